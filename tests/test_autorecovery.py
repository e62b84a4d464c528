"""Autorecovery on the simulated cluster (virtual time, in-memory store and bookies): the
write and read triggers, bad input (a mark for a deleted ledger, two workers on one mark,
the metadata store failing mid-copy), election failover; and the pure parts (fragments,
marks) as properties."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper_aio.autorecovery import fragments as fr
from bookkeeper_aio.autorecovery import worker_job
from bookkeeper_aio.autorecovery.checker import check_ledger, list_present
from bookkeeper_aio.autorecovery.election import current_auditor
from bookkeeper_aio.autorecovery.worker import ReplicationWorker
from bookkeeper_aio.bookie.integrity import DataIntegrity
from bookkeeper_aio.config import AutorecoveryConfig, ConfigError
from bookkeeper_aio.digest import pack_entry_record, payload_digest
from bookkeeper_aio.errors import BookKeeperError
from bookkeeper_aio.metadata.model import LedgerMetadata, LedgerState
from bookkeeper_aio.metadata.underreplication import (
    MARKS_PREFIX,
    Mark,
    Missing,
    mark_under_replicated,
    merge_ranges,
    to_ranges,
)
from bookkeeper_aio.quorum import write_set
from bookkeeper_aio.sim.autorecovery import SimAutorecovery
from bookkeeper_aio.sim.loop import VirtualTimeLoop
from bookkeeper_aio.sim.runner import _teardown
from bookkeeper_aio.sim.world import CLIENT_CONFIG, Faults, World, close_client

PW = b"t"
CONFIG = AutorecoveryConfig(
    metadata_uri="memory://simulated",
    lost_bookie_recovery_delay_s=0.5,
    audit_interval_s=3.0,
    open_ledger_rereplication_grace_s=1.0,
    replication_lock_ttl_s=2,
    replication_retry_backoff_s=0.2,
    replication_entries_in_flight_max=4,
    lease_ttl_s=2,
)


def simulate(body: Callable[[World], Awaitable[Any]], bookies: int = 4) -> Any:
    """Run ``body(world)`` on a fresh simulated cluster of ``bookies`` bookies."""
    loop = VirtualTimeLoop()
    world = World(seed=3, faults=Faults())
    world.client_config = CLIENT_CONFIG.replace(mark_short_copies=True)
    logging.getLogger("bookkeeper_aio").setLevel(logging.CRITICAL + 1)

    async def main() -> Any:
        for i in range(bookies):
            await world.add_bookie(f"/rack-{i % 3}").start()
        async with asyncio.timeout(300):
            return await body(world)

    try:
        return loop.run_until_complete(main())
    finally:
        _teardown(loop, world)  # the simulator's own: crash every bookie, cancel every task
        logging.getLogger("bookkeeper_aio").setLevel(logging.NOTSET)


async def write(world: World, entries: int, quorum=(3, 3, 2), close: bool = True) -> int:
    bk = world.client("writer")
    try:
        w = await bk.create_ledger(*quorum, PW)
        for i in range(entries):
            await w.append(f"e{i}".encode())
        if close:
            await w.close()
        return w.ledger_id
    finally:
        await close_client(bk)


def drop_entries(node: Any, lid: int) -> None:
    """Take every entry of ``lid`` off a simulated bookie's in-memory engine."""
    engine = node.storage.engine
    engine._entries.pop(lid, None)
    engine.disk.entries.pop(lid, None)
    engine._last.pop(lid, None)


async def complete(world: World, lid: int) -> bool:
    bk = world.client("checker")
    try:
        md = world.ledger(lid).value
        registered = set(await bk.ctx.metadata.list_bookies())
        return (await check_ledger(bk.ctx, md, registered)).complete
    finally:
        await close_client(bk)


async def marks(world: World) -> list[Mark]:
    """The marks, read past the injected metadata faults (god's view)."""
    return [Mark.from_json_bytes(v.value) for _, v in world.state.keys.items(MARKS_PREFIX)]


async def drained(world: World, timeout_s: float = 20.0) -> None:
    """Wait (virtual time, bounded) until no mark is left."""
    for _ in range(int(timeout_s / 0.2)):
        await asyncio.sleep(0.2)
        if not await marks(world):
            return
    raise AssertionError(f"mark not drained: {await marks(world)}")


