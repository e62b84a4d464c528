"""The Spark pipeline's pure parts: job and attempt records, the commit decision, slices of a
log, row values and chunks (property tests; no Spark, no cluster)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookkeeper_aio.errors import (
    IncorrectParameterError,
    MetadataFormatError,
    SparkInputError,
    SparkJobError,
)
from bookkeeper_aio.spark.model import (
    ATTEMPT_TRANSITIONS,
    JOB_TRANSITIONS,
    AttemptRecord,
    AttemptState,
    JobRecord,
    JobState,
    attempt_key,
    committed_by_membership,
    orphan_ledger,
    plan_abort,
    plan_commit,
)
from bookkeeper_aio.spark.rows import chunks, row_values
from bookkeeper_aio.spark.source import plan_slices

JOB = "20260101-000000-abcdef012345"


@st.composite
def attempt_sets(draw: st.DrawFn) -> dict[str, AttemptRecord]:
    """Attempts of one job: 1-6 partitions (maybe two stages), 1-3 copies each, any state,
    distinct ledgers."""
    ledger_ids = iter(range(1, 10_000))
    found = {}
    task = 0
    for stage in range(draw(st.integers(1, 2))):
        for partition in range(draw(st.integers(1, 6))):
            for number in range(draw(st.integers(1, 3))):
                state = draw(st.sampled_from(AttemptState))
                count = 0 if state is AttemptState.CREATING else draw(st.integers(0, 2))
                ledgers = tuple(next(ledger_ids) for _ in range(count))
                task += draw(st.integers(1, 5))
                record = AttemptRecord(
                    stage, partition, task, number, 0, state, ledgers,
                    rows=draw(st.integers(0, 100)), bytes=draw(st.integers(0, 1000)),
                )  # fmt: skip
                found[attempt_key(JOB, stage, partition, task)] = record
    return found


def done_per_slot(attempts: dict[str, AttemptRecord]) -> dict[tuple[int, int], list[str]]:
    found: dict[tuple[int, int], list[str]] = {}
    for key, record in sorted(attempts.items()):
        if record.state is AttemptState.DONE:
            found.setdefault(record.slot, []).append(key)
    return found


@given(attempt_sets(), st.randoms(), st.data())
def test_a_commit_appends_the_accepted_attempts_and_deletes_everything_else(attempts, rng, data):
    named = [data.draw(st.sampled_from(keys)) for keys in done_per_slot(attempts).values()]
    shuffled = list(attempts.items())
    rng.shuffle(shuffled)
    plan = plan_commit(dict(shuffled), list(reversed(named)))
    assert plan == plan_commit(attempts, named)  # the listing's order does not matter
    slots = [attempts[k].slot for k in plan.winners]
    assert slots == sorted(set(slots))  # one per partition, in stage and partition order
    assert set(plan.winners) == set(named)
    assert plan.append == tuple(i for k in plan.winners for i in attempts[k].ledgers)
    deleted = [i for k in plan.losers for i in attempts[k].ledgers]
    every = [i for r in attempts.values() for i in r.ledgers]
    assert sorted([*plan.append, *deleted]) == sorted(every)  # each ledger once, one side
    assert set(plan.winners) | set(plan.losers) == set(attempts)
    assert plan.tag_scan == any(attempts[k].state is AttemptState.CREATING for k in plan.losers)
    assert plan.rows == sum(attempts[k].rows for k in plan.winners)


@given(attempt_sets())
def test_a_commit_refuses_a_job_with_a_partition_missing(attempts):
    stages = {r.stage for r in attempts.values()}
    partitions = max(r.partition for r in attempts.values()) + 1
    per_stage = {
        s: {r.partition for r in attempts.values() if r.stage == s and r.state.value == "DONE"}
        for s in stages
    }  # every stage an attempt ran in must be whole
    whole = all(found == set(range(partitions)) for found in per_stage.values())
    named = [keys[0] for keys in done_per_slot(attempts).values()]
    if whole:
        plan = plan_commit(attempts, named, partitions=partitions)
        assert len(plan.winners) == partitions * len(stages)
    else:
        with pytest.raises(SparkJobError, match="finished attempts cover only"):
            plan_commit(attempts, named, partitions=partitions)


@given(attempt_sets(), st.data())
def test_a_commit_refuses_winners_that_are_not_one_finished_attempt_per_partition(attempts, data):
    by_slot = done_per_slot(attempts)
    named = [data.draw(st.sampled_from(keys)) for keys in by_slot.values()]
    not_done = [k for k, r in attempts.items() if r.state is not AttemptState.DONE]
    if not_done:
        with pytest.raises(SparkJobError, match="not DONE"):
            plan_commit(attempts, [*named, not_done[0]])
    with pytest.raises(SparkJobError, match="missing"):
        plan_commit(attempts, [*named, attempt_key(JOB, 9, 9, 99_999)])
    twins = [keys for keys in by_slot.values() if len(keys) > 1]
    if twins:
        with pytest.raises(SparkJobError, match="copy one partition"):
            plan_commit(attempts, twins[0][:2])


@given(attempt_sets())
def test_an_abort_deletes_every_ledger(attempts):
    plan = plan_abort(attempts)
    assert plan.winners == () and plan.append == ()
    assert set(plan.losers) == set(attempts)


@given(
    st.builds(
        JobRecord,
        job_id=st.from_regex(r"[A-Za-z0-9_.-]{1,40}", fullmatch=True),
        log=st.text(min_size=1, max_size=20),
        created_ms=st.integers(0, 2**50),
        ensemble_size=st.integers(3, 5),
        write_quorum=st.integers(1, 3),
        ack_quorum=st.integers(1, 1),
        partitions=st.none() | st.integers(0, 1000),
    ),
    st.lists(st.integers(1, 2**62), max_size=5, unique=True),
)
def test_job_records_survive_json_and_move_by_their_table(job, ledgers):
    assert JobRecord.from_json_bytes(job.to_json_bytes()) == job
    committing = job.sealed().committing(ledgers)
    assert JobRecord.from_json_bytes(committing.to_json_bytes()) == committing
    assert committing.aborting().state is JobState.ABORTING
    with pytest.raises(SparkJobError):
        committing.sealed()  # a committing job cannot go back
    with pytest.raises(SparkJobError):
        job.committing(ledgers)  # it must be sealed first


def test_every_move_outside_the_tables_is_refused():
    job = JobRecord(JOB, "orders", 0)
    for old in JobState:
        for new in JobState:
            moved = {
                JobState.SEALED: lambda j: j.sealed(),
                JobState.COMMITTING: lambda j: j.committing([1]),
                JobState.ABORTING: lambda j: j.aborting(),
            }.get(new)
            if moved is None:
                continue
            record = dataclasses.replace(
                job, state=old, ledgers=(1,) if old is JobState.COMMITTING else ()
            )
            allowed = (old, new) in JOB_TRANSITIONS or old is new is JobState.ABORTING
            if allowed:
                assert moved(record).state is new
            else:
                with pytest.raises(SparkJobError):
                    moved(record)
    attempt = AttemptRecord(0, 1, 2, 0, 0)
    moves = {
        AttemptState.WRITING: lambda r: r.writing(9),
        AttemptState.DONE: lambda r: r.done(1, 1),
        AttemptState.ABORTED: lambda r: r.aborted(),
    }
    for old in AttemptState:
        for new, move in moves.items():
            record = dataclasses.replace(attempt, state=old)
            again = old is new and new is not AttemptState.DONE  # another ledger; a tombstone
            if (old, new) in ATTEMPT_TRANSITIONS or again:
                assert move(record).state is new
            else:
                with pytest.raises(SparkJobError):
                    move(record)


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"format_version": 9}',
        b'{"format_version": 1, "stage": -1}',
    ],
)
def test_corrupt_records_are_format_errors(data):
    with pytest.raises(MetadataFormatError):
        AttemptRecord.from_json_bytes(data)
    with pytest.raises(MetadataFormatError):
        JobRecord.from_json_bytes(data)


def test_bad_ids_are_refused_before_the_store_is_touched():
    for bad in ("", "a/b", "x" * 200, "sp ace", 7):
        with pytest.raises(IncorrectParameterError):
            JobRecord(bad, "orders", 0)  # type: ignore[arg-type]
    with pytest.raises(IncorrectParameterError):
        attempt_key(JOB, 0, -1, 0)
    with pytest.raises(IncorrectParameterError):
        JobRecord(JOB, "orders", 0, query="q")  # a stream job needs its batch id too


@given(st.sets(st.integers(1, 20), min_size=1, max_size=6), st.data())
def test_membership_tells_a_landed_append_from_one_that_did_not_land(chosen, data):
    ledgers = sorted(chosen)
    # Landed: every chosen ledger in the log, or deleted by retention since.
    deleted = set(data.draw(st.lists(st.sampled_from(ledgers), max_size=len(ledgers))))
    assert committed_by_membership(ledgers, chosen - deleted, chosen - deleted) is True
    # Not landed: none in the log, all still there.
    assert committed_by_membership(ledgers, set(), set(chosen)) is False
    if len(ledgers) > 1:  # some in, some out and still there: contradictory
        assert committed_by_membership(ledgers, {ledgers[0]}, set(chosen)) is None


def test_orphans_are_old_ledgers_of_jobs_gone_and_not_in_their_log():
    tags = {"spark-job": b"j1"}
    assert orphan_ledger(tags, 0, 10_000, 5, set(), in_log=False)
    assert not orphan_ledger(tags, 0, 10_000, 5, set(), in_log=True)  # committed
    assert not orphan_ledger(tags, 0, 10_000, 5, {"j1"}, in_log=False)  # its job lives
    assert not orphan_ledger(tags, 9_000, 10_000, 5, set(), in_log=False)  # young
    assert not orphan_ledger({}, 0, 10_000, 5, set(), in_log=False)  # not a job's


@st.composite
def logs(draw: st.DrawFn) -> list[tuple[int, int, int]]:
    segments, offset = [], draw(st.integers(0, 50))
    for ledger_id in range(1, draw(st.integers(0, 6)) + 1):
        entries = draw(st.integers(0, 40))
        segments.append((ledger_id, offset, offset + entries - 1))
        offset += entries
    return segments


@given(logs(), st.integers(0, 300), st.none() | st.integers(0, 300), st.integers(1, 17))
def test_slices_cover_the_range_once_within_one_ledger_each(segments, low, high, entries_max):
    if high is not None and high < low - 1:
        with pytest.raises(IncorrectParameterError):
            plan_slices(segments, low, high, entries_max)
        return
    slices = plan_slices(segments, low, high, entries_max)
    covered = [o for s in slices for o in range(s.first_offset, s.last_offset + 1)]
    every = [o for _, first, last in segments for o in range(first, last + 1)]
    assert covered == [o for o in every if o >= low and (high is None or o <= high)]
    starts = {ledger_id: first for ledger_id, first, _ in segments}
    for piece in slices:
        assert 1 <= piece.last_entry - piece.first_entry + 1 <= entries_max
        assert piece.first_offset - starts[piece.ledger_id] == piece.first_entry
    assert len({s.ledger_id for s in slices}) == len(
        [1 for _, first, last in segments if any(first <= o <= last for o in covered)]
    )


class Row(tuple):
    """A stand-in for pyspark's Row: a tuple with ``__fields__``."""

    __fields__ = ("id", "value")


