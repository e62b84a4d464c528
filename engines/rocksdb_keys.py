"""The rocksdb engine's key layout: its column families, their keys and values, and the seeks
that read them back (engines/rocksdb.py says how the engine works as a whole).

One RocksDB in raw mode (bytes keys, bytewise order), in column families:

* ledger infos (``infos``, ``INFOS_CF``): ``b"L" + >Q(ledger_id)`` -> ``LedgerInfo.to_bytes()``;
* batches (the default family; ``copies``, ``COPIES_CF``, for recovery adds): ``b"b" +
  >QQQ(ledger_id, first_entry_id, last_entry_id)`` -> the entries of one ``put_entries`` call
  packed as an add batch carries them (per entry ``protocol.PACKED_ENTRY_PREFIX`` — id, record
  length — then the record; ids ascending);
* entries (``singles``, ``SINGLES_CF``): ``b"e" + >QQ(ledger_id, entry_id)`` -> the record;
* every batch key again (``batches``, ``BATCHES_CF``), its entry count as value (why:
  docs/engines.md, "Why `batches`, and no lookup near a value it does not need").

Big-endian ids make byte order numeric order, so a ledger's batches and its entries are each one
contiguous key range (``seek`` walks it, ``seek_for_prev`` finds its last, ``delete_range``
drops it).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from rocksdict import Rdict, RdictIter

from bookkeeper_aio.engine import Record
from bookkeeper_aio.protocol import PACKED_ENTRY_PREFIX

_ENTRY_KEY = struct.Struct(">cQQ")
_BATCH_KEY = struct.Struct(">cQQQ")
_RANGE = struct.Struct(">QQ")  # a batch key's first and last entry ids, after the prefix
_COUNT = struct.Struct(">I")  # in BATCHES_CF: how many entries the batch holds
_IN_COPIES = b"r"  # after the count in BATCHES_CF: the batch's value is in COPIES_CF
_IN_COPIES_SIZE = _COUNT.size + len(_IN_COPIES)  # (a count alone may end in b"r": 114)
_LEDGER_KEY = struct.Struct(">cQ")
_ID = struct.Struct(">Q")
_ID_MAX = 2**64 - 1


def entry_key(ledger_id: int, entry_id: int) -> bytes:
    return _ENTRY_KEY.pack(b"e", ledger_id, entry_id)


INFOS_CF = "infos"  # the column family of the ledger infos
BATCHES_CF = "batches"  # every batch key again, its entry count as value (module docstring)
COPIES_CF = "copies"  # the batches of recovery adds, with blob files (docs/engines.md)
SINGLES_CF = "singles"  # entry keys (docs/engines.md: why a family of their own)
_BATCHES_MARKER = b"v1"  # in BATCHES_CF: it holds every batch key (sorts after b"b...")


def info_key(ledger_id: int) -> bytes:
    return _LEDGER_KEY.pack(b"L", ledger_id)


class _Batch:
    """A batch value as read, and where each of its records lies (found on first use)."""

    __slots__ = ("last", "spans", "value")

    def __init__(self, last: int, value: bytes) -> None:
        self.last, self.value = last, value
        self.spans: dict[int, tuple[int, int]] | None = None

    def record(self, entry_id: int) -> bytes | None:
        if self.spans is None:
            self.spans = dict(_spans(self.value))
        span = self.spans.get(entry_id)
        return self.value[span[0] : span[1]] if span is not None else None


def _spans(value: bytes) -> Iterator[tuple[int, tuple[int, int]]]:
    """(entry id, (start, end) of its record) of a batch value, in order."""
    unpack, size, pos, end = (
        PACKED_ENTRY_PREFIX.unpack_from,
        PACKED_ENTRY_PREFIX.size,
        0,
        len(value),
    )
    while pos < end:
        entry_id, length = unpack(value, pos)
        pos += size
        yield entry_id, (pos, pos + length)
        pos += length


def _ascending_above(entries: list[tuple[int, Record]], last: int) -> bool:
    """Whether the entry ids ascend strictly, all above ``last``."""
    for entry_id, _ in entries:
        if entry_id <= last:
            return False
        last = entry_id
    return True


def _db_batch(it: RdictIter, ledger_id: int, entry_id: int) -> tuple[int, int, bool] | None:
    """(first, last id, whether in COPIES_CF) of the ledger's batch whose id range covers
    ``entry_id``, if any, from an iterator of ``BATCHES_CF``: batches never overlap, so it is
    the one with the greatest first id <= ``entry_id``."""
    it.seek_for_prev(_BATCH_KEY.pack(b"b", ledger_id, entry_id, _ID_MAX))
    if it.valid():
        key = it.key()
        if key[:9] == _LEDGER_KEY.pack(b"b", ledger_id):
            first, last = _RANGE.unpack_from(key, 9)
            if entry_id <= last:
                return first, last, len(it.value()) == _IN_COPIES_SIZE
    return None


def _db_last(it: RdictIter, ledger_id: int, space: bytes) -> int:
    """The ledger's last entry id under entry keys (``b"e"``, the entries' iterator) or batch
    keys (``b"b"``, an iterator of ``BATCHES_CF``); -1 if none."""
    if space == b"e":
        it.seek_for_prev(entry_key(ledger_id, _ID_MAX))
        if it.valid() and it.key()[:9] == _LEDGER_KEY.pack(b"e", ledger_id):
            return int(_ID.unpack_from(it.key(), 9)[0])
        return -1
    it.seek_for_prev(_BATCH_KEY.pack(b"b", ledger_id, _ID_MAX, _ID_MAX))
    if it.valid() and it.key()[:9] == _LEDGER_KEY.pack(b"b", ledger_id):
        return int(_RANGE.unpack_from(it.key(), 9)[1])
    return -1


def _skip_scan(it: RdictIter, space: bytes, found: set[int]) -> None:
    """Add every ledger with keys in ``space`` to ``found`` (one seek per ledger)."""
    it.seek(space)
    while it.valid() and it.key()[:1] == space:
        ledger_id = _ID.unpack_from(it.key(), 1)[0]
        found.add(ledger_id)
        if ledger_id == _ID_MAX:
            break
        it.seek(_LEDGER_KEY.pack(space, ledger_id + 1))


def _db_batch_ids(
    it: RdictIter, dbs: tuple[Rdict, Rdict], ledger_id: int, start: int, max_count: int
) -> list[int]:
    """Up to ``max_count`` ids >= ``start`` held in the ledger's batches, ascending, from an
    iterator of ``BATCHES_CF``. A batch whose count there says it holds every id of its range
    is listed from its key; only the others (a striped ensemble's, or from a dir written before
    the counts) have their value read (from the entries' family or ``COPIES_CF``, ``dbs``; a
    256 KiB entry's batch is megabytes: reading every value took a third of a bookie's CPU
    while autorecovery checked ledgers)."""
    prefix = _LEDGER_KEY.pack(b"b", ledger_id)
    it.seek_for_prev(_BATCH_KEY.pack(b"b", ledger_id, start, _ID_MAX))
    if not (it.valid() and it.key()[:9] == prefix):
        it.seek(prefix)
    ids: list[int] = []
    while len(ids) < max_count and it.valid():
        key = it.key()
        if key[:9] != prefix:
            break
        first, last = _RANGE.unpack_from(key, 9)
        count = it.value()
        if last >= start:
            if len(count) >= _COUNT.size and _COUNT.unpack_from(count)[0] == last - first + 1:
                low = max(first, start)
                ids += range(low, min(last, low + max_count - len(ids) - 1) + 1)
            else:
                value = dbs[len(count) == _IN_COPIES_SIZE].get(key)
                if value is not None:
                    ids += (entry_id for entry_id, _ in _spans(value) if entry_id >= start)
        it.next()
    return ids[:max_count]


def _db_ids(it: RdictIter, ledger_id: int, start: int, max_count: int) -> list[int]:
    # Not ReadOptions.set_iterate_lower_bound: in rocksdict 0.3.29 it sets the upper bound.
    prefix = _LEDGER_KEY.pack(b"e", ledger_id)
    ids: list[int] = []
    it.seek(entry_key(ledger_id, start))
    while len(ids) < max_count and it.valid():
        key = it.key()
        if key[:9] != prefix:
            break
        ids.append(_ID.unpack_from(key, 9)[0])
        it.next()
    return ids
