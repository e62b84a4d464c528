"""The auditor: notices under-replication and marks it. One at a time (election.py).

Theory of operation
-------------------
While it holds the seat, the :class:`Auditor` runs four owned loops:

* **Bookies** (the registry watch): a bookie that leaves starts a timer; one that is still
  gone after ``lost_bookie_recovery_delay_s`` is *declared lost* (``autorecovery/lost/<id>``)
  and every ledger with a fragment on it is marked; one that comes back before cancels the
  timer (and a lost one that comes back is no longer lost: its copies are there). A bookie
  registering with another **incarnation** id than the one recorded was formatted again: the
  old incarnation's copies are gone, so its ledgers are marked (the event is logged and
  counted). Bookies that appear in ensembles but never registered while this auditor ran
  (dead before it was elected) are timed from the first audit pass that finds them.
* **Periodic check** every ``audit_interval_s`` (audit.py): every closed fragment's entries
  listed on its bookies; whatever has fewer than WQ copies is marked.
* **Marks** (watch): the number of under-replicated ledgers, and for each lost bookie the
  moment no mark names it any more — the SLA figure *loss to WQ* (from the moment it left).
* **Processes** (watch): the workers' published counters, added up (entries and bytes
  copied), so :meth:`Auditor.statistics` has the cluster's figures.

Timers run on the event loop's clock; the ``*_ms`` wall-clock stamps are for people.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..client.context import ClientContext
from ..config import AutorecoverySettings
from ..errors import BookKeeperError, MetadataUnavailableError
from ..metadata.lease import Lease
from ..metadata.underreplication import MARKS_PREFIX, Mark
from . import state
from .audit import audit_all, mark_bookie

log = logging.getLogger(__name__)

RETRY_S = 1.0  # a loop whose store call failed tries again after this long
PUBLISH_INTERVAL_S = 1.0  # statistics are written to the store at most this often


class Auditor:
    """See the module docstring. ``wall_ms`` stamps marks for people only."""

    def __init__(
        self,
        ctx: ClientContext,
        config: AutorecoverySettings,
        auditor_id: str,
        wall_ms: Callable[[], int],
    ) -> None:
        self.ctx = ctx
        self.store = ctx.metadata
        self.config = config
        self.auditor_id = auditor_id
        self.wall_ms = wall_ms
        self.counters: Counter[str] = Counter()
        self.registered: dict[str, Any] = {}
        self.gone_since: dict[str, float] = {}  # bookie -> loop time it was last seen
        self.incarnations: dict[str, str] = {}
        self.lost: dict[str, float] = {}  # declared lost, not yet back at WQ: bookie -> gone at
        self.restore_s: dict[str, float] = {}  # lost bookie -> loss to WQ, seconds
        self.under_replicated = 0
        self.copied: dict[str, dict[str, int]] = {}  # process -> its last published counters
        self._copied_gone: Counter[str] = Counter()  # counters of processes that went away
        self._audit_now = asyncio.Event()
        self._published_at = -1e9

    def statistics(self) -> dict[str, Any]:
        """The SLA figures and counters (docs/durability.md)."""
        copied = self._copied_totals()
        restore = list(self.restore_s.values())
        return {
            **self.counters,
            "under_replicated_ledgers": self.under_replicated,
            "bookies_registered": len(self.registered),
            "bookies_gone": sorted(self.gone_since),
            "bookies_lost_not_restored": sorted(self.lost),
            "loss_to_wq_s_last": round(restore[-1], 3) if restore else None,
            "loss_to_wq_s_max": round(max(restore), 3) if restore else None,
            "losses_restored": len(restore),
            "entries_copied": copied["entries_copied"],
            "bytes_copied": copied["bytes_copied"],
        }

    def trigger_audit(self) -> None:
        """Run the periodic check now (``shell audit`` runs its own instead)."""
        self._audit_now.set()

    async def run(self, lease: Lease) -> None:
        """Audit until cancelled (the caller cancels when the seat is lost)."""
        log.warning("auditor %s elected", self.auditor_id)
        self.counters["elected"] += 1
        found = await state.read_prefix(self.store, state.INCARNATIONS_PREFIX)
        self.incarnations = {b: str(d.get("incarnation", "")) for b, d in found.items()}
        now = asyncio.get_running_loop().time()
        lost = await state.lost_bookies(self.store)
        self.lost = {b: now for b in lost}
        async with asyncio.TaskGroup() as group:
            group.create_task(self._retrying(self._watch_bookies))
            group.create_task(self._retrying(self._watch_marks))
            group.create_task(self._retrying(self._watch_processes))
            group.create_task(self._retrying(self._periodic))
            group.create_task(self._retrying(self._loss_timer))
            group.create_task(self._publisher(lease))

    async def _retrying(self, loop_fn: Callable[[], Any]) -> None:
        while True:
            try:
                await loop_fn()
            except (BookKeeperError, OSError) as exc:
                self.counters["store_errors"] += 1
                log.warning("auditor %s: %s failed (retrying): %s", self.auditor_id,
                            loop_fn.__name__, exc)  # fmt: skip
                await asyncio.sleep(RETRY_S)

    # --- bookies ----------------------------------------------------------------------------

    async def _watch_bookies(self) -> None:
        async for snapshot in self.store.watch_bookies():
            now = asyncio.get_running_loop().time()
            for bookie in self.registered:
                if bookie not in snapshot:
                    self.gone_since.setdefault(bookie, now)
                    log.warning("auditor: bookie %s left", bookie)
            self.registered = dict(snapshot)
            for bookie, info in snapshot.items():
                await self._seen(bookie, getattr(info, "incarnation", ""))

    async def _seen(self, bookie: str, incarnation: str) -> None:
        self.gone_since.pop(bookie, None)
        if bookie in self.lost:
            await state.forget_lost(self.store, bookie)
            self.lost.pop(bookie, None)
            log.warning("auditor: lost bookie %s is back", bookie)
        known = self.incarnations.get(bookie)
        if not incarnation or known == incarnation:
            return
        if known:
            self.counters["incarnations_changed"] += 1
            log.warning("auditor: bookie %s was formatted again (incarnation %s -> %s): the old "
                        "incarnation's copies are gone", bookie, known, incarnation)  # fmt: skip
            await mark_bookie(self.ctx, bookie, "new incarnation", self.wall_ms())
        doc = {"incarnation": incarnation, "since_ms": self.wall_ms()}
        await self.store.put(state.INCARNATIONS_PREFIX + bookie, state.encode(doc))
        self.incarnations[bookie] = incarnation

    async def _loss_timer(self) -> None:
        loop = asyncio.get_running_loop()
        delay = self.config.lost_bookie_recovery_delay_s
        while True:
            now = loop.time()
            due = [b for b, t in sorted(self.gone_since.items()) if now - t >= delay]
            for bookie in due:
                await self._declare_lost(bookie, self.gone_since[bookie])
            waits = [t + delay - now for b, t in self.gone_since.items() if b not in due]
            await asyncio.sleep(max(0.05, min([*waits, 1.0])))

    async def _declare_lost(self, bookie: str, gone_at: float) -> None:
        if bookie in self.registered:
            self.gone_since.pop(bookie, None)
            return
        # Marks first: a failure in between retries both (marks merge); a lost record without
        # its marks would leave ledgers short until the next periodic check.
        marked = await mark_bookie(self.ctx, bookie, "lost", self.wall_ms())
        await state.declare_lost(
            self.store, bookie, f"gone for {self.config.lost_bookie_recovery_delay_s} s",
            self.incarnations.get(bookie, ""), self.wall_ms(),
        )  # fmt: skip
        self.gone_since.pop(bookie, None)
        self.lost[bookie] = gone_at
        self.counters["bookies_lost"] += 1
        self.counters["ledgers_marked"] += marked

    # --- periodic check ---------------------------------------------------------------------

    async def _periodic(self) -> None:
        while True:
            await self.audit()
            try:
                async with asyncio.timeout(self.config.audit_interval_s):
                    await self._audit_now.wait()
            except TimeoutError:
                pass
            self._audit_now.clear()

    async def audit(self) -> None:
        """One pass of the periodic check (audit.py)."""
        registered = set(await self.store.list_bookies())
        lost = set(await state.lost_bookies(self.store)) - registered
        gone = lost | set(await state.decommissioning(self.store))
        result = await audit_all(self.ctx, registered, gone,
                                 self.config.audit_ledgers_in_flight_max, self.wall_ms)  # fmt: skip
        now = asyncio.get_running_loop().time()
        for bookie in sorted(result.bookies - registered - set(self.lost)):
            self.gone_since.setdefault(bookie, now)  # in an ensemble, never seen registered
        self.counters["audits"] += 1
        self.counters["audit_ledgers_marked"] += result.marked
        log.info("auditor: audit of %d ledgers: %d short, %d not fully checked", result.ledgers,
                 result.marked, result.incomplete)  # fmt: skip

    # --- marks and figures ------------------------------------------------------------------

    async def _watch_marks(self) -> None:
        async for snapshot in self.store.watch_prefix(MARKS_PREFIX):
            self.under_replicated = len(snapshot)
            named = set()
            for versioned in snapshot.values():
                named.update(Mark.from_json_bytes(versioned.value).bookies())
            now = asyncio.get_running_loop().time()
            for bookie, gone_at in list(self.lost.items()):
                if bookie not in named and bookie not in self.restore_s:
                    self.restore_s[bookie] = now - gone_at
                    log.warning("auditor: every ledger of lost bookie %s is back at WQ, %.1f s "
                                "after it left", bookie, now - gone_at)  # fmt: skip

    async def _watch_processes(self) -> None:
        async for snapshot in self.store.watch_prefix(state.PROCESSES_PREFIX):
            current = {
                k[len(state.PROCESSES_PREFIX) :]: state.decode(k, v.value)
                for k, v in snapshot.items()
            }
            for process, last in self.copied.items():
                if process not in current:  # keep what a process copied before it went
                    self._copied_gone.update({k: int(last.get(k, 0)) for k in _COPY_KEYS})
            self.copied = {p: {k: int(d.get(k, 0)) for k in _COPY_KEYS} for p, d in current.items()}

    def _copied_totals(self) -> Counter[str]:
        totals = Counter(self._copied_gone)
        for counters in self.copied.values():
            totals.update(counters)
        return totals

    async def _publisher(self, lease: Lease) -> None:
        while True:
            await asyncio.sleep(PUBLISH_INTERVAL_S)
            try:
                stats = {**self.statistics(), "auditor": self.auditor_id, "at_ms": self.wall_ms()}
                await self.store.put(state.AUDITOR_STATS_KEY, state.encode(stats))
            except MetadataUnavailableError as exc:
                log.info("auditor: could not publish statistics: %s", exc)


_COPY_KEYS = ("entries_copied", "bytes_copied")
