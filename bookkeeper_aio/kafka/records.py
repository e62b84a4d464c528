"""Record batch v2 (magic 2): validation at the edge and the base-offset rewrite.

Theory of operation
-------------------
A producer sends, per partition, one record batch::

    0  baseOffset int64          (the broker's to fill in)
    8  batchLength int32         (bytes after this field)
    12 partitionLeaderEpoch int32
    16 magic int8 = 2
    17 crc uint32                CRC32C of bytes 21..end
    21 attributes int16          compression (bits 0-2), timestamp type (3),
                                 transactional (4), control (5)
    23 lastOffsetDelta int32
    27 baseTimestamp, maxTimestamp int64
    43 producerId int64, producerEpoch int16, baseSequence int32
    57 recordCount int32, then the records (compressed as a whole if compression is set)

The CRC does not cover bytes 0..20, so the gateway writes the base offset it assigns into
bytes 0..7 and stores the batch otherwise exactly as sent (compressed batches too): one log
entry per batch. The entry then describes its own Kafka offsets: ``base_offset`` ..
``base_offset + lastOffsetDelta``. Nothing is decompressed; the record count comes from the
header. Everything here is pure.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import google_crc32c

from .errors import BatchTooLargeError, CorruptBatchError, ErrorCode, KafkaError

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_BYTES = HEADER.size  # 61
CRC_START = 21
MAGIC = 2
LENGTH_PREFIX_BYTES = 12  # baseOffset + batchLength: not counted in batchLength
_BASE_OFFSET = struct.Struct(">q")
_LAST_OFFSET_DELTA = struct.Struct(">i")

COMPRESSION_MASK = 0x07
COMPRESSION_CODECS_MAX = 4  # none, gzip, snappy, lz4, zstd
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
NO_PRODUCER_ID = -1


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed 61-byte header of a record batch v2."""

    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def offset_span(self) -> int:
        """How many Kafka offsets the batch takes: lastOffsetDelta + 1."""
        return self.last_offset_delta + 1

    @property
    def last_sequence(self) -> int:
        """The sequence number of the batch's last record (idempotent producers)."""
        return self.base_sequence + self.last_offset_delta


def parse_header(data: bytes | bytearray | memoryview) -> BatchHeader:
    """The header fields, unchecked.

    Raises:
        CorruptBatchError: fewer than 61 bytes.
    """
    if len(data) < HEADER_BYTES:
        raise CorruptBatchError(
            f"a record batch has at least {HEADER_BYTES} bytes, got {len(data)}"
        )
    return BatchHeader(*HEADER.unpack_from(data, 0))


def validate_batch(data: bytes | None, batch_bytes_max: int) -> BatchHeader:
    """Check one produced batch: size, exactly one batch, magic 2, CRC32C, record count,
    no transactional or control batch, a known compression codec.

    Raises:
        BatchTooLargeError: over ``batch_bytes_max`` (MESSAGE_TOO_LARGE).
        CorruptBatchError: anything else wrong with the bytes (CORRUPT_MESSAGE).
        KafkaError: a transactional or control batch (INVALID_REQUEST: transactions are not
            supported).
    """
    if not data:
        raise CorruptBatchError("the partition's record set is empty")
    if len(data) > batch_bytes_max:
        raise BatchTooLargeError(f"record batch of {len(data)} bytes > {batch_bytes_max}")
    header = parse_header(data)
    if header.magic != MAGIC:
        raise CorruptBatchError(f"record batch magic {header.magic}: only magic 2 is supported")
    if header.batch_length + LENGTH_PREFIX_BYTES != len(data):
        raise CorruptBatchError(
            f"batchLength {header.batch_length} does not span the {len(data)} bytes sent "
            "(exactly one record batch per partition is accepted)"
        )
    if google_crc32c.value(bytes(data[CRC_START:])) != header.crc:
        raise CorruptBatchError("record batch CRC32C mismatch")
    if header.record_count < 1 or header.last_offset_delta != header.record_count - 1:
        raise CorruptBatchError(
            f"recordCount {header.record_count} and lastOffsetDelta "
            f"{header.last_offset_delta} disagree"
        )
    if header.attributes & (TRANSACTIONAL_FLAG | CONTROL_FLAG):
        raise KafkaError("transactional and control batches are not supported",
                         ErrorCode.INVALID_REQUEST)  # fmt: skip
    if header.attributes & COMPRESSION_MASK > COMPRESSION_CODECS_MAX:
        raise CorruptBatchError(f"unknown compression codec {header.attributes & 7}")
    return header


def with_base_offset(data: bytes, base_offset: int) -> bytearray:
    """A copy of the batch with ``base_offset`` in bytes 0..7 (the CRC stays valid)."""
    out = bytearray(data)
    _BASE_OFFSET.pack_into(out, 0, base_offset)
    return out


def span(entry: bytes | bytearray | memoryview) -> tuple[int, int]:
    """(first, next) Kafka offsets of a stored entry: ``base .. base + lastOffsetDelta + 1``.

    Raises:
        CorruptBatchError: the entry is too short to be a batch.
    """
    if len(entry) < HEADER_BYTES:
        raise CorruptBatchError(f"stored entry of {len(entry)} bytes is not a record batch")
    (base,) = _BASE_OFFSET.unpack_from(entry, 0)
    (delta,) = _LAST_OFFSET_DELTA.unpack_from(entry, 23)
    return base, base + delta + 1
