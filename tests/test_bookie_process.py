"""End to end against real bookie processes on 127.0.0.1: durability across kill -9, garbage."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import struct
import subprocess
import sys

import msgpack
import pytest

from bookkeeper_aio.client.bookie_client import BookieClient
from bookkeeper_aio.config import ClientConfig
from bookkeeper_aio.digest import entry_digest, master_key, payload_digest
from bookkeeper_aio.errors import BookKeeperError, StatusCode
from bookkeeper_aio.net import TcpNetwork
from bookkeeper_aio.protocol import (
    ADD_FLAG_DEFERRED_SYNC,
    ADD_FLAG_RECOVERY,
    PROTOCOL_VERSION,
    AddBatchRequest,
    AddRequest,
    HelloRequest,
    ListEntriesRequest,
    SharedFrame,
    encode,
    pack_add_entries,
)
from bookkeeper_aio.sandbox import BookieProcess, free_port

pytestmark = pytest.mark.process

KEY = master_key(b"secret")
CONFIG = ClientConfig(connect_timeout_s=5, request_timeout_s=20)


def _digest(ledger_id: int, entry_id: int, payload: bytes) -> int:
    return entry_digest(ledger_id, entry_id, entry_id - 1, payload)


async def pipelined_adds(address: str, ledger_id: int, count: int) -> dict[int, bytes]:
    """Pipeline ``count`` adds; return the payloads of those acknowledged OK."""
    client = await BookieClient.connect(TcpNetwork(), address, CONFIG)
    payloads = {e: os.urandom(100 + e % 900) for e in range(count)}
    futures = {}
    try:
        for e, p in payloads.items():
            await client.wait_capacity()  # the client's in-flight bound: backpressure
            futures[e] = client.request(AddRequest, ledger_id, e, 0, KEY, e - 1, p,
                                        _digest(ledger_id, e, p))  # fmt: skip
        results = await asyncio.gather(*futures.values(), return_exceptions=True)
    except BookKeeperError:  # the bookie died under us: what was acknowledged counts
        results = [f.exception() or f.result() if f.done() else None for f in futures.values()]
        await asyncio.gather(*futures.values(), return_exceptions=True)
        results = [f.exception() or f.result() for f in futures.values()]
    finally:
        await client.close()
    acked = {
        e: payloads[e]
        for e, r in zip(futures, results, strict=True)
        if not isinstance(r, BaseException) and r.status == StatusCode.OK
    }
    return acked


async def read_back(address: str, ledger_id: int, expected: dict[int, bytes]) -> None:
    client = await BookieClient.connect(TcpNetwork(), address, CONFIG)
    ids = sorted(expected)
    reads = []
    try:
        for i in range(0, len(ids), 1000):
            chunk = ids[i : i + 1000]
            reads += await asyncio.gather(*(client.read_entry(ledger_id, e) for e in chunk))
    finally:
        await client.close()
    for entry_id, read in zip(ids, reads, strict=True):
        assert read.payload == expected[entry_id], f"entry {entry_id} differs"
        assert read.digest == entry_digest(ledger_id, entry_id, read.entry_lac, read.payload)


@pytest.mark.parametrize("engine", ["files", "rocksdb"])
async def test_acknowledged_adds_survive_kill_9(tmp_path, engine):
    bookie = BookieProcess(tmp_path, engine).start()
    try:
        acked = await pipelined_adds(bookie.address, 42, 10_000)
        assert len(acked) == 10_000
        bookie.kill()
        bookie.start()
        await read_back(bookie.address, 42, acked)
        assert bookie.stop() == 0  # and a clean shutdown after the restart
        bookie.start()
        await read_back(bookie.address, 42, acked)
    finally:
        bookie.kill()


async def _copy_deferred(client: BookieClient, ledger_id: int, ids: range) -> None:
    payloads = [(e, e - 1, os.urandom(1000)) for e in ids]
    wire = [(e, lac, payload_digest(p), entry_digest(ledger_id, e, lac, p), p)
            for e, lac, p in payloads]  # fmt: skip
    flags = ADD_FLAG_RECOVERY | ADD_FLAG_DEFERRED_SYNC
    answer = await client.request(AddBatchRequest, ledger_id, flags, KEY, pack_add_entries(wire))
    assert answer.statuses == [StatusCode.OK] * len(ids)


async def _listed(client: BookieClient, ledger_id: int) -> list[list[int]]:
    answer = await client.request(ListEntriesRequest, ledger_id, 0, 1000)
    return [] if answer.status == StatusCode.NO_SUCH_LEDGER else answer.ranges


async def test_deferred_sync_copies_a_listing_reported_survive_kill_9(tmp_path):
    """Autorecovery's copies skip the journal (and RocksDB's memtables: they go into a copy
    file ingested at the engine's sync): a kill -9 before any sync loses them, as the
    simulator models; once a listing reported them (it waits for an engine sync first) they
    survive."""
    bookie = BookieProcess(tmp_path, "rocksdb", "--set", "checkpoint_interval_s=3600").start()
    try:
        client = await BookieClient.connect(TcpNetwork(), bookie.address, CONFIG)
        await _copy_deferred(client, 5, range(0, 50))
        await client.close()
        bookie.kill()  # no sync since the copies: their copy file was never ingested
        staged = tmp_path / "ledgers" / "copy-files"  # (engines/copy_files.py)
        assert [p.suffix for p in staged.iterdir()] == [".sst"]
        bookie.start()
        assert list(staged.iterdir()) == []  # a crash's leftovers go on open
        client = await BookieClient.connect(TcpNetwork(), bookie.address, CONFIG)
        assert await _listed(client, 5) == []
        await _copy_deferred(client, 5, range(0, 50))
        assert await _listed(client, 5) == [[0, 49]]  # synced before the answer
        await client.close()
        bookie.kill()
        bookie.start()
        client = await BookieClient.connect(TcpNetwork(), bookie.address, CONFIG)
        assert await _listed(client, 5) == [[0, 49]]
        await client.close()
    finally:
        bookie.kill()


async def test_kill_9_after_checkpoints_and_journal_file_reuse(tmp_path):
    """RocksDB runs without its WAL under the journal: what a checkpoint flushed is in SSTs, the
    rest only in the journal, partly in reused files that still hold older records."""
    small = ["--set", "checkpoint_interval_s=0.2", "--set", "journal_file_bytes_max=6000000",
             "--set", "journal_preallocate_bytes=1000000"]  # fmt: skip
    bookie = BookieProcess(tmp_path, "rocksdb", *small).start()
    try:
        acked = {}
        for ledger_id in (5, 6):
            acked[ledger_id] = await pipelined_adds(bookie.address, ledger_id, 8_000)
            await asyncio.sleep(0.5)  # checkpoints: the engine flushes, files are retired
        recycled = {p.name for p in (tmp_path / "journal").glob("recycled-*")}
        assert recycled
        acked[7] = await pipelined_adds(bookie.address, 7, 16_000)  # rolls over: reuses one
        assert recycled - {p.name for p in (tmp_path / "journal").glob("recycled-*")}
        bookie.kill()  # the last round is in the journal (a reused file), maybe not in SSTs
        bookie.start()
        for ledger_id, entries in acked.items():
            assert len(entries) == (16_000 if ledger_id == 7 else 8_000)
            await read_back(bookie.address, ledger_id, entries)
        # Usually the tail of the last round comes back from the reused file; a checkpoint
        # that started after the last write and finished before the kill (one every 0.2 s)
        # leaves nothing to replay, and then the SSTs alone held it: read back above.
        replayed = re.findall(r"(\d+) journal records replayed", bookie.log.read_text())
        assert len(replayed) == 2, replayed
    finally:
        bookie.kill()


async def test_kill_9_during_a_stream_of_adds_loses_nothing_acknowledged(tmp_path):
    bookie = BookieProcess(tmp_path, "rocksdb").start()
    try:
        task = asyncio.ensure_future(pipelined_adds(bookie.address, 9, 20_000))
        await asyncio.sleep(0.3)
        bookie.kill()
        acked = await task
        bookie.start()
        await read_back(bookie.address, 9, acked)
    finally:
        bookie.kill()


async def _multi_adds(address: str, ledgers: range, rounds: int) -> dict[tuple[int, int], bytes]:
    """``rounds`` adds to each of ``ledgers``, each round's in one loop turn through one
    connection, so that they travel as MultiAddRequests (BookieClient.request_shared); the
    payloads of those acknowledged OK, by (ledger, entry)."""
    client = await BookieClient.connect(TcpNetwork(), address, CONFIG)
    loop = asyncio.get_running_loop()
    answers: dict[tuple[int, int], asyncio.Future] = {}
    payloads: dict[tuple[int, int], bytes] = {}
    try:
        for e in range(rounds):
            for lid in ledgers:
                payload = payloads[lid, e] = os.urandom(50 + (lid * 31 + e) % 400)
                frame = SharedFrame(AddRequest, lid, e, 0, KEY, e - 1, payload,
                                    _digest(lid, e, payload))  # fmt: skip
                answers[lid, e] = future = loop.create_future()
                client.request_shared(frame, future.set_result)
            await asyncio.sleep(0.002)  # the next round in a later turn, as a service's
        await asyncio.wait(answers.values(), timeout=30)
        assert client.statistics()["multi_adds"] >= rounds // 2, client.statistics()
    finally:
        await client.close()
    return {
        key: payloads[key]
        for key, answer in answers.items()
        if answer.done()
        and not isinstance(answer.result(), BaseException)
        and answer.result().status == StatusCode.OK
    }


@pytest.mark.parametrize("engine", ["files", "rocksdb"])
async def test_multi_adds_of_many_ledgers_survive_kill_9(tmp_path, engine):
    """A multi-add's parts are journaled as one REC_LEDGERS_ENTRIES record: a replay after a
    kill -9 puts every acknowledged entry of every ledger back into the real engine."""
    bookie = BookieProcess(tmp_path, engine).start()
    ledgers = range(100, 120)
    try:
        acked = await _multi_adds(bookie.address, ledgers, 60)
        assert len(acked) == 20 * 60
        bookie.kill()
        bookie.start()
        for lid in ledgers:
            mine = {e: p for (owner, e), p in acked.items() if owner == lid}
            await read_back(bookie.address, lid, mine)
    finally:
        bookie.kill()


def _raw(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), 5)
    sock.settimeout(5)
    return sock


def _hello(sock: socket.socket) -> None:
    sock.sendall(encode(HelloRequest(1, PROTOCOL_VERSION, "garbage-test")))
    assert sock.recv(65536)  # the hello response


async def test_garbage_does_not_stop_the_bookie(tmp_path):
    bookie = BookieProcess(tmp_path, "files").start()
    try:
        # Random bytes before any hello: the connection is closed, the bookie lives.
        with _raw(bookie.address) as s:
            s.sendall(os.urandom(4096))
            _drain_until_closed(s)
        # An oversize frame after a hello: an error, then that connection is closed.
        with _raw(bookie.address) as s:
            _hello(s)
            s.sendall(struct.pack(">I", 1 << 30) + b"x" * 100)
            _drain_until_closed(s)
        # A bad body inside a good frame: an error response; the connection stays usable.
        with _raw(bookie.address) as s:
            _hello(s)
            body = msgpack.packb([2, 77, "not", "an", "add"])
            s.sendall(struct.pack(">I", len(body)) + body)
            reply = msgpack.unpackb(s.recv(65536)[4:])
            assert reply[:3] == [0xFF, 77, StatusCode.BAD_REQUEST]
            for op in (0x42, 0x82):  # unknown op, a response sent as a request
                body = msgpack.packb([op, 78])
                s.sendall(struct.pack(">I", len(body)) + body)
                reply = msgpack.unpackb(s.recv(65536)[4:])
                assert reply[0] == 0xFF and reply[2] == StatusCode.BAD_REQUEST
        # A wrong protocol version is refused with BAD_VERSION.
        with _raw(bookie.address) as s:
            s.sendall(encode(HelloRequest(1, PROTOCOL_VERSION + 1, "future")))
            reply = msgpack.unpackb(s.recv(65536)[4:])
            assert reply[2] == StatusCode.BAD_VERSION
            _drain_until_closed(s)
        # Still serving, and the bookie sanity check passes.
        acked = await pipelined_adds(bookie.address, 5, 50)
        assert len(acked) == 50
        result = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "bookkeeper_aio.shell", "bookie-sanity",
             "--bookie", bookie.address],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "ok" in result.stdout
        assert bookie.proc.poll() is None
        bookie.signal(signal.SIGTERM)
        assert bookie.proc.wait(30) == 0
    finally:
        bookie.kill()


def test_bookie_sanity_fails_clearly_when_no_bookie_listens(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bookkeeper_aio.shell", "bookie-sanity",
         "--bookie", f"127.0.0.1:{free_port()}", "--timeout", "2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert "bookie-sanity failed" in result.stderr


def test_bad_config_exits_2_with_the_key_named(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bookkeeper_aio.bookie", "--journal-dir", str(tmp_path),
         "--ledger-dir", str(tmp_path), "--set", "journal_batch_bytes_maxx=3"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "journal_batch_bytes_maxx" in result.stderr


def _drain_until_closed(sock: socket.socket) -> None:
    while True:
        try:
            if not sock.recv(65536):
                return
        except ConnectionResetError:
            return


def test_journal_write_data_false_needs_a_metadata_store():
    from bookkeeper_aio.config import BookieConfig
    from bookkeeper_aio.errors import ConfigError

    with pytest.raises(ConfigError, match="metadata_uri"):
        BookieConfig(journal_write_data=False).validate()


def test_a_negative_engine_write_behind_is_refused():
    from bookkeeper_aio.config import BookieConfig
    from bookkeeper_aio.errors import ConfigError

    with pytest.raises(ConfigError, match="engine_write_behind_bytes"):
        BookieConfig(engine_write_behind_bytes=-1).validate()
    BookieConfig(engine_write_behind_bytes=1).validate()  # 1: every put at once


def test_the_engine_write_rate_may_be_zero_but_not_negative():
    from bookkeeper_aio.config import BookieConfig
    from bookkeeper_aio.errors import ConfigError

    with pytest.raises(ConfigError, match="engine_write_rate_bytes_per_s must be >= 0"):
        BookieConfig(engine_write_rate_bytes_per_s=-1).validate()
    BookieConfig(engine_write_rate_bytes_per_s=0).validate()  # 0: no limit
