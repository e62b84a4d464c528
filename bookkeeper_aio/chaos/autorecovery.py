"""Chaos with autorecovery (BP-31's black-box tests): an autorecovery process, bookies lost for
good, and at the end every ledger back at WQ.

An autorecovery process (``python -m bookkeeper_aio.autorecovery``, short delays) runs beside
the cluster from the start. During the faults, ``lose`` bookies are killed and never started
again (they count against ``max_unavailable`` for good). After the usual verification, every
ledger must, within ``WQ_WAIT_S``, have every copy of every closed fragment on a live bookie
(the replicas check of ``autorecovery/checker.py``) and none on a lost bookie; each ledger that
does counts in ``report.back_at_wq``, and one that does not is an error.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
from contextlib import AbstractContextManager
from pathlib import Path

from .. import BookKeeper, sandbox
from ..autorecovery.checker import check_ledger
from ..errors import NoSuchLedgerError
from ..metadata.underreplication import read_mark
from .base import _ChaosState, _event_wait

WQ_WAIT_S = 90.0
AUTORECOVERY_SETTINGS = (
    "lost_bookie_recovery_delay_s=2",
    "audit_interval_s=15",
    "open_ledger_rereplication_grace_s=5",
    "replication_lock_ttl_s=3",
    "replication_workers=4",
    "replication_retry_backoff_s=1",
    "lease_ttl_s=3",
)


def autorecovery_process(uri: str, log_path: Path) -> AbstractContextManager[subprocess.Popen]:
    """The run's autorecovery process (sandbox.autorecovery_process, short delays)."""
    return sandbox.autorecovery_process(uri, log_path, AUTORECOVERY_SETTINGS)


async def _describe(bk: BookKeeper, lid: int, lost: set[str]) -> str:
    """What is short in a ledger, and what its mark (if any) says."""
    md = (await bk.ctx.metadata.read_ledger(lid)).value
    registered = set(await bk.ctx.metadata.list_bookies())
    check = await check_ledger(bk.ctx, md, registered, lost)
    rows = [f"{r.first}[{r.index}] {r.bookie} {r.status}" for r in check.rows if r.status != "ok"]
    mark = await read_mark(bk.ctx.metadata, lid)
    said = (
        "no mark"
        if mark is None
        else (
            f"mark {mark.value.reasons()} attempts {mark.value.attempts}: {mark.value.last_error}"
        )
    )
    return f"ledger {lid} {md.state.value}: {rows}, {said}"


class _Autorecovery(_ChaosState):
    """Methods of :class:`~bookkeeper_aio.chaos.run._Chaos` (its state is theirs)."""

    async def lose_bookies(self, count: int) -> None:
        """Kill ``count`` bookies for good at random moments of the fault phase (one at a time,
        each while another fault may still strike)."""
        rng = random.Random(f"{self.seed}/lose")
        for _ in range(count):
            if await _event_wait(self.stop_faults, rng.uniform(0.2, 0.5) * self.duration_s):
                return
            while len(self.unavailable) >= self.max_unavailable:
                if await _event_wait(self.stop_faults, 0.5):
                    return
            candidates = [
                i
                for i, b in enumerate(self.bookies)
                if i not in self.unavailable and i not in self.starting and b.running
            ]
            if not candidates:
                return
            victim = rng.choice(candidates)
            self.unavailable.add(victim)
            self.lost.add(victim)  # unavailable for good: other faults now leave E3 up
            self.bookies[victim].kill()
            self.report.lost_for_good += 1
            self.say(f"kill -9 {self.name(victim)} for good (autorecovery must replace it)")

    async def _why_short(self, bk: BookKeeper, lid: int, lost: set[str]) -> str:
        try:
            return await _describe(bk, lid, lost)
        except NoSuchLedgerError:
            return f"ledger {lid} deleted"

    async def back_at_wq(self, bk: BookKeeper) -> None:
        """Wait until every ledger has all its copies on live bookies (see module doc)."""
        lost = {self.bookies[i].address for i in self.lost}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WQ_WAIT_S
        pending = sorted(self.ledgers)
        while pending and loop.time() < deadline:
            registered = set(await bk.ctx.metadata.list_bookies())
            still = []
            for lid in pending:
                try:
                    md = (await bk.ctx.metadata.read_ledger(lid)).value
                except NoSuchLedgerError:
                    continue
                check = await check_ledger(bk.ctx, md, registered, lost)
                if not check.complete or lost & set(md.bookies()):
                    still.append(lid)
            self.report.back_at_wq = len(self.ledgers) - len(still)
            pending = still
            if pending:
                await asyncio.sleep(1.0)
        if pending:
            why = [await self._why_short(bk, lid, lost) for lid in pending[:3]]
            self.error(f"{len(pending)} ledgers not back at WQ {WQ_WAIT_S} s after healing: "
                       f"{pending[:5]}; {'; '.join(why)}")  # fmt: skip
        else:
            self.say(f"every ledger back at WQ (lost for good: {sorted(lost)})")
