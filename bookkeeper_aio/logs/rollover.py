"""A log writer's rollover: the next ledger prepared ahead, the switch, the held records.

Theory of operation
-------------------
Right after a segment starts, the next ledger is created and recorded as the log's prepared
ledger (a background task), so it is ready before it is needed. When the segment is full
(``segment_entries_max``, ``segment_bytes_max``, or ``segment_age_s`` after its first record)
the writer goes ROLLING: new records get their offsets at once and wait in order, bounded like
a ledger writer's pending adds, while the current ledger drains and closes; one
compare-and-swap records its end and opens the prepared ledger (``LogMetadata.rolled_over``);
then the held records go to the new ledger in order, and if they fill it, it rolls over again.
Nothing is sent to a ledger before it is in the log's list, and at most one ledger of the list
is open.

:class:`Rollover` is a part of :class:`~bookkeeper_aio.logs.writer.LogWriter` (a mixin: one
concept per module); the writer's lifecycle, appends and errors are in ``writer.py``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ..client.writer import LedgerWriter
from ..config import ClientConfig
from ..errors import BookKeeperError, LogFencedError
from ..metadata.model import Versioned
from .admin import empty_trash, enforce_retention
from .keys import update_log
from .model import LogMetadata
from .options import LogOptions
from .segment import Segment, WriterState

if TYPE_CHECKING:
    from .api import Logs

S = WriterState


class Rollover:
    """The rollover half of a log writer (see the module docstring)."""

    name: str
    state: WriterState
    _logs: Logs
    _config: ClientConfig
    _options: LogOptions
    _epoch: int
    _versioned: Versioned[LogMetadata] | None
    _segment: Segment | None
    _written: list[tuple[int, int]]
    _next_offset: int
    _held: collections.deque[tuple[int, bytes, Any]]
    _held_bytes: int
    _room: asyncio.Event
    _spare_task: asyncio.Task[LedgerWriter] | None
    _switch_task: asyncio.Task[None] | None
    _retention_task: asyncio.Task[Any] | None
    _age_handle: asyncio.TimerHandle | None
    _rollovers: int
    # The writer's (writer.py):
    _move: Callable[[WriterState], None]
    _stop: Callable[[WriterState, BaseException], None]
    _as_log_error: Callable[[BaseException, str], BaseException]
    _ledger_error: Callable[[BaseException], BaseException]
    _spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]]
    _cancel: Callable[[asyncio.Task[Any] | None], Coroutine[Any, Any, None]]

    def _full(self, segment: Segment, size: int) -> bool:
        """Whether ``segment`` must roll over before a record of ``size`` bytes (an empty
        segment takes any record, even one over ``segment_bytes_max``)."""
        if not segment.entries:
            return False
        options = self._options
        return (
            segment.aged
            or (options.segment_entries_max is not None
                and segment.entries >= options.segment_entries_max)
            or (options.segment_bytes_max is not None
                and segment.bytes + size > options.segment_bytes_max)
        )  # fmt: skip

    def _held_room(self, size: int) -> bool:
        cfg = self._config
        return not self._held or (
            len(self._held) < cfg.adds_pending_max
            and self._held_bytes + size <= cfg.adds_pending_bytes_max
        )

    def _hold(self, payload: bytes, whom: Any) -> int:
        if not self._held_room(len(payload)):
            raise BookKeeperError(
                f"log {self.name}: {len(self._held)} records wait for a rollover; "
                "await append() instead"
            )
        offset = self._next_offset
        self._held.append((offset, payload, whom))
        self._held_bytes += len(payload)
        self._next_offset = offset + 1
        return offset

    # --- rollover -------------------------------------------------------------------------

    def _arm_age(self, segment: Segment) -> None:
        age = self._options.segment_age_s
        if age is not None:
            loop = asyncio.get_running_loop()
            self._age_handle = loop.call_later(age, self._age_expired, segment)

    def _age_expired(self, segment: Segment) -> None:
        segment.aged = True
        if self.state is S.ACTIVE and self._segment is segment:
            self._roll()

    def _roll(self) -> None:
        self._move(S.ROLLING)
        self._switch_task = self._spawn(self._switch(), "rollover")

    async def _switch(self) -> None:
        """Switch to the prepared ledger, then send the held records (again if they fill it)."""
        try:
            async with asyncio.timeout(self._config.log_rollover_timeout_s):
                while True:
                    await self._switch_once()
                    if await self._flush_held():
                        break
        except Exception as exc:
            error = self._as_log_error(exc, "rollover")
            self._stop(S.FENCED if isinstance(error, LogFencedError) else S.FAILED, error)
            return
        if self.state is S.ROLLING:
            self._move(S.ACTIVE)
        self._room.set()

    async def _switch_once(self) -> None:
        old = self._segment
        assert old is not None
        spare = await self._take_spare()
        try:
            entries, size = await self._close_ledger(old)
            epoch, now_ms = self._epoch, self._logs.clock_ms()
            self._versioned = await update_log(
                self._logs.store,
                self.name,
                lambda md: md.rolled_over(epoch, entries, size, now_ms, spare.ledger_id),
                self._config.metadata_retries_max,
                current=self._versioned,
            )
        except BaseException:
            # The spare stays recorded as prepared (the next writer deletes it): only its
            # handle goes.
            with contextlib.suppress(BookKeeperError):
                await spare.close()
            raise
        self._start_segment(spare, old.first_offset + entries)
        self._rollovers += 1
        self._after_switch()

    async def _flush_held(self) -> bool:
        """Send the held records to the new segment in order; False if it filled up first."""
        segment = self._segment
        assert segment is not None
        while self._held and self.state is S.ROLLING:
            offset, payload, whom = self._held[0]
            if self._full(segment, len(payload)):
                return False
            await segment.writer.wait_for_room(len(payload))
            if not self._held or self._held[0][0] != offset:
                break  # failed meanwhile: _stop told them
            self._held.popleft()
            self._held_bytes -= len(payload)
            pushed = segment.push(payload, whom)
            assert pushed == offset, (pushed, offset)
            if segment.entries == 1:
                self._arm_age(segment)
            self._room.set()
        return True

    async def _close_ledger(self, segment: Segment) -> tuple[int, int]:
        """Drain and close the segment's ledger; its entries and bytes, all acknowledged."""
        await segment.writer.close()
        entries = segment.writer.last_add_confirmed + 1
        if entries != segment.entries:
            raise BookKeeperError(
                f"log {self.name}: ledger {segment.ledger_id} acknowledged {entries} of "
                f"{segment.entries} records"
            )
        return entries, segment.writer.length

    async def _close_segment(self) -> None:
        segment = self._segment
        assert segment is not None
        await self._release_spare()
        entries, size = await self._close_ledger(segment)
        epoch, now_ms = self._epoch, self._logs.clock_ms()
        self._versioned = await update_log(
            self._logs.store,
            self.name,
            lambda md: md.closed_by_writer(epoch, entries, size, now_ms),
            self._config.metadata_retries_max,
            current=self._versioned,
        )

    def _start_segment(self, ledger: LedgerWriter, first_offset: int) -> None:
        self._segment = Segment(ledger, first_offset, self._ledger_error)
        self._written.append((ledger.ledger_id, first_offset))

    def _after_switch(self) -> None:
        """Prepare the next ledger; apply retention and empty the trash (background)."""
        self._spare_task = self._spawn(self._prepare_spare(), "prepare")
        options = self._options
        retain = options.retention_s is not None or options.retention_bytes is not None
        trash = self._versioned is not None and bool(self._versioned.value.trash)
        if (retain or trash) and (self._retention_task is None or self._retention_task.done()):
            job = enforce_retention if retain else empty_trash
            self._retention_task = self._spawn(job(self._logs, self.name), "retention")

    async def _take_spare(self) -> LedgerWriter:
        task = self._spare_task
        if task is None or (task.done() and (task.cancelled() or task.exception())):
            task = self._spare_task = self._spawn(self._prepare_spare(), "prepare")
        spare = await task
        self._spare_task = None
        return spare

    async def _prepare_spare(self) -> LedgerWriter:
        ledger = await self._logs.new_ledger(self.name, self._options)
        epoch = self._epoch
        try:
            self._versioned = await update_log(
                self._logs.store,
                self.name,
                lambda md: md.with_prepared(epoch, ledger.ledger_id),
                self._config.metadata_retries_max,
                current=self._versioned,
            )
        except BaseException as exc:
            await self._logs.discard_ledger(ledger, exc)  # not recorded: nobody else would
            raise
        return ledger

    async def _release_spare(self) -> None:
        """Cancel the preparation of the next ledger, or close the prepared ledger's handle
        (an unrecorded one deletes itself; a recorded one goes to the trash with the close or
        the next writer's takeover)."""
        task, self._spare_task = self._spare_task, None
        if task is None:
            return
        if not task.done():
            await self._cancel(task)
        elif not task.cancelled() and task.exception() is None:
            with contextlib.suppress(BookKeeperError):
                await task.result().close()
