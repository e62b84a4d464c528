"""A local cluster of real processes: bookies (and, with the metadata store, etcd).

What ``make run``, the benchmarks and the end-to-end tests start. Every process gets its own
dirs under one root and a free port on 127.0.0.1; :class:`BookieProcess` is a thin handle over
``python -m bookkeeper_aio.bookie`` with start / kill -9 / SIGTERM, and :func:`bookies` is a
context manager that never leaves a process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(address: str, proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    """Poll until ``address`` accepts a TCP connection.

    Raises:
        RuntimeError: the process exited (its log tail is in the message).
        TimeoutError: still not listening after ``timeout_s``.
    """
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited {proc.returncode}:\n{_tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), 0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"{address} not listening after {timeout_s}s:\n{_tail(log)}")


async def wait_registered(uri: str, count: int, timeout_s: float = 30.0) -> None:
    """Wait until ``count`` bookies are registered at ``uri``.

    Raises:
        TimeoutError: fewer after ``timeout_s``.
    """
    from .metadata.store import open_metadata_store

    deadline = time.monotonic() + timeout_s
    async with open_metadata_store(uri) as store:
        while len(await store.list_bookies()) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {count} bookies registered at {uri}")
            await asyncio.sleep(0.05)


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"


class BookieProcess:
    """``python -m bookkeeper_aio.bookie`` with its own dirs under ``root``."""

    def __init__(self, root: Path, engine: str = "rocksdb", *extra: str) -> None:
        self.root = Path(root)
        self.engine = engine
        self.extra = list(extra)
        self.address = f"127.0.0.1:{free_port()}"
        self.log = self.root / "bookie.log"
        self.proc: subprocess.Popen | None = None
        self.root.mkdir(parents=True, exist_ok=True)

    def args(self) -> list[str]:
        """The command line."""
        return [
            sys.executable, "-m", "bookkeeper_aio.bookie",
            "--listen", self.address,
            "--journal-dir", str(self.root / "journal"),
            "--ledger-dir", str(self.root / "ledgers"),
            "--engine", self.engine,
            *self.extra,
        ]  # fmt: skip

    def start(self, timeout_s: float = 30.0) -> BookieProcess:
        """Start the process and wait until it listens."""
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.args(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            wait_listening(self.address, self.proc, self.log, timeout_s)
        except BaseException:
            self.kill()  # never leave a half-started process behind
            raise
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9: no chance to flush anything (also resumes a stopped process first)."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait; return the exit status (SIGKILL after the timeout)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def signal(self, sig: int) -> None:
        """Send a signal (SIGSTOP/SIGCONT freeze and thaw it)."""
        assert self.proc is not None
        os.kill(self.proc.pid, sig)


@contextlib.contextmanager
def autorecovery_process(
    uri: str, log_path: Path, settings: tuple[str, ...] = (), *extra: str
) -> Iterator[subprocess.Popen]:
    """``python -m bookkeeper_aio.autorecovery --metadata URI --set KEY=VALUE...`` logging to
    ``log_path``; stopped on exit (SIGTERM, then SIGKILL)."""
    sets = [arg for item in settings for arg in ("--set", item)]
    cmd = [sys.executable, "-m", "bookkeeper_aio.autorecovery", "--metadata", uri, *sets, *extra]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def bookies(root: Path, count: int, engine: str = "rocksdb", *extra: str) -> Iterator[list]:
    """Start ``count`` bookie processes; kill whatever is left at the end."""
    procs = [BookieProcess(Path(root) / f"bookie-{i}", engine, *extra) for i in range(count)]
    try:
        for p in procs:
            p.start()
        yield procs
    finally:
        for p in procs:
            p.kill()


class Cluster:
    """etcd + ``bookies`` bookie processes registered in it: what ``make run`` starts.

    Use as a context manager; :attr:`uri` is the metadata URI clients connect to.
    """

    def __init__(self, root: Path, bookies: int = 3, engine: str = "rocksdb", *extra: str):
        from .etcd_server import EtcdServer

        self.root = Path(root)
        self.etcd = EtcdServer(self.root / "etcd")
        self.uri = self.etcd.uri("bookkeeper")
        self.bookies = [
            BookieProcess(
                self.root / f"bookie-{i}",
                engine,
                "--metadata",
                self.uri,
                "--set",
                "lease_ttl_s=3",
                *extra,
            )
            for i in range(bookies)
        ]

    def start(self) -> Cluster:
        """Start etcd, initialize the cluster, start every bookie."""
        import asyncio

        from .metadata.store import open_metadata_store

        self.etcd.start()

        async def init() -> None:
            async with open_metadata_store(self.uri) as store:
                await store.init_cluster()

        asyncio.run(init())
        for bookie in self.bookies:
            bookie.start()
        # A bookie listens before it registers: a client started right away could find too
        # few bookies to create a ledger.
        asyncio.run(wait_registered(self.uri, len(self.bookies)))
        return self

    def stop(self) -> None:
        """Stop bookies (SIGTERM, then kill), then etcd."""
        for bookie in self.bookies:
            if bookie.running:
                bookie.stop(10)
        self.etcd.stop()

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m bookkeeper_aio.sandbox --bookies N``: run a local cluster until Ctrl-C."""
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(
        prog="python -m bookkeeper_aio.sandbox", description=main.__doc__
    )
    parser.add_argument("--bookies", type=int, default=3)
    parser.add_argument("--engine", default="rocksdb", choices=("rocksdb", "files"))
    parser.add_argument("--dir", help="where data goes (default: a temporary dir)")
    args = parser.parse_args(argv)
    root = Path(args.dir or tempfile.mkdtemp(prefix="bookkeeper-aio-sandbox-"))
    with Cluster(root, args.bookies, args.engine) as cluster:
        # sigwait only returns for blocked signals (unblocked, SIGTERM killed this process and
        # left the cluster running), and never for ignored ones (a shell's background job
        # ignores SIGINT). Blocked only now: the servers started above keep default masks.
        # And before "running" is printed: a signal sent as soon as that line appears was
        # lost (SIGINT still ignored) or killed us (SIGTERM) when the block came after it.
        stop = {signal.SIGINT, signal.SIGTERM}
        for signum in stop:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)
        print(f"metadata URI: {cluster.uri}", flush=True)
        for b in cluster.bookies:
            print(f"bookie {b.address}  (log {b.log})", flush=True)
        print("running; Ctrl-C stops everything", flush=True)
        signal.sigwait(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
