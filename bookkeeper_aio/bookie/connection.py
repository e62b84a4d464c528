"""One client connection to a bookie: framing, handshake, limits and coalesced output.

Theory of operation
-------------------
:class:`BookieConnection` is an asyncio ``Protocol``. Bytes go through a
:class:`~bookkeeper_aio.protocol.FrameDecoder`; each request goes to the
:class:`~bookkeeper_aio.bookie.handler.RequestHandler` with this connection's :meth:`send` as
its reply callback and the connection itself as its :class:`~.long_poll.Peer`.

* **Handshake first.** The first frame must be a ``HelloRequest`` with our protocol version;
  otherwise the answer is BAD_REQUEST / BAD_VERSION and the connection closes. A connection
  that says nothing for ``handshake_timeout_s`` is closed; so is a greeted one with nothing
  in flight that completes no request for ``connection_idle_timeout_s`` (idle, or trickling
  a frame byte by byte).
* **Bad input never kills the server.** A frame that decodes to a ``BadFrame`` is answered
  with an ``ErrorResponse`` and the connection stays usable; an oversize or zero-length frame
  means the stream cannot be trusted, so this one connection gets an error and is closed.
* **Bounded in flight.** At most ``connection_requests_in_flight_max`` requests and
  ``connection_in_flight_bytes_max`` payload bytes per connection wait for an answer; past
  either bound the answer is TOO_MANY_REQUESTS. Only requests counted in are counted out:
  the answer to a bad frame or a second hello is not a request's (:meth:`_answer`).
* **Bounded output.** Answer bytes not yet sent — queued here and in the transport's buffer,
  half of ``connection_output_bytes_max`` each — are counted. Past it the connection stops
  reading *and*
  stops handling: the requests already decoded wait (``_held``), and so do answers produced
  later (a read whose fence became durable, a long poll's; :meth:`defer`), until the client
  has read enough. A client that sends reads and never reads answers therefore costs at most
  that bound plus one answer, not a queue of every answer it asked for. A full journal queue
  also pauses reading (the bookie pauses every connection).
* **Coalesced output.** Replies produced in one loop iteration (a journal batch completes
  hundreds of adds at once) leave in one ``writelines`` call, as do the answers given while
  reading one chunk of requests; an answer given later to a connection that awaits no other
  leaves at once (nothing would join it; one add at a time is answered a loop turn sooner).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from ..errors import FrameTooLargeError, ProtocolError, StatusCode
from ..framed import FramedConnection
from ..protocol import (
    PROTOCOL_VERSION,
    RESPONSE_BIT,
    AddBatchRequest,
    AddRequest,
    BadFrame,
    ErrorResponse,
    FrameDecoder,
    HelloRequest,
    HelloResponse,
    Message,
    MultiAddRequest,
    multi_add_bytes,
    request_limits,
)
from .handler import error_response
from .long_poll import Peer

if TYPE_CHECKING:
    from .server import Bookie

log = logging.getLogger(__name__)

Held = Message | BadFrame | Callable[[], None]  # a request not handled yet, or deferred work


class BookieConnection(FramedConnection, Peer):
    """The server side of one connection (see the module docstring; the output plumbing is
    :class:`~bookkeeper_aio.framed.FramedConnection`'s, every queued answer handed to the
    transport at once)."""

    def __init__(self, bookie: Bookie) -> None:
        FramedConnection.__init__(self)
        Peer.__init__(self)
        self.bookie = bookie
        self.config = bookie.config
        self.handler = bookie.handler
        self._decoder = FrameDecoder(
            self.config.frame_bytes_max, request_limits(self.config.multi_add_parts_max)
        )
        # Half the bound here, half in the transport's buffer (its high-water mark).
        self._out_max = self.config.connection_output_bytes_max // 2
        self._held: collections.deque[Held] = collections.deque()
        self._receiving = False
        self._greeted = False
        self._closing = False
        self._in_flight = 0
        self._in_flight_bytes = 0
        self._add_bytes: dict[int, int] = {}  # request id -> payload bytes of pending adds
        self._pause_reasons: set[str] = set()
        self._timer: asyncio.TimerHandle | None = None  # handshake, then idle timeout
        self._chunks = 0  # reads that completed requests (the idle timer compares it)
        self._chunks_seen = -1  # _chunks when the idle timer last looked
        self.peer = "?"

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        FramedConnection.connection_made(self, transport)
        self.peer = str(transport.get_extra_info("peername"))
        cast(asyncio.Transport, transport).set_write_buffer_limits(high=self._out_max)
        if not self.bookie.register(self):
            log.warning("refusing %s: connections_max reached", self.peer)
            status = StatusCode.TOO_MANY_REQUESTS
            self._close_with(ErrorResponse(-1, status, "too many connections"))
            return
        self._timer = self._loop.call_later(self.config.handshake_timeout_s, self._no_hello)
        if self._pause_reasons:  # registered while the bookie reads nothing (journal, engine)
            # Both event loops start reading after connection_made, whatever it paused: pause
            # again once they have (asyncio's second pause_reading alone would be a no-op).
            self._loop.call_soon(self._pause_again)

    def _pause_again(self) -> None:
        if self._pause_reasons and self._transport is not None and not self._closing:
            self._transport.resume_reading()
            self._transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        try:
            messages = self._decoder.feed(data)
        except (FrameTooLargeError, ProtocolError) as exc:
            self.bookie.counters["frames_rejected"] += 1
            log.warning("closing %s: %s", self.peer, exc)
            self._close_with(ErrorResponse(-1, StatusCode.BAD_REQUEST, str(exc)))
            return
        if not messages:
            return
        self._chunks += 1  # not idle (cheaper than reading the clock on every read)
        if self._held:  # answers are backed up: these wait behind the others
            self._held.extend(messages)
            return
        self._receiving = True  # answers given meanwhile wait for the rest (one write)
        try:
            for msg in messages:
                if self._closing:
                    return
                if (self._blocked or self._out_bytes > self._out_max) and self._backed_up():
                    self._hold_rest(messages, msg)
                    return
                self._on_message(msg)
        finally:
            self._receiving = False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._drop_output()
        self._held.clear()
        if self._timer is not None:
            self._timer.cancel()
        self.drop_long_polls()
        self.bookie.unregister(self)

    def _on_pause(self) -> None:
        self.pause_reading("output")

    def _on_resume(self) -> None:
        self._run_held()
        if not self._held:
            self.resume_reading("output")

    # --- flow control ---------------------------------------------------------------------

    def pause_reading(self, reason: str) -> None:
        """Stop reading requests until every reason is gone (output full, journal full)."""
        if not self._pause_reasons and self._transport is not None and not self._closing:
            self._transport.pause_reading()
        self._pause_reasons.add(reason)

    def resume_reading(self, reason: str) -> None:
        """Drop one reason to pause; read again when none is left."""
        self._pause_reasons.discard(reason)
        if not self._pause_reasons and self._transport is not None and not self._closing:
            self._transport.resume_reading()

    def _backed_up(self) -> bool:
        """Past the output bound: hand what is queued to the transport (it writes what the
        socket takes at once); still past it — the peer is not reading — stop reading."""
        self._flush()
        if self._blocked:
            self.pause_reading("output")
        return self._blocked

    def _hold_rest(self, messages: list[Message | BadFrame], first: Message | BadFrame) -> None:
        """Hold ``first`` and what follows it in ``messages`` (found by identity: equal
        messages may come twice; no index is kept on the hot path)."""
        start = next(i for i, msg in enumerate(messages) if msg is first)
        self._held.extend(messages[start:])

    def defer(self, work: Callable[[], None]) -> None:
        """Produce a later answer (``work``) now, or once the peer has read enough."""
        if self._closing:
            return  # nobody to answer
        if self._held or ((self._blocked or self._out_bytes > self._out_max) and self._backed_up()):
            self._held.append(work)
            return
        work()

    def _run_held(self) -> None:
        """The peer read: handle what waited, until the output is past its bound again."""
        held = self._held
        while held and not self._closing:
            if (self._blocked or self._out_bytes > self._out_max) and self._backed_up():
                return
            item = held.popleft()
            if callable(item):  # deferred work (messages are NamedTuples: not callable)
                item()
            else:
                self._on_message(item)

    # --- requests -------------------------------------------------------------------------

    def _on_message(self, msg: Message | BadFrame) -> None:
        if type(msg) is BadFrame:
            self.bookie.counters["bad_frames"] += 1
            reply = ErrorResponse(msg.request_id, StatusCode.BAD_REQUEST, msg.reason)
            self._answer(reply) if self._greeted else self._close_with(reply)
            return
        if not self._greeted:
            self._hello(msg)
            return
        if type(msg) is HelloRequest or msg.OP & RESPONSE_BIT:
            what = "a second hello" if type(msg) is HelloRequest else "a response"
            self._answer(
                ErrorResponse(msg.request_id, StatusCode.BAD_REQUEST, f"unexpected {what}")
            )
            return
        size = (
            len(msg.payload) if type(msg) is AddRequest
            else len(msg.entries) if type(msg) is AddBatchRequest
            else multi_add_bytes(msg) if type(msg) is MultiAddRequest
            else 0
        )  # fmt: skip
        if (
            self._in_flight >= self.config.connection_requests_in_flight_max
            or self._in_flight_bytes + size > self.config.connection_in_flight_bytes_max
        ):
            self.bookie.counters["too_many_requests"] += 1
            self._answer(error_response(msg, StatusCode.TOO_MANY_REQUESTS))
            return
        self._in_flight += 1
        if size:
            self._in_flight_bytes += size
            self._add_bytes[msg.request_id] = size
        self.handler.handle(msg, self.send, self)

    def _hello(self, msg: Message) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if type(msg) is not HelloRequest:
            reply = ErrorResponse(msg.request_id, StatusCode.BAD_REQUEST, "expected hello first")
            self._close_with(reply)
        elif msg.protocol_version != PROTOCOL_VERSION:
            status = StatusCode.BAD_VERSION
            self._close_with(HelloResponse(msg.request_id, status, PROTOCOL_VERSION, ""))
        else:
            self._greeted = True
            bookie_id = self.config.bookie_id
            self._answer(HelloResponse(msg.request_id, StatusCode.OK, PROTOCOL_VERSION, bookie_id))
            self._timer = self._loop.call_later(self.config.connection_idle_timeout_s, self._idle)

    def _no_hello(self) -> None:
        if not self._greeted and not self._closing:
            self._close_with(ErrorResponse(-1, StatusCode.BAD_REQUEST, "no hello in time"))

    def _idle(self) -> None:
        """The idle timer, every ``connection_idle_timeout_s``: close a connection that
        awaits nothing and completed no request since the last look (so an idle one goes
        after one to two timeouts)."""
        if self._closing:
            return
        if self._chunks == self._chunks_seen and not self._in_flight and not self._held:
            self.bookie.counters["connections_idle_closed"] += 1
            log.info("closing %s: idle", self.peer)
            self.close()
            return
        self._chunks_seen = self._chunks
        self._timer = self._loop.call_later(self.config.connection_idle_timeout_s, self._idle)

    # --- output ---------------------------------------------------------------------------

    def send(self, msg: Message) -> None:
        """The reply callback of a request counted in flight: count it out, queue the frame."""
        self._in_flight -= 1
        if self._add_bytes:
            self._in_flight_bytes -= self._add_bytes.pop(msg.request_id, 0)
        # No other answer to wait for (and no request being read that might answer at once):
        # write it now, so one add at a time skips a loop turn.
        self._answer(msg, now=not self._in_flight and not self._receiving)

    def _answer(self, msg: Message, *, now: bool = False) -> None:
        """Queue an answer (of a counted request through :meth:`send`, or of a frame that was
        not one: a bad frame, a second hello, a refusal)."""
        if self._closing:
            return  # the client is gone; dropping its answers is all we can do
        frame = self._encoder.encode(msg)
        self._out.append(frame)
        self._out_bytes += len(frame)
        if now:
            self._flush()
        else:
            self._schedule_flush()

    def _close_with(self, msg: Message) -> None:
        """Send a last message, then close (after the output is flushed)."""
        self._answer(msg)
        self._flush()
        self.close()

    def close(self) -> None:
        """Flush what is queued and close the connection."""
        self._flush()
        self._closing = True
        self._held.clear()
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        """Drop the connection now, unflushed output included (a crashing bookie)."""
        self._closing = True
        self._drop_output()
        self._held.clear()
        if self._transport is not None:
            self._transport.abort()

    def statistics(self) -> dict[str, int]:
        """In-flight requests and bytes, queued output, held requests, parked long polls."""
        return {
            "in_flight": self._in_flight,
            "in_flight_bytes": self._in_flight_bytes,
            "output_frames": len(self._out),
            "output_bytes": self.output_bytes(),
            "held": len(self._held),
            "long_polls": len(self.long_polls),
        }
