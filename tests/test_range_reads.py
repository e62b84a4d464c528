"""A reader's range reads in ReadBatchRequests (client/range_reads.py): the pure parts as
properties, and the real client against simulated bookies (virtual time): how many requests a
long read makes, limits, a slow or dead bookie, a missing end, a ledger read entry by entry."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from bookkeeper_aio.client.range_reads import chunks, good_prefix
from bookkeeper_aio.digest import entry_digest, pack_entry_record, payload_digest
from bookkeeper_aio.errors import NoSuchEntryError, StatusCode
from bookkeeper_aio.metadata.model import LedgerMetadata
from bookkeeper_aio.protocol import ReadBatchResponse, ReadResponse, pack_read_entry
from bookkeeper_aio.sim.world import World, close_client
from tests.simulated import simulated_cluster

PW = b"t"
LID = 7


# --- chunks ---------------------------------------------------------------------------------


@given(
    first=st.integers(0, 50),
    length=st.integers(1, 400),
    starts=st.sets(st.integers(1, 450), max_size=4),
    lac=st.integers(-1, 460),
    size=st.integers(1, 300),
)
@example(first=0, length=600, starts=set(), lac=599, size=256)
@example(first=10, length=20, starts={15}, lac=12, size=4)
def test_chunks_cover_the_range_in_order_within_segments_and_the_lac(
    first: int, length: int, starts: set[int], lac: int, size: int
) -> None:
    last = first + length - 1
    bookies = ("a", "b", "c")
    md = LedgerMetadata(LID, 3, 3, 2, tuple((s, bookies) for s in sorted({0, *starts})))
    cut = chunks(md, first, last, lac, size)
    assert [e for c in cut for e in c] == list(range(first, last + 1))
    for c in cut:
        assert 1 <= len(c) <= size
        assert md.ensemble_at(c.start) == md.ensemble_at(c[-1])  # one segment each
        assert all(s <= c.start or s > c[-1] for s in starts)
        assert c[-1] <= lac or c.start > lac  # one side of the LAC
    # as few as those rules allow: a chunk shorter than size ends at a cut or the range's end
    boundaries = {s for s in starts if first < s <= last}
    if first <= lac < last:
        boundaries.add(lac + 1)
    for c in cut:
        if len(c) < size:
            assert c.stop in boundaries or c.stop == last + 1


# --- good_prefix ----------------------------------------------------------------------------


def packed(first: int, count: int, corrupt: int | None = None) -> bytes:
    parts: list[Any] = []
    for entry_id in range(first, first + count):
        payload, lac = b"p%d" % entry_id, entry_id - 1
        digest = entry_digest(LID, entry_id, lac, payload)
        if entry_id == corrupt:
            payload = b"junk"
        parts += pack_read_entry(entry_id, pack_entry_record(lac, payload_digest(payload),
                                                             digest, payload))  # fmt: skip
    return b"".join(parts)


def batch(first: int, entries: bytes, end: int = StatusCode.OK, status: int = 0) -> Any:
    return ReadBatchResponse(1, status, LID, first, entries, end, None)


@given(first=st.integers(0, 100), count=st.integers(1, 20), data=st.data())
def test_good_prefix_takes_the_verified_entries_up_to_the_first_bad_one(
    first: int, count: int, data: st.DataObject
) -> None:
    sent = data.draw(st.integers(0, count + 2))
    corrupt = data.draw(st.none() | st.integers(first, first + count + 2))
    end = data.draw(st.sampled_from([StatusCode.OK, StatusCode.NO_SUCH_ENTRY, StatusCode.IO_ERROR]))
    good, limited = good_prefix(LID, first, count, batch(first, packed(first, sent, corrupt), end))
    stop = min(sent, count)
    if corrupt is not None and corrupt - first < stop:
        stop = corrupt - first
    assert [e.entry_id for e in good] == list(range(first, first + stop))
    assert [e.payload for e in good] == [b"p%d" % e for e in range(first, first + stop)]
    intact = corrupt is None or corrupt - first >= min(sent, count)
    assert limited == (intact and end == StatusCode.OK and sent <= count)


def test_good_prefix_refuses_answers_of_another_kind_place_or_shape() -> None:
    entries = packed(5, 3)
    assert good_prefix(LID, 5, 3, batch(5, entries)) != ([], False)
    for answer in [
        batch(4, entries),  # another first entry
        batch(5, entries, status=StatusCode.NO_SUCH_LEDGER),
        batch(5, entries[:-1]),  # cut short: garbled
        ReadResponse(1, 0, LID, 5, None, None, None, None),
        TimeoutError("no answer"),
    ]:
        assert good_prefix(LID, 5, 3, answer) == ([], False)
    assert good_prefix(LID + 1, 5, 3, batch(5, entries)) == ([], False)  # digests of another
    skipped = packed(5, 1) + packed(7, 1)  # entry 6 left out
    assert [e.entry_id for e in good_prefix(LID, 5, 3, batch(5, skipped))[0]] == [5]


# --- against simulated bookies --------------------------------------------------------------


async def write(world: World, entries: int, quorum: tuple[int, int, int] = (3, 3, 2),
                size: int = 10) -> Any:  # fmt: skip
    """A closed ledger of ``entries`` entries (payload ``e<i>`` padded to ``size`` bytes)."""
    bk = world.client("writer")
    try:
        w = await bk.create_ledger(*quorum, PW)
        for start in range(0, entries, 50):
            await asyncio.gather(*(w.append_nowait(payload(i, size))
                                   for i in range(start, min(entries, start + 50))))  # fmt: skip
        await w.close()
        versioned = world.ledger(w.ledger_id)
        assert versioned is not None
        return versioned.value
    finally:
        await close_client(bk)


def payload(i: int, size: int = 10) -> bytes:
    return (b"e%d" % i).ljust(size, b".")


def counts(world: World) -> dict[str, tuple[int, int]]:
    """(batch requests, entries read) per running bookie's address."""
    out = {}
    for node in world.bookies:
        if node.bookie is None:  # crashed
            continue
        counters = node.bookie.handler.counters
        out[node.address] = (counters["read_batches"], counters["reads"])
    return out


