"""What every admin server shares: JSON errors, ``/metrics``, ``/heartbeat``, query checks,
and serving on exactly the address given.

Theory of operation
-------------------
An :class:`aiohttp.web.Application` runs on the process's own event loop beside the bookie
(or the autorecovery service): handlers only read state the loop owns, so they need no locks,
and a slow scrape costs the loop what the scrape costs. Every failure is answered with a JSON
body ``{"error": REASON, "status": CODE}``: an unknown path (404), a wrong method (405), bad
input (400), a missing feature (501), a failure inside (500). The server listens on the
``HOST:PORT`` given and nothing else (``0.0.0.0`` only if the operator says so).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..config import parse_address
from ..errors import BookKeeperError

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BODY_BYTES_MAX = 64 * 1024  # admin requests are tiny; anything larger is refused (413)


def error(status: int, reason: str) -> web.Response:
    """A JSON error answer."""
    return web.json_response({"error": reason, "status": status}, status=status)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as JSON, whatever raised it."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error(exc.status, exc.reason if exc.text is None else _text(exc))
    except BadRequest as exc:
        return error(400, str(exc))
    except BookKeeperError as exc:
        return error(503, f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        log.exception("admin request %s %s failed", request.method, request.path)
        return error(500, f"{type(exc).__name__}: {exc}")


def _text(exc: web.HTTPException) -> str:
    text = exc.text or exc.reason
    return text.removeprefix(f"{exc.status}: ")


class BadRequest(Exception):
    """Input the endpoint cannot take: answered 400 with the message."""


def check_query(request: web.Request, allowed: Iterable[str] = ()) -> dict[str, str]:
    """The query parameters, each at most once and all in ``allowed``.

    Raises:
        BadRequest: an unknown or repeated parameter.
    """
    allowed = set(allowed)
    params: dict[str, str] = {}
    for key, value in request.query.items():
        if key not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise BadRequest(f"unknown query parameter {key!r} (known: {known})")
        if key in params:
            raise BadRequest(f"query parameter {key!r} given twice")
        params[key] = value
    return params


def flag(params: dict[str, str], name: str, default: bool = False) -> bool:
    """A ``true``/``false`` query parameter.

    Raises:
        BadRequest: another value.
    """
    value = params.get(name)
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise BadRequest(f"{name} must be true or false, got {value!r}")
    return value.lower() == "true"


async def json_object_body(request: web.Request, allowed: Iterable[str] = ()) -> dict[str, Any]:
    """An empty body or a JSON object whose keys are in ``allowed``.

    Raises:
        BadRequest: not JSON, not an object, or an unknown key.
    """
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise BadRequest(f"unknown key(s) in the body: {', '.join(unknown)}")
    return body


def base_app(registry: CollectorRegistry, serving: Callable[[], bool]) -> web.Application:
    """An app with the JSON error middleware, ``GET /metrics`` and ``GET /heartbeat``
    (200 "OK" while ``serving()``, else 503)."""
    app = web.Application(middlewares=[json_errors], client_max_size=BODY_BYTES_MAX)

    async def metrics(request: web.Request) -> web.Response:
        check_query(request, ("name[]",))  # Prometheus' own filter parameter is harmless
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def heartbeat(request: web.Request) -> web.Response:
        check_query(request)
        if not serving():
            return error(503, "not serving")
        return web.Response(text="OK")

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/heartbeat", heartbeat)
    return app


@contextlib.asynccontextmanager
async def serve_http(app: web.Application, address: str) -> AsyncIterator[str]:
    """Serve ``app`` on ``HOST:PORT`` (port 0: any free one); yield the address it listens on.

    Raises:
        ConfigError: a malformed address. OSError: the address cannot be bound.
    """
    host, port = parse_address(address)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        bound = runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        log.info("HTTP admin API on http://%s:%d/", shown, bound[1])
        yield f"{shown}:{bound[1]}"
    finally:
        await runner.cleanup()
