"""One bookie, shaped like BookKeeper's BenchBookie: warm-up, sequential latency, pipelined
throughput — against a real bookie process, with the disk's raw group-commit limit measured in
the same run as the baseline.

    python -m benchmarks bookie --duration 10 --outstanding 1000 --entry-size 1024
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bookkeeper_aio.client.bookie_client import BookieClient
from bookkeeper_aio.config import BookieConfig, ClientConfig
from bookkeeper_aio.digest import entry_digest, master_key
from bookkeeper_aio.errors import StatusCode
from bookkeeper_aio.net import TcpNetwork
from bookkeeper_aio.protocol import AddRequest
from bookkeeper_aio.sandbox import BookieProcess

from .disk import group_commit_limit
from .load import payload_pool
from .stats import latency_summary, print_table, timeline, write_json

KEY = master_key(b"bench")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=10.0, metavar="S")
    p.add_argument("--warmup", type=float, default=1.0, metavar="S")
    p.add_argument("--baseline-duration", type=float, default=2.0, metavar="S",
                   help="seconds per disk baseline (1 entry, a batch per fsync)")  # fmt: skip
    p.add_argument("--outstanding", type=int, default=1000, metavar="N")
    p.add_argument("--entry-size", type=int, default=1024, metavar="B")
    p.add_argument("--sequential", type=int, default=2000, metavar="N", help="sequential adds")
    p.add_argument("--engine", default="rocksdb", choices=("rocksdb", "files", "memory"))
    p.add_argument("--bookie", metavar="HOST:PORT", help="use this bookie instead of starting one")
    p.add_argument("--dir", metavar="DIR", help="where the bookie and baseline write (tmp)")
    p.add_argument("--json", metavar="PATH")


class _Writer:
    """Adds to one ledger, one entry id after another."""

    def __init__(self, client: BookieClient, ledger_id: int, payloads: Sequence[bytes]) -> None:
        self.client, self.ledger_id, self.payloads = client, ledger_id, payloads
        self.entry_size = len(payloads[0])
        self.next_entry_id = 0

    def send(self) -> asyncio.Future:
        e, lid = self.next_entry_id, self.ledger_id
        payload = self.payloads[e % len(self.payloads)]
        self.next_entry_id += 1
        digest = entry_digest(lid, e, e - 1, payload)
        return self.client.request(AddRequest, lid, e, 0, KEY, e - 1, payload, digest)


async def sequential(writer: _Writer, count: int) -> dict[str, Any]:
    """One add outstanding at a time: the latency floor (one fdatasync per add)."""
    latencies, completions = [], []
    start = time.perf_counter()
    for _ in range(count):
        t0 = time.perf_counter()
        reply = await writer.send()
        completions.append(time.perf_counter())
        latencies.append(completions[-1] - t0)
        assert reply.status == StatusCode.OK, reply
    elapsed = time.perf_counter() - start
    return {
        "adds_per_s": count / elapsed,
        **latency_summary(latencies),
        "timeline": timeline(latencies, completions, start),
    }


async def pipelined(writer: _Writer, outstanding: int, duration_s: float) -> dict[str, Any]:
    """Closed loop with ``outstanding`` adds in flight for ``duration_s``."""
    latencies: list[float] = []
    completions: list[float] = []
    done = asyncio.Event()
    deadline = time.perf_counter() + duration_s
    in_flight = 0
    errors = 0

    def launch() -> None:
        nonlocal in_flight
        in_flight += 1
        t0 = time.perf_counter()  # uvloop's loop.time() has millisecond resolution
        writer.send().add_done_callback(lambda f: completed(f, t0))

    def completed(fut: asyncio.Future, t0: float) -> None:
        nonlocal in_flight, errors
        in_flight -= 1
        now = time.perf_counter()
        if fut.exception() is not None or fut.result().status != StatusCode.OK:
            errors += 1
        latencies.append(now - t0)
        completions.append(now)
        if now < deadline:
            launch()
        elif in_flight == 0:
            done.set()

    start = time.perf_counter()
    for _ in range(outstanding):
        launch()
    await done.wait()
    elapsed = time.perf_counter() - start
    count = len(latencies)
    size = writer.entry_size
    return {
        "entries": count,
        "elapsed_s": elapsed,
        "adds_per_s": count / elapsed,
        "mb_per_s": count * size / elapsed / 1e6,
        "errors": errors,
        **latency_summary(latencies),
        "timeline": timeline(latencies, completions, start),
    }


async def run_bookie_bench(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """Run the three phases (and the baseline); print a table; return the results.

    The top-level ``entries_per_s``, ``mb_per_s`` and percentiles are the pipelined phase's.
    """
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-bookie-") as tmp:
        root = Path(tmp)
        bookie = None
        try:
            if not args.bookie:
                bookie = BookieProcess(root / "bookie", args.engine)
                bookie.start()
            result = await _phases(args.bookie or bookie.address, args)  # type: ignore[union-attr]
        finally:
            if bookie is not None and bookie.proc is not None:
                bookie.stop()
        journal_dir = root / "bookie" / "journal" if bookie else root
        seconds = args.baseline_duration
        result["disk_1_entry"] = group_commit_limit(journal_dir, args.entry_size, seconds)
        batch = BookieConfig().journal_batch_bytes_max
        result["disk_batch"] = group_commit_limit(journal_dir, batch, seconds, args.entry_size)
    pipe = result["pipelined"]
    result.update({k: pipe[k] for k in ("mb_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms")})
    result["entries_per_s"] = pipe["adds_per_s"]
    result["ratio_pipelined_to_disk"] = pipe["adds_per_s"] / result["disk_batch"]["entries_per_s"]
    result["ratio_sequential_p50_to_fsync_p50"] = (
        result["sequential"]["p50_ms"] / result["disk_1_entry"]["p50_ms"]
    )
    if not quiet:
        _print(result)
    write_json(args.json, result)
    return result


async def _phases(address: str, args: argparse.Namespace) -> dict[str, Any]:
    config = ClientConfig(request_timeout_s=60, bookie_requests_in_flight_max=100_000)
    client = await BookieClient.connect(TcpNetwork(), address, config)
    payloads = payload_pool(args.entry_size)
    try:
        base = int.from_bytes(os.urandom(6), "big") << 8
        await pipelined(_Writer(client, base, payloads), args.outstanding, args.warmup)
        seq = await sequential(_Writer(client, base + 1, payloads), args.sequential)
        pipe = await pipelined(_Writer(client, base + 2, payloads), args.outstanding, args.duration)
    finally:
        await client.close()
    return {"entry_size": args.entry_size, "sequential": seq, "pipelined": pipe}


def _print(result: dict[str, Any]) -> None:
    rows = []
    for name in ("sequential", "pipelined", "disk_1_entry", "disk_batch"):
        r = result[name]
        rows.append({
            "phase": name,
            "entries/s": r.get("adds_per_s", r.get("entries_per_s")),
            "p50_ms": r["p50_ms"],
            "p99_ms": r["p99_ms"],
            "max_ms": r["max_ms"],
        })  # fmt: skip
    print_table(f"bookie benchmark, {result['entry_size']} B entries, fsync before ack", rows)
    print(f"pipelined / disk group-commit limit: {result['ratio_pipelined_to_disk']:.2f}")
    print(f"sequential p50 / one fdatasync p50:  {result['ratio_sequential_p50_to_fsync_p50']:.2f}")
