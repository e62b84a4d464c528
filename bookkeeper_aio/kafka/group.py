"""One consumer group's membership: the join/sync barrier as a pure state machine.

Theory of operation
-------------------
Kafka's classic group protocol, as its coordinator runs it (``GroupCoordinator.scala``)::

    EMPTY --join--> PREPARING_REBALANCE --every member joined, or the rebalance timeout-->
    COMPLETING_REBALANCE --the leader's SyncGroup--> STABLE --join, leave, expiry--> PREPARING...

* **Join barrier.** A JoinGroup parks until every member of the group has (re)joined or the
  rebalance timeout (the largest of the members') passes; members that did not rejoin are
  removed. Then the generation goes up, the protocol (the assignor: ``range``,
  ``roundrobin``, ...) is chosen by the members' votes among those all of them support, and
  every parked join is answered: the leader gets the members and their metadata, the others
  an empty list. An empty group waits ``initial_rebalance_delay_s`` first, so that consumers
  started together land in one generation.
* **Sync barrier.** Members then send SyncGroup; they park until the leader's arrives with
  the assignment, which the coordinator relays (the leader's client ran the assignor).
* **Liveness.** Every join, sync, heartbeat and commit pushes the member's session deadline
  ``session_timeout`` ahead; a member past it is removed and the group rebalances. A member
  parked in a join or a sync does not expire (it is waiting for us).

The machine never blocks or reads a clock: each event carries ``now`` (the event loop's time)
and returns the :class:`Reply` list to deliver to parked requests (identified by the caller's
``token``); :meth:`Group.next_deadline` says when :meth:`Group.tick` must run next. Every
request gets exactly one reply: a parked request replaced by a newer one from the same member,
or whose member is removed, is answered with an error.
"""

from __future__ import annotations

import enum
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .errors import ErrorCode
from .messages import JoinGroupRequest, JoinGroupResponse, SyncGroupRequest, SyncGroupResponse


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


