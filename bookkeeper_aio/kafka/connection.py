"""One Kafka client connection: frames in, answers out in request order.

Theory of operation
-------------------
Two loops per connection. The read loop takes one size-prefixed request at a time, checks its
size against ``kafka_request_bytes_max`` before reading it, decodes it and lets the handler do
the request's ordered part (``handler.py``); the rest runs as a task of the connection's task
group, queued for the answer loop. The answer loop awaits those tasks in queue order and
writes each answer, so answers leave in request order whatever finishes first (Kafka clients
pipeline and match answers by order). The queue is bounded
(``kafka_connection_requests_in_flight_max``): a client that sends faster than it is answered,
or does not read its answers, stops being read (TCP pushes back). A produce with acks=0 is
never queued: it gets no answer.

Bad input keeps the gateway serving: an unknown API key or version is answered with
UNSUPPORTED_VERSION (``codec.encode_unsupported``) and the connection stays open; a request
over the size limit, a header that does not parse or a body that does not decode closes this
connection only (after the answers already due are written), as Kafka does. The connection's
lifecycle is one state: OPEN -> CLOSING (no more requests read) -> CLOSED.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import struct
from typing import TYPE_CHECKING, Any

from . import codec
from .errors import ProtocolDecodeError
from .handler import RequestHandler

if TYPE_CHECKING:
    from .gateway import Gateway

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
HEADER_BYTES_MIN = 10  # api key, version, correlation id, client id length
IDLE_TIMEOUT_S = 600.0  # Kafka's connections.max.idle.ms
WRITE_TIMEOUT_S = 30.0  # an answer not taken by the peer in this long closes the connection


class ConnectionState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


TRANSITIONS = frozenset(
    {
        (ConnectionState.OPEN, ConnectionState.CLOSING),
        (ConnectionState.CLOSING, ConnectionState.CLOSED),
        (ConnectionState.OPEN, ConnectionState.CLOSED),
    }
)


class KafkaConnection:
    """A client connection (see the module docstring)."""

    def __init__(
        self, gateway: Gateway, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ):
        self.gateway = gateway
        self.config = gateway.config
        self.reader = reader
        self.writer = writer
        self.handler = RequestHandler(gateway)
        self.state = ConnectionState.OPEN
        self.peer = writer.get_extra_info("peername")
        self.requests = 0
        self.task: asyncio.Task[None] | None = None
        limit = self.config.kafka_connection_requests_in_flight_max
        self._answers: asyncio.Queue[tuple[int, asyncio.Future[Any]] | None] = asyncio.Queue(limit)

    async def run(self) -> None:
        """Serve until the peer closes, bad input, or the gateway shuts down."""
        if len(self.gateway.connections) >= self.config.kafka_connections_max:
            log.warning("refusing %s: kafka_connections_max reached", self.peer)
            self.writer.close()
            return
        self.gateway.connections.add(self)
        self.task = asyncio.current_task()
        try:
            async with asyncio.TaskGroup() as tasks:
                answers = tasks.create_task(self._answer_loop())
                await self._read_loop(tasks)
                self._move(ConnectionState.CLOSING)
                await self._answers.put(None)  # after the answers already due
                await answers
        except* OSError as group:  # reset, broken pipe, an answer the peer did not take
            log.info("%s: connection lost: %r", self.peer, group.exceptions[0])
        except* Exception as group:  # a bug: logged with its traceback, this connection ends
            log.error("%s: connection failed", self.peer, exc_info=group)
        finally:
            self._move(ConnectionState.CLOSED)
            self.writer.close()
            self.gateway.connections.discard(self)

    def close(self) -> None:
        """Stop reading (the gateway shuts down); answers due are still written."""
        if self.state is ConnectionState.OPEN:
            self.reader.feed_eof()

    async def _read_loop(self, tasks: asyncio.TaskGroup) -> None:
        while self.state is ConnectionState.OPEN:
            frame = await self._read_frame()
            if frame is None:
                return
            try:
                header, body_start = codec.parse_header(frame)
                if not codec.is_supported(header.api_key, header.api_version):
                    log.info(
                        "%s: unsupported API %d v%d", self.peer, header.api_key, header.api_version
                    )
                    await self._queue(
                        header.correlation_id,
                        _done(codec.encode_unsupported(header.correlation_id)),
                    )
                    continue
                request = codec.decode_request(header, frame, body_start)
            except ProtocolDecodeError as exc:
                log.warning("%s: closing: %s", self.peer, exc)
                return
            self.requests += 1
            work = await self.handler.start(header, request)
            if work is not None:
                await self._queue(
                    header.correlation_id, tasks.create_task(self._encoded(header, work))
                )

    async def _read_frame(self) -> bytes | None:
        try:
            async with asyncio.timeout(IDLE_TIMEOUT_S):
                (size,) = _SIZE.unpack(await self.reader.readexactly(4))
                if not HEADER_BYTES_MIN <= size <= self.config.kafka_request_bytes_max:
                    log.warning(
                        "%s: closing: request of %d bytes (kafka_request_bytes_max is %d)",
                        self.peer, size, self.config.kafka_request_bytes_max,
                    )  # fmt: skip
                    return None
                return await self.reader.readexactly(size)
        except asyncio.IncompleteReadError:
            return None  # the peer closed (or the gateway is shutting down)
        except TimeoutError:
            log.info("%s: closing an idle connection", self.peer)
            return None

    async def _queue(self, correlation_id: int, answer: asyncio.Future[Any]) -> None:
        await self._answers.put((correlation_id, answer))

    async def _encoded(self, header: Any, work: Any) -> bytes:
        return codec.encode_response(header, await work)

    async def _answer_loop(self) -> None:
        while (item := await self._answers.get()) is not None:
            _, answer = item
            data = await answer
            self.writer.write(data)
            async with asyncio.timeout(WRITE_TIMEOUT_S):
                await self.writer.drain()

    def _move(self, target: ConnectionState) -> None:
        if self.state is target:
            return
        if (self.state, target) not in TRANSITIONS:
            raise AssertionError(f"connection {self.state.value} -> {target.value}")
        self.state = target


def _done(data: bytes) -> asyncio.Future[bytes]:
    future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    future.set_result(data)
    return future
