"""RocksDBEngine: ledger storage in one RocksDB (rocksdict 0.3.29), group-committed by sync().

Theory of operation
-------------------
One RocksDB per ledger dir, in raw mode, in column families (their keys and the seeks that read
them back: engines/rocksdb_keys.py; the options: engines/rocksdb_options.py): ledger infos
(``infos``), batches of a writer's entries (the default family), batches of recovery adds
(``copies``, with blob files), entries under keys of their own (``singles``) and every batch
key again with its entry count (``batches``). docs/engines.md §3 has why each family exists,
with the runs behind it.

Writes: the entries of one ``put_entries`` call become one batch (one key) when their ids
ascend above the ledger's last stored entry, how a writer's adds arrive; batches then never
overlap, so the one batch that may hold entry *e* is the one with the greatest first id <= *e*.
Anything else (a re-sent add, a recovery's write-back, the journal's replay) goes under entry
keys, which reads try first: written later, they are the newest copy. Writes are staged in one
``WriteBatch`` that reaches the DB at the end of each call with the WAL, or after
``write_behind_bytes`` without it; every read, ``sync()``, ``put_ledger`` and ``delete_ledger``
write it first under the lock, so reads need nothing but the DB. Autorecovery's deferred copies
may instead go into SST files ingested at ``sync()`` (engines/copy_files.py), their index keys
written only once their payloads are in the DB.

Reads never position on a value they do not need (a block holding a 4 MiB entry made a lookup
of an absent id next to it ~0.7 ms): an id past the ledger's cached last entry is absent
without a read; the batch that may hold an id is found in ``batches`` (keys only) and its
value read by its exact key; absent entry keys are answered by a Bloom filter. Reads may run in
several threads (``can_read_now``, bookie/read_pool.py): a read finds its batch under the lock
and reads the value outside it, without the GIL. Parsed batches and which batches are still in
a memtable are kept in memory (engines/rocksdb_memory.py).

Durability: ``sync()`` with the WAL is ``flush_wal(True)`` (RocksDB replays it in point-in-time
mode: a lost write is absent, a present one whole). Without it (``wal=False``: a bookie whose
journal holds every write, so the journal is the write-ahead log) ``sync()`` flushes every
family's memtable into SSTs, and after a crash the journal's replay puts back what was lost.
Both release the GIL while they write and fsync.

Ledger infos and the sets of ledgers with batches or entry keys live in memory, loaded on open
(one seek per ledger), where a dir an older version wrote is upgraded first
(engines/rocksdb_upgrade.py); ``last_entry_id`` is cached per ledger.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar, cast

from rocksdict import (
    ColumnFamily,
    IngestExternalFileOptions,
    Rdict,
    RdictIter,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from bookkeeper_aio.engine import LedgerInfo, Record
from bookkeeper_aio.protocol import PACKED_ENTRY_PREFIX

from .copy_files import DIR_NAME as COPY_DIR_NAME
from .copy_files import CopyFile, CopyFiles, sync_data
from .rocksdb_keys import (
    _BATCH_KEY,
    _BATCHES_MARKER,
    _COUNT,
    _ENTRY_KEY,
    _IN_COPIES,
    _LEDGER_KEY,
    BATCHES_CF,
    COPIES_CF,
    INFOS_CF,
    SINGLES_CF,
    _ascending_above,
    _Batch,
    _db_batch,
    _db_batch_ids,
    _db_ids,
    _db_last,
    _skip_scan,
    entry_key,
    info_key,
)
from .rocksdb_memory import MemtableBatches, ParsedBatches
from .rocksdb_options import _IMMUTABLE_PAUSE, BLOB_BYTES_MIN, _collect_copies, _open_db
from .rocksdb_upgrade import index_batches, move_infos, move_singles, old_infos, scan_infos

__all__ = [
    "BATCHES_CF",
    "BLOB_BYTES_MIN",
    "COPIES_CF",
    "INFOS_CF",
    "SINGLES_CF",
    "RocksDBEngine",
    "entry_key",
    "info_key",
]

_T = TypeVar("_T")


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
        batch_cache_bytes: int = 8 << 20,
        write_behind_bytes: int = 0,
        write_rate_bytes_per_s: int = 0,
        copy_file_bytes: int = 0,
    ) -> None:
        self.directory = os.path.abspath(directory)
        self._wal = wal
        # Without the WAL a write is as volatile in a WriteBatch as in the memtable: entries
        # may gather there (module docstring). With it, a write must reach the WAL at once.
        self._write_behind_bytes = 0 if wal else write_behind_bytes
        self._staged: WriteBatch | None = None  # writes not in the DB yet (under _lock)
        self._staged_bytes = 0
        os.makedirs(self.directory, exist_ok=True)
        self._db: Rdict | None = _open_db(
            self.directory, memtable_bytes, direct_io, blob_files, write_rate_bytes_per_s
        )
        self._infos_db: Rdict | None = self._db.get_column_family(INFOS_CF)
        self._infos_cf: ColumnFamily | None = self._db.get_column_family_handle(INFOS_CF)
        self._batches_db: Rdict | None = self._db.get_column_family(BATCHES_CF)
        self._batches_cf: ColumnFamily | None = self._db.get_column_family_handle(BATCHES_CF)
        self._copies_db: Rdict | None = self._db.get_column_family(COPIES_CF)
        self._copies_cf: ColumnFamily | None = self._db.get_column_family_handle(COPIES_CF)
        self._singles_db: Rdict | None = self._db.get_column_family(SINGLES_CF)
        self._singles_cf: ColumnFamily | None = self._db.get_column_family_handle(SINGLES_CF)
        self._write_opt = WriteOptions()
        self._write_opt.sync = False  # the fsync is flush_wal(True) in sync(), once per group
        # A property in rocksdict 0.3.29, not a method (as its type stub says).
        self._write_opt.disable_wal = not wal  # type: ignore[method-assign, assignment]
        self._lock = threading.Lock()  # db calls vs close (the sync thread's included)
        self._sync_lock = threading.Lock()  # one sync at a time
        self._infos: dict[int, LedgerInfo] = {}
        self._singles: set[int] = set()  # ledgers with entry keys
        self._batched: set[int] = set()  # ledgers with batch keys
        self._last: dict[int, int] = {}  # cache; absent means "ask the db"
        self._deleted: set[int] = set()  # ledgers whose ranges reclaim_space compacts next
        self._parsed = ParsedBatches(batch_cache_bytes)  # batches reads parsed (under _lock)
        # Read threads (can_read_now): how many read a batch outside the lock (close waits for
        # none), and how many ledgers were deleted (a batch read across a delete is not cached).
        self._reading = 0
        self._idle = threading.Condition(self._lock)
        self._deletions = 0
        # Batches still in a memtable: a read of them does not wait on the disk.
        self._memtables = MemtableBatches(memtable_bytes)
        self._syncs = 0
        # Deferred-sync copies go into SST files ingested at sync (engines/copy_files.py).
        self._copy_files: CopyFiles | None = None
        self._ingest_opt = IngestExternalFileOptions()
        self._ingest_opt.set_move_files(True)  # a hard link: the payload is written once
        try:
            if copy_file_bytes > 0:
                self._copy_files = CopyFiles(os.path.join(self.directory, COPY_DIR_NAME),
                                             copy_file_bytes)  # fmt: skip
            self._load()
        except BaseException:
            self._release()
            raise

    def _load(self) -> None:
        """Read every ledger info and find every ledger with entries or batches (one seek per
        ledger and key space), upgrading a dir an older version wrote first
        (engines/rocksdb_upgrade.py)."""
        old = old_infos(self._iterate, self.directory)
        assert self._singles_cf is not None and self._batches_cf is not None
        if move_singles(self._iterate, self._write, self._singles_cf):
            self.sync()
        self._iterate(lambda it: _skip_scan(it, b"e", self._singles), self._singles_db)
        current = self._iterate(scan_infos, self._infos_db)
        assert self._batches_db is not None and self._infos_cf is not None
        if self._batches_db.get(_BATCHES_MARKER) is None:  # a dir from before it (or a new one)
            self._batched = index_batches(self._iterate, self._write, self._batches_cf)
            if self._batched:
                self.sync()
        else:
            self._iterate(lambda it: _skip_scan(it, b"b", self._batched), self._batches_db)
        if old:
            move_infos(self._write, self._infos_cf, old, current)
            self.sync()
        for ledger_id, data in {**old, **current}.items():
            self._infos[ledger_id] = LedgerInfo.from_bytes(data)

    def _iterate(self, walk: Callable[[RdictIter], _T], db: Rdict | None = None) -> _T:
        """Run ``walk`` on a fresh iterator (of ``db``, default the entries) and drop it: a live
        iterator keeps the LOCK held."""
        assert self._db is not None, "engine is closed"
        self._write_staged()
        it = (self._db if db is None else db).iter(ReadOptions())
        try:
            return walk(it)
        finally:
            del it

    # ----- writes

    def put_entry(self, ledger_id: int, entry_id: int, record: Record) -> None:
        self.put_entries(ledger_id, [(entry_id, bytes(record))])

    def put_entries(
        self,
        ledger_id: int,
        entries: list[tuple[int, Record]],
        packed: bytes | None = None,
        recovery: bool = False,
        deferred: bool = False,
    ) -> None:
        if not entries:
            return
        last = self.last_entry_id(ledger_id)
        if _ascending_above(entries, last):
            first, last = entries[0][0], entries[-1][0]
            if packed is None:
                parts: list[Record] = []
                for entry_id, record in entries:
                    parts += (PACKED_ENTRY_PREFIX.pack(entry_id, len(record)), record)
                packed = b"".join(parts)
            key = _BATCH_KEY.pack(b"b", ledger_id, first, last)
            count = _COUNT.pack(len(entries))
            if deferred and recovery and self._copy_to_file(ledger_id, key, packed, count, last):
                return
            with self._lock:
                batch = self._stage()
                if recovery:
                    batch.put(key, packed, self._copies_cf)
                    count += _IN_COPIES
                else:
                    batch.put(key, packed)
                # found there without reading values; the count says whether the batch holds
                # every id from first to last, so listing it needs no value either
                batch.put(key, count, self._batches_cf)
                self._staged_bytes += len(packed)
                self._write_staged(self._write_behind_bytes)
            self._batched.add(ledger_id)
            self._memtables.added(ledger_id, first, last, len(packed))
        else:
            pack, singles = _ENTRY_KEY.pack, self._singles_cf
            with self._lock:
                put = self._stage().put
                for entry_id, record in entries:
                    # a view: rocksdict wants bytes
                    put(pack(b"e", ledger_id, entry_id), bytes(record), singles)
                    self._staged_bytes += len(record)
                self._write_staged(self._write_behind_bytes)
            self._singles.add(ledger_id)
            last = max(last, max(entries)[0])
        self._last[ledger_id] = last

    def _copy_to_file(
        self, ledger_id: int, key: bytes, packed: bytes, count: bytes, last: int
    ) -> bool:
        """Put a batch of deferred copies (ids up to ``last``) into the ledger's copy file,
        if the engine has them and one can take it (engines/copy_files.py)."""
        if self._copy_files is None:
            return False
        with self._lock:  # with the last id: a failed ingestion forgets it under the lock
            if not self._copy_files.add(ledger_id, key, bytes(packed), count + _IN_COPIES):
                return False
            self._last[ledger_id] = last
        self._batched.add(ledger_id)
        # Its batches in the memtable lie below these, which are on the disk once ingested:
        # no read of the ledger counts on the memtable until its next batch there.
        self._memtables.forget_ledger(ledger_id)
        return True

    def _ingest_copies(self, ledger_id: int) -> None:
        """Ingest the ledger's copy files now (a read or listing of it; ``_lock`` held)."""
        assert self._copy_files is not None
        self._ingest_files(self._copy_files.take(ledger_id))

    def _ingest_files(self, files: list[CopyFile]) -> None:
        """Ingest copy files and write their index entries (``_lock`` held). A failure loses
        the failed file's ledger's copies (engines/copy_files.py): its last id is looked up
        again."""
        assert self._copy_files is not None, "engine is closed"
        try:
            self._copy_files.ingest(files, self._ingest_file, self._write_index)
        except OSError:
            for file in files:
                if not self._copy_files.pending(file.ledger_id):
                    self._last.pop(file.ledger_id, None)
            raise

    def _ingest_file(self, path: str) -> None:
        assert self._copies_db is not None, "engine is closed"
        self._copies_db.ingest_external_file([path], self._ingest_opt)

    def _write_index(self, index: list[tuple[bytes, bytes]]) -> None:
        """Write ingested batches' index entries into BATCHES_CF (``_lock`` held): only now,
        after their payloads are in the DB, so that no index entry points at a lost one."""
        if index:
            batch = self._stage()
            for key, value in index:
                batch.put(key, value, self._batches_cf)
            self._write_staged()

    def _copies_pending(self, ledger_id: int) -> bool:
        return self._copy_files is not None and self._copy_files.pending(ledger_id)

    def put_ledger(self, ledger_id: int, info: LedgerInfo) -> None:
        batch = WriteBatch(raw_mode=True)
        batch.put(info_key(ledger_id), info.to_bytes(), self._infos_cf)
        self._write(batch)
        self._infos[ledger_id] = info

    def delete_ledger(self, ledger_id: int) -> None:
        if not (
            ledger_id in self._infos or ledger_id in self._singles or ledger_id in self._batched
        ):
            return
        with self._lock:
            if self._copy_files is not None:
                self._copy_files.drop(ledger_id)
            batch = self._stage()  # after the ledger's staged puts, so that it deletes them too
            # 17 bytes of 0xff sort after every key of this ledger (ids up to 2**64-1).
            start = _LEDGER_KEY.pack(b"e", ledger_id)
            batch.delete_range(start, start + b"\xff" * 17, self._singles_cf)
            start = _LEDGER_KEY.pack(b"b", ledger_id)
            batch.delete_range(start, start + b"\xff" * 17)
            batch.delete_range(start, start + b"\xff" * 17, self._batches_cf)
            batch.delete_range(start, start + b"\xff" * 17, self._copies_cf)
            batch.delete(info_key(ledger_id), self._infos_cf)
            self._write_staged()
        self._deleted.add(ledger_id)
        self._infos.pop(ledger_id, None)
        self._singles.discard(ledger_id)
        self._batched.discard(ledger_id)
        self._last.pop(ledger_id, None)
        self._memtables.forget_ledger(ledger_id)
        with self._lock:
            self._deletions += 1
            self._parsed.drop_ledger(ledger_id)

    def _write(self, batch: WriteBatch) -> None:
        """Apply ``batch`` atomically (after the staged writes), without an fsync (``sync()``
        is the durability point)."""
        with self._lock:
            assert self._db is not None, "engine is closed"
            self._write_staged()
            self._db.write(batch, self._write_opt)

    def _stage(self) -> WriteBatch:
        """The batch gathering writes not in the DB yet (``_lock`` held)."""
        if self._staged is None:
            self._staged = WriteBatch(raw_mode=True)
        return self._staged

    def _write_staged(self, over: int = 0) -> None:
        """Write the staged batch if it holds more than ``over`` bytes (0: whatever it holds);
        ``_lock`` held. Every read of the DB calls this first."""
        if self._staged is not None and (not over or self._staged_bytes > over):
            assert self._db is not None, "engine is closed"
            staged, self._staged, self._staged_bytes = self._staged, None, 0
            self._db.write(staged, self._write_opt)

    def write_pressure(self) -> bool:
        """Whether a family has ``_IMMUTABLE_PAUSE`` memtables waiting for their flush: past
        ``_MEMTABLES_MAX - 1`` RocksDB slows every write down (to 16 MB/s) by sleeping in the
        writing thread, the bookie's event loop (``_open_db``, engines/rocksdb_options.py)."""
        with self._lock:
            families = (self._db, self._copies_db, self._singles_db)
            return any(
                family is not None
                and (family.property_int_value("rocksdb.num-immutable-mem-table") or 0)
                >= _IMMUTABLE_PAUSE
                for family in families
            )

    # ----- reads

    def can_read_now(self, ledger_id: int, entry_id: int) -> bool:
        """True unless the entry lies in a stored batch that may have to come from the disk:
        one neither cached nor still in a memtable (written less than a memtable's bytes ago,
        and not flushed by a ``sync()`` since)."""
        if ledger_id not in self._batched or entry_id < 0:
            return True  # entry keys only (a point lookup, Bloom-filtered), or nothing
        if entry_id > self.last_entry_id(ledger_id):
            return True  # absent
        if self._copies_pending(ledger_id):
            return False  # its copy files are ingested first
        if self._memtables.holds(ledger_id, entry_id):
            return True
        with self._lock:  # read threads add batches to the cache
            return self._parsed.find(ledger_id, entry_id) is not None

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        """Safe in several threads at once (can_read_now): the read of a batch's value, the
        one that may wait on the disk, runs outside the lock and without the GIL."""
        if entry_id < 0 or entry_id > self.last_entry_id(ledger_id):
            return None  # past the last entry: absent, without reading anything
        with self._lock:
            assert self._db is not None, "engine is closed"
            if self._copies_pending(ledger_id):
                self._ingest_copies(ledger_id)
            self._write_staged()
            if ledger_id in self._singles:  # an entry key is the newest copy (module doc)
                assert self._singles_db is not None
                value: bytes | None = self._singles_db.get(entry_key(ledger_id, entry_id))
                if value is not None:
                    return value
            if ledger_id not in self._batched:
                return None
            batch = self._parsed.find(ledger_id, entry_id)
            if batch is not None:
                return batch.record(entry_id)
            found = self._iterate(lambda it: _db_batch(it, ledger_id, entry_id),
                                  self._batches_db)  # fmt: skip
            if found is None:
                return None
            first, last, copied = found
            family = self._copies_db if copied else self._db
            assert family is not None
            deletions = self._deletions
            self._reading += 1
            # Still in a memtable (as can_read_now saw it): a plain get, the GIL held for
            # microseconds; released, the event loop (which reads these) would have to take
            # it back from whichever thread took it meanwhile (the journal's, a reader's).
            in_memory = self._memtables.holds_batch(ledger_id, first)
        key = _BATCH_KEY.pack(b"b", ledger_id, first, last)
        try:
            value = family.get(key) if in_memory else _get_without_gil(family, key)
        finally:
            with self._lock:
                self._reading -= 1
                if not self._reading:
                    self._idle.notify_all()
        if value is None:
            return None
        batch = _Batch(last, value)
        with self._lock:
            if deletions == self._deletions:  # else the ledger may be gone: cache nothing
                self._parsed.remember(ledger_id, first, batch)
        return batch.record(entry_id)

    def last_entry_id(self, ledger_id: int) -> int:
        last = self._last.get(ledger_id)
        if last is None:
            if ledger_id not in self._singles and ledger_id not in self._batched:
                last = -1  # no entries (a new ledger): no read, which would write the staged
            else:
                with self._lock:
                    last = max(self._iterate(lambda it: _db_last(it, ledger_id, b"e"),
                                             self._singles_db),
                               self._iterate(lambda it: _db_last(it, ledger_id, b"b"),
                                             self._batches_db))  # fmt: skip
            # Only if absent: a read thread's figure may be older than a write just made (the
            # writes, on the loop, set it outright)
            last = self._last.setdefault(ledger_id, last)
        return last

    def list_entries(self, ledger_id: int, start_entry_id: int, max_count: int) -> list[int]:
        start = max(start_entry_id, 0)
        if max_count <= 0:
            return []
        with self._lock:
            if self._copies_pending(ledger_id):
                self._ingest_copies(ledger_id)
            ids = self._iterate(lambda it: _db_ids(it, ledger_id, start, max_count),
                                self._singles_db)  # fmt: skip
            if ledger_id in self._batched:
                db, copies = self._db, self._copies_db
                assert db is not None and copies is not None, "engine is closed"
                more = self._iterate(
                    lambda it: _db_batch_ids(it, (db, copies), ledger_id, start, max_count),
                    self._batches_db,
                )
                ids = sorted(set(ids).union(more))[:max_count]
        return ids

    def get_ledger(self, ledger_id: int) -> LedgerInfo | None:
        return self._infos.get(ledger_id)

    def ledgers(self) -> list[int]:
        return sorted(self._singles.union(self._batched, self._infos))

    def statistics(self) -> dict[str, int]:
        """Counters for metrics: ledgers, syncs."""
        files = self._copy_files
        return {
            "ledgers": len(self._singles.union(self._batched, self._infos)),
            "syncs": self._syncs,
            "copy_files_ingested": files.ingested_files if files else 0,
            "copy_bytes_ingested": files.ingested_bytes if files else 0,
        }

    # ----- space

    def reclaim_space(self, live_ratio_min: float) -> int:
        """Compact the key ranges of the ledgers deleted since the last call: the range
        deletes then drop their keys (and blob files whose every entry is gone), and the SSTs
        are rewritten without them. When less than ``live_ratio_min`` of ``COPIES_CF``'s blob
        bytes is still live, its live payloads move to new blob files too. Returns the SST and
        blob bytes freed (RocksDB's figures before and after). A crash at any point leaves
        RocksDB's own consistent state: the range deletes were written (and synced by the
        bookie) before."""
        with self._lock:
            deleted, self._deleted = sorted(self._deleted), set()
        if not deleted:
            return 0
        with self._sync_lock:  # close() waits for it
            db, batches, copies, singles = (self._db, self._batches_db, self._copies_db,
                                            self._singles_db)  # fmt: skip
            assert db and batches and copies and singles, "engine is closed"
            before = _stored_bytes(db, batches, copies, singles)
            spaces = ((b"e", singles), (b"b", db), (b"b", batches), (b"b", copies))
            for ledger_id in deleted:
                for space, family in spaces:
                    start = _LEDGER_KEY.pack(space, ledger_id)
                    family.compact_range(start, start + b"\xff" * 17)
            _collect_copies(copies, live_ratio_min)
            return max(0, before - _stored_bytes(db, batches, copies, singles))

    # ----- durability

    def sync(self) -> None:
        with self._sync_lock:
            with self._lock:
                db, infos, batches, copies, singles = (
                    self._db, self._infos_db, self._batches_db, self._copies_db, self._singles_db
                )  # fmt: skip
                assert db and infos and batches and copies and singles, "engine is closed"
                self._write_staged()
                put_bytes = self._memtables.put_bytes
                files = self._copy_files.seal_all() if self._copy_files is not None else []
            if files:  # the copy files: their bulk synced here, then ingested under the lock
                sync_data(files)
                with self._lock:
                    self._ingest_files(files)
            # The durability point; both release the GIL while they write and fsync. One WAL
            # serves every column family; without it, each flushes its own memtable.
            if self._wal:
                db.flush_wal(True)
            else:
                infos.flush(True)
                singles.flush(True)
                copies.flush(True)  # before the batch keys that point into it
                batches.flush(True)
                db.flush(True)
                self._memtables.flushed(put_bytes)  # what was in them is in SSTs now
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
            self._idle.wait_for(lambda: not self._reading)  # a read thread's multi-get
            db, self._db = self._db, None
            self._infos_db = self._infos_cf = None  # handles also hold the LOCK
            self._batches_db = self._batches_cf = None
            self._copies_db = self._copies_cf = None
            self._singles_db = self._singles_cf = None
            self._staged, self._staged_bytes = None, 0  # close() synced them; else a failure
            if self._copy_files is not None:
                self._copy_files.close()
            if db is not None:
                db.close()
            del db


def _get_without_gil(family: Rdict, key: bytes) -> bytes | None:
    """``family.get(key)``, with the GIL released while RocksDB reads: rocksdict 0.3.29 does
    that for a list of keys (its multi-get) only, and holds it through one key's read from the
    disk (a thread reading 1 MiB values stopped the others ~half of the time)."""
    keys: list[str | int | float | bytes | bool] = [key]  # (the element type of its stub)
    return cast("list[bytes | None]", family.get(keys))[0]


def _stored_bytes(*families: Rdict) -> int:
    """SST and blob file bytes of the column families (RocksDB's own accounting)."""
    total = 0
    for family in families:
        for name in ("rocksdb.total-sst-files-size", "rocksdb.total-blob-file-size"):
            total += family.property_int_value(name) or 0
    return total
