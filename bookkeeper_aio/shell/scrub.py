"""``scrub --bookie ID``: one scrub pass on one bookie now, with a progress bar (BP-31 bit rot,
``bookie/scrubber.py``).

The shell asks the bookie itself, with a SCRUB request on its client port, rather than through
a request key in etcd that bookies would watch: the answer comes from the scrubber at once
(it exists, a pass is queued, how far it is), so progress and the result need no state in the
metadata store to write, poll and clean up, and an unknown or stopped bookie is an immediate,
clear error instead of a request nobody picks up. The metadata store only says whether the id
is a bookie of this cluster (registered now, or with a cookie).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from tqdm import tqdm

from ..client.bookie_pool import BookiePool
from ..client.context import ClientContext
from ..client.placement import PlacementPolicy
from ..client.reads import request
from ..config import ClientConfig
from ..errors import BookKeeperError, StatusCode
from ..metadata.store import MetadataStore, open_metadata_store
from ..net import TcpNetwork
from ..protocol import ScrubRequest, ScrubResponse

POLL_S = 0.5  # how often the shell asks for progress


async def known_bookie(store: MetadataStore, bookie: str) -> None:
    """Raises BookKeeperError (the message says why) unless ``bookie`` is registered now."""
    if bookie in await store.list_bookies():
        return
    if await store.get_cookie(bookie) is not None:
        raise BookKeeperError(f"bookie {bookie} is not running (not registered): start it first")
    raise BookKeeperError(
        f"unknown bookie {bookie}: not registered and no cookie in this cluster "
        "(`list-bookies` shows the registered ones)"
    )


async def scrub(uri: str, bookie: str, timeout_s: float | None) -> tuple[str, int]:
    """One pass on ``bookie`` now; exit status 1 if a bad copy could not be repaired."""
    config, rng = ClientConfig(), random.Random()
    async with open_metadata_store(uri) as store, BookiePool(TcpNetwork(), config, rng) as pool:
        await known_bookie(store, bookie)
        ctx = ClientContext(config, store, pool, rng, PlacementPolicy())
        first = await _ask(ctx, bookie, True)
        target = first.passes_started + 1  # the pass this request queued (Scrubber.control)
        try:
            async with asyncio.timeout(timeout_s):
                last = await _follow(ctx, bookie, target)
        except TimeoutError:
            raise BookKeeperError(f"bookie {bookie}: pass {target} not done within {timeout_s} "
                                  "s (it goes on)") from None  # fmt: skip
    text = (f"bookie {bookie}: scrub pass {target}: {last.ledgers_done} ledgers, "
            f"{last.entries_checked} entries ({last.bytes_checked} bytes) checked, "
            f"{last.bad_copies} bad copies, {last.repaired} repaired, "
            f"{last.unrepaired} not repaired")  # fmt: skip
    return text, 1 if last.unrepaired else 0


async def _follow(ctx: ClientContext, bookie: str, target: int) -> ScrubResponse:
    with tqdm(desc=f"scrub {bookie}", unit="ledger") as bar:
        while True:
            state = await _ask(ctx, bookie, False)
            if state.passes_started >= target:  # ours (or, finished, the one after it)
                bar.total = state.ledgers_total
                bar.n = state.ledgers_done
                bar.refresh()
            if state.passes_done >= target:
                return state
            await asyncio.sleep(POLL_S)


async def _ask(ctx: ClientContext, bookie: str, start: bool) -> ScrubResponse:
    answer: Any = await request(ctx, bookie, ScrubRequest, start)
    if type(answer) is ScrubResponse and answer.status == StatusCode.OK:
        return answer
    if isinstance(answer, BaseException):
        raise BookKeeperError(f"bookie {bookie}: {answer}")
    raise BookKeeperError(f"bookie {bookie} refused the scrub request: {answer!r:.200}")
