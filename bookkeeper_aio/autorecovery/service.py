"""An autorecovery process: an auditor candidate and replication workers under one lease.

Theory of operation
-------------------
:class:`Autorecovery` is what ``python -m bookkeeper_aio.autorecovery`` runs and what a bookie
runs in-process with ``--autorecovery true``: the same code, the same keys
(:class:`~bookkeeper_aio.config.AutorecoverySettings`). It grants one lease
(``replication_lock_ttl_s``) and, under it, runs the auditor election (election.py; the winner
runs the :class:`~.auditor.Auditor`), the :class:`~.worker.ReplicationWorker` and the
publication of its counters (``autorecovery/processes/<id>``). When the lease is lost
(a pause longer than its TTL, etcd unreachable that long), everything under it stops and the
process starts over with a new lease: whatever it held may belong to others by then. A store
that cannot be reached is retried with a backoff, never given up.

Use :meth:`Autorecovery.serve` (``async with``): it owns the task and revokes the lease on
exit, so the auditor seat and the locks are free at once after a clean shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..client.bookie_pool import BookiePool
from ..client.context import ClientContext
from ..client.placement import PlacementPolicy
from ..config import AutorecoverySettings, ClientConfig
from ..errors import BookKeeperError
from ..metadata.lease import Lease
from ..metadata.store import MetadataStore
from ..net import Network
from . import election, state
from .auditor import Auditor
from .worker import ReplicationWorker

log = logging.getLogger(__name__)

RESTART_BACKOFF_S = 1.0  # after the lease was lost or the store could not be reached
PUBLISH_INTERVAL_S = 1.0


class Autorecovery:
    """See the module docstring."""

    def __init__(
        self,
        ctx: ClientContext,
        config: AutorecoverySettings,
        process_id: str,
        wall_ms: Callable[[], int],
        *,
        bugs: frozenset[str] = frozenset(),
    ) -> None:
        self.ctx = ctx
        self.config = config
        self.process_id = process_id
        self.wall_ms = wall_ms
        self.worker = ReplicationWorker(ctx, config, process_id, wall_ms, bugs=bugs)
        self.auditor: Auditor | None = None
        self.counters: Counter[str] = Counter()
        self.lease: Lease | None = None
        self.task: asyncio.Task[None] | None = None  # set by serve()

    @classmethod
    @contextlib.asynccontextmanager
    async def serve(
        cls,
        ctx: ClientContext,
        config: AutorecoverySettings,
        process_id: str,
        wall_ms: Callable[[], int],
        *,
        bugs: frozenset[str] = frozenset(),
    ) -> AsyncIterator[Autorecovery]:
        """Run in the background while the block runs; stop and free the seat on exit."""
        service = cls(ctx, config, process_id, wall_ms, bugs=bugs)
        task = service.task = asyncio.create_task(service.run(), name=f"autorecovery-{process_id}")
        try:
            yield service
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await service._revoke()

    def abort(self) -> None:
        """Stop at once, as kill -9 would: the lease is abandoned (it expires by itself)."""
        if self.task is not None:
            self.task.cancel()
        if self.lease is not None:
            self.lease.abandon()

    @property
    def is_auditor(self) -> bool:
        return self.auditor is not None

    def statistics(self) -> dict[str, Any]:
        """This process: whether it is the auditor (and the auditor's SLA figures), its
        worker's counters, lease restarts."""
        return {
            **self.counters,
            "is_auditor": self.is_auditor,
            "auditor": self.auditor.statistics() if self.auditor else {},
            "worker": self.worker.statistics(),
        }

    async def run(self) -> None:
        """Run until cancelled (see the module docstring)."""
        while True:
            try:
                self.lease = await self.ctx.metadata.grant_lease(self.config.replication_lock_ttl_s)
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._elect(self.lease))
                    group.create_task(self.worker.run(self.lease))
                    group.create_task(self._publish(self.lease))
                    group.create_task(_until_lost(self.lease))
            except* (BookKeeperError, OSError) as failed:
                self.counters["restarts"] += 1
                log.warning("autorecovery %s: restarting: %s", self.process_id,
                            "; ".join(map(str, failed.exceptions)))  # fmt: skip
            except* Exception as bug:  # never silently: a bug stops nothing for good either
                self.counters["restarts_after_bug"] += 1
                log.error("autorecovery %s: unexpected failure, restarting", self.process_id,
                          exc_info=bug.exceptions[0])  # fmt: skip
            self.auditor = None
            await self._revoke()
            await asyncio.sleep(RESTART_BACKOFF_S)

    async def _elect(self, lease: Lease) -> None:
        async def as_auditor() -> None:
            self.auditor = Auditor(self.ctx, self.config, self.process_id, self.wall_ms)
            try:
                await self.auditor.run(lease)
            finally:
                self.auditor = None

        await election.hold_seat(self.ctx.metadata, self.process_id, lease, self.wall_ms,
                                 as_auditor, self.counters)  # fmt: skip

    async def _publish(self, lease: Lease) -> None:
        while not lease.lost.is_set():
            await asyncio.sleep(PUBLISH_INTERVAL_S)
            stats = {**self.worker.statistics(), "at_ms": self.wall_ms()}
            try:
                await state.publish_process(self.ctx.metadata, self.process_id, stats, lease)
            except BookKeeperError as exc:
                log.info("autorecovery %s: could not publish counters: %s", self.process_id, exc)

    async def _revoke(self) -> None:
        lease, self.lease = self.lease, None
        if lease is None:
            return
        try:
            await lease.revoke()
        except BookKeeperError as exc:
            log.info("autorecovery %s: lease not revoked (it expires): %s", self.process_id, exc)


class _LeaseLost(BookKeeperError):
    """The process's lease ended: everything under it starts over."""


async def _until_lost(lease: Lease) -> None:
    await lease.lost.wait()
    raise _LeaseLost(f"lease {lease.lease_id:x} lost")


@contextlib.asynccontextmanager
async def in_bookie(
    config: AutorecoverySettings,
    store: MetadataStore,
    network: Network,
    process_id: str,
    rng: random.Random,
) -> AsyncIterator[Autorecovery]:
    """A bookie's ``--autorecovery true``: the same service with its own bookie connections.
    ``wall_ms`` is the wall clock (stamps for people only)."""
    client_config = ClientConfig()
    async with BookiePool(network, client_config, rng) as pool:
        ctx = ClientContext(client_config, store, pool, rng, PlacementPolicy())
        async with Autorecovery.serve(ctx, config, process_id, _wall_ms) as service:
            yield service


def _wall_ms() -> int:
    return int(time.time() * 1000)  # stamps on marks for people; never used for decisions
