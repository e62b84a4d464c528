"""Replication workers: take a mark, restore WQ copies of the ledger, delete the mark.

Theory of operation
-------------------
A :class:`ReplicationWorker` watches the marks (``metadata/underreplication.py``) and works on
up to ``replication_workers`` ledgers at once, each under a lock it creates under its
process's lease (a dead worker's locks expire with its lease). For one ledger (a *job*):

1. **Deleted ledger**: the mark is dropped (and counted) — nothing to restore.
2. **Open last fragment**: if a bookie of it is lost, failing or leaving, or lacks entries a
   mark names, the writer gets ``open_ledger_rereplication_grace_s`` to replace it by itself
   (its own ensemble change); then the worker fences and recovers the ledger, as BookKeeper
   does ("recovery open could result in client write failure"). Other fragments go at once.
3. **Check** every closed fragment (checker.py) against the cluster: registered bookies, the
   bookies autorecovery declared lost, those being decommissioned.
4. **Replace** bookies that cannot hold their copies (lost, decommissioning, answering errors):
   replacements from the placement policy (replacement.py), recorded in the mark's plan, copied
   (copier.py: from good replicas, digest verified, recovery adds, rate-limited, without the
   target's journal), listed on the target (its listing answers once the copies are synced:
   bookie/deferred.py; any missing, it restarted, the job fails and copies again), then the
   fragment's ensemble is swapped by compare-and-swap.
5. **Fill in place** what live bookies lack (an add that failed after AQ, a bookie formatted
   again); a bookie that refuses the copies because it cannot store any (IO_ERROR, READ_ONLY:
   its disks failed) is replaced as in 4 instead. Then rewrite the entries a mark names on a
   live bookie whose copy reads back bad (a reader's report): copies to the same bookie, no
   metadata change.
6. **Verify** with a second check; only a complete one deletes the mark, and only at the
   version read, so a report merged meanwhile keeps it for another round.

A bookie that is merely unreachable (not registered, not yet declared lost) defers the job: the
auditor's ``lost_bookie_recovery_delay_s`` decides when a bookie is gone. A failed or deferred
job records ``attempts``/``last_error`` in the mark and waits ``replication_retry_backoff_s``
(doubling, at most 8 times that) before the next try; a target that did not answer is dropped
from the plan. Before every commit the worker checks that its lease (hence
its lock) is alive; a commit racing another worker loses the compare-and-swap and redoes.

The loop (marks, locks, jobs, backoff) is here; one job's steps are ``worker_job.py``
(``LedgerRestore``, which ``ReplicationWorker`` extends).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..client.context import ClientContext
from ..client.placement import PlacementPolicy
from ..config import AutorecoverySettings
from ..errors import BookKeeperError, MetadataUnavailableError
from ..metadata.lease import Lease
from ..metadata.underreplication import (
    MARKS_PREFIX,
    claim,
    read_mark,
    release,
    update_mark,
)
from .copier import RateLimiter
from .worker_job import Deferred, LedgerRestore, LockLost, TargetUnavailable

log = logging.getLogger(__name__)

BACKOFF_DOUBLINGS_MAX = 3  # a mark waits at most 8 x replication_retry_backoff_s
WORKER_BUGS = frozenset({"replication-ignores-placement"})


class ReplicationWorker(LedgerRestore):
    """See the module docstring. ``wall_ms`` timestamps marks for people only."""

    def __init__(
        self,
        ctx: ClientContext,
        config: AutorecoverySettings,
        worker_id: str,
        wall_ms: Callable[[], int],
        *,
        bugs: frozenset[str] = frozenset(),
    ) -> None:
        assert bugs <= WORKER_BUGS, bugs
        self.ctx = ctx
        self.store = ctx.metadata
        self.config = config
        self.worker_id = worker_id
        self.wall_ms = wall_ms
        self.rng = random.Random(ctx.rng.getrandbits(64))
        ignore = "replication-ignores-placement" in bugs  # simulator: placement ignored
        # Replacements always spread write sets over the most racks available (replacement.py)
        self.policy = PlacementPolicy(1 if ignore else 2)
        self.limiter = RateLimiter(config.replication_rate_bytes_per_s)
        self.counters: Counter[str] = Counter()
        self.running: dict[int, asyncio.Task[None]] = {}
        self._failures: dict[int, int] = {}
        self._retry_at: dict[int, float] = {}
        self._marks: list[int] = []
        self._wake = asyncio.Event()

    def statistics(self) -> dict[str, Any]:
        """Counters (marks done/failed/deferred, entries and bytes copied, replacements,
        ledgers recovered, ...), jobs running, marks waiting for a retry."""
        return {
            **self.counters,
            "jobs_running": len(self.running),
            "marks_backing_off": len(self._retry_at),
            "rate_limit_wait_s": round(self.limiter.waited_s, 3),
        }

    # --- the loop ---------------------------------------------------------------------------

    async def run(self, lease: Lease) -> None:
        """Work on marks until cancelled, or until ``lease`` is lost (then return: the caller
        gets a new lease). Jobs are owned here and cancelled on the way out."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._watch(lease))
                while not lease.lost.is_set():
                    await self._start_jobs(group, lease)
                    await self._sleep(lease)
                raise LockLost("lease lost")
        except* LockLost:
            log.warning("worker %s: lease lost; jobs stopped", self.worker_id)

    async def _watch(self, lease: Lease) -> None:
        while not lease.lost.is_set():
            try:
                async for snapshot in self.store.watch_prefix(MARKS_PREFIX):
                    self._marks = [int(key[len(MARKS_PREFIX) :]) for key in sorted(snapshot)]
                    self._wake.set()
            except MetadataUnavailableError as exc:
                log.warning("worker %s: watching marks failed (retrying): %s", self.worker_id, exc)
                await asyncio.sleep(self.config.replication_retry_backoff_s)

    async def _sleep(self, lease: Lease) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        due = [t - now for t in self._retry_at.values()]
        timeout = max(0.01, min(due)) if due else None
        self._wake.clear()
        lost = asyncio.ensure_future(lease.lost.wait())
        woke = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({lost, woke}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
            woke.cancel()

    async def _start_jobs(self, group: asyncio.TaskGroup, lease: Lease) -> None:
        now = asyncio.get_running_loop().time()
        for lid, at in list(self._retry_at.items()):
            if at <= now:
                del self._retry_at[lid]
        candidates = [m for m in self._marks if m not in self.running and m not in self._retry_at]
        self.rng.shuffle(candidates)  # several workers: spread out instead of colliding
        for lid in candidates:
            if len(self.running) >= self.config.replication_workers or lease.lost.is_set():
                return
            try:
                lock = await claim(self.store, lid, self.worker_id, lease, now_ms=self.wall_ms())
            except MetadataUnavailableError as exc:
                log.warning("worker %s: cannot claim marks: %s", self.worker_id, exc)
                return
            if lock is None:
                self.counters["lock_conflicts"] += 1
                continue
            self.running[lid] = group.create_task(self._job(lid, lock, lease), name=f"rr-{lid}")

    async def _job(self, lid: int, lock: int, lease: Lease) -> None:
        try:
            await self._restore(lid, lease)
            self._failures.pop(lid, None)
        except (BookKeeperError, OSError) as exc:
            await self._failed(lid, exc)
        finally:
            self.running.pop(lid, None)
            self._wake.set()
            try:
                await release(self.store, lid, lock)
            except MetadataUnavailableError as exc:  # the lock expires with the lease
                log.warning("worker %s: could not release ledger %d: %s", self.worker_id, lid, exc)

    async def _failed(self, lid: int, exc: BaseException) -> None:
        kind = "deferred" if isinstance(exc, Deferred) else "failed"
        self.counters[f"marks_{kind}"] += 1
        failures = self._failures[lid] = self._failures.get(lid, 0) + 1
        delay = self.config.replication_retry_backoff_s * 2 ** min(
            failures - 1, BACKOFF_DOUBLINGS_MAX
        )
        self._retry_at[lid] = asyncio.get_running_loop().time() + delay
        level = logging.INFO if kind == "deferred" else logging.WARNING
        log.log(level, "worker %s: ledger %d %s (retry in %.1f s): %s",
                self.worker_id, lid, kind, delay, exc)  # fmt: skip
        try:
            current = await read_mark(self.store, lid)
            if current is not None:
                mark = current.value.failed(f"{type(exc).__name__}: {exc}")
                if isinstance(exc, TargetUnavailable):  # not that bookie again next time
                    mark = dataclasses.replace(mark, plan=())
                await update_mark(self.store, lid, current.version, mark)
        except (BookKeeperError, OSError) as note_exc:
            log.info("worker %s: could not note the failure of %d: %s", self.worker_id, lid,
                     note_exc)  # fmt: skip
