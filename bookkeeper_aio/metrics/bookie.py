"""The bookie's metrics: requests, journal, queues and their limits, disks, read-only state,
garbage collection (``bookkeeper_bookie_*``; docs/operations.md has the list).

Everything is read from the bookie's objects at scrape time (``families.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .autorecovery import autorecovery_metrics
from .families import counter, dir_space, gauge, histogram, labelled, numbers

if TYPE_CHECKING:
    from ..bookie.server import Bookie

P = "bookkeeper_bookie_"
# Handler counters exported as counters of their own: key -> (name, help).
_HANDLER_COUNTERS = {
    "adds": ("entries_added", "Entries stored (each entry of a batch counts)"),
    "reads": ("reads", "Read requests"),
    "read_lacs": ("read_lacs", "Read-LAC requests"),
    "write_lacs": ("write_lacs", "Explicit-LAC writes"),
    "fences": ("fences", "Fence requests (fencing reads and read-LACs)"),
    "io_errors": ("io_errors", "Requests answered IO_ERROR"),
    "long_polls_refused": ("long_polls_refused", "Long polls refused: too many parked"),
    "ledgers_evicted": ("ledgers_evicted", "Ledger states dropped from the cache"),
    "copies_deferred": (
        "copies_deferred",
        "Copies stored without the journal (deferred sync), durable at the next engine sync",
    ),
    "lists_after_sync": (
        "lists_after_sync",
        "Listings that waited for an engine sync of the ledger's deferred-sync copies",
    ),
}


class BookieCollector:
    """A prometheus_client collector of one :class:`~bookkeeper_aio.bookie.server.Bookie`."""

    def __init__(self, bookie: Bookie) -> None:
        self.bookie = bookie

    def collect(self) -> Iterator[Metric]:
        bookie = self.bookie
        if bookie._handler is None:  # not started (yet): nothing to report
            return
        cfg, handler = bookie.config, bookie.handler
        yield from self._requests(handler)
        yield from self._journal()
        yield from self._connections()
        yield gauge(
            P + "read_only",
            "1 while the bookie refuses adds (disk full, forced)",
            int(handler.read_only),
        )
        yield gauge(P + "ledgers", "Ledgers stored", len(bookie.engine.ledgers()))
        yield gauge(P + "ledgers_cached", "Ledger states cached", len(handler._ledgers))
        yield gauge(P + "ledgers_unsynced_copies",
                    "Ledgers holding deferred-sync copies no engine sync covers yet",
                    len(handler.deferred))  # fmt: skip
        yield gauge(P + "ledger_cache_max", "Limit: ledger states cached", cfg.ledger_cache_max)
        yield gauge(P + "long_polls_parked", "Long-poll reads waiting", handler.parked)
        yield gauge(
            P + "long_poll_parked_max", "Limit: long polls parked", cfg.long_poll_parked_max
        )
        reads = handler.reads
        yield gauge(P + "reads_queued", "Reads waiting for or running in a read thread",
                    reads.queued)  # fmt: skip
        yield gauge(P + "read_queue_max", "Limit: reads queued for the threads", cfg.read_queue_max)
        yield counter(P + "reads_threaded", "Reads run in a read thread (may wait on the disk)",
                      reads.threaded)  # fmt: skip
        yield counter(
            P + "reads_inline",
            "Reads that may wait on the disk run on the event loop (no threads, or queue full)",
            reads.inline,
        )
        yield from self._disks()
        stats: dict[str, Any] = bookie.statistics()
        for key in ("gc", "compaction"):  # garbage collection's own statistics, if it keeps any
            if isinstance(stats.get(key), dict):
                yield from numbers(f"{P}{key}_", f"Bookie {key} statistic", stats[key])
        if bookie.integrity is not None:
            yield from numbers(
                P + "integrity_", "Data integrity check counter", bookie.integrity.counters
            )
        if bookie.autorecovery is not None:
            yield from autorecovery_metrics(bookie.autorecovery)

    def _requests(self, handler: Any) -> Iterator[Metric]:
        yield histogram(
            P + "add_request_seconds",
            "Add requests: received to durable answer (one per request)",
            handler.add_latency,
        )
        yield histogram(
            P + "read_request_seconds", "Plain read requests: time to answer", handler.read_latency
        )
        counters = handler.counters
        for key, (name, doc) in _HANDLER_COUNTERS.items():
            yield counter(P + name, doc, counters[key])
        refused = {k[4:]: v for k, v in counters.items() if k.startswith("add_")}
        yield labelled(
            CounterMetricFamily,
            P + "adds_refused",
            "Add entries refused, by status",
            "reason",
            refused,
        )

    def _journal(self) -> Iterator[Metric]:
        bookie, cfg = self.bookie, self.bookie.config
        journal = bookie._journal
        if journal is None:
            return
        stats = journal.statistics()
        for attr, name, doc in (
            ("sync_latency", "journal_sync_seconds", "Journal batch write + fdatasync"),
            ("batch_records", "journal_batch_records", "Records per journal batch"),
            ("batch_bytes", "journal_batch_bytes", "Bytes per journal batch"),
        ):
            hist = getattr(journal, attr, None)  # the simulator's journal keeps none
            if hist is not None:
                yield histogram(P + name, doc, hist)
        yield counter(P + "journal_records", "Journal records written", stats.get("records", 0))
        yield counter(P + "journal_written_bytes", "Journal bytes written", stats.get("bytes", 0))
        yield counter(P + "journal_fsyncs", "Journal fdatasyncs", stats.get("fsyncs", 0))
        yield gauge(
            P + "journal_queue_bytes",
            "Bytes appended, not yet durable",
            stats.get("queued_bytes", 0),
        )
        yield gauge(
            P + "journal_queue_bytes_max",
            "Limit: journal queue bytes (then stop reading requests)",
            cfg.journal_queue_bytes_max,
        )
        yield gauge(
            P + "journal_queue_records",
            "Records queued for the journal thread",
            stats.get("queued_records", 0),
        )
        yield counter(
            P + "journal_pressure_events",
            "Times the journal queue filled up",
            bookie.counters["journal_pressure_events"],
        )
        yield counter(
            P + "engine_pressure_events",
            "Times the engine's writes ran ahead of its flushes (then stop reading requests)",
            bookie.counters["engine_pressure_events"],
        )
        yield counter(
            P + "engine_pressure_seconds",
            "Time spent not reading requests while the engine caught up",
            bookie.counters["engine_pressure_ms"] / 1000,
        )
        yield counter(
            P + "checkpoints",
            "Checkpoints (engine synced, journal trimmed)",
            bookie.counters["checkpoints"],
        )

    def _connections(self) -> Iterator[Metric]:
        bookie, cfg = self.bookie, self.bookie.config
        conns = [c.statistics() for c in list(bookie.connections)]
        yield gauge(P + "connections", "Client connections open", len(conns))
        yield gauge(P + "connections_max", "Limit: connections", cfg.connections_max)
        yield counter(
            P + "connections_accepted",
            "Connections accepted",
            bookie.counters["connections_accepted"],
        )
        yield counter(
            P + "connections_refused",
            "Connections refused at connections_max",
            bookie.counters["connections_refused"],
        )
        for key, name, doc, limit in (
            (
                "in_flight",
                "requests_in_flight",
                "Requests being handled, all connections",
                cfg.connection_requests_in_flight_max,
            ),
            (
                "in_flight_bytes",
                "in_flight_bytes",
                "Payload bytes awaiting the journal",
                cfg.connection_in_flight_bytes_max,
            ),
            (
                "output_bytes",
                "output_bytes",
                "Answer bytes not yet sent",
                cfg.connection_output_bytes_max,
            ),
        ):
            yield gauge(P + name, doc, sum(c.get(key, 0) for c in conns))
            yield gauge(P + name + "_per_connection_max", f"Limit: {name} per connection", limit)

    def _disks(self) -> Iterator[Metric]:
        cfg = self.bookie.config
        used, free, total = (
            GaugeMetricFamily(P + f"ledger_dir_{k}_bytes", doc, labels=["dir"])
            for k, doc in (
                ("used", "Bytes used on the ledger dir's disk"),
                ("free", "Bytes free on the ledger dir's disk"),
                ("total", "Size of the ledger dir's disk"),
            )
        )
        dirs = _dirs_statistics(self.bookie)
        failed = set(dirs.get("ledger_dirs_failed", []))
        bad = GaugeMetricFamily(
            P + "ledger_dir_failed", "1: the dir is out of service", labels=["dir"]
        )
        for directory in cfg.ledger_dirs:
            space = dir_space(directory)
            if space is not None:
                for family, value in zip((used, free, total), space, strict=True):
                    family.add_metric([directory], value)
            bad.add_metric([directory], int(directory in failed))
        yield from (used, free, total, bad)
        yield gauge(
            P + "disk_usage_threshold",
            "Limit: read-only at this fraction used",
            cfg.disk_usage_threshold,
        )
        yield counter(
            P + "ledger_dirs_failed",
            "Ledger dirs taken out of service",
            self.bookie.counters["ledger_dirs_failed"],
        )
        yield counter(P + "copy_files_ingested",
                      "Files of deferred-sync copies ingested by the engine (rocksdb)",
                      dirs.get("copy_files_ingested", 0))  # fmt: skip
        yield counter(P + "copy_bytes_ingested",
                      "Bytes of deferred-sync copies ingested as files (rocksdb)",
                      dirs.get("copy_bytes_ingested", 0))  # fmt: skip


def _dirs_statistics(bookie: Bookie) -> dict[str, Any]:
    """The ledger dirs' statistics (bookie/ledger_dirs.py); none for a simulated engine."""
    from ..bookie.ledger_dirs import LedgerDirs

    engine = bookie._engine
    return engine.statistics() if isinstance(engine, LedgerDirs) else {}