def delta(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]],
          bookie: str) -> tuple[int, int]:  # fmt: skip
    """A bookie's (batch requests, entries read) from ``before`` to ``after``."""
    return after[bookie][0] - before[bookie][0], after[bookie][1] - before[bookie][1]


async def read(world: World, md: Any, first: int, last: int, **changes: Any) -> list[bytes]:
    bk = world.client("reader", world.client_config.replace(**changes))
    try:
        reader = await bk.open_ledger(md.ledger_id, PW, recovery=False)
        return [e.payload for e in await reader.read_unconfirmed(first, last)]
    finally:
        await close_client(bk)


def test_a_long_read_is_one_batch_a_chunk_and_the_chunks_rotate_over_the_ensemble() -> None:
    with simulated_cluster(seed=1) as run:

        async def scenario(world: World) -> None:
            md = await write(world, 600)
            before = counts(world)
            assert await read(world, md, 0, 599) == [payload(i) for i in range(600)]
            after = counts(world)
            ensemble = md.ensembles[0][1]
            # 0-255, 256-511, 512-599: each from the first of its first entry's write set
            for index, bookie in enumerate(ensemble):
                batches, entries = delta(before, after, bookie)
                assert batches == 1, (index, after[bookie])
                assert entries == [256, 256, 88][index]

        run(scenario)


def test_answers_cut_by_the_byte_limit_go_on_from_the_same_bookie() -> None:
    with simulated_cluster(seed=2) as run:

        async def scenario(world: World) -> None:
            md = await write(world, 100, size=1000)
            before = counts(world)
            small = {"frame_bytes_max": 64 * 1024, "add_batch_bytes_max": 16 * 1024}
            assert await read(world, md, 0, 99, **small) == [payload(i, 1000) for i in range(100)]
            first = md.ensembles[0][1][0]
            batches, entries = delta(before, counts(world), first)
            assert entries == 100 and batches >= 100 * 1000 // (16 * 1024)  # 16 KiB answers
            others = [a for a in md.ensembles[0][1] if a != first]
            assert all(counts(world)[a] == before[a] for a in others)

        run(scenario)


