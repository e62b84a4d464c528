"""Metadata URIs, and opening the store one names (metadata/store.py says what a store is).

URIs: ``etcd://HOST:PORT[,HOST:PORT...]/ROOT`` (``metadata/etcd.py``) and ``memory://[NAME]``
(``metadata/memory.py``; stores with the same name in one process share state, the default
name is ``default``).
"""

from __future__ import annotations

import contextlib
import random
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import parse_qsl, unquote

from ..config import MetadataConfig, parse_address
from ..errors import ConfigError

if TYPE_CHECKING:
    from .store import MetadataStore

_ROOT = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")


class MetadataUri(NamedTuple):
    """A parsed metadata URI: ``scheme`` etcd or etcds (endpoints, root; TLS for etcds; a
    user and password if the URI has them) or memory (root = name)."""

    scheme: str
    endpoints: tuple[str, ...]
    root: str
    username: str | None = None
    password: str | None = None
    tls_files: tuple[tuple[str, str], ...] = ()  # MetadataConfig TLS keys given in the URI

    @property
    def tls(self) -> bool:
        return self.scheme == "etcds"


def parse_metadata_uri(uri: str) -> MetadataUri:
    """Parse ``etcd[s]://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/ROOT[?KEY=FILE&...]`` or
    ``memory://[NAME]``: etcds is etcd over TLS; USER and PASSWORD are percent-encoded; the
    KEYs are MetadataConfig's ``tls_ca_file``, ``tls_cert_file`` and ``tls_key_file`` (etcds
    only), so that one URI carries a whole connection to every process and shell command.

    Raises:
        ConfigError: an unknown scheme or a malformed URI (the message shows the right form).
    """
    form = "etcd[s]://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/ROOT or memory://[NAME]"
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise ConfigError(f"metadata URI {_shown(uri)!r}: expected {form}")
    if scheme == "memory":
        return MetadataUri("memory", (), rest or "default")
    if scheme not in ("etcd", "etcds"):
        raise ConfigError(
            f"metadata URI {_shown(uri)!r}: unknown scheme {scheme!r}; expected {form}"
        )
    rest, _, query = rest.partition("?")
    tls_files = _tls_files(query, scheme, _shown(uri))
    authority, _, root = rest.partition("/")
    credentials, at, hosts = authority.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = credentials.partition(":")
        if not user or not colon:
            raise ConfigError(f"metadata URI {_shown(uri)!r}: expected USER:PASSWORD@ before "
                              "the hosts")  # fmt: skip
        username, password = unquote(user), unquote(secret)
    uri = _shown(uri)
    root = root.strip("/")
    if not hosts or not _ROOT.match(root):
        raise ConfigError(
            f"metadata URI {uri!r}: expected {form}; ROOT is one or more /-separated "
            f"segments of [A-Za-z0-9_.-]"
        )
    endpoints = tuple(hosts.split(","))
    for endpoint in endpoints:
        parse_address(endpoint)  # ConfigError naming the bad one
    return MetadataUri(scheme, endpoints, "/" + root, username, password, tls_files)


_TLS_KEYS = ("tls_ca_file", "tls_cert_file", "tls_key_file")


def _tls_files(query: str, scheme: str, shown: str) -> tuple[tuple[str, str], ...]:
    if not query:
        return ()
    try:
        pairs = parse_qsl(query, strict_parsing=True)
    except ValueError as exc:
        raise ConfigError(f"metadata URI {shown!r}: bad query: {exc}") from exc
    keys = [k for k, _ in pairs]
    bad = sorted(set(keys) - set(_TLS_KEYS)) or sorted({k for k in keys if keys.count(k) > 1})
    if bad or scheme != "etcds":
        keys_text = ", ".join(_TLS_KEYS)
        raise ConfigError(
            f"metadata URI {shown!r}: the query may only give {keys_text}, once each, "
            f"to etcds:// (not {bad})"
        )
    return tuple(pairs)


def _shown(uri: str) -> str:
    """The URI with its password hidden (for messages and logs), even a malformed one."""
    scheme, sep, rest = uri.partition("://")
    credentials, at, tail = rest.rpartition("@")
    if not at:
        return uri
    return f"{scheme}{sep}{credentials.partition(':')[0]}:***@{tail}"


@contextlib.asynccontextmanager
async def open_metadata_store(
    uri: str, config: MetadataConfig | None = None, *, rng: random.Random | None = None
) -> AsyncIterator[MetadataStore]:
    """Open the store a URI names; close it on exit. ``rng`` draws ledger ids and jitter.

    Raises:
        ConfigError: an unknown scheme or a malformed URI.
        MetadataUnavailableError: etcd cannot be reached (the message names the endpoints).
    """
    config = config or MetadataConfig()
    parsed = parse_metadata_uri(uri)
    if parsed.tls_files:
        config = config.replace(**dict(parsed.tls_files))
    store: MetadataStore
    if parsed.scheme == "memory":
        from .memory import MemoryMetadataStore

        store = MemoryMetadataStore.named(parsed.root, config, rng=rng)
    else:
        from .etcd import EtcdMetadataStore

        if (config.tls_ca_file or config.tls_cert_file) and not parsed.tls:
            raise ConfigError("MetadataConfig has TLS files but the URI is etcd://: use etcds://")
        store = await EtcdMetadataStore.connect(
            parsed.endpoints, parsed.root, config, rng=rng, tls=parsed.tls,
            username=parsed.username, password=parsed.password,
        )  # fmt: skip
    try:
        yield store
    finally:
        await store.close()
