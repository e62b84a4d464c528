"""Latency and throughput over time, as pictures: one PNG (and its JSON) per measured phase.

Every load (benchmarks/load.py) records when each operation completed; ``stats.timeline``
turns that into one row per second (operations/s, p50/p99/p99.9/max of the operations that
completed in that second). :func:`write_phase_plots` walks a result and, for every phase that
has such a ``timeline``, writes ``DIR/<phase>.png`` (latency percentiles on a log scale above,
throughput below, on one time axis) and ``DIR/<phase>.json`` (the phase's whole result), so a
stall is seen, not inferred from a p99.

matplotlib is the ``bench`` extra (pyproject.toml), installed by ``make setup``; it is
imported only here, and only when pictures are asked for (``--plots DIR``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

PERCENTILES = (("p50_ms", "p50"), ("p99_ms", "p99"), ("p99_9_ms", "p99.9"), ("max_ms", "max"))


def phases(
    result: dict[str, Any], name: str = "run", prefix: str = ""
) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(name, phase)`` for every dict in ``result`` (itself included, as ``name``) with a
    non-empty ``timeline``; nested phases are named ``outer.inner``."""
    if result.get("timeline"):
        yield prefix or name, result
    for key, value in result.items():
        if isinstance(value, dict):
            yield from phases(value, name, f"{prefix}.{key}" if prefix else key)


def write_phase_plots(directory: str | Path, result: dict[str, Any], mode: str) -> list[Path]:
    """A PNG and a JSON per phase of ``result`` with a timeline (the result itself is named
    after ``mode``); the PNGs written.

    Raises:
        ModuleNotFoundError: matplotlib is not installed (``pip install -e '.[bench]'``).
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, phase in phases(result, mode):
        png = out / f"{name}.png"
        plot_timeline(png, name if name.startswith(mode) else f"{mode}: {name}", phase)
        (out / f"{name}.json").write_text(json.dumps(phase, indent=2, sort_keys=True) + "\n")
        written.append(png)
    return written


def plot_timeline(path: Path, title: str, phase: dict[str, Any]) -> None:
    """Latency percentiles per second (log scale) over throughput per second."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    rows = phase["timeline"]
    t = [r["t_s"] for r in rows]
    fig, (lat, thr) = plt.subplots(2, 1, sharex=True, figsize=(9, 6), height_ratios=(2, 1))
    try:
        for key, label in PERCENTILES:
            values = [r[key] if r[key] is not None else float("nan") for r in rows]
            lat.plot(t, values, marker=".", label=label)
        lat.set_yscale("log")
        lat.set_ylabel("latency (ms)")
        lat.grid(True, which="both", alpha=0.3)
        lat.legend(loc="upper left", ncols=4, fontsize="small")
        summary = (
            f"whole phase: {phase.get('entries_per_s', 0):,.0f}/s, "
            f"p50 {phase.get('p50_ms', float('nan')):.2f} ms, "
            f"p99 {phase.get('p99_ms', float('nan')):.2f} ms, "
            f"p99.9 {phase.get('p99_9_ms', float('nan')):.2f} ms"
        )
        lat.set_title(f"{title}\n{summary}", fontsize="medium")
        thr.plot(t, [r["ops_per_s"] for r in rows], marker=".", color="tab:green")
        if phase.get("rate"):
            thr.axhline(phase["rate"], linestyle="--", color="grey", label="intended rate")
            thr.legend(loc="lower left", fontsize="small")
        thr.set_ylabel("operations/s")
        thr.set_xlabel("second of the measured phase (by completion time)")
        thr.set_ylim(bottom=0)
        thr.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=80)
    finally:
        plt.close(fig)
