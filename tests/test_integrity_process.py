"""BP-31 integrity at rest with real processes: etcd, bookie processes (files engine), the shell.

A byte flipped in an entry's stored copy on disk: a reader that meets it first still gets the
right payload and the bad copy is rewritten (read repair); the scrubber finds another one and
repairs it from a peer, when asked (`shell scrub`) and on its own schedule. The metadata
store wiped and started empty: `shell recover-metadata` brings every ledger back (a closed
one with custom metadata, one with an ensemble change, one left open) and each reads back
byte for byte. Bad input: a scrub of an unknown bookie, a recovery into a store that still
has ledgers.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import random
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.client.bookie_pool import BookiePool
from bookkeeper_aio.client.context import ClientContext
from bookkeeper_aio.client.placement import PlacementPolicy
from bookkeeper_aio.client.reads import read_copy, request
from bookkeeper_aio.config import ClientConfig
from bookkeeper_aio.digest import ENTRY_RECORD_HEADER
from bookkeeper_aio.errors import UnauthorizedError
from bookkeeper_aio.etcd_server import EtcdServer
from bookkeeper_aio.metadata.ledger_record import unpack_held
from bookkeeper_aio.metadata.store import open_metadata_store
from bookkeeper_aio.metadata.underreplication import list_marks
from bookkeeper_aio.net import TcpNetwork
from bookkeeper_aio.protocol import LedgerRecordsRequest
from bookkeeper_aio.sandbox import BookieProcess, wait_registered

pytestmark = pytest.mark.process

PASSWORD = b"rot"
ENTRY_HEAD = struct.Struct("<IB3xIQQ")  # engines/files_log.py: magic, type, length, ledger, entry
MAGIC, ENTRY = 0x31414B42, 1
FILES_HEADER_BYTES = 36


def _bookie(root: Path, uri: str, *settings: str, engine: str = "files") -> BookieProcess:
    flags = ["--metadata", uri, "--set", "lease_ttl_s=2", "--set", "checkpoint_interval_s=0.5"]
    for setting in settings:
        flags += ["--set", setting]
    return BookieProcess(root, engine, *flags)


@contextlib.asynccontextmanager
async def _running(procs: list[BookieProcess], uri: str) -> AsyncIterator[None]:
    try:
        for p in procs:
            p.start()
        await wait_registered(uri, len(procs))
        yield
    finally:
        for p in procs:
            p.kill()


def _shell(uri: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bookkeeper_aio.shell", "--metadata", uri, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)


async def _init(uri: str) -> None:
    async with open_metadata_store(uri) as store:
        await store.init_cluster()


async def _wait(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def _ctx(uri: str) -> AsyncIterator[ClientContext]:
    config, rng = ClientConfig(), random.Random(1)
    async with open_metadata_store(uri) as store, BookiePool(TcpNetwork(), config, rng) as pool:
        yield ClientContext(config, store, pool, rng, PlacementPolicy())


def _find_record(ledger_dir: Path, ledger_id: int, entry_id: int, payload: bytes):  # type: ignore[no-untyped-def]
    """(log path, offset of the payload) of the entry's record on disk, or None."""
    head = ENTRY_HEAD.pack(MAGIC, ENTRY, ENTRY_RECORD_HEADER.size + len(payload), ledger_id,
                           entry_id)  # fmt: skip
    for log in sorted(ledger_dir.glob("entrylog-*.log")):
        if log.stat().st_size == 0:
            continue
        with open(log, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            at = data.find(head)
        if at >= 0:
            return log, at + FILES_HEADER_BYTES + ENTRY_RECORD_HEADER.size
    return None


async def _flip_on_disk(proc: BookieProcess, ledger_id: int, entry_id: int, payload: bytes) -> None:
    """Flip one byte of the entry's payload in the bookie's entry log, once it is on disk."""
    found = None

    async def on_disk() -> bool:
        nonlocal found
        found = _find_record(proc.root / "ledgers", ledger_id, entry_id, payload)
        return found is not None

    await _wait(on_disk, 20, f"entry {entry_id} of ledger {ledger_id} in an entry log")
    assert found is not None
    _flip_byte(*found, len(payload) // 2)


def _flip_byte(path: Path, offset: int, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset + at)
        byte = f.read(1)
        f.seek(offset + at)
        f.write(bytes([byte[0] ^ 0x40]))


async def _write(bk: BookKeeper, entries: int, **kw) -> tuple[int, list[bytes]]:  # type: ignore[no-untyped-def]
    w = await bk.create_ledger(3, 3, 2, PASSWORD, **kw)
    payloads = [f"ledger {w.ledger_id} entry {i} ".encode() * 20 for i in range(entries)]
    for p in payloads:
        await w.append(p)
    await w.close()
    return w.ledger_id, payloads


async def _copy_good(ctx: ClientContext, ledger_id: int, entry_id: int, bookie: str) -> bool:
    return await read_copy(ctx, ledger_id, entry_id, [bookie]) is not None


async def test_a_read_that_meets_a_flipped_byte_gets_the_payload_and_repairs_the_copy(
    tmp_path, etcd_uri
):
    await _init(etcd_uri)
    procs = [_bookie(tmp_path / f"b{i}", etcd_uri, "scrub_interval_s=0") for i in range(3)]
    by_address = {p.address: p for p in procs}
    async with _running(procs, etcd_uri), BookKeeper.connect(etcd_uri) as bk:
        lid, payloads = await _write(bk, 10)
        md = (await bk.ctx.metadata.read_ledger(lid)).value
        first = md.ensembles[0][1][0]  # entry 0's first replica: the one a reader asks first
        await _flip_on_disk(by_address[first], lid, 0, payloads[0])
        async with _ctx(etcd_uri) as ctx:
            assert not await _copy_good(ctx, lid, 0, first)  # the bookie now has a bad copy
            reader = await bk.open_ledger(lid, PASSWORD)
            assert [e.payload for e in await reader.read(0, 9)] == payloads
            assert await _copy_good(ctx, lid, 0, first)  # repaired by the read
            assert [m async for m in list_marks(ctx.metadata)] == []  # no work left over


async def test_the_scrubber_finds_a_flipped_byte_and_repairs_it_from_a_peer(tmp_path, etcd_uri):
    await _init(etcd_uri)
    # b0 scrubs on its own every second; b1 and b2 only when asked.
    procs = [_bookie(tmp_path / "b0", etcd_uri, "scrub_interval_s=1")]
    procs += [_bookie(tmp_path / f"b{i}", etcd_uri, "scrub_interval_s=0") for i in (1, 2)]
    async with _running(procs, etcd_uri), BookKeeper.connect(etcd_uri) as bk:
        lid, payloads = await _write(bk, 10)
        asked, scheduled = procs[1], procs[0]
        await _flip_on_disk(asked, lid, 3, payloads[3])
        async with _ctx(etcd_uri) as ctx:
            assert not await _copy_good(ctx, lid, 3, asked.address)
            result = _shell(etcd_uri, "scrub", "--bookie", asked.address)
            assert result.returncode == 0, result.stderr
            assert "1 bad copies, 1 repaired, 0 not repaired" in result.stdout, result.stdout
            assert await _copy_good(ctx, lid, 3, asked.address)

            await _flip_on_disk(scheduled, lid, 5, payloads[5])

            async def repaired() -> bool:
                return await _copy_good(ctx, lid, 5, scheduled.address)

            await _wait(repaired, 30, "the scheduled scrub pass repaired entry 5")
        reader = await bk.open_ledger(lid, PASSWORD)
        assert [e.payload for e in await reader.read(0, 9)] == payloads


async def test_scrub_of_an_unknown_bookie_is_a_clear_error(etcd_uri):
    await _init(etcd_uri)
    result = _shell(etcd_uri, "scrub", "--bookie", "127.0.0.1:1")
    assert result.returncode == 1
    assert "unknown bookie 127.0.0.1:1" in result.stderr, result.stderr


async def _records_of(ctx: ClientContext, bookie: str) -> dict[int, bytes]:
    answer = await request(ctx, bookie, LedgerRecordsRequest, 0, 1000)
    return {h.ledger_id: h.record for h in map(unpack_held, answer.records)}


async def test_recover_metadata_after_etcd_is_wiped_every_ledger_reads_back(tmp_path):
    etcd = EtcdServer(tmp_path / "etcd", unsafe_no_fsync=True)
    async with etcd:
        uri = etcd.uri("bk")
        await _init(uri)
        procs = [_bookie(tmp_path / f"b{i}", uri, engine="rocksdb") for i in range(4)]
        async with _running(procs, uri):
            expected, closed, changed, still_open = await _write_ledgers(uri, procs)
            # Wiped: the store starts empty; the bookies register again on their own.
            await asyncio.to_thread(etcd.wipe)
            async with open_metadata_store(uri) as store:
                assert [i async for i in store.list_ledgers()] == []
            await wait_registered(uri, 4)

            result = _shell(uri, "recover-metadata")
            assert result.returncode == 0, result.stdout + result.stderr
            assert "3 ledgers restored (1 not closed" in result.stdout, result.stdout

            again = _shell(uri, "recover-metadata")
            assert again.returncode == 1
            assert "still has 3 ledgers" in again.stderr and "--merge" in again.stderr
            merged = _shell(uri, "recover-metadata", "--merge")
            assert merged.returncode == 0, merged.stdout + merged.stderr
            assert "0 ledgers restored" in merged.stdout and "3 already" in merged.stdout

            await _check_recovered(uri, expected, closed, changed, still_open)


async def _write_ledgers(uri: str, procs: list[BookieProcess]):  # type: ignore[no-untyped-def]
    """A closed ledger with custom metadata, one with an ensemble change, one left open; the
    bookies' records current (a scrub pass each, or read at first sight for the open one)."""
    expected: dict[int, list[bytes]] = {}
    async with BookKeeper.connect(uri) as bk:
        closed, payloads = await _write(bk, 10, custom_metadata={"owner": b"tests"})
        expected[closed] = payloads
        w = await bk.create_ledger(3, 3, 2, PASSWORD)
        changed, payloads = w.ledger_id, []
        for i in range(10):
            if i == 5:  # one of its bookies dies: the writer replaces it (ensemble change)
                victim = next(p for p in procs if p.address in w.metadata.ensembles[0][1])
                victim.kill()
            payloads.append(f"changed {i} ".encode() * 30)
            await w.append(payloads[-1])
        await w.close()
        expected[changed] = payloads
        victim.start()
        await wait_registered(uri, 4)
        for p in procs:
            result = _shell(uri, "scrub", "--bookie", p.address)
            assert result.returncode == 0, result.stderr
        w = await bk.create_ledger(3, 3, 2, PASSWORD)
        still_open = w.ledger_id
        expected[still_open] = [f"open {i}".encode() for i in range(7)]
        for p in expected[still_open]:
            await w.append(p)
        ensemble = w.metadata.ensembles[0][1]
        async with _ctx(uri) as ctx:

            async def recorded() -> bool:
                for bookie in ensemble:
                    if not (await _records_of(ctx, bookie)).get(still_open):
                        return False
                return True

            await _wait(recorded, 20, "the open ledger's records on its bookies")
    return expected, closed, changed, still_open


async def _check_recovered(uri, expected, closed, changed, still_open) -> None:  # type: ignore[no-untyped-def]
    async with BookKeeper.connect(uri) as bk:
        assert sorted(await bk.list_ledgers()) == sorted(expected)
        for lid, payloads in expected.items():
            reader = await bk.open_ledger(lid, PASSWORD)  # the open one is recovered here
            assert reader.is_closed
            got = [e.payload for e in await reader.read(0, reader.last_add_confirmed)]
            assert got == payloads, lid
        md = (await bk.ctx.metadata.read_ledger(closed)).value
        assert md.custom_metadata == {"owner": b"tests"} and md.ctime_ms > 0
        assert len((await bk.ctx.metadata.read_ledger(changed)).value.ensembles) == 2
        with pytest.raises(UnauthorizedError):
            await bk.open_ledger(still_open, b"wrong password")
        lid, payloads = await _write(bk, 3)  # new ledgers still work
        reader = await bk.open_ledger(lid, PASSWORD)
        assert [e.payload for e in await reader.read(0, 2)] == payloads
