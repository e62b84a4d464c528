"""Every limit and timeout in one place, with units in the names.

Theory of operation
-------------------
Configuration objects are frozen dataclasses. Each field has a default, a type, and (where it
matters) a range checked by :meth:`_Config.validate`. Files are TOML whose keys are exactly the
field names; an unknown key, a wrong type or an out-of-range value raises
:class:`~bookkeeper_aio.errors.ConfigError` naming the key, so a typo never silently falls back
to a default.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

from .errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


def parse_address(text: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (IPv6 hosts in brackets) into (host, port).

    Raises:
        ConfigError: not of that form, or the port is out of range.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def check_tls_files(
    owner: str, ca_file: str | None, cert_file: str | None, key_file: str | None
) -> None:
    """A certificate needs its key (and the other way round); a client certificate is only
    sent over TLS, so it needs the CA that TLS verifies the server with.

    Raises:
        ConfigError: an incomplete combination.
    """
    if (cert_file is None) != (key_file is None):
        raise ConfigError(f"{owner}: tls_cert_file and tls_key_file go together")
    if cert_file is not None and ca_file is None:
        raise ConfigError(f"{owner}: tls_cert_file needs tls_ca_file (the server's CA)")


def set_options(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` options as config overrides: values in TOML syntax (``3``, ``true``,
    ``"x"``), anything else taken as a bare string.

    Raises:
        ConfigError: an item without ``=``.
    """
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            overrides[key.strip()] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            overrides[key.strip()] = text
    return overrides


@dataclass(frozen=True)
class _Config:
    """Shared loading and validation of configuration dataclasses."""

    # Keys whose unit suffix would make them positive, but for which 0 means "at once".
    ZERO_ALLOWED: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], source: str = "config") -> Self:
        """Build from a mapping of field names to values, checking names and types.

        Raises:
            ConfigError: an unknown key, a wrong type or an invalid value.
        """
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            valid = ", ".join(sorted(names))
            raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)}; valid keys: {valid}")
        converted = {k: _coerce(k, v, hints[k], source) for k, v in values.items()}
        config = cls(**converted)
        config.validate()
        return config

    @classmethod
    def from_file(cls, path: str | Path, overrides: Mapping[str, Any] | None = None) -> Self:
        """Load a TOML file; ``overrides`` (e.g. command-line flags) win over the file.

        Raises:
            ConfigError: the file cannot be read or parsed, or a value is invalid.
        """
        try:
            with open(path, "rb") as f:
                values = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
        return cls.from_mapping({**values, **(overrides or {})}, source=str(path))

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields changed, validated."""
        config = dataclasses.replace(self, **changes)
        config.validate()
        return config

    def validate(self) -> None:
        """Check ranges; subclasses add their own rules. NaN and infinities are never valid
        (a comparison with NaN is always false, so ``value <= 0`` would let it through).

        Raises:
            ConfigError: a value is out of range.
        """
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{f.name} must be a finite number, got {value}")
            positive = f.name.endswith(("_max", "_s", "_ms", "_bytes")) and not f.name.endswith(
                "_wait_ms"
            )
            if f.name in self.ZERO_ALLOWED and isinstance(value, int | float) and value < 0:
                raise ConfigError(f"{f.name} must be >= 0, got {value}")
            if f.name in self.ZERO_ALLOWED:
                continue
            if positive and isinstance(value, int | float) and value <= 0:
                raise ConfigError(f"{f.name} must be > 0, got {value}")


def _coerce(key: str, value: Any, hint: Any, source: str) -> Any:
    """Check ``value`` against a field's type; accept ints for floats and lists for tuples."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in typing.get_args(hint):
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{source}: {key} must be a list of strings, got {value!r}")
        return tuple(value)
    if hint is float and type(value) is int:
        return float(value)
    if hint is bool and type(value) is str and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if type(value) is not hint:
        raise ConfigError(
            f"{source}: {key} must be {hint.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


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
    journal_preallocate_bytes: int = 16 * MiB  # zero-filled ahead so fdatasync skips metadata
    # Journal files opened O_DIRECT (not through the page cache) where the fs supports it.
    journal_direct_io: bool = True
    # Journal files a checkpoint retires but keeps for reuse: overwriting blocks a file already
    # has skips the zero-fill, half of a journal's writes to the disk. 0: delete them.
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
