"""Writing around the page cache: O_DIRECT files written in whole aligned blocks.

Why
---
Data a bookie writes is read back rarely (the journal only at replay; an engine's files mostly
from its own caches), yet every buffered write first copies it into the page cache, and new
page-cache pages are what costs: measured on the 2-vCPU VM of the benchmarks, writing 6 GB into
fresh pages took 1.8 µs of kernel time per KiB, and the same bytes over pages already cached
0.24 µs (the VM's memory balloon hands freed pages back to the host, so a page the kernel
allocates anew faults on the host first). A bookie writes each entry twice (journal, engine),
so the page cache was ~3 µs of its ~8 µs per entry. O_DIRECT writes go from our buffer to the
device: no copy into the page cache, no new pages.

O_DIRECT needs the offset, the length and the memory address aligned to the device's logical
block size. :class:`BlockWriter` keeps one page-aligned buffer (an anonymous ``mmap``) and writes
whole ``BLOCK_BYTES`` blocks: an append whose end is not aligned writes its last block padded
with zeros, and the next append rewrites that block with more data. Rewriting a block with the
bytes it held plus new ones is what the page cache does on writeback too: a torn write leaves
each sector old or new, and the old bytes are the same in both.

A file system without O_DIRECT (tmpfs before Linux 6.6, some FUSE file systems) refuses the
open with EINVAL: :func:`open_file` then opens the file buffered, and the same whole-block writes
go through the page cache.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Sequence

BLOCK_BYTES = 4096  # a multiple of every logical block size in use (512, 4096)
O_DIRECT = getattr(os, "O_DIRECT", 0)  # Linux; elsewhere buffered
_ZERO_BLOCKS = mmap.mmap(-1, 1 << 20)  # anonymous memory is zeroed, and page-aligned


def round_up(n: int) -> int:
    """``n`` rounded up to a whole number of blocks."""
    return -(-n // BLOCK_BYTES) * BLOCK_BYTES


def open_file(path: str | os.PathLike[str], flags: int, mode: int = 0o644, *,
              direct: bool = True) -> tuple[int, bool]:  # fmt: skip
    """``os.open`` with O_DIRECT when ``direct`` and the file system supports it.

    Returns the fd and whether it is direct.
    """
    if direct and O_DIRECT:
        try:
            return os.open(path, flags | O_DIRECT, mode), True
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            # Linux creates the file before it refuses O_DIRECT: with O_EXCL the file is ours
            # (it did not exist, or the first open would have failed with EEXIST).
            flags &= ~os.O_EXCL
    return os.open(path, flags, mode), False


def supports_direct_io(directory: str) -> bool:
    """True if files in ``directory`` can be opened with O_DIRECT."""
    path = os.path.join(directory, ".direct-io-probe")
    fd, direct = open_file(path, os.O_CREAT | os.O_RDWR)
    os.close(fd)
    os.unlink(path)
    return direct


def write_zeros(fd: int, start: int, end: int) -> None:
    """Write real zeros (not a hole) over ``[start, end)``; both must be block-aligned."""
    assert start % BLOCK_BYTES == 0 and end % BLOCK_BYTES == 0, (start, end)
    view = memoryview(_ZERO_BLOCKS)
    try:
        while start < end:
            n = min(len(view), end - start)
            _pwrite_all(fd, view[:n], start)
            start += n
    finally:
        view.release()


class BlockWriter:
    """Appends to a file in whole aligned blocks (see the module docstring).

    ``append(pieces, pos)`` writes the concatenation of ``pieces`` at ``pos``, the end of
    everything appended so far (copied once, into the aligned buffer); the rest of its last
    block is written as zeros. Not thread-safe: one thread writes.
    """

    def __init__(self, fd: int) -> None:
        """Start appending at offset 0 of ``fd``."""
        self._fd = fd
        self._block_start = 0  # where the partial block the next append rewrites starts
        self._head = b""  # that block's bytes so far
        self._buf = mmap.mmap(-1, 1 << 20)

    @property
    def position(self) -> int:
        """Where the next append goes."""
        return self._block_start + len(self._head)

    def append(self, pieces: Sequence[bytes | memoryview], pos: int) -> None:
        """Write the concatenation of ``pieces`` at ``pos`` (which must be :attr:`position`)."""
        assert pos == self.position, (pos, self.position)
        used = len(self._head) + sum(map(len, pieces))
        total = round_up(used)
        if total > len(self._buf):
            self._buf.close()
            self._buf = mmap.mmap(-1, round_up(total + (1 << 20)))
        buf = self._buf
        at = len(self._head)
        buf[:at] = self._head
        for piece in pieces:
            buf[at : at + len(piece)] = piece
            at += len(piece)
        buf[used:total] = _ZERO_BLOCKS[: total - used]
        view = memoryview(buf)
        try:
            _pwrite_all(self._fd, view[:total], self._block_start)
        finally:
            view.release()
        last = used - used % BLOCK_BYTES  # the partial block the next append rewrites
        self._head = buf[last:used]
        self._block_start += last

    def close(self) -> None:
        """Free the buffer (the fd is the caller's)."""
        self._buf.close()


def _pwrite_all(fd: int, view: memoryview, pos: int) -> None:
    # A regular file takes a whole pwrite unless the disk is full (then it raises); a short
    # write is still handled rather than trusted away.
    while view:
        n = os.pwrite(fd, view, pos)
        if n <= 0:
            raise OSError(errno.EIO, f"pwrite wrote {n} bytes")
        view, pos = view[n:], pos + n
