"""End-to-end digests of entries and LAC records, and the master key.

Theory of operation
-------------------
The writer computes a digest for every entry; the bookie recomputes it before storing anything
(BP-31 "checksum at bookies in the write path") and every reader recomputes it again ("assert
twice"). The digest is two-level so that a header can be verified without its payload:

    payload_digest = XXH3_64(payload)
    digest         = XXH3_64(be_i64 ledger_id || be_i64 entry_id || be_i64 lac
                             || be_u64 payload_digest)

An explicit LAC record uses the same header with ``entry_id = LAC_RECORD_ENTRY_ID`` (-2) and
``payload_digest = 0``. A :class:`LacProof` is such a header: it tells a reader "the writer
declared entries up to ``lac`` confirmed", and the reader can check it was not corrupted on the
way. A bookie sends the proof with the highest LAC it holds for a ledger.

Digests protect against corruption (NIC, disk, bugs); they are not a MAC. Access control is the
master key, SHA-1("ledger" || password) as in BookKeeper, stored with the ledger by the bookie.
"""

from __future__ import annotations

import hashlib
import struct
from typing import NamedTuple

from xxhash import xxh3_64_intdigest

DIGEST_TYPE = "xxh3_64"
LAC_RECORD_ENTRY_ID = -2
NO_ENTRY = -1  # "no entry": an empty ledger's LAC and last entry id
MASTER_KEY_BYTES = 20

HEADER = struct.Struct(">qqqQ")  # what the header digest hashes: ledger, entry, lac, pdigest
# What a bookie stores per entry: lac, payload_digest, digest, then the payload.
ENTRY_RECORD_HEADER = struct.Struct(">qQQ")


def payload_digest(payload: bytes | memoryview) -> int:
    """XXH3_64 of the payload."""
    return xxh3_64_intdigest(payload)


def header_digest(ledger_id: int, entry_id: int, lac: int, pdigest: int) -> int:
    """The digest of an entry (or LAC record) header."""
    return xxh3_64_intdigest(HEADER.pack(ledger_id, entry_id, lac, pdigest))


def entry_digest(ledger_id: int, entry_id: int, lac: int, payload: bytes) -> int:
    """The digest a writer sends with an entry."""
    return xxh3_64_intdigest(HEADER.pack(ledger_id, entry_id, lac, xxh3_64_intdigest(payload)))


def lac_digest(ledger_id: int, lac: int) -> int:
    """The digest of an explicit LAC record."""
    return header_digest(ledger_id, LAC_RECORD_ENTRY_ID, lac, 0)


def master_key(password: bytes) -> bytes:
    """BookKeeper's master key: SHA-1("ledger" || password), 20 bytes."""
    return hashlib.sha1(b"ledger" + password).digest()


class LacProof(NamedTuple):
    """A digest-protected claim "entries up to ``lac`` are confirmed" for one ledger.

    Either the header of a stored entry (``entry_id >= 0``) or an explicit LAC record
    (``entry_id == LAC_RECORD_ENTRY_ID``, ``payload_digest == 0``).
    """

    entry_id: int
    lac: int
    payload_digest: int
    digest: int

    def verify(self, ledger_id: int) -> bool:
        """True if the digest matches this header for ``ledger_id``."""
        return self.digest == header_digest(ledger_id, self.entry_id, self.lac, self.payload_digest)

    @classmethod
    def explicit(cls, ledger_id: int, lac: int) -> LacProof:
        """An explicit LAC record, as a writer sends it."""
        return cls(LAC_RECORD_ENTRY_ID, lac, 0, lac_digest(ledger_id, lac))


def pack_entry_record(lac: int, pdigest: int, digest: int, payload: bytes) -> bytes:
    """The bytes a bookie stores for one entry."""
    return ENTRY_RECORD_HEADER.pack(lac, pdigest, digest) + payload


def unpack_entry_record(record: bytes) -> tuple[int, int, int, bytes]:
    """(lac, payload_digest, digest, payload) of a stored entry record."""
    lac, pdigest, digest = ENTRY_RECORD_HEADER.unpack_from(record)
    return lac, pdigest, digest, record[ENTRY_RECORD_HEADER.size :]
