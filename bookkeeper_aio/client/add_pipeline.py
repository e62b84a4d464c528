"""The write path's decisions, pure: pending adds, acks, in-order completion, LAC, LAFR,
ensemble changes and pinning. No asyncio, no sockets, no clock.

Theory of operation
-------------------
:class:`AddPipeline` is the state of one ledger writer's adds; its driver
(:class:`~bookkeeper_aio.client.writer.LedgerWriter`) turns bookies' answers into events and
does what the pipeline returns:

* ``push(op)``: a new add (the driver sends it to its write set);
* ``acked(ops, index)`` / ``ack(op, index)``: bookie ``index`` stored these adds; true when
  :meth:`complete` has something to do. :meth:`complete` returns the adds acknowledged now,
  in entry order (an add is acknowledged once it and every earlier add reached the ack quorum;
  the LAC advances with it);
* ``fail_bookie(index, bookie)``: a bookie failed an add; it waits for replacement;
  :meth:`begin_change` picks the failed indexes that may be replaced now, and
  :meth:`replaced` (after the metadata CAS) returns which adds to send where.

Adds leave the queue when they are *released*: at the ack quorum normally, and with
**guaranteed write quorum** (seed 001, docs/protocol.md) only at the write quorum — when the
add and every earlier one have WQ copies; ``last_add_fully_replicated`` (the LAFR) is the last
released add. Then an ensemble change starts its segment at LAFR + 1 (not LAC + 1): every add
not yet at WQ, acknowledged or not, goes to the replacement, and the bookies holding an
acknowledged add below WQ are **pinned** — never replaced while they hold it, so no ensemble
change can leave an acknowledged entry on fewer than AQ bookies of its ensemble. A failed
pinned bookie waits until the adds pinning it reach WQ (through the other members).

During an ensemble change (``changing`` not empty) completions and releases are held
(BookKeeper's changingEnsemble): an ack from a bookie being replaced must not complete or
release an add that the new segment assigns to its replacement.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable, Iterable

from ..quorum import AckSet, write_set

log = logging.getLogger(__name__)

AddCallback = Callable[[int, BaseException | None], None]
_NOTHING: list[PendingAdd] = []  # complete()'s answer when nothing completed (never mutated)


class PendingAdd(AckSet):
    """An add in flight: its acknowledgements (an AckSet itself, not holding one: a writer
    keeps thousands of these, and each object is one more for the garbage collector), and
    whom to tell: a future (append_nowait) or a callback (append_callback)."""

    __slots__ = (
        "callback", "digest", "done", "entry_id", "error", "future", "head", "lac", "overloads",
        "payload",
    )  # fmt: skip
    error: BaseException | None  # set by the writer for an append_callback add
    overloads: int  # TOO_MANY_REQUESTS answers in a row, set by the writer (rare)

    def __init__(
        self, entry_id: int, lac: int, payload: bytes, digest: int, head: bytes,
        write_set: tuple[int, ...], ack_quorum: int, future: asyncio.Future[int] | None,
        callback: AddCallback | None, guaranteed_write_quorum: bool = False,
    ) -> None:  # fmt: skip
        # AckSet.__init__ inlined (the writer checked its quorums once): the call cost 0.14 µs
        # of the 0.36 this constructor takes per add (timeit).
        self.write_set, self.ack_quorum = write_set, ack_quorum
        self.guaranteed_write_quorum = guaranteed_write_quorum
        self._acked = self._failed = 0
        self.entry_id, self.lac, self.payload, self.digest = entry_id, lac, payload, digest
        self.head = head  # what precedes the payload in a batch (protocol.add_entry_head)
        self.future, self.callback = future, callback
        self.done = False  # acknowledged or failed: the caller was told (or will be)
        # self.error: set by the writer for an append_callback add, read when it tells it
        # self.overloads: TOO_MANY_REQUESTS answers in a row, set by the writer (rare)

    def finish(self, error: BaseException | None) -> None:
        """Tell the caller the add succeeded (``error`` None) or failed; once."""
        self.done = True
        future = self.future
        if future is None:
            try:
                # A callback add (no future): no assert on this hot path.
                self.callback(self.entry_id, error)  # type: ignore[misc]
            except Exception:  # the caller's bug must not break the writer's bookkeeping
                log.exception("add callback of entry %d raised", self.entry_id)
        elif not future.done():  # not cancelled by its caller
            if error is None:
                future.set_result(self.entry_id)
            else:
                future.set_exception(error)
                future.exception()  # the caller may have dropped it: not "never retrieved"


class AddPipeline:
    """The adds of one writer (see the module docstring).

    Valid states: ``changing`` empty (adds complete and release as acks arrive) or not
    (an ensemble change is being committed: completions and releases wait).
    """

    def __init__(
        self,
        ensemble_size: int,
        write_quorum: int,
        ack_quorum: int,
        *,
        guaranteed_write_quorum: bool = False,
        pinning: bool = True,
    ) -> None:
        assert ensemble_size >= write_quorum >= ack_quorum >= 1
        self.ensemble_size, self.write_quorum, self.ack_quorum = (
            ensemble_size,
            write_quorum,
            ack_quorum,
        )
        self.guaranteed_write_quorum = guaranteed_write_quorum
        self._pinning = pinning  # False only for the simulator's gwq-no-pinning bug switch
        # There are exactly E write sets: entry e uses number e % E.
        self.write_sets = [write_set(i, ensemble_size, write_quorum) for i in range(ensemble_size)]
        self.last_add_pushed = -1
        self.last_add_confirmed = -1  # the LAC: the last acknowledged add
        self.last_add_fully_replicated = -1  # the LAFR (guaranteed write quorum only)
        self.length = 0  # payload bytes of the acknowledged adds
        self.pending_bytes = 0  # payload bytes of the adds not released
        self.unacked: collections.deque[PendingAdd] = collections.deque()
        # Guaranteed write quorum: acknowledged adds not at WQ yet (they precede ``unacked``).
        self.unreleased: collections.deque[PendingAdd] = collections.deque()
        self.failed_bookies: dict[int, str] = {}  # index -> bookie awaiting replacement
        self.changing: set[int] = set()

    # --- adds and answers -----------------------------------------------------------------

    def push(self, op: PendingAdd) -> None:
        """A new add (id ``last_add_pushed + 1``); the driver sends it to its write set."""
        assert op.entry_id == self.last_add_pushed + 1, (op.entry_id, self.last_add_pushed)
        self.last_add_pushed = op.entry_id
        self.unacked.append(op)
        self.pending_bytes += len(op.payload)

    def acked(self, ops: list[PendingAdd], index: int) -> bool:
        """Bookie ``index`` stored every add of ``ops``; true if :meth:`complete` has work."""
        AckSet.add_acks(ops, index)  # acks of adds released already change nothing
        unacked = self.unacked
        if unacked and unacked[0].completed:
            return True
        unreleased = self.unreleased
        return bool(unreleased) and unreleased[0].fully_replicated

    def ack(self, op: PendingAdd, index: int) -> bool:
        """Bookie ``index`` stored ``op``; true if :meth:`complete` has work."""
        if op.done and not self.guaranteed_write_quorum:
            return False  # acknowledged and released: further copies change nothing
        return self.acked([op], index)

    def complete(self) -> list[PendingAdd]:
        """Acknowledge (and, with guaranteed write quorum, release) what is ready, in order;
        return the adds acknowledged now. Nothing while an ensemble change is committed."""
        if self.changing:
            return _NOTHING
        unacked = self.unacked
        if not (unacked and unacked[0].completed):
            if self.unreleased:
                self._release()
            return _NOTHING
        done: list[PendingAdd] = []
        gwq = self.guaranteed_write_quorum
        while unacked and unacked[0].completed:
            op = unacked.popleft()
            assert op.entry_id == self.last_add_confirmed + 1  # ordered completion
            self.last_add_confirmed = op.entry_id
            self.length += len(op.payload)
            done.append(op)
            if gwq:
                self.unreleased.append(op)
            else:
                self.pending_bytes -= len(op.payload)
        if gwq:
            self._release()
        return done

    def _release(self) -> None:
        unreleased = self.unreleased
        while unreleased and unreleased[0].fully_replicated:
            op = unreleased.popleft()
            self.last_add_fully_replicated = op.entry_id
            self.pending_bytes -= len(op.payload)

    def is_short_copy(self, op: PendingAdd) -> bool:
        """A failed copy of ``op`` leaves it under-replicated for good (BP-31): it was
        acknowledged, and without guaranteed write quorum nothing writes it again."""
        return op.entry_id <= self.last_add_confirmed and not self.guaranteed_write_quorum

    def take_all(self) -> list[PendingAdd]:
        """Empty the queues (the writer failed or closed); return the adds not told yet."""
        ops = [op for op in (*self.unreleased, *self.unacked) if not op.done]
        self.unreleased.clear()
        self.unacked.clear()
        self.pending_bytes = 0
        return ops

    # --- ensemble changes -----------------------------------------------------------------

    def fail_bookie(self, index: int, bookie: str) -> bool:
        """Bookie ``bookie`` at ``index`` failed an add: it waits for replacement. True when
        it is newly failed (the driver makes sure a change round runs)."""
        if index in self.failed_bookies:
            return False
        self.failed_bookies[index] = bookie
        return True

    def pinned(self) -> frozenset[int]:
        """Indexes an ensemble change must not replace: the members holding an acknowledged
        add below the write quorum (guaranteed write quorum only)."""
        if not self.guaranteed_write_quorum or not self._pinning:
            return frozenset()
        mask = 0
        for op in self.unreleased:  # acknowledged, not at WQ (releases are in order)
            if not op.fully_replicated:
                mask |= op._acked
        return frozenset(i for i in range(self.ensemble_size) if mask >> i & 1)

    def replaceable(self) -> dict[int, str]:
        """The failed bookies that may be replaced now (not pinned, not being replaced).

        With guaranteed write quorum the new segment starts at LAFR + 1, so it takes over
        acknowledged adds that already had WQ copies (behind one that has not): a change may
        only swap out members so that each of them keeps AQ holders in the new ensemble
        (sim seed 66: two members replaced at once left an acknowledged entry on one
        bookie). Failed members are taken in index order while that holds; the others wait
        for a later round, once the replacements hold copies."""
        pinned = self.pinned()
        candidates = {
            i: b
            for i, b in sorted(self.failed_bookies.items())
            if i not in pinned and i not in self.changing
        }
        if not candidates or not self.guaranteed_write_quorum or not self._pinning:
            return candidates
        masks = {op._acked for op in self.unreleased}
        gone = sum(1 << i for i in self.changing)
        chosen: dict[int, str] = {}
        for index, bookie in candidates.items():
            without = ~(gone | 1 << index)
            if all((mask & without).bit_count() >= self.ack_quorum for mask in masks):
                chosen[index] = bookie
                gone |= 1 << index
        return chosen

    def begin_change(self) -> dict[int, str]:
        """Start replacing the replaceable failed bookies; return them (empty: none now)."""
        failed = self.replaceable()
        self.changing |= set(failed)
        return failed

    @property
    def segment_start(self) -> int:
        """Where an ensemble change's new segment starts: at the first add not released
        (LAC + 1; LAFR + 1 with guaranteed write quorum)."""
        if self.guaranteed_write_quorum:
            return self.last_add_fully_replicated + 1
        return self.last_add_confirmed + 1

    def replaced(self, indexes: Iterable[int]) -> dict[int, list[PendingAdd]]:
        """The change of ``indexes`` is committed: their bookies' acks no longer count;
        return, per index, the pending adds to send to its replacement (oldest first)."""
        replaced = set(indexes)
        self.changing -= replaced
        for index in replaced:
            self.failed_bookies.pop(index, None)
        resend: dict[int, list[PendingAdd]] = {}
        for op in (*self.unreleased, *self.unacked):
            for index in op.write_set:
                if index in replaced:
                    op.remove(index)
                    resend.setdefault(index, []).append(op)
        return resend

    def abort_change(self) -> None:
        """The change failed (the writer fails with it)."""
        self.changing.clear()

    # --- queries --------------------------------------------------------------------------

    @property
    def pending_count(self) -> int:
        """Adds not released (what the writer's memory holds)."""
        return len(self.unacked) + len(self.unreleased)

    @property
    def drained(self) -> bool:
        """Nothing pending: every add acknowledged (and at WQ with guaranteed write quorum)."""
        return not self.unacked and not self.unreleased

    def statistics(self) -> dict[str, int]:
        return {
            "pending_adds": self.pending_count,
            "unacknowledged_adds": len(self.unacked),
            "pending_bytes": self.pending_bytes,
            "last_add_confirmed": self.last_add_confirmed,
            "last_add_fully_replicated": self.last_add_fully_replicated,
        }
