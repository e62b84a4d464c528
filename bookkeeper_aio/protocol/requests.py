"""The wire's constants and its request messages (the package's ``__init__`` says how the
protocol works as a whole).

Each message type is a ``NamedTuple`` (immutable, typed, positional: it *is* the frame's field
list, and builds 4-8x faster than a frozen dataclass, which matters at 100k messages/s).
"""

from __future__ import annotations

from typing import Any, NamedTuple

# 2: AddBatchRequest carries packed stored records; 3: MultiAddRequest; 4: ScrubRequest and
# LedgerRecordsRequest (operator requests), WriteLafrRequest and
# ReadLacResponse.last_add_fully_replicated (guaranteed write quorum); 5: ReadBatchRequest
PROTOCOL_VERSION = 5
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
