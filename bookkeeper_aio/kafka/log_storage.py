"""The storage seam on named logs: one log per topic partition, one entry per record batch.

Theory of operation
-------------------
Partition *p* of topic *t* is the log ``kafka:<t>:<p>`` (a topic name has no ``:``), created
with the topic's ensemble, write quorum and ack quorum and the gateway's
``kafka_segment_bytes_max``. Taking a partition over is opening the log's writer: that bumps
the log's epoch and recovers (fences) the previous writer's open ledger, so a gateway that
lost the partition without noticing has its next append refused (LogFencedError, answered
NOT_LEADER_OR_FOLLOWER) and nothing it had acknowledged is lost. The new owner reads the last
entry back: the Kafka offset after it is where its own batches start.

Each batch is appended with ``append_callback``: the log offset is known at once (for the
offset index) and the callbacks come in offset order, so the high watermark — the Kafka
offset after the last acknowledged batch — only moves forward, and only when the log's ack
quorum has the entry. Reads go through ``offset_index.py`` to find the entry holding a Kafka
offset, then read whole entries: recent ones this gateway appended from a bounded tail cache
(a consumer keeping up never reaches the bookies), older ones with ``read_log`` (confirmed
entries only).

A consumer group's committed offset for the partition is a cursor of its log
(``commit_log_offset``): the cursor holds the **Kafka** offset (a record count, as
OffsetFetch must return it), under the group id percent-encoded (a cursor name has no ``/``
or spaces).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

from ..config import KafkaConfig
from ..errors import LogFencedError, NoSuchLogError
from .errors import NotLeaderError, UnknownTopicError
from .offset_index import OffsetIndex
from .ownership import key_segment
from .records import HEADER_BYTES, span

if TYPE_CHECKING:
    from ..client.bookkeeper import BookKeeper
    from ..logs.writer import LogWriter

log = logging.getLogger(__name__)

OWN_INDEX_ENTRIES_MAX = 1 << 20  # 8 MiB of base offsets per partition
CACHED_BASES_MAX = 4096  # base offsets learnt by bisection, per partition
READ_CHUNK_ENTRIES = 64  # entries one read_log call of a fetch asks for (bounded memory)


def log_name(topic: str, partition: int) -> str:
    """The log behind a topic partition."""
    return f"kafka:{topic}:{partition}"


def cursor_name(group: str) -> str:
    """A Kafka group id as a log cursor name (percent-encoded: no ``/``, no spaces)."""
    return key_segment(group)


class LogPartitionStorage:
    """:class:`~bookkeeper_aio.kafka.partition.PartitionStorage` on named logs."""

    def __init__(self, bk: BookKeeper, config: KafkaConfig) -> None:
        self.bk = bk
        self.config = config

    async def create_partitions(
        self, topic: str, partitions: range, quorum: tuple[int, int, int]
    ) -> None:
        ensemble, write_quorum, ack_quorum = quorum
        for p in partitions:
            await self.bk.create_log(
                log_name(topic, p), ensemble_size=ensemble, write_quorum=write_quorum,
                ack_quorum=ack_quorum, segment_bytes_max=self.config.kafka_segment_bytes_max,
                exist_ok=True,
            )  # fmt: skip

    async def delete_partitions(self, topic: str, partitions: range) -> None:
        for p in partitions:
            try:
                await self.bk.delete_log(log_name(topic, p))
            except NoSuchLogError:
                pass  # already gone (a delete interrupted half-way, or never created)

    async def take_over(self, topic: str, partition: int) -> LogPartition:
        name = log_name(topic, partition)
        writer = self.bk.open_log_writer(name)
        try:
            await writer.open()  # the takeover: epoch bump, recovery of the open ledger
        except NoSuchLogError as exc:
            raise UnknownTopicError(f"no log {name}") from exc
        try:
            part = LogPartition(self.bk, name, writer, self.config)
            await part.start()
        except BaseException:
            await writer.abort()
            raise
        return part

    async def commit_offset(self, topic: str, partition: int, group: str, offset: int) -> None:
        await self.bk.commit_log_offset(log_name(topic, partition), cursor_name(group), offset)

    async def committed_offset(self, topic: str, partition: int, group: str) -> int | None:
        return await self.bk.committed_log_offset(log_name(topic, partition), cursor_name(group))


class LogPartition:
    """:class:`~bookkeeper_aio.kafka.partition.PartitionLog` on a taken-over named log."""

    def __init__(self, bk: BookKeeper, name: str, writer: LogWriter, config: KafkaConfig) -> None:
        self.bk = bk
        self.name = name
        self.writer = writer
        self.config = config
        self.index = OffsetIndex(OWN_INDEX_ENTRIES_MAX, CACHED_BASES_MAX)
        self._end = 0  # Kafka offset after the last entry at takeover
        self._start = 0  # first Kafka offset kept
        self._hw = 0
        self._acked_log_end = 0  # log offset after the last acknowledged entry
        self._taken_over_at = 0  # the log's next offset when this writer took over
        self._old_segments: list[tuple[int, int]] = []
        self._log_start = 0  # the first log offset kept
        self._changed = asyncio.Event()
        self._tail: OrderedDict[int, bytes] = OrderedDict()  # log offset -> entry
        self._tail_bytes = 0
        self.tail_hits = self.log_reads = 0

    async def start(self) -> None:
        """Learn the log's Kafka offsets: its first kept one and the one after its end."""
        info = await self.bk.log_info(self.name)
        self._acked_log_end = self._taken_over_at = self.writer.next_offset
        # What the log held at the takeover never changes: its segments, clipped there, are
        # all a bisection for an older offset needs (this writer's own are indexed).
        self._old_segments = [
            (s.first_offset, min(s.last_offset, self._taken_over_at - 1))
            for s in info.segments
            if s.first_offset <= min(s.last_offset, self._taken_over_at - 1)
        ]
        self._log_start = info.start_offset
        if info.start_offset < self._acked_log_end:
            self._start = await self._read_base(info.start_offset)
            [last] = await self.bk.read_log(
                self.name, self._acked_log_end - 1, self._acked_log_end - 1
            )
            self._end = span(last.payload)[1]
        self._hw = self._end

    @property
    def end_offset(self) -> int:
        return self._end

    @property
    def high_watermark(self) -> int:
        return self._hw

    @property
    def log_start_offset(self) -> int:
        return self._start

    def append_nowait(self, entry: bytearray) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        payload = bytes(entry)
        base, end = span(payload)
        try:
            log_offset = self.writer.append_callback(
                payload, lambda o, e: self._acked(future, payload, end, o, e)
            )
        except LogFencedError as exc:
            future.set_exception(NotLeaderError(f"{self.name}: fenced by another writer: {exc}"))
            return future
        except Exception as exc:  # the writer failed earlier: the outcome is known (not sent)
            future.set_exception(exc)
            return future
        self.index.appended(log_offset, base)
        return future

    def _acked(
        self,
        future: asyncio.Future[None],
        payload: bytes,
        end: int,
        log_offset: int,
        error: BaseException | None,
    ) -> None:
        if error is not None:
            if isinstance(error, LogFencedError):
                error = NotLeaderError(f"{self.name}: fenced by another writer: {error}")
            if not future.done():
                future.set_exception(error)
            return
        self._acked_log_end = log_offset + 1
        self._hw = end
        self._remember(log_offset, payload)
        self._changed.set()
        self._changed = asyncio.Event()
        if not future.done():
            future.set_result(None)

    async def wait_for_room(self, size: int) -> None:
        try:
            await self.writer.wait_for_room(size)
        except LogFencedError as exc:
            raise NotLeaderError(f"{self.name}: fenced by another writer: {exc}") from exc

    async def read(self, offset: int, max_bytes: int) -> list[bytes]:
        log_offset = await self.index.locate(offset, self._segments, self._read_base)
        out: list[bytes] = []
        size = 0
        while log_offset < self._acked_log_end and (not out or size < max_bytes):
            last = min(self._acked_log_end, log_offset + READ_CHUNK_ENTRIES) - 1
            batch = await self._entries(log_offset, last)
            for entry in batch:
                if out and size + len(entry) > max_bytes:
                    return out
                out.append(entry)
                size += len(entry)
            log_offset += len(batch)
        return out

    async def wait_for_more(self, offset: int) -> None:
        while self._hw <= offset:
            await self._changed.wait()

    async def recent_headers(self, count_max: int) -> list[bytes]:
        first = max(self._log_start, self._acked_log_end - count_max)
        headers: list[bytes] = []
        while first < self._acked_log_end:  # in chunks: memory is bounded whatever the sizes
            last = min(self._acked_log_end, first + READ_CHUNK_ENTRIES) - 1
            records = await self.bk.read_log(self.name, first, last)
            headers += [r.payload[:HEADER_BYTES] for r in records]
            first += len(records)
        return headers

    async def close(self) -> None:
        try:
            await self.writer.close()
        except Exception as exc:  # fenced or failed: what was acknowledged stays in the log
            log.info("%s: writer closed with %r", self.name, exc)

    # --- helpers --------------------------------------------------------------------------

    async def _entries(self, first: int, last: int) -> list[bytes]:
        """Entries from ``first`` (not past ``last``): from the tail cache when it holds
        ``first``, else one read_log call."""
        cached: list[bytes] = []
        while first + len(cached) <= last and (entry := self._tail.get(first + len(cached))):
            cached.append(entry)
        if cached:
            self.tail_hits += len(cached)
            return cached
        self.log_reads += 1
        return [r.payload for r in await self.bk.read_log(self.name, first, last)]

    async def _read_base(self, log_offset: int) -> int:
        [record] = await self.bk.read_log(self.name, log_offset, log_offset)
        return span(record.payload)[0]

    async def _segments(self) -> list[tuple[int, int]]:
        if self.index.own_covers(self._taken_over_at):
            return self._old_segments
        info = await self.bk.log_info(self.name)  # the own index dropped entries: ask the log
        return [
            (s.first_offset, s.last_offset)
            for s in info.segments
            if s.last_offset >= s.first_offset
        ]

    def _remember(self, log_offset: int, payload: bytes) -> None:
        self._tail[log_offset] = payload
        self._tail_bytes += len(payload)
        while self._tail_bytes > self.config.kafka_tail_cache_bytes_max and self._tail:
            _, old = self._tail.popitem(last=False)
            self._tail_bytes -= len(old)
