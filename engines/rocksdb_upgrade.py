"""Opening a ledger dir an older version of the rocksdb engine wrote: its keys move to where
this version keeps them, once, on open (docs/engines.md §3 has why each moved).

* Ledger infos under ``b"L"`` in the default family (before 2026-11-23) move to ``INFOS_CF``,
  in one write, synced; infos under ``b"l"`` (before 2026-11) are refused (``OSError(EINVAL)``)
  rather than read without them.
* Entry keys in the default family (before 2026-11-27) move to ``SINGLES_CF``, in writes of at
  most ``MOVE_BYTES``, then one range delete, synced. A crash in between leaves copies in both,
  and the next open moves them again.
* Batch keys not yet in ``BATCHES_CF`` (a dir from before it) are copied there in one pass,
  then the marker, synced. A new dir just gets the marker, durable with its first sync (lost,
  the next open copies nothing again).

Each step is a function of the engine's own ``iterate`` (a walk over a fresh iterator of the
default family) and ``write`` (an atomic write, unsynced); the engine syncs after what moved.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import TypeVar

from rocksdict import ColumnFamily, RdictIter, WriteBatch

from .rocksdb_keys import _BATCHES_MARKER, _ID, info_key

_T = TypeVar("_T")
Iterate = Callable[[Callable[[RdictIter], _T]], _T]
Write = Callable[[WriteBatch], None]

MOVE_BYTES = 64 << 20  # entry keys moved to SINGLES_CF per write


def scan_infos(it: RdictIter) -> dict[int, bytes]:
    """Every ``b"L"`` ledger info an iterator's family holds: ledger id -> its bytes."""
    found = {}
    it.seek(b"L")
    while it.valid() and it.key()[:1] == b"L":
        found[_ID.unpack_from(it.key(), 1)[0]] = it.value()
        it.next()
    return found


def old_infos(iterate: Iterate[dict[int, bytes]], directory: str) -> dict[int, bytes]:
    """The ledger infos still in the default family.

    Raises:
        OSError(EINVAL): the dir has infos under the ``b"l"`` keys of before 2026-11.
    """

    def scan(it: RdictIter) -> dict[int, bytes]:
        it.seek(b"l")
        if it.valid() and it.key()[:1] == b"l":
            raise OSError(
                errno.EINVAL,
                f"ledger dir {directory} has ledger infos under the old b'l' keys "
                "(before 2026-11); this version reads b'L' keys only",
            )
        return scan_infos(it)

    return iterate(scan)


def move_infos(
    write: Write, infos_cf: ColumnFamily, old: dict[int, bytes], current: dict[int, bytes]
) -> None:
    """Move ``old`` infos into ``INFOS_CF`` in one write, where it has none of its own."""
    batch = WriteBatch(raw_mode=True)
    for ledger_id, data in old.items():
        if ledger_id not in current:
            batch.put(info_key(ledger_id), data, infos_cf)
        batch.delete(info_key(ledger_id))
    write(batch)


def move_singles(iterate: Iterate[bool], write: Write, singles_cf: ColumnFamily) -> bool:
    """Move the entry keys of the default family into ``SINGLES_CF`` and delete them there;
    whether there were any (then the caller syncs)."""

    def move(it: RdictIter) -> bool:
        it.seek(b"e")
        moved, batch, size = False, WriteBatch(raw_mode=True), 0
        while it.valid() and it.key()[:1] == b"e":
            value = it.value()
            batch.put(it.key(), value, singles_cf)
            moved, size = True, size + len(value)
            if size >= MOVE_BYTES:
                write(batch)
                batch, size = WriteBatch(raw_mode=True), 0
            it.next()
        if len(batch):
            write(batch)
        return moved

    if not iterate(move):
        return False
    batch = WriteBatch(raw_mode=True)
    batch.delete_range(b"e", b"f")
    write(batch)
    return True


def index_batches(iterate: Iterate[WriteBatch], write: Write, batches_cf: ColumnFamily) -> set[int]:
    """Copy every batch key of the default family into ``BATCHES_CF`` (empty values: counts
    unknown), with the marker saying it holds them all; the ledgers that have batches (when
    any, the caller syncs)."""
    batched: set[int] = set()

    def copy(it: RdictIter) -> WriteBatch:
        batch = WriteBatch(raw_mode=True)
        it.seek(b"b")
        while it.valid() and it.key()[:1] == b"b":
            batch.put(it.key(), b"", batches_cf)
            batched.add(_ID.unpack_from(it.key(), 1)[0])
            it.next()
        batch.put(_BATCHES_MARKER, b"", batches_cf)
        return batch

    write(iterate(copy))
    return batched
