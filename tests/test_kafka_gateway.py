"""The Kafka gateway in-process on memory storage: real Kafka clients (aiokafka) and raw
sockets for the protocol's corners and bad input (issue 33 points 1, 3, 4 and 7)."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import subprocess
import sys
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.protocol.admin import ApiVersionRequest_v0, ApiVersionRequest_v2
from aiokafka.protocol.coordination import FindCoordinatorRequest_v0
from aiokafka.protocol.metadata import MetadataRequest_v1, MetadataRequest_v4
from aiokafka.protocol.produce import ProduceRequest_v2
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords

from bookkeeper_aio.config import KafkaConfig
from bookkeeper_aio.kafka.__main__ import build_config, parse_args
from bookkeeper_aio.kafka.gateway import Gateway
from bookkeeper_aio.kafka.memory_storage import MemoryPartitionStorage
from bookkeeper_aio.metadata.memory import MemoryMetadataStore
from bookkeeper_aio.metadata.store import open_metadata_store
from bookkeeper_aio.sandbox import free_port
from tests.kafka_support import (
    CORRUPT_MESSAGE,
    NOT_LEADER,
    UNKNOWN_TOPIC,
    UNSUPPORTED_VERSION,
    RawClient,
    batch,
    fetch,
    fetched_values,
    memory_gateway,
    produce,
    produce_answer,
)


async def test_aiokafka_idempotent_producer_and_a_group_of_two_read_everything(caplog):
    async with memory_gateway(kafka_group_session_timeout_ms_min=1000) as gw:
        await gw.topics.create("orders", 3, 1, 1, 1)
        bootstrap = f"127.0.0.1:{gw.port}"
        sent = [f"r{i}".encode() for i in range(2000)]
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True
        )
        await producer.start()
        try:
            results = await asyncio.gather(*[await producer.send("orders", v, key=v) for v in sent])
        finally:
            await producer.stop()
        acked = {(r.partition, r.offset) for r in results}
        assert len(acked) == len(sent)  # every record its own offset
        consumers = [
            AIOKafkaConsumer("orders", bootstrap_servers=bootstrap, group_id="billing",
                             auto_offset_reset="earliest", session_timeout_ms=6000)
            for _ in range(2)
        ]  # fmt: skip
        got: dict[int, list[bytes]] = {}
        for c in consumers:
            await c.start()
        try:
            async with asyncio.timeout(30):
                while sum(map(len, got.values())) < len(sent):
                    for c in consumers:
                        for tp, msgs in (await c.getmany(timeout_ms=200)).items():
                            got.setdefault(tp.partition, []).extend(m.value for m in msgs)
        finally:
            for c in consumers:
                await c.stop()
        everything = [v for vs in got.values() for v in vs]
        assert sorted(everything) == sorted(sent)  # exactly once each
        for partition, values in got.items():  # in produce order within each partition
            order = [r for r in results if r.partition == partition]
            assert values == [sent[results.index(r)] for r in sorted(order, key=lambda r: r.offset)]
        # The leader's (aiokafka's roundrobin) assignments passed the coordinator's check.
        assert not [r for r in caplog.records if r.name == "bookkeeper_aio.kafka.coordinator"]


async def test_unknown_api_key_and_versions_get_unsupported_version_and_the_gateway_goes_on():
    async with memory_gateway() as gw, RawClient.connect(gw.port) as c:
        c.send_raw(struct.pack(">ihhih", 10, 999, 0, 7, -1))  # an API key nobody knows
        cid, body = await c.receive()
        assert cid == 7 and struct.unpack(">h", body[:2])[0] == UNSUPPORTED_VERSION
        c.send(ProduceRequest_v2(-1, 1000, []), 9)  # Produce v2: below the advertised range
        cid, body = await c.receive()
        assert cid == 9 and struct.unpack(">h", body[:2])[0] == UNSUPPORTED_VERSION
        versions = await c.call(ApiVersionRequest_v2(), 10)  # the connection is still good
        assert versions.error_code == 0
        assert {k: (lo, hi) for k, lo, hi in versions.api_versions}[0] == (3, 7)


async def test_api_versions_v3_is_answered_flexibly_and_v4_with_error_35():
    async with memory_gateway() as gw, RawClient.connect(gw.port) as c:
        # ApiVersions v3, header v2: client id, empty tags; body: two compact strings, tags.
        body = (
            struct.pack(">hhih", 18, 3, 1, 3) + b"kcl" + b"\x00" + b"\x04abc" + b"\x021" + b"\x00"
        )
        c.send_raw(struct.pack(">i", len(body)) + body)
        cid, answer = await c.receive()
        error, count = struct.unpack(">hB", answer[:3])
        assert (cid, error, count - 1) == (1, 0, 13)
        assert answer[3:10] == struct.pack(">hhhB", 0, 3, 7, 0)  # Produce 3-7, no tags
        v4 = struct.pack(">hhih", 18, 4, 2, -1)
        c.send_raw(struct.pack(">i", len(v4)) + v4)
        cid, answer = await c.receive()
        assert cid == 2 and struct.unpack(">h", answer[:2])[0] == UNSUPPORTED_VERSION
        assert (await c.call(ApiVersionRequest_v0(), 3)).error_code == 0


async def test_bad_batches_get_corrupt_message_or_too_large():
    async with memory_gateway(kafka_batch_bytes_max=4096) as gw, RawClient.connect(gw.port) as c:
        await gw.topics.create("t", 1, 1, 1, 1)
        good = batch([b"a", b"b"])
        bad_crc = bytearray(good)
        bad_crc[-1] ^= 0xFF
        bad_magic = bytearray(good)
        bad_magic[16] = 1
        cases = {
            "crc": bytes(bad_crc),
            "magic": bytes(bad_magic),
            "two batches": good + good,
            "truncated": good[:-3],
            "short": good[:20],
        }
        for i, (name, data) in enumerate(cases.items()):
            error, _ = produce_answer(await c.call(produce("t", 0, data), i))
            assert error == CORRUPT_MESSAGE, name
        error, _ = produce_answer(await c.call(produce("t", 0, batch([b"x" * 5000])), 20))
        assert error == 10  # MESSAGE_TOO_LARGE
        assert produce_answer(await c.call(produce("t", 0, good), 21)) == (0, 0)  # still serving
        assert fetched_values(await c.call(fetch("t", 0, 0), 22)) == [b"a", b"b"]


async def test_oversized_and_undecodable_requests_close_only_their_connection():
    async with memory_gateway(kafka_request_bytes_max=64 * 1024, kafka_batch_bytes_max=1024) as gw:
        async with RawClient.connect(gw.port) as c:
            c.send_raw(struct.pack(">i", 10 * 1024 * 1024))  # announces 10 MiB: not read
            assert await c.closed_by_peer()
        async with RawClient.connect(gw.port) as c:
            body = struct.pack(">hhih", 3, 1, 5, -1) + struct.pack(">i", 3)  # 3 topics, none sent
            c.send_raw(struct.pack(">i", len(body)) + body)
            assert await c.closed_by_peer()
        async with RawClient.connect(gw.port) as c:
            assert (await c.call(ApiVersionRequest_v0(), 1)).error_code == 0


async def test_produce_to_an_unknown_topic_and_auto_creation():
    async with memory_gateway() as gw, RawClient.connect(gw.port) as c:
        assert (
            produce_answer(await c.call(produce("nope", 0, batch([b"x"])), 1))[0] == UNKNOWN_TOPIC
        )
        md = await c.call(MetadataRequest_v4(["nope"], True), 2)
        assert md.topics[0][0] == UNKNOWN_TOPIC and await gw.topics.get("nope") is None
    async with memory_gateway(kafka_auto_create_topics=True) as gw, RawClient.connect(gw.port) as c:
        assert produce_answer(await c.call(produce("auto", 0, batch([b"x"])), 1)) == (0, 0)
        info = await gw.topics.get("auto")
        assert info is not None and info.partitions == gw.config.kafka_default_partitions
        md = await c.call(MetadataRequest_v4(["made-by-metadata"], True), 2)
        assert md.topics[0][0] == 0 and await gw.topics.get("made-by-metadata") is not None
        md = await c.call(MetadataRequest_v4(["not-this-one"], False), 3)  # the client said no
        assert md.topics[0][0] == UNKNOWN_TOPIC


async def test_acks_zero_gets_no_answer_and_answers_keep_request_order():
    async with memory_gateway() as gw, RawClient.connect(gw.port) as c:
        await gw.topics.create("t", 1, 1, 1, 1)
        c.send(produce("t", 0, batch([b"fire", b"forget"]), acks=0), 1)
        assert (await c.call(MetadataRequest_v1(["t"]), 2)).topics[0][0] == 0  # 1 never answered
        # A fetch parked for new data, then a quick request: answers come in request order.
        c.send(fetch("t", 0, 2, max_wait_ms=300), 3)
        c.send(ApiVersionRequest_v0(), 4)
        assert (await c.receive())[0] == 3
        assert (await c.receive())[0] == 4
        assert fetched_values(await c.call(fetch("t", 0, 0), 5)) == [b"fire", b"forget"]


async def test_a_parked_fetch_is_woken_by_a_produce():
    async with (
        memory_gateway() as gw,
        RawClient.connect(gw.port) as c,
        RawClient.connect(gw.port) as p,
    ):
        await gw.topics.create("t", 1, 1, 1, 1)
        c.send(fetch("t", 0, 0, max_wait_ms=10_000), 1)
        await asyncio.sleep(0.1)
        started = asyncio.get_running_loop().time()
        assert produce_answer(await p.call(produce("t", 0, batch([b"wake"])), 1)) == (0, 0)
        cid, _ = await c.receive()
        assert cid == 1 and asyncio.get_running_loop().time() - started < 2.0


async def test_idempotent_duplicates_are_answered_with_the_original_offset():
    async with memory_gateway() as gw, RawClient.connect(gw.port) as c:
        await gw.topics.create("t", 1, 1, 1, 1)
        first = batch([b"a", b"b"], producer_id=7, epoch=0, sequence=0)
        assert produce_answer(await c.call(produce("t", 0, first), 1)) == (0, 0)
        assert produce_answer(await c.call(produce("t", 0, first), 2)) == (0, 0)  # a retry
        nxt = batch([b"c"], producer_id=7, epoch=0, sequence=2)
        assert produce_answer(await c.call(produce("t", 0, nxt), 3)) == (0, 2)
        gap = batch([b"d"], producer_id=7, epoch=0, sequence=9)
        assert produce_answer(await c.call(produce("t", 0, gap), 4))[0] == 45  # out of order
        assert fetched_values(await c.call(fetch("t", 0, 0), 5)) == [b"a", b"b", b"c"]
        assert gw.owned["t", 0].sequences.duplicates == 1


@contextlib.asynccontextmanager
async def two_gateways():
    name = f"kafka-{uuid.uuid4().hex[:8]}"
    storage = MemoryPartitionStorage()
    try:
        async with open_metadata_store(f"memory://{name}") as store:
            a_cfg = KafkaConfig(kafka_listen=f"127.0.0.1:{free_port()}")
            b_cfg = KafkaConfig(kafka_listen=f"127.0.0.1:{free_port()}")
            async with (
                Gateway.serve(a_cfg, store, storage) as a,
                Gateway.serve(b_cfg, store, storage) as b,
            ):
                yield a, b, storage
    finally:
        MemoryMetadataStore.forget(name)


async def test_one_owner_per_partition_and_takeover_through_fencing():
    async with two_gateways() as (a, b, storage):
        await a.topics.create("t", 1, 1, 1, 1)
        async with RawClient.connect(a.port) as ca, RawClient.connect(b.port) as cb:
            assert produce_answer(await ca.call(produce("t", 0, batch([b"1"])), 1)) == (0, 0)
            # b does not own it: NOT_LEADER_OR_FOLLOWER, and its metadata names a as leader.
            assert produce_answer(await cb.call(produce("t", 0, batch([b"x"])), 1))[0] == NOT_LEADER
            md = await cb.call(MetadataRequest_v1(["t"]), 2)
            assert md.topics[0][3][0][2] == a.membership.node_id
            # Someone takes the log over behind a's back (a paused past its lease, say):
            # a's next append is fenced and its producer is told to refresh its metadata.
            await storage.take_over("t", 0)
            assert produce_answer(await ca.call(produce("t", 0, batch([b"2"])), 3))[0] == NOT_LEADER
            # a still holds the claim: the next request takes the log over again, and offsets
            # continue from the log's true end.
            assert produce_answer(await ca.call(produce("t", 0, batch([b"3"])), 4))[0] == 0
        await a.membership.unregister()  # a goes away: its claims with its lease
        async with RawClient.connect(b.port) as cb:
            error, offset = produce_answer(await cb.call(produce("t", 0, batch([b"4"])), 5))
            assert error == 0 and offset >= 2
            values = fetched_values(await cb.call(fetch("t", 0, 0), 6))
            assert values[0] == b"1" and values[-1] == b"4"


@pytest.mark.parametrize("version", [3, 7])
async def test_produce_versions_report_offsets(version):
    async with memory_gateway() as gw, RawClient.connect(gw.port) as c:
        await gw.topics.create("t", 1, 1, 1, 1)
        for i in range(3):
            answer = await c.call(produce("t", 0, batch([b"x", b"y"]), version=version), i)
            assert produce_answer(answer) == (0, 2 * i)


async def test_a_new_owner_knows_the_idempotent_producers_from_the_log():
    """A retry that reaches the partition's next owner is still recognized as a duplicate:
    the owner read the producers' last sequences back from the log's last batches."""
    async with two_gateways() as (a, b, _), RawClient.connect(a.port) as ca:
        await a.topics.create("t", 1, 1, 1, 1)
        first = batch([b"a", b"b"], producer_id=9, epoch=0, sequence=0)
        assert produce_answer(await ca.call(produce("t", 0, first), 1)) == (0, 0)
        await a.membership.unregister()  # a goes away; b takes the partition over
        async with RawClient.connect(b.port) as cb:
            assert produce_answer(await cb.call(produce("t", 0, first), 2)) == (0, 0)
            nxt = batch([b"c"], producer_id=9, epoch=0, sequence=2)
            assert produce_answer(await cb.call(produce("t", 0, nxt), 3)) == (0, 2)
            assert fetched_values(await cb.call(fetch("t", 0, 0), 4)) == [b"a", b"b", b"c"]


async def test_group_ids_too_long_for_a_cursor_are_refused():
    async with memory_gateway() as gw, RawClient.connect(gw.port) as c:
        answer = await c.call(FindCoordinatorRequest_v0("g" * 300), 1)
        assert answer.error_code == 24  # INVALID_GROUP_ID
        answer = await c.call(FindCoordinatorRequest_v0("billing team/eu"), 2)  # any characters
        assert answer.error_code == 0 and answer.coordinator_id == gw.membership.node_id


def gzip_batch(values: list[bytes]) -> bytes:
    """A gzip-compressed record batch v2 (base offset 0), as a producer with
    ``compression_type="gzip"`` builds it."""
    builder = DefaultRecordBatchBuilder(2, DefaultRecordBatch.CODEC_GZIP, 0, -1, -1, -1,
                                        1 << 20)  # fmt: skip
    for i, value in enumerate(values):
        builder.append(i, 1_700_000_000_000, None, value, [])
    return bytes(builder.build())


async def test_compressed_batches_are_stored_as_sent_and_a_fetch_mid_batch_gets_it_whole():
    async with memory_gateway() as gw, RawClient.connect(gw.port) as c:
        await gw.topics.create("t", 1, 1, 1, 1)
        sent = [gzip_batch([b"a", b"b", b"c"]), gzip_batch([b"d", b"e"])]
        assert produce_answer(await c.call(produce("t", 0, sent[0]), 1)) == (0, 0)
        assert produce_answer(await c.call(produce("t", 0, sent[1]), 2)) == (0, 3)
        for n, (offset, first_batch) in enumerate([(1, 0), (2, 0), (4, 1)]):
            [(_, [part])] = (await c.call(fetch("t", 0, offset), 10 + n)).topics
            records = MemoryRecords(part[-1])
            got = []
            while (b := records.next_batch()) is not None:
                got.append(b)
            # The batch holding the offset, whole: its records from its base offset on.
            assert got[0].base_offset == (0, 3)[first_batch]
            assert got[0].compression_type == DefaultRecordBatch.CODEC_GZIP
            assert [r.offset for r in got[0]] == [[0, 1, 2], [3, 4]][first_batch]
            # As sent: only the base offset (outside the CRC) was written by the gateway.
            stored = bytes(part[-1])[: len(sent[first_batch])]
            assert stored[8:] == sent[first_batch][8:]
            assert struct.unpack(">q", stored[:8])[0] == (0, 3)[first_batch]
        assert fetched_values(await c.call(fetch("t", 0, 0), 20)) == [b"a", b"b", b"c", b"d", b"e"]


async def test_metadata_names_the_advertised_address():
    async with (
        memory_gateway(kafka_advertised_address="gw.example:19092") as gw,
        RawClient.connect(gw.port) as c,
    ):
        await gw.topics.create("t", 1, 1, 1, 1)
        md = await c.call(MetadataRequest_v1(["t"]), 1)
        assert [(host, port) for _, host, port, _ in md.brokers] == [("gw.example", 19092)]
        assert md.topics[0][3][0][2] == md.brokers[0][0]  # the partition's leader is it


def test_the_command_line_takes_a_config_file_and_flags_over_it(tmp_path):
    conf = tmp_path / "kafka.toml"
    conf.write_text(
        'kafka_metadata_uri = "etcd://127.0.0.1:2379/a"\nkafka_listen = "127.0.0.1:1"\n'
        "kafka_auto_create_topics = true\n"
    )
    args = ["--config", str(conf), "--listen", "127.0.0.1:9093",
            "--advertised-address", "gw.example:19092"]  # fmt: skip
    cfg = build_config(parse_args(args))
    assert (cfg.kafka_metadata_uri, cfg.kafka_listen, cfg.advertised_address) == (
        "etcd://127.0.0.1:2379/a", "127.0.0.1:9093", "gw.example:19092",
    )  # fmt: skip
    assert cfg.kafka_auto_create_topics
    assert build_config(parse_args(["--metadata", "memory://x"])).advertised_address == (
        "127.0.0.1:9092"
    )
    for bad in (["--listen", "127.0.0.1:1"], ["--metadata", "memory://x", "--set", "nope=1"],
                ["--metadata", "memory://x", "--advertised-address", "no-port"]):  # fmt: skip
        cmd = [sys.executable, "-m", "bookkeeper_aio.kafka", *bad]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "configuration error" in done.stderr, (bad, done)
