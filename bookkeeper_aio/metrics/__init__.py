"""Prometheus metrics (docs/operations.md lists them): collectors that read the statistics
the bookie, the client and autorecovery keep anyway, at scrape time.

Nothing on a request path calls prometheus_client: the objects keep plain counters and
:class:`~bookkeeper_aio.histogram.Histogram` buckets, and a scrape turns them into metric
families (``families.py``). A scrape costs a few hundred microseconds of the event loop; the
work between scrapes costs what the counters cost, which the benchmarks measure
(``benchmarks writes --metrics-cost``).
"""

from .families import new_registry

__all__ = ["new_registry"]
