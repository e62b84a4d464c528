"""``python -m benchmarks MODE ...``; ``all --short`` is what ``make bench`` runs.

Modes: writes (BenchThroughputLatency: closed loop or --rate), reads, tail, recovery (client
benchmarks against etcd + bookie processes started here, or --metadata URI), bookie (one
bookie, no client), journal (one bookie with and without the journal), overload (client and
bookie memory when writers push faster than the bookies sync), floor (one add through minimal
servers with the same I/O and network: this machine's floor), log (log appends with
rollovers against plain ledger writes), ops (writes with metrics scraped and over TLS against
plain), kafka (aiokafka's producer through the Kafka gateway against direct log appends),
spark (the Spark sink and source against the client, and the commit's cost), rereplication
(autorecovery after losing a bookie: copy rate against the disk's limit, time back to WQ), gc
(writes while the bookies delete and compact a previous run's ledgers, against the same writes
without), scrub (writes while the bookies scrub vs not), scale (throughput and p99 over ledgers
and bookies), breakdown (the open loop's latency by phase, from the bookies' timestamps), all.
Every mode takes ``--plots DIR``: per phase a PNG and a JSON of its latency percentiles and
throughput per second (benchmarks/plots.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop

from . import (
    bookie,
    breakdown,
    floor,
    gc,
    hostile,
    journal,
    kafka,
    logs,
    misses,
    ops,
    overload,
    plots,
    reads,
    recovery,
    rereplication,
    scale,
    scrub,
    spark,
    suite,
    tail,
    writes,
)
from .cluster import ClusterStartError

MODES: dict[str, tuple[Any, Callable[[argparse.Namespace], Awaitable[Any]], str]] = {
    "writes": (writes, writes.run_writes, "client adds: entries/s, latency, etcd/disk peers"),
    "reads": (reads, reads.run_reads, "write a ledger, read it back"),
    "tail": (tail, tail.run_tail, "one writer, one tailing reader: append-to-read latency"),
    "recovery": (recovery, recovery.run_recovery, "open-with-recovery of abandoned ledgers"),
    "bookie": (bookie, bookie.run_bookie_bench, "one bookie: latency and throughput"),
    "journal": (journal, journal.run_journal, "one bookie with/without the journal"),
    "floor": (floor, floor.run_floor, "one add through minimal servers: the machine's floor"),
    "overload": (overload, overload.run_overload, "writers faster than the bookies: RSS"),
    "ops": (ops, ops.run_ops, "writes with metrics scraped and over TLS against plain"),
    "log": (logs, logs.run_log, "log appends with rollovers vs plain ledger writes"),
    "kafka": (kafka, kafka.run_kafka, "aiokafka through the Kafka gateway vs direct log appends"),
    "spark": (spark, spark.run_spark, "rows/s through the Spark sink and source; commit cost"),
    "rereplication": (
        rereplication,
        rereplication.run_rereplication,
        "autorecovery after a lost bookie: copy MB/s vs the disk, time to WQ",
    ),
    "gc": (gc, gc.run_gc, "writes while GC frees a previous run's ledgers vs without"),
    "breakdown": (breakdown, breakdown.run_breakdown, "open loop: where an add's time goes"),
    "scale": (scale, scale.run_scale, "throughput and p99 over 1-100 ledgers and 3-6 bookies"),
    "misses": (misses, misses.run_misses, "engines: absent entries next to a large one"),
    "hostile": (hostile, hostile.run_hostile, "a bookie's RSS under clients that never read"),
    "scrub": (scrub, scrub.run_scrub, "writes with the bookies scrubbing at their rate vs not"),
    "all": (suite, suite.run_all, "every benchmark, one table (--short: make bench)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    modes = parser.add_subparsers(dest="mode", required=True, metavar="MODE")
    for name, (module, _, help_text) in MODES.items():
        sub = modes.add_parser(
            name,
            help=help_text,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.add_argument(
            "--plots",
            metavar="DIR",
            help="per phase, latency percentiles and throughput per second: DIR/PHASE.png "
            "and DIR/PHASE.json (matplotlib: the bench extra)",
        )
    return parser


async def _stoppable(run: Callable[[argparse.Namespace], Awaitable[Any]], args: Any) -> None:
    """Run a mode; SIGTERM cancels it like Ctrl-C does, so its servers are stopped too."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    result = await run(args)
    if args.plots and isinstance(result, dict):
        for png in plots.write_phase_plots(args.plots, result, args.mode):
            print(f"wrote {png}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _, run, _ = MODES[args.mode]
    if getattr(args, "dir", None):  # every mode's temporary dirs go inside it: make it
        try:
            os.makedirs(args.dir, exist_ok=True)
        except OSError as exc:
            print(f"benchmarks: --dir {args.dir}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    try:
        uvloop.run(_stoppable(run, args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted; every server it started was stopped", file=sys.stderr)
        return 130
    except ClusterStartError as exc:
        print(f"benchmarks: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
