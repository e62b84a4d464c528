"""The client side of one bookie connection: pipelined requests, matched by request id.

Theory of operation
-------------------
:class:`BookieClient` is an asyncio ``Protocol``. :meth:`BookieClient.request` builds a request
with a fresh request id, queues its frame and returns a future; frames queued in one loop
iteration leave in one ``writelines`` call. Responses are matched to futures by request id, in
whatever order the bookie answers. Adds packed by writers (:meth:`BookieClient.request_shared`)
go out at once when they are the connection's first request of a loop turn or large; the
small adds (of other writers) that follow in the same turn leave together at its end, as one
``MultiAddRequest`` (at most ``add_batch_entries_max`` parts and ``add_batch_bytes_max``
bytes), and each writer gets the answer its own request would have had. After a turn that
had several small adds, the next turn's first waits for its end too (one request per turn
while many ledgers write; one add at a time still leaves at once). A response resolves
its future whatever its status (callers interpret statuses); an ``ErrorResponse`` resolves it
with the matching exception.

Deadlines: every request has one (``request_timeout_s`` unless given). Instead of one timer per
request, a sweeper wakes every ``timeout_sweep_interval_s`` and fails requests whose deadline
passed with :class:`OperationTimeoutError` (a timer per request costs more than the request at
100k requests/s). A late answer to a timed-out request is ignored.

Bounds: at most ``bookie_requests_in_flight_max`` requests wait for answers; past that,
:meth:`request` raises :class:`TooManyRequestsError` at once and :meth:`wait_capacity` lets a
caller wait for room. When the transport's buffer is full (the bookie reads slowly)
:meth:`wait_capacity` also waits for it to drain.

A lost connection fails every pending request with :class:`BookieUnavailableError`: the outcome
of those requests is unknown, never negative.

An answer the client cannot understand — a frame that does not decode, a response of another
type than its request's, a status no bookie sends, an error saying OK, a batch's status list
of unknown codes — fails its request *and the connection* with :class:`ProtocolError`: a
bookie that says nonsense once is not trusted with the other requests either (they fail as
unknown, like a lost connection). An answer with a request id nothing waits for is ignored
(late answers are normal); if it was meant for a waiting request, that request times out.

The client holds one connection per bookie, shared, in a
:class:`~bookkeeper_aio.client.bookie_pool.BookiePool` (client/bookie_pool.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import Any, cast

from ..config import ClientConfig
from ..errors import (
    KNOWN_STATUSES,
    BookieUnavailableError,
    BookKeeperError,
    ClientClosedError,
    FrameTooLargeError,
    OperationTimeoutError,
    ProtocolError,
    ProtocolVersionError,
    StatusCode,
    TooManyRequestsError,
    error_for_status,
)
from ..framed import FramedConnection
from ..net import Network
from ..protocol import (
    ADD_FLAG_RECOVERY,
    MULTI_ADD_PART_OPS,
    PROTOCOL_VERSION,
    READ_FLAG_FENCE,
    READ_FLAG_LONG_POLL,
    RESPONSE_BIT,
    RESPONSE_LIMITS,
    AddBatchResponse,
    AddRequest,
    AddResponse,
    BadFrame,
    BookieInfoRequest,
    BookieInfoResponse,
    ErrorResponse,
    FrameDecoder,
    HelloRequest,
    ListEntriesRequest,
    ListEntriesResponse,
    MultiAddRequest,
    MultiAddResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    SharedFrame,
    WriteLacRequest,
    WriteLacResponse,
    multi_add_results,
    pack_multi_add,
)

log = logging.getLogger(__name__)

WRITE_CHUNK_BYTES = 256 * 1024  # handed to the transport per call while it is writable
# An add request this big goes alone: sharing a frame saves little beside its own cost, and a
# single writer's full batches (the 1-ledger benchmark) would only wait for the end of the turn.
MULTI_ADD_PART_BYTES_MAX = 64 * 1024


def handshake_hint(config: ClientConfig) -> str:
    """Why a bookie may drop a connection at once: what a bookie that requires TLS does to a
    plain client, and one that requires client certificates to a client without one."""
    if config.tls_ca_file is None:
        return "if the bookie requires TLS, set ClientConfig.tls_ca_file"
    return "if the bookie requires client certificates, set tls_cert_file and tls_key_file"


class BookieClient(FramedConnection):
    """One pipelined connection to one bookie (see the module docstring; the output plumbing
    is :class:`~bookkeeper_aio.framed.FramedConnection`'s, in WRITE_CHUNK_BYTES calls)."""

    WRITE_CHUNK_BYTES = WRITE_CHUNK_BYTES

    def __init__(self, address: str, config: ClientConfig) -> None:
        FramedConnection.__init__(self)
        self.address = address
        self.config = config
        self.bookie_id = address
        self._decoder = FrameDecoder(config.frame_bytes_max, RESPONSE_LIMITS)
        # request id -> (deliver(response or exception), deadline, bytes, the request's op).
        # Callbacks, not futures: a future costs an allocation plus a call_soon hop per
        # response (profiled: about a fifth of the client's CPU per add).
        self._pending: dict[int, tuple[Callable[[Any], None], float, int, int]] = {}
        self.backlog_bytes = 0  # bytes of the requests queued or sent and not yet answered
        self.on_drain: Callable[[], None] | None = None  # called when backlog_bytes fell
        self._next_id = 1
        # Adds of this loop turn after its first request: one MultiAddRequest at its end.
        self._parts: list[tuple[SharedFrame, Callable[[Any], None]]] = []
        self._parts_bytes = 0
        self._turn_adds = 0  # adds that could be parts, this loop turn
        self._gather = False  # the last turn had several: this one's first waits too
        self._closed: BaseException | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._capacity = asyncio.Event()
        self._capacity.set()
        self._sweeper: asyncio.TimerHandle | None = None
        self.lost = asyncio.Event()
        self.stats = {"requests": 0, "responses": 0, "timeouts": 0, "late_responses": 0,
                      "multi_adds": 0, "bad_answers": 0}  # fmt: skip

    # --- connect --------------------------------------------------------------------------

    @classmethod
    async def connect(cls, network: Network, address: str, config: ClientConfig) -> BookieClient:
        """Connect and shake hands.

        Raises:
            BookieUnavailableError: cannot connect, or no hello answer in time.
            ProtocolVersionError: the bookie speaks another protocol version.
        """
        client: BookieClient | None = None
        try:
            async with asyncio.timeout(config.connect_timeout_s):
                _, protocol = await network.connect(lambda: cls(address, config), address)
                assert isinstance(protocol, BookieClient)
                client = protocol
                hello = await client.request(HelloRequest, PROTOCOL_VERSION, config.client_name)
        except (OSError, TimeoutError, BookKeeperError) as exc:
            if client is not None:
                client.abort(BookieUnavailableError("handshake failed"))
            if isinstance(exc, ProtocolVersionError):
                raise
            what = "timed out" if isinstance(exc, TimeoutError) else str(exc)
            if client is not None and config.tls_cert_file is None:  # connected, then dropped
                what += f" before answering the handshake ({handshake_hint(config)})"
            raise BookieUnavailableError(f"cannot connect to bookie {address}: {what}") from exc
        if hello.status != StatusCode.OK or hello.protocol_version != PROTOCOL_VERSION:
            client.abort(ProtocolVersionError(f"bookie {address} speaks version "
                                              f"{hello.protocol_version}"))  # fmt: skip
            raise ProtocolVersionError(
                f"bookie {address} speaks protocol {hello.protocol_version}, "
                f"we speak {PROTOCOL_VERSION}"
            )
        client.bookie_id = hello.bookie_id
        return client

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        FramedConnection.connection_made(self, transport)
        self._schedule_sweep()

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._decoder.feed(data)
        except (FrameTooLargeError, ProtocolError) as exc:
            self.abort(BookieUnavailableError(f"bookie {self.address} sent garbage: {exc}"))
            return
        pending = self._pending
        for msg in messages:
            if type(msg) is BadFrame:
                self._nonsense(pending.pop(msg.request_id, None), f"a bad frame: {msg.reason}")
                return
            entry = pending.pop(msg.request_id, None)
            if entry is None:
                self.stats["late_responses"] += 1
                continue
            self.stats["responses"] += 1
            self.backlog_bytes -= entry[2]
            if type(msg) is ErrorResponse:
                error = error_for_status(msg.status, f"{self.address}: {msg.message}")
                if isinstance(error, ProtocolError):
                    self._nonsense(entry, str(error))
                    return
                _deliver(entry[0], error)
            elif entry[3] | RESPONSE_BIT != msg.OP:  # a request even, which has no status
                self._nonsense(entry, f"{type(msg).__name__} to op {entry[3]}")
                return
            else:
                response = cast(Response, msg)  # its op is the answer to a request's
                if response.status not in KNOWN_STATUSES or (
                    type(response) is AddBatchResponse
                    and not KNOWN_STATUSES.issuperset(response.statuses)
                ):
                    self._nonsense(entry, f"{type(msg).__name__} with status {response.status} "
                                          f"to op {entry[3]}")  # fmt: skip
                    return
                _deliver(entry[0], response)
        if not self._capacity.is_set() and len(pending) < self.config.bookie_requests_in_flight_max:
            self._capacity.set()
        if self.on_drain is not None:
            self.on_drain()

    def _nonsense(self, entry: tuple[Callable[[Any], None], float, int, int] | None,
                  what: str) -> None:  # fmt: skip
        """The bookie answered something we cannot understand: fail that request (if we know
        it) and the connection, with a clear error."""
        error = ProtocolError(f"bookie {self.address} sent {what}")
        log.warning("%s; closing the connection", error)
        self.stats["bad_answers"] += 1
        if entry is not None:
            _deliver(entry[0], error)
        self.abort(error)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"connection to bookie {self.address} lost" + (f": {exc}" if exc else "")
        self._fail_all(self._closed or BookieUnavailableError(reason))

    def _on_pause(self) -> None:
        self._writable.clear()

    def _on_resume(self) -> None:
        self._writable.set()
        self._flush()

    # --- requests -------------------------------------------------------------------------

    @property
    def is_usable(self) -> bool:
        """True while the connection is open."""
        return self._closed is None and not self.lost.is_set()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def request(
        self, msg_type: type[Request], *fields: Any, timeout_s: float | None = None
    ) -> asyncio.Future[Any]:
        """Send ``msg_type(request_id, *fields)``; a future of the response (any status).

        Raises:
            ClientClosedError / BookieUnavailableError: the connection is closed or lost.
            TooManyRequestsError: ``bookie_requests_in_flight_max`` requests are pending.
        """
        fut: asyncio.Future[Any] = self._loop.create_future()
        self.request_callback(msg_type, *fields, callback=partial(_settle, fut),
                              timeout_s=timeout_s)  # fmt: skip
        return fut

    def request_callback(
        self, msg_type: type[Request], *fields: Any, callback: Callable[[Any], None],
        timeout_s: float | None = None,
    ) -> None:  # fmt: skip
        """Like :meth:`request`, but ``callback(response or exception)`` is called once, from
        the event loop (inside data_received, the timeout sweep or a close); it must not raise.

        Raises: as :meth:`request`, before sending anything.
        """
        self._check_room()
        frame = self._encoder.encode(msg_type(self._next_id, *fields))
        self._register(callback, timeout_s, len(frame), msg_type.OP)
        self._out.append(frame)
        self._out_bytes += len(frame)
        self._schedule_flush()

    def request_shared(
        self, frame: SharedFrame, callback: Callable[[Any], None], timeout_s: float | None = None
    ) -> None:
        """:meth:`request_callback` for a request packed once for several bookies (its caller,
        the writer's end-of-turn flush, already batched it). Written at once when it is the
        first request of this loop turn (one add outstanding waits for nothing); an add after
        it in the turn becomes a part of the turn's ``MultiAddRequest`` (module docstring);
        after a turn of several adds, the first waits for the end of the turn too."""
        self._check_room()
        part = (
            frame.op in MULTI_ADD_PART_OPS
            and frame.part_size < MULTI_ADD_PART_BYTES_MAX
            and timeout_s is None
        )
        self._turn_adds += part
        if part and (self._flush_scheduled or self._gather):
            self._schedule_flush()
            config = self.config
            if self._parts and (
                len(self._parts) >= config.add_batch_entries_max
                or self._parts_bytes + frame.part_size > config.add_batch_bytes_max
            ):
                self._send_parts()
            self._parts.append((frame, callback))
            self._parts_bytes += frame.part_size
            self.backlog_bytes += frame.part_size  # a writer's backpressure counts it now
            return
        pieces = frame.pieces(self._encoder.packer, self._next_id)
        size = sum(map(len, pieces))
        self._register(callback, timeout_s, size, frame.op)
        self._out += pieces
        self._out_bytes += size
        if not self._flush_scheduled:
            self._flush()
            self._schedule_flush()  # the turn's later requests, together

    def _send_parts(self) -> None:
        """Queue the parts gathered so far as one request (a lone part as itself)."""
        parts, self._parts = self._parts, []
        self.backlog_bytes -= self._parts_bytes  # counted again, framed, by _register
        self._parts_bytes = 0
        packer = self._encoder.packer
        if len(parts) == 1:
            frame, callback = parts[0]
            pieces = list(frame.pieces(packer, self._next_id))
            op = frame.op
        else:
            pieces = pack_multi_add(packer, self._next_id, [frame for frame, _ in parts])
            callback = partial(self._answer_parts, [(f.op, callback) for f, callback in parts])
            op = MultiAddRequest.OP
            self.stats["multi_adds"] += 1
        size = sum(map(len, pieces))
        self._register(callback, None, size, op)
        self._out += pieces
        self._out_bytes += size

    def _answer_parts(self, parts: list[tuple[int, Callable[[Any], None]]], result: Any) -> None:
        """Give each part of a MultiAddRequest (its op, whom to tell) its own answer (the
        response it would have had alone), or the whole request's fate: an exception, or a
        response refusing it all. A part answered with nonsense fails like a bad answer."""
        if type(result) is MultiAddResponse:
            if len(result.results) != len(parts) and result.status == StatusCode.OK:
                result = ProtocolError(
                    f"bookie {self.address} answered {len(result.results)} of {len(parts)} parts"
                )
            elif len(result.results) == len(parts):
                answers = [_part_answer(op, response, self.address)
                           for (op, _), response in zip(parts, multi_add_results(result),
                                                        strict=True)]  # fmt: skip
                for (_, callback), answer in zip(parts, answers, strict=True):
                    _deliver(callback, answer)
                bad = next((a for a in answers if isinstance(a, ProtocolError)), None)
                if bad is not None:
                    self.abort(bad)
                return
        for _, callback in parts:
            _deliver(callback, result)

    def _check_room(self) -> None:
        if self._closed is not None:
            raise self._closed
        if len(self._pending) >= self.config.bookie_requests_in_flight_max:
            self._capacity.clear()
            raise TooManyRequestsError(f"{len(self._pending)} requests pending on {self.address}")

    def _register(
        self, callback: Callable[[Any], None], timeout_s: float | None, size: int, op: int
    ) -> None:
        """Track the request just encoded with ``self._next_id`` as its id."""
        rid = self._next_id
        self._next_id += 1
        deadline = self._loop.time() + (timeout_s or self.config.request_timeout_s)
        self._pending[rid] = (callback, deadline, size, op)
        self.backlog_bytes += size
        self.stats["requests"] += 1

    async def wait_capacity(self) -> None:
        """Wait until a request can be sent without exceeding a bound."""
        limit = self.config.bookie_requests_in_flight_max
        while self._closed is None and (len(self._pending) >= limit or not self._writable.is_set()):
            if len(self._pending) >= limit:
                self._capacity.clear()
            await self._capacity.wait()
            await self._writable.wait()
        if self._closed is not None:
            raise self._closed

    def _flush(self) -> None:
        if self._flush_scheduled:  # the end of the turn
            # Several adds this turn (many ledgers, a busy client): the next turn's are
            # likely several too, and its first waits with them, so that one request per
            # turn carries them all. (Written at once, it made a second request per turn for
            # each bookie: in an open loop over 100 ledgers, as many lone adds as multi-adds.)
            # After a turn of one add, the first goes at once again (one add at a time).
            self._gather = self._turn_adds > 1
            self._turn_adds = 0
        if self._parts:  # the turn's gathered adds go first, as one MultiAddRequest
            self._send_parts()
        FramedConnection._flush(self)

    def _schedule_sweep(self) -> None:
        self._sweeper = self._loop.call_later(self.config.timeout_sweep_interval_s, self._sweep)

    def _sweep(self) -> None:
        now = self._loop.time()
        expired = [rid for rid, entry in self._pending.items() if entry[1] <= now]
        for rid in expired:
            deliver, _, size, _ = self._pending.pop(rid)
            self.backlog_bytes -= size
            self.stats["timeouts"] += 1
            _deliver(deliver, OperationTimeoutError(f"bookie {self.address} did not answer"))
        if expired and len(self._pending) < self.config.bookie_requests_in_flight_max:
            self._capacity.set()
        if expired and self.on_drain is not None:
            self.on_drain()
        if self._closed is None:
            self._schedule_sweep()

    def _fail_all(self, exc: BaseException) -> None:
        if self._closed is None:
            self._closed = exc
        self.lost.set()
        if self._sweeper is not None:
            self._sweeper.cancel()
        pending, self._pending = self._pending, {}
        entries = list(pending.values())
        pending.clear()  # a data_received looping over it finds nothing more to deliver
        parts, self._parts, self._parts_bytes = self._parts, [], 0
        self.backlog_bytes = 0
        for deliver, *_ in entries:
            _deliver(deliver, exc)
        for _, deliver in parts:
            _deliver(deliver, exc)
        self._capacity.set()
        self._writable.set()
        if self.on_drain is not None:
            self.on_drain()

    def abort(self, exc: BaseException) -> None:
        """Close at once, failing pending requests with ``exc``."""
        self._fail_all(exc)
        if self._transport is not None:
            self._transport.abort()

    async def close(self) -> None:
        """Close the connection; pending requests fail with ClientClosedError."""
        if self._closed is None:
            self._flush()
            self._fail_all(ClientClosedError(f"connection to {self.address} closed"))
        if self._transport is not None:
            self._transport.close()
        await asyncio.sleep(0)

    def statistics(self) -> dict[str, int]:
        """Requests, responses, timeouts, late responses, in flight."""
        return {**self.stats, "in_flight": len(self._pending)}

    # --- typed helpers (raise on a non-OK status) -----------------------------------------

    async def add_entry(
        self, ledger_id: int, entry_id: int, master_key: bytes, lac: int, payload: bytes,
        digest: int, *, recovery: bool = False,
    ) -> AddResponse:  # fmt: skip
        """Add one entry. Raises the status's exception unless OK."""
        flags = ADD_FLAG_RECOVERY if recovery else 0
        fields = (ledger_id, entry_id, flags, master_key, lac, payload, digest)
        return _ok(await self.request(AddRequest, *fields))

    async def read_entry(
        self, ledger_id: int, entry_id: int, *, master_key: bytes | None = None,
        fence: bool = False, long_poll_previous_lac: int | None = None,
        long_poll_timeout_ms: int = 0,
    ) -> ReadResponse:  # fmt: skip
        """Read one entry (optionally fencing, or long-polling for the LAC to pass a value)."""
        flags = READ_FLAG_FENCE if fence else 0
        previous, timeout_s = -1, None
        if long_poll_previous_lac is not None:
            flags |= READ_FLAG_LONG_POLL
            previous = long_poll_previous_lac
            timeout_s = long_poll_timeout_ms / 1000 + self.config.request_timeout_s
        fields = (ledger_id, entry_id, flags, master_key, previous, long_poll_timeout_ms)
        return _ok(await self.request(ReadRequest, *fields, timeout_s=timeout_s))

    async def read_lac(
        self, ledger_id: int, *, master_key: bytes | None = None, fence: bool = False
    ) -> ReadLacResponse:
        """The bookie's best LAC proof and last entry id for a ledger."""
        flags = READ_FLAG_FENCE if fence else 0
        return _ok(await self.request(ReadLacRequest, ledger_id, flags, master_key))

    async def write_lac(
        self, ledger_id: int, master_key: bytes, lac: int, digest: int
    ) -> WriteLacResponse:
        """Store an explicit LAC."""
        return _ok(await self.request(WriteLacRequest, ledger_id, master_key, lac, digest))

    async def list_entries(
        self, ledger_id: int, start_entry_id: int = 0, max_count: int = 100_000
    ) -> ListEntriesResponse:
        """One page of the entry ids the bookie holds."""
        return _ok(await self.request(ListEntriesRequest, ledger_id, start_entry_id, max_count))

    async def bookie_info(self) -> BookieInfoResponse:
        """Free/total disk and read-only state."""
        return _ok(await self.request(BookieInfoRequest))


def _ok(response: Any) -> Any:
    if response.status != StatusCode.OK:
        raise error_for_status(response.status)
    return response


def _settle(fut: asyncio.Future[Any], result: Any) -> None:
    if not fut.done():
        if isinstance(result, BaseException):
            fut.set_exception(result)
        else:
            fut.set_result(result)


def _part_answer(op: int, response: Any, address: str) -> Any:
    """What a part of a multi-add is told: its response, its error, or a ProtocolError."""
    if type(response) is BadFrame:
        return ProtocolError(f"bookie {address} sent a bad part: {response.reason}")
    if type(response) is ErrorResponse:
        return error_for_status(response.status, f"{address}: {response.message}")
    if op | RESPONSE_BIT != response.OP or response.status not in KNOWN_STATUSES or (
        type(response) is AddBatchResponse and not KNOWN_STATUSES.issuperset(response.statuses)
    ):  # fmt: skip
        return ProtocolError(f"bookie {address} sent {type(response).__name__} with status "
                             f"{response.status} to op {op}")  # fmt: skip
    return response


def _deliver(callback: Callable[[Any], None], result: Any) -> None:
    try:
        callback(result)
    except Exception as exc:  # a broken callback must not stop the other responses
        asyncio.get_running_loop().call_exception_handler(
            {"message": "bookie response callback failed", "exception": exc}
        )
