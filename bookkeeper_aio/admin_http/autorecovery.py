"""The autorecovery process's HTTP admin API (``--http-listen HOST:PORT``): ``/metrics``,
``/heartbeat`` and ``/api/v1/autorecovery/list_under_replicated_ledger``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from ..metadata.store import MetadataStore
from ..metadata.underreplication import list_marks
from ..metrics import new_registry
from ..metrics.autorecovery import AutorecoveryCollector
from .app import base_app, check_query, flag, serve_http

LIST_UNDER_REPLICATED = "/api/v1/autorecovery/list_under_replicated_ledger"


def add_under_replicated_route(
    app: web.Application, store: Callable[[], MetadataStore | None]
) -> None:
    """``GET LIST_UNDER_REPLICATED``: every under-replicated ledger, from the marks in the
    metadata store. Filters (BookKeeper's names): ``missingreplica=BOOKIE`` (only ledgers
    missing a copy on it), ``excludingmissingreplica=BOOKIE`` (not those);
    ``printmissingreplica=false`` leaves out the missing copies."""

    async def list_under_replicated(request: web.Request) -> web.Response:
        params = check_query(
            request, ("missingreplica", "excludingmissingreplica", "printmissingreplica")
        )
        show = flag(params, "printmissingreplica", default=True)
        only, excluding = params.get("missingreplica"), params.get("excludingmissingreplica")
        metadata = store()
        if metadata is None:
            return web.json_response({"error": "no metadata store", "status": 503}, status=503)
        ledgers: list[dict[str, Any]] = []
        async for versioned in list_marks(metadata):
            mark = versioned.value
            bookies = [m.bookie for m in mark.missing]
            if (only is not None and only not in bookies) or excluding in bookies:
                continue
            doc: dict[str, Any] = {
                "ledger_id": mark.ledger_id,
                "since_ms": mark.since_ms,
                "reasons": mark.reasons(),
                "attempts": mark.attempts,
            }
            if show:
                doc["missing_replicas"] = [
                    {"bookie": m.bookie, "entries": m.entry_count()} for m in mark.missing
                ]
            ledgers.append(doc)
        return web.json_response({"under_replicated_ledgers": ledgers, "count": len(ledgers)})

    app.router.add_get(LIST_UNDER_REPLICATED, list_under_replicated)


def autorecovery_app(service: Any, serving: Callable[[], bool]) -> web.Application:
    """The routes of an autorecovery process running ``service``."""
    registry = new_registry()
    registry.register(AutorecoveryCollector(service))
    app = base_app(registry, serving)
    add_under_replicated_route(app, lambda: service.ctx.metadata)
    return app


@contextlib.asynccontextmanager
async def serve_autorecovery_http(
    service: Any, address: str, serving: Callable[[], bool]
) -> AsyncIterator[str]:
    """Serve the autorecovery admin API on ``address``; yield the address bound."""
    async with serve_http(autorecovery_app(service, serving), address) as bound:
        yield bound
