"""Wire messages and the sans-IO codec: bytes in, messages out (docs/protocol.md).

Theory of operation
-------------------
A connection carries frames in both directions. A frame is a 4-byte big-endian body length
followed by a msgpack body. The body is always a positional array ``[op, request_id, ...]``;
``op`` picks the message type, responses use ``op | 0x80`` and echo the request id, so many
requests can be in flight on one connection and answers may come back in any order.

Each message type is a ``NamedTuple`` (immutable, typed, positional: it *is* the frame's field
list, and builds 4-8x faster than a frozen dataclass, which matters at 100k messages/s).
:func:`encode` packs a message; :class:`FrameDecoder` turns a byte stream, cut at any point,
into messages. A frame whose length is fine but whose contents are not a valid message (not
msgpack, unknown op, wrong field count or type) becomes a :class:`BadFrame` carrying the
request id when one could be read, so the server can answer it and keep the connection. A
frame whose declared length exceeds ``frame_bytes_max`` (or is zero) raises
:class:`~bookkeeper_aio.errors.FrameTooLargeError` / :class:`~bookkeeper_aio.errors.ProtocolError`:
the stream cannot be trusted any more and that one connection is closed.

Nothing here does I/O, reads a clock or knows about asyncio.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, final

import msgpack
from xxhash import xxh3_64_intdigest

from .bounded_msgpack import (
    ARRAY_LEN_MAX,
    SMALL_BODY_BYTES,
    BodyDecoder,
    DecodeLimits,
    peek_request_id,
)
from .digest import ENTRY_RECORD_HEADER, HEADER, LacProof
from .errors import FrameTooLargeError, ProtocolError

# 2: AddBatchRequest carries packed stored records; 3: MultiAddRequest; 4: ScrubRequest and
# LedgerRecordsRequest (operator requests), WriteLafrRequest and
# ReadLacResponse.last_add_fully_replicated (guaranteed write quorum); 5: ReadBatchRequest
PROTOCOL_VERSION = 5
FRAME_HEADER = struct.Struct(">I")
RESPONSE_BIT = 0x80
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1

# Flags of AddRequest / AddBatchRequest
ADD_FLAG_RECOVERY = 0x1
# With ADD_FLAG_RECOVERY only (autorecovery's copies): answered once stored in the engine, not
# journaled; durable with the bookie's next engine sync, which a ListEntriesRequest of the
# ledger waits for (BookKeeper's DEFERRED_SYNC and force, docs/durability.md).
ADD_FLAG_DEFERRED_SYNC = 0x2
# Flags of ReadRequest / ReadLacRequest
READ_FLAG_FENCE = 0x1
READ_FLAG_LONG_POLL = 0x2


# --- requests -----------------------------------------------------------------------------
# Each message is a subclass of a NamedTuple of its fields that adds the class constant OP: a
# NamedTuple's own body may hold only fields for a type checker. The subclass has no __dict__
# (__slots__ = ()) and builds and reads as fast as the NamedTuple itself.


class _HelloRequestFields(NamedTuple):
    request_id: int
    protocol_version: int
    client_name: str


class HelloRequest(_HelloRequestFields):
    """First frame of every connection: the client's protocol version."""

    __slots__ = ()
    OP = 1


class _AddRequestFields(NamedTuple):
    request_id: int
    ledger_id: int
    entry_id: int
    flags: int  # ADD_FLAG_RECOVERY
    master_key: bytes
    lac: int
    payload: bytes
    digest: int


class AddRequest(_AddRequestFields):
    """Store one entry. ``digest`` covers (ledger_id, entry_id, lac, payload)."""

    __slots__ = ()
    OP = 2


class _ReadRequestFields(NamedTuple):
    request_id: int
    ledger_id: int
    entry_id: int
    flags: int
    master_key: bytes | None  # required with READ_FLAG_FENCE
    previous_lac: int  # long poll: wait until the bookie's LAC > previous_lac
    timeout_ms: int  # long poll: give up after this long (the bookie clamps it)


class ReadRequest(_ReadRequestFields):
    """Read one entry; may fence (READ_FLAG_FENCE) or long-poll (READ_FLAG_LONG_POLL)."""

    __slots__ = ()
    OP = 3


class _ReadLacRequestFields(NamedTuple):
    request_id: int
    ledger_id: int
    flags: int  # READ_FLAG_FENCE
    master_key: bytes | None