@settings(max_examples=50)
@given(
    st.lists(st.binary(max_size=30) | st.text(max_size=10) | st.none(), max_size=40),
    st.integers(1, 7),
    st.integers(1, 60),
)
def test_values_go_in_bounded_chunks_and_nulls_are_refused_or_skipped(values, rows_max, bytes_max):
    rows = [Row((i, v)) for i, v in enumerate(values)]
    kept = [v.encode() if isinstance(v, str) else v for v in values if v is not None]
    out = list(chunks(row_values(rows, 3, skip_nulls=True), rows_max, bytes_max))
    assert [v for chunk in out for v in chunk] == kept
    for chunk in out:
        assert len(chunk) <= rows_max
        assert len(chunk) == 1 or sum(map(len, chunk)) <= bytes_max
    if None in values:
        with pytest.raises(SparkInputError, match=f"partition 3, row {values.index(None)}:"):
            list(row_values(rows, 3, skip_nulls=False))


def test_rows_without_a_binary_or_string_value_are_refused_with_how_to_build_one():
    with pytest.raises(SparkInputError, match="to_json"):
        list(row_values([Row((1, 2.5))], 0, False))

    class Other(tuple):
        __fields__ = ("id",)

    with pytest.raises(SparkInputError, match=r"no 'value' field.*to_json"):
        list(row_values([Other((1,))], 0, False))
    assert list(row_values([b"raw", "text", {"value": b"d"}], 0, False)) == [b"raw", b"text", b"d"]
