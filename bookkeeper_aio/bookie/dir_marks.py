"""Marking the ledgers of a failed ledger dir under-replicated (BP-31), with retries: the
bookie cannot serve them any more, and waiting for the next periodic check would leave them
one copy short for hours."""

from __future__ import annotations

import asyncio
import logging
import time

from ..errors import BookKeeperError
from ..metadata.store import MetadataStore
from ..metadata.underreplication import ALL, Missing, mark_under_replicated

log = logging.getLogger(__name__)

ATTEMPTS_MAX = 10
RETRY_S = 1.0


async def mark_dir_ledgers(store: MetadataStore, bookie_id: str, ledgers: list[int]) -> int:
    """Mark each ledger as lacking every copy on ``bookie_id``; how many were marked (the
    rest are logged; the auditor's periodic check finds them too)."""
    marked = 0
    for lid in ledgers:
        now_ms = int(time.time() * 1000)  # a stamp for people; never used for decisions
        missing = [Missing(bookie_id, ("disk failure",), now_ms, ALL)]
        for attempt in range(ATTEMPTS_MAX):
            try:
                await mark_under_replicated(store, lid, missing, now_ms=now_ms)
                marked += 1
                break
            except BookKeeperError as exc:
                if attempt + 1 == ATTEMPTS_MAX:
                    log.error("bookie %s: could not mark ledger %d: %s", bookie_id, lid, exc)
                await asyncio.sleep(RETRY_S)
    log.warning("bookie %s: %d of %d ledgers of a failed dir marked under-replicated",
                bookie_id, marked, len(ledgers))  # fmt: skip
    return marked
