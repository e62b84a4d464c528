"""Reads the engine may have to fetch from the disk run in read threads (bookie/read_pool.py):
the event loop answers everything else meanwhile."""

from __future__ import annotations

import asyncio
import threading
from functools import partial

import pytest

from bookkeeper_aio.bookie.read_pool import LEDGER_THREADS_MAX, ReadPool
from bookkeeper_aio.errors import StatusCode
from bookkeeper_aio.protocol import ReadBatchRequest, unpack_read_entries
from engines.memory import MemoryEngine
from tests.test_bookie_handler import Harness

WAIT_S = 10.0


class ColdEngine(MemoryEngine):
    """A memory engine whose entries in ``cold`` 'are on the disk': not readable now, and a
    read of one waits for ``disk`` (its thread's name is noted), then brings its 'batch'
    (ids // ``batch`` alike) into memory."""

    def __init__(self) -> None:
        super().__init__()
        self.cold: set[int] = set()
        self.disk = threading.Event()
        self.fail: OSError | None = None
        self.threads: dict[int, str] = {}
        self.batch = 4

    def can_read_now(self, ledger_id: int, entry_id: int) -> bool:
        return entry_id not in self.cold

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        self.threads[entry_id] = threading.current_thread().name
        if entry_id in self.cold:
            assert self.disk.wait(WAIT_S), "the test never let the disk answer"
            if self.fail is not None:
                raise self.fail
            self.cold -= {i for i in self.cold if i // self.batch == entry_id // self.batch}
        return super().get_entry(ledger_id, entry_id)


class Replies(list):
    """The harness's replies, with an event for each one that arrives."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = asyncio.Event()

    def append(self, reply: object) -> None:
        super().append(reply)
        self.arrived.set()


def harness(**config: object) -> tuple[Harness, ColdEngine]:
    engine = ColdEngine()
    h = Harness(engine, **config)
    h.replies = Replies()
    for i in range(10):
        h.add(i, b"entry %d" % i)
    return h, engine


async def answered(h: Harness, count: int) -> None:
    async with asyncio.timeout(WAIT_S):
        while len(h.replies) < count:
            h.replies.arrived.clear()
            await h.replies.arrived.wait()


async def test_a_read_waiting_on_the_disk_holds_up_no_other_request() -> None:
    h, engine = harness()
    engine.cold = {2}
    before = len(h.replies)
    assert h.read(2) is None  # in a read thread, waiting on the "disk"
    assert h.add(10, b"entry 10").status == StatusCode.OK  # the loop goes on meanwhile
    assert h.read(7).payload == b"entry 7"
    assert len(h.replies) == before + 2
    engine.disk.set()
    await answered(h, before + 3)
    read = h.replies[-1]
    assert (read.status, read.entry_id, read.payload) == (StatusCode.OK, 2, b"entry 2")
    assert engine.threads[2].startswith("bookie-read") and engine.threads[7] == "MainThread"
    assert h.handler.statistics()["reads_threaded"] == 1
    h.handler.reads.close()


async def test_a_batch_read_gathers_what_is_in_memory_then_the_rest_in_a_thread() -> None:
    h, engine = harness()
    engine.cold = {4}
    engine.disk.set()
    before = len(h.replies)
    assert h.send(ReadBatchRequest, 7, 0, 10, 0, None, 1 << 20) is None
    await answered(h, before + 1)
    reply = h.replies[-1]
    got = unpack_read_entries(reply.entries)
    assert [g[0] for g in got] == list(range(10)) and reply.end_status == StatusCode.OK
    assert [g[3] for g in got] == [b"entry %d" % i for i in range(10)]
    where = engine.threads
    assert {where[i] for i in range(4)} == {"MainThread"}
    assert all(where[i].startswith("bookie-read") for i in range(4, 10))
    assert h.handler.statistics()["reads"] >= 10
    h.handler.reads.close()


async def test_reads_of_a_ledger_on_the_disk_take_four_threads_at_most() -> None:
    h, engine = harness()
    engine.cold, engine.batch = set(range(10)), 10
    before = len(h.replies)
    for i in range(10):
        assert h.read(i) is None
    assert h.handler.reads.queued == LEDGER_THREADS_MAX  # the other six wait for them
    engine.disk.set()
    await answered(h, before + 10)
    got = sorted((r.entry_id, r.payload) for r in h.replies[-10:])
    assert got == [(i, b"entry %d" % i) for i in range(10)]
    # the first of 0-3 to end brought the 'batch' in: 4-9 waited, then ran on the loop
    on_loop = [i for i in range(10) if engine.threads[i] == "MainThread"]
    assert on_loop == [4, 5, 6, 7, 8, 9] and h.handler.statistics()["reads_threaded"] == 4
    h.handler.reads.close()


async def test_past_the_queue_bound_a_read_runs_on_the_loop() -> None:
    pool = ReadPool(threads=2, queue_max=1)
    disk = threading.Event()
    got: list[tuple[str, object]] = []
    both = asyncio.Event()

    def note(result: str | None, exc: Exception | None) -> None:
        got.append((result, exc))
        if len(got) == 2:
            both.set()

    def cold(name: str) -> str:
        assert disk.wait(WAIT_S)
        return name + " in " + threading.current_thread().name

    pool.read(1, lambda: False, lambda: cold("first"), note)
    disk.set()  # (the second read would wait forever on the loop otherwise)
    pool.read(2, lambda: False, lambda: cold("second"), note)
    assert got == [("second in MainThread", None)]  # the queue is full: on the loop
    async with asyncio.timeout(WAIT_S):
        await both.wait()
    assert got[1][0] is not None and got[1][0].startswith("first in bookie-read")
    assert (pool.threaded, pool.inline, pool.queued) == (1, 1, 0)
    pool.close()


async def test_without_read_threads_every_read_runs_on_the_loop() -> None:
    h, engine = harness(read_threads=0)
    engine.cold = {3}
    engine.disk.set()
    assert h.read(3).payload == b"entry 3" and engine.threads[3] == "MainThread"


async def test_closing_a_pool_that_never_used_a_thread_starts_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The simulator's bookies close their pools on the loop: a thread there breaks replay.
    async def no_thread(*args: object) -> None:
        raise AssertionError("aclose started a thread")

    monkeypatch.setattr(asyncio, "to_thread", no_thread)
    pool = ReadPool(threads=4, queue_max=8)
    got: list[object] = []
    pool.read(1, lambda: True, lambda: "in memory", lambda r, e: got.append(r))
    await pool.aclose()
    pool.read(1, lambda: False, lambda: "after close", lambda r, e: got.append(r))
    assert got == ["in memory", "after close"] and pool.inline == 1  # no thread any more


async def test_closing_a_pool_waits_for_the_read_in_its_thread() -> None:
    pool = ReadPool(threads=2, queue_max=8)
    disk = threading.Event()
    finished = threading.Event()

    def slow() -> str:
        assert disk.wait(WAIT_S)
        finished.set()
        return "from the disk"

    pool.run(slow, lambda r, e: None)
    closing = asyncio.create_task(pool.aclose())
    await asyncio.sleep(0.05)
    assert not closing.done()  # the loop still runs while the pool waits in a thread
    disk.set()
    async with asyncio.timeout(WAIT_S):
        await closing
    assert finished.is_set()


async def test_a_read_that_fails_in_its_thread_is_an_io_error() -> None:
    h, engine = harness()
    engine.cold = {5}
    engine.fail = OSError(5, "injected")
    engine.disk.set()
    before = len(h.replies)
    assert h.read(5) is None
    assert h.send(ReadBatchRequest, 7, 4, 3, 0, None, 1 << 20) is None
    await answered(h, before + 2)
    single, batch = h.replies[-2:]
    assert single.status == StatusCode.IO_ERROR
    assert [g[0] for g in unpack_read_entries(batch.entries)] == [4]
    assert batch.end_status == StatusCode.IO_ERROR
    assert h.handler.statistics()["io_errors"] == 2
    h.handler.reads.close()
    assert h.read(5).status == StatusCode.IO_ERROR  # closed: on the loop, answered at once


async def test_reads_waiting_for_their_ledger_are_looked_at_once_per_read_finished() -> None:
    """2,000 reads of one ledger, none in memory, 4 per 'batch': each thread read brings its
    batch in, the reads waiting behind it are looked at again in order until one is not in
    memory; every read is answered and the looks stay linear (quadratic: ~500,000)."""
    pool = ReadPool(threads=2, queue_max=1024)
    loaded: set[int] = set()
    looks = [0]
    answered_ids: list[int] = []
    finished = asyncio.Event()
    count = 2_000

    def ready(i: int) -> bool:
        looks[0] += 1
        return i // 4 in loaded

    def read(i: int) -> int:
        loaded.add(i // 4)  # (a set add from a thread: the GIL keeps it whole)
        return i

    def then(i: int | None, exc: Exception | None) -> None:
        assert exc is None and i is not None
        answered_ids.append(i)
        if len(answered_ids) == count:
            finished.set()

    for i in range(count):
        pool.read(7, partial(ready, i), partial(read, i), then)
    async with asyncio.timeout(WAIT_S):
        await finished.wait()
    assert sorted(answered_ids) == list(range(count))
    assert looks[0] <= 3 * count
    assert pool.threaded <= count // 4 * LEDGER_THREADS_MAX
    pool.close()