class ReadLacRequest(_ReadLacRequestFields):
    """Read the highest LAC the bookie knows for a ledger; may fence."""

    __slots__ = ()
    OP = 4


class _WriteLacRequestFields(NamedTuple):
    request_id: int
    ledger_id: int
    master_key: bytes
    lac: int
    digest: int


class WriteLacRequest(_WriteLacRequestFields):
    """Store an explicit LAC record (the writer's LAC when it has nothing to add)."""

    __slots__ = ()
    OP = 5


class _ListEntriesRequestFields(NamedTuple):
    request_id: int
    ledger_id: int
    start_entry_id: int
    max_count: int


class ListEntriesRequest(_ListEntriesRequestFields):
    """List the entry ids a bookie holds for a ledger, from ``start_entry_id``."""

    __slots__ = ()
    OP = 6


class _BookieInfoRequestFields(NamedTuple):
    request_id: int


class BookieInfoRequest(_BookieInfoRequestFields):
    """Ask for the bookie's disk space and state."""

    __slots__ = ()
    OP = 7


class _AddBatchRequestFields(NamedTuple):
    request_id: int
    ledger_id: int
    flags: int  # ADD_FLAG_RECOVERY
    master_key: bytes
    entries: bytes


class AddBatchRequest(_AddBatchRequestFields):
    """Store several entries of one ledger: each as an AddRequest would, one answer for all.

    ``entries`` is the entries packed by :func:`pack_add_entries`: per entry its id, the
    length of its record, then the record exactly as a bookie stores it (LAC, payload digest,
    digest, payload). The writer builds each record once for its whole write set; the bookie
    checks the digests and stores the records as they came, and its journal writes the
    whole field as the body of one record. A writer sends one per bookie per event-loop turn
    when it has more than one add for that bookie.
    """

    __slots__ = ()
    OP = 8


class _MultiAddRequestFields(NamedTuple):
    request_id: int
    parts: list[list[Any]]


class MultiAddRequest(_MultiAddRequestFields):
    """Several add requests (of any ledgers) in one frame, answered together.

    Each of ``parts`` is an :class:`AddRequest` or :class:`AddBatchRequest` written as
    ``[op, field, ...]`` without its request id (the parts share this request's): the bookie
    handles them in order, exactly as if each had come alone, and answers once every part has
    its answer (:class:`MultiAddResponse`). A client sends one per bookie per event-loop turn
    when several writers (ledgers) have adds for that bookie: at a few entries per ledger and
    turn, the cost of a request (its frame, its id, its answer) is most of the cost of an add.
    """

    __slots__ = ()
    OP = 9


class _ScrubRequestFields(NamedTuple):
    request_id: int
    start: bool


class ScrubRequest(_ScrubRequestFields):
    """Ask for the state of the bookie's scrubber (BP-31 bit rot); ``start``: also have a pass
    run now (after the running one, if any). ``shell scrub`` polls with it for its progress."""

    __slots__ = ()
    OP = 10


class _LedgerRecordsRequestFields(NamedTuple):
    request_id: int
    start_ledger_id: int
    max_count: int


class LedgerRecordsRequest(_LedgerRecordsRequestFields):
    """Page through what the bookie keeps per ledger, from ``start_ledger_id`` (the metadata
    recovery tool: ``shell recover-metadata``)."""

    __slots__ = ()
    OP = 11


class _WriteLafrRequestFields(NamedTuple):
    request_id: int
    ledger_id: int
    master_key: bytes
    lafr: int


class WriteLafrRequest(_WriteLafrRequestFields):
    """Guaranteed write quorum: the writer's LAFR (last add fully replicated: it and every
    earlier entry have WQ copies), sent now and then. A hint that lets a recovery start
    reading there instead of at the first entry of the last segment; kept in memory only."""

    __slots__ = ()
    OP = 12


class _ReadBatchRequestFields(NamedTuple):
    request_id: int
    ledger_id: int
    first_entry_id: int
    max_count: int
    flags: int  # READ_FLAG_FENCE (no long poll)
    master_key: bytes | None  # required with READ_FLAG_FENCE
    max_bytes: int  # the answer's packed entries stop before passing it (one entry at least)


class ReadBatchRequest(_ReadBatchRequestFields):
    """Read up to ``max_count`` consecutive entries from ``first_entry_id`` in one answer
    (BookKeeper 4.17's batch read), as that many ReadRequests would; may fence.
    Recovery reads a long tail with it where every bookie holds every entry (E == WQ)."""

    __slots__ = ()
    OP = 13


