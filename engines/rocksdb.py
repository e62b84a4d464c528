"""RocksDBEngine: ledger storage in one RocksDB (rocksdict 0.3.29), group-committed by sync().

Theory of operation
-------------------
One RocksDB in raw mode, in column families: the ledger infos (``infos``), batches of entries
(the default family, and ``copies`` for recovery adds), entries under keys of their own
(``singles``) and every batch key again (``batches``). Their keys and values, and the seeks
that read them back, are in engines/rocksdb_keys.py; opening the DB and the options of its
families (memtables, level 0, paced writes, blob files) in engines/rocksdb_options.py.

Why batches: a key costs the event loop ~0.8 µs of RocksDB work (the ``WriteBatch.put`` call and
the memtable's skiplist insert) whatever its value's size, and a bookie takes up to ~256 entries
per add request: one key per call took that work from ~1.0 to ~0.2 µs per 1 KiB entry
(docs/performance.md at e27bdd3, seventh round). A call's entries become a batch when their ids
ascend and all lie above the ledger's last stored entry, which is how a writer's adds arrive:
batches then never overlap, so the one batch that may hold entry *e* is the one with the
greatest first id <= *e* (one ``seek_for_prev``; its id range is in the key, so a miss reads no
value). Anything else — an entry at or below the last one stored (a re-sent add, a recovery's
re-write, the journal's replay of what the engine already has), ids out of order — goes under an
entry key. Reads try the entry key first: it was written after any batch holding the same id, so
it is the newest copy. Reads keep the last few batches they parsed (``batch_cache_bytes``, at
most ``_PARSED_COUNT_MAX`` of them), so reading a batch's entries one by one parses it once.

Why infos apart: a memtable flush of a ledger's new batches then makes an SST whose keys lie
after every older SST's of that ledger, which RocksDB moves down the levels without rewriting
it. An info flushed with them made that SST span every key in between: with infos after the
entries (``b"l"``, until 2026-11) every flush overlapped the SST holding the info (7 % of a
bookie's CPU at 50k adds/s); with infos before them (``b"L"`` in the same family, until
2026-11-23) a new ledger's first flush overlapped every batch of every ledger with a smaller
id, so each new ledger compacted older ones (docs/performance.md at e27bdd3, seventh round).
A dir with ``b"L"`` infos in the default family has them moved on open.

Why entry keys apart (since 2026-11-27): among the batches they sorted after every batch key, so
an SST holding one spanned from its batches to it, over every batch key a later ledger would
ever get; once such an SST sat in the last level every flush overlapped it and compacted its
megabytes again (one re-sent add in a bookie filled with 480 MiB: 269 MiB of compaction against
none; a bookie filled with 1 GiB then re-replicated at a third of the speed). They come from
re-sent adds, recoveries' write-backs and journal replays, so few, but every bookie gets some.
A dir with entry keys in the default family has them moved on open (``_move_singles``).

Lookups never position on a value they do not need: RocksDB reads the whole data block a key
lands in, and a block holding a 4 MiB entry took a lookup of an absent id next to it from ~10
µs to ~0.7 ms (8,000 long-poll expiries then blocked a bookie's loop for seconds). So:

* an id past the ledger's last entry (a tailer's or a long poll's next entry, recovery's probe
  past the end) is absent without a read: ``last_entry_id`` is cached;
* every batch key is also written, with its number of entries as the only value, to the
  column family ``batches`` (``BATCHES_CF``): the batch that may hold an id is found there, and
  its value is then read by its exact key only when its id range covers the id; listing a
  ledger's ids reads no value of a batch whose count fills its id range (a dir written
  before the counts has empty values there: its batches are listed from their values);
* the entries' column family has a Bloom filter, so the point lookup of an absent entry key
  (a ledger with entry keys checks them first on every read) skips the data blocks.

A dir written before the ``batches`` family existed gets its batch keys copied there on open
(one pass over the batches, then a marker key; synced).

Why copies apart: the batches of recovery adds (``put_entries(..., recovery=True)``: the copies
autorecovery makes, a recovery's write-back) go to the column family ``copies``
(``COPIES_CF``), with blob files, and their index entry in ``batches`` says so (a suffix after
the count). A bookie that takes copies already holds SSTs over the copied ledgers' key range
(its own ledgers, written at the same time), so in the entries' family every flush of copies
overlapped them and compaction rewrote megabytes of payload again and again: re-replicating 1
GiB ran at 18-24 MB/s, the target's disk busy compacting. In ``copies`` the payloads go to
blob files at flush and compactions move keys and ~30-byte references only. A blob file holds
the copies of the few ledgers copied at the same time, so a deleted ledger's payloads may share
files with live ones: blob garbage collection is on there (a compaction moves the live payloads
of the oldest quarter of the blob files it meets, and such files past half garbage are compacted
for it), and ``reclaim_space`` moves every live payload once less than ``live_ratio_min`` of the
family's blob bytes is live (BookKeeper's compaction threshold for entry logs).
Writers' adds stay in the entries' family, where one ledger's SSTs only move down the levels
(blob files there cost one ledger 4-8 %: ``blob_files``).
Deferred-sync copies (``put_entries(..., deferred=True)``, autorecovery's) reach ``copies``
another way when ``copy_file_bytes`` is set: written into SST files of their own and ingested
at ``sync()``, they skip the memtables and the flushes' pacing (engines/copy_files.py). Their
index entries in ``batches`` are written only once their file is ingested, and reads or
listings of a ledger with files not ingested yet ingest them first.

A write batch spanning the families is still atomic; one WAL serves them all, and without
it ``sync()`` flushes each family's memtable.

Writes (``sync=False``) go into one staged ``WriteBatch``. With the WAL (``wal=True``) it
reaches the DB at the end of each call. Without it (below) it may gather several calls, up to
``write_behind_bytes``: a write is then no more volatile there than in the memtable, and one
add at a time no longer pays RocksDB's ``write`` per add on cold caches (~25 µs of a bookie's
CPU per add in situ, ~8 µs in a cold microbenchmark; docs/performance.md at e27bdd3, twelfth round).
Every read of the DB, ``sync()``, ``delete_ledger`` and ``put_ledger`` write the staged batch
first, under the same lock, so reads need no overlay of our own. (Until 2026-11 writes
gathered behind an overlay dict; each entry then cost a dict insert and every read an overlay
check, ~0.3 µs of Python per entry.)
``sync()`` calls ``flush_wal(True)``: the WAL fsync is the durability point, and rocksdict
runs it without the GIL. After a crash RocksDB replays the WAL in point-in-time mode: a torn
tail is dropped and nothing after it is applied, so a lost write is absent and a present one
is whole.

With ``wal=False`` (a bookie whose journal holds every write: the journal *is* the write-ahead
log, and RocksDB's own WAL would write each entry a second time on the event-loop thread) the
batches skip the WAL and ``sync()`` flushes the memtable into an SST instead (``flush(True)``,
also without the GIL). A crash then loses everything since the last flush, and the bookie's
journal replay puts it back.

Reads may run in several threads (``can_read_now``, bookie/read_pool.py): a read finds its
batch under the lock and reads the value outside it, without the GIL, so that a read from the
disk stops neither the writes nor the other reads.

Ledger infos and the set of ledgers that have entries are small, so they live in memory (loaded on
open, one seek per ledger); ``last_entry_id`` is cached per ledger.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict, deque
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
    _ID,
    _ID_MAX,
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
from .rocksdb_options import _IMMUTABLE_PAUSE, BLOB_BYTES_MIN, _collect_copies, _open_db

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

_PARSED_COUNT_MAX = 16  # batches kept parsed for reads (each read looks through them)
_RECENT_MAX = 65_536  # batches known to be in a memtable (tiny entries: a few MiB of them)
_T = TypeVar("_T")
_MOVE_BYTES = 64 << 20  # entry keys moved to SINGLES_CF per write, opening an older dir


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
        # Batches parsed by reads, newest last: (ledger, first id) -> batch; within the bound.
        self._parsed: OrderedDict[tuple[int, int], _Batch] = OrderedDict()
        self._parsed_bytes = 0
        self._parsed_bytes_max = batch_cache_bytes
        # Read threads (can_read_now): how many read a batch outside the lock (close waits for
        # none), and how many ledgers were deleted (a batch read across a delete is not cached).
        self._reading = 0
        self._idle = threading.Condition(self._lock)
        self._deletions = 0
        # Batches still in a memtable, so that a read of them is known not to wait on the
        # disk (can_read_now): those written here less than a memtable's bytes ago and since
        # the last flush, oldest first, as (_put_bytes after it, ledger, last id); and per
        # ledger the first id from which every batch of it is among them.
        self._recent: deque[tuple[int, int, int]] = deque()
        self._recent_from: dict[int, int] = {}
        self._put_bytes = 0  # payload bytes of the batches written since open
        self._flushed_at = 0  # _put_bytes when sync() last flushed the memtables (wal=False)
        self._memtable_bytes = memtable_bytes
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
        ledger and key space). Infos still in the default column family (a dir written before
        2026-11-23) move to their own, in one write, synced."""

        def infos(it: RdictIter) -> dict[int, bytes]:
            found = {}
            it.seek(b"L")
            while it.valid() and it.key()[:1] == b"L":
                found[_ID.unpack_from(it.key(), 1)[0]] = it.value()
                it.next()
            return found

        def scan(it: RdictIter) -> dict[int, bytes]:
            it.seek(b"l")
            if it.valid() and it.key()[:1] == b"l":
                raise OSError(
                    errno.EINVAL,
                    f"ledger dir {self.directory} has ledger infos under the old b'l' keys "
                    "(before 2026-11); this version reads b'L' keys only",
                )
            return infos(it)

        old = self._iterate(scan)
        self._move_singles()
        self._iterate(lambda it: _skip_scan(it, b"e", self._singles), self._singles_db)
        current = self._iterate(infos, self._infos_db)
        assert self._batches_db is not None
        if self._batches_db.get(_BATCHES_MARKER) is None:
            self._index_batches()  # a dir from before BATCHES_CF (or a new one)
        else:
            self._iterate(lambda it: _skip_scan(it, b"b", self._batched), self._batches_db)
        if old:
            batch = WriteBatch(raw_mode=True)
            for ledger_id, data in old.items():
                if ledger_id not in current:
                    batch.put(info_key(ledger_id), data, self._infos_cf)
                batch.delete(info_key(ledger_id))
            self._write(batch)
            self.sync()
        for ledger_id, data in {**old, **current}.items():
            self._infos[ledger_id] = LedgerInfo.from_bytes(data)

    def _move_singles(self) -> None:
        """Move entry keys from the entries' family to ``SINGLES_CF`` (a dir written before
        2026-11-27), in writes of at most ``_MOVE_BYTES`` and then one range delete, synced. A
        crash in between leaves copies in both, and the next open moves them again."""

        def move(it: RdictIter) -> bool:
            it.seek(b"e")
            moved, batch, size = False, WriteBatch(raw_mode=True), 0
            while it.valid() and it.key()[:1] == b"e":
                value = it.value()
                batch.put(it.key(), value, self._singles_cf)
                moved, size = True, size + len(value)
                if size >= _MOVE_BYTES:
                    self._write(batch)
                    batch, size = WriteBatch(raw_mode=True), 0
                it.next()
            if len(batch):
                self._write(batch)
            return moved

        if self._iterate(move):
            batch = WriteBatch(raw_mode=True)
            batch.delete_range(b"e", b"f")
            self._write(batch)
            self.sync()

    def _index_batches(self) -> None:
        """Copy every batch key to ``BATCHES_CF`` (a dir written before it existed), mark it
        complete, sync. One pass over the batches, once. A new dir just gets the marker,
        durable with the first sync (lost, the next open copies nothing again)."""

        def copy(it: RdictIter) -> WriteBatch:
            batch = WriteBatch(raw_mode=True)
            it.seek(b"b")
            while it.valid() and it.key()[:1] == b"b":
                batch.put(it.key(), b"", self._batches_cf)
                self._batched.add(_ID.unpack_from(it.key(), 1)[0])
                it.next()
            batch.put(_BATCHES_MARKER, b"", self._batches_cf)
            return batch

        self._write(self._iterate(copy))
        if self._batched:
            self.sync()

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
            self._put_bytes += len(packed)
            self._recent_from.setdefault(ledger_id, first)
            self._recent.append((self._put_bytes, ledger_id, last))
            self._forget_flushed()
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
        self._recent_from.pop(ledger_id, None)
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
        self._recent_from.pop(ledger_id, None)  # (its batches in _recent are aged out alone)
        with self._lock:
            self._deletions += 1
            for key in [k for k in self._parsed if k[0] == ledger_id]:
                self._parsed_bytes -= len(self._parsed.pop(key).value)

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
        self._forget_flushed()
        recent_from = self._recent_from.get(ledger_id)
        if recent_from is not None and entry_id >= recent_from:
            return True
        with self._lock:  # read threads add batches to the cache
            return self._parsed_batch(ledger_id, entry_id) is not None

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
            batch = self._parsed_batch(ledger_id, entry_id)
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
            in_memory = self._recent_from.get(ledger_id, _ID_MAX) <= first
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
                self._remember(ledger_id, first, batch)
        return batch.record(entry_id)

    def _forget_flushed(self) -> None:
        """Drop from ``_recent`` the batches a memtable flush has written to an SST by now
        (the loop's thread only)."""
        recent, recent_from = self._recent, self._recent_from
        if not recent:
            return
        oldest = max(self._put_bytes - self._memtable_bytes, self._flushed_at)
        while recent and (recent[0][0] <= oldest or len(recent) > _RECENT_MAX):
            _, ledger_id, last = recent.popleft()
            if ledger_id in recent_from:  # (not deleted since)
                recent_from[ledger_id] = last + 1  # its later batches are still in memory

    def _parsed_batch(self, ledger_id: int, entry_id: int) -> _Batch | None:
        """The cached batch whose id range covers ``entry_id``, or None (``_lock`` held)."""
        for (lid, first), batch in reversed(self._parsed.items()):
            if lid == ledger_id and first <= entry_id <= batch.last:
                return batch
        return None

    def _remember(self, ledger_id: int, first: int, batch: _Batch) -> None:
        """Cache a batch just read, within the cache's bounds (``_lock`` held)."""
        if len(batch.value) <= self._parsed_bytes_max:
            old = self._parsed.pop((ledger_id, first), None)  # two threads read it at once
            if old is not None:
                self._parsed_bytes -= len(old.value)
            self._parsed[(ledger_id, first)] = batch
            self._parsed_bytes += len(batch.value)
            while (
                self._parsed_bytes > self._parsed_bytes_max or len(self._parsed) > _PARSED_COUNT_MAX
            ):
                self._parsed_bytes -= len(self._parsed.popitem(last=False)[1].value)

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
                put_bytes = self._put_bytes
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
                self._flushed_at = put_bytes  # what was in the memtables is in SSTs now
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
