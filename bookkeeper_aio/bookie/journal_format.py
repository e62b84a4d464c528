"""The journal's on-disk format: file names, the file header, records, and the scan.

Theory of operation
-------------------
A journal file ``journal-<seq:016x>.log`` starts with a header (magic, format version, the file's
sequence number) followed by records::

    [length u32][checksum u64][type u8][body]

``length`` counts type + body. ``checksum`` is XXH3_64 of type + body, seeded with the file's
sequence number, so a record copied from another file (or left over from a recycled one) never
validates. New files are preallocated with blocks that read as zeros (fallocated, or zeros
written), so a zero length means "end of data"; a recycled file (``recycled-<old seq>.log``,
renamed to its new name once its new header is durable) still holds its old records, which
fail the checksum. A scan stops at the first record
that is zero, runs past the end of the file, or fails its checksum: after a crash the tail of
the last file may be torn, and a torn record was never acknowledged.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from xxhash import xxh3_64, xxh3_64_intdigest

MAGIC = b"BKAIOJNL"
FORMAT_VERSION = 1
FILE_HEADER = struct.Struct(">8sIQ")  # magic, version, seq
RECORD_HEADER = struct.Struct(">IQ")  # length of type+body, checksum
_NAME = re.compile(r"^journal-([0-9a-f]{16})\.log$")
_RECYCLED_NAME = re.compile(r"^recycled-([0-9a-f]{16})\.log$")

# Record types (the body's meaning is the bookie's business: bookie/records.py).
REC_ENTRY = 1
REC_MASTER_KEY = 2
REC_FENCE = 3
REC_EXPLICIT_LAC = 4
REC_LIMBO = 5
REC_ENTRIES = 6
REC_LEDGERS_ENTRIES = 7


class JournalRecord(NamedTuple):
    """One record as replay returns it."""

    type: int
    body: bytes


def file_name(seq: int) -> str:
    """The name of journal file number ``seq``."""
    return f"journal-{seq:016x}.log"


def recycled_name(seq: int) -> str:
    """The name a retired journal file ``seq`` waits under until it is reused."""
    return f"recycled-{seq:016x}.log"


def list_recycled(directory: Path) -> list[Path]:
    """Retired journal files waiting for reuse (never replayed)."""
    return sorted(p for p in directory.iterdir() if _RECYCLED_NAME.match(p.name))


def list_files(directory: Path) -> list[tuple[int, Path]]:
    """Journal files in ``directory`` as (seq, path), oldest first."""
    found = []
    for path in directory.iterdir():
        m = _NAME.match(path.name)
        if m:
            found.append((int(m.group(1), 16), path))
    return sorted(found)


def file_header(seq: int) -> bytes:
    """The bytes a journal file starts with."""
    return FILE_HEADER.pack(MAGIC, FORMAT_VERSION, seq)


# A record's body as the journal takes it: bytes, or pieces it writes without joining them.
Body = bytes | tuple[bytes | memoryview, ...]


def record_head(seq: int, rtype: int, pieces: tuple[bytes | memoryview, ...], size: int) -> bytes:
    """What precedes a body (its ``pieces``, ``size`` bytes in all) in its record of file
    ``seq``: length, checksum, type. The journal writes head and pieces without joining
    them (a batch's bodies are copied once, into the write buffer)."""
    kind = bytes((rtype,))
    digest = xxh3_64(kind, seq)
    for piece in pieces:
        digest.update(piece)
    return RECORD_HEADER.pack(size + 1, digest.intdigest()) + kind


def encode_record(seq: int, rtype: int, body: bytes) -> bytes:
    """One record of file ``seq``."""
    return record_head(seq, rtype, (body,), len(body)) + body


class ScanResult(NamedTuple):
    """Records of one file and where valid data ends."""

    records: list[JournalRecord]
    end_offset: int
    clean_end: bool  # True if the data ended at a zero length or exactly at the file's end


def scan(data: bytes | memoryview, seq: int, start: int = 0) -> ScanResult:
    """Parse a whole journal file's bytes from ``start`` (0 = right after the header).

    Raises:
        ValueError: the header is missing, of another format version, or of another seq.
    """
    if len(data) < FILE_HEADER.size:
        raise ValueError("journal file shorter than its header")
    magic, version, file_seq = FILE_HEADER.unpack_from(data)
    if magic != MAGIC or version != FORMAT_VERSION or file_seq != seq:
        raise ValueError(f"bad journal header {magic!r} v{version} seq {file_seq} (expected {seq})")
    pos = max(start, FILE_HEADER.size)
    records: list[JournalRecord] = []
    for rtype, body, end in _records(data, seq, pos):
        records.append(JournalRecord(rtype, body))
        pos = end
    clean = len(data) - pos < RECORD_HEADER.size or (RECORD_HEADER.unpack_from(data, pos)[0] == 0)
    return ScanResult(records, pos, clean)


def _records(data: bytes | memoryview, seq: int, pos: int) -> Iterator[tuple[int, bytes, int]]:
    size = len(data)
    while size - pos >= RECORD_HEADER.size:
        length, checksum = RECORD_HEADER.unpack_from(data, pos)
        start = pos + RECORD_HEADER.size
        end = start + length
        if length == 0 or end > size:
            return
        payload = bytes(data[start:end])
        if xxh3_64_intdigest(payload, seq) != checksum:
            return
        yield payload[0], payload[1:], end
        pos = end
