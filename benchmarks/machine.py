"""How fast the machine's CPU was while a benchmark ran.

The benchmarks' VM runs 30-40 % slower for stretches of 3-5 s: a fixed single-thread workload
took 161-244 ms of its own CPU time within one minute on the idle machine, and no steal time
shows (docs/performance.md at e27bdd3, sixth round). A 5 s phase lands in such a stretch or not,
so two runs of the same code differ by a third. :func:`cpu_probe` samples the CPU during a
phase: a child process runs a fixed ~3 ms workload every 0.25 s (about 1 % of one CPU) and
reports the CPU time each run took; a phase's ``cpu_probe_ms`` is their median. Lower is a
faster machine.
It is comparable between runs of the same phase on the same interpreter only: under load the
benchmark's processes share the CPUs and their caches with the probe, on an idle machine the CPU
wakes from its idle states for each run (the idle machine measured slower than a loaded one),
and the probe runs on the benchmark's own interpreter (a PGO build runs it ~1.2x faster).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

PROBE_INTERVAL_S = 0.25
_REPO = Path(__file__).resolve().parent.parent
_STOP_TIMEOUT_S = 5.0


def workload() -> None:
    """A fixed mix of interpreter work and memory copies, ~3 ms on the benchmarks' VM."""
    block = bytes(256 * 1024)
    total = 0
    for i in range(30_000):
        total += i * i
    for _ in range(6):
        bytes(bytearray(block))


def probe_loop(interval_s: float = PROBE_INTERVAL_S) -> None:
    """The child: print the CPU milliseconds of each workload run, until killed."""
    while True:
        start = time.thread_time()
        workload()
        print(f"{(time.thread_time() - start) * 1000:.3f}", flush=True)
        time.sleep(interval_s)


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system, all threads) the processes have used so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")


class CpuPerEntry:
    """CPU time per entry of a measured phase: the bookie processes' together (``pids``;
    none: a cluster not started by the benchmark, not measured) and the client's, the
    benchmark's own process. Read where throughput is bound by the CPU (this machine's two
    vCPUs hold every process): the per-entry cost is then what a change moves, while the
    rate also moves with whatever else the machine runs."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.bookie_s = self.client_s = 0.0

    def __enter__(self) -> CpuPerEntry:
        self._bookie0 = cpu_seconds(self.pids)
        self._client0 = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bookie_s = cpu_seconds(self.pids) - self._bookie0
        self.client_s = time.process_time() - self._client0

    def summary(self, entries: int) -> dict[str, float]:
        """``bookie_cpu_us_per_entry`` (all bookies) and ``client_cpu_us_per_entry``."""
        if not entries:
            return {}
        out = {"client_cpu_us_per_entry": self.client_s / entries * 1e6}
        if self.pids:
            out["bookie_cpu_us_per_entry"] = self.bookie_s / entries * 1e6
        return out


class Probe:
    """The samples (CPU ms per workload run) of one :func:`cpu_probe`."""

    def __init__(self) -> None:
        self.samples_ms: list[float] = []

    def median_ms(self) -> float | None:
        return statistics.median(self.samples_ms) if self.samples_ms else None


@contextlib.asynccontextmanager
async def cpu_probe() -> AsyncIterator[Probe]:
    """Sample the CPU's speed while the body runs (a child process, stopped on exit)."""
    repo = str(_REPO)
    path = os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from benchmarks.machine import probe_loop; probe_loop()",
        stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    probe = Probe()

    async def read() -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            with contextlib.suppress(ValueError):
                probe.samples_ms.append(float(line))

    reader = asyncio.create_task(read())
    try:
        yield probe
    finally:
        if proc.returncode is None:
            proc.kill()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_STOP_TIMEOUT_S):
                await proc.wait()
                await reader
        reader.cancel()


def cpu_probe_ms(probe: Probe) -> float | None:
    """The probe's median, rounded (None without samples)."""
    median = probe.median_ms()
    return round(median, 3) if median is not None else None
