"""One replication job: restoring WQ copies of one marked ledger (steps 1-6 of
autorecovery/worker.py's theory of operation), and what a job knows and raises."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

from ..client.context import ClientContext
from ..client.placement import PlacementPolicy
from ..client.reads import read_copy
from ..client.recovery import recover
from ..config import AutorecoverySettings
from ..errors import NoSuchLedgerError
from ..metadata.lease import Lease
from ..metadata.model import LedgerMetadata, Versioned
from ..metadata.registration import BookieInfo
from ..metadata.store import MetadataStore, update_ledger
from ..metadata.underreplication import (
    Mark,
    mark_done,
    read_mark,
    to_ranges,
    update_mark,
)
from . import fragments as fr
from .checker import LedgerCheck, Row, check_ledger, list_present
from .copier import RateLimiter, ReplicationError, TargetRefused, copy_entries
from .replacement import choose, commit
from .state import decommissioning, lost_bookies

log = logging.getLogger(__name__)

ROUNDS_MAX = 3  # check-copy-verify rounds per job before it counts as failed


class Deferred(ReplicationError):
    """The job must wait: a bookie is unreachable but not (yet) declared lost."""


class TargetUnavailable(ReplicationError):
    """The bookie chosen to receive copies does not answer: the next attempt chooses again."""


class LockLost(ReplicationError):
    """The worker's lease ended: its locks may belong to others; nothing more is committed."""


@dataclass
class ClusterView:
    """What a job knows of the cluster: live bookies, and bookies that must be replaced."""

    registered: dict[str, BookieInfo]
    lost: set[str]
    leaving: set[str]

    @property
    def unusable(self) -> set[str]:
        return self.lost | self.leaving


@dataclass
class _Job:
    ledger_id: int
    mark: Versioned[Mark]
    lease: Lease
    key: bytes = b""
    failing: set[str] = field(default_factory=set)  # bookies answering errors


