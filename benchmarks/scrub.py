"""``scrub``: what the scrubber (BP-31 bit rot, ``bookie/scrubber.py``) costs a write load:
client add throughput with every bookie scrubbing at ``scrub_bytes_per_s`` against the same
load without, in one run.

    python -m benchmarks scrub --duration 10 --outstanding 100 --entry-size 1024

One local cluster: etcd + 3 bookies (``--engine``, the scrubber only on request:
``scrub_interval_s=0``, at ``--scrub-rate``). After a ``--warmup``, the write load (closed
loop, ``--outstanding`` adds in flight, E3/WQ3/AQ2, a new ledger per phase) runs ``--rounds``
phases of ``--duration`` alone, then ``--rounds`` phases while every bookie scrubs without a
break (a pass asked for with the SCRUB request, as ``shell scrub`` does, and the next one as
soon as it ends; they read what the earlier phases wrote). A pass cannot be stopped, so the
phases without come first; a drift between them (RocksDB compactions piling up) counts against
the scrubber. The ratio is the median with-scrub throughput over the median without. The
scrub re-reads data written a moment before, mostly from the page cache: the figure is the
scrubber's CPU and loop cost, not that of a disk seek per entry.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from typing import Any

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.client.reads import request
from bookkeeper_aio.config import BookieConfig
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
    """Phases without, then with scrubbing; a table; the JSON."""
    sets = ["--set", "scrub_interval_s=0", "--set", f"scrub_bytes_per_s={args.scrub_rate}"]
    async with target(None, args.dir, 3, args.engine, *sets) as where:
        bookies = [b.address for b in where.bookies]
        async with BookKeeper.connect(where.uri) as bk:
            if args.warmup > 0:
                await _load(bk, args, args.warmup)
            without = [await _load(bk, args, args.duration) for _ in range(args.rounds)]
            scrubbing = _Scrubbing(bk, bookies)
            keeper = asyncio.ensure_future(scrubbing.keep_going())
            try:
                await scrubbing.started.wait()
                with_scrub = [await _load(bk, args, args.duration) for _ in range(args.rounds)]
            finally:
                keeper.cancel()
                await asyncio.gather(keeper, return_exceptions=True)
            scrubbed = await scrubbing.bytes_checked()
    result = _result(args, without, with_scrub, scrubbed)
    if not quiet:
        _print(result, args)
    write_json(args.json, result)
    return result


async def _load(bk: BookKeeper, args: argparse.Namespace, duration_s: float) -> dict[str, Any]:
    """The write load on a new ledger for ``duration_s``; its summary."""
    w = await bk.create_ledger(3, 3, 2, PASSWORD)
    send = round_robin_callbacks([w], payload_pool(args.entry_size))
    load = await closed_loop(send, args.outstanding, duration_s, callbacks=True)
    await w.close()
    return load.summary(args.entry_size)


class _Scrubbing:
    """Every bookie scrubbing without a break: the next pass asked for as one ends."""

    def __init__(self, bk: BookKeeper, bookies: list[str]) -> None:
        self.bk = bk
        self.bookies = bookies
        self.started = asyncio.Event()
        self.done_bytes = 0  # checked by the passes that ended
        self._passes: dict[str, int] = {}  # bookie -> the pass asked for

    async def keep_going(self) -> None:
        while True:  # polled, as `shell scrub` does
            for bookie in self.bookies:
                state = await _scrub(self.bk, bookie, False)
                wanted = self._passes.get(bookie)
                if wanted is not None and state.passes_done < wanted:
                    continue
                if wanted is not None:
                    self.done_bytes += state.bytes_checked
                self._passes[bookie] = (await _scrub(self.bk, bookie, True)).passes_started + 1
            self.started.set()
            await asyncio.sleep(0.1)

    async def bytes_checked(self) -> int:
        """By the ended passes and the running ones so far."""
        running = 0
        for bookie, wanted in self._passes.items():
            state = await _scrub(self.bk, bookie, False)
            if state.passes_started >= wanted:
                running += state.bytes_checked
        return self.done_bytes + running


async def _scrub(bk: BookKeeper, bookie: str, start: bool) -> ScrubResponse:
    answer: Any = await request(bk.ctx, bookie, ScrubRequest, start)
    if type(answer) is not ScrubResponse:
        raise RuntimeError(f"bookie {bookie} did not answer SCRUB: {answer!r:.200}")
    return answer


def _result(
    args: argparse.Namespace,
    without: list[dict[str, Any]],
    with_scrub: list[dict[str, Any]],
    scrubbed: int,
) -> dict[str, Any]:
    off = statistics.median(r["entries_per_s"] for r in without)
    on = statistics.median(r["entries_per_s"] for r in with_scrub)
    scrubbing_s = sum(r["elapsed_s"] for r in with_scrub)
    return {
        "entries_per_s": on,
        "mb_per_s": statistics.median(r["mb_per_s"] for r in with_scrub),
        "p50_ms": statistics.median(r["p50_ms"] for r in with_scrub),
        "p99_ms": statistics.median(r["p99_ms"] for r in with_scrub),
        "errors": sum(r["errors"] for r in without + with_scrub),
        "scrub_bytes_per_s": args.scrub_rate,
        "scrubbed_bytes": scrubbed,  # payload bytes checked, 3 bookies, about the with phases
        "scrubbed_mb_per_s_per_bookie": scrubbed / 3 / max(scrubbing_s, 1e-9) / 1e6,
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
    ratio, rate = (
        result["ratio_entries_per_s_scrub_vs_none"],
        result["scrubbed_mb_per_s_per_bookie"],
    )
    print(f"entries/s scrubbing/none (medians): {ratio:.3f}   checked per bookie: {rate:.2f} MB/s")


__all__ = ["add_arguments", "run_scrub"]
