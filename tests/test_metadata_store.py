"""One contract suite for every metadata store (memory://, and a real etcd), plus the parts
only etcd has: unreachable endpoints, lost replies, restarts, two processes, readable JSON."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
import uuid
from contextlib import aclosing
from pathlib import Path

import aetcd
import aetcd.exceptions
import pytest

from bookkeeper_aio.config import MetadataConfig
from bookkeeper_aio.errors import (
    ConfigError,
    IncorrectParameterError,
    MetadataUnavailableError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from bookkeeper_aio.etcd_server import EtcdServer, etcd_binary, free_ports
from bookkeeper_aio.metadata import (
    LedgerMetadata,
    LedgerState,
    open_metadata_store,
    parse_metadata_uri,
    update_ledger,
)
from bookkeeper_aio.metadata.etcd import EtcdMetadataStore
from bookkeeper_aio.metadata.memory import MemoryFaults, MemoryMetadataStore
from bookkeeper_aio.metadata.model import MAX_LEDGER_ID, time_ordered_ledger_id
from bookkeeper_aio.metadata.store_shared import tombstone_key

ENSEMBLE = ("b1:1", "b2:2", "b3:3")
CONFIG = MetadataConfig(lease_ttl_s=1, keepalive_interval_s=0.25, list_page_max=2)


def make(token: str = "", **changes):
    def build(ledger_id: int) -> LedgerMetadata:
        return LedgerMetadata(ledger_id, 3, 3, 2, ((0, ENSEMBLE),), creator_token=token,
                              custom_metadata={"app": b"\x00x"}, **changes)  # fmt: skip

    return build


def add_segment(v):
    """A transform: a new segment one entry after the last one, with a fresh first bookie."""
    first, ensemble = v.value.last_ensemble()
    return v.value.with_ensemble_change(first + 1, (f"n{first + 1}:1", *ensemble[1:]))


@pytest.fixture(params=["memory", "etcd"])
def uri(request):
    if request.param == "etcd":
        yield request.getfixturevalue("etcd_uri")
        return
    name = uuid.uuid4().hex
    yield f"memory://{name}"
    MemoryMetadataStore.forget(name)


# --- the contract ------------------------------------------------------------------------


async def test_ids_are_unique_and_create_is_idempotent(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        created = await asyncio.gather(*(store.create_ledger(make()) for _ in range(30)))
        ids = [v.value.ledger_id for v in created]
        assert len(set(ids)) == 30 and all(1 <= i <= MAX_LEDGER_ID for i in ids)
        assert all(v.value.creator_token for v in created)  # the store supplies one
        first = await store.create_ledger(make("token-a"))
        again = await store.create_ledger(make("token-a"))  # a client retrying a lost reply
        assert again == first
        read = await store.read_ledger(first.value.ledger_id)
        assert read == first and read.value.custom_metadata == {"app": b"\x00x"}


async def test_etcd_ledger_ids_grow_with_the_clock(etcd_uri):
    """A bookie's rocksdb engine appends a newer ledger's keys after the older ones' instead of
    compacting them again (metadata/model.py, time_ordered_ledger_id)."""
    async with open_metadata_store(etcd_uri, CONFIG) as store:
        assert isinstance(store, EtcdMetadataStore)
        now = [1_800_000_000.0]
        store.clock = lambda: now[0]
        ids = []
        for _ in range(5):
            ids.append((await store.create_ledger(make())).value.ledger_id)
            now[0] += 0.01  # 10 ms: a float's ms never rounds back
        assert ids == sorted(ids) and len(set(ids)) == 5


async def test_restore_stores_a_ledger_under_its_own_id_only_if_the_id_is_free(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        md = make("token-r")(4242)
        restored = await store.restore_ledger(md)
        assert restored is not None and restored == await store.read_ledger(4242)
        assert await store.restore_ledger(md.in_recovery()) is None  # taken: kept as it is
        assert (await store.read_ledger(4242)).value == md
        assert [i async for i in store.list_ledgers()] == [4242]


async def test_compare_and_swap_conflict_carries_the_current_value(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        a = await store.create_ledger(make())
        lid = a.value.ledger_id
        written = await store.write_ledger(lid, add_segment(a), a.version)
        assert written.version > a.version and written == await store.read_ledger(lid)
        with pytest.raises(MetadataVersionError) as conflict:
            await store.write_ledger(lid, a.value.in_recovery(), a.version)
        assert conflict.value.current == written and conflict.value.code == -17
        closed = await update_ledger(store, lid, lambda v: v.value.closed(0, 10), current=a)
        assert closed.value.state is LedgerState.CLOSED and len(closed.value.ensembles) == 1


async def test_concurrent_writers_lose_no_update(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        stale = await store.create_ledger(make())
        lid = stale.value.ledger_id
        # Every writer starts from the same stale version: all but one conflict, then retry.
        await asyncio.gather(
            *(update_ledger(store, lid, add_segment, 50, current=stale) for _ in range(8))
        )
        final = (await store.read_ledger(lid)).value
        assert [f for f, _ in final.ensembles] == list(range(9))


async def test_delete_with_version_and_listing_in_pages(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        ledgers = [await store.create_ledger(make()) for _ in range(5)]
        ids = sorted(v.value.ledger_id for v in ledgers)
        assert [i async for i in store.list_ledgers()] == ids  # pages of 2
        victim = ledgers[0]
        moved = await store.write_ledger(victim.value.ledger_id, add_segment(victim),
                                         victim.version)  # fmt: skip
        with pytest.raises(MetadataVersionError) as conflict:
            await store.delete_ledger(victim.value.ledger_id, victim.version)
        assert conflict.value.current == moved
        await store.delete_ledger(victim.value.ledger_id, moved.version)
        await store.delete_ledger(ledgers[1].value.ledger_id)  # unconditional
        with pytest.raises(NoSuchLedgerError):
            await store.read_ledger(victim.value.ledger_id)
        gone = {victim.value.ledger_id, ledgers[1].value.ledger_id}
        assert [i async for i in store.list_ledgers()] == [i for i in ids if i not in gone]


async def test_tombstone_replaces_the_ledger_at_its_version_and_blocks_its_id(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        a = await store.create_ledger(make("token-t"))
        lid = a.value.ledger_id
        moved = await store.write_ledger(lid, add_segment(a), a.version)
        with pytest.raises(MetadataVersionError) as conflict:
            await store.tombstone_ledger(lid, a.version, b'{"t": 1}')
        assert conflict.value.current == moved
        assert await store.get(tombstone_key(lid)) is None  # nothing changed
        stone = await store.tombstone_ledger(lid, moved.version, b'{"t": 1}')
        assert stone.value == b'{"t": 1}' and stone.version > moved.version
        assert await store.get(tombstone_key(lid)) == stone
        with pytest.raises(NoSuchLedgerError):
            await store.read_ledger(lid)
        assert lid not in [i async for i in store.list_ledgers()]
        with pytest.raises(NoSuchLedgerError):  # a second delete
            await store.tombstone_ledger(lid, stone.version, b'{"t": 2}')
        # The creator token went with the ledger: the same token creates a new ledger.
        b = await store.create_ledger(make("token-t"))
        assert b.value.ledger_id != lid


async def test_a_create_never_draws_a_tombstoned_id(uri):
    async with open_metadata_store(uri, CONFIG, rng=random.Random(7)) as store:
        if isinstance(store, EtcdMetadataStore):  # time-ordered ids: this clock, this rng
            store.clock = lambda: 1_800_000_000.0
            first = time_ordered_ledger_id(1_800_000_000_000, random.Random(7))
        else:
            first = random.Random(7).randint(1, MAX_LEDGER_ID)  # the id the store draws first
        stone = await store.put(tombstone_key(first), b"{}")
        created = await store.create_ledger(make("token-draw"))  # no token drawn from the rng
        assert created.value.ledger_id != first
        assert await store.get(tombstone_key(first)) == stone


async def test_bad_inputs_are_clear_errors(uri):
    async with open_metadata_store(uri, CONFIG.replace(value_bytes_max=4096)) as store:
        for call in (store.read_ledger(12345), store.delete_ledger(12345),
                     store.write_ledger(12345, make()(12345), 1)):  # fmt: skip
            with pytest.raises(NoSuchLedgerError, match="12345"):
                await call
        with pytest.raises(NoSuchLedgerError):
            await anext(store.watch_ledger(12345))
        with pytest.raises(IncorrectParameterError, match="value_bytes_max"):
            await store.create_ledger(
                lambda i: make()(i).__class__(**{**make()(i).__dict__,
                                                "custom_metadata": {"big": b"x" * 5000}})
            )  # fmt: skip
        for bad in ("", "a/b", "x" * 300):
            with pytest.raises(IncorrectParameterError, match="bookie id"):
                await store.register_bookie(bad, "127.0.0.1:1", None, False)
        assert [i async for i in store.list_ledgers()] == []


async def test_watch_delivers_every_change_in_order(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        a = await store.create_ledger(make())
        lid = a.value.ledger_id
        watch = store.watch_ledger(lid)
        assert await anext(watch) == a  # the current value first
        b = await store.write_ledger(lid, add_segment(a), a.version)
        c = await store.write_ledger(lid, b.value.in_recovery(), b.version)
        d = await store.write_ledger(lid, c.value.closed(0, 1), c.version)
        seen = [await asyncio.wait_for(anext(watch), 5) for _ in range(3)]
        assert seen == [b, c, d]
        await store.delete_ledger(lid)
        assert await asyncio.wait_for(anext(watch), 5) is None
        with pytest.raises(StopAsyncIteration):
            await anext(watch)
        e = await store.create_ledger(make())
        later = store.watch_ledger(e.value.ledger_id, since_version=e.version)
        f = await store.write_ledger(e.value.ledger_id, add_segment(e), e.version)
        assert await asyncio.wait_for(anext(later), 5) == f  # nothing older than asked
        await later.aclose()


async def test_bookie_registration_lease_expiry_and_watch(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        snapshots = store.watch_bookies()
        assert await anext(snapshots) == {}
        a = await store.register_bookie("127.0.0.1:1", "127.0.0.1:1", "/zone-a/rack-1", False)
        assert set(await anext(snapshots)) == {"127.0.0.1:1"}
        b = await store.register_bookie("127.0.0.1:2", "127.0.0.1:2", None, False)
        assert set(await anext(snapshots)) == {"127.0.0.1:1", "127.0.0.1:2"}
        await a.update(read_only=True)
        latest = await anext(snapshots)
        assert latest["127.0.0.1:1"].read_only and latest["127.0.0.1:1"].rack == "/zone-a/rack-1"
        assert await store.list_bookies() == latest
        b.abandon()  # what kill -9 looks like: no unregister, the lease runs out
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert set(await asyncio.wait_for(anext(snapshots), 4)) == {"127.0.0.1:1"}
        assert loop.time() - start > 0.5  # it took the lease, not the abandon, to drop it
        await asyncio.sleep(1.2)  # longer than the TTL: keepalives hold the other one
        assert set(await store.list_bookies()) == {"127.0.0.1:1"} and a.renewals >= 3
        await a.unregister()
        assert await asyncio.wait_for(anext(snapshots), 2) == {}
        async with await store.register_bookie("c:3", "c:3", None, True):
            assert (await store.list_bookies())["c:3"].read_only
        assert await store.list_bookies() == {}
        await snapshots.aclose()


async def test_cookies_are_versioned(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        assert await store.get_cookie("b:1") is None
        c1 = await store.put_cookie("b:1", b"one", None)
        with pytest.raises(MetadataVersionError) as exists:
            await store.put_cookie("b:1", b"two", None)
        assert exists.value.current == c1
        c2 = await store.put_cookie("b:1", b"two", c1.version)
        assert await store.get_cookie("b:1") == c2 and c2.value == b"two"
        with pytest.raises(MetadataVersionError):
            await store.delete_cookie("b:1", c1.version)
        await store.delete_cookie("b:1", c2.version)
        assert await store.get_cookie("b:1") is None


async def test_instance_id_is_created_once(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        assert await store.get_instance_id() is None
        ids = await asyncio.gather(*(store.init_cluster() for _ in range(5)))
        assert len(set(ids)) == 1 and uuid.UUID(ids[0])
    async with open_metadata_store(uri, CONFIG) as other:
        assert await other.init_cluster() == ids[0] == await other.get_instance_id()
        assert isinstance(other.statistics(), dict)


# --- URIs and the memory store's faults --------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    ["localhost:2379", "zk://h:1/x", "etcd://h:1", "etcd://h:1/", "etcd:///x", "etcd://h/x",
     "etcd://h:1/a b", "etcd://h:99999/x"],
)  # fmt: skip
def test_malformed_uris_are_refused(bad):
    with pytest.raises(ConfigError, match=r"etcd://HOST:PORT|HOST:PORT"):
        parse_metadata_uri(bad)


def test_uris_parse():
    assert parse_metadata_uri("etcd://a:1,b:2/bk/x").endpoints == ("a:1", "b:2")
    assert parse_metadata_uri("etcd://a:1/bk/x/").root == "/bk/x"
    assert parse_metadata_uri("memory://").root == "default"


async def test_memory_lost_replies_are_safe_to_retry():
    faults = MemoryFaults(random.Random(7), lost_reply_rate=0.5)
    store = MemoryMetadataStore(faults=faults)
    created = set()
    for n in range(10):
        for _ in range(20):  # the client retries until it hears back
            try:
                created.add((await store.create_ledger(make(f"t{n}"))).value.ledger_id)
                break
            except MetadataUnavailableError:
                continue
    assert len(created) == 10 == len(store.state.ledgers)
    assert store.statistics()["injected_lost_replies"] > 0


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """The loop clock jumps to the next timer instead of sleeping (no real I/O allowed)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        select = self._selector.select

        def jump(timeout=None):
            self.now += timeout or 0.0
            return select(0)

        self._selector.select = jump

    def time(self) -> float:
        return self.now


