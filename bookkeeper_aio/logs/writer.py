"""The log writer: one at a time per log, dense offsets, rollover without stalling appends.

Theory of operation
-------------------
``async with bk.open_log_writer(name) as lw`` takes the log over (``takeover.py``: epoch bump,
recovery of the last ledger if open) and appends a new ledger as the log's OPEN segment. A
record's offset is fixed when it is appended: the segment's first offset plus its entry id,
which the ledger writer assigns in order, so offsets are dense and futures (or callbacks)
resolve in offset order.

**Rollover** (``rollover.py``): the next ledger is prepared ahead; when a segment is full,
new appends wait in order (offsets already given) while the ledger drains and closes, then go
to the next ledger, which one compare-and-swap made the log's open segment.

**Fencing.** Another writer's takeover fences this writer's ledger (its adds fail with
LedgerFencedError) and moves the epoch (its compare-and-swaps fail): either way the writer
goes FENCED and appends fail with :class:`~bookkeeper_aio.errors.LogFencedError`. What it had
acknowledged stays: recovery closes the ledger after it.

Background tasks (preparing the next ledger, the rollover, retention) belong to the writer:
``close`` (the ``async with`` exit) waits for or cancels them; the client's shutdown aborts
writers still open.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import uuid
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from ..client.writer import LedgerWriter
from ..errors import (
    BookKeeperError,
    ClientClosedError,
    IncorrectParameterError,
    LedgerClosedError,
    LedgerFencedError,
    LogFencedError,
    MetadataVersionError,
    NoSuchLedgerError,
    NoSuchLogError,
    OperationTimeoutError,
)
from ..metadata.model import Versioned
from .admin import empty_trash
from .keys import update_log
from .model import LogMetadata
from .options import LogOptions, check_name
from .rollover import Rollover
from .segment import AppendCallback, Segment, WriterState, check_move, tell
from .takeover import take_over

if TYPE_CHECKING:
    from .api import Logs

log = logging.getLogger(__name__)
S = WriterState
WORKING = frozenset({S.OPENING, S.ACTIVE, S.ROLLING, S.CLOSING})


class LogWriter(Rollover):
    """The one writer of a log (see the module docstring); from :meth:`Logs.open_log_writer`."""

    def __init__(self, logs: Logs, name: str) -> None:
        self.name = check_name(name)
        self._logs = logs
        self._config = logs.config
        self.state = S.NEW
        self.writer_id = f"{logs.config.client_name}-{uuid.UUID(int=logs.ctx.rng.getrandbits(128))}"
        self._error: BaseException | None = None
        self._epoch = -1
        self._options = LogOptions()
        self._versioned: Versioned[LogMetadata] | None = None
        self._segment: Segment | None = None
        self._written: list[tuple[int, int]] = []  # (ledger id, first offset) we wrote to
        self._next_offset = 0
        self._held: collections.deque[tuple[int, bytes, Any]] = collections.deque()
        self._held_bytes = 0
        self._room = asyncio.Event()
        self._spare_task: asyncio.Task[LedgerWriter] | None = None
        self._switch_task: asyncio.Task[None] | None = None
        self._retention_task: asyncio.Task[Any] | None = None
        self._age_handle: asyncio.TimerHandle | None = None
        self._rollovers = 0

    # --- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> LogWriter:
        await self.open()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            await self.close()
        except BookKeeperError:
            if exc_type is None:
                raise
            log.info("log %s: close after %s failed", self.name, exc_type.__name__)

    async def open(self) -> None:
        """Take the log over (see the module docstring); ``async with`` calls it.

        Raises:
            NoSuchLogError: no such log.
            LogFencedError: another writer took the log over meanwhile.
            LedgerRecoveryError: the previous writer's ledger could not be recovered yet.
            OperationTimeoutError: not done within ``log_open_timeout_s``.
        """
        self._move(S.OPENING)
        try:
            async with asyncio.timeout(self._config.log_open_timeout_s):
                await self._take_over()
        except BaseException as exc:
            error = self._as_log_error(exc, "takeover")
            self._stop(S.FENCED if isinstance(error, LogFencedError) else S.FAILED, error)
            self._move(S.CLOSED)
            if error is exc:
                raise
            raise error from exc
        self._move(S.ACTIVE)
        self._logs.register(self)
        self._after_switch()

    async def close(self) -> None:
        """Drain, close the ledger, record its end (the log then has no open segment), and
        delete the prepared ledger. Idempotent.

        Raises:
            LogFencedError: another writer took over before the close (what was acknowledged
                stays in the log); not raised again when an append reported it already.
            BookKeeperError: the close failed otherwise.
        """
        if self.state in (S.NEW, S.CLOSED):
            self.state = S.CLOSED
            return
        assert self.state is not S.OPENING, "close() while open() runs"
        if self._switch_task is not None:
            await asyncio.gather(self._switch_task, return_exceptions=True)  # bounded itself
        error = None
        if self.state is S.ACTIVE:
            self._move(S.CLOSING)
            try:
                limit = self._config.close_timeout_s + self._config.log_rollover_timeout_s
                async with asyncio.timeout(limit):
                    await self._close_segment()
            except Exception as exc:
                error = self._as_log_error(exc, "close")
                self._stop(S.FENCED if isinstance(error, LogFencedError) else S.FAILED, error)
        elif self._segment is not None:
            await self._drain_quietly()
        await self._release()
        self._move(S.CLOSED)
        self._logs.unregister(self)
        if error is not None:
            raise error

    async def abort(self) -> None:
        """Stop without closing the ledger (the client is shutting down): appends fail with
        ClientClosedError; the next writer recovers the ledger."""
        self._stop(S.FAILED, ClientClosedError(f"log writer of {self.name}: client closed"))
        tasks = [t for t in (self._switch_task, self._spare_task, self._retention_task) if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.state is not S.CLOSED:
            self._move(S.CLOSED)
        self._logs.unregister(self)

    # --- appends --------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """The offset the next append gets."""
        return self._next_offset

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def segments(self) -> tuple[tuple[int, int], ...]:
        """(ledger id, first offset) of every ledger this writer appended to, in order."""
        return tuple(self._written)

    def append_nowait(self, payload: bytes) -> asyncio.Future[int]:
        """Append now; a future of the record's offset, resolved once it and every earlier
        record are acknowledged (in offset order).

        Raises:
            LogFencedError: another writer took the log over.
            LedgerClosedError: the writer is closed (or not open yet).
            BookKeeperError: as many records as a ledger writer may have pending are pending
                (use :meth:`append`, which waits), or the writer failed earlier.
        """
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._append(payload, future)
        return future

    def append_callback(self, payload: bytes, callback: AppendCallback) -> int:
        """Append now; return the record's offset. ``callback(offset, error)`` is called once,
        in offset order (``LedgerWriter.append_callback``'s rules: it must not block).

        Raises:
            as :meth:`append_nowait` (then ``callback`` is never called).
        """
        return self._append(payload, callback)

    async def append(self, payload: bytes) -> int:
        """Append and wait until the record (and every earlier one) is acknowledged; its offset.

        Raises:
            as :meth:`append_nowait`, and the ledger's errors (NotEnoughBookiesError, ...).
        """
        await self.wait_for_room(len(payload))
        return await self.append_nowait(payload)

    async def wait_for_room(self, size: int) -> None:
        """Wait until :meth:`append_nowait` takes a record of ``size`` bytes (backpressure).

        Raises:
            LogFencedError, LedgerClosedError, BookKeeperError: as :meth:`append_nowait`.
        """
        while True:
            if self.state is S.ACTIVE:
                segment = self._segment
                assert segment is not None
                if self._full(segment, size):
                    self._roll()
                    continue
                try:
                    await segment.writer.wait_for_room(size)
                except (LedgerFencedError, LedgerClosedError) as exc:
                    raise self._ledger_error(exc) from exc
                if self.state is S.ACTIVE and self._segment is segment:
                    return
            elif self.state is S.ROLLING:
                if self._held_room(size):
                    return
                self._room.clear()
                await self._room.wait()  # set as held records leave (the rollover is bounded)
            else:
                raise self._unwritable()

    def _append(self, payload: bytes, whom: Any) -> int:
        if type(payload) is not bytes:
            raise IncorrectParameterError(f"a record is bytes, got {type(payload).__name__}")
        if self.state is S.ACTIVE:
            segment = self._segment
            assert segment is not None
            if not self._full(segment, len(payload)):
                try:
                    offset = segment.push(payload, whom)
                except (LedgerFencedError, LedgerClosedError) as exc:
                    raise self._ledger_error(exc) from exc
                self._next_offset = offset + 1
                if segment.entries == 1:
                    self._arm_age(segment)
                return offset
            self._roll()
        if self.state is S.ROLLING:
            return self._hold(payload, whom)
        raise self._unwritable()

    # --- takeover, errors and cleanup ------------------------------------------------------

    async def _take_over(self) -> None:
        takeover = await take_over(self._logs, self.name, self.writer_id)
        self._epoch = epoch = takeover.epoch
        self._options = takeover.versioned.value.options
        ledger = await self._logs.new_ledger(self.name, self._options)
        now_ms = self._logs.clock_ms()
        try:
            self._versioned = await update_log(
                self._logs.store,
                self.name,
                lambda md: takeover.seal(md, now_ms).with_new_segment(epoch, ledger.ledger_id),
                self._config.metadata_retries_max,
                current=takeover.versioned,
            )
        except BaseException as exc:
            await self._logs.discard_ledger(ledger, exc)
            raise
        first = self._versioned.value.segments[-1].first_offset
        self._start_segment(ledger, first)
        self._next_offset = first

    def _ledger_error(self, error: BaseException) -> BaseException:
        """The error a record's caller gets for a ledger error (and the writer's new state)."""
        closing = self.state in (S.ROLLING, S.CLOSING)
        if isinstance(error, LedgerFencedError) or (
            isinstance(error, LedgerClosedError) and not closing
        ):
            if isinstance(self._error, LogFencedError):
                return self._error
            fenced = LogFencedError(f"log {self.name}: another writer took over ({error})")
            fenced.__cause__ = error
            self._stop(S.FENCED, fenced)
            return fenced
        self._stop(S.FAILED, error)
        return error

    def _as_log_error(self, exc: BaseException, what: str) -> BaseException:
        if isinstance(exc, TimeoutError):
            return OperationTimeoutError(f"log {self.name}: {what} did not finish in time")
        if isinstance(exc, NoSuchLedgerError):  # only a deleted log loses its open ledger
            return NoSuchLogError(f"log {self.name}: its ledger is gone (log deleted?): {exc}")
        if isinstance(exc, LedgerFencedError | MetadataVersionError) and not isinstance(
            exc, LogFencedError
        ):
            return LogFencedError(f"log {self.name}: another writer took over ({exc})")
        return exc

    def _unwritable(self) -> BaseException:
        if self._error is not None:
            return self._error
        return LedgerClosedError(f"log writer of {self.name} is {self.state.value.lower()}")

    def _stop(self, state: WriterState, error: BaseException) -> None:
        """FENCED or FAILED: held records fail; the writer takes no more."""
        if self.state not in WORKING:
            return
        self._move(state)
        self._error = error
        if self._age_handle is not None:
            self._age_handle.cancel()
        held, self._held, self._held_bytes = self._held, collections.deque(), 0
        for offset, _, whom in held:
            tell(whom, offset, error)
        self._room.set()
        expected = isinstance(error, LogFencedError | NoSuchLogError | ClientClosedError)
        level = logging.INFO if expected else logging.WARNING
        log.log(level, "log %s: writer %s %s: %s", self.name, self.writer_id, state.value, error)

    async def _drain_quietly(self) -> None:
        """Fenced or failed: let the records in flight end (acknowledged or failed)."""
        segment = self._segment
        assert segment is not None
        with contextlib.suppress(BookKeeperError, TimeoutError):
            async with asyncio.timeout(self._config.close_timeout_s):
                await segment.writer.close()

    async def _release(self) -> None:
        """Stop background work, close the spare's handle, delete the trash (best effort)."""
        if self._age_handle is not None:
            self._age_handle.cancel()
        await self._cancel(self._retention_task)
        try:
            async with asyncio.timeout(self._config.log_rollover_timeout_s):
                await self._release_spare()
                if self.state is S.CLOSING:
                    await empty_trash(self._logs, self.name)
        except (BookKeeperError, TimeoutError) as exc:
            log.info("log %s: cleanup after close: %s", self.name, exc)

    async def _cancel(self, task: asyncio.Task[Any] | None) -> None:
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, Any], what: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"log {self.name} {what}")
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        error = task.exception()  # retrieved: the rollover or close awaits it, or it is logged
        if isinstance(error, LogFencedError | NoSuchLogError):
            self._stop(S.FENCED if isinstance(error, LogFencedError) else S.FAILED, error)
        elif error is not None and task is not self._switch_task:
            log.warning("log %s: %s failed: %s", self.name, task.get_name(), error)

    def _move(self, new: WriterState) -> None:
        check_move(self.name, self.state, new)
        self.state = new

    def statistics(self) -> dict[str, Any]:
        """State, epoch, offsets, the current ledger, held records, rollovers."""
        segment = self._segment
        return {
            "state": self.state.value,
            "epoch": self._epoch,
            "next_offset": self._next_offset,
            "ledger_id": segment.ledger_id if segment else None,
            "segment_entries": segment.entries if segment else 0,
            "segment_bytes": segment.bytes if segment else 0,
            "held": len(self._held),
            "rollovers": self._rollovers,
        }
