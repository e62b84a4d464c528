"""The pure ledger metadata model: validation, the transition table, segments, JSON."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bookkeeper_aio.errors import (
    IllegalLedgerTransitionError,
    IncorrectParameterError,
    MetadataFormatError,
)
from bookkeeper_aio.metadata.model import (
    MAX_LEDGER_ID,
    TRANSITIONS,
    LedgerMetadata,
    LedgerState,
    check_transition,
    password_hash,
    time_ordered_ledger_id,
)

ENSEMBLE = ("b1:1", "b2:2", "b3:3")
OPEN, IN_RECOVERY, CLOSED = LedgerState.OPEN, LedgerState.IN_RECOVERY, LedgerState.CLOSED


def ledger(**changes) -> LedgerMetadata:
    fields = {"ledger_id": 7, "ensemble_size": 3, "write_quorum": 3, "ack_quorum": 2,
              "ensembles": ((0, ENSEMBLE),)}  # fmt: skip
    return LedgerMetadata(**{**fields, **changes})


@given(st.integers(-1, 5), st.integers(-1, 5), st.integers(-1, 5))
def test_quorum_sizes_are_validated(e, w, a):
    ensemble = tuple(f"b{i}" for i in range(max(e, 0)))
    if e >= w >= a >= 1:
        assert ledger(ensemble_size=e, write_quorum=w, ack_quorum=a,
                      ensembles=((0, ensemble),)).ack_quorum == a  # fmt: skip
    else:
        with pytest.raises(IncorrectParameterError):
            ledger(ensemble_size=e, write_quorum=w, ack_quorum=a, ensembles=((0, ensemble),))


@pytest.mark.parametrize(
    "bad",
    [
        {"ensembles": ((0, ("a", "a", "b")),)},  # a bookie twice
        {"ensembles": ((0, ("a", "b")),)},  # fewer than E
        {"ensembles": ((1, ENSEMBLE),)},  # does not start at entry 0
        {"ensembles": ((0, ENSEMBLE), (5, ENSEMBLE), (3, ENSEMBLE))},  # out of order
        {"ensembles": ()},
        {"ensembles": ((0, ("a", "", "b")),)},
        {"ledger_id": -1},
        {"ledger_id": MAX_LEDGER_ID + 1},
        {"ensemble_size": True},
        {"last_entry_id": -2},
        {"custom_metadata": {"k": "not bytes"}},
    ],
)
def test_malformed_metadata_is_refused(bad):
    with pytest.raises(IncorrectParameterError):
        ledger(**bad)


def test_transition_table_is_exactly_the_protocol():
    allowed = {(OPEN, OPEN), (OPEN, IN_RECOVERY), (OPEN, CLOSED),
               (IN_RECOVERY, IN_RECOVERY), (IN_RECOVERY, CLOSED)}  # fmt: skip
    assert allowed == TRANSITIONS
    for old in LedgerState:
        for new in LedgerState:
            if (old, new) in allowed:
                check_transition(1, old, new)
            else:
                with pytest.raises(IllegalLedgerTransitionError, match=f"{old.value} -> "):
                    check_transition(1, old, new)


def test_segments_and_closing():
    md = ledger()
    changed = md.with_ensemble_change(10, ("b1:1", "b4:4", "b3:3"))
    assert changed.ensemble_at(9) == ENSEMBLE and changed.ensemble_at(10)[1] == "b4:4"
    assert changed.last_ensemble() == (10, ("b1:1", "b4:4", "b3:3"))
    replaced = changed.with_ensemble_change(10, ("b1:1", "b5:5", "b3:3"))
    assert len(replaced.ensembles) == 2 and replaced.ensemble_at(10)[1] == "b5:5"
    assert replaced.bookies() == ["b1:1", "b2:2", "b3:3", "b5:5"]
    with pytest.raises(IncorrectParameterError):
        replaced.with_ensemble_change(5, ENSEMBLE)
    closed = replaced.in_recovery().closed(9, 100)
    assert closed.is_closed and closed.last_entry_id == 9 and closed.length == 100
    assert closed.ensembles == ((0, ENSEMBLE),)  # the segment from 10 was never used
    assert md.closed(-1, 0).ensembles == md.ensembles  # an empty ledger keeps its first segment
    for illegal in (closed.in_recovery, lambda: closed.closed(9, 100),
                    lambda: closed.with_ensemble_change(10, ENSEMBLE)):  # fmt: skip
        with pytest.raises(IllegalLedgerTransitionError):
            illegal()


OPS = st.one_of(
    st.tuples(st.just("change"), st.integers(0, 20), st.integers(0, 2)),
    st.tuples(st.just("recover")),
    st.tuples(st.just("close"), st.integers(-1, 40)),
)


@given(st.lists(OPS, max_size=12))
def test_any_sequence_of_changes_follows_the_table(ops):
    md, fresh = ledger(), iter(range(100, 1000))
    for op in ops:
        before = md
        target = {"change": md.state, "recover": IN_RECOVERY, "close": CLOSED}[op[0]]
        legal = (md.state, target) in TRANSITIONS
        try:
            if op[0] == "change":
                first = md.last_ensemble()[0] + op[1]
                new = list(md.last_ensemble()[1])
                new[op[2]] = f"b{next(fresh)}:1"
                md = md.with_ensemble_change(first, tuple(new))
            elif op[0] == "recover":
                md = md.in_recovery()
            else:
                md = md.closed(op[1], 10)
        except IllegalLedgerTransitionError:
            assert not legal and md is before
            continue
        assert legal and md.state is target
        firsts = [f for f, _ in md.ensembles]
        assert firsts[0] == 0 and firsts == sorted(set(firsts))
        assert LedgerMetadata.from_json_bytes(md.to_json_bytes()) == md


@given(
    st.integers(0, MAX_LEDGER_ID),
    st.dictionaries(st.text(max_size=8), st.binary(max_size=16), max_size=4),
    st.sampled_from(list(LedgerState)),
    st.integers(-1, 10**12),
    st.text(max_size=40),
)
def test_json_round_trip(ledger_id, custom, state, last, token):
    md = LedgerMetadata(ledger_id, 3, 2, 1, ((0, ENSEMBLE), (5, ("x", "y", "z"))), state=state,
                        last_entry_id=last, length=last + 1, custom_metadata=custom,
                        creator_token=token, password_hash=password_hash(b"pw"),
                        ctime_ms=1_700_000_000_000)  # fmt: skip
    data = md.to_json_bytes()
    assert LedgerMetadata.from_json_bytes(data) == md
    doc = json.loads(data)  # readable: what etcdctl shows
    assert doc["state"] == state.value and doc["ensembles"][1]["bookies"] == ["x", "y", "z"]


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: b"not json",
        lambda d: json.dumps({**d, "format_version": 99}).encode(),
        lambda d: json.dumps({k: v for k, v in d.items() if k != "ensembles"}).encode(),
        lambda d: json.dumps({**d, "state": "HALF_OPEN"}).encode(),
        lambda d: json.dumps({**d, "custom_metadata": {"k": "!!"}}).encode(),
        lambda d: json.dumps({**d, "write_quorum": 9}).encode(),
        lambda d: json.dumps({**d, "surprise": 1}).encode(),
        lambda d: json.dumps([d]).encode(),
    ],
)
def test_corrupt_json_is_a_clear_error(mutate):
    doc = json.loads(ledger(custom_metadata={"k": b"v"}).to_json_bytes())
    with pytest.raises(MetadataFormatError, match="metadata") as raised:
        LedgerMetadata.from_json_bytes(mutate(doc))
    assert isinstance(raised.value, ValueError) and raised.value.code == -107


def test_password_hash_is_stable_and_distinguishes():
    assert password_hash(b"a") == password_hash(b"a") != password_hash(b"b")
    assert len(password_hash(b"")) == 64


def test_guaranteed_write_quorum_is_kept_and_absent_by_default():
    plain = ledger()
    assert b"guaranteed_write_quorum" not in plain.to_json_bytes()  # older ledgers' bytes
    assert LedgerMetadata.from_json_bytes(plain.to_json_bytes()).guaranteed_write_quorum is False
    gwq = ledger(guaranteed_write_quorum=True)
    again = LedgerMetadata.from_json_bytes(gwq.to_json_bytes())
    assert again == gwq and again.guaranteed_write_quorum is True
    # Every transform keeps it (a recovery's close must still write back to WQ).
    assert (
        gwq.with_ensemble_change(5, ("b4:4", "b2:2", "b3:3"))
        .in_recovery()
        .closed(7, -1)
        .guaranteed_write_quorum
    )
    with pytest.raises(IncorrectParameterError):
        ledger(guaranteed_write_quorum=1)


@given(st.integers(0, 2**45), st.integers(0, 2**45), st.integers(0, 2**32))
def test_time_ordered_ledger_ids_are_valid_and_grow_with_the_milliseconds(a, b, seed):
    import random

    first = time_ordered_ledger_id(a, random.Random(seed))
    second = time_ordered_ledger_id(b, random.Random(seed + 1))
    assert 1 <= first <= MAX_LEDGER_ID and 1 <= second <= MAX_LEDGER_ID
    epoch = 1_735_689_600_000
    if epoch <= a < b <= epoch + (MAX_LEDGER_ID >> 22):  # 2025 to 2094: ordered
        assert first < second
