"""A bookie's registration: its info under a lease that an owned task keeps alive.

Theory of operation
-------------------
Registration is what makes a bookie visible to clients (placement reads the registered
bookies). The info sits under a lease with a TTL; a keepalive task refreshes it every
``keepalive_interval_s``. If the process dies (kill -9, a crash, a long pause) the refreshes
stop and the store deletes the info ``lease_ttl_s`` later: clients stop choosing it. If the
lease is found lost while the process lives (etcd lost it, or the pause was longer than the
TTL), the task registers again under a new lease and logs it. Any error of a round is logged
and the next round tries again: a serving bookie must not drop out of the registry because
one refresh failed in an unexpected way. ``unregister`` (clean
shutdown) revokes the lease at once; ``abandon`` stops the keepalive without revoking, which is
what a crash looks like from outside (the simulator and tests use it).

:class:`BookieRegistration` holds that loop; each store supplies four small primitives
(``_register``, ``_refresh``, ``_publish``, ``_revoke``). Use it as ``async with``: leaving
the block unregisters.
"""

from __future__ import annotations

import asyncio
import logging
from typing import NamedTuple, Self

from ..errors import MetadataUnavailableError

log = logging.getLogger(__name__)


class BookieInfo(NamedTuple):
    """A registered bookie: where it listens, its network location, whether it takes adds."""

    bookie_id: str
    address: str
    rack: str | None
    read_only: bool
    incarnation: str = ""  # BP-31: from the bookie's cookie; new when it is formatted again


class BookieRegistration:
    """See the module docstring. Created by ``store.register_bookie``; do not construct."""

    def __init__(self, info: BookieInfo, keepalive_interval_s: float) -> None:
        self.info = info
        self.keepalive_interval_s = keepalive_interval_s
        self.renewals = 0
        self.reregistrations = 0
        self.failures = 0  # keepalive rounds that failed unexpectedly (logged, retried)
        self._task: asyncio.Task[None] | None = None

    # --- what a store implements ----------------------------------------------------------

    async def _register(self) -> None:
        """Grant a new lease and put the info under it."""
        raise NotImplementedError

    async def _refresh(self) -> bool:
        """Refresh the lease; False if it no longer exists."""
        raise NotImplementedError

    async def _publish(self) -> None:
        """Put the current info under the current lease (register again if it is gone)."""
        raise NotImplementedError

    async def _revoke(self) -> None:
        """Revoke the lease (its info disappears now); a lease already gone is fine."""
        raise NotImplementedError

    def _detach(self) -> None:
        """Forget this registration in the store (it no longer needs stopping on close)."""

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Register and start the keepalive task (the store calls this)."""
        await self._register()
        self._task = asyncio.get_running_loop().create_task(
            self._keepalive(), name=f"keepalive-{self.info.bookie_id}"
        )

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(self.keepalive_interval_s)
            try:
                if await self._refresh():
                    self.renewals += 1
                    continue
                log.warning("lease of bookie %s was lost; registering again", self.info.bookie_id)
                self.reregistrations += 1
                await self._register()
            except MetadataUnavailableError as exc:  # the next round tries again
                log.warning("bookie %s: lease keepalive failed: %s", self.info.bookie_id, exc)
            except Exception:  # whatever it was, the next round tries again
                self.failures += 1
                log.exception("bookie %s: lease keepalive failed", self.info.bookie_id)

    @property
    def active(self) -> bool:
        """True while the keepalive runs."""
        return self._task is not None and not self._task.done()

    async def update(self, *, read_only: bool) -> None:
        """Change the registered read-only state (a bookie entering/leaving read-only mode).

        Raises:
            MetadataUnavailableError: the store cannot be reached.
        """
        self.info = self.info._replace(read_only=read_only)
        await self._publish()

    def abandon(self) -> None:
        """Stop the keepalive without unregistering: the info goes when the lease expires."""
        if self._task is not None:
            self._task.cancel()
        self._detach()

    async def unregister(self) -> None:
        """Remove the registration now (clean shutdown).

        Raises:
            MetadataUnavailableError: the store cannot be reached (the lease still expires).
        """
        task = self._task
        self.abandon()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)  # cancelled: nothing to lose
        await self._revoke()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.unregister()