def test_a_lost_bookie_is_replaced_and_the_auditor_moves_when_its_process_dies() -> None:
    async def body(world: World) -> None:
        lid = await write(world, 12)
        victim = world.bookie_at(world.ledger(lid).value.ensembles[0][1][0])
        a, b = (SimAutorecovery(world, f"ar-{i}", CONFIG) for i in range(2))
        a.start()
        await asyncio.sleep(0.5)
        b.start()
        await asyncio.sleep(0.5)
        assert await current_auditor(world.metadata_store()) == "ar-0"
        a.crash()  # its lease expires: the seat moves to ar-1
        victim.lose()
        for _ in range(100):
            await asyncio.sleep(0.2)
            md = world.ledger(lid).value
            if victim.address not in md.bookies() and await complete(world, lid):
                break
        else:
            raise AssertionError(f"not restored: {world.ledger(lid).value}")
        assert await current_auditor(world.metadata_store()) == "ar-1"
        stats = b.service.statistics()
        assert stats["is_auditor"] and stats["worker"]["replacements"] == 1
        for _ in range(30):  # the SLA figure once no mark names the lost bookie
            if b.service.statistics()["auditor"]["loss_to_wq_s_last"] is not None:
                break
            await asyncio.sleep(0.2)
        assert 0 < b.service.statistics()["auditor"]["loss_to_wq_s_last"] < 20

    simulate(body)


def test_the_writer_marks_entries_acknowledged_without_a_failed_copy() -> None:
    async def body(world: World) -> None:
        bk = world.client("writer")
        w = await bk.create_ledger(3, 3, 2, PW)
        for i in range(3):
            await w.append(f"e{i}".encode())
        slow = w.metadata.ensembles[0][1][2]
        world.net.slow_s[world.bookie_at(slow).name] = 0.5  # its copies arrive after AQ
        futures = [w.append_nowait(f"x{i}".encode()) for i in range(5)]
        await asyncio.gather(*futures)  # acknowledged by the two others
        world.bookie_at(slow).crash(power_loss=False)  # the slow copies never land
        await w.append(b"after")  # the failure replaces it; then the writer reports
        await w.close()
        await close_client(bk)
        found = await marks(world)
        assert [m.ledger_id for m in found] == [w.ledger_id]
        (missing,) = found[0].missing
        assert missing.bookie == slow and missing.reasons == ("write failed after ack quorum",)
        assert set(fr.entries(missing.entries)) >= {3, 4, 5, 6, 7}

    simulate(body)


def test_a_reader_of_an_open_ledger_marks_no_replica_that_is_behind_the_writer() -> None:
    """A tailing reader asks a replica for an entry the LAC covers before the writer's add
    reached it (AQ bookies acknowledged it): "no such entry" there is a replica behind, not a
    copy short (`make bench` of 2026-11-27: 78 marks of a healthy ledger in its tail phase).
    Once the ledger is closed, a replica without an entry is short."""

    async def body(world: World) -> None:
        bk = world.client("writer")
        w = await bk.create_ledger(3, 3, 2, PW)
        await w.append(b"e0")
        behind = world.bookie_at(w.metadata.ensembles[0][1][1])
        world.net.slow_link_s[("writer", behind.name)] = 2.0  # the writer's adds to it lag
        for i in range(1, 7):
            await w.append(f"e{i}".encode())  # acknowledged by the two others
        reader_bk = world.client("reader")
        reader = await reader_bk.open_ledger(w.ledger_id, PW, recovery=False)
        assert await reader.read_last_add_confirmed() >= 5
        entries = await reader.read(1, 5)
        assert [e.payload for e in entries] == [f"e{i}".encode() for i in range(1, 6)]
        assert not behind.stored(w.ledger_id, 1)  # it was asked, and is behind
        assert not await marks(world)
        world.net.slow_link_s.clear()
        await w.close()
        await close_client(bk)
        drop_entries(behind, w.ledger_id)  # now it is short for good
        reader = await reader_bk.open_ledger(w.ledger_id, PW, recovery=False)
        await reader.read(1, 6)  # one batch read (E == WQ), asked of entry 1's first: behind
        await close_client(reader_bk)
        found = await marks(world)
        assert [(m.ledger_id, m.missing[0].bookie, m.missing[0].reasons) for m in found] == [
            (w.ledger_id, behind.address, ("read error",))
        ]

    simulate(body)


