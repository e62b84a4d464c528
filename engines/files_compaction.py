"""Compaction of the files engine's entry logs: the disk space of deleted ledgers back.

Theory of operation
-------------------
A log other than the current one never changes, so its space comes back only by dropping the
whole file. ``FilesEngine.reclaim_space(live_ratio_min)`` (the bookie's GC, in a worker thread,
with the engine's sync lock held) compacts every log whose **live fraction** — the bytes of
the records the index still points to, over the file's size — fell below the ratio:

1. The current log, if it is such a log (the usual case right after many deletes), is rolled
   first (synced to its end, a new log begun), so it can be compacted like the others.
2. **Copy**: each live ENTRY record is appended again, byte for byte, to the current log and
   its index slot moved there — under the engine's lock, and only if the slot still points
   at the old place (a put or a delete that came meanwhile wins). Every ledger with a
   LEDGER_INFO record in the log gets its current info appended again. The copies are
   records like any other: a replay applies them after everything older, which is what the
   index says.
3. **Snapshot**: the engine syncs (the copies are durable) and writes an index snapshot at
   the new end, then deletes every older snapshot: nothing that survives names the old log.
4. **Drop**: the log is unlinked (its descriptor closed a pass later: a read that took it just
   before the move may still be reading) and the directory fsynced.

Crash safety, step by step: before 3 the old log and the old snapshots are intact (copies
replayed or not, they hold the same bytes as what they copy); between 3 and 4 the new
snapshot does not need the old log; after 4 the same. If every snapshot is lost, opening
replays every log from the first: a dropped log's DELETE_LEDGER records are then gone, so a
log is dropped only when **no older log holds records of a ledger it deleted** (else those
older records would come back). Such a log waits until the older one is compacted (its live
fraction fell too: those records are dead). Each log's summary (the ledgers it has records
of, those it deletes) is read once, from its record headers, and kept.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .files_log import (
    DELETE_LEDGER,
    ENTRY,
    HEAD,
    HEADER_BYTES,
    LEDGER_INFO,
    MAGIC,
    OFFSET_BITS,
    SUM,
    LogCorruptError,
    _fsync_dir,
    _parse,
)

if TYPE_CHECKING:
    from .files import FilesEngine

log = logging.getLogger(__name__)

COPY_BATCH_RECORDS = 1024  # records read outside the lock, then moved under it at once


@dataclass
class LogSummary:
    """What a log holds records of (its headers, read once: the log never changes)."""

    ledgers: set[int] = field(default_factory=set)  # with ENTRY or LEDGER_INFO records
    deletes: set[int] = field(default_factory=set)  # with DELETE_LEDGER records
    damaged: bool = False  # an unreadable header: assume it holds every ledger


def reclaim(engine: FilesEngine, live_ratio_min: float, step: Callable[[str], None]) -> int:
    """Compact the logs below ``live_ratio_min`` (module docstring); the bytes freed (those
    of the logs dropped less those copied forward).
    ``step(name)`` is called between steps (tests crash there). Caller holds ``_sync_lock``."""
    with engine._lock:
        engine._check_usable()
        for fd in engine._retired_fds:  # dropped a pass ago: no read can still hold them
            os.close(fd)
        engine._retired_fds.clear()
    logs = sorted(engine._log_sizes())
    if live_ratio_min <= 0 or not logs:
        return 0
    live = _live_bytes(engine, OFFSET_BITS)
    sizes = engine._log_sizes()
    doomed = [i for i in logs if sizes[i] > 0 and live.get(i, 0) < live_ratio_min * sizes[i]]
    current = engine._log_id
    if current in doomed:
        if sizes[current] < engine._buffer_bytes_max:
            doomed.remove(current)  # too small to be worth a roll
        else:
            with engine._lock:
                engine._roll()
            step("rolled")
    dropped: list[int] = []
    copied_before = engine._compaction["bytes_copied"]
    for log_id in doomed:
        if _blocked(engine, log_id, [i for i in logs if i < log_id and i not in dropped]):
            engine._compaction["logs_deferred"] += 1
            continue
        _copy_live(engine, log_id, OFFSET_BITS, step)
        dropped.append(log_id)
    if not dropped:
        return 0
    engine._sync(force_snapshot=True, snapshot_always=True)
    step("snapshot written")
    for name in engine._snapshot_names()[1:]:  # the one just written is the newest
        os.unlink(os.path.join(engine.directory, name))
    step("older snapshots deleted")
    freed = 0
    for log_id in dropped:
        with engine._lock:
            engine._retired_fds.append(engine._read_fd(log_id))
            del engine._fds[log_id]
        os.unlink(engine._log_path(log_id))
        engine._summaries.pop(log_id, None)
        freed += sizes[log_id]
        step(f"log {log_id} dropped")
    _fsync_dir(engine.directory)
    freed = max(0, freed - (engine._compaction["bytes_copied"] - copied_before))
    engine._compaction["logs_compacted"] += len(dropped)
    engine._compaction["bytes_freed"] += freed
    log.info("%s: compacted %d entry logs, %d bytes freed", engine.directory, len(dropped), freed)
    return freed


def _live_bytes(engine: FilesEngine, offset_bits: int) -> dict[int, int]:
    """Bytes per log the index points to (records with headers). Outside the lock: an
    estimate that only chooses candidates; the copy checks every slot under the lock."""
    with engine._lock:
        ledgers = list(engine._ledgers.values())
    live: dict[int, int] = {}
    for ledger in ledgers:
        for slots in list(ledger.chunks.values()):
            locs, lengths = slots[0::2], slots[1::2]
            if not locs:
                continue
            low, high = min(locs), max(locs)
            if low >= 0 and low >> offset_bits == high >> offset_bits:
                # The usual chunk: no holes, one log (builtins over the array: no Python loop)
                bytes_ = sum(lengths) + HEADER_BYTES * len(locs)
                live[low >> offset_bits] = live.get(low >> offset_bits, 0) + bytes_
                continue
            for loc, length in zip(locs, lengths, strict=True):
                if loc >= 0:
                    live[loc >> offset_bits] = (
                        live.get(loc >> offset_bits, 0) + HEADER_BYTES + length
                    )
    return live


def summary(engine: FilesEngine, log_id: int) -> LogSummary:
    """The log's summary, read from its headers once and kept."""
    found = engine._summaries.get(log_id)
    if found is not None:
        return found
    found = LogSummary()
    with engine._lock:
        fd = engine._read_fd(log_id)
    size = os.fstat(fd).st_size
    if size:
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as data:
            pos = 0
            while pos + HEADER_BYTES <= size:
                magic, kind, length, ledger_id, _ = HEAD.unpack_from(data, pos)
                if magic != MAGIC or kind not in (ENTRY, LEDGER_INFO, DELETE_LEDGER):
                    found.damaged = True
                    break
                (found.deletes if kind == DELETE_LEDGER else found.ledgers).add(ledger_id)
                pos += HEADER_BYTES + length
            found.damaged |= pos != size
    engine._summaries[log_id] = found
    return found


