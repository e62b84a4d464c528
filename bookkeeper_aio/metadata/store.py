"""The metadata store interface and the compare-and-swap loops over it.

Theory of operation
-------------------
Everything the protocol's safety rests on is a compare-and-swap: a writer's ensemble change,
a writer's close, a recoverer's IN_RECOVERY and its close. :class:`MetadataStore` offers
exactly that (``write_ledger`` with an expected version; a lost race raises
:class:`MetadataVersionError` carrying the current value) plus ledger ids, bookie registration
under leases, cookies, and the cluster's instance id. :func:`update_ledger` is the one CAS
loop: read, apply a pure transform, write at the version read, retry on conflict.

Beside ledgers, bookies and cookies the store keeps **keys**: versioned byte values under
readable paths (``logs/orders``, ``underreplicated/...``) for everything built on top of
ledgers — logs and their cursors, autorecovery's marks, locks and election, tombstones, jobs.
They have the same compare-and-swap (``put`` with ``expected_version``: 0 creates only, a
version replaces only that version), prefix listing and watches, and can be tied to a
:class:`~bookkeeper_aio.metadata.lease.Lease` so they vanish when their owner dies.

Versions are etcd ``mod_revision`` numbers (the memory store keeps the same counter): they
only grow, so "newer" is ``>``. Watches yield values in version order; a watcher that falls
too far behind skips to the latest value rather than blocking writers (a ledger's metadata
is a state, not a log).

Where each part lives: the helpers both implementations share (checks of ids, keys and
values, encodings, a watch's queue) in ``store_shared.py``; metadata URIs and
:func:`open_metadata_store` in ``store_uri.py`` (they import from here too).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Protocol, TypeVar

from ..errors import MetadataUnavailableError, MetadataVersionError
from .lease import Lease
from .model import LedgerMetadata, Versioned
from .registration import BookieInfo, BookieRegistration
from .store_uri import MetadataUri, open_metadata_store, parse_metadata_uri

T = TypeVar("T")

__all__ = [
    "BookieInfo",
    "BookieRegistration",
    "Lease",
    "MetadataStore",
    "MetadataUri",
    "open_metadata_store",
    "parse_metadata_uri",
    "update_key",
    "update_ledger",
]


class MetadataStore(Protocol):
    """See the module docstring. Every method may raise MetadataUnavailableError."""

    async def create_ledger(self, make: Callable[[int], LedgerMetadata]) -> Versioned:
        """Store ``make(ledger_id)`` under a new unique random id (1 .. 2^63-1).

        ``make`` must be pure apart from the id. Its ``creator_token`` makes the create
        idempotent: a retry with the same token returns the ledger the first attempt made
        (an empty token gets a random one, so the store's own retries are safe too).

        Raises:
            IncorrectParameterError: the encoded metadata is over ``value_bytes_max``.
        """
        ...

    async def read_ledger(self, ledger_id: int) -> Versioned:
        """The ledger's metadata and version. Raises NoSuchLedgerError."""
        ...

    async def restore_ledger(self, metadata: LedgerMetadata) -> Versioned | None:
        """Store ``metadata`` under its own id if no ledger has that id (the metadata recovery
        tool, ``shell recover-metadata``); None if one has (it is left as it is).

        Raises:
            IncorrectParameterError: the encoded metadata is over ``value_bytes_max``.
        """
        ...

    async def write_ledger(
        self, ledger_id: int, metadata: LedgerMetadata, expected_version: int
    ) -> Versioned:
        """Compare-and-swap on ``expected_version``; return the new version.

        Raises:
            MetadataVersionError: the version moved; ``.current`` is the stored Versioned.
            NoSuchLedgerError: the ledger was deleted.
            IncorrectParameterError: the encoded metadata is over ``value_bytes_max``.
        """
        ...

    async def delete_ledger(self, ledger_id: int, expected_version: int | None = None) -> None:
        """Delete (only at ``expected_version`` when given) **without** a tombstone: the raw
        removal (tests, an operator's repair). Bookies then keep the ledger's data as an
        orphan; deleting a ledger is ``BookKeeper.delete_ledger`` (``tombstone_ledger``).
        Raises NoSuchLedgerError, MetadataVersionError (with ``.current``)."""
        ...

    async def tombstone_ledger(
        self, ledger_id: int, expected_version: int, tombstone: bytes
    ) -> Versioned[bytes]:
        """Replace the ledger's metadata (at ``expected_version``) by ``tombstone`` under the
        key ``tombstones/<id, 20 digits>`` in one transaction (the ledger key and its creator
        key go, the tombstone comes): the first phase of a delete (``metadata/tombstones.py``).
        A create never draws a tombstoned id.

        Raises:
            NoSuchLedgerError: the ledger is absent (deleted before).
            MetadataVersionError: the version moved; ``.current`` is the stored Versioned.
            IncorrectParameterError: the tombstone is over ``value_bytes_max``.
        """
        ...

    def list_ledgers(self) -> AsyncIterator[int]:
        """Every ledger id in increasing order, read in pages of ``list_page_max``."""
        ...

    def watch_ledger(
        self, ledger_id: int, since_version: int = 0
    ) -> AsyncGenerator[Versioned | None, None]:
        """Each stored value newer than ``since_version`` (the current one first), in version
        order; ``None`` then the end when the ledger is deleted. Raises NoSuchLedgerError if
        it does not exist when the watch starts."""
        ...

    async def register_bookie(
        self,
        bookie_id: str,
        address: str,
        rack: str | None,
        read_only: bool,
        incarnation: str = "",
    ) -> BookieRegistration:
        """Register under a lease kept alive until ``unregister``/``abandon`` or store close.
        ``incarnation``: the id in the bookie's cookie (new when it was formatted again).

        Raises:
            IncorrectParameterError: a malformed bookie id.
        """
        ...

    async def list_bookies(self) -> dict[str, BookieInfo]:
        """The registered (live) bookies by id, sorted."""
        ...

    def watch_bookies(self) -> AsyncGenerator[dict[str, BookieInfo], None]:
        """Snapshots of the registered bookies: the current one, then one per change."""
        ...

    async def get_cookie(self, bookie_id: str) -> Versioned | None:
        """The bookie's cookie bytes and version, or None."""
        ...

    async def put_cookie(
        self, bookie_id: str, data: bytes, expected_version: int | None
    ) -> Versioned:
        """Create (``expected_version`` None) or replace at a version. Raises
        MetadataVersionError (with ``.current``)."""
        ...

    async def delete_cookie(self, bookie_id: str, expected_version: int) -> None:
        """Delete at a version. Raises MetadataVersionError (with ``.current``)."""
        ...

    async def init_cluster(self) -> str:
        """Create the cluster's instance id if there is none; return the stored one."""
        ...

    async def get_instance_id(self) -> str | None:
        """The cluster's instance id, or None before ``init_cluster``."""
        ...

    async def get(self, key: str) -> Versioned[bytes] | None:
        """The key's value and version, or None.

        Raises:
            IncorrectParameterError: a malformed or reserved key (:func:`~.store_shared.check_key`).
        """
        ...

    async def put(
        self,
        key: str,
        value: bytes,
        expected_version: int | None = None,
        *,
        lease: Lease | None = None,
    ) -> Versioned[bytes]:
        """Write ``value``: unconditionally (``expected_version`` None), only if the key is
        absent (0), or only if it is at that version (compare-and-swap). With ``lease`` the
        key is deleted when the lease ends.

        Raises:
            MetadataVersionError: the condition failed; ``.current`` is the stored
                Versioned, or None when the key is absent.
            IncorrectParameterError: a malformed or reserved key, a value over
                ``value_bytes_max``.
        """
        ...

    async def delete(self, key: str, expected_version: int | None = None) -> bool:
        """Delete the key; True if it existed. With ``expected_version``, only at that version.

        Raises:
            MetadataVersionError: with ``expected_version``, the key is absent (``.current``
                None) or at another version.
        """
        ...

    def list_prefix(self, prefix: str) -> AsyncIterator[tuple[str, Versioned[bytes]]]:
        """Every key under ``prefix`` (a key prefix, usually ending in ``/``) with its value,
        in key order, read in pages of ``list_page_max``."""
        ...

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix``; how many there were."""
        ...

    def watch(self, key: str) -> AsyncGenerator[Versioned[bytes] | None, None]:
        """The key's state: the current one first (None when absent), then one per change
        (None on delete). Runs until the caller stops or the store closes."""
        ...

    def watch_prefix(self, prefix: str) -> AsyncGenerator[dict[str, Versioned[bytes]], None]:
        """Snapshots of the keys under ``prefix``: the current one, then one per change. A
        watcher that falls behind skips to the latest snapshot."""
        ...

    async def grant_lease(self, ttl_s: int) -> Lease:
        """A new lease of ``ttl_s`` seconds, kept alive by its own task until revoked,
        abandoned or lost (``lease.py``)."""
        ...

    def statistics(self) -> dict[str, int]:
        """Counters: calls, retries, conflicts, watch resumes, lease renewals, ..."""
        ...

    async def close(self) -> None:
        """Stop keepalives (registrations stay until their leases expire) and disconnect."""
        ...


async def update_ledger(
    store: MetadataStore,
    ledger_id: int,
    transform: Callable[[Versioned], LedgerMetadata | None],
    retries_max: int = 20,
    current: Versioned | None = None,
) -> Versioned:
    """Read-transform-CAS until it sticks; return the value now stored.

    ``transform`` gets the current ``Versioned`` and returns the new metadata, or None to leave
    it as it is; it may raise to abort (for example when it sees CLOSED). ``current`` saves
    the first read when the caller already holds a (possibly stale) value.

    Raises:
        MetadataVersionError: still conflicting after ``retries_max`` attempts.
        NoSuchLedgerError: the ledger does not exist (or was deleted meanwhile).
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


async def update_key(
    store: MetadataStore,
    key: str,
    decode: Callable[[Versioned[bytes] | None], Versioned[T]],
    encode: Callable[[T], bytes],
    transform: Callable[[T], T | None],
    retries_max: int,
    current: Versioned[T] | None = None,
) -> Versioned[T]:
    """The compare-and-swap loop of a key (what logs and Spark jobs keep): read, transform,
    write at the version read, and on a lost race transform the winner; return what is stored
    now. ``decode`` turns what the store holds (None: absent) into a value or raises;
    ``transform`` returns the new value, or None (or an equal one) to leave it, or raises to
    give up. A write whose reply was lost is told apart by reading the key back: if it holds
    exactly what was written, the write happened.

    Raises:
        MetadataVersionError: still conflicting after ``retries_max`` attempts.
        whatever ``decode`` or ``transform`` raise.
    """
    for _ in range(retries_max):
        if current is None:
            current = decode(await store.get(key))
        new = transform(current.value)
        if new is None or new == current.value:
            return current
        data = encode(new)
        try:
            stored = await store.put(key, data, expected_version=current.version)
            return Versioned(new, stored.version)
        except MetadataVersionError as exc:
            current = decode(exc.current)
        except MetadataUnavailableError:
            # The write may have landed and only its reply been lost: look (this read may
            # fail too, and then the caller sees the store is unavailable).
            found = await store.get(key)
            if found is not None and found.value == data:
                return Versioned(new, found.version)
            current = decode(found)
    raise MetadataVersionError(f"{key}: {retries_max} conflicting updates")
