"""The adversarial suite (issue 25): one real bookie process, and everything a hostile client
can send it — every field of every operation with wrong types and out-of-range values
(hypothesis), nesting, oversize headers, frames that decode to huge work, clients that never
read, slowloris. After each case: the bookie serves, its RSS stays within the bound
docs/operations.md gives, and the entries it acknowledged before read back."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.hostile import HUGE_WORK
from bookkeeper_aio.config import MiB
from bookkeeper_aio.digest import entry_digest
from bookkeeper_aio.errors import KNOWN_STATUSES, StatusCode
from bookkeeper_aio.protocol import (
    PROTOCOL_VERSION,
    AddBatchRequest,
    AddRequest,
    BookieInfoRequest,
    ErrorResponse,
    FrameDecoder,
    HelloRequest,
    LedgerRecordsRequest,
    ListEntriesRequest,
    MultiAddRequest,
    ReadBatchRequest,
    ReadLacRequest,
    ReadRequest,
    ScrubRequest,
    WriteLacRequest,
    encode,
)
from bookkeeper_aio.sandbox import BookieProcess

from .wire import KEY

pytestmark = pytest.mark.process

FRAME_MAX = 5 * MiB
OUTPUT_MAX = 1 * MiB
IDLE_S = 2.0
BIG = 4 * MiB  # an acknowledged entry that a read asks for: the biggest answer
ACKED_LEDGER = 1


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) * 1024


def memory_bound(connections: int) -> int:
    """docs/operations.md, "Memory under hostile clients": what ``connections`` hostile
    connections may add to an idle bookie's RSS. Per connection: its decoder's buffer (a
    frame), its answers not yet sent (connection_output_bytes_max) and one more answer (an
    entry, at most a frame), ~1 MiB of requests read and held. Once: decoding a frame and
    building an answer (~3 frames). Plus 64 MiB of slack for what any load grows (the
    allocator's arenas, RocksDB's block cache and memtables)."""
    per_connection = 2 * FRAME_MAX + OUTPUT_MAX + 1 * MiB
    return connections * per_connection + 3 * FRAME_MAX + 64 * MiB


class Wire:
    """A blocking connection speaking raw frames (hypothesis runs synchronous tests)."""

    def __init__(self, address: str, *, hello: bool = True) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.decoder = FrameDecoder(64 * MiB)
        self.inbox: list[Any] = []
        if hello:
            self.send(HelloRequest(0, PROTOCOL_VERSION, "adversary"))
            assert self.recv().status == StatusCode.OK

    def send(self, *messages: Any) -> None:
        self.sock.sendall(b"".join(encode(m) for m in messages))

    def send_raw(self, body: bytes) -> None:
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def recv(self) -> Any:
        while not self.inbox:
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError("the bookie closed the connection")
            self.inbox += self.decoder.feed(data)
        return self.inbox.pop(0)

    def closed_by_peer(self, timeout_s: float = 10.0) -> bool:
        self.sock.settimeout(timeout_s)
        try:
            while self.sock.recv(1 << 20):
                pass
        except TimeoutError:
            return False
        except ConnectionError:
            pass
        return True

    def close(self) -> None:
        self.sock.close()


def add_request(rid: int, ledger_id: int, entry_id: int, payload: bytes) -> AddRequest:
    digest = entry_digest(ledger_id, entry_id, entry_id - 1, payload)
    return AddRequest(rid, ledger_id, entry_id, 0, KEY, entry_id - 1, payload, digest)


class Target:
    """The bookie under attack, what it acknowledged, and its idle RSS."""

    def __init__(self, process: BookieProcess, acked: dict[int, bytes], idle_rss: int) -> None:
        self.process, self.acked, self.idle_rss = process, acked, idle_rss
        self.address = process.address
        self.pid = process.proc.pid  # type: ignore[union-attr]
        self.peak_rss = idle_rss

    def assert_healthy(self, hostile_connections: int = 1) -> None:
        """Serving, within its memory bound, and every acknowledged entry reads back."""
        assert self.process.running, "the bookie died"
        rss = rss_bytes(self.pid)
        self.peak_rss = max(self.peak_rss, rss)
        assert rss - self.idle_rss <= memory_bound(hostile_connections), (rss, self.idle_rss)
        wire = Wire(self.address)
        try:
            wire.send(BookieInfoRequest(1))
            assert wire.recv().status == StatusCode.OK
            for entry_id, payload in self.acked.items():
                wire.send(ReadRequest(2, ACKED_LEDGER, entry_id, 0, None, -1, 0))
                answer = wire.recv()
                assert answer.status == StatusCode.OK and answer.payload == payload, entry_id
        finally:
            wire.close()


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Iterator[Target]:
    root = tmp_path_factory.mktemp("hostile")
    process = BookieProcess(
        root, "rocksdb", "--set", f"connection_output_bytes_max={OUTPUT_MAX}",
        "--set", f"connection_idle_timeout_s={IDLE_S}", "--set", f"frame_bytes_max={FRAME_MAX}",
    ).start()  # fmt: skip
    try:
        payloads = {e: os.urandom(100 + 37 * e) for e in range(20)}
        payloads[20] = os.urandom(BIG)
        payloads[21] = os.urandom(256 * 1024)
        wire = Wire(process.address)
        for entry_id, payload in payloads.items():
            wire.send(add_request(entry_id, ACKED_LEDGER, entry_id, payload))
            assert wire.recv().status == StatusCode.OK
        wire.close()
        target = Target(process, payloads, 0)
        target.assert_healthy()  # warm: the reads' buffers exist before the baseline
        time.sleep(0.2)
        target.idle_rss = target.peak_rss = rss_bytes(target.pid)
        yield target
        target.assert_healthy()
        assert process.stop(30) == 0  # and it still shuts down cleanly
    finally:
        process.kill()


# --- every field of every operation, wrong types and out-of-range values -----------------

REQUESTS: dict[type, list[Any]] = {  # a valid instance's fields after the request id
    AddRequest: [ACKED_LEDGER + 100, 0, 0, KEY, -1, b"p", 0],
    ReadRequest: [ACKED_LEDGER, 0, 0, None, -1, 0],
    ReadLacRequest: [ACKED_LEDGER, 0, None],
    WriteLacRequest: [ACKED_LEDGER + 100, KEY, 0, 0],
    ListEntriesRequest: [ACKED_LEDGER, 0, 10],
    BookieInfoRequest: [],
    AddBatchRequest: [ACKED_LEDGER + 100, 0, KEY, b""],
    MultiAddRequest: [[]],
    ScrubRequest: [False],
    LedgerRecordsRequest: [0, 10],
    ReadBatchRequest: [ACKED_LEDGER, 0, 10, 0, None, 1 << 20],
}
WRONG_TYPES = st.one_of(
    st.text(max_size=8), st.binary(max_size=8), st.floats(allow_nan=True), st.none(),
    st.booleans(), st.lists(st.integers(-(2**63), 2**64 - 1), max_size=3), st.just({"a": 1}),
    st.just(msgpack.ExtType(5, b"x")), st.integers(2**63, 2**64 - 1),
    st.recursive(st.none(), lambda inner: st.lists(inner, max_size=2), max_leaves=8),
)  # fmt: skip
OUT_OF_RANGE = st.one_of(
    st.integers(-(2**63), -1), st.just(2**63 - 1), st.just(-1), st.just(0),
    st.binary(min_size=19, max_size=21), st.just(b""),
)  # fmt: skip


def _never_valid(cls: type, value: Any) -> bool:
    """A value no field of these requests takes (a list only a multi-add's parts)."""
    return type(value) in (str, float, dict, msgpack.ExtType) or (
        type(value) is list and cls is not MultiAddRequest
    )


def _encode_fields(op: int, rid: int, fields: list[Any]) -> bytes:
    return msgpack.packb([op, rid, *fields], use_bin_type=True)


@pytest.fixture(scope="module")
def wire(target) -> Iterator[Wire]:
    wire = Wire(target.address)
    yield wire
    wire.close()


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())  # fmt: skip
def test_every_field_of_every_operation_with_wrong_types_and_out_of_range_values(
    target, wire, data
):
    cls = data.draw(st.sampled_from(sorted(REQUESTS, key=lambda c: c.OP)), label="op")
    fields = list(REQUESTS[cls])
    rid = data.draw(st.integers(0, 2**63 - 1), label="request id")
    modes = ["type", "range", "count", "op"] if fields else ["count", "op"]
    mode = data.draw(st.sampled_from(modes), label="mode")
    op = cls.OP
    if mode == "op":  # a response's op, an unknown one, a hello again
        op = data.draw(st.sampled_from([1, 0, 100, 0x42, 0x81, 0x82, 0x89, 0xFF, 300, -1]))
    elif mode == "count":
        fields = [*fields, 0] if data.draw(st.booleans()) or not fields else fields[:-1]
    else:
        index = data.draw(st.integers(0, len(fields) - 1), label="field")
        fields[index] = data.draw(WRONG_TYPES if mode == "type" else OUT_OF_RANGE, label="value")
    wire.send_raw(_encode_fields(op, rid, fields))
    answer = wire.recv()
    assert answer.request_id == rid  # always answered, and named
    assert answer.status in KNOWN_STATUSES and answer.status != StatusCode.IO_ERROR, answer
    if (mode == "type" and _never_valid(cls, fields[index])) or mode == "op":
        assert answer.status == StatusCode.BAD_REQUEST, answer
    wire.send(BookieInfoRequest(rid))  # the connection stays usable
    assert wire.recv().status == StatusCode.OK


