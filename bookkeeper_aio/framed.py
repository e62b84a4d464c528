"""One framed-connection base for every msgpack peer: output buffering and flow control.

Theory of operation
-------------------
A :class:`FramedConnection` is an asyncio ``Protocol`` that queues encoded frames (``_out``,
``_out_bytes`` their size) and hands them to the transport together, one ``writelines`` per
flush: at the end of the loop turn (:meth:`_schedule_flush`) or at once (:meth:`_flush`), so
the frames a loop turn produced (a writer's adds for one bookie, a journal batch's answers)
leave in one system call. The transport's flow control (``pause_writing`` /
``resume_writing``) sets and clears ``_blocked``; subclasses react in :meth:`_on_pause` and
:meth:`_on_resume` (the bookie stops reading a peer that does not read its answers; the client
stops writing and wakes its senders).

``WRITE_CHUNK_BYTES`` None hands every queued frame to the transport at once (it buffers what
the socket does not take). A number hands it at most that many bytes per call and stops once
the transport pauses: the client's frames are shared with its other bookies' connections
(packed once per write set), and what stays here is not copied into a transport buffer;
``resume_writing`` flushes the rest.

Both sides of the wire (``client/bookie_client.py``'s ``BookieClient`` and
``bookie/connection.py``'s ``BookieConnection``) derive from it: one copy of the mechanism.
"""

from __future__ import annotations

import asyncio
from typing import cast

from .protocol import FrameEncoder


class FramedConnection(asyncio.Protocol):
    """Queued frames written together, and the transport's flow control (see above)."""

    WRITE_CHUNK_BYTES: int | None = None

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._encoder = FrameEncoder()
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._out_bytes = 0  # bytes in _out
        self._flush_scheduled = False
        self._blocked = False  # the transport's buffer is past its high-water mark

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a stream's: a Transport

    def pause_writing(self) -> None:
        self._blocked = True
        self._on_pause()

    def resume_writing(self) -> None:
        self._blocked = False
        self._on_resume()

    def _on_pause(self) -> None:
        """The transport's buffer went past its high-water mark."""

    def _on_resume(self) -> None:
        """The transport's buffer drained below its low-water mark: write what waits."""
        self._flush()

    # --- output ---------------------------------------------------------------------------

    def _schedule_flush(self) -> None:
        """Write the queued frames at the end of this loop turn."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Write the queued frames now (within WRITE_CHUNK_BYTES, see the module docstring)."""
        self._flush_scheduled = False
        out, transport = self._out, self._transport
        if not out or transport is None or transport.is_closing():
            return
        chunk = self.WRITE_CHUNK_BYTES
        if chunk is None:
            self._out, self._out_bytes = [], 0
            transport.writelines(out)
            return
        start = end = sent = 0
        while end < len(out) and not self._blocked:  # pause_writing runs inside writelines
            size = 0
            while end < len(out) and size < chunk:
                size += len(out[end])
                end += 1
            transport.writelines(out[start:end])
            sent += size
            start = end
        self._out = out[end:] if end < len(out) else []
        self._out_bytes -= sent

    def _drop_output(self) -> None:
        """Forget the queued frames (the connection is gone or aborted)."""
        self._out.clear()
        self._out_bytes = 0

    def output_bytes(self) -> int:
        """Bytes queued here and in the transport's buffer."""
        transport = self._transport
        return self._out_bytes + (transport.get_write_buffer_size() if transport else 0)
