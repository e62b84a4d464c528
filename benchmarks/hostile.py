"""``hostile``: a bookie's memory under clients that ask for answers and never read them.

    python -m benchmarks hostile --connections 1,4,16,64 --entry-bytes 4194304

One bookie process (``--engine``, its default config unless ``--bookie-set KEY=VALUE``) gets
one entry of ``--entry-bytes``. Its RSS (``/proc/PID/status`` VmRSS) is read idle; then for
each count in ``--connections`` that many connections each send ``--reads`` reads of that
entry (the biggest answer there is: ``--reads`` x ``--entry-bytes`` of answers asked for)
with a 4 KiB receive buffer, and never read. After ``--settle`` seconds the RSS is read
again, the connections are closed, and the next count runs. A second phase does the same with
connections that each pipeline adds of ``--add-bytes`` without reading the answers, and a
third with connections that each send the worst frames of tests/test_hostile_process.py (a
frame that decodes to huge work) in a loop. ``per_connection_mib`` is the RSS growth over
idle divided by the connections: what docs/operations.md's bound has to cover.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack

from bookkeeper_aio.digest import entry_digest, master_key, payload_digest
from bookkeeper_aio.protocol import (
    ADD_ENTRY_HEAD,
    PROTOCOL_VERSION,
    AddRequest,
    HelloRequest,
    ReadRequest,
    encode,
)
from bookkeeper_aio.sandbox import BookieProcess

from .stats import print_table, write_json

MiB = 1 << 20
KEY = master_key(b"hostile")

# Frames that decode to huge work: what tests/test_hostile_process.py sends a bookie, and the
# third phase here. Each is at most 5 MiB (the default frame_bytes_max).


def tiny_entries(count: int) -> bytes:
    """``count`` packed entries of no payload and a wrong digest: work, nothing stored."""
    head = ADD_ENTRY_HEAD.pack(0, 24, -1, payload_digest(b""), 0)
    return head * count


def tree(leaf: bytes, width: int, depth: int) -> bytes:
    """Arrays ``width`` wide nested ``depth`` deep with ``leaf`` at the bottom."""
    header = bytes([0x90 | width]) if width < 16 else b"\xdc" + width.to_bytes(2, "big")
    body = leaf
    for _ in range(depth):
        body = header + body * width
    return body


def request(op: int, field: bytes) -> bytes:
    """``[op, 9, field]`` with ``field`` already encoded."""
    return bytes([0x93, op, 9]) + field


HUGE_WORK = {
    "a million-part multi-add": request(9, b"\xdd" + (1 << 20).to_bytes(4, "big")
                                         + b"\x91\x02" * (1 << 20)),
    "a multi-add of 1024 parts of 1024 empty arrays": request(9, tree(b"\x90", 1024, 2)),
    "empty arrays, 15 wide, 5 deep": request(2, tree(b"\x90", 15, 5)),
    "2-character strings, 15 wide, 5 deep": request(2, tree(b"\xa2ab", 15, 5)),
    "uint16s, 15 wide, 5 deep, in a multi-add": request(9, tree(b"\xcd\x01\x02", 15, 5)),
    "uint16s in arrays nested 1000 deep": request(
        9, (b"\xdc\x04\x00" + b"\xcd\x01\x02" * 1023) * 1000 + b"\xc0"),
    "an add batch of 140k entries": msgpack.packb(
        [8, 9, 200, 0, KEY, tiny_entries(140_000)], use_bin_type=True),
    "a multi-add of 1024 batches, 122k entries": msgpack.packb(
        [9, 9, [[8, 201 + i, 0, KEY, tiny_entries(120)] for i in range(1024)]],
        use_bin_type=True),
}  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--connections", default="1,4,16,64", metavar="N,N,...")
    p.add_argument("--entry-bytes", type=int, default=4 * MiB, metavar="B")
    p.add_argument("--reads", type=int, default=2000, metavar="N", help="per connection")
    p.add_argument("--add-bytes", type=int, default=1 * MiB, metavar="B")
    p.add_argument("--settle", type=float, default=2.0, metavar="S")
    p.add_argument("--engine", default="rocksdb", choices=("rocksdb", "files", "memory"))
    p.add_argument("--bookie-set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--dir", metavar="DIR", help="where the bookie writes (tmp)")
    p.add_argument("--json", metavar="PATH")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kib = int(next(line for line in f if line.startswith("VmRSS:")).split()[1])
    return kib / 1024


def _connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.sendall(encode(HelloRequest(0, PROTOCOL_VERSION, "hostile")))
    sock.recv(4096)
    sock.setblocking(False)
    return sock


def _push(sock: socket.socket, data: bytes) -> None:
    """Send what the bookie takes now (it stops reading once its answers back up)."""
    try:
        sock.send(data)
    except (BlockingIOError, ConnectionError):
        pass


def _reads(count: int) -> bytes:
    return b"".join(encode(ReadRequest(i, 1, 0, 0, None, -1, 0)) for i in range(count))


def _adds(ledger_id: int, size: int, count: int) -> bytes:
    payload = os.urandom(size)
    digests = [entry_digest(ledger_id, e, e - 1, payload) for e in range(count)]
    adds = [AddRequest(e, ledger_id, e, 0, KEY, e - 1, payload, digests[e]) for e in range(count)]
    return b"".join(map(encode, adds))


def _frames() -> bytes:
    return b"".join(struct.pack(">I", len(body)) + body for body in HUGE_WORK.values())


def _phase(
    bookie: BookieProcess, name: str, counts: list[int], load: Any, settle_s: float
) -> list[dict[str, Any]]:
    pid = bookie.proc.pid  # type: ignore[union-attr]
    rows = []
    for count in counts:
        time.sleep(0.5)
        idle = rss_mib(pid)
        socks = [_connect(bookie.address) for _ in range(count)]
        try:
            deadline = time.monotonic() + settle_s
            for index, sock in enumerate(socks):
                _push(sock, load(index))
            peak = idle
            while time.monotonic() < deadline:
                for index, sock in enumerate(socks):
                    if name == "frames":
                        _push(sock, load(index))  # again and again
                peak = max(peak, rss_mib(pid))
                time.sleep(0.05)
            assert bookie.running, "the bookie died"
        finally:
            for sock in socks:
                sock.close()
        grown = peak - idle
        rows.append({"clients": name, "connections": count, "idle_rss_mib": round(idle, 1),
                     "peak_rss_mib": round(peak, 1), "grown_mib": round(grown, 1),
                     "per_connection_mib": round(grown / count, 2)})  # fmt: skip
    return rows


async def run_hostile(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start the bookie, run the three phases, print one table."""
    root = Path(args.dir or tempfile.mkdtemp(prefix="bk-hostile-"))
    extra = [item for kv in args.bookie_set for item in ("--set", kv)]
    bookie = BookieProcess(root, args.engine, *extra).start()
    try:
        sock = _connect(bookie.address)
        sock.setblocking(True)
        payload = os.urandom(args.entry_bytes)
        sock.sendall(encode(AddRequest(1, 1, 0, 0, KEY, -1, payload,
                                       entry_digest(1, 0, -1, payload))))  # fmt: skip
        sock.recv(4096)
        sock.close()
        counts = [int(n) for n in args.connections.split(",")]
        reads, settle = _reads(args.reads), args.settle
        rows = await asyncio.to_thread(_phase, bookie, "never read", counts, lambda i: reads,
                                       settle)  # fmt: skip
        rows += await asyncio.to_thread(
            _phase, bookie, "adds, unread", counts,
            lambda i: _adds(1000 + i, args.add_bytes, 64), settle,
        )  # fmt: skip
        frames = _frames()
        rows += await asyncio.to_thread(_phase, bookie, "frames", counts[:2], lambda i: frames,
                                        settle)  # fmt: skip
        assert bookie.stop(30) == 0
    finally:
        bookie.kill()
    print_table(f"hostile: bookie RSS, {args.reads} unread reads of a {args.entry_bytes} B entry "
                "per connection", rows)  # fmt: skip
    write_json(args.json, {"rows": rows})
    return rows
