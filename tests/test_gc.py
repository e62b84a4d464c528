"""The garbage collector's decisions and the tombstone model, in process (memory store and
engine, a clock the test moves): what is deleted, what is kept, who confirms, the TTL."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from bookkeeper_aio.bookie.gc import GarbageCollector
from bookkeeper_aio.bookie.handler import RequestHandler
from bookkeeper_aio.bookie.server import Bookie
from bookkeeper_aio.config import BookieConfig
from bookkeeper_aio.digest import entry_digest, payload_digest
from bookkeeper_aio.engine import LedgerInfo
from bookkeeper_aio.errors import (
    ConfigError,
    IncorrectParameterError,
    MetadataFormatError,
    StatusCode,
)
from bookkeeper_aio.metadata.memory import MemoryMetadataStore
from bookkeeper_aio.metadata.model import LedgerMetadata
from bookkeeper_aio.metadata.store import MetadataStore, open_metadata_store
from bookkeeper_aio.metadata.tombstones import (
    ClusterOptions,
    Tombstone,
    read_tombstone,
    set_cluster_option,
)
from bookkeeper_aio.metadata.underreplication import Missing, mark_under_replicated
from bookkeeper_aio.protocol import ADD_FLAG_RECOVERY, AddBatchRequest, pack_add_entries
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


def _collector(store: MetadataStore, engine: MemoryEngine, clock: Clock, hold=None,
               **config: object):  # fmt: skip
    checkpoints: list[int] = []
    forgotten: list[tuple[int, bool]] = []  # (ledger, copies of it welcome)

    async def checkpoint() -> None:
        checkpoints.append(len(engine.ledgers()))

    async def reclaim(ratio: float) -> int:
        return engine.reclaim_space(ratio)

    settings: dict[str, object] = {"listen": ME, "ledger_dirs": ("x",), "engine": "memory"}
    cfg = BookieConfig(**{**settings, **config})  # type: ignore[arg-type]
    gc = GarbageCollector(cfg, engine, store, incarnation="i1",
                          forget=lambda lid, extra: forgotten.append((lid, extra)),
                          hold=hold or (lambda ledger_id, held: None), checkpoint=checkpoint,
                          reclaim=reclaim, wall_clock_ms=clock)  # fmt: skip
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
    assert engine.ledgers() == sorted([live, orphan, 12345]) and forgotten == [(doomed, False)]
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


OTHER = "127.0.0.1:3183"
HOUR_MS = 3_600_000


async def _closed_ledger(store: MetadataStore, engine: MemoryEngine, *segments) -> int:
    """A CLOSED ledger with these segments, held by this bookie's engine."""
    v = await store.create_ledger(lambda i: LedgerMetadata(i, 2, 2, 2, segments))
    lid = v.value.ledger_id
    await store.write_ledger(lid, v.value.closed(9, 100), v.version)
    engine.put_ledger(lid, LedgerInfo(b"k" * 20))
    engine.put_entry(lid, 0, b"entry")
    return lid


QUARTER_MS = DAY_MS // 4  # extra copies are looked for every quarter of the wait


async def test_an_extra_copy_is_deleted_after_a_day_unchanged(store):
    engine, clock = MemoryEngine(), Clock()
    events: list[tuple[str, int]] = []

    def hold(ledger_id: int, held: bool) -> None:
        events.append(("hold" if held else "release", ledger_id))

    gc, checkpoints, forgotten = _collector(store, engine, clock, hold)
    extra = await _closed_ledger(store, engine, (0, (PEER, OTHER)))  # replaced here
    mine = await _closed_ledger(store, engine, (0, ENSEMBLE), (5, (PEER, OTHER)))  # an old segment
    assert (await gc.collect())["extra_copies_waiting"] == 0  # the first pass looks later
    clock.ms += QUARTER_MS - 1
    assert (await gc.collect())["extra_copies_waiting"] == 0
    clock.ms += 1
    assert (await gc.collect())["extra_copies_waiting"] == 1  # seen from now
    for _ in range(3):
        clock.ms += QUARTER_MS
        assert (await gc.collect())["extra_copies_deleted"] == 0
    clock.ms += QUARTER_MS  # a day since it was first seen extra
    last = await gc.collect()
    assert (last["extra_copies_deleted"], last["extra_copies_waiting"]) == (1, 0)
    assert engine.ledgers() == [mine] and forgotten == [(extra, True)] and checkpoints
    assert events == [("hold", extra), ("release", extra)]  # adds refused while deleting
    assert gc.statistics()["extra_copies_deleted"] == 1
    assert (await store.read_ledger(extra)).value.ensembles == ((0, (PEER, OTHER)),)  # untouched


