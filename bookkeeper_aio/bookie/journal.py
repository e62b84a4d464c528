"""The bookie's write-ahead journal: group commit, fdatasync before acknowledgement, replay.

Theory of operation
-------------------
:meth:`Journal.append` queues a typed record with a callback and returns at once. The journal's
own thread (BookKeeper's journal thread) takes the queued records itself, up to
``journal_batch_bytes_max``, writes them with a single ``pwrite`` and ``fdatasync``, hands the
batch back to the event loop, where the callbacks run in append order, and takes the next
batch at once: records that arrived during a sync form the next batch, so the batch size
adapts to the load (group commit), and while the disk is busy the thread never waits for the
event loop. ``journal_batch_wait_ms`` > 0 additionally waits that long for a batch to fill.
(Until 2026-11-24 a writer coroutine on the loop took each batch and waited for it: every
batch cost two wake-ups between the threads, ~70 µs of an idle bookie's one-add latency, and
under load the disk sat idle until a busy loop came round to the next batch.)

Files are preallocated with real zeros ``journal_preallocate_bytes`` ahead of the write position
(so an fdatasync does not also have to persist a new file size), 1 MiB at a time after a batch's
sync (a new file starts with one such step, not all of them at once), and roll over past
``journal_file_bytes_max``. Every start opens a new file: a file with a torn tail is never
appended to. A checkpoint keeps up to ``journal_recycle_files`` of the files it retires
(``recycled-<seq>.log``) and the next new file reuses one: its blocks exist already, so no
zero-fill (which doubles the bytes written) until the write position passes its old end. The
old records it still holds fail the checksum of the new file's sequence number.

A checkpoint marks the current write position, syncs the storage engine (every record before
the mark was applied to the engine before it was appended), atomically records the mark in the
``checkpoint`` file, and deletes files entirely before it. Replay returns every record after
the mark, in order.

Failure is fail-stop: after an I/O error the journal never writes again, fails every pending
and future record with :class:`JournalFailedError`, and tells the bookie through
``on_failure``. A journal holding more than ``journal_queue_bytes_max`` bytes that are not yet
durable reports pressure (``on_pressure(True)``) so the bookie stops reading requests until it
drains below half.

Threads: the event loop owns the callbacks, the byte count and the failure state; the journal
thread owns the file (descriptor, sequence number, position, zero-filled end). They meet in
two deques, each with an eventfd that wakes its reader (records, loop to thread: written only
when the thread sleeps; written batches, thread to loop: an ``add_reader`` callback), and in
the checkpoint mark ``(seq, pos)``, which the thread replaces as one tuple after each write.
Both wake-ups are ``os.eventfd_write``, which releases the GIL around its syscall, so the
thread woken finds the GIL free: with ``SimpleQueue.put`` and ``call_soon_threadsafe``
(until 2026-11-24) the waker still held it, the woken thread often went back to sleep on the
GIL and needed a second wake-up, and the loop ran a batch's callbacks one loop iteration
late (docs/performance.md at e27bdd3, twelfth round).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import final

from ..config import BookieConfig
from ..direct_io import BLOCK_BYTES, BlockWriter, open_file, round_up, write_zeros
from ..errors import JournalFailedError
from ..histogram import BYTES_BOUNDS, COUNT_BOUNDS, LATENCY_BOUNDS_S, new_histogram
from .journal_format import (
    FILE_HEADER,
    REC_ENTRIES,
    REC_ENTRY,
    REC_EXPLICIT_LAC,
    REC_FENCE,
    REC_LEDGERS_ENTRIES,
    REC_LIMBO,
    REC_MASTER_KEY,
    RECORD_HEADER,
    Body,
    JournalRecord,
    file_header,
    file_name,
    list_files,
    list_recycled,
    record_head,
    recycled_name,
    scan,
)
from .trace import AddTrace

__all__ = [
    "REC_ENTRIES",
    "REC_ENTRY",
    "REC_EXPLICIT_LAC",
    "REC_FENCE",
    "REC_LEDGERS_ENTRIES",
    "REC_LIMBO",
    "REC_MASTER_KEY",
    "Body",
    "Journal",
    "JournalRecord",
]

log = logging.getLogger(__name__)

Callback = Callable[[BaseException | None], None]
# A queued record: type, body pieces, body size, what to call once it is durable.
_Queued = tuple[int, tuple[bytes | memoryview, ...], int, Callback]


@final  # for type checks: ``type(x) is _Stop`` decides either way
class _Stop:
    """Queued by close(): the thread writes the records before it, then ends."""


_STOP = _Stop()
_Item = _Queued | _Stop
CHECKPOINT_FILE = "checkpoint"
_ZERO_STEP_BYTES = 1 << 20


class Journal:
    """See the module docstring. Not thread-safe: use it from the event loop thread."""

    def __init__(
        self,
        directory: str | Path,
        config: BookieConfig,
        *,
        on_pressure: Callable[[bool], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.config = config
        self._on_pressure = on_pressure
        self._on_failure = on_failure
        # The event loop's side.
        self._records: collections.deque[_Item] = collections.deque()
        self._records_fd = -1  # an eventfd the thread sleeps on while it has no records
        self._thread_idle = False  # the thread is (about to be) asleep on _records_fd
        self._queued_bytes = 0  # appended, not yet durable
        self._pressure = False
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Future[None] | None = None  # set when the thread has ended
        self._closer: asyncio.Task[None] | None = None  # close(): stop, join, close fds
        self._closing = False
        self._failed: BaseException | None = None
        self._checkpoint_lock = asyncio.Lock()
        # Thread to loop: written batches (None once the thread ends), and an eventfd that
        # wakes the loop for them.
        self._written: collections.deque[tuple[list[_Queued], BaseException | None] | None]
        self._written = collections.deque()
        self._wake_fd = -1
        # The journal thread's side (and start() before the thread runs).
        self._fd = -1
        self._file: BlockWriter | None = None  # writes self._fd in whole blocks
        self._seq = 0
        self._pos = 0  # write position in the current file
        self._allocated = 0  # bytes of the current file known to be zero-filled
        self._broken: BaseException | None = None  # the write error; nothing is written after
        # Written by the thread after each write, read by checkpoints: every record before it
        # was applied to the engine before it was appended.
        self._mark = (0, 0)
        # Each key is counted by one thread only (loop, journal thread, checkpoint worker).
        self._stats = collections.Counter[str]()
        # Written by the journal thread once per batch (histogram.py; read by /metrics).
        timed = config.metrics_latency
        self.sync_latency = new_histogram(timed, LATENCY_BOUNDS_S)  # one batch's write + sync
        self.batch_records = new_histogram(timed, COUNT_BOUNDS)
        self.batch_bytes = new_histogram(timed, BYTES_BOUNDS)
        # Timestamps of each batch (bookie/trace.py), when the bookie traces: batches are
        # numbered in the order written, which is the order their callbacks run.
        self.trace: AddTrace | None = None
        self._traced_written = 0  # the journal thread's count
        self._traced_durable = 0  # the event loop's count

    # --- replay ---------------------------------------------------------------------------

    def replay(self) -> Iterator[JournalRecord]:
        """Every record written after the last checkpoint, in order (call before start).

        Raises:
            JournalFailedError: a journal file is unreadable or has a foreign header.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        mark_seq, mark_offset = self._read_checkpoint()
        for seq, path in list_files(self.directory):
            if seq < mark_seq:
                continue
            try:
                data = path.read_bytes()
                result = scan(data, seq, mark_offset if seq == mark_seq else 0)
            except (OSError, ValueError) as exc:
                raise JournalFailedError(f"cannot replay journal file {path}: {exc}") from exc
            if not result.clean_end:
                log.warning(
                    "journal file %s: replay stops at offset %d of %d (a torn write, or the "
                    "old records of a recycled file)", path.name, result.end_offset, len(data),
                )  # fmt: skip
            self._stats["replayed_records"] += len(result.records)
            yield from result.records

    def _read_checkpoint(self) -> tuple[int, int]:
        path = self.directory / CHECKPOINT_FILE
        try:
            mark = json.loads(path.read_text())
            return int(mark["seq"]), int(mark["offset"])
        except FileNotFoundError:
            return 0, 0
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise JournalFailedError(f"unreadable journal checkpoint {path}: {exc}") from exc

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Open a new journal file and start the journal thread."""
        assert self._thread is None, "journal already started"
        self.directory.mkdir(parents=True, exist_ok=True)
        files = list_files(self.directory)
        next_seq = files[-1][0] + 1 if files else 1
        await asyncio.to_thread(self._open_file, next_seq)
        loop = asyncio.get_running_loop()
        self._stopped = loop.create_future()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._records_fd = os.eventfd(0, os.EFD_CLOEXEC)
        loop.add_reader(self._wake_fd, self._on_wake, loop)
        self._thread = threading.Thread(target=self._serve, name="journal", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """Make everything appended durable (callbacks run), then stop the thread; returns
        once the thread has ended and the journal's descriptors are closed."""
        if self._thread is None:
            return
        if self._closer is None:  # a second close waits for the first
            self._closer = asyncio.get_running_loop().create_task(self._close())
        await asyncio.shield(self._closer)

    async def _close(self) -> None:
        if not self._closing:
            self._closing = True
            self._put(_STOP)
        assert self._stopped is not None and self._thread is not None
        await self._stopped  # after the completions of the records before it
        # The thread's last act is the eventfd write that said so: join it before the
        # descriptors close (a closed fd's number may be reused by any other file).
        await asyncio.to_thread(self._thread.join)
        os.close(self._wake_fd)
        os.close(self._records_fd)
        if self.trace is not None:
            log.info("add trace written to %s", await asyncio.to_thread(self.trace.write))

    @property
    def failed(self) -> BaseException | None:
        """The failure that stopped the journal, if any."""
        return self._failed

    @property
    def queued_bytes(self) -> int:
        """Bytes appended but not yet durable."""
        return self._queued_bytes

    # --- append ---------------------------------------------------------------------------

    def append(self, rtype: int, body: Body, callback: Callback) -> None:
        """Queue a record; ``callback(None)`` once it is durable, ``callback(exc)`` on failure.

        Raises:
            JournalFailedError: the journal has failed or is closed.
        """
        if self._failed is not None:
            raise JournalFailedError(f"journal failed: {self._failed}") from self._failed
        if self._closing or self._thread is None:
            raise JournalFailedError("journal is not running")
        pieces = body if isinstance(body, tuple) else (body,)
        size = sum(map(len, pieces))
        self._put((rtype, pieces, size, callback))
        self._queued_bytes += size + RECORD_HEADER.size + 1
        if not self._pressure and self._queued_bytes > self.config.journal_queue_bytes_max:
            self._set_pressure(True)

    def _put(self, item: _Item) -> None:
        self._records.append(item)
        if self._thread_idle:
            self._thread_idle = False
            # Releases the GIL around the syscall: the thread it wakes finds the GIL free.
            os.eventfd_write(self._records_fd, 1)

    def _set_pressure(self, full: bool) -> None:
        self._pressure = full
        if self._on_pressure is not None:
            self._on_pressure(full)

    # --- the journal thread ----------------------------------------------------------------

    def _serve(self) -> None:
        """The journal thread: batches of queued records, written and synced back to back."""
        wait_s = self.config.journal_batch_wait_ms / 1000
        carry: _Item | None = None  # what the last batch took and did not hold
        try:
            while True:
                first = carry if carry is not None else self._next()
                if type(first) is _Stop:
                    break
                if wait_s:
                    time.sleep(wait_s)  # let the batch fill (bounded by time)
                batch, carry = self._take_batch(first)
                error = self._write_batch(batch)
                self._tell_loop((batch, error))
            self._close_file()
        finally:
            self._tell_loop(None)  # the thread has ended

    def _tell_loop(self, item: tuple[list[_Queued], BaseException | None] | None) -> None:
        """Hand a written batch (None: the thread's end) to the event loop (_on_wake)."""
        self._written.append(item)
        os.eventfd_write(self._wake_fd, 1)  # without the GIL (module docstring)

    def _next(self) -> _Item:
        """The next queued record; sleeps on the eventfd while there is none."""
        records = self._records
        while not records:
            self._thread_idle = True  # before the check: an append after it writes the fd
            if records:
                self._thread_idle = False
                break
            os.eventfd_read(self._records_fd)  # without the GIL; may wake spuriously
        return records.popleft()

    def _take_batch(self, first: _Queued) -> tuple[list[_Queued], _Item | None]:
        """``first`` and the records queued after it, up to ``journal_batch_bytes_max``;
        also what was taken and does not belong in the batch (a record that did not fit,
        or _STOP), if anything."""
        limit = self.config.journal_batch_bytes_max
        batch = [first]
        size = first[2] + RECORD_HEADER.size + 1
        records = self._records
        while size < limit:
            if not records:
                return batch, None
            item = records.popleft()
            if type(item) is _Stop or size + item[2] > limit:
                return batch, item
            batch.append(item)
            size += item[2] + RECORD_HEADER.size + 1
        return batch, None

    def _write_batch(self, batch: list[_Queued]) -> BaseException | None:
        """Write and sync ``batch``; the error if that (or an earlier write) failed."""
        if self._broken is not None:
            return self._broken  # fail-stop: nothing after a failed write is written
        taken = time.perf_counter() if self.trace is not None else 0.0
        rolled = False
        try:
            if self._pos >= self.config.journal_file_bytes_max:
                rolled = True
                self._roll_over()
            seq = self._seq
            pieces: list[bytes | memoryview] = []
            size = 0
            for rtype, body, body_size, _ in batch:
                head = record_head(seq, rtype, body, body_size)
                pieces.append(head)
                pieces += body
                size += len(head) + body_size
            started = time.perf_counter()
            times = self._write_sync(pieces, self._pos, size)
        except BaseException as exc:  # any failure of the disk or the code: stop writing
            self._broken = exc
            return exc
        self.sync_latency.observe(times[1] - started)
        self.batch_records.observe(len(batch))
        self.batch_bytes.observe(size)
        if self.trace is not None:
            self.trace.batch(self._traced_written, taken, *times, len(batch), size, rolled)
            self._traced_written += 1
        self._pos += size
        self._mark = (seq, self._pos)
        self._stats["batches"] += 1
        self._stats["records"] += len(batch)
        self._stats["bytes"] += size
        return None

    # --- completions (the event loop) -----------------------------------------------------

    def _on_wake(self, loop: asyncio.AbstractEventLoop) -> None:
        """The journal thread wrote batches (or ended): run their callbacks, in order."""
        try:
            os.eventfd_read(self._wake_fd)
        except BlockingIOError:
            pass  # read already, by the wake-up that took the items now being handled
        written = self._written
        while written:
            item = written.popleft()
            if item is None:
                loop.remove_reader(self._wake_fd)
                _settle(self._stopped)
                return
            self._durable(*item)

    def _durable(self, batch: list[_Queued], exc: BaseException | None) -> None:
        """``batch`` was written and synced (``exc`` None) or failed: tell its callbacks."""
        overhead = RECORD_HEADER.size + 1
        self._queued_bytes -= sum(item[2] for item in batch) + len(batch) * overhead
        if self.trace is not None and exc is None:
            self.trace.batch_callbacks(self._traced_durable)
            self._traced_durable += 1
        if self._pressure and self._queued_bytes < self.config.journal_queue_bytes_max // 2:
            self._set_pressure(False)
        error = None
        if exc is not None:
            error = JournalFailedError(f"journal write failed: {exc}")
            error.__cause__ = exc
            if self._failed is None:
                self._failed = error
                log.critical("journal failed, no further writes: %s", exc)
                if self._on_failure is not None:
                    self._on_failure(error)
        for *_, callback in batch:
            try:
                callback(error)
            except Exception:  # one broken callback must not strand the batch's other answers
                log.exception("journal callback failed")

    # --- file operations (the journal's thread) -------------------------------------------

    def _write_sync(
        self, pieces: list[bytes | memoryview], pos: int, size: int
    ) -> tuple[float, float]:
        """Write ``pieces`` at ``pos`` and fdatasync; when the write and the sync returned."""
        end = pos + size
        while end + RECORD_HEADER.size > self._allocated:
            self._preallocate(_ZERO_STEP_BYTES)
        assert self._file is not None
        self._file.append(pieces, pos)
        written = time.perf_counter()
        os.fdatasync(self._fd)
        synced = time.perf_counter()
        self._stats["fsyncs"] += 1
        if self._allocated - end < self.config.journal_preallocate_bytes:
            # Keep the zeros ahead one step (1 MiB) at a time, synced with the next batch: a
            # whole journal_preallocate_bytes at once made one batch's fdatasync ~8 ms.
            self._preallocate(_ZERO_STEP_BYTES)
        return written, synced

    def _preallocate(self, size: int | None = None) -> None:
        """Zero-fill the next ``size`` bytes (default ``journal_preallocate_bytes``; real
        zeros, not a sparse hole)."""
        step = min(size or self.config.journal_preallocate_bytes,
                   self.config.journal_preallocate_bytes)  # fmt: skip
        target = round_up(self._allocated + step)
        write_zeros(self._fd, self._allocated, target)
        self._allocated = target

    def _open_file(self, seq: int) -> None:
        path = self.directory / file_name(seq)
        header = file_header(seq)
        # Only checkpoints (one at a time) add recycled files and only this thread takes them.
        recycled = list_recycled(self.directory)[:1]
        direct = self.config.journal_direct_io
        if recycled:
            # The new header is durable before the file takes its journal name: a crash in
            # between leaves a recycled file, never a journal file with a stale header.
            fd, direct = open_file(recycled[0], os.O_RDWR, direct=direct)
            writer = BlockWriter(fd)
            writer.append([header], 0)  # its block's old records become zeros
            os.fdatasync(fd)
            os.rename(recycled[0], path)
            size = os.fstat(fd).st_size
            allocated = max(size - size % BLOCK_BYTES, BLOCK_BYTES)
            self._stats["files_reused"] += 1
        else:
            fd, direct = open_file(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, direct=direct)
            writer = BlockWriter(fd)
            writer.append([header], 0)
            allocated = BLOCK_BYTES
            self._stats["files_created"] += 1
        if self.config.journal_direct_io and not direct and "direct_io" not in self._stats:
            log.warning("journal dir %s refuses O_DIRECT: writing through the page cache",
                        self.directory)  # fmt: skip
        self._stats["direct_io"] = int(direct)
        self._fd, self._file, self._seq = fd, writer, seq
        self._pos, self._allocated = len(header), allocated
        self._mark = (seq, self._pos)
        if self._allocated - self._pos < self.config.journal_preallocate_bytes:
            # One step only: the batches that follow add the rest a step at a time. All of
            # journal_preallocate_bytes here made a rollover to a new file one stall of the
            # whole 16 MiB written and synced in the batch's path (~40-80 ms on this disk;
            # under load a fresh file every ~2.5 s: docs/performance.md).
            self._preallocate(_ZERO_STEP_BYTES)
        os.fsync(fd)
        fsync_dir(self.directory)

    def _roll_over(self) -> None:
        self._close_file()
        self._open_file(self._seq + 1)

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # --- checkpoint -----------------------------------------------------------------------

    async def checkpoint(self, sync_engine: Callable[[], None]) -> None:
        """Sync the engine and drop the journal it now covers (see the module docstring).

        Raises:
            OSError: the engine sync or the checkpoint file write failed.
        """
        async with self._checkpoint_lock:
            started = time.perf_counter()
            # Everything before (seq, pos) was applied to the engine before it was appended.
            mark_seq, mark_pos = self._mark
            await asyncio.to_thread(sync_engine)
            await asyncio.to_thread(self._write_checkpoint, mark_seq, mark_pos)
            self._stats["checkpoints"] += 1
            if self.trace is not None:
                self.trace.checkpoint(started)

    def _write_checkpoint(self, seq: int, offset: int) -> None:
        tmp = self.directory / (CHECKPOINT_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"seq": seq, "offset": offset}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.directory / CHECKPOINT_FILE)
        fsync_dir(self.directory)
        # Replay skips files before the mark whatever their name, so a crash around these
        # renames and deletes loses nothing.
        kept_max = self.config.journal_recycle_files
        for old_seq, path in list_files(self.directory):
            if old_seq < seq:
                if len(list_recycled(self.directory)) < kept_max:
                    os.rename(path, self.directory / recycled_name(old_seq))
                    self._stats["files_recycled"] += 1
                else:
                    path.unlink(missing_ok=True)
                    self._stats["files_deleted"] += 1
        fsync_dir(self.directory)

    def statistics(self) -> dict[str, int | float]:
        """Batches, records, bytes, fsyncs, files, queue depth, mean batch size."""
        stats: dict[str, int | float] = dict(self._stats)
        stats["queued_bytes"] = self._queued_bytes
        stats["queued_records"] = len(self._records)
        stats["file_seq"] = self._mark[0]
        batches = self._stats["batches"]
        stats["records_per_batch"] = self._stats["records"] / batches if batches else 0.0
        return stats


def _settle(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


def fsync_dir(directory: Path) -> None:
    """Make a dir's entries (created, renamed, deleted files) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


assert FILE_HEADER.size < 64
