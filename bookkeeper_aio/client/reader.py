"""The reader's handle: reads up to the LAC, the LAC itself, and tailing a live ledger.

Theory of operation
-------------------
A reader never returns an entry beyond the last add confirmed (LAC) through :meth:`read` —
entries past it may still be truncated by a recovery. The LAC of a CLOSED ledger is its last
entry; of an open one, the highest verified LAC proof its last ensemble reports
(:meth:`read_last_add_confirmed`), refreshed by long polls while tailing. Entries past the LAC
are only available through :meth:`read_unconfirmed`, named so that callers know what they get.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ..errors import IncorrectParameterError, ReadError
from ..metadata.model import LedgerMetadata, LedgerState, Versioned
from ..protocol import ReadLacRequest
from .context import ClientContext, LedgerEntry
from .range_reads import batched, read_range
from .read_repair import ReadRepair
from .reads import long_poll, proof_lac, read_entry, request
from .short_copies import ShortCopies


class LedgerReader:
    """A ledger opened by :meth:`BookKeeper.open_ledger`."""

    def __init__(self, ctx: ClientContext, versioned: Versioned) -> None:
        self.ctx = ctx
        self._versioned = versioned
        self.ledger_id = versioned.value.ledger_id
        md: LedgerMetadata = versioned.value
        self.last_add_confirmed = md.last_entry_id if md.is_closed else -1

    @property
    def metadata(self) -> LedgerMetadata:
        return self._versioned.value

    @property
    def is_closed(self) -> bool:
        return self.metadata.is_closed

    async def read_last_add_confirmed(self) -> int:
        """Ask the last ensemble for its LAC (or take the end of a closed ledger)."""
        if not self.is_closed:
            await self._refresh_metadata()
        if self.is_closed:
            self.last_add_confirmed = self.metadata.last_entry_id
            return self.last_add_confirmed
        _, ensemble = self.metadata.last_ensemble()
        results = await asyncio.gather(
            *(request(self.ctx, b, ReadLacRequest, self.ledger_id, 0, None) for b in ensemble)
        )
        for result in results:
            lac = proof_lac(self.ledger_id, getattr(result, "lac_proof", None))
            self.last_add_confirmed = max(self.last_add_confirmed, lac)
        return self.last_add_confirmed

    async def read(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first..last`` (inclusive), never beyond the LAC.

        Raises:
            IncorrectParameterError: the range is empty or goes past the LAC.
            ReadError / NoSuchEntryError: an entry has no good copy.
        """
        if last > self.last_add_confirmed:
            await self.read_last_add_confirmed()
        if first < 0 or last < first or last > self.last_add_confirmed:
            raise IncorrectParameterError(
                f"cannot read {first}..{last} of ledger {self.ledger_id}: "
                f"the last add confirmed is {self.last_add_confirmed}"
            )
        return await self.read_unconfirmed(first, last)

    async def read_unconfirmed(self, first: int, last: int) -> list[LedgerEntry]:
        """Entries ``first..last`` whether or not they are confirmed (they may be truncated by
        a later recovery if they are not). In batches where every bookie holds every entry
        (range_reads.py), else one read per entry."""
        md = self.metadata
        window = asyncio.Semaphore(self.ctx.config.reads_parallel_max)
        short = ShortCopies(self.ctx.metadata, self.ledger_id, "read error")
        repair = ReadRepair(self.ctx, md, short) if self.ctx.config.read_repair else None
        lac = self.last_add_confirmed

        async def one(entry_id: int, bookie: str | None = None) -> LedgerEntry:
            """The entry read alone, ``bookie`` (a batch read's) asked first."""
            async with window:  # a long range must not exceed the connections' bounds
                if entry_id > lac:
                    return await read_entry(self.ctx, md, entry_id, first=bookie)
                # It exists: a replica with a bad copy is repaired, one without it is short
                # (BP-31: detection and repair in the read path) once the ledger is closed;
                # before, it may only be behind the writer (which reports its own failures).
                return await read_entry(self.ctx, md, entry_id, short.add,
                                        repair.note if repair else None,
                                        missing_is_short=md.is_closed, first=bookie)  # fmt: skip

        try:
            if first < last and batched(md, self.ctx.config.read_batch_entries):
                return await read_range(self.ctx, md, first, last, lac, one)
            return list(await asyncio.gather(*(one(e) for e in range(first, last + 1))))
        finally:
            if repair is not None:
                await repair.run()
            if self.ctx.config.mark_short_copies:
                await short.report()

    async def tail(self, from_entry_id: int = 0, batch: int = 100) -> AsyncIterator[LedgerEntry]:
        """Every entry from ``from_entry_id`` in order, following the writer; ends once the
        ledger is closed and its last entry was yielded."""
        next_id = from_entry_id
        while True:
            if next_id <= self.last_add_confirmed:
                last = min(self.last_add_confirmed, next_id + batch - 1)
                try:
                    entries = await self.read_unconfirmed(next_id, last)
                except ReadError:
                    # The writer may have changed ensemble since our metadata was read.
                    await self._refresh_metadata()
                    entries = await self.read_unconfirmed(next_id, last)
                for entry in entries:
                    yield entry
                next_id = last + 1
                continue
            if self.is_closed:
                return
            loop = asyncio.get_running_loop()
            started, before = loop.time(), self.last_add_confirmed
            lac, polled = await long_poll(self.ctx, self.metadata, before)
            if lac > before:
                self.last_add_confirmed = lac
                if polled is not None and polled.entry_id == next_id <= lac:
                    yield polled  # the answer carried it (digest checked): no second read
                    next_id += 1
                continue
            # No progress: maybe the writer closed (or changed ensemble).
            await self.read_last_add_confirmed()
            fast = loop.time() - started < self.ctx.config.long_poll_timeout_ms / 2000
            if fast and self.last_add_confirmed == before and not self.is_closed:
                # Every replica failed fast (down, backing off): wait instead of spinning.
                await asyncio.sleep(self.ctx.config.reconnect_backoff_s)

    async def _refresh_metadata(self) -> None:
        self._versioned = await self.ctx.metadata.read_ledger(self.ledger_id)
        if self.metadata.state is LedgerState.CLOSED:
            self.last_add_confirmed = self.metadata.last_entry_id