def test_a_reader_marks_a_replica_with_a_corrupt_copy_and_a_worker_repairs_it() -> None:
    async def body(world: World) -> None:
        lid = await write(world, 4)
        md = world.ledger(lid).value
        bad = world.bookie_at(md.ensembles[0][1][0])
        record = pack_entry_record(-1, payload_digest(b"junk"), 12345, b"junk")
        bad.storage.engine.put_entry(lid, 0, record)  # bit rot on one replica
        world.client_config = world.client_config.replace(read_repair=False)  # marks only
        bk = world.client("reader")
        reader = await bk.open_ledger(lid, PW)
        await reader.read(0, 3)  # entry 0's first replica is the corrupt one
        await close_client(bk)
        found = await marks(world)
        assert found and found[0].missing[0].bookie == bad.address
        assert found[0].missing[0].reasons == ("read error",)
        ar = SimAutorecovery(world, "ar", CONFIG)
        ar.start()
        for _ in range(50):
            await asyncio.sleep(0.2)
            if not await marks(world):
                break
        assert bad.stored(lid, 0) == b"e0"  # the copy was made again, in place
        assert ar.service.worker.counters["entries_rewritten"] == 1

    simulate(body)


def test_a_reader_repairs_a_corrupt_copy_itself_and_leaves_no_mark() -> None:
    async def body(world: World) -> None:
        lid = await write(world, 4)
        md = world.ledger(lid).value
        bad = world.bookie_at(md.ensembles[0][1][0])
        record = pack_entry_record(-1, payload_digest(b"junk"), 12345, b"junk")
        bad.storage.engine.put_entry(lid, 0, record)  # bit rot on one replica
        bk = world.client("reader")
        reader = await bk.open_ledger(lid, PW)
        assert [e.payload for e in await reader.read(0, 3)] == [b"e0", b"e1", b"e2", b"e3"]
        await close_client(bk)
        assert bad.stored(lid, 0) == b"e0"  # written back by the read (read repair)
        assert not await marks(world)

    simulate(body)


def test_a_bookie_that_cannot_store_the_missing_copies_is_replaced() -> None:
    """A live bookie lacks the entries a mark names and its disks failed: it lists the ledger
    as absent but refuses every copy (IO_ERROR). Filling it in place can never succeed, so
    the worker replaces it (sim seed 392: the mark stayed for ever)."""

    async def body(world: World) -> None:
        lid = await write(world, 3)
        bad = world.bookie_at(world.ledger(lid).value.ensembles[0][1][2])
        drop_entries(bad, lid)  # it knows the ledger but lacks its entries ...

        def eio(*args: Any) -> None:
            raise OSError(errno.EIO, "simulated: every write fails")

        engine = bad.storage.engine  # ... and cannot store any: writes fail with EIO
        engine.put_entry = engine.put_entries = eio
        missing = Missing(bad.address, ("write failed after ack quorum",), 1, ((0, 2),))
        await mark_under_replicated(world.metadata_store(), lid, [missing], now_ms=1)
        ar = SimAutorecovery(world, "ar", CONFIG)
        ar.start()
        await drained(world)
        md = world.ledger(lid).value
        assert bad.address not in md.bookies() and await complete(world, lid)
        assert ar.service.worker.counters["replacements"] == 1

    simulate(body)


def test_a_mark_for_a_deleted_ledger_is_dropped_and_counted() -> None:
    async def body(world: World) -> None:
        lid = await write(world, 2)
        store = world.metadata_store()
        await mark_under_replicated(store, lid, [Missing("bookie-0:3181", ("test",), 1)], now_ms=1)
        await store.delete_ledger(lid)
        ar = SimAutorecovery(world, "ar", CONFIG)
        ar.start()
        for _ in range(30):
            await asyncio.sleep(0.2)
            if not await marks(world):
                break
        assert not await marks(world)
        assert ar.service.worker.counters["marks_of_deleted_ledgers"] == 1

    simulate(body)


