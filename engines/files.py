"""FilesEngine: ledger storage in append-only, self-checking entry logs and an in-memory index.

Theory of operation
-------------------
Every write (entry, ledger info, delete tombstone) becomes one *record* appended to the current
entry log ``entrylog-XXXXXXXX.log``. Records are staged in a memory buffer and reach the file with
one ``os.write`` when the buffer fills or on ``sync()``, and the kernel is told to start
writing them to the disk at once (``sync_file_range``: a checkpoint's fdatasync then finds
little left to write, and the journal's fdatasyncs on the same disk do not wait behind it).
``sync()`` then ``fdatasync``s every log written since the previous sync, and the directory
when a log was created. A log rolls over at
the first ``sync()`` after it passed ``entry_log_bytes_max``, in the sync's thread: the old log
is fdatasync'ed to its end before the next one is created, so a torn record can only ever sit
at the tail of the newest log — and no put waits for that fdatasync (it once ran inside the put
that crossed the bound: up to 256 MiB synced on the event loop). The bulk of it runs outside
the lock; only what was appended meanwhile is synced under it, right before the switch.

The index lives in memory: per ledger, chunks of 1024 entry slots in ``array('q')`` (two numbers
per slot: the location ``log_id << 40 | offset`` or -1 for a hole, and the record length), plus
the ledger info and the highest entry id. A record still in the buffer is read from the buffer.

The index is checkpointed into a snapshot file that names the log position it covers (on a sync
once ``snapshot_interval_bytes`` were appended since the last one, and on close). Under the lock
a sync only takes the index's shape (per ledger its info, last id and chunk map) and marks the
chunks as shared; a put that changes a shared chunk copies it first (copy-on-write), so the
snapshot is serialized outside the lock, in pieces, and still describes exactly the log prefix
it names. Opening loads the newest valid snapshot and replays the logs from its position. A bad
record at the tail of the newest log is a write torn by a crash and is truncated away; a bad
record anywhere else is corruption and opening fails. The byte layouts are in docs/engines.md.

Space comes back through ``reclaim_space`` (the bookie's garbage collector): entry logs whose
live fraction fell below a ratio are compacted — live records copied forward, the log dropped
(``files_compaction.py``, crash-safe at every step).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import mmap
import os
import re
import struct
import sys
import threading
from array import array
from collections.abc import Callable
from typing import cast

import msgpack
from xxhash import xxh3_64, xxh3_64_intdigest

from bookkeeper_aio.engine import LedgerInfo, Record

from .files_compaction import LogSummary, reclaim

log = logging.getLogger(__name__)

ENTRY, LEDGER_INFO, DELETE_LEDGER = 1, 2, 3
MAGIC = 0x31414B42  # the bytes b"BKA1" read as a little-endian u32
HEAD = struct.Struct("<IB3xIQQ")  # magic, record type, data length, ledger id, entry id
SUM = struct.Struct("<Q")  # xxh3_64 over the 28 HEAD bytes followed by the data
HEADER_BYTES = HEAD.size + SUM.size  # 36
OFFSET_BITS = 40  # location = log_id << 40 | offset: logs up to 1 TiB, 2**23 logs
SNAPSHOT_MAGIC = b"BKAIDX01"
SNAPSHOT_TAIL_BYTES = 4096  # a snapshot checksums this much log before its position
SNAPSHOTS_KEPT = 2
_OFFSET_MASK = (1 << OFFSET_BITS) - 1
# A log rolls at a sync once past entry_log_bytes_max; past this it rolls at once (a log may not
# outgrow its locations, and a record is at most 4 GiB).
_LOG_BYTES_HARD_MAX = (1 << OFFSET_BITS) - (1 << 33)
_ROLL_SYNC_ROUNDS = 4  # fdatasyncs outside the lock before the last bit is synced under it
_CHUNK_BITS = 10
_HOLES = array("q", [-1, 0]) * (1 << _CHUNK_BITS)
_LOG_NAME = re.compile(r"entrylog-([0-9a-f]{8})\.log")
_SNAPSHOT_NAME = re.compile(r"index-([0-9a-f]{8})-([0-9a-f]{16})\.snap")


class LogCorruptError(RuntimeError):
    """A record that was durably written fails its checks: the ledger dir is damaged."""


class _Ledger:
    """One ledger's index: chunked entry locations, the highest entry id, the info."""

    __slots__ = ("chunks", "info", "last", "shared")

    def __init__(self) -> None:
        self.chunks: dict[int, array[int]] = {}  # entry_id >> 10 -> [loc, length] * up to 1024
        self.info: LedgerInfo | None = None
        self.last = -1
        self.shared: set[int] | None = None  # chunks a snapshot holds: copied before a change

    def set(self, entry_id: int, loc: int, length: int) -> None:
        chunk = entry_id >> _CHUNK_BITS
        slots = self.chunks.get(chunk)
        if self.shared and chunk in self.shared:  # the snapshot's copy stays as it was
            self.shared.discard(chunk)
            assert slots is not None  # a snapshot shares only chunks the ledger has
            slots = self.chunks[chunk] = array("q", slots)
        if slots is None:
            slots = self.chunks[chunk] = array("q")
        i = (entry_id & ((1 << _CHUNK_BITS) - 1)) * 2
        if len(slots) <= i:  # grow lazily so a small ledger costs a few slots, not a chunk
            slots.extend(_HOLES[: i + 2 - len(slots)])
        slots[i] = loc
        slots[i + 1] = length
        if entry_id > self.last:
            self.last = entry_id

    def get(self, entry_id: int) -> tuple[int, int] | None:
        slots = self.chunks.get(entry_id >> _CHUNK_BITS)
        i = (entry_id & ((1 << _CHUNK_BITS) - 1)) * 2
        if slots is None or i >= len(slots) or slots[i] < 0:
            return None
        return slots[i], slots[i + 1]

    def ids(self, start: int, max_count: int) -> list[int]:
        out: list[int] = []
        for c in sorted(k for k in self.chunks if k >= max(start, 0) >> _CHUNK_BITS):
            slots, base = self.chunks[c], c << _CHUNK_BITS
            for i in range(0, len(slots), 2):
                if slots[i] >= 0 and base + i // 2 >= start:
                    if len(out) >= max_count:
                        return out
                    out.append(base + i // 2)
        return out

    def capture(self) -> tuple[bytes | None, int, dict[int, array[int]]]:
        """The ledger as a snapshot will hold it (lock held): its chunks become shared."""
        self.shared = set(self.chunks)
        return self.info.to_bytes() if self.info else None, self.last, dict(self.chunks)

    @classmethod
    def load(cls, info: bytes | None, last: int, chunks: list[list[object]]) -> _Ledger:
        ledger = cls()
        ledger.info = LedgerInfo.from_bytes(info) if info is not None else None
        ledger.last = last
        for c, raw in chunks:
            assert isinstance(c, int) and isinstance(raw, bytes)
            slots = array("q")
            slots.frombytes(raw)
            if sys.byteorder == "big":
                slots.byteswap()
            ledger.chunks[c] = slots
        return ledger


def _le_bytes(slots: array[int]) -> bytes:
    if sys.byteorder == "big":
        slots = array("q", slots)
        slots.byteswap()
    return slots.tobytes()


class FilesEngine:
    """An :class:`~bookkeeper_aio.engine.Engine` on plain files in one ledger dir.

    Raises (on open):
        OSError: the dir cannot be created, or another process has it open (EBUSY).
        LogCorruptError: a record before the tail of the newest log is damaged.
    """

    _log_end: int  # where the next record goes in the current log (set by _open_log)

    def __init__(
        self,
        directory: str,
        *,
        entry_log_bytes_max: int = 256 << 20,
        write_buffer_bytes_max: int = 1 << 20,
        snapshot_interval_bytes: int = 64 << 20,
    ) -> None:
        assert 0 < entry_log_bytes_max <= 1 << (OFFSET_BITS - 1)
        self.directory = os.path.abspath(directory)
        self._log_bytes_max = entry_log_bytes_max
        self._buffer_bytes_max = write_buffer_bytes_max
        self._snapshot_interval = snapshot_interval_bytes
        os.makedirs(self.directory, exist_ok=True)
        self._lock_fd: int | None = _lock_dir(self.directory)
        self._lock = threading.Lock()  # buffer, log position, index, fds: sync thread vs the rest
        self._sync_lock = threading.Lock()  # one sync or snapshot at a time
        self._ledgers: dict[int, _Ledger] = {}
        self._fds: dict[int, int] = {}
        self._buf = bytearray()
        self._dirty: set[int] = set()  # logs written since the last sync
        self._synced_end = 0  # the current log is durable up to here (as far as we know)
        self._dir_dirty = False
        self._since_snapshot = 0
        self._syncs = 0
        self._failure: OSError | None = None  # a failed write or fdatasync poisons the engine
        self._closed = False
        # Compaction (files_compaction.py): per-log summaries (logs never change), descriptors
        # of dropped logs (closed a pass later), counters.
        self._summaries: dict[int, LogSummary] = {}
        self._retired_fds: list[int] = []
        self._compaction = {"logs_compacted": 0, "logs_deferred": 0, "bytes_copied": 0,
                            "bytes_freed": 0}  # fmt: skip
        try:
            self._recover()
        except BaseException:
            self._close_files()
            raise

    # ----- writes

    def put_entry(self, ledger_id: int, entry_id: int, record: Record) -> None:
        head = HEAD.pack(MAGIC, ENTRY, len(record), ledger_id, entry_id)
        tail = SUM.pack(xxh3_64_intdigest(head + record))
        with self._lock:
            loc = self._append(head, tail, record)
            ledger = self._ledgers.get(ledger_id)
            if ledger is None:
                ledger = self._ledgers[ledger_id] = _Ledger()
            ledger.set(entry_id, loc, len(record))

    def put_entries(
        self,
        ledger_id: int,
        entries: list[tuple[int, Record]],
        packed: bytes | None = None,
        recovery: bool = False,
        deferred: bool = False,
    ) -> None:
        for entry_id, record in entries:
            self.put_entry(ledger_id, entry_id, record)

    def put_ledger(self, ledger_id: int, info: LedgerInfo) -> None:
        data = info.to_bytes()
        head = HEAD.pack(MAGIC, LEDGER_INFO, len(data), ledger_id, 0)
        with self._lock:
            self._append(head, SUM.pack(xxh3_64_intdigest(head + data)), data)
            self._ledgers.setdefault(ledger_id, _Ledger()).info = info

    def _append_info(self, ledger_id: int, info: LedgerInfo) -> None:
        """Append the ledger's info again, the index unchanged. Caller holds ``_lock``."""
        data = info.to_bytes()
        head = HEAD.pack(MAGIC, LEDGER_INFO, len(data), ledger_id, 0)
        self._append(head, SUM.pack(xxh3_64_intdigest(head + data)), data)

    def delete_ledger(self, ledger_id: int) -> None:
        if ledger_id not in self._ledgers:
            return
        head = HEAD.pack(MAGIC, DELETE_LEDGER, 0, ledger_id, 0)
        with self._lock:
            self._append(head, SUM.pack(xxh3_64_intdigest(head)), b"")
            del self._ledgers[ledger_id]

    def _append(self, head: bytes, tail: bytes, data: Record) -> int:
        """Stage one record; return its location. Caller holds ``_lock``."""
        self._check_usable()
        if self._log_end >= _LOG_BYTES_HARD_MAX:
            self._roll()  # no sync came for a very long time: roll here, whatever it costs
        pos = self._log_end
        buf = self._buf
        buf += head
        buf += tail
        buf += data
        self._log_end = pos + HEADER_BYTES + len(data)
        self._since_snapshot += HEADER_BYTES + len(data)
        if len(buf) >= self._buffer_bytes_max:
            self._flush()
        return (self._log_id << OFFSET_BITS) | pos

    def _check_usable(self) -> None:
        assert not self._closed, "engine is closed"
        if self._failure is not None:
            # A failed fdatasync cannot be retried (the kernel may have dropped the dirty pages),
            # and after a failed write the log's end is unknown. Reopening recovers from disk.
            raise OSError(errno.EIO, f"ledger dir {self.directory} failed: {self._failure}")

    def _flush(self) -> None:
        """Write the buffer to the current log with one os.write. Caller holds ``_lock``."""
        if self._buf:
            fd = self._fds[self._log_id]
            try:
                _write_all(fd, self._buf)
            except OSError as e:
                self._failure = e
                raise
            _start_writeback(fd, self._log_end - len(self._buf), len(self._buf))
            self._buf = bytearray()
            self._flushed = self._log_end
            self._dirty.add(self._log_id)

    def _roll(self) -> None:
        """Switch to the next log, the current one synced to its end first (so a torn record
        can only ever be at the tail of the newest log). Caller holds ``_lock``."""
        self._flush()
        self._fdatasync(self._fds[self._log_id])
        self._dirty.discard(self._log_id)
        self._open_log(self._log_id + 1)

    def _roll_if_full(self) -> None:
        """Roll a log past ``entry_log_bytes_max`` (the sync thread, ``_sync_lock`` held):
        sync the bulk outside the lock while puts go on, then under it only the rest."""
        for _ in range(_ROLL_SYNC_ROUNDS):
            with self._lock:
                self._check_usable()
                if self._log_end < self._log_bytes_max:
                    return
                self._flush()
                fd, end = self._fds[self._log_id], self._log_end
                if end - self._synced_end <= self._buffer_bytes_max:
                    break  # little left: sync it under the lock, below
            self._fdatasync(fd)
            with self._lock:
                if self._fds.get(self._log_id) == fd:
                    self._synced_end = end
        with self._lock:
            if self._log_end >= self._log_bytes_max:
                self._roll()
                self._synced_end = 0

    def _fdatasync(self, fd: int) -> None:
        try:
            os.fdatasync(fd)
        except OSError as e:
            self._failure = e  # a failed fdatasync cannot be retried: poison the engine
            raise

    def _open_log(self, log_id: int) -> None:
        path = self._log_path(log_id)
        created = not os.path.exists(path)
        read_only = self._fds.pop(log_id, None)  # recovery may have opened it for reading
        if read_only is not None:
            os.close(read_only)
        fd = self._fds[log_id] = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self._log_id = log_id
        self._log_end = self._flushed = os.fstat(fd).st_size
        self._synced_end = 0  # as far as we know: a roll syncs it all
        self._dir_dirty |= created

    # ----- reads

    def write_pressure(self) -> bool:
        return False  # appends go straight to the current log: no backlog of our own

    def can_read_now(self, ledger_id: int, entry_id: int) -> bool:
        # Read on the event loop (a pread, mostly from the page cache); get_entry is not made
        # safe in several threads (its log rolls and compactions swap fds under it).
        return True

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        ledger = self._ledgers.get(ledger_id)
        found = self._read_record(ledger, entry_id) if ledger is not None else None
        if found is None:
            return None
        raw, log_id, pos, length = found
        parsed = _parse(raw, 0, len(raw))
        if parsed is None or parsed != (ENTRY, ledger_id, entry_id, length):
            raise LogCorruptError(
                f"entry {ledger_id}:{entry_id} at {self._log_path(log_id)} offset {pos} is damaged"
            )
        return raw[HEADER_BYTES:]

    def _read_record(self, ledger: _Ledger, entry_id: int) -> tuple[bytes, int, int, int] | None:
        """(record bytes, log id, offset, data length) of an entry, or None. The location is
        looked up under the lock: a compaction (files_compaction.py) moves it under the lock,
        and closes a dropped log's descriptor only a pass later."""
        with self._lock:
            assert not self._closed, "engine is closed"
            where = ledger.get(entry_id)
            if where is None:
                return None
            loc, length = where
            log_id, pos, size = loc >> OFFSET_BITS, loc & _OFFSET_MASK, HEADER_BYTES + length
            if log_id == self._log_id and pos >= self._flushed:
                start = pos - self._flushed
                return bytes(self._buf[start : start + size]), log_id, pos, length
            fd = self._read_fd(log_id)
        # flushed bytes never change: read outside the lock
        return os.pread(fd, size, pos), log_id, pos, length

    def _read_fd(self, log_id: int) -> int:
        fd = self._fds.get(log_id)
        if fd is None:
            fd = self._fds[log_id] = os.open(self._log_path(log_id), os.O_RDONLY)
        return fd

    def last_entry_id(self, ledger_id: int) -> int:
        ledger = self._ledgers.get(ledger_id)
        return ledger.last if ledger is not None else -1

    def list_entries(self, ledger_id: int, start_entry_id: int, max_count: int) -> list[int]:
        ledger = self._ledgers.get(ledger_id)
        return ledger.ids(start_entry_id, max_count) if ledger is not None else []

    def get_ledger(self, ledger_id: int) -> LedgerInfo | None:
        ledger = self._ledgers.get(ledger_id)
        return ledger.info if ledger is not None else None

    def ledgers(self) -> list[int]:
        return sorted(self._ledgers)

    def statistics(self) -> dict[str, int]:
        """Counters for metrics: current log, its size, buffered bytes, ledgers, syncs."""
        return {
            "log_id": self._log_id,
            "log_bytes": self._log_end,
            "buffered_bytes": len(self._buf),
            "ledgers": len(self._ledgers),
            "bytes_since_snapshot": self._since_snapshot,
            "syncs": self._syncs,
            **self._compaction,
        }

    # ----- space

    def reclaim_space(self, live_ratio_min: float) -> int:
        """Compact the entry logs whose live fraction is below ``live_ratio_min``; the bytes
        of the logs dropped (``files_compaction.py``)."""
        with self._sync_lock:
            return reclaim(self, live_ratio_min, self._compaction_step)

    def _compaction_step(self, name: str) -> None:
        """Called between the steps of a compaction (tests crash there)."""

    def _log_sizes(self) -> dict[int, int]:
        """Every log's size: on disk, and the current one's end (buffer included)."""
        sizes = {}
        for name in os.listdir(self.directory):
            m = _LOG_NAME.fullmatch(name)
            if m:
                sizes[int(m[1], 16)] = os.stat(os.path.join(self.directory, name)).st_size
        with self._lock:
            sizes[self._log_id] = self._log_end
        return sizes

    # ----- durability

    def sync(self) -> None:
        with self._sync_lock:
            self._sync(force_snapshot=False)

    def _sync(self, *, force_snapshot: bool, snapshot_always: bool = False) -> None:
        if not force_snapshot:  # close() does not roll: the next open appends where it was
            self._roll_if_full()
        snapshot = None
        with self._lock:
            self._check_usable()
            self._flush()
            fds = [self._fds[i] for i in self._dirty]
            current_end = self._log_end if self._log_id in self._dirty else None
            self._dirty.clear()
            dir_dirty, self._dir_dirty = self._dir_dirty, False
            due = self._since_snapshot >= self._snapshot_interval
            if due or snapshot_always or (force_snapshot and self._since_snapshot > 0):
                snapshot = self._capture()  # its shape only: the chunks are copy-on-write
                self._since_snapshot = 0
        try:
            for fd in fds:  # outside the lock: puts and gets go on while the disk works
                os.fdatasync(fd)
            if dir_dirty:
                _fsync_dir(self.directory)
        except OSError as e:
            self._failure = e
            raise
        if current_end is not None:
            with self._lock:
                self._synced_end = max(self._synced_end, current_end)
        if snapshot is not None:  # only now is every record the snapshot covers durable
            self._write_snapshot(*_serialize(*snapshot))
        self._syncs += 1

    def close(self) -> None:
        if self._closed:
            return
        try:
            with self._sync_lock:
                self._sync(force_snapshot=True)
        finally:
            self._closed = True
            self._close_files()

    def _close_files(self) -> None:
        for fd in [*self._fds.values(), *self._retired_fds]:
            os.close(fd)
        self._fds.clear()
        self._retired_fds.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the only descriptor releases the flock
            self._lock_fd = None

    # ----- snapshots

    def _capture(self) -> tuple[int, int, int, list[tuple[int, bytes | None, int, dict]]]:
        """The index as of the current log end, as cheaply as the lock allows: per ledger its
        info, last id and chunk map; the chunks are shared, copied by the next put that
        changes one. Caller holds ``_lock``, buffer empty."""
        pos = self._log_end
        tail = self._tail_sum(self._fds[self._log_id], pos)
        ledgers = [(lid, *ledger.capture()) for lid, ledger in self._ledgers.items()]
        return self._log_id, pos, tail, ledgers

    @staticmethod
    def _tail_sum(fd: int, pos: int) -> int:
        n = min(pos, SNAPSHOT_TAIL_BYTES)
        return xxh3_64_intdigest(os.pread(fd, n, pos - n))

    def _write_snapshot(self, name: str, pieces: list[bytes]) -> None:
        tmp = os.path.join(self.directory, "index.snap.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for piece in pieces:
                _write_all(fd, piece)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(self.directory, name))
        _fsync_dir(self.directory)
        for old in self._snapshot_names()[SNAPSHOTS_KEPT:]:
            os.unlink(os.path.join(self.directory, old))

    def _snapshot_names(self) -> list[str]:
        """Snapshot file names, newest (highest position) first."""
        names = [n for n in os.listdir(self.directory) if _SNAPSHOT_NAME.fullmatch(n)]
        return sorted(names, reverse=True)  # fixed-width hex: name order is position order

    def _load_snapshot(self, name: str, logs: list[int]) -> tuple[int, int]:
        """Restore the index from one snapshot; return the log position it covers.

        Raises:
            ValueError: the snapshot is damaged or does not match the logs on disk.
        """
        with open(os.path.join(self.directory, name), "rb") as f:
            blob = f.read()
        body = blob[len(SNAPSHOT_MAGIC) + SUM.size :]
        if blob[: len(SNAPSHOT_MAGIC)] != SNAPSHOT_MAGIC or blob[8:16] != SUM.pack(
            xxh3_64_intdigest(body)
        ):
            raise ValueError("bad magic or checksum")
        version, log_id, pos, tail, ledgers = msgpack.unpackb(body, raw=False)
        if version != 1 or log_id not in logs:
            raise ValueError(f"version {version} or log {log_id} unknown")
        fd = self._read_fd(log_id)
        if os.fstat(fd).st_size < pos or self._tail_sum(fd, pos) != tail:
            raise ValueError(f"does not match {self._log_path(log_id)}")
        self._ledgers = {lid: _Ledger.load(*rest) for lid, *rest in ledgers}
        return log_id, pos

    # ----- recovery

    def _recover(self) -> None:
        names = os.listdir(self.directory)
        if "index.snap.tmp" in names:  # a snapshot write interrupted by a crash
            os.unlink(os.path.join(self.directory, "index.snap.tmp"))
        logs = sorted(int(m[1], 16) for n in names if (m := _LOG_NAME.fullmatch(n)))
        start_log, start_pos = self._restore_index(logs)
        for log_id in logs:
            if log_id >= start_log:
                pos = start_pos if log_id == start_log else 0
                self._since_snapshot += self._replay(log_id, pos, newest=log_id == logs[-1])
        self._open_log(logs[-1] if logs else 0)

    def _restore_index(self, logs: list[int]) -> tuple[int, int]:
        """Load the newest valid snapshot, deleting the ones that fail; else start from zero."""
        for name in self._snapshot_names():
            try:
                return self._load_snapshot(name, logs)
            except (ValueError, TypeError, KeyError, AssertionError, msgpack.UnpackException) as e:
                log.warning("%s: ignoring index snapshot %s: %s", self.directory, name, e)
                self._ledgers = {}
                # Delete it: once the logs change again it could look valid and be wrong.
                os.unlink(os.path.join(self.directory, name))
        return (logs[0] if logs else 0), 0

    def _replay(self, log_id: int, pos: int, *, newest: bool) -> int:
        """Apply the records of one log from ``pos``; return the bytes replayed."""
        fd = self._read_fd(log_id)
        size = os.fstat(fd).st_size
        if size <= pos:
            return 0
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as data:
            end = self._apply_records(log_id, data, pos, size)
        if end < size:
            path = self._log_path(log_id)
            if not newest:
                raise LogCorruptError(f"{path}: damaged record at offset {end} (not at the tail)")
            log.warning("%s: torn record at offset %d, dropping %d bytes", path, end, size - end)
            with open(path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
        return end - pos

    def _apply_records(self, log_id: int, data: mmap.mmap, pos: int, size: int) -> int:
        """Apply good records from ``pos``; return the offset of the first bad one (or size)."""
        while pos < size:
            parsed = _parse(data, pos, size)
            if parsed is None:
                return pos
            kind, lid, eid, length = parsed
            if kind == ENTRY:
                ledger = self._ledgers.get(lid)
                if ledger is None:
                    ledger = self._ledgers[lid] = _Ledger()
                ledger.set(eid, (log_id << OFFSET_BITS) | pos, length)
            elif kind == LEDGER_INFO:
                info = _decode_info(data[pos + HEADER_BYTES : pos + HEADER_BYTES + length])
                self._ledgers.setdefault(lid, _Ledger()).info = info
            else:
                self._ledgers.pop(lid, None)
            pos += HEADER_BYTES + length
        return pos

    def _log_path(self, log_id: int) -> str:
        return os.path.join(self.directory, f"entrylog-{log_id:08x}.log")


def _serialize(
    log_id: int, pos: int, tail: int, ledgers: list[tuple[int, bytes | None, int, dict]]
) -> tuple[str, list[bytes]]:
    """A captured index as a snapshot file's name and bytes, in pieces: one msgpack call per
    chunk, so the event loop's thread gets the GIL between them (docs/engines.md has the
    layout; the bytes are those of one ``packb`` of the whole)."""
    packer = msgpack.Packer()
    body = [packer.pack_array_header(5), packer.pack(1), packer.pack(log_id), packer.pack(pos),
            packer.pack(tail), packer.pack_array_header(len(ledgers))]  # fmt: skip
    for lid, info, last, chunks in ledgers:
        body += (packer.pack_array_header(4), packer.pack(lid), packer.pack(info),
                 packer.pack(last), packer.pack_array_header(len(chunks)))  # fmt: skip
        for c, slots in chunks.items():
            body.append(packer.pack([c, _le_bytes(slots)]))
    digest = xxh3_64()
    for piece in body:
        digest.update(piece)
    name = f"index-{log_id:08x}-{pos:016x}.snap"
    return name, [SNAPSHOT_MAGIC + SUM.pack(digest.intdigest()), *body]


def _parse(data: bytes | mmap.mmap, pos: int, size: int) -> tuple[int, int, int, int] | None:
    """(type, ledger id, entry id, data length) of a sound record at ``pos``, else None."""
    if size - pos < HEADER_BYTES:
        return None
    magic, kind, length, ledger_id, entry_id = HEAD.unpack_from(data, pos)
    end = pos + HEADER_BYTES + length
    if magic != MAGIC or kind not in (ENTRY, LEDGER_INFO, DELETE_LEDGER) or end > size:
        return None
    with memoryview(data) as view:  # hash in place: no copy of the record
        h = xxh3_64(view[pos : pos + HEAD.size])
        h.update(view[pos + HEADER_BYTES : end])
    if SUM.unpack_from(data, pos + HEAD.size)[0] != h.intdigest():
        return None
    return kind, ledger_id, entry_id, length


def _decode_info(data: bytes) -> LedgerInfo:
    try:
        return LedgerInfo.from_bytes(data)
    except (ValueError, TypeError) as e:  # its checksum held: written so by a newer version?
        raise LogCorruptError(f"undecodable ledger info record: {e}") from e


def _writeback_call() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux; Python's ``os`` has no binding), or None."""
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return cast("Callable[[int, int, int, int], int]", call)


_SYNC_FILE_RANGE = _writeback_call()
_SYNC_FILE_RANGE_WRITE = 2  # start writing the range's dirty pages; wait for nothing


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Have the kernel start writing what was just written (a buffer: ~1 MiB) to the disk.

    Without it the page cache held everything until ``sync()``'s fdatasync, which then wrote a
    checkpoint interval's data in one go (~100 MB a bookie at 10,000 adds/s), and every journal
    fdatasync on the same disk waited for it: `breakdown --rate 10000 --engine files
    --duration 20`, p99 227-229 ms, checkpoints ~2.0 s in all; with this 26-30 ms and 0.34-0.37
    s (two pairs, 2026-11-28; rocksdb's paced flushes the same day: 62.5 ms). Only a hint: its
    result is ignored, ``sync()``'s fdatasync is still the durability point and reports any
    error."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def _write_all(fd: int, data: bytes | bytearray) -> None:
    done = os.write(fd, data)
    while done < len(data):  # short writes are rare on regular files but allowed
        done += os.write(fd, memoryview(data)[done:])


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock_dir(directory: str) -> int:
    """Hold an exclusive flock on ``directory/LOCK``; the descriptor keeps it."""
    fd = os.open(os.path.join(directory, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OSError(errno.EBUSY, f"ledger dir {directory} is in use by another process") from None
    return fd
