"""``kafka``: an unmodified Kafka producer through the gateway against direct log appends.

    python -m benchmarks kafka --duration 10 --outstanding 1000 --entry-size 1024 \\
        --ensemble 3 --write-quorum 3 --ack-quorum 2 --json out.json

Against its own etcd and bookie processes (or ``--metadata URI``) and a gateway process
(``python -m bookkeeper_aio.kafka``), three phases of ``--duration`` seconds each, closed loops
of ``--outstanding`` operations, latency from send to acknowledgement:

1. ``log``: direct appends of ``--entry-size`` byte records to a log (one record per entry),
   through ``BookKeeper.open_log_writer``: the log's own rate for this record size.
2. ``kafka``: aiokafka's producer (acks=all, its defaults otherwise: batches of up to 16 KiB,
   no linger) sending ``--entry-size`` byte records to a one-partition topic through the
   gateway, which appends one log entry per batch. Kafka offsets and log offsets then give the
   mean records per batch.
3. ``log_batches``: direct appends of entries the size of phase 2's mean batch, one at a time
   (aiokafka keeps one produce request in flight per partition, so the gateway appends one
   batch at a time too): the same entries at the same concurrency without the gateway, so
   ``ratio_vs_log_batches`` (MB/s) is what the Kafka protocol and the gateway cost.

The gateway's CPU time per record comes from its ``/proc`` stat.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import time
import uuid
from typing import Any

from aiokafka import AIOKafkaProducer

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.kafka import admin
from bookkeeper_aio.kafka.log_storage import log_name
from bookkeeper_aio.kafka.process import GatewayProcess
from bookkeeper_aio.kafka.records import HEADER_BYTES

from . import machine
from .cluster import mode_target
from .load import LoadResult, closed_loop, drive, payload_pool
from .options import add_client_arguments, client_config, quorum_label
from .stats import print_table, write_json

RECORD_OVERHEAD_BYTES = 12  # a v2 record's varint framing around a key-less value, roughly


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p, outstanding=1000)


async def measure_log(uri: str, args: argparse.Namespace, size: int, outstanding: int) -> dict:
    """Direct appends of ``size`` byte entries to a fresh log."""
    payloads = payload_pool(size)
    name = f"bench-{uuid.uuid4().hex[:8]}"
    async with BookKeeper.connect(uri, client_config(outstanding, size)) as bk:
        await bk.create_log(name, ensemble_size=args.ensemble, write_quorum=args.write_quorum,
                            ack_quorum=args.ack_quorum)  # fmt: skip
        async with bk.open_log_writer(name) as writer:
            turn = itertools.cycle(payloads)

            def send(done: Any) -> object:
                return writer.append_callback(next(turn), done)

            if args.warmup > 0:
                await closed_loop(send, outstanding, args.warmup, callbacks=True)
            async with machine.cpu_probe() as probe:
                load = await drive(send, outstanding, args.duration, args.rate, callbacks=True)
        await bk.delete_log(name)
    return {**load.summary(size), "entry_size": size, "outstanding": outstanding,
            "cpu_probe_ms": machine.cpu_probe_ms(probe)}  # fmt: skip


async def measure_kafka(uri: str, gateway: GatewayProcess, args: argparse.Namespace) -> dict:
    """aiokafka's producer through the gateway to a one-partition topic."""
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    await admin.create_topic(uri, topic, 1, args.ensemble, args.write_quorum, args.ack_quorum)
    payloads = itertools.cycle(payload_pool(args.entry_size))
    producer = AIOKafkaProducer(bootstrap_servers=gateway.address, acks="all",
                                max_request_size=8 << 20)  # fmt: skip
    await producer.start()
    try:
        if args.warmup > 0:
            await produce_loop(producer, topic, payloads, args.outstanding, args.warmup)
        cpu_before = _cpu_s(gateway)
        async with machine.cpu_probe() as probe:
            load = await produce_loop(producer, topic, payloads, args.outstanding, args.duration)
        cpu_s = _cpu_s(gateway) - cpu_before
    finally:
        await producer.stop()
    async with BookKeeper.connect(uri) as bk:
        info = await bk.log_info(log_name(topic, 0))
        records = (await _high_watermark(gateway, topic)) or 1
        await admin.delete_topic(uri, topic)
    per_batch = records / max(1, info.next_offset)
    return {
        **load.summary(args.entry_size),
        "records_per_batch": per_batch,
        "batch_bytes": round(HEADER_BYTES + per_batch * (args.entry_size + RECORD_OVERHEAD_BYTES)),
        "gateway_cpu_us_per_record": cpu_s * 1e6 / max(1, load.entries),
        "cpu_probe_ms": machine.cpu_probe_ms(probe),
    }


