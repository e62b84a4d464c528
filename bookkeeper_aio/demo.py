"""``make run``: a local cluster (etcd + 4 bookie processes) and a demo workload.

One client writes ledgers (E3/WQ3/AQ2) with a progress bar while a second client tails them; half
way through, one bookie of the ensemble is killed with kill -9 and the writer's ensemble change
shows; a third client then recovers (fences and closes) the last ledger as if its writer had
crashed, and the old writer's next append fails as fenced. At the end every acknowledged entry
is read back and compared; the exit status is non-zero if anything acknowledged was lost.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from . import BookKeeper, ClientConfig, LedgerFencedError
from .sandbox import Cluster

CONFIG = ClientConfig(request_timeout_s=3, explicit_lac_interval_s=0.2, long_poll_timeout_ms=1000)


def progress(label: str, done: int, total: int) -> None:
    width = 40
    filled = width * done // total
    end = "\n" if done == total else ""
    print(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end=end, flush=True)


async def tail(bk: BookKeeper, ledger_id: int, seen: dict[int, list[bytes]]) -> None:
    reader = await bk.open_ledger(ledger_id, password=b"demo", recovery=False)
    async for entry in reader.tail(from_entry_id=0):
        seen.setdefault(ledger_id, []).append(entry.payload)


async def run(cluster: Cluster, ledgers: int, entries: int) -> int:
    acked: dict[int, dict[int, bytes]] = {}
    tailed: dict[int, list[bytes]] = {}
    async with (
        BookKeeper.connect(cluster.uri, CONFIG) as writer_bk,
        BookKeeper.connect(cluster.uri, CONFIG) as tail_bk,
        BookKeeper.connect(cluster.uri, CONFIG) as recover_bk,
    ):
        start = time.perf_counter()
        killed = False
        for n in range(ledgers):
            w = await writer_bk.create_ledger(3, 3, 2, password=b"demo")
            print(f"ledger {w.ledger_id}: ensemble {', '.join(w.metadata.ensembles[0][1])}")
            acked[w.ledger_id] = {}
            tailer = asyncio.create_task(tail(tail_bk, w.ledger_id, tailed))
            for i in range(entries):
                payload = f"ledger {n} entry {i}".encode()
                acked[w.ledger_id][await w.append(payload)] = payload
                if (i + 1) % 100 == 0:
                    progress("  writing", i + 1, entries)
                if not killed and n == ledgers // 2 and i == entries // 2:
                    victim = next(
                        b for b in cluster.bookies if b.address in w.metadata.ensembles[-1][1]
                    )
                    print(f"\n  killing bookie {victim.address} (kill -9)")
                    victim.kill()
                    killed = True
            if w.statistics()["ensemble_changes"]:
                print(f"  ensemble change: now {', '.join(w.metadata.last_ensemble()[1])}")
            if n < ledgers - 1:
                await w.close()
                await asyncio.wait_for(tailer, 30)
            else:
                print(f"  writer of ledger {w.ledger_id} 'crashes'; another client recovers it")
                reader = await recover_bk.open_ledger(w.ledger_id, password=b"demo")
                print(f"  recovered and closed at entry {reader.last_add_confirmed}")
                try:
                    await w.append(b"too late")
                except LedgerFencedError:
                    print("  the old writer's next append fails: ledger fenced")
                await asyncio.wait_for(tailer, 30)
        elapsed = time.perf_counter() - start
        lost = await verify(recover_bk, acked, tailed)
    total = sum(len(v) for v in acked.values())
    print(f"summary: {ledgers} ledgers, {total} entries acknowledged in {elapsed:.1f}s; "
          f"tailed {sum(len(v) for v in tailed.values())}; lost {lost}")  # fmt: skip
    return 1 if lost else 0


async def verify(
    bk: BookKeeper, acked: dict[int, dict[int, bytes]], tailed: dict[int, list[bytes]]
) -> int:
    """Read every acknowledged entry back; count the missing or different ones."""
    lost = 0
    for ledger_id, entries in acked.items():
        reader = await bk.open_ledger(ledger_id, password=b"demo")
        got = await reader.read(0, reader.last_add_confirmed)
        lost += sum(1 for e, p in entries.items() if e >= len(got) or got[e].payload != p)
        lost += sum(1 for e, p in enumerate(tailed.get(ledger_id, [])) if got[e].payload != p)
    return lost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bookkeeper_aio.demo", description=__doc__)
    parser.add_argument("--ledgers", type=int, default=3)
    parser.add_argument("--entries", type=int, default=1000)
    parser.add_argument("--bookies", type=int, default=4)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bookkeeper-aio-demo-") as tmp:
        print(f"starting etcd and {args.bookies} bookies under {tmp}")
        with Cluster(Path(tmp), args.bookies) as cluster:
            print(f"metadata URI {cluster.uri}")
            return asyncio.run(run(cluster, args.ledgers, args.entries))


if __name__ == "__main__":
    sys.exit(main())
