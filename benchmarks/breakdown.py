"""``breakdown``: where an add's time goes in the open loop, from timestamps.

    python -m benchmarks breakdown --duration 10          # at half of the peak measured first
    python -m benchmarks breakdown --rate 20000 --ledgers 4

Starts etcd and ``--bookies`` bookie processes with ``trace_dir`` set (bookie/trace.py: each
notes when it handled every add request, queued its journal record, which batch made it
durable, and per batch when its thread took it, wrote it, synced it and the loop ran its
callbacks; its GC pauses; its checkpoints). Then, unless ``--rate`` is given, the closed loop
at ``--outstanding`` for ``--peak-duration`` seconds (the peak); then the open loop at
``--rate`` (default: ``--fraction`` of the peak), noting per add its intended send time, when
the driver sent it, when its writer handed it to each bookie's connection and when it
completed, and the client's GC pauses. The bookies are stopped
(they write their traces) and every add is joined with the bookie whose answer completed its
ack quorum (the AQ-th to answer). ``perf_counter`` is CLOCK_MONOTONIC on Linux: one clock for
every process. An add's latency (from its intended send time) is then the sum of:

=============  ===============================================================================
driver         the open loop sending it late (its own loop busy: completions, GC)
client_queue   the writer holding it: until its end-of-turn flush, or an answer while
               ``add_batches_in_flight_max`` of its requests to that bookie are unanswered
to_bookie      the connection's write (at the end of the turn), the network, the bookie
               reading and decoding it
handle         the bookie's handler: checks, engine put, queuing the journal record
journal_queue  waiting for the journal thread (the batch before it being written and synced)
write          the journal's write of its batch
fsync          the batch's fdatasync
to_loop        journal thread to the event loop, and the batch's earlier callbacks
reply          the bookie handing its answer to the connection
answer         the answer back: network, the client's decoding, in-order completion, callback
=============  ===============================================================================

For all adds and for the slowest 1 % (at or past p99) it reports each phase's mean and its
share of the latency, and which stalls the slow adds overlapped: a GC pause of the client or
of a bookie (by generation), a journal rollover, a checkpoint, an fsync over ``--slow-fsync-ms``.
Tracing costs ~1 µs per add in each process; the figures are for the traced run only.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.client.writer import LedgerWriter

from .cluster import local_cluster
from .load import (
    CallbackSend,
    GcPauses,
    LoadTrace,
    closed_loop,
    frozen_gc,
    open_loop,
    payload_pool,
)
from .options import client_config, quorum_label
from .stats import print_table, timeline, write_json
from .writes import close_and_delete, open_writers, round_robin_callbacks

PHASES = ("driver", "client_queue", "to_bookie", "handle", "journal_queue", "write", "fsync",
          "to_loop", "reply", "answer")  # fmt: skip
Handed = tuple[int, int, int, str, float]  # (ledger id, first and last entry id, bookie, when)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=10.0, metavar="S", help="open loop seconds")
    p.add_argument("--warmup", type=float, default=1.0, metavar="S")
    p.add_argument("--rate", type=float, default=None, metavar="R", help="default: measured")
    p.add_argument("--fraction", type=float, default=0.5, help="of the peak (default 0.5)")
    p.add_argument("--peak-duration", type=float, default=3.0, metavar="S")
    p.add_argument("--outstanding", type=int, default=1000, metavar="N",
                   help="the peak's closed loop; the open loop's cap is 10x")  # fmt: skip
    p.add_argument("--entry-size", type=int, default=1024, metavar="B")
    p.add_argument("--ensemble", type=int, default=3, metavar="E")
    p.add_argument("--write-quorum", type=int, default=3, metavar="W")
    p.add_argument("--ack-quorum", type=int, default=2, metavar="A")
    p.add_argument("--ledgers", type=int, default=1, metavar="L")
    p.add_argument("--bookies", type=int, default=None, metavar="N", help="default: E")
    p.add_argument("--engine", default="rocksdb", choices=("rocksdb", "files", "memory"))
    p.add_argument("--bookie-set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--gc-freeze", action=argparse.BooleanOptionalAction, default=True,
                   help="gc.freeze() before the open loop (as writes; default: on)")  # fmt: skip
    p.add_argument("--slow-fsync-ms", type=float, default=5.0, metavar="MS")
    p.add_argument("--dir", metavar="DIR", help="where the cluster and traces go (tmp)")
    p.add_argument("--json", metavar="PATH")


def trace_handing(writers: list[LedgerWriter]) -> list[Handed]:
    """Note from now on when each writer hands a batch of adds to a bookie's connection
    (``LedgerWriter._send_batch``, wrapped on these writers only: the library keeps no hook
    on its hot path for a benchmark); the list fills as they do."""
    handed: list[Handed] = []
    for writer in writers:
        send_batch = writer._send_batch

        def traced(index: int, ops: list[Any], previous: Any, *, _w: LedgerWriter = writer,
                   _send: Any = send_batch) -> Any:  # fmt: skip
            handed.append((_w.ledger_id, ops[0].entry_id, ops[-1].entry_id, _w._ensemble[index],
                           time.perf_counter()))  # fmt: skip
            return _send(index, ops, previous)

        writer._send_batch = traced  # type: ignore[method-assign]
    return handed


def traced_send(writers: list[LedgerWriter], payloads: Sequence[bytes]) -> CallbackSend:
    """Round-robin ``append_callback`` returning ``(ledger id, entry id)`` for the trace."""
    turn, payload = itertools.cycle(writers), itertools.cycle(payloads)

    def send(done: Any) -> tuple[int, int]:
        writer = next(turn)
        return writer.ledger_id, writer.append_callback(next(payload), done)

    return send


async def measure_breakdown(args: argparse.Namespace) -> dict[str, Any]:
    """Peak (unless ``--rate``), the traced open loop, the bookies' traces; the join."""
    payloads = payload_pool(args.entry_size)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-breakdown-") as tmp:
        traces = Path(tmp) / "traces"
        extra = [a for item in [*args.bookie_set, f"trace_dir={traces}"] for a in ("--set", item)]
        bookies = args.bookies or args.ensemble
        cap = 10 * args.outstanding
        trace, gc_pauses = LoadTrace(), GcPauses()
        root = Path(tmp) / "cluster"
        async with local_cluster(root, bookies, args.engine, *extra) as cluster:  # noqa: SIM117
            async with BookKeeper.connect(cluster.uri, client_config(cap, args.entry_size)) as bk:
                writers = await open_writers(bk, args)
                plain = round_robin_callbacks(writers, payloads)
                if args.warmup > 0:
                    await closed_loop(plain, args.outstanding, args.warmup, callbacks=True)
                peak = None
                if not args.rate:
                    load = await closed_loop(
                        plain, args.outstanding, args.peak_duration, callbacks=True
                    )
                    peak = load.summary(args.entry_size)["entries_per_s"]
                rate = args.rate or max(100.0, round(peak * args.fraction, -2))
                handed = trace_handing(writers)
                with frozen_gc(args.gc_freeze), gc_pauses:
                    load = await open_loop(
                        traced_send(writers, payloads), rate, args.duration, cap,
                        callbacks=True, trace=trace,
                    )  # fmt: skip
                await close_and_delete(bk, writers)
        bookie_traces = {p.stem: json.loads(p.read_text()) for p in sorted(traces.glob("*.json"))}
    joined = join(trace, handed, bookie_traces, args.ack_quorum)
    result: dict[str, Any] = {
        "rate": rate,
        "peak_entries_per_s": peak,
        "ledgers": args.ledgers,
        "entry_size": args.entry_size,
        "bookies": bookies,
        "gc_freeze": args.gc_freeze,
        **load.summary(args.entry_size),
        **gc_pauses.summary(),
        **analyse(joined, gc_pauses.pauses, bookie_traces, args.slow_fsync_ms),
    }
    if peak:
        result["ratio_rate_vs_peak"] = load.summary(args.entry_size)["entries_per_s"] / peak
    return result


