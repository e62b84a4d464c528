"""A gateway process for tests, benchmarks and local runs: ``python -m bookkeeper_aio.kafka``
with start / kill -9 / SIGTERM, like ``sandbox.BookieProcess``."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from ..sandbox import free_port, wait_listening


class GatewayProcess:
    """One gateway on 127.0.0.1 (a free port unless given), logging to ``root/gateway.log``."""

    def __init__(self, root: Path, metadata_uri: str, port: int | None = None, *extra: str):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.metadata_uri = metadata_uri
        self.address = f"127.0.0.1:{port or free_port()}"
        self.extra = list(extra)
        self.log = self.root / "gateway.log"
        self.proc: subprocess.Popen | None = None

    def args(self) -> list[str]:
        return [
            sys.executable, "-m", "bookkeeper_aio.kafka",
            "--metadata", self.metadata_uri, "--listen", self.address, *self.extra,
        ]  # fmt: skip

    def start(self, timeout_s: float = 30.0) -> GatewayProcess:
        """Start and wait until it listens (a restart keeps the address)."""
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                self.args(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            wait_listening(self.address, self.proc, self.log, timeout_s)
        except BaseException:
            self.kill()
            raise
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait (SIGKILL after the timeout); the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(10)