MULTI_ADD_PART_OPS = frozenset({AddRequest.OP, AddBatchRequest.OP})


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


# --- responses ----------------------------------------------------------------------------


class _HelloResponseFields(NamedTuple):
    request_id: int
    status: int
    protocol_version: int
    bookie_id: str


class HelloResponse(_HelloResponseFields):
    __slots__ = ()
    OP = HelloRequest.OP | RESPONSE_BIT


class _AddResponseFields(NamedTuple):
    request_id: int
    status: int
    ledger_id: int
    entry_id: int


class AddResponse(_AddResponseFields):
    __slots__ = ()
    OP = AddRequest.OP | RESPONSE_BIT


class _AddBatchResponseFields(NamedTuple):
    request_id: int
    status: int
    ledger_id: int
    statuses: Sequence[int]  # a list


class AddBatchResponse(_AddBatchResponseFields):
    """``statuses[i]`` answers ``entries[i]``; ``status`` is OK or, if any failed, the first
    failure (a request-level error leaves ``statuses`` empty)."""

    __slots__ = ()
    OP = AddBatchRequest.OP | RESPONSE_BIT


class _MultiAddResponseFields(NamedTuple):
    request_id: int
    status: int
    results: list[list[Any]]


class MultiAddResponse(_MultiAddResponseFields):
    """``results[i]`` answers ``parts[i]``: the response that part would have had alone,
    as ``[op, field, ...]`` without its request id (an :class:`AddResponse`,
    :class:`AddBatchResponse`, or :class:`ErrorResponse` for a part that is not a valid add).
    ``status`` is OK, or the status of a request refused as a whole (``results`` empty)."""

    __slots__ = ()
    OP = MultiAddRequest.OP | RESPONSE_BIT


class _ReadResponseFields(NamedTuple):
    request_id: int
    status: int
    ledger_id: int
    entry_id: int
    entry_lac: int | None
    payload: bytes | None
    digest: int | None
    lac_proof: LacProof | None  # the highest LAC this bookie holds for the ledger


class ReadResponse(_ReadResponseFields):
    """An entry (entry_lac, payload, digest all set) or, after a long poll, maybe none."""

    __slots__ = ()
    OP = ReadRequest.OP | RESPONSE_BIT


class _ReadLacResponseFields(NamedTuple):
    request_id: int
    status: int
    ledger_id: int
    lac_proof: LacProof | None
    last_entry_id: int  # -1 if the bookie holds no entry of the ledger
    last_add_fully_replicated: int = -1  # the highest LAFR a writer sent (-1: none)


class ReadLacResponse(_ReadLacResponseFields):
    __slots__ = ()
    OP = ReadLacRequest.OP | RESPONSE_BIT


class _WriteLacResponseFields(NamedTuple):
    request_id: int
    status: int
    ledger_id: int


class WriteLacResponse(_WriteLacResponseFields):
    __slots__ = ()
    OP = WriteLacRequest.OP | RESPONSE_BIT


class _WriteLafrResponseFields(NamedTuple):
    request_id: int
    status: int
    ledger_id: int


class WriteLafrResponse(_WriteLafrResponseFields):
    __slots__ = ()
    OP = WriteLafrRequest.OP | RESPONSE_BIT


class _ListEntriesResponseFields(NamedTuple):
    request_id: int
    status: int
    ledger_id: int
    ranges: list[list[int]]
    next_entry_id: int


class ListEntriesResponse(_ListEntriesResponseFields):
    """Held entry ids as inclusive ``[first, last]`` ranges; ``next_entry_id`` -1 when done."""

    __slots__ = ()
    OP = ListEntriesRequest.OP | RESPONSE_BIT


class _BookieInfoResponseFields(NamedTuple):
    request_id: int
    status: int
    free_bytes: int
    total_bytes: int
    read_only: bool
    bookie_id: str


class BookieInfoResponse(_BookieInfoResponseFields):
    __slots__ = ()
    OP = BookieInfoRequest.OP | RESPONSE_BIT


class _ScrubResponseFields(NamedTuple):
    request_id: int
    status: int
    passes_started: int
    passes_done: int
    ledgers_total: int
    ledgers_done: int
    entries_checked: int
    bytes_checked: int
    bad_copies: int
    repaired: int
    unrepaired: int


