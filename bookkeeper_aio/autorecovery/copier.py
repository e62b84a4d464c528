"""Copying entries to a bookie: streamed, bounded, rate-limited, digest-verified, batched.

Theory of operation
-------------------
:func:`copy_entries` reads ahead and writes in order. A reader walks the entry ids in order
and starts a read of each (:func:`~bookkeeper_aio.client.reads.read_copy`: from the entry's
good replicas, the digest recomputed, a corrupt copy is no copy) while fewer than
``replication_entries_in_flight_max`` entries are being read, waiting to be written or being
written: memory is bounded by that many entries, not by the fragment. A writer takes the
copies in id order, waits for the rate limiter, and gathers them into
:class:`~bookkeeper_aio.protocol.AddBatchRequest` frames with the **recovery flag** (a fenced
or closed ledger accepts them; each entry keeps its own LAC and digest, so the target verifies
it again), at most the client's ``add_batch_entries_max`` entries and ``add_batch_bytes_max``
payload bytes each, as a recovery's rewrites are sent. A batch leaves once full, or as soon as
nothing more is read and fewer than :data:`WRITES_AHEAD` batches are waiting for answers (the
target is never idle while a copy is ready).

Why batches, in order (docs/performance.md at 909bfe3, ``rereplication``): one request per entry
cost the target a frame, a journal record and an answer per entry, and, the copies landing out of
order, its engine stored most of them under per-entry keys, whose flushed SSTs overlap and get
compacted: the target's disk wrote ~6x the bytes copied. Batches of ascending ids above what the
target holds are stored as one batch record each (~3x: journal, its zero-fill, the flush; ~2x
since the journal fallocates instead of writing zeros).

With ``deferred_sync`` (autorecovery's copies; not a rewrite of a corrupt copy, whose old
bytes a crash would bring back under the same id) the batches also carry
``ADD_FLAG_DEFERRED_SYNC``: the target stores them without its journal and answers at once; they
are durable once a listing of the ledger on the target answered (bookie/deferred.py), which the
worker makes before it relies on them. A copied byte then costs the target one write (its
engine's) instead of ~2.7 at the time (journal, zero-fill, engine; ~1.7 without the zero-fill).

Each batch's answer has a status per entry: the entries answered OK are stored (and counted);
the first entry refused fails the copy. Every write is idempotent (same bytes), so a copy
interrupted anywhere is resumed by copying what the target still lacks (the worker lists it).

:class:`~bookkeeper_aio.rate_limit.RateLimiter` (a token bucket on the event loop's clock) is
shared by every copy of a process (``replication_rate_bytes_per_s``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from ..client.context import ClientContext
from ..client.reads import read_copy, request
from ..digest import payload_digest
from ..errors import BookKeeperError, StatusCode
from ..protocol import (
    ADD_FLAG_DEFERRED_SYNC,
    ADD_FLAG_RECOVERY,
    AddBatchRequest,
    AddBatchResponse,
    ReadResponse,
    pack_add_entries,
)
from ..rate_limit import RateLimiter


class ReplicationError(BookKeeperError):
    """A copy could not be made (no good replica, the target refused); retried later."""

    code = -200  # BookKeeper's ReplicationException


class TargetRefused(ReplicationError):
    """The target answered a copy with an error that says it cannot store it (its disks are
    out of service, it is read-only): copies must go elsewhere."""

    def __init__(self, message: str, target: str, status: str) -> None:
        super().__init__(message)
        # The status's name (a str, unlike BookKeeperError.status: the target's answer may be
        # no status at all).
        self.target, self.status = target, status  # type: ignore[assignment]


# What a target answers when it cannot store any copy (not: busy, or the request lost).
CANNOT_STORE = frozenset({"IO_ERROR", "READ_ONLY"})
# Batches sent and not yet answered before a batch that is not full leaves anyway.
WRITES_AHEAD = 2

__all__ = ["CANNOT_STORE", "RateLimiter", "ReplicationError", "TargetRefused", "copy_entries"]


async def copy_entries(
    ctx: ClientContext,
    ledger_id: int,
    master_key: bytes,
    target: str,
    entry_ids: Iterator[int],
    sources: Callable[[int], list[str]],
    limiter: RateLimiter,
    in_flight_max: int,
    counters: Counter[str],
    *,
    deferred_sync: bool = False,
) -> None:
    """Copy every entry of ``entry_ids`` (ascending) to ``target`` (see the module docstring).
    ``deferred_sync``: the target stores the copies without its journal, durable once a
    listing of the ledger there has answered (the caller's to make).

    Raises:
        ReplicationError: an entry had no good copy on its sources, or the target refused it
            (:class:`TargetRefused` when it cannot store copies at all); the rest of the copy
            stops (what was stored stays: the next attempt skips it).
    """
    flags = ADD_FLAG_RECOVERY | (ADD_FLAG_DEFERRED_SYNC if deferred_sync else 0)
    copy = _Copy(ctx, ledger_id, master_key, target, sources, limiter, counters, flags)
    await copy.run(entry_ids, max(1, in_flight_max))


class _Copy:
    """One copy's reads and writes (:func:`copy_entries`)."""

    def __init__(
        self,
        ctx: ClientContext,
        ledger_id: int,
        master_key: bytes,
        target: str,
        sources: Callable[[int], list[str]],
        limiter: RateLimiter,
        counters: Counter[str],
        flags: int,
    ) -> None:
        self.ctx, self.ledger_id, self.master_key, self.target = ctx, ledger_id, master_key, target
        self.sources, self.limiter, self.counters, self.flags = sources, limiter, counters, flags
        config = ctx.config
        self.entries_max = max(1, config.add_batch_entries_max)
        self.bytes_max = max(1, min(config.add_batch_bytes_max, config.frame_bytes_max // 2))
        # Reads started, in id order (None: no more); each holds a slot until written.
        self.reads: asyncio.Queue[asyncio.Task[ReadResponse | ReplicationError] | None]
        self.reads = asyncio.Queue()
        self.slots = asyncio.Semaphore(1)
        self.writes: set[asyncio.Task[None]] = set()  # batches sent, not yet answered
        self.failure: ReplicationError | None = None  # the first; nothing new starts after it

    async def run(self, entry_ids: Iterator[int], in_flight_max: int) -> None:
        """Copy; on a failure, wait for the batches already sent (their answers count: what
        they stored is not copied again), then raise it. Cancelled: drop everything."""
        self.slots = asyncio.Semaphore(in_flight_max)
        reader = asyncio.create_task(self._read_all(entry_ids))
        try:
            await self._write_all()
            if self.writes:
                await asyncio.wait(self.writes)
        finally:
            reader.cancel()
            while not self.reads.empty():
                read = self.reads.get_nowait()
                if read is not None:
                    read.cancel()
            for write in self.writes:
                write.cancel()
        if self.failure is not None:
            raise self.failure

    async def _read_all(self, entry_ids: Iterator[int]) -> None:
        try:
            for entry_id in entry_ids:
                await self.slots.acquire()  # released once the entry's write is answered
                self.reads.put_nowait(asyncio.create_task(self._read(entry_id)))
        finally:  # the writer stops there whatever happened
            self.reads.put_nowait(None)

    async def _read(self, entry_id: int) -> ReadResponse | ReplicationError:
        found = await read_copy(self.ctx, self.ledger_id, entry_id, self.sources(entry_id))
        if found is None:
            self.counters["entries_unreadable"] += 1
            return ReplicationError(f"ledger {self.ledger_id}: no good copy of entry "
                                    f"{entry_id} on {self.sources(entry_id)}")  # fmt: skip
        return found

    async def _write_all(self) -> None:
        """Gather the copies, in id order, into batches and send them (module docstring),
        until every entry is sent or something failed."""
        ended = False
        while not ended and self.failure is None:
            batch: list[ReadResponse] = []
            size = 0
            while len(batch) < self.entries_max and size < self.bytes_max and not self.failure:
                if batch and self.reads.empty() and len(self.writes) < WRITES_AHEAD:
                    break  # nothing more read yet, and the target could be idle: send
                task = await self.reads.get()
                if task is None:  # every entry is read
                    ended = True
                    break
                entry = await task
                if not isinstance(entry, ReadResponse):  # no good copy anywhere
                    self.failure = self.failure or entry
                    break
                assert entry.payload is not None  # read_copy checked the copy (reads.entry_ok)
                if batch and size + len(entry.payload) > self.bytes_max:
                    self._send(batch)
                    batch, size = [], 0
                await self.limiter.acquire(len(entry.payload))
                batch.append(entry)
                size += len(entry.payload)
            if batch and self.failure is None:
                self._send(batch)
                await asyncio.sleep(0)  # let it go out now: batches reach the target in order

    def _send(self, batch: list[ReadResponse]) -> None:
        task = asyncio.create_task(self._write(batch))
        self.writes.add(task)
        task.add_done_callback(self.writes.discard)

    async def _write(self, batch: list[ReadResponse]) -> None:
        packed = pack_add_entries(_record(e) for e in batch)
        try:
            answer = await request(self.ctx, self.target, AddBatchRequest, self.ledger_id,
                                   self.flags, self.master_key, packed)  # fmt: skip
        except Exception as exc:  # not a BookKeeperError (request() returns those): no copy
            answer = exc
        finally:
            for _ in batch:
                self.slots.release()
        for entry, why in zip(batch, _statuses(answer, len(batch)), strict=True):
            if why is None:
                self.counters["entries_copied"] += 1
                self.counters["bytes_copied"] += len(entry.payload or b"")
            elif self.failure is None:
                message = (f"ledger {self.ledger_id}: {self.target} refused entry "
                           f"{entry.entry_id}: {why}")  # fmt: skip
                if why in CANNOT_STORE:
                    self.failure = TargetRefused(message, self.target, why)
                else:
                    self.failure = ReplicationError(message)


def _statuses(answer: Any, count: int) -> list[str | None]:
    """Per entry of a batch: None once stored, else why not (a status name, or the error)."""
    if type(answer) is AddBatchResponse and len(answer.statuses) == count:
        return [None if s == StatusCode.OK else _why(s) for s in answer.statuses]
    status = getattr(answer, "status", None)  # refused as a whole, an error, no answer
    return [_why(status) if status is not None else str(answer)] * count


def _why(status: int) -> str:
    try:
        return StatusCode(status).name
    except ValueError:  # a number we do not know
        return str(status)


def _record(copy: ReadResponse) -> tuple[int, int, int, int, bytes]:
    """A checked copy as ``pack_add_entries`` takes it: read_copy (reads.entry_ok) made sure
    its payload, entry LAC and digest are there."""
    assert copy.payload is not None and copy.entry_lac is not None and copy.digest is not None
    return copy.entry_id, copy.entry_lac, payload_digest(copy.payload), copy.digest, copy.payload
