"""Building blocks of the collectors: metric families from plain numbers and histograms."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from ..histogram import Histogram


def new_registry() -> CollectorRegistry:
    """A registry with the process's own metrics (CPU, memory, file descriptors, Python's
    garbage collector) that a process's collectors are added to."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    """A counter (prometheus_client adds ``_total``)."""
    return CounterMetricFamily(name, doc, value=value)


def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def labelled(
    kind: type[CounterMetricFamily | GaugeMetricFamily],
    name: str,
    doc: str,
    label: str,
    values: Mapping[str, float],
) -> Metric:
    """One family, one sample per ``values`` key under the label ``label``."""
    family = kind(name, doc, labels=[label])
    for key in sorted(values):
        family.add_metric([key], values[key])
    return family


def histogram(name: str, doc: str, hist: Histogram) -> HistogramMetricFamily:
    """A Prometheus histogram of a :class:`Histogram`'s buckets (cumulative ``le``)."""
    buckets, total = hist.snapshot()
    family = HistogramMetricFamily(name, doc, labels=[])
    family.add_metric([], buckets, total)
    return family


def numbers(prefix: str, doc: str, stats: Mapping[str, Any]) -> Iterator[Metric]:
    """Gauges for every number in ``stats`` (a statistics dict whose keys this module does not
    know in advance, such as garbage collection's): ``prefix + key``."""
    for key in sorted(stats):
        value = stats[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        name = prefix + "".join(c if c.isalnum() else "_" for c in key)
        yield gauge(name, f"{doc}: {key}", value)


def dir_space(directory: str) -> tuple[int, int, int] | None:
    """(used, free, total) bytes of the file system holding ``directory``; None if it cannot
    be read (a failed disk: the metric is absent, the bookie's own state says why)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    return total - st.f_bfree * st.f_frsize, free, total
