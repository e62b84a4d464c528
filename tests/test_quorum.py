"""Quorum math and recovery rules: property tests and an exhaustive model check."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper_aio.digest import LacProof
from bookkeeper_aio.errors import StatusCode
from bookkeeper_aio.quorum import (
    AckSet,
    Answer,
    EnsembleCoverage,
    QuorumCoverage,
    ReadDecision,
    RecoveryReadRule,
    classify,
    fenced_lac,
    is_covered,
    recovery_read_decision,
    recovery_start,
    write_set,
)

OK, NSE, NSL = StatusCode.OK, StatusCode.NO_SUCH_ENTRY, StatusCode.NO_SUCH_LEDGER
LIMBO, IO = StatusCode.UNKNOWN, StatusCode.IO_ERROR
HOLDER_ANSWERS = (OK, LIMBO, IO, None)  # a bookie holding the entry: OK or unknown
MISSING_ANSWERS = (NSE, NSL, LIMBO, IO, None)  # a bookie without it: negative or unknown
RULES = tuple(RecoveryReadRule)


@st.composite
def quorums(draw, e_max: int = 7):
    e = draw(st.integers(1, e_max))
    w = draw(st.integers(1, e))
    return e, w, draw(st.integers(1, w))


def small_quorums(w_max: int = 4):
    """Every (WQ, AQ) with 1 <= AQ <= WQ <= w_max."""
    return [(w, a) for w in range(1, w_max + 1) for a in range(1, w + 1)]


# --- write sets ---------------------------------------------------------------------------


@given(quorums(), st.integers(0, 10**12))
def test_write_set_is_round_robin(q, entry_id):
    e, w, _ = q
    ws = write_set(entry_id, e, w)
    assert ws == tuple((entry_id + i) % e for i in range(w))
    assert len(set(ws)) == w and ws == write_set(entry_id % e, e, w)


@given(quorums())
def test_each_bookie_is_in_exactly_wq_of_the_e_write_sets(q):
    e, w, _ = q
    counts = Counter(i for first in range(e) for i in write_set(first, e, w))
    assert counts == {i: w for i in range(e)}


# --- ack sets -----------------------------------------------------------------------------

ops = st.lists(st.tuples(st.sampled_from(["ack", "remove", "fail"]), st.integers(0, 7)))


@given(quorums(), st.integers(0, 100), ops, st.booleans())
def test_ack_set_matches_a_set_model(q, entry_id, steps, gwq):
    """Completed exactly at AQ distinct write-set members; remove/fail discard the ack."""
    e, w, a = q
    ws = write_set(entry_id, e, w)
    ack_set, acked, failed = AckSet(ws, a, guaranteed_write_quorum=gwq), set(), set()
    for op, index in steps:
        member = index in ws
        if op == "ack":
            acked |= {index} if member else set()
            failed -= {index}
            assert ack_set.add_ack(index) == (len(acked) >= a)
        elif op == "remove":
            acked.discard(index)
            failed.discard(index)
            assert ack_set.remove(index) == (len(acked) >= a)
        else:
            acked.discard(index)
            failed |= {index} if member else set()
            slack = 0 if gwq else w - a
            assert ack_set.fail(index) == (len(failed) > slack)
        assert ack_set.acked == acked and ack_set.failed == failed
        assert ack_set.completed == (len(acked) >= a)
        assert ack_set.fully_replicated == (len(acked) == w)
        assert ack_set.releasable == (len(acked) >= (w if gwq else a))


@given(quorums(), st.lists(st.tuples(st.integers(0, 100), ops), max_size=6), st.integers(0, 7))
def test_add_acks_is_add_ack_on_each(q, adds, index):
    """The writer's batched ack equals one add_ack per add, whatever state each add is in."""
    e, w, a = q
    one_by_one, batched = [], []
    for entry_id, steps in adds:
        pair = [AckSet(write_set(entry_id, e, w), a) for _ in range(2)]
        for op, i in steps:  # the same history on both
            for ack_set in pair:
                {"ack": ack_set.add_ack, "remove": ack_set.remove, "fail": ack_set.fail}[op](i)
        one_by_one.append(pair[0])
        batched.append(pair[1])
    for ack_set in one_by_one:
        ack_set.add_ack(index)
    AckSet.add_acks(batched, index)
    for x, y in zip(one_by_one, batched, strict=True):
        assert (x.acked, x.failed, x.completed) == (y.acked, y.failed, y.completed)