def _blocked(engine: FilesEngine, log_id: int, older: list[int]) -> bool:
    """Would dropping the log bring back records of a ledger it deleted (on a full replay)?"""
    deletes = summary(engine, log_id).deletes
    if not deletes:
        return False
    for other in older:
        s = summary(engine, other)
        if s.damaged or not deletes.isdisjoint(s.ledgers):
            return True
    return False


def _copy_live(engine: FilesEngine, log_id: int, offset_bits: int, step: Callable) -> None:
    """Append the log's live records to the current log and move their slots there."""
    with engine._lock:
        fd = engine._read_fd(log_id)
    size = os.fstat(fd).st_size
    infos: set[int] = set()
    batch: list[tuple[int, int, int, bytes]] = []
    if not size:
        return
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as data:
        pos = 0
        while pos < size:
            parsed = _parse(data, pos, size)  # every record's checksum is checked
            if parsed is None:
                raise LogCorruptError(f"{engine._log_path(log_id)}: damaged record at {pos}")
            kind, ledger_id, entry_id, length = parsed
            end = pos + HEADER_BYTES + length
            if kind == ENTRY and _points_at(engine, ledger_id, entry_id, log_id, pos, offset_bits):
                batch.append((ledger_id, entry_id, pos, data[pos:end]))
            elif kind == LEDGER_INFO:
                infos.add(ledger_id)
            if len(batch) >= COPY_BATCH_RECORDS:
                _move(engine, log_id, batch, offset_bits)
                batch = []
                step(f"copying log {log_id}")
            pos = end
    _move(engine, log_id, batch, offset_bits)
    with engine._lock:  # the info as it is now: a put_ledger after this appends after it
        for ledger_id in sorted(infos):
            ledger = engine._ledgers.get(ledger_id)
            if ledger is not None and ledger.info is not None:
                engine._append_info(ledger_id, ledger.info)
    step(f"log {log_id} copied")


def _points_at(
    engine: FilesEngine, ledger_id: int, entry_id: int, log_id: int, pos: int, bits: int
) -> bool:
    ledger = engine._ledgers.get(ledger_id)
    where = ledger.get(entry_id) if ledger is not None else None
    return where is not None and where[0] == (log_id << bits) | pos


def _move(
    engine: FilesEngine, log_id: int, batch: list[tuple[int, int, int, bytes]], bits: int
) -> None:
    with engine._lock:
        for ledger_id, entry_id, pos, raw in batch:
            ledger = engine._ledgers.get(ledger_id)
            where = ledger.get(entry_id) if ledger is not None else None
            if ledger is None or where is None or where[0] != (log_id << bits) | pos:
                continue  # overwritten or deleted meanwhile: that write wins
            length = len(raw) - HEADER_BYTES
            head, tail = raw[: HEADER_BYTES - SUM.size], raw[HEADER_BYTES - SUM.size : HEADER_BYTES]
            ledger.set(entry_id, engine._append(head, tail, raw[HEADER_BYTES:]), length)
            engine._compaction["bytes_copied"] += len(raw)
