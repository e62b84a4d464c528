"""Taking a log over: the first steps of every new writer (and of a job appending ledgers).

Theory of operation
-------------------
The protocol of ``LedgerChaining.tla`` (../shared/reference/bookkeeper.md §6), with the epoch
standing for its leader election:

1. **Bump the epoch** by compare-and-swap. From now on every change the previous writer tries
   to make to the log fails (:class:`~bookkeeper_aio.errors.LogFencedError`); its prepared
   ledger goes to the trash.
2. **Recover the last ledger** if its segment is OPEN: open it with recovery, which fences it
   on its bookies (the previous writer's next add fails) and closes it at its true last entry
   (everything the previous writer had acknowledged is before it). The segment's end is that
   entry.
3. Only then does the caller **append** to the list — a new OPEN ledger for a writer, closed
   ledgers for a committing job — in one compare-and-swap that also records the recovered end
   and still expects its own epoch.

So at most one ledger of the list is open at a time, no ledger outside the list was written to
by a writer of the current epoch, and no later ledger holds an earlier write.

The simulator's bug switch ``log-takeover-without-recovery`` skips the fence: the new writer
takes the end from a non-fencing LAC read, so the old writer keeps adding to a ledger whose end
the log already recorded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..metadata.model import Versioned
from .keys import update_log
from .model import LogMetadata

if TYPE_CHECKING:
    from .api import Logs

log = logging.getLogger(__name__)
BUG_NO_RECOVERY = "log-takeover-without-recovery"


@dataclass(frozen=True)
class Takeover:
    """A log taken over: the metadata after the epoch bump, and the end found for the segment
    that was open, ``(entries, size in bytes or None)``, to record with the first append."""

    versioned: Versioned[LogMetadata]
    epoch: int
    sealed: tuple[int, int | None] | None

    def seal(self, md: LogMetadata, closed_ms: int) -> LogMetadata:
        """``md`` with the recovered segment closed (still expecting our epoch).

        Raises:
            LogFencedError: another writer took the log over since.
        """
        if self.sealed is None:
            return md
        entries, size_bytes = self.sealed
        return md.with_last_closed(self.epoch, entries, size_bytes, closed_ms)


async def take_over(logs: Logs, name: str, writer: str) -> Takeover:
    """Steps 1 and 2 of the module docstring; the caller does step 3 with :meth:`Takeover.seal`.

    Raises:
        NoSuchLogError: no such log.
        LedgerRecoveryError: the last ledger's end could not be decided (retry later).
    """
    versioned = await update_log(
        logs.store, name, lambda md: md.taken_over(writer), logs.config.metadata_retries_max
    )
    md = versioned.value
    segment = md.open_segment
    sealed = None
    if segment is not None:
        sealed = await _seal_ledger(logs, segment.ledger_id)
        log.info(
            "log %s: epoch %d (%s) recovered ledger %d: %d records",
            name, md.epoch, writer, segment.ledger_id, sealed[0],
        )  # fmt: skip
    return Takeover(versioned, md.epoch, sealed)


async def _seal_ledger(logs: Logs, ledger_id: int) -> tuple[int, int | None]:
    """Fence and close the ledger (recovery); its number of entries and its byte length."""
    if logs.ctx.has_bug(BUG_NO_RECOVERY):
        # The defect: trust the LAC without fencing; the old writer may go on adding.
        reader = await logs.bk.open_ledger(ledger_id, logs.password, recovery=False)
        return reader.last_add_confirmed + 1, None
    reader = await logs.bk.open_ledger(ledger_id, logs.password, recovery=True)
    md = reader.metadata
    return md.last_entry_id + 1, (md.length if md.length >= 0 else None)