def test_a_slow_or_dead_first_bookie_sends_the_chunk_to_the_next_replica() -> None:
    with simulated_cluster(seed=3) as run:

        async def scenario(world: World) -> None:
            md = await write(world, 300)
            first = world.bookie_at(md.ensembles[0][1][0])
            assert first is not None
            bk = world.client("reader")
            reader = await bk.open_ledger(md.ledger_id, PW, recovery=False)
            await reader.read(0, 1)  # connected to the first bookie
            world.net.slow_s[first.name] = 30.0  # far past the request timeout (1 s)
            loop = asyncio.get_running_loop()
            started = loop.time()
            got = await reader.read(0, 199)
            assert [e.payload for e in got] == [payload(i) for i in range(200)]
            # one speculative wait (0.2 s), not a request timeout nor a wait per entry
            assert loop.time() - started < 0.5
            world.net.slow_s.clear()
            first.crash(power_loss=False)
            before = counts(world)
            got = await reader.read(0, 299)
            assert [e.payload for e in got] == [payload(i) for i in range(300)]
            after = counts(world)
            live = list(after)
            # 0-255 from the next replica at once, 256-299 from its own first: no single reads
            assert sum(after[a][0] - before[a][0] for a in live) == 2
            assert sum(after[a][1] - before[a][1] for a in live) == 300
            await close_client(bk)

        run(scenario)


def test_past_the_end_is_no_such_entry_as_with_single_reads() -> None:
    with simulated_cluster(seed=4) as run:

        async def scenario(world: World) -> None:
            md = await write(world, 20)
            with pytest.raises(NoSuchEntryError):
                await read(world, md, 10, 25)
            with pytest.raises(NoSuchEntryError):
                await read(world, md, 10, 25, read_batch_entries=0)

        run(scenario)


def test_striped_ledgers_and_a_zero_batch_size_read_entry_by_entry() -> None:
    with simulated_cluster(seed=5) as run:

        async def scenario(world: World) -> None:
            striped = await write(world, 30, quorum=(3, 2, 2))
            full = await write(world, 30)
            before = counts(world)
            assert await read(world, striped, 0, 29) == [payload(i) for i in range(30)]
            assert await read(world, full, 0, 29, read_batch_entries=0) == [
                payload(i) for i in range(30)
            ]
            after = counts(world)
            assert sum(after[a][0] - before[a][0] for a in after) == 0  # no batch request
            assert sum(after[a][1] - before[a][1] for a in after) == 60

        run(scenario)


def test_single_reads_speculate_past_a_slow_replica_and_move_on_from_a_dead_one() -> None:
    """The entry-by-entry path (client/reads.py read_entry) under the same faults: a striped
    ledger's range, and one entry alone."""
    with simulated_cluster(seed=6) as run:

        async def scenario(world: World) -> None:
            md = await write(world, 30, quorum=(3, 2, 2))
            slow = world.bookie_at(md.ensembles[0][1][0])
            assert slow is not None
            bk = world.client("reader")
            reader = await bk.open_ledger(md.ledger_id, PW, recovery=False)
            await reader.read(0, 2)  # connected to every bookie
            world.net.slow_s[slow.name] = 30.0  # far past the request timeout (1 s)
            loop = asyncio.get_running_loop()
            for first, last in [(0, 29), (3, 3)]:  # entry 3's first replica is the slow one
                started = loop.time()
                got = await reader.read(first, last)
                assert [e.payload for e in got] == [payload(i) for i in range(first, last + 1)]
                assert loop.time() - started < 0.5  # a speculative wait (0.2 s), no timeout
            world.net.slow_s.clear()
            slow.crash(power_loss=False)
            got = await reader.read(0, 29)
            assert [e.payload for e in got] == [payload(i) for i in range(30)]
            await close_client(bk)

        run(scenario)
