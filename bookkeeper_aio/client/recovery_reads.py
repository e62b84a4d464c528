"""Recovery's reads forward (step 3 of client/recovery.py's theory of operation): fencing
reads of the tail from each entry's write set, kept a bounded number of entries ahead of the
write-back, in ``ReadBatchRequest``s where every bookie holds every entry (E == WQ), each entry
decided by :func:`~bookkeeper_aio.quorum.recovery_read_decision` as its answers arrive
(client/recovery.py says how recovery works)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..errors import LedgerRecoveryError, StatusCode
from ..metadata.model import LedgerMetadata
from ..protocol import (
    READ_FLAG_FENCE,
    ReadBatchRequest,
    ReadBatchResponse,
    ReadRequest,
    ReadResponse,
    unpack_read_entries,
)
from ..quorum import ReadDecision, recovery_read_decision, write_set
from .context import ClientContext
from .reads import entry_ok


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
