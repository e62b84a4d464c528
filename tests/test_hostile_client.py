"""The client against a fake bookie that answers nonsense (issue 25): silence, wrong ids,
wrong types, unknown or impossible statuses, garbage. Every answer it cannot understand
fails that request and the connection with a clear error, within its timeout; a writer
replaces such a bookie and a recovery goes on without it. Also: the retry policy, the writer
set, and recovery past a hung bookie (real processes)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import signal
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookkeeper_aio import BookKeeper, ClientConfig
from bookkeeper_aio.bookie.server import Bookie
from bookkeeper_aio.client.bookie_client import BookieClient
from bookkeeper_aio.errors import (
    KNOWN_STATUSES,
    BookieUnavailableError,
    BookKeeperError,
    OperationTimeoutError,
    ProtocolError,
    StatusCode,
)
from bookkeeper_aio.metadata.store import open_metadata_store
from bookkeeper_aio.metadata.underreplication import list_marks
from bookkeeper_aio.net import TcpNetwork
from bookkeeper_aio.protocol import (
    FRAME_HEADER,
    PROTOCOL_VERSION,
    RESPONSE_BIT,
    AddBatchRequest,
    AddBatchResponse,
    AddRequest,
    AddResponse,
    BookieInfoResponse,
    ErrorResponse,
    FrameDecoder,
    HelloRequest,
    HelloResponse,
    ListEntriesResponse,
    Message,
    ReadLacResponse,
    ReadResponse,
    WriteLacResponse,
    check_add_entries,
    encode,
)
from bookkeeper_aio.retry import RetryPolicy
from bookkeeper_aio.sandbox import Cluster

from .wire import bookie_config

TIMEOUT_S = 0.5
CONFIG = ClientConfig(connect_timeout_s=TIMEOUT_S, request_timeout_s=TIMEOUT_S,
                      timeout_sweep_interval_s=0.05)  # fmt: skip
Answer = Callable[[Any], bytes | None]  # a request -> the bytes the fake sends back


class FakeBookie:
    """A server that greets (unless told not to) and answers each request with ``answer``."""

    def __init__(self, answer: Answer, *, hello: Answer | None = None) -> None:
        self.answer = answer
        self.hello = hello or (lambda m: encode(HelloResponse(m.request_id, 0, PROTOCOL_VERSION,
                                                              self.address)))  # fmt: skip
        self.requests: list[Any] = []
        self.address = ""
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> FakeBookie:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        decoder = FrameDecoder(64 << 20)
        try:
            while data := await reader.read(1 << 20):
                for msg in decoder.feed(data):
                    first = type(msg) is HelloRequest
                    if not first:
                        self.requests.append(msg)
                    out = (self.hello if first else self.answer)(msg)
                    if out:
                        writer.write(out)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def silent(msg: Any) -> None:
    return None


def frame(body: bytes) -> bytes:
    return FRAME_HEADER.pack(len(body)) + body


NONSENSE: dict[str, tuple[Answer, type[BaseException]]] = {
    "silence": (silent, OperationTimeoutError),
    "a wrong request id": (lambda m: encode(AddResponse(m.request_id + 7, 0, 1, 0)),
                           OperationTimeoutError),
    "a wrong response type": (lambda m: encode(WriteLacResponse(m.request_id, 0, 1)),
                              ProtocolError),
    "an unknown status": (lambda m: encode(AddResponse(m.request_id, 999, 1, 0)), ProtocolError),
    # A request has no status: the client's complaint about it raised AttributeError.
    "a request instead of an answer": (
        lambda m: encode(AddRequest(m.request_id, 1, 0, 0, b"k", -1, b"p", 0)), ProtocolError),
    "an impossible status": (lambda m: encode(AddResponse(m.request_id, -1, 1, 0)),
                             ProtocolError),
    "an error saying OK": (lambda m: encode(ErrorResponse(m.request_id, 0, "fine")),
                           ProtocolError),
    "an error of unknown status": (lambda m: encode(ErrorResponse(m.request_id, 4242, "?")),
                                   ProtocolError),
    "unknown statuses in a batch": (
        lambda m: encode(AddBatchResponse(m.request_id, 0, 1, [0, 77])), ProtocolError),
    "a body that is not msgpack": (lambda m: frame(b"\xc1\xc1\xc1"), ProtocolError),
    "an unknown op": (lambda m: frame(b"\x93\x42\x01\x00"), ProtocolError),
    "arrays nested 3000 deep": (lambda m: frame(b"\x93\xcc\x82\x01" + b"\x91" * 3000 + b"\xc0"),
                                ProtocolError),
    "an oversize frame": (lambda m: FRAME_HEADER.pack(1 << 30), BookieUnavailableError),
    "a zero-length frame": (lambda m: FRAME_HEADER.pack(0), BookieUnavailableError),
}  # fmt: skip


async def one_add(address: str, config: ClientConfig = CONFIG) -> tuple[Any, BookieClient]:
    client = await BookieClient.connect(TcpNetwork(), address, config)
    return await client.request(AddRequest, 1, 0, 0, b"k" * 20, -1, b"p", 0), client


@pytest.mark.parametrize("name", list(NONSENSE))
async def test_an_answer_the_client_cannot_understand_fails_clearly_and_in_time(name):
    answer, expected = NONSENSE[name]
    async with FakeBookie(answer) as fake:
        loop = asyncio.get_running_loop()
        started = loop.time()
        client = await BookieClient.connect(TcpNetwork(), fake.address, CONFIG)
        other = client.request(AddRequest, 1, 1, 0, b"k" * 20, 0, b"p", 0)  # pending alongside
        with pytest.raises(expected):
            await client.request(AddRequest, 1, 0, 0, b"k" * 20, -1, b"p", 0)
        assert loop.time() - started < TIMEOUT_S + 1.5
        if expected is not OperationTimeoutError:  # nonsense: the connection is not trusted
            assert not client.is_usable
            with pytest.raises(BookKeeperError):
                await other
        else:
            with pytest.raises(OperationTimeoutError):
                await other
        await client.close()


@pytest.mark.parametrize(
    "hello",
    [silent, lambda m: encode(ErrorResponse(m.request_id, 0, "?")),
     lambda m: encode(AddResponse(m.request_id, 0, 1, 0)), lambda m: frame(b"\xc1"),
     lambda m: encode(HelloResponse(m.request_id, 77, PROTOCOL_VERSION, "x"))],
    ids=["silence", "error OK", "wrong type", "garbage", "unknown status"],
)  # fmt: skip
async def test_a_handshake_the_client_cannot_understand_fails_clearly_and_in_time(hello):
    async with FakeBookie(silent, hello=hello) as fake:
        async with asyncio.timeout(TIMEOUT_S + 1):
            with pytest.raises(BookKeeperError):
                await BookieClient.connect(TcpNetwork(), fake.address, CONFIG)


RESPONSES = st.one_of(
    st.builds(AddResponse, st.just(0), st.integers(-5, 300), st.integers(-1, 3),
              st.integers(-1, 3)),
    st.builds(AddBatchResponse, st.just(0), st.integers(-5, 300), st.integers(-1, 3),
              st.lists(st.integers(-5, 300), max_size=3)),
    st.builds(ReadResponse, st.just(0), st.integers(-5, 300), st.integers(0, 3),
              st.integers(0, 3), st.none(), st.none(), st.none(), st.none()),
    st.builds(ReadLacResponse, st.just(0), st.integers(-5, 300), st.integers(0, 3), st.none(),
              st.integers(-1, 3)),
    st.builds(ListEntriesResponse, st.just(0), st.integers(-5, 300), st.integers(0, 3),
              st.just([]), st.integers(-1, 3)),
    st.builds(BookieInfoResponse, st.just(0), st.integers(-5, 300), st.integers(0, 9),
              st.integers(0, 9), st.booleans(), st.text(max_size=5)),
    st.builds(ErrorResponse, st.just(0), st.integers(-5, 300), st.text(max_size=5)),
)  # fmt: skip


QUICK = CONFIG.replace(request_timeout_s=0.1, timeout_sweep_interval_s=0.02)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(response=RESPONSES, id_shift=st.sampled_from([0, 0, 0, 0, 1, -1, 1000]))
def test_any_answer_is_a_typed_response_or_a_clear_error_in_time(response, id_shift):
    def answer(msg: Message) -> bytes:
        return encode(response._replace(request_id=msg.request_id + id_shift))

    async def scenario() -> Any:
        async with FakeBookie(answer) as fake:
            async with asyncio.timeout(QUICK.request_timeout_s + 1):
                try:
                    result, client = await one_add(fake.address, QUICK)
                except BookKeeperError as exc:
                    return exc
                await client.close()
                return result

    result = asyncio.run(scenario())
    if isinstance(result, BaseException):
        assert isinstance(result, BookKeeperError)
    else:  # delivered: exactly what the add's caller may rely on
        assert type(result) is AddResponse and result.status in KNOWN_STATUSES
        assert result.OP == AddRequest.OP | RESPONSE_BIT and id_shift == 0


# --- the facade with a nonsense bookie in the ensemble ------------------------------------


@contextlib.asynccontextmanager
async def in_process_cluster(tmp_path, bookies: int) -> AsyncIterator[tuple[str, list[Bookie]]]:
    """``bookies`` in-process bookies registered in a fresh memory:// metadata store."""
    uri = f"memory://hostile-{uuid.uuid4().hex[:8]}"
    async with open_metadata_store(uri) as store, contextlib.AsyncExitStack() as stack:
        await store.init_cluster()
        started = []
        for i in range(bookies):
            config = bookie_config(tmp_path / f"b{i}", metadata_uri=uri)
            started.append(await stack.enter_async_context(Bookie.serve(config)))
        yield uri, started


