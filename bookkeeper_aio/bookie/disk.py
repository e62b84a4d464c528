"""Disk usage of the ledger dirs and the read-only decision (BookKeeper's LedgerDirsMonitor).

The decision is pure (:func:`next_read_only`); :func:`disk_usage` does the I/O and is run in a
worker thread by the bookie every ``disk_check_interval_s``. Hysteresis keeps a bookie near the
threshold from flapping: it turns read-only when any dir reaches ``disk_usage_threshold`` and
writable again only when every dir is below ``disk_usage_lwm_threshold``.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from typing import NamedTuple


class DiskUsage(NamedTuple):
    """The fullest dir's used fraction, and the free/total bytes of the dir with least free."""

    used_fraction_max: float
    free_bytes: int
    total_bytes: int


def disk_usage(dirs: Sequence[str]) -> DiskUsage:
    """Measure every dir (blocking: call from a worker thread)."""
    usages = [shutil.disk_usage(d) for d in dirs]
    used_max = max(1 - u.free / u.total if u.total else 1.0 for u in usages)
    least = min(usages, key=lambda u: u.free)
    return DiskUsage(used_max, least.free, least.total)


def next_read_only(current: bool, used: float, threshold: float, lwm_threshold: float) -> bool:
    """Read-only at or above ``threshold``; writable again only below ``lwm_threshold``."""
    if used >= threshold:
        return True
    if used < lwm_threshold:
        return False
    return current
