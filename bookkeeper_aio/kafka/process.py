"""A gateway process for tests, benchmarks and local runs: ``python -m bookkeeper_aio.kafka``
with start / kill -9 / SIGTERM (``sandbox.BookieProcess``'s, with the gateway's command line)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..sandbox import BookieProcess


class GatewayProcess(BookieProcess):
    """One gateway on 127.0.0.1 (a free port unless given), logging to ``root/gateway.log``;
    a restart keeps its address."""

    def __init__(self, root: Path, metadata_uri: str, port: int | None = None, *extra: str):
        super().__init__(root, "rocksdb", *extra)
        self.metadata_uri = metadata_uri
        if port is not None:
            self.address = f"127.0.0.1:{port}"
        self.log = self.root / "gateway.log"

    def args(self) -> list[str]:
        return [
            sys.executable, "-m", "bookkeeper_aio.kafka",
            "--metadata", self.metadata_uri, "--listen", self.address, *self.extra,
        ]  # fmt: skip

    def __enter__(self) -> GatewayProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(10)
