"""Bit-rot detection and repair (BP-31 "Bit Rot Detection", BP-24): the scrubber.

Theory of operation
-------------------
Data kept for years degrades silently, and nobody notices until a reader needs it. A pass
re-reads every entry this bookie stores, ledger by ledger, at most ``scrub_bytes_per_s`` (a
token bucket on the loop clock, :class:`~bookkeeper_aio.rate_limit.RateLimiter`), and checks
it twice: the payload against its payload digest and the header against the entry digest,
as a reader would (an engine that checks its own records, like the files engine, raises
instead; that is a bad copy too). A bad copy is replaced by a digest-verified copy from a
peer replica (:func:`~bookkeeper_aio.bookie.integrity.copy_from_peers`, the same repair the
BP-46 integrity check makes), durable like an add; a copy no peer can give is marked
under-replicated for autorecovery and counted. The peers come from the ledger's metadata,
which the pass reads anyway to keep the ledger's record current (``ledger_records.py``); a
ledger without metadata is still checked, but a bad copy of it can only be reported.

Engine calls happen on the event loop, like the handler's reads (the engine interface's
threading contract), in steps of at most ``STEP_ENTRIES`` entries or ``STEP_BYTES`` bytes
between awaits, so a pass holds the loop for about a millisecond at most at a time. Each entry
is charged its size plus ``ENTRY_CHARGE_BYTES`` against the rate: the per-entry work (a
lookup, two hashes, ~10-30 us of CPU) costs as much as reading a few KiB, and without the
charge a rate in bytes over small entries meant thousands of lookups a second (``python -m
benchmarks scrub``: 1 KiB entries at 8 MiB/s cost a loaded 2-core machine most of its write
throughput; BookKeeper's ``localScrubRateLimit`` counts entries per second).

Passes start every ``scrub_interval_s`` after the previous one started, the first one after a
random part of the interval (bookies started together do not scrub together, and a bookie
restarted often still gets passes; BookKeeper's ScrubberService draws every delay from 0.5-1.5
times its period); 0: only on request. And when asked (:meth:`Scrubber.control`, the SCRUB
request of ``shell scrub --bookie ID``). Counters go to :meth:`statistics` and to SCRUB's
answer.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter

from ..client.context import ClientContext
from ..client.reads import replicas
from ..client.short_copies import ShortCopies
from ..config import BookieConfig
from ..digest import ENTRY_RECORD_HEADER, header_digest, payload_digest
from ..errors import BookKeeperError
from ..metadata.model import LedgerMetadata
from ..rate_limit import RateLimiter
from .handler import RequestHandler
from .integrity import copy_from_peers
from .ledger_records import LedgerRecords

log = logging.getLogger(__name__)

PAGE = 1_000  # entry ids listed at a time
STEP_ENTRIES = 32  # entries checked between two awaits
STEP_BYTES = 256 << 10
ENTRY_CHARGE_BYTES = 4096  # charged per entry beside its size (module docstring)
PROGRESS = ("ledgers_total", "ledgers_done", "entries_checked", "bytes_checked", "bad_copies",
            "repaired", "unrepaired")  # fmt: skip


class Scrubber:
    """See the module docstring. ``ctx`` and ``records`` are None without a metadata store
    (the pass then checks and reports, but cannot repair)."""

    def __init__(
        self,
        config: BookieConfig,
        handler: RequestHandler,
        ctx: ClientContext | None,
        records: LedgerRecords | None,
        rng: random.Random | None = None,
    ) -> None:
        self.bookie_id = config.bookie_id
        self.interval_s = config.scrub_interval_s
        self.handler = handler
        self.ctx = ctx
        self.records = records
        self.limiter = RateLimiter(config.scrub_bytes_per_s)
        self.rng = rng or random.Random()
        self.passes_started = 0
        self.passes_done = 0
        self.progress: Counter[str] = Counter()  # the running pass, or the last one
        self.counters: Counter[str] = Counter()  # since boot
        self._wanted = asyncio.Event()

    def control(self, start: bool) -> tuple[int, ...]:
        """The SCRUB request: ask for a pass (``start``) and report. A caller that asked waits
        until ``passes_done`` passes ``passes_started`` as it was answered: that pass starts
        after the call (a running one may have passed some ledgers already)."""
        if start:
            self._wanted.set()
        return (self.passes_started, self.passes_done, *(self.progress[k] for k in PROGRESS))

    def statistics(self) -> dict[str, int]:
        return {**self.counters, "passes_started": self.passes_started,
                "passes_done": self.passes_done}  # fmt: skip

    async def run(self) -> None:
        """Passes every ``scrub_interval_s`` and on request (the owned background task)."""
        loop = asyncio.get_running_loop()
        next_start = loop.time()
        if self.interval_s > 0:  # no draw otherwise: the simulator's bookies share this rng
            next_start += self.rng.uniform(0, self.interval_s)
        while True:
            if self.interval_s > 0:
                try:
                    async with asyncio.timeout_at(next_start):
                        await self._wanted.wait()
                except TimeoutError:
                    pass
            else:
                await self._wanted.wait()
            self._wanted.clear()
            next_start = loop.time() + self.interval_s
            try:
                await self.scrub_pass()
            except Exception:  # e.g. listing the ledgers failed: the next pass tries again
                self.counters["pass_failures"] += 1
                log.exception("bookie %s: scrub pass failed", self.bookie_id)

    async def scrub_pass(self) -> None:
        """Check every stored entry once; repair or report what is bad. The pass counts as
        done however it ends (a caller waiting for it is not left waiting)."""
        self.passes_started += 1
        try:
            await self._pass()
        finally:
            self.passes_done += 1
        p = self.progress
        self.counters["passes"] += 1
        log.info("bookie %s: scrub pass %d done: %d entries (%d bytes) checked, %d bad copies, "
                 "%d repaired, %d not repaired", self.bookie_id, self.passes_done,
                 p["entries_checked"], p["bytes_checked"], p["bad_copies"], p["repaired"],
                 p["unrepaired"])  # fmt: skip

    async def _pass(self) -> None:
        ledgers = self.handler.engine.ledgers()
        self.progress = Counter(ledgers_total=len(ledgers))
        log.info("bookie %s: scrub pass %d: %d ledgers", self.bookie_id, self.passes_started,
                 len(ledgers))  # fmt: skip
        for ledger_id in ledgers:
            try:
                await self._scrub_ledger(ledger_id)
            except (BookKeeperError, OSError) as exc:
                self.counters["ledger_failures"] += 1
                log.warning("bookie %s: scrub of ledger %d failed: %s", self.bookie_id,
                            ledger_id, exc)  # fmt: skip
            except Exception:  # unexpected: logged in full; a scrub never stops the bookie
                self.counters["ledger_failures"] += 1
                log.exception("bookie %s: scrub of ledger %d failed", self.bookie_id, ledger_id)
            self.progress["ledgers_done"] += 1

    async def _metadata(self, ledger_id: int) -> LedgerMetadata | None:
        """The ledger's metadata (keeping its record current), None if there is none."""
        if self.records is not None:
            return await self.records.refresh(ledger_id)
        if self.ctx is None:
            return None
        try:
            return (await self.ctx.metadata.read_ledger(ledger_id)).value
        except BookKeeperError:  # none, or the store is unreachable: checked, not repaired
            return None

    async def _scrub_ledger(self, ledger_id: int) -> None:
        md = await self._metadata(ledger_id)
        engine = self.handler.engine
        start = 0
        while True:
            ids = engine.list_entries(ledger_id, start, PAGE)
            at = 0
            while at < len(ids):
                checked, charge, read = 0, 0, 0
                for entry_id in ids[at : at + STEP_ENTRIES]:
                    checked += 1
                    size, intact = self._check(ledger_id, entry_id)
                    read += size
                    charge += size + ENTRY_CHARGE_BYTES
                    if not intact:
                        await self._repair(ledger_id, entry_id, md)
                    if charge >= STEP_BYTES:
                        break
                at += checked
                self._count(checked, read)
                await self.limiter.acquire(charge)
                await asyncio.sleep(0)  # the loop's other work between two steps
            if len(ids) < PAGE:
                return
            start = ids[-1] + 1

    def _count(self, entries: int, size: int) -> None:
        for counters in (self.progress, self.counters):
            counters["entries_checked"] += entries
            counters["bytes_checked"] += size

    def _check(self, ledger_id: int, entry_id: int) -> tuple[int, bool]:
        """(bytes read, whether the stored copy is intact); an absent entry (deleted since it
        was listed) is intact."""
        try:
            record = self.handler.engine.get_entry(ledger_id, entry_id)
        except Exception as exc:  # the engine's own checks failed, or the disk did
            log.error("bookie %s: scrub: entry %d of ledger %d cannot be read: %r",
                      self.bookie_id, entry_id, ledger_id, exc)  # fmt: skip
            return 0, False
        if record is None:
            return 0, True
        if len(record) < ENTRY_RECORD_HEADER.size:
            return len(record), False
        lac, pdigest, digest = ENTRY_RECORD_HEADER.unpack_from(record)
        with memoryview(record) as view:  # the payload hashed in place, not copied
            intact = payload_digest(view[ENTRY_RECORD_HEADER.size :]) == pdigest
        intact = intact and header_digest(ledger_id, entry_id, lac, pdigest) == digest
        if not intact:
            log.error("bookie %s: scrub: entry %d of ledger %d fails its digest",
                      self.bookie_id, entry_id, ledger_id)  # fmt: skip
        return len(record), intact

    async def _repair(self, ledger_id: int, entry_id: int, md: LedgerMetadata | None) -> None:
        self.progress["bad_copies"] += 1
        self.counters["bad_copies"] += 1
        members = replicas(md, entry_id) if md is not None else []
        peers = [b for b in members if b != self.bookie_id]
        repaired = False
        if self.ctx is not None and peers and self.bookie_id in members:
            repaired = await copy_from_peers(self.ctx, self.handler, ledger_id, entry_id, peers)
        if repaired:
            self.progress["repaired"] += 1
            self.counters["repaired"] += 1
            log.warning("bookie %s: scrub: entry %d of ledger %d repaired from a peer",
                        self.bookie_id, entry_id, ledger_id)  # fmt: skip
            return
        self.progress["unrepaired"] += 1
        self.counters["unrepaired"] += 1
        why = ("no metadata (no peers known)" if md is None
               else "not in its write set any more" if self.bookie_id not in members
               else "no peer has a good copy")  # fmt: skip
        log.error("bookie %s: scrub: entry %d of ledger %d is bad and not repaired: %s",
                  self.bookie_id, entry_id, ledger_id, why)  # fmt: skip
        if self.ctx is not None and md is not None and self.bookie_id in members:
            short = ShortCopies(self.ctx.metadata, ledger_id, "scrub found a bad copy")
            short.add(self.bookie_id, entry_id)
            await short.report()
