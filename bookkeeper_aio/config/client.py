"""A client's configuration (:class:`ClientConfig`) and its metadata store's
(:class:`MetadataConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from ..errors import ConfigError
from .base import KiB, MiB, _Config, check_tls_files


@dataclass(frozen=True)
class ClientConfig(_Config):
    """Limits and timeouts of a client (connections to bookies)."""

    ZERO_ALLOWED: ClassVar[frozenset[str]] = frozenset(
        {"recovery_read_batch_entries", "read_batch_entries"}
    )

    connect_timeout_s: float = 5.0
    request_timeout_s: float = 10.0  # any request without its own longer deadline
    frame_bytes_max: int = 5 * MiB
    bookie_requests_in_flight_max: int = 5_000  # per connection; below the bookie's bound
    timeout_sweep_interval_s: float = 0.1  # how often pending requests' deadlines are checked
    reconnect_backoff_s: float = 0.1  # first wait before reconnecting to a failed bookie
    reconnect_backoff_max_s: float = 5.0
    # A bookie answering TOO_MANY_REQUESTS to an add: retried after a backoff from the first
    # to the max (doubling, jittered), at most this many times in a row, then replaced.
    overload_retry_backoff_s: float = 0.01
    overload_retry_backoff_max_s: float = 1.0
    overload_retries_max: int = 20
    client_name: str = field(default="bookkeeper-aio")
    # Ledger handles.
    adds_pending_max: int = 10_000  # per writer; past it append() waits (backpressure)
    adds_pending_bytes_max: int = 16 * MiB  # per writer: payload bytes pending, same effect
    bookie_backlog_bytes_max: int = 32 * MiB  # unanswered bytes to one bookie: writers wait
    add_batch_entries_max: int = 256  # adds to one bookie in one loop turn go in one frame
    add_batch_bytes_max: int = 1 * MiB  # payload bytes per batch frame (< frame_bytes_max)
    # Add requests one writer leaves unanswered per bookie; later adds wait for an answer and
    # then go together (batches grow with the load instead of one per loop turn).
    add_batches_in_flight_max: int = 4
    explicit_lac_interval_s: float = 0.5  # idle writer sends its LAC so tailers see the end
    ensemble_changes_max: int = 1_000  # per writer, then the handle fails
    metadata_retries_max: int = 20  # compare-and-swap attempts per metadata change
    speculative_read_timeout_s: float = 0.5  # then the read also goes to the next replica
    long_poll_timeout_ms: int = 5_000  # a tailer's wait for the LAC to move
    recovery_reads_parallel_max: int = 256  # a window: recovery reads two ahead, writes one
    # Past this many entries read one by one, recovery reads the tail in ReadBatchRequests of
    # this many entries where every bookie holds every entry (E == WQ); 0: one by one.
    recovery_read_batch_entries: int = 64
    reads_parallel_max: int = 1_000  # entries of one read(first, last) in flight at once
    # A read of a range goes in ReadBatchRequests of this many entries where every bookie holds
    # every entry (E == WQ; client/range_reads.py); 0: one ReadRequest per entry.
    read_batch_entries: int = 256
    close_timeout_s: float = 30.0  # waiting for pending adds before a close gives up
    min_racks_per_write_quorum: int = 1  # >1: rack-aware placement
    strict_placement: bool = False  # BP-31: fail rather than under-spread a write set
    # Logs (bookkeeper_aio/logs, docs/logs.md).
    log_read_ahead_bytes_max: int = 4 * MiB  # payload bytes a log reader holds read ahead
    log_read_batch_entries_max: int = 256  # entries one read-ahead step asks for at once
    log_read_records_max: int = 10_000  # records one read_log call returns at most
    log_read_retries_max: int = 10  # failed reads of one batch before a log reader raises
    log_open_timeout_s: float = 60.0  # a writer's takeover: epoch, recovery, first ledger
    log_rollover_timeout_s: float = 30.0  # a rollover: drain, close, compare-and-swap
    # BP-31: writers and readers mark a ledger under-replicated when they see a copy missing
    # (a bookie failed after the entry reached AQ; a replica's error or bad digest).
    mark_short_copies: bool = True
    # BP-31 "no repair in the read path": a replica whose copy of a confirmed entry is corrupt
    # (bad digest) or unreadable (IO_ERROR) gets the good copy written back (recovery flag)
    # once a read found one; a copy that cannot be written back is marked as above.
    read_repair: bool = True
    # TLS to the bookies (docs/operations.md): the CA that signed their certificates; a
    # client certificate and key for bookies that require one (mutual TLS).
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    def validate(self) -> None:
        super().validate()
        check_tls_files("client", self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
        backoffs = (("reconnect_backoff_s", "reconnect_backoff_max_s"),
                    ("overload_retry_backoff_s", "overload_retry_backoff_max_s"))  # fmt: skip
        for first, most in backoffs:
            if getattr(self, first) > getattr(self, most):
                raise ConfigError(f"{first} must be <= {most}")
        if self.add_batch_bytes_max > self.frame_bytes_max // 2:
            raise ConfigError(
                f"add_batch_bytes_max ({self.add_batch_bytes_max}) must leave room in a frame: "
                f"at most frame_bytes_max / 2 ({self.frame_bytes_max // 2})"
            )


@dataclass(frozen=True)
class MetadataConfig(_Config):
    """Timeouts, retries, leases and limits of the metadata store client (docs/metadata.md)."""

    call_timeout_s: float = 5.0  # one store operation, retries included
    attempt_timeout_s: float = 2.0  # one RPC attempt; a slow endpoint is then retried/rotated
    retries_max: int = 10  # attempts per operation that is safe to retry
    retry_backoff_s: float = 0.05  # first backoff; doubles, jittered
    retry_backoff_max_s: float = 1.0
    grpc_reconnect_backoff_max_ms: int = 1_000  # gRPC's own reconnect backoff (default 120 s)
    lease_ttl_s: int = 10  # a killed bookie disappears after this long
    keepalive_interval_s: float = 3.0  # lease refresh period (well below the TTL)
    watch_queue_max: int = 1000  # buffered watch events per watcher
    list_page_max: int = 1000  # keys per page when listing ledgers
    value_bytes_max: int = 256 * KiB  # one encoded value (etcd refuses requests > 1.5 MiB)
    create_attempts_max: int = 16  # random ledger ids tried before giving up
    # etcd over TLS (an etcds:// URI; docs/operations.md): the CA that signed etcd's
    # certificate, and a client certificate and key if etcd requires one.
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    def validate(self) -> None:
        super().validate()
        check_tls_files("metadata", self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
        if self.keepalive_interval_s >= self.lease_ttl_s:
            raise ConfigError(
                f"keepalive_interval_s ({self.keepalive_interval_s}) must be below "
                f"lease_ttl_s ({self.lease_ttl_s})"
            )
