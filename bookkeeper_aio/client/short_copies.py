"""Copies a client saw missing, reported as under-replication marks (BP-31 "plug durability
violations").

Theory of operation
-------------------
A writer learns that an entry has fewer than WQ copies when a bookie of its write set fails
*after* the entry reached AQ (BookKeeper only logs that, so the ledger stays short until a
periodic check, if ever). A reader learns it when a replica of an entry below the LAC answers
with an error or a copy whose digest is wrong, or, once the ledger is closed, "no such entry"
(in an open ledger that replica may only be behind the writer). Both note ``(bookie, entry)``
in a :class:`ShortCopies` and, at a point where it costs nothing on the hot path (after an
ensemble change, at close, after a read), :meth:`ShortCopies.report` writes one mark per
ledger (``metadata/underreplication.py``). Reporting is best effort: a failure is logged, and
the auditor's periodic check finds the same copies later. At most ``ENTRIES_MAX`` entries are
kept per bookie (past it the mark names every entry of that bookie; the worker lists them).
"""

from __future__ import annotations

import logging
import time

from ..errors import BookKeeperError
from ..metadata.store import MetadataStore
from ..metadata.underreplication import ALL, Missing, mark_under_replicated, to_ranges

log = logging.getLogger(__name__)

ENTRIES_MAX = 10_000


class ShortCopies:
    """Entries of one ledger seen short of a copy, per bookie, until reported."""

    def __init__(self, store: MetadataStore, ledger_id: int, reason: str) -> None:
        self.store = store
        self.ledger_id = ledger_id
        self.reason = reason
        self.pending: dict[str, set[int] | None] = {}  # None: too many, every entry
        self.reported = 0

    def add(self, bookie: str, entry_id: int) -> None:
        entries = self.pending.setdefault(bookie, set())
        if entries is not None:
            entries.add(entry_id)
            if len(entries) > ENTRIES_MAX:
                self.pending[bookie] = None

    async def report(self) -> None:
        """Mark the ledger for what was noted since the last report (never raises)."""
        if not self.pending:
            return
        pending, self.pending = self.pending, {}
        now_ms = int(time.time() * 1000)  # a stamp for people; never used for decisions
        missing = [
            Missing(b, (self.reason,), now_ms, ALL if e is None else to_ranges(e))
            for b, e in sorted(pending.items())
        ]
        try:
            await mark_under_replicated(self.store, self.ledger_id, missing, now_ms=now_ms)
            self.reported += len(missing)
            log.warning("ledger %d marked under-replicated (%s): %s", self.ledger_id, self.reason,
                        ", ".join(sorted(pending)))  # fmt: skip
        except BookKeeperError as exc:
            log.warning("ledger %d: could not mark it under-replicated (%s): %s; the periodic "
                        "check will find it", self.ledger_id, self.reason, exc)  # fmt: skip
