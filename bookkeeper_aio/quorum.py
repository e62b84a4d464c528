"""Quorum math: write sets, ack sets and coverage. Pure: no I/O, no asyncio, no clock.

Theory of operation
-------------------
A ledger segment has an ensemble of ``E`` bookies. Entry ``e`` goes to the ``WQ`` bookies at
ensemble indexes ``(e + i) % E`` for ``i < WQ`` — its **write set** (BookKeeper's
``RoundRobinDistributionSchedule``); there are exactly ``E`` distinct write sets. An add is
acknowledged once ``AQ`` distinct members of its write set stored it (:class:`AckSet`). The
coroutines send requests and feed every answer into one of the objects here; these objects
alone decide.

**Answers.** A bookie's answer is *positive* (OK), an *explicit negative* (NO_SUCH_ENTRY /
NO_SUCH_LEDGER: the bookie positively lacks the data) or *unknown* (any other status, a
timeout, a lost connection, a copy whose digest fails, limbo's UNKNOWN).
:func:`~bookkeeper_aio.recovery_rules.classify` is the one place that sorts them; only
explicit negatives may ever shrink a ledger.

**Coverage** (seed 000, "A note on Quorums"). A property is *covered* within a cohort when no
ack quorum of the cohort lies entirely outside the bookies that satisfy it, equivalently when
at least ``cohort - AQ + 1`` members satisfy it.

* :class:`EnsembleCoverage` (fencing and the LAC read; BookKeeper's ``RRQuorumCoverageSet``):
  every ack quorum of every entry lies inside one of the ``E`` write sets, so it suffices that
  each write set has fewer than ``AQ`` members that have not given a known answer (positive or
  explicit negative), i.e. at least ``WQ - AQ + 1`` known answers per write set. Unknown
  answers do **not** count: an erroring bookie may still be unfenced. Seed 000 writes this as
  ``EC = E - AQ + 1`` known answers over the whole ensemble: the same rule when ``E == WQ``
  (as in the TLA+ model); when striped, EC always implies our rule but demands more answers
  than needed, so we follow the reference's exact per-write-set rule.
* :class:`~bookkeeper_aio.recovery_rules.QuorumCoverage` (recovery reads) applies the rule to
  one entry's write set: ``QC = WQ - AQ + 1`` explicit negatives prove no ack quorum holds it.

Guaranteed write quorum (seed 001) is an option of :class:`AckSet`: the client still
acknowledges at ``AQ`` (the meaning of the LAC does not change), but a pending add may only be
released from the writer's queue at ``WQ``, and until then the bookies that acknowledged it are
*pinned* (an ensemble change must not replace them).

Answer classification, recovery-read decisions, the recovery start point and the fencing LAC
live in :mod:`bookkeeper_aio.recovery_rules` (below this module) and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .errors import StatusCode
from .recovery_rules import (
    Answer,
    QuorumCoverage,
    ReadDecision,
    RecoveryReadRule,
    classify,
    fenced_lac,
    gwq_recovery_start,
    recovery_read_decision,
    recovery_start,
)


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """Ensemble indexes that store ``entry_id``, in write order: ``(entry_id + i) % E``.

    Valid for ``entry_id >= 0`` and ``1 <= write_quorum <= ensemble_size``.
    """
    assert entry_id >= 0 and 1 <= write_quorum <= ensemble_size, (entry_id, write_quorum)
    return tuple((entry_id + i) % ensemble_size for i in range(write_quorum))


def check_quorums(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    """Assert ``E >= WQ >= AQ >= 1`` (callers validated user input already)."""
    assert ensemble_size >= write_quorum >= ack_quorum >= 1, (ensemble_size, write_quorum)


# --- adds -----------------------------------------------------------------------------------


class AckSet:
    """The acknowledgements of one add, from the members of its write set.

    Valid states: ``completed`` (AQ distinct members acked; the add may be acknowledged to the
    client in order), and with ``guaranteed_write_quorum`` additionally ``fully_replicated``
    (all WQ acked) before the add is ``releasable`` from the writer's queue.
    """

    # Bit i of _acked / _failed stands for ensemble index i: one add keeps no sets (a writer
    # holds thousands of these, and every set is one more object for the garbage collector).
    __slots__ = ("_acked", "_failed", "ack_quorum", "guaranteed_write_quorum", "write_set")

    def __init__(
        self, write_set: tuple[int, ...], ack_quorum: int, *, guaranteed_write_quorum: bool = False
    ) -> None:
        # Distinct members: write_set() makes them so (no set built per add to check it here).
        assert 1 <= ack_quorum <= len(write_set), (write_set, ack_quorum)
        self.write_set = write_set
        self.ack_quorum = ack_quorum
        self.guaranteed_write_quorum = guaranteed_write_quorum
        self._acked = 0
        self._failed = 0

    def add_ack(self, index: int) -> bool:
        """Record an ack from ensemble index ``index``; return ``completed``.

        Acks from outside the write set are ignored; a repeated ack counts once.
        """
        if index in self.write_set:
            self._acked |= 1 << index
            self._failed &= ~(1 << index)
        return self._acked.bit_count() >= self.ack_quorum

    @staticmethod
    def add_acks(acks: Iterable[AckSet], index: int) -> None:
        """:meth:`add_ack` from ``index`` on each of ``acks`` (one answer to a batch of adds).

        The loop of ``add_ack`` calls inlined: a writer runs it for every add and every
        member's answer, and a method call per add and answer cost ~0.1 µs.
        """
        bit = 1 << index
        keep = ~bit
        for ack in acks:
            if index in ack.write_set:
                ack._acked |= bit
                ack._failed &= keep

    def fail(self, index: int) -> bool:
        """Record that ``index`` failed this add; True if the ensemble must change for it.

        Without guaranteed write quorum that is when more than ``WQ - AQ`` members failed (the
        rest can no longer make an ack quorum; BookKeeper's ``failBookieAndCheck``); with it,
        any failure, since the add must reach every member.
        """
        if index in self.write_set:
            self._acked &= ~(1 << index)
            self._failed |= 1 << index
        slack = 0 if self.guaranteed_write_quorum else len(self.write_set) - self.ack_quorum
        return self._failed.bit_count() > slack

    def remove(self, index: int) -> bool:
        """Forget ``index``: its bookie was replaced by an ensemble change; return ``completed``.

        The replacement must store the entry anew, so an earlier ack from the old bookie no
        longer counts (BookKeeper's ``removeBookieAndCheck``). An add may thus fall back from
        completed to not completed if it had not been acknowledged to the client yet.
        """
        self._acked &= ~(1 << index)
        self._failed &= ~(1 << index)
        return self.completed

    @property
    def completed(self) -> bool:
        """AQ distinct members acknowledged: the add counts as written."""
        return self._acked.bit_count() >= self.ack_quorum

    @property
    def fully_replicated(self) -> bool:
        """Every member of the write set acknowledged."""
        return self._acked.bit_count() == len(self.write_set)

    @property
    def releasable(self) -> bool:
        """The writer may drop the add from its pending queue (AQ, or WQ when guaranteed)."""
        return self.fully_replicated if self.guaranteed_write_quorum else self.completed

    @property
    def pinned(self) -> frozenset[int]:
        """Indexes an ensemble change must not replace (guaranteed write quorum only).

        The members holding a committed add that has not reached WQ: replacing one could leave
        the committed entry on fewer than AQ bookies of the ensemble metadata names.
        """
        if self.guaranteed_write_quorum and self.completed and not self.fully_replicated:
            return self.acked
        return frozenset()

    @property
    def acked(self) -> frozenset[int]:
        return _members(self._acked)

    @property
    def failed(self) -> frozenset[int]:
        return _members(self._failed)

    def __repr__(self) -> str:
        return f"AckSet(ws={self.write_set}, aq={self.ack_quorum}, acked={sorted(self.acked)})"


def _members(mask: int) -> frozenset[int]:
    """The indexes whose bits are set in ``mask``."""
    return frozenset(i for i in range(mask.bit_length()) if mask >> i & 1)


# --- coverage -------------------------------------------------------------------------------


class EnsembleCoverage:
    """Fencing / LAC-read coverage of one ensemble (see the module docstring).

    Feed every answer with :meth:`record`. ``covered`` becomes True once no ack quorum of any
    write set is outside the known answers (then no normal add can reach AQ any more);
    ``blocked`` becomes True once some write set has ``AQ`` members that answered unknown, so
    the remaining bookies cannot complete it (retry those bookies or fail the recovery).
    ``max_lac`` is the highest LAC reported by a positive answer (-1 if none).
    """

    __slots__ = ("_answers", "ack_quorum", "ensemble_size", "max_lac", "write_quorum")

    def __init__(self, ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
        check_quorums(ensemble_size, write_quorum, ack_quorum)
        self.ensemble_size = ensemble_size
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.max_lac = -1
        self._answers: list[Answer | None] = [None] * ensemble_size

    def record(self, index: int, status: int | None, lac: int = -1) -> bool:
        """Record bookie ``index``'s answer (None: no answer); return ``covered``.

        ``lac`` is the LAC the bookie proved (verified by the caller), used only with OK.
        A known answer is never downgraded by a later unknown one: a fence, once applied, stays.
        """
        assert 0 <= index < self.ensemble_size and lac >= -1, (index, lac)
        answer = classify(status)
        previous = self._answers[index]
        if previous is None or answer > previous:
            self._answers[index] = answer
        if answer is Answer.POSITIVE:
            self.max_lac = max(self.max_lac, lac)
        return self.covered

    @property
    def covered(self) -> bool:
        """Every write set has fewer than AQ members without a known answer."""
        return all(
            self._count(first, lambda a: a is None or a is Answer.UNKNOWN) < self.ack_quorum
            for first in range(self.ensemble_size)
        )

    @property
    def blocked(self) -> bool:
        """Some write set has AQ members that answered unknown: coverage is out of reach."""
        return any(
            self._count(first, lambda a: a is Answer.UNKNOWN) >= self.ack_quorum
            for first in range(self.ensemble_size)
        )

    @property
    def known(self) -> frozenset[int]:
        """Indexes that gave a positive or explicitly negative answer."""
        return frozenset(i for i, a in enumerate(self._answers) if a in _KNOWN)

    def _count(self, first: int, pred: Callable[[Answer | None], bool]) -> int:
        members = write_set(first, self.ensemble_size, self.write_quorum)
        return sum(1 for i in members if pred(self._answers[i]))

    def __repr__(self) -> str:
        marks = "".join("." if a is None else "?-+"[a] for a in self._answers)
        return f"EnsembleCoverage({marks}, wq={self.write_quorum}, aq={self.ack_quorum})"


_KNOWN = (Answer.POSITIVE, Answer.NEGATIVE)


def is_covered(
    ensemble_size: int, write_quorum: int, ack_quorum: int, known: Iterable[int]
) -> bool:
    """True when every write set has fewer than ``ack_quorum`` members outside ``known``."""
    coverage = EnsembleCoverage(ensemble_size, write_quorum, ack_quorum)
    for index in sorted(set(known)):
        coverage.record(index, StatusCode.OK)
    return coverage.covered


__all__ = [
    "AckSet",
    "Answer",
    "EnsembleCoverage",
    "QuorumCoverage",
    "ReadDecision",
    "RecoveryReadRule",
    "check_quorums",
    "classify",
    "fenced_lac",
    "gwq_recovery_start",
    "is_covered",
    "recovery_read_decision",
    "recovery_start",
    "write_set",
]
