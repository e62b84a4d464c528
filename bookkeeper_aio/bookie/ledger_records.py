"""Each ledger's record on this bookie: its metadata as last read from the store (BP-31
"metadata recovery tool"; the format and its use are in ``metadata/ledger_record.py``).

Theory of operation
-------------------
The handler calls :meth:`LedgerRecords.learned` when it first sees a ledger (an add, a fence,
a copy); the id goes into a bounded queue and one owned task reads the ledger's metadata and
keeps it in the ledger's ``LedgerInfo`` (:meth:`RequestHandler.set_record`). The scrubber
calls :meth:`refresh` for every ledger on every pass, so a record is at most one scrub
interval older than the store, and a ledger whose record was lost (a crash before the engine
synced it, a full queue) gets it then.

A bookie that learns of a ledger before the metadata names it (autorecovery copies entries
first and swaps the bookie into the ensemble afterwards) reads it again ``RETRY_S`` later, up
to ``RETRIES_MAX`` times; the scrub pass catches anything later. A ledger that has no metadata
is left as it is: its record must survive a store that lost it (that is what it is for).
Every failure is logged, counted and retried at the next occasion: records never stop the
bookie.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from ..errors import BookKeeperError, NoSuchLedgerError
from ..metadata.ledger_record import encode_record
from ..metadata.model import LedgerMetadata
from ..metadata.store import MetadataStore
from .handler import RequestHandler

log = logging.getLogger(__name__)

QUEUE_MAX = 10_000  # ledgers waiting for their metadata; past it the scrub pass reads them
RETRY_S = 5.0
RETRIES_MAX = 12


class LedgerRecords:
    """Keeps ledger records up to date (module docstring)."""

    def __init__(self, bookie_id: str, handler: RequestHandler, metadata: MetadataStore) -> None:
        self.bookie_id = bookie_id
        self.handler = handler
        self.metadata = metadata
        self.counters: Counter[str] = Counter()
        self._queue: asyncio.Queue[int] = asyncio.Queue(QUEUE_MAX)
        self._retries: dict[int, int] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}

    def statistics(self) -> dict[str, int]:
        return {**self.counters, "records_queued": self._queue.qsize()}

    def learned(self, ledger_id: int) -> None:
        """A ledger new to this bookie: read its metadata soon."""
        try:
            self._queue.put_nowait(ledger_id)
        except asyncio.QueueFull:
            self.counters["records_deferred_to_scrub"] += 1

    async def run(self) -> None:
        """Read the metadata of each ledger learned of (the owned background task)."""
        try:
            while True:
                ledger_id = await self._queue.get()
                try:
                    md = await self.refresh(ledger_id)
                except Exception:  # unexpected: logged; the scrub pass tries again
                    self.counters["record_failures"] += 1
                    log.exception("bookie %s: ledger %d: record", self.bookie_id, ledger_id)
                    continue
                if md is not None and self.bookie_id not in md.bookies():
                    self._retry_later(ledger_id)
                else:
                    self._retries.pop(ledger_id, None)
        finally:
            for timer in self._timers.values():
                timer.cancel()

    def _retry_later(self, ledger_id: int) -> None:
        attempts = self._retries.get(ledger_id, 0) + 1
        if attempts > RETRIES_MAX:
            self._retries.pop(ledger_id, None)
            return  # the scrub pass reads it again
        self._retries[ledger_id] = attempts
        loop = asyncio.get_running_loop()
        self._timers[ledger_id] = loop.call_later(RETRY_S, self._requeue, ledger_id)

    def _requeue(self, ledger_id: int) -> None:
        self._timers.pop(ledger_id, None)
        self.learned(ledger_id)

    async def refresh(self, ledger_id: int) -> LedgerMetadata | None:
        """Read the ledger's metadata and keep it as its record; the metadata, or None when
        the store has none or cannot be read (the record is then left as it is)."""
        try:
            versioned = await self.metadata.read_ledger(ledger_id)
        except NoSuchLedgerError:
            self.counters["records_without_metadata"] += 1
            return None
        except BookKeeperError as exc:
            self.counters["record_read_failures"] += 1
            log.warning("bookie %s: ledger %d: its metadata could not be read for its record: "
                        "%s", self.bookie_id, ledger_id, exc)  # fmt: skip
            return None
        md: LedgerMetadata = versioned.value
        try:
            if self.handler.set_record(ledger_id, encode_record(md, versioned.version)):
                self.counters["records_written"] += 1
        except OSError as exc:  # a failed ledger dir: its ledgers are re-replicated anyway
            self.counters["record_write_failures"] += 1
            log.warning("bookie %s: ledger %d: record not kept: %s", self.bookie_id, ledger_id,
                        exc)  # fmt: skip
        return md