def test_an_ensemble_change_discards_the_replaced_bookies_ack():
    ack_set = AckSet((1, 2, 3), 2)
    assert not ack_set.add_ack(1) and ack_set.add_ack(2)
    assert ack_set.remove(2) is False  # bookie 2 was replaced: the add is not complete any more
    assert ack_set.add_ack(2) is True  # ... until the replacement acknowledges it
    ack_set.add_ack(9)  # not a member: never counts
    assert ack_set.acked == {1, 2}


def test_guaranteed_write_quorum_acknowledges_at_aq_but_releases_at_wq_and_pins():
    """Seed 001: the LAC still moves at AQ; the add leaves the queue at WQ; ackers are pinned."""
    ack_set = AckSet((0, 1, 2), 2, guaranteed_write_quorum=True)
    ack_set.add_ack(0)
    assert ack_set.pinned == frozenset()  # not committed yet: nothing to protect
    assert ack_set.add_ack(1) and not ack_set.releasable
    assert ack_set.pinned == {0, 1}
    assert ack_set.fail(2) is True  # any failure needs an ensemble change under GWQ
    ack_set.remove(2)  # bookie 2 replaced; the new bookie acknowledges
    ack_set.add_ack(2)
    assert ack_set.releasable and ack_set.pinned == frozenset()
    plain = AckSet((0, 1, 2), 2)
    assert plain.add_ack(0) is False and plain.add_ack(1) and plain.releasable
    assert plain.pinned == frozenset() and plain.fail(2) is False  # WQ - AQ failures tolerated


# --- ensemble coverage (fencing, LAC read) ------------------------------------------------

answer_lists = st.lists(
    st.tuples(st.integers(0, 6), st.sampled_from([OK, NSE, NSL, LIMBO, IO, None]))
)


def unreached_ack_quorum(e: int, w: int, a: int, known: set[int]) -> bool:
    """Seed 000's definition, brute force: some ack quorum of some write set is all unknown."""
    return any(
        not set(aq) & known
        for first in range(e)
        for aq in itertools.combinations(write_set(first, e, w), a)
    )


@given(quorums(), answer_lists)
def test_ensemble_coverage_is_seed_000s_definition_and_monotone(q, answers):
    e, w, a = q
    coverage, covered_before = EnsembleCoverage(e, w, a), False
    for index, status in ((i, s) for i, s in answers if i < e):
        covered = coverage.record(index, status)
        assert covered == (not unreached_ack_quorum(e, w, a, set(coverage.known)))
        assert covered or not covered_before  # never uncovered by a later answer
        covered_before = covered
    assert coverage.known == {i for i, s in answers if i < e and s in (OK, NSE, NSL)}
    assert is_covered(e, w, a, coverage.known) == coverage.covered


@given(quorums(), answer_lists)
def test_blocked_means_no_further_answers_can_cover(q, answers):
    e, w, a = q
    coverage = EnsembleCoverage(e, w, a)
    for index, status in ((i, s) for i, s in answers if i < e):
        coverage.record(index, status)
    silent = [i for i in range(e) if i not in {i for i, _ in answers}]
    for index in silent:  # best case: everyone still silent answers OK
        coverage.record(index, OK)
    assert coverage.covered != coverage.blocked


@given(quorums())
def test_coverage_is_reached_when_all_answer_and_seed_ec_implies_it(q):
    e, w, a = q
    assert is_covered(e, w, a, range(e))
    # Seed 000's EC = E - AQ + 1 known answers always suffice; with E == WQ they are needed.
    for known in itertools.combinations(range(e), e - a + 1):
        assert is_covered(e, w, a, known)
    if e == w:
        assert not any(is_covered(e, w, a, k) for k in itertools.combinations(range(e), e - a))


