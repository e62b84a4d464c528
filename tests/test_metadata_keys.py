"""The key contract (values, compare-and-swap, prefixes, watches, leases) on every store:
memory:// and a real etcd; plus lost replies on etcd and leases on a virtual clock."""

from __future__ import annotations

import asyncio
import random
import uuid
from contextlib import aclosing

import aetcd
import aetcd.exceptions
import pytest

from bookkeeper_aio.config import MetadataConfig
from bookkeeper_aio.errors import (
    IncorrectParameterError,
    LeaseNotFoundError,
    MetadataVersionError,
)
from bookkeeper_aio.metadata import open_metadata_store
from bookkeeper_aio.metadata.memory import MemoryMetadataStore
from bookkeeper_aio.sim.loop import VirtualTimeLoop

CONFIG = MetadataConfig(lease_ttl_s=2, keepalive_interval_s=0.25, list_page_max=2)


@pytest.fixture(params=["memory", "etcd"])
def uri(request):
    if request.param == "etcd":
        yield request.getfixturevalue("etcd_uri")
        return
    name = uuid.uuid4().hex
    yield f"memory://{name}"
    MemoryMetadataStore.forget(name)


async def next_of(iterator, timeout_s: float = 10.0):
    async with asyncio.timeout(timeout_s):
        return await anext(iterator)