def test_an_open_ledger_whose_writer_is_gone_is_recovered_after_the_grace_period() -> None:
    """The lost bookie is in the open ledger's last fragment: the worker leaves it to the
    writer for ``open_ledger_rereplication_grace_s``, then fences and recovers the ledger
    and replaces the bookie in the closed ledger."""
    grace = CONFIG.replace(open_ledger_rereplication_grace_s=5.0)

    async def body(world: World) -> None:
        lid = await write(world, 6, close=False)  # its writer is gone, the ledger open
        victim = world.bookie_at(world.ledger(lid).value.ensembles[0][1][0])
        victim.lose()
        ar = SimAutorecovery(world, "ar", grace)
        ar.start()
        for _ in range(50):
            if await marks(world):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the lost bookie's ledger was not marked")
        marked = asyncio.get_running_loop().time()
        while not world.ledger(lid).value.is_closed:
            await asyncio.sleep(0.1)
            assert asyncio.get_running_loop().time() - marked < 30, "never recovered"
        waited_s = asyncio.get_running_loop().time() - marked
        assert waited_s >= 5.0 - 0.5, f"recovered {waited_s:.1f} s after the mark, in grace"
        for _ in range(100):
            md = world.ledger(lid).value
            if victim.address not in md.bookies() and not await marks(world):
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError(f"not restored: {world.ledger(lid).value}")
        assert md.last_entry_id == 5  # every acknowledged entry kept by the recovery
        assert await complete(world, lid)
        assert ar.service.worker.counters["ledgers_recovered"] == 1

    simulate(body)


def test_copying_keeps_to_replication_rate_bytes_per_s() -> None:
    """40 entries of 1,000 bytes at 4,000 bytes/s: the copy takes about 10 s (virtual time;
    the limiter's burst is a tenth of a second's worth), not the instant it takes unlimited."""
    rate = 4_000

    def copy_time_s(config: AutorecoveryConfig) -> float:
        result: list[float] = []

        async def body(world: World) -> None:
            bk = world.client("writer")
            w = await bk.create_ledger(3, 3, 2, PW)
            for i in range(40):
                await w.append(b"%04d" % i + bytes(996))
            await w.close()
            await close_client(bk)
            node = world.bookie_at(w.metadata.ensembles[0][1][1])
            drop_entries(node, w.ledger_id)
            missing = [Missing(node.address, ("test",), 1)]
            await mark_under_replicated(world.metadata_store(), w.ledger_id, missing, now_ms=1)
            ar = SimAutorecovery(world, "ar", config)
            loop = asyncio.get_running_loop()
            started = loop.time()
            ar.start()
            while await marks(world):
                await asyncio.sleep(0.05)
                assert loop.time() - started < 60, "not copied"
            assert ar.service.worker.counters["bytes_copied"] == 40_000
            assert node.stored(w.ledger_id, 39) == b"0039" + bytes(996)
            result.append(loop.time() - started)

        simulate(body)
        return result[0]

    limited = copy_time_s(CONFIG.replace(replication_rate_bytes_per_s=rate))
    unlimited = copy_time_s(CONFIG)
    assert limited >= (40_000 - rate / 10) / rate, limited
    assert limited < 40_000 / rate + 5 and unlimited < 2, (limited, unlimited)


def test_the_integrity_check_marks_what_it_cannot_repair_by_itself() -> None:
    """A bookie's data-integrity check (BP-46) finds entries it should hold and cannot copy
    from any peer: it marks them under-replicated at once (BP-31), naming itself."""

    async def body(world: World) -> None:
        lid = await write(world, 5)
        node = world.bookie_at(world.ledger(lid).value.ensembles[0][1][0])
        drop_entries(node, lid)  # its copies are gone
        for peer in world.ledger(lid).value.ensembles[0][1][1:]:
            world.net.partition(node.name, world.bookie_at(peer).name)  # no peer to copy from
        assert node.bookie is not None
        integrity = DataIntegrity(
            node.config(), node.bookie.handler, world.metadata_store(),
            world.net.view(node.name), client_config=CLIENT_CONFIG,
        )  # fmt: skip
        try:
            with pytest.raises(BookKeeperError, match="could not be copied"):
                await integrity.check()
        finally:
            await integrity.close()
        (mark,) = await marks(world)
        (missing,) = mark.missing
        assert (mark.ledger_id, missing.bookie) == (lid, node.address)
        assert missing.reasons == ("integrity check could not repair",)
        assert set(fr.entries(missing.entries)) == set(range(5))

    simulate(body)


