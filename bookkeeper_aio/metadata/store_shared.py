"""Helpers the metadata store implementations (``etcd.py``, ``memory.py`` and their key
spaces) share: checks of bookie ids, keys, values and cookies, the encoding of ledgers and
bookie registrations, creator tokens, tombstone keys, instance ids, and the queue of a watch
(metadata/store.py says what a store is)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import re
import uuid
from collections.abc import Callable

from ..config import MetadataConfig
from ..errors import IncorrectParameterError, MetadataFormatError, NoSuchLedgerError
from .model import LedgerMetadata
from .registration import BookieInfo

_BOOKIE_ID = re.compile(r"^[A-Za-z0-9_.:\[\]-]{1,255}$")
# Keys are /-separated segments of printable characters; these first segments belong to the
# ledger, bookie and cookie methods (whose invariants a raw put would bypass).
RESERVED_KEY_ROOTS = frozenset({"ledgers", "bookies", "cookies", "creators", "instanceid"})
KEY_BYTES_MAX = 1024
_KEY_SEGMENT = re.compile(r"^[^\x00-\x20\x7f/]+$")


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