@contextlib.asynccontextmanager
async def with_fake(
    tmp_path, answer: Answer
) -> AsyncIterator[tuple[str, FakeBookie, contextlib.AsyncExitStack]]:
    """Two in-process bookies and a registered fake one; the stack starts more."""
    async with (
        in_process_cluster(tmp_path, 2) as (uri, _),
        FakeBookie(answer) as fake,
        contextlib.AsyncExitStack() as stack,
    ):
        store = await stack.enter_async_context(open_metadata_store(uri))
        registration = await store.register_bookie(fake.address, fake.address, None, False)
        await stack.enter_async_context(registration)
        yield uri, fake, stack


class Switch:
    """A fake bookie's behaviour that a test can change: honest-looking acks, then nonsense."""

    def __init__(self) -> None:
        self.nonsense = False

    def __call__(self, msg: Any) -> bytes:
        if self.nonsense:
            return encode(ErrorResponse(msg.request_id, 0, "OK?"))
        if type(msg) is AddRequest:
            return encode(AddResponse(msg.request_id, 0, msg.ledger_id, msg.entry_id))
        return encode(ErrorResponse(msg.request_id, StatusCode.IO_ERROR, "no"))


async def test_a_writer_replaces_a_bookie_answering_nonsense_and_recovery_goes_on(tmp_path):
    # Defect 8: an error response saying OK hit an assert after its request was popped, and
    # an unknown status raised inside the callback: append() and open_ledger(recovery=True)
    # never returned.
    behaviour = Switch()
    behaviour.nonsense = True
    # Nonsense is answered at once; the real bookies get timeouts a loaded machine meets (a
    # real bookie's read timing out made the recovery undecidable in a slow CI run).
    config = CONFIG.replace(connect_timeout_s=5.0, request_timeout_s=5.0)
    async with (
        with_fake(tmp_path, behaviour) as (uri, fake, stack),
        BookKeeper.connect(uri, config) as bk,
    ):
        writer = await bk.create_ledger(3, 3, 2, password=b"pw")
        assert fake.address in writer.metadata.last_ensemble()[1]
        spare = await stack.enter_async_context(
            Bookie.serve(bookie_config(tmp_path / "spare", metadata_uri=uri))
        )
        async with asyncio.timeout(20):
            ids = [await writer.append(b"%d" % i) for i in range(20)]
        assert ids == list(range(20))
        assert fake.address not in writer.metadata.last_ensemble()[1]
        assert spare.config.bookie_id in writer.metadata.last_ensemble()[1]
        await writer.close()

        # Now a recovery with the nonsense bookie in the last ensemble.
        behaviour.nonsense = False
        writer2 = await bk.create_ledger(3, 3, 2, password=b"pw")
        while fake.address not in writer2.metadata.last_ensemble()[1]:
            writer2 = await bk.create_ledger(3, 3, 2, password=b"pw")
        for i in range(10):
            await writer2.append(b"r%d" % i)
        behaviour.nonsense = True
        async with BookKeeper.connect(uri, config) as bk2, asyncio.timeout(20):
            reader = await bk2.open_ledger(writer2.ledger_id, password=b"pw", recovery=True)
            entries = await reader.read(0, reader.last_add_confirmed)
        assert [e.payload for e in entries][:10] == [b"r%d" % i for i in range(10)]


