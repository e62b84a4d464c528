"""``rereplication``: how fast autorecovery restores WQ after a bookie is lost for good.

    python -m benchmarks rereplication --gib 0.5 --entry-size 262144 --workers 4

Starts etcd and ``--bookies`` bookie processes (default 4), writes closed E3/WQ3/AQ2 ledgers
until the bookie that will be lost holds ``--gib`` GiB, measures the disk's limits in the same
run (a write + fdatasync loop of journal-sized batches on the same disk: what the targets'
journals could do with no protocol at all; and a copy of as many bytes, at most 512 MiB, from
a file the page cache does not hold to another, synced: ``disk.copy_limit``), then kills that
bookie (kill -9) and starts an autorecovery process (``lost_bookie_recovery_delay_s=0``,
``--workers`` marks at once, no rate limit). It reports:

* ``detect_s`` — kill to the first mark (the registration's lease has to expire first);
* ``copy_s`` — first mark to the last ledger back at WQ (no mark left, the lost bookie in no
  ensemble; every copy is then checked on the live bookies, after the clock stopped);
* ``restore_s`` — kill to WQ: the SLA figure;
* ``copy_mb_per_s`` — bytes copied / ``copy_s`` (MiB/s), and its ratios to the disk's
  group-commit limit (``ratio_vs_disk``) and to its copy (``disk_copy_mb_per_s``,
  ``ratio_vs_disk_copy``);
* ``fill_marked_ledgers`` — ledgers the fill itself left marked under-replicated (should be 0:
  otherwise the first mark precedes the loss, and the figures above include that work);
* ``written_per_copied`` / ``read_per_copied`` — what the live bookies wrote to and read from
  the disk (``/proc/PID/io``: journals, engines, compactions) from the kill until one
  checkpoint interval after the restore (so that what the copies left in memtables is flushed
  and counted), per byte copied: the targets' write amplification;
* with ``--writer-rate R``: a writer appending 1 KiB entries at R/s (open loop, latency from the
  intended send time) to a new ledger for ``--writer-quiet`` seconds (5) before the kill
  (``writer_quiet_*``) and, on the live bookies (the copies' targets), from the first mark to
  the restore (``writer_copy_*``): what a service writing beside the copy sees, and
  ``writer_p99_ratio_vs_quiet``.

The bookies and the copier share this machine's two cores and one disk: every copied byte is
read from one bookie, sent to another and written to RocksDB there, not to its journal (deferred
sync: synced before the worker relies on it), while the copies' reads and writes share the disk
(what bounds the copy here: docs/performance.md has the profile).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.autorecovery.checker import check_ledger
from bookkeeper_aio.autorecovery.state import process_statistics
from bookkeeper_aio.config import BookieConfig, ClientConfig
from bookkeeper_aio.metadata.underreplication import MARKS_PREFIX
from bookkeeper_aio.sandbox import autorecovery_process

from .cluster import local_cluster
from .disk import copy_limit, group_commit_limit
from .load import open_loop
from .stats import latency_summary, print_table, write_json

MiB = 1 << 20
PASSWORD = b"bench"
DISK_COPY_BYTES_MAX = 512 * MiB


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gib", type=float, default=0.25, help="data the lost bookie holds (GiB)")
    p.add_argument("--entry-size", type=int, default=256 * 1024, metavar="B")
    p.add_argument("--ledgers", type=int, default=8, metavar="L")
    p.add_argument("--bookies", type=int, default=4)
    p.add_argument("--workers", type=int, default=4, help="replication_workers")
    p.add_argument("--in-flight", type=int, default=16, help="replication_entries_in_flight_max")
    p.add_argument("--engine", default="rocksdb", choices=("rocksdb", "files"))
    p.add_argument("--bookie-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a BookieConfig key for the started bookies, repeatable")  # fmt: skip
    p.add_argument("--duration", type=float, default=3.0, metavar="S",
                   help="seconds of the disk-limit measurement")  # fmt: skip
    p.add_argument("--writer-rate", type=float, default=0.0, metavar="R",
                   help="entries/s of a writer beside the copy (0: none)")  # fmt: skip
    p.add_argument("--writer-quiet", type=float, default=5.0, metavar="S",
                   help="seconds of that writer before the kill, its baseline")  # fmt: skip
    p.add_argument("--dir", metavar="DIR", help="where the cluster writes (tmp)")
    p.add_argument("--json", metavar="PATH", help="write the results here")


async def run_rereplication(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-rr-") as tmp:
        root = Path(tmp)
        extra = [a for item in args.bookie_set for a in ("--set", item)]
        # the bookies' journal batch: what one fdatasync of theirs carries at most
        batch = int(_bookie_setting(args.bookie_set, "journal_batch_bytes_max"))
        disk = group_commit_limit(root, batch, args.duration)
        disk_mb_s = disk["fsyncs_per_s"] * disk["batch_bytes"] / MiB
        # what a copy of these bytes (at most DISK_COPY_BYTES_MAX) could do on this disk, in
        # the copier's 1 MiB batches
        size = min(DISK_COPY_BYTES_MAX, int(args.gib * (1 << 30)))
        disk_copy = copy_limit(root, size)["copy_mib_per_s"]
        async with local_cluster(root / "cluster", args.bookies, args.engine, *extra) as cluster:
            result = await _measure(cluster, root, args)
    result["disk_limit_mb_per_s"] = round(disk_mb_s, 1)
    result["ratio_vs_disk"] = round(result["copy_mb_per_s"] / disk_mb_s, 3)
    result["disk_copy_mb_per_s"] = round(disk_copy, 1)
    result["ratio_vs_disk_copy"] = round(result["copy_mb_per_s"] / disk_copy, 3)
    print_table("rereplication (autorecovery after losing a bookie)", [result])
    write_json(args.json, result)
    return result


def _bookie_setting(settings: list[str], name: str) -> float:
    """A numeric BookieConfig key as ``--bookie-set`` gives it, else its default."""
    for item in settings:
        key, _, value = item.partition("=")
        if key.strip() == name:
            return float(value)
    return float(getattr(BookieConfig(), name))


def _io(pids: list[int]) -> tuple[int, int]:
    """Bytes written and read from the disk by these processes so far (every thread)."""
    written = read = 0
    for pid in pids:
        fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        written += int(fields["write_bytes"]) - int(fields["cancelled_write_bytes"])
        read += int(fields["read_bytes"])
    return written, read


async def _measure(cluster: Any, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    victim = cluster.bookies[0]
    # The client's backlog to one bookie stays within what a bookie takes in on a connection
    # (connection_in_flight_bytes_max, 64 MiB): with 128 MiB the bookies refused adds as
    # overloaded, and 9 of 10 ledgers were marked short before the kill (detect_s 0.01 s).
    config = ClientConfig(adds_pending_bytes_max=64 * MiB)
    async with BookKeeper.connect(cluster.uri, config) as bk:
        ids, held = await _fill(bk, victim.address, args)
        fill_marks = await _count_marks(bk)
        if fill_marks:
            print(f"warning: the fill left {fill_marks} ledgers marked under-replicated; "
                  "detect_s and copy_s include them")  # fmt: skip
        quiet = (
            await _foreground(bk, args.writer_rate, args.writer_quiet) if args.writer_rate else []
        )
        victim.kill()
        killed = time.monotonic()
        live = [b.proc.pid for b in cluster.bookies if b is not victim and b.proc is not None]
        io0 = _io(live)
        with _autorecovery(cluster.uri, root, args):
            first_mark = await _until(lambda: _any_mark(bk), killed, 120)
            writer = None
            if args.writer_rate:
                writer = asyncio.create_task(_foreground(bk, args.writer_rate, 900.0))
            try:
                restored = await _until(lambda: _restored(bk, ids, victim.address), killed, 900)
            finally:
                beside = await _stop(writer)
            copied = await _copied(bk)
        await _verify(bk, ids, victim.address)
        settle = _bookie_setting(args.bookie_set, "checkpoint_interval_s") + 1.0
        await asyncio.sleep(max(0.0, restored + settle - time.monotonic()))
        written, read = (after - before for after, before in zip(_io(live), io0, strict=True))
    copy_s = max(restored - first_mark, 1e-6)
    writes = {}
    if args.writer_rate:
        q, c = latency_summary(quiet), latency_summary(beside)
        writes = {
            **{f"writer_quiet_{k}": round(v, 2) for k, v in q.items() if k != "p95_ms"},
            **{f"writer_copy_{k}": round(v, 2) for k, v in c.items() if k != "p95_ms"},
            "writer_p99_ratio_vs_quiet": round(c["p99_ms"] / max(q["p99_ms"], 1e-9), 2),
        }
    return {
        "lost_gib": round(held / (1 << 30), 3),
        "entry_bytes": args.entry_size,
        "ledgers": len(ids),
        "workers": args.workers,
        "detect_s": round(first_mark - killed, 2),
        "copy_s": round(copy_s, 2),
        "restore_s": round(restored - killed, 2),
        "copied_mib": round(copied / MiB, 1),
        "copy_mb_per_s": round(copied / MiB / copy_s, 1),
        "fill_marked_ledgers": fill_marks,
        "written_per_copied": round(written / max(copied, 1), 2),
        "read_per_copied": round(read / max(copied, 1), 2),
        **writes,
    }


async def _fill(bk: BookKeeper, victim: str, args: argparse.Namespace) -> tuple[list[int], int]:
    """Closed ledgers until ``victim`` holds ``--gib`` GiB; their ids and its bytes."""
    payload = os.urandom(args.entry_size)
    target = int(args.gib * (1 << 30))
    ids, held = [], 0
    while held < target:
        w = await bk.create_ledger(3, 3, 2, PASSWORD)
        per_ledger = max(1, target // args.ledgers // args.entry_size)
        pending: list[asyncio.Future[int]] = []
        for _ in range(per_ledger):
            await w.wait_for_room(len(payload))
            pending.append(w.append_nowait(payload))
        await asyncio.gather(*pending)
        await w.close()
        ids.append(w.ledger_id)
        if victim in w.metadata.bookies():
            held += per_ledger * args.entry_size
    return ids, held


async def _foreground(bk: BookKeeper, rate: float, duration_s: float) -> list[float]:
    """Latencies (s) of a writer at ``rate`` 1 KiB entries/s for ``duration_s`` or until
    cancelled (then those of the rounds that finished), on a new E3/WQ3/AQ2 ledger, closed at
    the end."""
    w = await bk.create_ledger(3, 3, 2, PASSWORD)
    payload = os.urandom(1024)
    latencies: list[float] = []
    try:
        while duration_s > 0:  # one-second rounds: a cancellation keeps the finished ones
            step = min(1.0, duration_s)
            result = await open_loop(lambda: w.append_nowait(payload), rate, step, 1000)
            latencies += result.latencies_s
            duration_s -= step
    except asyncio.CancelledError:
        pass
    finally:
        await w.close()
    return latencies


async def _stop(task: asyncio.Task[list[float]] | None) -> list[float]:
    if task is None:
        return []
    task.cancel()
    return await task


def _autorecovery(uri: str, root: Path, args: argparse.Namespace) -> Any:
    sets = ("lost_bookie_recovery_delay_s=0", f"replication_workers={args.workers}",
            f"replication_entries_in_flight_max={args.in_flight}", "audit_interval_s=3600",
            f"replication_rate_bytes_per_s={1 << 40}")  # fmt: skip
    log = root / "autorecovery.log"
    return autorecovery_process(uri, log, sets, "--log-level", "WARNING")


async def _until(predicate: Any, since: float, timeout_s: float) -> float:
    while not await predicate():
        if time.monotonic() - since > timeout_s:
            raise TimeoutError(f"autorecovery did not finish within {timeout_s} s")
        await asyncio.sleep(0.1)  # etcd reads only (see _restored)
    return time.monotonic()


async def _count_marks(bk: BookKeeper) -> int:
    return sum([1 async for _ in bk.ctx.metadata.list_prefix(MARKS_PREFIX)])


async def _any_mark(bk: BookKeeper) -> bool:
    async for _ in bk.ctx.metadata.list_prefix(MARKS_PREFIX):
        return True
    return False


async def _restored(bk: BookKeeper, ids: list[int], victim: str) -> bool:
    """No mark left and the lost bookie in no ensemble. Cheap on purpose (etcd reads only): a
    worker deletes a mark only after its own check found every copy, and listing every
    ledger's entries on every bookie four times a second took a third of the bookies' CPU
    from the copy it measures. :func:`_verify` checks the copies once it is over."""
    if await _any_mark(bk):
        return False
    for lid in ids:
        if victim in (await bk.ctx.metadata.read_ledger(lid)).value.bookies():
            return False
    return True


async def _verify(bk: BookKeeper, ids: list[int], victim: str) -> None:
    """Every entry of every ledger has its WQ copies on live bookies (after the clock stops)."""
    registered = set(await bk.ctx.metadata.list_bookies())
    for lid in ids:
        md = (await bk.ctx.metadata.read_ledger(lid)).value
        check = await check_ledger(bk.ctx, md, registered)
        if victim in md.bookies() or not check.complete:
            raise RuntimeError(f"ledger {lid} is not back at WQ: {check.rows}")


async def _copied(bk: BookKeeper) -> int:
    """Bytes the autorecovery process reports copied (it publishes every second)."""
    await asyncio.sleep(1.5)
    stats = await process_statistics(bk.ctx.metadata)
    return sum(int(s.get("bytes_copied", 0)) for s in stats.values())
