"""A bookie's configuration (:class:`BookieConfig`), and the autorecovery keys it shares with an
autorecovery process (:class:`AutorecoverySettings`, :class:`AutorecoveryConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import ConfigError
from .base import KiB, MiB, _Config, check_tls_files, parse_address


@dataclass(frozen=True)
class AutorecoverySettings(_Config):
    """The autorecovery keys (BP-31), defined once: an autorecovery process
    (:class:`AutorecoveryConfig`) and a bookie running it in-process (``--autorecovery true``,
    :class:`BookieConfig`) read the same keys and run the same code (docs/durability.md)."""

    # A bookie gone from the registry this long is lost: its ledgers are re-replicated.
    lost_bookie_recovery_delay_s: float = 60.0
    # Every this often the auditor lists each fragment's entries on its bookies.
    audit_interval_s: float = 3600.0
    # An open ledger whose last fragment has a lost bookie is fenced and recovered only
    # after its writer had this long to replace the bookie itself.
    open_ledger_rereplication_grace_s: float = 30.0
    replication_workers: int = 2  # marks worked on at once by one process
    replication_rate_bytes_per_s: int = 256 * MiB  # copy rate of one process
    replication_entries_in_flight_max: int = 64  # entries read or written at once per mark
    audit_ledgers_in_flight_max: int = 16  # ledgers checked at once by an audit
    replication_lock_ttl_s: int = 10  # a dead worker's lock on a mark expires after this
    replication_retry_backoff_s: float = 5.0  # a mark that failed waits this long first

    ZERO_ALLOWED: ClassVar[frozenset[str]] = frozenset(
        {"lost_bookie_recovery_delay_s", "open_ledger_rereplication_grace_s"}
    )

    def validate(self) -> None:
        super().validate()
        if self.replication_workers < 0:
            raise ConfigError(f"replication_workers must be >= 0, got {self.replication_workers}")
        if self.replication_lock_ttl_s < 2:
            raise ConfigError(
                f"replication_lock_ttl_s must be >= 2, got {self.replication_lock_ttl_s}"
            )


@dataclass(frozen=True)
class BookieConfig(AutorecoverySettings):
    """A bookie's configuration (``python -m bookkeeper_aio.bookie --config FILE``)."""

    # 0: the integrity check runs at boot only.
    ZERO_ALLOWED: ClassVar[frozenset[str]] = AutorecoverySettings.ZERO_ALLOWED | {
        "data_integrity_check_interval_s",
        "engine_copy_file_bytes",
        "engine_write_rate_bytes_per_s",
        "gc_interval_s",
        "gc_overreplicated_wait_s",
        "scrub_interval_s",
    }

    # Where it listens and how clients find it.
    listen: str = "127.0.0.1:3181"
    advertised_address: str | None = None  # bookie id; defaults to ``listen``
    journal_dir: str = "data/journal"
    ledger_dirs: tuple[str, ...] = ("data/ledgers",)
    engine: str = "rocksdb"  # rocksdb | files | memory
    engine_direct_io: bool = True  # rocksdb: SSTs written O_DIRECT where the fs supports it
    # rocksdb: payloads in blob files, so compactions move keys only. For bookies writing many
    # ledgers at once (+24-32 % at 100); -4-8 % for one (docs/engines.md).
    engine_blob_files: bool = False
    # rocksdb with journal_write_data: puts gather in one write batch up to this many bytes
    # before they reach RocksDB (any read, sync or delete writes it first); 1: each at once.
    # One add at a time: ~25 us less CPU per add and bookie (docs/engines.md).
    engine_write_behind_bytes: int = 1 * MiB
    # rocksdb: its flushes and compactions write at most this fast per ledger dir (RocksDB's
    # rate limiter, in bursts of 2 ms), so the journal's fdatasyncs on the same disk do not
    # wait behind megabytes of SST writes: open-loop p99 at 8,000 adds/s 72-112 -> 16-85 ms on
    # the benchmarks' VM (docs/performance.md). The flushes must keep up with the adds
    # (entries/s x entry bytes, plus compactions with many ledgers). 0: no limit.
    engine_write_rate_bytes_per_s: int = 64 * MiB
    # rocksdb: autorecovery's deferred-sync copies are written into SST files of about this
    # many bytes and ingested at the next engine sync, around the memtables and the rate limit
    # above (engines/copy_files.py); the copy is paced by replication_rate_bytes_per_s instead.
    # 0: through the memtables, paced with the writers' flushes.
    engine_copy_file_bytes: int = 64 * MiB

    # Wire limits.
    frame_bytes_max: int = 5 * MiB  # like BookKeeper's nettyMaxFrameSizeBytes
    connections_max: int = 1024
    connection_requests_in_flight_max: int = 10_000  # past it: TOO_MANY_REQUESTS
    connection_in_flight_bytes_max: int = 64 * MiB  # payload bytes awaiting the journal
    # Answer bytes not yet sent (queued or in the socket's buffer): past it the connection
    # stops reading and handling requests, and long-poll or fence reads wait to be answered.
    connection_output_bytes_max: int = 8 * MiB
    handshake_timeout_s: float = 10.0
    # A greeted connection with nothing in flight that completes no request for this long is
    # closed, within one more period (idle clients; slowloris: a frame trickled in byte by byte
    # never completes).
    connection_idle_timeout_s: float = 600.0
    multi_add_parts_max: int = 1024  # parts of one MultiAddRequest; more: BAD_REQUEST
    # Entries of one add request (an AddBatchRequest, or a MultiAddRequest's parts together);
    # past it the rest are BAD_REQUEST: work per frame is bounded, not just its bytes.
    request_entries_max: int = 65_536

    # Journal: group commit bounded by bytes and by wait time, then fdatasync.
    journal_batch_bytes_max: int = 512 * KiB
    journal_batch_wait_ms: float = 0.0  # 0: write as soon as the disk is free (adaptive)
    # The bookie process's sys.setswitchinterval: how long the journal thread, back from its
    # write or fdatasync, may wait for the GIL while the event loop runs (four times a batch).
    # Python's 5 ms put up to 20 ms into a loaded bookie's every batch: open-loop p99 at
    # 10,000 adds/s 73-111 -> 44-48 ms on the benchmarks' VM (docs/performance.md).
    gil_switch_interval_s: float = 0.0005
    journal_queue_bytes_max: int = 64 * MiB  # appended, not yet durable; past it, stop reading
    # The engine's backlog (rocksdb: memtables waiting for their flush) is looked at after this
    # many bytes written to it; under pressure the bookie stops reading requests, and looks
    # again every engine_pressure_poll_s until it is gone (docs/operations.md).
    engine_pressure_check_bytes: int = 1 * MiB
    engine_pressure_poll_s: float = 0.005
    # Reads the engine may have to fetch from the disk (Engine.can_read_now) run in this many
    # threads, so one blocks neither the event loop nor the other reads (bookie/read_pool.py);
    # 0: on the loop. With read_queue_max waiting or running, a further read runs on the loop.
    read_threads: int = 4
    read_queue_max: int = 1024
    journal_file_bytes_max: int = 256 * MiB  # roll over to a new file past this
    journal_preallocate_bytes: int = 16 * MiB  # allocated ahead of the write position
    # How a new journal file's blocks are allocated ahead: "fallocate" (the file system
    # allocates them unwritten: no bytes written, and each fdatasync also commits their
    # conversion) or "zeros" (real zeros written: each journal byte is written twice, and an
    # fdatasync persists data only). Where fallocate is not supported the journal writes zeros.
    # On the benchmarks' VM fallocate took the closed loop 26k -> 34k adds/s, one add's p50
    # +0.05 ms (docs/performance.md, "The journal's preallocation").
    journal_preallocate_mode: str = "fallocate"
    # Journal files opened O_DIRECT (not through the page cache) where the fs supports it.
    journal_direct_io: bool = True
    # Journal files a checkpoint retires but keeps for reuse: overwriting blocks a file already
    # has written needs no preallocation (no zeros written, no conversions to commit). 0:
    # delete them.
    journal_recycle_files: int = 2

    # Checkpoint: sync the engine, then drop journal files it covers.
    checkpoint_interval_s: float = 10.0
    # A listing of deferred-sync copies waits at most this long for the engine syncs that make
    # them durable (bookie/deferred.py); then it answers IO_ERROR and the worker retries.
    list_sync_timeout_s: float = 60.0

    # Long-poll reads parked waiting for the LAC to advance.
    long_poll_parked_max: int = 10_000
    connection_long_polls_max: int = 1_000  # parked by one connection: none takes them all
    long_poll_timeout_ms_max: int = 60_000

    # Ledger states cached in memory (master key, fence, best LAC); least recently loaded ones
    # without parked reads or a pending fence are dropped past it and reloaded from the engine.
    ledger_cache_max: int = 100_000

    # Read-only mode when a ledger dir fills up.
    disk_check_interval_s: float = 10.0
    disk_usage_threshold: float = 0.95  # read-only at or above this fraction used
    disk_usage_lwm_threshold: float = 0.90  # writable again below this
    force_read_only: bool = False

    # Metadata store: registration, cookies (none: the bookie runs unregistered).
    metadata_uri: str | None = None  # etcd://HOST:PORT[,...]/ROOT or memory://NAME
    rack: str | None = None  # network location for placement, e.g. "/zone-a/rack-1"
    lease_ttl_s: int = 10  # a bookie killed with kill -9 disappears after this long

    # BP-46: running without the journal (see docs/operations.md#running-without-the-journal).
    journal_write_data: bool = True  # False: adds skip the journal (fences etc. still use it)
    data_integrity_check_interval_s: float = 60.0  # limbo repair and entry checks; 0: boot only
    data_integrity_copies_in_flight_max: int = 64  # entries copied from peers at once
    cookie_auto_fix: bool = False  # a dir lost its cookie: fence, limbo, restamp, repair (BP-46)

    # BP-31 garbage collection (bookie/gc.py, docs/durability.md): a pass every this often
    # deletes the data of tombstoned ledgers and reclaims the space (0: only on demand).
    gc_interval_s: float = 300.0
    # files engine: an entry log whose live fraction falls below this is compacted (its live
    # records copied forward, then the log dropped); 0 never compacts, 1 compacts any waste.
    compaction_live_ratio_min: float = 0.5
    # A tombstone is removed after this long even if a bookie never confirmed it; a bookie
    # away longer than this keeps every ledger it cannot check (default 7 days).
    tombstone_ttl_s: float = 7 * 86_400.0
    # An extra copy: a CLOSED ledger this bookie holds but is in no ensemble of (autorecovery
    # replaced it while it was away), with no under-replication mark, unchanged for this long,
    # is deleted here (BookKeeper's over-replicated ledger GC, gcOverreplicatedLedgerWaitTime;
    # 0: never), looked for every quarter of it, reading at most gc_overreplicated_checks_max.
    gc_overreplicated_wait_s: float = 86_400.0
    gc_overreplicated_checks_max: int = 1_000
    # Ledgers this bookie deleted, remembered (ids, in memory) so that a late add of a writer
    # that outlived its ledger (a zombie, fenced before the delete) is refused as fenced
    # instead of creating the ledger again: GC deleted the fence with the data.
    deleted_ledgers_remembered_max: int = 100_000

    list_entries_max: int = 100_000  # entry ids per LIST_ENTRIES answer

    # BP-31 bit rot: the scrubber re-reads every stored entry, checks both digests and repairs
    # a bad copy from a peer replica (bookie/scrubber.py). A pass starts this long after the
    # previous one started (0: only when asked, `shell scrub --bookie ID`) and reads at most
    # scrub_bytes_per_s: 8 MiB/s is a pass over 1 TiB in 36 hours.
    scrub_interval_s: float = 7 * 86_400.0
    scrub_bytes_per_s: int = 8 * MiB
    # BP-31 metadata recovery: keep each ledger's metadata as last read from the store (with
    # metadata_uri), read when the ledger is first seen and on every scrub pass, so that
    # `shell recover-metadata` can rebuild a lost store (bookie/ledger_records.py).
    ledger_records: bool = True
    ledger_records_max: int = 1_000  # per-ledger records per LEDGER_RECORDS answer
    shutdown_timeout_s: float = 30.0

    # BP-31: run the auditor election and replication workers in this process too (needs
    # metadata_uri); the autorecovery keys are those of AutorecoverySettings.
    autorecovery: bool = False
    # Testing only: a ledger dir's engine fails every call with EIO once a file named
    # INJECT_IO_ERROR exists in that dir (docs/durability.md, disk problems).
    engine_fault_injection: bool = False
    # Benchmarks only: timestamps of every add, journal batch, GC pause and checkpoint, written
    # to trace_dir/<bookie id>.json at shutdown (bookie/trace.py); at most trace_records_max
    # of each kind are kept.
    trace_dir: str | None = None
    trace_records_max: int = 2_000_000

    # The HTTP admin API and /metrics (docs/operations.md): HOST:PORT, bound to that only.
    http_listen: str | None = None
    # Latency and journal batch histograms (false: the counters and gauges only; the
    # benchmarks' metrics-cost row compares the two).
    metrics_latency: bool = True
    # TLS (docs/operations.md): the bookie's certificate and key; with tls_client_ca_file,
    # clients must present a certificate that CA signed (mutual TLS). tls_ca_file: the CA
    # this bookie trusts when it connects to other bookies (repair, in-process autorecovery).
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    tls_ca_file: str | None = None

    def validate(self) -> None:
        super().validate()
        parse_address(self.listen)
        if self.advertised_address is not None:
            parse_address(self.advertised_address)
        if self.engine not in ("rocksdb", "files", "memory"):
            raise ConfigError(f"engine must be rocksdb, files or memory, got {self.engine!r}")
        if not self.ledger_dirs:
            raise ConfigError("at least one ledger dir is needed")
        if not 0 < self.disk_usage_lwm_threshold <= self.disk_usage_threshold <= 1:
            raise ConfigError(
                "need 0 < disk_usage_lwm_threshold <= disk_usage_threshold <= 1, got "
                f"{self.disk_usage_lwm_threshold} and {self.disk_usage_threshold}"
            )
        if self.journal_preallocate_mode not in ("fallocate", "zeros"):
            raise ConfigError(
                "journal_preallocate_mode must be fallocate or zeros, "
                f"got {self.journal_preallocate_mode!r}"
            )
        if self.journal_recycle_files < 0:
            raise ConfigError("journal_recycle_files must be >= 0")
        if not self.list_sync_timeout_s > 0:
            raise ConfigError(f"list_sync_timeout_s must be > 0, got {self.list_sync_timeout_s}")
        if not 0 <= self.read_threads <= 64:
            raise ConfigError(f"read_threads must be in [0, 64], got {self.read_threads}")
        if self.journal_batch_wait_ms < 0:
            raise ConfigError("journal_batch_wait_ms must be >= 0")
        if not 1e-6 <= self.gil_switch_interval_s <= 1:
            raise ConfigError(
                f"gil_switch_interval_s must be in [1e-6, 1], got {self.gil_switch_interval_s}"
            )
        if self.journal_batch_bytes_max > self.journal_queue_bytes_max:
            raise ConfigError("journal_batch_bytes_max must be <= journal_queue_bytes_max")
        if not self.journal_write_data and not self.metadata_uri:
            raise ConfigError(
                "journal_write_data=false needs metadata_uri: after a crash the bookie must "
                "learn from the metadata store which ledgers to fence and repair (BP-46)"
            )
        if self.data_integrity_check_interval_s < 0 or self.data_integrity_copies_in_flight_max < 1:
            raise ConfigError(
                "data_integrity_check_interval_s must be >= 0 and "
                "data_integrity_copies_in_flight_max >= 1"
            )
        if self.journal_file_bytes_max < self.frame_bytes_max + self.journal_batch_bytes_max:
            raise ConfigError("journal_file_bytes_max must hold a batch plus the largest frame")
        if self.autorecovery and not self.metadata_uri:
            raise ConfigError("autorecovery=true needs metadata_uri (marks and locks live there)")
        if self.connection_long_polls_max > self.long_poll_parked_max:
            raise ConfigError("connection_long_polls_max must be <= long_poll_parked_max")
        if not 0 <= self.compaction_live_ratio_min <= 1:
            raise ConfigError(
                f"compaction_live_ratio_min must be in [0, 1], got {self.compaction_live_ratio_min}"
            )
        if self.http_listen is not None:
            parse_address(self.http_listen)
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError("tls_cert_file and tls_key_file go together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ConfigError("tls_client_ca_file needs tls_cert_file and tls_key_file")

    @property
    def bookie_id(self) -> str:
        """The address clients use for this bookie."""
        return self.advertised_address or self.listen


@dataclass(frozen=True)
class AutorecoveryConfig(AutorecoverySettings):
    """An autorecovery process (``python -m bookkeeper_aio.autorecovery --metadata URI``):
    the autorecovery keys plus where the cluster is and who this process is."""

    metadata_uri: str = ""  # etcd://HOST:PORT[,...]/ROOT or memory://NAME
    worker_id: str = ""  # how marks' locks and the auditor seat name this process; "" : host:pid
    lease_ttl_s: int = 10  # the auditor seat's lease: a dead auditor is replaced after this
    http_listen: str | None = None  # /metrics and the admin API (docs/operations.md)
    # TLS to the bookies, as ClientConfig's keys of the same names.
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    def validate(self) -> None:
        super().validate()
        if self.http_listen is not None:
            parse_address(self.http_listen)
        check_tls_files("autorecovery", self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
        if not self.metadata_uri:
            raise ConfigError("metadata_uri is required (--metadata URI)")