S = GroupState
TRANSITIONS: frozenset[tuple[GroupState, GroupState]] = frozenset(
    {
        (S.EMPTY, S.PREPARING_REBALANCE),  # a first join
        (S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE),  # the join barrier completed
        (S.PREPARING_REBALANCE, S.EMPTY),  # every member left or expired meanwhile
        (S.COMPLETING_REBALANCE, S.STABLE),  # the leader's sync
        (S.COMPLETING_REBALANCE, S.PREPARING_REBALANCE),  # a join, leave or expiry
        (S.COMPLETING_REBALANCE, S.EMPTY),
        (S.STABLE, S.PREPARING_REBALANCE),
        (S.STABLE, S.EMPTY),
    }
)


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer for a parked request."""

    token: Any
    response: JoinGroupResponse | SyncGroupResponse


@dataclass(slots=True)
class Member:
    member_id: str
    client_id: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocols: tuple[tuple[str, bytes], ...]
    session_deadline: float
    join_token: Any = None  # parked JoinGroup, if any
    sync_token: Any = None  # parked SyncGroup, if any
    assignment: bytes = b""

    def metadata_for(self, protocol: str) -> bytes:
        return next(md for name, md in self.protocols if name == protocol)


@dataclass(frozen=True, slots=True)
class GroupLimits:
    session_timeout_ms_min: int = 6_000
    session_timeout_ms_max: int = 1_800_000
    initial_rebalance_delay_s: float = 0.0
    members_max: int = 1_000


@dataclass
class Group:
    """One group's state (see the module docstring)."""

    group_id: str
    limits: GroupLimits
    rng: random.Random
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # in join order
    rebalance_deadline: float | None = None
    initial_delay_until: float | None = None

    # --- events ---------------------------------------------------------------------------

    def join(self, now: float, token: Any, req: JoinGroupRequest, client_id: str) -> list[Reply]:
        """A JoinGroup: park it (the replies say when it is answered)."""
        error = self._join_error(req)
        if error is not None:
            return [Reply(token, JoinGroupResponse(error, member_id=req.member_id))]
        replies: list[Reply] = []
        member = self.members.get(req.member_id)
        if member is None:
            member_id = f"{client_id or 'member'}-{uuid.UUID(int=self.rng.getrandbits(128))}"
            member = Member(member_id, client_id, 0, 0, (), 0)
            self.members[member_id] = member
        elif member.join_token is not None:
            replies.append(_join_error_reply(member.join_token, ErrorCode.REBALANCE_IN_PROGRESS))
        member.session_timeout_s = req.session_timeout_ms / 1000
        member.rebalance_timeout_s = req.rebalance_timeout_ms / 1000
        member.protocols = req.protocols
        member.session_deadline = now + member.session_timeout_s
        member.join_token = token
        self.protocol_type = req.protocol_type
        if self.state is not S.PREPARING_REBALANCE:
            replies += self._prepare_rebalance(now)
        return replies + self._maybe_complete_join(now)

    def sync(self, now: float, token: Any, req: SyncGroupRequest) -> list[Reply]:
        """A SyncGroup: answered at once (error, or STABLE) or parked until the leader's."""
        member = self.members.get(req.member_id)
        error = self._generation_error(member, req.generation_id)
        if error is not None:
            return [Reply(token, SyncGroupResponse(error))]
        assert member is not None
        member.session_deadline = now + member.session_timeout_s
        if self.state is S.STABLE:
            return [Reply(token, SyncGroupResponse(ErrorCode.NONE, member.assignment))]
        replies = []
        if member.sync_token is not None:
            replies.append(
                Reply(member.sync_token, SyncGroupResponse(ErrorCode.REBALANCE_IN_PROGRESS))
            )
        member.sync_token = token
        if member.member_id == self.leader:
            assignments = dict(req.assignments)
            for m in self.members.values():
                m.assignment = assignments.get(m.member_id, b"")
            self._move(S.STABLE)
            replies += self._answer_syncs()
        return replies

    def heartbeat(self, now: float, generation: int, member_id: str) -> ErrorCode:
        """A Heartbeat: the error code to answer (NONE keeps the member alive)."""
        member = self.members.get(member_id)
        error = self._generation_error(member, generation)
        if member is not None and error in (None, ErrorCode.REBALANCE_IN_PROGRESS):
            member.session_deadline = now + member.session_timeout_s
        return error if error is not None else ErrorCode.NONE

    def leave(self, now: float, member_id: str) -> tuple[ErrorCode, list[Reply]]:
        """A LeaveGroup: the member goes, the others rebalance."""
        if member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID, []
        return ErrorCode.NONE, self._remove([member_id], now)

    def commit_error(self, now: float, generation: int, member_id: str) -> ErrorCode | None:
        """None if an OffsetCommit of this generation and member may go ahead."""
        if generation < 0 and not member_id:
            return None if not self.members else ErrorCode.ILLEGAL_GENERATION
        member = self.members.get(member_id)
        error = self._generation_error(member, generation)
        if error is None and self.state is S.COMPLETING_REBALANCE:
            error = ErrorCode.REBALANCE_IN_PROGRESS
        if member is not None and error is None:
            member.session_deadline = now + member.session_timeout_s
        return error

    def tick(self, now: float) -> list[Reply]:
        """Time passed: expire sessions, complete a join barrier whose timeout passed."""
        expired = [m.member_id for m in self.members.values() if _expires(m, now)]
        replies = self._remove(expired, now) if expired else []
        if self.state is S.PREPARING_REBALANCE and self.rebalance_deadline is not None:
            if now >= self.rebalance_deadline:
                absent = [m.member_id for m in self.members.values() if m.join_token is None]
                replies += self._remove(absent, now, rebalance=False)
                replies += self._complete_join(now)
            else:
                replies += self._maybe_complete_join(now)
        return replies

    def next_deadline(self) -> float | None:
        """When :meth:`tick` must run next (None: nothing pending)."""
        times = [m.session_deadline for m in self.members.values() if _expires(m, None)]
        if self.state is S.PREPARING_REBALANCE:
            times += [t for t in (self.rebalance_deadline, self.initial_delay_until) if t]
        return min(times) if times else None

    def describe(self) -> dict[str, Any]:
        """What ``list-groups`` shows."""
        return {
            "state": self.state.value,
            "generation": self.generation,
            "protocol_type": self.protocol_type,
            "protocol": self.protocol,
            "leader": self.leader,
            "members": sorted(self.members),
        }

    # --- the barriers -----------------------------------------------------------------------

    def _prepare_rebalance(self, now: float) -> list[Reply]:
        replies = self._answer_syncs(ErrorCode.REBALANCE_IN_PROGRESS)
        if self.state is S.EMPTY and self.limits.initial_rebalance_delay_s > 0:
            self.initial_delay_until = now + self.limits.initial_rebalance_delay_s
        timeout = max(m.rebalance_timeout_s for m in self.members.values())
        self.rebalance_deadline = now + timeout
        self._move(S.PREPARING_REBALANCE)
        return replies

    def _maybe_complete_join(self, now: float) -> list[Reply]:
        if self.initial_delay_until is not None and now < self.initial_delay_until:
            return []
        if all(m.join_token is not None for m in self.members.values()):
            return self._complete_join(now)
        return []

    def _complete_join(self, now: float) -> list[Reply]:
        self.rebalance_deadline = self.initial_delay_until = None
        if not self.members:
            self.generation += 1
            self._move(S.EMPTY)
            return []
        self.generation += 1
        self.protocol = _choose_protocol(list(self.members.values()))
        if self.leader not in self.members:
            self.leader = next(iter(self.members))
        self._move(S.COMPLETING_REBALANCE)
        everyone = tuple(
            (m.member_id, m.metadata_for(self.protocol)) for m in self.members.values()
        )
        replies = []
        for m in self.members.values():
            m.session_deadline = now + m.session_timeout_s
            members = everyone if m.member_id == self.leader else ()
            response = JoinGroupResponse(ErrorCode.NONE, self.generation, self.protocol,
                                         self.leader, m.member_id, members)  # fmt: skip
            replies.append(Reply(m.join_token, response))
            m.join_token = None
        return replies

    def _answer_syncs(self, error: ErrorCode = ErrorCode.NONE) -> list[Reply]:
        replies = []
        for m in self.members.values():
            if m.sync_token is not None:
                assignment = m.assignment if error == ErrorCode.NONE else b""
                replies.append(Reply(m.sync_token, SyncGroupResponse(error, assignment)))
                m.sync_token = None
        return replies

    def _remove(self, member_ids: list[str], now: float, rebalance: bool = True) -> list[Reply]:
        replies = []
        for member_id in member_ids:
            m = self.members.pop(member_id)
            if m.join_token is not None:
                replies.append(_join_error_reply(m.join_token, ErrorCode.UNKNOWN_MEMBER_ID))
            if m.sync_token is not None:
                replies.append(Reply(m.sync_token, SyncGroupResponse(ErrorCode.UNKNOWN_MEMBER_ID)))
        if not rebalance:
            return replies
        if not self.members:
            replies += self._answer_syncs(ErrorCode.REBALANCE_IN_PROGRESS)
            self.rebalance_deadline = self.initial_delay_until = None
            if self.state is not S.EMPTY:
                self._move(S.EMPTY)
            return replies
        if self.state is S.PREPARING_REBALANCE:
            return replies + self._maybe_complete_join(now)
        return replies + self._prepare_rebalance(now)

    # --- checks ---------------------------------------------------------------------------

    def _join_error(self, req: JoinGroupRequest) -> ErrorCode | None:
        limits = self.limits
        if (
            not limits.session_timeout_ms_min
            <= req.session_timeout_ms
            <= limits.session_timeout_ms_max
        ):
            return ErrorCode.INVALID_SESSION_TIMEOUT
        if req.member_id and req.member_id not in self.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if not req.protocols or not req.protocol_type:
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        others = [m for m in self.members.values() if m.member_id != req.member_id]
        if others:
            if req.protocol_type != self.protocol_type:
                return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
            names = {name for name, _ in req.protocols}
            if not _common_protocols(others) & names:
                return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if not req.member_id and len(self.members) >= limits.members_max:
            return ErrorCode.GROUP_MAX_SIZE_REACHED
        return None

    def _generation_error(self, member: Member | None, generation: int) -> ErrorCode | None:
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if self.state is S.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        if generation != self.generation:
            return ErrorCode.ILLEGAL_GENERATION
        return None

    def _move(self, target: GroupState) -> None:
        if self.state is not target and (self.state, target) not in TRANSITIONS:
            raise AssertionError(f"group {self.group_id}: {self.state.value} -> {target.value}")
        self.state = target


def _common_protocols(members: list[Member]) -> set[str]:
    common = {name for name, _ in members[0].protocols}
    for m in members[1:]:
        common &= {name for name, _ in m.protocols}
    return common


def _choose_protocol(members: list[Member]) -> str:
    """Each member votes for its most preferred protocol that every member supports; ties go
    to the first member's preference order (Kafka: ``GroupMetadata.selectProtocol``)."""
    candidates = _common_protocols(members)
    assert candidates, "a join that shares no protocol is refused before it gets here"
    votes = Counter(next(n for n, _ in m.protocols if n in candidates) for m in members)
    order = [n for n, _ in members[0].protocols if n in candidates]
    return max(order, key=lambda name: (votes[name], -order.index(name)))


def _expires(member: Member, now: float | None) -> bool:
    """Whether the member's session can run out (at ``now``): not while it is parked in a join
    or a sync (it is waiting for us, not gone)."""
    if member.join_token is not None or member.sync_token is not None:
        return False
    return now is None or now >= member.session_deadline


def _join_error_reply(token: Any, error: ErrorCode) -> Reply:
    return Reply(token, JoinGroupResponse(error))
