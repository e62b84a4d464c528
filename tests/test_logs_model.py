"""The pure log model: transforms keep offsets dense and stable, JSON round-trips, bad
input is refused, and a stale epoch can change nothing (property tests)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookkeeper_aio.errors import (
    IncorrectParameterError,
    LogFencedError,
    MetadataFormatError,
    NoSuchLogError,
)
from bookkeeper_aio.logs.model import LogMetadata, LogSegment, SegmentState, new_log
from bookkeeper_aio.logs.options import LogOptions, check_name, cursor_key, log_key

OPTIONS = LogOptions(retention_bytes=1000, retention_s=60)


def fresh() -> LogMetadata:
    return new_log("orders", OPTIONS, "id1", ctime_ms=5)


class Ids:
    def __init__(self) -> None:
        self.next = 100

    def __call__(self) -> int:
        self.next += 1
        return self.next


def apply(md: LogMetadata, op: tuple, ids: Ids) -> LogMetadata:
    """One random operation, as a writer, a job or an admin would do it."""
    kind, a, b = op
    if kind == "takeover":
        md = md.taken_over(f"w{md.epoch + 1}")
        if md.open_segment is not None:
            md = md.with_last_closed(md.epoch, a, a * 10, closed_ms=b)
        return md.with_new_segment(md.epoch, ids())
    if kind == "append" and md.open_segment is not None:
        return md.rolled_over(md.epoch, a, None if b % 2 else a * 7, b, ids())
    if kind == "prepare":
        return md.with_prepared(md.epoch, ids())
    if kind == "close" and md.open_segment is not None:
        return md.closed_by_writer(md.epoch, a, a, b)
    if kind == "commit":
        md = md.taken_over("job")
        if md.open_segment is not None:
            md = md.with_last_closed(md.epoch, a, None, b)
        return md.with_ledgers_appended(md.epoch, [(ids(), a, None), (ids(), b % 5, 3)], b)
    if kind == "truncate":
        return md.truncated(a * 3)
    if kind == "retention":
        return md.without_front(md.retention_count(b * 1000))
    if kind == "empty-trash":
        return md.without_trash(md.trash[:a])
    return md


KINDS = ["takeover", "append", "prepare", "close", "commit", "truncate", "retention", "empty-trash"]
OPS = st.lists(
    st.tuples(
        st.sampled_from(KINDS),
        st.integers(0, 12),
        st.integers(0, 200),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_transforms_keep_offsets_dense_and_closed_segments_stable(ops: list[tuple]) -> None:
    ids, md = Ids(), fresh()
    seen: dict[int, tuple[int, int]] = {}  # closed ledger -> (first offset, entries)
    for op in ops:
        new = apply(md, op, ids)
        assert LogMetadata.from_json_bytes(new.to_json_bytes()) == new
        assert new.epoch >= md.epoch and new.start_offset >= md.start_offset
        if md.open_segment is not None and md.open_segment.ledger_id not in new.ledger_ids:
            pytest.fail(f"{op} removed the open segment")
        for segment in new.segments:
            if not segment.is_open:
                fixed = (segment.first_offset, segment.entries)
                assert seen.setdefault(segment.ledger_id, fixed) == fixed, "a closed segment moved"
        removed = set(md.ledger_ids) - set(new.ledger_ids)
        assert removed <= set(new.trash) | (set(md.trash) - set(new.trash)), "a ledger was lost"
        md = new
        _check_lookup(md)


def _check_lookup(md: LogMetadata) -> None:
    end = md.end_offset if md.end_offset is not None else md.segments[-1].first_offset + 5
    for offset in range(max(0, md.start_offset - 2), end + 2):
        found = md.locate(offset)
        owners = [
            s for s in md.segments
            if s.first_offset <= offset and (s.is_open or offset < s.end_offset)
        ]  # fmt: skip
        if not owners:
            assert found is None, (offset, md)
        else:
            assert found == (owners[0].ledger_id, offset - owners[0].first_offset)


@settings(max_examples=100, deadline=None)
@given(OPS, st.sampled_from(["rolled", "prepared", "closed", "appended", "new"]))
def test_a_stale_epoch_changes_nothing(ops: list[tuple], what: str) -> None:
    ids, md = Ids(), fresh()
    for op in ops:
        md = apply(md, op, ids)
    stale = md.epoch
    md = md.taken_over("newer")
    with pytest.raises(LogFencedError):
        if what == "rolled":
            md.rolled_over(stale, 1, 1, 0, ids())
        elif what == "prepared":
            md.with_prepared(stale, ids())
        elif what == "closed":
            md.closed_by_writer(stale, 1, 1, 0)
        elif what == "appended":
            md.with_ledgers_appended(stale, [(ids(), 1, 1)], 0)
        else:
            md.with_new_segment(stale, ids())


def test_a_takeover_trashes_the_previous_writers_prepared_ledger() -> None:
    md = fresh().taken_over("w1").with_new_segment(1, 7).with_prepared(1, 8)
    md = md.taken_over("w2")
    assert md.prepared_ledger_id is None and md.trash == (8,)
    assert md.rolled_over(2, 3, 30, 1, 9).segments[-1] == LogSegment(9, 3)


def test_retention_never_removes_the_last_segment_and_counts_bytes_and_age() -> None:
    md = fresh().taken_over("w").with_new_segment(1, 1)
    for ledger_id, closed_ms in ((2, 1_000), (3, 2_000), (4, 100_000)):
        md = md.rolled_over(1, 10, 400, closed_ms, ledger_id)
    md = md.closed_by_writer(1, 10, 400, 200_000)  # 4 segments of 400 bytes
    assert md.retention_count(now_ms=0) == 2  # 1600 bytes > 1000: keep the newest 2
    assert md.retention_count(now_ms=10**9) == 3  # everything is old: never the last one
    only_age = dataclasses.replace(md, options=LogOptions(retention_s=60))
    assert only_age.retention_count(now_ms=62_500) == 2  # closed at 1 s and 2 s
    assert only_age.without_front(2).start_offset == 20


def test_truncation_keeps_a_segment_that_holds_the_offset() -> None:
    md = fresh().taken_over("w").with_new_segment(1, 1).rolled_over(1, 10, 1, 0, 2)
    md = md.rolled_over(1, 10, 1, 0, 3)  # [0,10) [10,20) open at 20
    assert md.truncated(15).start_offset == 10
    assert md.truncated(10**6).start_offset == 20  # never the open segment
    assert md.truncated(10**6).trash == (1, 2)
    closed = md.closed_by_writer(1, 5, 5, 0).truncated(10**6)
    assert closed.segments == () and closed.start_offset == 25 and closed.end_offset == 25


def test_a_deleted_log_refuses_writers() -> None:
    md = fresh().taken_over("w").with_new_segment(1, 1).with_prepared(1, 2).marked_deleting()
    assert md.trash == (1, 2) and md.deleting
    with pytest.raises(NoSuchLogError):
        md.taken_over("x")


@pytest.mark.parametrize(
    ("name", "why"),
    [("", "non-empty"), ("a/b", "'/'"), ("x" * 256, "at most 255"), ("a b", "no spaces"),
     ("tab\t", "no spaces"), (7, "non-empty string"), ("\udc80", "UTF-8")],
)  # fmt: skip
def test_invalid_names_are_refused_clearly(name: object, why: str) -> None:
    with pytest.raises(IncorrectParameterError, match=why):
        check_name(name)


def test_names_and_keys() -> None:
    assert check_name("é" * 127) == "é" * 127  # 254 bytes
    assert log_key("a") == "logs/a" and cursor_key("a", "g") == "logs/a/cursors/g"


@pytest.mark.parametrize(
    "changes",
    [{"ensemble_size": 2}, {"segment_bytes_max": 0}, {"segment_age_s": float("nan")},
     {"retention_s": float("inf")}, {"retention_bytes": -1}, {"segment_entries_max": 1.5},
     {"segment_bytes_max": True}],
)  # fmt: skip
def test_invalid_options_are_refused(changes: dict) -> None:
    with pytest.raises(IncorrectParameterError):
        LogOptions(**changes)


def test_malformed_metadata_is_refused() -> None:
    good = fresh().taken_over("w").with_new_segment(1, 9)
    doc = good.to_json_bytes()
    for bad in (b"{}", b"not json", doc.replace(b'"first_offset": 0', b'"first_offset": 3'),
                doc.replace(b'"format_version": 1', b'"format_version": 9')):  # fmt: skip
        with pytest.raises(MetadataFormatError):
            LogMetadata.from_json_bytes(bad)
    with pytest.raises(IncorrectParameterError, match="only the last"):
        LogMetadata("x", "i", OPTIONS, segments=(LogSegment(1, 0), LogSegment(2, 0)))
    with pytest.raises(IncorrectParameterError, match="end"):
        LogSegment(1, 0, SegmentState.CLOSED)
