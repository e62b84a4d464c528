"""The configurations of the services built on the client: the Kafka gateway
(:class:`KafkaConfig`) and the Spark sink and source (:class:`SparkConfig`)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .base import MiB, _Config, parse_address


@dataclass(frozen=True)
class KafkaConfig(_Config):
    """The Kafka gateway's configuration (``python -m bookkeeper_aio.kafka --config FILE``;
    docs/kafka.md)."""

    kafka_listen: str = "127.0.0.1:9092"
    kafka_advertised_address: str | None = None  # what clients are told; defaults to listen
    kafka_metadata_uri: str | None = None  # etcd://HOST:PORT[,...]/ROOT (or --metadata)
    kafka_lease_ttl_s: int = 10  # a killed gateway's partitions are free after this long

    # Topics: Kafka's auto.create.topics.enable, and what a topic gets when unspecified.
    kafka_auto_create_topics: bool = False
    kafka_default_partitions: int = 1
    kafka_default_ensemble_size: int = 3
    kafka_default_write_quorum: int = 3
    kafka_default_ack_quorum: int = 2
    kafka_segment_bytes_max: int = 64 * MiB  # a partition's log rolls to a new ledger past it
    # Recent batches kept per owned partition, so consumers keeping up read no bookie.
    kafka_tail_cache_bytes_max: int = 8 * MiB

    # Wire limits.
    kafka_request_bytes_max: int = 16 * MiB  # one request; larger: the connection is closed
    kafka_batch_bytes_max: int = 1 * MiB  # one record batch (MESSAGE_TOO_LARGE past it)
    kafka_connections_max: int = 1024
    kafka_connection_requests_in_flight_max: int = 64  # per connection; then stop reading
    kafka_fetch_bytes_max: int = 16 * MiB  # one fetch answer, whatever the client asks
    kafka_fetch_wait_ms_max: int = 30_000  # caps a fetch's max_wait_ms
    kafka_produce_wait_ms_max: int = 30_000  # caps a produce's wait for its acknowledgement

    # Consumer groups (Kafka's group.min/max.session.timeout.ms, initial rebalance delay).
    kafka_group_session_timeout_ms_min: int = 6_000
    kafka_group_session_timeout_ms_max: int = 1_800_000
    kafka_group_initial_rebalance_wait_ms: int = 0
    kafka_group_members_max: int = 1_000
    kafka_groups_max: int = 10_000

    # Idempotent producers remembered per partition, and batches read back at a takeover.
    kafka_producers_max: int = 10_000
    kafka_producer_state_batches_max: int = 1_000
    kafka_producer_id_block: int = 1_000  # producer ids a gateway reserves at once

    kafka_takeover_timeout_s: float = 30.0  # fencing and recovering a partition's log
    kafka_shutdown_timeout_s: float = 10.0

    def validate(self) -> None:
        super().validate()
        parse_address(self.kafka_listen)
        if self.kafka_advertised_address is not None:
            parse_address(self.kafka_advertised_address)
        if self.kafka_group_initial_rebalance_wait_ms < 0:
            raise ConfigError("kafka_group_initial_rebalance_wait_ms must be >= 0")
        if self.kafka_group_session_timeout_ms_min > self.kafka_group_session_timeout_ms_max:
            raise ConfigError("kafka_group_session_timeout_ms_min must be <= ..._max")
        if self.kafka_batch_bytes_max > self.kafka_request_bytes_max:
            raise ConfigError("kafka_batch_bytes_max must be <= kafka_request_bytes_max")
        if not (
            self.kafka_default_ensemble_size
            >= self.kafka_default_write_quorum
            >= self.kafka_default_ack_quorum
            >= 1
        ):
            raise ConfigError("need kafka_default_ensemble_size >= write_quorum >= ack_quorum >= 1")

    @property
    def advertised_address(self) -> str:
        """The address clients are told to connect to."""
        return self.kafka_advertised_address or self.kafka_listen


@dataclass(frozen=True)
class SparkConfig(_Config):
    """Limits and timeouts of the Spark pipeline (``bookkeeper_aio.spark``, docs/spark.md).

    The data source takes any of these as an option of the same name (strings are parsed).
    """

    # Sink: rows go from Spark's thread to the client's event loop in chunks.
    write_chunk_rows_max: int = 2_000
    write_chunk_bytes_max: int = 4 * MiB
    # Source: a read task covers at most this many entries of one ledger (more ledgers or
    # longer ones: more tasks); it reads them in requests of read_batch_entries_max.
    partition_entries_max: int = 100_000
    read_batch_entries_max: int = 1_000
    # One call from a Spark thread into the client's loop (a chunk, a commit, a read batch).
    step_timeout_s: float = 300.0
    # A commit that lost the log to another writer (LogFencedError) tries again this often.
    commit_attempts_max: int = 5
    # cleanup(): unfinished jobs and untracked job ledgers older than this are removed.
    job_ttl_s: float = 3_600.0
    # Metadata reads and ledger deletes a sweep keeps in flight at once.
    sweep_parallel_max: int = 32
    # The attempt records one job may hold (a runaway job is refused, not listed forever).
    job_attempts_max: int = 100_000
