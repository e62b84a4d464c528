"""Autorecovery's metrics (``bookkeeper_autorecovery_*``): under-replicated ledgers and loss
figures (from the auditor, in the process that holds the seat), copies made by this
process's worker (their rate is the copy rate), jobs and limits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import Metric

from .families import counter, gauge

P = "bookkeeper_autorecovery_"
# Worker counters exported as counters when present: key -> help.
_WORKER_COUNTERS = {
    "entries_copied": "Entries copied to replacement bookies by this process",
    "bytes_copied": "Payload bytes copied by this process (rate(): the copy rate)",
    "marks_done": "Under-replicated marks completed by this process",
    "marks_failed": "Mark attempts that failed (retried later)",
    "replacements": "Bookies replaced in ledgers' ensembles",
    "ledgers_recovered": "Open ledgers fenced and recovered before re-replication",
    "lock_conflicts": "Marks another process was already working on",
    "copies_lost_before_sync": "Copies answered, then lost: their target restarted before its sync",
}


class AutorecoveryCollector:
    """A prometheus_client collector of one autorecovery service (process or in-bookie)."""

    def __init__(self, service: Any) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        yield from autorecovery_metrics(self.service)


def autorecovery_metrics(service: Any) -> Iterator[Metric]:
    """The families of one ``autorecovery.service.Autorecovery``."""
    worker = service.worker
    counters, config = worker.counters, service.config
    for key, doc in _WORKER_COUNTERS.items():
        yield counter(P + key, doc, counters[key])
    yield gauge(P + "jobs_running", "Marks being worked on by this process", len(worker.running))
    yield gauge(
        P + "replication_workers", "Limit: marks worked on at once", config.replication_workers
    )
    yield gauge(
        P + "replication_rate_bytes_per_s",
        "Limit: copy rate of this process",
        config.replication_rate_bytes_per_s,
    )
    yield counter(
        P + "rate_limit_wait_seconds",
        "Time copies waited for the rate limit",
        worker.limiter.waited_s,
    )
    yield counter(
        P + "restarts",
        "Restarts of the service after a failure",
        service.counters["restarts"] + service.counters["restarts_after_bug"],
    )
    auditor = service.auditor
    yield gauge(
        P + "is_auditor", "1 in the process that holds the auditor seat", int(auditor is not None)
    )
    if auditor is None:
        return  # the figures below are the auditor's: query max() over the processes
    stats = auditor.statistics()
    yield gauge(
        P + "under_replicated_ledgers",
        "Ledgers marked under-replicated",
        stats["under_replicated_ledgers"],
    )
    yield gauge(P + "bookies_registered", "Bookies registered", stats["bookies_registered"])
    yield gauge(
        P + "bookies_lost",
        "Bookies lost whose ledgers are not yet back at WQ",
        len(stats["bookies_lost_not_restored"]),
    )
    yield counter(
        P + "cluster_bytes_copied",
        "Bytes copied by every autorecovery process",
        stats["bytes_copied"],
    )
    if stats["loss_to_wq_s_last"] is not None:
        yield gauge(
            P + "loss_to_wq_seconds_last",
            "Last loss: time until every ledger was back at its write quorum",
            stats["loss_to_wq_s_last"],
        )
