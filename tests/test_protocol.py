"""The wire codec: round trips, every split point, garbage, limits (hypothesis)."""

from __future__ import annotations

import itertools
import struct
import tracemalloc

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bookkeeper_aio.digest import (
    LacProof,
    entry_digest,
    header_digest,
    pack_entry_record,
    payload_digest,
)
from bookkeeper_aio.errors import FrameTooLargeError, ProtocolError
from bookkeeper_aio.protocol import (
    ADD_ENTRY_HEAD,
    PACKED_ENTRY_PREFIX,
    AddBatchRequest,
    AddBatchResponse,
    AddRequest,
    AddResponse,
    BadFrame,
    BatchFrames,
    BookieInfoRequest,
    BookieInfoResponse,
    ErrorResponse,
    FrameDecoder,
    FrameEncoder,
    HelloRequest,
    HelloResponse,
    LedgerRecordsRequest,
    LedgerRecordsResponse,
    ListEntriesRequest,
    ListEntriesResponse,
    MultiAddRequest,
    MultiAddResponse,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    ScrubRequest,
    ScrubResponse,
    SharedFrame,
    WriteLacRequest,
    WriteLacResponse,
    WriteLafrRequest,
    WriteLafrResponse,
    as_part,
    check_add_entries,
    decode_all,
    describe,
    encode,
    multi_add_parts,
    multi_add_results,
    pack_add_entries,
    pack_multi_add,
    pack_read_entry,
    request_limits,
    unpack_read_entries,
)
from bookkeeper_aio.protocol.validation import _build

i64 = st.integers(-(2**63), 2**63 - 1)
u64 = st.integers(0, 2**64 - 1)
ids = st.integers(0, 2**63 - 1)  # requests name ledgers (and a read its entry) by ids >= 0
small = st.integers(-1, 2**40)
text = st.text(max_size=40)
blob = st.binary(max_size=200)
proofs = st.none() | st.builds(LacProof, i64, i64, u64, u64)
ranges = st.lists(st.lists(small, min_size=2, max_size=2), max_size=5)

MESSAGES = st.one_of(
    st.builds(HelloRequest, i64, i64, text),
    st.builds(AddRequest, i64, ids, i64, i64, blob, i64, blob, u64),
    st.builds(ReadRequest, i64, ids, ids, i64, st.none() | blob, i64, i64),
    st.builds(ReadLacRequest, i64, ids, i64, st.none() | blob),
    st.builds(WriteLacRequest, i64, ids, blob, i64, u64),
    st.builds(ListEntriesRequest, i64, ids, i64, i64),
    st.builds(BookieInfoRequest, i64),
    st.builds(HelloResponse, i64, i64, i64, text),
    st.builds(AddResponse, i64, i64, i64, i64),
    st.builds(
        ReadResponse, i64, i64, i64, i64, st.none() | i64, st.none() | blob, st.none() | u64, proofs
    ),
    st.builds(ReadLacResponse, i64, i64, i64, proofs, i64, i64),
    st.builds(WriteLacResponse, i64, i64, i64),
    st.builds(WriteLafrRequest, i64, ids, blob, i64),
    st.builds(WriteLafrResponse, i64, i64, i64),
    st.builds(ListEntriesResponse, i64, i64, i64, ranges, i64),
    st.builds(BookieInfoResponse, i64, i64, i64, i64, st.booleans(), text),
    st.builds(ErrorResponse, i64, i64, text),
    st.builds(AddBatchRequest, i64, ids, i64, blob, blob),
    st.builds(AddBatchResponse, i64, i64, i64, st.lists(i64)),
    st.builds(ScrubRequest, i64, st.booleans()),
    st.builds(ScrubResponse, i64, *[i64] * 10),
    st.builds(LedgerRecordsRequest, i64, ids, i64),
    st.builds(LedgerRecordsResponse, i64, i64, st.lists(blob, max_size=2), i64),
    st.builds(ReadBatchRequest, i64, ids, ids, ids, i64, st.none() | blob, i64),
    st.builds(ReadBatchResponse, i64, i64, i64, i64, blob, i64, proofs),
)
ADDS = st.one_of(
    st.builds(AddRequest, i64, ids, i64, i64, blob, i64, blob, u64),
    st.builds(AddBatchRequest, i64, ids, i64, blob, blob),
)
ADD_ANSWERS = st.one_of(
    st.builds(AddResponse, i64, i64, i64, i64),
    st.builds(AddBatchResponse, i64, i64, i64, st.lists(i64)),
    st.builds(ErrorResponse, i64, i64, text),
)
MESSAGES = (
    MESSAGES
    | st.builds(MultiAddRequest, i64, st.lists(ADDS.map(as_part), max_size=20))
    | st.builds(MultiAddResponse, i64, i64, st.lists(ADD_ANSWERS.map(as_part), max_size=20))
)


