"""``writes``: the client write benchmark, modelled on BookKeeper's BenchThroughputLatency.

    python -m benchmarks writes --duration 10 --outstanding 1000 --entry-size 1024 \\
        --ensemble 3 --write-quorum 3 --ack-quorum 2 --ledgers 1 --json out.json
    python -m benchmarks writes --rate 5000 ...        # open loop at 5000 entries/s
    python -m benchmarks writes --guaranteed-write-quorum ...  # GWQ vs normal (gwq.py)

Opens ``--ledgers`` ledgers through the public client (``BookKeeper.create_ledger``) and adds
``--entry-size`` byte entries round-robin over them with ``append_callback``: a closed loop with
``--outstanding`` adds in flight, or an open loop at ``--rate`` (latency from the intended send
time). Every bookie fdatasyncs before it acknowledges. After a ``--warmup`` the measured phase
lasts ``--duration`` seconds; then the ledgers are closed and deleted. With ``--peers`` (the
default) a 3-member etcd cluster and the disk's group-commit limit are measured afterwards at
the same concurrency and value size, and the results are also given as ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.client.writer import LedgerWriter
from bookkeeper_aio.errors import BookKeeperError

from . import machine
from .cluster import mode_target
from .load import (
    CallbackSend,
    Done,
    GcPauses,
    LoadResult,
    Send,
    closed_loop,
    drive,
    frozen_gc,
    payload_pool,
)
from .options import PASSWORD, add_client_arguments, client_config, quorum_label
from .peers import disk_limits, etcd_fields, etcd_peer, ratios
from .stats import print_table, write_json

CLOSE_TIMEOUT_S = 30.0
ROOM_WAIT_S = 60.0  # a refused add waits this long for room at most (the loads' drain bound)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p)
    p.add_argument(
        "--peers",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure a 3-member etcd and the disk limit (default: on)",
    )
    p.add_argument(
        "--gc-freeze",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="gc.freeze() after the setup, as a latency-sensitive application does after its "
        "start: full collections then skip the objects the setup made (default: on)",
    )
    p.add_argument(
        "--guaranteed-write-quorum",
        action="store_true",
        help="compare guaranteed-write-quorum ledgers with normal ones in the same run, all "
        "bookies healthy and one slow (benchmarks/gwq.py)",
    )
    p.add_argument(
        "--peer-duration",
        type=float,
        default=None,
        metavar="S",
        help="seconds per peer measurement (default: --duration, at most 10)",
    )


async def open_writers(
    bk: BookKeeper, args: argparse.Namespace, count: int | None = None
) -> list[LedgerWriter]:
    """``count`` (default ``--ledgers``) new ledgers with the benchmark's quorums."""
    quorums = (args.ensemble, args.write_quorum, args.ack_quorum)
    count = args.ledgers if count is None else count
    return [await bk.create_ledger(*quorums, password=PASSWORD) for _ in range(count)]


async def close_and_delete(bk: BookKeeper, writers: list[LedgerWriter]) -> None:
    """Close every ledger (bounded), then delete it: a shared cluster keeps no garbage."""
    async with asyncio.timeout(CLOSE_TIMEOUT_S):
        for writer in writers:
            await writer.close()
            await bk.delete_ledger(writer.ledger_id)


def round_robin(writers: list[LedgerWriter], payloads: Sequence[bytes]) -> Send:
    """A ``send`` that appends ``payloads`` in turn to the writers in turn."""
    turn, payload = itertools.cycle(writers), itertools.cycle(payloads)
    return lambda: next(turn).append_nowait(next(payload))


def round_robin_callbacks(writers: list[LedgerWriter], payloads: Sequence[bytes]) -> CallbackSend:
    """:func:`round_robin` through ``append_callback`` (the load's ``callbacks=True``).

    An add the writer refuses (its pending or backlog bound: a bookie beyond the ack quorum
    lagging, a GWQ writer behind a slow bookie) waits for room as ``append()`` does, then
    goes: it stays in flight and its latency counts the wait; ``send`` returns -1 for it.
    (A refused send used to leave the closed loop: a `make bench` of 2026-11-28 lost all 1000
    adds in flight of the GWQ phase that way, and a `writes` run of a client paused by a
    profiler all of its own.)"""
    turn, payload = itertools.cycle(writers), itertools.cycle(payloads)
    waiting: set[asyncio.Task[None]] = set()

    def send(done: Done) -> int:
        writer, data = next(turn), next(payload)
        try:
            return writer.append_callback(data, done)
        except BookKeeperError:
            task = asyncio.ensure_future(_append_when_room(writer, data, done))
            waiting.add(task)
            task.add_done_callback(waiting.discard)
            return -1

    return send


async def _append_when_room(writer: LedgerWriter, payload: bytes, done: Done) -> None:
    """Wait for room in ``writer`` (at most ``ROOM_WAIT_S``), then append; a handle that
    failed or closed meanwhile, or no room in time, fails the add instead."""
    try:
        async with asyncio.timeout(ROOM_WAIT_S):
            await writer.wait_for_room(len(payload))
        writer.append_callback(payload, done)
    except (BookKeeperError, TimeoutError) as exc:
        done(None, exc)


