"""Deleting what a job's losing, failed or unrecorded attempts wrote.

Theory of operation
-------------------
A loser is tombstoned before its ledgers are deleted: the compare-and-swap to ABORTED is
applied to the record's latest version, so it also catches a ledger the task recorded after
the listing, and once it lands the task can record no more (its next compare-and-swap fails
and it deletes its own ledger). What no record names — a ledger whose task died between
creating and recording it — carries the job's tag: :func:`tagged_ledgers` reads every ledger's
metadata (bounded parallelism) to find it. That scan costs one metadata read per ledger in the
cluster, so a commit runs it only when a loser was still CREATING.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TypeVar

from ..client.bookkeeper import BookKeeper
from ..config import SparkConfig
from ..errors import NoSuchLedgerError, SparkJobError
from ..metadata.model import LedgerMetadata, Versioned
from .attempt import delete_ledger
from .model import TAG_JOB, AttemptRecord
from .records import update_attempt

T = TypeVar("T")
U = TypeVar("U")


async def bounded_map(
    items: Iterable[T], fn: Callable[[T], Awaitable[U]], parallel: int
) -> list[U]:
    """``fn`` over ``items``, at most ``parallel`` at once, results in order."""
    items = list(items)
    results: list[U] = []
    for start in range(0, len(items), parallel):
        results.extend(await asyncio.gather(*(fn(i) for i in items[start : start + parallel])))
    return results


async def tombstone(
    bk: BookKeeper, key: str, current: Versioned[AttemptRecord], config: SparkConfig
) -> tuple[int, ...]:
    """Mark an attempt ABORTED; return every ledger it recorded (none if the record is gone)."""
    try:
        stored = await update_attempt(
            bk.ctx.metadata, key, lambda r: r.aborted(), config.commit_attempts_max, current
        )
    except SparkJobError:
        return ()  # gone: the task removed it after finding the job closed
    return stored.value.ledgers


async def job_ledgers(bk: BookKeeper, parallel: int) -> list[tuple[int, LedgerMetadata]]:
    """Every ledger carrying a Spark job's tag, with its metadata."""

    async def one(ledger_id: int) -> tuple[int, LedgerMetadata] | None:
        try:
            md = (await bk.ctx.metadata.read_ledger(ledger_id)).value
        except NoSuchLedgerError:
            return None
        return (ledger_id, md) if TAG_JOB in md.custom_metadata else None

    found = await bounded_map(await bk.list_ledgers(), one, parallel)
    return [item for item in found if item is not None]


async def tagged_ledgers(bk: BookKeeper, job_id: str, parallel: int) -> set[int]:
    """The ledgers tagged with ``job_id``."""
    tag = job_id.encode()
    return {i for i, md in await job_ledgers(bk, parallel) if md.custom_metadata[TAG_JOB] == tag}


async def sweep(
    bk: BookKeeper,
    job_id: str,
    losers: Mapping[str, Versioned[AttemptRecord]],
    keep: set[int],
    tag_scan: bool,
    config: SparkConfig,
) -> int:
    """Tombstone ``losers`` and delete their ledgers (and, with ``tag_scan``, every ledger
    tagged with the job that is not in ``keep``); return how many ledgers were deleted."""
    parallel = config.sweep_parallel_max
    recorded = await bounded_map(
        losers.items(), lambda item: tombstone(bk, item[0], item[1], config), parallel
    )
    doomed = {ledger for ledgers in recorded for ledger in ledgers}
    if tag_scan:
        doomed |= await tagged_ledgers(bk, job_id, parallel)
    doomed -= keep
    deleted = await bounded_map(sorted(doomed), lambda i: delete_ledger(bk, i), parallel)
    return sum(deleted)


__all__ = ["bounded_map", "job_ledgers", "sweep", "tagged_ledgers", "tombstone"]