class ScrubResponse(_ScrubResponseFields):
    """The scrubber's passes (started, finished) and the counters of the running pass, or of
    the last one when none runs."""

    __slots__ = ()
    OP = ScrubRequest.OP | RESPONSE_BIT


class _LedgerRecordsResponseFields(NamedTuple):
    request_id: int
    status: int
    records: list[bytes]
    next_ledger_id: int


class LedgerRecordsResponse(_LedgerRecordsResponseFields):
    """One msgpack record per ledger, ascending ids (``metadata/ledger_record.py`` reads them);
    ``next_ledger_id`` -1 when done."""

    __slots__ = ()
    OP = LedgerRecordsRequest.OP | RESPONSE_BIT


class _ReadBatchResponseFields(NamedTuple):
    request_id: int
    status: int
    ledger_id: int
    first_entry_id: int
    entries: bytes  # consecutive entries from first_entry_id, each as pack_read_entry packs it
    end_status: int  # why the entry after the last one is not there; OK: a limit was reached
    lac_proof: LacProof | None


class ReadBatchResponse(_ReadBatchResponseFields):
    """The entries a :class:`ReadBatchRequest` found, in order, each as a ReadResponse would
    carry it (:func:`unpack_read_entries`), then what the next entry would have answered
    (NO_SUCH_ENTRY, UNKNOWN in limbo, IO_ERROR), or OK when ``max_count`` or ``max_bytes`` ended
    the answer first. ``status`` is the request's own (NO_SUCH_LEDGER, UNAUTHORIZED, ...)."""

    __slots__ = ()
    OP = ReadBatchRequest.OP | RESPONSE_BIT


class _ErrorResponseFields(NamedTuple):
    request_id: int
    status: int
    message: str


class ErrorResponse(_ErrorResponseFields):
    """The answer to a frame that could not be understood (``request_id`` -1 if unknown)."""

    __slots__ = ()
    OP = 0xFF


Request = (
    HelloRequest
    | AddRequest
    | ReadRequest
    | ReadLacRequest
    | WriteLacRequest
    | WriteLafrRequest
    | ListEntriesRequest
    | BookieInfoRequest
    | AddBatchRequest
    | MultiAddRequest
    | ScrubRequest
    | LedgerRecordsRequest
    | ReadBatchRequest
)
Response = (
    HelloResponse
    | AddResponse
    | ReadResponse
    | ReadLacResponse
    | WriteLacResponse
    | WriteLafrResponse
    | ListEntriesResponse
    | BookieInfoResponse
    | AddBatchResponse
    | MultiAddResponse
    | ScrubResponse
    | LedgerRecordsResponse
    | ReadBatchResponse
    | ErrorResponse
)
Message = Request | Response


@final  # no subclasses: ``type(x) is not BadFrame`` then tells a type checker x is a message
class BadFrame(NamedTuple):
    """A correctly framed body that is not a valid message."""

    request_id: int
    reason: str


# --- field validation -------------------------------------------------------------------
# Each message's fields are described by one tag per field; a checker function is generated
# from the tags (a generic per-field loop costs ~1.5 us per message, the generated one ~0.3 us).
#   i int64   n int64 >= 0 (an id)   u uint64   b bytes   s str   t bool
#   I int64 or None   U uint64 or None   B bytes or None   p LacProof or None   r ranges
#   l list of int64   m list of non-empty lists, each starting with an int (an op)
#   L list of bytes
# Requests name ledgers (and a read its entry) with ``n``: ids are int64 >= 0, checked at the
# edge, so no negative id reaches the handler or an engine (RocksDB keys pack them unsigned).

