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
   back to its write set with the recovery flag; QC explicit negatives → the ledger ends just
   before; undecided → fail (retry later), never truncate. Reads and write-back are a
   pipeline, as BookKeeper's ``LedgerRecoveryOp`` keeps several in flight: up to two windows
   of ``recovery_reads_parallel_max`` entries are being read and decided (callbacks, in entry
   order) while the window before them is written back, one recovery ``AddBatchRequest`` per
   bookie; so at most three windows of entries are held, whatever the tail's length. A
   write-back is done once AQ bookies acknowledged it (it does not wait for the rest of its
   write set), so a hung bookie costs a window one request timeout, not every entry one. A
   bookie that failed is replaced in a *local* ensemble from the lowest entry not yet at AQ,
   and every entry from there that counted on it is written again.
4. **Close**: CAS IN_RECOVERY → CLOSED at the last recovered entry, committing local ensemble
   changes with it — only those: the segments before the first of them are the metadata's at
   the close (an autorecovery may have replaced a lost bookie there meanwhile). Concurrent
   recoverers read the same bookies and converge on the same end; whoever loses the CAS
   adopts the winner's CLOSED metadata.

**Guaranteed write quorum** (docs/protocol.md): step 2's fencing reads also return the LAFR
(last add fully replicated) the writer sent; step 3 starts after
:func:`~bookkeeper_aio.quorum.gwq_recovery_start` (the LAFR, bounded by the LAC, and never
before the last segment) instead of the LAC, and writes back until WQ bookies hold each
entry, so the close leaves no entry below WQ.

The ledger's byte length is not carried by entries, so a recovered ledger records length -1
(unknown) unless nothing past the writer's close was needed.

Where each part lives: taking over, fencing, the driver of step 3 and the close here; the
reads forward (:class:`~bookkeeper_aio.client.recovery_reads._ReadAhead`: fencing reads ahead
of the write-back, batched where E == WQ, each entry decided as its answers arrive) in
``recovery_reads.py``; the write-back, its local ensemble changes and :class:`LocalEnsembles`
in ``recovery_writes.py``.
"""

from __future__ import annotations

import asyncio
import logging

from ..digest import master_key
from ..errors import LedgerRecoveryError, MetadataVersionError, StatusCode
from ..metadata.model import LedgerMetadata, LedgerState, Versioned
from ..metadata.store import update_ledger
from ..protocol import READ_FLAG_FENCE, ReadLacRequest
from ..quorum import gwq_recovery_start, is_covered, recovery_start
from .context import ClientContext
from .reads import proof_lac, request
from .recovery_reads import _ReadAhead
from .recovery_writes import LocalEnsembles, _write_back, copies_needed

__all__ = ["LocalEnsembles", "copies_needed", "recover"]

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
    ctx.stats.counters["recoveries"] += 1
    md: LedgerMetadata = versioned.value
    key = key if key is not None else master_key(password)
    lac, lafr = await _fence(ctx, md, key)
    first_of_last, _ = md.last_ensemble()
    below = ctx.has_bug("recovery-below-last-segment")
    if md.guaranteed_write_quorum:  # from the LAFR, not the LAC (docs/protocol.md)
        last = gwq_recovery_start(lac, lafr, first_of_last)
    else:
        last = recovery_start(lac, first_of_last, below_last_segment=below)
    ensembles = LocalEnsembles({first: list(ens) for first, ens in md.ensembles})
    last = await _read_forward(ctx, md, key, last, ensembles)
    return await _close(ctx, versioned, last, ensembles)


def _to_recovery(v: Versioned) -> LedgerMetadata | None:
    md: LedgerMetadata = v.value
    if md.state is LedgerState.OPEN:
        return md.in_recovery()
    return None  # already IN_RECOVERY (another recoverer) or CLOSED


async def _fence(ctx: ClientContext, md: LedgerMetadata, key: bytes) -> tuple[int, int]:
    """Fence the last ensemble; return the highest LAC and LAFR it reports (see the module
    doc; the LAFR is -1 unless the ledger has guaranteed write quorum)."""
    _, ensemble = md.last_ensemble()
    tasks = {
        asyncio.ensure_future(
            request(ctx, bookie, ReadLacRequest, md.ledger_id, READ_FLAG_FENCE, key)
        ): index
        for index, bookie in enumerate(ensemble)
    }
    known: set[int] = set()
    lac = lafr = -1
    pending = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                result = task.result()
                if getattr(result, "status", None) == StatusCode.OK:
                    known.add(tasks[task])
                    lac = max(lac, proof_lac(md.ledger_id, result.lac_proof))
                    lafr = max(lafr, result.last_add_fully_replicated)
            if is_covered(md.ensemble_size, md.write_quorum, md.ack_quorum, known):
                return lac, lafr
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
    """Recover entries after ``last``; return the ledger's last entry id.

    A pipeline of two stages (module docstring): :class:`_ReadAhead` keeps up to two windows
    of entries being read and decided, and each window of decided entries is written back
    while the reads of the next one go on. At most one window is being written back, so at
    most three windows of entries are held at once, whatever the tail's length.
    """
    window = ctx.config.recovery_reads_parallel_max
    reads = _ReadAhead(ctx, md, key, last + 1, 2 * window)
    writing: asyncio.Future[None] | None = None
    try:
        while True:
            batch, at_end = await reads.take(window)
            if writing is not None:
                await writing  # its failure (LedgerRecoveryError) ends the recovery
                writing = None
            if batch:
                # Written back one window after the other: a window's local ensemble change
                # (a failed bookie replaced) is in place before the next window is sent.
                writing = asyncio.ensure_future(_write_back(ctx, md, key, batch, ensembles))
                last = batch[-1].entry_id
            if at_end:
                break
        if writing is not None:
            await writing
            writing = None
        return last
    finally:
        reads.close()
        if writing is not None:
            writing.cancel()


async def _close(
    ctx: ClientContext, versioned: Versioned, last: int, ensembles: LocalEnsembles
) -> Versioned:
    start = ensembles.changed_from
    local = tuple(
        (f, tuple(e)) for f, e in sorted(ensembles.items()) if start is not None and f >= start
    )

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
        segments = md.ensembles  # as they are now (module docstring: LocalEnsembles)
        if start is not None:
            segments = tuple(s for s in md.ensembles if s[0] < start) + local
        return LedgerMetadata(**{**md.__dict__, "ensembles": segments}).closed(last, -1)

    return await update_ledger(
        ctx.metadata, versioned.value.ledger_id, close,
        ctx.config.metadata_retries_max, current=versioned,
    )  # fmt: skip
