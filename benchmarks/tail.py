"""``tail``: one writer appends, a tailing reader follows; append-to-tail-read latency.

    python -m benchmarks tail --rate 1000 --duration 10        # open loop (the default)
    python -m benchmarks tail --rate 0 --outstanding 100       # closed loop instead

The writer and the reader are two clients (two sets of connections) in this process. The
writer appends through ``append_nowait`` (open loop at ``--rate``, or closed loop); the reader
runs ``reader.tail()``. The latency of an entry is the time from its ``append_nowait`` call to
the moment the reader's ``tail`` yields it; a reader only sees an entry once the LAC covers it,
which the writer piggybacks on a *later* add (or sends after ``explicit_lac_interval_s`` idle),
so at low rates the gap between adds is part of the figure, as it is in BookKeeper.

Entries appended during the ``--duration`` window (after ``--warmup``) are measured; the writer
keeps appending for ``GRACE_S`` more so that their LAC reaches the reader the normal way, then
the benchmark waits (bounded) for the reader to see every measured entry.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import time
from typing import Any

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.client.reader import LedgerReader
from bookkeeper_aio.client.writer import LedgerWriter

from .cluster import mode_target
from .load import LoadResult, drive, payload_pool
from .options import PASSWORD, add_client_arguments, client_config, quorum_label
from .stats import latency_summary, print_table, timeline, write_json
from .writes import describe, open_writers

GRACE_S = 0.5  # appends after the window, so measured entries get their LAC piggybacked
CATCH_UP_TIMEOUT_S = 10.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p)
    p.set_defaults(rate=1000.0)


class _Follower:
    """The tailing reader: when each entry was seen."""

    def __init__(self, reader: LedgerReader) -> None:
        self.reader = reader
        self.seen: dict[int, float] = {}
        self.progress = asyncio.Event()

    async def run(self) -> None:
        async for entry in self.reader.tail(0):
            self.seen[entry.entry_id] = time.perf_counter()
            self.progress.set()

    async def wait_for(self, entry_id: int, timeout_s: float) -> None:
        """Until ``entry_id`` was seen, or ``timeout_s`` passed (then some stay unseen)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while entry_id not in self.seen:
                    self.progress.clear()
                    await self.progress.wait()


async def _append(
    writer: LedgerWriter, args: argparse.Namespace, sent: dict[int, float]
) -> LoadResult:
    """Append for warm-up + duration + grace; ``sent`` gets each entry's append time."""
    payloads = itertools.cycle(payload_pool(args.entry_size))

    def send() -> asyncio.Future[int]:
        t0 = time.perf_counter()
        future = writer.append_nowait(next(payloads))
        sent[writer.last_add_pushed] = t0
        return future

    total_s = args.warmup + args.duration + GRACE_S
    return await drive(send, args.outstanding, total_s, args.rate)


async def measure_tail(uri: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run writer and follower; the tail latency of the entries appended in the window."""
    config = client_config(args.outstanding, args.entry_size)
    async with BookKeeper.connect(uri, config) as wbk, BookKeeper.connect(uri, config) as rbk:
        (writer,) = await open_writers(wbk, args, count=1)
        follower = _Follower(await rbk.open_ledger(writer.ledger_id, PASSWORD, recovery=False))
        sent: dict[int, float] = {}
        follow = asyncio.create_task(follower.run())
        try:
            start = time.perf_counter()
            appends = await _append(writer, args, sent)
            window = (start + args.warmup, start + args.warmup + args.duration)
            measured = [e for e, t in sent.items() if window[0] <= t < window[1]]
            if measured:
                await follower.wait_for(max(measured), CATCH_UP_TIMEOUT_S)
        finally:
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follow
        await writer.close()
        await wbk.delete_ledger(writer.ledger_id)
    seen = [e for e in measured if e in follower.seen]
    latencies = [follower.seen[e] - sent[e] for e in seen]
    append = appends.summary(args.entry_size)
    return {
        **describe(args),
        "entries": len(latencies),
        "unseen": len(measured) - len(latencies),
        "entries_per_s": len(latencies) / args.duration,
        "mb_per_s": len(latencies) * args.entry_size / args.duration / 1e6,
        "errors": appends.errors,
        "first_error": appends.first_error,
        **latency_summary(latencies),
        "timeline": timeline(latencies, [follower.seen[e] for e in seen], window[0]),
        **{f"append_{k}": v for k, v in append.items() if k.endswith("_ms")},
    }


async def run_tail(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """The ``tail`` mode: print a table, write the JSON, return the results."""
    async with mode_target(args) as tgt:
        result = await measure_tail(tgt.uri, args)
    if not quiet:
        load = f"rate {args.rate:g}/s" if args.rate else f"{args.outstanding} outstanding"
        rows = [
            {"latency": "append -> tail read", **_percentiles(result, "")},
            {"latency": "append acknowledged", **_percentiles(result, "append_")},
        ]
        title = f"tail: {args.entry_size} B entries, {quorum_label(args)}, {load}"
        print_table(title, rows)
        print(f"entries seen: {result['entries']}, unseen: {result['unseen']}")
    write_json(args.json, result)
    return result


def _percentiles(result: dict[str, Any], prefix: str) -> dict[str, float]:
    keys = ("p50_ms", "p95_ms", "p99_ms", "p99_9_ms", "max_ms")
    return {k.replace("_9", ".9"): result[prefix + k] for k in keys}
