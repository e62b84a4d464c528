"""Deletes and garbage collection against a real etcd and real bookie processes (BP-31 "Delete
Discipline", docs/durability.md): disk really freed on both engines, orphans kept and
reported, the archival option, and the delete path's bad input."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from bookkeeper_aio import (
    BookKeeper,
    IncorrectParameterError,
    LedgerNotArchivedError,
    LedgerOfLogError,
    NoSuchLedgerError,
)
from bookkeeper_aio.config import ClientConfig
from bookkeeper_aio.metadata.store import open_metadata_store
from bookkeeper_aio.metadata.tombstones import GC_BOOKIES_PREFIX, read_tombstone
from bookkeeper_aio.sandbox import BookieProcess, wait_registered
from tests.test_bookie_process import read_back

pytestmark = pytest.mark.process

PASSWORD = b"gc"
CLIENT = ClientConfig(request_timeout_s=20)
ENTRY = 4096
ENTRIES = 100  # 400 KiB per ledger and bookie


def _bookies(root: Path, uri: str, engine: str) -> list[BookieProcess]:
    flags = ("--metadata", uri, "--set", "lease_ttl_s=2", "--set", "gc_interval_s=0.5",
             "--set", "checkpoint_interval_s=0.5", "--log-level", "INFO")  # fmt: skip
    return [BookieProcess(root / f"b{i}", engine, *flags) for i in range(3)]


@asynccontextmanager
async def _cluster(root: Path, uri: str, engine: str) -> AsyncIterator[list[BookieProcess]]:
    async with open_metadata_store(uri) as store:
        await store.init_cluster()
    procs = _bookies(root, uri, engine)
    try:
        for p in procs:
            p.start()
        await wait_registered(uri, len(procs))
        yield procs
    finally:
        for p in procs:
            p.stop()


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def _write(bk: BookKeeper, count: int) -> dict[int, dict[int, bytes]]:
    written: dict[int, dict[int, bytes]] = {}
    for _ in range(count):
        w = await bk.create_ledger(3, 3, 2, PASSWORD)
        entries = {}
        for i in range(ENTRIES):
            entries[i] = os.urandom(ENTRY)
        await asyncio.gather(*(w.append(p) for p in entries.values()))
        await w.close()
        written[w.ledger_id] = entries
    return written


async def _wait_for(
    predicate: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 60.0
) -> None:
    """Poll a condition with a deadline (the bookies' GC is another process: no event)."""
    try:
        async with asyncio.timeout(timeout_s):
            while not await predicate():  # noqa: ASYNC110
                await asyncio.sleep(0.2)
    except TimeoutError:
        raise AssertionError(what) from None


async def _passes_after(uri: str, procs: list[BookieProcess], passes: int = 2) -> None:
    """Wait until every bookie has recorded ``passes`` more GC passes."""
    async with open_metadata_store(uri) as store:

        async def versions() -> list[int]:
            found = [await store.get(GC_BOOKIES_PREFIX + p.address) for p in procs]
            return [v.version if v else 0 for v in found]

        start = await versions()
        for _ in range(passes):
            seen = await versions()

            async def moved(seen: list[int] = seen) -> bool:
                return all(n > s for n, s in zip(await versions(), seen, strict=True))

            await _wait_for(moved, "every bookie ran a GC pass")
        assert all(n > s for n, s in zip(await versions(), start, strict=True))


@pytest.mark.parametrize("engine", ["rocksdb", "files"])
async def test_deleted_ledgers_free_their_disk_and_the_rest_read_back(tmp_path, etcd_uri, engine):
    async with (
        _cluster(tmp_path, etcd_uri, engine) as procs,
        BookKeeper.connect(etcd_uri, CLIENT) as bk,
    ):
        written = await _write(bk, 20)
        dirs = [p.root / "ledgers" for p in procs]
        await _passes_after(etcd_uri, procs)  # checkpointed: the data is in the engines
        before = [_dir_bytes(d) for d in dirs]
        data = 20 * ENTRIES * ENTRY
        assert all(b >= data for b in before), (before, data)
        doomed, kept = sorted(written)[:18], sorted(written)[18:]
        for ledger_id in doomed:
            await bk.delete_ledger(ledger_id)

        async def shrunk() -> bool:
            # the deleted share (18/20) gone, give or take a tenth of what was there
            return all(
                _dir_bytes(d) <= b * (2 / 20 + 0.1) for d, b in zip(dirs, before, strict=True)
            )

        await _wait_for(shrunk, f"ledger dirs shrink by 18/20: {before}")
        for ledger_id in kept:
            reader = await bk.open_ledger(ledger_id, PASSWORD)
            got = [e.payload for e in await reader.read(0, ENTRIES - 1)]
            assert got == [written[ledger_id][i] for i in range(ENTRIES)]
        async with open_metadata_store(etcd_uri) as store:

            async def tombstones_gone() -> bool:
                return all([await read_tombstone(store, i) is None for i in doomed])

            await _wait_for(tombstones_gone, "every bookie confirmed: tombstones removed")
        shell = _shell(etcd_uri, "list-tombstones")
        assert shell.returncode == 0 and shell.stdout.strip() == "no tombstones"


def _shell(uri: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bookkeeper_aio.shell", "--metadata", uri, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


async def test_orphans_are_kept_and_reported_archival_and_bad_deletes(tmp_path, etcd_uri):
    async with (
        _cluster(tmp_path, etcd_uri, "rocksdb") as procs,
        BookKeeper.connect(etcd_uri, CLIENT) as bk,
    ):
        written = await _write(bk, 2)
        orphan, other = sorted(written)
        async with open_metadata_store(etcd_uri) as store:
            await store.delete_ledger(orphan)  # the etcd key removed by hand
        await _passes_after(etcd_uri, procs)
        for p in procs:  # kept: every entry still there, byte for byte
            await read_back(p.address, orphan, written[orphan])
            log = p.log.read_text()
            assert "orphans, kept, never deleted" in log and str(orphan) in log

        # Deleting twice: the second names the first.
        await bk.delete_ledger(other)
        with pytest.raises(NoSuchLedgerError, match="already deleted"):
            await bk.delete_ledger(other)
        with pytest.raises(NoSuchLedgerError, match="no metadata"):
            await bk.delete_ledger(orphan)

        # Archival required: an unarchived delete is refused and nothing changes.
        out = _shell(etcd_uri, "cluster-config", "require-archival-before-delete", "true")
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["require-archival-before-delete"] is True
        (kept,) = await _write(bk, 1)
        before = await bk.ctx.metadata.read_ledger(kept)
        with pytest.raises(LedgerNotArchivedError, match="not archived"):
            await bk.delete_ledger(kept)
        assert await bk.ctx.metadata.read_ledger(kept) == before
        assert await read_tombstone(bk.ctx.metadata, kept) is None
        await bk.mark_archived(kept)
        await bk.delete_ledger(kept)
        assert await read_tombstone(bk.ctx.metadata, kept) is not None
        out = _shell(etcd_uri, "cluster-config", "require-archival-before-delete", "maybe")
        assert out.returncode == 1 and "true or false" in out.stderr
        out = _shell(etcd_uri, "cluster-config", "require-archival-before-delete", "false")
        assert out.returncode == 0, out.stderr

        # An open ledger cannot be archived.
        w = await bk.create_ledger(3, 3, 2, PASSWORD)
        with pytest.raises(IncorrectParameterError, match="only a closed ledger"):
            await bk.mark_archived(w.ledger_id)
        await w.close()

        # A log's ledger: refused, the log keeps it.
        await bk.create_log("orders")
        async with bk.open_log_writer("orders") as lw:
            await lw.append(b"one")
        (segment,) = (await bk.log_info("orders")).segments
        with pytest.raises(LedgerOfLogError, match=r"belongs to log 'orders'.*truncate"):
            await bk.delete_ledger(segment.ledger_id)
        out = _shell(etcd_uri, "delete-ledger", str(segment.ledger_id))
        assert out.returncode == 1 and "belongs to log" in out.stderr
        assert [r.payload for r in await bk.read_log("orders")] == [b"one"]
        await bk.delete_log("orders")  # the log's own path deletes it
        assert await read_tombstone(bk.ctx.metadata, segment.ledger_id) is not None


async def test_a_bookie_away_longer_than_the_ttl_keeps_what_it_cannot_check(tmp_path, etcd_uri):
    """The tombstone expires while a bookie is down; back, it cannot tell the ledger from
    an orphan: it keeps it and says why (BP-31: decommission it and add it as new)."""
    async with open_metadata_store(etcd_uri) as store:
        await store.init_cluster()
    flags = ("--metadata", etcd_uri, "--set", "lease_ttl_s=2", "--set", "gc_interval_s=0.3",
             "--set", "checkpoint_interval_s=0.5", "--set", "tombstone_ttl_s=3")  # fmt: skip
    procs = [BookieProcess(tmp_path / f"b{i}", "rocksdb", *flags) for i in range(3)]
    try:
        for p in procs:
            p.start()
        await wait_registered(etcd_uri, 3)
        async with BookKeeper.connect(etcd_uri, CLIENT) as bk:
            written = await _write(bk, 1)
            (ledger_id,) = written
            await _passes_after(etcd_uri, procs)
            away = procs[0]
            assert away.stop() == 0
            await bk.delete_ledger(ledger_id)
            async with open_metadata_store(etcd_uri) as store:

                async def expired() -> bool:  # the others confirmed; the TTL removed it
                    return await read_tombstone(store, ledger_id) is None

                await _wait_for(expired, "the tombstone expired")
            away.start()
            await _passes_after(etcd_uri, procs)
            await read_back(away.address, ledger_id, written[ledger_id])  # kept
            log = away.log.read_text()
            assert "longer than tombstone_ttl_s" in log and "cannot check" in log
            assert str(ledger_id) in log.split("longer than tombstone_ttl_s", 1)[1]
    finally:
        for p in procs:
            p.stop()
