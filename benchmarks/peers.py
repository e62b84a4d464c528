"""Peers measured in the same run: a 3-member etcd cluster (Raft + WAL fdatasync, the same
etcd binary the tests use) doing 1 KiB puts through an asyncio client at the same
concurrency, and the disk's raw group-commit limit.

The etcd client is aetcd (gRPC), the client the project already uses; one channel per
member, puts spread over them round-robin like etcd's own ``benchmark put --endpoints=...``.
Keys are sequential (``bench/0000000001``...), values random bytes of the entry size. The
Python client spends CPU too, on the same two cores: this is "etcd as an asyncio
application sees it", not etcd's own Go benchmark (docs/performance.md has both).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from pathlib import Path
from typing import Any

import aetcd

from bookkeeper_aio.config import BookieConfig
from bookkeeper_aio.etcd_server import EtcdServer

from .disk import group_commit_limit, new_blocks_limit
from .load import closed_loop

ETCD_MEMBERS = 3


async def etcd_peer(
    root: Path, outstandings: list[int], duration_s: float, value_bytes: int
) -> dict[int, dict[str, Any]]:
    """Puts/s and latency of a fresh 3-member etcd cluster, one closed loop per concurrency."""
    results: dict[int, dict[str, Any]] = {}
    # Started and stopped synchronously: a Ctrl-C during a threaded start would orphan members.
    with EtcdServer(root / "etcd-peer", members=ETCD_MEMBERS) as etcd:
        clients = [aetcd.Client(host="127.0.0.1", port=port) for port in etcd.client_ports]
        try:
            value = os.urandom(value_bytes)
            keys = itertools.count()
            picks = itertools.cycle(clients)

            def send() -> asyncio.Future[Any]:
                key = b"bench/%010d" % next(keys)
                return asyncio.ensure_future(next(picks).put(key, value))

            await closed_loop(send, max(outstandings), min(1.0, duration_s))  # warm-up
            for outstanding in outstandings:
                load = await closed_loop(send, outstanding, duration_s)
                results[outstanding] = load.summary(value_bytes)
        finally:
            for client in clients:
                with contextlib.suppress(Exception):
                    await client.close()
    return results


def etcd_fields(summary: dict[str, Any]) -> dict[str, Any]:
    """The etcd peer's figures under the JSON keys the issue fixes."""
    return {
        "etcd_puts_per_s": summary["entries_per_s"],
        "etcd_p50_ms": summary["p50_ms"],
        "etcd_p99_ms": summary["p99_ms"],
        "etcd_errors": summary["errors"],
    }


def disk_limits(directory: Path, entry_bytes: int, duration_s: float) -> dict[str, Any]:
    """One entry per fdatasync (the latency floor), journal-sized groups (the throughput
    ceiling: ``journal_batch_bytes_max`` per fdatasync, into written blocks) and the same
    groups from three streams into new blocks (a fresh cluster's bytes)."""
    batch = BookieConfig().journal_batch_bytes_max
    single = group_commit_limit(directory, entry_bytes, duration_s, entry_bytes)
    grouped = group_commit_limit(directory, batch, duration_s, entry_bytes)
    fresh = new_blocks_limit(directory, batch, duration_s)
    return {
        "disk_new_blocks_mb_per_s": fresh["mb_per_s"],
        "disk_group_commit_entries_per_s": grouped["entries_per_s"],
        "disk_group_commit_batch_bytes": batch,
        "disk_group_commit_p50_ms": grouped["p50_ms"],
        "disk_fsync_per_s": single["fsyncs_per_s"],
        "disk_fsync_p50_ms": single["p50_ms"],
        "disk_fsync_p99_ms": single["p99_ms"],
    }


def ratios(result: dict[str, Any]) -> dict[str, float]:
    """Our figures over the peers' (where both are present)."""
    out: dict[str, float] = {}
    if result.get("etcd_puts_per_s"):
        out["ratio_vs_etcd"] = result["entries_per_s"] / result["etcd_puts_per_s"]
        out["ratio_p99_vs_etcd"] = result["p99_ms"] / result["etcd_p99_ms"]
    if result.get("disk_group_commit_entries_per_s"):
        out["ratio_vs_disk"] = result["entries_per_s"] / result["disk_group_commit_entries_per_s"]
        out["ratio_p50_vs_fsync"] = result["p50_ms"] / result["disk_fsync_p50_ms"]
    if result.get("disk_new_blocks_mb_per_s") and result.get("write_quorum"):
        # Each of the write quorum's bookies writes the payload twice: journal and engine.
        written = 2 * result["write_quorum"] * result["mb_per_s"]
        out["ratio_bytes_vs_disk_new_blocks"] = written / result["disk_new_blocks_mb_per_s"]
    if result.get("floor_p50_ms"):
        out["ratio_p50_vs_floor"] = result["p50_ms"] / result["floor_p50_ms"]
    for suffix in ("", "_inline"):  # the open loop's floor at the same rate (floor --rate)
        if result.get(f"floor_open{suffix}_p99_ms"):
            out[f"ratio_p99_vs_floor_open{suffix}"] = (
                result["p99_ms"] / result[f"floor_open{suffix}_p99_ms"]
            )
    return out
