"""Wire messages and the sans-IO codec: bytes in, messages out (docs/protocol.md).

Theory of operation
-------------------
A connection carries frames in both directions. A frame is a 4-byte big-endian body length
followed by a msgpack body. The body is always a positional array ``[op, request_id, ...]``;
``op`` picks the message type, responses use ``op | 0x80`` and echo the request id, so many
requests can be in flight on one connection and answers may come back in any order.

Nothing here does I/O, reads a clock or knows about asyncio.

Where each part lives: the constants (version, flags, bounds) and the request messages in
``requests.py``; the response messages, the ``Message`` union and ``BadFrame`` in
``responses.py``; the packed entries of add and read batches in ``packed.py``; the checks that
turn a decoded body (or a multi-add's part) into a message in ``validation.py``; frames,
encoding, shared frames and decoding in ``codec.py``. Imports go one way only:
requests -> responses -> validation -> codec (``packed.py`` stands alone). Every public name is
re-exported here.
"""

from __future__ import annotations

from .codec import (
    FRAME_HEADER,
    NARROW_ARRAY_LEN,
    PART_FIELDS_MAX,
    RESPONSE_LIMITS,
    BatchFrames,
    FrameDecoder,
    FrameEncoder,
    SharedFrame,
    decode_all,
    encode,
    pack_multi_add,
    request_limits,
)
from .packed import (
    ADD_ENTRY_HEAD,
    PACKED_ENTRY_PREFIX,
    CheckedEntry,
    add_entry_head,
    check_add_entries,
    pack_add_entries,
    pack_read_entry,
    unpack_read_entries,
)
from .requests import (
    ADD_FLAG_DEFERRED_SYNC,
    ADD_FLAG_RECOVERY,
    INT64_MAX,
    INT64_MIN,
    MULTI_ADD_PART_OPS,
    PROTOCOL_VERSION,
    READ_FLAG_FENCE,
    READ_FLAG_LONG_POLL,
    RESPONSE_BIT,
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
    Request,
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
    Response,
    ScrubResponse,
    WriteLacResponse,
    WriteLafrResponse,
)
from .validation import (
    as_part,
    describe,
    multi_add_bytes,
    multi_add_parts,
    multi_add_results,
)

__all__ = [
    "ADD_ENTRY_HEAD",
    "ADD_FLAG_DEFERRED_SYNC",
    "ADD_FLAG_RECOVERY",
    "FRAME_HEADER",
    "INT64_MAX",
    "INT64_MIN",
    "MULTI_ADD_PART_OPS",
    "NARROW_ARRAY_LEN",
    "PACKED_ENTRY_PREFIX",
    "PART_FIELDS_MAX",
    "PROTOCOL_VERSION",
    "READ_FLAG_FENCE",
    "READ_FLAG_LONG_POLL",
    "RESPONSE_BIT",
    "RESPONSE_LIMITS",
    "UINT64_MAX",
    "AddBatchRequest",
    "AddBatchResponse",
    "AddRequest",
    "AddResponse",
    "BadFrame",
    "BatchFrames",
    "BookieInfoRequest",
    "BookieInfoResponse",
    "CheckedEntry",
    "ErrorResponse",
    "FrameDecoder",
    "FrameEncoder",
    "HelloRequest",
    "HelloResponse",
    "LedgerRecordsRequest",
    "LedgerRecordsResponse",
    "ListEntriesRequest",
    "ListEntriesResponse",
    "Message",
    "MultiAddRequest",
    "MultiAddResponse",
    "ReadBatchRequest",
    "ReadBatchResponse",
    "ReadLacRequest",
    "ReadLacResponse",
    "ReadRequest",
    "ReadResponse",
    "Request",
    "Response",
    "ScrubRequest",
    "ScrubResponse",
    "SharedFrame",
    "WriteLacRequest",
    "WriteLacResponse",
    "WriteLafrRequest",
    "WriteLafrResponse",
    "add_entry_head",
    "as_part",
    "check_add_entries",
    "decode_all",
    "describe",
    "encode",
    "multi_add_bytes",
    "multi_add_parts",
    "multi_add_results",
    "pack_add_entries",
    "pack_multi_add",
    "pack_read_entry",
    "request_limits",
    "unpack_read_entries",
]
