"""``log``: appends to a log that rolls over every few seconds, against plain ledger writes
measured in the same run.

    python -m benchmarks log --duration 10 --outstanding 1000 --rollover-s 2

Three phases on one client, each a closed loop of ``--outstanding`` appends of
``--entry-size`` bytes through ``append_callback`` (as the ``writes`` benchmark): plain ledger
writes, then log appends, then ledger writes again (the baseline is the mean of the two, so a
drift of the machine during the run does not count against either). The log's
``segment_bytes_max`` is what the first ledger phase wrote in ``--rollover-s`` seconds, so the
writer rolls over to a new ledger about that often. Reported: both rates and their ratio
(goal >= 0.9), the percentiles of both, the rollovers, and the step a rollover makes: the p99
of the appends in flight while a rollover finished (within ``ROLLOVER_WINDOW_S`` before a
segment's close) against the p99 of the others.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from array import array
from collections.abc import Callable
from typing import Any

from bookkeeper_aio import BookKeeper

from . import machine
from .cluster import mode_target
from .load import payload_pool
from .options import add_client_arguments, client_config, quorum_label
from .stats import latency_summary, print_table, timeline, write_json

ROLLOVER_WINDOW_S = 0.05  # before a segment's close: drain, close, compare-and-swap
DRAIN_TIMEOUT_S = 60.0

Send = Callable[[bytes, Callable[[int, BaseException | None], None]], object]


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p)
    p.add_argument(
        "--rollover-s",
        type=float,
        default=2.0,
        metavar="S",
        help="the log rolls over to a new ledger about every S seconds (default 2)",
    )


class Timed:
    """A closed loop that keeps each append's start and latency (for the rollover windows),
    with reused slots like ``load.closed_loop`` (no closure per append)."""

    def __init__(self, send: Send, payloads: list[bytes], outstanding: int) -> None:
        self.send, self.payloads, self.outstanding = send, payloads, outstanding
        self.starts, self.latencies = array("d"), array("d")
        self.errors = 0
        self.first_error: str | None = None
        self.in_flight, self.turn, self.deadline = 0, 0, 0.0
        self.idle = asyncio.Event()

    async def run(self, duration_s: float) -> Timed:
        start = self.started = time.perf_counter()
        self.deadline = start + duration_s
        self.idle.clear()
        for _ in range(self.outstanding):
            self._launch(_Slot(self), start)
        async with asyncio.timeout(duration_s + DRAIN_TIMEOUT_S):
            await self.idle.wait()
        self.elapsed_s = time.perf_counter() - start
        return self

    def _launch(self, slot: _Slot, now: float) -> None:
        if now >= self.deadline:
            if not self.in_flight:
                self.idle.set()
            return
        slot.t0 = now
        self.turn += 1
        try:
            self.send(self.payloads[self.turn % len(self.payloads)], slot.done)
        except Exception as exc:  # the handle failed: count it, stop this slot
            self._fail(exc)
            if not self.in_flight:
                self.idle.set()
            return
        self.in_flight += 1

    def _fail(self, exc: BaseException) -> None:
        self.errors += 1
        self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"

    def summary(self) -> dict[str, Any]:
        count = len(self.latencies)
        return {
            "entries": count,
            "entries_per_s": count / self.elapsed_s,
            "mb_per_s": count * len(self.payloads[0]) / self.elapsed_s / 1e6,
            "errors": self.errors,
            "first_error": self.first_error,
            **latency_summary(self.latencies),
            "timeline": timeline(
                self.latencies,
                [t + lat for t, lat in zip(self.starts, self.latencies, strict=True)],
                self.started,
            ),
        }


class _Slot:
    __slots__ = ("loop", "t0")

    def __init__(self, loop: Timed) -> None:
        self.loop, self.t0 = loop, 0.0

    def done(self, _value: int, error: BaseException | None) -> None:
        loop, now = self.loop, time.perf_counter()
        loop.in_flight -= 1
        if error is None:
            loop.starts.append(self.t0)
            loop.latencies.append(now - self.t0)
        else:
            loop._fail(error)
        loop._launch(self, now)  # the slot goes on with the next append


async def measure_log(uri: str, args: argparse.Namespace) -> dict[str, Any]:
    """The three phases; see the module docstring."""
    payloads = payload_pool(args.entry_size)
    quorum = (args.ensemble, args.write_quorum, args.ack_quorum)
    async with BookKeeper.connect(uri, client_config(args.outstanding, args.entry_size)) as bk:
        before = await _ledger_phase(bk, args, payloads)
        segment_bytes = max(100 * args.entry_size, int(
            before.summary()["entries_per_s"] * args.entry_size * args.rollover_s
        ))  # fmt: skip
        name = f"bench-{uuid.uuid4().hex[:12]}"
        await bk.create_log(name, ensemble_size=quorum[0], write_quorum=quorum[1],
                            ack_quorum=quorum[2], segment_bytes_max=segment_bytes)  # fmt: skip
        wall_minus_perf = time.time() - time.perf_counter()
        async with machine.cpu_probe() as probe, bk.open_log_writer(name) as writer:
            if args.warmup > 0:
                await Timed(writer.append_callback, payloads, args.outstanding).run(args.warmup)
            log = await Timed(writer.append_callback, payloads, args.outstanding).run(args.duration)
            rollovers = writer.statistics()["rollovers"]
        info = await bk.log_info(name)
        await bk.delete_log(name)
        after = await _ledger_phase(bk, args, payloads)
    closes = [(s.closed_ms or 0) / 1000 - wall_minus_perf for s in info.metadata.segments]
    return {
        **_describe(args, segment_bytes),
        "ledger": _merge(before.summary(), after.summary()),
        "ledger_first": before.summary(),
        "ledger_last": after.summary(),
        **log.summary(),
        "rollovers": rollovers,
        **_step(log, closes),
        "cpu_probe_ms": machine.cpu_probe_ms(probe),
    }


async def _ledger_phase(bk: BookKeeper, args: argparse.Namespace, payloads: list[bytes]) -> Timed:
    quorum = (args.ensemble, args.write_quorum, args.ack_quorum)
    writer = await bk.create_ledger(*quorum)
    if args.warmup > 0:
        await Timed(writer.append_callback, payloads, args.outstanding).run(args.warmup)
    timed = await Timed(writer.append_callback, payloads, args.outstanding).run(args.duration)
    await writer.close()
    await bk.delete_ledger(writer.ledger_id)
    return timed


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The mean of two phases' figures (rates and percentiles alike)."""
    merged = {k: (a[k] + b[k]) / 2 if isinstance(a[k], int | float) else a[k] for k in a}
    merged.pop("timeline", None)  # each phase has its own
    return merged


