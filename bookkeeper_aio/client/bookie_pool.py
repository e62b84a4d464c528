"""The client's connections to bookies: one :class:`~.bookie_client.BookieClient` per address.

:class:`BookiePool` hands out one shared connection per bookie (client/bookie_client.py says
how a connection works), connects on first use and again after a loss, backs off from a bookie
that cannot be reached, and sends requests that need no await (``send``, ``send_shared``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..config import ClientConfig
from ..errors import BookieUnavailableError, ClientClosedError
from ..net import Network
from ..protocol import Request, SharedFrame
from ..retry import RetryPolicy
from .bookie_client import BookieClient


class BookiePool:
    """Connections by address: one per bookie, shared, reconnected on the next use after a loss.

    Concurrent callers of :meth:`get` share one connection attempt. After a failed attempt the
    address is not retried for a backoff that doubles up to ``reconnect_backoff_max_s`` (with
    jitter from the injected rng: :class:`~bookkeeper_aio.retry.RetryPolicy`), so a dead
    bookie costs one fast failure, not a connect storm.
    """

    def __init__(self, network: Network, config: ClientConfig, rng: Any) -> None:
        self.network = network
        self.config = config
        self.rng = rng
        self._clients: dict[str, BookieClient] = {}
        self._connecting: dict[str, asyncio.Task[BookieClient]] = {}
        self._backoff: dict[str, tuple[float, int]] = {}  # address -> (retry_at, failures)
        self._reconnect = RetryPolicy(config.reconnect_backoff_s, config.reconnect_backoff_max_s)
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()  # connect-then-send, owned until done
        self._room_waiters: set[asyncio.Event] = set()

    def add_room_waiter(self, event: asyncio.Event) -> None:
        """Set ``event`` whenever a connection's backlog falls (until discarded): a writer
        waiting on another writer's backlog gets no answer of its own to wake it."""
        self._room_waiters.add(event)

    def discard_room_waiter(self, event: asyncio.Event) -> None:
        self._room_waiters.discard(event)

    def _wake_room_waiters(self) -> None:
        for event in self._room_waiters:
            event.set()

    def backlog_bytes(self, address: str) -> int:
        """Bytes sent to ``address`` and not yet answered (0 without a connection)."""
        client = self._clients.get(address)
        return client.backlog_bytes if client is not None else 0

    def get_nowait(self, address: str) -> BookieClient | None:
        """A usable connection if there is one already."""
        client = self._clients.get(address)
        return client if client is not None and client.is_usable else None

    async def get(self, address: str) -> BookieClient:
        """A usable connection to ``address``, connecting if needed.

        Raises:
            BookieUnavailableError: cannot connect (or still backing off after a failure).
            ClientClosedError: the pool is closed.
        """
        if self._closed:
            raise ClientClosedError("bookie pool closed")
        client = self.get_nowait(address)
        if client is not None:
            return client
        loop = asyncio.get_running_loop()
        retry_at, _ = self._backoff.get(address, (0.0, 0))
        if loop.time() < retry_at:
            raise BookieUnavailableError(f"bookie {address} unreachable (backing off)")
        fut = self._connecting.get(address)
        if fut is None:
            # The connect runs in a task of its own: a caller that gets cancelled (a read
            # that lost a race) must not cancel the connect other callers wait for.
            fut = self._connecting[address] = loop.create_task(self._connect(address))
            fut.add_done_callback(_consume)  # every caller may be gone by the time it fails
        return await asyncio.shield(fut)

    async def _connect(self, address: str) -> BookieClient:
        loop = asyncio.get_running_loop()
        try:
            client = await BookieClient.connect(self.network, address, self.config)
        except BaseException:
            self._note_failure(address, loop.time())
            raise
        finally:
            self._connecting.pop(address, None)
        if self._closed:  # the pool closed while we were connecting
            await client.close()
            raise ClientClosedError("bookie pool closed")
        self._backoff.pop(address, None)
        client.on_drain = self._wake_room_waiters
        self._clients[address] = client
        return client

    def _note_failure(self, address: str, now: float) -> None:
        failures = self._backoff.get(address, (0.0, 0))[1] + 1
        delay = self._reconnect.delay_s(failures, self.rng)
        assert delay is not None  # an unbounded policy
        self._backoff[address] = (now + delay, failures)

    def send(
        self, address: str, msg_type: type[Request], *fields: Any, callback: Callable[[Any], None]
    ) -> None:
        """Fire a request and call ``callback(response_or_exception)`` (no await needed).

        Connects first if needed (in a task owned until it finishes).
        """
        self._send(address, lambda c: c.request_callback(msg_type, *fields, callback=callback),
                   callback)  # fmt: skip

    def send_shared(
        self, address: str, frame: SharedFrame, callback: Callable[[Any], None]
    ) -> None:
        """:meth:`send` for a request packed once for several bookies."""
        client = self.get_nowait(address)
        if client is None:
            self._send(address, lambda c: c.request_shared(frame, callback), callback)
            return
        try:  # the common case, inlined: this is the per-add path
            client.request_shared(frame, callback)
        except Exception as exc:
            callback(exc)

    def _send(
        self, address: str, issue: Callable[[BookieClient], None], callback: Callable[[Any], None]
    ) -> None:
        client = self.get_nowait(address)
        if client is not None:
            try:
                issue(client)
            except Exception as exc:
                callback(exc)
            return

        async def connect_then_send() -> None:
            try:
                issue(await self.get(address))
            except Exception as exc:
                callback(exc)

        task = asyncio.ensure_future(connect_then_send())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def statistics(self) -> dict[str, int]:
        """Open connections, and requests/responses/timeouts/in flight summed over them."""
        total = {"connections": len(self._clients)}
        for client in self._clients.values():
            for key, value in client.statistics().items():
                total[key] = total.get(key, 0) + value
        return total

    async def close(self) -> None:
        """Close every connection."""
        self._closed = True
        for task in [*self._tasks, *self._connecting.values()]:
            task.cancel()
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            await c.close()

    async def __aenter__(self) -> BookiePool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _consume(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
