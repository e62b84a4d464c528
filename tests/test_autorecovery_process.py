"""Autorecovery with real processes: etcd, bookie processes in racks, an autorecovery process.

A bookie killed for good is replaced in every ledger (three copies again, racks respected, no
acknowledged entry lost, the open ledger's writer never interrupted); a live bookie is
decommissioned, and its GC then deletes the copies no ensemble names any more; a bookie
formatted again gets its copies back. Short delays and leases keep
each test well under a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.autorecovery.checker import check_ledger
from bookkeeper_aio.autorecovery.state import INCARNATIONS_PREFIX, process_statistics
from bookkeeper_aio.client.reads import request
from bookkeeper_aio.config import ClientConfig
from bookkeeper_aio.errors import StatusCode
from bookkeeper_aio.metadata.store import open_metadata_store
from bookkeeper_aio.protocol import ListEntriesRequest, ListEntriesResponse
from bookkeeper_aio.quorum import write_set
from bookkeeper_aio.sandbox import BookieProcess, autorecovery_process, wait_registered

pytestmark = pytest.mark.process

PASSWORD = b"ar"
CLIENT = ClientConfig(min_racks_per_write_quorum=3)


def _bookie(root: Path, uri: str, rack: str | None, *extra: str) -> BookieProcess:
    flags = ["--metadata", uri, "--set", "lease_ttl_s=2", *extra]
    if rack:
        flags += ["--rack", rack]
    return BookieProcess(root, "rocksdb", *flags)


def _autorecovery(root: Path, uri: str, *settings: str) -> Any:
    every = ("replication_lock_ttl_s=3", "lease_ttl_s=3", *settings)
    return autorecovery_process(uri, root / "autorecovery.log", every)


@contextlib.asynccontextmanager
async def _running(procs: list[BookieProcess], uri: str) -> AsyncIterator[None]:
    """Start the bookies (registered when it returns); kill whatever is left at the end."""
    try:
        for p in procs:
            p.start()
        await wait_registered(uri, len(procs))
        yield
    finally:
        for p in procs:
            p.kill()


def _shell(uri: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bookkeeper_aio.shell", "--metadata", uri, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)


async def _init(uri: str) -> None:
    async with open_metadata_store(uri) as store:
        await store.init_cluster()


async def _write_closed(bk: BookKeeper, count: int, entries: int) -> dict[int, list[bytes]]:
    written = {}
    for _ in range(count):
        w = await bk.create_ledger(3, 3, 2, PASSWORD)
        payloads = [f"{w.ledger_id}:{i}".encode() * 10 for i in range(entries)]
        for p in payloads:
            await w.append(p)
        await w.close()
        written[w.ledger_id] = payloads
    return written


async def _restored(bk: BookKeeper, ids: list[int], without: str | None = None) -> bool:
    """Every ledger complete (every copy there) and, if given, not on ``without``."""
    registered = set(await bk.ctx.metadata.list_bookies())
    for lid in ids:
        md = (await bk.ctx.metadata.read_ledger(lid)).value
        if without is not None and without in md.bookies():
            return False
        if not (await check_ledger(bk.ctx, md, registered)).complete:
            return False
    return True


async def _wait(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.25)


async def _read_back(bk: BookKeeper, written: dict[int, list[bytes]]) -> None:
    for lid, payloads in written.items():
        r = await bk.open_ledger(lid, PASSWORD)
        got = [e.payload for e in await r.read(0, r.last_add_confirmed)] if payloads else []
        assert got == payloads, lid


async def test_a_lost_bookie_is_replaced_in_every_ledger_racks_respected(tmp_path, etcd_uri):
    racks = ["/zone/r0", "/zone/r0", "/zone/r1", "/zone/r1", "/zone/r2"]
    await _init(etcd_uri)
    procs = [_bookie(tmp_path / f"b{i}", etcd_uri, rack) for i, rack in enumerate(racks)]
    rack_of = {p.address: rack for p, rack in zip(procs, racks, strict=True)}
    async with _running(procs, etcd_uri), BookKeeper.connect(etcd_uri, CLIENT) as bk:
        written = await _write_closed(bk, 20, 10)
        live = await bk.create_ledger(3, 3, 2, PASSWORD)
        live_payloads: list[bytes] = []
        stop = asyncio.Event()

        async def keep_writing() -> None:  # any failure fails the test
            while not stop.is_set():
                payload = f"live:{len(live_payloads)}".encode()
                await live.append(payload)
                live_payloads.append(payload)
                await asyncio.sleep(0.02)

        writing = asyncio.create_task(keep_writing())
        settings = ("lost_bookie_recovery_delay_s=1", "open_ledger_rereplication_grace_s=120")
        with _autorecovery(tmp_path, etcd_uri, *settings):
            # A member of the live ledger's ensemble in a rack with a spare bookie: the
            # writer replaces it by itself, autorecovery the rest; three racks remain.
            ensemble = live.metadata.last_ensemble()[1]
            victim = next(p for p in procs if p.address in ensemble
                          and rack_of[p.address] != "/zone/r2")  # fmt: skip
            victim.kill()
            ids = [*written, live.ledger_id]

            async def done() -> bool:
                if writing.done():
                    return True  # the writer failed: reported below
                return await _restored(bk, list(written), without=victim.address) and (
                    victim.address not in (await bk.ctx.metadata.read_ledger(
                        live.ledger_id)).value.bookies()
                )  # fmt: skip

            await _wait(done, 45, f"every ledger off {victim.address}, three copies")
            stop.set()
            await writing  # never interrupted: no exception
            await live.close()
            await _wait(lambda: _restored(bk, ids, without=victim.address), 20, "closed")
            check = _shell(etcd_uri, "ledger-check", str(next(iter(written))))
            assert check.returncode == 0, check.stdout + check.stderr
        written[live.ledger_id] = live_payloads
        await _read_back(bk, written)
        for lid in ids:  # racks: every write set spans three racks (three are left)
            md = (await bk.ctx.metadata.read_ledger(lid)).value
            for _first, ensemble in md.ensembles:
                for e in range(md.ensemble_size):
                    members = [ensemble[i] for i in write_set(e, md.ensemble_size, 3)]
                    assert len({rack_of[b] for b in members}) == 3, (lid, ensemble)


async def test_decommission_of_a_live_bookie_and_of_an_unknown_one(tmp_path, etcd_uri):
    await _init(etcd_uri)
    # The leaving bookie's GC deletes its extra copies once they are a second old.
    gc = ("--set", "gc_interval_s=0.5", "--set", "gc_overreplicated_wait_s=1")
    procs = [_bookie(tmp_path / f"b{i}", etcd_uri, None, *(gc if i == 1 else ()))
             for i in range(4)]  # fmt: skip
    async with _running(procs, etcd_uri), BookKeeper.connect(etcd_uri) as bk:
        written = await _write_closed(bk, 6, 5)
        leaving = procs[1].address
        assert await _held_by(bk, leaving, list(written))  # E3 of 4: it holds some
        with _autorecovery(tmp_path, etcd_uri, "lost_bookie_recovery_delay_s=30"):
            unknown = _shell(etcd_uri, "decommission", "--bookie", "10.9.9.9:1")
            assert unknown.returncode == 1 and "unknown bookie" in unknown.stderr

            async def running() -> bool:  # the autorecovery process has published itself
                return bool(await process_statistics(bk.ctx.metadata))

            await _wait(running, 30, "the autorecovery process runs")
            result = await asyncio.to_thread(
                _shell, etcd_uri, "decommission", "--bookie", leaving, timeout_s=60
            )
            assert result.returncode == 0, result.stdout + result.stderr
            assert "decommissioned" in result.stdout
        assert await _restored(bk, list(written), without=leaving)
        assert await bk.ctx.metadata.get_cookie(leaving) is None
        await _read_back(bk, written)

        async def emptied() -> bool:  # its copies, extra now, deleted by its GC
            return not await _held_by(bk, leaving, list(written))

        await _wait(emptied, 30, "the decommissioned bookie deletes its extra copies")
        await _read_back(bk, written)


async def _held_by(bk: BookKeeper, address: str, ledger_ids: list[int]) -> list[int]:
    """The ledgers of which the bookie at ``address`` lists any entry."""
    held = []
    for lid in ledger_ids:
        answer = await request(bk.ctx, address, ListEntriesRequest, lid, 0, 1_000)
        assert type(answer) is ListEntriesResponse, answer
        if answer.status == StatusCode.OK and answer.ranges:
            held.append(lid)
    return held


async def test_decommission_of_a_dead_bookie_and_without_an_autorecovery_process(
    tmp_path, etcd_uri
):
    await _init(etcd_uri)
    procs = [_bookie(tmp_path / f"b{i}", etcd_uri, None) for i in range(4)]
    async with _running(procs, etcd_uri), BookKeeper.connect(etcd_uri) as bk:
        written = await _write_closed(bk, 5, 4)
        held = {p.address: 0 for p in procs}
        for lid in written:
            for address in (await bk.ctx.metadata.read_ledger(lid)).value.bookies():
                held[address] += 1
        dead = max(procs, key=lambda p: held[p.address])
        dead.kill()
        alone = await asyncio.to_thread(_shell, etcd_uri, "decommission", "--bookie", dead.address)
        assert alone.returncode == 1 and "no autorecovery process is running" in alone.stderr
        assert await bk.ctx.metadata.get_cookie(dead.address) is not None  # nothing done
        # The auditor would not declare it lost for 10 minutes: only the decommission acts.
        with _autorecovery(tmp_path, etcd_uri, "lost_bookie_recovery_delay_s=600"):

            async def running() -> bool:
                return bool(await process_statistics(bk.ctx.metadata))

            await _wait(running, 30, "the autorecovery process runs")
            result = await asyncio.to_thread(
                _shell, etcd_uri, "decommission", "--bookie", dead.address, timeout_s=90
            )
            assert result.returncode == 0, result.stdout + result.stderr
        assert await _restored(bk, list(written), without=dead.address)
        assert await bk.ctx.metadata.get_cookie(dead.address) is None
        await _read_back(bk, written)


async def test_a_bookie_formatted_again_gets_its_copies_back(tmp_path, etcd_uri):
    await _init(etcd_uri)
    procs = [_bookie(tmp_path / f"b{i}", etcd_uri, None) for i in range(3)]
    async with _running(procs, etcd_uri), BookKeeper.connect(etcd_uri) as bk:
        written = await _write_closed(bk, 4, 6)
        with _autorecovery(tmp_path, etcd_uri, "lost_bookie_recovery_delay_s=60"):
            target = procs[0]

            async def recorded() -> bool:  # the auditor records the incarnations it sees
                key = INCARNATIONS_PREFIX + target.address
                return await bk.ctx.metadata.get(key) is not None

            await _wait(recorded, 30, "the auditor records the bookie's incarnation")
            target.kill()
            lid = next(iter(written))
            short = await asyncio.to_thread(_shell, etcd_uri, "ledger-check", str(lid))
            assert short.returncode == 1, short.stdout + short.stderr  # a copy is missing
            assert "copies missing" in short.stdout and target.address in short.stdout
            shutil.rmtree(target.root / "journal")
            shutil.rmtree(target.root / "ledgers")
            async with open_metadata_store(etcd_uri) as store:  # formatted: a new bookie
                cookie = await store.get_cookie(target.address)
                await store.delete_cookie(target.address, cookie.version)
            target.start()
            # Same address, empty dirs, a new incarnation: the auditor marks its ledgers
            # and the copies are made again on it (no ensemble change needed).
            await _wait(lambda: _restored(bk, list(written)), 40, "copies back on it")

            async def counted() -> bool:  # the auditor publishes its figures every second
                status = await asyncio.to_thread(_shell, etcd_uri, "autorecovery-status")
                return '"incarnations_changed": 1' in status.stdout

            await _wait(counted, 20, "the auditor counts the new incarnation")
        for lid in written:
            md = (await bk.ctx.metadata.read_ledger(lid)).value
            assert target.address in md.bookies()
        await _read_back(bk, written)


async def test_a_bookie_with_autorecovery_true_replaces_a_lost_bookie(tmp_path, etcd_uri):
    """``--autorecovery true``: no autorecovery process runs; the service inside a bookie
    audits, declares the killed bookie lost and copies its entries to the spare bookie."""
    await _init(etcd_uri)
    settings = ("lost_bookie_recovery_delay_s=1", "replication_lock_ttl_s=3")
    inside = [arg for item in settings for arg in ("--set", item)]
    host = _bookie(tmp_path / "b0", etcd_uri, None, "--autorecovery", "true", *inside)
    procs = [host, *(_bookie(tmp_path / f"b{i}", etcd_uri, None) for i in range(1, 4))]
    async with _running(procs, etcd_uri), BookKeeper.connect(etcd_uri) as bk:
        written = await _write_closed(bk, 4, 6)

        async def running() -> bool:  # the in-bookie service has published itself
            return host.address in await process_statistics(bk.ctx.metadata)

        await _wait(running, 30, "the bookie's autorecovery service runs")
        held = {p.address: 0 for p in procs[1:]}  # the victim: the one holding the most
        for lid in written:
            for address in (await bk.ctx.metadata.read_ledger(lid)).value.bookies():
                held[address] = held.get(address, 0) + 1
        victim = max(procs[1:], key=lambda p: held[p.address])
        victim.kill()
        await _wait(lambda: _restored(bk, list(written), without=victim.address), 45,
                    f"every ledger off {victim.address} by the bookie's autorecovery")  # fmt: skip
        await _read_back(bk, written)
    assert "autorecovery" in host.log.read_text()


async def test_audit_marks_what_is_short_and_list_under_replicated_shows_it(tmp_path, etcd_uri):
    """No autorecovery process: ``shell audit`` finds the copies a bookie formatted again no
    longer holds, marks those ledgers, and ``list-under-replicated`` shows them (ledger,
    which bookie misses how many entries, since when, why)."""
    await _init(etcd_uri)
    procs = [_bookie(tmp_path / f"b{i}", etcd_uri, None) for i in range(3)]
    async with _running(procs, etcd_uri), BookKeeper.connect(etcd_uri) as bk:
        written = await _write_closed(bk, 3, 4)
        clean = await asyncio.to_thread(_shell, etcd_uri, "audit")
        assert clean.returncode == 0, clean.stderr
        assert "3 ledgers checked: 0 marked" in clean.stdout
        listed = await asyncio.to_thread(_shell, etcd_uri, "list-under-replicated")
        assert listed.stdout.strip() == "no under-replicated ledgers"
        target = procs[0]
        target.kill()
        shutil.rmtree(target.root / "journal")
        shutil.rmtree(target.root / "ledgers")
        async with open_metadata_store(etcd_uri) as store:  # formatted again: empty, same id
            cookie = await store.get_cookie(target.address)
            await store.delete_cookie(target.address, cookie.version)
        target.start()
        await wait_registered(etcd_uri, 3)
        audited = await asyncio.to_thread(_shell, etcd_uri, "audit")
        assert audited.returncode == 0, audited.stderr
        assert "3 ledgers checked: 3 marked under-replicated" in audited.stdout
        listed = await asyncio.to_thread(_shell, etcd_uri, "list-under-replicated")
        assert listed.returncode == 0, listed.stderr
        rows = listed.stdout.strip().splitlines()
        assert sorted(int(row.split("\t")[0]) for row in rows) == sorted(written)
        for row in rows:
            assert f"missing {target.address}: 4 entries" in row, row
            assert "\tsince " in row and "why periodic check" in row, row


def test_bad_autorecovery_configuration_exits_2(tmp_path):
    cmd = [sys.executable, "-m", "bookkeeper_aio.autorecovery", "--metadata", "memory://x",
           "--set", "audit_interval_s=nan"]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "audit_interval_s" in result.stderr


async def test_a_failing_ledger_dir_is_taken_out_and_its_ledgers_re_replicated(tmp_path, etcd_uri):
    await _init(etcd_uri)
    extra = ("--set", "engine_fault_injection=true", "--set", "checkpoint_interval_s=1")
    procs = [_bookie(tmp_path / f"b{i}", etcd_uri, None, *extra) for i in range(4)]
    sick = procs[0]
    sick.extra += ["--ledger-dir", str(sick.root / "ledgers2")]  # two dirs: one will fail
    async with _running(procs, etcd_uri):
        async with BookKeeper.connect(etcd_uri) as bk:
            # ledger_dirs.LedgerDirs puts a new ledger in dir ledger_id % 2 (of the good ones):
            # write until the sick bookie has ledgers in both dirs (ids are random).
            written: dict[int, list[bytes]] = {}
            failing: list[int] = []
            kept: list[int] = []
            while not (failing and kept) and len(written) < 60:
                (lid, payloads), *_ = (await _write_closed(bk, 1, 5)).items()
                written[lid] = payloads
                if sick.address in (await bk.ctx.metadata.read_ledger(lid)).value.bookies():
                    (kept if lid % 2 else failing).append(lid)
            assert failing and kept, written
            # No lost-bookie delay or periodic check can act: only the bookie's own report.
            settings = ("lost_bookie_recovery_delay_s=600", "audit_interval_s=3600")
            with _autorecovery(tmp_path, etcd_uri, *settings):
                (sick.root / "ledgers" / "INJECT_IO_ERROR").touch()  # the disk dies

                async def moved() -> bool:
                    for lid in failing:
                        md = (await bk.ctx.metadata.read_ledger(lid)).value
                        if sick.address in md.bookies():
                            return False
                    return await _restored(bk, list(written))

                await _wait(moved, 40, "the failed dir's ledgers off the bookie")
            for lid in kept:  # the good dir's ledgers stay where they are
                assert sick.address in (await bk.ctx.metadata.read_ledger(lid)).value.bookies()
            await _read_back(bk, written)
        assert "ledger dir" in sick.log.read_text() and "failed" in sick.log.read_text()
