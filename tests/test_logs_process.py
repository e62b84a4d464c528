"""A log across real processes: a writer killed with kill -9 mid-stream, a second writer
taking the log over, a tailing reader in a third process (etcd and 3 bookie processes)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.metadata.store import open_metadata_store
from bookkeeper_aio.sandbox import bookies, wait_registered

pytestmark = pytest.mark.process
WORKER = str(Path(__file__).with_name("logs_worker.py"))
SEGMENT_ENTRIES = 40


@contextlib.asynccontextmanager
async def worker(*args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        WORKER,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def lines(proc: asyncio.subprocess.Process, until: str | None, timeout_s: float) -> list:
    """``(kind, offset, payload)`` of each line, until one whose payload is ``until`` (or EOF)."""
    got = []
    assert proc.stdout is not None
    async with asyncio.timeout(timeout_s):
        while line := (await proc.stdout.readline()).decode():
            kind, offset, *payload = line.split()
            got.append((kind, int(offset), payload[0] if payload else ""))
            if got[-1][2] == until:
                break
    return got


async def test_writer_killed_then_taken_over_while_a_reader_tails(etcd_uri, tmp_path):
    async with open_metadata_store(etcd_uri) as store:
        await store.init_cluster()
    with bookies(tmp_path, 3, "rocksdb", "--metadata", etcd_uri, "--set", "lease_ttl_s=3"):
        await wait_registered(etcd_uri, 3)
        async with BookKeeper.connect(etcd_uri) as bk:
            await bk.create_log("events", segment_entries_max=SEGMENT_ENTRIES)
            async with worker("reader", etcd_uri, "events") as reader:
                async with worker("writer", etcd_uri, "events", "first", "100000") as first:
                    got: list[tuple[str, int, str]] = []
                    async with asyncio.timeout(30):
                        while sum(k == "ACK" for k, _, _ in got) < 3 * SEGMENT_ENTRIES:
                            got.append(await _one(first))
                    first.send_signal(signal.SIGKILL)  # mid-stream: appends are in flight
                    await first.wait()
                    got += await lines(first, None, 10)  # what it printed before dying
                acked_first = {o: p for k, o, p in got if k == "ACK"}
                async with worker("writer", etcd_uri, "events", "second", "100") as second:
                    taken = await lines(second, "END", 60)
                    assert await second.wait() == 0
                read = await lines(reader, "END", 60)
            records = await bk.read_log("events")
            info = await bk.log_info("events")
    offsets = [r.offset for r in records]
    assert offsets == list(range(len(records))), "dense from 0"
    payloads = {r.offset: r.payload.decode() for r in records}
    # Everything the killed writer was told is there, with its payload.
    assert all(payloads[o] == p for o, p in acked_first.items())
    # The second writer started right after the recovered end: no gap, nothing reused.
    opened = taken[0][1]
    assert taken[0][0] == "OPEN" and opened >= max(acked_first) + 1
    assert all(payloads[o].startswith("first-") for o in range(opened))
    acked_second = [(o, p) for k, o, p in taken if k == "ACK"]
    assert [o for o, _ in acked_second] == list(range(opened, opened + 101))
    assert all(payloads[o] == p for o, p in acked_second)
    # The tailing reader saw every record once, in order, across at least three ledgers.
    assert [(o, p) for _, o, p in read] == [(r.offset, r.payload.decode()) for r in records]
    assert len(info.segments) >= 3 + 3 and info.segments[-1].state.value == "CLOSED"


async def _one(proc: asyncio.subprocess.Process) -> tuple[str, int, str]:
    assert proc.stdout is not None
    line = (await proc.stdout.readline()).decode()
    assert line, "the writer exited early"
    kind, offset, *payload = line.split()
    return kind, int(offset), payload[0] if payload else ""


def shell(uri: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bookkeeper_aio.shell", "--metadata", uri, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


async def test_shell_lists_logs_and_shows_one(etcd_uri):
    async with BookKeeper.connect(etcd_uri) as bk:
        await bk.create_log("orders", segment_entries_max=10, retention_bytes=1000)
        await bk.commit_log_offset("orders", "billing", 3)  # a cursor is not a log
    listed = await asyncio.to_thread(shell, etcd_uri, "list-logs")
    assert listed.returncode == 0 and listed.stdout.split() == ["orders"]
    shown = await asyncio.to_thread(shell, etcd_uri, "log-info", "orders")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["next_offset"] == 0 and doc["segments"] == []
    assert doc["metadata"]["options"]["segment_entries_max"] == 10
    missing = await asyncio.to_thread(shell, etcd_uri, "log-info", "nope")
    assert missing.returncode == 1 and "NoSuchLogError" in missing.stderr
    bad = await asyncio.to_thread(shell, etcd_uri, "log-info", "a/b")
    assert bad.returncode == 1 and "must not contain '/'" in bad.stderr
