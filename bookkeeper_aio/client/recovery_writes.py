"""Recovery's write-back (step 3 of client/recovery.py's theory of operation): a window of
recovered entries added with the recovery flag to their write sets, one ``AddBatchRequest`` per
bookie, done at AQ (WQ with guaranteed write quorum); a bookie that failed is replaced in a
local ensemble (:class:`LocalEnsembles`) that only the closing compare-and-swap commits
(client/recovery.py says how recovery works)."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from ..digest import payload_digest
from ..errors import LedgerRecoveryError, NotEnoughBookiesError, StatusCode
from ..metadata.model import LedgerMetadata
from ..protocol import (
    ADD_FLAG_RECOVERY,
    AddBatchRequest,
    AddBatchResponse,
    AddResponse,
    pack_add_entries,
)
from ..quorum import write_set
from .context import ClientContext


class LocalEnsembles(dict[int, list[str]]):
    """The ensembles recovery writes back to: the metadata's as recovery started, with its
    local replacements; ``changed_from`` is the first entry of the earliest of those (None:
    none). Only that part is recovery's to commit: the segments before it are taken from the
    metadata as it is at the close (an autorecovery may have replaced a lost bookie in them
    meanwhile, and writing back the old ones would undo it)."""

    changed_from: int | None = None


async def _write_back(
    ctx: ClientContext, md: LedgerMetadata, key: bytes, entries: list[Any], ensembles: dict
) -> None:
    """Recovery-add ``entries`` (ascending ids) to their write sets, all at once, until AQ
    bookies of the (local) ensemble hold each; replace failed bookies from the lowest entry
    still short of AQ and write again what counted on them.

    With the bug switch ``recovery-below-last-segment`` the entries go to the *last* ensemble
    whatever their ids, as BookKeeper 4.13 did ("recovery adds go to the current ensemble"),
    so a failure there makes a fragment start below the last segment (#2615).

    Raises:
        LedgerRecoveryError: bookies kept failing (more rounds than the ensemble has bookies).
    """
    acked: dict[int, set[int]] = {e.entry_id: set() for e in entries}
    need = copies_needed(md)
    for _attempt in range(md.ensemble_size + 3):
        failed = await _write_round(ctx, md, key, entries, ensembles, acked)
        waiting = [e.entry_id for e in entries if len(acked[e.entry_id]) < need]
        if not waiting:
            return
        first = waiting[0]
        if not failed:  # cannot happen: an entry short of AQ heard a failure
            break
        base = _segment(ctx, ensembles, first)
        await _replace_locally(ctx, md, ensembles, base, first, failed)
        for entry_id, indexes in acked.items():
            if entry_id >= first:  # those bookies are no longer in their write sets
                indexes -= failed
    raise LedgerRecoveryError(f"ledger {md.ledger_id}: could not write back {entries[0].entry_id}")


def copies_needed(md: LedgerMetadata) -> int:
    """How many copies a written-back entry needs: AQ, or WQ with guaranteed write quorum
    (a recovery's close must not leave entries below WQ either)."""
    return md.write_quorum if md.guaranteed_write_quorum else md.ack_quorum


def _segment(ctx: ClientContext, ensembles: dict, entry_id: int) -> int:
    """The first entry of the (local) segment ``entry_id`` is written to."""
    if ctx.has_bug("recovery-below-last-segment"):
        return max(ensembles)
    return max(f for f in ensembles if f <= entry_id)


async def _write_round(
    ctx: ClientContext,
    md: LedgerMetadata,
    key: bytes,
    entries: list[Any],
    ensembles: dict,
    acked: dict[int, set[int]],
) -> set[int]:
    """One round: send each entry short of AQ to the members of its write set that did not
    acknowledge it; return once each such entry reached AQ or heard from all of them, with
    the indexes that failed. Answers after that (stragglers beyond AQ) are ignored: their
    requests end with their own timeouts, and counting them is never needed."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    failed: set[int] = set()
    unanswered: dict[int, int] = {}  # entry id -> its requests of this round not answered
    need = copies_needed(md)

    def answered(entry_id: int, index: int, result: Any) -> None:
        if done.done() or entry_id not in unanswered:
            return
        if getattr(result, "status", None) == StatusCode.OK and type(result) is AddResponse:
            acked[entry_id].add(index)
        else:
            failed.add(index)
        unanswered[entry_id] -= 1
        if len(acked[entry_id]) >= need or not unanswered[entry_id]:
            del unanswered[entry_id]
            if not unanswered:
                done.set_result(None)

    groups: dict[tuple[str, int], list[Any]] = {}  # (bookie, index) -> entries for it
    for entry in entries:
        if len(acked[entry.entry_id]) >= need:
            continue
        ensemble = ensembles[_segment(ctx, ensembles, entry.entry_id)]
        members = write_set(entry.entry_id, md.ensemble_size, md.write_quorum)
        targets = [i for i in members if i not in acked[entry.entry_id]]
        unanswered[entry.entry_id] = len(targets)
        for i in targets:
            groups.setdefault((ensemble[i], i), []).append(entry)
    if not unanswered:
        return failed

    def batch_answered(ids: list[int], index: int, result: Any) -> None:
        if type(result) is AddBatchResponse and len(result.statuses) == len(ids):
            for entry_id, status in zip(ids, result.statuses, strict=True):
                answered(entry_id, index, AddResponse(0, status, md.ledger_id, entry_id))
        else:  # refused as a whole, an error, a lost connection: none of them stored
            for entry_id in ids:
                answered(entry_id, index, result)

    # One batch request per bookie (and per bound on a batch's entries and bytes), as the
    # writer sends them: per entry and bookie, a request of its own cost a frame, a journal
    # record and an answer. Sent after counting them all: answers may come at once.
    config = ctx.config
    for (bookie, index), group in groups.items():
        for chunk in _chunks(group, config.add_batch_entries_max, config.add_batch_bytes_max):
            packed = pack_add_entries(
                (e.entry_id, e.entry_lac, payload_digest(e.payload), e.digest, e.payload)
                for e in chunk
            )
            callback = partial(batch_answered, [e.entry_id for e in chunk], index)
            ctx.pool.send(bookie, AddBatchRequest, md.ledger_id, ADD_FLAG_RECOVERY, key,
                          packed, callback=callback)  # fmt: skip
    await done
    return failed


def _chunks(entries: list[Any], count_max: int, bytes_max: int) -> list[list[Any]]:
    """``entries`` cut into runs of at most ``count_max`` entries and ``bytes_max`` payload
    bytes (an entry larger than that alone in its run)."""
    chunks: list[list[Any]] = []
    size = 0
    for entry in entries:
        if not chunks or len(chunks[-1]) >= count_max or size + len(entry.payload) > bytes_max:
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += len(entry.payload)
    return chunks


async def _replace_locally(
    ctx: ClientContext,
    md: LedgerMetadata,
    ensembles: dict,
    base: int,
    entry_id: int,
    failed: set[int],
) -> None:
    """A local ensemble change from ``entry_id`` (a copy of segment ``base`` with the failed
    indexes replaced), committed only by the closing CAS."""
    new = list(ensembles[base])
    bookies = (await ctx.metadata.list_bookies()).values()
    exclude = {new[i] for i in failed}
    try:
        for index in sorted(failed):
            new[index] = ctx.placement.replace_bookie(
                new, index, md.write_quorum, bookies, ctx.rng, exclude
            )
    except NotEnoughBookiesError as exc:
        raise LedgerRecoveryError(f"ledger {md.ledger_id}: {exc}") from exc
    for f in [f for f in ensembles if f > entry_id]:
        del ensembles[f]
    ensembles[entry_id] = new
    if isinstance(ensembles, LocalEnsembles):
        start = ensembles.changed_from
        ensembles.changed_from = entry_id if start is None else min(start, entry_id)
