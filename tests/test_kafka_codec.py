"""The Kafka codec, record batch validation and producer sequences (pure)."""

from __future__ import annotations

import io
import struct
from typing import Any

import pytest
from aiokafka.protocol import commit, coordination, fetch, group, metadata, offset, produce
from aiokafka.protocol.api import RequestHeader_v1
from aiokafka.protocol.transaction import InitProducerIdRequest_v0
from aiokafka.protocol.types import Array, Boolean, Bytes, Int8, Int16, Int32, Int64, Schema, String
from hypothesis import given, settings
from hypothesis import strategies as st

from bookkeeper_aio.kafka import codec
from bookkeeper_aio.kafka import messages as m
from bookkeeper_aio.kafka.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    ErrorCode,
    KafkaError,
    ProtocolDecodeError,
)
from bookkeeper_aio.kafka.messages import ApiKey
from bookkeeper_aio.kafka.offset_index import OffsetIndex
from bookkeeper_aio.kafka.records import parse_header, span, validate_batch, with_base_offset
from bookkeeper_aio.kafka.sequences import ProducerSequences
from tests.kafka_support import batch

REQUESTS = [
    produce.ProduceRequest_v3(None, -1, 1000, [("t", [(0, b"data")])]),
    produce.ProduceRequest_v7(None, 1, 1000, [("t", [(1, None)])]),
    fetch.FetchRequest_v4(-1, 500, 1, 1 << 20, 1, [("t", [(0, 5, 1000)])]),
    fetch.FetchRequest_v11(-1, 500, 1, 1 << 20, 0, 0, -1, [("t", [(2, -1, 9, 0, 100)])], [], ""),
    offset.OffsetRequest_v1(-1, [("t", [(0, -2)])]),
    offset.OffsetRequest_v2(-1, 1, [("t", [(0, -1)])]),
    metadata.MetadataRequest_v1(None),
    metadata.MetadataRequest_v4(["a", "b"], False),
    commit.OffsetCommitRequest_v2("g", 3, "m", -1, [("t", [(0, 42, "md")])]),
    commit.OffsetFetchRequest_v3("g", None),
    coordination.FindCoordinatorRequest_v0("g"),
    coordination.FindCoordinatorRequest_v1("g", 0),
    group.JoinGroupRequest_v0("g", 10000, "", "consumer", [("range", b"x")]),
    group.JoinGroupRequest_v2("g", 10000, 30000, "m", "consumer", [("range", b"x")]),
    group.SyncGroupRequest_v1("g", 1, "m", [("m", b"a")]),
    group.HeartbeatRequest_v1("g", 1, "m"),
    group.LeaveGroupRequest_v0("g", "m"),
    InitProducerIdRequest_v0(None, 60000),
]


def decode(request) -> m.Request:
    data = RequestHeader_v1(request, 77, "client").encode() + request.encode()
    header, pos = codec.parse_header(data)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        request.API_KEY, request.API_VERSION, 77, "client",
    )  # fmt: skip
    return codec.decode_request(header, data, pos)


@pytest.mark.parametrize("request_", REQUESTS, ids=lambda r: type(r).__name__)
def test_every_request_kind_decodes(request_):
    decoded = decode(request_)
    if isinstance(decoded, m.FetchRequest):
        assert decoded.topics[0].partitions[0].fetch_offset in (5, 9)
    if isinstance(decoded, m.JoinGroupRequest):
        assert decoded.rebalance_timeout_ms in (10000, 30000)  # v0: the session timeout
    if isinstance(decoded, m.MetadataRequest):
        assert decoded.topics in (None, ("a", "b"))


def test_trailing_bytes_and_truncation_are_decode_errors():
    r = metadata.MetadataRequest_v1(["t"])
    data = RequestHeader_v1(r, 1, None).encode() + r.encode()
    header, pos = codec.parse_header(data)
    with pytest.raises(ProtocolDecodeError):
        codec.decode_request(header, data + b"\x00", pos)
    with pytest.raises(ProtocolDecodeError):
        codec.decode_request(header, data[:-1], pos)
    with pytest.raises(ProtocolDecodeError):
        codec.parse_header(data[:5])


P, F, LO = m.ProducePartitionResponse, m.FetchPartitionResponse, m.ListOffsetsPartitionResponse
RESPONSES = [
    (produce.ProduceRequest_v3, m.ProduceResponse((("t", (P(0, 0, 5),)),))),
    (produce.ProduceRequest_v7, m.ProduceResponse((("t", (P(0, 6),)),))),
    (fetch.FetchRequest_v4, m.FetchResponse((("t", (F(0, 0, 9, 0, b"r"),)),))),
    (fetch.FetchRequest_v11, m.FetchResponse((("t", (F(0, 1),)),))),
    (offset.OffsetRequest_v2, m.ListOffsetsResponse((("t", (LO(0, 0, 7),)),))),
    (metadata.MetadataRequest_v2, m.MetadataResponse(
        (m.Broker(1, "h", 9),), "c", 1, (m.TopicMetadata(0, "t", (m.PartitionMetadata(0, 0, 1),)),)
    )),
    (commit.OffsetCommitRequest_v3, m.OffsetCommitResponse((("t", ((0, 0),)),))),
    (commit.OffsetFetchRequest_v1,
     m.OffsetFetchResponse((("t", (m.OffsetFetchPartitionResponse(0, 4),)),))),
    (coordination.FindCoordinatorRequest_v1, m.FindCoordinatorResponse(0, 1, "h", 9)),
    (group.JoinGroupRequest_v2, m.JoinGroupResponse(0, 1, "range", "a", "a", (("a", b"md"),))),
    (group.SyncGroupRequest_v0, m.SyncGroupResponse(0, b"as")),
    (group.HeartbeatRequest_v1, m.HeartbeatResponse(27)),
    (InitProducerIdRequest_v0, m.InitProducerIdResponse(0, 1000, 0)),
]  # fmt: skip