def join(
    trace: LoadTrace, handed: list[Handed], bookies: dict[str, Any], ack_quorum: int
) -> list[tuple[float, float, dict[str, float]]]:
    """Per completed add: (intended send time, latency, phase -> seconds), from the bookie
    whose answer completed its ack quorum (and when the writer handed the add to that bookie's
    connection last before the bookie handled it); adds some bookie did not trace are left
    out. ``bookies``: each bookie's trace by its file's stem (bookie/trace.py)."""
    per_entry: dict[tuple[int, int], list[tuple[Any, ...]]] = {}
    for name, data in bookies.items():
        batches = {b[0]: b for b in data["batches"]}
        for lid, first, count, handled, queued, number, answered in data["requests"]:
            batch = batches.get(number)
            if batch is None:
                continue
            _, taken, written, synced, loop, *_ = batch
            times = (handled, queued, taken, written, synced, loop, answered, name)
            for eid in range(first, first + count):
                per_entry.setdefault((lid, eid), []).append(times)
    hands: dict[tuple[int, int, str], list[float]] = {}
    for lid, first, last, bookie, when in handed:
        name = bookie.replace(":", "_").replace("/", "_")  # as the bookie names its trace
        for eid in range(first, last + 1):
            hands.setdefault((lid, eid, name), []).append(when)
    out = []
    for index, done in trace.done:
        key, intended, sent = trace.sent[index]
        answers = sorted(per_entry.get(tuple(key), ()), key=lambda t: t[-2])
        if len(answers) < ack_quorum:
            continue
        handled, queued, taken, written, synced, loop, answered, bookie = answers[ack_quorum - 1]
        # A re-sent add (an ensemble change) was handed more than once: the last before.
        hand_times = [t for t in hands.get((*key, bookie), ()) if sent <= t <= handled]
        if not hand_times:
            continue
        marks = (intended, sent, max(hand_times), handled, queued, taken, written, synced, loop,
                 answered, done)  # fmt: skip
        phases = {name: b - a for name, a, b in zip(PHASES, marks[:-1], marks[1:], strict=True)}
        out.append((intended, done - intended, phases))
    return out


