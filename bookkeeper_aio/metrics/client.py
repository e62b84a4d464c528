"""The client's metrics (``bookkeeper_client_*``): pending adds, add latency (sampled, see
``client/stats.py``), ensemble changes, recoveries, connections to bookies.

Exported into the application's own registry by
``BookKeeper.connect(uri, metrics_registry=registry)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import Metric

from .families import counter, gauge, histogram

if TYPE_CHECKING:
    from ..client.bookkeeper import BookKeeper

P = "bookkeeper_client_"


class ClientCollector:
    """A prometheus_client collector of one :class:`~bookkeeper_aio.client.BookKeeper`."""

    def __init__(self, bk: BookKeeper) -> None:
        self.bk = bk

    def collect(self) -> Iterator[Metric]:
        stats = self.bk.statistics()
        counters = self.bk.ctx.stats.counters
        yield gauge(
            P + "pending_adds",
            "Adds sent and not yet acknowledged, all writers",
            stats["pending_adds"],
        )
        yield gauge(P + "writers_open", "Ledgers open for writing", stats["writers_open"])
        yield gauge(
            P + "adds_pending_max",
            "Limit: pending adds per writer",
            self.bk.ctx.config.adds_pending_max,
        )
        yield histogram(
            P + "add_seconds",
            "Add latency, send to acknowledgement (sampled: one add per writer at a time)",
            self.bk.ctx.stats.add_latency,
        )
        yield counter(P + "adds_completed", "Adds acknowledged", counters["adds_completed"])
        yield counter(
            P + "ensemble_changes",
            "Bookies replaced in a writer's ensemble",
            counters["ensemble_changes"],
        )
        yield counter(
            P + "recoveries", "Ledgers fenced and recovered by this client", counters["recoveries"]
        )
        pool = stats["bookies"]
        yield gauge(P + "bookie_connections", "Connections to bookies", pool.get("connections", 0))
        yield gauge(
            P + "bookie_requests_in_flight",
            "Requests to bookies awaiting an answer",
            pool.get("in_flight", 0),
        )
        for key in sorted(pool):
            if key not in ("connections", "in_flight"):
                yield counter(P + "bookie_" + key, f"Bookie requests: {key}", pool[key])
