"""The ``range`` and ``roundrobin`` assignors, and the check of an assignment (pure).

Theory of operation
-------------------
In Kafka's classic group protocol the members choose the assignor: each lists the ones it
supports in JoinGroup, the coordinator picks one all support (``group.py``), and the leader's
client runs it and sends the result in SyncGroup, which the coordinator relays. These are the
two assignors every Kafka client ships (Java's ``RangeAssignor`` / ``RoundRobinAssignor``,
aiokafka, librdkafka), written from their definitions:

* ``range``: per topic, the members subscribed to it in member-id order each take a
  contiguous run of partitions; the first ``partitions % members`` take one more.
* ``roundrobin``: every subscribed (topic, partition) in order, dealt to the members in
  member-id order, skipping members not subscribed to that topic.

The coordinator uses :func:`check_assignment` on the leader's SyncGroup of a consumer group to
log an assignment that leaves a subscribed partition out or gives one to two members (a
client bug that would otherwise show up only as stuck or duplicated consumption), and
``list-groups`` shows who holds what.
"""

from __future__ import annotations

from collections.abc import Mapping

Assignment = dict[str, dict[str, list[int]]]  # member -> topic -> partitions


def range_assign(
    subscriptions: Mapping[str, tuple[str, ...]], partitions: Mapping[str, int]
) -> Assignment:
    """Kafka's RangeAssignor. Topics without a partition count are skipped."""
    result: Assignment = {member: {} for member in subscriptions}
    for topic in sorted({t for topics in subscriptions.values() for t in topics}):
        count = partitions.get(topic)
        if not count:
            continue
        members = sorted(m for m, topics in subscriptions.items() if topic in topics)
        each, extra = divmod(count, len(members))
        for i, member in enumerate(members):
            start = i * each + min(i, extra)
            run = list(range(start, start + each + (1 if i < extra else 0)))
            if run:
                result[member][topic] = run
    return result


def roundrobin_assign(
    subscriptions: Mapping[str, tuple[str, ...]], partitions: Mapping[str, int]
) -> Assignment:
    """Kafka's RoundRobinAssignor. Topics without a partition count are skipped."""
    result: Assignment = {member: {} for member in subscriptions}
    members = sorted(subscriptions)
    if not members:
        return result
    turn = 0
    for topic in sorted({t for topics in subscriptions.values() for t in topics}):
        for partition in range(partitions.get(topic, 0)):
            while topic not in subscriptions[members[turn % len(members)]]:
                turn += 1
            result[members[turn % len(members)]].setdefault(topic, []).append(partition)
            turn += 1
    return result


ASSIGNORS = {"range": range_assign, "roundrobin": roundrobin_assign}


def check_assignment(
    subscriptions: Mapping[str, tuple[str, ...]],
    partitions: Mapping[str, int],
    assignment: Mapping[str, Mapping[str, list[int] | tuple[int, ...]]],
) -> list[str]:
    """What is wrong with an assignment: each problem as a sentence (empty: nothing).

    Every partition of a subscribed topic (with a known partition count) must go to exactly
    one member, and only to a member subscribed to its topic.
    """
    problems: list[str] = []
    owners: dict[tuple[str, int], str] = {}
    for member, topics in assignment.items():
        for topic, parts in topics.items():
            if topic not in subscriptions.get(member, ()):
                problems.append(f"{member} got {topic} without subscribing to it")
            for p in parts:
                if (topic, p) in owners:
                    problems.append(f"{topic}-{p} went to {owners[topic, p]} and {member}")
                owners[topic, p] = member
    for topic in sorted({t for topics in subscriptions.values() for t in topics}):
        missing = [p for p in range(partitions.get(topic, 0)) if (topic, p) not in owners]
        if missing:
            problems.append(f"{topic} partitions {missing} went to nobody")
    return problems
