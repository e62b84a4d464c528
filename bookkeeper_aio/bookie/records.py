"""What the bookie writes into its journal, and how a replay puts it back into the engine.

Theory of operation
-------------------
The journal (``journal.py``) stores typed opaque records; this module gives them meaning.
Every change a client is told is durable goes through the journal first:

* ``REC_ENTRY``        ledger id, entry id, then the stored entry record (LAC, digests, payload)
                       — an entry the integrity check copied from a peer
* ``REC_ENTRIES``      ledger id, then per entry: entry id, record length (u32), the record —
                       the entries of one add or batched add, one record (one header, one
                       checksum); after the ledger id it is a batch's packed entries as they
                       came (``protocol.pack_add_entries``)
* ``REC_LEDGERS_ENTRIES`` per ledger: ledger id, the length (u32) of its packed entries, then
                       those entries as in ``REC_ENTRIES`` — the stored entries of every
                       part of one ``MultiAddRequest``, one record (a record per part cost the
                       bookie more than the part's entries when 100 ledgers share a request)
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
    REC_LEDGERS_ENTRIES,
    REC_LIMBO,
    REC_MASTER_KEY,
    Body,
    JournalRecord,
)
from .ledger_state import unpack_proof

ENTRY_KEY = struct.Struct(">qq")
LEDGER_KEY = struct.Struct(">q")
LEDGER_SPAN = struct.Struct(">qI")  # a REC_LEDGERS_ENTRIES part: ledger id, its entries' bytes

# One ledger's stored entries to journal: its id and the entries packed as an add batch
# carries them (protocol.pack_add_entries), in pieces the journal writes without joining.
Journaled = tuple[int, tuple[Record, ...]]


def entry_body(ledger_id: int, entry_id: int, record: Record) -> bytes:
    """The journal body of a stored entry."""
    return ENTRY_KEY.pack(ledger_id, entry_id) + record


def packed(entries: list[tuple[int, Record]]) -> tuple[Record, ...]:
    """``(entry_id, record)`` pairs packed as an add batch carries them, in pieces."""
    pack = PACKED_ENTRY_PREFIX.pack
    parts: list[Record] = []
    for entry_id, record in entries:
        parts += (pack(entry_id, len(record)), record)
    return tuple(parts)


def entries_record(journaled: Journaled) -> tuple[int, Body]:
    """The journal record (type, body) of one ledger's stored entries: ``REC_ENTRIES``."""
    ledger_id, pieces = journaled
    return REC_ENTRIES, (LEDGER_KEY.pack(ledger_id), *pieces)


def ledgers_entries_record(parts: list[Journaled]) -> tuple[int, Body]:
    """The journal record of several ledgers' stored entries (a multi add's parts, in order):
    ``REC_ENTRIES`` for one, ``REC_LEDGERS_ENTRIES`` for more."""
    if len(parts) == 1:
        return entries_record(parts[0])
    span = LEDGER_SPAN.pack
    body: list[Record] = []
    for ledger_id, pieces in parts:
        body.append(span(ledger_id, sum(map(len, pieces))))
        body += pieces
    return REC_LEDGERS_ENTRIES, tuple(body)


def unpack_entries(body: bytes) -> tuple[int, list[tuple[int, Record]]]:
    """The ledger id and the (entry id, record) pairs of a ``REC_ENTRIES`` body.

    Raises:
        ValueError: the body is truncated (it passed the journal's checksum: a bug, not a crash).
    """
    (ledger_id,) = LEDGER_KEY.unpack_from(body)
    return ledger_id, _entries(ledger_id, body, LEDGER_KEY.size, len(body))


def unpack_ledgers_entries(body: bytes) -> list[tuple[int, list[tuple[int, Record]]]]:
    """Each ledger's id and (entry id, record) pairs of a ``REC_LEDGERS_ENTRIES`` body.

    Raises:
        ValueError: the body is truncated (as for :func:`unpack_entries`).
    """
    out, pos, end = [], 0, len(body)
    while pos < end:
        if end - pos < LEDGER_SPAN.size:
            raise ValueError(f"ledgers' entries cut short at byte {pos}")
        ledger_id, size = LEDGER_SPAN.unpack_from(body, pos)
        pos += LEDGER_SPAN.size
        if pos + size > end:
            raise ValueError(f"ledger {ledger_id}: {size} bytes of entries do not fit")
        out.append((ledger_id, _entries(ledger_id, body, pos, pos + size)))
        pos += size
    return out


def _entries(ledger_id: int, body: bytes, start: int, end: int) -> list[tuple[int, Record]]:
    # The add batch's parser; its digest check (two hashes per entry) is not needed here.
    view = memoryview(body)[:end]
    entries = check_add_entries(ledger_id, view, start)
    return [(entry[0], bytes(entry[4])) for entry in entries]


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
        elif rtype == REC_LEDGERS_ENTRIES:
            for ledger_id, entries in unpack_ledgers_entries(body):
                engine.put_entries(ledger_id, entries)
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
