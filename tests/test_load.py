"""The benchmarks' load generators and payloads, in one process (no servers)."""

from __future__ import annotations

import asyncio

import uvloop

from benchmarks.load import PAYLOAD_POOL_COUNT_MAX, closed_loop, open_loop, payload_pool


def test_open_loop_sends_everything_due_per_tick_instead_of_spinning(monkeypatch):
    """At 50k/s an add is due every 20 µs: the loop must not wake once per add (under uvloop a
    sleep that short is a zero timer, and the loop spun, burning the bookies' CPU)."""
    sleeps = []
    real_sleep = asyncio.sleep

    async def counting_sleep(delay: float, *args: object) -> None:
        sleeps.append(delay)
        await real_sleep(delay, *args)

    async def run() -> None:
        loop = asyncio.get_running_loop()

        def send() -> asyncio.Future[int]:
            future = loop.create_future()
            future.set_result(0)
            return future

        monkeypatch.setattr(asyncio, "sleep", counting_sleep)
        result = await open_loop(send, 50_000, 0.2, outstanding_max=100_000)
        assert result.entries == 10_000 and result.errors == 0
        assert len(result.latencies_s) == 10_000

    uvloop.run(run())
    # ~200 one-millisecond ticks in 0.2 s, fewer when ticks oversleep: on a loaded machine
    # three ticks took the whole 0.2 s (and the first one sent what was due); one per add was
    # 10k. What is checked is the upper bound: the loop sleeps a tick, never once per add.
    assert 1 <= len(sleeps) <= 400, len(sleeps)
    assert min(sleeps) >= 0.001


def test_callback_operations_reuse_their_slots():
    """An operation through a callback send reuses a finished one's ``done``: no closure per
    operation (~5 objects the cyclic GC tracks, ~1 µs of the client's CPU per add)."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        dones: list = []  # kept alive, so that no two distinct objects share an id

        def send(done) -> None:
            dones.append(done)
            loop.call_soon(done, None, None)

        closed = await closed_loop(send, 8, count=5_000, callbacks=True)
        assert closed.entries == 5_000 and len({id(d) for d in dones}) == 8
        dones.clear()
        opened = await open_loop(send, 50_000, 0.1, outstanding_max=100_000, callbacks=True)
        assert opened.entries == 5_000
        assert len({id(d) for d in dones}) <= 1_000  # at most one tick's sends at once

    uvloop.run(run())


def test_closed_loop_with_callbacks_counts_values_errors_and_raises():
    """``callbacks=True``: send takes done(value, error), as the writes mode's append_callback."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        sent = 0

        def send(done) -> None:
            nonlocal sent
            sent += 1
            if sent == 50:
                raise RuntimeError("the handle failed")  # stops that slot
            value, error = (None, ValueError("lost")) if sent % 10 == 0 else ([1, 2, 3], None)
            loop.call_soon(done, value, error)

        result = await closed_loop(send, 4, count=100, weight=len, callbacks=True)
        assert result.errors == 1 + 9  # the raise, and every tenth send but the 50th
        assert result.first_error == "ValueError: lost"
        assert len(result.latencies_s) == 99 - 9 and result.entries == 3 * 90

    uvloop.run(run())


def test_payload_pool_is_distinct_and_bounded():
    pool = payload_pool(1024)
    assert len(pool) == PAYLOAD_POOL_COUNT_MAX
    assert {len(p) for p in pool} == {1024}
    assert len(set(pool)) == len(pool)  # distinct: block compression cannot fold them
    big = payload_pool(1 << 20)  # the byte bound: 8 MiB
    assert len(big) == 8 and {len(p) for p in big} == {1 << 20}
    assert len(payload_pool(64 << 20)) == 1  # at least one, however large