def test_memory_leases_run_on_the_loop_clock():
    """An hour of keepalives and a lease expiry, in virtual time: deterministic and instant."""

    async def scenario() -> list[tuple[float, list[str]]]:
        loop = asyncio.get_running_loop()
        store = MemoryMetadataStore(config=MetadataConfig(), rng=random.Random(1))
        seen = []

        async def watch():
            async for snapshot in store.watch_bookies():
                seen.append((round(loop.time(), 3), list(snapshot)))

        watcher = asyncio.ensure_future(watch())
        await asyncio.sleep(0)
        alive = await store.register_bookie("a:1", "a:1", None, False)
        dead = await store.register_bookie("b:1", "b:1", None, False)
        await asyncio.sleep(3600)
        dead.abandon()
        await asyncio.sleep(60)
        assert 1219 <= alive.renewals <= 1220  # every 3 s for 3660 s
        await alive.unregister()
        await asyncio.sleep(1)
        await store.close()
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        return seen

    loop = VirtualTimeLoop()
    started = time.perf_counter()
    try:
        seen = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert time.perf_counter() - started < 2
    # b's last renewal was at 3597 s (every 3 s); its 10 s lease ran out at 3607 s.
    assert seen == [(0, []), (0, ["a:1"]), (0, ["a:1", "b:1"]), (3607, ["a:1"]), (3660, [])]


