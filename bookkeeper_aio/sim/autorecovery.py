"""Autorecovery in the simulated cluster: bookies lost for good, auditors and workers, and the
BP-31 durability contract as a checker.

Theory of operation
-------------------
A share of the seeds (drawn from a generator of their own, so that every other seed plays
exactly as before) become *autorecovery seeds* (:func:`maybe_enable`): the normal-mode seeds
with the journal get 6-7 bookies in 3 racks, two autorecovery processes (real
:class:`~bookkeeper_aio.autorecovery.Autorecovery` on the simulated network and metadata,
short delays), one of which crashes once (its lease expires: the auditor seat and its locks
move), and one or two bookies that are **lost for good** during the faults (a bookie holding
fragments: its process and disk gone; never restarted).

After the liveness phase (every ledger closed), the run is *healed and quiet*: an audit of
every ledger runs, then the marks must drain (bounded). Then :class:`DurabilityContract`
checks BP-31's contract on the god's view: every entry of every closed ledger has WQ copies,
with the payload the writer sent, on live bookies of its write set. Placement is checked at
every replacement autorecovery commits (``History.on_replacement``): a new bookie that shares
a rack with another member of a write set through its index is a violation when some bookie
in a rack none of them has was registered and writable throughout the job (since its lock was
taken). The bug switch ``replication-ignores-placement`` makes workers choose at random.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..autorecovery.audit import audit_all
from ..autorecovery.replacement import neighbour_racks
from ..autorecovery.service import Autorecovery
from ..autorecovery.state import LOST_PREFIX, lost_bookies
from ..autorecovery.worker import WORKER_BUGS
from ..client.bookie_pool import BookiePool
from ..client.context import ClientContext
from ..client.placement import DEFAULT_RACK, PlacementPolicy
from ..config import AutorecoveryConfig
from ..metadata.model import LedgerMetadata
from ..metadata.underreplication import LOCKS_PREFIX, MARKS_PREFIX, lock_key
from ..quorum import write_set
from .world import CLIENT_CONFIG, SimBookie, World

if TYPE_CHECKING:
    from .checkers import History
    from .workload import Run, Scenario

SHARE = 0.6  # of the eligible seeds (normal mode, with the journal): about 18 % of all
RACKS = 3
QUORUMS = ((3, 3, 2), (3, 3, 2), (3, 2, 2), (4, 3, 2), (3, 3, 3), (4, 2, 2))
SETTLE_S = 120.0  # healed and quiet: the marks must drain within this much virtual time
STABLE_MARGIN_S = 0.2  # a candidate counts if registered since before the job's lock


@dataclass
class AutorecoveryPlan:
    """What an autorecovery seed adds to its scenario."""

    losses: int  # bookies lost for good during the faults
    disk_failures: int  # bookies whose ledger disk dies under them (they stay up, read-only)
    processes: int
    crash_process: bool  # one process crashes once (seat and locks move to the other)
    delay_s: float  # lost_bookie_recovery_delay_s


def maybe_enable(seed: int, sc: Scenario) -> None:
    """Make ``sc`` an autorecovery seed (see the module docstring), or leave it as it is."""
    rng = random.Random(f"autorecovery-{seed}")
    if sc.storm or sc.power_storm or not sc.journal_write_data or rng.random() >= SHARE:
        return
    sc.bookies = rng.randint(6, 7)
    sc.quorum = rng.choice(QUORUMS)
    sc.autorecovery = AutorecoveryPlan(
        losses=rng.choice((1, 1, 2)),
        disk_failures=rng.choice((0, 0, 1)),
        processes=2,
        crash_process=rng.random() < 0.5,
        delay_s=rng.choice((0.5, 1.0, 2.0)),
    )


def rack_for(index: int) -> str:
    return f"/zone/rack-{index % RACKS}"


def config_for(plan: AutorecoveryPlan) -> AutorecoveryConfig:
    return AutorecoveryConfig(
        metadata_uri="memory://simulated",
        lost_bookie_recovery_delay_s=plan.delay_s,
        audit_interval_s=5.0,
        open_ledger_rereplication_grace_s=2.0,
        replication_workers=2,
        replication_entries_in_flight_max=8,
        replication_lock_ttl_s=2,
        replication_retry_backoff_s=0.5,
        lease_ttl_s=2,
    )


class SimAutorecovery:
    """One autorecovery process of the simulated cluster."""

    def __init__(self, world: World, name: str, config: AutorecoveryConfig) -> None:
        self.world, self.name, self.config = world, name, config
        self.service: Autorecovery | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        world = self.world
        rng = random.Random(world.rng.getrandbits(64))
        pool = BookiePool(world.net.view(self.name), CLIENT_CONFIG, rng)
        ctx = ClientContext(CLIENT_CONFIG, world.metadata_store(), pool, rng, PlacementPolicy(),
                            world.bugs, wall_clock_ms=_virtual_ms)  # fmt: skip
        self.service = Autorecovery(ctx, self.config, self.name, _virtual_ms,
                                    bugs=world.bugs & WORKER_BUGS)  # fmt: skip
        self.task = asyncio.create_task(self.service.run(), name=self.name)

    def crash(self) -> None:
        """kill -9: the task stops, its lease is abandoned (the seat and locks expire)."""
        assert self.task is not None and self.service is not None
        self.task.cancel()
        if self.service.lease is not None:
            self.service.lease.abandon()
        self.world.net.kill_node(self.name)
        self.task = None


def _virtual_ms() -> int:
    return int(asyncio.get_running_loop().time() * 1000)


class AutorecoveryAgents:
    """The autorecovery side of one run (see the module docstring)."""

    def __init__(self, run: Run, plan: AutorecoveryPlan) -> None:
        self.run, self.plan = run, plan
        self.world, self.history = run.world, run.history
        self.config = config_for(plan)
        self.processes = [
            SimAutorecovery(self.world, f"autorecovery-{i}", self.config)
            for i in range(plan.processes)
        ]
        self.registered_since: dict[str, float] = {}
        self.history.on_replacement = self.check_replacement
        # Writers and readers mark the copies they see missing (BP-31 triggers); bookies
        # take a failed disk out of service and mark its ledgers.
        self.world.client_config = self.world.client_config.replace(mark_short_copies=True)
        self.world.guard_dirs = True

    def statistics(self) -> dict[str, int]:
        """Bookies lost, and what the workers did (summed over the processes' counters)."""
        totals: dict[str, int] = {"bookies_lost": sum(b.lost for b in self.world.bookies)}
        for process in self.processes:
            if process.service is None:
                continue
            for key, value in process.service.worker.counters.items():
                totals[key] = totals.get(key, 0) + value
        return totals

    def start(self) -> None:
        for process in self.processes:
            process.start()
        self.run.spawn(self._permanent_faults(), "permanent-faults")
        if self.plan.crash_process:
            self.run.spawn(self._crash_one_process(), "crash-autorecovery")

    def observe(self) -> None:
        """Called every checker tick: who has been registered and writable since when."""
        now = asyncio.get_running_loop().time()
        live = {b for b, (info, _) in self.world.state.bookies.items() if not info.read_only}
        for bookie in list(self.registered_since):
            if bookie not in live:
                del self.registered_since[bookie]
        for bookie in live:
            self.registered_since.setdefault(bookie, now)

    # --- agents -----------------------------------------------------------------------------

    async def _permanent_faults(self) -> None:
        """Bookies lost for good and disks that die, one at a time: the next only once the
        marks of the last are drained (two at once in one write set is real data loss)."""
        run, rng = self.run, self.run.rng
        kinds = ["lose"] * self.plan.losses + ["disk"] * self.plan.disk_failures
        rng.shuffle(kinds)
        for k, kind in enumerate(kinds):
            await asyncio.sleep(rng.uniform(0.5, max(0.6, run.sc.fault_phase_s / 2)))
            if k and not await self._drained(30.0):
                return
            if run.healing:
                return  # faults stop when the run heals
            node = self._victim()
            if node is None:
                return
            if kind == "lose":
                node.lose()
                self.history.note(f"{node.name} is lost for good")
            else:
                node.fail_disk()
                self.history.note(f"{node.name}'s ledger disk fails")

    def _victim(self) -> SimBookie | None:
        """A bookie that holds fragments, while enough others are up to form ensembles."""
        world = self.world
        up = [b for b in world.bookies if b.up and not b.lost and not b.disk.failed]
        if len(up) <= self.run.sc.quorum[0] + 1:
            return None
        used = set()
        for lid in self.run.ledger_ids:
            md = world.ledger(lid)
            if md is not None:
                used.update(md.value.bookies())
        holders = [b for b in up if b.address in used] or up
        return self.run.rng.choice(holders)

    async def _crash_one_process(self) -> None:
        await asyncio.sleep(self.run.rng.uniform(1.0, max(1.5, self.run.sc.fault_phase_s)))
        process = self.run.rng.choice(self.processes)
        process.crash()
        self.history.note(f"{process.name} crashes")
        await asyncio.sleep(self.run.rng.uniform(0.5, 3.0))
        process.start()
        self.history.note(f"{process.name} restarted")

    async def _drained(self, timeout_s: float) -> bool:
        """Quiet: every lost bookie was declared lost by an auditor, every running bookie
        whose disk died noticed it, and no mark is left (bounded wait). A lock without a mark
        is harmless (a claim whose reply was lost, gone with its process's lease)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        keys = self.world.state.keys
        while loop.time() < deadline:
            # A lost bookie is down: one whose disk died and that crashed before it noticed
            # (seed 6620) left no mark, and only the auditor's declaration tells its loss.
            declared = all(
                keys.get(LOST_PREFIX + b.address) is not None for b in self.world.bookies if b.lost
            )
            noticed = all(  # a bookie notices a dead disk at its next engine call or sync
                b.bookie.counters["ledger_dirs_failed"]
                for b in self.world.bookies
                if b.disk.failed and b.bookie is not None
            )
            if declared and noticed and not keys.items(MARKS_PREFIX):
                return True
            await asyncio.sleep(0.5)
        return False

    # --- healed and quiet -------------------------------------------------------------------

    async def settle(self) -> None:
        """After liveness: audit every ledger, wait for the marks to drain, check the
        contract (see the module docstring)."""
        name = "auditor-final"
        bk = self.run._client(name)
        try:
            ctx = bk.ctx
            registered = set(await ctx.metadata.list_bookies())
            gone = set(await lost_bookies(ctx.metadata)) - registered
            await audit_all(ctx, registered, gone, 4, _virtual_ms)
        finally:
            from .world import close_client

            await close_client(bk)
        self.history.note("healed and quiet: audit done, waiting for the marks to drain")
        if not await self._drained(SETTLE_S):
            marks = [k for k, _ in self.world.state.keys.items(MARKS_PREFIX)]
            locks = [k for k, _ in self.world.state.keys.items(LOCKS_PREFIX)]
            self.history.violate(
                "DurabilityContract",
                f"marks not drained {SETTLE_S} s after healing: {marks[:5]} (locks {locks[:5]})",
            )
            return
        DurabilityContract(self.world, self.history).check()

    # --- placement at every replacement -----------------------------------------------------

    def rack(self, bookie: str) -> str:
        node = self.world.bookie_at(bookie)
        return (node.rack if node is not None else None) or DEFAULT_RACK

    def check_replacement(self, old: LedgerMetadata, new: LedgerMetadata) -> None:
        lid = new.ledger_id
        self.history.note(f"autorecovery replaced bookies of ledger {lid}: {new.ensembles}")
        started = self._job_started(lid)
        for (first, before), (_, after) in zip(old.ensembles, new.ensembles, strict=True):
            for i, (a, b) in enumerate(zip(before, after, strict=True)):
                if a != b:
                    self._check_choice(lid, first, after, i, a, started, new.write_quorum)

    def _check_choice(
        self,
        lid: int,
        first: int,
        after: tuple[str, ...],
        i: int,
        a: str,
        started: float,
        write_quorum: int,
    ) -> None:
        """Whether ``after[i]``, which replaced ``a``, put two copies of a write set in one
        rack though a bookie up for the whole job would not have: in every view of the
        members the worker may have had (below)."""
        # A member the worker could not see registered when its job started has no rack for
        # it (autorecovery/replacement.py's _rack): it must not count against the choice (seed
        # 54: a bookie down during the job shared the chosen one's rack). One registered only
        # later in the job, or gone before its end, the worker may have seen either way (seed
        # 700: a member back before the choice shared the better candidate's rack, a tie for
        # the worker): only a choice worse in every such view is a violation.
        steady = {b for b in after if self.registered_since.get(b, float("inf")) <= started}
        options = [
            [self.rack(b)] if b in steady
            else [f"/unavailable/{b}"] + ([self.rack(b)] if j != i else [])
            for j, b in enumerate(after)
        ]  # fmt: skip
        reported: tuple[list[str], list[str]] | None = None  # the first view's, for the message
        for racks in itertools.product(*options):
            near = neighbour_racks(list(racks), i, write_quorum)
            if racks[i] not in near:
                return
            better = [
                c
                for c, since in sorted(self.registered_since.items())
                if since <= started and c not in after and c != a and self.rack(c) not in near
            ]
            if not better:
                return
            reported = reported or (sorted(near), better)
        assert reported is not None  # (every member has at least one view)
        shared, better = reported
        self.history.violate(
            "DurabilityContract",
            f"ledger {lid} segment {first}: {after[i]} replaced {a} in {options[i][0]}, a rack "
            f"of its write sets ({shared}), though {better} were up",
        )

    def _job_started(self, lid: int) -> float:
        """When the lock of the job that made this change was taken (its lease-held key)."""
        found = self.world.state.keys.get(lock_key(lid))
        if found is None:
            return -1.0  # no lock (cannot happen for a worker's change): judge nothing
        import json

        return json.loads(found.value)["since_ms"] / 1000 - STABLE_MARGIN_S


class DurabilityContract:
    """BP-31: once healed and quiet, every entry of every closed ledger has WQ copies, with
    the payload the writer sent, on live bookies of its write set."""

    def __init__(self, world: World, history: History) -> None:
        self.world, self.history = world, history

    def check(self) -> None:
        for lid, h in sorted(self.history.ledgers.items()):
            versioned = self.world.ledger(lid)
            if versioned is None or not versioned.value.is_closed:
                continue
            self._ledger(versioned.value, h.sent.get)

    def _ledger(self, md: LedgerMetadata, sent: Callable[[int], bytes | None]) -> None:
        for entry_id in range(md.last_entry_id + 1):
            ensemble = md.ensemble_at(entry_id)
            members = [ensemble[i] for i in write_set(entry_id, md.ensemble_size, md.write_quorum)]
            payload = sent(entry_id)
            short = [b for b in members if not self._holds(b, md.ledger_id, entry_id, payload)]
            if short:
                self.history.violate(
                    "DurabilityContract",
                    f"ledger {md.ledger_id} entry {entry_id}: {md.write_quorum - len(short)} of "
                    f"WQ {md.write_quorum} copies on live bookies (missing on {short})",
                )
                return

    def _holds(self, bookie: str, ledger_id: int, entry_id: int, payload: bytes | None) -> bool:
        node = self.world.bookie_at(bookie)
        if node is None or node.lost or node.disk.failed:
            return False
        stored = node.stored(ledger_id, entry_id)
        return stored is not None and (payload is None or stored == payload)
