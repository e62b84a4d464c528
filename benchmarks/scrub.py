"""``scrub``: what the scrubber (BP-31 bit rot, ``bookie/scrubber.py``) costs a write load:
client add throughput with every bookie scrubbing at ``scrub_bytes_per_s`` against the same
load without, in one run.

    python -m benchmarks scrub --duration 10 --outstanding 100 --entry-size 1024

One local cluster: etcd + 3 bookies (``--engine``, the scrubber only on request:
``scrub_interval_s=0``). First as many entries as one pass at ``--scrub-rate`` checks in
``--duration`` are written to closed ledgers (E3/WQ3/AQ2: every bookie holds all of them).
Then, ``--rounds`` times: the write load alone for ``--duration`` (closed loop,
``--outstanding`` adds in flight, a new ledger per phase), then the same load while every
bookie makes one scrub pass (asked with the SCRUB request, as ``shell scrub`` does; a pass
also reads every earlier phase's ledger, so it lasts the whole phase, and it is waited for
before the next phase). The ratio is the median with-scrub throughput over the median
without. The scrub re-reads data written a moment before, mostly from the page cache: the
figure is the scrubber's CPU and loop cost, not that of a disk seek per entry.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.bookie.scrubber import ENTRY_CHARGE_BYTES
from bookkeeper_aio.client.reads import request
from bookkeeper_aio.config import BookieConfig
from bookkeeper_aio.digest import ENTRY_RECORD_HEADER
from bookkeeper_aio.protocol import ScrubRequest, ScrubResponse

from .cluster import target
from .load import closed_loop, payload_pool
from .options import PASSWORD
from .stats import print_table, write_json
from .writes import round_robin_callbacks

DEFAULT_RATE = BookieConfig().scrub_bytes_per_s


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=10.0, metavar="S",
                   help="each phase; also sets how much is written first")  # fmt: skip
    p.add_argument("--warmup", type=float, default=1.0, metavar="S")
    p.add_argument("--rounds", type=int, default=2, metavar="N")
    p.add_argument("--outstanding", type=int, default=100, metavar="N")
    p.add_argument("--entry-size", type=int, default=1024, metavar="B")
    p.add_argument("--scrub-rate", type=int, default=DEFAULT_RATE, metavar="BYTES_PER_S",
                   help=f"the bookies' scrub_bytes_per_s (default: {DEFAULT_RATE})")  # fmt: skip
    p.add_argument("--engine", default="rocksdb", choices=("rocksdb", "files", "memory"))
    p.add_argument("--dir", metavar="DIR", help="where the bookies write (tmp)")
    p.add_argument("--json", metavar="PATH")


async def run_scrub(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """Fill, then rounds of without/with scrubbing; a table; the JSON."""
    sets = ["--set", "scrub_interval_s=0", "--set", f"scrub_bytes_per_s={args.scrub_rate}"]
    async with target(None, args.dir, 3, args.engine, *sets) as where:
        bookies = [b.address for b in where.bookies]
        async with BookKeeper.connect(where.uri) as bk:
            # As much as one pass at the rate checks in --duration (entries are charged their
            # size plus ENTRY_CHARGE_BYTES against it).
            charge = args.entry_size + ENTRY_RECORD_HEADER.size + ENTRY_CHARGE_BYTES
            entries = int(args.duration * args.scrub_rate / charge)
            filled = await _fill(bk, entries * args.entry_size, args.entry_size)
            if args.warmup > 0:
                await _load(bk, args, args.warmup)
            without, with_scrub, scrubbed = [], [], []
            for _ in range(args.rounds):
                without.append(await _load(bk, args, args.duration))
                phase, checked = await _with_scrub(bk, bookies, args)
                with_scrub.append(phase)
                scrubbed.append(checked)
    result = _result(args, filled, without, with_scrub, scrubbed)
    if not quiet:
        _print(result, args)
    write_json(args.json, result)
    return result


async def _fill(bk: BookKeeper, total: int, entry_size: int) -> int:
    """Closed ledgers holding ``total`` payload bytes (at least one entry)."""
    payloads = payload_pool(entry_size)
    written = 0
    while written < max(total, 1):
        w = await bk.create_ledger(3, 3, 2, PASSWORD)
        pending = []
        for i in range(min(10_000, max(1, (total - written) // entry_size))):
            payload = payloads[i % len(payloads)]
            await w.wait_for_room(len(payload))
            pending.append(w.append_nowait(payload))
            written += len(payload)
        await asyncio.gather(*pending)
        await w.close()
    return written


async def _load(bk: BookKeeper, args: argparse.Namespace, duration_s: float) -> dict[str, Any]:
    """The write load on a new ledger for ``duration_s``; its summary."""
    w = await bk.create_ledger(3, 3, 2, PASSWORD)
    send = round_robin_callbacks([w], payload_pool(args.entry_size))
    load = await closed_loop(send, args.outstanding, duration_s, callbacks=True)
    await w.close()
    return load.summary(args.entry_size)


async def _with_scrub(
    bk: BookKeeper, bookies: list[str], args: argparse.Namespace
) -> tuple[dict[str, Any], int]:
    """The load for ``--duration`` while every bookie makes one pass, which reads at least as
    much (the fill, and every earlier phase's ledger): the passes cover the whole phase and
    are waited for afterwards, so none runs into the next phase. Its summary and the bytes
    the passes checked."""
    targets = {b: (await _scrub(bk, b, True)).passes_started + 1 for b in bookies}
    summary = await _load(bk, args, args.duration)
    checked = 0
    for bookie, pass_id in targets.items():
        while True:  # polled, as `shell scrub` does
            state = await _scrub(bk, bookie, False)
            if state.passes_done >= pass_id:
                break
            await asyncio.sleep(0.1)
        checked += state.bytes_checked
    return summary, checked


async def _scrub(bk: BookKeeper, bookie: str, start: bool) -> ScrubResponse:
    answer: Any = await request(bk.ctx, bookie, ScrubRequest, start)
    if type(answer) is not ScrubResponse:
        raise RuntimeError(f"bookie {bookie} did not answer SCRUB: {answer!r:.200}")
    return answer


def _result(args, filled, without, with_scrub, scrubbed) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    off = statistics.median(r["entries_per_s"] for r in without)
    on = statistics.median(r["entries_per_s"] for r in with_scrub)
    return {
        "entries_per_s": on,
        "mb_per_s": statistics.median(r["mb_per_s"] for r in with_scrub),
        "p50_ms": statistics.median(r["p50_ms"] for r in with_scrub),
        "p99_ms": statistics.median(r["p99_ms"] for r in with_scrub),
        "errors": sum(r["errors"] for r in without + with_scrub),
        "scrub_bytes_per_s": args.scrub_rate,
        "filled_bytes": filled,
        "scrubbed_bytes_per_pass": statistics.median(scrubbed),
        "without_scrub": without,
        "with_scrub": with_scrub,
        "without_scrub_entries_per_s": off,
        "with_scrub_entries_per_s": on,
        "ratio_entries_per_s_scrub_vs_none": on / off if off else None,
    }


def _print(result: dict[str, Any], args: argparse.Namespace) -> None:
    rows = []
    for name, runs in (("none", result["without_scrub"]), ("scrubbing", result["with_scrub"])):
        for r in runs:
            rows.append({"scrubber": name, "entries/s": r["entries_per_s"],
                         "MB/s": r["mb_per_s"], "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"],
                         "s": r["elapsed_s"]})  # fmt: skip
    title = (f"writes while 3 bookies scrub at {args.scrub_rate} B/s: {args.entry_size} B "
             f"entries, {args.outstanding} in flight, {args.engine}")  # fmt: skip
    print_table(title, rows)
    print(f"entries/s scrubbing/none (medians): {result['ratio_entries_per_s_scrub_vs_none']:.3f}")


__all__ = ["add_arguments", "run_scrub"]