def test_two_workers_on_one_mark_copy_once() -> None:
    async def body(world: World) -> None:
        lid = await write(world, 10)
        node = world.bookie_at(world.ledger(lid).value.ensembles[0][1][1])
        drop_entries(node, lid)  # one replica lost them (its disk, say)
        missing = [Missing(node.address, ("test",), 1)]
        await mark_under_replicated(world.metadata_store(), lid, missing, now_ms=1)
        workers = []
        for i in range(2):
            bk = world.client(f"w{i}")
            workers.append(ReplicationWorker(bk.ctx, CONFIG, f"w{i}", lambda: 1))
        leases = [await w.store.grant_lease(2) for w in workers]
        tasks = [asyncio.create_task(w.run(x)) for w, x in zip(workers, leases, strict=True)]
        for _ in range(50):
            await asyncio.sleep(0.2)
            if not await marks(world):
                break
        for t in tasks:
            t.cancel()
        copied = sum(w.counters["entries_copied"] for w in workers)
        done = sum(w.counters["marks_done"] for w in workers)
        assert done == 1 and copied == 10, [w.statistics() for w in workers]
        assert await complete(world, lid)

    simulate(body)


@pytest.mark.parametrize("listing_syncs", [True, False])
def test_copies_a_listing_reported_survive_a_crash_of_their_target(listing_syncs: bool) -> None:
    """Copies go without the target's journal (ADD_FLAG_DEFERRED_SYNC). The target crashes
    once right after a copy was answered, before any sync: the worker's listing finds them
    gone and the job copies again. Once the mark is drained the target crashes again: what
    the listings reported was durable. With ``listing_syncs=False`` (a listing that does not
    wait for the sync, the bug this guards against) that second crash loses copies no mark
    names: the test's own check can fail."""

    async def body(world: World) -> None:
        lid = await write(world, 20)
        ensemble = world.ledger(lid).value.ensembles[0][1]
        victim = world.bookie_at(ensemble[0])
        (target,) = [b for b in world.bookies if b.address not in ensemble]
        config = target.config()  # no checkpoint or GC sync during the test
        target.config = lambda: dataclasses.replace(
            config, checkpoint_interval_s=3600.0, gc_interval_s=0.0
        )
        target.crash(power_loss=False)
        await target.start()
        if not listing_syncs:
            target.bookie.handler.deferred.pending = lambda ledger_id: False
        real_copy = worker_job.copy_entries
        crashed: list[int] = []

        async def copy_then_crash(*args: Any, **kwargs: Any) -> None:
            await real_copy(*args, **kwargs)
            if not crashed:  # the copies answered, not yet synced: lost with the process
                crashed.append(target.bookie.handler.counters["copies_deferred"])
                target.crash(power_loss=False)
                await target.start()
                if not listing_syncs:
                    target.bookie.handler.deferred.pending = lambda ledger_id: False
                for _ in range(5):  # the worker's connection to it is back
                    if await list_present(args[0], target.address, lid) != "unreachable":
                        break

        worker_job.copy_entries = copy_then_crash
        try:
            victim.lose()
            ar = SimAutorecovery(world, "ar", CONFIG)
            ar.start()
            for _ in range(100):  # the registration's lease, then the delay
                if crashed:
                    break
                await asyncio.sleep(0.2)
            await drained(world)
        finally:
            worker_job.copy_entries = real_copy
        assert crashed and crashed[0] > 0  # copies were deferred, then lost
        worker = ar.service.worker.counters
        assert worker["entries_copied"] >= 2 * 7 and worker["marks_failed"] >= 1, worker
        assert worker["copies_lost_before_sync"] == crashed[0], worker
        assert victim.address not in world.ledger(lid).value.bookies()
        assert await complete(world, lid)
        target.crash(power_loss=False)  # no sync since the listings
        await target.start()
        assert await complete(world, lid) is listing_syncs

    simulate(body)


