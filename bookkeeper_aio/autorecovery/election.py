"""Electing the one auditor: a create-only key under the candidate's lease.

Theory of operation
-------------------
Every autorecovery process is a candidate. :func:`hold_seat` tries to create
``autorecovery/auditor`` (``expected_version=0``) under the process's lease; whoever creates it
is the auditor until its lease ends (process death, a pause longer than the TTL, losing etcd
for that long: the key vanishes with the lease). The others watch the key and try again when
it is deleted. The winner runs ``as_auditor`` until its lease is lost (then the caller starts
over with a new lease) or it is cancelled (shutdown: the caller revokes the lease, which frees
the seat at once).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from ..errors import MetadataVersionError
from ..metadata.lease import Lease
from ..metadata.store import MetadataStore
from .state import AUDITOR_KEY, decode, encode

log = logging.getLogger(__name__)


async def current_auditor(store: MetadataStore) -> str | None:
    """Who holds the seat, or None."""
    found = await store.get(AUDITOR_KEY)
    return None if found is None else str(decode(AUDITOR_KEY, found.value).get("auditor"))


async def hold_seat(
    store: MetadataStore,
    candidate: str,
    lease: Lease,
    now_ms: Callable[[], int],
    as_auditor: Callable[[], Awaitable[None]],
    counters: Counter[str],
) -> None:
    """Win the seat (waiting for it as long as it takes), then run ``as_auditor``; return when
    the lease is lost. Raises MetadataUnavailableError when the store cannot be reached."""
    value = encode({"auditor": candidate, "since_ms": now_ms()})
    while not lease.lost.is_set():
        counters["election_attempts"] += 1
        try:
            await store.put(AUDITOR_KEY, value, expected_version=0, lease=lease)
        except MetadataVersionError:
            await _wait_for_vacancy(store, lease)
            continue
        counters["elections_won"] += 1
        await _run_until_lost(lease, as_auditor)
        return


async def _wait_for_vacancy(store: MetadataStore, lease: Lease) -> None:
    async def vacancy() -> None:
        async for found in store.watch(AUDITOR_KEY):
            if found is None:
                return

    await _first_of(vacancy(), lease)


async def _first_of(work_coro: Awaitable[None], lease: Lease) -> None:
    """Run ``work_coro`` until it ends or the lease is lost; its error, if any, is raised."""
    work = asyncio.ensure_future(work_coro)
    lost = asyncio.ensure_future(lease.lost.wait())
    try:
        await asyncio.wait({work, lost}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            work.result()
    finally:
        for task in (work, lost):
            task.cancel()
        await asyncio.gather(work, lost, return_exceptions=True)


async def _run_until_lost(lease: Lease, as_auditor: Callable[[], Awaitable[None]]) -> None:
    await _first_of(as_auditor(), lease)
    log.warning("auditor seat lost with lease %x", lease.lease_id)
