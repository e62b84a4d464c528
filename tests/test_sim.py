"""The deterministic simulation: a sweep finds nothing, each bug switch is found, seeds replay.

``SIM_SEEDS=A-B`` widens the sweep of seeds 0-99 (``make sim`` runs seeds 0-999 from the
command line).
Sweeps run their seeds in parallel processes (``SIM_WORKERS``; same results). The fixed-sample
rate tests run only the seeds of the kind that plays the defect's conditions (race seeds,
autorecovery seeds): a count there is a floor for the whole range, whose other seeds can only
add catches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bookkeeper_aio.bookie import integrity
from bookkeeper_aio.sim.logs import has_log_act
from bookkeeper_aio.sim.loop import RealThreadError, VirtualTimeLoop
from bookkeeper_aio.sim.runner import KNOWN_BUGS, quiet_logging, run_seed, scenario_of, sweep


def _seeds() -> range:
    first, _, last = os.environ.get("SIM_SEEDS", "0-99").partition("-")
    return range(int(first), int(last) + 1)


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logger = logging.getLogger("bookkeeper_aio")
    level = logger.level
    quiet_logging()
    yield
    logger.setLevel(level)  # later tests check what is logged (caplog)


def test_sweep_without_bugs_finds_nothing() -> None:
    results = list(sweep(_seeds()))
    bad = [r.report() for r in results if not r.ok]
    assert not bad, "\n\n".join(bad[:3])
    # ... although it includes journal-less runs whose power losses took acknowledged copies
    # away (BP-46: the limbo protocol and the repair must make up for them).
    if len(results) >= 100:
        assert sum(r.scenario.power_storm for r in results) >= len(results) // 10
        assert sum(r.stats["acked_copies_lost"] > 0 for r in results) >= len(results) // 20
        # ... and autorecovery seeds whose lost bookies were replaced (DurabilityContract).
        ar = [r.stats["autorecovery"] for r in results if r.stats["autorecovery"]]
        assert sum(s.get("replacements", 0) > 0 for s in ar) >= len(results) // 10


def _autorecovery_seeds(seeds: range) -> list[int]:
    return [seed for seed in seeds if scenario_of(seed)[0].autorecovery is not None]


def _race_seeds(seeds: range) -> list[int]:
    return [seed for seed in seeds if scenario_of(seed)[0].race is not None]


def _catches(seeds: list[int], bug: str, invariant: str, floor: int) -> list[int]:
    """The seeds whose run with ``bug`` violates ``invariant``, in order, the sweep stopped
    once ``floor`` of them are found: the tests ask for a floor, and past it the rest of the
    sample could only add catches (a sample test took ~35 s of the suite run whole)."""
    caught: list[int] = []
    with contextlib.closing(sweep(seeds, [bug])) as results:
        for result in results:
            if any(v.invariant == invariant for v in result.violations):
                caught.append(result.seed)
                if len(caught) >= floor:
                    break
    return caught


def test_replication_ignoring_placement_is_caught_in_a_fixed_sample() -> None:
    """The bug switch is caught often, not once by luck: 22 of seeds 0-199 (83 of 0-999,
    docs/simulation.md), all autorecovery seeds (41 of 0-199); at least 10 here leaves room
    for timing changes elsewhere."""
    seeds = _autorecovery_seeds(range(200))
    caught = _catches(seeds, "replication-ignores-placement", "DurabilityContract", 10)
    assert len(caught) >= 10, caught


CLIENT_BUGS = ("recovery-reads-without-fence", "recovery-below-last-segment", "unknown-as-negative")
# BP-46 bookies (bookie/integrity.py), found by the journal-less power storms: a bookie back
# from a power loss answers "no such entry" for an entry it acknowledged and lost, and a
# recovery truncates it (acknowledged before, or after, the close). Or a bookie takes a power
# loss for a crash the system survived, and skips limbo (bookie/storage.py).
BOOKIE_BUGS = ("no-limbo", "no-fence-on-boot", "crash-always-kept-writes")
DATA_LOSS = {"NoDivergenceBetweenClientAndMetaData", "AllAckedEntriesAreReadable"}
# Logs (sim/logs.py): a new writer opens its ledger without recovering the previous one.
LOG_BUGS = ("log-takeover-without-recovery",)
# Autorecovery (sim/autorecovery.py): replacements chosen without regard to racks.
WORKER_BUGS = ("replication-ignores-placement",)
# Guaranteed write quorum (sim/gwq.py): no pinning; a close that does not wait for WQ.
GWQ_BUGS = ("gwq-no-pinning", "gwq-close-before-wq")


@pytest.mark.parametrize("bug", CLIENT_BUGS + BOOKIE_BUGS + LOG_BUGS + WORKER_BUGS + GWQ_BUGS)
def test_each_bug_switch_is_found_within_200_seeds(bug: str) -> None:
    results = list(sweep(range(200), [bug], stop_at_first=True))
    last = results[-1]
    assert not last.ok, f"--bug {bug}: no violation in seeds 0-199"
    # The violation is one of the protocol invariants, not a crash of the simulator.
    found = {v.invariant for v in last.violations}
    assert found - {"NoUnhandledErrors"}, last.report()
    if bug in BOOKIE_BUGS:
        assert found & DATA_LOSS, last.report()
    if bug in WORKER_BUGS:
        assert "DurabilityContract" in found, last.report()
    if bug in GWQ_BUGS:
        assert found & ({"ClosedLedgerEntriesAtWriteQuorum"} | DATA_LOSS), last.report()


@pytest.mark.parametrize("seed", [3534, 3575])
def test_crashed_bookies_that_kept_their_writes_come_back_without_limbo(seed: int) -> None:
    """Two journal-less bookies of one ensemble fail-stopped (a journal write error) and came
    back in limbo, where neither answers a fence: recovery waited for ever for one of them to
    leave limbo, which needs a recovery (Liveness). A crash the system survived loses nothing
    the engine wrote, so they now skip limbo; after a power loss (3575's other bookie) limbo
    stays."""
    result = run_seed(seed)
    assert result.ok, result.report()


def test_the_next_permanent_fault_waits_until_a_crashed_dead_disk_is_declared_lost() -> None:
    """Seed 6620 (E3/WQ2/AQ2): bookie-5's ledger disk died and bookie-5 crashed before it
    noticed, so it left no mark; the simulation took that as repaired and lost bookie-2 for
    good 1.4 s later, before the auditor had even seen bookie-5 leave: both copies of an
    acknowledged entry gone, which no system repairs in time. The next permanent fault now
    waits until every lost bookie, a crashed dead disk's too, was declared lost and its
    marks drained; the seed then keeps every invariant, autorecovery having replaced both."""
    result = run_seed(6620)
    assert result.ok, result.report()
    assert result.stats["autorecovery"]["replacements"] >= 2, result.stats["autorecovery"]


@pytest.mark.parametrize("seed", [7, 53, 92])
def test_a_seed_replays_exactly(seed: int) -> None:
    # 53: a bookie crash aborts several connections, whose order (and so the latencies drawn
    # for them) once came from a set of objects, ordered by their addresses. 92: a bookie that
    # stopped itself closed its read pool in a real thread, and the virtual clock jumped from
    # timer to timer while it ran (one of four traces per run; VirtualTimeLoop now refuses
    # threads).
    a, b, c = run_seed(seed), run_seed(seed), run_seed(seed)
    assert (a.trace, a.virtual_s, a.stats) == (b.trace, b.virtual_s, b.stats)
    assert (a.trace, a.virtual_s, a.stats) == (c.trace, c.virtual_s, c.stats)
    assert a.trace and a.virtual_s > 1.0


def test_the_virtual_loop_refuses_a_real_thread() -> None:
    # A thread's wall time would move the virtual clock: the run would not replay.
    loop = VirtualTimeLoop()
    try:
        with pytest.raises(RealThreadError, match="a real thread in the simulation"):
            loop.run_until_complete(asyncio.to_thread(print, "never"))
    finally:
        loop.close()


def test_recovery_batch_reads_keep_every_invariant_and_the_fence_switch_is_still_found() -> None:
    # The default recovery_read_batch_entries (64) is past the simulated tails, so this sample
    # sends every recovery past its third entry through ReadBatchRequests. Seed 220 found a
    # batch bookie's negative counted twice (an acknowledged entry truncated).
    batched = {"recovery_read_batch_entries": 3}
    bad = [r for r in sweep(range(200, 230), client_changes=batched) if not r.ok]
    assert not bad, bad[0].report()
    bug = ["recovery-reads-without-fence"]
    fenceless = list(sweep(range(0, 30), bug, stop_at_first=True, client_changes=batched))
    assert not fenceless[-1].ok


def test_a_sweep_whose_worker_overruns_a_seed_stops_it_and_says_which_seed() -> None:
    # In a child process: if the pool's shutdown waited for the stuck worker, this would hang.
    code = (
        "from bookkeeper_aio.sim.runner import SeedTimeoutError, sweep\n"
        "try:\n"
        "    list(sweep(range(4), workers=2, seed_wall_s=0.001))\n"
        "except SeedTimeoutError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent.parent,
    )
    assert done.returncode == 0, done.stderr
    assert "seed 0 ran over 0.001 real seconds" in done.stdout
    assert "python -m bookkeeper_aio.sim --seed 0" in done.stdout


def test_every_bug_switch_is_known_to_the_command_line_and_tested() -> None:
    assert set(CLIENT_BUGS + BOOKIE_BUGS + LOG_BUGS + WORKER_BUGS + GWQ_BUGS) == set(KNOWN_BUGS)
    assert set(BOOKIE_BUGS) == integrity.BOOKIE_BUGS


def test_unknown_bug_switch_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown bug"):
        run_seed(0, ["no-such-bug"])


def test_command_line_exit_status() -> None:
    def sim(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "bookkeeper_aio.sim", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    ok = sim("--seeds", "0-3")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "violations: none" in ok.stdout
    first_bad = list(sweep(range(200), ["unknown-as-negative"], stop_at_first=True))[-1].seed
    bad = sim("--seed", str(first_bad), "--bug", "unknown-as-negative")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    replay = f"python -m bookkeeper_aio.sim --seed {first_bad} --bug unknown-as-negative"
    assert replay in bad.stdout
    assert sim("--seeds", "5-1").returncode == 2


LOG_INVARIANTS = {
    "AllNonEmptyLedgersInLedgerList",
    "EntryOrderMaintained",
    "OnlyOneLedgerOpenAtATime",
    "LogOffsetsDenseAndStable",
    "AllAckedLogRecordsReadable",
}


def test_the_log_bug_is_found_in_most_seeds_of_a_fixed_sample() -> None:
    """Not tuned for one seed: the log act makes takeovers of open ledgers common, so the
    switch shows in most seeds (docs/simulation.md has the rate over 1,000 seeds), and not
    only through OnlyOneLedgerOpenAtATime: records are lost or change offsets too."""
    seeds = [seed for seed in range(300, 400) if has_log_act(seed)][:20]
    results = list(sweep(seeds, ["log-takeover-without-recovery"]))
    found = [r for r in results if not r.ok]
    assert len(found) >= 18, [r.seed for r in results if r.ok]
    invariants = {v.invariant for r in found for v in r.violations}
    assert invariants & LOG_INVARIANTS and "NoUnhandledErrors" not in invariants, invariants
    data = {"LogOffsetsDenseAndStable", "AllAckedLogRecordsReadable", "EntryOrderMaintained"}
    assert sum(bool({v.invariant for v in r.violations} & data) for r in found) >= 10


# The switches race seeds aim at (sim/races.py), and the invariant each shows as.
RACE_TARGETS = {
    "recovery-below-last-segment": "OnlyValidFragments",
    "recovery-reads-without-fence": "NoDivergenceBetweenClientAndMetaData",
}
# Issue 29 asks for 5 % of any 1,000 consecutive seeds: here, of seeds 0-99. Race seeds (35 of
# 0-99) with 6-12 strikes over at least 6 s of faults catch 9 and 8 of them (docs/simulation.md);
# the floors leave room for timing changes elsewhere and still mean more than 5 %.
RACE_FLOOR = {"recovery-below-last-segment": 10, "recovery-reads-without-fence": 10}


@pytest.mark.parametrize("bug", sorted(RACE_TARGETS))
def test_race_seeds_catch_the_recovery_bugs_often_in_a_fixed_sample(
    bug: str,
) -> None:
    """Not once by luck: the catches among the race seeds of 0-199 (the other seeds can only
    add to them) are at least 5 % of the 200 seeds (RACE_FLOOR; 12 and 18 on 2026-11-27). A
    sample of 100 seeds was too small: any change of timing moved a catch in or out of it."""
    caught = _catches(_race_seeds(range(200)), bug, RACE_TARGETS[bug], RACE_FLOOR[bug])
    assert len(caught) >= RACE_FLOOR[bug], (bug, caught)


def test_journal_errors_stop_bookies_and_lose_nothing() -> None:
    """Seeds with journal write errors (sim/workload_scenario.maybe_journal_errors; the first six):
    bookies fail-stop on them, come back at the heal, and every invariant holds."""
    seeds = [s for s in range(200) if scenario_of(s)[1].disk.journal_error_rate][:6]
    assert len(seeds) == 6, seeds
    results = list(sweep(seeds))
    bad = [r.report() for r in results if not r.ok]
    assert not bad, "\n\n".join(bad[:2])
    # 2 of these 6 (21 of the 37 journal-error seeds of 0-399 before race seeds grew).
    assert sum(r.stats["fail_stops"] > 0 for r in results) >= 2, [r.stats for r in results]
    first = next(r for r in results if r.stats["fail_stops"])
    again = run_seed(first.seed)  # a fail-stop replays exactly too
    assert (again.trace, again.virtual_s) == (first.trace, first.virtual_s)
    assert again.stats == first.stats


def test_shared_client_seeds_journal_multi_adds_as_one_record_and_replay_it(monkeypatch) -> None:
    """Shared-client seeds (sim/workload_scenario.maybe_share_client): the writers' adds travel as
    MultiAddRequests, which the bookies journal as one REC_LEDGERS_ENTRIES record; crashed
    bookies replay those records and every invariant holds. With that replay broken, the
    checkers see acknowledged entries missing in these two seeds."""
    from bookkeeper_aio.bookie import handler, records
    from bookkeeper_aio.protocol import MultiAddRequest

    seeds = [7, 45]
    assert all(scenario_of(seed)[0].shared_client for seed in seeds)
    counts = {"multi_adds": 0, "replayed": 0}
    handle, unpack = handler.RequestHandler.handle, records.unpack_ledgers_entries

    def counted_handle(self, request, reply, peer=None):  # type: ignore[no-untyped-def]
        counts["multi_adds"] += type(request) is MultiAddRequest
        return handle(self, request, reply, peer)

    def counted_unpack(body):  # type: ignore[no-untyped-def]
        counts["replayed"] += 1
        return unpack(body)

    monkeypatch.setattr(handler.RequestHandler, "handle", counted_handle)
    monkeypatch.setattr(records, "unpack_ledgers_entries", counted_unpack)
    results = [run_seed(seed) for seed in seeds]
    assert [r.report() for r in results if not r.ok] == []
    assert counts["multi_adds"] >= 4 and counts["replayed"] >= 2, counts

    monkeypatch.setattr(records, "unpack_ledgers_entries", lambda body: [])  # replays nothing
    for seed in seeds:
        invariants = {v.invariant for v in run_seed(seed).violations}
        assert "AllCommittedEntriesReachAckQuorum" in invariants, (seed, invariants)