async def produce_loop(
    producer: AIOKafkaProducer, topic: str, payloads: Any, outstanding: int, duration_s: float
) -> LoadResult:
    """A closed loop as an application drives aiokafka: one coroutine calls ``send`` (which
    waits for room in the producer's batches) while at most ``outstanding`` records are
    unacknowledged; latency from the call to the acknowledgement. (Many tasks each calling
    ``send`` starve some of them in aiokafka's accumulator for seconds: a client artefact.)"""
    result = LoadResult()
    room = asyncio.Semaphore(outstanding)
    loop_start = time.perf_counter()

    def acked(future: asyncio.Future[Any], t0: float) -> None:
        room.release()
        if future.cancelled() or future.exception() is not None:
            result.fail(future.exception() or asyncio.CancelledError())
        else:
            result.latencies_s.append(time.perf_counter() - t0)
            result.entries += 1

    while time.perf_counter() - loop_start < duration_s:
        await room.acquire()
        t0 = time.perf_counter()
        future = await producer.send(topic, next(payloads))
        future.add_done_callback(lambda f, t0=t0: acked(f, t0))
    async with asyncio.timeout(60):
        for _ in range(outstanding):
            await room.acquire()
    result.elapsed_s = time.perf_counter() - loop_start
    return result


async def _high_watermark(gateway: GatewayProcess, topic: str) -> int:
    """The partition's end offset, as a Kafka client asks for it."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=gateway.address)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        return (await consumer.end_offsets([tp]))[tp]
    finally:
        await consumer.stop()


def _cpu_s(gateway: GatewayProcess) -> float:
    """The gateway process's user + system CPU seconds so far."""
    assert gateway.proc is not None
    with open(f"/proc/{gateway.proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_kafka(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """The ``kafka`` mode: the three phases, one table, the JSON."""
    async with mode_target(args) as tgt:
        gateway = GatewayProcess(tgt.scratch / "gateway", tgt.uri)
        with gateway:
            log_records = await measure_log(tgt.uri, args, args.entry_size, args.outstanding)
            kafka = await measure_kafka(tgt.uri, gateway, args)
            # aiokafka keeps one produce request in flight per partition: so does this one.
            batches = await measure_log(tgt.uri, args, kafka["batch_bytes"], 1)
    result = {
        **kafka,
        "entry_size": args.entry_size,
        "outstanding": args.outstanding,
        "quorum": quorum_label(args),
        "log": log_records,
        "log_batches": batches,
        "ratio_vs_log_batches": kafka["mb_per_s"] / max(batches["mb_per_s"], 1e-9),
        "ratio_vs_log": kafka["entries_per_s"] / max(log_records["entries_per_s"], 1e-9),
        "ratio_p99_vs_log_batches": kafka["p99_ms"] / max(batches["p99_ms"], 1e-9),
    }
    if not quiet:
        print_kafka(result, args)
    write_json(args.json, result)
    return result


def print_kafka(r: dict[str, Any], args: argparse.Namespace) -> None:
    rows = [
        _row(f"log appends, {args.entry_size} B records", r["log"]),
        _row(f"aiokafka -> gateway, {args.entry_size} B records", r),
        _row(f"log appends, {r['batch_bytes']} B entries", r["log_batches"]),
    ]
    title = f"kafka: {r['quorum']}, {args.outstanding} records outstanding, fdatasync before acks"
    print_table(title, rows)
    print("ops: records (rows 1-2), entries of one batch's size (row 3)")
    print(f"records per batch: {r['records_per_batch']:.1f}; gateway CPU per record: "
          f"{r['gateway_cpu_us_per_record']:.1f} us")  # fmt: skip
    print(f"ratio_vs_log_batches (MB/s): {r['ratio_vs_log_batches']:.3f}; "
          f"ratio_vs_log (records/s): {r['ratio_vs_log']:.3f}; "
          f"ratio_p99_vs_log_batches: {r['ratio_p99_vs_log_batches']:.3f}")  # fmt: skip


def _row(name: str, r: dict[str, Any]) -> dict[str, Any]:
    return {
        "phase": name,
        "ops/s": r.get("entries_per_s"),
        "MB/s": r.get("mb_per_s"),
        "p50_ms": r.get("p50_ms"),
        "p99_ms": r.get("p99_ms"),
        "max_ms": r.get("max_ms"),
        "errors": r.get("errors"),
    }
