"""The response messages (``op | RESPONSE_BIT`` of their request's), the unions of all
messages, and :class:`BadFrame`: a frame that is not a valid message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, final

from ..digest import LacProof
from .requests import (
    RESPONSE_BIT,
    AddBatchRequest,
    AddRequest,
    BookieInfoRequest,
    HelloRequest,
    LedgerRecordsRequest,
    ListEntriesRequest,
    MultiAddRequest,
    ReadBatchRequest,
    ReadLacRequest,
    ReadRequest,
    Request,
    ScrubRequest,
    WriteLacRequest,
    WriteLafrRequest,
)

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