async def _deleted_at(gc: GarbageCollector, clock: Clock, quarters: int) -> list[int]:
    """Passes a quarter apart; the quarters (from now) at which extra copies were deleted."""
    found = []
    for quarter in range(quarters):
        if (await gc.collect())["extra_copies_deleted"]:
            found.append(quarter)
        clock.ms += QUARTER_MS
    return found


async def test_an_extra_copy_is_kept_while_open_marked_changing_or_switched_off(store):
    engine, clock = MemoryEngine(), Clock()
    gc, _, forgotten = _collector(store, engine, clock)
    v = await store.create_ledger(lambda i: LedgerMetadata(i, 2, 2, 2, ((0, (PEER, OTHER)),)))
    open_one = v.value.ledger_id  # OPEN: its ensembles may still change
    engine.put_ledger(open_one, LedgerInfo(b"k" * 20))
    marked = await _closed_ledger(store, engine, (0, (PEER, OTHER)))
    await mark_under_replicated(store, marked, [Missing(OTHER, ("lost",), clock.ms)],
                                now_ms=clock.ms)  # fmt: skip
    changing = await _closed_ledger(store, engine, (0, (PEER, OTHER)))
    assert await _deleted_at(gc, clock, 3) == []  # first seen at quarter 1
    current = await store.read_ledger(changing)  # autorecovery moved it meanwhile: a new version
    await store.write_ledger(changing, current.value, current.version)
    # Seen again from quarter 3 (this pass): a day later, at quarter 7.
    assert await _deleted_at(gc, clock, 6) == [4] and forgotten == [(changing, True)]
    assert sorted(engine.ledgers()) == sorted([open_one, marked])
    off_engine = MemoryEngine()
    off, _, _ = _collector(store, off_engine, clock, gc_overreplicated_wait_s=0)
    await _closed_ledger(store, off_engine, (0, (PEER, OTHER)))
    assert await _deleted_at(off, clock, 12) == [] and len(off_engine.ledgers()) == 1  # 0: never


async def test_an_extra_copy_changed_during_its_last_check_is_kept(store):
    engine, clock = MemoryEngine(), Clock()
    gc, _, forgotten = _collector(store, engine, clock)
    lid = await _closed_ledger(store, engine, (0, (PEER, OTHER)))
    assert await _deleted_at(gc, clock, 5) == []  # seen at quarter 1, due at quarter 5
    read_ledger, reads = store.read_ledger, []

    async def worker_meanwhile(ledger_id: int):  # a replication worker's CAS between the reads
        reads.append(ledger_id)
        if len(reads) == 2:
            current = await read_ledger(ledger_id)
            await store.write_ledger(ledger_id, current.value, current.version)
        return await read_ledger(ledger_id)

    store.read_ledger = worker_meanwhile  # type: ignore[method-assign]
    figures = await gc.collect()
    assert reads == [lid, lid] and figures["extra_copies_deleted"] == 0 and not forgotten
    assert engine.ledgers() == [lid]


async def test_held_adds_are_refused_until_released():
    h = RequestHandler(MemoryEngine(), _Journal(), BookieConfig())
    key = b"k" * 20
    wire = [(0, -1, payload_digest(b"p"), entry_digest(7, 0, -1, b"p"), b"p")]
    replies: list = []

    def add(flags: int) -> int:
        h.handle(AddBatchRequest(len(replies), 7, flags, key, pack_add_entries(wire)),
                 replies.append)  # fmt: skip
        return replies[-1].statuses[0]

    h.hold_adds(7, True)
    assert add(ADD_FLAG_RECOVERY) == StatusCode.NO_SUCH_LEDGER and add(0) == StatusCode.FENCED
    h.hold_adds(7, False)
    assert add(ADD_FLAG_RECOVERY) == StatusCode.OK


class _Journal:
    def append(self, rtype, body, callback) -> None:
        callback(None)


async def test_extra_copies_are_checked_a_bounded_number_a_pass_in_turns(store):
    engine, clock = MemoryEngine(), Clock()
    gc, _, _ = _collector(store, engine, clock, gc_overreplicated_checks_max=2)
    ids = sorted([await _closed_ledger(store, engine, (0, (PEER, OTHER))) for _ in range(5)])
    reads: list[int] = []
    read_ledger = store.read_ledger

    async def counted(ledger_id: int):
        reads.append(ledger_id)
        return await read_ledger(ledger_id)

    store.read_ledger = counted  # type: ignore[method-assign]
    await gc.collect()
    assert reads == []  # the first pass only schedules the first look
    for _ in range(3):
        clock.ms += QUARTER_MS
        await gc.collect()
        await gc.collect()  # the same quarter: no look
    assert reads == [*ids[:2], *ids[2:4], ids[4], ids[0]]  # two a look, in id order, round
    assert gc.statistics()["last_pass"]["extra_copies_waiting"] == 5


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
