"""What the bookie writes into its journal, and how a replay puts it back into the engine.

Theory of operation
-------------------
The journal (``journal.py``) stores typed opaque records; this module gives them meaning.
Every change a client is told is durable goes through the journal first:

* ``REC_ENTRY``        ledger id, entry id, then the stored entry record (LAC, digests, payload)
* ``REC_ENTRIES``      ledger id, then per entry: entry id, record length (u32), the record —
                       the entries of one batched add, one record (one header, one checksum);
                       after the ledger id it is the add's packed entries as they came
                       (``protocol.pack_add_entries``)
* ``REC_MASTER_KEY``   ledger id, master key — written once, on a ledger's first add
* ``REC_FENCE``        ledger id, master key — the fence must survive a crash before its reply
* ``REC_EXPLICIT_LAC`` ledger id, packed LAC proof
* ``REC_LIMBO``        ledger id, master key, then one byte: 1 enter limbo, 0 leave it (BP-46)

Replay applies records in journal order to the engine, so the engine ends where the bookie
was when it last acknowledged something; it is idempotent (records before the checkpoint may
be replayed again after a crash during a checkpoint).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from ..engine import Engine, LedgerInfo, Record
from ..protocol import PACKED_ENTRY_PREFIX, check_add_entries
from .journal import (
    REC_ENTRIES,
    REC_ENTRY,
    REC_EXPLICIT_LAC,
    REC_FENCE,
    REC_LIMBO,
    REC_MASTER_KEY,
    Body,
    JournalRecord,
)
from .ledger_state import unpack_proof

ENTRY_KEY = struct.Struct(">qq")
LEDGER_KEY = struct.Struct(">q")


def entry_body(ledger_id: int, entry_id: int, record: Record) -> bytes:
    """The journal body of a stored entry."""
    return ENTRY_KEY.pack(ledger_id, entry_id) + record


def entries_record(ledger_id: int, entries: list[tuple[int, Record]]) -> tuple[int, Body]:
    """The journal record (type, body) of stored entries of one ledger: ``REC_ENTRY`` for one,
    ``REC_ENTRIES`` for several (its body in pieces, which the journal writes unjoined)."""
    if len(entries) == 1:
        return REC_ENTRY, entry_body(ledger_id, *entries[0])
    pack = PACKED_ENTRY_PREFIX.pack
    parts: list[Record] = [LEDGER_KEY.pack(ledger_id)]
    for entry_id, record in entries:
        parts += (pack(entry_id, len(record)), record)
    return REC_ENTRIES, tuple(parts)


def unpack_entries(body: bytes) -> tuple[int, list[tuple[int, Record]]]:
    """The ledger id and the (entry id, record) pairs of a ``REC_ENTRIES`` body.

    Raises:
        ValueError: the body is truncated (it passed the journal's checksum: a bug, not a crash).
    """
    (ledger_id,) = LEDGER_KEY.unpack_from(body)
    # The add batch's parser; its digest check (two hashes per entry) is not needed here.
    entries = check_add_entries(ledger_id, body, LEDGER_KEY.size)
    return ledger_id, [(entry[0], bytes(entry[4])) for entry in entries]


def ledger_body(ledger_id: int, data: bytes) -> bytes:
    """The journal body of a per-ledger record (master key, fence, explicit LAC)."""
    return LEDGER_KEY.pack(ledger_id) + data


def limbo_body(ledger_id: int, master_key: bytes, limbo: bool) -> bytes:
    """The journal body of a limbo change."""
    return LEDGER_KEY.pack(ledger_id) + master_key + (b"\x01" if limbo else b"\x00")


def replay_into(engine: Engine, records: Iterable[JournalRecord]) -> int:
    """Apply journal records to the engine in order; return how many were applied.

    Raises:
        ValueError: a record of an unknown type (a newer bookie wrote this journal).
    """
    count = 0
    for rtype, body in records:
        if rtype == REC_ENTRY:
            ledger_id, entry_id = ENTRY_KEY.unpack_from(body)
            engine.put_entry(ledger_id, entry_id, bytes(body[ENTRY_KEY.size :]))
        elif rtype == REC_ENTRIES:
            engine.put_entries(*unpack_entries(body))
        else:
            (ledger_id,) = LEDGER_KEY.unpack_from(body)
            _apply_ledger_record(engine, rtype, ledger_id, bytes(body[LEDGER_KEY.size :]))
        count += 1
    return count


def _apply_ledger_record(engine: Engine, rtype: int, ledger_id: int, data: bytes) -> None:
    info = engine.get_ledger(ledger_id)
    if rtype == REC_MASTER_KEY:
        if info is None:
            engine.put_ledger(ledger_id, LedgerInfo(master_key=data))
    elif rtype == REC_FENCE:
        base = info or LedgerInfo(master_key=data)
        engine.put_ledger(ledger_id, base.replace(fenced=True))
    elif rtype == REC_EXPLICIT_LAC:
        proof = unpack_proof(data)
        current = unpack_proof(info.explicit_lac) if info else None
        if info is not None and proof is not None and (current is None or proof.lac > current.lac):
            engine.put_ledger(ledger_id, info.replace(explicit_lac=data))
    elif rtype == REC_LIMBO:
        limbo = data[-1:] == b"\x01"
        base = info or LedgerInfo(master_key=data[:-1])
        # Entering limbo also fences (BP-46); leaving limbo keeps the fence.
        engine.put_ledger(ledger_id, base.replace(limbo=limbo, fenced=True))
    else:
        raise ValueError(f"journal record of unknown type {rtype}")
