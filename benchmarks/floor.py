"""``floor``: adds through minimal servers doing the journal's I/O — this machine's floor.

    python -m benchmarks floor --adds 5000 --entry-size 1024 --ack-quorum 2 --json out.json
    python -m benchmarks floor --rate 10000 --duration 5      # the open loop's floor

Three minimal uvloop servers (processes, loopback TCP) each append what they receive to a
preallocated O_DIRECT file with the journal's own ``BlockWriter`` (one ``pwrite`` of whole 4 KiB
blocks, rewriting the partial last one) and an ``fdatasync``, on a journal thread with the
bookie journal's hand-offs (a deque and an eventfd each way, docs/performance.md at e27bdd3,
twelfth round) and its GIL switch interval, or ``--inline`` on the event loop; then they answer
with the request's sequence number. The journal thread commits in
groups, as the bookie's does: it writes everything queued when it wakes (up to
``BATCH_BYTES_MAX``, the bookie's ``journal_batch_bytes_max``) with one ``pwrite`` and one
``fdatasync``; ``--inline`` commits what one read from the socket brought. The file is zeroed
before the run and rewritten from its start, as a journal's recycled file is. No protocol, no
digests, no storage engine, no metadata.

A client sends each entry to all three and counts it done at ``--ack-quorum`` answers. By
default it sends one entry at a time and waits for *that* entry: what one add outstanding costs
on this machine before our request path runs; ``writes --outstanding 1`` divided by this is our
overhead (docs/performance.md at e27bdd3, tenth round). The first fifth of the adds is not
measured (warm-up). With ``--rate R`` it is the open loop of ``writes --rate R``
(benchmarks/load.py: entry *i* sent at ``start + i / R``, latency from that time) for
``--duration`` seconds after a fifth of that as warm-up: what this disk's fdatasyncs, shared by
three processes syncing in groups, leave of ``writes --rate R``'s percentiles before our request
path, our engine and our client run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from bookkeeper_aio.direct_io import BlockWriter, open_file, write_zeros

from .load import Done, open_loop
from .stats import latency_summary, print_table, write_json

FILE_BYTES = 8 << 20  # preallocated with real zeros and rewritten from the start when full
SEQ_BYTES = 8  # a message starts with its sequence number, then its size
ENTRY_BYTES_MAX = 1 << 20  # well inside the file
SERVERS = 3
START_TIMEOUT_S = 15.0
ADD_TIMEOUT_S = 5.0
BATCH_BYTES_MAX = 512 << 10  # one group commit at most (the bookie's journal_batch_bytes_max)
OPEN_LOOP_OUTSTANDING_MAX = 100_000  # the open loop's bound on entries awaiting answers


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--adds", type=int, default=5000, metavar="N", help="adds, one at a time")
    p.add_argument("--entry-size", type=int, default=1024, metavar="B")
    p.add_argument("--ack-quorum", type=int, default=2, metavar="A", help="answers awaited (of 3)")
    p.add_argument("--inline", action="store_true", help="write and sync on the event loop")
    p.add_argument(
        "--rate", type=float, default=None, metavar="R",
        help="an open loop at R entries/s instead of one add at a time",
    )  # fmt: skip
    p.add_argument("--duration", type=float, default=5.0, metavar="S", help="the open loop's")
    p.add_argument("--dir", metavar="DIR", help="where the servers' files go (tmp)")
    p.add_argument("--json", metavar="PATH")


# --- the server (a subprocess: python -m benchmarks.floor DIR INLINE) ----------------------


def serve(directory: str, inline: bool) -> None:
    """Listen on an ephemeral loopback port (printed on stdout), append and sync the messages
    in groups (module docstring), answer each with its first ``SEQ_BYTES``; until stdin
    closes."""
    import uvloop

    from bookkeeper_aio.config import BookieConfig

    # The bookie's GIL switch interval: its journal thread's hand-offs, not Python's default 5 ms.
    sys.setswitchinterval(BookieConfig().gil_switch_interval_s)
    path = Path(directory) / f"floor-{os.getpid()}.log"
    fd, _ = open_file(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC)
    write_zeros(fd, 0, FILE_BYTES)
    os.fsync(fd)
    writer = BlockWriter(fd)

    def append(messages: list[bytes]) -> None:
        """One group commit: one pwrite of every message, one fdatasync."""
        nonlocal writer
        size = sum(map(len, messages))
        if writer.position + size > FILE_BYTES:  # stay inside the preallocated zeros
            writer.close()
            writer = BlockWriter(fd)
        writer.append(messages, writer.position)
        os.fdatasync(fd)

    def answer(transport: asyncio.Transport, messages: list[bytes]) -> None:
        if not transport.is_closing():  # the client may be gone before the last answers
            transport.write(b"".join(m[:SEQ_BYTES] for m in messages))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        # The bookie journal's hand-offs (bookkeeper_aio/bookie/journal.py): a deque each way,
        # each with an eventfd that wakes its reader, written without the GIL.
        records: collections.deque[tuple[bytes, asyncio.Transport]] = collections.deque()
        written: collections.deque[tuple[asyncio.Transport, list[bytes]]] = collections.deque()
        records_fd = os.eventfd(0, os.EFD_CLOEXEC)
        wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        idle = [False]  # the thread sleeps on records_fd: the next put writes it

        def put(item: tuple[bytes, asyncio.Transport]) -> None:
            records.append(item)
            if idle[0]:
                idle[0] = False
                os.eventfd_write(records_fd, 1)

        def journal() -> None:
            # One client connection per server, so one transport answers a whole group.
            while True:
                while not records:
                    idle[0] = True  # before the check: a put after it writes the fd
                    if records:
                        idle[0] = False
                        break
                    os.eventfd_read(records_fd)
                data, transport = records.popleft()
                group, size = [data], len(data)
                while size < BATCH_BYTES_MAX and records:
                    data, _ = records.popleft()
                    group.append(data)
                    size += len(data)
                append(group)
                written.append((transport, group))
                os.eventfd_write(wake_fd, 1)

        def on_wake() -> None:
            try:
                os.eventfd_read(wake_fd)
            except BlockingIOError:
                pass  # read already by the wake-up that took the groups now answered
            while written:
                answer(*written.popleft())

        loop.add_reader(wake_fd, on_wake)
        threading.Thread(target=journal, daemon=True).start()

        class Server(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.transport: asyncio.Transport = transport  # type: ignore[assignment]
                self.pending = b""

            def data_received(self, data: bytes) -> None:
                # The client sends fixed-size messages: the first SEQ_BYTES hold the size.
                data = self.pending + data
                received = []
                while len(data) >= SEQ_BYTES * 2:
                    size = int.from_bytes(data[SEQ_BYTES : SEQ_BYTES * 2], "little")
                    if not SEQ_BYTES * 2 <= size <= ENTRY_BYTES_MAX:
                        self.transport.close()  # not our client: stop reading it
                        return
                    if len(data) < size:
                        break
                    message, data = data[:size], data[size:]
                    if inline:
                        received.append(message)
                    else:
                        put((message, self.transport))
                self.pending = data
                if received:  # one read's worth: uvloop reads at most 256 KiB at a time
                    append(received)
                    answer(self.transport, received)

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
    """Start the servers, add one entry at a time (or the open loop at ``--rate``), stop them;
    print (unless ``quiet``) and return the result."""
    if not 1 <= args.ack_quorum <= SERVERS:
        raise SystemExit(f"--ack-quorum must be 1..{SERVERS}")
    if not SEQ_BYTES * 2 <= args.entry_size <= ENTRY_BYTES_MAX:
        raise SystemExit(f"--entry-size must be {SEQ_BYTES * 2}..{ENTRY_BYTES_MAX}")
    if args.rate is not None and not (args.rate > 0 and args.duration > 0):
        raise SystemExit("--rate and --duration must be > 0")
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
            if args.rate is not None:
                result = await _open_client(ports, args)
            else:
                result = _one_at_a_time(await _client(ports, args), args)
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
    result = {
        "system": f"floor ({'inline' if args.inline else 'journal thread'}) A{args.ack_quorum}/3",
        **result,
    }
    if not quiet:
        load = f"open loop at {args.rate:g}/s" if args.rate else "one add at a time"
        print_table(f"{load}, minimal servers (no request path)", [result])
    write_json(args.json, result)
    return result


def _one_at_a_time(latencies: list[float], args: argparse.Namespace) -> dict[str, Any]:
    elapsed = sum(latencies)
    return {
        "entries_per_s": len(latencies) / elapsed if elapsed else 0.0,
        "mb_per_s": len(latencies) * args.entry_size / elapsed / 1e6 if elapsed else 0.0,
        **latency_summary(latencies),
    }


class _Answers(asyncio.Protocol):
    """A client's connection to one server: ``on_answer(seq)`` for each answer."""

    def __init__(self, on_answer: Callable[[int], None]) -> None:
        self.on_answer = on_answer
        self.pending = b""

    def data_received(self, data: bytes) -> None:
        data = self.pending + data
        usable = len(data) - len(data) % SEQ_BYTES
        for i in range(0, usable, SEQ_BYTES):
            self.on_answer(int.from_bytes(data[i : i + SEQ_BYTES], "little"))
        self.pending = data[usable:]


