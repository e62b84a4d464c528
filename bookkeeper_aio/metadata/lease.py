"""Leases for keys that must vanish when their owner dies: locks, elections, claims.

Theory of operation
-------------------
A :class:`Lease` is granted by a store (``await store.grant_lease(ttl_s)``) and kept alive by a
task it owns, which refreshes it every ``keepalive_interval_s``. Keys written with
``store.put(key, value, lease=lease)`` are deleted by the store when the lease ends: revoked
(``await lease.revoke()``, or leaving ``async with``), or expired because the refreshes
stopped (the process died, paused longer than the TTL, or lost etcd for that long).

A lease that is found gone while its owner lives is *not* re-granted: whatever the owner held
under it (a lock, the auditor's seat) may already belong to someone else, so the owner must
notice and start over. :attr:`Lease.lost` is set at that moment, and also when the keepalive
fails for longer than the TTL (the lease has certainly expired by then); owners wait on it
alongside their work. A refresh that fails for a shorter while is retried at the next tick.

Each store supplies three primitives (grant is done by the store before construction):
``_refresh`` (False when the lease no longer exists) and ``_revoke``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Self

from ..errors import MetadataUnavailableError

log = logging.getLogger(__name__)


class Lease:
    """A granted lease and its keepalive task (see the module docstring). Do not construct:
    use ``store.grant_lease``."""

    def __init__(self, lease_id: int, ttl_s: int, keepalive_interval_s: float) -> None:
        self.lease_id = lease_id
        self.ttl_s = ttl_s
        self.keepalive_interval_s = min(keepalive_interval_s, ttl_s / 3)
        self.lost = asyncio.Event()
        self.renewals = 0
        self._task: asyncio.Task[None] | None = None
        self.held_by: set[Lease] | None = None  # the store's live leases (closed with it)

    # --- what a store implements ----------------------------------------------------------

    async def _refresh(self) -> bool:
        """Refresh the lease; False if it no longer exists."""
        raise NotImplementedError

    async def _revoke(self) -> None:
        """Revoke the lease (its keys disappear now); a lease already gone is fine."""
        raise NotImplementedError

    # --- lifecycle ------------------------------------------------------------------------

    def start(self, held_by: set[Lease]) -> None:
        """Start the keepalive task (the store calls this after granting; it abandons the
        leases in ``held_by`` when it closes)."""
        self.held_by = held_by
        held_by.add(self)
        self._task = asyncio.get_running_loop().create_task(
            self._keepalive(), name=f"lease-{self.lease_id}"
        )

    async def _keepalive(self) -> None:
        loop = asyncio.get_running_loop()
        last_ok = loop.time()
        while not self.lost.is_set():
            await asyncio.sleep(self.keepalive_interval_s)
            try:
                if not await self._refresh():
                    log.warning("lease %x ended while its owner lives", self.lease_id)
                    self.lost.set()
                    return
                self.renewals += 1
                last_ok = loop.time()
            except MetadataUnavailableError as exc:
                if loop.time() - last_ok >= self.ttl_s:
                    log.warning("lease %x: no refresh for its TTL (%s); lost", self.lease_id, exc)
                    self.lost.set()
                    return
                log.warning("lease %x: refresh failed (%s); retrying", self.lease_id, exc)
            except Exception:  # a bug here must not silently keep a dead lease "alive"
                log.exception("lease %x: keepalive failed; the lease counts as lost", self.lease_id)
                self.lost.set()
                return

    @property
    def alive(self) -> bool:
        """True while the keepalive runs and the lease was not found lost."""
        return self._task is not None and not self._task.done() and not self.lost.is_set()

    async def revoke(self) -> None:
        """Stop the keepalive and revoke the lease: its keys vanish now.

        Raises:
            MetadataUnavailableError: the store cannot be reached (the lease still expires
                ``ttl_s`` later).
        """
        self.abandon()
        await self._revoke()

    def abandon(self) -> None:
        """Stop the keepalive without revoking: the keys go when the lease expires (what a
        crash looks like from outside; the simulator and tests use it)."""
        if self._task is not None:
            self._task.cancel()
        self.lost.set()
        if self.held_by is not None:
            self.held_by.discard(self)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await self.revoke()
        except MetadataUnavailableError as exc:
            log.warning("lease %x: revoke failed (%s); it expires by itself", self.lease_id, exc)
