"""``floor``: one add through minimal servers doing the journal's I/O — this machine's floor.

    python -m benchmarks floor --adds 5000 --entry-size 1024 --ack-quorum 2 --json out.json

Three minimal uvloop servers (processes, loopback TCP) each append what they receive to a
preallocated O_DIRECT file with the journal's own ``BlockWriter`` (one ``pwrite`` of whole 4 KiB
blocks, rewriting the partial last one) and an ``fdatasync``, on a journal thread
(``SimpleQueue`` in, ``call_soon_threadsafe`` out: the bookie's journal's hand-offs until
2026-11-24, now eventfds, docs/performance.md at e27bdd3, twelfth round), or ``--inline`` on the
event loop; then they answer with the request's sequence number. A client sends one entry at a
time to all three and waits for ``--ack-quorum`` answers to *that* entry. No protocol, no
digests, no storage engine, no metadata: what one add outstanding costs on this machine before
our request path runs. ``writes --outstanding 1`` divided by this is our overhead
(docs/performance.md at e27bdd3, tenth round). The first fifth of the adds is not measured
(warm-up).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bookkeeper_aio.direct_io import BlockWriter, open_file, write_zeros

from .stats import latency_summary, print_table, write_json

FILE_BYTES = 8 << 20  # preallocated with real zeros and rewritten from the start when full
SEQ_BYTES = 8  # a message starts with its sequence number, then its size
ENTRY_BYTES_MAX = 1 << 20  # well inside the file
SERVERS = 3
START_TIMEOUT_S = 15.0
ADD_TIMEOUT_S = 5.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--adds", type=int, default=5000, metavar="N", help="adds, one at a time")
    p.add_argument("--entry-size", type=int, default=1024, metavar="B")
    p.add_argument("--ack-quorum", type=int, default=2, metavar="A", help="answers awaited (of 3)")
    p.add_argument("--inline", action="store_true", help="write and sync on the event loop")
    p.add_argument("--dir", metavar="DIR", help="where the servers' files go (tmp)")
    p.add_argument("--json", metavar="PATH")


# --- the server (a subprocess: python -m benchmarks.floor DIR INLINE) ----------------------


def serve(directory: str, inline: bool) -> None:
    """Listen on an ephemeral loopback port (printed on stdout), append and sync each message,
    answer with its first ``SEQ_BYTES``; until stdin closes."""
    import uvloop

    path = Path(directory) / f"floor-{os.getpid()}.log"
    fd, _ = open_file(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC)
    write_zeros(fd, 0, FILE_BYTES)
    os.fsync(fd)
    writer = BlockWriter(fd)

    def append(data: bytes) -> None:
        nonlocal writer
        if writer.position + len(data) > FILE_BYTES:  # stay inside the preallocated zeros
            writer.close()
            writer = BlockWriter(fd)
        writer.append([data], writer.position)
        os.fdatasync(fd)

    def answer(transport: asyncio.Transport, message: bytes) -> None:
        if not transport.is_closing():  # the client may be gone before the last answers
            transport.write(message[:SEQ_BYTES])

    async def main() -> None:
        loop = asyncio.get_running_loop()
        records: queue.SimpleQueue[tuple[bytes, asyncio.Transport]] = queue.SimpleQueue()

        def journal() -> None:
            while True:
                data, transport = records.get()
                append(data)
                loop.call_soon_threadsafe(answer, transport, data)

        threading.Thread(target=journal, daemon=True).start()

        class Server(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.transport: asyncio.Transport = transport  # type: ignore[assignment]
                self.pending = b""

            def data_received(self, data: bytes) -> None:
                # The client sends fixed-size messages: the first SEQ_BYTES hold the size.
                data = self.pending + data
                while len(data) >= SEQ_BYTES * 2:
                    size = int.from_bytes(data[SEQ_BYTES : SEQ_BYTES * 2], "little")
                    if not SEQ_BYTES * 2 <= size <= ENTRY_BYTES_MAX:
                        self.transport.close()  # not our client: stop reading it
                        return
                    if len(data) < size:
                        break
                    message, data = data[:size], data[size:]
                    if inline:
                        append(message)
                        answer(self.transport, message)
                    else:
                        records.put((message, self.transport))
                self.pending = data

        server = await loop.create_server(Server, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await loop.run_in_executor(None, sys.stdin.read)  # the parent closes stdin to stop us

    try:
        uvloop.run(main())
    finally:
        writer.close()
        os.close(fd)
        path.unlink(missing_ok=True)


# --- the client ----------------------------------------------------------------------------


async def run_floor(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """Start the servers, add one entry at a time, stop them; print (unless ``quiet``) and
    return the result."""
    if not 1 <= args.ack_quorum <= SERVERS:
        raise SystemExit(f"--ack-quorum must be 1..{SERVERS}")
    if not SEQ_BYTES * 2 <= args.entry_size <= ENTRY_BYTES_MAX:
        raise SystemExit(f"--entry-size must be {SEQ_BYTES * 2}..{ENTRY_BYTES_MAX}")
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        argv = [sys.executable, "-m", "benchmarks.floor", directory, "1" if args.inline else "0"]
        pipe = asyncio.subprocess.PIPE
        procs = [
            await asyncio.create_subprocess_exec(*argv, stdin=pipe, stdout=pipe)
            for _ in range(SERVERS)
        ]
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                ports = [int(await p.stdout.readline()) for p in procs]  # type: ignore[union-attr]
            latencies = await _client(ports, args)
        finally:
            for p in procs:
                if p.stdin is not None:
                    p.stdin.close()
            for p in procs:
                try:
                    async with asyncio.timeout(5):
                        await p.wait()
                except TimeoutError:
                    p.kill()
                    await p.wait()
    elapsed = sum(latencies)
    result: dict[str, Any] = {
        "system": f"floor ({'inline' if args.inline else 'journal thread'}) A{args.ack_quorum}/3",
        "entries_per_s": len(latencies) / elapsed if elapsed else 0.0,
        "mb_per_s": len(latencies) * args.entry_size / elapsed / 1e6 if elapsed else 0.0,
        **latency_summary(latencies),
    }
    if not quiet:
        print_table("one add at a time, minimal servers (no request path)", [result])
    write_json(args.json, result)
    return result


async def _client(ports: list[int], args: argparse.Namespace) -> list[float]:
    loop = asyncio.get_running_loop()
    state: dict[str, Any] = {"seq": -1, "acks": 0, "done": None}

    class Client(asyncio.Protocol):
        def __init__(self) -> None:
            self.pending = b""

        def data_received(self, data: bytes) -> None:
            data = self.pending + data
            usable = len(data) - len(data) % SEQ_BYTES
            for i in range(0, usable, SEQ_BYTES):  # answers to earlier adds are ignored
                if int.from_bytes(data[i : i + SEQ_BYTES], "little") == state["seq"]:
                    state["acks"] += 1
                    done = state["done"]
                    if state["acks"] >= args.ack_quorum and done is not None and not done.done():
                        done.set_result(None)
            self.pending = data[usable:]

    transports = []
    try:
        for port in ports:
            transport, _ = await loop.create_connection(Client, "127.0.0.1", port)
            transports.append(transport)
        body = os.urandom(args.entry_size - SEQ_BYTES * 2)
        size = args.entry_size.to_bytes(SEQ_BYTES, "little")
        latencies: list[float] = []
        for seq in range(args.adds):
            message = seq.to_bytes(SEQ_BYTES, "little") + size + body
            state.update(seq=seq, acks=0, done=loop.create_future())
            start = time.perf_counter()
            for transport in transports:
                transport.write(message)
            async with asyncio.timeout(ADD_TIMEOUT_S):
                await state["done"]
            latencies.append(time.perf_counter() - start)
    finally:
        for transport in transports:
            transport.close()
    return latencies[len(latencies) // 5 :]


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2] == "1")
