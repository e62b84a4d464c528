"""Recovery rules: what bookies' answers let a recoverer decide. Pure: no I/O, no asyncio.

Theory of operation
-------------------
Recovery (open with recovery; BookKeeper's ``LedgerRecoveryOp``) fences the last ensemble,
takes the highest verified LAC it reports (:func:`fenced_lac`), starts reading forward after
:func:`recovery_start`, and decides each entry from its write set's answers
(:class:`QuorumCoverage` / :func:`recovery_read_decision`):

* **RECOVERABLE** — a good copy is in hand (one copy by default; see
  :class:`RecoveryReadRule`): write it back and go on to the next entry.
* **NOT_RECOVERABLE** — ``QC = WQ - AQ + 1`` members answered an *explicit negative*
  (NO_SUCH_ENTRY / NO_SUCH_LEDGER). At most ``AQ - 1`` members can hold the entry, so it was
  never acknowledged: the ledger ends before it.
* **UNDECIDED** — neither outcome can be reached any more with the members still to answer
  (at the latest: everyone answered). Recovery must fail and be retried later; it never
  truncates on unknowns.
* **PENDING** — wait for more answers.

Only explicit negatives count against an entry (:func:`classify`): a timeout, an error, a
copy whose digest fails and limbo's UNKNOWN (BP-46) say nothing about whether the bookie holds
it. Hence the model-checked guarantee: if at least ``AQ`` members of the write set hold the
entry, and holders answer OK or unknown while the others answer negative or unknown, the
decision is never NOT_RECOVERABLE, whatever the order.

Bug switches for the simulator re-introduce known protocol defects; they default to off and
nothing but the simulator sets them: ``unknown_as_negative`` (counting unknowns as negatives
truncates acknowledged entries once bookies answer from limbo) and ``below_last_segment``
(BookKeeper #2615: starting below the last segment creates an invalid ensemble).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .errors import StatusCode, is_explicit_negative

if TYPE_CHECKING:
    from .digest import LacProof


class Answer(enum.IntEnum):
    """What one bookie's answer tells us; a higher value is a stronger fact."""

    UNKNOWN = 0
    NEGATIVE = 1
    POSITIVE = 2


def classify(status: int | None, *, unknown_as_negative: bool = False) -> Answer:
    """Sort a wire status (None: timeout or lost connection) into positive/negative/unknown.

    The caller passes OK only for a copy whose digest verified. ``unknown_as_negative`` is a
    **bug switch** (see the module docstring).
    """
    if status == StatusCode.OK:
        return Answer.POSITIVE
    if status is not None and is_explicit_negative(status):
        return Answer.NEGATIVE
    return Answer.NEGATIVE if unknown_as_negative else Answer.UNKNOWN


class ReadDecision(enum.Enum):
    """The fate of one entry during recovery (see the module docstring)."""

    RECOVERABLE = "recoverable"
    NOT_RECOVERABLE = "not-recoverable"
    UNDECIDED = "undecided"
    PENDING = "pending"


class RecoveryReadRule(enum.Enum):
    """How many good copies make an entry RECOVERABLE.

    ``ONE_COPY`` (the default) is BookKeeper's rule (``PendingReadOp`` in recovery mode, and
    ``BookKeeperProtocol.tla``, model-checked); ``ACK_QUORUM`` is seed 000's (BP-46: "Entry
    recoverable: AQ positive read responses"), which the reference paraphrases for the BP-46
    limbo spec. Both are safe; we default to one copy because:

    1. Safety needs only the persistence property: every entry the writer acknowledged ends
       up at or below the sealed last entry. Adopting an entry that was *not* acknowledged is
       allowed — to the writer its add "may or may not have been written" (LedgerFenced is a
       timeout). So the only question per entry is "could it have been acknowledged?", and
       only the negative side (QC explicit negatives) answers it.
    2. A copy whose digest verifies is the writer's own entry at this id, and recovery reads
       forward one id at a time, so adopting it never leaves a gap below it.
    3. Recovery writes the adopted entry back to an ack quorum before the close, so every
       entry of the closed ledger is on at least AQ bookies either way; asking for AQ copies
       at read time adds no durability.
    4. The AQ rule costs liveness exactly where BP-46 needs it: after a crash, one surviving
       copy beside bookies in limbo (UNKNOWN) is UNDECIDED, so recovery keeps failing until
       repair finishes, although adopting the copy is already safe. And one copy beside
       ``WQ - 1`` explicit negatives (``WQ - 1 >= QC``) becomes NOT_RECOVERABLE: legal, as
       the entry was never acknowledged, but it discards data the writer did send.
    """

    ONE_COPY = "one-copy"
    ACK_QUORUM = "ack-quorum"

    def positives_needed(self, ack_quorum: int) -> int:
        return 1 if self is RecoveryReadRule.ONE_COPY else ack_quorum


