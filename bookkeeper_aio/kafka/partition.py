"""A topic partition as its owning gateway serves it, over the storage seam.

Theory of operation
-------------------
The storage seam is two small protocols. :class:`PartitionStorage` creates and deletes a
topic's partitions, takes a partition's log over (fencing whoever wrote it before) and keeps
consumer groups' committed offsets. :class:`PartitionLog` is one taken-over partition: it
appends one entry per record batch and acknowledges them in order, moving the high watermark
only when an entry is acknowledged; it reads whole batches from the one that holds a Kafka
offset; it lets a fetch wait for the high watermark to move. ``log_storage.py`` implements it
on named logs (production), ``memory_storage.py`` in memory (unit tests).

:class:`OwnedPartition` is the one copy of what the gateway does with a partition it owns,
whatever the storage: validate a produced batch, check the idempotent producer's sequence
(``sequences.py``), give the batch its base offset (the next Kafka offset: offsets count
records, so the next batch starts ``lastOffsetDelta + 1`` later) and append it; serve a fetch
from a Kafka offset. Its state is OWNED until its log fails or is fenced, then FAILED for
good: the gateway drops it and a later request takes the log over again (fencing and
recovering whatever this one left half-written, so offsets continue from the log's true end).
Base offsets are assigned and appends issued synchronously, so batches are appended in the
order their produce requests were dispatched.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable
from typing import Protocol

from .errors import ErrorCode, KafkaError, NotLeaderError
from .records import parse_header, span, validate_batch, with_base_offset
from .sequences import ProducerSequences

log = logging.getLogger(__name__)


class PartitionLog(Protocol):
    """One partition's log, taken over by this gateway (the storage seam)."""

    @property
    def end_offset(self) -> int:
        """The Kafka offset after the last entry when the log was taken over."""
        ...

    @property
    def high_watermark(self) -> int:
        """Every record below it is acknowledged (readable by consumers)."""
        ...

    @property
    def log_start_offset(self) -> int:
        """The first Kafka offset still stored."""
        ...

    def append_nowait(self, entry: bytearray) -> asyncio.Future[None]:
        """Append one batch (its base offset already written) as one entry; the future is
        done when the entry is acknowledged, after the high watermark moved past it.

        Raises (through the future):
            NotLeaderError: another writer fenced this one.
            BookKeeperError: the append failed (its outcome is unknown).
        """
        ...

    async def wait_for_room(self, size: int) -> None:
        """Wait until an append of ``size`` bytes would not exceed the writer's bounds."""
        ...

    async def read(self, offset: int, max_bytes: int) -> list[bytes]:
        """Whole acknowledged batches from the one holding ``offset`` (below the high
        watermark), stopping past ``max_bytes`` (the first batch is returned whatever its
        size, as Kafka does)."""
        ...

    async def wait_for_more(self, offset: int) -> None:
        """Return once the high watermark is above ``offset`` (the caller bounds the wait)."""
        ...

    async def recent_headers(self, count_max: int) -> list[bytes]:
        """The 61-byte batch headers of up to ``count_max`` of the last entries, oldest first
        (the idempotent producers' state is rebuilt from them)."""
        ...

    async def close(self) -> None:
        """Stop writing (pending appends are failed or finished); release resources."""
        ...


class PartitionStorage(Protocol):
    """Where partitions live (the storage seam's factory)."""

    async def create_partitions(
        self, topic: str, partitions: range, quorum: tuple[int, int, int]
    ) -> None:
        """Create the logs of these partitions (E, WQ, AQ); existing ones are kept."""
        ...

    async def delete_partitions(self, topic: str, partitions: range) -> None:
        """Delete the logs of these partitions (missing ones are fine)."""
        ...

    async def take_over(self, topic: str, partition: int) -> PartitionLog:
        """Become the partition's writer, fencing any previous one.

        Raises:
            UnknownTopicError: the partition's log does not exist.
        """
        ...

    async def commit_offset(self, topic: str, partition: int, group: str, offset: int) -> None:
        """Store a group's committed Kafka offset for the partition."""
        ...

    async def committed_offset(self, topic: str, partition: int, group: str) -> int | None:
        """A group's committed Kafka offset for the partition, or None."""
        ...


