"""Kafka admin commands of ``python -m bookkeeper_aio.shell``: create-topic, list-topics,
delete-topic, list-groups. Each returns the text to print."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from urllib.parse import unquote

from ..client.bookkeeper import BookKeeper
from ..config import KafkaConfig
from .coordinator import GROUPS
from .ownership import GATEWAYS
from .topics import Topics


@contextlib.asynccontextmanager
async def _topics(uri: str) -> AsyncIterator[Topics]:
    from .log_storage import LogPartitionStorage

    async with BookKeeper.connect(uri) as bk:
        yield Topics(bk.ctx.metadata, LogPartitionStorage(bk, KafkaConfig()))


async def create_topic(
    uri: str, name: str, partitions: int, ensemble: int, write_quorum: int, ack_quorum: int
) -> str:
    """Create a topic and one log per partition.

    Raises:
        KafkaError: a bad name, partition count or quorum, or the topic exists.
    """
    async with _topics(uri) as topics:
        info = await topics.create(name, partitions, ensemble, write_quorum, ack_quorum)
    return (
        f"created topic {info.name}: {info.partitions} partitions, "
        f"E{info.ensemble_size}/WQ{info.write_quorum}/AQ{info.ack_quorum}"
    )


async def list_topics(uri: str, as_json: bool = False) -> str:
    """Every topic, one per line: name, partitions, quorum (``as_json``: a JSON object per
    line)."""
    async with _topics(uri) as topics:
        infos = await topics.list()
    if as_json:
        return "\n".join(
            json.dumps(
                {
                    "name": t.name,
                    "partitions": t.partitions,
                    "ensemble_size": t.ensemble_size,
                    "write_quorum": t.write_quorum,
                    "ack_quorum": t.ack_quorum,
                }
            )
            for t in infos
        )
    lines = [
        f"{t.name}\t{t.partitions} partitions\t"
        f"E{t.ensemble_size}/WQ{t.write_quorum}/AQ{t.ack_quorum}"
        for t in infos
    ]
    return "\n".join(lines) if lines else "no topics"


async def delete_topic(uri: str, name: str) -> str:
    """Delete a topic, its logs and the groups' committed offsets on it.

    Raises:
        KafkaError: no such topic.
    """
    async with _topics(uri) as topics:
        info = await topics.delete(name)
    return f"deleted topic {info.name} ({info.partitions} partitions)"


async def list_groups(uri: str, as_json: bool = False) -> str:
    """Every group a gateway coordinated: state, generation, protocol, members, coordinator
    (``as_json``: a JSON object per line)."""
    async with BookKeeper.connect(uri) as bk:
        store = bk.ctx.metadata
        live = {key[len(GATEWAYS) :] async for key, _ in store.list_prefix(GATEWAYS)}
        docs = [
            (unquote(key[len(GROUPS) :]), json.loads(v.value))
            async for key, v in store.list_prefix(GROUPS)
        ]
    lines = []
    for group, doc in docs:
        coordinator = doc["coordinator"] if doc["coordinator"] in live else "none (gone)"
        if as_json:
            lines.append(json.dumps({
                "group": group, "state": doc["state"], "generation": doc["generation"],
                "protocol_type": doc["protocol_type"], "protocol": doc["protocol"],
                "members": len(doc["members"]),
                "coordinator": doc["coordinator"] if doc["coordinator"] in live else None,
            }))  # fmt: skip
            continue
        lines.append(
            f"{group}\t{doc['state']}\tgeneration {doc['generation']}\t"
            f"{doc['protocol_type'] or '-'}/{doc['protocol'] or '-'}\t"
            f"{len(doc['members'])} members\tcoordinator {coordinator}"
        )
    return "\n".join(lines) if lines or as_json else "no groups"