def test_a_keepalive_survives_any_error_and_keeps_the_bookie_registered(caplog):
    """A refresh failing with something unexpected is logged and retried; the bookie stays
    in the registry (the keepalive once ended silently on anything but unavailability)."""

    async def scenario() -> tuple[int, int, list[str], bool]:
        store = MemoryMetadataStore(config=MetadataConfig(), rng=random.Random(1))
        registration = await store.register_bookie("a:1", "a:1", None, False)
        refresh, failures = registration._refresh, 0

        async def flaky() -> bool:
            nonlocal failures
            if failures < 3:
                failures += 1
                raise RuntimeError("a surprise")
            return await refresh()

        registration._refresh = flaky
        await asyncio.sleep(60)
        bookies = list(await store.list_bookies())
        active = registration.active
        await registration.unregister()
        await store.close()
        return registration.failures, registration.renewals, bookies, active

    loop = VirtualTimeLoop()
    try:
        failures, renewals, bookies, active = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert failures == 3 and renewals >= 10 and active
    assert bookies == ["a:1"]
    assert "lease keepalive failed" in caplog.text and "a surprise" in caplog.text


# --- etcd only ---------------------------------------------------------------------------


async def test_unreachable_etcd_fails_clearly_and_quickly():
    config = MetadataConfig(call_timeout_s=0.5, retries_max=3, retry_backoff_s=0.05)
    ports = free_ports(2)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(MetadataUnavailableError, match="unreachable") as raised:
        async with open_metadata_store(f"etcd://127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/x",
                                       config):  # fmt: skip
            pass
    assert loop.time() - start < 2
    assert f"127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}" in str(raised.value)


