"""The storage seam in memory: partitions as lists of batches (unit tests, no bookies).

Acknowledgements come one loop turn after the append (``call_soon``), in order, so the high
watermark lags the appends as it does on real logs. A takeover fences the previous
:class:`MemoryPartitionLog` of the partition: its later appends fail with
:class:`NotLeaderError`, as a fenced log writer's do.
"""

from __future__ import annotations

import asyncio
import bisect
from dataclasses import dataclass, field

from .errors import NotLeaderError, UnknownTopicError
from .records import HEADER_BYTES, span


@dataclass
class _Partition:
    entries: list[bytes] = field(default_factory=list)
    bases: list[int] = field(default_factory=list)  # base offset of each entry
    acked_end: int = 0  # high watermark
    epoch: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class MemoryPartitionStorage:
    """:class:`~bookkeeper_aio.kafka.partition.PartitionStorage` in memory."""

    def __init__(self) -> None:
        self.partitions: dict[tuple[str, int], _Partition] = {}
        self.offsets: dict[tuple[str, int, str], int] = {}
        self.takeovers = 0

    async def create_partitions(
        self, topic: str, partitions: range, quorum: tuple[int, int, int]
    ) -> None:
        for p in partitions:
            self.partitions.setdefault((topic, p), _Partition())

    async def delete_partitions(self, topic: str, partitions: range) -> None:
        for p in partitions:
            self.partitions.pop((topic, p), None)

    async def take_over(self, topic: str, partition: int) -> MemoryPartitionLog:
        state = self.partitions.get((topic, partition))
        if state is None:
            raise UnknownTopicError(f"no log for {topic}-{partition}")
        state.epoch += 1
        self.takeovers += 1
        return MemoryPartitionLog(state, state.epoch)

    async def commit_offset(self, topic: str, partition: int, group: str, offset: int) -> None:
        self.offsets[topic, partition, group] = offset

    async def committed_offset(self, topic: str, partition: int, group: str) -> int | None:
        return self.offsets.get((topic, partition, group))


class MemoryPartitionLog:
    """:class:`~bookkeeper_aio.kafka.partition.PartitionLog` in memory."""

    def __init__(self, state: _Partition, epoch: int) -> None:
        self._state = state
        self._epoch = epoch
        self._end = span(state.entries[-1])[1] if state.entries else 0
        state.acked_end = self._end  # a takeover recovers: what was written is acknowledged

    @property
    def end_offset(self) -> int:
        return self._end

    @property
    def high_watermark(self) -> int:
        return self._state.acked_end

    @property
    def log_start_offset(self) -> int:
        return self._state.bases[0] if self._state.bases else 0

    def append_nowait(self, entry: bytearray) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._state.epoch != self._epoch:
            future.set_exception(NotLeaderError("fenced by a newer writer"))
            return future
        base, end = span(entry)
        self._state.entries.append(bytes(entry))
        self._state.bases.append(base)
        asyncio.get_running_loop().call_soon(self._ack, future, end)
        return future

    def _ack(self, future: asyncio.Future[None], end: int) -> None:
        self._state.acked_end = max(self._state.acked_end, end)
        self._state.changed.set()
        self._state.changed = asyncio.Event()
        if not future.done():
            future.set_result(None)

    async def wait_for_room(self, size: int) -> None:
        return None

    async def read(self, offset: int, max_bytes: int) -> list[bytes]:
        i = max(0, bisect.bisect_right(self._state.bases, offset) - 1)
        out: list[bytes] = []
        size = 0
        for entry in self._state.entries[i:]:
            if span(entry)[1] > self._state.acked_end or (out and size + len(entry) > max_bytes):
                break
            out.append(entry)
            size += len(entry)
        return out

    async def wait_for_more(self, offset: int) -> None:
        while self._state.acked_end <= offset:
            await self._state.changed.wait()

    async def recent_headers(self, count_max: int) -> list[bytes]:
        return [entry[:HEADER_BYTES] for entry in self._state.entries[-count_max:]]

    async def close(self) -> None:
        return None
