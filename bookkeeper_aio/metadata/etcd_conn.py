"""Calls to etcd through aetcd: deadlines, retries with jittered backoff, endpoints, watches.

Theory of operation
-------------------
:meth:`EtcdConnection.call` runs one operation (a coroutine taking an ``aetcd.Client``) under
two deadlines: ``attempt_timeout_s`` per attempt and ``call_timeout_s`` for the whole call.
An attempt that fails because etcd is unreachable or slow is retried, at most
``retries_max`` times, after a jittered exponential backoff from the injected
``random.Random``, on the next endpoint. Only operations the caller marks safe are retried:
reads, and conditional transactions whose outcome the caller can recognize afterwards (the
store resolves "did my first attempt land?" by looking at the value). When the call gives
up, :class:`MetadataUnavailableError` names every endpoint and the last error.

TLS (an ``etcds://`` URI) and user/password authentication are per connection: every
endpoint's client uses them (``etcd_tls.py`` for the TLS channel). etcd's auth tokens expire
(``--auth-token-ttl``, 5 minutes by default, counted from the last use) and aetcd does not
renew them: a call refused for an invalid token drops that endpoint's client, and the retry
authenticates again.

There is one aetcd client (one gRPC channel) per endpoint, created on first use and closed
only by :meth:`close`; a failed endpoint is not closed, because gRPC reconnects a channel by
itself (we cap its reconnect backoff at ``grpc_reconnect_backoff_max_ms`` instead of gRPC's
120 s) and closing it would cancel other coroutines' calls on it.

:meth:`watch` yields watch events from a start revision and survives disconnects: when the
stream breaks (etcd restarted, the member died) it re-creates the watch on the next endpoint
from the last event's revision + 1, so no event is lost or repeated. If that history was
compacted it raises :class:`WatchCompactedError`; the caller re-reads and starts over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

import aetcd
import aetcd.exceptions as aex
from aetcd import rpc, rtypes

from ..config import MetadataConfig, parse_address
from ..errors import LeaseNotFoundError, MetadataUnavailableError
from .etcd_tls import TlsClient, channel_credentials

log = logging.getLogger(__name__)
T = TypeVar("T")

# Failures after which the same request may be sent again: etcd was unreachable or slow.
RETRYABLE = (
    aex.ConnectionFailedError,  # gRPC UNAVAILABLE
    aex.ConnectionTimeoutError,  # gRPC DEADLINE_EXCEEDED
    aex.InternalError,
    aex.WatchTimeoutError,
    TimeoutError,  # our attempt deadline
    OSError,
)


class WatchCompactedError(MetadataUnavailableError):
    """The revision a watch must resume from was compacted away; re-read and watch again."""


def _busy(exc: aex.ClientError) -> bool:
    """etcd asked us to come back later (too many requests, an aborted request)."""
    cause = exc.__cause__
    busy = (rpc.StatusCode.RESOURCE_EXHAUSTED, rpc.StatusCode.ABORTED)
    return isinstance(cause, rpc.AioRpcError) and cause.code() in busy


def _token_expired(exc: aex.ClientError) -> bool:
    """etcd no longer knows our auth token (it expired, or etcd restarted)."""
    return isinstance(exc, aex.UnauthenticatedError) and "invalid auth token" in str(exc)


def _refused(exc: aex.ClientError, what: str) -> MetadataUnavailableError:
    """An etcd error that retrying cannot fix, as a BookKeeper error."""
    if "lease not found" in str(exc):
        return LeaseNotFoundError(f"{what}: {exc}")
    return MetadataUnavailableError(f"etcd refused {what}: {type(exc).__name__}: {exc}")


class EtcdConnection:
    """See the module docstring."""

    def __init__(
        self,
        endpoints: tuple[str, ...],
        config: MetadataConfig,
        rng: random.Random,
        *,
        tls: bool = False,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        """``tls``: TLS with ``config``'s CA and client certificate; ``username`` and
        ``password``: etcd authentication.

        Raises:
            ConfigError: a TLS file cannot be read.
        """
        assert endpoints
        assert (username is None) == (password is None)
        self.endpoints = endpoints
        self._credentials = channel_credentials(config) if tls else None
        self._user = (username, password)
        self.config = config
        self.rng = rng
        self.counters: Counter[str] = Counter()
        self._clients: dict[int, aetcd.Client] = {}
        self._closing: set[asyncio.Task[None]] = set()  # clients dropped by _reauthenticate
        self._current = 0
        self.closed = False

    def _client(self, index: int) -> aetcd.Client:
        client = self._clients.get(index)
        if client is None:
            host, port = parse_address(self.endpoints[index])
            options = {
                "grpc.initial_reconnect_backoff_ms": 100,
                "grpc.min_reconnect_backoff_ms": 100,
                "grpc.max_reconnect_backoff_ms": self.config.grpc_reconnect_backoff_max_ms,
                "grpc.keepalive_time_ms": 10_000,  # notice a dead peer under an idle watch
                "grpc.keepalive_timeout_ms": 5_000,
            }
            username, password = self._user
            kwargs: dict[str, Any] = {"host": host, "port": port, "username": username,
                                      "password": password, "options": options,
                                      "timeout": self.config.attempt_timeout_s}  # fmt: skip
            if self._credentials is not None:
                client = TlsClient(credentials=self._credentials, **kwargs)
            else:
                client = aetcd.Client(**kwargs)
            self._clients[index] = client
        return client

    def _reauthenticate(self, index: int) -> None:
        """Drop the endpoint's client (its token expired): the next attempt authenticates on
        a new one. The old one is closed in the background: calls still on it fail and are
        retried like any other failed attempt."""
        client = self._clients.pop(index, None)
        self.counters["reauthentications"] += 1
        if client is not None:
            task = asyncio.get_running_loop().create_task(self._close_client(client))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _close_client(self, client: aetcd.Client) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.config.attempt_timeout_s):
                await client.close()

    def _failed(self, index: int) -> None:
        """Move on from a failed endpoint (unless another call already did)."""
        if self._current == index:
            self._current = (index + 1) % len(self.endpoints)

    def _backoff_s(self, attempt: int) -> float:
        cfg = self.config
        delay = min(cfg.retry_backoff_s * 2**attempt, cfg.retry_backoff_max_s)
        return delay * (0.5 + self.rng.random())

    async def call(
        self, op: Callable[[aetcd.Client], Awaitable[T]], what: str, *, retry: bool = True
    ) -> T:
        """Run ``op`` with deadlines and (when ``retry``) retries; see the module docstring.

        Raises:
            MetadataUnavailableError: every attempt failed, or etcd refused the request.
        """
        if self.closed:
            raise MetadataUnavailableError(f"{what}: the metadata store is closed")
        attempts = self.config.retries_max if retry else 1
        last: BaseException | None = None
        self.counters["calls"] += 1
        try:
            async with asyncio.timeout(self.config.call_timeout_s):
                for attempt in range(attempts):
                    index = self._current
                    try:
                        async with asyncio.timeout(self.config.attempt_timeout_s):
                            return await op(self._client(index))
                    except RETRYABLE as exc:
                        last = exc
                        self._failed(index)
                    except aex.ClientError as exc:
                        if _token_expired(exc):
                            self._reauthenticate(index)
                        elif not _busy(exc):
                            raise _refused(exc, what) from exc
                        last = exc
                    if attempt + 1 < attempts:
                        self.counters["retries"] += 1
                        await asyncio.sleep(self._backoff_s(attempt))
        except TimeoutError as exc:  # the whole call's deadline
            last = last or exc
        self.counters["unavailable"] += 1
        raise MetadataUnavailableError(
            f"etcd at {','.join(self.endpoints)} is unreachable ({what}): "
            f"{type(last).__name__}: {last}"
        ) from last

    async def watch(
        self, key: bytes, range_end: bytes | None, start_revision: int
    ) -> AsyncGenerator[rtypes.Event, None]:
        """Events for ``[key, range_end)`` from ``start_revision`` on, across disconnects.

        Ends when the connection is closed.

        Raises:
            WatchCompactedError: ``start_revision`` (or the resume point) was compacted.
            MetadataUnavailableError: the watch could not be re-created within one call.
        """
        next_revision = start_revision
        while not self.closed:

            async def open_watch(c: aetcd.Client, start: int = next_revision) -> Any:
                return await c.watch(key, range_end=range_end, start_revision=start)

            try:
                watch = await self.call(open_watch, f"watch {key!r}")
            except MetadataUnavailableError as exc:
                if isinstance(exc.__cause__, aex.RevisionCompactedError):
                    raise WatchCompactedError(str(exc)) from exc.__cause__
                raise
            try:
                async for event in watch:
                    next_revision = event.kv.mod_revision + 1
                    yield event
            except aex.RevisionCompactedError as exc:
                raise WatchCompactedError(f"watch {key!r}: {exc}") from exc
            except aex.ClientError as exc:  # the stream broke: resume where it stopped
                self.counters["watch_resumes"] += 1
                log.warning("etcd watch of %r broke (%s); resuming at %d", key, exc, next_revision)
                await asyncio.sleep(self._backoff_s(0))
            finally:
                await self._cancel(watch)

    async def _cancel(self, watch: Any) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.config.attempt_timeout_s):
                await watch.cancel()

    async def close(self) -> None:
        """Close every channel; open watches end."""
        self.closed = True
        await asyncio.gather(*self._closing, return_exceptions=True)
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.config.attempt_timeout_s):
                    await client.close()
