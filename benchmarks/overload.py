"""``overload``: memory of a writer that pushes faster than the bookies can sync.

    python -m benchmarks overload --duration 20 --writers 4 --entry-size 65536

``--writers`` tasks each push entries into their own ledger as fast as they can, without waiting
for acknowledgements (``append_nowait``), held back only by the client's backpressure:
``wait_for_room`` waits while ``adds_pending_max`` entries or ``adds_pending_bytes_max``
payload bytes (``--pending-bytes``) are pending on that writer. Client and bookie resident set
sizes are sampled every 0.2 s. The documented bound for the client is its RSS before the load
plus, per writer, the pending payloads held for a retry plus one copy per bookie in the
write quorum on its way to the socket: ``base + writers * (1 + WQ) * pending_bytes``. The
bookie's is ``connection_in_flight_bytes_max`` per connection plus ``journal_queue_bytes_max``
plus the engine's buffers; the figures show how far below those the run stays.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from bookkeeper_aio import BookKeeper

from .cluster import target
from .options import PASSWORD, client_config
from .stats import print_table, write_json

MiB = 1 << 20
SAMPLE_S = 0.2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=20.0, metavar="S")
    p.add_argument("--writers", type=int, default=4, metavar="N", help="ledgers, one task each")
    p.add_argument("--entry-size", type=int, default=64 * 1024, metavar="B")
    p.add_argument("--pending-bytes", type=int, default=16 * MiB, metavar="B",
                   help="adds_pending_bytes_max per writer")  # fmt: skip
    p.add_argument("--ensemble", type=int, default=3, metavar="E")
    p.add_argument("--write-quorum", type=int, default=3, metavar="W")
    p.add_argument("--ack-quorum", type=int, default=2, metavar="A")
    p.add_argument("--engine", default="rocksdb", choices=("rocksdb", "files", "memory"))
    p.add_argument("--dir", metavar="DIR", help="where started servers write (tmp)")
    p.add_argument("--json", metavar="PATH", help="write the results here")


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size of a process (Linux /proc)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def run_overload(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """The ``overload`` mode: print a table, write the JSON, return the result."""
    bookies = args.ensemble
    async with target(None, args.dir, bookies, args.engine) as tgt:
        pids = [b.proc.pid for b in tgt.bookies if b.proc is not None]
        config = client_config(1000, adds_pending_bytes_max=args.pending_bytes)
        async with BookKeeper.connect(tgt.uri, config) as bk:
            quorums = (args.ensemble, args.write_quorum, args.ack_quorum)
            writers = [await bk.create_ledger(*quorums, password=PASSWORD)
                       for _ in range(args.writers)]  # fmt: skip
            base = rss_bytes()
            bookie_base = max(rss_bytes(p) for p in pids)
            payload = os.urandom(args.entry_size)
            written = [0] * len(writers)
            stop = time.monotonic() + args.duration

            async def write(i: int) -> None:
                w = writers[i]

                def acked(f: asyncio.Future[int]) -> None:
                    if not f.cancelled() and f.exception() is None:
                        written[i] += 1

                while time.monotonic() < stop:
                    await w.wait_for_room(len(payload))
                    w.append_nowait(payload).add_done_callback(acked)

            client_peak, bookie_peak, pending_peak = base, bookie_base, 0
            tasks = [asyncio.create_task(write(i)) for i in range(len(writers))]
            start = time.monotonic()
            try:
                while not all(t.done() for t in tasks):
                    await asyncio.sleep(SAMPLE_S)
                    client_peak = max(client_peak, rss_bytes())
                    bookie_peak = max(bookie_peak, *(rss_bytes(p) for p in pids))
                    pending = sum(w.statistics()["pending_bytes"] for w in writers)
                    pending_peak = max(pending_peak, pending)
                await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
            elapsed = time.monotonic() - start
            for w in writers:
                await w.close()
    entries = sum(written)
    bound = base + args.writers * (1 + args.write_quorum) * args.pending_bytes
    result = {
        "entries_per_s": entries / elapsed,
        "mb_per_s": entries * args.entry_size / elapsed / 1e6,
        "client_rss_base_mib": base / MiB,
        "client_rss_max_mib": client_peak / MiB,
        "client_rss_bound_mib": bound / MiB,
        "client_pending_bytes_max_mib": pending_peak / MiB,
        "bookie_rss_base_mib": bookie_base / MiB,
        "bookie_rss_max_mib": bookie_peak / MiB,
        "within_bound": client_peak <= bound,
    }
    if not quiet:
        title = (f"overload: {args.writers} writers x {args.entry_size} B entries, "
                 f"adds_pending_bytes_max {args.pending_bytes // MiB} MiB")  # fmt: skip
        rows = [{"what": k, "value": round(v, 1) if isinstance(v, float) else v}
                for k, v in result.items()]  # fmt: skip
        print_table(title, rows)
    write_json(args.json, result)
    return result
