"""Race seeds: the narrow interleavings behind BookKeeper's recovery bugs, made common.

Theory of operation
-------------------
Random faults find #2614 and #2615 only when several independent accidents line up (about
one seed in 50 and one in 120 before race seeds existed). A *race seed* (chosen by a
generator of its own, ``random.Random(f"race-{seed}")``, so every other seed plays exactly as
before) adds a :class:`RaceAgent` that keeps striking at writers with adds in flight. Each
strike sets up the conditions of one defect and then lets the real code race:

- **change-then-death** (#2615): a bookie of a busy writer's ensemble crashes, so the writer
  makes an ensemble change while adds are pending; right after the change is in the metadata
  the writer's process dies (its connections reset, what it had in flight is gone), before a
  later add tells the bookies its LAC. A recoverer starts at once and its link to a bookie of
  the new ensemble is down for a while, so one of its write-backs fails and it must replace a
  bookie. The bookies' LAC is then below the last segment's first entry: a recovery that
  starts there (the bug) writes entries of the previous segment to the last ensemble and its
  replacement makes a fragment start before the last segment (OnlyValidFragments).
- **lost-fence** (#2614): a busy writer's adds to one bookie of its ensemble lag (a slow
  link) while its other replicas acknowledge; a recoverer starts, and its fencing request to
  the lagging bookie is lost on the way (the first request of that link after the handshake).
  Fencing still completes on the others; a recovery read without the fence flag (the bug)
  gets "no such entry" from the lagging bookie, which then accepts the late add: an entry is
  acknowledged after the ledger was closed before it (NoDivergenceBetweenClientAndMetaData).

Both are plain agents of the workload (the writer, its faults and the recoverer are the ones
every seed has), with random timing; nothing is scripted to a seed. Without a bug switch the
protocol must survive every strike (the sweeps check it).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..quorum import write_set

if TYPE_CHECKING:
    from .workload import Run, Scenario
    from .world import Faults

RACE_SHARE = 0.75  # of the seeds that are neither power storms nor autorecovery seeds
STRIKES = ("change-then-death", "lost-fence")
RACE_QUORUMS = {
    "change-then-death": ((3, 3, 2), (4, 3, 2), (3, 3, 2), (2, 2, 2)),
    "lost-fence": ((2, 2, 2), (3, 2, 2), (3, 3, 3)),
    "any": ((3, 3, 2), (4, 3, 2), (2, 2, 2), (3, 3, 3), (3, 2, 2)),
}


@dataclass
class RacePlan:
    """What a race seed's agent does (drawn up front)."""

    strikes: int
    kinds: tuple[str, ...]  # the strikes it chooses from
    first_s: float  # the first strike no earlier than this


def maybe_race(seed: int, sc: Scenario, faults: Faults) -> None:
    """Make ``sc`` a race seed (see the module docstring), or leave it as it is; a race
    seed's network loses and reorders less (its strikes drop what they need dropped)."""
    rng = random.Random(f"race-{seed}")
    if sc.power_storm or sc.autorecovery is not None or rng.random() >= RACE_SHARE:
        return
    kinds = rng.choice((STRIKES, STRIKES, STRIKES[:1], STRIKES[1:]))
    # A lost fence shows when one negative settles an entry (AQ = WQ); a recovery below the
    # last segment when the others complete adds a crashed bookie had not (AQ < WQ).
    sc.quorum = rng.choice(RACE_QUORUMS[kinds[0]] if len(kinds) == 1 else RACE_QUORUMS["any"])
    # A replacement for the writer's change, one for the recovery's, one to spare.
    sc.bookies = max(sc.bookies, sc.quorum[0] + 3)
    sc.crashes = rng.randint(0, 2)  # the strikes crash bookies too (at most bookies - E down)
    sc.journal_write_data = True  # a crash loses no acknowledged copy (quorum checked)
    sc.fault_phase_s = max(sc.fault_phase_s, 6.0)
    # Its own strikes are the recoveries that matter: a storm's recoverers would take most
    # ledgers first (its lossy, reordering network stays).
    sc.storm, sc.recoveries = False, rng.randint(1, 3)
    net = faults.net
    net.loss_rate, net.reorder_rate = min(net.loss_rate, 0.01), min(net.reorder_rate, 0.1)
    sc.outstanding_max = max(sc.outstanding_max, rng.randint(3, 8))  # a LAC that lags
    # Short ledgers, one after another (short pauses): many ends of ledgers to race.
    sc.entries_max, sc.ledgers_per_writer = rng.randint(4, 20), rng.randint(3, 6)
    sc.race = RacePlan(
        strikes=rng.randint(6, 12),
        kinds=kinds,
        first_s=rng.uniform(0.1, 0.5),
    )


