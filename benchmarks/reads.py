"""``reads``: write a ledger, close it, read it back (like BookKeeper's
BenchReadThroughputLatency).

    python -m benchmarks reads --entries 20000 --batch 100 --outstanding 1 --duration 10

The ledger gets ``--entries`` entries (closed loop, ``--write-outstanding`` adds in flight)
and is closed; a second client opens it (no recovery needed: it is closed) and reads it with
``--outstanding`` read calls in flight (``--rate``: open loop), each ``reader.read(first,
first + batch - 1)``, walking the ledger from the start and wrapping around. Latency is per
read call; entries/s counts entries.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from typing import Any

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.client.context import LedgerEntry

from .cluster import mode_target
from .load import closed_loop, drive, payload_pool
from .options import PASSWORD, add_client_arguments, client_config, quorum_label
from .stats import print_table, write_json
from .writes import describe, open_writers, round_robin


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p, outstanding=1)
    p.add_argument("--entries", type=int, default=20_000, metavar="N", help="entries written")
    p.add_argument("--batch", type=int, default=100, metavar="N", help="entries per read call")
    p.add_argument("--write-outstanding", type=int, default=1000, metavar="N")


async def write_ledger(uri: str, args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    """One closed ledger of ``--entries`` entries; its id and the write figures."""
    payloads = payload_pool(args.entry_size)
    async with BookKeeper.connect(
        uri, client_config(args.write_outstanding, args.entry_size)
    ) as bk:
        (writer,) = await open_writers(bk, args, count=1)
        load = await closed_loop(
            round_robin([writer], payloads), args.write_outstanding, count=args.entries
        )
        await writer.close()
    if load.errors:
        raise RuntimeError(f"writing the ledger failed: {load.first_error}")
    return writer.ledger_id, load.summary(args.entry_size)


async def measure_reads(uri: str, args: argparse.Namespace) -> dict[str, Any]:
    """Write the ledger, then the measured reads; the summary."""
    ledger_id, written = await write_ledger(uri, args)
    async with BookKeeper.connect(uri, client_config(args.outstanding, args.entry_size)) as bk:
        reader = await bk.open_ledger(ledger_id, PASSWORD, recovery=False)
        last = reader.last_add_confirmed
        starts = itertools.cycle(range(0, last + 1, args.batch))

        def send() -> asyncio.Future[list[LedgerEntry]]:
            first = next(starts)
            return asyncio.ensure_future(reader.read(first, min(last, first + args.batch - 1)))

        if args.warmup > 0:
            await closed_loop(send, args.outstanding, args.warmup, weight=len)
        load = await drive(send, args.outstanding, args.duration, args.rate, weight=len)
        await bk.delete_ledger(ledger_id)
    return {
        **describe(args),
        "batch": args.batch,
        "entries_written": args.entries,
        "write_entries_per_s": written["entries_per_s"],
        **load.summary(args.entry_size),
    }


async def run_reads(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """The ``reads`` mode: print a table, write the JSON, return the results."""
    async with mode_target(args) as tgt:
        result = await measure_reads(tgt.uri, args)
    if not quiet:
        load = f"rate {args.rate:g}/s" if args.rate else f"{args.outstanding} outstanding"
        title = f"reads: {args.entry_size} B entries, {args.batch} per call, {load}"
        print_table(title, [{
            "ledger": quorum_label(args), "entries/s": result["entries_per_s"],
            "MB/s": result["mb_per_s"], "p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"],
            "p99.9_ms": result["p99_9_ms"], "max_ms": result["max_ms"],
            "errors": result["errors"],
        }])  # fmt: skip
    write_json(args.json, result)
    return result
