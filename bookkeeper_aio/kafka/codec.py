"""The Kafka wire codec: the one module that touches aiokafka's protocol classes.

Theory of operation
-------------------
A Kafka request is a frame: int32 size, then the request header v1 (api_key int16,
api_version int16, correlation_id int32, client_id nullable string), then the body. The answer
is int32 size, the correlation id (response header v0) and the body. The gateway advertises
only non-flexible versions, with one exception: ApiVersions v3, which librdkafka sends first.
Its request uses header v2 (a tagged-field buffer after the client id) and a flexible body,
its response keeps header v0 and a flexible body; both are written by hand (``wire.py``), as
are the request header (aiokafka's header class cannot decode one) and Produce requests (the
hot path).

The other bodies are decoded with aiokafka 0.14's request classes (an internal API, pinned in
pyproject.toml) and mapped onto the version-independent dataclasses of ``messages.py``;
responses are encoded from those dataclasses with aiokafka's response schemas, one tuple
layout per version. Nothing outside this module imports aiokafka's protocol package, so a
change there is a change here only.

Bad input: a body that does not decode, or leaves bytes over, is a
:class:`~bookkeeper_aio.kafka.errors.ProtocolDecodeError` (the connection answers nothing
and closes, as Kafka does). An unknown API key or version is answered by
:func:`encode_unsupported` — an ApiVersions v0 body with error 35 and the supported ranges.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from io import BytesIO
from typing import Any

from aiokafka.protocol import (
    commit,
    coordination,
    fetch,
    group,
    metadata,
    offset,
    produce,
    transaction,
)
from aiokafka.protocol.api import RequestStruct
from aiokafka.protocol.types import Array, Bytes, Int16, Int32, Schema, String

from . import messages as m
from . import wire
from .errors import ErrorCode, ProtocolDecodeError
from .messages import ApiKey
from .wire import parse_header

# The versions advertised: what aiokafka 0.14 and librdkafka 2.0 need, none flexible except
# ApiVersions v3 (see docs/kafka.md). JoinGroup stops at 2 (v4+ adds MEMBER_ID_REQUIRED).
SUPPORTED_VERSIONS: dict[ApiKey, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 7),
    ApiKey.FETCH: (4, 11),
    ApiKey.LIST_OFFSETS: (1, 2),
    ApiKey.METADATA: (1, 4),
    ApiKey.OFFSET_COMMIT: (2, 3),
    ApiKey.OFFSET_FETCH: (1, 3),
    ApiKey.FIND_COORDINATOR: (0, 1),
    ApiKey.JOIN_GROUP: (0, 2),
    ApiKey.HEARTBEAT: (0, 1),
    ApiKey.LEAVE_GROUP: (0, 1),
    ApiKey.SYNC_GROUP: (0, 1),
    ApiKey.API_VERSIONS: (0, 3),
    ApiKey.INIT_PRODUCER_ID: (0, 1),
}
_INT32 = struct.Struct(">i")
__all__ = ["api_versions", "decode_request", "encode_response", "encode_unsupported",
           "is_supported", "parse_header"]  # fmt: skip


def is_supported(api_key: int, api_version: int) -> bool:
    """Whether the gateway serves this API at this version."""
    try:
        low, high = SUPPORTED_VERSIONS[ApiKey(api_key)]
    except ValueError:
        return False
    return low <= api_version <= high


def decode_request(header: m.RequestHeader, frame: bytes, body_start: int) -> m.Request:
    """The request's body as a ``messages`` dataclass (the version must be supported).

    Raises:
        ProtocolDecodeError: the body does not decode, or bytes are left over.
    """
    key = ApiKey(header.api_key)
    if key is ApiKey.API_VERSIONS:
        return wire.decode_api_versions(header.api_version, frame, body_start)
    if key is ApiKey.PRODUCE:  # the hot path: by hand, without copying the batches twice
        return wire.decode_produce(frame, body_start)
    cls = _REQUEST_CLASSES[key][header.api_version]
    buf = BytesIO(frame)
    buf.seek(body_start)
    try:
        body = _named(cls.SCHEMA, cls.SCHEMA.decode(buf))
        request = _DECODERS[key](header.api_version, body)
    except (ValueError, TypeError, KeyError, struct.error) as exc:
        raise ProtocolDecodeError(
            f"{key.name} v{header.api_version} does not decode: {exc}"
        ) from exc
    if buf.tell() != len(frame):
        left = len(frame) - buf.tell()
        raise ProtocolDecodeError(f"{key.name} v{header.api_version}: {left} bytes left over")
    return request


def encode_response(header: m.RequestHeader, response: m.Response) -> bytes:
    """The whole answer frame: size, correlation id (header v0), body."""
    key, version = ApiKey(header.api_key), header.api_version
    if key is ApiKey.API_VERSIONS:
        assert isinstance(response, m.ApiVersionsResponse)
        body = wire.encode_api_versions(version, response)
    else:
        schema = _REQUEST_CLASSES[key][version].RESPONSE_TYPE.SCHEMA
        body = schema.encode(_ENCODERS[key](version, response))
    return _frame(header.correlation_id, body)


def encode_unsupported(correlation_id: int) -> bytes:
    """The answer to an unknown API key or version: an ApiVersions v0 body with error 35
    (UNSUPPORTED_VERSION) and the supported ranges, as Kafka answers ApiVersions."""
    return _frame(
        correlation_id, wire.encode_api_versions(0, api_versions(ErrorCode.UNSUPPORTED_VERSION))
    )


def api_versions(error_code: int = 0) -> m.ApiVersionsResponse:
    """The ApiVersions answer: every supported key with its range."""
    ranges = tuple((int(k), low, high) for k, (low, high) in sorted(SUPPORTED_VERSIONS.items()))
    return m.ApiVersionsResponse(error_code, ranges)


def _named(schema: Schema, values: tuple) -> dict[str, Any]:
    """A decoded struct as nested dicts by field name (null arrays stay None)."""
    out: dict[str, Any] = {}
    for name, field, value in zip(schema.names, schema.fields, values, strict=True):
        if isinstance(field, Schema):
            value = _named(field, value)
        elif isinstance(field, Array) and isinstance(field.array_of, Schema) and value is not None:
            value = [_named(field.array_of, v) for v in value]
        out[name] = value
    return out


def _frame(correlation_id: int, body: bytes) -> bytes:
    return _INT32.pack(len(body) + 4) + _INT32.pack(correlation_id) + body


# --- request decoders (decoded structs as dicts -> messages) --------------------------


def _fetch(v: int, b: dict[str, Any]) -> m.FetchRequest:
    key = "offset" if v == 4 else "fetch_offset"
    topics = tuple(
        m.FetchTopic(t["topic"], tuple(m.FetchPartition(p["partition"], p[key], p["max_bytes"])
                                       for p in t["partitions"]))
        for t in b["topics"]
    )  # fmt: skip
    return m.FetchRequest(
        b["max_wait_time"], b["min_bytes"], b["max_bytes"], b["isolation_level"], topics
    )


def _list_offsets(v: int, b: dict[str, Any]) -> m.ListOffsetsRequest:
    topics = tuple(
        (t["topic"], tuple((p["partition"], p["timestamp"]) for p in t["partitions"]))
        for t in b["topics"]
    )
    return m.ListOffsetsRequest(b.get("isolation_level", 0), topics)


def _metadata(v: int, b: dict[str, Any]) -> m.MetadataRequest:
    topics = None if b["topics"] is None else tuple(b["topics"])
    return m.MetadataRequest(topics, b.get("allow_auto_topic_creation", True))


def _offset_commit(v: int, b: dict[str, Any]) -> m.OffsetCommitRequest:
    topics = tuple(
        (t["topic"], tuple((p["partition"], p["offset"], p["metadata"]) for p in t["partitions"]))
        for t in b["topics"]
    )
    return m.OffsetCommitRequest(
        b["consumer_group"], b["consumer_group_generation_id"], b["consumer_id"], topics
    )


def _offset_fetch(v: int, b: dict[str, Any]) -> m.OffsetFetchRequest:
    if b["topics"] is None:
        return m.OffsetFetchRequest(b["consumer_group"], None)
    topics = tuple((t["topic"], tuple(t["partitions"])) for t in b["topics"])
    return m.OffsetFetchRequest(b["consumer_group"], topics)


def _find_coordinator(v: int, b: dict[str, Any]) -> m.FindCoordinatorRequest:
    if v == 0:
        return m.FindCoordinatorRequest(b["consumer_group"], 0)
    return m.FindCoordinatorRequest(b["coordinator_key"], b["coordinator_type"])


def _join_group(v: int, b: dict[str, Any]) -> m.JoinGroupRequest:
    protocols = tuple((p["protocol_name"], p["protocol_metadata"]) for p in b["group_protocols"])
    rebalance = b.get("rebalance_timeout", b["session_timeout"])  # v0: the session timeout
    return m.JoinGroupRequest(
        b["group"], b["session_timeout"], rebalance, b["member_id"], b["protocol_type"], protocols
    )


def _sync_group(v: int, b: dict[str, Any]) -> m.SyncGroupRequest:
    assignments = tuple((a["member_id"], a["member_metadata"]) for a in b["group_assignment"])
    return m.SyncGroupRequest(b["group"], b["generation_id"], b["member_id"], assignments)


_DECODERS: dict[ApiKey, Callable[[int, dict[str, Any]], m.Request]] = {
    ApiKey.FETCH: _fetch,
    ApiKey.LIST_OFFSETS: _list_offsets,
    ApiKey.METADATA: _metadata,
    ApiKey.OFFSET_COMMIT: _offset_commit,
    ApiKey.OFFSET_FETCH: _offset_fetch,
    ApiKey.FIND_COORDINATOR: _find_coordinator,
    ApiKey.JOIN_GROUP: _join_group,
    ApiKey.SYNC_GROUP: _sync_group,
    ApiKey.HEARTBEAT: lambda v, b: m.HeartbeatRequest(
        b["group"], b["generation_id"], b["member_id"]
    ),
    ApiKey.LEAVE_GROUP: lambda v, b: m.LeaveGroupRequest(b["group"], b["member_id"]),
    ApiKey.INIT_PRODUCER_ID: lambda v, b: m.InitProducerIdRequest(
        b["transactional_id"], b["transaction_timeout_ms"]
    ),
}


def _classes(module: Any, name: str, low: int, high: int) -> dict[int, type[RequestStruct]]:
    return {v: getattr(module, f"{name}_v{v}") for v in range(low, high + 1)}


_REQUEST_CLASSES: dict[ApiKey, dict[int, type[RequestStruct]]] = {
    ApiKey.PRODUCE: _classes(produce, "ProduceRequest", 3, 7),
    ApiKey.FETCH: _classes(fetch, "FetchRequest", 4, 11),
    ApiKey.LIST_OFFSETS: _classes(offset, "OffsetRequest", 1, 2),
    ApiKey.METADATA: _classes(metadata, "MetadataRequest", 1, 4),
    ApiKey.OFFSET_COMMIT: _classes(commit, "OffsetCommitRequest", 2, 3),
    ApiKey.OFFSET_FETCH: _classes(commit, "OffsetFetchRequest", 1, 3),
    ApiKey.FIND_COORDINATOR: _classes(coordination, "FindCoordinatorRequest", 0, 1),
    ApiKey.JOIN_GROUP: _classes(group, "JoinGroupRequest", 0, 2),
    ApiKey.HEARTBEAT: _classes(group, "HeartbeatRequest", 0, 1),
    ApiKey.LEAVE_GROUP: _classes(group, "LeaveGroupRequest", 0, 1),
    ApiKey.SYNC_GROUP: _classes(group, "SyncGroupRequest", 0, 1),
    # v1 only changed the broker's throttling behaviour: the same layout as v0.
    ApiKey.INIT_PRODUCER_ID: {v: transaction.InitProducerIdRequest_v0 for v in (0, 1)},
}


# --- response encoders (messages -> each version's tuple layout) --------------------------


def _enc_produce(v: int, r: m.ProduceResponse) -> tuple:
    def part(p: m.ProducePartitionResponse) -> tuple:
        fields = (p.index, p.error_code, p.base_offset, -1)  # timestamp -1: CreateTime
        return (*fields, p.log_start_offset) if v >= 5 else fields

    return ([(name, [part(p) for p in parts]) for name, parts in r.topics], 0)


def _enc_fetch(v: int, r: m.FetchResponse) -> tuple:
    def part(p: m.FetchPartitionResponse) -> tuple:
        # last_stable_offset = high watermark: no transactions, so read_committed (librdkafka's
        # default) sees everything acknowledged.
        head: tuple = (p.index, p.error_code, p.high_watermark, p.high_watermark)
        if v >= 5:
            head = (*head, p.log_start_offset)
        head = (*head, None)  # aborted transactions: none
        return (*head, -1, p.records) if v >= 11 else (*head, p.records)

    topics = [(name, [part(p) for p in parts]) for name, parts in r.topics]
    return (0, r.error_code, 0, topics) if v >= 7 else (0, topics)


def _enc_list_offsets(v: int, r: m.ListOffsetsResponse) -> tuple:
    topics = [
        (name, [(p.index, p.error_code, p.timestamp, p.offset) for p in parts])
        for name, parts in r.topics
    ]
    return (0, topics) if v >= 2 else (topics,)


def _enc_metadata(v: int, r: m.MetadataResponse) -> tuple:
    brokers = [(b.node_id, b.host, b.port, None) for b in r.brokers]
    topics = [
        (t.error_code, t.name, False,
         [(p.error_code, p.index, p.leader, [p.leader], [p.leader]) for p in t.partitions])
        for t in r.topics
    ]  # fmt: skip
    if v == 1:
        return (brokers, r.controller_id, topics)
    body = (brokers, r.cluster_id, r.controller_id, topics)
    return (0, *body) if v >= 3 else body


def _enc_offset_commit(v: int, r: m.OffsetCommitResponse) -> tuple:
    topics = [(name, list(parts)) for name, parts in r.topics]
    return (0, topics) if v >= 3 else (topics,)


def _enc_offset_fetch(v: int, r: m.OffsetFetchResponse) -> tuple:
    topics = [
        (name, [(p.index, p.offset, p.metadata, p.error_code) for p in parts])
        for name, parts in r.topics
    ]
    if v == 1:
        return (topics,)
    return (0, topics, r.error_code) if v >= 3 else (topics, r.error_code)


def _enc_find_coordinator(v: int, r: m.FindCoordinatorResponse) -> tuple:
    if v == 0:
        return (r.error_code, r.node_id, r.host, r.port)
    return (0, r.error_code, None, r.node_id, r.host, r.port)


def _enc_join_group(v: int, r: m.JoinGroupResponse) -> tuple:
    body = (r.error_code, r.generation_id, r.protocol_name, r.leader, r.member_id,
            list(r.members))  # fmt: skip
    return (0, *body) if v >= 2 else body


def _throttled(v: int, body: tuple, first: int) -> tuple:
    """Bodies that gained throttle_time_ms at their front in version ``first``."""
    return (0, *body) if v >= first else body


_ENCODERS: dict[ApiKey, Callable[[int, Any], tuple]] = {
    ApiKey.PRODUCE: _enc_produce,
    ApiKey.FETCH: _enc_fetch,
    ApiKey.LIST_OFFSETS: _enc_list_offsets,
    ApiKey.METADATA: _enc_metadata,
    ApiKey.OFFSET_COMMIT: _enc_offset_commit,
    ApiKey.OFFSET_FETCH: _enc_offset_fetch,
    ApiKey.FIND_COORDINATOR: _enc_find_coordinator,
    ApiKey.JOIN_GROUP: _enc_join_group,
    ApiKey.SYNC_GROUP: lambda v, r: _throttled(v, (r.error_code, r.assignment), 1),
    ApiKey.HEARTBEAT: lambda v, r: _throttled(v, (r.error_code,), 1),
    ApiKey.LEAVE_GROUP: lambda v, r: _throttled(v, (r.error_code,), 1),
    ApiKey.INIT_PRODUCER_ID: lambda v, r: (0, r.error_code, r.producer_id, r.producer_epoch),
}


# --- the consumer protocol (group member metadata and assignments) ------------------------

_SUBSCRIPTION = Schema(("version", Int16), ("topics", Array(String("utf-8"))), ("user_data", Bytes))
_ASSIGNMENT = Schema(
    ("version", Int16),
    ("partitions", Array(("topic", String("utf-8")), ("partitions", Array(Int32)))),
    ("user_data", Bytes),
)


def decode_subscription(data: bytes) -> m.ConsumerSubscription:
    """A consumer-protocol member's JoinGroup metadata (fields of later versions ignored).

    Raises:
        ProtocolDecodeError: it does not decode.
    """
    try:
        _, topics, user_data = _SUBSCRIPTION.decode(BytesIO(data))
    except (ValueError, struct.error) as exc:
        raise ProtocolDecodeError(f"consumer subscription does not decode: {exc}") from exc
    return m.ConsumerSubscription(tuple(topics or ()), user_data)


def decode_assignment(data: bytes) -> m.ConsumerAssignment:
    """A consumer-protocol member's SyncGroup assignment (an empty one is no partitions).

    Raises:
        ProtocolDecodeError: it does not decode.
    """
    if not data:
        return m.ConsumerAssignment(())
    try:
        _, parts, user_data = _ASSIGNMENT.decode(BytesIO(data))
    except (ValueError, struct.error) as exc:
        raise ProtocolDecodeError(f"consumer assignment does not decode: {exc}") from exc
    return m.ConsumerAssignment(tuple((t, tuple(ps)) for t, ps in parts or ()), user_data)


def encode_subscription(s: m.ConsumerSubscription) -> bytes:
    """The JoinGroup metadata a consumer sends (version 0; tests and tools)."""
    return _SUBSCRIPTION.encode((0, list(s.topics), s.user_data))


def encode_assignment(a: m.ConsumerAssignment) -> bytes:
    """The SyncGroup assignment a leader sends (version 0)."""
    return _ASSIGNMENT.encode((0, [(t, list(ps)) for t, ps in a.partitions], a.user_data))
