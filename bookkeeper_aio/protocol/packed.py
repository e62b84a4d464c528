"""Packed entries: how an :class:`~.requests.AddBatchRequest` carries the records it stores and a
:class:`~.responses.ReadBatchResponse` the records it read (packing, unpacking, checking)."""

from __future__ import annotations

import struct
from collections.abc import Iterable

from xxhash import xxh3_64_intdigest

from ..digest import ENTRY_RECORD_HEADER, HEADER

# A packed entry: entry id and record length (PACKED_ENTRY_PREFIX), then the record: its own
# header (lac, payload digest, digest: digest.ENTRY_RECORD_HEADER) and the payload.
PACKED_ENTRY_PREFIX = struct.Struct(">qI")
ADD_ENTRY_HEAD = struct.Struct(">qIqQQ")  # the prefix and the record's header, in one
assert ADD_ENTRY_HEAD.size == PACKED_ENTRY_PREFIX.size + ENTRY_RECORD_HEADER.size


def add_entry_head(entry_id: int, lac: int, pdigest: int, digest: int, payload_len: int) -> bytes:
    """What precedes an entry's payload in :attr:`AddBatchRequest.entries`."""
    return ADD_ENTRY_HEAD.pack(entry_id, ENTRY_RECORD_HEADER.size + payload_len, lac, pdigest,
                               digest)  # fmt: skip


def pack_add_entries(entries: Iterable[tuple[int, int, int, int, bytes]]) -> bytes:
    """Pack ``(entry_id, lac, payload_digest, digest, payload)`` entries for an
    :class:`AddBatchRequest`."""
    parts: list[bytes] = []
    for entry_id, lac, pdigest, digest, payload in entries:
        parts += (add_entry_head(entry_id, lac, pdigest, digest, len(payload)), payload)
    return b"".join(parts)


CheckedEntry = tuple[int, int, int, int, memoryview, bool]


def check_add_entries(
    ledger_id: int, data: bytes | memoryview, start: int = 0, *, entries_max: int = 1 << 62
) -> list[CheckedEntry]:
    """The ``(entry_id, lac, payload_digest, digest, record, intact)`` of packed entries from
    ``start``, unpacked and checked in one pass (what a bookie does with every add batch).
    ``record`` is the stored form (header and payload), a view of ``data`` (no copy);
    ``intact``: its payload hashes to ``payload_digest`` and its header (with ``ledger_id``)
    to ``digest``.

    Raises:
        ValueError: an entry is cut short, its record is shorter than its header, or there
            are more than ``entries_max`` entries.
    """
    unpack, view, pack = ADD_ENTRY_HEAD.unpack_from, memoryview(data), HEADER.pack
    skip, out, pos, end = ENTRY_RECORD_HEADER.size, [], start, len(data)
    # Every entry takes at least ADD_ENTRY_HEAD.size bytes: a cheap bound before any work.
    if (end - pos) // ADD_ENTRY_HEAD.size > entries_max and _more_entries(data, pos, entries_max):
        raise ValueError(f"more than {entries_max} entries")
    while pos < end:
        if end - pos < ADD_ENTRY_HEAD.size:
            raise ValueError(f"packed entries cut short at byte {pos - start}")
        entry_id, size, lac, pdigest, digest = unpack(data, pos)
        start = pos + PACKED_ENTRY_PREFIX.size
        pos = start + size
        if size < skip or pos > end:
            raise ValueError(f"entry {entry_id}: record of {size} bytes does not fit")
        intact = (
            xxh3_64_intdigest(view[start + skip : pos]) == pdigest
            and xxh3_64_intdigest(pack(ledger_id, entry_id, lac, pdigest)) == digest
        )
        out.append((entry_id, lac, pdigest, digest, view[start:pos], intact))
    return out


def _more_entries(data: bytes | memoryview, pos: int, most: int) -> bool:
    """Whether ``data`` holds more than ``most`` packed entries from ``pos`` (their lengths
    only are read, and only as far as needed)."""
    end, prefix = len(data), PACKED_ENTRY_PREFIX
    for _ in range(most + 1):
        if end - pos < prefix.size:
            return False
        pos += prefix.size + prefix.unpack_from(data, pos)[1]
    return True


def pack_read_entry(entry_id: int, record: bytes | memoryview) -> tuple[bytes, bytes | memoryview]:
    """One stored record (``digest.ENTRY_RECORD_HEADER`` and payload) as a
    :class:`ReadBatchResponse` carries it: the same layout as an add batch's entries."""
    return PACKED_ENTRY_PREFIX.pack(entry_id, len(record)), record


def unpack_read_entries(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """``(entry_id, entry_lac, digest, payload)`` of a :class:`ReadBatchResponse`'s entries,
    unchecked (the reader verifies each digest, as for a ReadResponse).

    Raises:
        ValueError: an entry is cut short or its record is shorter than its header.
    """
    out, pos, end, skip = [], 0, len(data), ENTRY_RECORD_HEADER.size
    while pos < end:
        if end - pos < ADD_ENTRY_HEAD.size:
            raise ValueError(f"read entries cut short at byte {pos}")
        entry_id, size, lac, _pdigest, digest = ADD_ENTRY_HEAD.unpack_from(data, pos)
        start = pos + PACKED_ENTRY_PREFIX.size
        pos = start + size
        if size < skip or pos > end:
            raise ValueError(f"entry {entry_id}: record of {size} bytes does not fit")
        out.append((entry_id, lac, digest, data[start + skip : pos]))
    return out
