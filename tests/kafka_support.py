"""Test helpers for the Kafka gateway: a raw Kafka client over a socket (requests built with
aiokafka's client-side classes, the way a Kafka client sends them), record batches, and an
in-process gateway on memory storage."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import uuid
from collections.abc import AsyncIterator
from typing import Any

from aiokafka.protocol.api import RequestHeader_v1
from aiokafka.protocol.fetch import FetchRequest_v4
from aiokafka.protocol.produce import ProduceRequest_v3, ProduceRequest_v7
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords

from bookkeeper_aio.config import KafkaConfig
from bookkeeper_aio.kafka.gateway import Gateway
from bookkeeper_aio.kafka.memory_storage import MemoryPartitionStorage
from bookkeeper_aio.metadata.memory import MemoryMetadataStore
from bookkeeper_aio.metadata.store import open_metadata_store
from bookkeeper_aio.sandbox import free_port

TIMEOUT_S = 10.0


def batch(values: list[bytes], producer_id: int = -1, epoch: int = -1, sequence: int = -1) -> bytes:
    """A record batch v2 as a producer builds it (base offset 0)."""
    builder = DefaultRecordBatchBuilder(2, 0, 0, producer_id, epoch, sequence, 1 << 20)
    for i, value in enumerate(values):
        builder.append(i, 1_700_000_000_000, None, value, [])
    return bytes(builder.build())


def frame(request: Any, correlation_id: int, client_id: str = "raw") -> bytes:
    """A request frame: size, header v1, body."""
    data = RequestHeader_v1(request, correlation_id, client_id).encode() + request.encode()
    return struct.pack(">i", len(data)) + data


class RawClient:
    """One TCP connection speaking frames; answers are read back raw (correlation id, body)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, port: int) -> AsyncIterator[RawClient]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            yield cls(reader, writer)
        finally:
            writer.close()

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    def send(self, request: Any, correlation_id: int) -> None:
        self.writer.write(frame(request, correlation_id))

    async def receive(self) -> tuple[int, bytes]:
        """(correlation id, body) of the next answer."""
        async with asyncio.timeout(TIMEOUT_S):
            (size,) = struct.unpack(">i", await self.reader.readexactly(4))
            data = await self.reader.readexactly(size)
        return struct.unpack(">i", data[:4])[0], data[4:]

    async def call(self, request: Any, correlation_id: int = 1) -> Any:
        """Send, receive, decode with the request's own response class."""
        self.send(request, correlation_id)
        cid, body = await self.receive()
        assert cid == correlation_id
        return request.RESPONSE_TYPE.decode(body)

    async def closed_by_peer(self) -> bool:
        """True when the gateway closed the connection (EOF within the timeout)."""
        async with asyncio.timeout(TIMEOUT_S):
            return await self.reader.read(1) == b""


@contextlib.asynccontextmanager
async def memory_gateway(**config: Any) -> AsyncIterator[Gateway]:
    """A gateway on memory storage and a memory metadata store, on a free port."""
    name = f"kafka-{uuid.uuid4().hex[:8]}"
    port = free_port()
    async with open_metadata_store(f"memory://{name}") as store:
        cfg = KafkaConfig(kafka_listen=f"127.0.0.1:{port}", **config)
        try:
            async with Gateway.serve(cfg, store, MemoryPartitionStorage()) as gateway:
                yield gateway
        finally:
            MemoryMetadataStore.forget(name)


UNSUPPORTED_VERSION, CORRUPT_MESSAGE, UNKNOWN_TOPIC, NOT_LEADER = 35, 2, 3, 6


def produce(topic: str, partition: int, data: bytes, acks: int = -1, version: int = 3):
    cls = {3: ProduceRequest_v3, 7: ProduceRequest_v7}[version]
    return cls(None, acks, 5_000, [(topic, [(partition, data)])])


def produce_answer(response) -> tuple[int, int]:
    """(error code, base offset) of a one-partition produce answer."""
    [(_, [part])] = response.topics
    return part[1], part[2]


def fetch(topic: str, partition: int, offset: int, max_wait_ms: int = 0):
    return FetchRequest_v4(
        -1, max_wait_ms, 1, 1 << 20, 0, [(topic, [(partition, offset, 1 << 20)])]
    )


def fetched_values(response) -> list[bytes]:
    [(_, [part])] = response.topics
    records, out = MemoryRecords(part[-1]), []
    while (b := records.next_batch()) is not None:
        out += [r.value for r in b]
    return out
