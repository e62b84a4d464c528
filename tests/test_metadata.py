"""Metadata: the pure model, and one contract suite over the memory store and a real etcd."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper_aio.config import MetadataConfig
from bookkeeper_aio.errors import (
    IncorrectParameterError,
    MetadataUnavailableError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from bookkeeper_aio.metadata import LedgerMetadata, LedgerState, open_metadata_store, update_ledger
from bookkeeper_aio.metadata.model import IllegalLedgerTransitionError
from bookkeeper_aio.metadata.store import watch_bookies
from bookkeeper_aio.sandbox import free_port

ENSEMBLE = ("b1:1", "b2:2", "b3:3")


def make(token: str = ""):
    return lambda i: LedgerMetadata(i, 3, 3, 2, ((0, ENSEMBLE),), creator_token=token,
                                    custom_metadata={"app": b"\x00x"})  # fmt: skip


# --- model ------------------------------------------------------------------------------


@given(st.integers(0, 5), st.integers(0, 5), st.integers(0, 5))
def test_quorum_sizes_are_validated(e, w, a):
    ensemble = tuple(f"b{i}" for i in range(e))
    if e >= w >= a >= 1:
        assert LedgerMetadata(1, e, w, a, ((0, ensemble),)).ack_quorum == a
    else:
        with pytest.raises(IncorrectParameterError):
            LedgerMetadata(1, e, w, a, ((0, ensemble),))


def test_transitions_and_segments():
    md = make()(7)
    changed = md.with_ensemble_change(10, ("b1:1", "b4:4", "b3:3"))
    assert changed.ensemble_at(9) == ENSEMBLE and changed.ensemble_at(10)[1] == "b4:4"
    replaced = changed.with_ensemble_change(10, ("b1:1", "b5:5", "b3:3"))
    assert len(replaced.ensembles) == 2 and replaced.ensemble_at(10)[1] == "b5:5"
    with pytest.raises(IncorrectParameterError):
        replaced.with_ensemble_change(5, ENSEMBLE)
    closed = replaced.in_recovery().closed(9, 100)
    assert closed.state is LedgerState.CLOSED and len(closed.ensembles) == 1  # unused segment
    for illegal in (closed.in_recovery, lambda: closed.closed(9, 100),
                    lambda: closed.with_ensemble_change(10, ENSEMBLE)):  # fmt: skip
        with pytest.raises(IllegalLedgerTransitionError):
            illegal()
    with pytest.raises(IncorrectParameterError):
        LedgerMetadata(1, 3, 2, 2, ((0, ("a", "a", "b")),))


@given(st.dictionaries(st.text(max_size=5), st.binary(max_size=10), max_size=3),
       st.sampled_from(list(LedgerState)), st.integers(-1, 10**6))  # fmt: skip
def test_json_round_trip(custom, state, last):
    md = LedgerMetadata(2**62, 3, 2, 1, ((0, ENSEMBLE), (5, ("x", "y", "z"))), state=state,
                        last_entry_id=last, custom_metadata=custom, creator_token="t")  # fmt: skip
    assert LedgerMetadata.from_json_bytes(md.to_json_bytes()) == md


# --- contract suite ---------------------------------------------------------------------


@pytest.fixture(params=["memory", "etcd"])
def uri(request):
    if request.param == "memory":
        return f"memory://{uuid.uuid4().hex}"
    return request.getfixturevalue("etcd_uri")


CONFIG = MetadataConfig(lease_ttl_s=2, keepalive_interval_s=0.5, list_page_max=2)


async def test_ledgers_create_cas_delete_list(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        a = await store.create_ledger(make("token-a"))
        again = await store.create_ledger(make("token-a"))  # a retried create
        b = await store.create_ledger(make())
        assert again.value.ledger_id == a.value.ledger_id != b.value.ledger_id
        read = await store.read_ledger(a.value.ledger_id)
        assert read == a and read.value.custom_metadata == {"app": b"\x00x"}
        new = a.value.with_ensemble_change(5, ("b1:1", "b9:9", "b3:3"))
        written = await store.write_ledger(a.value.ledger_id, new, a.version)
        assert written.version > a.version
        with pytest.raises(MetadataVersionError) as conflict:
            await store.write_ledger(a.value.ledger_id, a.value.in_recovery(), a.version)
        assert conflict.value.current == written
        closed = await update_ledger(store, a.value.ledger_id,
                                     lambda v: v.value.closed(4, 10), current=a)  # fmt: skip
        assert closed.value.state is LedgerState.CLOSED and closed.value.last_entry_id == 4
        ids = {
            b.value.ledger_id,
            a.value.ledger_id,
            (await store.create_ledger(make())).value.ledger_id,
        }
        assert {i async for i in store.list_ledgers()} == ids
        with pytest.raises(MetadataVersionError):
            await store.delete_ledger(b.value.ledger_id, b.version + 1000)
        await store.delete_ledger(b.value.ledger_id, b.version)
        with pytest.raises(NoSuchLedgerError):
            await store.read_ledger(b.value.ledger_id)


async def test_watch_sees_changes_and_deletion(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        a = await store.create_ledger(make())
        lid = a.value.ledger_id
        seen = []

        async def watch():
            async for v in store.watch_ledger(lid):
                seen.append(v)

        task = asyncio.create_task(watch())
        await asyncio.sleep(0.2)
        b = await store.write_ledger(lid, a.value.in_recovery(), a.version)
        await store.delete_ledger(lid)
        await asyncio.wait_for(task, 5)
        assert seen == [b, None]


async def test_bookie_registration_and_lease_expiry(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        reg = await store.register_bookie("127.0.0.1:1", "127.0.0.1:1", "/rack-a", False)
        gone = await store.register_bookie("127.0.0.1:2", "127.0.0.1:2", None, False)
        await reg.update(read_only=True)
        bookies = await store.list_bookies()
        assert bookies["127.0.0.1:1"].read_only and bookies["127.0.0.1:1"].rack == "/rack-a"
        gone.abandon()  # a kill -9: no unregister, the lease runs out
        loop = asyncio.get_running_loop()
        start = loop.time()
        while "127.0.0.1:2" in await store.list_bookies():
            assert loop.time() - start < 10, "the abandoned lease never expired"
            await asyncio.sleep(0.1)
        assert loop.time() - start >= 1.0  # not before (about) its TTL of 2 s
        # Past the TTL, the kept-alive registration is still there.
        assert set(await store.list_bookies()) == {"127.0.0.1:1"}
        await reg.unregister()
        assert await store.list_bookies() == {}
        snapshots = watch_bookies(store, interval_s=0.1)
        assert await anext(snapshots) == {}
        await store.register_bookie("127.0.0.1:3", "127.0.0.1:3", None, False)
        assert set(await anext(snapshots)) == {"127.0.0.1:3"}
        await snapshots.aclose()


async def test_cookies_and_instance_id(uri):
    async with open_metadata_store(uri, CONFIG) as store:
        assert await store.get_instance_id() is None
        instance = await store.init_cluster()
        assert await store.init_cluster() == instance == await store.get_instance_id()
        assert await store.get_cookie("b") is None
        c1 = await store.put_cookie("b", b"one", None)
        with pytest.raises(MetadataVersionError):
            await store.put_cookie("b", b"two", None)
        c2 = await store.put_cookie("b", b"two", c1.version)
        assert (await store.get_cookie("b")) == c2 and c2.value == b"two"
        with pytest.raises(MetadataVersionError):
            await store.delete_cookie("b", c1.version)
        await store.delete_cookie("b", c2.version)
        assert await store.get_cookie("b") is None


async def test_unreachable_etcd_fails_clearly_and_quickly():
    config = MetadataConfig(call_timeout_s=0.5, retries_max=2, retry_backoff_s=0.05)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(MetadataUnavailableError, match="unreachable"):
        async with open_metadata_store(f"etcd://127.0.0.1:{free_port()}/x", config):
            pass
    assert loop.time() - start < 5
