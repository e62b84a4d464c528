"""The metadata store interface, the compare-and-swap loop, and opening a store by URI.

Theory of operation
-------------------
Everything the protocol's safety rests on is a compare-and-swap: a writer's ensemble change,
a writer's close, a recoverer's IN_RECOVERY and its close. :class:`MetadataStore` offers
exactly that (``write_ledger`` with an expected version; a lost race raises
:class:`MetadataVersionError` carrying the current value) plus ledger ids, bookie registration
under leases, cookies, and the cluster's instance id. :func:`update_ledger` is the one CAS
loop: read, apply a pure transform, write at the version read, retry on conflict.

URIs: ``etcd://HOST:PORT[,HOST:PORT...]/ROOT`` (``metadata/etcd.py``) and ``memory://[NAME]``
(``metadata/memory.py``; stores with the same name in one process share state).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import NamedTuple, Protocol

from ..config import MetadataConfig
from ..errors import ConfigError, MetadataVersionError
from .model import LedgerMetadata, Versioned


class BookieInfo(NamedTuple):
    """A registered bookie: where it listens, its network location, whether it takes adds."""

    bookie_id: str
    address: str
    rack: str | None
    read_only: bool


class BookieRegistration(Protocol):
    """A bookie's registration, kept alive by a lease until unregistered or the process dies."""

    async def update(self, *, read_only: bool) -> None: ...

    async def unregister(self) -> None: ...


class MetadataStore(Protocol):
    """See the module docstring. Every method may raise MetadataUnavailableError."""

    async def create_ledger(self, make: Callable[[int], LedgerMetadata]) -> Versioned: ...

    async def read_ledger(self, ledger_id: int) -> Versioned: ...

    async def write_ledger(
        self, ledger_id: int, metadata: LedgerMetadata, expected_version: int
    ) -> Versioned: ...

    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None: ...

    def list_ledgers(self) -> AsyncIterator[int]: ...

    def watch_ledger(self, ledger_id: int) -> AsyncIterator[Versioned | None]: ...

    async def register_bookie(
        self, bookie_id: str, address: str, rack: str | None, read_only: bool
    ) -> BookieRegistration: ...

    async def list_bookies(self) -> dict[str, BookieInfo]: ...

    async def get_cookie(self, bookie_id: str) -> Versioned | None: ...

    async def put_cookie(
        self, bookie_id: str, data: bytes, expected_version: int | None
    ) -> Versioned: ...

    async def delete_cookie(self, bookie_id: str, expected_version: int) -> None: ...

    async def init_cluster(self) -> str: ...

    async def get_instance_id(self) -> str | None: ...

    async def close(self) -> None: ...


async def update_ledger(
    store: MetadataStore,
    ledger_id: int,
    transform: Callable[[Versioned], LedgerMetadata | None],
    retries_max: int = 20,
    current: Versioned | None = None,
) -> Versioned:
    """Read-transform-CAS until it sticks; return the value now stored.

    ``transform`` gets the current ``Versioned`` and returns the new metadata, or None to leave
    it as it is; it may raise to abort (for example when it sees CLOSED).

    Raises:
        MetadataVersionError: still conflicting after ``retries_max`` attempts.
        NoSuchLedgerError: the ledger does not exist.
    """
    for _ in range(retries_max):
        if current is None:
            current = await store.read_ledger(ledger_id)
        new = transform(current)
        if new is None:
            return current
        try:
            return await store.write_ledger(ledger_id, new, current.version)
        except MetadataVersionError as exc:
            current = exc.current if isinstance(exc.current, Versioned) else None
    raise MetadataVersionError(f"ledger {ledger_id}: {retries_max} conflicting updates")


async def watch_bookies(
    store: MetadataStore, interval_s: float = 1.0
) -> AsyncIterator[dict[str, BookieInfo]]:
    """Snapshots of the available bookies: the current one, then each change.

    Polls ``list_bookies`` every ``interval_s`` (one small range read): registrations change
    rarely, and a poll needs no watch-resume logic. Ends when the caller stops iterating.
    """
    last: dict[str, BookieInfo] | None = None
    while True:
        current = await store.list_bookies()
        if current != last:
            last = current
            yield current
        await asyncio.sleep(interval_s)


@contextlib.asynccontextmanager
async def open_metadata_store(
    uri: str, config: MetadataConfig | None = None
) -> AsyncIterator[MetadataStore]:
    """Open the store a URI names; close it on exit.

    Raises:
        ConfigError: an unknown scheme or a malformed URI.
        MetadataUnavailableError: etcd cannot be reached.
    """
    config = config or MetadataConfig()
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise ConfigError(f"metadata URI {uri!r}: expected etcd://HOST:PORT/ROOT or memory://")
    store: MetadataStore
    if scheme == "memory":
        from .memory import MemoryMetadataStore

        store = MemoryMetadataStore.named(rest or "default", config)
    elif scheme == "etcd":
        from .etcd import EtcdMetadataStore

        hosts, _, root = rest.partition("/")
        if not hosts or not root:
            raise ConfigError(f"metadata URI {uri!r}: expected etcd://HOST:PORT[,...]/ROOT")
        store = await EtcdMetadataStore.connect(hosts.split(","), "/" + root.strip("/"), config)
    else:
        raise ConfigError(f"metadata URI {uri!r}: unknown scheme {scheme!r} (etcd or memory)")
    try:
        yield store
    finally:
        await store.close()
