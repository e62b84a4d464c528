"""Reading a range of entries with batch reads (BookKeeper 4.17's), where every bookie holds
every entry of the ledger (E == WQ).

Theory of operation
-------------------
One ReadRequest per entry costs the client a coroutine, a future and a frame per entry, and the
bookie a request each: a 1,000-entry read was several times slower than writing it. Here
:func:`read_range` splits ``first..last`` into chunks of at most ``read_batch_entries`` that stay
within one ensemble and on one side of the LAC, and reads each chunk with a
:class:`~bookkeeper_aio.protocol.ReadBatchRequest` to the first bookie of its first entry's write
set (consecutive chunks rotate over the ensemble, as single reads do). At most
``max(1, reads_parallel_max // read_batch_entries)`` chunk requests are in flight.

An answer's entries are checked one by one as a ReadResponse would be (its id, its digest:
"assert twice"); the chunk takes the good ones in order from its first. An answer cut short by
a limit (``max_bytes``) is followed by a request to the same bookie for the rest.

- No answer within ``speculative_read_timeout_s``, or no batch answer at all (the request
  failed: a lost connection, a timeout, a frame the bookie refused): the chunk's remaining
  entries go to the next replica too, as a single read speculates; the first answer wins.
- Where a bookie's batch answer stops (an entry it lacks, cannot read or holds corrupt, a
  status refusing the whole request), the rest of the chunk is read entry by entry with
  :func:`~bookkeeper_aio.client.reads.read_entry`, that bookie asked first: the single-entry
  path then decides NoSuchEntry against ReadError, reports short copies and repairs bad ones
  exactly as for any read (BP-31's read-path detection).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from typing import Any

from ..digest import entry_digest
from ..errors import StatusCode
from ..metadata.model import LedgerMetadata
from ..protocol import ReadBatchRequest, ReadBatchResponse, unpack_read_entries
from .context import ClientContext, LedgerEntry
from .reads import replicas, request


def batched(md: LedgerMetadata, batch_entries: int) -> bool:
    """Whether a range of ``md``'s ledger is read in batches: every bookie holds every entry
    (a batch read's bookie stops at the first entry it lacks)."""
    return batch_entries > 1 and md.ensemble_size == md.write_quorum


def chunks(md: LedgerMetadata, first: int, last: int, lac: int, size: int) -> list[range]:
    """``first..last`` cut at ensemble changes, after ``lac``, and every ``size`` entries."""
    cuts = {f for f, _ in md.ensembles if first < f <= last}
    if first <= lac < last:
        cuts.add(lac + 1)
    out: list[range] = []
    start = first
    for end in [*sorted(cuts), last + 1]:
        out += [range(lo, min(lo + size, end)) for lo in range(start, end, size)]
        start = end
    return out


def good_prefix(
    ledger_id: int, first: int, count: int, answer: Any
) -> tuple[list[LedgerEntry], bool]:
    """The verified entries a batch answer carries from ``first`` on (at most ``count``), and
    whether it ended only for a limit (every entry it carried good, the next one not refused)."""
    if (
        type(answer) is not ReadBatchResponse
        or answer.status != StatusCode.OK
        or answer.first_entry_id != first
    ):
        return [], False
    try:
        found = unpack_read_entries(answer.entries)
    except ValueError:  # garbled: nothing of it counts
        return [], False
    good: list[LedgerEntry] = []
    for entry_id, lac, digest, payload in found[:count]:
        expected = first + len(good)
        if entry_id != expected or digest != entry_digest(ledger_id, entry_id, lac, payload):
            return good, False
        good.append(LedgerEntry(entry_id, payload))
    return good, answer.end_status == StatusCode.OK and len(found) <= count


async def _batch(
    ctx: ClientContext, md: LedgerMetadata, first: int, count: int, bookies: list[str]
) -> tuple[list[LedgerEntry], bool, str | None]:
    """One chunk's batch read, speculating over ``bookies`` in order: the good entries of the
    first batch answer, whether it ended only for a limit, and its bookie (None if no bookie
    answered: the rest is read entry by entry from any)."""
    lid = md.ledger_id
    max_bytes = ctx.config.frame_bytes_max // 4
    remaining = collections.deque(bookies)
    asked: dict[asyncio.Future[Any], str] = {}

    def ask_next() -> None:
        bookie = remaining.popleft()
        future = asyncio.ensure_future(
            request(ctx, bookie, ReadBatchRequest, lid, first, count, 0, None, max_bytes)
        )
        asked[future] = bookie

    ask_next()
    try:
        while asked:
            timeout = ctx.config.speculative_read_timeout_s if remaining else None
            done, _ = await asyncio.wait(asked, timeout=timeout,
                                         return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            if not done:
                ask_next()  # slow replica: the next one too
                continue
            for future in done:
                bookie = asked.pop(future)
                answer = future.result()
                good, limited = good_prefix(lid, first, count, answer)
                if good or type(answer) is ReadBatchResponse:  # the bookie's word on its copies
                    return good, limited, bookie
            if remaining:
                ask_next()  # a failed answer moves on at once
    finally:
        for future in asked:
            future.cancel()
    return [], False, None


async def read_range(
    ctx: ClientContext,
    md: LedgerMetadata,
    first: int,
    last: int,
    lac: int,
    single: Callable[[int, str | None], Awaitable[LedgerEntry]],
) -> list[LedgerEntry]:
    """Entries ``first..last`` of a ledger where :func:`batched` holds, in order (module
    docstring). ``single(entry_id, bookie)`` reads an entry alone, ``bookie`` (if any) asked
    first: ``LedgerReader.read_unconfirmed``'s single read, which reports short copies and
    repairs bad ones.

    Raises:
        ReadError / NoSuchEntryError: as :func:`~bookkeeper_aio.client.reads.read_entry`, for
            an entry no bookie has a good copy of.
    """
    config = ctx.config
    window = asyncio.Semaphore(max(1, config.reads_parallel_max // config.read_batch_entries))

    async def chunk(ids: range) -> list[LedgerEntry]:
        got: list[LedgerEntry] = []
        bookies = replicas(md, ids.start)
        bookie: str | None = None
        while len(got) < len(ids):
            async with window:
                good, limited, bookie = await _batch(ctx, md, ids.start + len(got),
                                                     len(ids) - len(got), bookies)  # fmt: skip
            got += good
            if not (good and limited):
                break
            assert bookie is not None  # it gave entries
            bookies = [bookie, *(b for b in bookies if b != bookie)]  # the rest from it too
        rest = range(ids.start + len(got), ids.stop)
        return got + list(await asyncio.gather(*(single(e, bookie) for e in rest)))

    cut = chunks(md, first, last, lac, config.read_batch_entries)
    parts = await asyncio.gather(*map(chunk, cut))
    return [entry for part in parts for entry in part]
