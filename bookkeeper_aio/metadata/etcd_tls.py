"""aetcd's client over a TLS channel, and reading the TLS files of :class:`MetadataConfig`.

aetcd 1.x authenticates (user and password: a token on every call) but opens only plaintext
gRPC channels. :class:`TlsClient` is aetcd's ``Client`` whose ``connect`` opens a
``grpc.aio.secure_channel`` instead, and is otherwise aetcd's own connect (authentication,
stubs, watcher); it leans on aetcd's error translation, which is why aetcd is pinned below 2.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aetcd
import grpc
from aetcd import exceptions, rpc, watcher

from ..config import MetadataConfig
from ..errors import ConfigError


def channel_credentials(config: MetadataConfig) -> grpc.ChannelCredentials:
    """TLS credentials from ``tls_ca_file`` (None: the system's CAs) and the optional client
    certificate and key.

    Raises:
        ConfigError: a file cannot be read.
    """
    ca, cert, key = (
        _read(path) for path in (config.tls_ca_file, config.tls_cert_file, config.tls_key_file)
    )
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                        certificate_chain=cert)  # fmt: skip


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read etcd TLS file {path}: {exc.strerror}") from exc


class TlsClient(aetcd.Client):
    """aetcd's client on a TLS channel (see the module docstring)."""

    _is_connecting: bool  # aetcd's own (its connect is the model of ours)

    def __init__(self, *args: Any, credentials: grpc.ChannelCredentials, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        try:
            await self._connect()
        except rpc.AioRpcError as exc:  # as aetcd's own connect: its exception tree
            exceptions._handle_exception(exc)

    async def _connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:  # another task is connecting: wait for it
            async with asyncio.timeout(self._connect_wait_timeout):
                await self._connected.wait()
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            self.channel = rpc.secure_channel(
                target, self._credentials, options=self._options.items()
            )
            if self._username is not None and self._password is not None:
                self.auth_stub = rpc.AuthStub(self.channel)
                request = rpc.AuthenticateRequest(name=self._username, password=self._password)
                reply = await self.auth_stub.Authenticate(request, timeout=self._timeout)
                self.metadata = (("token", reply.token),)
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = watcher.Watcher(
                rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False
