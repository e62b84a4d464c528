"""The final check: every ledger recovered, closed where it must be, and read back whole."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .. import (
    BookKeeper,
    BookKeeperError,
    LedgerReader,
)
from .base import (
    READ_CHUNK,
    READ_TIMEOUT_S,
    VERIFY_LEDGER_TIMEOUT_S,
    VERIFY_TIMEOUT_S,
    LedgerLog,
    _call,
    _ChaosState,
)


class _Verify(_ChaosState):
    """Methods of :class:`~bookkeeper_aio.chaos.run._Chaos` (its state is theirs)."""

    async def verify(self, bk: BookKeeper) -> None:
        r = self.report
        r.ledgers = len(self.ledgers)
        r.acknowledged = sum(log.acked_max + 1 for log in self.ledgers.values())
        deadline = time.monotonic() + VERIFY_TIMEOUT_S + r.acknowledged / 2000
        for ledger_id in sorted(self.ledgers):
            log = self.ledgers[ledger_id]
            self.last_failure = "no failure"
            budget = max(5.0, min(VERIFY_LEDGER_TIMEOUT_S, deadline - time.monotonic()))
            try:
                async with asyncio.timeout(budget):
                    await self.verify_ledger(bk, log)
            except TimeoutError:
                if ledger_id not in self.closed_final:
                    r.unclosed.append(ledger_id)
                r.lost += log.acked_max + 1
                r.problem(
                    f"ledger {ledger_id}: not verified in {budget:.0f}s (last failure: "
                    f"{self.last_failure}); its {log.acked_max + 1} acknowledged entries count "
                    "as lost"
                )
        self.say(f"verified {len(self.ledgers)} ledgers")

    async def verify_ledger(self, bk: BookKeeper, log: LedgerLog) -> None:
        """Recover (retrying while it fails), then read the whole ledger back."""
        r = self.report
        while True:
            try:
                reader = await self.open(bk, log.ledger_id, recovery=True)
                break
            except BookKeeperError as exc:
                self.last_failure = f"open_ledger: {type(exc).__name__}: {exc}"
                await asyncio.sleep(0.5)
        if not reader.is_closed:
            r.unclosed.append(log.ledger_id)
            r.problem(f"ledger {log.ledger_id}: still {reader.metadata.state} after recovery")
            return
        r.closed_ledgers += 1
        self.closed_final.add(log.ledger_id)
        last = reader.last_add_confirmed
        self.closed(log, last, "the final check")
        if last < log.lac_seen:
            r.problem(f"ledger {log.ledger_id}: closed at {last}, a reader saw LAC {log.lac_seen}")
            r.errors.append(f"ledger {log.ledger_id}: a LAC seen by a reader was truncated")
        bad: list[int] = []
        for lo in range(0, last + 1, READ_CHUNK):
            hi = min(last, lo + READ_CHUNK - 1)
            entries = await self.read_retrying(reader, lo, hi)
            bad += self.compare(log, lo, entries)
            r.verified_entries += len(entries)
        missing = [e for e in bad if e <= log.acked_max] + list(range(last + 1, log.acked_max + 1))
        if missing:
            r.lost += len(missing)
            r.problem(
                f"ledger {log.ledger_id} (writer {log.writer}, E/WQ/AQ {log.quorums}) closed at "
                f"{last} by {log.closed_by}; acknowledged 0..{log.acked_max}: "
                f"{len(missing)} acknowledged entries missing or different, first {missing[:10]}"
            )

    async def read_retrying(self, reader: LedgerReader, lo: int, hi: int) -> list[Any]:
        """Read a chunk, retrying ReadError (bookies just restarted) until the caller's timeout."""
        while True:
            try:
                async with asyncio.timeout(READ_TIMEOUT_S):
                    return await _call(self.report, "LedgerReader.read", reader.read(lo, hi))
            except BookKeeperError as exc:
                self.last_failure = f"read {lo}..{hi}: {type(exc).__name__}: {exc}"
                self.report.read_retries += 1
                await asyncio.sleep(0.5)
