"""The files engine's index: per ledger in memory, checkpointed into snapshot files, rebuilt on
open from the newest valid snapshot and the logs after it (engines/files.py says how the
engine works as a whole).

The index lives in memory: per ledger, chunks of 1024 entry slots in ``array('q')`` (two numbers
per slot: the location ``log_id << 40 | offset`` or -1 for a hole, and the record length), plus
the ledger info and the highest entry id. A record still in the buffer is read from the buffer.

The index is checkpointed into a snapshot file that names the log position it covers (on a sync
once ``snapshot_interval_bytes`` were appended since the last one, and on close). Under the lock
a sync only takes the index's shape (per ledger its info, last id and chunk map) and marks the
chunks as shared; a put that changes a shared chunk copies it first (copy-on-write), so the
snapshot is serialized outside the lock, in pieces, and still describes exactly the log prefix
it names. Opening loads the newest valid snapshot and replays the logs from its position. A bad
record at the tail of the newest log is a write torn by a crash and is truncated away; a bad
record anywhere else is corruption and opening fails. The byte layouts are in docs/engines.md.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import sys
from array import array

import msgpack
from xxhash import xxh3_64, xxh3_64_intdigest

from bookkeeper_aio.engine import LedgerInfo

from .files_log import (
    _LOG_NAME,
    ENTRY,
    HEADER_BYTES,
    LEDGER_INFO,
    OFFSET_BITS,
    SUM,
    EntryLogs,
    LogCorruptError,
    _decode_info,
    _fsync_dir,
    _parse,
    _write_all,
)

log = logging.getLogger(__name__)

SNAPSHOT_MAGIC = b"BKAIDX01"
SNAPSHOT_TAIL_BYTES = 4096  # a snapshot checksums this much log before its position
SNAPSHOTS_KEPT = 2
_CHUNK_BITS = 10
_HOLES = array("q", [-1, 0]) * (1 << _CHUNK_BITS)
_SNAPSHOT_NAME = re.compile(r"index-([0-9a-f]{8})-([0-9a-f]{16})\.snap")


class _Ledger:
    """One ledger's index: chunked entry locations, the highest entry id, the info."""

    __slots__ = ("chunks", "info", "last", "shared")

    def __init__(self) -> None:
        self.chunks: dict[int, array[int]] = {}  # entry_id >> 10 -> [loc, length] * up to 1024
        self.info: LedgerInfo | None = None
        self.last = -1
        self.shared: set[int] | None = None  # chunks a snapshot holds: copied before a change

    def set(self, entry_id: int, loc: int, length: int) -> None:
        chunk = entry_id >> _CHUNK_BITS
        slots = self.chunks.get(chunk)
        if self.shared and chunk in self.shared:  # the snapshot's copy stays as it was
            self.shared.discard(chunk)
            assert slots is not None  # a snapshot shares only chunks the ledger has
            slots = self.chunks[chunk] = array("q", slots)
        if slots is None:
            slots = self.chunks[chunk] = array("q")
        i = (entry_id & ((1 << _CHUNK_BITS) - 1)) * 2
        if len(slots) <= i:  # grow lazily so a small ledger costs a few slots, not a chunk
            slots.extend(_HOLES[: i + 2 - len(slots)])
        slots[i] = loc
        slots[i + 1] = length
        if entry_id > self.last:
            self.last = entry_id

    def get(self, entry_id: int) -> tuple[int, int] | None:
        slots = self.chunks.get(entry_id >> _CHUNK_BITS)
        i = (entry_id & ((1 << _CHUNK_BITS) - 1)) * 2
        if slots is None or i >= len(slots) or slots[i] < 0:
            return None
        return slots[i], slots[i + 1]

    def ids(self, start: int, max_count: int) -> list[int]:
        out: list[int] = []
        for c in sorted(k for k in self.chunks if k >= max(start, 0) >> _CHUNK_BITS):
            slots, base = self.chunks[c], c << _CHUNK_BITS
            for i in range(0, len(slots), 2):
                if slots[i] >= 0 and base + i // 2 >= start:
                    if len(out) >= max_count:
                        return out
                    out.append(base + i // 2)
        return out

    def capture(self) -> tuple[bytes | None, int, dict[int, array[int]]]:
        """The ledger as a snapshot will hold it (lock held): its chunks become shared."""
        self.shared = set(self.chunks)
        return self.info.to_bytes() if self.info else None, self.last, dict(self.chunks)

    @classmethod
    def load(cls, info: bytes | None, last: int, chunks: list[list[object]]) -> _Ledger:
        ledger = cls()
        ledger.info = LedgerInfo.from_bytes(info) if info is not None else None
        ledger.last = last
        for c, raw in chunks:
            assert isinstance(c, int) and isinstance(raw, bytes)
            slots = array("q")
            slots.frombytes(raw)
            if sys.byteorder == "big":
                slots.byteswap()
            ledger.chunks[c] = slots
        return ledger


def _le_bytes(slots: array[int]) -> bytes:
    if sys.byteorder == "big":
        slots = array("q", slots)
        slots.byteswap()
    return slots.tobytes()


class IndexSnapshots(EntryLogs):
    """The index's snapshots (``_capture``, ``_write_snapshot``, ``_load_snapshot``) and its
    rebuilding on open (``_recover``: the newest valid snapshot, then the logs replayed)."""

    _ledgers: dict[int, _Ledger]

    # ----- snapshots

    def _capture(self) -> tuple[int, int, int, list[tuple[int, bytes | None, int, dict]]]:
        """The index as of the current log end, as cheaply as the lock allows: per ledger its
        info, last id and chunk map; the chunks are shared, copied by the next put that
        changes one. Caller holds ``_lock``, buffer empty."""
        pos = self._log_end
        tail = self._tail_sum(self._fds[self._log_id], pos)
        ledgers = [(lid, *ledger.capture()) for lid, ledger in self._ledgers.items()]
        return self._log_id, pos, tail, ledgers

    @staticmethod
    def _tail_sum(fd: int, pos: int) -> int:
        n = min(pos, SNAPSHOT_TAIL_BYTES)
        return xxh3_64_intdigest(os.pread(fd, n, pos - n))

    def _write_snapshot(self, name: str, pieces: list[bytes]) -> None:
        tmp = os.path.join(self.directory, "index.snap.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for piece in pieces:
                _write_all(fd, piece)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(self.directory, name))
        _fsync_dir(self.directory)
        for old in self._snapshot_names()[SNAPSHOTS_KEPT:]:
            os.unlink(os.path.join(self.directory, old))

    def _snapshot_names(self) -> list[str]:
        """Snapshot file names, newest (highest position) first."""
        names = [n for n in os.listdir(self.directory) if _SNAPSHOT_NAME.fullmatch(n)]
        return sorted(names, reverse=True)  # fixed-width hex: name order is position order

    def _load_snapshot(self, name: str, logs: list[int]) -> tuple[int, int]:
        """Restore the index from one snapshot; return the log position it covers.

        Raises:
            ValueError: the snapshot is damaged or does not match the logs on disk.
        """
        with open(os.path.join(self.directory, name), "rb") as f:
            blob = f.read()
        body = blob[len(SNAPSHOT_MAGIC) + SUM.size :]
        if blob[: len(SNAPSHOT_MAGIC)] != SNAPSHOT_MAGIC or blob[8:16] != SUM.pack(
            xxh3_64_intdigest(body)
        ):
            raise ValueError("bad magic or checksum")
        version, log_id, pos, tail, ledgers = msgpack.unpackb(body, raw=False)
        if version != 1 or log_id not in logs:
            raise ValueError(f"version {version} or log {log_id} unknown")
        fd = self._read_fd(log_id)
        if os.fstat(fd).st_size < pos or self._tail_sum(fd, pos) != tail:
            raise ValueError(f"does not match {self._log_path(log_id)}")
        self._ledgers = {lid: _Ledger.load(*rest) for lid, *rest in ledgers}
        return log_id, pos

    # ----- recovery

    def _recover(self) -> None:
        names = os.listdir(self.directory)
        if "index.snap.tmp" in names:  # a snapshot write interrupted by a crash
            os.unlink(os.path.join(self.directory, "index.snap.tmp"))
        logs = sorted(int(m[1], 16) for n in names if (m := _LOG_NAME.fullmatch(n)))
        start_log, start_pos = self._restore_index(logs)
        for log_id in logs:
            if log_id >= start_log:
                pos = start_pos if log_id == start_log else 0
                self._since_snapshot += self._replay(log_id, pos, newest=log_id == logs[-1])
        self._open_log(logs[-1] if logs else 0)

    def _restore_index(self, logs: list[int]) -> tuple[int, int]:
        """Load the newest valid snapshot, deleting the ones that fail; else start from zero."""
        for name in self._snapshot_names():
            try:
                return self._load_snapshot(name, logs)
            except (ValueError, TypeError, KeyError, AssertionError, msgpack.UnpackException) as e:
                log.warning("%s: ignoring index snapshot %s: %s", self.directory, name, e)
                self._ledgers = {}
                # Delete it: once the logs change again it could look valid and be wrong.
                os.unlink(os.path.join(self.directory, name))
        return (logs[0] if logs else 0), 0

    def _replay(self, log_id: int, pos: int, *, newest: bool) -> int:
        """Apply the records of one log from ``pos``; return the bytes replayed."""
        fd = self._read_fd(log_id)
        size = os.fstat(fd).st_size
        if size <= pos:
            return 0
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as data:
            end = self._apply_records(log_id, data, pos, size)
        if end < size:
            path = self._log_path(log_id)
            if not newest:
                raise LogCorruptError(f"{path}: damaged record at offset {end} (not at the tail)")
            log.warning("%s: torn record at offset %d, dropping %d bytes", path, end, size - end)
            with open(path, "r+b") as f:
                f.truncate(end)
                os.fsync(f.fileno())
        return end - pos

    def _apply_records(self, log_id: int, data: mmap.mmap, pos: int, size: int) -> int:
        """Apply good records from ``pos``; return the offset of the first bad one (or size)."""
        while pos < size:
            parsed = _parse(data, pos, size)
            if parsed is None:
                return pos
            kind, lid, eid, length = parsed
            if kind == ENTRY:
                ledger = self._ledgers.get(lid)
                if ledger is None:
                    ledger = self._ledgers[lid] = _Ledger()
                ledger.set(eid, (log_id << OFFSET_BITS) | pos, length)
            elif kind == LEDGER_INFO:
                info = _decode_info(data[pos + HEADER_BYTES : pos + HEADER_BYTES + length])
                self._ledgers.setdefault(lid, _Ledger()).info = info
            else:
                self._ledgers.pop(lid, None)
            pos += HEADER_BYTES + length
        return pos


def _serialize(
    log_id: int, pos: int, tail: int, ledgers: list[tuple[int, bytes | None, int, dict]]
) -> tuple[str, list[bytes]]:
    """A captured index as a snapshot file's name and bytes, in pieces: one msgpack call per
    chunk, so the event loop's thread gets the GIL between them (docs/engines.md has the
    layout; the bytes are those of one ``packb`` of the whole)."""
    packer = msgpack.Packer()
    body = [packer.pack_array_header(5), packer.pack(1), packer.pack(log_id), packer.pack(pos),
            packer.pack(tail), packer.pack_array_header(len(ledgers))]  # fmt: skip
    for lid, info, last, chunks in ledgers:
        body += (packer.pack_array_header(4), packer.pack(lid), packer.pack(info),
                 packer.pack(last), packer.pack_array_header(len(chunks)))  # fmt: skip
        for c, slots in chunks.items():
            body.append(packer.pack([c, _le_bytes(slots)]))
    digest = xxh3_64()
    for piece in body:
        digest.update(piece)
    name = f"index-{log_id:08x}-{pos:016x}.snap"
    return name, [SNAPSHOT_MAGIC + SUM.pack(digest.intdigest()), *body]
