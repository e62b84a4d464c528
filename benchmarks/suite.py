"""``all``: every benchmark once, then one table (what ``make bench`` runs with ``--short``).

Order: the disk's limits (first, while nothing of ours is being written back), the floor (one
add at a time through minimal servers: the baseline of the 1-outstanding row), one bookie,
journal on/off, then one local cluster (etcd + 3 bookies) for the client benchmarks (writes at
1, 128 and 1000 outstanding and an open loop at half the closed-loop rate, tail, reads,
recovery of 10 ledgers and of one ledger's 10,000 unconfirmed entries, log appends with
rollovers against ledger writes), then the floor's open loop at the same rate (the baseline of
the open-loop row: a journal thread, and inline), then a fresh cluster for writes to 100
ledgers at once (1000 outstanding), then the cost of metrics and of TLS (``ops``: three
clusters written to in turn), then the 3-member etcd peer at the same concurrencies.
``--short`` gives each measured phase 5 s (the whole run takes about four minutes on a 2-vCPU
machine); without it, 30 s.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from . import bookie, floor, gwq, journal, logs, ops, overload, reads, recovery, tail, writes
from .cluster import local_cluster
from .peers import disk_limits, etcd_fields, etcd_peer, ratios
from .stats import print_table, write_json

WRITE_OUTSTANDINGS = (1, 128, 1000)
MANY_LEDGERS = 100  # written at once, as a bookie behind many topics sees them
RECOVERY_TAIL_ENTRIES = 10_000  # unconfirmed entries at a ledger's tail (issue 32's goal)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--short", action="store_true", help="5 s per measured phase (make bench)")
    p.add_argument("--dir", metavar="DIR", help="where servers and baselines write (tmp)")
    p.add_argument("--json", metavar="PATH")


def mode_args(module: ModuleType, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` with ``module``'s own options (so defaults stay in one place)."""
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(argv)


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Run everything; print one table; return (and write) every result."""
    started = time.perf_counter()
    d = "5" if args.short else "30"
    common = ["--duration", d, "--dir", args.dir] if args.dir else ["--duration", d]
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-all-") as tmp:
        scratch = Path(tmp)
        disk = disk_limits(scratch, 1024, 2.0)  # first: nothing of ours is being written back
        adds = "2000" if args.short else "10000"  # ~1 s and ~4 s at ~0.35 ms an add
        argv = ["--adds", adds, "--dir", tmp]
        results["floor"] = await floor.run_floor(mode_args(floor, argv), quiet=True)
        results["bookie"] = await bookie.run_bookie_bench(mode_args(bookie, common), quiet=True)
        results["journal"] = await journal.run_journal(mode_args(journal, common), quiet=True)
        async with local_cluster(scratch / "cluster", 3) as cluster:
            results.update(await _client_benchmarks(cluster.uri, common))
            argv = [*common, "--outstanding", "1000", "--guaranteed-write-quorum"]
            results["gwq"] = await gwq.measure_gwq(
                cluster.uri, cluster.bookies, mode_args(writes, argv)
            )
        # The open loop's floor at its rate, with the journal thread and inline (the cluster
        # is stopped: its bookies' background writes would share the disk's syncs).
        rate = results["writes_rate"]["rate"]
        for key, flags in (("floor_open", []), ("floor_open_inline", ["--inline"])):
            argv = ["--rate", str(rate), "--duration", d, "--dir", tmp, *flags]
            results[key] = await floor.run_floor(mode_args(floor, argv), quiet=True)
        # A fresh cluster: the phases above leave RocksDB compactions behind them.
        async with local_cluster(scratch / "many", 3) as cluster:
            argv = [*common, "--outstanding", "1000", "--ledgers", str(MANY_LEDGERS)]
            many = await writes.measure_writes(cluster.uri, mode_args(writes, argv))
            results["writes_many"] = many
        # What metrics (scraped every second) and TLS cost the 1000-outstanding writes.
        argv = [*common, "--rounds", "2", "--warmup", "1"]
        results["ops"] = await ops.measure_ops(scratch / "ops", mode_args(ops, argv))
        etcd = await etcd_peer(scratch, list(WRITE_OUTSTANDINGS), float(d), 1024)
        results["overload"] = await overload.run_overload(mode_args(overload, common), quiet=True)
    # The one-add floor is the 1-outstanding row's baseline, the open-loop floor the open loop's.
    results["writes_c1"]["floor_p50_ms"] = results["floor"]["p50_ms"]
    r = results["writes_rate"]
    r["floor_open_p99_ms"] = results["floor_open"]["p99_ms"]
    r["floor_open_inline_p99_ms"] = results["floor_open_inline"]["p99_ms"]
    r.update(ratios(r))
    for n in WRITE_OUTSTANDINGS:
        r = results[f"writes_c{n}"]
        r.update(etcd_fields(etcd[n]))
        r.update(disk)
        r.update(ratios(r))
    results["etcd"] = {str(n): v for n, v in etcd.items()}
    results["disk"] = disk
    results["elapsed_s"] = time.perf_counter() - started
    results["python"] = interpreter()
    print_summary(results, args.short)
    write_json(args.json, results)
    return results


async def _client_benchmarks(uri: str, common: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in WRITE_OUTSTANDINGS:
        argv = [*common, "--outstanding", str(n)]
        out[f"writes_c{n}"] = await writes.measure_writes(uri, mode_args(writes, argv))
    rate = max(100, round(out["writes_c1000"]["entries_per_s"] / 2, -2))
    argv = [*common, "--rate", str(rate), "--outstanding", "10000"]
    out["writes_rate"] = await writes.measure_writes(uri, mode_args(writes, argv))
    out["tail"] = await tail.measure_tail(uri, mode_args(tail, [*common, "--rate", "1000"]))
    argv = [*common, "--entries", "20000"]
    out["reads_batch100"] = await reads.measure_reads(uri, mode_args(reads, argv))
    argv = [*argv, "--batch", "1", "--outstanding", "100"]
    out["reads_c100"] = await reads.measure_reads(uri, mode_args(reads, argv))
    argv = ["--ledgers", "10", "--entries", "2000", "--outstanding", "1000"]
    out["recovery"] = await recovery.measure_recovery(uri, mode_args(recovery, argv))
    argv = ["--ledgers", "1", "--entries", "0", "--tail-entries", str(RECOVERY_TAIL_ENTRIES)]
    out["recovery_tail"] = await recovery.measure_recovery(uri, mode_args(recovery, argv))
    log = await logs.measure_log(uri, mode_args(logs, [*common, "--outstanding", "1000"]))
    out["log"] = {**log, **logs.ratios(log)}
    return out


def interpreter() -> str:
    """This Python's version and executable: its build moves every figure (Makefile,
    docs/performance.md at e27bdd3, thirteenth round)."""
    return f"{platform.python_version()} {os.path.realpath(sys.executable)}"


def print_summary(results: dict[str, Any], short: bool) -> None:
    """The one table: every benchmark, the peers, the ratios."""
    rows = [
        _row("bookie: 1 add in flight", results["bookie"]["sequential"], "1 bookie, no client"),
        _row("bookie: 1000 adds in flight", results["bookie"]["pipelined"], "1 bookie"),
    ]
    for key, label in (("journal_on", "journal on"), ("journal_off", "journal off (BP-46)")):
        r = results["journal"][key]
        rows.append(_row(f"bookie, {label}", r, f"{r['disk_bytes_per_entry']:,.0f} disk B/entry"))
    for n in WRITE_OUTSTANDINGS:
        r = results[f"writes_c{n}"]
        note = f"x{r['ratio_vs_etcd']:.2f} etcd rate, x{r['ratio_p99_vs_etcd']:.2f} etcd p99"
        if "ratio_p50_vs_floor" in r:
            note += f", x{r['ratio_p50_vs_floor']:.2f} floor p50"
        if n == max(WRITE_OUTSTANDINGS) and "ratio_bytes_vs_disk_new_blocks" in r:
            note += f", x{r['ratio_bytes_vs_disk_new_blocks']:.2f} disk new-block bytes"
        rows.append(_row(f"writes E3/WQ3/AQ2, {n} outstanding", r, _with_cpu(note, r)))
    r = results["writes_rate"]
    note = (f"latency from intended send; x{r['ratio_p99_vs_floor_open']:.2f} the floor's p99 "
            f"(x{r['ratio_p99_vs_floor_open_inline']:.2f} inline)")  # fmt: skip
    note = _with_cpu(note, r)
    rows.append(_row(f"writes open loop {r['rate']:g}/s", r, note))
    r = results["writes_many"]
    note = _with_cpu("fresh cluster", r)
    rows.append(_row(f"writes, 1000 outstanding, {r['ledgers']} ledgers", r, note))
    rows += ops.rows(results["ops"])
    for condition, label in (("healthy", "bookies healthy"), ("slow", "1 slow bookie")):
        r, normal = results["gwq"][f"gwq_{condition}"], results["gwq"][f"normal_{condition}"]
        x = results["gwq"][f"ratio_{condition}"]
        note = (f"x{x['entries_per_s'] or 0:.2f} normal rate, x{x['p99_ms'] or 0:.2f} p99; "
                f"pending {r['pending_mib_max']:.1f} MiB (normal "
                f"{normal['pending_mib_max']:.1f})")  # fmt: skip
        rows.append(_row(f"writes GWQ, 1000 outstanding, {label}", r, note))
    r = results["tail"]
    rows.append(_row("tail: append -> tail read", r, f"rate {r['rate']:g}/s"))
    rows.append(_row("reads: 100/call, 1 call", results["reads_batch100"], "latency per call"))
    rows.append(_row("reads: 1/call, 100 calls", results["reads_c100"], ""))
    r = results["recovery"]
    rows.append(_row("recovery: 10 ledgers", r, f"per ledger; {r['entries']} entries read fwd"))
    r = results["recovery_tail"]
    note = (f"x{r['ratio_vs_tail_write']:.2f} the tail's write "
            f"({r['tail_write_p50_ms']:.0f} ms, {r['tail_entries']} in flight)")  # fmt: skip
    rows.append(_row(f"recovery: 1 ledger, {r['tail_entries']} unconfirmed", r, note))
    r = results["log"]
    step = r["ratio_rollover_p99"] or float("nan")
    note = (f"x{r['ratio_vs_ledger']:.2f} ledger rate, x{r['ratio_p99_vs_ledger']:.2f} ledger "
            f"p99; p99 at a rollover x{step:.2f}")  # fmt: skip
    rows.append(_row(f"log appends, 1000 outstanding, {r['rollovers']} rollovers", r, note))
    r = results["overload"]
    client, bound = r["client_rss_max_mib"], r["client_rss_bound_mib"]
    note = f"RSS client {client:.0f} MiB (bound {bound:.0f}), bookie {r['bookie_rss_max_mib']:.0f}"
    rows.append(_row("overload: 4 writers x 64 KiB", r, note))
    for n, r in results["etcd"].items():
        rows.append(_row(f"peer: etcd 3 members, {n} outstanding", r, "aetcd puts"))
    note = "our I/O, no protocol"
    rows.append(_row("peer: floor, 1 add, 3 minimal servers", results["floor"], note))
    for key, how in (("floor_open", "journal thread"), ("floor_open_inline", "inline")):
        r = results[key]
        rows.append(_row(f"peer: floor, open loop {r['rate']:g}/s, {how}", r, note))
    disk = results["disk"]
    rows.append({**_row("peer: disk, 1 entry per fdatasync", {}, ""),
                 "entries/s": disk["disk_fsync_per_s"], "p50_ms": disk["disk_fsync_p50_ms"],
                 "p99_ms": disk["disk_fsync_p99_ms"]})  # fmt: skip
    rows.append({**_row("peer: disk, group commit", {}, "512 KiB per fdatasync"),
                 "entries/s": disk["disk_group_commit_entries_per_s"],
                 "p50_ms": disk["disk_group_commit_p50_ms"]})  # fmt: skip
    rows.append({**_row("peer: disk, new blocks", {}, "3 streams, 512 KiB per fdatasync"),
                 "MB/s": disk["disk_new_blocks_mb_per_s"]})  # fmt: skip
    length = "short (5 s phases)" if short else "30 s phases"
    print_table(f"benchmarks, 1 KiB entries, fdatasync before every ack, {length}", rows)
    print(f"total {results['elapsed_s']:.0f} s; python {results['python']}")


def _with_cpu(note: str, r: dict[str, Any]) -> str:
    """The note and the phase's CPU probe (benchmarks/machine.py): runs differ by a third."""
    return f"{note}, cpu probe {r['cpu_probe_ms']:.2f} ms" if r.get("cpu_probe_ms") else note


def _row(name: str, r: dict[str, Any], note: str) -> dict[str, Any]:
    if r.get("errors"):
        note = f"{note}; {r['errors']} ERRORS".lstrip("; ")
    return {
        "benchmark": name,
        "entries/s": r.get("entries_per_s", r.get("adds_per_s")),
        "MB/s": r.get("mb_per_s"),
        "p50_ms": r.get("p50_ms"),
        "p99_ms": r.get("p99_ms"),
        "p99.9_ms": r.get("p99_9_ms"),
        "max_ms": r.get("max_ms"),
        "note": note,
    }
