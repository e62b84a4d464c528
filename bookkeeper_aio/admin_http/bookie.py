"""The bookie's HTTP admin API (``--http-listen HOST:PORT``): ``/metrics``, ``/heartbeat``,
``/api/v1/bookie/info``, ``/api/v1/bookie/state``, ``PUT /api/v1/bookie/gc`` and, when the
bookie has a metadata store, ``/api/v1/autorecovery/list_under_replicated_ledger``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..metrics import new_registry
from ..metrics.bookie import BookieCollector
from .app import base_app, check_query, error, json_object_body, serve_http
from .autorecovery import add_under_replicated_route

if TYPE_CHECKING:
    from ..bookie.server import Bookie


def bookie_app(bookie: Bookie) -> web.Application:
    """The routes, reading ``bookie`` (started) on each request."""
    registry = new_registry()
    registry.register(BookieCollector(bookie))
    app = base_app(registry, lambda: not bookie.stopped.is_set())

    async def info(request: web.Request) -> web.Response:
        check_query(request)
        return web.json_response(bookie_info(bookie))

    async def state(request: web.Request) -> web.Response:
        check_query(request)
        return web.json_response(bookie_state(bookie))

    async def gc(request: web.Request) -> web.Response:
        check_query(request)
        await json_object_body(request)  # nothing to choose yet: {} or no body
        if bookie.gc is None:  # no metadata store: nothing to check deletes against
            return error(501, "garbage collection needs a metadata store (--metadata)")
        return web.json_response(await bookie.collect_garbage())

    app.router.add_get("/api/v1/bookie/info", info)
    app.router.add_get("/api/v1/bookie/state", state)
    app.router.add_put("/api/v1/bookie/gc", gc)
    if bookie.metadata is not None:
        add_under_replicated_route(app, lambda: bookie.metadata)
    return app


def bookie_info(bookie: Bookie) -> dict[str, Any]:
    """Disk space (as of the disk monitor's last check), read-only state, ledgers stored."""
    handler = bookie.handler
    free, total = handler.disk_space
    return {
        "bookie_id": bookie.config.bookie_id,
        "free_bytes": free,
        "total_bytes": total,
        "read_only": handler.read_only,
        "ledgers": len(bookie.engine.ledgers()),
    }


def bookie_state(bookie: Bookie) -> dict[str, Any]:
    """Running, read-only, shutting down, failed (BookKeeper's state endpoint, our spelling)."""
    failure = bookie.failure
    return {
        "bookie_id": bookie.config.bookie_id,
        "running": not bookie.stopped.is_set(),
        "read_only": bookie.handler.read_only,
        "shutting_down": bookie.stopped.is_set() and not bookie.closed.is_set(),
        "failed": None if failure is None else f"{type(failure).__name__}: {failure}",
        "instance_id": bookie.instance_id,
        "autorecovery": bookie.autorecovery is not None,
        "tls": bookie.config.tls_cert_file is not None,
    }


@contextlib.asynccontextmanager
async def serve_bookie_http(bookie: Bookie, address: str) -> AsyncIterator[str]:
    """Serve the bookie's admin API on ``address``; yield the address bound."""
    async with serve_http(bookie_app(bookie), address) as bound:
        yield bound
