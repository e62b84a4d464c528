"""Property tests of what the rocksdb engine keeps in memory (engines/rocksdb_memory.py): the
parsed-batch cache stays within its bounds and finds what a plain model finds; the memtable
tracker never says a batch a flush may have written is still in memory, and always says so of
the batch just written."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from bookkeeper_aio.protocol import PACKED_ENTRY_PREFIX
from engines.rocksdb_keys import _Batch
from engines.rocksdb_memory import PARSED_COUNT_MAX, MemtableBatches, ParsedBatches

LEDGERS = st.integers(1, 4)


def batch(first: int, count: int, size: int) -> _Batch:
    parts = [PACKED_ENTRY_PREFIX.pack(i, size) + bytes(size) for i in range(first, first + count)]
    return _Batch(first + count - 1, b"".join(parts))


parsed_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("remember"), LEDGERS, st.integers(0, 40), st.integers(1, 8), st.integers(0, 300)
        ),
        st.tuples(st.just("drop"), LEDGERS),
        st.tuples(st.just("find"), LEDGERS, st.integers(0, 50)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(parsed_ops, st.integers(0, 4000))
def test_parsed_batches_stay_bounded_and_find_the_newest_covering_batch(
    ops: list[tuple], bytes_max: int
) -> None:
    cache = ParsedBatches(bytes_max)
    model: list[tuple[int, int, _Batch]] = []  # oldest first
    for op in ops:
        if op[0] == "remember":
            _, ledger_id, first, count, size = op
            b = batch(first, count, size)
            cache.remember(ledger_id, first, b)
            if len(b.value) <= bytes_max:
                model = [m for m in model if (m[0], m[1]) != (ledger_id, first)]
                model.append((ledger_id, first, b))
                while (
                    sum(len(m[2].value) for m in model) > bytes_max or len(model) > PARSED_COUNT_MAX
                ):
                    model.pop(0)
        elif op[0] == "drop":
            cache.drop_ledger(op[1])
            model = [m for m in model if m[0] != op[1]]
        else:
            _, ledger_id, entry_id = op
            covering = (b for lid, first, b in reversed(model)
                        if lid == ledger_id and first <= entry_id <= b.last)  # fmt: skip
            expected = next(covering, None)
            assert cache.find(ledger_id, entry_id) is expected
        assert cache.value_bytes == sum(len(m[2].value) for m in model) <= bytes_max
        assert len(cache) == len(model) <= PARSED_COUNT_MAX
        for ledger_id, first, b in model:
            assert cache.get(ledger_id, first) is b


@dataclass
class Written:
    ledger_id: int
    first: int
    last: int
    end: int  # put_bytes once it was written
    epoch: int  # the ledger's forget count when it was written


memtable_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 2), st.integers(1, 3), st.integers(1, 400)),
        st.tuples(st.just("flush")),
        st.tuples(st.just("forget"), st.integers(1, 2)),
        st.tuples(st.just("holds"), st.integers(1, 2), st.integers(0, 15)),
    ),
    max_size=100,
)


@settings(max_examples=300, deadline=None)
@given(memtable_ops, st.integers(1, 2000))
def test_memtable_batches_never_claim_a_flushed_batch(
    ops: list[tuple], memtable_bytes: int
) -> None:
    tracker = MemtableBatches(memtable_bytes)
    written: list[Written] = []
    next_id = {1: 0, 2: 0}  # a writer's batches: ascending, never overlapping
    epochs = {1: 0, 2: 0}
    flushed_at = 0
    for op in ops:
        if op[0] == "add":
            _, ledger_id, count, size = op
            first = next_id[ledger_id]
            next_id[ledger_id] += count
            tracker.added(ledger_id, first, first + count - 1, size)
            end = tracker.put_bytes
            written.append(Written(ledger_id, first, first + count - 1, end, epochs[ledger_id]))
            assert tracker.holds(ledger_id, first)  # the batch just written is in memory
            assert tracker.holds_batch(ledger_id, first)
        elif op[0] == "flush":
            flushed_at = tracker.put_bytes
            tracker.flushed(flushed_at)
        elif op[0] == "forget":
            tracker.forget_ledger(op[1])
            epochs[op[1]] += 1
        else:
            _, ledger_id, entry_id = op
            if not tracker.holds(ledger_id, entry_id):
                continue
            oldest = max(tracker.put_bytes - memtable_bytes, flushed_at)
            for w in written:  # the batch covering the id (none: absent, nothing to read)
                if w.ledger_id == ledger_id and w.first <= entry_id <= w.last:
                    assert w.end > oldest, "a batch a flush may have written counted in memory"
                    assert w.epoch == epochs[ledger_id], "a forgotten batch counted in memory"