async def test_an_overloaded_bookie_is_retried_with_backoff_then_replaced(tmp_path):
    # Defect 11: TOO_MANY_REQUESTS was retried every 10 ms forever.
    def overloaded(msg: Any) -> bytes:
        return encode(AddResponse(msg.request_id, StatusCode.TOO_MANY_REQUESTS, msg.ledger_id,
                                  msg.entry_id))  # fmt: skip

    config = CONFIG.replace(overload_retry_backoff_s=0.01, overload_retry_backoff_max_s=0.05,
                            overload_retries_max=4)  # fmt: skip
    async with (
        with_fake(tmp_path, overloaded) as (uri, fake, stack),
        BookKeeper.connect(uri, config) as bk,
    ):
        writer = await bk.create_ledger(3, 3, 3, password=b"pw")  # the entry needs it
        await stack.enter_async_context(
            Bookie.serve(bookie_config(tmp_path / "spare", metadata_uri=uri))
        )
        async with asyncio.timeout(10):
            assert await writer.append(b"x") == 0
            await asyncio.sleep(0.5)  # the overloaded bookie was replaced: no more retries
        assert writer.statistics()["ensemble_changes"] == 1
        assert 1 + 4 <= len(fake.requests) <= 1 + 4 + 1  # first try, 4 retries (+ a race)
        await writer.close()