class RaceAgent:
    """Strikes at busy writers during the fault phase (see the module docstring)."""

    def __init__(self, run: Run, plan: RacePlan) -> None:
        self.run, self.plan = run, plan
        self.rng = random.Random(run.rng.getrandbits(64))
        self.strikes = 0
        self.struck: set[int] = set()  # ledgers a strike went for

    async def play(self) -> None:
        """Start the strikes at random times; each waits for its moment on its own."""
        loop = asyncio.get_running_loop()
        end = self.run.sc.fault_phase_s
        await asyncio.sleep(self.plan.first_s)
        for k in range(self.plan.strikes):
            if loop.time() > end - 2.0:
                return
            self.run.spawn(self._strike(f"racer-{k}", end), f"race-{k}")
            await asyncio.sleep(self.rng.uniform(0.1, (end - 2.0) / self.plan.strikes))

    async def _strike(self, racer: str, end: float) -> None:
        target = await self._busy_writer(end - 1.0)
        if target is None:
            return
        kind = self.rng.choice(self.plan.kinds)
        self.run.history.note(f"{racer}: {kind} on ledger {target}")
        if kind == "change-then-death":
            await self._change_then_death(target, racer)
        else:
            await self._lost_fence(target, racer)
        self.strikes += 1

    async def _busy_writer(self, end: float) -> int | None:
        """A ledger whose live writer has adds in flight and is not struck yet (bounded
        wait)."""
        loop = asyncio.get_running_loop()
        while loop.time() < end:
            busy = [
                lid
                for lid, (_, task) in self.run.sessions.items()
                if not task.done() and self._open(lid) and self._pending(lid)
                and lid not in self.struck
            ]  # fmt: skip
            if busy:
                lid = self.rng.choice(busy)
                self.struck.add(lid)
                return lid
            await asyncio.sleep(0.002)
        return None

    def _open(self, lid: int) -> bool:
        md = self.run.world.ledger(lid)
        return md is not None and md.value.state.name == "OPEN"

    def _pending(self, lid: int) -> int:
        return int(self.run.writers[lid].statistics()["pending_adds"])

    def _ensemble(self, lid: int) -> list[Any]:
        md = self.run.world.ledger(lid)
        assert md is not None
        world = self.run.world
        return [n for a in md.value.last_ensemble()[1] if (n := world.bookie_at(a)) is not None]

    async def _change_then_death(self, lid: int, racer: str) -> None:
        run, world, rng = self.run, self.run.world, self.rng
        name = run.sessions[lid][0]
        up = [n for n in self._ensemble(lid) if n.up]
        if not up or not run._may_crash():
            run.history.note(f"{racer}: no crash allowed")
            return
        # The writer's adds to one bookie lag; once the writer sent its last add, the others'
        # acknowledgements move its LAC past the one its adds carried; then that bookie
        # crashes and the writer replaces it.
        victim = rng.choice(up)
        link = (name, victim.name)
        world.net.slow_link_s[link] = rng.choice((0.1, 0.2, 0.3))
        try:
            await self._crash_when_lac_moved_on(lid, racer, victim)
        finally:
            world.net.slow_link_s.pop(link, None)

    async def _crash_when_lac_moved_on(self, lid: int, racer: str, victim: Any) -> None:
        run, world = self.run, self.run.world
        # Once the writer's LAC is past the one its last add carried: with AQ < WQ the others
        # complete the adds while the lagging copies are on their way (a failure after the
        # ack quorum still replaces the bookie); with AQ = WQ adds still wait for the victim.
        for _ in range(3000):
            if run.sessions[lid][1].done() or self._lac_moved_on(lid):
                break
            await asyncio.sleep(0.001)
        run.history.note(
            f"{racer}: draining {lid in run.draining}, {self._pending(lid)} pending, "
            f"session done {run.sessions[lid][1].done()}"
        )
        md = world.ledger(lid)
        late = asyncio.get_running_loop().time() > run.sc.fault_phase_s - 1.0
        gone = run.sessions[lid][1].done()  # closed, failed, or vanished: nothing to race
        if md is None or md.value.state.name != "OPEN" or not victim.up or late or gone:
            why = "too late" if late else "not open" if victim.up else "victim down"
            run.history.note(f"{racer}: ledger {lid}: {why}")
            return
        if not run._may_crash():
            run.history.note(f"{racer}: ledger {lid} no longer open, or no crash allowed")
            return
        segments = len(md.value.ensembles)
        run._crash(victim, power=False)
        # Wait for the writer's ensemble change to land (or the ledger to end otherwise).
        for _ in range(2000):
            md = world.ledger(lid)
            if md is None or md.value.state.name != "OPEN" or len(md.value.ensembles) > segments:
                break
            await asyncio.sleep(0.001)
        if md is None or md.value.state.name != "OPEN" or len(md.value.ensembles) == segments:
            run.history.note(f"{racer}: no ensemble change of ledger {lid} to race")
            return
        stats = run.writers[lid].statistics()
        run.history.note(
            f"{racer}: ledger {lid} segments {[f for f, _ in md.value.ensembles]}, writer's "
            f"LAC {stats['last_add_confirmed']} (its last add carried {run.draining.get(lid)}), "
            f"{stats['pending_adds']} adds pending"
        )
        run.kill_writer(lid)
        self._fail_write_backs(racer, lid, md.value)
        run.spawn(self._recover(racer, lid), racer)

    def _fail_write_backs(self, racer: str, lid: int, md: Any) -> None:
        """Cut the recoverer from enough bookies of the last ensemble that a write-back there
        cannot reach the ack quorum (WQ - AQ + 1) once they answered its fencing request and
        its reads (the first two writes of each link after the handshake: a client sends a
        loop turn's requests together, and recovery reads a window of entries in one turn),
        the writer's replacements first: they hold no entry of the previous segment, whose
        other bookies must still answer the recovery's reads of it."""
        world = self.run.world
        first, ensemble = md.ensembles[-1]
        before = set(md.ensembles[-2][1])
        # Bookies of the write set the entry before the last segment has in it.
        members = [ensemble[i] for i in write_set(first - 1, md.ensemble_size, md.write_quorum)]
        last = [n for a in members if (n := world.bookie_at(a)) is not None]
        order = sorted(last, key=lambda n: (n.address in before, self.rng.random()))
        cut = order[: md.write_quorum - md.ack_quorum + 1]
        hold = self.rng.uniform(1.0, 3.0)
        for node in cut:
            link = (racer, node.name)
            world.net.cut_after[link] = 2  # its fencing request, then one turn's reads
            asyncio.get_running_loop().call_later(hold, world.net.cut_after.pop, link, None)
        names = [n.name for n in cut]
        self.run.history.note(f"{racer} cannot reach {names} after fencing, for {hold:.2f} s")

    def _lac_moved_on(self, lid: int) -> bool:
        sent = self.run.draining.get(lid)
        stats = self.run.writers[lid].statistics()
        return sent is not None and stats["last_add_confirmed"] > sent

    async def _recover(self, racer: str, lid: int) -> None:
        """Recover ``lid``, retrying a few times (another fault may stop an attempt)."""
        for _ in range(4):
            md = self.run.world.ledger(lid)
            if md is None or md.value.is_closed or await self.run._recover_and_read(racer, lid):
                return
            await asyncio.sleep(self.rng.uniform(0.05, 0.2))

    def _slow_link(self, src: str, dst: str, delay: float) -> None:
        net = self.run.world.net
        net.slow_link_s[(src, dst)] = delay
        hold = delay + self.rng.uniform(0.3, 1.0)
        asyncio.get_running_loop().call_later(hold, net.slow_link_s.pop, (src, dst), None)
        self.run.history.note(f"link {src} -> {dst} slows down by {delay} s")

    async def _lost_fence(self, lid: int, racer: str) -> None:
        run, world = self.run, self.run.world
        name = run.sessions[lid][0]
        ensemble = self._ensemble(lid)
        if not all(n.up for n in ensemble):  # the others must cover the fence without it
            run.history.note(f"{racer}: a bookie of ledger {lid} is down")
            return
        lagging = self.rng.choice(ensemble).name
        delay = self.rng.choice((0.05, 0.1, 0.2))
        self._slow_link(name, lagging, delay)
        await asyncio.sleep(self.rng.uniform(0.0, delay))
        world.net.drop_next[(racer, lagging)] += 1  # its fencing request (after the handshake)
        # The recoverer is nearer the lagging bookie: its answer to a read comes first.
        for node in ensemble:
            if node.name != lagging:
                self._slow_link(racer, node.name, self.rng.choice((0.005, 0.01, 0.02)))
        run.spawn(run._recover_and_read(racer, lid), racer)
