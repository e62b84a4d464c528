"""Command-line options shared by the client benchmarks (writes, reads, tail, recovery), named
after BookKeeper's BenchThroughputLatency, and the client config they imply."""

from __future__ import annotations

import argparse
from typing import Any

from bookkeeper_aio.config import ClientConfig

PASSWORD = b"bench"


def add_client_arguments(p: argparse.ArgumentParser, *, outstanding: int = 1000) -> None:
    """The flags every client benchmark takes."""
    p.add_argument("--duration", type=float, default=10.0, metavar="S", help="measured seconds")
    p.add_argument("--warmup", type=float, default=1.0, metavar="S", help="unmeasured seconds")
    p.add_argument(
        "--outstanding",
        type=int,
        default=outstanding,
        metavar="N",
        help="operations in flight (closed loop; with --rate, the cap)",
    )
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        metavar="R",
        help="open loop: R operations/s, latency from the intended send time",
    )
    p.add_argument("--entry-size", type=int, default=1024, metavar="B")
    p.add_argument("--ensemble", type=int, default=3, metavar="E")
    p.add_argument("--write-quorum", type=int, default=3, metavar="W")
    p.add_argument("--ack-quorum", type=int, default=2, metavar="A")
    p.add_argument("--ledgers", type=int, default=1, metavar="L")
    p.add_argument(
        "--metadata",
        metavar="URI",
        help="use this cluster (etcd://HOST:PORT/ROOT) instead of starting one",
    )
    p.add_argument(
        "--bookies",
        type=int,
        default=None,
        metavar="N",
        help="bookie processes to start (default: the ensemble size)",
    )
    p.add_argument("--engine", default="rocksdb", choices=("rocksdb", "files", "memory"))
    p.add_argument(
        "--bookie-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a BookieConfig key for the started bookies (their --set), repeatable",
    )
    p.add_argument("--dir", metavar="DIR", help="where started servers and baselines write (tmp)")
    p.add_argument("--json", metavar="PATH", help="write the results here")


def client_config(outstanding: int, entry_bytes: int = 1024, **changes: Any) -> ClientConfig:
    """A client config whose bounds admit ``outstanding`` operations of ``entry_bytes`` in
    flight: the benchmark's own loop is the throttle (BenchThroughputLatency's semaphore), so
    ``append_nowait`` never refuses for lack of room. ``changes`` override any field."""
    default = ClientConfig()
    in_flight_bytes = 2 * outstanding * entry_bytes
    bounds: dict[str, Any] = {
        "adds_pending_max": max(default.adds_pending_max, outstanding + 1),
        "adds_pending_bytes_max": max(default.adds_pending_bytes_max, in_flight_bytes),
        "bookie_requests_in_flight_max": max(
            default.bookie_requests_in_flight_max, 2 * outstanding
        ),
        "request_timeout_s": 30.0,
    }
    if hasattr(default, "bookie_backlog_bytes_max"):  # a newer client bound, same reasoning
        bounds["bookie_backlog_bytes_max"] = max(default.bookie_backlog_bytes_max, in_flight_bytes)
    return default.replace(**{**bounds, **changes})


def quorum_label(args: argparse.Namespace) -> str:
    """``E3/WQ3/AQ2``."""
    return f"E{args.ensemble}/WQ{args.write_quorum}/AQ{args.ack_quorum}"
