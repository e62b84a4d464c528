"""``ops``: what operating it costs the writes benchmark: metrics, and TLS.

    python -m benchmarks ops --duration 10 --rounds 2 --outstanding 1000

Three local clusters (etcd + 3 bookies each) run side by side, written to in turn by one
client process, E3/WQ3/AQ2, 1 KiB entries, closed loop:

* **plain**: the baseline: bookies with ``metrics_latency = false`` (no latency or journal
  histograms) and no HTTP server;
* **metrics**: every bookie with its histograms and ``--http-listen``, the client with a
  ``metrics_registry``, and a scraper fetching every bookie's ``/metrics`` and rendering the
  client's registry every ``--scrape-interval`` seconds (Prometheus' default is 15 s);
* **tls**: bookies serving TLS with a CA made for the run (``tls_certs.py``), the client
  verifying them; no histograms, as the baseline.

The measured phases alternate plain, metrics, tls, ``--rounds`` times (each phase
``--duration / --rounds`` seconds): a machine that drifts (other load, the disk writing back)
drifts under all three alike. Each variant's figure is over all its phases; the ratios
against plain are the costs (docs/operations.md). Throughput on a shared machine moves by
tens of percent from one phase to the next, so each variant also reports the CPU it spent per
entry: the bookie processes' (``/proc/PID/stat``) and this process's (the client, and the
scraper in the metrics variant). CPU per entry barely moves with other load, and a cost of a
few percent shows there first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.sandbox import free_port
from bookkeeper_aio.tls_certs import make_test_pki

from .cluster import local_cluster
from .load import LoadResult, closed_loop, drive, payload_pool
from .machine import cpu_seconds
from .options import add_client_arguments, client_config
from .stats import print_table, write_json
from .writes import close_and_delete, open_writers, round_robin_callbacks

VARIANTS = ("plain", "metrics", "tls")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p)
    p.add_argument("--rounds", type=int, default=2, help="phases per variant (alternating)")
    p.add_argument("--scrape-interval", type=float, default=1.0, metavar="S")


async def measure_ops(scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Start the three clusters, run the alternating phases; per variant its summary, and
    the ratios against plain."""
    pki = make_test_pki(scratch / "pki")
    http = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    quiet = ("--set", "metrics_latency=false")
    tls = (*quiet, "--tls-cert", pki.server_cert_file, "--tls-key", pki.server_key_file)
    engine = args.engine
    async with (
        local_cluster(scratch / "plain", 3, engine, *quiet) as plain,
        local_cluster(
            scratch / "metrics", 3, engine, per_bookie=lambda i: ["--http-listen", http[i]]
        ) as metrics,
        local_cluster(scratch / "tls", 3, engine, *tls) as secure,
    ):
        registry = CollectorRegistry()
        base = client_config(args.outstanding, args.entry_size)
        configs = {
            "plain": (plain.uri, base, None, plain),
            "metrics": (metrics.uri, base, registry, metrics),
            "tls": (secure.uri, base.replace(tls_ca_file=pki.ca_file), None, secure),
        }
        results = await _phases(configs, args, http, registry)
    out: dict[str, Any] = {}
    for v in VARIANTS:
        load, cpu = results[v]
        entries = max(load.entries, 1)
        out[v] = {
            **load.summary(args.entry_size),
            "bookie_cpu_us_per_entry": cpu[0] / entries * 1e6,
            "client_cpu_us_per_entry": cpu[1] / entries * 1e6,
        }
    rate = out["plain"]["entries_per_s"] or float("nan")
    cpu_plain = _cpu_per_entry(out["plain"])
    for v in ("metrics", "tls"):
        out[v]["ratio_vs_plain"] = out[v]["entries_per_s"] / rate
        out[v]["cpu_ratio_vs_plain"] = _cpu_per_entry(out[v]) / cpu_plain
    out["scrapes"] = results["scrapes"]
    return out


def _cpu_per_entry(r: dict[str, Any]) -> float:
    return r["bookie_cpu_us_per_entry"] + r["client_cpu_us_per_entry"] or float("nan")


