"""Reading a log: a tailing reader with bounded read-ahead, and ``read_log``.

Theory of operation
-------------------
An offset's ledger is found by bisecting the log's segments (``LogMetadata.segment_index``).
A closed segment is read up to its recorded end; the open one up to its ledger's last add
confirmed (LAC), never further: what is past the LAC may still be cut by a recovery, so
neither the reader nor :func:`read_log` ever returns an unconfirmed record.

:class:`LogReader` reads ahead in a task of its own: batches of entries, each sized so that
the records it holds stay within ``log_read_ahead_bytes_max`` (by the mean record size seen so
far), handed to the consumer through a buffer; when the buffer is full the task waits. At the
end of the open ledger it long-polls the LAC on the ledger's bookies and, at the same time,
waits for the log's metadata to change (a second task keeps a ``store.watch`` on the log's
key): a rollover or a takeover closes the segment and appends the next one, and the reader
follows at once instead of at the end of a long poll. Both tasks belong to the reader:
``aclose()`` (or leaving ``async with``) stops them; the client's shutdown closes readers
still open.

A transient failure (bookies or the store unreachable, a read without a good copy) is
retried by :func:`retried`, the one retry policy of reading a log: fresh ledger metadata (the
writer may have changed its ensemble), a backoff, at most ``log_read_retries_max`` attempts of
each step; then it is raised to the consumer. An offset
below the log's first kept one raises :class:`~bookkeeper_aio.errors.LogTruncatedError`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ..client.reader import LedgerReader
from ..client.reads import long_poll
from ..errors import (
    BookieUnavailableError,
    BookKeeperError,
    LedgerRecoveryError,
    LogTruncatedError,
    MetadataUnavailableError,
    OperationTimeoutError,
    ReadError,
    TooManyRequestsError,
)
from ..metadata.model import Versioned
from .keys import decode, read_log
from .model import LogMetadata, LogSegment
from .options import check_name, log_key

if TYPE_CHECKING:
    from .api import Logs

log = logging.getLogger(__name__)
T = TypeVar("T")


class LogRecord(NamedTuple):
    """One record of a log."""

    offset: int
    payload: bytes


# Failures worth another attempt: the bookies or the store may come back, the writer may
# have changed its ensemble. Anything else (a truncated log, a deleted ledger) is final.
TRANSIENT = (
    BookieUnavailableError,
    LedgerRecoveryError,
    MetadataUnavailableError,
    OperationTimeoutError,
    ReadError,
    TooManyRequestsError,
)


async def retried(
    call: Callable[[], Awaitable[T]], settled: Callable[[], Awaitable[None]], logs: Logs
) -> T:
    """``call()``, again after a transient failure (a backoff from ``reconnect_backoff_s``,
    at most ``log_read_retries_max`` attempts); ``settled()`` raises first when the failure
    is final (the log was truncated past the offset, or deleted).

    Raises:
        LogTruncatedError / NoSuchLogError: from ``settled``.
        BookKeeperError: a final failure, or still failing after the last attempt.
    """
    config = logs.config
    backoff = config.reconnect_backoff_s
    for attempt in range(config.log_read_retries_max):
        try:
            return await call()
        except TRANSIENT as exc:
            await settled()
            if attempt + 1 == config.log_read_retries_max:
                raise
            log.info("log read failed (%s: %s); again in %.2f s", type(exc).__name__, exc, backoff)
        except BookKeeperError:
            await settled()
            raise
        await asyncio.sleep(backoff)
        backoff = min(2 * backoff, config.reconnect_backoff_max_s)
    raise AssertionError("unreachable")


class LedgerCache:
    """Ledger handles for reading, opened without recovery; dropped after a failed read (the
    next one opens the ledger again, with fresh metadata)."""

    def __init__(self, logs: Logs) -> None:
        self.logs = logs
        self.readers: dict[int, LedgerReader] = {}

    async def get(self, ledger_id: int) -> LedgerReader:
        reader = self.readers.get(ledger_id)
        if reader is None:
            reader = await self.logs.bk.open_ledger(ledger_id, self.logs.password, recovery=False)
            self.readers = {ledger_id: reader}  # the reader moves forward: keep one
        return reader

    async def read(self, ledger_id: int, first: int, last: int) -> list[Any]:
        """Entries ``first..last`` (confirmed: the caller checked).

        Raises:
            BookKeeperError: as ``LedgerReader.read_unconfirmed`` (the handle is dropped).
        """
        try:
            return await (await self.get(ledger_id)).read_unconfirmed(first, last)
        except BookKeeperError:
            self.readers.pop(ledger_id, None)
            raise


class LogReader:
    """Records from ``from_offset`` on, in offset order, across ledgers; at the end it waits
    for more (see the module docstring). From :meth:`Logs.open_log_reader`.

    Iterating raises LogTruncatedError (offset below the first kept one), NoSuchLogError
    (the log was deleted), or a read error after retries; the reader is then done.
    """

    def __init__(self, logs: Logs, name: str, from_offset: int) -> None:
        from .admin import check_offset

        self.name = check_name(name)
        self._next = check_offset(from_offset, "from_offset")  # the next offset to read
        self._logs = logs
        self._config = logs.config
        self._ledgers = LedgerCache(logs)
        self._buffer: collections.deque[LogRecord] = collections.deque()
        self._buffered_bytes = 0
        self._mean_bytes = 0.0
        self._ready = asyncio.Event()  # records (or an error) for the consumer
        self._room = asyncio.Event()  # the consumer took records
        self._changed = asyncio.Event()  # the log's metadata moved
        self._md: Versioned[LogMetadata] | None = None
        self._gone: BaseException | None = None  # the log was deleted
        self._error: BaseException | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._delivered = self._next

    # --- the consumer's side --------------------------------------------------------------

    def __aiter__(self) -> LogReader:
        return self

    async def __anext__(self) -> LogRecord:
        if not self._tasks and not self._closed:
            self._logs.register(self)
            self._tasks.append(self._spawn(self._produce(), "read-ahead"))
        while not self._buffer:
            if self._error is not None:
                raise self._error
            if self._closed:
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()  # the read-ahead task sets it (each step is bounded)
        record = self._buffer.popleft()
        self._buffered_bytes -= len(record.payload)
        self._delivered = record.offset + 1
        self._room.set()
        return record

    async def __aenter__(self) -> LogReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop reading ahead and following the log. Idempotent."""
        self._closed = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._ready.set()
        self._logs.unregister(self)

    @property
    def position(self) -> int:
        """The offset of the next record the iteration yields."""
        return self._delivered

    def statistics(self) -> dict[str, Any]:
        """Read-ahead state: buffered records and bytes, the next offset to read."""
        return {
            "position": self._delivered,
            "read_ahead_next": self._next,
            "buffered_records": len(self._buffer),
            "buffered_bytes": self._buffered_bytes,
        }

    # --- the read-ahead task --------------------------------------------------------------

    async def _produce(self) -> None:
        try:
            self._md = await read_log(self._logs.store, self.name)
            self._tasks.append(self._spawn(self._follow(), "follow"))
            while True:
                await retried(self._step, self._check_truncated, self._logs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # handed to the consumer, who raises it
            self._error = exc
        finally:
            self._ready.set()

    async def _step(self) -> None:
        """Read one batch, or wait (bounded) for more to read."""
        assert self._md is not None
        md = self._md.value
        await self._check_truncated()
        index = md.segment_index(self._next)
        if index is None:
            await self._wait_change(self._md.version)  # past the end of a closed log
            return
        segment = md.segments[index]
        if not segment.is_open:
            last = min(segment.end_offset - 1, self._next + self._batch() - 1)
            await self._read(segment, last - segment.first_offset)
            return
        reader = await self._ledgers.get(segment.ledger_id)
        entry = self._next - segment.first_offset
        if entry <= reader.last_add_confirmed:
            last = min(reader.last_add_confirmed, entry + self._batch() - 1)
            await self._read(segment, last)
        elif reader.is_closed:
            await self._wait_change(self._md.version)  # the log records the end next
        else:
            await self._wait_for_more(segment, reader)

    def _batch(self) -> int:
        """Entries for the next read: the read-ahead bound by the mean record size."""
        if not self._mean_bytes:
            return 1  # the records' size is not known yet
        room = self._config.log_read_ahead_bytes_max - self._buffered_bytes
        return max(1, min(self._config.log_read_batch_entries_max, int(room / self._mean_bytes)))

    async def _read(self, segment: LogSegment, last_entry: int) -> None:
        first_entry = self._next - segment.first_offset
        entries = await self._ledgers.read(segment.ledger_id, first_entry, last_entry)
        self._push(segment, entries)
        while self._buffered_bytes >= self._config.log_read_ahead_bytes_max:
            self._room.clear()
            await self._room.wait()  # the consumer's next record frees room

    def _push(self, segment: LogSegment, entries: list[Any]) -> None:
        for entry in entries:
            offset = segment.first_offset + entry.entry_id
            assert offset == self._next, (offset, self._next)
            self._buffer.append(LogRecord(offset, entry.payload))
            size = len(entry.payload)
            self._buffered_bytes += size
            mean = self._mean_bytes or max(1, size)
            self._mean_bytes = mean + (max(1, size) - mean) / 16  # a moving mean
            self._next = offset + 1
        self._ready.set()

    async def _wait_for_more(self, segment: LogSegment, reader: LedgerReader) -> None:
        """Long-poll the LAC while watching the log's metadata; whichever moves first."""
        assert self._md is not None
        # What we read is confirmed, even when a fresh handle's LAC (from other bookies)
        # is behind it.
        before = reader.last_add_confirmed = max(
            reader.last_add_confirmed, self._next - segment.first_offset - 1
        )
        version = self._md.version
        loop = asyncio.get_running_loop()
        started = loop.time()
        poll = asyncio.ensure_future(long_poll(self._logs.ctx, reader.metadata, before))
        changed = asyncio.ensure_future(self._wait_change(version, bounded=False))
        try:
            await asyncio.wait({poll, changed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (poll, changed):
                task.cancel()
            await asyncio.gather(poll, changed, return_exceptions=True)
        failure = changed.exception() if changed.done() and not changed.cancelled() else None
        if failure is not None:
            raise failure
        if not poll.done() or poll.cancelled():
            return  # the log moved: re-read from its new metadata
        lac, entry = poll.result()
        if lac > before:
            reader.last_add_confirmed = lac
            if entry is not None and entry.entry_id == before + 1:
                self._push(segment, [entry])  # the answer carried it (digest checked)
            return
        await reader.read_last_add_confirmed()  # closed meanwhile? (or another ensemble)
        fast = loop.time() - started < self._config.long_poll_timeout_ms / 2000
        if fast and reader.last_add_confirmed == before and not reader.is_closed:
            await asyncio.sleep(self._config.reconnect_backoff_s)  # every replica failed fast

    async def _wait_change(self, version: int, *, bounded: bool = True) -> None:
        """Wait until the log's metadata is newer than ``version``: at most one long poll's
        time, or (``bounded`` False) as long as the caller's long poll, which bounds it.

        Raises:
            NoSuchLogError (MetadataFormatError): the log was deleted (is corrupt).
        """
        limit = self._config.long_poll_timeout_ms / 1000 if bounded else None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit):
                while self._gone is None and self._md is not None and self._md.version == version:
                    self._changed.clear()
                    await self._changed.wait()
        if self._gone is not None:
            raise self._gone

    async def _check_truncated(self) -> None:
        """Raises LogTruncatedError past the first kept offset, NoSuchLogError once deleted."""
        assert self._md is not None
        if self._gone is not None:
            raise self._gone
        start = self._md.value.start_offset
        if self._next < start:
            raise LogTruncatedError(
                f"log {self.name}: offset {self._next} was truncated; the first offset kept "
                f"is {start}",
                start_offset=start,
            )

    async def _follow(self) -> None:
        """Keep the newest metadata of the log (a watch on its key)."""
        key = log_key(self.name)
        while True:
            try:
                async with contextlib.aclosing(self._logs.store.watch(key)) as states:
                    async for state in states:
                        self._take(state)
                return  # the store closed
            except MetadataUnavailableError as exc:
                log.info("log %s: watch failed (%s); again", self.name, exc)
                await asyncio.sleep(self._config.reconnect_backoff_max_s)

    def _take(self, state: Versioned[bytes] | None) -> None:
        try:
            versioned = decode(self.name, state)
        except BookKeeperError as exc:  # deleted (NoSuchLogError) or corrupt
            self._gone = exc
        else:
            if self._md is None or versioned.version > self._md.version:
                self._md = versioned
        self._changed.set()

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        loop = asyncio.get_running_loop()
        task = loop.create_task(coro, name=f"log reader {self.name} {what}")
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and self._error is None:
            self._error = task.exception()  # a bug, not an operating error: the consumer sees it
            self._ready.set()


async def read_records(
    logs: Logs, name: str, from_offset: int, to_offset: int | None
) -> list[LogRecord]:
    """See :meth:`Logs.read_log`."""
    versioned = await read_log(logs.store, name)
    md = versioned.value
    if from_offset < md.start_offset:
        raise LogTruncatedError(
            f"log {name}: offset {from_offset} was truncated; the first offset kept is "
            f"{md.start_offset}",
            start_offset=md.start_offset,
        )
    last = from_offset + logs.config.log_read_records_max - 1
    if to_offset is not None:
        last = min(last, to_offset)
    cache, records, offset = LedgerCache(logs), [], from_offset

    async def moved() -> None:
        start = (await read_log(logs.store, name)).value.start_offset
        if offset < start:
            raise LogTruncatedError(
                f"log {name}: offset {offset} was truncated meanwhile; the first offset kept "
                f"is {start}",
                start_offset=start,
            )

    while offset <= last:
        index = md.segment_index(offset)
        if index is None:
            break
        segment = md.segments[index]
        if segment.is_open:
            opened = await retried(partial(cache.get, segment.ledger_id), moved, logs)
            end = opened.last_add_confirmed
        else:
            end = segment.end_offset - 1 - segment.first_offset
        stop = min(end, last - segment.first_offset)
        first = offset - segment.first_offset
        while first <= stop:
            chunk = min(stop, first + logs.config.reads_parallel_max - 1)
            entries = await retried(
                partial(cache.read, segment.ledger_id, first, chunk), moved, logs
            )
            records += [LogRecord(segment.first_offset + e.entry_id, e.payload) for e in entries]
            first = chunk + 1
        offset = segment.first_offset + stop + 1
        if segment.is_open or stop < end:
            break
    return records
