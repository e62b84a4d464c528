"""The garbage collector's decisions and the tombstone model, in process (memory store and
engine, a clock the test moves): what is deleted, what is kept, who confirms, the TTL."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from bookkeeper_aio.bookie.gc import GarbageCollector
from bookkeeper_aio.bookie.server import Bookie
from bookkeeper_aio.config import BookieConfig
from bookkeeper_aio.engine import LedgerInfo
from bookkeeper_aio.errors import ConfigError, IncorrectParameterError, MetadataFormatError
from bookkeeper_aio.metadata.memory import MemoryMetadataStore
from bookkeeper_aio.metadata.model import LedgerMetadata
from bookkeeper_aio.metadata.store import MetadataStore, open_metadata_store
from bookkeeper_aio.metadata.tombstones import (
    ClusterOptions,
    Tombstone,
    read_tombstone,
    set_cluster_option,
)
from bookkeeper_aio.shell import cluster
from engines.memory import MemoryEngine
from tests.wire import bookie_config

ME, PEER = "127.0.0.1:3181", "127.0.0.1:3182"
ENSEMBLE = (ME, PEER)
DAY_MS = 86_400_000


@pytest.fixture
async def store() -> AsyncIterator[MetadataStore]:
    name = uuid.uuid4().hex
    async with open_metadata_store(f"memory://{name}") as s:
        yield s
    MemoryMetadataStore.forget(name)


class Clock:
    def __init__(self) -> None:
        self.ms = 10 * DAY_MS

    def __call__(self) -> int:
        return self.ms


def _collector(store: MetadataStore, engine: MemoryEngine, clock: Clock, **config: object):
    checkpoints: list[int] = []
    forgotten: list[int] = []

    async def checkpoint() -> None:
        checkpoints.append(len(engine.ledgers()))

    async def reclaim(ratio: float) -> int:
        return engine.reclaim_space(ratio)

    settings: dict[str, object] = {"listen": ME, "ledger_dirs": ("x",), "engine": "memory"}
    cfg = BookieConfig(**{**settings, **config})  # type: ignore[arg-type]
    gc = GarbageCollector(cfg, engine, store, incarnation="i1", forget=forgotten.append,
                          checkpoint=checkpoint, reclaim=reclaim, wall_clock_ms=clock)  # fmt: skip
    return gc, checkpoints, forgotten


async def _ledger(store: MetadataStore, engine: MemoryEngine) -> int:
    v = await store.create_ledger(lambda i: LedgerMetadata(i, 2, 2, 2, ((0, ENSEMBLE),)))
    lid = v.value.ledger_id
    engine.put_ledger(lid, LedgerInfo(b"k" * 20))
    engine.put_entry(lid, 0, b"entry")
    return lid


async def _tombstone(store: MetadataStore, lid: int, now_ms: int) -> None:
    current = await store.read_ledger(lid)
    stone = Tombstone(lid, now_ms, current.value.ensembles)
    await store.tombstone_ledger(lid, current.version, stone.to_json_bytes())


async def test_only_explicitly_tombstoned_ledgers_are_deleted(store):
    engine, clock = MemoryEngine(), Clock()
    gc, checkpoints, forgotten = _collector(store, engine, clock)
    live, doomed, orphan = [await _ledger(store, engine) for _ in range(3)]
    await _tombstone(store, doomed, clock.ms)
    await store.delete_ledger(orphan)  # its metadata removed by hand: no tombstone
    engine.put_entry(12345, 0, b"never had metadata here")  # another orphan
    figures = await gc.collect()
    assert figures["ledgers_deleted"] == 1 and figures["orphans"] == 2
    assert figures["orphan_ids"] == sorted([orphan, 12345])
    assert engine.ledgers() == sorted([live, orphan, 12345]) and forgotten == [doomed]
    assert checkpoints == [3]  # the delete made durable before the confirmation
    stone = await read_tombstone(store, doomed)
    assert stone is not None and stone.value.confirmed == (ME,)  # the peer has not confirmed
    again = await gc.collect()  # nothing more to do; orphans still kept and counted
    assert again["ledgers_deleted"] == 0 and again["orphans"] == 2 and len(checkpoints) == 1
    assert gc.statistics()["ledgers_deleted"] == 1 and gc.statistics()["passes"] == 2
    json.dumps([figures, gc.statistics()])  # JSON-able: what PUT /api/v1/bookie/gc returns


async def test_the_last_confirmation_removes_the_tombstone(store):
    engine, clock = MemoryEngine(), Clock()
    gc, _, _ = _collector(store, engine, clock)
    peer_gc, _, _ = _collector(store, MemoryEngine(), clock, listen=PEER)
    lid = await _ledger(store, engine)
    await _tombstone(store, lid, clock.ms)
    await peer_gc.collect()  # the peer never held it: it confirms at once
    assert (await read_tombstone(store, lid)).value.confirmed == (PEER,)
    figures = await gc.collect()
    assert figures["tombstones_removed"] == 1 and await read_tombstone(store, lid) is None
    assert engine.ledgers() == []


async def test_a_tombstoned_id_with_metadata_again_is_kept(store):
    """Belt and braces: the create refuses tombstoned ids, and the collector deletes only
    ledgers whose metadata is absent."""
    engine, clock = MemoryEngine(), Clock()
    gc, _, _ = _collector(store, engine, clock)
    lid = await _ledger(store, engine)
    await store.put(
        f"tombstones/{lid:020d}", Tombstone(lid, clock.ms, ((0, ENSEMBLE),)).to_json_bytes()
    )
    figures = await gc.collect()
    assert figures["ledgers_deleted"] == 0 and engine.ledgers() == [lid]


async def test_expired_tombstones_go_and_a_bookie_away_longer_keeps_what_it_cannot_check(store):
    engine, clock = MemoryEngine(), Clock()
    gc, _, _ = _collector(store, engine, clock, tombstone_ttl_s=86_400.0)
    await gc.collect()  # its first pass: recorded
    lid = await _ledger(store, engine)
    await _tombstone(store, lid, clock.ms - 2 * DAY_MS)  # expired: deleted and removed
    figures = await gc.collect()
    assert figures["tombstones_expired"] == 1 and figures["ledgers_deleted"] == 1
    assert await read_tombstone(store, lid) is None
    assert not figures["away_longer_than_ttl"]
    # Away two days: a ledger without metadata may be one whose tombstone expired meanwhile.
    ghost = await _ledger(store, engine)
    await store.delete_ledger(ghost)
    clock.ms += 2 * DAY_MS
    figures = await gc.collect()
    assert figures["away_longer_than_ttl"] and figures["orphan_ids"] == [ghost]
    assert engine.ledgers() == [ghost]
    clock.ms += 1000
    assert (await gc.collect())["away_longer_than_ttl"]  # sticky: said at every pass
    # Formatted again (a new incarnation): a fresh start.
    fresh, _, _ = _collector(store, MemoryEngine(), clock, tombstone_ttl_s=86_400.0)
    fresh.incarnation = "i2"
    assert not (await fresh.collect())["away_longer_than_ttl"]


def test_tombstone_json_and_rules():
    t = Tombstone(7, 1000, ((0, ("a:1", "b:1")), (5, ("a:1", "c:1"))), log="orders")
    assert t.bookies == ("a:1", "b:1", "c:1") and not t.complete
    assert Tombstone.from_json_bytes(t.to_json_bytes()) == t
    done = t.confirmed_by("a:1").confirmed_by("c:1").confirmed_by("b:1").confirmed_by("a:1")
    assert done.confirmed == ("a:1", "b:1", "c:1") and done.complete
    assert t.expired(1000 + 86_400_001, 86_400) and not t.expired(1000 + 86_400_000, 86_400)
    with pytest.raises(MetadataFormatError):
        Tombstone.from_json_bytes(b'{"ledger_id": 1}')
    with pytest.raises(MetadataFormatError):
        ClusterOptions.from_json_bytes(b'{"require_archival_before_delete": "yes"}')


async def test_cluster_options_keep_unknown_keys(store):
    await store.put("cluster/config", b'{"future_option": 3}')
    options = await set_cluster_option(store, "require_archival_before_delete", True)
    assert options.require_archival_before_delete and options.extra == {"future_option": 3}
    with pytest.raises(IncorrectParameterError, match="unknown cluster option"):
        await set_cluster_option(store, "no_such_option", True)


def test_gc_keys_are_checked():
    for bad in ({"compaction_live_ratio_min": 1.5}, {"compaction_live_ratio_min": -0.1},
                {"gc_interval_s": -1.0}, {"tombstone_ttl_s": 0.0}):  # fmt: skip
        with pytest.raises(ConfigError, match=next(iter(bad))):
            BookieConfig.from_mapping(bad)
    assert BookieConfig.from_mapping({"gc_interval_s": 0}).gc_interval_s == 0  # on demand only


async def test_list_tombstones_shows_who_is_awaited():
    name = uuid.uuid4().hex
    uri = f"memory://{name}"
    try:
        assert await cluster.list_tombstones(uri, as_json=False) == "no tombstones"
        async with open_metadata_store(uri) as s:
            engine = MemoryEngine()
            lid = await _ledger(s, engine)
            clock = Clock()
            await _tombstone(s, lid, clock.ms)
            gc, _, _ = _collector(s, engine, clock)
            await gc.collect()  # this bookie confirms; the peer has not
        line = await cluster.list_tombstones(uri, as_json=False)
        assert line == f"{lid}\tdeleted_ms={clock.ms}\tconfirmed 1/2\twaiting for {PEER}"
        doc = json.loads(await cluster.list_tombstones(uri, as_json=True))
        assert (doc["ledger_id"], doc["confirmed"], doc["bookies"]) == (lid, [ME], [ME, PEER])
    finally:
        MemoryMetadataStore.forget(name)


async def test_a_bookie_collects_on_demand_and_reports_it(tmp_path):
    """``Bookie.collect_garbage`` (what ``PUT /api/v1/bookie/gc`` calls): one pass through
    the bookie's own journal checkpoint and storage, its figures also in ``statistics()``."""
    name = uuid.uuid4().hex
    uri = f"memory://{name}"
    try:
        async with open_metadata_store(uri) as s:
            await s.init_cluster()
            config = bookie_config(tmp_path, metadata_uri=uri, gc_interval_s=0)
            async with Bookie.serve(config) as bookie:
                engine = bookie.engine
                v = await s.create_ledger(
                    lambda i: LedgerMetadata(i, 1, 1, 1, ((0, (config.bookie_id,)),))
                )
                lid = v.value.ledger_id
                engine.put_ledger(lid, LedgerInfo(b"k" * 20))
                engine.put_entry(lid, 0, b"entry")
                await _tombstone(s, lid, int(time.time() * 1000))
                figures = await bookie.collect_garbage()
                assert figures["ledgers_deleted"] == 1 and figures["tombstones_removed"] == 1
                assert engine.ledgers() == [] and await read_tombstone(s, lid) is None
                assert bookie.statistics()["gc"]["last_pass"] == figures
        async with Bookie.serve(bookie_config(tmp_path / "alone")) as alone:
            with pytest.raises(RuntimeError, match="needs a metadata store"):
                await alone.collect_garbage()
    finally:
        MemoryMetadataStore.forget(name)
