"""``misses``: what an engine pays to find that an entry is absent next to a large one.

    python -m benchmarks misses --big-bytes 4194304 --lookups 2000

For each engine (rocksdb with and without its WAL, files) a fresh dir under ``--dir`` gets
ledger 1 with a batch of ten 100-byte entries, entry 10 of ``--big-bytes`` (a batch of one),
entry 12 of 100 bytes (11 is a hole between batches), and ledger 2 with entry 0 written
twice, the second time ``--big-bytes`` (an entry key: a re-send), and entry 2. The engine is
closed and reopened, so every read goes to its files (RocksDB: SSTs, not memtables). Then
``--lookups`` reads of each case are timed on this thread: ids past the last entry (what a
long poll's expiry or a tailer reads), the hole, a miss next to the big entry key, and a
present 100-byte entry as the reference. Figures are µs per lookup; ``bytes_read_per_lookup``
is the process's ``rchar`` (read/pread bytes, page cache hits included) per lookup.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import engines
from bookkeeper_aio.engine import Engine

from .stats import print_table, write_json

CASES = {
    "past the last entry": [(1, 13), (1, 10**6), (2, 3)],
    "hole between batches": [(1, 11)],
    "next to a big entry key": [(2, 1)],
    "present, 100 B": [(1, 5), (2, 2)],
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--big-bytes", type=int, default=4 << 20, metavar="B")
    p.add_argument("--lookups", type=int, default=2000, metavar="N")
    p.add_argument("--dir", metavar="DIR", help="where the engines write (tmp)")
    p.add_argument("--json", metavar="PATH")


def _fill(engine: Engine, big: bytes) -> None:
    small = b"s" * 100
    engine.put_entries(1, [(i, small) for i in range(10)])
    engine.put_entries(1, [(10, big)])
    engine.put_entries(1, [(12, small)])
    engine.put_entries(2, [(0, small)])
    engine.put_entries(2, [(0, big)])
    engine.put_entries(2, [(2, small)])


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def _measure(kind: str, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    name, journaled = (kind.split("-")[0], kind.endswith("nowal"))
    engine = engines.open_engine(name, (str(root),), journaled=journaled)
    _fill(engine, os.urandom(args.big_bytes))
    engine.close()
    engine = engines.open_engine(name, (str(root),), journaled=journaled)
    row: dict[str, Any] = {"engine": kind}
    try:
        for case, ids in CASES.items():
            reads = before = 0
            start = time.perf_counter()
            before = _rchar()
            for _ in range(args.lookups):
                for ledger_id, entry_id in ids:
                    engine.get_entry(ledger_id, entry_id)
                    reads += 1
            elapsed = time.perf_counter() - start
            row[f"{case}_us"] = round(elapsed / reads * 1e6, 2)
            row[f"{case}_bytes"] = (_rchar() - before) // reads
    finally:
        engine.close()
    return row


async def run_misses(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Measure each engine; print one table."""
    base = Path(args.dir or tempfile.mkdtemp(prefix="bk-misses-"))
    rows = [_measure(kind, base / kind, args) for kind in ("rocksdb", "rocksdb-nowal", "files")]
    print_table(f"misses: absent entries next to a {args.big_bytes} B entry, µs per lookup", rows)
    write_json(args.json, {"rows": rows, "big_bytes": args.big_bytes})
    return rows
