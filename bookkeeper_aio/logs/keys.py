"""A log's key in the metadata store: reading it and its compare-and-swap loop.

Theory of operation
-------------------
Every change of a log is ``update_log(store, name, transform)``: read the key, apply a pure
transform of :mod:`~bookkeeper_aio.logs.model`, write the result at the version read, and on a
lost race apply the transform again to the winner (a transform raises to give up, say
:class:`~bookkeeper_aio.errors.LogFencedError` when the epoch moved). A reply lost after the
write landed (the store says "unavailable") is told apart by reading the key back: if it holds
exactly what we wrote, the write happened. The loop is the store's one for keys
(``metadata.store.update_key``), with the log's decoding.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from ..errors import (
    MetadataFormatError,
    MetadataUnavailableError,
    MetadataVersionError,
    NoSuchLogError,
)
from ..metadata.model import Versioned
from ..metadata.store import MetadataStore, update_key
from .model import LogMetadata
from .options import log_key

Transform = Callable[[LogMetadata], LogMetadata | None]


def decode(
    name: str, stored: Versioned[bytes] | None, *, deleting_ok: bool = False
) -> Versioned[LogMetadata]:
    """The stored value as ``Versioned[LogMetadata]``.

    Raises:
        NoSuchLogError: absent, or being deleted (unless ``deleting_ok``).
        MetadataFormatError: not log metadata.
    """
    if stored is None:
        raise NoSuchLogError(f"no log named {name!r}")
    md = LogMetadata.from_json_bytes(stored.value)
    if md.name != name:
        raise MetadataFormatError(f"the key of log {name!r} holds log {md.name!r}")
    if md.deleting and not deleting_ok:
        raise NoSuchLogError(f"log {name!r} is being deleted")
    return Versioned(md, stored.version)


async def read_log(
    store: MetadataStore, name: str, *, deleting_ok: bool = False
) -> Versioned[LogMetadata]:
    """The log's metadata and version.

    Raises:
        NoSuchLogError: no such log (or it is being deleted, unless ``deleting_ok``).
    """
    return decode(name, await store.get(log_key(name)), deleting_ok=deleting_ok)


async def update_log(
    store: MetadataStore,
    name: str,
    transform: Transform,
    retries_max: int,
    current: Versioned[LogMetadata] | None = None,
    *,
    deleting_ok: bool = False,
) -> Versioned[LogMetadata]:
    """Read-transform-CAS until it sticks; return what is stored now.

    ``transform`` returns the new metadata, or None (or an equal value) to leave it; it may
    raise to give up. ``current`` saves the first read.

    Raises:
        NoSuchLogError: the log does not exist (or was deleted meanwhile).
        MetadataVersionError: still conflicting after ``retries_max`` attempts.
        whatever ``transform`` raises.
    """

    def decoded(stored: Versioned[bytes] | None) -> Versioned[LogMetadata]:
        return decode(name, stored, deleting_ok=deleting_ok)

    def encode(md: LogMetadata) -> bytes:
        return md.to_json_bytes()

    return await update_key(store, log_key(name), decoded, encode, transform, retries_max, current)


async def create_key(store: MetadataStore, key: str, data: bytes) -> bool:
    """Write ``data`` at ``key`` only if it is absent; False if it exists (with other bytes).

    A lost reply is told apart by reading the key back.
    """
    try:
        await store.put(key, data, expected_version=0)
        return True
    except MetadataVersionError:
        return False
    except MetadataUnavailableError:
        found = await store.get(key)
        if found is None:
            raise
        return found.value == data


def cursor_json(offset: int, log_id: str) -> bytes:
    """A committed offset as stored: tied to the log it was committed on."""
    return json.dumps({"offset": offset, "log_id": log_id}, sort_keys=True).encode()


def cursor_offset(data: bytes, log_id: str) -> int | None:
    """The offset of a stored cursor, or None if it belongs to an earlier log of that name.

    Raises:
        MetadataFormatError: not a cursor.
    """
    try:
        doc = json.loads(data)
        offset, owner = doc["offset"], doc["log_id"]
        if type(offset) is not int or offset < 0 or not isinstance(owner, str):
            raise ValueError(f"bad cursor {doc!r}")
    except (ValueError, KeyError, TypeError) as exc:
        raise MetadataFormatError(f"invalid cursor {data[:200]!r}: {exc}") from exc
    return offset if owner == log_id else None
