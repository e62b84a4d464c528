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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from ..digest import master_key, payload_digest
from ..errors import LedgerRecoveryError, MetadataVersionError, NotEnoughBookiesError, StatusCode
from ..metadata.model import LedgerMetadata, LedgerState, Versioned
from ..metadata.store import update_ledger
from ..protocol import (
    ADD_FLAG_RECOVERY,
    READ_FLAG_FENCE,
    AddBatchRequest,
    AddBatchResponse,
    AddResponse,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadLacRequest,
    ReadRequest,
    ReadResponse,
    pack_add_entries,
    unpack_read_entries,
)
from ..quorum import (
    ReadDecision,
    gwq_recovery_start,
    is_covered,
    recovery_read_decision,
    recovery_start,
    write_set,
)
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


class LocalEnsembles(dict[int, list[str]]):
    """The ensembles recovery writes back to: the metadata's as recovery started, with its
    local replacements; ``changed_from`` is the first entry of the earliest of those (None:
    none). Only that part is recovery's to commit: the segments before it are taken from the
    metadata as it is at the close (an autorecovery may have replaced a lost bookie in them
    meanwhile, and writing back the old ones would undo it)."""

    changed_from: int | None = None


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


class _ReadAhead:
    """Fencing reads of the entries from ``first`` on, from their write sets (the ensemble
    as recovery started), with at most ``ahead`` entries issued and not yet taken; every entry
    decided by :func:`~bookkeeper_aio.quorum.recovery_read_decision` as its answers arrive
    (callbacks, no task per request). An entry is asked of the first member of its write set
    and of the others only when that answer is not a good copy (BookKeeper's sequential
    recovery reads): one good copy decides it, and every answer that counts as a negative
    still comes from a fencing read. A first member that has not answered within
    ``speculative_read_timeout_s`` gets the others asked too, and from then on is asked
    together with them (:meth:`_speculate`). Nothing past an entry that decided anything but
    RECOVERABLE is issued."""

    def __init__(self, ctx: ClientContext, md: LedgerMetadata, key: bytes, first: int,
                 ahead: int) -> None:  # fmt: skip
        self.ctx, self.md, self.ahead = ctx, md, ahead
        flags = 0 if ctx.has_bug("recovery-reads-without-fence") else READ_FLAG_FENCE
        self._fields = (flags, key, -1, 0)
        self._unknown_as_negative = ctx.has_bug("unknown-as-negative")
        self._decided: dict[int, tuple[ReadDecision, Any]] = {}
        self._next = first  # the next entry to issue
        self._taken = first  # the next entry to hand out
        self._stopped = False  # an entry decided other than RECOVERABLE: issue nothing more
        self._closed = False
        self._wake: asyncio.Future[None] | None = None
        # Entries asked of their first member only: entry -> (that bookie, when, ask the rest).
        self._first_only: dict[int, tuple[str, float, Callable[[], None]]] = {}
        self._slow: set[str] = set()  # first members that did not answer in time: ask all
        self._speculate_at: asyncio.TimerHandle | None = None
        # Past the first ``batch`` entries (a short tail is decided entry by entry), entries go
        # ``batch`` at a time in one ReadBatchRequest to the bookie that comes first for all
        # of them: possible only where every bookie holds every entry (E == WQ).
        self._first = first
        self._after: dict[int, list[_EntryRead]] = {}  # (_issue_batch) asked once it is decided
        batch = ctx.config.recovery_read_batch_entries
        self._batch = min(batch, ahead) if md.ensemble_size == md.write_quorum else 0
        self._fill()

    async def take(self, count: int) -> tuple[list[Any], bool]:
        """The next ``count`` recoverable entries' responses, in order, and whether the
        ledger's end came first (fewer then).

        Raises:
            LedgerRecoveryError: an entry could not be decided.
        """
        batch: list[Any] = []
        while len(batch) < count:
            got = self._decided.pop(self._taken, None)
            if got is None:
                self._wake = asyncio.get_running_loop().create_future()
                await self._wake
                continue
            decision, response = got
            if decision is ReadDecision.NOT_RECOVERABLE:
                return batch, True
            if decision is not ReadDecision.RECOVERABLE:
                raise LedgerRecoveryError(
                    f"ledger {self.md.ledger_id}: cannot decide entry {self._taken} "
                    "(replicas unreachable or in limbo); retry later"
                )
            batch.append(response)
            self._taken += 1
            self._fill()
        return batch, False

    def close(self) -> None:
        """Ignore every answer still to come (their requests end by themselves)."""
        self._closed = True
        if self._speculate_at is not None:
            self._speculate_at.cancel()

    def _speculate(self) -> None:
        """Ask the rest of the write set of every entry whose first member has not answered
        within ``speculative_read_timeout_s`` (as a reader's speculative read), and from now
        on ask all members at once where that bookie comes first: a hung bookie costs the
        recovery one such wait, not one per window."""
        self._speculate_at = None
        if self._closed:
            return
        now, wait_s = asyncio.get_running_loop().time(), self.ctx.config.speculative_read_timeout_s
        # The same sum as the timer's: ``at <= now - wait_s`` can miss by a rounding error, and
        # the timer then fired again and again at the same (simulated) time.
        late = [e for e, (_, at, _) in self._first_only.items() if at + wait_s <= now]
        for entry_id in late:
            bookie, _, ask_rest = self._first_only.pop(entry_id)
            self._slow.add(bookie)
            ask_rest()
        self._schedule_speculation()

    def _schedule_speculation(self) -> None:
        if self._speculate_at is None and self._first_only and not self._closed:
            first_at = min(at for _, at, _ in self._first_only.values())
            delay = first_at + self.ctx.config.speculative_read_timeout_s
            self._speculate_at = asyncio.get_running_loop().call_at(delay, self._speculate)

    def _fill(self) -> None:
        while not self._stopped and self._next < self._taken + self.ahead:
            count = self._batch_size()
            if count > 1:
                self._issue_batch(self._next, count)
            elif count == 1:
                self._issue(self._next)
            else:
                return  # room for a whole batch comes as entries are taken
            self._next += count

    def _batch_size(self) -> int:
        """How many entries from ``_next`` to ask now: 1 (a read of its own), a batch (up
        to the end of its segment), or 0: wait until there is room ahead for the batch."""
        if not self._batch or self._next - self._first < self._batch:
            return 1
        later = [f for f, _ in self.md.ensembles if f > self._next]
        count = min(self._batch, min(later) - self._next) if later else self._batch
        return count if self._next + count <= self._taken + self.ahead else 0

    def _issue_batch(self, first: int, count: int) -> None:
        """Ask one bookie (the first of the first entry's write set; E == WQ: it holds every
        entry) for ``count`` entries at once: each entry's first read. Each entry it returns
        is decided as if its own ReadRequest had answered; the entry it stopped at gets the
        status it gave (so its other replicas are asked); an entry it did not reach (a
        limit), or every entry of a request that failed as a whole, is asked with a
        ReadRequest of its own. That bookie comes first for each of these entries
        (:class:`_EntryRead`): its answer must not count again when the others are asked."""
        md, lid = self.md, self.md.ledger_id
        members = write_set(first, md.ensemble_size, md.write_quorum)
        bookie = md.ensemble_at(first)[members[0]]
        reads = [_EntryRead(self, e, bookie) for e in range(first, first + count)]
        flags, key = self._fields[0], self._fields[1]
        if bookie in self._slow:  # as _issue: a slow first member is asked with the others
            for read in reads:
                read.ask_first()
                read.ask_rest()
            return
        now = asyncio.get_running_loop().time()
        for read in reads:
            self._first_only[read.entry_id] = (bookie, now, read.ask_rest)

        def answered(result: Any) -> None:
            if self._closed:
                return
            found: list[tuple[int, int, int, bytes]] = []
            whole = type(result) is ReadBatchResponse and result.status == StatusCode.OK
            if whole:
                try:
                    found = unpack_read_entries(result.entries)
                except ValueError:  # garbled: every entry asked again, one by one
                    whole = False
            stop = len(found) if whole and result.end_status != StatusCode.OK else None
            if stop is not None and stop + 1 < count:
                # Past an entry the bookie lacks (most often the ledger's end): asked only
                # if that entry proves recoverable after all (another replica has it).
                later = reads[stop + 1 :]
                for read in later:
                    self._first_only.pop(read.entry_id, None)
                self._after[reads[stop].entry_id] = later
            for index, read in enumerate(reads):
                if stop is not None and index > stop:
                    break
                if not whole or (index >= len(found) and stop is None):
                    read.ask_first()  # not reached (a limit), or no answer: its own request
                elif index == stop:  # where the bookie stopped: its answer for it
                    read.answered(ReadResponse(0, result.end_status, lid, read.entry_id, None,
                                               None, None, result.lac_proof))  # fmt: skip
                else:
                    eid, lac, digest, payload = found[index]
                    read.answered(ReadResponse(0, StatusCode.OK, lid, eid, lac, payload, digest,
                                               result.lac_proof))  # fmt: skip
            if stop is not None and reads[stop].decision is ReadDecision.RECOVERABLE:
                self._decide_later(reads[stop].entry_id)  # decided before this answer came

        self.ctx.pool.send(bookie, ReadBatchRequest, lid, first, count, flags, key,
                           self.ctx.config.frame_bytes_max // 4, callback=answered)  # fmt: skip
        self._schedule_speculation()

    def _issue(self, entry_id: int) -> None:
        self._ask(_EntryRead(self, entry_id))

    def _decide(self, entry_id: int, decision: ReadDecision, response: Any) -> None:
        self._decided[entry_id] = (decision, response)
        if decision is not ReadDecision.RECOVERABLE:
            self._stopped = True
        self._decide_later(entry_id)
        if entry_id == self._taken and self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _decide_later(self, entry_id: int) -> None:
        """Ask the entries deferred behind ``entry_id`` (:meth:`_issue_batch`) once it is
        decided recoverable: the ledger may go on past it. (Even if a later entry stopped
        the reads meanwhile: these come before it, and take() needs them.)"""
        decided = self._decided.get(entry_id)
        if decided is None or decided[0] is ReadDecision.RECOVERABLE:
            for read in self._after.pop(entry_id, ()):
                self._ask(read)

    def _ask(self, read: _EntryRead) -> None:
        """An entry's own read of its first member (the others too if that one is slow),
        watched for speculation."""
        read.ask_first()
        if read.first in self._slow:
            read.ask_rest()
        elif read.pending():  # not answered at once
            now = asyncio.get_running_loop().time()
            self._first_only[read.entry_id] = (read.first, now, read.ask_rest)
            self._schedule_speculation()


class _EntryRead:
    """The reads of one entry in a recovery (:class:`_ReadAhead`): one member of its write
    set asked first (the write set's first, or ``first``: a batch's bookie), then the others
    if that answer is not a good copy; decided by
    :func:`~bookkeeper_aio.quorum.recovery_read_decision` as the answers arrive. Each
    member is asked once: a negative counts once per bookie."""

    __slots__ = ("ahead", "asked_first", "asked_rest", "bookies", "decision", "entry_id",
                 "first", "statuses")  # fmt: skip

    def __init__(self, ahead: _ReadAhead, entry_id: int, first: str | None = None) -> None:
        md = ahead.md
        self.ahead, self.entry_id = ahead, entry_id
        ensemble = md.ensemble_at(entry_id)
        bookies = [ensemble[i] for i in write_set(entry_id, md.ensemble_size, md.write_quorum)]
        if first is not None:  # a batch's bookie (E == WQ: it holds every entry) goes first
            bookies.remove(first)
            bookies.insert(0, first)
        self.bookies = bookies
        self.first = bookies[0]
        self.statuses: list[int | None] = []
        self.asked_first = self.asked_rest = False
        self.decision: ReadDecision | None = None

    def pending(self) -> bool:
        """Nothing decided it yet and only its first member was asked."""
        return len(self.statuses) < len(self.bookies) and not self.asked_rest

    def ask_first(self) -> None:
        if not self.asked_first:
            self.asked_first = True
            self._send(self.first)

    def ask_rest(self) -> None:
        if not self.asked_rest:
            self.asked_rest = True
            for bookie in self.bookies[1:]:
                self._send(bookie)

    def _send(self, bookie: str) -> None:
        ahead = self.ahead
        ahead.ctx.pool.send(bookie, ReadRequest, ahead.md.ledger_id, self.entry_id,
                            *ahead._fields, callback=self.answered)  # fmt: skip

    def answered(self, result: Any) -> None:
        ahead, md, statuses = self.ahead, self.ahead.md, self.statuses
        if ahead._closed or len(statuses) >= len(self.bookies):
            return  # closed, or decided before this answer
        good = entry_ok(md.ledger_id, self.entry_id, result)
        status = getattr(result, "status", None)
        statuses.append(StatusCode.OK if good else (None if status == 0 else status))
        decision = recovery_read_decision(
            statuses, md.write_quorum, md.ack_quorum,
            unknown_as_negative=ahead._unknown_as_negative,
        )  # fmt: skip
        if decision is ReadDecision.PENDING and len(statuses) == len(self.bookies):
            decision = ReadDecision.UNDECIDED
        ahead._first_only.pop(self.entry_id, None)
        if decision is not ReadDecision.PENDING:
            statuses.extend([None] * (len(self.bookies) - len(statuses)))  # decided: no more
            self.decision = decision
            ahead._decide(self.entry_id, decision, result if good else None)
        else:  # the first copy was not good: ask the rest
            self.ask_rest()


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