@contextlib.asynccontextmanager
async def _connections(
    ports: list[int], on_answer: Callable[[int], None]
) -> AsyncIterator[list[asyncio.Transport]]:
    """One connection to each server, closed on the way out."""
    loop = asyncio.get_running_loop()
    transports: list[asyncio.Transport] = []
    try:
        for port in ports:
            transport, _ = await loop.create_connection(
                lambda: _Answers(on_answer), "127.0.0.1", port
            )
            transports.append(transport)
        yield transports
    finally:
        for transport in transports:
            transport.close()


def _message(seq: int, entry_size: int, body: bytes) -> bytes:
    return seq.to_bytes(SEQ_BYTES, "little") + entry_size.to_bytes(SEQ_BYTES, "little") + body


async def _client(ports: list[int], args: argparse.Namespace) -> list[float]:
    loop = asyncio.get_running_loop()
    state: dict[str, Any] = {"seq": -1, "acks": 0, "done": None}

    def answered(seq: int) -> None:
        if seq == state["seq"]:  # answers to earlier adds are ignored
            state["acks"] += 1
            done = state["done"]
            if state["acks"] >= args.ack_quorum and done is not None and not done.done():
                done.set_result(None)

    body = os.urandom(args.entry_size - SEQ_BYTES * 2)
    latencies: list[float] = []
    async with _connections(ports, answered) as transports:
        for seq in range(args.adds):
            message = _message(seq, args.entry_size, body)
            state.update(seq=seq, acks=0, done=loop.create_future())
            start = time.perf_counter()
            for transport in transports:
                transport.write(message)
            async with asyncio.timeout(ADD_TIMEOUT_S):
                await state["done"]
            latencies.append(time.perf_counter() - start)
    return latencies[len(latencies) // 5 :]


async def _open_client(ports: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """The open loop of ``writes --rate`` (a warm-up of a fifth of ``--duration``, then the
    measured phase) against the servers; the load's summary, timeline included."""
    waiting: dict[int, list[Any]] = {}  # seq -> [answers so far, done]

    def answered(seq: int) -> None:
        entry = waiting.get(seq)
        if entry is None:  # its quorum answered already
            return
        entry[0] += 1
        if entry[0] >= args.ack_quorum:
            del waiting[seq]
            entry[1](None, None)

    body = os.urandom(args.entry_size - SEQ_BYTES * 2)
    seqs = iter(range(1 << 62))
    async with _connections(ports, answered) as transports:

        def send(done: Done) -> int:
            seq = next(seqs)
            message = _message(seq, args.entry_size, body)
            waiting[seq] = [0, done]
            for transport in transports:
                transport.write(message)
            return seq

        bound, timeout = OPEN_LOOP_OUTSTANDING_MAX, ADD_TIMEOUT_S
        warmup = args.duration / 5
        await open_loop(send, args.rate, warmup, bound, drain_timeout_s=timeout, callbacks=True)
        load = await open_loop(
            send, args.rate, args.duration, bound, drain_timeout_s=timeout, callbacks=True
        )
    return {"rate": args.rate, "duration_s": args.duration, **load.summary(args.entry_size)}


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2] == "1")
