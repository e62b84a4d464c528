"""The one object that carries the outside world into ledger handles.

Handles never reach for globals: the metadata store, the bookie connections, the placement
policy, the rng and the config all come through :class:`ClientContext`, so the simulator can
hand them in-memory versions. ``bugs`` holds the simulator's switches that re-introduce known
protocol defects; production code never sets them.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from ..config import ClientConfig
from ..metadata.store import MetadataStore
from .bookie_pool import BookiePool
from .placement import PlacementPolicy
from .stats import ClientStats

KNOWN_BUGS = (
    frozenset(
        {"recovery-reads-without-fence", "recovery-below-last-segment", "unknown-as-negative"}
    )
    | {"log-takeover-without-recovery"}  # logs/takeover.py: opens a ledger without fencing
    # Guaranteed write quorum (client/writer.py): no pinning; a close that does not wait for WQ.
    | {"gwq-no-pinning", "gwq-close-before-wq"}
)


class LedgerEntry(NamedTuple):
    """One entry as a reader gets it."""

    entry_id: int
    payload: bytes


@dataclass
class ClientContext:
    """See the module docstring."""

    config: ClientConfig
    metadata: MetadataStore
    pool: BookiePool
    rng: random.Random
    placement: PlacementPolicy = field(default_factory=PlacementPolicy)
    bugs: frozenset[str] = frozenset()
    stats: ClientStats = field(default_factory=ClientStats)
    # Wall-clock milliseconds, for timestamps in metadata and the decisions taken on them
    # (a log's segment age, its retention, tombstones' TTL): the simulator's is virtual.
    wall_clock_ms: Callable[[], int] = field(default=lambda: int(time.time() * 1000))

    def has_bug(self, name: str) -> bool:
        assert name in KNOWN_BUGS, name
        return name in self.bugs
