"""``scale``: throughput and latency over the number of ledgers written at once and bookies.

    python -m benchmarks scale --duration 5 --ledger-counts 1,10,100 --bookie-counts 3,6

For each bookie count a fresh local cluster (etcd + that many bookie processes), all of them up
at once; for each ledger count, in each cluster in turn (so that neighbouring points share the
machine's drift), the ``writes`` closed loop (``--outstanding`` adds in flight in all,
round-robin over the ledgers, E3/WQ3/AQ2 by default: with more bookies than the ensemble the
ledgers' ensembles spread over them). Every point is also given as a ratio against the first
one (the fewest ledgers on the fewest bookies), measured in the same run: the cost of adding
ledgers and bookies on this machine, whatever its speed. With ``--plots DIR`` each point gets
its picture over time (``b<bookies>_l<ledgers>``).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path
from typing import Any

from . import writes
from .cluster import local_cluster
from .options import quorum_label
from .stats import print_table, write_json


def _counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",") if part.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"not a list of counts >= 1: {text!r}")
    return counts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=10.0, metavar="S", help="seconds per point")
    p.add_argument("--warmup", type=float, default=1.0, metavar="S")
    p.add_argument("--outstanding", type=int, default=1000, metavar="N", help="adds in flight")
    p.add_argument("--entry-size", type=int, default=1024, metavar="B")
    p.add_argument("--ensemble", type=int, default=3, metavar="E")
    p.add_argument("--write-quorum", type=int, default=3, metavar="W")
    p.add_argument("--ack-quorum", type=int, default=2, metavar="A")
    p.add_argument("--ledger-counts", type=_counts, default=[1, 10, 100], metavar="L,L,...")
    p.add_argument("--bookie-counts", type=_counts, default=[3, 6], metavar="N,N,...")
    p.add_argument("--engine", default="rocksdb", choices=("rocksdb", "files", "memory"))
    p.add_argument(
        "--bookie-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a BookieConfig key for the started bookies (their --set), repeatable",
    )
    p.add_argument("--dir", metavar="DIR", help="where the clusters write (a temporary dir)")
    p.add_argument("--json", metavar="PATH", help="write the results here")


def writes_args(args: argparse.Namespace, ledgers: int) -> argparse.Namespace:
    """The ``writes`` mode's arguments for one point."""
    parser = argparse.ArgumentParser()
    writes.add_arguments(parser)
    return parser.parse_args([
        "--duration", str(args.duration), "--warmup", str(args.warmup),
        "--outstanding", str(args.outstanding), "--entry-size", str(args.entry_size),
        "--ensemble", str(args.ensemble), "--write-quorum", str(args.write_quorum),
        "--ack-quorum", str(args.ack_quorum), "--ledgers", str(ledgers), "--no-peers",
    ])  # fmt: skip


async def measure_scale(args: argparse.Namespace) -> dict[str, Any]:
    """Every point; ``points`` keyed ``b<bookies>_l<ledgers>``, with ratios to the first."""
    points: dict[str, Any] = {}
    extra = [arg for item in args.bookie_set for arg in ("--set", item)]
    for bookies in args.bookie_counts:
        if bookies < args.ensemble:
            raise SystemExit(f"scale: {bookies} bookies cannot hold an ensemble of {args.ensemble}")
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-scale-") as tmp:
        async with contextlib.AsyncExitStack() as stack:
            # Every cluster up at once, and the points alternate between them: this machine's
            # speed drifts within minutes, and neighbouring points then share its drift.
            clusters = {
                bookies: await stack.enter_async_context(
                    local_cluster(Path(tmp) / f"b{bookies}", bookies, args.engine, *extra)
                )
                for bookies in args.bookie_counts
            }
            for ledgers in args.ledger_counts:
                for bookies, cluster in clusters.items():
                    pids = [b.proc.pid for b in cluster.bookies if b.proc]
                    result = await writes.measure_writes(
                        cluster.uri, writes_args(args, ledgers), pids
                    )
                    points[f"b{bookies}_l{ledgers}"] = {**result, "bookies": bookies}
    points = {f"b{b}_l{n}": points[f"b{b}_l{n}"] for b in args.bookie_counts
              for n in args.ledger_counts}  # fmt: skip
    base = next(iter(points.values()))
    for point in points.values():
        point["ratio_vs_first"] = point["entries_per_s"] / base["entries_per_s"]
        point["ratio_p99_vs_first"] = point["p99_ms"] / base["p99_ms"]
    return {"points": points, "first": next(iter(points))}


async def run_scale(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """The ``scale`` mode: measure, print one table, write the JSON."""
    result = await measure_scale(args)
    if not quiet:
        rows = [{
            "bookies": p["bookies"], "ledgers": p["ledgers"], "entries/s": p["entries_per_s"],
            "p50_ms": p["p50_ms"], "p99_ms": p["p99_ms"], "p99.9_ms": p["p99_9_ms"],
            "x rate": p["ratio_vs_first"], "x p99": p["ratio_p99_vs_first"],
            "bookies us/entry": p.get("bookie_cpu_us_per_entry"),
            "client us/entry": p.get("client_cpu_us_per_entry"),
            "errors": p["errors"],
        } for p in result["points"].values()]  # fmt: skip
        title = (
            f"scale: {args.entry_size} B entries, {quorum_label(args)}, {args.outstanding}"
            f" outstanding in all, {args.duration:g} s per point; x: against {result['first']}"
        )
        print_table(title, rows)
    write_json(args.json, result)
    return result