def test_after_the_field_attack_the_bookie_is_healthy(target):
    target.assert_healthy()


@pytest.mark.parametrize(
    "fields", [[PROTOCOL_VERSION], [PROTOCOL_VERSION, "x", 1], ["3", "x"], [PROTOCOL_VERSION, b"x"],
               [2**63 - 1, "x"], [PROTOCOL_VERSION, "x" * 70_000], [[[]], "x"]],
)  # fmt: skip
def test_a_first_frame_that_is_not_a_good_hello_is_refused_and_closed(target, fields):
    hostile = Wire(target.address, hello=False)
    hostile.send_raw(msgpack.packb([HelloRequest.OP, 5, *fields]))
    answer = hostile.recv()
    assert answer.status in (StatusCode.BAD_REQUEST, StatusCode.BAD_VERSION)
    assert hostile.closed_by_peer()
    target.assert_healthy()


# --- nesting, oversize headers, frames that decode to huge work ----------------------------


@pytest.mark.parametrize("depth", [100, 1000, 1024, 5000])
def test_nested_arrays_in_a_field_are_answered(target, wire, depth):
    body = b"\x95\x04\xcd\x01\x01" + b"\x91" * depth + b"\xc0\x00\xc0"
    wire.send_raw(body)
    answer = wire.recv()
    assert type(answer) is ErrorResponse and answer.request_id == 257
    target.assert_healthy()


