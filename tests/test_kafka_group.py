"""The group coordinator's state machine and the assignors (pure; property tests)."""

from __future__ import annotations

import dataclasses
import random

import hypothesis.strategies as st
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from bookkeeper_aio.kafka.assignors import check_assignment, range_assign, roundrobin_assign
from bookkeeper_aio.kafka.errors import ErrorCode
from bookkeeper_aio.kafka.group import Group, GroupLimits, GroupState
from bookkeeper_aio.kafka.messages import JoinGroupRequest, JoinGroupResponse, SyncGroupRequest

LIMITS = GroupLimits(session_timeout_ms_min=100, session_timeout_ms_max=60_000)


def join_req(member_id: str = "", protocols=(("range", b"r"), ("roundrobin", b"rr")), **kw):
    args = dict(session_timeout_ms=10_000, rebalance_timeout_ms=5_000, protocol_type="consumer")
    args.update(kw)
    return JoinGroupRequest("g", member_id=member_id, protocols=protocols, **args)


def new_group(**limits) -> Group:
    return Group("g", dataclasses.replace(LIMITS, **limits), random.Random(1))


def test_two_members_one_generation_then_stable():
    g = new_group()
    [r1] = g.join(0.0, "a", join_req(), "c1")  # alone: the barrier completes at once
    assert r1.response.error_code == 0 and r1.response.generation_id == 1
    a = r1.response.member_id
    assert g.state is GroupState.COMPLETING_REBALANCE
    assert g.join(0.1, "b", join_req(), "c2") == []  # parks: a must rejoin
    assert g.state is GroupState.PREPARING_REBALANCE
    replies = {r.token: r.response for r in g.join(0.2, "a2", join_req(a), "c1")}
    assert set(replies) == {"a2", "b"}
    assert {r.generation_id for r in replies.values()} == {2}
    leader = replies["a2"]
    assert leader.leader == a and len(leader.members) == 2 and replies["b"].members == ()
    b = replies["b"].member_id
    assert g.sync(0.3, "sb", SyncGroupRequest("g", 2, b, ())) == []  # waits for the leader
    out = g.sync(0.4, "sa", SyncGroupRequest("g", 2, a, ((a, b"A"), (b, b"B"))))
    assert {r.token: r.response.assignment for r in out} == {"sb": b"B", "sa": b"A"}
    assert g.state is GroupState.STABLE
    assert g.heartbeat(0.5, 2, b) == ErrorCode.NONE
    assert g.heartbeat(0.5, 1, b) == ErrorCode.ILLEGAL_GENERATION
    assert g.heartbeat(0.5, 2, "nobody") == ErrorCode.UNKNOWN_MEMBER_ID


def test_session_expiry_rebalances_and_rebalance_timeout_drops_absent_members():
    g = new_group()
    a = g.join(0.0, "a", join_req(session_timeout_ms=1_000), "c")[0].response.member_id
    g.sync(0.0, "s", SyncGroupRequest("g", 1, a, ((a, b"x"),)))
    b_join = g.join(0.5, "b", join_req(session_timeout_ms=1_000), "c")
    assert b_join == [] and g.state is GroupState.PREPARING_REBALANCE
    # a never rejoins: at the rebalance timeout (5 s after b's join) it is dropped.
    assert g.next_deadline() is not None
    replies = g.tick(5.6)
    assert [r.token for r in replies] == ["b"] and replies[0].response.generation_id == 2
    assert list(g.members) == [replies[0].response.member_id]
    assert g.commit_error(5.7, 2, a) == ErrorCode.UNKNOWN_MEMBER_ID
    # b's session runs out without heartbeats: the group empties.
    g.tick(5.6 + 1.01)
    assert g.state is GroupState.EMPTY and not g.members


def test_bad_joins_are_refused_at_once():
    g = new_group()
    assert g.join(0, "t", join_req(session_timeout_ms=10), "c")[0].response.error_code == (
        ErrorCode.INVALID_SESSION_TIMEOUT
    )
    assert g.join(0, "t", join_req("ghost"), "c")[0].response.error_code == (
        ErrorCode.UNKNOWN_MEMBER_ID
    )
    g.join(0, "a", join_req(protocols=(("range", b""),)), "c")
    r = g.join(0, "b", join_req(protocols=(("sticky", b""),)), "c")
    assert r[0].response.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL


def test_protocol_vote_and_leave():
    g = new_group()
    a = g.join(0, "a", join_req(protocols=(("range", b""), ("roundrobin", b""))), "c")
    a_id = a[0].response.member_id
    g.join(0, "b", join_req(protocols=(("roundrobin", b""), ("range", b""))), "c")
    out = g.join(0, "c", join_req(protocols=(("roundrobin", b""),)), "c")
    out += g.join(0, "a2", join_req(a_id, protocols=(("range", b""), ("roundrobin", b""))), "c")
    assert {r.response.protocol_name for r in out} == {"roundrobin"}  # the only common one
    error, _ = g.leave(0.1, a_id)
    assert error == ErrorCode.NONE and g.state is GroupState.PREPARING_REBALANCE
    assert g.leave(0.1, a_id)[0] == ErrorCode.UNKNOWN_MEMBER_ID


