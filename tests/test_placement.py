"""Placement: eligibility, determinism, rack spread (checked against brute force), errors."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookkeeper_aio.client.placement import (
    DEFAULT_RACK,
    BookieCandidate,
    PlacementPolicy,
    write_set_rack_spread,
)
from bookkeeper_aio.errors import ConfigError, NotEnoughBookiesError
from bookkeeper_aio.metadata import BookieInfo


def bookies(n: int, racks: int = 0, read_only: tuple[int, ...] = ()) -> list[BookieCandidate]:
    """b0..b{n-1}, on racks /r{i % racks} (no rack if racks == 0)."""
    return [
        BookieCandidate(f"b{i}", f"/r{i % racks}" if racks else None, i in read_only)
        for i in range(n)
    ]


def spread(ensemble, candidates, write_quorum: int) -> int:
    racks = {c.bookie_id: c.rack for c in candidates}
    return write_set_rack_spread([racks[b] for b in ensemble], write_quorum)


def best_possible_spread(racks: list[str], ensemble_size: int, write_quorum: int) -> int:
    """Brute force over every ensemble of the pool."""
    return max(
        write_set_rack_spread([racks[i] for i in order], write_quorum)
        for order in itertools.permutations(range(len(racks)), ensemble_size)
    )


@st.composite
def layouts(draw):
    """A small pool with a random rack layout, and E, WQ, R for it."""
    racks = draw(st.lists(st.sampled_from(["/a", "/b", "/c", "/d", None]), min_size=1, max_size=7))
    e = draw(st.integers(1, len(racks)))
    w = draw(st.integers(1, e))
    r = draw(st.integers(2, 4))
    pool = [BookieCandidate(f"b{i}", rack) for i, rack in enumerate(racks)]
    return pool, e, w, r


POLICIES = [PlacementPolicy(), PlacementPolicy(2), PlacementPolicy(2, strict=True)]


@given(st.integers(0, 2**32), st.sampled_from(POLICIES))
def test_placement_is_deterministic_per_seed_and_respects_eligibility(seed, policy):
    pool = bookies(9, racks=3, read_only=(3,))
    one = policy.new_ensemble(5, 3, pool, random.Random(seed), exclude=["b5"])
    assert one == policy.new_ensemble(5, 3, list(reversed(pool)), random.Random(seed), ["b5"])
    assert len(set(one)) == 5 and not {"b3", "b5"} & set(one)
    new = policy.replace_bookie(one, 1, 3, pool, random.Random(seed), exclude=["b7"])
    assert new == policy.replace_bookie(one, 1, 3, pool, random.Random(seed), exclude=["b7"])
    assert new not in one and new not in ("b3", "b7")


@given(
    st.integers(0, 2**32), st.integers(0, 5), st.sampled_from([0, 2, 3]), st.sampled_from(POLICIES)
)
def test_replace_never_picks_an_ensemble_member(seed, index, racks, policy):
    if policy.strict and not racks:
        racks = 2  # strict placement never uses bookies without a rack
    pool = bookies(12, racks=racks, read_only=(7,))
    ensemble = policy.new_ensemble(6, 3, pool, random.Random(seed))
    new = policy.replace_bookie(ensemble, index, 3, pool, random.Random(seed))
    assert new not in ensemble and new != "b7" and new in {c.bookie_id for c in pool}


@settings(max_examples=300, deadline=None)
@given(layouts(), st.integers(0, 2**16))
def test_rack_aware_ensembles_reach_the_target_whenever_any_ensemble_can(layout, seed):
    pool, e, w, r = layout
    policy = PlacementPolicy(r)
    target = policy.target_racks(w)
    best = best_possible_spread([c.rack or DEFAULT_RACK for c in pool], e, w)
    ensemble = policy.new_ensemble(e, w, pool, random.Random(seed))
    assert len(set(ensemble)) == e
    assert spread(ensemble, pool, w) >= min(target, best)
    strict = PlacementPolicy(r, strict=True)
    racked = [c for c in pool if c.rack]
    if len(racked) >= e and best_possible_spread([c.rack for c in racked], e, w) >= target:
        assert spread(strict.new_ensemble(e, w, pool, random.Random(seed)), pool, w) >= target
    elif len(racked) >= e:
        with pytest.raises(NotEnoughBookiesError, match="strict placement"):
            strict.new_ensemble(e, w, pool, random.Random(seed))


@settings(deadline=None)
@given(layouts(), st.integers(0, 2**16), st.data())
def test_replacement_keeps_the_spread_whenever_a_candidate_can(layout, seed, data):
    pool, e, w, r = layout
    if len(pool) == e:
        pool = [*pool, BookieCandidate("extra", data.draw(st.sampled_from(["/a", "/e", None])))]
    policy = PlacementPolicy(r)
    ensemble = list(policy.new_ensemble(e, w, pool, random.Random(seed)))
    index = data.draw(st.integers(0, e - 1))
    new = policy.replace_bookie(ensemble, index, w, pool, random.Random(seed))
    assert new not in ensemble
    best = max(
        spread([*ensemble[:index], c.bookie_id, *ensemble[index + 1 :]], pool, w)
        for c in pool
        if c.bookie_id not in ensemble
    )
    assert spread([*ensemble[:index], new, *ensemble[index + 1 :]], pool, w) == best


def test_rack_aware_examples():
    pool = bookies(8, racks=2)
    ensemble = PlacementPolicy(2, strict=True).new_ensemble(8, 2, pool, random.Random(7))
    assert spread(ensemble, pool, 2) == 2  # alternating racks, including the wrap-around
    # Five bookies on one rack, one each on two more: E=6, WQ=3 can still spread 2 racks.
    skewed = [BookieCandidate(f"b{i}", "/big") for i in range(5)]
    skewed += [BookieCandidate("x", "/x"), BookieCandidate("y", "/y")]
    assert spread(PlacementPolicy(3).new_ensemble(6, 3, skewed, random.Random(1)), skewed, 3) == 2
    # Best effort without strict: one rack only is still an ensemble.
    one_rack = bookies(3, racks=1)
    assert len(PlacementPolicy(2).new_ensemble(3, 2, one_rack, random.Random(1))) == 3
    with pytest.raises(NotEnoughBookiesError, match="strict placement: no ensemble of 3"):
        PlacementPolicy(2, strict=True).new_ensemble(3, 2, one_rack, random.Random(1))


def test_strict_placement_ignores_bookies_without_a_rack_and_replacement_is_rack_aware():
    pool = [*bookies(4, racks=2), BookieCandidate("norack")]
    strict = PlacementPolicy(2, strict=True)
    for seed in range(20):
        assert "norack" not in strict.new_ensemble(4, 2, pool, random.Random(seed))
    with pytest.raises(NotEnoughBookiesError, match=r"1 without a rack \(strict placement\)"):
        strict.new_ensemble(5, 2, pool, random.Random(1))
    assert len(PlacementPolicy(2).new_ensemble(5, 2, pool, random.Random(1))) == 5
    # Replacing b0 (/r0) between two /r1 bookies must pick /r0: only b4 qualifies.
    pool = [*bookies(4, racks=2), BookieCandidate("b4", "/r0"), BookieCandidate("b5", "/r1")]
    assert strict.replace_bookie(["b0", "b1", "b2", "b3"], 0, 2, pool, random.Random(3)) == "b4"
    with pytest.raises(NotEnoughBookiesError, match="strict placement: no replacement for b0"):
        strict.replace_bookie(["b0", "b1", "b2", "b3"], 0, 2, pool, random.Random(3), ["b4"])
    # Not strict: settles for b5.
    ensemble = ["b0", "b1", "b2", "b3"]
    assert PlacementPolicy(2).replace_bookie(ensemble, 0, 2, pool, random.Random(3), ["b4"]) == "b5"


def test_not_enough_bookies_says_what_was_needed_and_where_the_candidates_went():
    pool = bookies(5, read_only=(0, 1))
    with pytest.raises(NotEnoughBookiesError) as err:
        PlacementPolicy().new_ensemble(3, 2, pool, random.Random(1), exclude=["b2", "zz"])
    assert str(err.value) == (
        "need 3 writable bookies but 2 eligible: 5 registered, 2 read-only, 1 excluded"
    )
    assert err.value.code == -6
    with pytest.raises(NotEnoughBookiesError, match="need 1 writable bookie outside the ensemble"):
        PlacementPolicy().replace_bookie(["b0", "b1", "b2"], 0, 2, bookies(3), random.Random(1))


def test_metadata_bookie_info_is_a_candidate_and_bad_config_is_refused():
    infos = [BookieInfo(f"b{i}", f"127.0.0.1:{3181 + i}", f"/r{i % 2}", False) for i in range(4)]
    ensemble = PlacementPolicy(2, strict=True).new_ensemble(4, 2, infos, random.Random(5))
    assert write_set_rack_spread([infos[int(b[1:])].rack for b in ensemble], 2) == 2
    with pytest.raises(ConfigError):
        PlacementPolicy(0)
    with pytest.raises(ConfigError):
        PlacementPolicy(2, search_steps_max=0)
