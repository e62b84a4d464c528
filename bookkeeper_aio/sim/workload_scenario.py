"""The scenario of a seed: what it decides up front (:func:`draw_scenario`: bookies, quorums,
writers, entries, fault rates and counts), and the seed families drawn on top of it
(sim/workload.py says how a run plays a scenario).

Seed families: half of the seeds are *storms* (recoverers racing busy writers on a lossy,
reordering network); most journal-less seeds (BP-46 bookies) are *power storms*
(:func:`_power_storm`): power cuts that take a bookie's last acknowledged, unsynced entries
while their ledger is still open, quick restarts, recoverers right after. Both are plain
random draws of the same agents with other probabilities, not scripts. In *shared-client*
seeds (:func:`maybe_share_client`) every writer appends through one client, as a service
writing many ledgers does: its adds to a bookie in one loop turn travel as one
``MultiAddRequest``, which the bookie journals as one record for all its ledgers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from .world import Faults

QUORUMS = ((3, 3, 2), (3, 2, 2), (4, 3, 2), (3, 3, 3), (4, 2, 2), (5, 3, 2), (2, 2, 2))
STORM_QUORUMS = ((2, 2, 2), (2, 2, 2), (3, 3, 3), (3, 3, 2))
# BP-46's own shapes: one lost copy decides an entry (QC = 1) or needs one more negative.
POWER_STORM_QUORUMS = ((2, 2, 2), (2, 2, 2), (3, 2, 2), (3, 2, 2), (3, 3, 2))
POWER_STORM_SHARE = 0.8  # of the journal-less seeds (40 %)


@dataclass
class Scenario:
    """Everything a seed decides up front."""

    bookies: int
    quorum: tuple[int, int, int]
    writers: int
    ledgers_per_writer: int
    entries_max: int
    outstanding_max: int
    recoveries: int
    crashes: int
    power_loss_share: float
    partitions: int
    slowdowns: int
    blips_per_s: float  # brief cuts (5-50 ms) between a client and a bookie
    slow_links: int  # a writer's link to one bookie gets slow for a while
    storm: bool  # recoverers keep striking at busy writers, who keep starting new ledgers
    journal_write_data: bool  # False: BP-46 bookies; a power loss then loses acknowledged copies
    fault_phase_s: float
    # Power storms (BP-46, journal-less seeds; see _power_storm); the defaults change nothing.
    power_storm: bool = False
    vanish_share: float = 0.25  # a writer's chance to vanish without closing a ledger
    power_cut_share: float = 0.0  # a vanishing writer's chance to take one of its bookies along
    busy_cut_share: float = 0.0  # a crash's chance to be a power cut of a busy writer's bookie
    restart_s: tuple[float, float] = (0.2, 3.0)  # a crashed bookie's downtime
    recover_on_restart: float = 0.0  # per open ledger of a restarted bookie: recover it
    power_loss_gap_s: float = 5.0  # journal-less runs: the least time between power losses
    liveness_s: float = 120.0
    check_interval_s: float = 0.1
    # Autorecovery seeds (sim/autorecovery.py: racks, lost bookies, DurabilityContract).
    autorecovery: Any = None
    # Race seeds (sim/races.py: ensemble changes racing a writer's death, lost fences).
    race: Any = None
    shared_client: bool = False  # every writer appends through one client (maybe_share_client)


def draw_scenario(rng: random.Random, faults: Faults) -> Scenario:
    """A random bounded scenario; also sets the random fault rates in ``faults``.

    Half of the seeds are *storms*: many recoveries racing busy writers on a lossy,
    reordering network with crashes, the conditions under which fencing and recovery bugs
    (#2614, #2615) show.
    """
    storm = rng.random() < 0.5
    bookies = rng.randint(3, 6)
    # Storms favour AQ == WQ: one negative then settles an entry and fencing stops at the
    # first bookie, the sharpest edge of the recovery protocol.
    quorums = STORM_QUORUMS if storm else QUORUMS
    quorum = rng.choice([q for q in quorums if q[0] < bookies])
    net = faults.net
    net.latency_s = (0.0001, rng.choice((0.005, 0.02) if storm else (0.001, 0.005, 0.02)))
    net.loss_rate = rng.choice((0.03, 0.06, 0.1) if storm else (0.0, 0.001, 0.01))
    net.duplicate_rate = rng.choice((0.0, 0.01, 0.05))
    net.reorder_rate = rng.choice((0.3, 0.5) if storm else (0.0, 0.1, 0.3))
    net.reorder_delay_s = rng.choice((0.2, 0.5) if storm else (0.02, 0.05))
    faults.disk.fsync_s = (0.0001, rng.choice((0.001, 0.01)))
    faults.disk.io_error_rate = rng.choice((0.0, 0.0, 0.001))
    faults.metadata_latency_s_max = rng.choice((0.0, 0.001) if storm else (0.0, 0.002, 0.02))
    faults.metadata_failure_rate = rng.choice((0.0, 0.0, 0.02))
    faults.metadata_lost_reply_rate = rng.choice((0.0, 0.0, 0.01))
    scenario = Scenario(
        bookies=bookies,
        quorum=quorum,
        writers=rng.randint(1, 3),
        ledgers_per_writer=rng.randint(1, 3),
        entries_max=rng.randint(5, 60),
        outstanding_max=rng.randint(1, 3) if storm else rng.randint(1, 10),
        recoveries=rng.randint(8, 16) if storm else rng.randint(1, 5),
        crashes=rng.randint(2, 5) if storm else rng.randint(0, 4),
        power_loss_share=rng.random(),
        partitions=rng.randint(0, 2),
        slowdowns=rng.randint(1, 3) if storm else rng.randint(0, 2),
        blips_per_s=rng.choice((20.0, 50.0)) if storm else rng.choice((0.0, 0.0, 5.0)),
        slow_links=rng.randint(2, 6) if storm else rng.randint(0, 1),
        storm=storm,
        journal_write_data=rng.random() < 0.6,
        fault_phase_s=rng.uniform(2.0, 8.0),
    )
    # Drawn last, and only for journal-less seeds: every other seed plays as before.
    if not scenario.journal_write_data and rng.random() < POWER_STORM_SHARE:
        _power_storm(rng, scenario, faults)
    return scenario


JOURNAL_ERROR_SHARE = 0.5  # of the seeds neither race, autorecovery nor power storms (~8 %)


def maybe_journal_errors(seed: int, sc: Scenario, faults: Faults) -> None:
    """Journal write errors during the faults, in some seeds (a generator of their own, so
    every other seed plays as before): a bookie whose journal write fails answers the batch
    with errors and stops itself (fail-stop); it comes back at the heal, replaying what its
    journal made durable."""
    rng = random.Random(f"journal-errors-{seed}")
    if sc.power_storm or sc.autorecovery is not None or sc.race is not None:
        return
    if rng.random() < JOURNAL_ERROR_SHARE:
        faults.disk.journal_error_rate = rng.choice((0.01, 0.05))


SHARED_CLIENT_SHARE = 0.3  # of the seeds that are not race seeds
SHARED_TICK_S = 0.1  # shared-client writers resume after a pause on multiples of this


def maybe_share_client(seed: int, sc: Scenario) -> None:
    """Have every writer of ``sc`` append through one client in some seeds (a generator of
    their own, so every other seed plays as before). Not in race seeds: their strikes kill a
    writer's process, which would take every writer's connections along."""
    rng = random.Random(f"shared-client-{seed}")
    if sc.race is None and rng.random() < SHARED_CLIENT_SHARE:
        sc.shared_client = True
        # A lone add of a turn goes as itself: a MultiAddRequest needs a third writer.
        sc.writers = max(sc.writers, rng.randint(3, 5))


def _power_storm(rng: random.Random, sc: Scenario, faults: Faults) -> None:
    """Turn a journal-less seed into a *power storm* (BP-46's data-loss scenarios).

    Without the journal, what a bookie acknowledged but had not synced is gone after a power
    cut: typically the last entries of a ledger, above the LAC the other bookies know. That
    matters while the ledger is open (its writer vanished, paused, or waits for a slower
    replica) and someone recovers it right after the bookie is back, before the repair: the
    bookie must answer "unknown" (limbo), not "no such entry". So: writers that vanish often,
    power cuts that take a vanishing writer down together with one of its bookies (same rack)
    or hit a bookie that acknowledged adds still in flight elsewhere, quick restarts,
    recoverers sent to the restarted bookie's open ledgers, slow replicas, and quorums where
    one lost copy matters (E2/WQ2/AQ2, E3/WQ2/AQ2: QC = 1; E3/WQ3/AQ2: QC = 2).
    """
    sc.power_storm, sc.storm = True, False  # writers start new ledgers, but few recoverers
    sc.recoveries = rng.randint(1, 4)
    sc.entries_max = rng.randint(3, 20)  # short ledgers: more of them end while faults last
    net = faults.net
    net.loss_rate = rng.choice((0.0, 0.001, 0.01))
    net.reorder_rate = rng.choice((0.0, 0.1, 0.3))
    net.reorder_delay_s = rng.choice((0.02, 0.05))
    sc.blips_per_s = rng.choice((0.0, 5.0))
    # A slow replica keeps adds in flight while a fast one already acknowledged them: the
    # fast one's power cut then loses an entry whose other copy is still on its way.
    sc.slowdowns = rng.randint(1, 3)
    sc.crashes = rng.randint(2, 5)
    sc.quorum = rng.choice([q for q in POWER_STORM_QUORUMS if q[0] < sc.bookies])
    # Power losses are the targeted cuts; the other crashes are kill -9 (they keep the page
    # cache). A bookie syncs its engine at least every 3 s (SimBookie.config), so 3.5 s after
    # a power loss the other copies of whatever it lost are durable: one lost copy at a time.
    sc.power_loss_share = 0.0
    sc.power_loss_gap_s = 3.5
    sc.vanish_share = 0.5
    sc.power_cut_share = 1.0
    sc.busy_cut_share = 0.3
    sc.fault_phase_s = rng.uniform(3.0, 8.0)
    sc.restart_s = (0.05, rng.choice((0.3, 1.0)))
    sc.recover_on_restart = rng.choice((0.75, 1.0))