def analyse(
    joined: list[tuple[float, float, dict[str, float]]],
    client_gc: list[tuple[float, float, int]],
    bookies: dict[str, Any],
    slow_fsync_ms: float,
) -> dict[str, Any]:
    """Phase means and shares for all adds and the slowest 1 %; the stalls the slow ones
    overlapped."""
    if not joined:
        return {"joined": 0}
    latencies = sorted(lat for _, lat, _ in joined)
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))]
    slow = [j for j in joined if j[1] >= p99]
    stalls: dict[str, list[tuple[float, float]]] = {
        "client_gc_gen0": [], "client_gc_gen1": [], "client_gc_gen2": [],
        "bookie_gc_gen2": [], "bookie_gc_gen01": [], "journal_rollover": [],
        "checkpoint": [], "slow_fsync": [],
    }  # fmt: skip
    for start, end, gen in client_gc:
        stalls[f"client_gc_gen{gen}"].append((start, end))
    for data in bookies.values():
        for start, end, gen in data["gc_pauses"]:
            stalls["bookie_gc_gen2" if gen == 2 else "bookie_gc_gen01"].append((start, end))
        for _, taken, written, synced, _, _, _, rolled in data["batches"]:
            if rolled:
                stalls["journal_rollover"].append((taken, synced))
            if synced - written > slow_fsync_ms / 1000:
                stalls["slow_fsync"].append((written, synced))
        stalls["checkpoint"] += [tuple(c) for c in data["checkpoints"]]
    overlapped = {}
    for name, spans in stalls.items():
        spans.sort()
        starts = [s for s, _ in spans]
        hit = sum(_overlaps(spans, starts, t0, t0 + lat) for t0, lat, _ in slow)
        overlapped[name] = {"count": len(spans), "total_ms": 1000 * sum(e - s for s, e in spans),
                            "slow_adds_overlapping": hit / len(slow)}  # fmt: skip
    return {
        "joined": len(joined),
        "p99_ms_joined": p99 * 1000,
        "phases_all_ms": _phase_means(joined),
        "phases_slow_ms": _phase_means(slow),
        "phases_slow_share": _shares(slow),
        "stalls": overlapped,
        "timeline_slow": timeline(
            [lat for _, lat, _ in slow],
            [t + lat for t, lat, _ in slow],
            min(t for t, _, _ in joined),
        ),
    }


def _overlaps(spans: list[tuple[float, float]], starts: list[float], a: float, b: float) -> bool:
    i = bisect.bisect_right(starts, b)  # spans starting after b cannot overlap
    return any(end >= a for _, end in spans[max(0, i - 64) : i])


def _phase_means(rows: list[tuple[float, float, dict[str, float]]]) -> dict[str, float]:
    return {name: 1000 * statistics.fmean(r[2][name] for r in rows) for name in PHASES}


def _shares(rows: list[tuple[float, float, dict[str, float]]]) -> dict[str, float]:
    total = sum(r[1] for r in rows)
    return {name: sum(r[2][name] for r in rows) / total for name in PHASES}


async def run_breakdown(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """The ``breakdown`` mode: measure, print the phases and the stalls, write the JSON."""
    result = await measure_breakdown(args)
    if not quiet:
        print_breakdown(result, args)
    write_json(args.json, result)
    return result


def print_breakdown(result: dict[str, Any], args: argparse.Namespace) -> None:
    """Two tables: phases (all adds, the slowest 1 %), stalls the slow adds overlapped."""
    peak = result["peak_entries_per_s"]
    title = (
        f"breakdown: open loop at {result['rate']:,.0f}/s"
        + (f" ({args.fraction:g} of a {peak:,.0f}/s peak)" if peak else "")
        + f", {quorum_label(args)}, {args.ledgers} ledger(s): {result['entries_per_s']:,.0f}/s,"
        f" p50 {result['p50_ms']:.2f} ms, p99 {result['p99_ms']:.2f} ms,"
        f" p99.9 {result['p99_9_ms']:.2f} ms; {result.get('joined', 0)} adds joined"
    )
    if not result.get("joined"):
        print(title + " (none: no bookie traces)")
        return
    rows = [{
        "phase": name, "mean_ms (all)": result["phases_all_ms"][name],
        "mean_ms (>= p99)": result["phases_slow_ms"][name],
        "share of >= p99": result["phases_slow_share"][name],
    } for name in PHASES]  # fmt: skip
    print_table(title, rows)
    rows = [{"stall": name, "count": s["count"], "total_ms": s["total_ms"],
             "share of >= p99 adds overlapping": s["slow_adds_overlapping"]}
            for name, s in result["stalls"].items()]  # fmt: skip
    print_table("stalls during the run (an add >= p99 may overlap several)", rows)
