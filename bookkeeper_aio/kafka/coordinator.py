"""The group coordinator: the groups this gateway coordinates, their timers and offsets.

Theory of operation
-------------------
Each group is a pure :class:`~bookkeeper_aio.kafka.group.Group`; this module feeds it requests
and the clock and delivers its replies. A JoinGroup or SyncGroup parks on a future (the
group's ``token``) until the group answers it; :meth:`Coordinator.run`, a loop owned by the
gateway, sleeps until the earliest group deadline (session expiry, rebalance timeout) and
ticks the groups due. Every parked wait also has its own deadline, longer than any the group
can set, so nothing waits forever.

A gateway coordinates a group once it holds the group's claim (``ownership.py``); requests
for a group claimed by another gateway get NOT_COORDINATOR and clients ask FindCoordinator
again. Membership lives in memory only, as in Kafka: after a failover the members rejoin.
Committed offsets do not: they are stored with the partition (a cursor of the partition's
log, ``log_storage.py``), so they survive gateways, rebalances and coordinator moves. Each
group's state is published to ``kafka/groups/<group>`` (JSON) for ``list-groups``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from typing import Any

from ..config import KafkaConfig
from . import codec
from . import messages as m
from .assignors import check_assignment
from .errors import ErrorCode, KafkaError, NotCoordinatorError, code_for
from .group import Group, GroupLimits, GroupState
from .ownership import GatewayInfo, Membership, key_segment
from .partition import PartitionStorage
from .topics import Topics

log = logging.getLogger(__name__)

COORDINATORS = "kafka/coordinators/"
GROUPS = "kafka/groups/"
PARKED_MARGIN_S = 5.0
GROUP_ID_BYTES_MAX = 255  # a log cursor's name  # beyond the longest deadline a group can set


def check_group_id(group_id: str) -> None:
    """A group id is 1 or more characters whose percent-encoded form (the log cursor's and
    the keys' name for it) fits in 255 bytes.

    Raises:
        KafkaError: INVALID_GROUP_ID.
    """
    if not group_id or len(key_segment(group_id).encode()) > GROUP_ID_BYTES_MAX:
        raise KafkaError(
            f"group id of {len(group_id)} characters: 1 to {GROUP_ID_BYTES_MAX} bytes once "
            "percent-encoded",
            ErrorCode.INVALID_GROUP_ID,
        )


class Coordinator:
    """Groups coordinated here (see the module docstring)."""

    def __init__(
        self,
        config: KafkaConfig,
        membership: Membership,
        storage: PartitionStorage,
        topics: Topics,
        rng: random.Random,
    ) -> None:
        self.config = config
        self.membership = membership
        self.storage = storage
        self.topics = topics
        self.rng = rng
        self.limits = GroupLimits(
            config.kafka_group_session_timeout_ms_min,
            config.kafka_group_session_timeout_ms_max,
            config.kafka_group_initial_rebalance_wait_ms / 1000,
            config.kafka_group_members_max,
        )
        self.groups: dict[str, Group] = {}
        self._published: dict[str, str] = {}  # group -> JSON last written
        self._wake = asyncio.Event()

    # --- requests -------------------------------------------------------------------------

    async def find(self, group_id: str) -> GatewayInfo:
        """The group's coordinator: this gateway if it holds (or now took) the claim."""
        check_group_id(group_id)
        owner = await self.membership.claim(COORDINATORS + key_segment(group_id))
        return self.membership.me if owner is None else owner

    async def join(self, req: m.JoinGroupRequest, client_id: str) -> m.JoinGroupResponse:
        group = await self._group(req.group_id)
        future = self._future()
        self._deliver(group.join(self._now(), future, req, client_id))
        timeout_s = req.rebalance_timeout_ms / 1000 + self.limits.initial_rebalance_delay_s
        return await self._parked(future, timeout_s, m.JoinGroupResponse)

    async def sync(self, req: m.SyncGroupRequest) -> m.SyncGroupResponse:
        group = await self._group(req.group_id)
        future = self._future()
        self._deliver(group.sync(self._now(), future, req))
        if group.state is GroupState.STABLE and req.member_id == group.leader and req.assignments:
            await self._check_assignment(group, req.assignments)
        timeout_s = self.limits.session_timeout_ms_max / 1000
        return await self._parked(future, timeout_s, m.SyncGroupResponse)

    async def heartbeat(self, req: m.HeartbeatRequest) -> ErrorCode:
        group = await self._group(req.group_id)
        return group.heartbeat(self._now(), req.generation_id, req.member_id)

    async def leave(self, req: m.LeaveGroupRequest) -> ErrorCode:
        group = await self._group(req.group_id)
        error, replies = group.leave(self._now(), req.member_id)
        self._deliver(replies)
        return error

    async def commit(self, req: m.OffsetCommitRequest) -> m.OffsetCommitResponse:
        """Store the offsets (each a cursor of its partition's log) if the member may."""
        group = await self._group(req.group_id)
        error = group.commit_error(self._now(), req.generation_id, req.member_id)
        topics = []
        for name, parts in req.topics:
            results = []
            info = await self.topics.get(name) if error is None else None
            for index, offset, _metadata in parts:
                code = error
                if code is None:
                    code = await self._commit_one(info, name, index, req.group_id, offset)
                results.append((index, int(code)))
            topics.append((name, tuple(results)))
        self._wake.set()
        return m.OffsetCommitResponse(tuple(topics))

    async def fetch_offsets(self, req: m.OffsetFetchRequest) -> m.OffsetFetchResponse:
        """The group's committed offsets (-1 where none); every partition when topics is None."""
        await self._group(req.group_id)
        wanted = req.topics
        if wanted is None:
            wanted = tuple((t.name, tuple(range(t.partitions))) for t in await self.topics.list())
        topics = []
        for name, indexes in wanted:
            info = await self.topics.get(name)
            parts = []
            for index in indexes:
                if info is None or not 0 <= index < info.partitions:
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                    parts.append(m.OffsetFetchPartitionResponse(index, -1, "", code))
                    continue
                offset = await self.storage.committed_offset(name, index, req.group_id)
                if offset is not None or req.topics is not None:
                    parts.append(
                        m.OffsetFetchPartitionResponse(index, -1 if offset is None else offset)
                    )
            if parts:
                topics.append((name, tuple(parts)))
        return m.OffsetFetchResponse(tuple(topics))

    # --- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """Tick groups at their deadlines and publish their state (runs until cancelled)."""
        loop = asyncio.get_running_loop()
        while True:
            deadlines = [d for g in self.groups.values() if (d := g.next_deadline()) is not None]
            delay = max(0.0, min(deadlines) - loop.time()) if deadlines else 1.0
            self._wake.clear()
            try:
                async with asyncio.timeout(min(delay, 1.0)):
                    await self._wake.wait()
            except TimeoutError:
                pass
            now = loop.time()
            for group in list(self.groups.values()):
                deadline = group.next_deadline()
                if deadline is not None and deadline <= now:
                    self._deliver(group.tick(now))
            await self._publish()

    def drop_all(self, why: str) -> None:
        """Stop coordinating every group (lease lost, shutdown): parked requests get
        NOT_COORDINATOR and members find the new coordinator."""
        for group in self.groups.values():
            for member in group.members.values():
                for token in (member.join_token, member.sync_token):
                    if token is not None and not token.done():
                        token.set_exception(NotCoordinatorError(why))
        self.groups.clear()

    def statistics(self) -> dict[str, int]:
        return {
            "groups": len(self.groups),
            "members": sum(len(g.members) for g in self.groups.values()),
        }

    # --- helpers --------------------------------------------------------------------------

    async def _group(self, group_id: str) -> Group:
        check_group_id(group_id)
        group = self.groups.get(group_id)
        if group is not None:
            return group
        owner = await self.membership.claim(COORDINATORS + key_segment(group_id))
        if owner is not None:
            raise NotCoordinatorError(f"group {group_id} is coordinated by {owner.address}")
        group = self.groups.get(group_id)  # re-checked: the claim awaited
        if group is None:
            if len(self.groups) >= self.config.kafka_groups_max:
                self._forget_an_empty_group()
            group = self.groups[group_id] = Group(group_id, self.limits, self.rng)
        return group

    def _forget_an_empty_group(self) -> None:
        """Make room for a group: an empty one goes (its offsets stay in the logs).

        Raises:
            KafkaError: every group here has members (COORDINATOR_NOT_AVAILABLE).
        """
        for group_id, group in self.groups.items():
            if group.state is GroupState.EMPTY:
                del self.groups[group_id]
                self._published.pop(group_id, None)
                return
        raise KafkaError("too many groups on this gateway", ErrorCode.COORDINATOR_NOT_AVAILABLE)

    async def _commit_one(
        self, info: Any, topic: str, index: int, group: str, offset: int
    ) -> ErrorCode:
        if info is None or not 0 <= index < info.partitions:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if offset < 0:
            return ErrorCode.NONE  # Kafka ignores "no offset"
        try:
            await self.storage.commit_offset(topic, index, group, offset)
        except Exception as exc:  # answered as a code, and logged: never silent
            log.warning("commit %s %s-%d=%d failed: %r", group, topic, index, offset, exc)
            return code_for(exc)
        return ErrorCode.NONE

    async def _check_assignment(
        self, group: Group, assignments: tuple[tuple[str, bytes], ...]
    ) -> None:
        if group.protocol_type != "consumer" or group.protocol is None:
            return
        try:
            subs = {
                mid: codec.decode_subscription(member.metadata_for(group.protocol)).topics
                for mid, member in group.members.items()
            }
            given = {
                mid: dict(codec.decode_assignment(data).partitions) for mid, data in assignments
            }
        except KafkaError as exc:
            log.warning("group %s: cannot decode the consumer protocol: %s", group.group_id, exc)
            return
        counts = {}
        for topic in sorted({t for topics in subs.values() for t in topics}):
            info = await self.topics.get(topic)
            counts[topic] = info.partitions if info else 0
        for problem in check_assignment(subs, counts, given):
            log.warning("group %s generation %d: %s", group.group_id, group.generation, problem)

    async def _publish(self) -> None:
        for group_id, group in list(self.groups.items()):
            doc = json.dumps(
                {**group.describe(), "coordinator": self.membership.address}, sort_keys=True
            )
            if self._published.get(group_id) != doc:
                try:
                    await self.membership.store.put(GROUPS + key_segment(group_id), doc.encode())
                    self._published[group_id] = doc
                except Exception as exc:  # retried on the next turn
                    log.warning("group %s: publishing its state failed: %r", group_id, exc)

    def _deliver(self, replies: list[Any]) -> None:
        for reply in replies:
            if not reply.token.done():
                reply.token.set_result(reply.response)
        self._wake.set()

    def _future(self) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().create_future()

    async def _parked(self, future: asyncio.Future[Any], timeout_s: float, kind: type) -> Any:
        try:
            async with asyncio.timeout(timeout_s + PARKED_MARGIN_S):
                return await future
        except TimeoutError:
            log.error("a parked %s outlived every group deadline", kind.__name__)
            return kind(ErrorCode.REBALANCE_IN_PROGRESS)

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()
