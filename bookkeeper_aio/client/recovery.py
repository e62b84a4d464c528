"""Ledger recovery (open with recovery): fence, find the end, copy it to a quorum, close.

Theory of operation
-------------------
1. **Take over**: CAS the metadata OPEN → IN_RECOVERY (a CLOSED ledger needs nothing). From now
   on the writer's ensemble changes conflict, and it fails with LedgerFencedError.
2. **Fence and find the LAC**: a fencing LAC read goes to every bookie of the last ensemble; the
   phase completes at coverage (every write set has fewer than AQ bookies that did not answer),
   so no ack quorum can still accept a normal add. The highest verified LAC proof wins.
3. **Read forward** from ``max(LAC, first entry of the last segment - 1) + 1``, with the fence
   flag, each entry from its write set in the ensemble as it was when recovery started, and
   decide each by :func:`~bookkeeper_aio.quorum.recovery_read_decision`: a good copy → write it
   back to its write set with the recovery flag (AQ acks needed; a failed bookie is replaced in
   a *local* ensemble); QC explicit negatives → the ledger ends just before; undecided → fail
   (retry later), never truncate.
4. **Close**: CAS IN_RECOVERY → CLOSED at the last recovered entry, committing local ensemble
   changes with it. Concurrent recoverers read the same bookies and converge on the same end;
   whoever loses the CAS adopts the winner's CLOSED metadata.

The ledger's byte length is not carried by entries, so a recovered ledger records length -1
(unknown) unless nothing past the writer's close was needed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..digest import master_key
from ..errors import LedgerRecoveryError, MetadataVersionError, NotEnoughBookiesError, StatusCode
from ..metadata.model import LedgerMetadata, LedgerState, Versioned
from ..metadata.store import update_ledger
from ..protocol import ADD_FLAG_RECOVERY, READ_FLAG_FENCE, AddRequest, ReadLacRequest, ReadRequest
from ..quorum import ReadDecision, is_covered, recovery_read_decision, recovery_start, write_set
from .context import ClientContext
from .reads import entry_ok, proof_lac, request

log = logging.getLogger(__name__)


async def recover(
    ctx: ClientContext, ledger_id: int, password: bytes = b"", *, key: bytes | None = None
) -> Versioned:
    """Recover and close the ledger; return its CLOSED metadata.

    ``key`` (the master key itself) replaces ``password`` for a bookie repairing a ledger it
    holds (BP-46), which knows the key but not the password.

    Raises:
        LedgerRecoveryError: the end could not be decided (too many bookies unreachable).
        NoSuchLedgerError: no such ledger.
    """
    versioned = await update_ledger(
        ctx.metadata, ledger_id, _to_recovery, ctx.config.metadata_retries_max
    )
    if versioned.value.state is LedgerState.CLOSED:
        return versioned
    md: LedgerMetadata = versioned.value
    key = key if key is not None else master_key(password)
    lac = await _fence(ctx, md, key)
    first_of_last, _ = md.last_ensemble()
    below = ctx.has_bug("recovery-below-last-segment")
    last = recovery_start(lac, first_of_last, below_last_segment=below)
    ensembles = {first: list(ens) for first, ens in md.ensembles}
    last = await _read_forward(ctx, md, key, last, ensembles)
    return await _close(ctx, versioned, last, ensembles)


def _to_recovery(v: Versioned) -> LedgerMetadata | None:
    md: LedgerMetadata = v.value
    if md.state is LedgerState.OPEN:
        return md.in_recovery()
    return None  # already IN_RECOVERY (another recoverer) or CLOSED


async def _fence(ctx: ClientContext, md: LedgerMetadata, key: bytes) -> int:
    """Fence the last ensemble; return the highest LAC it reports (see the module doc)."""
    _, ensemble = md.last_ensemble()
    tasks = {
        asyncio.ensure_future(
            request(ctx, bookie, ReadLacRequest, md.ledger_id, READ_FLAG_FENCE, key)
        ): index
        for index, bookie in enumerate(ensemble)
    }
    known: set[int] = set()
    lac = -1
    pending = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                result = task.result()
                if getattr(result, "status", None) == StatusCode.OK:
                    known.add(tasks[task])
                    lac = max(lac, proof_lac(md.ledger_id, result.lac_proof))
            if is_covered(md.ensemble_size, md.write_quorum, md.ack_quorum, known):
                return lac
    finally:
        for task in pending:
            task.cancel()
    raise LedgerRecoveryError(
        f"ledger {md.ledger_id}: fencing reached {len(known)} of {len(ensemble)} bookies, "
        "not enough to cover every write quorum"
    )


async def _read_forward(
    ctx: ClientContext, md: LedgerMetadata, key: bytes, last: int, ensembles: dict
) -> int:
    """Recover entries after ``last`` in windows; return the ledger's last entry id."""
    window = ctx.config.recovery_reads_parallel_max
    while True:
        ids = range(last + 1, last + 1 + window)
        decisions = await asyncio.gather(*(_read_for_recovery(ctx, md, key, e) for e in ids))
        for entry_id, (decision, response) in zip(ids, decisions, strict=True):
            if decision is ReadDecision.NOT_RECOVERABLE:
                return last
            if decision is not ReadDecision.RECOVERABLE:
                raise LedgerRecoveryError(
                    f"ledger {md.ledger_id}: cannot decide entry {entry_id} "
                    "(replicas unreachable or in limbo); retry later"
                )
            await _write_back(ctx, md, key, response, ensembles)
            last = entry_id


