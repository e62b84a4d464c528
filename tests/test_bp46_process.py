"""BP-46 with real processes: journal-less bookies, one killed with its ledger dirs wiped.

The bookie must notice (its dirs lost their cookies), refuse to start unless allowed (cookie
auto-fix, or an operator's ``shell cookie-fix``), then fence and put in limbo its open ledger
before serving, answer "unknown" rather than "no such entry" while in limbo, and copy what it
lost from its peers — and no acknowledged entry may be lost on the way. Killed on the same
boot of the system, it lost nothing and needs no limbo; after a reboot (a power loss) it does.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys

import pytest

from bookkeeper_aio import BookKeeper, ClientConfig, LedgerFencedError
from bookkeeper_aio.client.bookie_client import BookieClient
from bookkeeper_aio.errors import BookieStatusError, StatusCode
from bookkeeper_aio.metadata import open_metadata_store
from bookkeeper_aio.net import TcpNetwork
from bookkeeper_aio.sandbox import Cluster

pytestmark = pytest.mark.process
CONFIG = ClientConfig(request_timeout_s=3)
BOOKIE_FLAGS = ("--journal-write-data", "false", "--set", "data_integrity_check_interval_s=1")


def shell(uri: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bookkeeper_aio.shell", "--metadata", uri, *args],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


async def status_of(address: str, ledger_id: int, entry_id: int) -> tuple[int, bytes | None]:
    """What one bookie answers for one entry: (status, payload)."""
    client = await BookieClient.connect(TcpNetwork(), address, CONFIG)
    try:
        response = await client.read_entry(ledger_id, entry_id)
    except BookieStatusError as exc:
        return exc.status, None
    finally:
        await client.close()
    return response.status, response.payload


async def eventually(check, timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        assert loop.time() < deadline, "not reached in time"
        await asyncio.sleep(0.3)


@pytest.mark.parametrize(
    ("auto_fix", "wiped"),
    [(False, ("ledgers",)), (True, ("ledgers", "journal"))],
    ids=["ledger-dirs-wiped-cookie-fix-command", "whole-disk-wiped-auto-fix"],
)
async def test_wiped_journal_less_bookie_fences_limbos_and_repairs(tmp_path, auto_fix, wiped):
    flags = (*BOOKIE_FLAGS, "--cookie-auto-fix", "true" if auto_fix else "false")
    cluster = Cluster(tmp_path, 3, "rocksdb", *flags)
    try:
        await asyncio.to_thread(cluster.start)  # it runs its own event loop
        victim = cluster.bookies[1]
        async with BookKeeper.connect(cluster.uri, CONFIG) as bk:
            closed = await bk.create_ledger(3, 3, 2, password=b"pw")
            acked_closed = {await closed.append(b"c%d" % i): b"c%d" % i for i in range(40)}
            await closed.close()
            open_ = await bk.create_ledger(3, 3, 2, password=b"pw")
            acked_open = {await open_.append(b"o%d" % i): b"o%d" % i for i in range(40)}
            # Every bookie answered (an add returns at AQ 2 of 3): otherwise the victim's death
            # fails an add in flight and the writer, with no spare bookie to replace it, stops
            # with NotEnoughBookiesError before the rebooted bookie can fence it.
            async with asyncio.timeout(10):
                while bk.ctx.pool.statistics()["in_flight"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            victim.kill()
            for name in wiped:  # the disk is gone, DIRTY marker included
                shutil.rmtree(victim.root / name)
            if not auto_fix:
                with pytest.raises(RuntimeError, match="cookie-fix --bookie"):
                    victim.start()
                fixed = await asyncio.to_thread(
                    shell, cluster.uri, "cookie-fix", "--bookie", victim.address
                )
                assert fixed.returncode == 0, fixed.stderr
                assert "cookie fix requested" in fixed.stdout
            victim.start()
            log = victim.log.read_text()
            assert "fenced and put in limbo" in log and "cookies restamped" in log

            # The open ledger is in limbo: a lost entry is "unknown", never "no such entry".
            # With the journal kept, the bookie still knows the ledger's master key and may
            # already have recovered it and copied the entry back.
            status, _ = await status_of(victim.address, open_.ledger_id, 0)
            if "journal" in wiped:
                assert status == StatusCode.UNKNOWN  # no key: it waits for a client
            else:
                assert status in (StatusCode.UNKNOWN, StatusCode.OK)
            # Its writer is fenced out by the rebooted bookie, as after any recovery (an add
            # the two others acknowledge first still counts, and must survive).
            with pytest.raises(LedgerFencedError):
                for i in range(40, 50):
                    acked_open[await asyncio.wait_for(open_.append(b"o%d" % i), 10)] = b"o%d" % i

            # A recovering reader closes it; every acknowledged entry survives.
            async with BookKeeper.connect(cluster.uri, CONFIG) as bk2:
                reader = await bk2.open_ledger(open_.ledger_id, password=b"pw", recovery=True)
                assert reader.last_add_confirmed >= max(acked_open)
                got = await reader.read(0, max(acked_open))
                assert {e.entry_id: e.payload for e in got} == acked_open

            # The bookie copies back everything it should hold and leaves limbo.
            async def repaired() -> bool:
                for ledger_id, acked in ((closed.ledger_id, acked_closed),
                                         (open_.ledger_id, acked_open)):  # fmt: skip
                    for entry_id, payload in acked.items():
                        if await status_of(victim.address, ledger_id, entry_id) != (
                            StatusCode.OK, payload,
                        ):  # fmt: skip
                            return False
                return True

            await eventually(repaired)
            await eventually(lambda: _logged(victim, f"ledger {open_.ledger_id} repaired"))
            await eventually(lambda: _logged(victim, "0 in limbo"))  # a whole pass logged

        async with open_metadata_store(cluster.uri) as store:
            cookie = json.loads((await store.get_cookie(victim.address)).value)
        assert "fix_requested" not in cookie  # the approval is used up
        assert (victim.root / "ledgers" / "COOKIE").exists()
        victim.stop()
        victim.start()  # and it boots normally afterwards
        assert victim.log.read_text().count("cookies restamped") == 1
    finally:
        await asyncio.to_thread(cluster.stop)


async def _logged(bookie, text: str) -> bool:
    return text in bookie.log.read_text()


async def test_kill_9_on_the_same_boot_needs_no_limbo_and_after_a_reboot_it_does(tmp_path):
    """A journal-less bookie killed while the system runs on lost nothing (its engine's WAL
    reached the page cache): it comes back without limbo and serves every acknowledged entry.
    A marker naming another boot (a power loss) still puts its open ledger in limbo."""
    cluster = Cluster(tmp_path, 3, "rocksdb", *BOOKIE_FLAGS)
    try:
        await asyncio.to_thread(cluster.start)
        victim = cluster.bookies[1]
        async with BookKeeper.connect(cluster.uri, CONFIG) as bk:
            ledger = await bk.create_ledger(3, 3, 2, password=b"pw")
            acked = {await ledger.append(b"o%d" % i): b"o%d" % i for i in range(20)}
            async with asyncio.timeout(10):  # every bookie answered every add
                while bk.ctx.pool.statistics()["in_flight"]:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            victim.kill()
            victim.start()
            log = victim.log.read_text()
            assert "nothing written was lost, no limbo" in log
            assert "put in limbo" not in log
            for entry_id, payload in acked.items():
                status = await status_of(victim.address, ledger.ledger_id, entry_id)
                assert status == (StatusCode.OK, payload)
            victim.kill()
            (victim.root / "ledgers" / "DIRTY").write_bytes(b"a-boot-before-a-power-loss")
            victim.start()
            assert "fenced and put in limbo" in victim.log.read_text()
    finally:
        await asyncio.to_thread(cluster.stop)