class OverloadedOnce:
    """A fake bookie that refuses each entry's first copy as overloaded and stores the rest,
    sent alone or in an ``AddBatchRequest`` (a writer's retries due in the same loop turn
    leave together as one)."""

    def __init__(self) -> None:
        self.added: list[int] = []  # the entry id of each copy it was sent

    def __call__(self, msg: Any) -> bytes:
        if type(msg) is AddRequest:
            status = self._add(msg.entry_id)
            return encode(AddResponse(msg.request_id, status, msg.ledger_id, msg.entry_id))
        if type(msg) is AddBatchRequest:
            entries = check_add_entries(msg.ledger_id, msg.entries)
            statuses = [self._add(entry[0]) for entry in entries]
            first = next((s for s in statuses if s), 0)
            return encode(AddBatchResponse(msg.request_id, first, msg.ledger_id, statuses))
        return encode(ErrorResponse(msg.request_id, StatusCode.IO_ERROR, "no"))

    def _add(self, entry_id: int) -> int:
        self.added.append(entry_id)
        return StatusCode.TOO_MANY_REQUESTS if self.added.count(entry_id) == 1 else 0


class RetryAt:
    """An overload retry policy whose retries all fall due at one moment (``at_s``, loop
    time): they leave in one loop turn."""

    def __init__(self, at_s: float) -> None:
        self.at_s = at_s

    def delay_s(self, attempt: int, rng: random.Random) -> float | None:
        return max(0.0, self.at_s - asyncio.get_running_loop().time()) if attempt == 1 else None