@pytest.mark.parametrize("cls,response", RESPONSES, ids=lambda x: getattr(x, "__name__", ""))
def test_responses_decode_with_the_clients_classes(cls, response):
    header = m.RequestHeader(cls.API_KEY, cls.API_VERSION, 5, None)
    data = codec.encode_response(header, response)
    assert struct.unpack(">ii", data[:8]) == (len(data) - 4, 5)
    body = io.BytesIO(data[8:])
    cls.RESPONSE_TYPE.decode(body)
    assert body.tell() == len(data) - 8  # the version's schema takes every byte


def test_consumer_protocol_round_trip():
    sub = m.ConsumerSubscription(("a", "b"), b"u")
    assert codec.decode_subscription(codec.encode_subscription(sub)) == sub
    assignment = m.ConsumerAssignment((("a", (0, 2)),), None)
    assert codec.decode_assignment(codec.encode_assignment(assignment)) == assignment
    with pytest.raises(ProtocolDecodeError):
        codec.decode_subscription(b"\x00")


# --- record batches --------------------------------------------------------------------


def test_a_valid_batch_and_the_base_offset_rewrite():
    data = batch([b"a", b"b", b"c"], producer_id=5, epoch=1, sequence=10)
    header = validate_batch(data, 1 << 20)
    assert (header.record_count, header.offset_span, header.last_sequence) == (3, 3, 12)
    rewritten = with_base_offset(data, 1_000)
    assert validate_batch(bytes(rewritten), 1 << 20).base_offset == 1_000  # CRC still valid
    assert span(rewritten) == (1_000, 1_003)


@settings(deadline=None)
@given(st.integers(21, 80), st.integers(1, 255))
def test_any_flipped_byte_the_crc_covers_is_refused(position, flip):
    data = bytearray(batch([b"payload-one", b"payload-two"]))
    position = min(position, len(data) - 1)
    data[position] ^= flip
    with pytest.raises(KafkaError):  # the CRC (or the count check) catches it
        validate_batch(bytes(data), 1 << 20)


def test_batch_limits():
    with pytest.raises(BatchTooLargeError):
        validate_batch(batch([b"x" * 100]), 50)
    with pytest.raises(CorruptBatchError):
        validate_batch(None, 100)
    with pytest.raises(CorruptBatchError):
        parse_header(b"\x00" * 10)


# --- producer sequences --------------------------------------------------------------


def header_for(producer_id: int, epoch: int, sequence: int, count: int = 1):
    return parse_header(batch([b"x"] * count, producer_id, epoch, sequence))


def test_sequences_duplicates_gaps_and_epochs():
    seq = ProducerSequences(producers_max=2)
    h = header_for(1, 0, 0, 3)
    assert seq.check(h) is None
    seq.record(h, 100, token="t1")
    dup = seq.check(h)
    assert dup is not None and (dup.original.base_offset, dup.original.token) == (100, "t1")
    with pytest.raises(KafkaError) as exc:
        seq.check(header_for(1, 0, 5))
    assert exc.value.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert seq.check(header_for(1, 0, 3)) is None
    with pytest.raises(KafkaError) as exc:
        seq.check(header_for(1, 1, 4))  # a new epoch starts at 0
    assert exc.value.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    seq.record(header_for(1, 1, 0), 200)
    with pytest.raises(KafkaError) as exc:
        seq.check(header_for(1, 0, 3))
    assert exc.value.code == ErrorCode.INVALID_PRODUCER_EPOCH
    for pid in (2, 3):  # bounded: the least recently used producer goes
        seq.record(header_for(pid, 0, 0), 300)
    assert len(seq) == 2 and seq.check(header_for(1, 1, 77)) is None  # forgotten: accepted


@settings(deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=30), st.data())
def test_sequences_accept_in_order_batches_and_flag_every_retry(counts, data):
    seq = ProducerSequences(10)
    next_seq, offset, sent = 0, 0, []
    for count in counts:
        h = header_for(9, 0, next_seq, count)
        assert seq.check(h) is None
        seq.record(h, offset)
        sent.append((h, offset))
        next_seq, offset = next_seq + count, offset + count
        if data.draw(st.booleans()):  # a retry of one of the last five: a duplicate
            h_old, off_old = data.draw(st.sampled_from(sent[-5:]))
            dup = seq.check(h_old)
            assert dup is not None and dup.original.base_offset == off_old


