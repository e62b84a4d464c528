"""Logs on the simulated cluster (real client and bookie code, virtual time): offsets,
rollover, takeover and fencing, readers, read_log, truncation, retention, cursors, deletion,
appending ledgers, and bad input. The real-process test is tests/test_logs_process.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bookkeeper_aio import (
    BookKeeper,
    IncorrectParameterError,
    LogExistsError,
    LogFencedError,
    LogPropertyConflictError,
    LogTruncatedError,
    NoSuchLedgerError,
    NoSuchLogError,
    UnauthorizedError,
)
from bookkeeper_aio.logs import LOG_TAG
from bookkeeper_aio.metadata.model import LedgerState
from bookkeeper_aio.sim.world import CLIENT_CONFIG, World, close_client

from .simulated import Scenario, simulated_cluster


@pytest.fixture
def cluster() -> Iterator[Callable[[Scenario], Any]]:
    """``cluster(scenario)`` runs ``scenario(world)`` on 4 simulated bookies (bounded)."""
    with simulated_cluster(seed=26) as run:
        yield run


async def _write(lw: Any, payloads: list[bytes]) -> list[int]:
    """Pipelined appends (waiting for room: the simulated client has 64 pending at most)."""
    futures = []
    for payload in payloads:
        await lw.wait_for_room(len(payload))
        futures.append(lw.append_nowait(payload))
    return list(await asyncio.gather(*futures))


def _payloads(tag: str, n: int) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(n)]


def _open_ledgers(world: World, bk: BookKeeper, ids: list[int]) -> list[int]:
    return [i for i in ids if (v := world.ledger(i)) is not None and not v.value.is_closed]


def test_offsets_are_dense_across_rollovers_and_read_back(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        bk = world.client("a")
        await bk.create_log("orders", segment_entries_max=7, segment_bytes_max=60)
        async with bk.open_log_writer("orders") as lw:
            first = [await lw.append(p) for p in _payloads("x", 10)]  # 4 bytes: 7 per ledger
            second = await _write(lw, _payloads("pipelined-y", 40))  # 13 bytes: 4 per ledger
            assert first + second == list(range(50))
            assert lw.statistics()["rollovers"] >= 10
            tags = [world.ledger(i).value.custom_metadata[LOG_TAG] for i, _ in lw.segments]
            assert set(tags) == {b"orders"}
        info = await bk.log_info("orders")
        assert info.next_offset == 50 and info.start_offset == 0
        assert [s.state.value for s in info.segments] == ["CLOSED"] * len(info.segments)
        assert all(s.last_offset - s.first_offset < 7 for s in info.segments)
        assert info.locate(8) == (info.segments[1].ledger_id, 1)
        records = await bk.read_log("orders", 0, 99)
        assert [r.offset for r in records] == list(range(50))
        assert [r.payload for r in records] == _payloads("x", 10) + _payloads("pipelined-y", 40)
        assert [r.offset for r in await bk.read_log("orders", 45)] == list(range(45, 50))
        await close_client(bk)

    cluster(scenario)


def test_rollover_by_age_and_appends_during_a_rollover_keep_their_order(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        bk = world.client("a")
        await bk.create_log("t", segment_age_s=0.5)
        async with bk.open_log_writer("t") as lw:
            futures = []
            for i in range(30):
                futures.append(lw.append_nowait(b"%d" % i))
                await asyncio.sleep(0.05)
            assert await asyncio.gather(*futures) == list(range(30))
            assert lw.statistics()["rollovers"] >= 2
        assert [r.payload for r in await bk.read_log("t")] == [b"%d" % i for i in range(30)]
        await close_client(bk)

    cluster(scenario)


def test_a_takeover_fences_the_old_writer_and_loses_nothing_acknowledged(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        bk1, bk2 = world.client("w1"), world.client("w2")
        await bk1.create_log("t", segment_entries_max=5)
        w1 = bk1.open_log_writer("t")
        await w1.open()
        acked = await _write(w1, _payloads("one", 12))
        in_flight = [w1.append_nowait(p) for p in _payloads("late", 5)]
        async with bk2.open_log_writer("t") as w2:
            assert w2.epoch == w1.epoch + 1
            with pytest.raises(LogFencedError):
                await w1.append(b"after")
            settled = await asyncio.gather(*in_flight, return_exceptions=True)
            late = [r for r in settled if not isinstance(r, BaseException)]
            assert all(isinstance(r, LogFencedError) for r in settled if r not in late)
            # Acknowledged late adds are before the recovered end: the new writer follows.
            assert w2.next_offset == len(acked) + len(late)
            assert await w2.append(b"two") == w2.next_offset - 1
            ids = [i for i, _ in w1.segments + w2.segments]
            assert _open_ledgers(world, bk2, ids) == [w2.segments[-1][0]]
        await w1.close()  # the fencing was reported to the appends already
        assert w1.state.value == "CLOSED"
        records = await bk2.read_log("t")
        assert [r.payload for r in records[:12]] == _payloads("one", 12)
        assert records[-1].payload == b"two"
        assert [r.offset for r in records] == list(range(len(records)))
        for bk in (bk1, bk2):
            await close_client(bk)

    cluster(scenario)


def test_a_crashed_writers_ledgers_are_recovered_and_its_spare_deleted(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        bk1 = world.client("w1")
        await bk1.create_log("t", segment_entries_max=4)
        w1 = bk1.open_log_writer("t")
        await w1.open()
        acked = await _write(w1, _payloads("a", 10))
        await asyncio.sleep(1)  # the next ledger is prepared
        spare = (await bk1.logs.log_info("t")).metadata.prepared_ledger_id
        assert spare is not None and world.ledger(spare) is not None
        await close_client(bk1)  # the process dies: no close
        bk2 = world.client("w2")
        async with bk2.open_log_writer("t") as w2:
            assert w2.next_offset == len(acked)
        assert world.ledger(spare) is None, "the dead writer's prepared ledger was deleted"
        md = (await bk2.log_info("t")).metadata
        assert md.trash == () and md.prepared_ledger_id is None and md.open_segment is None
        assert [r.payload for r in await bk2.read_log("t")] == _payloads("a", 10)
        await close_client(bk2)

    cluster(scenario)


def test_a_reader_follows_rollovers_and_takeovers_from_any_offset(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        bk = world.client("r")
        await bk.create_log("t", segment_entries_max=3)
        got: list[Any] = []

        async def consume(from_offset: int) -> None:
            async with bk.open_log_reader("t", from_offset=from_offset) as reader:
                async for record in reader:
                    got.append(record)
                    if record.payload == b"end":
                        return

        for writer in range(3):
            wbk = world.client(f"w{writer}")
            async with wbk.open_log_writer("t") as lw:
                await _write(lw, _payloads(f"w{writer}", 5))
            await close_client(wbk)
        reading = asyncio.create_task(consume(4))
        await asyncio.sleep(0.5)
        wbk = world.client("last")
        lw = wbk.open_log_writer("t")
        await lw.open()
        for i in range(6):
            await lw.append(b"live-%d" % i)
            await asyncio.sleep(0.2)
        await close_client(wbk)  # crash: the reader must follow the next takeover
        async with bk.open_log_writer("t") as lw2:
            await lw2.append(b"end")
        async with asyncio.timeout(10):
            await reading
        assert [r.offset for r in got] == list(range(4, 22))
        assert got[-7].payload == b"live-0" and got[-1].payload == b"end"
        await close_client(bk)

    cluster(scenario)


def test_reading_ahead_is_bounded(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        config = CLIENT_CONFIG.replace(log_read_ahead_bytes_max=4000)
        bk = world.client("a", config)
        await bk.create_log("t", segment_entries_max=50)
        async with bk.open_log_writer("t") as lw:
            await _write(lw, [bytes(100)] * 200)
        reader = bk.open_log_reader("t")
        await anext(reader)
        await asyncio.sleep(2)  # a slow consumer
        stats = reader.statistics()
        assert 3000 <= stats["buffered_bytes"] <= 4000 + 100, stats
        count = 1
        async for _ in reader:
            count += 1
            if count == 200:
                break
        await reader.aclose()
        await close_client(bk)

    cluster(scenario)


def test_read_log_never_returns_an_unconfirmed_record(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        bk = world.client("w")
        await bk.create_log("t", ensemble_size=3, write_quorum=3, ack_quorum=2)
        lw = bk.open_log_writer("t")
        await lw.open()
        await _write(lw, _payloads("ok", 3))
        await asyncio.sleep(1)  # the explicit LAC reaches the bookies
        ensemble = world.ledger(lw.segments[-1][0]).value.ensembles[0][1]
        for address in ensemble[1:]:
            world.net.partition("w", world.bookie_at(address).name)
        pending = lw.append_nowait(b"unconfirmed")
        await asyncio.sleep(0.5)
        held = world.bookie_at(ensemble[0]).stored(lw.segments[-1][0], 3)
        assert held == b"unconfirmed"  # on one bookie, short of the ack quorum
        reader = world.client("r")
        assert [r.payload for r in await reader.read_log("t")] == _payloads("ok", 3)
        world.net.heal()
        assert await pending == 3
        await close_client(reader)
        await close_client(bk)

    cluster(scenario)


def test_truncation_deletes_whole_ledgers_and_names_the_first_offset_kept(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        bk = world.client("a")
        await bk.create_log("t", segment_entries_max=10)
        async with bk.open_log_writer("t") as lw:
            await _write(lw, _payloads("x", 35))
            ledgers = [i for i, _ in lw.segments]
            assert await bk.truncate_log("t", 25) == 20
            assert [world.ledger(i) is None for i in ledgers] == [True, True, False, False]
            assert await bk.truncate_log("t", 10**9) == 30  # never the open ledger
        with pytest.raises(LogTruncatedError, match="first offset kept is 30") as caught:
            await bk.read_log("t", 0)
        assert caught.value.start_offset == 30
        with pytest.raises(LogTruncatedError, match="kept is 30"):
            async for _ in bk.open_log_reader("t", from_offset=29):
                pass
        assert [r.offset for r in await bk.read_log("t", 30)] == list(range(30, 35))
        await close_client(bk)

    cluster(scenario)


def test_retention_by_bytes_runs_after_each_rollover(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        bk = world.client("a")
        await bk.create_log("t", segment_entries_max=10, retention_bytes=250)
        async with bk.open_log_writer("t") as lw:
            for _ in range(6):
                await _write(lw, [bytes(10)] * 10)
                await asyncio.sleep(0.5)
            await _write(lw, [bytes(10)])  # rolls over once more
            await asyncio.sleep(0.5)
            info = await bk.log_info("t")
        closed = [s for s in info.segments if s.state.value == "CLOSED"]
        assert 2 <= len(closed) <= 3 and info.start_offset >= 30, info
        assert await bk.logs.enforce_log_retention("t") >= 0
        await close_client(bk)

    cluster(scenario)


def test_retention_by_age_removes_segments_closed_longer_ago_than_retention_s(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        bk = world.client("a")
        loop = asyncio.get_running_loop()
        bk.logs.clock_ms = lambda: int(loop.time() * 1000)  # the log's clock: virtual time
        await bk.create_log("t", segment_entries_max=5, retention_s=10)
        async with bk.open_log_writer("t") as lw:
            await _write(lw, [b"old"] * 5)
            await _write(lw, [b"new"] * 5)  # the first segment closes (a rollover)
            await asyncio.sleep(0.5)
            assert (await bk.log_info("t")).start_offset == 0  # closed well within 10 s
            await asyncio.sleep(10)
            await _write(lw, [b"later"] * 5)  # the second closes now: retention runs after it
            await asyncio.sleep(0.5)
            info = await bk.log_info("t")
        # The segment closed more than 10 s before is gone; the one just closed stays.
        assert info.start_offset == 5, info
        assert [r.payload for r in await bk.read_log("t", 5)] == [b"new"] * 5 + [b"later"] * 5
        with pytest.raises(LogTruncatedError):
            await bk.read_log("t", 0)
        await close_client(bk)

    cluster(scenario)


def test_cursors(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        bk = world.client("a")
        await bk.create_log("t")
        assert await bk.committed_log_offset("t", "billing") is None
        await bk.commit_log_offset("t", "billing", 42)
        await bk.commit_log_offset("t", "audit", 7)
        assert await bk.committed_log_offset("t", "billing") == 42
        assert await bk.logs.list_log_cursors("t") == {"audit": 7, "billing": 42}
        assert await bk.list_logs() == ["t"]  # cursors are not logs
        await bk.delete_log("t")
        await bk.create_log("t")
        assert await bk.committed_log_offset("t", "billing") is None
        with pytest.raises(NoSuchLogError):
            await bk.commit_log_offset("nope", "g", 1)
        with pytest.raises(IncorrectParameterError):
            await bk.commit_log_offset("t", "g", -1)
        await close_client(bk)

    cluster(scenario)


def test_delete_log_removes_ledgers_cursors_and_stops_writers(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        bk = world.client("a")
        await bk.create_log("t", segment_entries_max=3)
        lw = bk.open_log_writer("t")
        await lw.open()
        await _write(lw, _payloads("x", 10))
        await bk.commit_log_offset("t", "g", 3)
        await asyncio.sleep(0.5)
        await bk.delete_log("t")
        assert await bk.list_logs() == [] and await bk.list_ledgers() == []
        with pytest.raises(NoSuchLogError):
            await lw.close()
        for call in (bk.log_info("t"), bk.read_log("t"), bk.delete_log("t")):
            with pytest.raises(NoSuchLogError):
                await call
        with pytest.raises(NoSuchLogError):
            async with bk.open_log_writer("t"):
                pass
        await close_client(bk)

    cluster(scenario)


def test_appending_ledgers_commits_them_in_one_step_as_a_writer(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        bk = world.client("job")
        await bk.create_log("t", segment_entries_max=100)
        live = world.client("live")
        lw = live.open_log_writer("t")
        await lw.open()
        await _write(lw, _payloads("live", 3))
        ledgers = []
        for part in range(2):
            w = await bk.create_ledger(3, 3, 2, custom_metadata={"job": b"j1"})
            for payload in _payloads(f"part{part}", 4):
                await w.append(payload)
            await w.close()
            ledgers.append(w.ledger_id)
        offsets = await bk.append_ledgers_to_log("t", ledgers, properties={"batch": "7"})
        assert offsets == range(3, 11)
        with pytest.raises(LogFencedError):
            await lw.append(b"fenced")
        info = await bk.log_info("t")
        assert info.metadata.properties == {"batch": "7"} and info.next_offset == 11
        records = await bk.read_log("t")
        assert [r.payload for r in records] == (
            _payloads("live", 3) + _payloads("part0", 4) + _payloads("part1", 4)
        )
        assert await bk.append_ledgers_to_log("t", ledgers) == offsets  # a retry: no change
        assert (await bk.log_info("t")).version == info.version
        with pytest.raises(IncorrectParameterError, match="is in it"):
            await bk.append_ledgers_to_log("t", ledgers[1:] + ledgers[:1])
        with pytest.raises(IncorrectParameterError, match="is in it"):
            await bk.append_ledgers_to_log("t", [ledgers[1], 777])
        open_ledger = await bk.create_ledger(3, 3, 2)
        with pytest.raises(IncorrectParameterError, match="not closed"):
            await bk.append_ledgers_to_log("t", [open_ledger.ledger_id])
        secret = await bk.create_ledger(3, 3, 2, password=b"pw")
        await secret.close()
        with pytest.raises(UnauthorizedError):
            await bk.append_ledgers_to_log("t", [secret.ledger_id])
        with pytest.raises(NoSuchLedgerError):
            await bk.append_ledgers_to_log("t", [12345])
        with pytest.raises(IncorrectParameterError, match="distinct"):
            await bk.append_ledgers_to_log("t", [1, 1])
        for client in (bk, live):
            await close_client(client)

    cluster(scenario)


def test_an_append_on_condition_lands_only_if_the_properties_hold(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        bk = world.client("job")
        await bk.create_log("t")
        live = world.client("live")
        lw = live.open_log_writer("t")
        await lw.open()

        async def ledger(tag: str) -> int:
            w = await bk.create_ledger(3, 3, 2)
            await w.append(tag.encode())
            await w.close()
            return w.ledger_id

        first, second = await ledger("a"), await ledger("b")
        with pytest.raises(LogPropertyConflictError, match="None, not '1'"):
            await bk.append_ledgers_to_log("t", [first], expected_properties={"q": "1"})
        await lw.append(b"still writing")  # refused before the takeover: not fenced
        got = await bk.append_ledgers_to_log(
            "t", [first], properties={"q": "1"}, expected_properties={"q": None}
        )
        assert got == range(1, 2)
        with pytest.raises(LogPropertyConflictError):
            await bk.append_ledgers_to_log(
                "t", [second], properties={"q": "1"}, expected_properties={"q": None}
            )
        info = await bk.log_info("t")
        assert info.next_offset == 2 and info.metadata.properties == {"q": "1"}
        for client in (bk, live):
            await close_client(client)

    cluster(scenario)


def test_bad_input_is_refused_before_the_store_is_touched(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        bk = world.client("a")
        world.faults.metadata_failure_rate = 1.0  # any store call would fail
        world.calm_rates_changed()
        for name in ("", "a/b", "x" * 256):
            with pytest.raises(IncorrectParameterError):
                await bk.create_log(name)
            with pytest.raises(IncorrectParameterError):
                bk.open_log_writer(name)
            with pytest.raises(IncorrectParameterError):
                await bk.read_log(name)
        with pytest.raises(IncorrectParameterError):
            await bk.create_log("ok", segment_age_s=float("nan"))
        with pytest.raises(IncorrectParameterError):
            bk.open_log_reader("ok", from_offset=-1)
        world.faults.metadata_failure_rate = 0.0
        world.calm_rates_changed()
        await bk.create_log("ok")
        with pytest.raises(LogExistsError):
            await bk.create_log("ok")
        assert (await bk.create_log("ok", exist_ok=True)).name == "ok"
        for call in (bk.log_info("no"), bk.read_log("no"), bk.truncate_log("no", 1),
                     bk.committed_log_offset("no", "g"), bk.delete_log("no")):  # fmt: skip
            with pytest.raises(NoSuchLogError):
                await call
        with pytest.raises(NoSuchLogError):
            await anext(bk.open_log_reader("no"))
        async with bk.open_log_writer("ok") as lw:
            with pytest.raises(IncorrectParameterError):
                lw.append_nowait("text")  # type: ignore[arg-type]
        with pytest.raises(BaseException, match="closed"):
            lw.append_nowait(b"after close")
        await close_client(bk)

    cluster(scenario)


def test_only_one_ledger_of_the_list_is_open_while_writers_race(cluster: Any) -> None:
    async def scenario(world: World) -> None:
        clients = [world.client(f"w{i}") for i in range(3)]
        await clients[0].create_log("t", segment_entries_max=4)
        seen: set[int] = set()

        async def writer(bk: BookKeeper, tag: str) -> None:
            for k in range(3):
                try:
                    async with bk.open_log_writer("t") as lw:
                        for i in range(8):
                            await lw.append(f"{tag}-{k}-{i}".encode())
                            md = (await bk.logs.log_info("t")).metadata
                            seen.update(md.ledger_ids)
                            states = [world.ledger(i).value.state for i in md.ledger_ids]
                            assert states.count(LedgerState.CLOSED) >= len(states) - 1
                except LogFencedError:
                    await asyncio.sleep(0.1)

        await asyncio.gather(*(writer(bk, f"w{i}") for i, bk in enumerate(clients)))
        records = await clients[0].read_log("t")
        assert [r.offset for r in records] == list(range(len(records)))
        assert len({r.payload for r in records}) == len(records)
        for bk in clients:
            await close_client(bk)

    cluster(scenario)
