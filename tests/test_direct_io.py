"""Writing around the page cache: whole-block appends, the zero fill, the buffered fallback."""

from __future__ import annotations

import errno
import fcntl
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookkeeper_aio import direct_io
from bookkeeper_aio.direct_io import BLOCK_BYTES, BlockWriter, open_file, round_up, write_zeros


@settings(max_examples=40, deadline=None)
@given(chunks=st.lists(st.integers(0, 3 * BLOCK_BYTES), max_size=12), seed=st.integers(0, 255))
def test_appends_give_the_concatenation_then_zeros(tmp_path_factory, chunks, seed):
    path = tmp_path_factory.mktemp("bw") / "f"
    fd, _ = open_file(path, os.O_CREAT | os.O_RDWR)
    try:
        # A file full of non-zero garbage: the zeros after the data must come from the writer.
        write_garbage(fd, round_up(4 * BLOCK_BYTES + sum(chunks) * 2))
        writer = BlockWriter(fd)
        expected = bytearray()
        for i, n in enumerate(chunks):
            data = bytes([(seed + i) % 255 + 1]) * n
            writer.append([data[: n // 3], data[n // 3 :]], writer.position)  # two pieces
            expected += data
            assert writer.position == sum(chunks[: i + 1])
            with open(path, "rb") as f:
                got = f.read(round_up(len(expected)))
            assert got[: len(expected)] == expected
            assert got[len(expected) :] == bytes(round_up(len(expected)) - len(expected))
        writer.close()
    finally:
        os.close(fd)


def _direct(fd: int) -> bool:
    return bool(fcntl.fcntl(fd, fcntl.F_GETFL) & direct_io.O_DIRECT)


def write_garbage(fd: int, size: int) -> None:
    writer = BlockWriter(fd)
    writer.append([b"\xee" * size], 0)
    writer.close()


def test_an_append_must_start_where_the_last_ended(tmp_path):
    fd, _ = open_file(tmp_path / "f", os.O_CREAT | os.O_RDWR)
    writer = BlockWriter(fd)
    writer.append([b"abc"], 0)
    with pytest.raises(AssertionError):
        writer.append([b"def"], 10)
    writer.close()
    os.close(fd)


def test_zero_fill_writes_real_zeros_over_old_bytes(tmp_path):
    fd, _ = open_file(tmp_path / "f", os.O_CREAT | os.O_RDWR)
    write_garbage(fd, 3 * (1 << 20))
    write_zeros(fd, BLOCK_BYTES, 2 * (1 << 20) + BLOCK_BYTES)  # more than one 1 MiB step
    os.close(fd)
    data = (tmp_path / "f").read_bytes()
    assert data[:BLOCK_BYTES] == b"\xee" * BLOCK_BYTES
    assert data[BLOCK_BYTES : 2 * (1 << 20) + BLOCK_BYTES] == bytes(2 * (1 << 20))
    assert set(data[2 * (1 << 20) + BLOCK_BYTES :]) == {0xEE}


def test_direct_where_supported_and_buffered_where_refused(tmp_path, monkeypatch):
    fd, direct = open_file(tmp_path / "a", os.O_CREAT | os.O_RDWR)
    assert _direct(fd) == direct == direct_io.supports_direct_io(str(tmp_path))  # ext4: True
    os.close(fd)
    fd, direct = open_file(tmp_path / "b", os.O_CREAT | os.O_RDWR, direct=False)
    assert not direct and not _direct(fd)
    os.close(fd)

    real_open = os.open

    def no_direct(path, flags, mode=0o777):  # what tmpfs before Linux 6.6 does
        if flags & direct_io.O_DIRECT:
            os.close(real_open(path, flags & ~direct_io.O_DIRECT, mode))  # creates, then refuses
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", no_direct)
    fd, direct = open_file(tmp_path / "c", os.O_CREAT | os.O_EXCL | os.O_RDWR)
    assert not direct
    writer = BlockWriter(fd)
    writer.append([b"hel", b"", b"lo"], 0)  # the same whole-block writes, through the page cache
    writer.close()
    os.close(fd)
    assert (tmp_path / "c").read_bytes() == b"hello" + bytes(BLOCK_BYTES - 5)
    assert not direct_io.supports_direct_io(str(tmp_path))
    assert not (tmp_path / ".direct-io-probe").exists()