class LedgerRestore:
    """A replication worker's steps for one ledger (``ReplicationWorker`` runs them)."""

    ctx: ClientContext
    store: MetadataStore
    config: AutorecoverySettings
    worker_id: str
    rng: random.Random
    policy: PlacementPolicy
    limiter: RateLimiter
    counters: Counter[str]

    async def _restore(self, lid: int, lease: Lease) -> None:
        for _ in range(ROUNDS_MAX):
            mark = await read_mark(self.store, lid)
            if mark is None:
                return  # done by another worker (or an operator)
            try:
                md = (await self.store.read_ledger(lid)).value
            except NoSuchLedgerError:
                await self._drop_deleted(lid, mark)
                return
            if not md.master_key:
                raise ReplicationError(
                    f"ledger {lid} has no master key in its metadata (made by an older client): "
                    "autorecovery cannot write copies of it"
                )
            job = _Job(lid, mark, lease, bytes.fromhex(md.master_key))
            view = await self.cluster_view()
            md = await self._settle_open(job, md, view)
            check = await check_ledger(self.ctx, md, view.registered, view.unusable)
            job.failing = {r.bookie for r in check.rows if r.status == "error"}
            await self._replace(job, md, check, view)
            refused = await self._fill_in_place(job, md, check, view)
            if refused:  # they cannot store copies: replaced like bookies answering errors
                job.failing |= {r.bookie for r in refused}
                md = (await self.store.read_ledger(lid)).value
                await self._replace(job, md, LedgerCheck(lid, refused), view)
                md = (await self.store.read_ledger(lid)).value
            await self._repair_named(job, md, view)
            if await self._verified(job) and await self._done(job):
                return
        raise ReplicationError(f"ledger {lid}: still under-replicated after {ROUNDS_MAX} rounds")

    async def cluster_view(self) -> ClusterView:
        registered = await self.store.list_bookies()
        lost = set(await lost_bookies(self.store)) - set(registered)
        return ClusterView(registered, lost, set(await decommissioning(self.store)))

    async def _drop_deleted(self, lid: int, mark: Versioned[Mark]) -> None:
        await mark_done(self.store, lid, mark.version)
        self.counters["marks_of_deleted_ledgers"] += 1
        log.warning("worker %s: ledger %d was deleted; its under-replication mark (%s) is "
                    "dropped", self.worker_id, lid, ", ".join(mark.value.reasons()))  # fmt: skip

    async def _settle_open(
        self, job: _Job, md: LedgerMetadata, view: ClusterView
    ) -> LedgerMetadata:
        """Wait for the writer to fix its open last fragment, or fence and recover the ledger
        after the grace period (see the module docstring)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.open_ledger_rereplication_grace_s
        while not md.is_closed and await self._open_problem(job, md, view):
            if loop.time() >= deadline:
                self._check_lease(job)
                log.warning("worker %s: ledger %d: fencing and recovering it (open after %.0f s "
                            "of grace)", self.worker_id, job.ledger_id,
                            self.config.open_ledger_rereplication_grace_s)  # fmt: skip
                md = (await recover(self.ctx, job.ledger_id, key=job.key)).value
                self.counters["ledgers_recovered"] += 1
                return md
            await asyncio.sleep(min(1.0, max(0.01, deadline - loop.time())))
            md = (await self.store.read_ledger(job.ledger_id)).value
        return md

    async def _open_problem(self, job: _Job, md: LedgerMetadata, view: ClusterView) -> bool:
        last = fr.fragments(md)[-1]
        named = {m.bookie: m for m in job.mark.value.missing}
        for bookie in last.ensemble:
            if bookie in view.unusable:
                return True
            wanted = named.get(bookie)
            if wanted is None or bookie not in view.registered:
                continue
            if not wanted.entries:
                return True
            held = await list_present(self.ctx, bookie, md.ledger_id)
            tail = fr.intersect(fr.normalize(wanted.entries), ((last.first, 1 << 62),))
            if isinstance(held, str) or fr.subtract(tail, held):
                return True
        return False

    async def _replace(
        self, job: _Job, md: LedgerMetadata, check: LedgerCheck, view: ClusterView
    ) -> None:
        by_fragment: dict[int, set[int]] = {}
        for r in check.rows:
            if r.status in ("lost", "error"):  # also where it holds nothing: off every ensemble
                by_fragment.setdefault(r.first, set()).add(r.index)
        for f in fr.fragments(md):
            indexes = by_fragment.get(f.first)
            if not indexes or f.last is None:
                continue
            unusable = view.unusable | job.failing
            chosen = choose(f.first, f.ensemble, indexes, md.write_quorum, view.registered,
                            unusable, self.policy, self.rng, job.mark.value.plan)  # fmt: skip
            await self._record_plan(
                job, [(f.first, i, f.ensemble[i], t) for i, t in chosen.items()]
            )
            for index, target in sorted(chosen.items()):
                runs = fr.normalize(
                    fr.index_runs(index, f.first, f.last, md.ensemble_size, md.write_quorum)
                )
                await self._copy(job, md, f, target, runs, view)
            self._check_lease(job)
            replaced = {i: (f.ensemble[i], t) for i, t in chosen.items()}
            await update_ledger(self.store, job.ledger_id, commit(f.first, replaced),
                                self.ctx.config.metadata_retries_max)  # fmt: skip
            self.counters["replacements"] += len(chosen)
            log.info("worker %s: ledger %d segment %d: %s", self.worker_id, job.ledger_id,
                     f.first, {f.ensemble[i]: t for i, t in chosen.items()})  # fmt: skip

    async def _fill_in_place(
        self, job: _Job, md: LedgerMetadata, check: LedgerCheck, view: ClusterView
    ) -> tuple[Row, ...]:
        """Copy to live bookies what they lack; return the rows (as ``error``) of bookies that
        cannot store copies (a failed disk, read-only): they must be replaced instead, or the
        mark would stay for ever (a ledger closed inside its first fragment keeps its bookies)."""
        by_fragment = {f.first: f for f in fr.fragments(md)}
        refused: list[Row] = []
        for r in check.rows:
            if r.status == "missing" and r.missing:
                try:
                    await self._copy(job, md, by_fragment[r.first], r.bookie, r.missing, view)
                except TargetRefused as exc:
                    log.warning("worker %s: %s; replacing it", self.worker_id, exc)
                    refused.append(dataclasses.replace(r, status="error"))
                    continue
                self.counters["entries_filled_in_place"] += fr.count(r.missing)
        return tuple(refused)

    async def _repair_named(self, job: _Job, md: LedgerMetadata, view: ClusterView) -> None:
        """Entries a mark names on a live bookie (a reader saw an error or a corrupt copy)
        are read back from it; a copy that is not good is written again (BP-31: repair in
        the read path). Listing alone would count a corrupt copy as present."""
        for m in job.mark.value.missing:
            if (not m.entries or m.bookie not in view.registered or m.bookie in view.unusable
                    or m.bookie in job.failing):  # fmt: skip
                continue
            for f in fr.fragments(md):
                if f.last is None or m.bookie not in f.ensemble:
                    continue
                index = f.ensemble.index(m.bookie)
                runs = fr.normalize(
                    fr.index_runs(index, f.first, f.last, md.ensemble_size, md.write_quorum)
                )
                bad = []
                for entry_id in fr.entries(fr.intersect(runs, fr.normalize(m.entries))):
                    copy = await read_copy(self.ctx, job.ledger_id, entry_id, [m.bookie])
                    if copy is None:
                        bad.append(entry_id)
                if bad:
                    await self._copy(job, md, f, m.bookie, to_ranges(bad), view, force=True)
                    self.counters["entries_rewritten"] += len(bad)

    async def _copy(
        self,
        job: _Job,
        md: LedgerMetadata,
        f: fr.Fragment,
        target: str,
        runs: fr.Ranges,
        view: ClusterView,
        *,
        force: bool = False,
    ) -> None:
        """Copy ``runs`` of fragment ``f`` to ``target``: what it lacks (or, ``force``, all
        of them: copies it holds are corrupt)."""
        if not runs:
            return
        held = await list_present(self.ctx, target, job.ledger_id)
        if isinstance(held, str):
            raise TargetUnavailable(f"ledger {job.ledger_id}: target {target} is {held}")
        todo = runs if force else fr.subtract(runs, held)
        if not todo:
            return
        bad = view.lost | job.failing | {target}

        # One preferred source for every entry it holds (fr.by_preference): a bookie reads a
        # stored batch whole to serve one entry of it (docs/performance.md at 909bfe3,
        # ``rereplication``); turned by the ledger id, so concurrent copies spread out.
        def sources(entry_id: int) -> list[str]:
            held = [b for b in fr.replicas(md, f, entry_id) if b not in bad]
            found = fr.by_preference(f, held, job.ledger_id)
            return [b for b in found if b in view.registered] or found

        await copy_entries(self.ctx, job.ledger_id, job.key, target, fr.entries(todo), sources,
                           self.limiter, self.config.replication_entries_in_flight_max,
                           self.counters, deferred_sync=not force)  # fmt: skip
        if force:
            return  # journaled: durable as answered
        # The copies went without the target's journal: a listing answers only once they are
        # synced (bookie/deferred.py). Missing now: the target restarted before its sync.
        held = await list_present(self.ctx, target, job.ledger_id)
        if isinstance(held, str):
            raise ReplicationError(f"ledger {job.ledger_id}: target {target} is {held} after "
                                   "the copy; copying again")  # fmt: skip
        lost = fr.count(fr.subtract(todo, held))
        if lost:  # counted as copied when answered: this says how many of them went again
            self.counters["copies_lost_before_sync"] += lost
            raise ReplicationError(f"ledger {job.ledger_id}: target {target} lacks {lost} of "
                                   "the entries it took (restarted before its sync?); copying "
                                   "again")  # fmt: skip

    async def _record_plan(self, job: _Job, plan: Collection[tuple[int, int, str, str]]) -> None:
        mark = job.mark
        updated = await update_mark(self.store, job.ledger_id, mark.version,
                                    mark.value.with_plan(plan))  # fmt: skip
        if updated is not None:
            job.mark = updated

    async def _verified(self, job: _Job) -> bool:
        md = (await self.store.read_ledger(job.ledger_id)).value
        view = await self.cluster_view()
        check = await check_ledger(self.ctx, md, view.registered, view.unusable)
        unreachable = sorted({r.bookie for r in check.rows if r.status == "unreachable"})
        if unreachable:
            raise Deferred(f"ledger {job.ledger_id}: {', '.join(unreachable)} unreachable and "
                           "not declared lost; waiting")  # fmt: skip
        if not md.is_closed and await self._open_problem(job, md, view):
            return False
        return check.complete

    async def _done(self, job: _Job) -> bool:
        self._check_lease(job)
        if await mark_done(self.store, job.ledger_id, job.mark.version):
            self.counters["marks_done"] += 1
            return True
        return False  # a report was merged meanwhile: another round

    def _check_lease(self, job: _Job) -> None:
        if not job.lease.alive:
            raise LockLost(f"ledger {job.ledger_id}: our lease (and lock) ended")
