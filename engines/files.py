"""FilesEngine: ledger storage in append-only, self-checking entry logs and an in-memory index.

Theory of operation
-------------------
Every write becomes one self-checking record appended to the current entry log through a
memory buffer; ``sync()`` makes the logs written since the last one durable, rolls a full log,
and now and then checkpoints the index into a snapshot; opening loads the newest valid
snapshot and replays the logs from the position it names.

Space comes back through ``reclaim_space`` (the bookie's garbage collector): entry logs whose
live fraction fell below a ratio are compacted — live records copied forward, the log dropped
(``files_compaction.py``, crash-safe at every step).

Where each part lives: the record format, the write buffer, writeback, syncing and rolling the
logs in ``files_log.py`` (:class:`EntryLogs`); the index, its snapshots and the replay on open
in ``files_index.py`` (:class:`IndexSnapshots`); compaction in ``files_compaction.py``.
:class:`FilesEngine` is all of them and the engine's interface: puts, reads, sync, close.
The byte layouts are in docs/engines.md.
"""

from __future__ import annotations

import os
import threading

from xxhash import xxh3_64_intdigest

from bookkeeper_aio.engine import LedgerInfo, Record

from .files_compaction import LogSummary, reclaim
from .files_index import (
    SNAPSHOT_MAGIC,
    SNAPSHOT_TAIL_BYTES,
    SNAPSHOTS_KEPT,
    IndexSnapshots,
    _Ledger,
    _serialize,
)
from .files_log import (
    _LOG_NAME,
    _OFFSET_MASK,
    DELETE_LEDGER,
    ENTRY,
    HEAD,
    HEADER_BYTES,
    LEDGER_INFO,
    MAGIC,
    OFFSET_BITS,
    SUM,
    LogCorruptError,
    _fsync_dir,
    _lock_dir,
    _parse,
)

__all__ = [
    "DELETE_LEDGER",
    "ENTRY",
    "HEAD",
    "HEADER_BYTES",
    "LEDGER_INFO",
    "MAGIC",
    "OFFSET_BITS",
    "SNAPSHOTS_KEPT",
    "SNAPSHOT_MAGIC",
    "SNAPSHOT_TAIL_BYTES",
    "SUM",
    "FilesEngine",
    "LogCorruptError",
]


class FilesEngine(IndexSnapshots):
    """An :class:`~bookkeeper_aio.engine.Engine` on plain files in one ledger dir.

    Raises (on open):
        OSError: the dir cannot be created, or another process has it open (EBUSY).
        LogCorruptError: a record before the tail of the newest log is damaged.
    """

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
