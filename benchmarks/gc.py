"""``gc``: what garbage collection costs the writers, and how fast the disk space comes back.

    python -m benchmarks gc --duration 10 --fill-mb 256 --engine files

One run, its own etcd and bookie processes (``gc_interval_s`` = ``--gc-interval``):

1. **fill**: ``--fill-ledgers`` closed ledgers, ``--fill-mb`` MiB in all (each bookie holds
   every entry: E = WQ = 3 by default);
2. **without GC**: the ``writes`` benchmark (``--duration``; its ledgers are deleted at its end,
   like every ``writes`` run);
3. every fill ledger deleted, then **with GC**: the same ``writes`` run while the bookies
   delete and compact the fill's ledgers and the previous run's;
4. the bookies' ledger dirs are measured until they shrink back (``space_back_s``, at most
   ``--space-timeout``);
5. **without GC** again: the same ``writes`` run once the space is back (the first run comes
   right after the fill, while the bookies may still be flushing it: order matters on a
   small machine, so the baseline is the mean of the two).

The result is the run with GC (``entries_per_s``, latencies), ``without_gc`` and
``without_gc_after`` (the same keys), ``ratio_vs_without_gc`` (throughput with GC over the
mean of the two without: below 1 is GC's cost), and the dirs' bytes before the deletes and
after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import Any

from bookkeeper_aio import BookKeeper

from .cluster import target
from .options import PASSWORD, add_client_arguments, client_config, quorum_label
from .stats import print_table, write_json
from .writes import measure_writes

FILL_ENTRY_BYTES = 64 << 10
POLL_S = 0.25


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p)
    p.add_argument("--fill-mb", type=int, default=128, metavar="MB", help="data then deleted")
    p.add_argument("--fill-ledgers", type=int, default=20, metavar="N")
    p.add_argument("--gc-interval", type=float, default=1.0, metavar="S", help="gc_interval_s")
    p.add_argument("--space-timeout", type=float, default=120.0, metavar="S")


async def run_gc(args: argparse.Namespace) -> dict[str, Any]:
    """The ``gc`` mode (see the module docstring)."""
    extra = [a for item in args.bookie_set for a in ("--set", item)]
    extra += ["--set", f"gc_interval_s={args.gc_interval}"]
    async with target(None, args.dir, args.bookies or args.ensemble, args.engine, *extra) as tgt:
        dirs = [b.root / "ledgers" for b in tgt.bookies]
        fill = await _fill(tgt.uri, args)
        without = await measure_writes(tgt.uri, args)
        before = _bytes(dirs)
        await _delete(tgt.uri, fill)
        started = time.monotonic()
        with_gc = await measure_writes(tgt.uri, args)
        back_s = await _space_back(dirs, before, args.fill_mb << 20, started, args.space_timeout)
        after = _bytes(dirs)
        without_after = await measure_writes(tgt.uri, args)
    baseline = (without["entries_per_s"] + without_after["entries_per_s"]) / 2
    result = {
        **with_gc,
        "without_gc": without,
        "without_gc_after": without_after,
        "ratio_vs_without_gc": with_gc["entries_per_s"] / max(baseline, 1e-9),
        "engine": args.engine,
        "fill_bytes": args.fill_mb << 20,
        "fill_ledgers": args.fill_ledgers,
        "gc_interval_s": args.gc_interval,
        "ledger_dirs_bytes_before": before,
        "ledger_dirs_bytes_after": after,
        "space_back_s": back_s,
    }
    _print(result, args)
    write_json(args.json, result)
    return result


async def _fill(uri: str, args: argparse.Namespace) -> list[int]:
    per_ledger = max(1, (args.fill_mb << 20) // args.fill_ledgers // FILL_ENTRY_BYTES)
    payload = os.urandom(FILL_ENTRY_BYTES)
    ids = []
    async with BookKeeper.connect(uri, client_config(per_ledger, FILL_ENTRY_BYTES)) as bk:
        for _ in range(args.fill_ledgers):
            w = await bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum,
                                       password=PASSWORD)  # fmt: skip
            for start in range(0, per_ledger, 64):
                await asyncio.gather(
                    *(w.append(payload) for _ in range(min(64, per_ledger - start)))
                )
            await w.close()
            ids.append(w.ledger_id)
    return ids


async def _delete(uri: str, ledger_ids: list[int]) -> None:
    async with BookKeeper.connect(uri) as bk:
        for ledger_id in ledger_ids:
            await bk.delete_ledger(ledger_id)


def _bytes(dirs: list[Path]) -> int:
    return sum(f.stat().st_size for d in dirs for f in d.rglob("*") if f.is_file())


async def _space_back(
    dirs: list[Path], before: int, fill: int, started: float, timeout_s: float
) -> float | None:
    """Seconds from the deletes until the dirs lost ~the fill (each bookie's copy); None if
    not within the timeout."""
    goal = before - len(dirs) * fill * 0.8
    try:
        async with asyncio.timeout(timeout_s):
            while _bytes(dirs) > goal:  # noqa: ASYNC110 (other processes: no event)
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        return None
    return round(time.monotonic() - started, 2)


def _print(result: dict[str, Any], args: argparse.Namespace) -> None:
    keys = ("entries_per_s", "mb_per_s", "p50_ms", "p99_ms")
    rows = [
        {"run": "writes, no GC", **{k: result["without_gc"].get(k) for k in keys}},
        {"run": "writes while GC frees the fill", **{k: result.get(k) for k in keys}},
        {"run": "writes, no GC (after)", **{k: result["without_gc_after"].get(k) for k in keys}},
    ]
    print_table(f"gc: {args.engine}, {quorum_label(args)}, fill {args.fill_mb} MiB", rows)
    print(f"ratio_vs_without_gc: {result['ratio_vs_without_gc']:.3f}")
    print(f"ledger dirs: {result['ledger_dirs_bytes_before']} -> "
          f"{result['ledger_dirs_bytes_after']} bytes; space back after "
          f"{result['space_back_s']} s")  # fmt: skip