@pytest.mark.parametrize("retries", ["apart", "together", "after_close"])
async def test_a_copy_refused_as_overloaded_is_still_owed_after_the_ack_quorum(tmp_path, retries):
    # The bookie refused the copy (TOO_MANY_REQUESTS) before the others acknowledged the add
    # at AQ; its retry then saw the add done and sent nothing, and nothing marked it: the
    # entry kept two copies of three for good, unmarked (found by `benchmarks rereplication`:
    # a ledger short on a live bookie after autorecovery was done). Now the retry writes the
    # copy, and a writer closed before its retry marks the entry short (BP-31). Retries due
    # in the same loop turn travel as one AddBatchRequest (a loaded machine's timers fire
    # together, which "together" makes happen; a fake that knew only AddRequest failed the
    # batch, and the test, in a fresh-clone `make test` of 2026-11-28).
    behaviour = OverloadedOnce()
    backoff = 5.0 if retries == "after_close" else 0.3  # longer than the others' acks take
    config = CONFIG.replace(overload_retry_backoff_s=backoff, overload_retry_backoff_max_s=backoff,
                            overload_retries_max=4)  # fmt: skip
    async with (
        with_fake(tmp_path, behaviour) as (uri, fake, _),
        BookKeeper.connect(uri, config) as bk,
    ):
        writer = await bk.create_ledger(3, 3, 2, password=b"pw")  # the fake is one of the 3
        if retries == "together":
            # after the three appends (a loaded machine's take well under 0.8 s)
            writer._overload_retry = RetryAt(asyncio.get_running_loop().time() + 0.8)  # type: ignore[assignment]
        async with asyncio.timeout(10):
            assert [await writer.append(b"%d" % i) for i in range(3)] == [0, 1, 2]
            if retries != "after_close":
                await asyncio.sleep(1.5)  # the retries' backoff (0.15-0.3 s; together: 0.8)
            await writer.close()
        marks = [m async for m in list_marks(bk.ctx.metadata)]
        if retries == "after_close":
            assert behaviour.added == [0, 1, 2]
            ((missing,),) = [m.value.missing for m in marks]
            assert (missing.bookie, missing.entries) == (fake.address, ((0, 2),))
        else:
            assert sorted(behaviour.added) == [0, 0, 1, 1, 2, 2] and marks == []
        if retries == "together":  # the three retries went as one request
            assert sum(type(m) is AddBatchRequest for m in fake.requests) == 1


def test_the_retry_policy_backs_off_with_jitter_and_ends():
    policy = RetryPolicy(0.01, 1.0, 20)
    rng = random.Random(7)
    delays = [policy.delay_s(attempt, rng) for attempt in range(1, 22)]
    assert delays[-1] is None and None not in delays[:-1]
    for attempt, delay in enumerate(delays[:-1], start=1):
        base = min(1.0, 0.01 * 2 ** (attempt - 1))
        assert base / 2 <= delay < base
    again = random.Random(7)  # the same seed gives the same delays
    assert [policy.delay_s(a, again) for a in range(1, 22)] == delays
    assert sum(d for d in delays if d) <= policy.total_s()
    assert RetryPolicy(0.1, 5.0).delay_s(10**6, rng) < 5.0  # unbounded: never None


async def test_closed_writers_are_not_kept_by_the_client(tmp_path):
    # Defect 11: BookKeeper._writers kept every writer ever created.
    async with in_process_cluster(tmp_path, 3) as (uri, _), BookKeeper.connect(uri, CONFIG) as bk:
        for _ in range(20):
            writer = await bk.create_ledger(3, 3, 2)
            await writer.append(b"x")
            await writer.close()
        open_writer = await bk.create_ledger(3, 3, 2)
        del writer
        await asyncio.sleep(0.2)  # answers beyond AQ still name their writer until they come
        gc.collect()
        assert list(bk._writers) == [open_writer]


# --- recovery past a hung bookie (real processes) -----------------------------------------


@pytest.fixture
def cluster(tmp_path):
    with Cluster(tmp_path, 4, "files") as c:
        yield c


