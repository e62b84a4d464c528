"""The network seam: how bookies listen and clients connect.

Theory of operation
-------------------
Both sides speak through asyncio ``Protocol``/``Transport`` pairs. :class:`Network` is the one
place that opens sockets, so the simulator can hand the same protocol objects an in-memory
transport (``bookkeeper_aio.sim``) while production uses :class:`TcpNetwork` on the running
loop (uvloop in the bookie). Code above this seam never calls ``loop.create_connection`` itself.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Protocol

from .config import parse_address


class Server(Protocol):
    """A listening endpoint; ``close`` stops accepting, ``wait_closed`` waits for that."""

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


class Network(Protocol):
    """Opens listening endpoints and outgoing connections by ``HOST:PORT`` address."""

    async def start_server(
        self, protocol_factory: Callable[[], asyncio.Protocol], address: str
    ) -> Server: ...

    async def connect(
        self, protocol_factory: Callable[[], asyncio.Protocol], address: str
    ) -> tuple[asyncio.Transport, asyncio.Protocol]: ...


class TcpNetwork:
    """TCP on the running event loop, with TCP_NODELAY (replies are small and latency-bound)."""

    async def start_server(
        self, protocol_factory: Callable[[], asyncio.Protocol], address: str
    ) -> Server:
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        return await loop.create_server(protocol_factory, host, port, reuse_address=True)

    async def connect(
        self, protocol_factory: Callable[[], asyncio.Protocol], address: str
    ) -> tuple[asyncio.Transport, asyncio.Protocol]:
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(protocol_factory, host, port)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return transport, protocol  # type: ignore[return-value]
