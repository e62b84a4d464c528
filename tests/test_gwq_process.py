"""Guaranteed write quorum with real processes: etcd and 4 bookie processes on 127.0.0.1.

The same steps on a GWQ ledger and on a ledger without the option (E3/WQ3/AQ2): one bookie
of the ensemble is frozen (SIGSTOP) mid-stream until the writer replaces it; the writer
closes; the frozen bookie is killed (kill -9: what it had not written is gone) and restarted;
then the two bookies that stayed in the ensemble throughout are killed. Only the frozen
bookie (restarted) and its replacement are left.

With the option every acknowledged entry still reads back: the entries acknowledged while
the bookie was frozen (on the two others only, at AQ) were carried into the new segment and
written to the replacement before the close completed. Without it those entries stayed on
the two killed bookies: some are unreadable, which proves the test exercises the difference.
"""

from __future__ import annotations

import asyncio
import signal
from functools import partial

import pytest

from bookkeeper_aio import BookKeeper, BookKeeperError, ClientConfig
from bookkeeper_aio.errors import NotEnoughBookiesError, WriteQuorumTimeoutError
from bookkeeper_aio.sandbox import Cluster

pytestmark = pytest.mark.process
CONFIG = ClientConfig(request_timeout_s=1.5, explicit_lac_interval_s=0.2, close_timeout_s=30)
WINDOW = 32  # adds in flight


@pytest.fixture
def cluster(tmp_path):
    with Cluster(tmp_path, 4, "rocksdb") as c:
        yield c


async def _until(progress: asyncio.Event, condition, what: str) -> None:  # type: ignore[no-untyped-def]
    """Wait (with a deadline) until ``condition()``, re-checked whenever ``progress`` is set."""
    async with asyncio.timeout(30.0):
        while not condition():
            progress.clear()
            await progress.wait()
    assert condition(), what


async def _freeze_replace_kill(cluster: Cluster, gwq: bool) -> tuple[dict[int, bytes], dict]:
    """The steps of the module docstring; return the acknowledged entries and what reads
    back of each one (bytes, or the error) from the two bookies left."""
    acked: dict[int, bytes] = {}
    async with BookKeeper.connect(cluster.uri, CONFIG) as bk:
        w = await bk.create_ledger(
            ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw",
            guaranteed_write_quorum=gwq,
        )  # fmt: skip
        assert w.metadata.guaranteed_write_quorum is gwq
        first = w.metadata.ensembles[0][1]
        frozen = next(b for b in cluster.bookies if b.address == first[0])
        stayed = [b for b in cluster.bookies if b.address in first[1:]]
        stop, progress = asyncio.Event(), asyncio.Event()

        def on_ack(payload: bytes, future: asyncio.Future[int]) -> None:
            if not future.exception():
                acked[future.result()] = payload
            progress.set()

        async def write() -> None:
            pending: list[asyncio.Future[int]] = []
            n = 0
            while not stop.is_set() or n < 200:
                payload = b"entry-%06d-" % n + b"x" * 200
                await w.wait_for_room(len(payload))
                future = w.append_nowait(payload)
                future.add_done_callback(partial(on_ack, payload))
                pending.append(future)
                n += 1
                if len(pending) >= WINDOW:
                    await pending.pop(0)
            await asyncio.gather(*pending)

        writer = asyncio.create_task(write())
        await _until(progress, lambda: len(acked) >= 100, "the first entries")
        frozen.signal(signal.SIGSTOP)
        try:
            await _until(
                progress, lambda: w.statistics()["ensemble_changes"] >= 1, "an ensemble change"
            )
            frozen_at = len(acked)
            await _until(
                progress, lambda: len(acked) >= frozen_at + 200, "entries after the change"
            )
            stop.set()
            await writer
            assert frozen.address not in w.metadata.last_ensemble()[1]
            await w.close()
        finally:
            frozen.kill()  # kill -9 (a stopped process too): its unread socket data is gone
        assert w.metadata.is_closed and w.last_add_confirmed == max(acked)
        frozen.start()
        for bookie in stayed:
            bookie.kill()
        ledger_id = w.ledger_id
    # A verifier: what reads back, nothing marked or repaired (each read of a lost entry
    # would report it to autorecovery: one metadata update per read).
    verify = CONFIG.replace(mark_short_copies=False, read_repair=False)
    async with BookKeeper.connect(cluster.uri, verify) as bk:
        reader = await bk.open_ledger(ledger_id, password=b"pw", recovery=False)
        got: dict[int, bytes | BaseException] = {}
        # Reads of lost entries each wait for their timeouts: many at once, not one by one.
        reads = asyncio.Semaphore(WINDOW)

        async def read(entry_id: int) -> None:
            async with reads:
                try:
                    (entry,) = await reader.read(entry_id, entry_id)
                    got[entry_id] = entry.payload
                except BookKeeperError as exc:
                    got[entry_id] = exc

        await asyncio.gather(*(read(entry_id) for entry_id in sorted(acked)))
    return acked, got


async def test_a_gwq_ledger_keeps_every_acknowledged_entry_on_the_bookies_left(cluster):
    acked, got = await _freeze_replace_kill(cluster, gwq=True)
    lost = [e for e, p in acked.items() if got[e] != p]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged entries lost, first {lost[:5]}"


async def test_without_the_option_the_same_steps_lose_acknowledged_entries(cluster):
    acked, got = await _freeze_replace_kill(cluster, gwq=False)
    lost = [e for e, p in acked.items() if got[e] != p]
    assert lost, "every entry read back: the test did not exercise what GWQ changes"
    # What is lost is exactly what the frozen bookie never stored and the writer never
    # re-sent: entries acknowledged at AQ before the new segment, an unbroken run.
    assert all(isinstance(got[e], BookKeeperError) for e in lost)
    assert lost == list(range(lost[0], lost[-1] + 1))


async def test_a_gwq_close_that_cannot_reach_wq_fails_and_leaves_the_ledger_to_recovery(cluster):
    """E4/WQ4/AQ3 on 4 bookies: one frozen, none to replace it. Adds are still acknowledged
    (AQ), but the writer cannot get them to WQ: close raises and the ledger stays OPEN; once
    the bookie thaws, a recovery closes it with every acknowledged entry."""
    async with BookKeeper.connect(cluster.uri, CONFIG) as bk:
        w = await bk.create_ledger(4, 4, 3, password=b"pw", guaranteed_write_quorum=True)
        for i in range(20):
            await w.append(b"before-%d" % i)
        frozen = cluster.bookies[0]
        frozen.signal(signal.SIGSTOP)
        try:
            acked = [await w.append(b"during-%d" % i) for i in range(20)]
            with pytest.raises((NotEnoughBookiesError, WriteQuorumTimeoutError)):
                await w.close()
            md = (await bk.ctx.metadata.read_ledger(w.ledger_id)).value
            assert not md.is_closed  # closing is the recovery's job now
        finally:
            frozen.signal(signal.SIGCONT)
        reader = await bk.open_ledger(w.ledger_id, password=b"pw", recovery=True)
        assert reader.is_closed and reader.last_add_confirmed >= max(acked)
        got = await reader.read(0, max(acked))
        assert [e.payload for e in got] == [b"before-%d" % i for i in range(20)] + [
            b"during-%d" % i for i in range(20)
        ]