@given(MESSAGES)
def test_every_message_round_trips(msg):
    (decoded,) = FrameDecoder(1 << 20).feed(encode(msg))
    assert decoded == msg and type(decoded) is type(msg)


@given(
    MESSAGES.filter(
        lambda m: not isinstance(m, ReadResponse | ReadLacResponse | ReadBatchResponse)
    ),
    i64,
)
def test_a_shared_frame_is_byte_for_byte_the_plain_frame(msg, request_id):
    # The writer packs an add once for its whole write set (SharedFrame): each bookie must
    # still receive exactly the frame a plain encode would have produced.
    encoder = FrameEncoder()
    shared = SharedFrame(type(msg), *msg[1:])
    plain = encoder.encode(type(msg)(request_id, *msg[1:]))
    assert b"".join(shared.pieces(encoder.packer, request_id)) == plain


@given(ids, i64, st.binary(max_size=40), st.binary(max_size=70_000), i64)
def test_batch_frames_are_byte_for_byte_the_shared_frames(lid, flags, key, entries, rid):
    # A writer packs its ledger's fields once (BatchFrames); every batch's frame must still
    # be the plain frame, alone and as a part (the bin header grows at 256 and 65536 bytes).
    encoder = FrameEncoder()
    framed = BatchFrames(lid, flags, key).frame(entries)
    shared = SharedFrame(AddBatchRequest, lid, flags, key, entries)
    plain = encoder.encode(AddBatchRequest(rid, lid, flags, key, entries))
    assert b"".join(framed.pieces(encoder.packer, rid)) == plain
    assert framed.part_size == shared.part_size and framed.op == shared.op
    assert b"".join(pack_multi_add(encoder.packer, rid, [framed])) == b"".join(
        pack_multi_add(encoder.packer, rid, [shared])
    )


@given(st.lists(ADDS, max_size=40), i64)
def test_a_multi_add_of_shared_frames_is_the_plain_frame_and_gives_back_its_parts(adds, rid):
    # A connection packs the small adds of one loop turn into one MultiAddRequest from the
    # frames the writers packed (no repacking): byte for byte what encode() makes, and the
    # bookie gets back each add as if it had come alone with the multi request's id.
    encoder = FrameEncoder()
    frames = [SharedFrame(type(m), *m[1:]) for m in adds]
    multi = MultiAddRequest(rid, [as_part(m) for m in adds])
    assert b"".join(pack_multi_add(encoder.packer, rid, frames)) == encoder.encode(multi)
    (decoded,) = FrameDecoder(1 << 20).feed(encoder.encode(multi))
    assert multi_add_parts(decoded) == [type(m)(rid, *m[1:]) for m in adds]


@given(st.lists(ADD_ANSWERS, max_size=10), i64)
def test_a_multi_add_response_gives_back_each_answer_with_its_request_id(answers, rid):
    (decoded,) = decode_all(encode(MultiAddResponse(rid, 0, [as_part(a) for a in answers])))
    assert multi_add_results(decoded) == [type(a)(rid, *a[1:]) for a in answers]


# What a hostile bookie may put where an add's answer goes: right and wrong types, zeros that
# are not the integer 0 (False, 0.0), ids out of range, wrong lengths.
_ZEROS = st.sampled_from([0, False, 0.0])
_JUNK = st.one_of(
    _ZEROS, st.none(), st.integers(-(2**64), 2**64), st.binary(max_size=2), st.text(max_size=2)
)


@st.composite
def _answer_like(draw):
    """An OK answer (AddResponse or AddBatchResponse part), maybe with one field, or one
    status, replaced by junk, or cut short or made longer."""
    op = draw(st.sampled_from([AddResponse.OP, AddBatchResponse.OP]))
    last = draw(i64) if op == AddResponse.OP else [0] * draw(st.integers(0, 3))
    answer = [op, 0, draw(i64), last]
    how = draw(st.integers(0, 5))
    if how < 4:
        answer[how] = draw(_JUNK)
    elif how == 4 and type(last) is list and last:
        last[draw(st.integers(0, len(last) - 1))] = draw(_JUNK)
    return answer[: draw(st.integers(1, 4))] if draw(st.booleans()) else answer


_ANSWER_LIKE = _answer_like() | st.lists(_JUNK, max_size=5).map(
    lambda fields: [ErrorResponse.OP, *fields]
)