async def test_lost_replies_are_recognized_not_repeated(etcd_uri, monkeypatch):
    """The first attempt of each transaction lands but its reply is 'lost'; the retry must
    report what happened, not a conflict."""
    real = aetcd.Client.transaction
    lose = {"next": False}

    async def flaky(self, *args, **kwargs):
        result = await real(self, *args, **kwargs)
        if lose["next"]:
            lose["next"] = False
            raise aetcd.exceptions.ConnectionFailedError("reply lost (test)")
        return result

    monkeypatch.setattr(aetcd.Client, "transaction", flaky)
    async with open_metadata_store(etcd_uri, CONFIG) as store:
        lose["next"] = True
        a = await store.create_ledger(make("tok"))
        assert [i async for i in store.list_ledgers()] == [a.value.ledger_id]
        lose["next"] = True
        b = await store.write_ledger(a.value.ledger_id, add_segment(a), a.version)
        assert b == await store.read_ledger(a.value.ledger_id)
        lose["next"] = True
        cookie = await store.put_cookie("b:1", b"c", None)
        assert cookie == await store.get_cookie("b:1")
        lose["next"] = True
        await store.delete_cookie("b:1", cookie.version)
        lose["next"] = True
        await store.delete_ledger(a.value.ledger_id, b.version)
        assert [i async for i in store.list_ledgers()] == []
        assert store.statistics()["retries"] == 5


