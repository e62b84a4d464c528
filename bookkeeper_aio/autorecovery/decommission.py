"""Decommissioning a bookie: move every copy off it, then remove its cookie.

Theory of operation
-------------------
:func:`decommission` works on a live or a dead bookie (BookKeeper needs it stopped; we do not):

1. The bookie must be known — registered, with a cookie, or in some ledger's ensembles — and
   at least one autorecovery process must be running (they do the copying); otherwise it
   fails at once with a message that says so.
2. ``autorecovery/decommission/<bookie>`` is written: from then on workers replace the bookie
   wherever it holds a fragment (a live one is still read from), and never choose it.
3. Every ledger with a fragment on it is marked, then re-listed every ``poll_s``; ledgers
   created on it meanwhile are marked too. Progress is reported as (done, total).
4. When no ledger names the bookie and no mark does, its cookie is deleted (a stale copy of
   the bookie can then not rejoin with its old identity), and the decommission record and any
   lost record are removed. Only then does it return.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..client.context import ClientContext
from ..errors import IncorrectParameterError, MetadataVersionError, OperationTimeoutError
from ..metadata.underreplication import ALL, Missing, list_marks, mark_under_replicated
from . import state
from .audit import ledgers_with

Progress = Callable[[int, int], None]  # (ledgers done, ledgers in all)


async def decommission(
    ctx: ClientContext,
    bookie: str,
    now_ms: Callable[[], int],
    progress: Progress = lambda done, total: None,
    *,
    poll_s: float = 1.0,
    timeout_s: float | None = None,
) -> str:
    """Move everything off ``bookie`` and remove its cookie (see the module docstring).

    Raises:
        IncorrectParameterError: an unknown bookie, or no autorecovery process is running.
        OperationTimeoutError: not done within ``timeout_s`` (the decommission goes on in
            the background; run the command again to wait for it).
    """
    store = ctx.metadata
    remaining = await ledgers_with(ctx, bookie)
    registered = await store.list_bookies()
    if bookie not in registered and await store.get_cookie(bookie) is None and not remaining:
        raise IncorrectParameterError(
            f"unknown bookie {bookie}: not registered, no cookie, in no ledger "
            "(`shell list-bookies` lists the registered ones)"
        )
    if not await state.process_statistics(store):
        raise IncorrectParameterError(
            "no autorecovery process is running to copy the data: start one with "
            "`python -m bookkeeper_aio.autorecovery --metadata URI` (or a bookie with "
            "--autorecovery true)"
        )
    await store.put(state.DECOMMISSION_PREFIX + bookie, state.encode({"since_ms": now_ms()}))
    total = len(remaining)
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    marked: set[int] = set()
    while True:
        for lid in remaining:
            if lid not in marked:
                missing = [Missing(bookie, ("decommission",), now_ms(), ALL)]
                await mark_under_replicated(store, lid, missing, now_ms=now_ms())
                marked.add(lid)
        pending = {m.value.ledger_id async for m in list_marks(store) if m.value.names(bookie)}
        total = max(total, len(marked))
        progress(total - len(set(remaining) | pending), total)
        if not remaining and not pending:
            break
        if deadline is not None and loop.time() > deadline:
            raise OperationTimeoutError(
                f"decommission of {bookie}: {len(set(remaining) | pending)} ledgers still "
                f"need it after {timeout_s} s (it goes on; run the command again to wait)"
            )
        await asyncio.sleep(poll_s)
        remaining = await ledgers_with(ctx, bookie)
    await _forget(ctx, bookie)
    return f"bookie {bookie} decommissioned: {total} ledgers moved off it, cookie removed"


async def _forget(ctx: ClientContext, bookie: str) -> None:
    store = ctx.metadata
    for _ in range(3):
        cookie = await store.get_cookie(bookie)
        if cookie is None:
            break
        try:
            await store.delete_cookie(bookie, cookie.version)
            break
        except MetadataVersionError:
            continue
    await store.delete(state.DECOMMISSION_PREFIX + bookie)
    await store.delete(state.LOST_PREFIX + bookie)