async def _phases(
    configs: dict[str, Any], args: argparse.Namespace, http: list[str], registry: Any
) -> dict[str, Any]:
    payloads = payload_pool(args.entry_size)
    results: dict[str, Any] = {v: (LoadResult(), [0.0, 0.0]) for v in VARIANTS}
    async with contextlib.AsyncExitStack() as stack:
        sends, handles = {}, []
        for v in VARIANTS:
            uri, config, reg, _ = configs[v]
            bk = await stack.enter_async_context(
                BookKeeper.connect(uri, config, metrics_registry=reg)
            )
            writers = await open_writers(bk, args)
            handles.append((bk, writers))
            sends[v] = round_robin_callbacks(writers, payloads)
            if args.warmup > 0:
                await closed_loop(sends[v], args.outstanding, args.warmup, callbacks=True)
        scraper = _Scraper(http, registry, args.scrape_interval)
        phase_s = args.duration / args.rounds
        for _ in range(args.rounds):
            for v in VARIANTS:
                pids = [b.proc.pid for b in configs[v][3].bookies]
                scraping = scraper.running() if v == "metrics" else contextlib.nullcontext()
                bookie_cpu, client_cpu = cpu_seconds(pids), time.process_time()
                async with scraping:
                    load = await drive(sends[v], args.outstanding, phase_s, callbacks=True)
                total, cpu = results[v]
                cpu[0] += cpu_seconds(pids) - bookie_cpu
                cpu[1] += time.process_time() - client_cpu
                _add(total, load)
        for bk, writers in handles:
            await close_and_delete(bk, writers)
    results["scrapes"] = scraper.scrapes
    return results


def _add(total: LoadResult, load: LoadResult) -> None:
    total.latencies_s += load.latencies_s
    total.entries += load.entries
    total.elapsed_s += load.elapsed_s
    total.errors += load.errors
    total.first_error = total.first_error or load.first_error


class _Scraper:
    """Fetches every bookie's /metrics and renders the client's registry, every interval."""

    def __init__(self, http: list[str], registry: Any, interval_s: float) -> None:
        self.urls = [f"http://{a}/metrics" for a in http]
        self.registry = registry
        self.interval_s = interval_s
        self.scrapes = 0

    @contextlib.asynccontextmanager
    async def running(self) -> Any:
        async with aiohttp.ClientSession() as session:
            task = asyncio.create_task(self._loop(session))
            try:
                yield
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _loop(self, session: aiohttp.ClientSession) -> None:
        while True:
            for url in self.urls:
                async with session.get(url) as reply:
                    assert reply.status == 200, url
                    await reply.read()
            generate_latest(self.registry)
            self.scrapes += 1
            await asyncio.sleep(self.interval_s)


async def run_ops(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """The ``ops`` mode: measure, print a table, write the JSON."""
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-ops-") as tmp:
        result = await measure_ops(Path(tmp), args)
    if not quiet:
        print_table(f"operating costs, {args.outstanding} outstanding", rows(result))
    write_json(args.json, result)
    return result


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Table rows of the three variants."""
    m, t = result["metrics"], result["tls"]
    notes = {
        "plain": "baseline: no histograms, no HTTP",
        "metrics": f"x{m['ratio_vs_plain']:.3f} plain rate, x{m['cpu_ratio_vs_plain']:.3f} "
        f"CPU/entry; {result['scrapes']} scrapes",
        "tls": f"x{t['ratio_vs_plain']:.3f} plain rate, x{t['cpu_ratio_vs_plain']:.3f} CPU/entry",
    }
    out = []
    for v in VARIANTS:
        r = result[v]
        cpu = r["bookie_cpu_us_per_entry"] + r["client_cpu_us_per_entry"]
        note = f"{notes[v]}; {cpu:.0f} us CPU/entry"
        note += f"; {r['errors']} ERRORS" if r.get("errors") else ""
        out.append(
            {
                "benchmark": f"writes E3/WQ3/AQ2, {v}",
                "entries/s": r["entries_per_s"],
                "MB/s": r["mb_per_s"],
                "p50_ms": r["p50_ms"],
                "p99_ms": r["p99_ms"],
                "p99.9_ms": r.get("p99_9_ms"),
                "max_ms": r.get("max_ms"),
                "note": note,
            }
        )
    return out
