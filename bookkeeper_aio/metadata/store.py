"""The metadata store interface, the compare-and-swap loop, and opening a store by URI.

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

URIs: ``etcd://HOST:PORT[,HOST:PORT...]/ROOT`` (``metadata/etcd.py``) and ``memory://[NAME]``
(``metadata/memory.py``; stores with the same name in one process share state, the default
name is ``default``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import re
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import NamedTuple, Protocol, TypeVar
from urllib.parse import parse_qsl, unquote

from ..config import MetadataConfig, parse_address
from ..errors import (
    ConfigError,
    IncorrectParameterError,
    MetadataFormatError,
    MetadataUnavailableError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from .lease import Lease
from .model import LedgerMetadata, Versioned
from .registration import BookieInfo, BookieRegistration

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

_BOOKIE_ID = re.compile(r"^[A-Za-z0-9_.:\[\]-]{1,255}$")
_ROOT = re.compile(r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
# Keys are /-separated segments of printable characters; these first segments belong to the
# ledger, bookie and cookie methods (whose invariants a raw put would bypass).
RESERVED_KEY_ROOTS = frozenset({"ledgers", "bookies", "cookies", "creators", "instanceid"})
KEY_BYTES_MAX = 1024
_KEY_SEGMENT = re.compile(r"^[^\x00-\x20\x7f/]+$")


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
            IncorrectParameterError: a malformed or reserved key (:func:`check_key`).
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


# --- helpers shared by the implementations ----------------------------------------------


def check_bookie_id(bookie_id: str) -> None:
    """Bookie ids become etcd key segments: ``HOST:PORT`` style, no ``/``.

    Raises:
        IncorrectParameterError: empty, too long, or characters outside [A-Za-z0-9_.:[]-].
    """
    if not isinstance(bookie_id, str) or not _BOOKIE_ID.match(bookie_id):
        raise IncorrectParameterError(
            f"bookie id {bookie_id!r} must be 1-255 characters of [A-Za-z0-9_.:[]-]"
        )


def check_key(key: str, *, prefix: bool = False) -> None:
    """Keys are 1-1024 bytes of ``/``-separated, non-empty segments of printable characters
    (no spaces), whose first segment is not one of :data:`RESERVED_KEY_ROOTS`. A prefix may
    end with ``/``.

    Raises:
        IncorrectParameterError: the key breaks these rules (the message says which).
    """
    if not isinstance(key, str) or not key or len(key.encode()) > KEY_BYTES_MAX:
        raise IncorrectParameterError(f"key {key!r} must be a string of 1-{KEY_BYTES_MAX} bytes")
    segments = key.split("/")
    if prefix and len(segments) > 1 and segments[-1] == "":
        segments.pop()
    if not all(_KEY_SEGMENT.match(s) for s in segments):
        raise IncorrectParameterError(
            f"key {key!r}: segments must be non-empty and printable, without spaces"
        )
    open_root = prefix and len(segments) == 1 and not key.endswith("/")  # "led" covers ledgers/
    if segments[0] in RESERVED_KEY_ROOTS or (
        open_root and any(r.startswith(segments[0]) for r in RESERVED_KEY_ROOTS)
    ):
        raise IncorrectParameterError(
            f"key {key!r}: {segments[0]}/ is kept by the ledger, bookie and cookie methods"
        )


def check_value(key: str, value: bytes, config: MetadataConfig) -> None:
    """Raises IncorrectParameterError for a bad key, a non-bytes value or one over the limit."""
    check_key(key)
    if not isinstance(value, bytes | bytearray):
        raise IncorrectParameterError(f"{key}: the value must be bytes, got {type(value)}")
    if len(value) > config.value_bytes_max:
        raise IncorrectParameterError(
            f"{key}: value of {len(value)} bytes is over value_bytes_max={config.value_bytes_max}"
        )


def encode_ledger(metadata: LedgerMetadata, config: MetadataConfig) -> bytes:
    """The stored JSON of ``metadata``, size-checked.

    Raises:
        IncorrectParameterError: over ``value_bytes_max`` (usually oversize custom metadata).
    """
    data = metadata.to_json_bytes()
    if len(data) > config.value_bytes_max:
        raise IncorrectParameterError(
            f"ledger {metadata.ledger_id}: metadata is {len(data)} bytes encoded, over "
            f"value_bytes_max={config.value_bytes_max} (custom metadata too large?)"
        )
    return data


def check_cookie(bookie_id: str, data: bytes, config: MetadataConfig) -> None:
    """Raises IncorrectParameterError for a bad bookie id or a cookie over the size limit."""
    check_bookie_id(bookie_id)
    if len(data) > config.value_bytes_max:
        raise IncorrectParameterError(f"cookie of {bookie_id} is over value_bytes_max")


def with_creator_token(
    make: Callable[[int], LedgerMetadata], rng: random.Random
) -> tuple[Callable[[int], LedgerMetadata], str]:
    """``make`` with a creator token guaranteed, and that token."""
    token = make(0).creator_token
    if token:
        return make, token
    token = uuid.UUID(int=rng.getrandbits(128)).hex
    return (lambda ledger_id: dataclasses.replace(make(ledger_id), creator_token=token)), token


def tombstone_key(ledger_id: int) -> str:
    """The key of a deleted ledger's tombstone (``metadata/tombstones.py``)."""
    return f"tombstones/{ledger_id:020d}"


def new_instance_id(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def no_such_ledger(ledger_id: int) -> NoSuchLedgerError:
    return NoSuchLedgerError(f"ledger {ledger_id} has no metadata")


def offer(queue: asyncio.Queue, item: object) -> bool:
    """Put without blocking the writer; a full queue loses its oldest item (returns False).

    Watches carry states, not a log: the newest item must get through, older ones may go.
    """
    dropped = queue.full()
    if dropped:
        queue.get_nowait()
    queue.put_nowait(item)
    return not dropped


def bookie_info_to_json(info: BookieInfo) -> bytes:
    return json.dumps(info._asdict(), sort_keys=True).encode()


def bookie_info_from_json(data: bytes) -> BookieInfo:
    """Raises MetadataFormatError for anything but a registration's JSON."""
    try:
        doc = json.loads(data)
        return BookieInfo(
            doc["bookie_id"],
            doc["address"],
            doc["rack"],
            bool(doc["read_only"]),
            str(doc.get("incarnation", "")),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise MetadataFormatError(f"invalid bookie registration {data[:200]!r}: {exc}") from exc


# --- URIs -------------------------------------------------------------------------------


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
