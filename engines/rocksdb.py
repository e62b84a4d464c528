"""RocksDBEngine: ledger storage in one RocksDB (rocksdict 0.3.29), group-committed by sync().

Theory of operation
-------------------
One RocksDB in raw mode (bytes keys, bytewise order) and only the default column family, with two
key spaces told apart by a prefix byte:

* entries: ``b"e" + >QQ(ledger_id, entry_id)`` -> the record;
* ledger infos: ``b"L" + >Q(ledger_id)`` -> ``LedgerInfo.to_bytes()``.

Infos sort *before* every entry: a memtable flush of new entries then makes an SST whose keys
lie after every older SST's, which RocksDB moves down the levels without rewriting it. (With
infos after the entries, as ``b"l"`` did until 2026-11, every SST overlapped the one holding
the info and each flush cost a compaction: 7 % of a bookie's CPU at 50k adds/s.)

Big-endian ids make byte order numeric order, so a ledger's entries are one contiguous key range
(``seek`` walks it, ``seek_for_prev`` finds its last entry, ``delete_range`` drops it). One column
family keeps one handle to release on close and makes every batch trivially atomic.

Every write reaches the DB at once (``sync=False``): a call's entries as one ``WriteBatch``,
so reads see them with no overlay of our own. (Until 2026-11 writes gathered in a batch of up
to 1 MiB behind an overlay dict; each entry then cost a dict insert and every read an overlay
check, ~0.3 µs of Python per entry, to save a ``write`` call per request that costs ~2.5 µs.)
``sync()`` calls ``flush_wal(True)``: the WAL fsync is the durability point, and rocksdict
runs it without the GIL. After a crash RocksDB replays the WAL in point-in-time mode: a torn
tail is dropped and nothing after it is applied, so a lost write is absent and a present one
is whole.

With ``wal=False`` (a bookie whose journal holds every write: the journal *is* the write-ahead
log, and RocksDB's own WAL would write each entry a second time on the event-loop thread) the
batches skip the WAL and ``sync()`` flushes the memtable into an SST instead (``flush(True)``,
also without the GIL). A crash then loses everything since the last flush, and the bookie's
journal replay puts it back.

Ledger infos and the set of ledgers that have entries are small, so they live in memory (loaded on
open, one seek per ledger); ``last_entry_id`` is cached per ledger.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
from collections.abc import Callable
from typing import TypeVar

from rocksdict import (
    DBCompressionType,
    DBRecoveryMode,
    Options,
    Rdict,
    RdictIter,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from bookkeeper_aio.direct_io import supports_direct_io
from bookkeeper_aio.engine import LedgerInfo

_ENTRY_KEY = struct.Struct(">cQQ")
_LEDGER_KEY = struct.Struct(">cQ")
_ID = struct.Struct(">Q")
_ID_MAX = 2**64 - 1
_T = TypeVar("_T")
BLOB_BYTES_MIN = 256  # with blob files: records this long or longer go to them (header: 24)


def entry_key(ledger_id: int, entry_id: int) -> bytes:
    return _ENTRY_KEY.pack(b"e", ledger_id, entry_id)


def info_key(ledger_id: int) -> bytes:
    return _LEDGER_KEY.pack(b"L", ledger_id)


class RocksDBEngine:
    """An :class:`~bookkeeper_aio.engine.Engine` on RocksDB in one ledger dir.

    Raises (on open):
        OSError: the dir cannot be created, or another engine holds its RocksDB LOCK (EBUSY).
    """

    def __init__(
        self,
        directory: str,
        *,
        wal: bool = True,
        memtable_bytes: int = 8 << 20,
        direct_io: bool = True,
        blob_files: bool = False,
    ) -> None:
        self.directory = os.path.abspath(directory)
        self._wal = wal
        os.makedirs(self.directory, exist_ok=True)
        self._db: Rdict | None = _open_db(self.directory, memtable_bytes, direct_io, blob_files)
        self._write_opt = WriteOptions()
        self._write_opt.sync = False  # the fsync is flush_wal(True) in sync(), once per group
        self._write_opt.disable_wal = not wal  # a property in rocksdict 0.3.29, not a method
        self._lock = threading.Lock()  # db calls vs close (the sync thread's included)
        self._sync_lock = threading.Lock()  # one sync at a time
        self._infos: dict[int, LedgerInfo] = {}
        self._with_entries: set[int] = set()
        self._last: dict[int, int] = {}  # cache; absent means "ask the db"
        self._syncs = 0
        try:
            self._load()
        except BaseException:
            self._release()
            raise

    def _load(self) -> None:
        """Read every ledger info and find every ledger with entries (one seek per ledger)."""

        def scan(it: RdictIter) -> None:
            it.seek(b"l")
            if it.valid() and it.key()[:1] == b"l":
                raise OSError(
                    errno.EINVAL,
                    f"ledger dir {self.directory} has ledger infos under the old b'l' keys "
                    "(before 2026-11); this version reads b'L' keys only",
                )
            it.seek(b"L")
            while it.valid() and it.key()[:1] == b"L":
                self._infos[_ID.unpack_from(it.key(), 1)[0]] = LedgerInfo.from_bytes(it.value())
                it.next()
            it.seek(b"e")
            while it.valid() and it.key()[:1] == b"e":
                ledger_id = _ID.unpack_from(it.key(), 1)[0]
                self._with_entries.add(ledger_id)
                if ledger_id == _ID_MAX:
                    break
                it.seek(entry_key(ledger_id + 1, 0))

        self._iterate(scan)

    def _iterate(self, walk: Callable[[RdictIter], _T]) -> _T:
        """Run ``walk`` on a fresh iterator and drop it: a live iterator keeps the LOCK held."""
        assert self._db is not None, "engine is closed"
        it = self._db.iter(ReadOptions())
        try:
            return walk(it)
        finally:
            del it

    # ----- writes

    def put_entry(self, ledger_id: int, entry_id: int, record: bytes) -> None:
        self.put_entries(ledger_id, [(entry_id, bytes(record))])

    def put_entries(self, ledger_id: int, entries: list[tuple[int, bytes]]) -> None:
        if not entries:
            return
        pack, batch = _ENTRY_KEY.pack, WriteBatch(raw_mode=True)
        put = batch.put
        for entry_id, record in entries:
            put(pack(b"e", ledger_id, entry_id), record)
        self._write(batch)
        self._with_entries.add(ledger_id)
        last = self._last.get(ledger_id)
        if last is not None:
            self._last[ledger_id] = max(last, max(entries)[0])

    def put_ledger(self, ledger_id: int, info: LedgerInfo) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.put(info_key(ledger_id), info.to_bytes())
        self._write(batch)
        self._infos[ledger_id] = info

    def delete_ledger(self, ledger_id: int) -> None:
        if ledger_id not in self._infos and ledger_id not in self._with_entries:
            return
        # 9 bytes of 0xff sort after every 8-byte entry id of this ledger, even 2**64-1.
        end = _LEDGER_KEY.pack(b"e", ledger_id) + b"\xff" * 9
        batch = WriteBatch(raw_mode=True)
        batch.delete_range(entry_key(ledger_id, 0), end)
        batch.delete(info_key(ledger_id))
        self._write(batch)
        self._infos.pop(ledger_id, None)
        self._with_entries.discard(ledger_id)
        self._last.pop(ledger_id, None)

    def _write(self, batch: WriteBatch) -> None:
        """Apply ``batch`` atomically, without an fsync (``sync()`` is the durability point)."""
        with self._lock:
            assert self._db is not None, "engine is closed"
            self._db.write(batch, self._write_opt)

    # ----- reads

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        with self._lock:
            assert self._db is not None, "engine is closed"
            value = self._db.get(entry_key(ledger_id, entry_id))
        return value  # type: ignore[no-any-return]

    def last_entry_id(self, ledger_id: int) -> int:
        last = self._last.get(ledger_id)
        if last is None:
            with self._lock:
                last = self._iterate(lambda it: _db_last(it, ledger_id))
            self._last[ledger_id] = last
        return last

    def list_entries(self, ledger_id: int, start_entry_id: int, max_count: int) -> list[int]:
        start = max(start_entry_id, 0)
        if max_count <= 0:
            return []
        with self._lock:
            return self._iterate(lambda it: _db_ids(it, ledger_id, start, max_count))

    def get_ledger(self, ledger_id: int) -> LedgerInfo | None:
        return self._infos.get(ledger_id)

    def ledgers(self) -> list[int]:
        return sorted(self._with_entries.union(self._infos))

    def statistics(self) -> dict[str, int]:
        """Counters for metrics: ledgers, syncs."""
        return {
            "ledgers": len(self._with_entries.union(self._infos)),
            "syncs": self._syncs,
        }

    # ----- durability

    def sync(self) -> None:
        with self._sync_lock:
            with self._lock:
                db = self._db
            assert db is not None, "engine is closed"
            # The durability point; both release the GIL while they write and fsync.
            if self._wal:
                db.flush_wal(True)
            else:
                db.flush(True)
            self._syncs += 1

    def close(self) -> None:
        if self._db is None:
            return
        try:
            self.sync()
        finally:
            self._release()

    def _release(self) -> None:
        """Close the DB and drop every reference, so RocksDB really closes and frees its LOCK."""
        with self._sync_lock, self._lock:
            db, self._db = self._db, None
            if db is not None:
                db.close()
            del db


def _open_db(directory: str, memtable_bytes: int, direct_io: bool, blob_files: bool) -> Rdict:
    opts = Options(raw_mode=True)  # bytes keys in bytewise order; no pickling
    opts.create_if_missing(True)
    # Small memtables (RocksDB's default is 64 MiB): each flush writes and fsyncs its SST while
    # the journal fdatasyncs on the same disk, and a 64 MiB flush stalled journal syncs for
    # 20-50 ms (open-loop p99 ~110 ms at 30k adds/s; with 8 MiB ~40-50 ms, throughput the same).
    # Four of them, so a slow flush never stops writes: a stall would block the event loop.
    opts.set_write_buffer_size(memtable_bytes)
    opts.set_max_write_buffer_number(4)
    # No block compression (RocksDB's default is Snappy): entries are the client's bytes,
    # which a client that wants it compresses itself (Pulsar compresses its batches), and
    # Snappy on incompressible entries cost ~0.4 µs per 1 KiB entry for nothing (benchmarks
    # writes with distinct random payloads: 47.7k -> 49.5k entries/s, 3 alternated runs).
    opts.set_compression_type(DBCompressionType.none())
    # Flushes and compactions write their SSTs with O_DIRECT: new page-cache pages cost ~1.8 µs
    # of kernel time per KiB on the benchmarks' VM (bookkeeper_aio/direct_io.py), and these
    # writes are never read back through the page cache soon (recent entries are in the
    # memtables). `benchmarks writes`: each bookie 8.1 -> 6.0-6.5 µs per entry.
    if direct_io and supports_direct_io(directory):
        opts.set_use_direct_io_for_flush_and_compaction(True)
    opts.set_wal_recovery_mode(DBRecoveryMode.point_in_time())  # the default; we rely on it
    if blob_files:
        # Entry records of BLOB_BYTES_MIN or more go to blob files at flush; SSTs keep keys and
        # blob references. With many ledgers written at once every flushed SST spans them all,
        # so compactions never stop, and they now rewrite ~30 bytes per entry instead of the
        # entry: 100 ledgers 21-23k -> 28-29k entries/s, the compaction thread 16 -> 5 % of a
        # core. One ledger loses 4-8 % (its SSTs are only moved, never compacted; writing
        # blob files costs the flush more). No blob GC: it rewrote live payloads at every
        # compaction (the gain fell to 3 %); a blob file goes once all its entries are deleted.
        opts.set_enable_blob_files(True)
        opts.set_min_blob_size(BLOB_BYTES_MIN)
    try:
        return Rdict(directory, opts)
    except Exception as e:  # rocksdict raises a bare Exception("IO error: ... lock ...")
        if "lock" in str(e).lower():
            raise OSError(
                errno.EBUSY, f"ledger dir {directory} is in use by another process ({e})"
            ) from e
        raise


def _db_last(it: RdictIter, ledger_id: int) -> int:
    it.seek_for_prev(entry_key(ledger_id, _ID_MAX))
    if it.valid() and it.key()[:9] == _LEDGER_KEY.pack(b"e", ledger_id):
        return int(_ID.unpack_from(it.key(), 9)[0])
    return -1


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