@settings(max_examples=400)
@given(st.lists(_ANSWER_LIKE, max_size=6), i64)
@example([[AddBatchResponse.OP, 0, 7, [0, False]], [AddBatchResponse.OP, 0, 7, [0.0]]], 1)
@example([[AddBatchResponse.OP, False, 7, []], [AddResponse.OP, 0.0, 7, 1]], 1)
@example([[AddResponse.OP, 0, 2**63, 1], [AddBatchResponse.OP, 0, -(2**63) - 1, []]], 1)
@example([[AddResponse.OP, 0, 7, 2**63], [AddResponse.OP, 0, 7, True]], 1)
def test_the_common_answers_shortcut_decodes_exactly_as_the_generic_checks(results, rid):
    # multi_add_results takes OK answers without _build's machinery: whatever a bookie sends,
    # it must give what _build gives (the message, or a BadFrame).
    (decoded,) = decode_all(encode(MultiAddResponse(rid, 0, [[1]])))
    decoded = decoded._replace(results=results)
    expected = [_build([r[0], rid, *r[1:]]) if r[0] in (AddResponse.OP, AddBatchResponse.OP,
                ErrorResponse.OP) else "bad" for r in results]  # fmt: skip
    got = multi_add_results(decoded)
    for want, have in zip(expected, got, strict=True):
        if want == "bad" or type(want) is BadFrame:
            assert type(have) is BadFrame
        else:
            assert type(have) is type(want) and have == want
            assert [type(x) for x in have] == [type(x) for x in want]


def test_parts_that_are_not_adds_are_bad_frames_not_messages():
    multi = MultiAddRequest(5, [[ReadRequest.OP, 1, 0, 0, None, -1, 0], [AddRequest.OP, 1]])
    (decoded,) = decode_all(encode(multi))
    read, short = multi_add_parts(decoded)
    assert type(read) is BadFrame and "cannot be part" in read.reason
    assert type(short) is BadFrame and short.request_id == 5
    assert isinstance(decode_all(encode(MultiAddRequest(5, [[]])))[0], BadFrame)  # empty part
    answers = MultiAddResponse(5, 0, [[HelloResponse.OP, 0, 3, "b"]])
    assert type(multi_add_results(decode_all(encode(answers))[0])[0]) is BadFrame


@settings(max_examples=60, deadline=None)  # quadratic in the stream: no timed assert (it
@given(st.lists(MESSAGES, min_size=1, max_size=6))  # took 256 ms once on a loaded 2-CPU VM)
def test_a_stream_cut_at_every_split_point_decodes_the_same(messages):
    stream = b"".join(encode(m) for m in messages)
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder(1 << 20)
        out = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:])
        assert out == messages
        assert decoder.buffered_bytes == 0


@given(st.lists(MESSAGES, min_size=1, max_size=6), st.lists(st.integers(0, 10_000), max_size=8))
def test_a_stream_cut_at_many_points_decodes_the_same(messages, cuts):
    stream = b"".join(encode(m) for m in messages)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    decoder = FrameDecoder(1 << 20)
    out = []
    for a, b in itertools.pairwise(points):
        out += decoder.feed(stream[a:b])
    assert out == messages


def test_oversize_and_zero_length_frames_raise():
    with pytest.raises(FrameTooLargeError):
        FrameDecoder(100).feed(struct.pack(">I", 101))
    with pytest.raises(ProtocolError):
        FrameDecoder(100).feed(struct.pack(">I", 0))


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(
    ("body", "request_id"),
    [
        (b"\xc1", -1),  # never-used msgpack byte
        (msgpack.packb({"op": 2}), -1),  # a map, not an array
        (msgpack.packb([]), -1),
        (msgpack.packb([0x42, 9]), 9),  # unknown op
        (msgpack.packb([2, 9, 1]), 9),  # wrong field count
        (msgpack.packb([2, 9, 1, 2, 0, "key", -1, b"p", 5]), 9),  # str where bytes belong
        (msgpack.packb([7, 2**64 - 1]), -1),  # request id out of int64
        (msgpack.packb([2, 9, 1, 2, 0, b"k", -1, b"p", -5]), 9),  # negative uint64 digest
        (msgpack.packb([1, 9, 1, b"\xff"]), 9),  # bytes where str belongs
        (msgpack.packb([7, 9, msgpack.ExtType(1, b"x")]), 9),  # ext types are refused
        (msgpack.packb([3, 9, -7, 0, 1, None, -1, 0]), 9),  # a negative ledger id
        (msgpack.packb([4, 9, 2**63, 1, None]), 9),  # a ledger id past int64
        (b"\x91\xd9\x02\xff\xfe", -1),  # non-UTF-8 str
    ],
)
def test_garbage_bodies_become_bad_frames_with_the_request_id(body, request_id):
    (bad,) = decode_all(frame(body))
    assert type(bad) is BadFrame and bad.request_id == request_id and bad.reason


