"""Smoke tests of ``python -m benchmarks``: every mode runs through the CLI with tiny sizes and
writes the JSON keys its contract names (docs/performance.md). Figures are not checked
beyond "something was measured": this is a 2-core shared machine."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from benchmarks import machine
from benchmarks.disk import copy_limit
from benchmarks.peers import ratios
from benchmarks.writes import round_robin_callbacks
from bookkeeper_aio.errors import BookKeeperError, LedgerClosedError
from bookkeeper_aio.sandbox import Cluster

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parent.parent
BASE_KEYS = {"entries_per_s", "mb_per_s", "p50_ms", "p99_ms"}
TINY = ["--duration", "0.5", "--warmup", "0.2", "--entry-size", "256"]


def run_benchmark(
    tmp_path: Path, *argv: str, timeout_s: float = 60.0, keys: set[str] = BASE_KEYS
) -> dict:
    """Run one mode in a subprocess; its JSON result (which must have ``keys``)."""
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "benchmarks", *argv, "--json", str(out)]
    proc = subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, env=dict(os.environ)
    )
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    result = json.loads(out.read_text())
    assert set(result) >= keys, set(result)
    assert keys != BASE_KEYS or result["entries_per_s"] > 0
    return result


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """etcd + 3 bookies shared by the modes run with ``--metadata``."""
    with Cluster(tmp_path_factory.mktemp("bench-cluster"), 3, "memory") as c:
        yield c


def test_writes_with_peers(tmp_path):
    result = run_benchmark(
        tmp_path, "writes", *TINY, "--outstanding", "8", "--engine", "memory",
        "--peers", "--peer-duration", "0.5", "--dir", str(tmp_path),
    )  # fmt: skip
    peer_keys = {"etcd_puts_per_s", "etcd_p99_ms", "disk_group_commit_entries_per_s",
                 "disk_new_blocks_mb_per_s"}  # fmt: skip
    ratio_keys = {"ratio_vs_etcd", "ratio_vs_disk", "ratio_bytes_vs_disk_new_blocks"}
    assert peer_keys | ratio_keys <= set(result)
    assert result["disk_new_blocks_mb_per_s"] > 0
    assert result["etcd_puts_per_s"] > 0 and result["errors"] == 0
    assert "cpu_probe_ms" in result  # None when the phase ended before the probe's first run
    # The CPU per entry of the bookies it started (/proc ticks of 10 ms: thousands of adds
    # take more) and of its own process.
    assert result["bookie_cpu_us_per_entry"] > 0 and result["client_cpu_us_per_entry"] > 0


def test_bookie_set_reaches_the_started_bookies(tmp_path):
    # A value the bookies refuse proves the flag is theirs: the run fails, saying why.
    cmd = [sys.executable, "-m", "benchmarks", "writes", *TINY, "--no-peers", "--dir",
           str(tmp_path), "--bookie-set", "engine_blob_files=42"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "the local cluster did not start" in proc.stderr and "engine_blob_files" in proc.stderr


async def test_the_cpu_probe_samples_while_its_body_runs_and_then_stops():
    async with machine.cpu_probe() as probe:
        await asyncio.sleep(1.0)
    assert probe.samples_ms and all(0 < ms < 1000 for ms in probe.samples_ms)
    assert machine.cpu_probe_ms(probe) == round(statistics.median(probe.samples_ms), 3)
    count = len(probe.samples_ms)
    await asyncio.sleep(0.6)
    assert len(probe.samples_ms) == count  # the child is gone


def test_writes_open_loop(tmp_path, cluster):
    plots = tmp_path / "plots"
    result = run_benchmark(
        tmp_path, "writes", *TINY, "--rate", "200", "--ledgers", "2", "--no-peers",
        "--metadata", cluster.uri, "--plots", str(plots),
    )  # fmt: skip
    assert result["rate"] == 200 and result["errors"] == 0
    assert "etcd_puts_per_s" not in result
    # The phase over time: one row per second of it, as a PNG and its JSON.
    (second,) = result["timeline"]
    assert second["t_s"] == 0 and second["ops_per_s"] > 0 and second["p99_ms"] > 0
    assert (plots / "writes.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((plots / "writes.json").read_text())["timeline"] == result["timeline"]


def test_reads(tmp_path, cluster):
    result = run_benchmark(
        tmp_path, "reads", *TINY, "--entries", "500", "--batch", "10", "--outstanding", "2",
        "--metadata", cluster.uri,
    )  # fmt: skip
    assert result["errors"] == 0


def test_tail(tmp_path, cluster):
    result = run_benchmark(tmp_path, "tail", *TINY, "--rate", "200", "--metadata", cluster.uri)
    assert result["unseen"] == 0 and "append_p99_ms" in result


def test_recovery(tmp_path, cluster):
    result = run_benchmark(
        tmp_path, "recovery", "--ledgers", "3", "--entries", "200", "--outstanding", "60",
        "--entry-size", "256", "--metadata", cluster.uri,
    )  # fmt: skip
    assert result["errors"] == 0  # every ledger recovered up to its last acknowledged entry


def test_scale(tmp_path):
    result = run_benchmark(
        tmp_path, "scale", "--duration", "0.5", "--warmup", "0.2", "--entry-size", "256",
        "--outstanding", "20", "--ledger-counts", "1,3", "--bookie-counts", "3,4",
        "--engine", "memory", "--dir", str(tmp_path), timeout_s=120, keys={"points", "first"},
    )  # fmt: skip
    points = result["points"]
    assert list(points) == ["b3_l1", "b3_l3", "b4_l1", "b4_l3"] and result["first"] == "b3_l1"
    for name, point in points.items():
        assert point["errors"] == 0 and point["entries_per_s"] > 0, name
        assert point["ledgers"] == int(name.split("_l")[1]) and point["ratio_vs_first"] > 0
        assert point["client_cpu_us_per_entry"] > 0 and "bookie_cpu_us_per_entry" in point
    assert points["b3_l1"]["ratio_vs_first"] == 1.0


def test_breakdown(tmp_path):
    result = run_benchmark(
        tmp_path, "breakdown", "--duration", "1", "--warmup", "0.2", "--peak-duration", "0.5",
        "--outstanding", "50", "--entry-size", "256", "--engine", "memory", "--ledgers", "2",
        "--dir", str(tmp_path), timeout_s=120,
    )  # fmt: skip
    assert result["errors"] == 0 and result["peak_entries_per_s"] > 0
    # Every completed add joined with its bookies' timestamps, whose phases add up to it.
    assert result["joined"] == result["operations"] > 0
    phases = result["phases_all_ms"]
    assert set(phases) == {"driver", "client_queue", "to_bookie", "handle", "journal_queue",
                           "write", "fsync", "to_loop", "reply", "answer"}  # fmt: skip
    mean_ms = sum(phases.values())
    assert mean_ms > 0 and phases["fsync"] > 0 and min(phases.values()) >= 0, phases
    assert abs(sum(result["phases_slow_share"].values()) - 1) < 1e-6
    assert {"client_gc_gen2", "journal_rollover", "checkpoint"} <= set(result["stalls"])


def test_recovery_of_an_unconfirmed_tail(tmp_path, cluster):
    result = run_benchmark(
        tmp_path, "recovery", "--ledgers", "1", "--entries", "50", "--tail-entries", "300",
        "--entry-size", "256", "--metadata", cluster.uri,
    )  # fmt: skip
    assert result["errors"] == 0  # recovered up to the tail's last entry
    assert result["entries"] >= 300  # the tail carried the prefix's LAC: all read forward
    assert result["tail_write_p50_ms"] > 0 and result["ratio_vs_tail_write"] > 0


def test_log(tmp_path, cluster):
    result = run_benchmark(
        tmp_path, "log", *TINY, "--outstanding", "20", "--rollover-s", "0.1",
        "--metadata", cluster.uri,
    )  # fmt: skip
    assert result["errors"] == 0 and result["rollovers"] >= 1
    assert result["ledger"]["entries_per_s"] > 0 and result["ratio_vs_ledger"] > 0
    assert {"rollover_p99_ms", "steady_p99_ms", "segment_bytes_max"} <= set(result)


@pytest.mark.parametrize("engine", ["rocksdb", "files"])
def test_gc(tmp_path, engine):
    result = run_benchmark(
        tmp_path, "gc", *TINY, "--outstanding", "20", "--fill-mb", "8", "--fill-ledgers", "4",
        "--gc-interval", "0.3", "--engine", engine, "--dir", str(tmp_path),
        timeout_s=180,
    )  # fmt: skip
    assert result["without_gc"]["entries_per_s"] > 0 and result["ratio_vs_without_gc"] > 0
    assert result["space_back_s"] is not None  # the fill's space came back
    assert result["ledger_dirs_bytes_after"] < result["ledger_dirs_bytes_before"]


def test_bookie(tmp_path):
    result = run_benchmark(
        tmp_path, "bookie", "--duration", "0.5", "--warmup", "0.2", "--sequential", "50",
        "--baseline-duration", "0.3", "--outstanding", "50", "--engine", "memory",
        "--entry-size", "256", "--dir", str(tmp_path),
    )  # fmt: skip
    assert result["pipelined"]["errors"] == 0


def test_journal_on_and_off(tmp_path):
    result = run_benchmark(
        tmp_path, "journal", "--duration", "0.5", "--warmup", "0.2", "--outstanding", "50",
        "--entry-size", "256", "--dir", str(tmp_path),
    )  # fmt: skip
    for key in ("journal_on_bytes_per_entry", "journal_off_bytes_per_entry"):
        assert result[key] > 0
    assert result["journal_off_entries_per_s"] > 0


def test_overload_stays_within_its_memory_bound(tmp_path):
    out = tmp_path / "overload.json"
    cmd = [sys.executable, "-m", "benchmarks", "overload", "--duration", "2", "--writers", "4",
           "--entry-size", "16384", "--pending-bytes", str(4 << 20), "--engine", "memory",
           "--dir", str(tmp_path), "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["entries_per_s"] > 0 and result["within_bound"] is True
    assert result["client_rss_max_mib"] <= result["client_rss_bound_mib"]


@pytest.mark.parametrize("inline", [False, True])
def test_floor(tmp_path, inline):
    # Both variants start their servers, measure (run_benchmark checks the JSON keys and a
    # rate above zero: every add got its quorum of answers) and stop them.
    # --dir need not exist yet: the benchmark makes it.
    flags = ["--inline"] if inline else []
    where = tmp_path / "not" / "made" / "yet"
    result = run_benchmark(
        tmp_path, "floor", "--adds", "200", "--entry-size", "256", "--dir", str(where),
        *flags,
    )  # fmt: skip
    assert where.is_dir()
    assert result["system"].startswith("floor (inline)" if inline else "floor (journal thread)")


@pytest.mark.parametrize("inline", [False, True])
def test_floor_open_loop(tmp_path, inline):
    # The open loop sends rate x duration entries after its warm-up, and each one counts only
    # once its quorum answered it: the sent count, no errors and a timeline per second.
    flags = ["--inline"] if inline else []
    result = run_benchmark(
        tmp_path, "floor", "--rate", "400", "--duration", "1", "--entry-size", "256",
        "--dir", str(tmp_path), *flags,
    )  # fmt: skip
    assert result["operations"] == result["entries"] == 400
    assert result["errors"] == 0 and result["rate"] == 400
    assert len(result["timeline"]) == 1 and result["timeline"][0]["ops_per_s"] > 0
    assert 0 < result["p50_ms"] <= result["p99_ms"]


def test_ratios_against_the_floor():
    # `all` gives the 1-outstanding row the floor's p50 and the open-loop row the open-loop
    # floor's p99s; a row without them gets no such ratio.
    row = {"entries_per_s": 1500.0, "p50_ms": 0.6, "p99_ms": 1.5, "floor_p50_ms": 0.3}
    assert ratios(row) == {"ratio_p50_vs_floor": pytest.approx(2.0)}
    del row["floor_p50_ms"]
    assert ratios(row) == {}
    row.update(floor_open_p99_ms=0.5, floor_open_inline_p99_ms=0.25)
    assert ratios(row) == {
        "ratio_p99_vs_floor_open": pytest.approx(3.0),
        "ratio_p99_vs_floor_open_inline": pytest.approx(6.0),
    }


def test_rereplication(tmp_path):
    out = tmp_path / "rereplication.json"
    cmd = [sys.executable, "-m", "benchmarks", "rereplication", "--gib", "0.01",
           "--entry-size", "65536", "--duration", "0.3", "--dir", str(tmp_path),
           "--bookie-set", "checkpoint_interval_s=1", "--writer-rate", "200", "--writer-quiet", "1",
           "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-3000:]}"
    result = json.loads(out.read_text())
    assert result["copied_mib"] >= 5 and result["copy_mb_per_s"] > 0  # the lost bookie's share
    assert result["restore_s"] > result["detect_s"] > 0 and result["disk_limit_mb_per_s"] > 0
    assert result["disk_copy_mb_per_s"] > 0 and result["ratio_vs_disk_copy"] > 0
    assert result["fill_marked_ledgers"] == 0  # the fill left every copy made
    assert result["written_per_copied"] > 0.5  # the targets wrote the copies (once, at least)
    assert result["writer_quiet_p50_ms"] > 0 and result["writer_copy_p50_ms"] > 0
    assert result["writer_p99_ratio_vs_quiet"] > 0


def test_copy_limit_copies_whole_chunks_and_removes_its_files(tmp_path):
    result = copy_limit(tmp_path, 5 * (1 << 20) + 123, chunk_bytes=1 << 20, sync_bytes=2 << 20)
    assert result["copy_bytes"] == 5 << 20  # whole chunks
    assert result["copy_mib_per_s"] > 0
    assert list(tmp_path.iterdir()) == []  # source and copy removed


def test_copy_limit_ends_when_its_writes_fail(tmp_path, monkeypatch):
    """A failed sync (here: every one) raises, and the reader thread ends with it."""

    def failing_sync(fd):
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "fdatasync", failing_sync)
    outcome: list[BaseException] = []
    threads_before = threading.active_count()

    def run() -> None:
        try:
            copy_limit(tmp_path, 16 << 20, chunk_bytes=1 << 20, sync_bytes=1 << 20)
        except OSError as exc:
            outcome.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(timeout=60)
    assert not runner.is_alive(), "copy_limit hung after a failed write"
    assert len(outcome) == 1 and "injected" in str(outcome[0])
    assert threading.active_count() <= threads_before  # its reader is gone too
    assert list(tmp_path.iterdir()) == []


def test_scrub_with_and_without(tmp_path):
    result = run_benchmark(
        tmp_path, "scrub", "--duration", "0.5", "--warmup", "0.2", "--rounds", "1",
        "--outstanding", "10", "--entry-size", "256", "--scrub-rate", "1000000",
        "--dir", str(tmp_path), timeout_s=120,
    )  # fmt: skip
    assert result["without_scrub_entries_per_s"] > 0 and result["with_scrub_entries_per_s"] > 0
    assert result["scrubbed_bytes"] > 0 and result["errors"] == 0
    assert result["ratio_entries_per_s_scrub_vs_none"] > 0


def test_ops_costs_of_metrics_and_tls(tmp_path):
    out = tmp_path / "ops.json"
    cmd = [sys.executable, "-m", "benchmarks", "ops", *TINY, "--outstanding", "16",
           "--engine", "memory", "--rounds", "1", "--scrape-interval", "0.1",
           "--dir", str(tmp_path), "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for variant in ("plain", "metrics", "tls"):
        r = result[variant]
        assert set(r) >= BASE_KEYS and r["entries_per_s"] > 0 and r["errors"] == 0, r
        assert r["bookie_cpu_us_per_entry"] > 0
    assert result["metrics"]["ratio_vs_plain"] > 0 and result["tls"]["cpu_ratio_vs_plain"] > 0
    assert result["scrapes"] >= 1


def test_writes_guaranteed_write_quorum_compares_both_modes_healthy_and_slow(tmp_path):
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "benchmarks", "writes", "--guaranteed-write-quorum", *TINY,
           "--outstanding", "64", "--engine", "memory", "--no-peers", "--dir", str(tmp_path),
           "--json", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-3000:]}"
    result = json.loads(out.read_text())
    for key in ("normal_healthy", "gwq_healthy", "normal_slow", "gwq_slow"):
        phase = result[key]
        assert phase["entries_per_s"] > 0 and phase["errors"] == 0, (key, phase)
        assert phase["guaranteed_write_quorum"] is key.startswith("gwq")
        assert phase["pending_mib_max"] > 0 and phase["p99_ms"] > 0
    assert set(result["ratio_slow"]) == {"entries_per_s", "p99_ms", "pending_mib_max"}
    assert "GWQ / normal, slow:" in proc.stdout


class _FullWriter:
    """A writer whose pending bound refuses its first ``refusals`` appends until room comes."""

    def __init__(self, refusals: int, closed: bool = False) -> None:
        self.refusals, self.closed = refusals, closed
        self.appended: list[bytes] = []
        self.room = asyncio.Event()

    def append_callback(self, payload: bytes, done) -> int:
        if self.refusals:
            self.refusals -= 1
            raise BookKeeperError("10 adds (10240 bytes) pending; await append() instead")
        self.appended.append(payload)
        done(len(self.appended) - 1, None)
        return len(self.appended) - 1

    async def wait_for_room(self, size: int) -> None:
        await self.room.wait()
        if self.closed:
            raise LedgerClosedError("closed")


async def test_the_write_load_waits_for_room_instead_of_losing_a_refused_add() -> None:
    full, closing = _FullWriter(refusals=1), _FullWriter(refusals=1, closed=True)
    results: list[tuple[object, object]] = []
    send = round_robin_callbacks([full, closing], [b"a", b"b"])  # type: ignore[list-item]
    send(lambda v, e: results.append((v, e)))  # refused by the full writer: waits
    send(lambda v, e: results.append((v, e)))  # refused; its handle closes meanwhile
    await asyncio.sleep(0)
    assert results == [] and full.appended == []
    full.room.set()
    closing.room.set()
    for _ in range(5):
        await asyncio.sleep(0)
    assert full.appended == [b"a"] and results[0] == (0, None)
    assert len(results) == 2 and type(results[1][1]).__name__ == "LedgerClosedError"
