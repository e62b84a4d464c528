"""One client per Python process: an event loop in a thread, one connection per cluster.

Theory of operation
-------------------
Spark calls our code synchronously, from the driver's thread and from the Python workers that
run tasks. Workers are reused across tasks (and killed after some idle time), so a
``BookKeeper`` connection per task would pay the connect and the bookie handshakes for every
partition, and a connection cannot outlive the ``asyncio.run()`` that opened it. So each
process gets one :class:`ProcessClient`: an event loop (uvloop) running in a daemon thread,
holding one ``BookKeeper`` per metadata URI, opened on first use and reused by every partition
the process handles. Spark's thread hands it coroutines (:meth:`ProcessClient.submit`) and
waits for them with a deadline; a connection that fails to open is not kept. A forked child
(a new worker) sees another pid and starts its own. The connections are closed at process
exit (``atexit``; a worker that Spark ends with ``os._exit`` just drops its sockets, and no
state of ours needs a goodbye: what a task leaves half done is in its attempt record).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import uvloop

from ..client.bookkeeper import BookKeeper
from ..errors import OperationTimeoutError

T = TypeVar("T")
CLOSE_TIMEOUT_S = 10.0


class ProcessClient:
    """See the module docstring."""

    def __init__(self) -> None:
        self._loop = uvloop.new_event_loop()
        self._clients: dict[str, BookKeeper] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._stack = contextlib.AsyncExitStack()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="bookkeeper-aio-spark", daemon=True
        )
        self._thread.start()
        self.calls = 0

    def submit(
        self, uri: str, fn: Callable[[BookKeeper], Awaitable[T]], timeout_s: float
    ) -> concurrent.futures.Future[T]:
        """Run ``fn(bk)`` on the loop, ``bk`` this process's client of ``uri``, within
        ``timeout_s``; a future to wait on (:meth:`wait`)."""
        self.calls += 1
        return asyncio.run_coroutine_threadsafe(self._call(uri, fn, timeout_s), self._loop)

    def run(self, uri: str, fn: Callable[[BookKeeper], Awaitable[T]], timeout_s: float) -> T:
        """:meth:`submit` and wait.

        Raises:
            whatever ``fn`` raises; OperationTimeoutError past ``timeout_s``.
        """
        return self.wait(self.submit(uri, fn, timeout_s), timeout_s)

    @staticmethod
    def wait(future: concurrent.futures.Future[T], timeout_s: float) -> T:
        """The result of a submitted call (its own deadline ends it; this one is a backstop).

        Raises:
            whatever the call raised; OperationTimeoutError past ``timeout_s`` (+ slack).
        """
        try:
            return future.result(timeout_s + CLOSE_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise OperationTimeoutError(f"no answer within {timeout_s} s") from None

    async def _call(
        self, uri: str, fn: Callable[[BookKeeper], Awaitable[T]], timeout_s: float
    ) -> T:
        try:
            async with asyncio.timeout(timeout_s):
                return await fn(await self._client(uri))
        except TimeoutError:
            raise OperationTimeoutError(f"no answer within {timeout_s} s") from None

    async def _client(self, uri: str) -> BookKeeper:
        if uri in self._clients:
            return self._clients[uri]
        async with self._opening.setdefault(uri, asyncio.Lock()):
            if uri not in self._clients:  # re-checked: another call may have opened it
                # A failure leaves no half-open client behind: the stack keeps only successes.
                self._clients[uri] = await self._stack.enter_async_context(BookKeeper.connect(uri))
        return self._clients[uri]

    def statistics(self) -> dict[str, Any]:
        return {"clusters": len(self._clients), "calls": self.calls, "pid": os.getpid()}

    def close(self) -> None:
        """Close every connection and stop the loop (waits at most ``CLOSE_TIMEOUT_S``)."""
        if not self._loop.is_running():
            return
        future = asyncio.run_coroutine_threadsafe(self._stack.aclose(), self._loop)
        try:
            future.result(CLOSE_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
        finally:
            self._clients.clear()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CLOSE_TIMEOUT_S)


_lock = threading.Lock()
_client: ProcessClient | None = None
_pid = 0


def process_client() -> ProcessClient:
    """This process's client (created on first use; a forked child gets its own)."""
    global _client, _pid
    with _lock:
        if _client is None or _pid != os.getpid():
            _client, _pid = ProcessClient(), os.getpid()
        return _client


@atexit.register
def close_process_client() -> None:
    """Close this process's client, if it has one."""
    global _client
    with _lock:
        client, _client = _client, None
    if client is not None and _pid == os.getpid():
        client.close()


__all__ = ["ProcessClient", "close_process_client", "process_client"]
