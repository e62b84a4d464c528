"""``writes --guaranteed-write-quorum``: GWQ ledgers against normal ones, in the same run.

    python -m benchmarks writes --guaranteed-write-quorum --duration 5 --outstanding 1000

Phases on one cluster (etcd + the ensemble's bookies, started here unless ``--metadata``):
normal and GWQ ledgers with every bookie healthy, then the same with one bookie of the
ensemble slow — frozen (SIGSTOP) for ``SLOW_STOP_MS`` of every
``SLOW_PERIOD_MS``, as a bookie with long pauses or a saturated disk, never long enough for a
request to time out. Each phase is the ``writes`` load (``append_callback``, closed loop at
``--outstanding`` after ``--warmup``) on fresh ledgers, while the writers' pending payload
bytes are sampled every ``SAMPLE_S``: the client memory GWQ costs (an add stays until WQ
bookies hold it, not AQ). The client's pending and backlog bounds admit
``PENDING_PER_OUTSTANDING`` times ``--outstanding``: behind a bookie slower than the load, a
GWQ writer's pending adds grow until that bound, where an application's ``append()`` waits
for room, and so does the load (``writes.round_robin_callbacks``).
The result gives GWQ / normal ratios per condition (same run, same cluster). Each condition
runs four phases of ``--duration / 2`` in the order normal, GWQ, GWQ, normal, and each mode's
figures are the mean of its two
(``pending_mib_max`` and ``max_ms`` the larger): a cluster slows down over a run (RocksDB
compactions, the VM's slow stretches), and measured in the order normal then GWQ, that
trend alone made GWQ look 36 % slower; the mirrored order cancels a linear trend. With
``--metadata`` there are no bookie processes to slow: the slow phases are skipped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from typing import Any

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.client.writer import LedgerWriter
from bookkeeper_aio.errors import BookKeeperError
from bookkeeper_aio.sandbox import BookieProcess

from . import machine
from .cluster import mode_target
from .load import LoadResult, closed_loop, drive, payload_pool
from .options import PASSWORD, client_config, quorum_label
from .stats import print_table, write_json
from .writes import round_robin_callbacks

SLOW_STOP_MS = 10.0
SLOW_PERIOD_MS = 40.0
SAMPLE_S = 0.01
PENDING_PER_OUTSTANDING = 50  # the client's pending bounds, per add kept in flight
MiB = 1 << 20
PHASES = (("healthy", False), ("healthy", True), ("slow", False), ("slow", True))  # printed
ORDER = (False, True, True, False)  # the modes of one condition's phases (ABBA)


async def run_gwq(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """The mode: four phases on one cluster; print a table; write the JSON."""
    async with mode_target(args) as tgt:
        result = await measure_gwq(tgt.uri, tgt.bookies, args)
    if not quiet:
        print_gwq(result, args)
    write_json(args.json, result)
    return result


async def measure_gwq(
    uri: str, bookies: list[BookieProcess], args: argparse.Namespace
) -> dict[str, Any]:
    """Every phase (see the module docstring); figures per phase and the ratios."""
    result: dict[str, Any] = {"slow_stop_ms": SLOW_STOP_MS, "slow_period_ms": SLOW_PERIOD_MS}
    half = argparse.Namespace(**{**vars(args), "duration": args.duration / 2})
    for condition in ("healthy", "slow"):
        if condition == "slow" and not bookies:
            continue
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for gwq in ORDER:
            slow = _slowed(bookies[0]) if condition == "slow" else contextlib.nullcontext()
            async with slow:
                runs[gwq].append(await _measure(uri, half, gwq))
        for gwq, pair in runs.items():
            result[f"{'gwq' if gwq else 'normal'}_{condition}"] = _mean(pair)
    for condition in ("healthy", "slow"):
        normal, guaranteed = result.get(f"normal_{condition}"), result.get(f"gwq_{condition}")
        if normal and guaranteed:
            result[f"ratio_{condition}"] = _ratios(guaranteed, normal)
    return result


async def _measure(uri: str, args: argparse.Namespace, gwq: bool) -> dict[str, Any]:
    payloads = payload_pool(args.entry_size)
    # A GWQ add stays pending after its acknowledgement until WQ bookies hold it: behind a slow
    # bookie far more than --outstanding are pending, and the slow bookie's backlog grows with
    # them (a `make bench` of 2026-11-27: 1,768 sends refused at the client's 10,000). Room for
    # PENDING_PER_OUTSTANDING times as many, so the phase measures what GWQ holds.
    config = client_config(args.outstanding, args.entry_size)
    room = PENDING_PER_OUTSTANDING * args.outstanding
    room_bytes = room * args.entry_size
    config = config.replace(
        adds_pending_max=max(config.adds_pending_max, room),
        adds_pending_bytes_max=max(config.adds_pending_bytes_max, room_bytes),
        bookie_backlog_bytes_max=max(config.bookie_backlog_bytes_max, room_bytes),
    )
    async with BookKeeper.connect(uri, config) as bk:
        quorums = (args.ensemble, args.write_quorum, args.ack_quorum)
        writers = [
            await bk.create_ledger(*quorums, password=PASSWORD, guaranteed_write_quorum=gwq)
            for _ in range(args.ledgers)
        ]
        send = round_robin_callbacks(writers, payloads)
        if args.warmup > 0:
            await closed_loop(send, args.outstanding, args.warmup, callbacks=True)
        async with machine.cpu_probe() as probe, _pending_sampler(writers) as pending:
            load: LoadResult = await drive(
                send, args.outstanding, args.duration, args.rate, callbacks=True
            )
        try:
            async with asyncio.timeout(30.0):
                for writer in writers:
                    await writer.close()
                    await bk.delete_ledger(writer.ledger_id)
        except BookKeeperError as exc:
            load.fail(exc)
    return {
        "guaranteed_write_quorum": gwq,
        **load.summary(args.entry_size),
        "pending_mib_max": max(pending, default=0) / MiB,
        "pending_mib_mean": sum(pending) / max(len(pending), 1) / MiB,
        "cpu_probe_ms": machine.cpu_probe_ms(probe),
    }


@contextlib.asynccontextmanager
async def _pending_sampler(writers: list[LedgerWriter]) -> AsyncIterator[list[int]]:
    """Sample the writers' pending payload bytes every SAMPLE_S while the block runs."""
    samples: list[int] = []

    async def sample() -> None:
        while True:
            samples.append(sum(w.statistics()["pending_bytes"] for w in writers))
            await asyncio.sleep(SAMPLE_S)

    task = asyncio.create_task(sample())
    try:
        yield samples
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def _slowed(bookie: BookieProcess) -> AsyncIterator[None]:
    """Freeze ``bookie`` SLOW_STOP_MS of every SLOW_PERIOD_MS while the block runs."""

    async def duty_cycle() -> None:
        while True:
            bookie.signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(SLOW_STOP_MS / 1000)
            finally:
                bookie.signal(signal.SIGCONT)  # never left frozen, cancelled or not
            await asyncio.sleep((SLOW_PERIOD_MS - SLOW_STOP_MS) / 1000)

    task = asyncio.create_task(duty_cycle())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's phases as one: means (the larger of maxima; errors added up)."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        values: list[Any] = [r.get(key) for r in runs]
        if type(value) is bool or not all(isinstance(v, int | float) for v in values):
            continue
        if key == "errors":
            out[key] = sum(values)
        elif key.startswith("max") or key.endswith("_max"):
            out[key] = max(values)
        else:
            out[key] = sum(values) / len(values)
    out["phases"] = len(runs)
    return out