@pytest.mark.process
async def test_recovery_past_a_hung_bookie_takes_one_timeout_not_one_per_entry(cluster):
    # Defect 14: a recovering client connected to a SIGSTOPped bookie of the last ensemble
    # waited a whole request timeout per entry: each write-back waited for its whole write set
    # and entries were written back one at a time (30 entries: 60 s at a 2 s timeout).
    # Windows of 8 entries: recovery reads an entry from its first replica, then the others
    # (BookKeeper's sequential recovery reads), so a hung first replica must cost one
    # speculative wait, not a timeout per window.
    timeout_s = 2.0
    config = ClientConfig(request_timeout_s=timeout_s, speculative_read_timeout_s=0.2,
                          recovery_reads_parallel_max=8)  # fmt: skip
    quiet = config.replace(explicit_lac_interval_s=600)  # the bookies learn no LAC
    async with BookKeeper.connect(cluster.uri, quiet) as bk:
        writer = await bk.create_ledger(3, 3, 2, password=b"pw")
        # Pushed together, every entry carries LAC -1: recovery must write all 30 back.
        await asyncio.gather(*(writer.append_nowait(b"entry-%d" % i) for i in range(30)))
        ensemble = writer.metadata.last_ensemble()[1]
        hung = next(b for b in cluster.bookies if b.address == ensemble[2])
        async with BookKeeper.connect(cluster.uri, config) as bk2:
            await (await bk2.ctx.pool.get(hung.address)).bookie_info()  # connected first
            hung.signal(signal.SIGSTOP)
            try:
                loop = asyncio.get_running_loop()
                started = loop.time()
                reader = await bk2.open_ledger(writer.ledger_id, password=b"pw")
                took = loop.time() - started
                entries = await reader.read(0, reader.last_add_confirmed)
            finally:
                hung.signal(signal.SIGCONT)
    assert [e.payload for e in entries] == [b"entry-%d" % i for i in range(30)]
    assert took < 2 * timeout_s, took


async def test_a_recovery_close_keeps_a_replacement_made_while_it_ran(tmp_path, monkeypatch):
    # The simulator (seed 340 with autorecovery) found a recovery whose close wrote back the
    # segments it had read at its start, undoing an autorecovery's replacement of a lost
    # bookie in an earlier segment: the entries copied to the replacement lost their listing.
    import bookkeeper_aio.client.recovery as recovery_module
    from bookkeeper_aio.metadata.store import update_ledger

    async with (
        in_process_cluster(tmp_path, 4) as (uri, bookies),
        BookKeeper.connect(uri, CONFIG) as bk,
    ):
        writer = await bk.create_ledger(3, 3, 2, password=b"pw")
        for i in range(5):
            await writer.append(b"%d" % i)
        first_ensemble = writer.metadata.ensembles[0][1]
        others = [b.config.bookie_id for b in bookies if b.config.bookie_id not in first_ensemble]
        spare = others[0]
        # The writer changed its ensemble at 5 (then vanished): segment 0 is an earlier one.
        await update_ledger(bk.ctx.metadata, writer.ledger_id,
                            lambda v: v.value.with_ensemble_change(5, (spare, *first_ensemble[1:])),
                            5)  # fmt: skip
        read_forward = recovery_module._read_forward

        def replaced(v):  # what an autorecovery does to segment 0 (entries copied first)
            return v.value.with_replicas_replaced(0, {1: spare})

        async def meanwhile(ctx, md, key, last, ensembles):
            await update_ledger(bk.ctx.metadata, md.ledger_id, replaced, 5)
            return await read_forward(ctx, md, key, last, ensembles)

        monkeypatch.setattr(recovery_module, "_read_forward", meanwhile)
        async with BookKeeper.connect(uri, CONFIG) as bk2:
            reader = await bk2.open_ledger(writer.ledger_id, password=b"pw")
        assert reader.is_closed and reader.last_add_confirmed == 4
        assert reader.metadata.ensembles[0][1][1] == spare  # kept, not undone


def test_a_copy_of_another_entry_is_not_the_entry_asked_for():
    """A bookie answering a read of entry 4 with entry 5 (a valid digest for 5) gets no pass:
    every reader, recovery and copier checks copies with entry_ok."""
    from bookkeeper_aio.client.reads import entry_ok
    from bookkeeper_aio.digest import entry_digest
    from bookkeeper_aio.protocol import ReadResponse as Read

    payload = b"the fifth entry"
    five = Read(1, 0, 9, 5, 4, payload, entry_digest(9, 5, 4, payload), None)
    assert entry_ok(9, 5, five)
    assert not entry_ok(9, 4, five)
    assert not entry_ok(8, 5, five)  # and a copy of another ledger's entry


def test_a_copy_with_a_payload_but_no_entry_lac_is_bad_not_a_crash():
    """The protocol lets a read's entry_lac be None (a long poll that found nothing): one
    with a payload but no LAC made entry_ok raise struct.error (found by mypy)."""
    from bookkeeper_aio.client.reads import entry_ok
    from bookkeeper_aio.protocol import ReadResponse as Read

    assert not entry_ok(9, 5, Read(1, 0, 9, 5, None, b"payload", 0, None))
