"""The Kafka requests and responses the gateway serves, one frozen dataclass each, the same
for every version (``codec.py`` maps each version's wire layout onto them).

Field names follow Kafka's JSON schemas where they do not clash with Python; times carry
their unit. A response field that only some versions carry is simply ignored by the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class ApiKey(IntEnum):
    """The API keys the gateway knows."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    API_VERSIONS = 18
    INIT_PRODUCER_ID = 22


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """Request header v1 (v2 for ApiVersions v3: the same fields plus empty tagged fields)."""

    api_key: int  # not an ApiKey: an unknown key must still be answered
    api_version: int
    correlation_id: int
    client_id: str | None


# --- requests -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ApiVersionsRequest:
    client_software_name: str = ""
    client_software_version: str = ""


@dataclass(frozen=True, slots=True)
class MetadataRequest:
    topics: tuple[str, ...] | None  # None: every topic
    allow_auto_topic_creation: bool


@dataclass(frozen=True, slots=True)
class ProducePartition:
    index: int
    records: bytes | None


@dataclass(frozen=True, slots=True)
class ProduceTopic:
    name: str
    partitions: tuple[ProducePartition, ...]


@dataclass(frozen=True, slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int  # 0: no answer; 1 and -1 both wait for the log's ack quorum
    timeout_ms: int
    topics: tuple[ProduceTopic, ...]


@dataclass(frozen=True, slots=True)
class FetchPartition:
    index: int
    fetch_offset: int
    partition_max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchTopic:
    name: str
    partitions: tuple[FetchPartition, ...]


@dataclass(frozen=True, slots=True)
class FetchRequest:
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    topics: tuple[FetchTopic, ...]


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest:
    isolation_level: int
    topics: tuple[tuple[str, tuple[tuple[int, int], ...]], ...]  # (topic, ((partition, ts),))


@dataclass(frozen=True, slots=True)
class FindCoordinatorRequest:
    key: str
    key_type: int  # 0 group, 1 transaction


@dataclass(frozen=True, slots=True)
class JoinGroupRequest:
    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    member_id: str
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]  # (name, metadata), in the member's preference


@dataclass(frozen=True, slots=True)
class SyncGroupRequest:
    group_id: str
    generation_id: int
    member_id: str
    assignments: tuple[tuple[str, bytes], ...]  # (member id, assignment); the leader's only


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    generation_id: int
    member_id: str


@dataclass(frozen=True, slots=True)
class LeaveGroupRequest:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class OffsetCommitRequest:
    group_id: str
    generation_id: int  # -1 with member "": a commit outside group management
    member_id: str
    topics: tuple[tuple[str, tuple[tuple[int, int, str | None], ...]], ...]  # (p, offset, md)


@dataclass(frozen=True, slots=True)
class OffsetFetchRequest:
    group_id: str
    topics: tuple[tuple[str, tuple[int, ...]], ...] | None  # None (v2+): every partition


@dataclass(frozen=True, slots=True)
class InitProducerIdRequest:
    transactional_id: str | None
    transaction_timeout_ms: int


Request = (
    ApiVersionsRequest | MetadataRequest | ProduceRequest | FetchRequest | ListOffsetsRequest
    | FindCoordinatorRequest | JoinGroupRequest | SyncGroupRequest | HeartbeatRequest
    | LeaveGroupRequest | OffsetCommitRequest | OffsetFetchRequest | InitProducerIdRequest
)  # fmt: skip


# --- responses ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ApiVersionsResponse:
    error_code: int
    api_keys: tuple[tuple[int, int, int], ...]  # (key, min, max)


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    error_code: int
    index: int
    leader: int  # node id; -1 when none


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    error_code: int
    name: str
    partitions: tuple[PartitionMetadata, ...]


@dataclass(frozen=True, slots=True)
class MetadataResponse:
    brokers: tuple[Broker, ...]
    cluster_id: str
    controller_id: int
    topics: tuple[TopicMetadata, ...]


@dataclass(frozen=True, slots=True)
class ProducePartitionResponse:
    index: int
    error_code: int
    base_offset: int = -1
    log_start_offset: int = -1


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    topics: tuple[tuple[str, tuple[ProducePartitionResponse, ...]], ...]


@dataclass(frozen=True, slots=True)
class FetchPartitionResponse:
    index: int
    error_code: int
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes = b""  # whole batches, concatenated


@dataclass(frozen=True, slots=True)
class FetchResponse:
    topics: tuple[tuple[str, tuple[FetchPartitionResponse, ...]], ...]
    error_code: int = 0


@dataclass(frozen=True, slots=True)
class ListOffsetsPartitionResponse:
    index: int
    error_code: int
    offset: int = -1
    timestamp: int = -1


@dataclass(frozen=True, slots=True)
class ListOffsetsResponse:
    topics: tuple[tuple[str, tuple[ListOffsetsPartitionResponse, ...]], ...]


@dataclass(frozen=True, slots=True)
class FindCoordinatorResponse:
    error_code: int
    node_id: int = -1
    host: str = ""
    port: int = -1


@dataclass(frozen=True, slots=True)
class JoinGroupResponse:
    error_code: int
    generation_id: int = -1
    protocol_name: str = ""
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, bytes], ...] = ()  # (member id, metadata): the leader's only


@dataclass(frozen=True, slots=True)
class SyncGroupResponse:
    error_code: int
    assignment: bytes = b""


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    error_code: int


@dataclass(frozen=True, slots=True)
class LeaveGroupResponse:
    error_code: int


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse:
    topics: tuple[tuple[str, tuple[tuple[int, int], ...]], ...]  # (topic, ((partition, err),))


@dataclass(frozen=True, slots=True)
class OffsetFetchPartitionResponse:
    index: int
    offset: int  # -1: nothing committed
    metadata: str | None = ""
    error_code: int = 0


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse:
    topics: tuple[tuple[str, tuple[OffsetFetchPartitionResponse, ...]], ...]
    error_code: int = 0


@dataclass(frozen=True, slots=True)
class InitProducerIdResponse:
    error_code: int
    producer_id: int = -1
    producer_epoch: int = -1


Response = (
    ApiVersionsResponse | MetadataResponse | ProduceResponse | FetchResponse
    | ListOffsetsResponse | FindCoordinatorResponse | JoinGroupResponse | SyncGroupResponse
    | HeartbeatResponse | LeaveGroupResponse | OffsetCommitResponse | OffsetFetchResponse
    | InitProducerIdResponse
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ConsumerSubscription:
    """A consumer-protocol member's metadata in JoinGroup (only what the gateway reads)."""

    topics: tuple[str, ...]
    user_data: bytes | None = None


@dataclass(frozen=True, slots=True)
class ConsumerAssignment:
    """A consumer-protocol member's assignment in SyncGroup."""

    partitions: tuple[tuple[str, tuple[int, ...]], ...]
    user_data: bytes | None = field(default=None)
