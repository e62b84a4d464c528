"""``recovery``: ledgers left open by a writer that went away, then opened with recovery.

    python -m benchmarks recovery --ledgers 10 --entries 2000 --outstanding 1000

A writer client adds ``--entries`` entries to each of ``--ledgers`` ledgers (closed loop,
``--outstanding`` adds in flight, round-robin) with explicit LAC writes switched off, waits
for every acknowledgement, then disconnects without closing anything: the bookies' LAC lags
the last entry by about the number of adds that were in flight, as after a writer crash. A
second client then opens each ledger with recovery (``--parallel`` at a time): fence, read
forward from the LAC, write the entries back, close. Per ledger it reports the recovery time
(p50/p99) and checks that the recovered end is the last acknowledged entry; entries/s counts
the entries recovery had to read forward (past the LAC the bookies knew) per second of
recovery wall time. ``--duration`` is unused here: the work is fixed by the ledger sizes.

``--tail-entries N`` then adds N more entries to each ledger, all sent in one event-loop turn
(one ledger after the other), so each of them carries the LAC the prefix left: a tail of N
unconfirmed entries, which recovery must read, write back to its write sets and close over.
The baseline, measured in the same run: how long writing that tail took
(``tail_write_p50_ms``, N adds in flight); ``ratio_vs_tail_write`` is recovery's p50 over it.

    python -m benchmarks recovery --ledgers 1 --tail-entries 10000
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from bookkeeper_aio import BookKeeper

from .cluster import mode_target
from .load import closed_loop, payload_pool
from .options import PASSWORD, add_client_arguments, client_config, quorum_label
from .stats import latency_summary, print_table, write_json
from .writes import describe, open_writers, round_robin

NO_EXPLICIT_LAC_S = 3600.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p)
    p.set_defaults(ledgers=10)
    p.add_argument("--entries", type=int, default=2000, metavar="N", help="entries per ledger")
    p.add_argument("--parallel", type=int, default=1, metavar="N", help="recoveries at a time")
    p.add_argument(
        "--tail-entries",
        type=int,
        default=0,
        metavar="N",
        help="then N more entries per ledger, sent at once: an unconfirmed tail",
    )
    p.add_argument(
        "--read-batch",
        type=int,
        default=None,
        metavar="N",
        help="the recovering client's recovery_read_batch_entries (0: one read per entry)",
    )


async def abandon_ledgers(uri: str, args: argparse.Namespace) -> tuple[list[int], list[float]]:
    """Write the ledgers, wait for every ack, leave them open; their ids and the seconds each
    one's unconfirmed tail took to write (none without ``--tail-entries``)."""
    payloads = payload_pool(args.entry_size)
    config = client_config(
        max(args.outstanding, args.tail_entries),
        args.entry_size,
        explicit_lac_interval_s=NO_EXPLICIT_LAC_S,
    )
    tail_s: list[float] = []
    async with BookKeeper.connect(uri, config) as bk:
        writers = await open_writers(bk, args)
        if args.entries:
            load = await closed_loop(
                round_robin(writers, payloads), args.outstanding, count=args.entries * args.ledgers
            )
            if load.errors:
                raise RuntimeError(f"writing the ledgers failed: {load.first_error}")
        for writer in writers if args.tail_entries else ():
            # One loop turn: every entry carries the LAC the prefix left.
            t0 = time.perf_counter()
            adds = [writer.append_nowait(payloads[i % len(payloads)])
                    for i in range(args.tail_entries)]  # fmt: skip
            await asyncio.gather(*adds)
            tail_s.append(time.perf_counter() - t0)
        return [w.ledger_id for w in writers], tail_s  # not closed: the client just goes away


async def _known_lacs(bk: BookKeeper, ledger_ids: list[int]) -> dict[int, int]:
    """The LAC the bookies report for each ledger (what recovery starts from)."""
    readers = [await bk.open_ledger(lid, PASSWORD, recovery=False) for lid in ledger_ids]
    return {r.ledger_id: r.last_add_confirmed for r in readers}


async def recover_all(
    uri: str, args: argparse.Namespace, ledger_ids: list[int]
) -> tuple[list[tuple[float, int, int]], float]:
    """Open every ledger with recovery, ``--parallel`` at a time: per ledger (seconds, LAC
    before, recovered end), and the wall time of them all."""
    gate = asyncio.Semaphore(args.parallel)
    batch = {} if args.read_batch is None else {"recovery_read_batch_entries": args.read_batch}
    config = client_config(args.outstanding, args.entry_size, **batch)
    async with BookKeeper.connect(uri, config) as bk:
        lacs = await _known_lacs(bk, ledger_ids)

        async def one(lid: int) -> tuple[float, int, int]:
            async with gate:
                t0 = time.perf_counter()
                reader = await bk.open_ledger(lid, PASSWORD, recovery=True)
                return time.perf_counter() - t0, lacs[lid], reader.last_add_confirmed

        start = time.perf_counter()
        async with asyncio.timeout(60.0 + 10.0 * len(ledger_ids)):
            outcomes = list(await asyncio.gather(*(one(lid) for lid in ledger_ids)))
        elapsed = time.perf_counter() - start
        for lid in ledger_ids:
            await bk.delete_ledger(lid)
    return outcomes, elapsed


async def measure_recovery(uri: str, args: argparse.Namespace) -> dict[str, Any]:
    """Abandon the ledgers, recover them; the summary."""
    ledger_ids, tail_s = await abandon_ledgers(uri, args)
    outcomes, elapsed = await recover_all(uri, args, ledger_ids)
    recovered = sum(end - lac for _, lac, end in outcomes)
    last = args.entries + args.tail_entries - 1
    wrong_end = sum(end != last for _, _, end in outcomes)
    summary = latency_summary([t for t, _, _ in outcomes])
    baseline: dict[str, Any] = {}
    if tail_s:
        tail_write = latency_summary(tail_s)
        baseline = {
            "tail_write_p50_ms": tail_write["p50_ms"],
            "ratio_vs_tail_write": summary["p50_ms"] / tail_write["p50_ms"],
        }
    return {
        **describe(args),
        "entries_per_ledger": args.entries + args.tail_entries,
        "tail_entries": args.tail_entries,
        **baseline,
        "parallel": args.parallel,
        "entries": recovered,
        "entries_per_s": recovered / elapsed,
        "mb_per_s": recovered * args.entry_size / elapsed / 1e6,
        "ledgers_per_s": len(outcomes) / elapsed,
        "errors": wrong_end,  # a recovered end other than the last acknowledged entry
        **summary,
    }


async def run_recovery(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """The ``recovery`` mode: print a table, write the JSON, return the results."""
    async with mode_target(args) as tgt:
        result = await measure_recovery(tgt.uri, args)
    if not quiet:
        title = (
            f"recovery: {args.ledgers} ledgers x {args.entries} entries"
            f" + {args.tail_entries} unconfirmed of {args.entry_size} B,"
            f" {quorum_label(args)}, {args.parallel} at a time"
        )
        print_table(title, [{
            "entries recovered": result["entries"], "entries/s": result["entries_per_s"],
            "ledgers/s": result["ledgers_per_s"], "p50_ms/ledger": result["p50_ms"],
            "p99_ms/ledger": result["p99_ms"], "max_ms/ledger": result["max_ms"],
            "wrong ends": result["errors"],
            "tail write p50_ms": result.get("tail_write_p50_ms"),
        }])  # fmt: skip
    write_json(args.json, result)
    return result