def _ratios(gwq: dict[str, Any], normal: dict[str, Any]) -> dict[str, float | None]:
    def ratio(key: str) -> float | None:
        a, b = gwq.get(key), normal.get(key)
        return a / b if a and b else None

    return {
        "entries_per_s": ratio("entries_per_s"),
        "p99_ms": ratio("p99_ms"),
        "pending_mib_max": ratio("pending_mib_max"),
    }


def print_gwq(result: dict[str, Any], args: argparse.Namespace) -> None:
    """One table: a row per phase, then the ratios."""
    rows = []
    for condition, gwq in PHASES:
        r = result.get(f"{'gwq' if gwq else 'normal'}_{condition}")
        if r is None:
            continue
        rows.append({
            "ledgers": f"{'GWQ' if gwq else 'normal'} {quorum_label(args)}",
            "bookies": "1 slow" if condition == "slow" else "healthy",
            "entries/s": r.get("entries_per_s"), "p50_ms": r.get("p50_ms"),
            "p99_ms": r.get("p99_ms"), "pending_MiB_max": r["pending_mib_max"],
            "pending_MiB_mean": r["pending_mib_mean"], "errors": r.get("errors", 0),
        })  # fmt: skip
    slow = f"SIGSTOP {SLOW_STOP_MS:g} ms every {SLOW_PERIOD_MS:g} ms"
    title = (f"writes, GWQ vs normal: {args.entry_size} B entries, {args.outstanding} "
             f"outstanding; slow = {slow}")  # fmt: skip
    print_table(title, rows)
    for condition in ("healthy", "slow"):
        r = result.get(f"ratio_{condition}")
        if r:
            print(f"GWQ / normal, {condition}: " + ", ".join(
                f"{k} x{v:.2f}" for k, v in r.items() if v is not None))  # fmt: skip