def test_a_batch_refused_in_part_is_resumed_by_copying_only_what_is_missing() -> None:
    """Copies go to the target in batches; the target refuses one entry of a batch (its copy
    arrived corrupt: BAD_DIGEST) and stores the others. The job fails, and the retry copies
    only what the target lacks: every entry is stored exactly once, the refused one on the
    second attempt."""
    config = CONFIG.replace(replication_entries_in_flight_max=8)
    refused_entry = 5

    async def body(world: World) -> None:
        lid = await write(world, 20)
        node = world.bookie_at(world.ledger(lid).value.ensembles[0][1][1])
        drop_entries(node, lid)  # one replica lost them (its disk, say)
        handler = node.bookie.handler
        real_store = handler._store
        batches: list[list[int]] = []  # the entry ids of each add request, as they came
        stored: Counter[int] = Counter()

        def store(ledger_id: int, flags: int, key: bytes, entries: Any, packed: Any = None):
            entries = list(entries)
            if ledger_id == lid:
                ids = [e[0] for e in entries]
                if refused_entry in ids and not any(refused_entry in b for b in batches):
                    # the first time it comes: as if its bytes were damaged on the way
                    entries = [(*e[:5], False) if e[0] == refused_entry else e for e in entries]
                batches.append(ids)
            statuses, journaled = real_store(ledger_id, flags, key, entries, packed)
            if ledger_id == lid:
                stored.update(e[0] for e, st in zip(entries, statuses, strict=True) if st == 0)
            return statuses, journaled

        handler._store = store
        await mark_under_replicated(
            world.metadata_store(), lid, [Missing(node.address, ("test",), 1)], now_ms=1
        )
        ar = SimAutorecovery(world, "ar", config)
        ar.start()
        await drained(world)
        (first,) = [b for b in batches if refused_entry in b][:1]
        assert len(first) > 1, batches  # the refused entry shared its batch with others
        assert stored == Counter(range(20)), (stored, batches)  # each stored once
        offered = Counter(e for b in batches for e in b)
        assert offered[refused_entry] == 2 and sum(offered.values()) == 21, batches
        worker = ar.service.worker.counters
        assert worker["entries_copied"] == 20 and worker["marks_failed"] >= 1, worker
        assert await complete(world, lid)

    simulate(body)


def test_metadata_unavailable_mid_copy_leaves_nothing_half_done() -> None:
    slow = CONFIG.replace(replication_rate_bytes_per_s=20, replication_entries_in_flight_max=1)

    async def body(world: World) -> None:
        lid = await write(world, 20)
        before = world.ledger(lid)
        victim = world.bookie_at(before.value.ensembles[0][1][0])
        victim.lose()
        ar = SimAutorecovery(world, "ar", slow)
        ar.start()
        for _ in range(200):
            if ar.service.worker.counters["entries_copied"]:
                break  # copying (slowly) to the replacement
            await asyncio.sleep(0.1)
        world.faults.metadata_failure_rate = 1.0  # etcd goes away mid-copy
        world.calm_rates_changed()
        await asyncio.sleep(8.0)
        assert world.ledger(lid) == before  # no half-done ensemble change
        (mark,) = await marks(world)
        assert mark.plan  # the chosen replacement is kept for the next attempt
        world.faults.metadata_failure_rate = 0.0
        world.calm_rates_changed()
        for _ in range(100):
            await asyncio.sleep(0.5)
            md = world.ledger(lid).value
            if victim.address not in md.bookies() and not await marks(world):
                break
        else:
            raise AssertionError("not restored after the store came back")
        assert await complete(world, lid)
        assert ar.service.statistics()["worker"]["entries_copied"] == 20  # resumed, not redone

    simulate(body)


def test_config_refuses_nan_infinity_and_ranges_naming_the_key() -> None:
    for key, value in (
        ("audit_interval_s", float("nan")),
        ("lost_bookie_recovery_delay_s", float("inf")),
        ("lost_bookie_recovery_delay_s", -1.0),
        ("replication_workers", -1),
        ("replication_rate_bytes_per_s", 0),
        ("open_ledger_rereplication_grace_s", float("-inf")),
    ):
        with pytest.raises(ConfigError, match=key):
            AutorecoveryConfig.from_mapping({"metadata_uri": "memory://x", key: value})
    assert (
        AutorecoveryConfig.from_mapping(
            {"metadata_uri": "memory://x", "lost_bookie_recovery_delay_s": 0}
        ).lost_bookie_recovery_delay_s
        == 0
    )


