"""Quorum math and placement: property tests (hypothesis)."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper_aio.client.placement import PlacementPolicy
from bookkeeper_aio.errors import NotEnoughBookiesError, StatusCode
from bookkeeper_aio.metadata.store import BookieInfo
from bookkeeper_aio.quorum import (
    AckSet,
    ReadDecision,
    is_covered,
    recovery_read_decision,
    recovery_start,
    write_set,
)


@st.composite
def quorums(draw):
    e = draw(st.integers(1, 7))
    w = draw(st.integers(1, e))
    a = draw(st.integers(1, w))
    return e, w, a


@given(quorums(), st.integers(0, 10**9))
def test_write_sets_are_distinct_and_cover_every_bookie(q, entry_id):
    e, w, _ = q
    ws = write_set(entry_id, e, w)
    assert len(set(ws)) == w and all(0 <= i < e for i in ws)
    covered = {i for x in range(e) for i in write_set(x, e, w)}
    assert covered == set(range(e))


@given(quorums(), st.lists(st.integers(0, 6), max_size=20))
def test_ack_set_completes_exactly_at_aq_distinct_members(q, acks):
    e, w, a = q
    ws = write_set(3, e, w)
    ack_set = AckSet(ws, a)
    seen: set[int] = set()
    for index in acks:
        done = ack_set.add(index)
        if index in ws:
            seen.add(index)
        assert done == (len(seen) >= a)


@given(quorums(), st.sets(st.integers(0, 6)))
def test_coverage_means_no_ack_quorum_is_unanswered(q, known):
    e, w, a = q
    known = {k for k in known if k < e}
    covered = is_covered(e, w, a, known)
    # Brute force: is there an ack quorum inside some write set with no known member?
    hidden = any(
        not (set(aq) & known)
        for first in range(e)
        for aq in itertools.combinations(write_set(first, e, w), a)
    )
    assert covered == (not hidden)
    assert is_covered(e, w, a, range(e))


ANSWERS = [StatusCode.OK, StatusCode.NO_SUCH_ENTRY, StatusCode.NO_SUCH_LEDGER,
           StatusCode.UNKNOWN, StatusCode.IO_ERROR, None]  # fmt: skip


@given(quorums(), st.data())
def test_an_entry_held_by_an_ack_quorum_is_never_declared_missing(q, data):
    """Model check: holders answer OK or unknown, others negative or unknown, in any order."""
    _, w, a = q
    holders = data.draw(st.integers(a, w))
    answers = [data.draw(st.sampled_from([StatusCode.OK, StatusCode.UNKNOWN, None]))
               for _ in range(holders)]  # fmt: skip
    answers += [data.draw(st.sampled_from(ANSWERS[1:])) for _ in range(w - holders)]
    order = data.draw(st.permutations(answers))
    for n in range(len(order) + 1):
        assert recovery_read_decision(order[:n], w, a) is not ReadDecision.NOT_RECOVERABLE


def test_the_unknown_as_negative_switch_can_truncate_an_acked_entry():
    # WQ 3, AQ 2: two holders answer UNKNOWN (limbo), the third has nothing.
    answers = [StatusCode.UNKNOWN, StatusCode.UNKNOWN, StatusCode.NO_SUCH_ENTRY]
    assert recovery_read_decision(answers, 3, 2) is ReadDecision.UNDECIDED
    bug = recovery_read_decision(answers, 3, 2, unknown_as_negative=True)
    assert bug is ReadDecision.NOT_RECOVERABLE


def test_one_good_copy_is_recoverable_and_qc_negatives_end_the_ledger():
    assert recovery_read_decision([StatusCode.OK], 3, 2) is ReadDecision.RECOVERABLE
    neg = [StatusCode.NO_SUCH_ENTRY, StatusCode.NO_SUCH_LEDGER]
    assert recovery_read_decision(neg, 3, 2) is ReadDecision.NOT_RECOVERABLE
    assert recovery_read_decision(neg[:1], 3, 2) is ReadDecision.PENDING
    # The seed-000 variant (AQ positives) is available and stricter.
    assert recovery_read_decision([StatusCode.OK], 3, 2, positives_needed=2) is ReadDecision.PENDING


def test_recovery_start_never_goes_below_the_last_segment():
    assert recovery_start(5, 20) == 19
    assert recovery_start(30, 20) == 30
    assert recovery_start(5, 20, below_last_segment=True) == 5


def bookies(n: int, racks: int = 0, read_only: tuple[int, ...] = ()) -> list[BookieInfo]:
    return [BookieInfo(f"b{i}", f"b{i}", f"/r{i % racks}" if racks else None, i in read_only)
            for i in range(n)]  # fmt: skip


@given(st.integers(0, 2**32))
def test_placement_is_deterministic_and_respects_exclusions(seed):
    policy = PlacementPolicy()
    pool = bookies(8, read_only=(3,))
    one = policy.new_ensemble(4, 3, pool, random.Random(seed), exclude=["b5"])
    two = policy.new_ensemble(4, 3, pool, random.Random(seed), exclude=["b5"])
    assert one == two and len(set(one)) == 4 and not {"b3", "b5"} & set(one)
    new = policy.replace_bookie(one, 1, 3, pool, random.Random(seed), exclude=[one[1]])
    assert new not in one and new != "b3"


def test_placement_errors_and_racks():
    with pytest.raises(NotEnoughBookiesError, match="need 3 writable bookies, have 2"):
        PlacementPolicy().new_ensemble(3, 2, bookies(3, read_only=(0,)), random.Random(1))
    rack_aware = PlacementPolicy(min_racks_per_write_quorum=2, strict=True)
    ensemble = rack_aware.new_ensemble(4, 2, bookies(8, racks=2), random.Random(7))
    racks = {b: f"/r{int(b[1:]) % 2}" for b in ensemble}
    assert all(len({racks[ensemble[i]] for i in write_set(f, 4, 2)}) == 2 for f in range(4))
    with pytest.raises(NotEnoughBookiesError, match="strict placement"):
        rack_aware.new_ensemble(3, 2, bookies(3, racks=1), random.Random(7))
    with pytest.raises(NotEnoughBookiesError):
        PlacementPolicy().replace_bookie(["b0", "b1", "b2"], 0, 2, bookies(3), random.Random(1))
