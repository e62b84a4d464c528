"""The one retry policy: bounded attempts, exponential backoff, jitter from an injected rng.

Theory of operation
-------------------
:class:`RetryPolicy` is a pure value: :meth:`RetryPolicy.delay_s` says how long to wait before
attempt number ``attempt`` (1 for the first retry) — ``first_s`` doubled per attempt up to
``max_s``, then scaled by a random factor in [0.5, 1) drawn from the caller's
``random.Random`` (so the simulator replays it, and peers that failed together do not retry
together) — or None once ``attempts_max`` retries were spent (None: no bound, for a
reconnect that waits longer and longer but never gives up for good). Callers keep the attempt
count themselves and start again from 1 after a success.

Used by the writer (a bookie answering TOO_MANY_REQUESTS: retried with backoff, then treated
as failed) and the bookie pool (reconnecting to a bookie that failed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """See the module docstring."""

    first_s: float
    max_s: float
    attempts_max: int | None = None

    def __post_init__(self) -> None:
        assert 0 < self.first_s <= self.max_s, (self.first_s, self.max_s)

    def delay_s(self, attempt: int, rng: random.Random) -> float | None:
        """The wait before retry ``attempt`` (>= 1), or None if no retry is left."""
        if self.attempts_max is not None and attempt > self.attempts_max:
            return None
        base = min(self.max_s, self.first_s * 2.0 ** min(attempt - 1, 64))
        return base * (0.5 + rng.random() / 2)

    def total_s(self) -> float:
        """The longest all retries can wait together (bounded policies only)."""
        assert self.attempts_max is not None
        return sum(min(self.max_s, self.first_s * 2.0 ** min(a, 64))
                   for a in range(self.attempts_max))  # fmt: skip
