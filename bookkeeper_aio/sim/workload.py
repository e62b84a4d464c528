"""What happens in one simulated run: the scenario a seed draws, and the agents that play it.

Theory of operation
-------------------
:func:`draw_scenario` turns a seed into a bounded scenario (number of bookies, quorums,
writers, entries, fault rates and counts). :func:`play` runs it in three phases:

1. **Faults**: writers create ledgers and append (several adds outstanding), then close them
   or vanish without closing; a tailer follows each ledger; recoverers open random ledgers
   with recovery, racing their writers; a fault agent crashes bookies (process crash or power
   loss) and restarts them, partitions nodes and slows them down. At most ``bookies - E``
   bookies are down at once, so an ensemble can always be formed.
2. **Heal**: random faults stop, partitions heal, every bookie is restarted.
3. **Liveness**: every ledger must be closed (recovered if needed) and read back in full
   within ``liveness_s`` of virtual time.

The checkers run every ``check_interval_s`` of virtual time and on every client event.

Where each part lives: the scenario and the seed families (storms, power storms, journal
errors, shared clients) in ``workload_scenario.py``; the client agents (writers, tailers,
recoverers) in ``workload_clients.py``; the fault agent (crashes, power cuts, partitions,
slowdowns, blips, restarts) in ``workload_faults.py``. :class:`Run` is all of them: the run's
state, its three phases and the checker.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from .checkers import History, check_all
from .gwq import GwqCoin
from .logs import LogAct
from .workload_clients import PASSWORD, ClientAgents
from .workload_faults import FaultAgents
from .workload_scenario import (
    JOURNAL_ERROR_SHARE,
    POWER_STORM_QUORUMS,
    POWER_STORM_SHARE,
    QUORUMS,
    SHARED_CLIENT_SHARE,
    SHARED_TICK_S,
    STORM_QUORUMS,
    Scenario,
    draw_scenario,
    maybe_journal_errors,
    maybe_share_client,
)
from .world import World, close_client

if TYPE_CHECKING:
    from ..client.bookkeeper import BookKeeper
    from ..client.writer import LedgerWriter

__all__ = [
    "JOURNAL_ERROR_SHARE",
    "PASSWORD",
    "POWER_STORM_QUORUMS",
    "POWER_STORM_SHARE",
    "QUORUMS",
    "SHARED_CLIENT_SHARE",
    "SHARED_TICK_S",
    "STORM_QUORUMS",
    "Run",
    "Scenario",
    "draw_scenario",
    "maybe_journal_errors",
    "maybe_share_client",
]


class Run(ClientAgents, FaultAgents):
    """One run of a scenario on a world (see the module docstring)."""

    def __init__(self, world: World, scenario: Scenario, history: History) -> None:
        self.world = world
        self.sc = scenario
        self.history = history
        self.rng = random.Random(world.rng.getrandbits(64))
        self.gwq_coin = GwqCoin(world.seed)  # guaranteed write quorum ledgers (sim/gwq.py)
        self.ledger_ids: list[int] = []
        self.tasks: list[asyncio.Task[object]] = []
        # Without the journal a power loss drops acknowledged copies until the integrity
        # check repairs them: AllCommittedEntriesReachAckQuorum does not hold then.
        self.quorum_check = scenario.journal_write_data and scenario.autorecovery is None
        self.ar: Any = None  # sim/autorecovery.AutorecoveryAgents in autorecovery seeds
        self.last_power_loss_s = -1e9
        self.client_names: list[str] = []
        self.shared: BookKeeper | None = None  # the writers' one client (shared-client seeds)
        self.writers: dict[int, LedgerWriter] = {}  # ledger id -> its LedgerWriter (god's view)
        # ledger id -> (its writer's client name, the task writing it): race seeds kill it
        self.sessions: dict[int, tuple[str, asyncio.Task[Any]]] = {}
        self.draining: dict[int, int] = {}  # ledger id -> writer's LAC when it sent its last add
        self.healing = False  # the fault phase is over
        self.power_losses = 0
        self.acked_copies_lost = 0  # acknowledged copies that power losses took away
        self.log_stats: dict[str, int] = {}  # the log act's (sim/logs.py)

    def spawn(self, coro: Coroutine[Any, Any, object], name: str) -> None:
        self.tasks.append(asyncio.create_task(coro, name=name))

    def check(self) -> None:
        check_all(self.world, self.history, quorum_check=self.quorum_check)
        if self.ar is not None:
            self.ar.observe()

    async def play(self) -> None:
        world, sc = self.world, self.sc
        world.journal_write_data = sc.journal_write_data
        racks: list[str | None] = [None] * sc.bookies
        if sc.autorecovery is not None:
            from .autorecovery import AutorecoveryAgents, rack_for

            racks = [rack_for(i) for i in range(sc.bookies)]
            self.ar = AutorecoveryAgents(self, sc.autorecovery)
        await asyncio.gather(*(self._start(world.add_bookie(rack)) for rack in racks))
        self.spawn(self._checker(), "checker")
        if self.ar is not None:
            self.ar.start()
        writers = [
            asyncio.create_task(self._writer(i), name=f"writer-{i}") for i in range(sc.writers)
        ]
        for k in range(sc.recoveries):
            self.spawn(self._recoverer(k), f"recoverer-{k}")
        faults = asyncio.create_task(self._faults(), name="faults")
        self.spawn(self._blips(), "blips")
        if sc.race is not None:
            from .races import RaceAgent

            self.spawn(RaceAgent(self, sc.race).play(), "races")
        await asyncio.sleep(sc.fault_phase_s)
        await faults
        self.history.note("heal: faults stop, every bookie restarts")
        self.healing = True
        world.calm()
        await self._restart_all()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30.0):
                await asyncio.gather(*writers, return_exceptions=True)
        for task in writers:
            task.cancel()
        if self.shared is not None:
            await close_client(self.shared)
        await self._liveness()
        if self.ar is not None:
            await self.ar.settle()
        self.check()
        await LogAct(self).play()  # named logs on the same cluster (sim/logs.py)
        self.check()

    # --- agents ---------------------------------------------------------------------------

    async def _checker(self) -> None:
        while True:
            await asyncio.sleep(self.sc.check_interval_s)
            self.check()

    # --- liveness -------------------------------------------------------------------------

    async def _liveness(self) -> None:
        for task in list(self.tasks):
            if task.get_name().startswith(("tailer", "recoverer")):
                task.cancel()
        try:
            async with asyncio.timeout(self.sc.liveness_s):
                for lid in list(self.ledger_ids):
                    while not await self._recover_and_read("verifier", lid):  # noqa: ASYNC110
                        await asyncio.sleep(1.0)  # retry: bookies may still be booting
        except TimeoutError:
            still = [
                lid
                for lid in self.ledger_ids
                if not (md := self.world.ledger(lid)) or not md.value.is_closed
            ]
            self.history.violate(
                "Liveness",
                f"ledgers not closed and read back within "
                f"{self.sc.liveness_s} s after healing: {still}",
            )
