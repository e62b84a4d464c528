"""The framed-connection base both sides of the wire share (bookkeeper_aio/framed.py)."""

from __future__ import annotations

import asyncio

from bookkeeper_aio.framed import FramedConnection


class Transport(asyncio.Transport):
    """Records writelines calls; pauses its protocol past ``high`` buffered bytes."""

    def __init__(self, protocol: FramedConnection, high: int) -> None:
        super().__init__()
        self.protocol, self.high, self.calls, self.buffered = protocol, high, [], 0

    def writelines(self, data) -> None:  # type: ignore[no-untyped-def]
        chunk = list(data)
        self.calls.append(chunk)
        self.buffered += sum(map(len, chunk))
        if self.buffered > self.high:
            self.protocol.pause_writing()  # as asyncio's transports do, inside the write

    def drain(self) -> None:
        self.buffered = 0
        self.protocol.resume_writing()

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.buffered


class Chunked(FramedConnection):
    WRITE_CHUNK_BYTES = 10


async def test_frames_of_a_turn_leave_in_one_call_at_its_end():
    conn = FramedConnection()
    transport = Transport(conn, high=1 << 20)
    conn.connection_made(transport)
    for frame in (b"a" * 5, b"b" * 5, b"c" * 5):
        conn._out.append(frame)
        conn._out_bytes += len(frame)
        conn._schedule_flush()
    assert transport.calls == [] and conn.output_bytes() == 15
    await asyncio.sleep(0)
    assert transport.calls == [[b"a" * 5, b"b" * 5, b"c" * 5]] and conn._out_bytes == 0


async def test_a_chunked_flush_stops_when_the_transport_pauses_and_resumes_with_it():
    conn = Chunked()
    transport = Transport(conn, high=15)
    conn.connection_made(transport)
    frames = [bytes([65 + i]) * 6 for i in range(6)]  # 36 bytes: chunks of two frames
    conn._out += frames
    conn._out_bytes = 36
    conn._flush()
    assert transport.calls == [frames[0:2], frames[2:4]]  # paused after 24 > 15 bytes
    assert conn._blocked and conn._out == frames[4:] and conn._out_bytes == 12
    assert conn.output_bytes() == 12 + 24
    transport.drain()  # resume_writing: the rest goes
    assert transport.calls[-1] == frames[4:] and conn._out == [] and conn._out_bytes == 0
