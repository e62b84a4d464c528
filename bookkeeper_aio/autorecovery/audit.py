"""One pass over every ledger: the replicas check, and marks for what is short.

Theory of operation
-------------------
:func:`audit_all` lists the ledgers and runs :func:`~.checker.check_ledger` on each, at most
``audit_ledgers_in_flight_max`` at once, against one view of the cluster (registered bookies,
bookies declared lost or leaving). Every bookie that lacks entries of a closed fragment gets a
mark (``metadata/underreplication.py``). The pass also returns every bookie that appears in a
ledger's ensembles, so the auditor learns of bookies that died before it was elected. The
auditor runs it every ``audit_interval_s``; ``shell audit`` runs it now, with a progress bar.
:func:`ledgers_with` lists the ledgers that have a fragment on a bookie (a lost bookie, a new
incarnation, a decommission).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field

from ..client.context import ClientContext
from ..errors import NoSuchLedgerError
from ..metadata.model import LedgerMetadata
from ..metadata.underreplication import ALL, Missing, mark_under_replicated
from .checker import check_ledger

log = logging.getLogger(__name__)


@dataclass
class AuditResult:
    ledgers: int = 0
    marked: int = 0  # ledgers found short
    incomplete: int = 0  # ledgers with a bookie that could not be asked
    bookies: set[str] = field(default_factory=set)  # every bookie of every ensemble


async def all_ledgers(ctx: ClientContext) -> AsyncIterator[LedgerMetadata]:
    """Every ledger's metadata (ledgers deleted while listing are skipped)."""
    async for lid in ctx.metadata.list_ledgers():
        try:
            yield (await ctx.metadata.read_ledger(lid)).value
        except NoSuchLedgerError:
            continue


async def audit_all(
    ctx: ClientContext,
    registered: Collection[str],
    gone: Collection[str],
    in_flight_max: int,
    now_ms: Callable[[], int],
    progress: Callable[[int], object] = lambda n: None,
) -> AuditResult:
    """Check and mark every ledger (see the module docstring); ``progress(1)`` per ledger."""
    result = AuditResult()
    limit = asyncio.Semaphore(in_flight_max)

    async def one(md: LedgerMetadata) -> None:
        try:
            check = await check_ledger(ctx, md, registered, gone)
            missing = check.missing("periodic check", now_ms())
            if missing:
                await mark_under_replicated(ctx.metadata, md.ledger_id, missing, now_ms=now_ms())
                result.marked += 1
            if any(r.status == "unreachable" for r in check.rows):
                result.incomplete += 1
        finally:
            limit.release()
            progress(1)

    async with asyncio.TaskGroup() as group:
        async for md in all_ledgers(ctx):
            result.ledgers += 1
            result.bookies.update(md.bookies())
            await limit.acquire()
            group.create_task(one(md))
    return result


async def ledgers_with(ctx: ClientContext, bookie: str) -> list[int]:
    """Ids of the ledgers that have ``bookie`` in a fragment."""
    return [md.ledger_id async for md in all_ledgers(ctx) if bookie in md.bookies()]


async def mark_bookie(ctx: ClientContext, bookie: str, reason: str, now_ms: int) -> int:
    """Mark every ledger with a fragment on ``bookie`` (all of its copies); how many."""
    marked = 0
    for lid in await ledgers_with(ctx, bookie):
        await mark_under_replicated(ctx.metadata, lid, [Missing(bookie, (reason,), now_ms, ALL)],
                                    now_ms=now_ms)  # fmt: skip
        marked += 1
    log.warning("%d ledgers with a fragment on %s marked under-replicated (%s)", marked, bookie,
                reason)  # fmt: skip
    return marked
