"""The operators' shell commands against etcd and real bookie processes: simpletest,
read-ledger, bookie-info, list-bookies --read-only and --json on the listings; their exit
codes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.metadata.store import open_metadata_store
from bookkeeper_aio.sandbox import BookieProcess, free_port, wait_registered

pytestmark = pytest.mark.process


def shell(uri: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    head = ["--metadata", uri] if uri else []
    cmd = [sys.executable, "-m", "bookkeeper_aio.shell", *head, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


async def run(uri: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(shell, uri, *args)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
async def cluster(etcd_uri, tmp_path):
    """Three writable bookies and a read-only one, registered."""
    async with open_metadata_store(etcd_uri) as store:
        await store.init_cluster()
    procs = [BookieProcess(tmp_path / f"b{i}", "memory", "--metadata", etcd_uri,
                           "--set", "lease_ttl_s=3") for i in range(3)]  # fmt: skip
    procs.append(BookieProcess(tmp_path / "ro", "memory", "--metadata", etcd_uri, "--set",
                               "lease_ttl_s=3", "--set", "force_read_only=true"))  # fmt: skip
    try:
        for p in procs:
            p.start()
        await wait_registered(etcd_uri, len(procs))
        yield procs
    finally:
        for p in procs:
            p.kill()


async def test_simpletest_writes_verifies_deletes_and_fails_with_exit_1(etcd_uri, cluster):
    done = await run(etcd_uri, "simpletest", "--ensemble", "3", "--write-quorum", "2",
                     "--ack-quorum", "2", "--entries", "300", "--entry-size", "100")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("simpletest ok: ledger ") and "300 entries" in done.stdout
    assert "write" in done.stderr  # the progress bars
    assert json_lines((await run(etcd_uri, "list-ledgers", "--json")).stdout) == []  # deleted
    # Four writable bookies are needed, three exist (the fourth is read-only).
    failed = await run(etcd_uri, "simpletest", "--ensemble", "4", "--write-quorum", "2",
                       "--ack-quorum", "2")  # fmt: skip
    assert failed.returncode == 1 and "NotEnoughBookiesError" in failed.stderr
    bad = await run(etcd_uri, "simpletest", "--entries", "0")
    assert bad.returncode == 2 and "must be >= 1" in bad.stderr


async def test_read_ledger_prints_text_or_hex(etcd_uri, cluster):
    async with BookKeeper.connect(etcd_uri) as bk:
        w = await bk.create_ledger(3, 2, 2, b"pw")
        for payload in (b"hello", b"\x00\xffbinary", b"third line"):
            await w.append(payload)
        open_writer = await bk.create_ledger(3, 2, 2, b"pw")
        await open_writer.append(b"tail")
        await w.close()
        ledger = str(w.ledger_id)
        done = await run(etcd_uri, "read-ledger", ledger, "--password", "pw")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == ["0\thello", "1\t00ff62696e617279", "2\tthird line"]
        done = await run(etcd_uri, "read-ledger", ledger, "--password", "pw", "--first", "1",
                         "--last", "1", "--json")  # fmt: skip
        assert json_lines(done.stdout) == [{"entry_id": 1, "bytes": 8, "hex": "00ff62696e617279"}]
        done = await run(etcd_uri, "read-ledger", ledger, "--password", "pw", "--format", "hex",
                         "--last", "0")  # fmt: skip
        assert done.stdout.splitlines() == ["0\t68656c6c6f"]
        past = await run(etcd_uri, "read-ledger", ledger, "--password", "pw", "--last", "9")
        assert past.returncode == 1 and "last add confirmed is 2" in past.stderr
        wrong = await run(etcd_uri, "read-ledger", ledger, "--password", "nope")
        assert wrong.returncode == 1 and "UnauthorizedError" in wrong.stderr
        missing = await run(etcd_uri, "read-ledger", "12345")
        assert missing.returncode == 1 and "NoSuchLedgerError" in missing.stderr
        # An open ledger is read up to its LAC without recovery: its writer goes on.
        await open_writer.append(b"more")
        done = await run(etcd_uri, "read-ledger", str(open_writer.ledger_id), "--password", "pw")
        assert done.returncode == 0 and done.stdout.splitlines()[0] == "0\ttail"
        await open_writer.append(b"still writable")
        await open_writer.close()


async def test_bookie_info_and_bookie_listings(etcd_uri, cluster):
    read_only = cluster[-1].address
    done = await run(etcd_uri, "bookie-info", "--bookie", read_only)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["bookie_id"] == read_only and info["read_only"] is True
    assert info["registered"] is True and info["registered_read_only"] is True
    assert 0 < info["free_bytes"] <= info["total_bytes"]
    gone = await run(None, "bookie-info", "--bookie", f"127.0.0.1:{free_port()}")
    assert gone.returncode == 1 and "BookieUnavailableError" in gone.stderr
    listed = json_lines((await run(etcd_uri, "list-bookies", "--json")).stdout)
    assert sorted(b["bookie_id"] for b in listed) == sorted(p.address for p in cluster)
    only = await run(etcd_uri, "list-bookies", "--read-only")
    assert only.stdout.split("\t")[0] == read_only and only.stdout.count("\n") == 1
    only = json_lines((await run(etcd_uri, "list-bookies", "--read-only", "--json")).stdout)
    assert [b["bookie_id"] for b in only] == [read_only]


async def test_every_listing_has_json(etcd_uri, cluster):
    async with BookKeeper.connect(etcd_uri) as bk:
        w = await bk.create_ledger(3, 2, 2)
        await w.close()
        await bk.create_log("events", ensemble_size=3, write_quorum=2, ack_quorum=2)
    assert {"ledger_id": w.ledger_id} in json_lines(
        (await run(etcd_uri, "list-ledgers", "--json")).stdout
    )
    assert json_lines((await run(etcd_uri, "list-logs", "--json")).stdout) == [{"name": "events"}]
    for command in ("list-under-replicated", "list-topics", "list-groups", "list-spark-jobs"):
        done = await run(etcd_uri, command, "--json")
        assert done.returncode == 0 and json_lines(done.stdout) == [], (command, done.stderr)