async def test_put_get_and_compare_and_swap(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        assert await store.get("logs/a") is None
        created = await store.put("logs/a", b"v1", expected_version=0)
        assert await store.get("logs/a") == created and created.value == b"v1"
        with pytest.raises(MetadataVersionError) as again:
            await store.put("logs/a", b"other", expected_version=0)  # create only: exists
        assert again.value.current == created
        replaced = await store.put("logs/a", b"v2", expected_version=created.version)
        assert replaced.version > created.version
        with pytest.raises(MetadataVersionError) as stale:
            await store.put("logs/a", b"v3", expected_version=created.version)
        assert stale.value.current == replaced
        with pytest.raises(MetadataVersionError) as absent:
            await store.put("logs/missing", b"x", expected_version=7)
        assert absent.value.current is None
        forced = await store.put("logs/a", b"v4")  # unconditional
        assert (await store.get("logs/a")) == forced


async def test_concurrent_compare_and_swap_loses_no_update(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        await store.put("counters/n", b"0", expected_version=0)

        async def increment() -> None:
            while True:
                current = await store.get("counters/n")
                value = str(int(current.value) + 1).encode()
                try:
                    await store.put("counters/n", value, expected_version=current.version)
                    return
                except MetadataVersionError:
                    continue

        await asyncio.gather(*(increment() for _ in range(20)))
        assert (await store.get("counters/n")).value == b"20"


async def test_delete_conditional_and_not(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        v = await store.put("jobs/x", b"1")
        with pytest.raises(MetadataVersionError):
            await store.delete("jobs/x", expected_version=v.version + 1000)
        assert await store.delete("jobs/x", expected_version=v.version) is True
        assert await store.get("jobs/x") is None
        assert await store.delete("jobs/x") is False
        with pytest.raises(MetadataVersionError) as absent:
            await store.delete("jobs/x", expected_version=v.version)
        assert absent.value.current is None


async def test_list_and_delete_prefix_in_pages_respect_boundaries(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        for name in ("a/1", "a/2", "a/3", "a/30", "a/4", "ab/1", "b/1"):
            await store.put(f"t/{name}", name.encode())
        listed = [(k, v.value) async for k, v in store.list_prefix("t/a/")]
        assert listed == [(f"t/a/{n}", f"a/{n}".encode()) for n in ("1", "2", "3", "30", "4")]
        assert [k async for k, _ in store.list_prefix("t/a/3")] == ["t/a/3", "t/a/30"]
        assert await store.delete_prefix("t/a/") == 5
        assert [k async for k, _ in store.list_prefix("t/")] == ["t/ab/1", "t/b/1"]
        assert [k async for k, _ in store.list_prefix("nothing/")] == []


@pytest.mark.parametrize(
    "bad",
    ["", "/a", "a//b", "a/", "a b", "tab\there", "ledgers/1", "bookies/x", "cookies", "x" * 1025],
)
async def test_bad_keys_are_refused_before_the_store_is_touched(uri, bad):
    async with open_metadata_store(uri, CONFIG) as store:
        with pytest.raises(IncorrectParameterError):
            await store.put(bad, b"x")
        with pytest.raises(IncorrectParameterError):
            await store.get(bad)


async def test_bad_prefixes_and_values_are_refused(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        for bad in ("led", "ledgers/", "", "c"):  # "led" and "c" would list ledgers/, cookies/
            with pytest.raises(IncorrectParameterError):
                async for _ in store.list_prefix(bad):
                    pass
        with pytest.raises(IncorrectParameterError, match="value_bytes_max"):
            await store.put("big/x", b"x" * (CONFIG.value_bytes_max + 1))
        with pytest.raises(IncorrectParameterError, match="bytes"):
            await store.put("big/x", "text")  # type: ignore[arg-type]


async def test_watch_a_key_sees_every_state(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        watch = store.watch("elect/leader")
        async with aclosing(watch):
            assert await next_of(watch) is None
            a = await store.put("elect/leader", b"a", expected_version=0)
            assert await next_of(watch) == a
            await store.put("elect/leaderX", b"other key")  # not this one
            b = await store.put("elect/leader", b"b", expected_version=a.version)
            assert await next_of(watch) == b
            await store.delete("elect/leader")
            assert await next_of(watch) is None
            c = await store.put("elect/leader", b"c")
            assert await next_of(watch) == c


async def test_watch_a_prefix_yields_snapshots(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        await store.put("ur/1", b"x")
        watch = store.watch_prefix("ur/")
        async with aclosing(watch):
            first = await next_of(watch)
            assert {k: v.value for k, v in first.items()} == {"ur/1": b"x"}
            await store.put("ur/2", b"y")
            assert set(await next_of(watch)) == {"ur/1", "ur/2"}
            await store.put("urx/3", b"not under ur/")
            await store.delete("ur/1")
            assert set(await next_of(watch)) == {"ur/2"}


async def test_keys_under_a_lease_vanish_when_it_is_revoked_or_expires(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        lease = await store.grant_lease(2)
        await store.put("locks/a", b"me", expected_version=0, lease=lease)
        await store.put("locks/plain", b"kept")
        await asyncio.sleep(3)  # the keepalive holds it past its TTL
        assert (await store.get("locks/a")).value == b"me" and lease.alive
        await lease.revoke()
        assert await store.get("locks/a") is None
        assert (await store.get("locks/plain")).value == b"kept"
        with pytest.raises(LeaseNotFoundError):
            await store.put("locks/b", b"x", lease=lease)

        crashed = await store.grant_lease(2)
        await store.put("locks/c", b"crashed owner", lease=crashed)
        watch = store.watch("locks/c")
        async with aclosing(watch):
            assert (await next_of(watch)).value == b"crashed owner"
            crashed.abandon()  # the owner died: no more keepalives
            assert await next_of(watch, timeout_s=15) is None


async def test_an_owner_learns_its_lease_was_lost(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        lease = await store.grant_lease(2)
        other = await store.grant_lease(2)
        # Someone else (an operator, etcd itself) ends the lease under its owner.
        other.lease_id, saved = lease.lease_id, other.lease_id
        await other._revoke()
        other.lease_id = saved
        async with asyncio.timeout(5):
            await lease.lost.wait()
        assert not lease.alive
        await other.revoke()


async def test_etcd_lost_replies_on_keys_are_recognized(etcd_uri, monkeypatch):
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
        a = await store.put("k/a", b"1", expected_version=0)
        assert a == await store.get("k/a")
        lose["next"] = True
        b = await store.put("k/a", b"2", expected_version=a.version)
        assert b == await store.get("k/a")
        lose["next"] = True
        assert await store.delete("k/a", expected_version=b.version) is True
        assert await store.get("k/a") is None
        assert store.statistics()["retries"] == 3


def test_memory_key_leases_run_on_the_loop_clock():
    async def scenario() -> list[tuple[float, bool]]:
        loop = asyncio.get_running_loop()
        store = MemoryMetadataStore(config=MetadataConfig(), rng=random.Random(3))
        lease = await store.grant_lease(10)
        await store.put("auditor", b"me", lease=lease)
        seen = []
        await asyncio.sleep(3600)
        seen.append((loop.time(), await store.get("auditor") is not None))
        lease.abandon()
        await asyncio.sleep(11)
        seen.append((round(loop.time()), await store.get("auditor") is not None))
        await store.close()
        return seen

    loop = VirtualTimeLoop()
    try:
        seen = loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert seen == [(3600, True), (3611, False)]