async def _read_for_recovery(
    ctx: ClientContext, md: LedgerMetadata, key: bytes, entry_id: int
) -> tuple[ReadDecision, Any]:
    """Ask the entry's whole write set (fencing reads); decide as answers arrive."""
    ensemble = md.ensemble_at(entry_id)
    flags = 0 if ctx.has_bug("recovery-reads-without-fence") else READ_FLAG_FENCE
    fields = (md.ledger_id, entry_id, flags, key, -1, 0)
    members = write_set(entry_id, md.ensemble_size, md.write_quorum)
    pending = {
        asyncio.ensure_future(request(ctx, ensemble[i], ReadRequest, *fields)) for i in members
    }
    statuses: list[int | None] = []
    unknown_as_negative = ctx.has_bug("unknown-as-negative")
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                result = task.result()
                good = entry_ok(md.ledger_id, result)
                status = getattr(result, "status", None)
                statuses.append(StatusCode.OK if good else (None if status == 0 else status))
                decision = recovery_read_decision(
                    statuses, md.write_quorum, md.ack_quorum,
                    unknown_as_negative=unknown_as_negative,
                )  # fmt: skip
                if decision is not ReadDecision.PENDING:
                    return decision, result if good else None
    finally:
        for task in pending:
            task.cancel()
    return ReadDecision.UNDECIDED, None


async def _write_back(
    ctx: ClientContext, md: LedgerMetadata, key: bytes, entry: Any, ensembles: dict
) -> None:
    """Recovery-add ``entry`` to its write set until AQ bookies hold it (replacing failures).

    With the bug switch ``recovery-below-last-segment`` the entry goes to the *last* ensemble
    whatever its id, as BookKeeper 4.13 did ("recovery adds go to the current ensemble"), so a
    failure there makes a fragment start below the last segment (#2615).
    """
    below = ctx.has_bug("recovery-below-last-segment")
    fields = (md.ledger_id, entry.entry_id, ADD_FLAG_RECOVERY, key, entry.entry_lac,
              entry.payload, entry.digest)  # fmt: skip
    members = list(write_set(entry.entry_id, md.ensemble_size, md.write_quorum))
    acked: set[int] = set()
    for _attempt in range(md.ensemble_size + 3):
        base = max(ensembles) if below else max(f for f in ensembles if f <= entry.entry_id)
        ensemble = ensembles[base]
        targets = [i for i in members if i not in acked]
        results = await asyncio.gather(
            *(request(ctx, ensemble[i], AddRequest, *fields) for i in targets)
        )
        for index, result in zip(targets, results, strict=True):
            if getattr(result, "status", None) == StatusCode.OK:
                acked.add(index)
        if len(acked) >= md.ack_quorum:
            return
        await _replace_locally(ctx, md, ensembles, base, entry.entry_id, set(targets) - acked)
    raise LedgerRecoveryError(f"ledger {md.ledger_id}: could not write back {entry.entry_id}")


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


async def _close(ctx: ClientContext, versioned: Versioned, last: int, ensembles: dict) -> Versioned:
    segments = tuple((f, tuple(e)) for f, e in sorted(ensembles.items()))

    def close(v: Versioned) -> LedgerMetadata | None:
        md: LedgerMetadata = v.value
        if md.state is LedgerState.CLOSED:
            if md.last_entry_id != last:
                # Possible and safe: an entry held by fewer than AQ bookies (never acknowledged)
                # is recoverable or not depending on which bookie answers first. The first
                # close wins; nothing acknowledged is past either end.
                log.warning("ledger %d closed by another recoverer at %d, we found %d",
                            md.ledger_id, md.last_entry_id, last)  # fmt: skip
            return None
        if md.state is not LedgerState.IN_RECOVERY:
            raise MetadataVersionError(f"ledger {md.ledger_id} changed state during recovery")
        return LedgerMetadata(**{**md.__dict__, "ensembles": segments}).closed(last, -1)

    return await update_ledger(
        ctx.metadata, versioned.value.ledger_id, close,
        ctx.config.metadata_retries_max, current=versioned,
    )  # fmt: skip