def test_unknown_answers_do_not_count_towards_coverage_and_lac_comes_from_positives():
    coverage = EnsembleCoverage(3, 3, 2)
    assert not coverage.record(0, LIMBO) and not coverage.record(1, OK, lac=7)
    assert not coverage.record(0, None)
    assert coverage.record(2, NSE) and coverage.max_lac == 7
    coverage.record(0, OK, lac=9)
    coverage.record(0, IO)  # a later error never un-fences
    assert coverage.known == {0, 1, 2} and coverage.max_lac == 9
    blocked = EnsembleCoverage(4, 3, 2)
    blocked.record(0, IO)
    blocked.record(1, None)
    assert blocked.blocked and not blocked.covered


def test_fenced_lac_is_the_max_of_the_verified_proofs():
    good = [LacProof.explicit(5, 3), LacProof.explicit(5, 11), None]
    forged = LacProof(-1, 99, 0, 12345)
    other_ledger = LacProof.explicit(6, 50)
    assert fenced_lac([*good, forged, other_ledger], 5) == 11
    assert fenced_lac([None, forged], 5) == -1


# --- recovery reads -----------------------------------------------------------------------


def test_only_no_such_entry_and_no_such_ledger_are_explicit_negatives():
    for status in StatusCode:
        expected = {OK: Answer.POSITIVE, NSE: Answer.NEGATIVE, NSL: Answer.NEGATIVE}
        assert classify(status) is expected.get(status, Answer.UNKNOWN)
        assert classify(status, unknown_as_negative=True) is not Answer.UNKNOWN
    assert classify(None) is Answer.UNKNOWN and classify(999) is Answer.UNKNOWN


def scenarios(w: int, a: int):
    """Every world where >= AQ members hold the entry, with every consistent answer pattern."""
    for holders in range(a, w + 1):
        for holder_set in itertools.combinations(range(w), holders):
            choices = [HOLDER_ANSWERS if m in holder_set else MISSING_ANSWERS for m in range(w)]
            yield from itertools.product(*choices)


def decisions_in_every_order(answers, w, a, rule, unknown_as_negative=False):
    """Decisions after each answer, for every arrival order (QuorumCoverage and the function)."""
    for order in itertools.permutations(range(w)):
        tracker = QuorumCoverage(
            tuple(range(w)), a, rule=rule, unknown_as_negative=unknown_as_negative
        )
        for n, member in enumerate(order, 1):
            yield tracker.record(member, answers[member])
            prefix = [answers[m] for m in order[:n]]
            yield recovery_read_decision(
                prefix, w, a, rule=rule, unknown_as_negative=unknown_as_negative
            )


@pytest.mark.parametrize(("w", "a"), small_quorums(3))
@pytest.mark.parametrize("rule", RULES)
def test_model_check_an_entry_on_an_ack_quorum_is_never_declared_missing(w, a, rule):
    """Exhaustive: holders answer OK or unknown, the others negative or unknown, any order."""
    for answers in scenarios(w, a):
        for decision in decisions_in_every_order(answers, w, a, rule):
            assert decision is not ReadDecision.NOT_RECOVERABLE, (answers, rule)


@given(st.sampled_from(small_quorums(5)), st.sampled_from(RULES), st.data())
def test_model_check_larger_write_quorums_sampled(q, rule, data):
    w, a = q
    holders = data.draw(st.sets(st.integers(0, w - 1), min_size=a))
    pick = [st.sampled_from(HOLDER_ANSWERS if m in holders else MISSING_ANSWERS) for m in range(w)]
    answers = [data.draw(choice) for choice in pick]
    order = data.draw(st.permutations(range(w)))
    tracker = QuorumCoverage(tuple(range(w)), a, rule=rule)
    for member in order:
        assert tracker.record(member, answers[member]) is not ReadDecision.NOT_RECOVERABLE


@pytest.mark.parametrize(("w", "a"), small_quorums(3))
def test_the_unknown_as_negative_bug_switch_truncates_entries_on_an_ack_quorum(w, a):
    """The checker must be able to fail: with the switch, the model check finds violations."""
    found = [
        answers
        for answers in scenarios(w, a)
        for decision in decisions_in_every_order(answers, w, a, RecoveryReadRule.ONE_COPY, True)
        if decision is ReadDecision.NOT_RECOVERABLE
    ]
    assert found
    # The BP-46 scenario: the holders answer from limbo.
    limbo = [LIMBO] * a + [NSE] * (w - a)
    assert recovery_read_decision(limbo, w, a) is ReadDecision.UNDECIDED
    bug = recovery_read_decision(limbo, w, a, unknown_as_negative=True)
    assert bug is ReadDecision.NOT_RECOVERABLE


