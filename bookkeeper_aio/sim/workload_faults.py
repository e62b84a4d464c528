"""The fault agent of a run: bookie crashes (kill -9 or power loss) and restarts, power cuts
aimed at busy writers, partitions, slow bookies and links, brief blips (sim/workload.py says
how a run plays them).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from ..quorum import write_set
from .checkers import History
from .workload_scenario import Scenario
from .world import SimBookie, World

if TYPE_CHECKING:
    from ..client.writer import LedgerWriter


class FaultAgents:
    """Blips (``_blips``), the fault agent (``_faults``), crashes and power cuts (``_crash``,
    ``_power_cut``) and restarts (``_start``, ``_restart_all``). The state is
    :class:`~.workload.Run`'s (its ``__init__``)."""

    world: World
    sc: Scenario
    history: History
    rng: random.Random
    ledger_ids: list[int]
    client_names: list[str]
    writers: dict[int, LedgerWriter]
    healing: bool
    last_power_loss_s: float
    power_losses: int
    acked_copies_lost: int

    if TYPE_CHECKING:  # the run's and the client agents' (sim/workload.py, workload_clients.py)

        def spawn(self, coro: Coroutine[Any, Any, object], name: str) -> None: ...

        async def _recover_and_read(self, name: str, lid: int) -> bool: ...

    async def _blips(self) -> None:
        """Brief cuts between a client and a bookie: the one lost fence or add that makes
        the difference (BookKeeper #2614 needs a fence request lost on its way)."""
        sc, rng, net = self.sc, self.rng, self.world.net
        loop = asyncio.get_running_loop()
        while sc.blips_per_s and loop.time() < sc.fault_phase_s:
            await asyncio.sleep(rng.expovariate(sc.blips_per_s))
            if not self.client_names:
                continue
            a, b = rng.choice(self.client_names[-8:]), rng.choice(self.world.bookies).name
            if frozenset((a, b)) in net.partitions:
                continue
            net.partition(a, b)
            loop.call_later(rng.uniform(0.005, 0.05), net.unpartition, a, b)

    async def _faults(self) -> None:
        sc, rng, world = self.sc, self.rng, self.world
        actions = ["crash"] * sc.crashes + ["partition"] * sc.partitions + ["slow"] * sc.slowdowns
        actions += ["slow-link"] * sc.slow_links
        rng.shuffle(actions)
        for action in actions:
            await asyncio.sleep(rng.uniform(0.05, sc.fault_phase_s / (len(actions) + 1)))
            if action == "crash" and sc.busy_cut_share and rng.random() < sc.busy_cut_share:
                await self._power_cut_busy()
            elif action == "crash":
                self._crash_one()
            elif action == "partition":
                a = rng.choice(world.bookies).name
                b = rng.choice(
                    [n.name for n in world.bookies if n.name != a]
                    + [f"writer-{i}-0" for i in range(sc.writers)]
                )
                world.net.partition(a, b)
                self.history.note(f"partition {a} <-> {b}")
            elif action == "slow-link":
                self._slow_link()
            else:
                node = rng.choice(world.bookies)
                # (A power storm's slow replicas stay reachable: below the client timeouts.)
                slow = (0.1, 0.2, 0.3) if sc.power_storm else (0.05, 0.3, 1.5)
                world.net.slow_s[node.name] = rng.choice(slow)
                self.history.note(f"{node.name} slows down by {world.net.slow_s[node.name]} s")

    def _slow_link(self) -> None:
        """One writer's adds to one bookie lag (the other replicas and every other client
        are unaffected) for a while."""
        writers = [n for n in self.client_names[-8:] if n.startswith("writer")]
        if not writers:
            return
        link = (self.rng.choice(writers), self.rng.choice(self.world.bookies).name)
        delay = self.rng.choice((0.02, 0.05, 0.2))
        self.world.net.slow_link_s[link] = delay
        loop = asyncio.get_running_loop()
        loop.call_later(self.rng.uniform(0.2, 2.0), self.world.net.slow_link_s.pop, link, None)
        self.history.note(f"link {link[0]} -> {link[1]} slows down by {delay} s")

    def _may_crash(self) -> bool:
        up = [b for b in self.world.bookies if b.up]
        if len(up) <= self.sc.quorum[0]:
            return False
        # BP-46 bookies: every unclean restart puts open ledgers in limbo until repaired;
        # crashing a second ensemble member before that can leave no bookie able to answer
        # for the ledger (BookKeeper too would need an operator then).
        return self.sc.journal_write_data or (
            len(up) == len(self.world.bookies) and not any(b.in_limbo() for b in up)
        )

    def _may_lose_power(self) -> bool:
        if self.sc.journal_write_data:
            return True
        # Replication covers one lost copy at a time: no second power loss before the last
        # one's bookie is back and the other copies of what it lost are synced (else data is
        # really gone).
        now = asyncio.get_running_loop().time()
        up = [b for b in self.world.bookies if b.up]
        gap = self.sc.power_loss_gap_s
        return len(up) == len(self.world.bookies) and now - self.last_power_loss_s > gap

    def _crash_one(self) -> None:
        if not self._may_crash():
            return
        node = self.rng.choice([b for b in self.world.bookies if b.up])
        power = self.rng.random() < self.sc.power_loss_share and self._may_lose_power()
        self._crash(node, power=power)

    def _power_cut(self, ensemble: list[str]) -> None:
        """A power cut hits one of these bookies (if one may lose power now): it loses what
        it acknowledged last and had not synced (BP-46)."""
        nodes = [n for a in ensemble if (n := self.world.bookie_at(a)) is not None and n.up]
        if nodes and not self.healing and self._may_crash() and self._may_lose_power():
            self._crash(self.rng.choice(nodes), power=True)

    async def _power_cut_busy(self) -> None:
        """A power cut hits a bookie while a writer has adds in flight to it (bounded wait):
        the bookie may lose an entry it acknowledged whose other copies are still on their
        way, or a writer that paused keeps the ledger open for a recoverer."""
        for _ in range(250):
            busy = [w for w in self.writers.values() if w.statistics()["pending_adds"]]
            if busy:
                writer = self.rng.choice(busy)
                ensemble = writer.statistics()["ensemble"]
                # Prefer a bookie that already acknowledged a pending add (god's view): its
                # copy is the one that counts until the others arrive.
                pipe = writer._pipe
                ackers = {ensemble[i] for op in (*pipe.unreleased, *pipe.unacked) for i in op.acked}
                self._power_cut(sorted(ackers) or ensemble)
                return
            await asyncio.sleep(0.004)

    def _crash(self, node: SimBookie, *, power: bool) -> None:
        held = self._acked_copies(node) if power else set()
        node.crash(power_loss=power)
        if power:
            self.last_power_loss_s = asyncio.get_running_loop().time()
            self.power_losses += 1
            self.acked_copies_lost += len(held - self._acked_copies(node))
        self.history.note(f"{node.name} crashes ({'power loss' if power else 'kill -9'})")
        self.spawn(self._restart_later(node), f"restart-{node.name}")

    def _acked_copies(self, node: SimBookie) -> set[tuple[int, int]]:
        """(ledger, entry) of the acknowledged entries ``node`` holds (statistics only)."""
        held = set()
        for lid, h in self.history.ledgers.items():
            versioned = self.world.ledger(lid)
            if versioned is None:
                continue
            md = versioned.value
            for entry_id in h.acked:
                ensemble = md.ensemble_at(entry_id)
                members = write_set(entry_id, md.ensemble_size, md.write_quorum)
                if node.address in (ensemble[i] for i in members) and node.stored(lid, entry_id):
                    held.add((lid, entry_id))
        return held

    async def _restart_later(self, node: SimBookie) -> None:
        await asyncio.sleep(self.rng.uniform(*self.sc.restart_s))
        await self._start(node)
        if not self.sc.recover_on_restart or self.healing:
            return
        # Someone notices the bookie flapped and recovers its open ledgers (an auditor, a
        # reader taking over): right when it may answer for what it lost.
        for lid in self.ledger_ids:
            md = self.world.ledger(lid)
            if md is None or md.value.is_closed or node.address not in md.value.last_ensemble()[1]:
                continue
            if self.rng.random() < self.sc.recover_on_restart:
                name = f"recoverer-{node.name}-{node.incarnation}"
                self.spawn(self._recover_and_read(name, lid), name)

    async def _start(self, node: SimBookie) -> None:
        while not node.up and not node.lost:
            try:
                await node.start()
                self.history.note(f"{node.name} restarted")
            except Exception as exc:
                self.history.note(f"{node.name} failed to start: {exc}")
                await asyncio.sleep(0.5)

    async def _restart_all(self) -> None:
        await asyncio.gather(
            *(self._start(b) for b in self.world.bookies if not b.up and not b.lost)
        )