async def test_a_compacted_watch_history_skips_to_the_current_value(etcd_uri, monkeypatch):
    real = aetcd.Client.watch
    compacted = {"once": True}

    async def watch(self, *args, **kwargs):
        if compacted.pop("once", False):
            raise aetcd.exceptions.RevisionCompactedError(10**9)
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(aetcd.Client, "watch", watch)
    async with open_metadata_store(etcd_uri, CONFIG) as store:
        a = await store.create_ledger(make())
        lid = a.value.ledger_id
        changes = store.watch_ledger(lid)
        assert await anext(changes) == a
        b = await store.write_ledger(lid, add_segment(a), a.version)
        c = await store.write_ledger(lid, add_segment(b), b.version)
        assert await asyncio.wait_for(anext(changes), 5) == c  # b was compacted away
        d = await store.write_ledger(lid, add_segment(c), c.version)
        assert await asyncio.wait_for(anext(changes), 5) == d
        assert store.statistics()["watch_compacted"] == 1
        await changes.aclose()


async def test_clients_ride_out_an_etcd_restart():
    config = MetadataConfig(lease_ttl_s=5, keepalive_interval_s=0.5, call_timeout_s=10)
    async with EtcdServer(unsafe_no_fsync=True) as etcd, \
            open_metadata_store(etcd.uri("restart"), config) as store:  # fmt: skip
        a = await store.create_ledger(make())
        lid = a.value.ledger_id
        await store.register_bookie("b:1", "b:1", None, False)
        watch = store.watch_ledger(lid)
        assert await anext(watch) == a
        current = a
        for kill in (False, True):  # SIGTERM, then SIGKILL
            pending = asyncio.ensure_future(anext(watch))  # the etcd watch is open
            await asyncio.sleep(0.2)
            await asyncio.to_thread(etcd.restart, kill)
            current = await store.write_ledger(lid, add_segment(current), current.version)
            assert await asyncio.wait_for(pending, 10) == current  # the watch resumed
            assert set(await store.list_bookies()) == {"b:1"}  # the lease survived
        assert store.statistics()["watch_resumes"] == 2
        await watch.aclose()