def _step(log: Timed, closes: list[float]) -> dict[str, Any]:
    """p99 of the appends in flight when a rollover finished vs the others."""
    windows = sorted((c - ROLLOVER_WINDOW_S, c) for c in closes if c > 0)
    near: list[float] = []
    far: list[float] = []
    for t0, latency in zip(log.starts, log.latencies, strict=True):
        hit = any(t0 <= end and t0 + latency >= start for start, end in windows)
        (near if hit else far).append(latency)
    n, f = latency_summary(near), latency_summary(far)
    return {
        "rollover_appends": len(near),
        "rollover_p99_ms": n["p99_ms"],
        "rollover_max_ms": n["max_ms"],
        "steady_p99_ms": f["p99_ms"],
        "ratio_rollover_p99": n["p99_ms"] / f["p99_ms"] if near and far else None,
    }


def _describe(args: argparse.Namespace, segment_bytes: int) -> dict[str, Any]:
    return {
        "entry_size": args.entry_size,
        "quorum": quorum_label(args),
        "outstanding": args.outstanding,
        "duration_s": args.duration,
        "rollover_s": args.rollover_s,
        "segment_bytes_max": segment_bytes,
    }


def ratios(result: dict[str, Any]) -> dict[str, float]:
    """Log against ledger: entries/s and p99."""
    ledger = result["ledger"]
    return {
        "ratio_vs_ledger": result["entries_per_s"] / ledger["entries_per_s"],
        "ratio_p99_vs_ledger": result["p99_ms"] / ledger["p99_ms"],
    }


async def run_log(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """The ``log`` mode: measure against its own cluster (or ``--metadata``), print, JSON."""
    async with mode_target(args) as target:
        result = await measure_log(target.uri, args)
    result.update(ratios(result))
    if not quiet:
        print_log(result)
    write_json(args.json, result)
    return result


def print_log(result: dict[str, Any]) -> None:
    """One table: ledger writes, log appends, appends across rollovers."""
    rows = [
        _row("ledger writes (mean of before and after)", result["ledger"]),
        _row(f"log appends, {result['rollovers']} rollovers", result),
        {**_row("  in flight at a rollover's end", {}), "entries": result["rollover_appends"],
         "p99_ms": result["rollover_p99_ms"], "max_ms": result["rollover_max_ms"]},
        {**_row("  the others", {}), "p99_ms": result["steady_p99_ms"]},
    ]  # fmt: skip
    print_table(
        f"log: {result['entry_size']} B, {result['quorum']}, {result['outstanding']} "
        f"outstanding, rollover every ~{result['rollover_s']:g} s",
        rows,
    )
    print(
        f"ratio_vs_ledger: {result['ratio_vs_ledger']:.3f} (goal >= 0.9); "
        f"ratio_p99_vs_ledger: {result['ratio_p99_vs_ledger']:.3f}; "
        f"ratio_rollover_p99: {result['ratio_rollover_p99'] or float('nan'):.3f}"
    )


def _row(name: str, r: dict[str, Any]) -> dict[str, Any]:
    return {
        "phase": name,
        "entries": r.get("entries"),
        "entries/s": r.get("entries_per_s"),
        "p50_ms": r.get("p50_ms"),
        "p99_ms": r.get("p99_ms"),
        "max_ms": r.get("max_ms"),
    }