_SPECS: dict[type[Message], str] = {
    HelloRequest: "iis",
    AddRequest: "iniibibu",
    ReadRequest: "inniBii",
    ReadLacRequest: "iniB",
    WriteLacRequest: "inbiu",
    WriteLafrRequest: "inbi",
    ListEntriesRequest: "inii",
    BookieInfoRequest: "i",
    AddBatchRequest: "inibb",
    AddBatchResponse: "iiil",
    MultiAddRequest: "im",
    MultiAddResponse: "iim",
    HelloResponse: "iiis",
    AddResponse: "iiii",
    ReadResponse: "iiiiIBUp",
    ReadLacResponse: "iiipii",
    WriteLacResponse: "iii",
    WriteLafrResponse: "iii",
    ListEntriesResponse: "iiiri",
    BookieInfoResponse: "iiiits",
    ErrorResponse: "iis",
    ScrubRequest: "it",
    ScrubResponse: "iiiiiiiiiii",
    LedgerRecordsRequest: "ini",
    LedgerRecordsResponse: "iiLi",
    ReadBatchRequest: "innniBi",
    ReadBatchResponse: "iiiibip",
}
_INT = f"(type({{v}}) is int and {INT64_MIN} <= {{v}} <= {INT64_MAX})"
_UINT = f"(type({{v}}) is int and 0 <= {{v}} <= {UINT64_MAX})"
_ID = f"(type({{v}}) is int and 0 <= {{v}} <= {INT64_MAX})"
_TAG_EXPR = {
    "i": _INT,
    "n": _ID,
    "u": _UINT,
    "b": "(type({v}) is bytes)",
    "s": "(type({v}) is str)",
    "t": "(type({v}) is bool)",
    "I": "({v} is None or " + _INT + ")",
    "U": "({v} is None or " + _UINT + ")",
    "B": "({v} is None or type({v}) is bytes)",
    "p": "({v} is None or _proof({v}))",
    "r": "_ranges({v})",
    "l": "(type({v}) is list and all(" + _INT.format(v="x") + " for x in {v}))",
    "m": "(type({v}) is list and all(type(x) is list and x and type(x[0]) is int for x in {v}))",
    "L": "(type({v}) is list and all(type(x) is bytes for x in {v}))",
}


def _proof(v: Any) -> bool:
    return (
        type(v) is list
        and len(v) == 4
        and all(type(x) is int and INT64_MIN <= x <= INT64_MAX for x in v[:2])
        and all(type(x) is int and 0 <= x <= UINT64_MAX for x in v[2:])
    )


def _ranges(v: Any) -> bool:
    return type(v) is list and all(
        type(r) is list
        and len(r) == 2
        and all(type(x) is int and INT64_MIN <= x <= INT64_MAX for x in r)
        for r in v
    )


def _checker(tags: str) -> Callable[[list[Any]], bool]:
    """Generate ``check(args) -> bool`` for a message's field list (without the op)."""
    terms = [_TAG_EXPR[t].format(v=f"a[{i}]") for i, t in enumerate(tags)]
    src = f"def check(a):\n    return {' and '.join(terms)}\n"
    namespace: dict[str, Any] = {"_proof": _proof, "_ranges": _ranges}
    exec(src, namespace)  # the source is built from the constant tags above only
    return namespace["check"]


_BY_OP: dict[int, tuple[type[Message], int, Callable[[list[Any]], bool]]] = {
    cls.OP: (cls, len(tags), _checker(tags)) for cls, tags in _SPECS.items()
}
_PROOF_FIELD: dict[type, int] = {ReadResponse: 7, ReadLacResponse: 3, ReadBatchResponse: 6}


def _build(fields: list[Any]) -> Message | BadFrame:
    """Turn a decoded body ``[op, request_id, ...]`` into a message, or a BadFrame."""
    if not fields:
        return BadFrame(-1, "empty frame")
    op = fields[0]
    args = fields[1:]
    request_id = args[0] if args and type(args[0]) is int and _in_int64(args[0]) else -1
    entry = _BY_OP.get(op) if type(op) is int else None
    if entry is None:
        return BadFrame(request_id, f"unknown operation {describe(op)}")
    cls, count, check = entry
    if len(args) != count:
        return BadFrame(request_id, f"{cls.__name__} takes {count} fields, got {len(args)}")
    if not check(args):
        return BadFrame(request_id, f"{cls.__name__}: {_first_bad_field(cls, args)}")
    proof_at = _PROOF_FIELD.get(cls)
    if proof_at is not None and args[proof_at] is not None:
        args[proof_at] = LacProof(*args[proof_at])
    return cls(*args)


def _build_part(request_id: int, part: list[Any]) -> Message | BadFrame:
    """:func:`_build` of ``[op, request_id, *part[1:]]`` for a part ``[op, field, ...]`` of a
    multi request or response whose op is known (its fields copied once, not three times)."""
    cls, count, check = _BY_OP[part[0]]
    if len(part) != count:
        return BadFrame(request_id, f"{cls.__name__} takes {count} fields, got {len(part)}")
    args = part.copy()
    args[0] = request_id
    if not check(args):
        return BadFrame(request_id, f"{cls.__name__}: {_first_bad_field(cls, args)}")
    return cls(*args)


