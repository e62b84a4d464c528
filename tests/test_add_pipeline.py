"""The pure add pipeline (client/add_pipeline.py) against a simple model, as the AckSet tests.

The model keeps, per entry, the set of ensemble indexes holding it, and derives everything
the pipeline decides from that: acknowledged = the longest prefix at AQ (sticky), released =
the longest acknowledged prefix at WQ (guaranteed write quorum) or the acknowledged prefix,
pinned = the holders of acknowledged entries below WQ, the new segment's start, what an
ensemble change re-sends. Random events (push, ack, fail, begin and commit a change) drive
both; after each, they must agree, and no acknowledged entry may ever drop below AQ holders
(the point of pinning).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bookkeeper_aio.client.add_pipeline import AddPipeline, PendingAdd
from bookkeeper_aio.quorum import write_set

QUORUMS = st.sampled_from([(3, 3, 2), (3, 2, 2), (4, 3, 2), (5, 3, 2), (3, 3, 3), (5, 5, 3)])
EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["push", "ack", "ack", "ack", "batch", "fail", "begin", "commit"]),
        st.integers(0, 63),
        st.integers(0, 7),
    ),
    max_size=120,
)


class Model:
    def __init__(self, e: int, wq: int, aq: int, gwq: bool) -> None:
        self.e, self.wq, self.aq, self.gwq = e, wq, aq, gwq
        self.holders: list[set[int]] = []
        self.sizes: list[int] = []
        self.acknowledged = 0  # entries 0 .. acknowledged - 1
        self.released = 0
        self.failed: set[int] = set()
        self.changing: set[int] = set()

    def ws(self, entry_id: int) -> tuple[int, ...]:
        return write_set(entry_id, self.e, self.wq)

    def complete(self) -> list[int]:
        if self.changing:
            return []
        done = []
        while self.acknowledged < len(self.holders) and (
            len(self.holders[self.acknowledged]) >= self.aq
        ):
            done.append(self.acknowledged)
            self.acknowledged += 1
        if not self.gwq:
            self.released = self.acknowledged
        else:
            while self.released < self.acknowledged and len(self.holders[self.released]) == self.wq:
                self.released += 1
        return done

    def pinned(self) -> set[int]:
        if not self.gwq:
            return set()
        return {
            i
            for k in range(self.released, self.acknowledged)
            if len(self.holders[k]) < self.wq
            for i in self.holders[k]
        }

    def replaceable(self) -> list[int]:
        """Failed, not pinned; with GWQ taken in index order only while every acknowledged,
        unreleased entry keeps AQ holders outside those taken (the new segment takes it)."""
        candidates = sorted(self.failed - self.pinned())
        if not self.gwq:
            return candidates
        chosen: list[int] = []
        for i in candidates:
            gone = {*chosen, i}
            unreleased = range(self.released, self.acknowledged)
            if all(len(self.holders[k] - gone) >= self.aq for k in unreleased):
                chosen.append(i)
        return chosen


def check(pipe: AddPipeline, model: Model) -> None:
    assert pipe.last_add_pushed == len(model.holders) - 1
    assert pipe.last_add_confirmed == model.acknowledged - 1
    lafr = model.released - 1 if model.gwq else -1
    assert pipe.last_add_fully_replicated == lafr
    assert pipe.pending_count == len(model.holders) - model.released
    assert pipe.pending_bytes == sum(model.sizes[model.released :])
    assert pipe.length == sum(model.sizes[: model.acknowledged])
    assert pipe.pinned() == model.pinned()
    start = model.released if model.gwq else model.acknowledged
    assert pipe.segment_start == start
    assert pipe.drained == (model.released == len(model.holders))
    for op in (*pipe.unreleased, *pipe.unacked):
        assert op.acked == model.holders[op.entry_id]
    # Pinning: an acknowledged entry never loses its ack quorum while the writer holds it.
    for k in range(model.released, model.acknowledged):
        assert len(model.holders[k]) >= model.aq, (k, model.holders[k])


@settings(max_examples=300, deadline=None)
@given(QUORUMS, st.booleans(), EVENTS)
def test_the_pipeline_matches_the_model(q, gwq, events):
    e, wq, aq = q
    pipe = AddPipeline(e, wq, aq, guaranteed_write_quorum=gwq)
    model = Model(e, wq, aq, gwq)
    ops: list[PendingAdd] = []
    for kind, n, index in events:
        index %= e
        if kind == "push":
            entry_id = len(ops)
            op = PendingAdd(entry_id, pipe.last_add_confirmed, b"x" * (n % 5), 0, b"",
                            write_set(entry_id, e, wq), aq, None, None, gwq)  # fmt: skip
            pipe.push(op)
            ops.append(op)
            model.holders.append(set())
            model.sizes.append(n % 5)
        elif kind in ("ack", "batch") and ops:
            chosen = [ops[n % len(ops)]] if kind == "ack" else ops[n % len(ops) :]
            pending = set(range(model.released, len(ops)))
            more = pipe.ack(chosen[0], index) if kind == "ack" else pipe.acked(chosen, index)
            for op in chosen:  # the model: acks of released entries change nothing
                if op.entry_id in pending and index in model.ws(op.entry_id):
                    model.holders[op.entry_id].add(index)
            told = pipe.complete()
            assert [op.entry_id for op in told] == model.complete()
            assert more or not told
            for op in told:
                op.done = True  # the driver tells the caller
        elif kind == "fail":
            pipe.fail_bookie(index, f"b{index}")
            model.failed.add(index)
        elif kind == "begin" and not model.changing:
            chosen_now = pipe.begin_change()
            expected = model.replaceable()
            assert sorted(chosen_now) == expected
            model.changing = set(expected)
            assert pipe.complete() == [] or not model.changing
        elif kind == "commit" and model.changing:
            resend = pipe.replaced(model.changing)
            expected: dict[int, list[int]] = {}
            for k in range(model.released, len(ops)):
                for i in model.ws(k):
                    if i in model.changing:
                        model.holders[k].discard(i)
                        expected.setdefault(i, []).append(k)
            assert {i: [op.entry_id for op in v] for i, v in resend.items()} == expected
            model.failed -= model.changing
            model.changing = set()
            told = pipe.complete()
            assert [op.entry_id for op in told] == model.complete()
            for op in told:
                op.done = True
        check(pipe, model)


def test_guaranteed_write_quorum_acknowledges_at_aq_and_releases_at_wq():
    pipe = AddPipeline(3, 3, 2, guaranteed_write_quorum=True)
    ops = [PendingAdd(k, k - 1, b"ab", 0, b"", (0, 1, 2), 2, None, None, True) for k in range(2)]
    for op in ops:
        pipe.push(op)
    pipe.acked(ops, 0)
    pipe.acked(ops, 1)
    assert [op.entry_id for op in pipe.complete()] == [0, 1]
    assert (pipe.last_add_confirmed, pipe.last_add_fully_replicated) == (1, -1)
    assert pipe.pending_count == 2 and pipe.pending_bytes == 4 and not pipe.drained
    assert pipe.pinned() == {0, 1} and pipe.segment_start == 0
    pipe.fail_bookie(1, "b1")  # a pinned bookie waits ...
    assert pipe.begin_change() == {}
    pipe.fail_bookie(2, "b2")  # ... a missing one goes, carrying both acknowledged entries
    assert pipe.begin_change() == {2: "b2"}
    assert pipe.replaced([2]) == {2: ops}
    pipe.acked(ops, 2)  # the replacement stores them
    assert pipe.complete() == [] and pipe.drained and pipe.last_add_fully_replicated == 1
    assert pipe.pinned() == frozenset() and pipe.begin_change() == {1: "b1"}


def test_without_the_option_an_add_leaves_at_aq_and_nothing_is_pinned():
    pipe = AddPipeline(3, 3, 2)
    op = PendingAdd(0, -1, b"ab", 0, b"", (0, 1, 2), 2, None, None)
    pipe.push(op)
    pipe.acked([op], 0)
    pipe.acked([op], 1)
    assert [o.entry_id for o in pipe.complete()] == [0]
    assert pipe.drained and pipe.pinned() == frozenset() and pipe.segment_start == 1
    assert pipe.last_add_fully_replicated == -1 and pipe.pending_bytes == 0


def test_without_pinning_a_change_may_replace_a_holder_of_an_acknowledged_entry():
    """The simulator's gwq-no-pinning switch: what pinning prevents."""
    pipe = AddPipeline(3, 3, 2, guaranteed_write_quorum=True, pinning=False)
    op = PendingAdd(0, -1, b"ab", 0, b"", (0, 1, 2), 2, None, None, True)
    pipe.push(op)
    pipe.acked([op], 0)
    pipe.acked([op], 1)
    assert pipe.complete() == [op]
    pipe.fail_bookie(1, "b1")
    assert pipe.begin_change() == {1: "b1"}
    pipe.replaced([1])
    assert op.acked == {0}  # acknowledged, and now on one bookie of its ensemble: below AQ


