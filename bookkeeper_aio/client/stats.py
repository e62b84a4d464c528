"""What one client did, for ``BookKeeper.statistics()`` and its Prometheus collector.

Ledger handles come and go; these counters belong to the client (its
:class:`~bookkeeper_aio.client.context.ClientContext`) and only grow. Add latency is sampled:
a writer times one add at a time (the next add it sends once the timed one is acknowledged),
so a writer at 100k adds/s pays two ``perf_counter`` calls per round trip, not per add, and a
slow writer has every add timed.
"""

from __future__ import annotations

from collections import Counter

from ..histogram import Histogram


class ClientStats:
    """Counters (``adds_completed``, ``ensemble_changes``, ``recoveries``, ...) and the add
    latency histogram (seconds from send to acknowledgement of the sampled adds)."""

    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.add_latency = Histogram()