class PartitionState(enum.Enum):
    OWNED = "owned"
    FAILED = "failed"


class OwnedPartition:
    """A partition this gateway writes (see the module docstring)."""

    def __init__(
        self,
        topic: str,
        index: int,
        log_: PartitionLog,
        batch_bytes_max: int,
        producers_max: int,
    ) -> None:
        self.topic = topic
        self.index = index
        self.log = log_
        self.batch_bytes_max = batch_bytes_max
        self.sequences = ProducerSequences(producers_max)
        self.next_offset = log_.end_offset
        self.state = PartitionState.OWNED
        self.failure: BaseException | None = None
        self.appended_batches = 0

    async def rebuild_producers(self, batches_max: int) -> None:
        """Learn the idempotent producers' last sequences from the log's last batches, so a
        retry of a batch the previous owner wrote is recognized as a duplicate."""
        for entry in await self.log.recent_headers(batches_max):
            header = parse_header(entry)
            self.sequences.record(header, header.base_offset)

    async def append(self, data: bytes | None) -> tuple[int, Awaitable[None]]:
        """Validate one produced batch and append it: (base offset, its acknowledgement).

        A duplicate of an idempotent producer's batch is not appended again: its original
        base offset and acknowledgement are returned.

        Raises:
            KafkaError: the batch is invalid (CORRUPT_MESSAGE, MESSAGE_TOO_LARGE, ...), out
                of sequence, or the partition is no longer owned (NOT_LEADER_OR_FOLLOWER).
        """
        header = validate_batch(data, self.batch_bytes_max)
        assert data is not None
        await self.log.wait_for_room(len(data))
        self._check_owned()  # re-checked: the wait may have seen the log fail
        duplicate = self.sequences.check(header)
        if duplicate is not None:
            original = duplicate.original
            return original.base_offset, original.token or _done()
        base_offset = self.next_offset
        future = self.log.append_nowait(with_base_offset(data, base_offset))
        future.add_done_callback(self._on_ack)
        self.next_offset = base_offset + header.offset_span
        self.sequences.record(header, base_offset, future)
        self.appended_batches += 1
        return base_offset, future

    async def fetch(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding ``offset`` up to the high watermark.

        Raises:
            KafkaError: OFFSET_OUT_OF_RANGE (below the log start or above the high watermark).
        """
        self._check_owned()
        if not self.log.log_start_offset <= offset <= self.log.high_watermark:
            raise KafkaError(
                f"offset {offset} is outside {self.log.log_start_offset}.."
                f"{self.log.high_watermark} of {self.topic}-{self.index}",
                ErrorCode.OFFSET_OUT_OF_RANGE,
            )
        if offset == self.log.high_watermark:
            return b""
        batches = await self.log.read(offset, max_bytes)
        assert not batches or span(batches[0])[0] <= offset < span(batches[0])[1]
        return b"".join(batches)

    def fail(self, exc: BaseException, quiet: bool = False) -> None:
        """The partition's log failed or was fenced (or the gateway lets it go): stop
        serving it."""
        if self.state is PartitionState.OWNED:
            self.state = PartitionState.FAILED
            self.failure = exc
            log.log(logging.INFO if quiet else logging.WARNING,
                    "%s-%d: no longer owned here: %r", self.topic, self.index, exc)  # fmt: skip

    def _on_ack(self, future: asyncio.Future[None]) -> None:
        if future.cancelled():
            self.fail(NotLeaderError("append cancelled"))
        elif (exc := future.exception()) is not None:
            self.fail(exc)

    def _check_owned(self) -> None:
        if self.state is not PartitionState.OWNED:
            raise NotLeaderError(
                f"{self.topic}-{self.index} is no longer owned here: {self.failure!r}"
            )

    def statistics(self) -> dict[str, int]:
        return {
            "next_offset": self.next_offset,
            "high_watermark": self.log.high_watermark,
            "appended_batches": self.appended_batches,
            "producers": len(self.sequences),
            "duplicates": self.sequences.duplicates,
        }


def _done() -> asyncio.Future[None]:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future