def test_a_change_keeps_aq_holders_of_acknowledged_entries_it_carries():
    """Sim seed 66: E4/WQ3/AQ2 with guaranteed write quorum, entry 0 below WQ (index 0 never
    stored it) and entries 1-4 at WQ behind it, so the new segment starts at 0 and takes them
    all. Replacing the failed members 0 and 3 together would leave entry 2 on index 2 alone;
    only 0 goes now, 3 once the replacement holds copies."""
    pipe = AddPipeline(4, 3, 2, guaranteed_write_quorum=True)
    ops = [PendingAdd(k, k - 1, b"x", 0, b"", write_set(k, 4, 3), 2, None, None, True)
           for k in range(5)]  # fmt: skip
    for op in ops:
        pipe.push(op)
    for k, holders in enumerate([(1, 2), (1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2)]):
        for index in holders:
            pipe.ack(ops[k], index)
    assert [op.entry_id for op in pipe.complete()] == [0, 1, 2, 3, 4]
    assert pipe.last_add_fully_replicated == -1 and pipe.pinned() == {1, 2}
    for index in (1, 3, 0):
        pipe.fail_bookie(index, f"b{index}")
    assert pipe.begin_change() == {0: "b0"}
    resend = pipe.replaced([0])
    assert [op.entry_id for op in resend[0]] == [0, 2, 3, 4]
    for op in resend[0]:
        pipe.ack(op, 0)  # the replacement stores them: entry 0 reaches WQ, 0-4 are released
    assert pipe.complete() == [] and pipe.last_add_fully_replicated == 4
    assert pipe.begin_change() == {1: "b1", 3: "b3"}