# --- pure parts ---------------------------------------------------------------------------


@given(
    st.integers(1, 6).flatmap(lambda e: st.tuples(st.just(e), st.integers(1, e))),
    st.integers(0, 40),
    st.integers(-1, 60),
)
def test_index_runs_are_exactly_the_entries_whose_write_set_holds_the_index(
    quorum: tuple[int, int], first: int, last: int
) -> None:
    e, wq = quorum
    for index in range(e):
        got = set(fr.entries(fr.normalize(fr.index_runs(index, first, last, e, wq))))
        want = {x for x in range(first, last + 1) if index in write_set(x, e, wq)}
        assert got == want


@given(
    st.integers(1, 6).flatmap(lambda e: st.tuples(st.just(e), st.integers(1, e))),
    st.integers(0, 50),
    st.sets(st.integers(0, 5), max_size=3),
)
def test_copy_sources_keep_one_bookie_first_wherever_it_holds_the_entry(
    quorum: tuple[int, int], turn: int, lost: set[int]
) -> None:
    """A stored batch is read whole to serve one entry: every entry a bookie holds must be
    asked of the same bookie first, not of the write set's first (which turns per entry)."""
    e, wq = quorum
    md = LedgerMetadata(turn, e, wq, 1, ((0, tuple(f"b{i}" for i in range(e))),))
    f = fr.fragments(md)[0]
    bad = {f"b{i}" for i in lost}

    def holders(entry_id: int) -> list[str]:
        return [b for b in fr.replicas(md, f, entry_id) if b not in bad]

    firsts = {}
    for entry_id in range(60):
        order = fr.by_preference(f, holders(entry_id), turn)
        assert sorted(order) == sorted(holders(entry_id))
        if order:
            firsts[entry_id] = order[0]
    # A bookie first for one entry is first for every entry it holds that no bookie
    # preferred to it holds too: its runs are never split among other bookies.
    rank = {b: (f.ensemble.index(b) - turn) % e for b in f.ensemble}
    for first in set(firsts.values()):
        for entry_id, other in firsts.items():
            if first in holders(entry_id):
                assert rank[other] <= rank[first]
    if e == wq and len(lost & set(range(e))) < e:  # all hold all: one source for everything
        assert len(set(firsts.values())) == 1


ids = st.sets(st.integers(0, 200), max_size=60)


@given(ids, ids)
def test_range_algebra_matches_sets(a: set[int], b: set[int]) -> None:
    ra, rb = to_ranges(a), to_ranges(b)
    assert set(fr.entries(fr.subtract(ra, rb))) == a - b
    assert set(fr.entries(fr.intersect(ra, rb))) == a & b
    assert set(fr.entries(merge_ranges(ra, rb))) == a | b


@given(st.lists(st.tuples(st.sampled_from("abc"), ids, st.booleans()), min_size=1, max_size=6))
def test_marks_merge_without_losing_a_report_and_round_trip(
    reports: list[tuple[str, set[int], bool]],
) -> None:
    mark = Mark(7, (), 100)
    for n, (bookie, entries, everything) in enumerate(reports):
        ranges = () if everything or not entries else to_ranges(entries)
        mark = mark.merged([Missing(bookie, (f"r{n}",), 100 + n, ranges)])
    assert Mark.from_json_bytes(mark.to_json_bytes()) == mark
    for bookie in {r[0] for r in reports}:
        (m,) = [m for m in mark.missing if m.bookie == bookie]
        mine = [r for r in reports if r[0] == bookie]
        if any(everything or not entries for _, entries, everything in mine):
            assert m.entries == ()
        else:
            assert set(fr.entries(m.entries)) == set().union(*(e for _, e, _ in mine))


def test_the_last_segment_of_an_open_ledger_is_not_replaced() -> None:
    md = LedgerMetadata(1, 3, 3, 2, ((0, ("a", "b", "c")), (5, ("a", "b", "d"))))
    assert md.with_replicas_replaced(0, {0: "e"}).ensembles[0][1] == ("e", "b", "c")
    with pytest.raises(Exception, match="belongs to its writer"):
        md.with_replicas_replaced(5, {0: "e"})
    closed = md.closed(7, 70)
    assert closed.with_replicas_replaced(5, {2: "e"}).state is LedgerState.CLOSED
