"""The files engine's entry logs: the record format, records appended through the write buffer,
each buffer handed to the disk at once (writeback), logs synced and rolled; the file helpers
(engines/files.py says how the engine works as a whole).

Every write (entry, ledger info, delete tombstone) becomes one *record* appended to the current
entry log ``entrylog-XXXXXXXX.log``. Records are staged in a memory buffer and reach the file with
one ``os.write`` when the buffer fills or on ``sync()``, and the kernel is told to start
writing them to the disk at once (``sync_file_range``: a checkpoint's fdatasync then finds
little left to write, and the journal's fdatasyncs on the same disk do not wait behind it).
``sync()`` then ``fdatasync``s every log written since the previous sync, and the directory
when a log was created. A log rolls over at
the first ``sync()`` after it passed ``entry_log_bytes_max``, in the sync's thread: the old log
is fdatasync'ed to its end before the next one is created, so a torn record can only ever sit
at the tail of the newest log — and no put waits for that fdatasync (it once ran inside the put
that crossed the bound: up to 256 MiB synced on the event loop). The bulk of it runs outside
the lock; only what was appended meanwhile is synced under it, right before the switch.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import re
import struct
import threading
from collections.abc import Callable
from typing import cast

from xxhash import xxh3_64

from bookkeeper_aio.engine import LedgerInfo, Record

ENTRY, LEDGER_INFO, DELETE_LEDGER = 1, 2, 3
MAGIC = 0x31414B42  # the bytes b"BKA1" read as a little-endian u32
HEAD = struct.Struct("<IB3xIQQ")  # magic, record type, data length, ledger id, entry id
SUM = struct.Struct("<Q")  # xxh3_64 over the 28 HEAD bytes followed by the data
HEADER_BYTES = HEAD.size + SUM.size  # 36
OFFSET_BITS = 40  # location = log_id << 40 | offset: logs up to 1 TiB, 2**23 logs
_OFFSET_MASK = (1 << OFFSET_BITS) - 1
# A log rolls at a sync once past entry_log_bytes_max; past this it rolls at once (a log may not
# outgrow its locations, and a record is at most 4 GiB).
_LOG_BYTES_HARD_MAX = (1 << OFFSET_BITS) - (1 << 33)
_ROLL_SYNC_ROUNDS = 4  # fdatasyncs outside the lock before the last bit is synced under it
_LOG_NAME = re.compile(r"entrylog-([0-9a-f]{8})\.log")


class LogCorruptError(RuntimeError):
    """A record that was durably written fails its checks: the ledger dir is damaged."""


class EntryLogs:
    """The entry logs of one ledger dir: appending (``_append``), writing the buffer
    (``_flush``), rolling (``_roll``, ``_roll_if_full``), opening and naming the logs. The
    state is :class:`~engines.files.FilesEngine`'s (its ``__init__``)."""

    directory: str
    _lock: threading.Lock
    _fds: dict[int, int]
    _buf: bytearray
    _dirty: set[int]
    _synced_end: int
    _dir_dirty: bool
    _since_snapshot: int
    _failure: OSError | None
    _closed: bool
    _log_bytes_max: int
    _buffer_bytes_max: int
    _log_id: int
    _flushed: int
    _log_end: int  # where the next record goes in the current log (set by _open_log)

    def _append(self, head: bytes, tail: bytes, data: Record) -> int:
        """Stage one record; return its location. Caller holds ``_lock``."""
        self._check_usable()
        if self._log_end >= _LOG_BYTES_HARD_MAX:
            self._roll()  # no sync came for a very long time: roll here, whatever it costs
        pos = self._log_end
        buf = self._buf
        buf += head
        buf += tail
        buf += data
        self._log_end = pos + HEADER_BYTES + len(data)
        self._since_snapshot += HEADER_BYTES + len(data)
        if len(buf) >= self._buffer_bytes_max:
            self._flush()
        return (self._log_id << OFFSET_BITS) | pos

    def _check_usable(self) -> None:
        assert not self._closed, "engine is closed"
        if self._failure is not None:
            # A failed fdatasync cannot be retried (the kernel may have dropped the dirty pages),
            # and after a failed write the log's end is unknown. Reopening recovers from disk.
            raise OSError(errno.EIO, f"ledger dir {self.directory} failed: {self._failure}")

    def _flush(self) -> None:
        """Write the buffer to the current log with one os.write. Caller holds ``_lock``."""
        if self._buf:
            fd = self._fds[self._log_id]
            try:
                _write_all(fd, self._buf)
            except OSError as e:
                self._failure = e
                raise
            _start_writeback(fd, self._log_end - len(self._buf), len(self._buf))
            self._buf = bytearray()
            self._flushed = self._log_end
            self._dirty.add(self._log_id)

    def _roll(self) -> None:
        """Switch to the next log, the current one synced to its end first (so a torn record
        can only ever be at the tail of the newest log). Caller holds ``_lock``."""
        self._flush()
        self._fdatasync(self._fds[self._log_id])
        self._dirty.discard(self._log_id)
        self._open_log(self._log_id + 1)

    def _roll_if_full(self) -> None:
        """Roll a log past ``entry_log_bytes_max`` (the sync thread, ``_sync_lock`` held):
        sync the bulk outside the lock while puts go on, then under it only the rest."""
        for _ in range(_ROLL_SYNC_ROUNDS):
            with self._lock:
                self._check_usable()
                if self._log_end < self._log_bytes_max:
                    return
                self._flush()
                fd, end = self._fds[self._log_id], self._log_end
                if end - self._synced_end <= self._buffer_bytes_max:
                    break  # little left: sync it under the lock, below
            self._fdatasync(fd)
            with self._lock:
                if self._fds.get(self._log_id) == fd:
                    self._synced_end = end
        with self._lock:
            if self._log_end >= self._log_bytes_max:
                self._roll()
                self._synced_end = 0

    def _fdatasync(self, fd: int) -> None:
        try:
            os.fdatasync(fd)
        except OSError as e:
            self._failure = e  # a failed fdatasync cannot be retried: poison the engine
            raise

    def _open_log(self, log_id: int) -> None:
        path = self._log_path(log_id)
        created = not os.path.exists(path)
        read_only = self._fds.pop(log_id, None)  # recovery may have opened it for reading
        if read_only is not None:
            os.close(read_only)
        fd = self._fds[log_id] = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        self._log_id = log_id
        self._log_end = self._flushed = os.fstat(fd).st_size
        self._synced_end = 0  # as far as we know: a roll syncs it all
        self._dir_dirty |= created

    def _read_fd(self, log_id: int) -> int:
        fd = self._fds.get(log_id)
        if fd is None:
            fd = self._fds[log_id] = os.open(self._log_path(log_id), os.O_RDONLY)
        return fd

    def _log_path(self, log_id: int) -> str:
        return os.path.join(self.directory, f"entrylog-{log_id:08x}.log")