class GroupMachine(RuleBasedStateMachine):
    """Random joins, syncs, heartbeats, leaves and time: every request gets exactly one reply,
    generations only grow, one leader per generation, and nothing stays parked forever."""

    def __init__(self) -> None:
        super().__init__()
        self.g = new_group(initial_rebalance_delay_s=0.3)
        self.now = 0.0
        self.token = 0
        self.open: set[int] = set()
        self.known: list[str] = []
        self.generation_leaders: dict[int, str] = {}
        self.last_generation = 0

    def _new_token(self) -> int:
        self.token += 1
        self.open.add(self.token)
        return self.token

    def _deliver(self, replies) -> None:
        for r in replies:
            assert r.token in self.open, f"reply to {r.token}: not parked (or answered twice)"
            self.open.discard(r.token)
            resp = r.response
            if isinstance(resp, JoinGroupResponse) and resp.error_code == 0:
                if resp.member_id not in self.known:
                    self.known.append(resp.member_id)
                leader = self.generation_leaders.setdefault(resp.generation_id, resp.leader)
                assert leader == resp.leader
                if resp.member_id == resp.leader:
                    assert {m for m, _ in resp.members} == set(self.g.members)

    @rule(which=st.integers(0, 5), session_ms=st.sampled_from([500, 2_000, 10_000]))
    def join(self, which, session_ms):
        member = self.known[which] if which < len(self.known) else ""
        req = join_req(member, session_timeout_ms=session_ms, rebalance_timeout_ms=1_000)
        self._deliver(self.g.join(self.now, self._new_token(), req, "c"))

    @precondition(lambda self: self.known)
    @rule(which=st.integers(0, 5), leader_sends=st.booleans())
    def sync(self, which, leader_sends):
        member = self.known[which % len(self.known)]
        assignments = tuple((m, m.encode()) for m in self.g.members) if leader_sends else ()
        req = SyncGroupRequest("g", self.g.generation, member, assignments)
        self._deliver(self.g.sync(self.now, self._new_token(), req))

    @precondition(lambda self: self.known)
    @rule(which=st.integers(0, 5))
    def heartbeat(self, which):
        self.g.heartbeat(self.now, self.g.generation, self.known[which % len(self.known)])

    @precondition(lambda self: self.known)
    @rule(which=st.integers(0, 5))
    def leave(self, which):
        self._deliver(self.g.leave(self.now, self.known[which % len(self.known)])[1])

    @rule(seconds=st.floats(0.01, 3.0))
    def advance(self, seconds):
        self.now += seconds
        deadline = self.g.next_deadline()
        if deadline is not None and deadline <= self.now:
            self._deliver(self.g.tick(self.now))

    @invariant()
    def consistent(self):
        g = self.g
        assert g.generation >= self.last_generation
        self.last_generation = g.generation
        if g.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            assert g.leader in g.members
            assert all(m.join_token is None for m in g.members.values())
        if g.state is GroupState.EMPTY:
            assert not g.members
        if g.state is not GroupState.COMPLETING_REBALANCE:
            assert all(m.sync_token is None for m in g.members.values())

    def teardown(self):
        # Liveness: time passing answers every parked join (syncs wait for their leader's
        # session, which is bounded too).
        for _ in range(10):
            self.now += 60.0
            self._deliver(self.g.tick(self.now))
        assert not self.open, f"still parked: {sorted(self.open)}"


TestGroupMachine = GroupMachine.TestCase
TestGroupMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


subscriptions = st.dictionaries(
    st.sampled_from(["m-a", "m-b", "m-c", "m-d", "m-e"]),
    st.lists(st.sampled_from(["t1", "t2", "t3"]), min_size=1, unique=True).map(tuple),
    min_size=1,
)
partition_counts = st.fixed_dictionaries({t: st.integers(0, 12) for t in ("t1", "t2", "t3")})


@settings(deadline=None)
@given(subscriptions, partition_counts)
def test_assignors_cover_every_partition_once(subs, counts):
    for assign in (range_assign, roundrobin_assign):
        result = assign(subs, counts)
        assert check_assignment(subs, counts, result) == []


@settings(deadline=None)
@given(subscriptions, partition_counts)
def test_range_gives_contiguous_runs_and_roundrobin_balances(subs, counts):
    for topics in range_assign(subs, counts).values():
        for parts in topics.values():
            assert parts == list(range(parts[0], parts[0] + len(parts)))
    same = {topics for topics in subs.values()}
    if len(same) == 1:  # identical subscriptions: round robin differs by at most one
        sizes = [sum(map(len, t.values())) for t in roundrobin_assign(subs, counts).values()]
        assert max(sizes) - min(sizes) <= 1


def test_check_assignment_finds_problems():
    subs = {"a": ("t",), "b": ("t",)}
    assert check_assignment(subs, {"t": 2}, {"a": {"t": [0]}, "b": {"t": [0]}}) == [
        "t-0 went to a and b",
        "t partitions [1] went to nobody",
    ]
    assert range_assign(subs, {"t": 3}) == {"a": {"t": [0, 1]}, "b": {"t": [2]}}
    assert roundrobin_assign(subs, {"t": 3}) == {"a": {"t": [0, 2]}, "b": {"t": [1]}}
