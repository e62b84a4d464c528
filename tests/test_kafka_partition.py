"""OwnedPartition over memory storage, as a state machine: idempotent producers sending,
retrying and being fenced by takeovers. Invariants: Kafka offsets are dense across batches
and owners, every acknowledged batch reads back at its offset, and no batch is stored twice."""

from __future__ import annotations

import asyncio

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from bookkeeper_aio.kafka.errors import KafkaError
from bookkeeper_aio.kafka.memory_storage import MemoryPartitionStorage
from bookkeeper_aio.kafka.partition import OwnedPartition, PartitionState
from bookkeeper_aio.kafka.records import span
from tests.kafka_support import batch


class PartitionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.storage = MemoryPartitionStorage()
        self.next_sequence = {1: 0, 2: 0}
        self.sent: dict[tuple[int, int], bytes] = {}  # (producer, sequence) -> the batch
        self.acked: dict[tuple[int, int], int] = {}  # -> base offset

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    @initialize()
    def start(self):
        self.run(self.storage.create_partitions("t", range(1), (1, 1, 1)))
        self.partition = self.run(self._take_over())

    async def _take_over(self) -> OwnedPartition:
        part = OwnedPartition("t", 0, await self.storage.take_over("t", 0), 1 << 20, 100)
        await part.rebuild_producers(50)
        return part

    async def _send(self, data: bytes, key: tuple[int, int]) -> None:
        try:
            base, ack = await self.partition.append(data)
            await ack
        except KafkaError:
            return  # refused or fenced: not acknowledged
        if key in self.acked:
            assert self.acked[key] == base, "a retry must get the original's offset"
        self.acked[key] = base

    @rule(producer=st.sampled_from([1, 2]), records=st.integers(1, 4))
    def send_new(self, producer, records):
        seq = self.next_sequence[producer]
        values = [f"{producer}-{seq + i}".encode() for i in range(records)]
        data = batch(values, producer_id=producer, epoch=0, sequence=seq)
        self.sent[producer, seq] = data
        self.next_sequence[producer] = seq + records
        self.run(self._send(data, (producer, seq)))

    @rule(data=st.data())
    def retry(self, data):
        if self.sent:
            key = data.draw(st.sampled_from(sorted(self.sent)[-5:]))
            self.run(self._send(self.sent[key], key))

    @rule()
    def fenced_then_taken_back(self):
        self.run(self.storage.take_over("t", 0))  # someone else took the log over
        self.partition.fail(KafkaError("fenced"), quiet=True)
        self.partition = self.run(self._take_over())
        assert self.partition.state is PartitionState.OWNED

    @invariant()
    def offsets_dense_and_nothing_twice(self):
        entries = self.storage.partitions["t", 0].entries
        expected = 0
        for entry in entries:
            first, end = span(entry)
            assert first == expected
            expected = end
        assert len({e[61:] for e in entries}) == len(entries), "a batch stored twice"
        for (producer, seq), base in self.acked.items():
            match = [e for e in entries if span(e)[0] == base]
            assert match and match[0][61:] == self.sent[producer, seq][61:]

    def teardown(self):
        self.loop.close()


TestPartitionMachine = PartitionMachine.TestCase
TestPartitionMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