def multi_add_parts(msg: MultiAddRequest) -> list[AddRequest | AddBatchRequest | BadFrame]:
    """The add requests a :class:`MultiAddRequest` carries, each checked as if it had come
    alone with the multi request's id (a part that is not a valid add is a BadFrame)."""
    rid = msg.request_id
    return [
        # (_build_part of an add's op gives that add or a BadFrame: no cast on this hot path)
        _build_part(rid, part) if part[0] in MULTI_ADD_PART_OPS  # type: ignore[misc]
        else BadFrame(rid, f"operation {describe(part[0])} cannot be part of a MultiAddRequest")
        for part in msg.parts
    ]  # fmt: skip


def multi_add_bytes(msg: MultiAddRequest) -> int:
    """The bytes fields of its parts (payloads, packed entries, keys): what it holds in memory
    beyond a few small numbers per part."""
    return sum(len(field) for part in msg.parts for field in part if type(field) is bytes)


def multi_add_results(msg: MultiAddResponse) -> list[Message | BadFrame]:
    """The responses a :class:`MultiAddResponse` carries, each with the multi's request id."""
    rid = msg.request_id
    return [
        _ok_add_answer(rid, result) or (
            _build_part(rid, result) if result[0] in _ADD_ANSWER_OPS
            else BadFrame(rid, f"operation {describe(result[0])} cannot answer an add")
        )
        for result in msg.results
    ]  # fmt: skip


_ADD_ANSWER_OPS = frozenset((AddResponse.OP, AddBatchResponse.OP, ErrorResponse.OP))
_INT_ONLY = frozenset((int,))
_ADD_BATCH_ANSWER_OP, _ADD_ANSWER_OP = AddBatchResponse.OP, AddResponse.OP
_new_tuple = tuple.__new__  # a NamedTuple's own __new__ takes its fields one by one, slower


def _ok_add_answer(request_id: int, result: list[Any]) -> AddResponse | AddBatchResponse | None:
    """``result`` as its response if it is the common answer, OK for the whole part (the
    checks of :func:`_build`, without its generic machinery: a writer of many ledgers decodes
    one per ledger, bookie and loop turn); None for any other."""
    if (
        len(result) != 4
        or result[1] != 0
        or type(result[1]) is not int
        or type(result[2]) is not int
        or not INT64_MIN <= result[2] <= INT64_MAX
    ):
        return None
    op, last = result[0], result[3]
    if op == _ADD_BATCH_ANSWER_OP:
        if (
            type(last) is list
            and last.count(0) == len(last)
            and {*map(type, last)} <= _INT_ONLY  # each 0, not False nor 0.0
        ):
            return _new_tuple(AddBatchResponse, (request_id, 0, result[2], last))
    elif op == _ADD_ANSWER_OP and type(last) is int and INT64_MIN <= last <= INT64_MAX:
        return _new_tuple(AddResponse, (request_id, 0, result[2], last))
    return None


def as_part(msg: Message) -> list[Any]:
    """``msg`` as a part of a multi request or response: ``[op, field, ...]`` without its id."""
    return [msg.OP, *msg[1:]]


def _in_int64(v: int) -> bool:
    return INT64_MIN <= v <= INT64_MAX


def _first_bad_field(cls: type[Message], args: list[Any]) -> str:
    for i, tag in enumerate(_SPECS[cls]):
        if not _checker(tag)([args[i]]):
            return f"field {cls._fields[i]} has a bad value {describe(args[i])}"
    return "bad fields"


def describe(value: Any) -> str:
    """A short description of a decoded value for an error text. Never ``repr`` the value
    itself: a 5 MiB field would make a 20 MB text, and arrays nested a thousand deep make
    ``repr`` raise RecursionError."""
    kind = type(value)
    if kind is int or kind is float or kind is bool or value is None:
        text = repr(value)
        return text if len(text) <= 24 else f"{text[:20]}..."
    if kind is str or kind is bytes:
        return f"{kind.__name__} of length {len(value)} {value[:16]!r}"
    if kind is list:
        return f"array of {len(value)}"
    return kind.__name__


# --- codec --------------------------------------------------------------------------------