def decide(
    positives: int,
    negatives: int,
    answered: int,
    write_quorum: int,
    ack_quorum: int,
    rule: RecoveryReadRule = RecoveryReadRule.ONE_COPY,
) -> ReadDecision:
    """Decide one entry from counts of distinct write-set members (see the module docstring)."""
    assert 1 <= ack_quorum <= write_quorum and positives + negatives <= answered <= write_quorum
    needed = rule.positives_needed(ack_quorum)
    negatives_needed = write_quorum - ack_quorum + 1  # QC
    if positives >= needed:
        return ReadDecision.RECOVERABLE
    if negatives >= negatives_needed:
        return ReadDecision.NOT_RECOVERABLE
    remaining = write_quorum - answered
    if positives + remaining < needed and negatives + remaining < negatives_needed:
        return ReadDecision.UNDECIDED
    return ReadDecision.PENDING


def recovery_read_decision(
    statuses: Iterable[int | None],
    write_quorum: int,
    ack_quorum: int,
    *,
    rule: RecoveryReadRule = RecoveryReadRule.ONE_COPY,
    unknown_as_negative: bool = False,
) -> ReadDecision:
    """Decide one entry from its write set's answers so far, one per distinct member.

    ``statuses`` holds a StatusCode per member that answered (OK only for a copy whose digest
    verified), or None for a timeout or lost connection.
    """
    answers = [classify(s, unknown_as_negative=unknown_as_negative) for s in statuses]
    positives = answers.count(Answer.POSITIVE)
    negatives = answers.count(Answer.NEGATIVE)
    return decide(positives, negatives, len(answers), write_quorum, ack_quorum, rule)


class QuorumCoverage:
    """Recovery-read tracker for one entry: feed each member's answer, read the decision.

    The first decision other than PENDING is final (the coroutine acts on it). A member that
    answers twice keeps its stronger answer (a positive beats a negative beats unknown).
    """

    __slots__ = ("_answers", "ack_quorum", "decision", "rule", "unknown_as_negative", "write_set")

    def __init__(
        self,
        write_set: tuple[int, ...],
        ack_quorum: int,
        *,
        rule: RecoveryReadRule = RecoveryReadRule.ONE_COPY,
        unknown_as_negative: bool = False,
    ) -> None:
        assert 1 <= ack_quorum <= len(write_set) == len(set(write_set)), (write_set, ack_quorum)
        self.write_set = write_set
        self.ack_quorum = ack_quorum
        self.rule = rule
        self.unknown_as_negative = unknown_as_negative
        self.decision = ReadDecision.PENDING
        self._answers: dict[int, Answer] = {}

    def record(self, index: int, status: int | None) -> ReadDecision:
        """Record member ``index``'s answer (None: no answer); return the decision."""
        assert index in self.write_set, (index, self.write_set)
        answer = classify(status, unknown_as_negative=self.unknown_as_negative)
        self._answers[index] = max(answer, self._answers.get(index, Answer.UNKNOWN))
        if self.decision is ReadDecision.PENDING:
            answers = list(self._answers.values())
            self.decision = decide(
                answers.count(Answer.POSITIVE), answers.count(Answer.NEGATIVE), len(answers),
                len(self.write_set), self.ack_quorum, self.rule,
            )  # fmt: skip
        return self.decision

    @property
    def answered(self) -> frozenset[int]:
        return frozenset(self._answers)

    def __repr__(self) -> str:
        got = {i: a.name for i, a in sorted(self._answers.items())}
        return f"QuorumCoverage({self.write_set}, aq={self.ack_quorum}, {got}, {self.decision})"


def recovery_start(
    max_lac: int, last_segment_first_entry_id: int, *, below_last_segment: bool = False
) -> int:
    """The last entry known confirmed; recovery reads forward from the entry after it.

    ``max(LAC from fencing, first entry of the last segment - 1)``: every entry before the
    last segment was confirmed before the ensemble change that created the segment (the fix
    for BookKeeper #2615). The bug switch ``below_last_segment`` starts from the LAC alone.
    """
    assert max_lac >= -1 and last_segment_first_entry_id >= 0
    if below_last_segment:
        return max_lac
    return max(max_lac, last_segment_first_entry_id - 1)


def gwq_recovery_start(max_lac: int, max_lafr: int, last_segment_first_entry_id: int) -> int:
    """Guaranteed write quorum: the last entry known to have WQ copies; recovery reads (and
    writes back to WQ) from the entry after it.

    Entries before the last segment have WQ copies (an ensemble change starts its segment at
    the first entry below WQ), and so do those up to the LAFR the fenced bookies report. The
    LAFR carries no proof, so it counts only up to the proven LAC: a wrong one can at worst
    make this the plain recovery's start, never skip an entry past the LAC.
    """
    assert max_lac >= -1 and max_lafr >= -1 and last_segment_first_entry_id >= 0
    return max(min(max_lafr, max_lac), last_segment_first_entry_id - 1)


def fenced_lac(proofs: Iterable[LacProof | None], ledger_id: int) -> int:
    """The highest LAC among the proofs whose digest verifies for ``ledger_id`` (-1 if none).

    A proof that is absent or fails its digest is ignored, never trusted.
    """
    valid = [p.lac for p in proofs if p is not None and p.verify(ledger_id)]
    assert all(lac >= -1 for lac in valid), valid
    return max(valid, default=-1)
