"""Field validation: a decoded body ``[op, request_id, ...]`` checked, field by field, and built
into its message or a :class:`~.responses.BadFrame`; the same for the parts of a multi-add
request or response."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..digest import LacProof
from .requests import (
    INT64_MAX,
    INT64_MIN,
    MULTI_ADD_PART_OPS,
    UINT64_MAX,
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
    ScrubRequest,
    WriteLacRequest,
    WriteLafrRequest,
)
from .responses import (
    AddBatchResponse,
    AddResponse,
    BadFrame,
    BookieInfoResponse,
    ErrorResponse,
    HelloResponse,
    LedgerRecordsResponse,
    ListEntriesResponse,
    Message,
    MultiAddResponse,
    ReadBatchResponse,
    ReadLacResponse,
    ReadResponse,
    ScrubResponse,
    WriteLacResponse,
    WriteLafrResponse,
)

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