class FrameEncoder:
    """Packs messages into frames. Not thread-safe: one per connection (or thread)."""

    def __init__(self) -> None:
        self.packer = msgpack.Packer(use_bin_type=True, datetime=False, autoreset=True)

    def encode(self, msg: Message) -> bytes:
        """One frame: 4-byte big-endian length, then the msgpack array ``[op, *fields]``."""
        body = self.packer.pack([msg.OP, *msg])
        return FRAME_HEADER.pack(len(body)) + body


class SharedFrame:
    """One request for several bookies (an add to its write set): everything after the
    request id is packed once; each bookie's frame is a small prefix plus that shared tail.
    A ``bytes`` last field (a batch's packed entries) is not even copied: the tail ends with
    the object itself, after its msgpack header.

    ``pieces(packer, request_id)`` gives bytes whose concatenation is exactly
    ``FrameEncoder().encode(msg_type(request_id, *fields))``.
    """

    __slots__ = ("_head", "_part", "_tail", "op", "part_size")

    def __init__(self, msg_type: type[Request], *fields: Any) -> None:
        assert len(fields) + 2 < 16, "fixarray only"
        last = fields[-1] if fields else None
        raw = type(last) is bytes
        packed = msgpack.packb(list(fields[:-1] if raw else fields), use_bin_type=True,
                               datetime=False)  # fmt: skip
        # Drop the array header (re-made with 2 more fields in front).
        self._tail: tuple[bytes, ...] = (
            (packed[1:] + _bin_header(len(last)), last) if type(last) is bytes else (packed[1:],)
        )
        self.op: int = msg_type.OP
        op = msgpack.packb(self.op)
        self._head = bytes([0x90 | (len(fields) + 2)]) + op
        self._part = (bytes([0x90 | (len(fields) + 1)]) + op, *self._tail)
        # The frame's bytes after its request id; also its bytes as a part of a
        # MultiAddRequest (its array header is as long: one byte either way).
        self.part_size = len(self._head) + sum(map(len, self._tail))

    def pieces(self, packer: msgpack.Packer, request_id: int) -> tuple[bytes, ...]:
        rid = packer.pack(request_id)
        return (FRAME_HEADER.pack(self.part_size + len(rid)) + self._head + rid, *self._tail)


class BatchFrames:
    """:class:`SharedFrame`\\ s of one ledger's ``AddBatchRequest``\\ s (with ``flags`` and
    ``master_key``): the fields before the packed entries are packed once, here, and not for
    every batch (a writer of many ledgers sends a batch of one or two entries per ledger and
    loop turn: packing them took ~3 µs of its ~4 per frame)."""

    __slots__ = ("_fields", "_head", "_part")

    def __init__(self, ledger_id: int, flags: int, master_key: bytes) -> None:
        model = SharedFrame(AddBatchRequest, ledger_id, flags, master_key, b"")
        self._fields = model._tail[0][: -len(_bin_header(0))]  # without the entries' header
        self._head, self._part = model._head, model._part[0]

    def frame(self, entries: bytes) -> SharedFrame:
        """The frame of ``AddBatchRequest(_, ledger_id, flags, master_key, entries)``."""
        frame = SharedFrame.__new__(SharedFrame)
        tail = self._fields + _bin_header(len(entries))
        frame._tail = (tail, entries)
        frame._head, frame._part = self._head, (self._part, tail, entries)
        frame.op = AddBatchRequest.OP
        frame.part_size = len(self._head) + len(tail) + len(entries)
        return frame


def pack_multi_add(
    packer: msgpack.Packer, request_id: int, frames: Sequence[SharedFrame]
) -> list[bytes]:
    """The frame of a :class:`MultiAddRequest` whose parts are the adds of ``frames``, in
    pieces (the frames' shared bytes are not copied): its concatenation is exactly
    ``encode(MultiAddRequest(request_id, [[op, field, ...] of each frame]))``."""
    head = packer.pack_array_header(3) + packer.pack(MultiAddRequest.OP) + packer.pack(request_id)
    head += packer.pack_array_header(len(frames))
    pieces = [b"", head]
    for frame in frames:
        pieces += frame._part
    pieces[0] = FRAME_HEADER.pack(len(head) + sum(frame.part_size for frame in frames))
    return pieces


def _bin_header(size: int) -> bytes:
    """msgpack's header of a ``bin`` of ``size`` bytes (bin 8, 16 or 32)."""
    if size < 1 << 8:
        return bytes((0xC4, size))
    if size < 1 << 16:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")


_local = threading.local()


