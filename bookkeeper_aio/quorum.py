"""Quorum math: write sets, ack sets, coverage, and the recovery-read decision. Pure code.

Theory of operation
-------------------
Entries are striped round-robin: entry ``e`` goes to the ``WQ`` bookies at ensemble indexes
``(e + i) % E`` — its *write set* (BookKeeper's ``RoundRobinDistributionSchedule``). An add
completes when ``AQ`` distinct members of its write set acknowledged it (:class:`AckSet`).

**Coverage.** Any ack quorum of any entry lies inside that entry's write set, so to be sure "no
AQ bookies could still accept an add" (fencing) it suffices that, for every write set of the
ensemble, fewer than ``AQ`` members are *unknown* (:func:`is_covered`; the reference's
``RRQuorumCoverageSet``; seed 000 calls it ensemble coverage, EC). The same rule over a single
write set is quorum coverage (QC): ``WQ - AQ + 1`` explicit negatives from an entry's write set
prove no ack quorum holds it.

**Recovery reads** (:func:`recovery_read_decision`). Only NO_SUCH_ENTRY / NO_SUCH_LEDGER are
negatives; every other answer (errors, timeouts, limbo's UNKNOWN) is unknown.

* RECOVERABLE on ``positives_needed`` good copies (default 1; see below),
* NOT_RECOVERABLE on QC negatives (``WQ - AQ + 1``): the ledger ends before this entry,
* UNDECIDED when every member answered and neither holds: recovery must fail (and be retried),
  never truncate,
* PENDING otherwise.

Seed 000 asks for AQ positives; the reference implementation takes one. We take **one**: a copy
whose digest verifies was sent by the writer, so including it (and writing it back to a full
write quorum) can never lose or invent data, while demanding AQ copies can only turn a surviving
entry into UNDECIDED (or, with ``WQ - 1`` negatives, into a truncation of an entry that exists).
``positives_needed`` keeps the other choice testable.

Bug switches for the simulator (``unknown_as_negative``, ``below_last_segment``) re-introduce
known protocol defects; they default to off and nothing but the simulator sets them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from .errors import StatusCode, is_explicit_negative


def write_set(entry_id: int, ensemble_size: int, write_quorum: int) -> tuple[int, ...]:
    """Ensemble indexes that store ``entry_id``."""
    return tuple((entry_id + i) % ensemble_size for i in range(write_quorum))


class AckSet:
    """Distinct acknowledgements from a write set; complete at ``ack_quorum``."""

    __slots__ = ("_acked", "ack_quorum", "write_set")

    def __init__(self, members: tuple[int, ...], ack_quorum: int) -> None:
        self.write_set = members
        self.ack_quorum = ack_quorum
        self._acked: set[int] = set()

    def add(self, index: int) -> bool:
        """Record an ack from ensemble index ``index``; True once complete."""
        if index in self.write_set:
            self._acked.add(index)
        return len(self._acked) >= self.ack_quorum

    def remove(self, index: int) -> None:
        """Forget ``index``'s ack: its bookie was replaced and must store the entry anew."""
        self._acked.discard(index)

    @property
    def completed(self) -> bool:
        return len(self._acked) >= self.ack_quorum

    @property
    def acked(self) -> frozenset[int]:
        return frozenset(self._acked)


def is_covered(
    ensemble_size: int, write_quorum: int, ack_quorum: int, known: Iterable[int]
) -> bool:
    """True when every write set has fewer than ``ack_quorum`` unknown members."""
    answered = set(known)
    for first in range(ensemble_size):
        members = write_set(first, ensemble_size, write_quorum)
        if sum(1 for m in members if m not in answered) >= ack_quorum:
            return False
    return True


class ReadDecision(enum.Enum):
    RECOVERABLE = "recoverable"
    NOT_RECOVERABLE = "not-recoverable"
    UNDECIDED = "undecided"
    PENDING = "pending"


def recovery_read_decision(
    statuses: Iterable[int | None],
    write_quorum: int,
    ack_quorum: int,
    *,
    positives_needed: int = 1,
    unknown_as_negative: bool = False,
) -> ReadDecision:
    """Decide one entry from its write set's answers so far.

    ``statuses`` has one item per member that answered: a StatusCode, or None for a timeout or
    lost connection. OK means a copy whose digest verified.
    """
    positives = negatives = answered = 0
    for status in statuses:
        answered += 1
        if status == StatusCode.OK:
            positives += 1
        elif (status is not None and is_explicit_negative(status)) or unknown_as_negative:
            negatives += 1
    if positives >= positives_needed:
        return ReadDecision.RECOVERABLE
    if negatives >= write_quorum - ack_quorum + 1:
        return ReadDecision.NOT_RECOVERABLE
    if answered >= write_quorum:
        return ReadDecision.UNDECIDED
    return ReadDecision.PENDING


def recovery_start(
    max_lac: int, last_segment_first_entry_id: int, *, below_last_segment: bool = False
) -> int:
    """The last entry known confirmed, where recovery's read-forward starts after.

    ``max(LAC from fencing, first entry of the last segment - 1)``: an entry before the last
    segment was confirmed before the ensemble change that created the segment (the fix for
    BookKeeper #2615). The bug switch starts from the LAC alone.
    """
    if below_last_segment:
        return max_lac
    return max(max_lac, last_segment_first_entry_id - 1)