async def test_a_dead_member_of_three_is_skipped():
    async with EtcdServer(members=3, unsafe_no_fsync=True) as etcd, \
            open_metadata_store(etcd.uri("three"), CONFIG) as store:  # fmt: skip
        a = await store.create_ledger(make())
        await asyncio.to_thread(etcd.procs[0].kill)  # the endpoint the store talks to
        b = await store.write_ledger(a.value.ledger_id, add_segment(a), a.version)
        assert await store.read_ledger(a.value.ledger_id) == b
        assert store.statistics()["retries"] >= 1


async def test_two_processes_compare_and_swap(etcd_uri):
    async with open_metadata_store(etcd_uri, CONFIG) as store:
        created = await store.create_ledger(make())
        lid = created.value.ledger_id
        script = (
            "import asyncio, sys\n"
            "from bookkeeper_aio.metadata import open_metadata_store, update_ledger\n"
            "def add_segment(v):\n"
            "    first, ensemble = v.value.last_ensemble()\n"
            "    new = (f'm{first + 1}:1', *ensemble[1:])\n"
            "    return v.value.with_ensemble_change(first + 1, new)\n"
            "async def main():\n"
            "    async with open_metadata_store(sys.argv[1]) as store:\n"
            "        for _ in range(50):\n"
            "            await update_ledger(store, int(sys.argv[2]), add_segment, 100)\n"
            "asyncio.run(main())\n"
        )
        root = Path(__file__).parent.parent
        other = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, etcd_uri, str(lid), cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
        )  # fmt: skip
        async with aclosing(store.watch_ledger(lid, created.version)) as changes:
            await asyncio.wait_for(anext(changes), 30)  # the other process is writing now
        for _ in range(50):
            await update_ledger(store, lid, add_segment, 100)
        assert await asyncio.wait_for(other.wait(), 30) == 0
        final = (await store.read_ledger(lid)).value
        assert [f for f, _ in final.ensembles] == list(range(101))
        writers = {e[0][0] for _, e in final.ensembles[1:]}
        assert writers == {"m", "n"}


async def test_values_are_readable_json_in_etcdctl(etcd, etcd_uri):
    async with open_metadata_store(etcd_uri, CONFIG) as store:
        await store.init_cluster()
        lid = (await store.create_ledger(make("tok"))).value.ledger_id
        async with await store.register_bookie("b:1", "b:1", "/r1", False):
            root = parse_metadata_uri(etcd_uri).root
            etcdctl = str(etcd_binary().parent / "etcdctl")
            shown = await asyncio.to_thread(
                subprocess.run, [etcdctl, "--endpoints", etcd.endpoints[0], "get", "--prefix",
                                 root], capture_output=True, text=True, timeout=10, check=True,
            )  # fmt: skip
    out = shown.stdout.splitlines()
    values = dict(zip(out[::2], out[1::2], strict=True))
    assert json.loads(values[f"{root}/ledgers/{lid:020d}"])["state"] == "OPEN"
    assert json.loads(values[f"{root}/bookies/b:1"])["rack"] == "/r1"
    assert values[f"{root}/creators/tok"] == str(lid)
    assert uuid.UUID(values[f"{root}/instanceid"])
