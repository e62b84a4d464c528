"""Latency percentiles and result printing shared by every benchmark."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TIMELINE_SPAN_MIN_S = 0.25


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) of already sorted values, nearest rank."""
    if not sorted_values:
        return math.nan
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


def latency_summary(latencies_s: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99/p99.9/max in milliseconds."""
    values = sorted(latencies_s)
    summary = {
        f"p{label}_ms": percentile(values, q) * 1000
        for label, q in (("50", 0.5), ("95", 0.95), ("99", 0.99), ("99_9", 0.999))
    }
    summary["max_ms"] = (values[-1] * 1000) if values else math.nan
    return summary


def timeline(
    latencies_s: Sequence[float], completions_s: Sequence[float], start_s: float
) -> list[dict[str, float | None]]:
    """Per second of the run, by completion time: operations/s and the latency percentiles
    of the operations that completed in that second (what a plot over time shows: a stall is
    a second whose p99 jumps and whose throughput drops). Empty when no completion times were
    recorded. The last second counts only the part of it the run lasted."""
    if not completions_s or len(completions_s) != len(latencies_s):
        return []
    buckets: dict[int, list[float]] = {}
    for done, latency in zip(completions_s, latencies_s, strict=True):
        buckets.setdefault(max(0, int(done - start_s)), []).append(latency)
    end = max(completions_s) - start_s
    rows = []
    for second in range(int(end) + 1):
        span = min(1.0, end - second)
        if span < TIMELINE_SPAN_MIN_S:  # the run's last few ms: no rate worth plotting
            break
        values = sorted(buckets.get(second, ()))
        summary: dict[str, float | None] = (
            dict(latency_summary(values))
            if values
            else {k: None for k in ("p50_ms", "p95_ms", "p99_ms", "p99_9_ms", "max_ms")}
        )
        rows.append({"t_s": float(second), "ops_per_s": len(values) / span, **summary})
    return rows


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    """A plain aligned table of result rows (same keys in every row)."""
    if not rows:
        return
    keys = list(rows[0])
    cells = [[_fmt(r.get(k)) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    left = [isinstance(rows[0].get(k), str) for k in keys]  # text left, numbers right

    def line(values: list[str]) -> str:
        parts = zip(values, widths, left, strict=True)
        return "  ".join(v.ljust(w) if lft else v.rjust(w) for v, w, lft in parts).rstrip()

    print(f"\n{title}")
    print(line(keys))
    for c in cells:
        print(line(c))


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def write_json(path: str | None, result: dict[str, Any]) -> None:
    """Write the result as JSON if a path was given."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
