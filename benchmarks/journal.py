"""``journal``: one bookie's add throughput and bytes written to disk per entry, with the
journal (``--journal-write-data true``, the default) and without it (BP-46, ``false``), in one
run.

    python -m benchmarks journal --duration 10 --outstanding 1000 --entry-size 1024

Each variant gets a fresh etcd + one bookie (a journal-less bookie needs a metadata store, so
both get one) with ``checkpoint_interval_s=1``. After a one-second warm-up the pipelined add
benchmark of ``python -m benchmarks bookie`` runs for ``--duration``; then the benchmark waits
for the next checkpoint (the engine's sync) so that what the adds left in memory reaches the
files. Bytes written are the bookie process's ``write_bytes`` (less ``cancelled_write_bytes``)
in ``/proc/PID/io`` from before the warm-up to then, per entry added meanwhile: every thread,
RocksDB's included (journal records, any zeros preallocating new journal files,
RocksDB's WAL when there is no journal, memtable flushes and compactions), counted when pages
are dirtied. Memtable flushes or compactions that fall after the window are not
counted; both variants use the same window. (The growth of the bookie's dirs says little: a
checkpoint deletes journal files and a memtable flush deletes RocksDB's WAL.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

from bookkeeper_aio.client.bookie_client import BookieClient
from bookkeeper_aio.config import ClientConfig
from bookkeeper_aio.net import TcpNetwork

from .bookie import _Writer, pipelined
from .cluster import local_cluster
from .load import payload_pool
from .stats import print_table, write_json

CHECKPOINT_INTERVAL_S = 1.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=10.0, metavar="S")
    p.add_argument("--warmup", type=float, default=1.0, metavar="S")
    p.add_argument("--outstanding", type=int, default=1000, metavar="N")
    p.add_argument("--entry-size", type=int, default=1024, metavar="B")
    p.add_argument("--engine", default="rocksdb", choices=("rocksdb", "files", "memory"))
    p.add_argument("--dir", metavar="DIR", help="where the bookies write (tmp)")
    p.add_argument("--json", metavar="PATH")


def process_write_bytes(pid: int) -> int:
    """Bytes ``pid`` caused to be written to storage, less truncated dirty pages."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["write_bytes"]) - int(fields["cancelled_write_bytes"])


async def one_variant(root: Path, journal: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Start a bookie with or without the journal; its throughput and bytes per entry."""
    flags = [
        "--journal-write-data",
        "true" if journal else "false",
        "--set",
        f"checkpoint_interval_s={CHECKPOINT_INTERVAL_S}",
    ]
    async with local_cluster(root, 1, args.engine, *flags) as cluster:
        bookie = cluster.bookies[0]
        assert bookie.proc is not None
        config = ClientConfig(request_timeout_s=60, bookie_requests_in_flight_max=100_000)
        client = await BookieClient.connect(TcpNetwork(), bookie.address, config)
        payloads = payload_pool(args.entry_size)
        try:
            base = int.from_bytes(os.urandom(6), "big") << 8
            # Bytes are counted from before the warm-up: a file written then and deleted while
            # still dirty in the window (a RocksDB WAL after a flush) would count negative.
            io0 = process_write_bytes(bookie.proc.pid)
            warm = await pipelined(_Writer(client, base, payloads), args.outstanding, args.warmup)
            result = await pipelined(
                _Writer(client, base + 1, payloads), args.outstanding, args.duration
            )
            await asyncio.sleep(CHECKPOINT_INTERVAL_S * 1.5)  # the engine syncs what it holds
            io1 = process_write_bytes(bookie.proc.pid)
        finally:
            await client.close()
    entries = max(1, result["entries"])
    return {
        "journal_write_data": journal,
        "entries": entries,
        "entries_per_s": result["adds_per_s"],
        "mb_per_s": result["mb_per_s"],
        "errors": result["errors"],
        "disk_bytes_per_entry": (io1 - io0) / max(1, warm["entries"] + result["entries"]),
        **{k: v for k, v in result.items() if k.endswith("_ms")},
    }


async def run_journal(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """Both variants; a table; the JSON (top-level figures are the journal-on ones)."""
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-journal-") as tmp:
        on = await one_variant(Path(tmp) / "journal-on", True, args)
        off = await one_variant(Path(tmp) / "journal-off", False, args)
    result = {
        **on,
        "entry_size": args.entry_size,
        "outstanding": args.outstanding,
        "journal_on": on,
        "journal_off": off,
        "journal_on_entries_per_s": on["entries_per_s"],
        "journal_off_entries_per_s": off["entries_per_s"],
        "journal_on_bytes_per_entry": on["disk_bytes_per_entry"],
        "journal_off_bytes_per_entry": off["disk_bytes_per_entry"],
        "ratio_entries_per_s_off_vs_on": off["entries_per_s"] / on["entries_per_s"],
        "ratio_bytes_per_entry_off_vs_on": off["disk_bytes_per_entry"]
        / max(on["disk_bytes_per_entry"], 1e-9),
    }
    if not quiet:
        print_journal(result, args)
    write_json(args.json, result)
    return result


def print_journal(result: dict[str, Any], args: argparse.Namespace) -> None:
    """One table: journal on and off side by side."""
    rows = [{
        "journal": "on" if r["journal_write_data"] else "off (BP-46)",
        "entries/s": r["entries_per_s"], "MB/s": r["mb_per_s"],
        "p50_ms": r["p50_ms"], "p99_ms": r["p99_ms"],
        "disk B/entry": r["disk_bytes_per_entry"],
    } for r in (result["journal_on"], result["journal_off"])]  # fmt: skip
    title = f"one bookie, journal on/off: {args.entry_size} B entries, {args.outstanding} in flight"
    print_table(title, rows)
    print(
        f"entries/s off/on: {result['ratio_entries_per_s_off_vs_on']:.2f}   "
        f"disk bytes per entry off/on: {result['ratio_bytes_per_entry_off_vs_on']:.2f}"
    )
