"""Copying entries to a bookie: streamed, bounded, rate-limited, digest-verified.

Theory of operation
-------------------
:func:`copy_entries` runs ``replication_entries_in_flight_max`` pumps over one shared iterator
of entry ids: each pump takes the next id, reads a copy from the entry's good replicas
(:func:`~bookkeeper_aio.client.reads.read_copy`: the digest is recomputed, a corrupt copy is
no copy), waits for the rate limiter, and writes it to the target with the **recovery flag**
(a fenced or closed ledger accepts it; the entry keeps its own LAC and digest, so the target
verifies it again). Memory is bounded by the pumps (one entry each), not by the fragment.
Entries may land out of order; each write is idempotent (same bytes), so a copy interrupted
anywhere is resumed by copying what the target still lacks.

:class:`~bookkeeper_aio.rate_limit.RateLimiter` (a token bucket on the event loop's clock) is
shared by every copy of a process (``replication_rate_bytes_per_s``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterator

from ..client.context import ClientContext
from ..client.reads import read_copy, write_copy
from ..errors import BookKeeperError
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
) -> None:
    """Copy every entry of ``entry_ids`` to ``target`` (see the module docstring).

    Raises:
        ReplicationError: an entry had no good copy on its sources, or the target refused it
            (:class:`TargetRefused` when it cannot store copies at all); the other pumps
            stop (what they copied stays: the next attempt skips it).
    """

    async def pump() -> None:
        for entry_id in entry_ids:  # one iterator shared by every pump
            copy = await read_copy(ctx, ledger_id, entry_id, sources(entry_id))
            if copy is None:
                counters["entries_unreadable"] += 1
                raise ReplicationError(
                    f"ledger {ledger_id}: no good copy of entry {entry_id} on {sources(entry_id)}"
                )
            assert copy.payload is not None  # read_copy checked the copy (reads.entry_ok)
            await limiter.acquire(len(copy.payload))
            why = await write_copy(ctx, ledger_id, master_key, target, copy)
            if why is not None:
                message = f"ledger {ledger_id}: {target} refused entry {entry_id}: {why}"
                if why in CANNOT_STORE:
                    raise TargetRefused(message, target, why)
                raise ReplicationError(message)
            counters["entries_copied"] += 1
            counters["bytes_copied"] += len(copy.payload)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(max(1, in_flight_max)):
                group.create_task(pump())
    except BaseExceptionGroup as failed:  # the first failure is the story; the rest followed
        raise failed.exceptions[0] from None