# --- the offset index --------------------------------------------------------------------


@settings(deadline=None)
@given(
    st.lists(st.integers(1, 20), min_size=1, max_size=200),  # records per batch
    st.lists(st.integers(1, 40), min_size=1, max_size=8),  # entries per segment
    st.integers(0, 100),  # how many of the last entries this gateway appended itself
)
async def test_offset_index_finds_the_entry_holding_every_kafka_offset(counts, cuts, own):
    bases = [sum(counts[:i]) for i in range(len(counts))]
    segments, first = [], 0
    for cut in cuts:
        if first < len(counts):
            last = min(len(counts), first + cut) - 1
            segments.append((first, last))
            first = last + 1
    if first < len(counts):
        segments.append((first, len(counts) - 1))
    index = OffsetIndex(own_entries_max=64, cached_entries_max=16)
    for log_offset in range(max(0, len(counts) - own), len(counts)):
        index.appended(log_offset, bases[log_offset])

    async def read_base(log_offset: int) -> int:
        return bases[log_offset]

    async def segments_():
        return segments

    for kafka_offset in range(sum(counts)):
        found = await index.locate(kafka_offset, segments_, read_base)
        assert bases[found] <= kafka_offset < bases[found] + counts[found]


# --- the hand-written produce decoder and garbage -----------------------------------------

names = st.text(alphabet="abcdefghij.-_", min_size=1, max_size=12)
produce_bodies = st.tuples(
    st.one_of(st.none(), names),
    st.sampled_from([-1, 0, 1]),
    st.integers(0, 2**31 - 1),
    st.lists(
        st.tuples(names, st.lists(st.tuples(st.integers(0, 99), st.one_of(st.none(), st.binary())),
                                  max_size=3)),
        max_size=3,
    ),
)  # fmt: skip


@settings(deadline=None)
@given(produce_bodies, st.integers(3, 7))
def test_the_hand_written_produce_decoder_agrees_with_the_clients_encoder(body, version):
    txn, acks, timeout, topics = body
    cls = getattr(produce, f"ProduceRequest_v{version}")
    decoded = decode(cls(txn, acks, timeout, topics))
    assert decoded == m.ProduceRequest(txn, acks, timeout, tuple(
        m.ProduceTopic(t, tuple(m.ProducePartition(i, r) for i, r in ps)) for t, ps in topics
    ))  # fmt: skip


@settings(deadline=None)
@given(st.sampled_from(sorted(codec.SUPPORTED_VERSIONS)), st.integers(0, 11), st.binary())
def test_garbage_bodies_are_decode_errors_and_nothing_else(key, version, body):
    low, high = codec.SUPPORTED_VERSIONS[key]
    header = m.RequestHeader(key, min(max(version, low), high), 1, None)
    try:
        codec.decode_request(header, body, 0)
    except ProtocolDecodeError:
        pass


# --- every advertised version, not a sample of them ----------------------------------------


def _minimal(kind: Any) -> Any:
    """The smallest value of an aiokafka schema type that encodes (one element per array)."""
    if isinstance(kind, Schema):
        return tuple(_minimal(field) for field in kind.fields)
    if isinstance(kind, Array):
        return [_minimal(kind.array_of)]
    if isinstance(kind, String):
        return "t"
    if kind is Bytes:
        return b"x"
    if kind is Boolean:
        return False
    assert kind in (Int8, Int16, Int32, Int64), kind
    return 0


ADVERTISED = [
    (key, version)
    for key, (low, high) in sorted(codec.SUPPORTED_VERSIONS.items())
    if key is not ApiKey.API_VERSIONS  # by hand in wire.py; tests/test_kafka_gateway.py
    for version in range(low, high + 1)
]
SAMPLE_RESPONSES = {cls.API_KEY: response for cls, response in RESPONSES} | {
    ApiKey.LEAVE_GROUP: m.LeaveGroupResponse(0),
}


@pytest.mark.parametrize("key,version", ADVERTISED, ids=lambda x: str(getattr(x, "name", x)))
def test_every_advertised_version_decodes_requests_and_encodes_answers(key, version):
    """Requests as aiokafka's class of that exact version encodes them decode with every byte
    taken, and answers decode with the client's response class of that version."""
    cls = codec._REQUEST_CLASSES[key][version]
    request = cls(*_minimal(cls.SCHEMA))
    # Header v1 of this version (aiokafka has one InitProducerId class for v0 and v1).
    data = struct.pack(">hhih", key, version, 77, 6) + b"client" + request.encode()
    header, pos = codec.parse_header(data)
    assert (header.api_key, header.api_version, header.client_id) == (key, version, "client")
    assert isinstance(codec.decode_request(header, data, pos), m.Request)
    answer = codec.encode_response(header, SAMPLE_RESPONSES[key])
    body = io.BytesIO(answer[8:])
    cls.RESPONSE_TYPE.decode(body)
    assert body.tell() == len(answer) - 8