def encode(msg: Message) -> bytes:
    """Encode one message as a frame, using a per-thread encoder."""
    encoder = getattr(_local, "encoder", None)
    if encoder is None:
        encoder = _local.encoder = FrameEncoder()
    return encoder.encode(msg)


# What a frame may decode into on each side (bounded_msgpack.py). A bookie: only a
# MultiAddRequest has a long array (its parts, each a short array of an add's fields) and only
# a HelloRequest carries text.
PART_FIELDS_MAX = 9


def request_limits(multi_add_parts_max: int) -> DecodeLimits:
    """A bookie's decode limits for the requests it reads."""
    return DecodeLimits(
        array_len_max=NARROW_ARRAY_LEN,
        objects_max=(PART_FIELDS_MAX + 2) * multi_add_parts_max + 64,
        wide_fields={MultiAddRequest.OP: (2, multi_add_parts_max)},
        text_ops=frozenset({HelloRequest.OP}),
    )


# A client's: entry ranges, a batch's statuses and a multi-add's results are long arrays.
RESPONSE_LIMITS = DecodeLimits(
    array_len_max=ARRAY_LEN_MAX,
    objects_max=4 * ARRAY_LEN_MAX,
    wide_fields={},
    text_ops=frozenset(
        {HelloResponse.OP, BookieInfoResponse.OP, MultiAddResponse.OP, ErrorResponse.OP}
    ),
)
NARROW_ARRAY_LEN = 16  # a request's field list (and a multi-add part's) is shorter


class FrameDecoder:
    """Turns a byte stream cut at arbitrary points into messages (and BadFrames).

    ``limits`` bound what one frame may decode into beyond its length (bounded_msgpack.py;
    None: msgpack's own bounds only, for tools and tests).
    """

    def __init__(self, frame_bytes_max: int, limits: DecodeLimits | None = None) -> None:
        assert frame_bytes_max > 0
        self.frame_bytes_max = frame_bytes_max
        self._buf = bytearray()
        self._bodies = BodyDecoder(frame_bytes_max, limits)
        self._small = self._bodies.small_kwargs  # the hot path: one call fewer per frame

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Message | BadFrame]:
        """Add bytes; return every message now complete, in order.

        Raises:
            FrameTooLargeError: a frame declares a length above ``frame_bytes_max``.
            ProtocolError: a frame declares length zero.
        """
        buf = self._buf
        buf += data
        out: list[Message | BadFrame] = []
        pos, end = 0, len(buf)
        view = memoryview(buf)
        try:
            while end - pos >= 4:
                (n,) = FRAME_HEADER.unpack_from(buf, pos)
                if n > self.frame_bytes_max:
                    raise FrameTooLargeError(
                        f"frame of {n} bytes exceeds frame_bytes_max {self.frame_bytes_max}"
                    )
                if n == 0:
                    raise ProtocolError("frame of length 0")
                if end - pos - 4 < n:
                    break
                out.append(self._decode_body(view[pos + 4 : pos + 4 + n]))
                pos += 4 + n
        finally:
            view.release()
        if pos:
            del buf[:pos]
        return out

    def _decode_body(self, body: memoryview) -> Message | BadFrame:
        try:
            if len(body) <= SMALL_BODY_BYTES:  # BodyDecoder.decode's own first case, inlined
                fields = msgpack.unpackb(body, **self._small)
            else:
                fields = self._bodies.decode(body)
        except Exception as exc:  # msgpack raises several types for garbage
            reason = f"not a valid msgpack body: {type(exc).__name__} {str(exc)[:80]}"
            return BadFrame(peek_request_id(body), reason)
        if type(fields) is not list:
            return BadFrame(-1, f"body is a {type(fields).__name__}, not an array")
        try:
            return _build(fields)
        except Exception as exc:  # a check that cannot cope with a value: still an answer
            request_id = fields[1] if len(fields) > 1 and type(fields[1]) is int else -1
            return BadFrame(request_id if _in_int64(request_id) else -1,
                            f"malformed message: {type(exc).__name__}")  # fmt: skip


def decode_all(data: bytes, frame_bytes_max: int = 1 << 30) -> list[Message | BadFrame]:
    """Decode a complete byte string of frames (a convenience for tests and tools)."""
    decoder = FrameDecoder(frame_bytes_max)
    out = decoder.feed(data)
    if decoder.buffered_bytes:
        raise ProtocolError(f"{decoder.buffered_bytes} trailing bytes")
    return out
