"""The journal's files: a new (or recycled) file, its preallocation, a batch's write and sync,
rollover, checkpoints and replay (bookie/journal.py says how the journal works as a whole;
bookie/journal_format.py holds the record format).

Files are preallocated ``journal_preallocate_bytes`` ahead of the write position (so an
fdatasync does not also have to persist a new file size and new blocks), 1 MiB at a time after a
batch's sync (a new file starts with one such step, not all of them at once), and roll over
past ``journal_file_bytes_max``. A step is ``posix_fallocate`` (``journal_preallocate_mode``
"fallocate", the default): the file system allocates the blocks unwritten, which read as zeros,
and writes nothing, so each fdatasync into them also commits their conversion to written (a
file-system journal commit). With "zeros", or where the file system refuses fallocate, a step
writes real zeros: an fdatasync then persists data only, but every journal byte reaches the
disk twice. Under load the disk's bytes are what counts: on the benchmarks' VM, whose disk
three bookies keep busy, zeros held the closed loop at 26k adds/s against 34k with fallocate
(docs/performance.md). Either way the region past the last record reads as zeros, where
replay stops.

Every start opens a new file: a file with a torn tail is never appended to. A checkpoint keeps
up to ``journal_recycle_files`` of the files it retires (``recycled-<seq>.log``) and the next
new file reuses one: its blocks exist and are written already, so no preallocation (neither
zeros nor conversions) until the write position passes its old end. The old records it still
holds fail the checksum of the new file's sequence number.

A checkpoint marks the current write position, syncs the storage engine (every record before
the mark was applied to the engine before it was appended), atomically records the mark in the
``checkpoint`` file, and deletes files entirely before it. Replay returns every record after
the mark, in order.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..config import BookieConfig
from ..direct_io import BLOCK_BYTES, BlockWriter, open_file, round_up, write_zeros
from ..errors import JournalFailedError
from .journal_format import (
    FILE_HEADER,
    RECORD_HEADER,
    JournalRecord,
    file_header,
    file_name,
    list_files,
    list_recycled,
    recycled_name,
    scan,
)
from .trace import AddTrace

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint"
# posix_fallocate's errors that mean "not on this file system" (glibc's own fallback, one byte
# written per block, fails EINVAL on an O_DIRECT file).
_NO_FALLOCATE = frozenset({errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS})
_STEP_BYTES = 1 << 20


class JournalFiles:
    """The journal's files, checkpoints and replay: a part of :class:`~.journal.Journal`, which
    holds the state (Journal.__init__ says which thread owns what)."""

    directory: Path
    config: BookieConfig
    trace: AddTrace | None
    _checkpoint_lock: asyncio.Lock
    _stats: collections.Counter[str]
    # The journal thread's side (and start()'s before the thread runs).
    _fd: int
    _file: BlockWriter | None
    _seq: int
    _pos: int
    _allocated: int
    _fallocate: bool
    _mark: tuple[int, int]

    # --- replay ---------------------------------------------------------------------------

    def replay(self) -> Iterator[JournalRecord]:
        """Every record written after the last checkpoint, in order (call before start).

        Raises:
            JournalFailedError: a journal file is unreadable or has a foreign header.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        mark_seq, mark_offset = self._read_checkpoint()
        for seq, path in list_files(self.directory):
            if seq < mark_seq:
                continue
            try:
                data = path.read_bytes()
                result = scan(data, seq, mark_offset if seq == mark_seq else 0)
            except (OSError, ValueError) as exc:
                raise JournalFailedError(f"cannot replay journal file {path}: {exc}") from exc
            if not result.clean_end:
                log.warning(
                    "journal file %s: replay stops at offset %d of %d (a torn write, or the "
                    "old records of a recycled file)", path.name, result.end_offset, len(data),
                )  # fmt: skip
            self._stats["replayed_records"] += len(result.records)
            yield from result.records

    def _read_checkpoint(self) -> tuple[int, int]:
        path = self.directory / CHECKPOINT_FILE
        try:
            mark = json.loads(path.read_text())
            return int(mark["seq"]), int(mark["offset"])
        except FileNotFoundError:
            return 0, 0
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise JournalFailedError(f"unreadable journal checkpoint {path}: {exc}") from exc

    # --- file operations (the journal's thread) -------------------------------------------

    def _write_sync(
        self, pieces: list[bytes | memoryview], pos: int, size: int
    ) -> tuple[float, float]:
        """Write ``pieces`` at ``pos`` and fdatasync; when the write and the sync returned."""
        end = pos + size
        while end + RECORD_HEADER.size > self._allocated:
            self._preallocate()
        assert self._file is not None
        self._file.append(pieces, pos)
        written = time.perf_counter()
        os.fdatasync(self._fd)
        synced = time.perf_counter()
        self._stats["fsyncs"] += 1
        if self._allocated - end < self.config.journal_preallocate_bytes:
            # Keep the allocation ahead one step (1 MiB) at a time, synced with the next batch:
            # a whole journal_preallocate_bytes of zeros at once made one batch's fdatasync ~8 ms.
            self._preallocate()
        return written, synced

    def _preallocate(self) -> None:
        """Allocate the next step (1 MiB, at most ``journal_preallocate_bytes``), reading as
        zeros, never a sparse hole: fallocated, or real zeros written (the module docstring)."""
        step = min(_STEP_BYTES, self.config.journal_preallocate_bytes)
        target = round_up(self._allocated + step)
        if self._fallocate:
            try:
                os.posix_fallocate(self._fd, self._allocated, target - self._allocated)
                self._allocated = target
                return
            except OSError as exc:
                if exc.errno not in _NO_FALLOCATE:
                    raise  # ENOSPC, EIO: the journal fails as on any write error
                self._fallocate = False
                log.warning("journal dir %s refuses fallocate (%s): preallocating with zeros",
                            self.directory, exc)  # fmt: skip
        write_zeros(self._fd, self._allocated, target)
        self._allocated = target

    def _open_file(self, seq: int) -> None:
        path = self.directory / file_name(seq)
        header = file_header(seq)
        # Only checkpoints (one at a time) add recycled files and only this thread takes them.
        recycled = list_recycled(self.directory)[:1]
        direct = self.config.journal_direct_io
        if recycled:
            # The new header is durable before the file takes its journal name: a crash in
            # between leaves a recycled file, never a journal file with a stale header.
            fd, direct = open_file(recycled[0], os.O_RDWR, direct=direct)
            writer = BlockWriter(fd)
            writer.append([header], 0)  # its block's old records become zeros
            os.fdatasync(fd)
            os.rename(recycled[0], path)
            size = os.fstat(fd).st_size
            allocated = max(size - size % BLOCK_BYTES, BLOCK_BYTES)
            self._stats["files_reused"] += 1
        else:
            fd, direct = open_file(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, direct=direct)
            writer = BlockWriter(fd)
            writer.append([header], 0)
            allocated = BLOCK_BYTES
            self._stats["files_created"] += 1
        if self.config.journal_direct_io and not direct and "direct_io" not in self._stats:
            log.warning("journal dir %s refuses O_DIRECT: writing through the page cache",
                        self.directory)  # fmt: skip
        self._stats["direct_io"] = int(direct)
        self._fd, self._file, self._seq = fd, writer, seq
        self._pos, self._allocated = len(header), allocated
        self._mark = (seq, self._pos)
        if self._allocated - self._pos < self.config.journal_preallocate_bytes:
            # One step only: the batches that follow add the rest a step at a time. All of
            # journal_preallocate_bytes of zeros here made a rollover to a new file one stall of
            # the whole 16 MiB written and synced in the batch's path (~40-80 ms on this disk;
            # under load a fresh file every ~2.5 s: docs/performance.md).
            self._preallocate()
        os.fsync(fd)
        fsync_dir(self.directory)

    def _roll_over(self) -> None:
        self._close_file()
        self._open_file(self._seq + 1)

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # --- checkpoint -----------------------------------------------------------------------

    async def checkpoint(self, sync_engine: Callable[[], None]) -> None:
        """Sync the engine and drop the journal it now covers (see the module docstring).

        Raises:
            OSError: the engine sync or the checkpoint file write failed.
        """
        async with self._checkpoint_lock:
            started = time.perf_counter()
            # Everything before (seq, pos) was applied to the engine before it was appended.
            mark_seq, mark_pos = self._mark
            await asyncio.to_thread(sync_engine)
            await asyncio.to_thread(self._write_checkpoint, mark_seq, mark_pos)
            self._stats["checkpoints"] += 1
            if self.trace is not None:
                self.trace.checkpoint(started)

    def _write_checkpoint(self, seq: int, offset: int) -> None:
        tmp = self.directory / (CHECKPOINT_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"seq": seq, "offset": offset}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.directory / CHECKPOINT_FILE)
        fsync_dir(self.directory)
        # Replay skips files before the mark whatever their name, so a crash around these
        # renames and deletes loses nothing.
        kept_max = self.config.journal_recycle_files
        for old_seq, path in list_files(self.directory):
            if old_seq < seq:
                if len(list_recycled(self.directory)) < kept_max:
                    os.rename(path, self.directory / recycled_name(old_seq))
                    self._stats["files_recycled"] += 1
                else:
                    path.unlink(missing_ok=True)
                    self._stats["files_deleted"] += 1
        fsync_dir(self.directory)


def fsync_dir(directory: Path) -> None:
    """Make a dir's entries (created, renamed, deleted files) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


assert FILE_HEADER.size < 64