async def measure_writes(
    uri: str, args: argparse.Namespace, bookie_pids: list[int] | None = None
) -> dict[str, Any]:
    """Warm up, then the measured load; return its summary (no peers). ``bookie_pids``: the
    cluster's bookie processes, for their CPU time per entry (machine.CpuPerEntry)."""
    payloads = payload_pool(args.entry_size)
    async with BookKeeper.connect(uri, client_config(args.outstanding, args.entry_size)) as bk:
        writers = await open_writers(bk, args)
        send = round_robin_callbacks(writers, payloads)
        if args.warmup > 0:
            await closed_loop(send, args.outstanding, args.warmup, callbacks=True)
        with frozen_gc(getattr(args, "gc_freeze", True)):
            async with machine.cpu_probe() as probe:
                with GcPauses() as gc_pauses, machine.CpuPerEntry(bookie_pids or []) as cpu:
                    load: LoadResult = await drive(
                        send, args.outstanding, args.duration, args.rate, callbacks=True
                    )
        try:
            await close_and_delete(bk, writers)
        except BookKeeperError as exc:  # a failed handle: the load's errors say why
            load.fail(exc)
    return {
        **describe(args),
        **load.summary(args.entry_size),
        **gc_pauses.summary(),
        **cpu.summary(load.entries),
        "gc_freeze": getattr(args, "gc_freeze", True),
        "cpu_probe_ms": machine.cpu_probe_ms(probe),
    }


def describe(args: argparse.Namespace) -> dict[str, Any]:
    """The run's parameters, for the JSON."""
    return {
        "entry_size": args.entry_size,
        "ensemble": args.ensemble,
        "write_quorum": args.write_quorum,
        "ack_quorum": args.ack_quorum,
        "outstanding": args.outstanding,
        "rate": args.rate,
        "ledgers": args.ledgers,
        "duration_s": args.duration,
    }


async def run_writes(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """The ``writes`` mode: measure, then the peers; print a table; write the JSON."""
    if args.guaranteed_write_quorum:
        from .gwq import run_gwq  # here: gwq imports this module

        return await run_gwq(args, quiet=quiet)
    async with mode_target(args) as tgt:
        result = await measure_writes(tgt.uri, args, [b.proc.pid for b in tgt.bookies if b.proc])
        if args.peers:
            result.update(await measure_peers(tgt.scratch, args, [args.outstanding]))
    result.update(ratios(result))
    if not quiet:
        print_writes(result, args)
    write_json(args.json, result)
    return result


async def measure_peers(
    scratch: Path, args: argparse.Namespace, outstandings: list[int]
) -> dict[str, Any]:
    """etcd at each concurrency (the first one's figures as ``etcd_*``) and the disk limit."""
    duration = args.peer_duration or min(args.duration, 10.0)
    disk = disk_limits(scratch, args.entry_size, min(duration, 3.0))  # before etcd's writes
    etcd = await etcd_peer(scratch, outstandings, duration, args.entry_size)
    fields: dict[str, Any] = etcd_fields(etcd[outstandings[0]])
    fields["etcd_by_outstanding"] = {str(k): v for k, v in etcd.items()}
    return {**fields, **disk}


def print_writes(result: dict[str, Any], args: argparse.Namespace) -> None:
    """One table: our writes, and the peers when measured."""
    load = f"rate {args.rate:g}/s" if args.rate else f"{args.outstanding} outstanding"
    rows = [_row(f"bookkeeper-aio {quorum_label(args)}", result)]
    if "etcd_puts_per_s" in result:
        etcd = result["etcd_by_outstanding"][str(args.outstanding)]
        rows.append(_row(f"etcd 3 members, {args.outstanding} outstanding", etcd))
        rows.append(_row("disk, 1 entry per fdatasync", {
            "entries_per_s": result["disk_fsync_per_s"], "p50_ms": result["disk_fsync_p50_ms"],
            "p99_ms": result["disk_fsync_p99_ms"]}))  # fmt: skip
        rows.append(_row("disk, group commit (limit)", {
            "entries_per_s": result["disk_group_commit_entries_per_s"],
            "p50_ms": result["disk_group_commit_p50_ms"]}))  # fmt: skip
        rows.append(_row("disk, new blocks, 3 streams", {
            "mb_per_s": result["disk_new_blocks_mb_per_s"]}))  # fmt: skip
    print_table(f"writes: {args.entry_size} B entries, {load}, {args.ledgers} ledger(s)", rows)
    if result.get("errors"):
        print(f"errors: {result['errors']} (first: {result['first_error']})")
    for key in ("ratio_vs_etcd", "ratio_p99_vs_etcd", "ratio_vs_disk", "ratio_p50_vs_fsync",
                "ratio_bytes_vs_disk_new_blocks"):  # fmt: skip
        if key in result:
            print(f"{key}: {result[key]:.3f}")
    if "client_cpu_us_per_entry" in result:
        bookies = result.get("bookie_cpu_us_per_entry")
        print(f"cpu per entry: client {result['client_cpu_us_per_entry']:.1f} us"
              + (f", bookies {bookies:.1f} us (all together)" if bookies else ""))  # fmt: skip
    if result.get("cpu_probe_ms"):
        probe = result["cpu_probe_ms"]
        print(f"cpu_probe_ms: {probe:.2f} (lower: a faster CPU; benchmarks/machine.py)")


def _row(name: str, r: dict[str, Any]) -> dict[str, Any]:
    keys = ("entries_per_s", "mb_per_s", "p50_ms", "p95_ms", "p99_ms", "p99_9_ms", "max_ms")
    labels = ("entries/s", "MB/s", "p50_ms", "p95_ms", "p99_ms", "p99.9_ms", "max_ms")
    return {"system": name, **{label: r.get(k) for k, label in zip(keys, labels, strict=True)}}
