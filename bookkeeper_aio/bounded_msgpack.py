"""Decoding a msgpack body into at most so many objects, whatever its bytes say.

Theory of operation
-------------------
A frame's length is bounded (``frame_bytes_max``), but what msgpack makes of its bytes is not:
one byte becomes an object of up to 64 bytes (``0x90``, an empty array), so 5 MiB of arrays
nested in arrays decode into ~360 MB of lists and most of a second of the event loop, before
any check of the message could refuse it. :class:`BodyDecoder` bounds that work:

* A body of at most ``SMALL_BODY_BYTES`` is decoded in one ``unpackb`` call, as fast as
  msgpack goes: so few bytes make few objects whatever they are (the hot path of small adds).
* A bigger body is decoded with a budget of ``objects_max`` arrays and array elements,
  spent by msgpack's list hook as each array completes: past it the body is refused at once.
* In a bigger body an array holds at most ``array_len_max`` elements, except the one long
  field of a ``wide_fields`` operation (a multi-add's parts), whose elements are decoded one
  by one under the same limits. So what can pile up before any array completes — msgpack's
  at most 1024 levels of arrays being filled — is at most 1024 x ``array_len_max`` scalars.
* Non-empty strings only in the bodies of ``text_ops`` operations (msgpack makes a 51-byte
  object of a 3-byte string).

The operation is peeked from the bytes (the body is ``[op, request_id, ...]``) without
decoding anything. Docs/operations.md gives the measured worst case.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import msgpack

STR_BYTES_MAX = 64 * 1024
ARRAY_LEN_MAX = 1 << 20
SMALL_BODY_BYTES = 4096  # a body this small decodes into few objects: no budget needed
_ARRAY_HEADERS = frozenset({*range(0x90, 0xA0), 0xDC, 0xDD})


class DecodeLimits(NamedTuple):
    """What one body may decode into beyond its byte count (module docstring)."""

    array_len_max: int  # elements of any array, but the long field of a wide operation
    objects_max: int  # arrays and array elements in one body
    wide_fields: Mapping[int, tuple[int, int]]  # op -> (index of its long field, its length max)
    text_ops: frozenset[int]  # operations whose bodies may hold non-empty strings


class FrameTooComplexError(ValueError):
    """A body decodes into more arrays and elements than its limits allow."""


class BodyDecoder:
    """Decodes bodies under ``limits`` (None: only msgpack's own bounds, for tools and tests).
    Not thread-safe: one per connection."""

    def __init__(self, bin_bytes_max: int, limits: DecodeLimits | None) -> None:
        self.limits = limits
        self._objects_left = 0
        common: dict[str, Any]
        common = dict(raw=False, use_list=True, strict_map_key=True, max_bin_len=bin_bytes_max,
                      max_map_len=0, max_ext_len=0)  # fmt: skip
        # A small body may hold a wide operation's long field too (a multi-add of tiny parts).
        small_arrays = ARRAY_LEN_MAX
        if limits is not None:
            small_arrays = max([limits.array_len_max, *(n for _, n in limits.wide_fields.values())])
        self.small_kwargs: dict[str, Any]
        self.small_kwargs = dict(common, max_str_len=STR_BYTES_MAX, max_array_len=small_arrays)
        if limits is not None:
            self._bounded = {
                text: dict(common, max_str_len=STR_BYTES_MAX if text else 0,
                           max_array_len=limits.array_len_max, list_hook=self._count)
                for text in (False, True)
            }  # fmt: skip

    def decode(self, body: memoryview | bytes) -> Any:
        """The decoded body.

        Raises:
            ValueError: it is not msgpack, or it decodes past the limits (msgpack raises
                several subclasses; also msgpack.StackError past 1024 levels).
        """
        limits = self.limits
        if limits is None or len(body) <= SMALL_BODY_BYTES:
            return msgpack.unpackb(body, **self.small_kwargs)
        op = peek_op(body)
        self._objects_left = limits.objects_max
        kw = self._bounded[op in limits.text_ops]
        wide = limits.wide_fields.get(op)
        if wide is None:
            return msgpack.unpackb(body, **kw)
        return self._decode_wide(body, kw, *wide)

    def _decode_wide(
        self, body: memoryview | bytes, kw: dict[str, Any], at: int, most: int
    ) -> list[Any]:
        """``[op, ...]`` whose field ``at`` may be an array of up to ``most`` elements, each
        decoded on its own under the narrow limits."""
        unpacker = msgpack.Unpacker(max_buffer_size=len(body), **kw)
        unpacker.feed(body)
        count = unpacker.read_array_header()
        assert self.limits is not None  # only bounded decoding has wide fields
        if count > self.limits.array_len_max:
            raise FrameTooComplexError(f"{count} fields")
        fields = []
        for index in range(count):
            if index == at and body[unpacker.tell()] in _ARRAY_HEADERS:
                length = unpacker.read_array_header()
                if length > most:
                    raise FrameTooComplexError(f"{length} exceeds max_array_len({most})")
                self._count(range(length))
                fields.append([unpacker.unpack() for _ in range(length)])
            else:
                fields.append(unpacker.unpack())
        if unpacker.tell() != len(body):
            raise msgpack.ExtraData(fields, b"")
        return fields

    def _count(self, array: Any) -> Any:
        """msgpack's list hook: spend the body's budget of arrays and elements."""
        self._objects_left -= len(array) + 1
        if self._objects_left < 0:
            assert self.limits is not None  # the hook of bounded decoding only
            raise FrameTooComplexError(f"more than {self.limits.objects_max} arrays and elements")
        return array


def peek_op(body: memoryview | bytes) -> int:
    """The op of a body ``[op, ...]`` without decoding it (-1 if it is not plainly there)."""
    if len(body) < 3 or not 0x91 <= body[0] <= 0x9F:
        return -1
    first = body[1]
    if first < 0x80:
        return first  # a positive fixint: a request's op
    return body[2] if first == 0xCC else -1  # a uint8: a response's op


def peek_request_id(body: memoryview | bytes) -> int:
    """The request id of a body that would not decode, if its first two fields are plain
    (-1 otherwise)."""
    try:
        unpacker = msgpack.Unpacker(max_buffer_size=64)
        unpacker.feed(body[:32])
        unpacker.read_array_header()
        unpacker.skip()
        request_id = unpacker.unpack()
    except Exception:
        return -1
    ok = type(request_id) is int and -(1 << 63) <= request_id < 1 << 63
    return request_id if ok else -1
