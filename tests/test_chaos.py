"""Chaos against real processes: etcd and 5 bookies, writers, a recovering reader, kill -9,
SIGSTOP/SIGCONT and restarts, a bookie lost for good with an autorecovery process; nothing
acknowledged may be lost, every ledger must close and be back at WQ.

A short round by default; ``CHAOS_DURATION_S`` (seconds of faults) and ``CHAOS_SEED`` change
it. The long run is ``python -m bookkeeper_aio.chaos --duration 600`` (``make chaos``).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from bookkeeper_aio.chaos import run_chaos, thawed_on_exit
from bookkeeper_aio.sandbox import Cluster

pytestmark = pytest.mark.process
DURATION_S = float(os.environ.get("CHAOS_DURATION_S", "25"))
SEED = int(os.environ.get("CHAOS_SEED", "20240605"))


def test_chaos_loses_nothing_acknowledged_and_closes_every_ledger(tmp_path: Path) -> None:
    with Cluster(tmp_path, 5, "rocksdb") as cluster, thawed_on_exit(cluster):
        report = asyncio.run(run_chaos(cluster, DURATION_S, SEED, say=print))
        # Healed: nothing frozen, nothing dead but the bookie lost for good.
        assert sum(not b.running for b in cluster.bookies) == report.lost_for_good == 1
    summary = report.summary()
    print(summary)
    assert report.ok, summary
    assert report.lost == 0 and report.corrupt == 0, summary
    assert not report.unclosed and report.closed_ledgers == report.ledgers, summary
    # The faults really happened and the workload really ran through them.
    assert report.kills >= 1 and report.freezes >= 1 and report.restarts >= report.kills, summary
    assert report.recoveries >= 1 and report.fenced + report.closed_under_writer >= 1, summary
    assert report.acknowledged >= 500 and report.verified_entries >= report.acknowledged, summary
    # BP-31 black-box: a bookie lost for good, and every ledger back at WQ at the end.
    assert report.back_at_wq == report.ledgers, summary
