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
import ssl
from collections.abc import Callable
from typing import Any, Protocol

from .config import BookieConfig, ClientConfig, parse_address
from .tls import HANDSHAKE_TIMEOUT_S, client_context, server_context


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
    """TCP on the running event loop, with TCP_NODELAY (replies are small and latency-bound);
    TLS when given contexts (``tls.py``): ``server_ssl`` for listening, ``client_ssl`` for
    connecting (the host of the address is the name the server's certificate must carry)."""

    def __init__(
        self, *, server_ssl: ssl.SSLContext | None = None, client_ssl: ssl.SSLContext | None = None
    ) -> None:
        self.server_ssl = server_ssl
        self.client_ssl = client_ssl

    async def start_server(
        self, protocol_factory: Callable[[], asyncio.Protocol], address: str
    ) -> Server:
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {}
        if self.server_ssl is not None:
            tls = {"ssl": self.server_ssl, "ssl_handshake_timeout": HANDSHAKE_TIMEOUT_S}
        return await loop.create_server(protocol_factory, host, port, reuse_address=True, **tls)

    async def connect(
        self, protocol_factory: Callable[[], asyncio.Protocol], address: str
    ) -> tuple[asyncio.Transport, asyncio.Protocol]:
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        tls: dict[str, Any] = {}
        if self.client_ssl is not None:
            tls = {"ssl": self.client_ssl, "server_hostname": host,
                   "ssl_handshake_timeout": HANDSHAKE_TIMEOUT_S}  # fmt: skip
        transport, protocol = await loop.create_connection(protocol_factory, host, port, **tls)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return transport, protocol


def client_network(config: ClientConfig) -> TcpNetwork:
    """The network a client with ``config`` uses: TLS when it names a CA.

    Raises:
        ConfigError: a TLS file cannot be loaded.
    """
    if config.tls_ca_file is None:
        return TcpNetwork()
    context = client_context(config.tls_ca_file, config.tls_cert_file, config.tls_key_file)
    return TcpNetwork(client_ssl=context)


def bookie_network(config: BookieConfig) -> TcpNetwork:
    """A bookie's network: it serves TLS with ``tls_cert_file`` (requiring client
    certificates with ``tls_client_ca_file``), and connects to other bookies over TLS with
    ``tls_ca_file`` (presenting its own certificate, for peers that require one).

    Raises:
        ConfigError: a TLS file cannot be loaded.
    """
    server = client = None
    if config.tls_cert_file is not None:
        assert config.tls_key_file is not None  # config.validate
        server = server_context(config.tls_cert_file, config.tls_key_file,
                                config.tls_client_ca_file)  # fmt: skip
    if config.tls_ca_file is not None:
        client = client_context(config.tls_ca_file, config.tls_cert_file, config.tls_key_file)
    return TcpNetwork(server_ssl=server, client_ssl=client)