def _parse(data: bytes | mmap.mmap, pos: int, size: int) -> tuple[int, int, int, int] | None:
    """(type, ledger id, entry id, data length) of a sound record at ``pos``, else None."""
    if size - pos < HEADER_BYTES:
        return None
    magic, kind, length, ledger_id, entry_id = HEAD.unpack_from(data, pos)
    end = pos + HEADER_BYTES + length
    if magic != MAGIC or kind not in (ENTRY, LEDGER_INFO, DELETE_LEDGER) or end > size:
        return None
    with memoryview(data) as view:  # hash in place: no copy of the record
        h = xxh3_64(view[pos : pos + HEAD.size])
        h.update(view[pos + HEADER_BYTES : end])
    if SUM.unpack_from(data, pos + HEAD.size)[0] != h.intdigest():
        return None
    return kind, ledger_id, entry_id, length


def _decode_info(data: bytes) -> LedgerInfo:
    try:
        return LedgerInfo.from_bytes(data)
    except (ValueError, TypeError) as e:  # its checksum held: written so by a newer version?
        raise LogCorruptError(f"undecodable ledger info record: {e}") from e


def _writeback_call() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux; Python's ``os`` has no binding), or None."""
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return cast("Callable[[int, int, int, int], int]", call)


_SYNC_FILE_RANGE = _writeback_call()
_SYNC_FILE_RANGE_WRITE = 2  # start writing the range's dirty pages; wait for nothing


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Have the kernel start writing what was just written (a buffer: ~1 MiB) to the disk.

    Without it the page cache held everything until ``sync()``'s fdatasync, which then wrote a
    checkpoint interval's data in one go (~100 MB a bookie at 10,000 adds/s), and every journal
    fdatasync on the same disk waited for it: `breakdown --rate 10000 --engine files
    --duration 20`, p99 227-229 ms, checkpoints ~2.0 s in all; with this 26-30 ms and 0.34-0.37
    s (two pairs, 2026-11-28; rocksdb's paced flushes the same day: 62.5 ms). Only a hint: its
    result is ignored, ``sync()``'s fdatasync is still the durability point and reports any
    error."""
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def _write_all(fd: int, data: bytes | bytearray) -> None:
    done = os.write(fd, data)
    while done < len(data):  # short writes are rare on regular files but allowed
        done += os.write(fd, memoryview(data)[done:])


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock_dir(directory: str) -> int:
    """Hold an exclusive flock on ``directory/LOCK``; the descriptor keeps it."""
    fd = os.open(os.path.join(directory, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise OSError(errno.EBUSY, f"ledger dir {directory} is in use by another process") from None
    return fd