@given(st.binary(min_size=1, max_size=300))
def test_arbitrary_bodies_never_raise(body):
    for item in FrameDecoder(1 << 20).feed(frame(body)):
        assert isinstance(item, BadFrame) or hasattr(item, "OP")


def nested(depth: int, leaf: bytes = b"\xc0") -> bytes:
    return b"\x91" * depth + leaf


@pytest.mark.parametrize("depth", [10, 1000, 1023, 1024, 5000])
def test_deep_nesting_is_a_bad_frame_that_names_the_request(depth):
    # [4, 9, <ledger id nested depth deep>, 0, nil]: a bookie answers it and keeps the
    # connection (the error text once took repr() of the field: RecursionError).
    body = b"\x95\x04\x09" + nested(depth) + b"\x00\xc0"
    (bad,) = FrameDecoder(1 << 20, request_limits(1024)).feed(frame(body))
    assert type(bad) is BadFrame and bad.request_id == 9 and len(bad.reason) < 200


def test_describe_is_short_whatever_the_value():
    deep: list = []
    for _ in range(3000):
        deep = [deep]
    for value in (deep, b"x" * (5 << 20), "y" * 70_000, 2**70, 1.5, None, {"a": 1}):
        assert len(describe(value)) < 80


def frame_of_arrays(total_bytes: int, op: int, leaf: bytes, width: int = 1024) -> bytes:
    """[op, 9, [[leaf * width] * n]]: a frame whose bytes are almost all tiny objects."""
    inner = b"\xdc" + width.to_bytes(2, "big") + leaf * width
    count = total_bytes // len(inner)
    return b"\x93" + bytes([op]) + b"\x09\xdc" + count.to_bytes(2, "big") + inner * count


@pytest.mark.parametrize("leaf", [b"\x90", b"\xa2ab", b"\x91\xc0", b"\xcd\x01\x02"])
@pytest.mark.parametrize("op", [MultiAddRequest.OP, AddRequest.OP])
def test_a_frame_of_tiny_objects_is_refused_within_its_object_budget(op, leaf):
    # 4 MiB of empty arrays decoded whole would be ~360 MB of lists; the budget stops it.
    body = frame_of_arrays(4 << 20, op, leaf)
    decoder = FrameDecoder(5 << 20, request_limits(1024))
    tracemalloc.start()
    try:
        (bad,) = decoder.feed(frame(body))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert type(bad) is BadFrame and bad.request_id == 9, bad
    assert peak < 16 << 20, peak  # the frame itself is 4 MiB


def test_a_multi_add_of_a_million_parts_is_refused_before_it_is_decoded():
    body = b"\x93\x09\x09\xdd" + (1 << 20).to_bytes(4, "big") + b"\x91\x02" * (1 << 20)
    (bad,) = FrameDecoder(5 << 20, request_limits(1024)).feed(frame(body))
    assert type(bad) is BadFrame and bad.request_id == 9 and "max_array_len" in bad.reason


def test_oversize_strings_are_refused():
    body = msgpack.packb([1, 3, 1, "x" * 70_000])
    (bad,) = decode_all(frame(body))
    assert type(bad) is BadFrame


ENTRIES = st.lists(st.tuples(i64, i64, u64, u64, blob), max_size=8)


def unpack(data: bytes, start: int = 0) -> list[tuple[int, int, int, int, bytes]]:
    """check_add_entries without the digest check, records as bytes."""
    return [(*c[:4], bytes(c[4])) for c in check_add_entries(0, data, start)]


@given(ENTRIES, st.binary(max_size=9))
def test_packed_entries_unpack_to_their_stored_records(entries, before):
    packed = pack_add_entries(entries)
    assert unpack(before + packed, len(before)) == [
        (e, lac, pd, d, pack_entry_record(lac, pd, d, p)) for e, lac, pd, d, p in entries
    ]
    assert len(packed) == sum(ADD_ENTRY_HEAD.size + len(p) for *_, p in entries)


@given(ENTRIES.filter(bool), st.data())
def test_packed_entries_cut_anywhere_but_between_entries_are_refused(entries, data):
    packed = pack_add_entries(entries)
    bounds = {len(pack_add_entries(entries[:i])) for i in range(len(entries) + 1)}
    cut = data.draw(st.integers(0, len(packed)))
    if cut in bounds:
        assert len(unpack(packed[:cut])) == sorted(bounds).index(cut)
    else:
        with pytest.raises(ValueError):
            unpack(packed[:cut])


