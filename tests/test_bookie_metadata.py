"""Bookie processes with a real etcd: init-cluster, registration, leases, cookies, shell."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys

import pytest

from bookkeeper_aio.metadata import open_metadata_store
from bookkeeper_aio.sandbox import BookieProcess

pytestmark = pytest.mark.process


def shell(uri: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bookkeeper_aio.shell", "--metadata", uri, *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


async def bookies_in(uri: str) -> dict:
    async with open_metadata_store(uri) as store:
        return await store.list_bookies()


async def wait_for(predicate, timeout_s: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.2)


async def test_registration_leases_cookies(tmp_path, etcd_uri):
    args = ("--metadata", etcd_uri, "--rack", "/zone-a/rack-1", "--set", "lease_ttl_s=2")
    bookie = BookieProcess(tmp_path / "b", "files", *args)
    try:
        # Before init-cluster the bookie refuses to start and says what to do.
        with pytest.raises(RuntimeError, match="init-cluster"):
            bookie.start()
        first = await asyncio.to_thread(shell, etcd_uri, "init-cluster")
        again = await asyncio.to_thread(shell, etcd_uri, "init-cluster")
        assert first.returncode == again.returncode == 0
        assert first.stdout.split()[-1] == again.stdout.split()[-1]  # same instance id

        bookie.start()
        listed = await asyncio.to_thread(shell, etcd_uri, "list-bookies")
        assert f"{bookie.address}\t/zone-a/rack-1\twritable" in listed.stdout

        bookie.kill()  # no unregister: the lease (2 s) must expire
        await wait_for(lambda: _absent(etcd_uri, bookie.address))

        bookie.start()  # the cookie matches: it starts and registers again
        assert bookie.address in await bookies_in(etcd_uri)
        assert bookie.stop() == 0  # a clean shutdown unregisters at once
        assert bookie.address not in await bookies_in(etcd_uri)

        shutil.rmtree(tmp_path / "b" / "ledgers")  # a wiped disk
        with pytest.raises(RuntimeError, match="no COOKIE file"):
            bookie.start()
    finally:
        bookie.kill()


async def _absent(uri: str, bookie_id: str) -> bool:
    return bookie_id not in await bookies_in(uri)


async def test_shell_lists_ledgers_and_shows_metadata(etcd_uri):
    from bookkeeper_aio.metadata import LedgerMetadata

    async with open_metadata_store(etcd_uri) as store:
        created = await store.create_ledger(
            lambda i: LedgerMetadata(i, 2, 2, 1, ((0, ("a:1", "b:2")),))
        )
    ledger_id = created.value.ledger_id
    listed = await asyncio.to_thread(shell, etcd_uri, "list-ledgers")
    assert str(ledger_id) in listed.stdout.split()
    shown = await asyncio.to_thread(shell, etcd_uri, "ledger-metadata", str(ledger_id))
    assert shown.returncode == 0 and '"state": "OPEN"' in shown.stdout
    missing = await asyncio.to_thread(shell, etcd_uri, "ledger-metadata", "12345")
    assert missing.returncode == 1 and "NoSuchLedgerError" in missing.stderr
    unknown = await asyncio.to_thread(shell, etcd_uri, "cookie-fix", "--bookie", "127.0.0.1:1")
    assert unknown.returncode == 1 and "no cookie for bookie 127.0.0.1:1" in unknown.stderr
