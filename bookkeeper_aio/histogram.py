"""Histograms cheap enough for the hot path, read by the Prometheus exporter at scrape time.

Theory of operation
-------------------
A :class:`Histogram` is a list of bucket counts and a sum: :meth:`Histogram.observe` is one
``bisect`` and two additions (~0.2 µs, no lock). The objects that own one (the journal, the
request handler, the client) call it where the work happens; nothing here knows Prometheus.
``bookkeeper_aio.metrics`` turns a :meth:`Histogram.snapshot` into a Prometheus histogram
(cumulative ``le`` buckets) when ``/metrics`` is scraped, so metrics cost nothing between
scrapes. prometheus_client's own ``Histogram.observe`` takes a lock and walks the buckets
(~1.5 µs): too much at 100k adds/s.

Each histogram has one writer thread (the event loop, or the journal's thread for its sync
latency); a scrape from another thread may see one observation counted in a bucket and not
yet in the sum, which Prometheus tolerates (the next scrape is exact again).

Durations are measured with ``time.perf_counter`` (uvloop's ``loop.time()`` has millisecond
resolution); they are reported, never used for a decision, so they are not one of the
simulator's sources of nondeterminism.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

# Seconds: 50 µs (an idle bookie's add) to 10 s (a request timeout).
LATENCY_BOUNDS_S: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
# Records per journal batch (group commit adapts it to the load).
COUNT_BOUNDS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)
# Bytes per journal batch: 1 KiB .. 4 MiB (journal_batch_bytes_max is 512 KiB by default).
BYTES_BOUNDS: tuple[float, ...] = tuple(float(1 << n) for n in range(10, 23, 2))


class Histogram:
    """Bucket counts and a sum; ``bounds`` are the buckets' inclusive upper bounds."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float] = LATENCY_BOUNDS_S) -> None:
        assert list(bounds) == sorted(bounds) and bounds, "bounds must ascend"
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count one value (into the first bucket whose bound is >= it)."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def observe_many(self, value: float, times: int) -> None:
        """Count ``value`` ``times`` times (a multi-add's parts, all answered at once)."""
        self.counts[bisect_left(self.bounds, value)] += times
        self.sum += value * times

    @property
    def count(self) -> int:
        return sum(self.counts)

    def snapshot(self) -> tuple[list[tuple[str, int]], float]:
        """Cumulative ``(le, count)`` pairs ending with ``+Inf``, and the sum: what a
        Prometheus histogram exposes."""
        counts, total = list(self.counts), self.sum
        buckets, running = [], 0
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            running += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return buckets, total

    def quantile(self, q: float) -> float:
        """An upper bound of the ``q`` quantile (the bound of its bucket; inf past the last):
        for summaries in ``statistics()``, not for alerting (use Prometheus for that)."""
        assert 0 <= q <= 1
        counts = list(self.counts)
        rank, running = q * sum(counts), 0
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            running += n
            if running >= rank and running:
                return bound
        return 0.0


class NullHistogram(Histogram):
    """Observes nothing: where latency metrics are turned off (``metrics_latency = false``;
    the benchmarks measure what they cost against this)."""

    __slots__ = ()

    def observe(self, value: float) -> None:
        pass


def new_histogram(enabled: bool, bounds: Sequence[float] = LATENCY_BOUNDS_S) -> Histogram:
    """A :class:`Histogram`, or a :class:`NullHistogram` when not ``enabled``."""
    return Histogram(bounds) if enabled else NullHistogram(bounds)


def no_clock() -> float:
    """The clock of code whose latency is not measured."""
    return 0.0
