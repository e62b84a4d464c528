"""The sans-IO frame codec: messages to frames and a byte stream back to messages.

:func:`encode` packs a message; :class:`FrameDecoder` turns a byte stream, cut at any point,
into messages. A frame whose length is fine but whose contents are not a valid message (not
msgpack, unknown op, wrong field count or type) becomes a :class:`~.responses.BadFrame` carrying
the request id when one could be read, so the server can answer it and keep the connection. A
frame whose declared length exceeds ``frame_bytes_max`` (or is zero) raises
:class:`~bookkeeper_aio.errors.FrameTooLargeError` / :class:`~bookkeeper_aio.errors.ProtocolError`:
the stream cannot be trusted any more and that one connection is closed.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from typing import Any

import msgpack

from ..bounded_msgpack import (
    ARRAY_LEN_MAX,
    SMALL_BODY_BYTES,
    BodyDecoder,
    DecodeLimits,
    peek_request_id,
)
from ..errors import FrameTooLargeError, ProtocolError
from .requests import AddBatchRequest, HelloRequest, MultiAddRequest, Request
from .responses import (
    BadFrame,
    BookieInfoResponse,
    ErrorResponse,
    HelloResponse,
    Message,
    MultiAddResponse,
)
from .validation import _build, _in_int64

# --- codec --------------------------------------------------------------------------------

FRAME_HEADER = struct.Struct(">I")


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
