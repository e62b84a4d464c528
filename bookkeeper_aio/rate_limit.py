"""A token bucket on the event loop's clock: autorecovery's copies
(``replication_rate_bytes_per_s``) and a bookie's scrubber (``scrub_bytes_per_s``)."""

from __future__ import annotations

import asyncio


class RateLimiter:
    """A token bucket of ``rate_bytes_per_s`` with a burst of a tenth of a second."""

    def __init__(self, rate_bytes_per_s: int) -> None:
        self.rate = float(rate_bytes_per_s)
        self.burst = max(self.rate / 10, 1.0)
        self.tokens = self.burst
        self.updated: float | None = None
        self.waited_s = 0.0

    async def acquire(self, size: int) -> None:
        """Wait until ``size`` bytes may go (a size over the burst waits for its own time)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self.updated is not None:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        self.tokens -= size
        if self.tokens < 0:
            wait_s = -self.tokens / self.rate
            self.waited_s += wait_s
            await asyncio.sleep(wait_s)
