"""The Kafka gateway as a real process over real logs (etcd + 3 bookie processes), with
unmodified Kafka clients: aiokafka and kcat (librdkafka). Issue 33, point 5."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.protocol.produce import ProduceRequest_v3
from aiokafka.record.memory_records import MemoryRecords

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.config import KafkaConfig
from bookkeeper_aio.kafka.gateway import Gateway
from bookkeeper_aio.kafka.log_storage import LogPartitionStorage, log_name
from bookkeeper_aio.kafka.process import GatewayProcess
from bookkeeper_aio.sandbox import Cluster, free_port
from tests.kafka_support import (
    NOT_LEADER,
    RawClient,
    batch,
    fetch,
    fetched_values,
    produce,
    produce_answer,
)

pytestmark = pytest.mark.process
KCAT = shutil.which("kcat") or shutil.which("kafkacat")
needs_kcat = pytest.mark.skipif(
    KCAT is None, reason="kcat is not installed (make test installs Debian's kcat when root)"
)
FAST = ["--set", "kafka_group_session_timeout_ms_min=1000", "--set", "kafka_lease_ttl_s=3"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("kafka"), 3, "rocksdb") as c:
        yield c


@pytest.fixture(scope="module")
def gateway(cluster, tmp_path_factory):
    with GatewayProcess(tmp_path_factory.mktemp("gateway"), cluster.uri, None, *FAST) as g:
        yield g


def run_shell(uri: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bookkeeper_aio.shell", "--metadata", uri, *args],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def shell(uri: str, *args: str) -> str:
    done = run_shell(uri, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def consumer(gateway: GatewayProcess, *topics: str, **kw) -> AIOKafkaConsumer:
    kw.setdefault("auto_offset_reset", "earliest")
    return AIOKafkaConsumer(*topics, bootstrap_servers=gateway.address, **kw)


async def drain(consumers: list[AIOKafkaConsumer], count: int, timeout_s: float = 60) -> dict:
    """Records per partition until ``count`` were read in all."""
    got: dict[int, list[bytes]] = {}
    async with asyncio.timeout(timeout_s):
        while sum(map(len, got.values())) < count:
            for c in consumers:
                for tp, msgs in (await c.getmany(timeout_ms=100)).items():
                    got.setdefault(tp.partition, []).extend(m.value for m in msgs)
    return got


async def test_a_group_of_two_reads_10000_records_as_produced_and_a_restart_resumes(
    cluster, gateway
):
    out = shell(cluster.uri, "create-topic", "orders", "--partitions", "3",
                "--ensemble", "3", "--write-quorum", "3", "--ack-quorum", "2")  # fmt: skip
    assert "created topic orders" in out
    assert "orders\t3 partitions" in shell(cluster.uri, "list-topics")
    producer = AIOKafkaProducer(bootstrap_servers=gateway.address, acks="all")
    await producer.start()
    try:
        sent = [f"order-{i}".encode() for i in range(10_000)]
        futures = [await producer.send("orders", v, key=v) for v in sent]
        results = await asyncio.gather(*futures)
    finally:
        await producer.stop()
    per_partition = {p: [] for p in range(3)}
    for value, r in sorted(zip(sent, results, strict=True), key=lambda x: x[1].offset):
        per_partition[r.partition].append(value)
    group = [consumer(gateway, "orders", group_id="billing", session_timeout_ms=6000,
                      enable_auto_commit=False) for _ in range(2)]  # fmt: skip
    for c in group:
        await c.start()
    try:
        got = await drain(group, len(sent))
        for c in group:
            await c.commit()
    finally:
        for c in group:
            await c.stop()
    assert got == {p: vs for p, vs in per_partition.items() if vs}  # exactly as produced
    assert "billing" in shell(cluster.uri, "list-groups")

    producer = AIOKafkaProducer(bootstrap_servers=gateway.address, acks="all")
    await producer.start()
    try:
        later = [f"later-{i}".encode() for i in range(300)]
        await asyncio.gather(*[await producer.send("orders", v) for v in later])
    finally:
        await producer.stop()
    restarted = consumer(gateway, "orders", group_id="billing", session_timeout_ms=6000)
    await restarted.start()
    try:
        resumed = await drain([restarted], len(later))
        await asyncio.sleep(0.5)  # nothing more arrives: it resumed at the committed offsets
        extra = await restarted.getmany(timeout_ms=200)
    finally:
        await restarted.stop()
    assert sorted(v for vs in resumed.values() for v in vs) == sorted(later)
    assert not any(extra.values())
    again = run_shell(cluster.uri, "create-topic", "orders", "--partitions", "1")
    assert again.returncode == 1 and "TopicExistsError" in again.stderr
    assert "deleted topic orders" in shell(cluster.uri, "delete-topic", "orders")
    assert "orders" not in shell(cluster.uri, "list-topics")


@needs_kcat
async def test_kcat_lists_produces_and_consumes(cluster, gateway):
    shell(cluster.uri, "create-topic", "kc", "--partitions", "2",
          "--ensemble", "2", "--write-quorum", "2", "--ack-quorum", "2")  # fmt: skip
    listing = await kcat("-b", gateway.address, "-L")
    assert 'topic "kc" with 2 partitions' in listing
    lines = [f"k{i}:value-{i}" for i in range(200)]
    await kcat("-b", gateway.address, "-P", "-t", "kc", "-K:", stdin="\n".join(lines) + "\n")
    out = await kcat("-b", gateway.address, "-C", "-t", "kc", "-e", "-o", "beginning",
                     "-f", "%k:%s\n")  # fmt: skip
    assert sorted(out.splitlines()) == sorted(lines)


async def kcat(*args: str, stdin: str | None = None) -> str:
    assert KCAT is not None
    proc = await asyncio.create_subprocess_exec(
        KCAT, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(60):
            out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
    finally:
        if proc.returncode is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_gateway_killed_mid_produce_loses_nothing_acknowledged(cluster, tmp_path):
    shell(cluster.uri, "create-topic", "chaos", "--partitions", "2",
          "--ensemble", "3", "--write-quorum", "3", "--ack-quorum", "2")  # fmt: skip
    gw = GatewayProcess(tmp_path / "gw", cluster.uri, None, *FAST).start()
    try:
        producer = AIOKafkaProducer(
            bootstrap_servers=gw.address, acks="all", enable_idempotence=True,
            request_timeout_ms=10_000, retry_backoff_ms=100,
        )  # fmt: skip
        await producer.start()
        sends: list[tuple[bytes, asyncio.Future]] = []
        try:
            for i in range(3_000):  # paced, pipelined: batches are in flight at the kill
                value = f"c-{i}".encode()
                sends.append((value, await producer.send("chaos", value, partition=i % 2)))
                if i % 50 == 0:
                    await asyncio.sleep(0.01)
                if i == 1_000:
                    gw.kill()  # kill -9 with sends in flight
                    gw.start()  # a new gateway process on the same address
            results = await asyncio.gather(*(f for _, f in sends), return_exceptions=True)
        finally:
            await producer.stop()
        acked = [
            (r.partition, r.offset, value)
            for (value, _), r in zip(sends, results, strict=True)
            if not isinstance(r, BaseException)
        ]
        assert len(acked) >= 2_000  # the new gateway served the partitions
        reader = consumer(gw, enable_auto_commit=False)
        await reader.start()
        try:
            reader.assign([TopicPartition("chaos", p) for p in range(2)])
            await reader.seek_to_beginning()
            stored: dict[tuple[int, int], bytes] = {}
            async with asyncio.timeout(60):
                while not all((p, o) in stored for p, o, _ in acked):
                    for tp, msgs in (await reader.getmany(timeout_ms=200)).items():
                        stored.update({(tp.partition, m.offset): m.value for m in msgs})
        finally:
            await reader.stop()
        assert all(stored[p, o] == v for p, o, v in acked)  # every acknowledged record
        values = list(stored.values())
        assert len(values) == len(set(values))  # idempotence: no record twice
    finally:
        gw.stop(10)


async def test_a_gateway_fenced_out_of_its_log_answers_not_leader(cluster):
    """Another writer takes the partition's log over behind the gateway's back (as a gateway
    that claimed it after this one's lease ran out would): the log refuses this gateway's
    next append, the producer is told NOT_LEADER_OR_FOLLOWER, and nothing acknowledged is
    lost; once the other writer is gone the gateway takes the log back, offsets continuing."""
    async with BookKeeper.connect(cluster.uri) as bk, BookKeeper.connect(cluster.uri) as other:
        cfg = KafkaConfig(kafka_listen=f"127.0.0.1:{free_port()}")
        async with Gateway.serve(cfg, bk.ctx.metadata, LogPartitionStorage(bk, cfg)) as gw:
            await gw.topics.create("fence", 1, 3, 3, 2)
            async with RawClient.connect(gw.port) as c:
                assert produce_answer(await c.call(produce("fence", 0, batch([b"a"])), 1)) == (0, 0)
                async with other.open_log_writer(log_name("fence", 0)):
                    answer = await c.call(produce("fence", 0, batch([b"b"])), 2)
                    assert produce_answer(answer)[0] == NOT_LEADER
                answer = await c.call(produce("fence", 0, batch([b"c", b"d"])), 3)
                assert produce_answer(answer) == (0, 1)
                assert fetched_values(await c.call(fetch("fence", 0, 0), 4)) == [b"a", b"c", b"d"]


async def test_the_high_watermark_moves_only_when_the_log_acknowledges(cluster):
    """acks=all waits for the ack quorum: with two of the three bookies frozen a produced
    batch is neither answered nor visible to a fetch (high watermark unmoved); once they thaw
    it is acknowledged, and only then fetched."""
    async with BookKeeper.connect(cluster.uri) as bk:
        cfg = KafkaConfig(kafka_listen=f"127.0.0.1:{free_port()}")
        async with Gateway.serve(cfg, bk.ctx.metadata, LogPartitionStorage(bk, cfg)) as gw:
            await gw.topics.create("hw", 1, 3, 3, 2)
            async with RawClient.connect(gw.port) as p, RawClient.connect(gw.port) as c:
                assert produce_answer(await p.call(produce("hw", 0, batch([b"a"])), 1)) == (0, 0)
                frozen = cluster.bookies[:2]
                try:
                    for b in frozen:
                        b.signal(signal.SIGSTOP)
                    p.send(produce("hw", 0, batch([b"b"])), 2)
                    writer = gw.owned["hw", 0].log.writer
                    deadline = asyncio.get_running_loop().time() + 10
                    while writer.next_offset < 2:  # appended: the add is out to the bookies
                        assert asyncio.get_running_loop().time() < deadline, "not appended"
                        await asyncio.sleep(0.01)
                    await asyncio.sleep(0.5)  # a chance to do the wrong thing
                    [(_, [part])] = (await c.call(fetch("hw", 0, 0), 3)).topics
                    assert part[2] == 1 and fetched_values_of(part) == [b"a"]  # unmoved
                finally:
                    for b in frozen:
                        b.signal(signal.SIGCONT)
                cid, body = await p.receive()
                assert cid == 2
                assert produce_answer(ProduceRequest_v3.RESPONSE_TYPE.decode(body)) == (0, 1)
                [(_, [part])] = (await c.call(fetch("hw", 0, 0), 4)).topics
                assert part[2] == 2 and fetched_values_of(part) == [b"a", b"b"]


def fetched_values_of(part) -> list[bytes]:  # type: ignore[no-untyped-def]
    records, out = MemoryRecords(part[-1]), []
    while (b := records.next_batch()) is not None:
        out += [r.value for r in b]
    return out


def test_the_kafka_benchmark_runs(cluster, tmp_path):
    """``python -m benchmarks kafka`` with tiny sizes: every phase measured, no errors."""
    out = tmp_path / "kafka.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "kafka", "--metadata", cluster.uri,
         "--duration", "0.5", "--warmup", "0.2", "--outstanding", "50", "--entry-size", "256",
         "--dir", str(tmp_path), "--json", str(out)],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    for phase in (result, result["log"], result["log_batches"]):
        assert phase["entries_per_s"] > 0 and phase["errors"] == 0
    assert result["records_per_batch"] >= 1 and result["ratio_vs_log_batches"] > 0
