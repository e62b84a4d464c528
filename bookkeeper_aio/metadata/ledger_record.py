"""What a bookie keeps per ledger so that the metadata can be rebuilt without etcd, and the
rebuilding itself (BP-31 "metadata recovery tool"). Pure: no I/O.

Theory of operation
-------------------
BP-31 asks for a way to read every ledger back after the metadata store is wiped. Entries
alone do not say enough: a bookie knows the ledgers it holds, their entry ids, master keys
and LACs, but not the other members of an ensemble, the quorum sizes, the password check or
where the ensemble changed. So every bookie keeps, beside its ``LedgerInfo``, a **ledger
record**: the ledger's metadata as the bookie last read it from the store (compact msgpack,
:func:`encode_record`), with the store version it was read at. The bookie reads it when it
first sees a ledger and again on every scrub pass (``bookie/ledger_records.py``), so a record
is at most one scrub interval old; a bookie that joined a ledger through an ensemble change
or a re-replication reads it after the change names it.

The recovery tool asks every bookie for what it holds (:func:`pack_held` is one ledger's
answer: id, master key, last entry held, record) and :func:`rebuild` chooses, per ledger, the
most advanced record any bookie has — CLOSED over IN_RECOVERY over OPEN, then the latest last
segment, then more segments, then a record whose every bookie holds the ledger, then the
highest store version. Records differ only by what happened after the older ones were read,
so the most advanced one is the ledger as the store last had it, up to the changes of the
last scrub interval: a ledger closed since then comes back OPEN and a reader's recovery
closes it again (it fences and finds the last entry, as after any writer crash).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack

from ..errors import MetadataFormatError
from .model import LedgerMetadata, LedgerState

RECORD_VERSION = 1
_STATE_RANK = {LedgerState.OPEN: 0, LedgerState.IN_RECOVERY: 1, LedgerState.CLOSED: 2}


def encode_record(md: LedgerMetadata, version: int) -> bytes:
    """The record a bookie keeps for ``md`` read at store ``version``."""
    return msgpack.packb(
        [RECORD_VERSION, version, md.ensemble_size, md.write_quorum, md.ack_quorum,
         [[first, list(ensemble)] for first, ensemble in md.ensembles], md.state.value,
         md.last_entry_id, md.length, md.digest_type, _packed_hex(md.password_hash), md.ctime_ms,
         md.custom_metadata, _packed_hex(md.creator_token), _packed_hex(md.master_key)],
    )  # fmt: skip


def _packed_hex(text: str) -> str | bytes:
    """Hex text (hashes, keys, tokens) as its bytes: half the size; other text as it is."""
    try:
        data = bytes.fromhex(text)
    except ValueError:
        return text
    return data if data.hex() == text else text


def _unpacked_hex(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.hex()


def decode_record(ledger_id: int, data: bytes) -> tuple[LedgerMetadata, int]:
    """(metadata, store version) of a record.

    Raises:
        MetadataFormatError: not a record of a known version, or invalid metadata.
    """
    try:
        fields = msgpack.unpackb(data, raw=False, strict_map_key=True)
        if not isinstance(fields, list) or len(fields) != 15 or fields[0] != RECORD_VERSION:
            raise MetadataFormatError("not a ledger record of version 1")
        _, version, e, wq, aq, segments, state, last, length, digest_type, pw, ctime, custom, \
            token, key = fields  # fmt: skip
        md = LedgerMetadata(
            ledger_id, e, wq, aq, tuple((int(f), tuple(b)) for f, b in segments),
            LedgerState(state), last, length, digest_type, _unpacked_hex(pw), ctime, dict(custom),
            _unpacked_hex(token), _unpacked_hex(key),
        )  # fmt: skip
        if type(version) is not int:
            raise MetadataFormatError("the record's store version is not an int")
        return md, version
    except MetadataFormatError:
        raise
    except Exception as exc:  # hostile bytes: any failure is a bad record, never a crash
        raise MetadataFormatError(f"ledger {ledger_id}: bad ledger record: {exc}") from exc


class Held(NamedTuple):
    """One ledger as one bookie holds it."""

    ledger_id: int
    master_key: bytes
    last_entry_id: int  # the highest entry id it holds, -1 for none
    record: bytes  # b"": the bookie never read the ledger's metadata


def pack_held(held: Held) -> bytes:
    """One item of a LEDGER_RECORDS answer."""
    return msgpack.packb(list(held))


def unpack_held(data: bytes) -> Held:
    """Inverse of :func:`pack_held`.

    Raises:
        MetadataFormatError: not such an item.
    """
    try:
        fields = msgpack.unpackb(data, raw=False)
        held = Held(*fields)
    except Exception as exc:
        raise MetadataFormatError(f"bad ledger records item: {exc}") from exc
    ok = (
        type(held.ledger_id) is int
        and 0 <= held.ledger_id < 1 << 63
        and type(held.master_key) is bytes
        and type(held.last_entry_id) is int
        and type(held.record) is bytes
    )
    if not ok:
        raise MetadataFormatError("bad ledger records item: wrong field types")
    return held


@dataclass
class Rebuilt:
    """What :func:`rebuild` found: the metadata to restore and what it could not."""

    ledgers: dict[int, LedgerMetadata] = field(default_factory=dict)
    # Ledgers some bookie holds but none has a (valid) record of: id -> the bookies.
    unrecoverable: dict[int, list[str]] = field(default_factory=dict)
    bad_records: int = 0


def rebuild(holdings: Mapping[str, Iterable[Held]]) -> Rebuilt:
    """Per ledger, the most advanced record any bookie holds (module docstring)."""
    holders: dict[int, set[str]] = {}
    candidates: dict[int, list[tuple[LedgerMetadata, int]]] = {}
    result = Rebuilt()
    for bookie, items in sorted(holdings.items()):
        for held in items:
            holders.setdefault(held.ledger_id, set()).add(bookie)
            if not held.record:
                continue
            try:
                candidates.setdefault(held.ledger_id, []).append(
                    decode_record(held.ledger_id, held.record)
                )
            except MetadataFormatError:
                result.bad_records += 1
    for ledger_id in sorted(holders):
        found = candidates.get(ledger_id)
        if not found:
            result.unrecoverable[ledger_id] = sorted(holders[ledger_id])
            continue
        result.ledgers[ledger_id] = max(found, key=lambda c: _rank(c, holders[ledger_id]))[0]
    return result


def _rank(candidate: tuple[LedgerMetadata, int], holders: set[str]) -> tuple[Any, ...]:
    md, version = candidate
    first, _ = md.last_ensemble()
    held_everywhere = all(b in holders for b in md.bookies())
    return (_STATE_RANK[md.state], first, len(md.ensembles), held_everywhere, version)
