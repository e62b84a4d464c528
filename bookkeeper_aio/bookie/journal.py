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

Failure is fail-stop: after an I/O error the journal never writes again, fails every pending
and future record with :class:`JournalFailedError`, and tells the bookie through
``on_failure``. A journal holding more than ``journal_queue_bytes_max`` bytes that are not yet
durable reports pressure (``on_pressure(True)``) so the bookie stops reading requests until it
drains below half.

Threads: the event loop owns the callbacks, the byte count and the failure state; the journal
thread owns the file (descriptor, sequence number, position, allocated end). They meet in
two deques, each with an eventfd that wakes its reader (records, loop to thread: written only
when the thread sleeps; written batches, thread to loop: an ``add_reader`` callback), and in
the checkpoint mark ``(seq, pos)``, which the thread replaces as one tuple after each write.
Both wake-ups are ``os.eventfd_write``, which releases the GIL around its syscall, so the
thread woken finds the GIL free: with ``SimpleQueue.put`` and ``call_soon_threadsafe``
(until 2026-11-24) the waker still held it, the woken thread often went back to sleep on the
GIL and needed a second wake-up, and the loop ran a batch's callbacks one loop iteration
late (docs/performance.md at e27bdd3, twelfth round).

Where each part lives: the files (a new or recycled one, preallocation, a batch's write and
sync, rollover), checkpoints and replay in ``journal_files.py``; the record format in
``journal_format.py``. :class:`Journal` is the append, the thread and its batches, the
callbacks on the event loop and the lifecycle.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import final

from ..config import BookieConfig
from ..direct_io import BlockWriter
from ..errors import JournalFailedError
from ..histogram import BYTES_BOUNDS, COUNT_BOUNDS, LATENCY_BOUNDS_S, new_histogram
from .journal_files import JournalFiles
from .journal_format import (
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
    list_files,
    record_head,
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


class Journal(JournalFiles):
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
        self._allocated = 0  # bytes of the current file allocated (written or fallocated)
        # Preallocate with fallocate (journal_preallocate_mode); off once the fs refused it.
        self._fallocate = config.journal_preallocate_mode == "fallocate"
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

    # --- statistics ----------------------------------------------------------------------

    def statistics(self) -> dict[str, int | float]:
        """Batches, records, bytes, fsyncs, files, queue depth, mean batch size."""
        stats: dict[str, int | float] = dict(self._stats)
        stats["queued_bytes"] = self._queued_bytes
        stats["queued_records"] = len(self._records)
        stats["file_seq"] = self._mark[0]
        stats["fallocate"] = int(self._fallocate)  # 0: zeros (configured, or the fs refused)
        batches = self._stats["batches"]
        stats["records_per_batch"] = self._stats["records"] / batches if batches else 0.0
        return stats


def _settle(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)
