"""A raw protocol peer for hostile tests: frames in, frames out, no client logic in between."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bookkeeper_aio.bookie.server import Bookie
from bookkeeper_aio.config import BookieConfig
from bookkeeper_aio.digest import entry_digest, master_key
from bookkeeper_aio.protocol import (
    PROTOCOL_VERSION,
    AddRequest,
    FrameDecoder,
    HelloRequest,
    Message,
    encode,
)
from bookkeeper_aio.sandbox import free_port

KEY = master_key(b"hostile")


def add(ledger_id: int, entry_id: int, payload: bytes, rid: int = 1) -> AddRequest:
    """A valid add of ``payload`` as entry ``entry_id`` (LAC: the entry before)."""
    lac = entry_id - 1
    digest = entry_digest(ledger_id, entry_id, lac, payload)
    return AddRequest(rid, ledger_id, entry_id, 0, KEY, lac, payload, digest)


class RawPeer:
    """One connection speaking frames: what a hostile (or careless) client can do."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = FrameDecoder(64 << 20)
        self.inbox: list[Any] = []

    @classmethod
    async def connect(cls, address: str, *, hello: bool = True) -> RawPeer:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 20)
        peer = cls(reader, writer)
        if hello:
            peer.send(HelloRequest(0, PROTOCOL_VERSION, "hostile"))
            (answer,) = await peer.recv(1)
            assert answer.status == 0, answer
        return peer

    def send(self, *messages: Message) -> None:
        self.writer.write(b"".join(encode(m) for m in messages))

    def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)

    async def recv(self, count: int, timeout_s: float = 10.0) -> list[Any]:
        """The next ``count`` frames (decoded; BadFrames as such).

        Raises:
            TimeoutError: fewer came in time. EOFError: the bookie closed first.
        """
        async with asyncio.timeout(timeout_s):
            while len(self.inbox) < count:
                data = await self.reader.read(1 << 20)
                if not data:
                    raise EOFError(f"closed after {len(self.inbox)} of {count} frames")
                self.inbox += self.decoder.feed(data)
        out, self.inbox = self.inbox[:count], self.inbox[count:]
        return out

    async def closed_by_peer(self, timeout_s: float = 10.0) -> bool:
        """Read (and drop) until the bookie closes the connection; False on timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                while await self.reader.read(1 << 20):
                    pass
        except TimeoutError:
            return False
        except ConnectionError:
            pass
        return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


def bookie_config(root: Path, **overrides: Any) -> BookieConfig:
    """An in-process bookie on a free port with the memory engine and a real journal."""
    return BookieConfig(
        listen=f"127.0.0.1:{free_port()}", journal_dir=str(root / "journal"),
        ledger_dirs=(str(root / "ledgers"),), engine="memory", journal_preallocate_bytes=1 << 20,
        **overrides,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def serving(root: Path, **overrides: Any) -> AsyncIterator[Bookie]:
    async with Bookie.serve(bookie_config(root, **overrides)) as bookie:
        yield bookie


def connection_stats(bookie: Bookie) -> list[dict[str, int]]:
    return [conn.statistics() for conn in bookie.connections]


def unsent_bytes(bookie: Bookie) -> list[int]:
    """Answer bytes each connection has not sent yet: queued, or in its transport's buffer."""
    return [
        sum(map(len, conn._out)) + conn._transport.get_write_buffer_size()
        for conn in bookie.connections
    ]