@pytest.mark.parametrize("length", [0, FRAME_MAX + 1, 2**32 - 1])
def test_an_oversize_or_empty_header_closes_that_connection_only(target, length):
    hostile = Wire(target.address)
    hostile.sock.sendall(struct.pack(">I", length) + b"\x00" * 64)
    answer = hostile.recv()
    assert type(answer) is ErrorResponse and answer.status == StatusCode.BAD_REQUEST
    assert hostile.closed_by_peer()
    target.assert_healthy()


@pytest.mark.parametrize("name", list(HUGE_WORK))
def test_a_frame_that_decodes_to_huge_work_is_bounded(target, wire, name):
    body = HUGE_WORK[name]
    assert len(body) <= FRAME_MAX
    for _ in range(3):
        wire.send_raw(body)
        answer = wire.recv()
        assert (answer.request_id == 9 and answer.status != StatusCode.OK) or (
            type(answer).__name__ == "MultiAddResponse"
        ), answer
    target.assert_healthy()


# --- clients that never read, slowloris ---------------------------------------------------


def test_clients_that_never_read_cost_a_bounded_output(target):
    hogs = [Wire(target.address) for _ in range(4)]
    try:
        for hog in hogs:  # each asks for 8 GiB of answers: 2,000 reads of the 4 MiB entry
            hog.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reads = b"".join(encode(ReadRequest(i, ACKED_LEDGER, 20, 0, None, -1, 0))
                             for i in range(2000))  # fmt: skip
            hog.sock.setblocking(False)
            try:
                hog.sock.send(reads)  # as much as the bookie takes: it stops reading
            except BlockingIOError:
                pass
        time.sleep(1.0)
        target.assert_healthy(hostile_connections=len(hogs))
    finally:
        for hog in hogs:
            hog.close()
    time.sleep(0.5)
    target.assert_healthy()


def test_slowloris_connections_are_closed(target):
    async def scenario() -> list[bool]:
        host, port = target.address.rsplit(":", 1)
        conns = [await asyncio.open_connection(host, int(port)) for _ in range(20)]
        for _, writer in conns:  # greeted, then a frame of 1000 bytes, a byte at a time
            writer.write(
                encode(HelloRequest(1, PROTOCOL_VERSION, "slow")) + struct.pack(">I", 1000)
            )

        async def trickle() -> None:
            for _ in range(int(IDLE_S * 40)):
                for _, writer in conns:
                    writer.write(b"\x00")
                await asyncio.sleep(0.1)

        task = asyncio.ensure_future(trickle())
        try:
            async with asyncio.timeout(IDLE_S * 4):
                closed = []
                for reader, _ in conns:
                    while await reader.read(1 << 16):
                        pass
                    closed.append(True)
                return closed
        finally:
            task.cancel()
            for _, writer in conns:
                writer.close()

    assert asyncio.run(scenario()) == [True] * 20
    target.assert_healthy()


def test_the_peak_rss_under_attack_is_reported(target, capsys):
    grown = (target.peak_rss - target.idle_rss) / MiB
    with capsys.disabled():
        print(f"\nbookie RSS idle {target.idle_rss / MiB:.1f} MiB, peak under attack "
              f"{target.peak_rss / MiB:.1f} MiB (+{grown:.1f})")  # fmt: skip
    assert target.peak_rss - target.idle_rss <= memory_bound(4)
