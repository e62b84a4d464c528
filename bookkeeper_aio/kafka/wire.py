"""The parts of the Kafka wire format written by hand (pure, no aiokafka).

* The **request header** v1 (api_key int16, api_version int16, correlation_id int32,
  client_id nullable string), and v2 for ApiVersions v3: the same plus a tagged-field buffer.
  aiokafka's header class cannot decode one.
* **ApiVersions v3**, the one flexible version the gateway serves (librdkafka sends it first):
  its request body is two compact strings and tagged fields; its answer keeps response header
  v0 and has a flexible body (compact array, tagged fields), which aiokafka has no class for.
* **Produce v3-v7** requests, the hot path: one pass with ``struct.unpack_from`` over the
  frame, each partition's record batch sliced out once (aiokafka's generic decoder reads it
  into a second copy and costs ~15 µs a request).

Everything raises :class:`~bookkeeper_aio.kafka.errors.ProtocolDecodeError` on bytes that do
not decode or are left over.
"""

from __future__ import annotations

import struct
from typing import Literal, overload

from . import messages as m
from .errors import ProtocolDecodeError
from .messages import ApiKey

API_VERSIONS_FLEXIBLE = 3
_HEADER = struct.Struct(">hhih")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_PRODUCE_HEAD = struct.Struct(">hii")  # acks, timeout, topic count
_PARTITION_HEAD = struct.Struct(">ii")  # partition, records length
_API_KEY = struct.Struct(">hhhB")  # key, min, max, no tagged fields


def parse_header(frame: bytes) -> tuple[m.RequestHeader, int]:
    """The request header of a frame (size prefix removed) and where the body starts.

    Raises:
        ProtocolDecodeError: the frame is too short for its header.
    """
    if len(frame) < _HEADER.size:
        raise ProtocolDecodeError(f"request of {len(frame)} bytes has no complete header")
    api_key, api_version, correlation_id, length = _HEADER.unpack_from(frame, 0)
    pos = _HEADER.size
    client_id = None
    if length >= 0:
        if pos + length > len(frame):
            raise ProtocolDecodeError("client id runs past the end of the request")
        client_id = frame[pos : pos + length].decode("utf-8", "replace")
        pos += length
    if api_key == ApiKey.API_VERSIONS and api_version == API_VERSIONS_FLEXIBLE:
        pos = _skip_tagged_fields(frame, pos)  # request header v2 (later versions: error 35)
    return m.RequestHeader(api_key, api_version, correlation_id, client_id), pos


def decode_produce(frame: bytes, pos: int) -> m.ProduceRequest:
    """A Produce v3-v7 body (their request layouts are the same).

    Raises:
        ProtocolDecodeError: it does not decode, or bytes are left over.
    """
    try:
        transactional_id, pos = _string(frame, pos, nullable=True)
        acks, timeout_ms, topic_count = _PRODUCE_HEAD.unpack_from(frame, pos)
        pos += _PRODUCE_HEAD.size
        topics = []
        for _ in range(_count(topic_count)):
            name, pos = _string(frame, pos)
            (partition_count,) = _INT32.unpack_from(frame, pos)
            pos += 4
            partitions = []
            for _ in range(_count(partition_count)):
                index, length = _PARTITION_HEAD.unpack_from(frame, pos)
                pos += _PARTITION_HEAD.size
                records = None
                if length >= 0:
                    if pos + length > len(frame):
                        raise ProtocolDecodeError("a record set runs past the end of the request")
                    records = frame[pos : pos + length]
                    pos += length
                partitions.append(m.ProducePartition(index, records))
            topics.append(m.ProduceTopic(name, tuple(partitions)))
    except (struct.error, UnicodeDecodeError) as exc:
        raise ProtocolDecodeError(f"PRODUCE does not decode: {exc}") from exc
    if pos != len(frame):
        raise ProtocolDecodeError(f"PRODUCE: {len(frame) - pos} bytes left over")
    return m.ProduceRequest(transactional_id, acks, timeout_ms, tuple(topics))


def decode_api_versions(version: int, frame: bytes, pos: int) -> m.ApiVersionsRequest:
    """An ApiVersions body: empty up to v2, two compact strings and tagged fields in v3.

    Raises:
        ProtocolDecodeError: it does not decode, or bytes are left over.
    """
    if version < API_VERSIONS_FLEXIBLE:
        if pos != len(frame):
            raise ProtocolDecodeError(f"API_VERSIONS v{version}: {len(frame) - pos} bytes over")
        return m.ApiVersionsRequest()
    name, pos = _compact_string(frame, pos)
    software_version, pos = _compact_string(frame, pos)
    if _skip_tagged_fields(frame, pos) != len(frame):
        raise ProtocolDecodeError("API_VERSIONS v3: bytes left over")
    return m.ApiVersionsRequest(name, software_version)


def encode_api_versions(version: int, r: m.ApiVersionsResponse) -> bytes:
    """An ApiVersions answer body: v0, v1-v2 (throttle time at the end), v3 (flexible)."""
    if version < API_VERSIONS_FLEXIBLE:
        parts = [_INT16.pack(r.error_code), _INT32.pack(len(r.api_keys))]
        parts += [struct.pack(">hhh", k, low, high) for k, low, high in r.api_keys]
        if version >= 1:
            parts.append(_INT32.pack(0))
        return b"".join(parts)
    parts = [_INT16.pack(r.error_code), _uvarint(len(r.api_keys) + 1)]
    parts += [_API_KEY.pack(k, low, high, 0) for k, low, high in r.api_keys]
    parts += [_INT32.pack(0), b"\x00"]  # throttle_time_ms, no tagged fields
    return b"".join(parts)


def _count(n: int) -> int:
    """An array's element count: a null array (-1) holds nothing; other negatives are bad."""
    if n < -1:
        raise ProtocolDecodeError(f"array of {n} elements")
    return max(n, 0)


@overload
def _string(frame: bytes, pos: int, nullable: Literal[False] = False) -> tuple[str, int]: ...


@overload
def _string(frame: bytes, pos: int, nullable: bool) -> tuple[str | None, int]: ...


def _string(frame: bytes, pos: int, nullable: bool = False) -> tuple[str | None, int]:
    (length,) = _INT16.unpack_from(frame, pos)
    pos += 2
    if length < 0:
        if not nullable:
            raise ProtocolDecodeError("a null string where a string is required")
        return None, pos
    if pos + length > len(frame):
        raise ProtocolDecodeError("a string runs past the end of the request")
    return frame[pos : pos + length].decode("utf-8"), pos + length


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_uvarint(frame: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(frame) or shift > 28:
            raise ProtocolDecodeError("malformed unsigned varint")
        byte = frame[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _compact_string(frame: bytes, pos: int) -> tuple[str, int]:
    length, pos = _read_uvarint(frame, pos)
    if length == 0:
        return "", pos
    end = pos + length - 1
    if end > len(frame):
        raise ProtocolDecodeError("compact string runs past the end of the request")
    return frame[pos:end].decode("utf-8", "replace"), end


def _skip_tagged_fields(frame: bytes, pos: int) -> int:
    count, pos = _read_uvarint(frame, pos)
    for _ in range(count):
        _, pos = _read_uvarint(frame, pos)
        size, pos = _read_uvarint(frame, pos)
        pos += size
        if pos > len(frame):
            raise ProtocolDecodeError("tagged field runs past the end of the request")
    return pos
