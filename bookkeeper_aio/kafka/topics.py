"""Topics: their metadata in etcd keys and their partitions' logs.

A topic is one key, ``kafka/topics/<name>``, whose JSON value names its partition count and
the ensemble, write quorum and ack quorum of its partitions' logs (one log per partition,
``log_storage.py`` names them). The key is written first (create-only, so two creates cannot
both succeed), then the logs; a log found missing later (a create interrupted half-way) is
created when a gateway first takes the partition over. Deleting removes the key first (no
gateway takes a partition of a deleted topic over again), then the logs and the partitions'
ownership keys.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

from ..errors import IncorrectParameterError, MetadataFormatError, MetadataVersionError
from ..metadata.model import validate_quorums
from ..metadata.store import MetadataStore
from .errors import ErrorCode, InvalidTopicError, KafkaError, TopicExistsError
from .partition import PartitionStorage

TOPICS = "kafka/topics/"
OWNERS = "kafka/owners/"  # kafka/owners/<topic>/<partition>: who writes it (ownership.py)
_LEGAL_NAME = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
PARTITIONS_MAX = 10_000


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic's metadata (the JSON value of its key)."""

    name: str
    partitions: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int

    @property
    def quorum(self) -> tuple[int, int, int]:
        return (self.ensemble_size, self.write_quorum, self.ack_quorum)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> TopicInfo:
        """Raises: MetadataFormatError: not a topic's JSON."""
        try:
            doc = json.loads(data)
            return cls(**{k: doc[k] for k in cls.__dataclass_fields__})
        except (ValueError, TypeError, KeyError) as exc:
            raise MetadataFormatError(f"bad topic metadata: {exc}") from exc


def check_topic_name(name: str) -> None:
    """Kafka's rule: 1-249 of ``[A-Za-z0-9._-]``, not ``.`` or ``..``.

    Raises:
        InvalidTopicError: any other name.
    """
    if not _LEGAL_NAME.match(name) or name in (".", ".."):
        raise InvalidTopicError(
            f"invalid topic name {name!r}: 1-249 characters of [A-Za-z0-9._-], not . or .."
        )


class Topics:
    """Create, read, list and delete topics."""

    def __init__(self, store: MetadataStore, storage: PartitionStorage) -> None:
        self.store = store
        self.storage = storage

    async def create(
        self, name: str, partitions: int, ensemble: int, write_quorum: int, ack_quorum: int
    ) -> TopicInfo:
        """Create a topic and its partitions' logs.

        Raises:
            InvalidTopicError: a bad name.
            KafkaError: INVALID_PARTITIONS or INVALID_REPLICATION_FACTOR.
            TopicExistsError: the topic exists.
        """
        check_topic_name(name)
        if not 1 <= partitions <= PARTITIONS_MAX:
            raise KafkaError(
                f"partitions must be 1..{PARTITIONS_MAX}, got {partitions}",
                ErrorCode.INVALID_PARTITIONS,
            )
        try:
            validate_quorums(ensemble, write_quorum, ack_quorum)
        except IncorrectParameterError as exc:
            raise KafkaError(str(exc), ErrorCode.INVALID_REPLICATION_FACTOR) from exc
        info = TopicInfo(name, partitions, ensemble, write_quorum, ack_quorum)
        try:
            await self.store.put(TOPICS + name, info.to_json(), expected_version=0)
        except MetadataVersionError as exc:
            raise TopicExistsError(f"topic {name} exists") from exc
        await self.storage.create_partitions(name, range(partitions), info.quorum)
        return info

    async def get(self, name: str) -> TopicInfo | None:
        """The topic's metadata, or None (also for a name Kafka would refuse)."""
        if not _LEGAL_NAME.match(name) or name in (".", ".."):
            return None
        versioned = await self.store.get(TOPICS + name)
        return None if versioned is None else TopicInfo.from_json(versioned.value)

    async def list(self) -> list[TopicInfo]:
        """Every topic, by name."""
        return [TopicInfo.from_json(v.value) async for _, v in self.store.list_prefix(TOPICS)]

    async def delete(self, name: str) -> TopicInfo:
        """Delete the topic, its logs (and so its committed offsets) and ownership keys.

        Raises:
            KafkaError: UNKNOWN_TOPIC_OR_PARTITION when there is no such topic.
        """
        info = await self.get(name)
        if info is None:
            raise KafkaError(f"no topic {name}", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        await self.store.delete(TOPICS + name)
        await self.storage.delete_partitions(name, range(info.partitions))
        await self.store.delete_prefix(f"{OWNERS}{name}/")
        return info
