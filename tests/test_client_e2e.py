"""The client end to end: etcd and 4 real bookie processes on 127.0.0.1."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import signal

import pytest

from bookkeeper_aio import (
    BookKeeper,
    BookKeeperError,
    ClientConfig,
    IncorrectParameterError,
    LedgerFencedError,
    MetadataConfig,
    MetadataUnavailableError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    UnauthorizedError,
)
from bookkeeper_aio.digest import master_key
from bookkeeper_aio.errors import BookieUnavailableError
from bookkeeper_aio.protocol import AddRequest, SharedFrame
from bookkeeper_aio.sandbox import Cluster, free_port

pytestmark = pytest.mark.process
CONFIG = ClientConfig(request_timeout_s=3, explicit_lac_interval_s=0.2, long_poll_timeout_ms=1000)


@pytest.fixture
def cluster(tmp_path):
    with Cluster(tmp_path, 4, "rocksdb") as c:
        yield c


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("shared"), 4, "files") as c:
        yield c


async def read_all(bk: BookKeeper, ledger_id: int) -> list[bytes]:
    reader = await bk.open_ledger(ledger_id, password=b"pw", recovery=True)
    if reader.last_add_confirmed < 0:
        return []
    return [e.payload for e in await reader.read(0, reader.last_add_confirmed)]


async def test_a_bookie_killed_mid_stream_loses_nothing_acknowledged(cluster):
    async with BookKeeper.connect(cluster.uri, CONFIG) as bk:
        w = await bk.create_ledger(3, 3, 2, password=b"pw")
        victim = next(b for b in cluster.bookies if b.address in w.metadata.ensembles[0][1])
        acked: dict[int, bytes] = {}
        third = asyncio.Event()

        async def write(n: int) -> None:
            for i in range(n):
                payload = f"entry-{i}".encode() * 10
                acked[await w.append(payload)] = payload
                if i == n // 3:
                    third.set()

        writer = asyncio.create_task(write(3000))
        await third.wait()
        victim.kill()
        await writer
        assert w.statistics()["ensemble_changes"] >= 1
        assert victim.address not in w.metadata.last_ensemble()[1]
        await w.close()
        payloads = await read_all(bk, w.ledger_id)
        assert len(payloads) == 3000
        assert all(payloads[e] == p for e, p in acked.items())


async def test_adds_of_one_loop_turn_go_to_each_bookie_in_one_frame(shared_cluster):
    async with BookKeeper.connect(shared_cluster.uri, CONFIG) as bk:
        w = await bk.create_ledger(3, 3, 2, password=b"pw")
        await w.append(b"first")  # connections are open now
        before = bk.ctx.pool.statistics()["requests"]
        ids = await asyncio.gather(*[w.append_nowait(b"%d" % i) for i in range(200)])
        assert ids == list(range(1, 201))
        assert bk.ctx.pool.statistics()["requests"] - before == 3  # one batch per bookie
        reader = await bk.open_ledger(w.ledger_id, password=b"pw")
        got = await reader.read(1, 200)
        assert [e.payload for e in got] == [b"%d" % i for i in range(200)]


async def test_small_adds_of_several_ledgers_in_one_turn_share_a_request(shared_cluster):
    config = dataclasses.replace(CONFIG, explicit_lac_interval_s=60)  # only adds are sent
    async with BookKeeper.connect(shared_cluster.uri, config) as bk:
        writers = [await bk.create_ledger(3, 3, 2, password=b"pw") for _ in range(5)]
        await asyncio.gather(*[w.append(b"first") for w in writers])
        before = bk.ctx.pool.statistics()
        futures = [
            w.append_nowait(b"%d-%d" % (n, i)) for i in range(20) for n, w in enumerate(writers)
        ]
        async with asyncio.timeout(10):
            ids = await asyncio.gather(*futures)
        assert ids == [i + 1 for i in range(20) for _ in writers]
        after = bk.ctx.pool.statistics()
        # Each writer packs its adds for a bookie into one frame; the frames for one bookie
        # leave together (one MultiAddRequest): the turn of the first appends had several
        # adds for each bookie, so this turn's first frame waited for the others too.
        users = collections.Counter(b for w in writers for b in w.metadata.ensembles[0][1])
        assert after["requests"] - before["requests"] == len(users)
        assert after["multi_adds"] - before["multi_adds"] == sum(n > 1 for n in users.values())
        for n, w in enumerate(writers):
            assert await read_all(bk, w.ledger_id) == [b"first"] + [
                b"%d-%d" % (n, i) for i in range(20)
            ]


async def test_a_turn_after_one_of_several_adds_sends_its_first_add_with_the_others(
    shared_cluster,
):
    async with BookKeeper.connect(shared_cluster.uri, CONFIG) as bk:
        client = await bk.ctx.pool.get(shared_cluster.bookies[0].address)
        told: list[object] = []
        more = asyncio.Event()

        def tell(answer: object) -> None:
            told.append(answer)
            more.set()

        def turn(ledgers: range) -> int:
            """Send one small add per ledger now; how many requests left at once."""
            before = client.statistics()["requests"]
            for ledger_id in ledgers:
                frame = SharedFrame(AddRequest, ledger_id, 0, 0, master_key(b"pw"), -1, b"x", 0)
                client.request_shared(frame, tell)
            return client.statistics()["requests"] - before

        async def answered(count: int) -> None:
            async with asyncio.timeout(10):
                while len(told) < count:
                    more.clear()
                    await more.wait()

        await asyncio.sleep(0)  # a turn of its own
        assert turn(range(910, 911)) == 1  # one add: at once
        await answered(1)
        assert turn(range(911, 914)) == 1  # several: the first at once, the others at its end
        await asyncio.sleep(0)  # the end of that turn: one MultiAddRequest of two
        multi = client.statistics()["multi_adds"]
        assert turn(range(914, 917)) == 0  # after several: all three wait for the end
        await asyncio.sleep(0)
        assert client.statistics()["multi_adds"] == multi + 1  # ... and leave as one request
        await answered(7)
        assert turn(range(917, 918)) == 0  # the last turn had several: even a lone one waits
        await answered(8)
        assert turn(range(918, 919)) == 1  # after a turn of one add, at once again
        await answered(9)


async def test_adds_waiting_for_the_end_of_the_turn_fail_with_their_connection(shared_cluster):
    async with BookKeeper.connect(shared_cluster.uri, CONFIG) as bk:
        address = shared_cluster.bookies[0].address
        client = await bk.ctx.pool.get(address)
        told: list[object] = []
        for ledger_id in (901, 902, 903):
            frame = SharedFrame(AddRequest, ledger_id, 0, 0, master_key(b"pw"), -1, b"x", 0)
            client.request_shared(frame, told.append)
        client.abort(BookieUnavailableError("test"))  # the 2nd and 3rd were not sent yet
        assert len(told) == 3 and all(isinstance(t, BookieUnavailableError) for t in told)


async def test_append_callback_tells_every_entry_once_in_order(shared_cluster, caplog):
    async with BookKeeper.connect(shared_cluster.uri, CONFIG) as bk:
        w = await bk.create_ledger(3, 3, 2, password=b"pw")
        told: list[tuple[int, BaseException | None]] = []
        all_told = asyncio.Event()

        def callback(entry_id: int, error: BaseException | None) -> None:
            told.append((entry_id, error))
            if entry_id < 5:  # a callback may append (a closed loop's next add)
                ids.append(w.append_callback(b"more-%d" % entry_id, callback))
            if entry_id == 7:
                raise RuntimeError("a careless callback")  # logged; the writer goes on
            if len(told) == 204:  # 205 entries, one of them with a future
                all_told.set()

        ids = [w.append_callback(b"%d" % i, callback) for i in range(100)]
        future = w.append_nowait(b"a future among them")
        ids += [w.append_callback(b"%d" % i, callback) for i in range(101, 200)]
        async with asyncio.timeout(10):
            await all_told.wait()
        assert await future == 100
        assert told == [(i, None) for i in range(205) if i != 100]
        assert sorted(ids) == [i for i in range(205) if i != 100]
        assert "add callback of entry 7 raised" in caplog.text
        await w.close()
        payloads = await read_all(bk, w.ledger_id)
        assert payloads[:3] == [b"0", b"1", b"2"] and payloads[200:] == [
            b"more-%d" % i for i in range(5)
        ]

        # A failure reaches the callback: a recoverer fenced the ledger.
        w = await bk.create_ledger(3, 3, 2, password=b"pw")
        await w.append(b"first")
        await bk.open_ledger(w.ledger_id, password=b"pw", recovery=True)
        failed = asyncio.get_running_loop().create_future()
        entry_id = w.append_callback(b"late", lambda e, error: failed.set_result((e, error)))
        async with asyncio.timeout(10):
            got_id, error = await failed
        assert got_id == entry_id == 1 and isinstance(error, LedgerFencedError)
        with pytest.raises(LedgerFencedError):
            w.append_callback(b"later", callback)


async def _settled(bk: BookKeeper) -> None:
    """Wait (bounded) until no request to any bookie is unanswered, on two looks 10 ms apart:
    an answer sends the adds held for its bookie only in the next loop turn (one look could
    fall in between, and a full-suite run once did)."""
    async with asyncio.timeout(5):
        quiet = 0
        while quiet < 2:
            quiet = 0 if bk.ctx.pool.statistics()["in_flight"] else quiet + 1
            await asyncio.sleep(0.01)


@contextlib.contextmanager
def _frozen(cluster: Cluster):
    """SIGSTOP every bookie; SIGCONT on the way out, whatever happens."""
    for b in cluster.bookies:
        b.signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for b in cluster.bookies:
            b.signal(signal.SIGCONT)


async def _adds_in_separate_turns(w, first: int, count: int) -> list:
    """Append ``count`` adds, each in a loop turn of its own (as independent tasks would)."""
    futures = []
    for i in range(first, first + count):
        futures.append(w.append_nowait(b"%d" % i))
        await asyncio.sleep(0.01)
    return futures


async def test_adds_wait_for_an_answer_when_batches_are_in_flight(shared_cluster):
    config = dataclasses.replace(CONFIG, add_batches_in_flight_max=1)
    async with BookKeeper.connect(shared_cluster.uri, config) as bk:
        w = await bk.create_ledger(3, 3, 2, password=b"pw")
        await w.append(b"first")  # connections are open now
        await _settled(bk)
        before = bk.ctx.pool.statistics()["requests"]
        with _frozen(shared_cluster):  # the bookies answer nothing meanwhile
            futures = await _adds_in_separate_turns(w, 0, 6)
            # Only the first add went out; the five later ones wait for its answer.
            assert bk.ctx.pool.statistics()["requests"] - before == 3
        assert await asyncio.gather(*futures) == list(range(1, 7))
        await _settled(bk)
        assert bk.ctx.pool.statistics()["requests"] - before == 3 * 2  # then one batch of 5
        reader = await bk.open_ledger(w.ledger_id, password=b"pw")
        got = await reader.read(1, 6)
        assert [e.payload for e in got] == [b"%d" % i for i in range(6)]


async def test_held_adds_of_a_striped_ledger_reach_their_write_sets(shared_cluster):
    config = dataclasses.replace(CONFIG, add_batches_in_flight_max=1, add_batch_entries_max=4)
    async with BookKeeper.connect(shared_cluster.uri, config) as bk:
        w = await bk.create_ledger(3, 2, 2, password=b"pw")
        await w.append(b"first")
        await _settled(bk)
        with _frozen(shared_cluster):
            futures = await _adds_in_separate_turns(w, 0, 20)  # held, and cut to batches of 4
        futures += [w.append_nowait(b"%d" % i) for i in range(20, 200)]
        assert await asyncio.gather(*futures) == list(range(1, 201))
        await w.close()
        reader = await bk.open_ledger(w.ledger_id, password=b"pw")
        got = await reader.read(1, 200)
        assert [e.payload for e in got] == [b"%d" % i for i in range(200)]


async def test_pending_payload_bytes_are_bounded(shared_cluster):
    config = ClientConfig(adds_pending_bytes_max=10_000, request_timeout_s=3)
    async with BookKeeper.connect(shared_cluster.uri, config) as bk:
        w = await bk.create_ledger(3, 3, 2, password=b"pw")
        first = [w.append_nowait(b"x" * 4096) for _ in range(2)]
        with pytest.raises(BookKeeperError, match="pending; await append"):
            w.append_nowait(b"x" * 4096)  # 12 KiB would be pending
        assert await w.append(b"y" * 4096) == 2  # waits for room instead
        assert await asyncio.gather(*first) == [0, 1]
        assert await w.append(b"z" * 50_000) == 3  # larger than the bound: goes alone


async def test_a_frozen_bookie_beyond_the_ack_quorum_does_not_grow_the_client(cluster):
    limit = 256 * 1024
    config = ClientConfig(bookie_backlog_bytes_max=limit, request_timeout_s=3)
    async with BookKeeper.connect(cluster.uri, config) as bk:
        w = await bk.create_ledger(3, 3, 2, password=b"pw")
        await w.append(b"warm")
        frozen = next(b for b in cluster.bookies if b.address in w.metadata.ensembles[0][1])
        frozen.signal(signal.SIGSTOP)  # AQ 2 of 3: the writer could run on without it
        try:
            acked, peak = {}, 0
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while loop.time() < deadline and not w.statistics()["ensemble_changes"]:
                await w.wait_for_room(1024)
                payload = b"%d" % len(acked) * 100
                fut = w.append_nowait(payload[:1024])
                fut.add_done_callback(lambda f, p=payload[:1024]: acked.__setitem__(f.result(), p))
                peak = max(peak, bk.ctx.pool.backlog_bytes(frozen.address))
            await w.close()
        finally:
            frozen.signal(signal.SIGCONT)
        assert peak <= limit  # the writer waited for it instead of queueing without end
        assert w.statistics()["ensemble_changes"] >= 1  # until the timeout replaced it
        reader = await bk.open_ledger(w.ledger_id, password=b"pw")
        got = await reader.read(1, reader.last_add_confirmed)
        assert {e.entry_id: e.payload for e in got} == acked


async def test_recovery_fences_the_writer_and_keeps_every_acknowledged_entry(shared_cluster):
    uri = shared_cluster.uri
    async with BookKeeper.connect(uri, CONFIG) as bk1, BookKeeper.connect(uri, CONFIG) as bk2:
        w = await bk1.create_ledger(3, 2, 2, password=b"pw")
        last_acked = -1
        for i in range(200):
            last_acked = await w.append(b"%d" % i)
        in_flight = [w.append_nowait(b"late-%d" % i) for i in range(50)]
        r = await bk2.open_ledger(w.ledger_id, password=b"pw", recovery=True)
        assert r.is_closed and r.last_add_confirmed >= last_acked
        results = await asyncio.gather(*in_flight, return_exceptions=True)
        acked_late = [x for x in results if isinstance(x, int)]
        assert all(e <= r.last_add_confirmed for e in acked_late)  # none acked past the end
        with pytest.raises(LedgerFencedError):
            await w.append(b"after recovery")
        entries = await r.read(0, r.last_add_confirmed)
        assert [e.payload for e in entries[:200]] == [b"%d" % i for i in range(200)]


@pytest.mark.parametrize("ensemble", [3, 4])
async def test_a_long_unconfirmed_tail_is_recovered_whole(shared_cluster, ensemble):
    # Every entry in flight at once: each carries the LAC of before the burst, so recovery
    # reads the whole tail forward: with E == WQ in ReadBatchRequests past the first
    # recovery_read_batch_entries, with E > WQ entry by entry.
    uri, tail = shared_cluster.uri, 1500
    async with BookKeeper.connect(uri, CONFIG) as bk1, BookKeeper.connect(uri, CONFIG) as bk2:
        w = await bk1.create_ledger(ensemble, 3, 2, password=b"pw")
        await asyncio.gather(*[w.append_nowait(b"t%d" % i) for i in range(tail)])
        sent: collections.Counter[str] = collections.Counter()
        send = bk2.ctx.pool.send

        def counting(address, msg_type, *fields, callback):
            sent[msg_type.__name__] += 1
            send(address, msg_type, *fields, callback=callback)

        bk2.ctx.pool.send = counting  # type: ignore[method-assign]
        r = await bk2.open_ledger(w.ledger_id, password=b"pw", recovery=True)
        assert r.is_closed and r.last_add_confirmed == tail - 1
        assert [e.payload for e in await r.read(0, tail - 1)] == [b"t%d" % i for i in range(tail)]
        batch = CONFIG.recovery_read_batch_entries
        if ensemble == 3:  # the first batch one by one, then batches (and the end's replicas)
            assert sent["ReadBatchRequest"] >= 5 and sent["ReadRequest"] < 2 * batch, sent
        else:
            assert sent["ReadBatchRequest"] == 0 and sent["ReadRequest"] > 2 * batch, sent


async def test_two_recoverers_agree(shared_cluster):
    uri = shared_cluster.uri
    async with (
        BookKeeper.connect(uri, CONFIG) as bk1,
        BookKeeper.connect(uri, CONFIG) as bk2,
        BookKeeper.connect(uri, CONFIG) as bk3,
    ):
        w = await bk1.create_ledger(3, 3, 2, password=b"pw")
        await asyncio.gather(*[w.append_nowait(b"x" * 100) for _ in range(500)])
        a, b = await asyncio.gather(
            bk2.open_ledger(w.ledger_id, password=b"pw"),
            bk3.open_ledger(w.ledger_id, password=b"pw"),
        )
        assert a.last_add_confirmed == b.last_add_confirmed >= 499
        assert a.metadata == b.metadata


async def test_a_tailing_reader_sees_every_entry_in_order(shared_cluster):
    uri = shared_cluster.uri
    async with BookKeeper.connect(uri, CONFIG) as bk1, BookKeeper.connect(uri, CONFIG) as bk2:
        w = await bk1.create_ledger(3, 2, 2, password=b"pw")
        r = await bk2.open_ledger(w.ledger_id, password=b"pw", recovery=False)
        seen: list[int] = []

        async def tail() -> None:
            async for entry in r.tail(from_entry_id=0):
                assert entry.payload == b"e%d" % entry.entry_id
                seen.append(entry.entry_id)

        tailer = asyncio.create_task(tail())
        for i in range(300):
            await w.append(b"e%d" % i)
            if i % 100 == 0:
                await asyncio.sleep(0.3)  # idle: the explicit LAC makes the tail catch up
        await asyncio.sleep(0.5)
        assert seen == list(range(len(seen)))  # in order, no gaps, while the writer is live
        await w.close()
        await asyncio.wait_for(tailer, 10)
        assert seen == list(range(300))
        with pytest.raises(IncorrectParameterError):
            await (await bk2.open_ledger(w.ledger_id, b"pw", recovery=False)).read(0, 300)


async def test_bad_input_gets_clear_errors(shared_cluster):
    async with BookKeeper.connect(shared_cluster.uri, CONFIG) as bk:
        with pytest.raises(IncorrectParameterError):
            await bk.create_ledger(2, 3, 2)
        with pytest.raises(NotEnoughBookiesError):
            await bk.create_ledger(5, 3, 2)
        w = await bk.create_ledger(3, 2, 2, password=b"right", custom_metadata={"app": b"x"})
        await w.append(b"data")
        await w.close()
        with pytest.raises(UnauthorizedError):
            await bk.open_ledger(w.ledger_id, password=b"wrong")
        assert w.ledger_id in await bk.list_ledgers()
        await bk.delete_ledger(w.ledger_id)
        with pytest.raises(NoSuchLedgerError):
            await bk.open_ledger(w.ledger_id, password=b"right")
        with pytest.raises(NoSuchLedgerError):
            await bk.delete_ledger(w.ledger_id)
    down = MetadataConfig(call_timeout_s=0.5, retries_max=2)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(MetadataUnavailableError):
        async with BookKeeper.connect(f"etcd://127.0.0.1:{free_port()}/x", metadata_config=down):
            pass
    assert loop.time() - start < 5


@pytest.mark.parametrize("script", ["write_and_tail.py", "recover_after_crash.py", "service.py"])
async def test_examples_run(shared_cluster, script):
    import subprocess
    import sys
    from pathlib import Path

    path = Path(__file__).parent.parent / "examples" / script
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(path), shared_cluster.uri],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]


async def test_overload_is_backpressure_not_bookie_failure(shared_cluster):
    config = ClientConfig(bookie_requests_in_flight_max=300, adds_pending_max=3000)
    async with BookKeeper.connect(shared_cluster.uri, config) as bk:
        w = await bk.create_ledger(3, 3, 2)
        ids = await asyncio.gather(*[w.append_nowait(b"x" * 100) for _ in range(2500)])
        assert ids == list(range(2500))
        assert w.statistics()["ensemble_changes"] == 0  # TOO_MANY_REQUESTS is retried