@given(st.binary(max_size=300))
def test_garbage_packed_entries_parse_or_raise_value_error(data):
    try:
        entries = unpack(data)
    except ValueError:
        return
    assert sum(PACKED_ENTRY_PREFIX.size + len(e[4]) for e in entries) == len(data)


@given(ENTRIES, st.lists(st.booleans()), st.integers(0, 2**63 - 1))
def test_check_add_entries_checks_both_digests(entries, honest, ledger_id):
    """What a bookie checks per add: the payload hashes to its digest, the header to its."""
    entries = [  # some with their true digests, the rest arbitrary
        (e, lac, payload_digest(p), entry_digest(ledger_id, e, lac, p), p)
        if h
        else (e, lac, pd, d, p)
        for (e, lac, pd, d, p), h in zip(entries, honest + [False] * len(entries), strict=False)
    ]
    packed = pack_add_entries(entries)
    checked = check_add_entries(ledger_id, packed)
    assert [c[5] for c in checked] == [
        payload_digest(p) == pd and header_digest(ledger_id, e, lac, pd) == d
        for e, lac, pd, d, p in entries
    ]
    assert all(c[5] for c, h in zip(checked, honest, strict=False) if h)


@pytest.mark.parametrize("size", [0, 255, 256, 65535, 65536, 300_000])
def test_a_shared_frame_ending_in_bytes_of_any_size_is_the_plain_frame(size):
    msg = AddBatchRequest(9, 7, 0, b"k" * 20, bytes(size))
    encoder = FrameEncoder()
    shared = SharedFrame(AddBatchRequest, *msg[1:]).pieces(encoder.packer, 9)
    assert shared[-1] is msg.entries  # the entries are sent as they are, not copied
    assert b"".join(shared) == encoder.encode(msg)


def test_a_small_multi_add_may_have_many_tiny_parts():
    parts = [as_part(AddRequest(0, 5, i, 0, b"k", -1, b"", 0)) for i in range(200)]
    body = encode(MultiAddRequest(3, parts))
    assert len(body) < 4096
    (msg,) = FrameDecoder(5 << 20, request_limits(1024)).feed(body)
    assert type(msg) is MultiAddRequest and len(msg.parts) == 200


big_blob = blob.map(lambda b: b + bytes(4100))
BIG_ADDS = st.one_of(
    st.builds(AddRequest, i64, ids, i64, i64, blob, i64, big_blob, u64),
    st.builds(AddBatchRequest, i64, ids, i64, blob, big_blob),
)
BIG_REQUESTS = st.one_of(
    BIG_ADDS,
    st.builds(HelloRequest, i64, i64, text.map(lambda t: t + "x" * 4100)),
    st.builds(MultiAddRequest, i64, st.lists(BIG_ADDS.map(as_part), min_size=1, max_size=3)),
    st.builds(
        lambda rid, n: MultiAddRequest(
            rid, [as_part(AddRequest(0, 1, i, 0, b"k", 0, b"pp", i)) for i in range(n)]
        ),
        i64,
        st.integers(300, 1024),
    ),
)


@settings(max_examples=50)
@given(BIG_REQUESTS)
def test_big_requests_round_trip_under_a_bookies_limits(msg):
    (decoded,) = FrameDecoder(5 << 20, request_limits(1024)).feed(encode(msg))
    assert decoded == msg


@settings(max_examples=50)
@given(st.binary(max_size=5000).map(lambda b: b"\x93\x09\x01" + b + bytes(4100)))
def test_arbitrary_big_bodies_never_raise_under_a_bookies_limits(body):
    for item in FrameDecoder(1 << 20, request_limits(1024)).feed(frame(body)):
        assert isinstance(item, BadFrame) or hasattr(item, "OP")


@given(st.lists(st.tuples(ids, i64, u64, blob), max_size=8), st.integers(1, 40))
def test_read_entries_unpack_as_packed_and_a_cut_is_refused(entries, cut):
    records = [
        (eid, pack_entry_record(lac, payload_digest(payload), digest, payload))
        for eid, lac, digest, payload in entries
    ]
    data = b"".join(b"".join(pack_read_entry(eid, rec)) for eid, rec in records)
    assert unpack_read_entries(data) == entries
    if entries:  # cut inside the last entry
        last = 12 + 24 + len(entries[-1][3])  # its prefix, record header and payload
        with pytest.raises(ValueError):
            unpack_read_entries(data[: len(data) - min(cut, last - 1)])