@given(st.sampled_from(small_quorums(5)), st.sampled_from(RULES), st.data())
def test_decision_is_final_once_everyone_answered_and_never_early_for_one_copy(q, rule, data):
    w, a = q
    any_answer = st.sampled_from([OK, NSE, NSL, LIMBO, IO, None])
    answers = data.draw(st.lists(any_answer, min_size=w, max_size=w))
    tracker = QuorumCoverage(tuple(range(w)), a, rule=rule)
    decisions = [tracker.record(m, answers[m]) for m in range(w)]
    assert decisions[-1] is not ReadDecision.PENDING
    first = next(d for d in decisions if d is not ReadDecision.PENDING)
    assert all(d is first for d in decisions[decisions.index(first) :])  # latched
    if OK not in answers:
        assert ReadDecision.RECOVERABLE not in decisions
    elif rule is RecoveryReadRule.ONE_COPY:
        assert first is not ReadDecision.UNDECIDED  # one copy always decides
        assert first is ReadDecision.RECOVERABLE or first is ReadDecision.NOT_RECOVERABLE
    if rule is RecoveryReadRule.ONE_COPY:
        assert ReadDecision.UNDECIDED not in decisions[:-1]  # only once everyone answered


def test_the_two_positive_rules_differ_as_documented():
    one, aq = RecoveryReadRule.ONE_COPY, RecoveryReadRule.ACK_QUORUM
    survivor = [OK, LIMBO, LIMBO]  # one copy beside two bookies in limbo
    assert recovery_read_decision(survivor, 3, 2, rule=one) is ReadDecision.RECOVERABLE
    assert recovery_read_decision(survivor, 3, 2, rule=aq) is ReadDecision.UNDECIDED
    lone = [OK, NSE, NSE]  # one copy of an entry that was never acknowledged
    assert recovery_read_decision(lone, 3, 2, rule=one) is ReadDecision.RECOVERABLE
    assert recovery_read_decision(lone, 3, 2, rule=aq) is ReadDecision.NOT_RECOVERABLE
    assert recovery_read_decision([OK, OK], 3, 2, rule=aq) is ReadDecision.RECOVERABLE
    # AQ rule: undecided early once neither outcome is reachable.
    assert recovery_read_decision([LIMBO, None], 3, 2, rule=aq) is ReadDecision.UNDECIDED
    assert recovery_read_decision([LIMBO, None], 3, 2, rule=one) is ReadDecision.PENDING
    # QC = WQ - AQ + 1 explicit negatives end the ledger; fewer wait.
    assert recovery_read_decision([NSE, NSL], 3, 2) is ReadDecision.NOT_RECOVERABLE
    assert recovery_read_decision([NSE, IO], 3, 2) is ReadDecision.PENDING
    assert recovery_read_decision([NSE, IO, LIMBO], 3, 2) is ReadDecision.UNDECIDED


def test_a_member_answering_twice_keeps_its_stronger_answer():
    tracker = QuorumCoverage((4, 5, 6), 2)
    assert tracker.record(4, None) is ReadDecision.PENDING
    assert tracker.record(4, NSE) is ReadDecision.PENDING  # a retry got a real answer
    assert tracker.record(4, None) is ReadDecision.PENDING  # ... which a timeout cannot undo
    assert tracker.record(5, NSE) is ReadDecision.NOT_RECOVERABLE
    assert tracker.record(6, OK) is ReadDecision.NOT_RECOVERABLE  # the first decision stands
    assert tracker.answered == {4, 5, 6}


# --- recovery start -----------------------------------------------------------------------


@given(st.integers(-1, 1000), st.integers(0, 1000))
def test_recovery_starts_at_the_lac_but_never_below_the_last_segment(lac, first):
    start = recovery_start(lac, first)
    assert start == max(lac, first - 1) and start >= first - 1
    assert recovery_start(lac, first, below_last_segment=True) == lac  # BookKeeper #2615


def test_recovery_start_examples():
    assert recovery_start(5, 20) == 19
    assert recovery_start(30, 20) == 30
    assert recovery_start(-1, 0) == -1
    assert recovery_start(5, 20, below_last_segment=True) == 5
