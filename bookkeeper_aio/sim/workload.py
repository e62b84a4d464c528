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

import asyncio
import contextlib
import random
from collections.abc import Coroutine
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import BookKeeperError
from ..quorum import write_set
from .checkers import History, check_all
from .gwq import GwqCoin
from .logs import LogAct
from .world import Faults, SimBookie, World, close_client

if TYPE_CHECKING:
    from ..client.bookkeeper import BookKeeper
    from ..client.writer import LedgerWriter

QUORUMS = ((3, 3, 2), (3, 2, 2), (4, 3, 2), (3, 3, 3), (4, 2, 2), (5, 3, 2), (2, 2, 2))
STORM_QUORUMS = ((2, 2, 2), (2, 2, 2), (3, 3, 3), (3, 3, 2))
# BP-46's own shapes: one lost copy decides an entry (QC = 1) or needs one more negative.
POWER_STORM_QUORUMS = ((2, 2, 2), (2, 2, 2), (3, 2, 2), (3, 2, 2), (3, 3, 2))
POWER_STORM_SHARE = 0.8  # of the journal-less seeds (40 %)
PASSWORD = b"sim"


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


class Run:
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

    async def _writer(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        busy = self.sc.storm or self.sc.power_storm or self.sc.race is not None
        for k in range(self.sc.ledgers_per_writer + 8 * busy):
            if k >= self.sc.ledgers_per_writer and loop.time() > self.sc.fault_phase_s:
                break  # a storm's writers start new ledgers until the faults stop
            name = f"writer-{index}-{k}"
            if self.sc.shared_client:
                if self.shared is None:
                    self.shared = self._client("writers")
                bk = self.shared
            else:
                bk = self._client(name)
            try:
                await self._session(bk, name)
            except (BookKeeperError, TimeoutError) as exc:
                self.history.note(f"{name}: {type(exc).__name__}: {exc}")
            finally:
                if bk is not self.shared:  # (the shared one is closed after the writers)
                    await close_client(bk)

    async def _session(self, bk: BookKeeper, name: str) -> None:
        if self.sc.race is None:
            return await self._write_ledger(bk, name)  # (no extra task: seeds play as before)
        # Its own task: the race agent may kill it (the process dies; see kill_writer).
        session = asyncio.create_task(self._write_ledger(bk, name), name=f"session-{name}")
        try:
            await asyncio.wait([session])
        finally:
            session.cancel()  # (this agent was cancelled: so is its session)
        if not session.cancelled() and (exc := session.exception()) is not None:
            raise exc

    async def _write_ledger(self, bk: BookKeeper, name: str) -> None:
        h, rng, (e, wq, aq) = self.history, self.rng, self.sc.quorum
        gwq = self.gwq_coin(wq, aq)
        writer = await bk.create_ledger(e, wq, aq, PASSWORD, guaranteed_write_quorum=gwq)
        lid = writer.ledger_id
        self.ledger_ids.append(lid)
        h.ledger(lid)
        h.note(
            f"{name} created ledger {lid} E{e}/WQ{wq}/AQ{aq}{' GWQ' if gwq else ''} "
            f"on {writer.metadata.ensembles[0][1]}"
        )
        self.spawn(self._tailer(lid), f"tailer-{lid}")
        outstanding: list[asyncio.Future[int]] = []
        window = rng.randint(1, self.sc.outstanding_max)
        entries = rng.randint(1, self.sc.entries_max)
        # Bursts of adds with pauses between them, spread over the fault phase.
        pause_s = self.sc.fault_phase_s / self.sc.ledgers_per_writer / (entries / window + 1)
        self.writers[lid] = writer
        task = asyncio.current_task()
        assert task is not None  # a session runs in a task of its own or its agent's
        self.sessions[lid] = (name, task)
        carried = -1  # the LAC the last add carried
        for n in range(entries):
            payload = f"{lid}:{n}".encode()
            h.sent(lid, n, payload)
            carried = writer.last_add_confirmed
            future = writer.append_nowait(payload)
            future.add_done_callback(partial(self._on_ack, lid, n))
            outstanding.append(future)
            if len(outstanding) >= window:
                await outstanding.pop(0)
            if rng.random() < 1 / window:
                pause = rng.expovariate(1 / pause_s)
                if self.sc.shared_client:  # on a common tick: the writers' bursts coincide
                    end = asyncio.get_running_loop().time() + pause
                    pause += SHARED_TICK_S - end % SHARED_TICK_S
                await asyncio.sleep(pause)
        self.draining[lid] = carried  # all sent; the writer's LAC may move past it
        for future in outstanding:
            await future
        if self.sc.race is not None:  # it pauses before closing (race seeds' strikes)
            await asyncio.sleep(rng.uniform(0.05, 0.3))
        if rng.random() < 1 - self.sc.vanish_share:
            await writer.close()
            h.writer_closed(lid, writer.last_add_confirmed)
        else:
            h.note(f"{name} vanishes without closing ledger {lid}")
            if self.sc.power_cut_share and rng.random() < self.sc.power_cut_share:
                # The same power cut takes one of its bookies down (same rack).
                self._power_cut(writer.statistics()["ensemble"])

    def kill_writer(self, lid: int) -> None:
        """The process writing ``lid`` dies: its session stops and its connections reset,
        dropping what it had in flight (its client is shut down by its agent)."""
        name, session = self.sessions[lid]
        session.cancel()
        self.world.net.kill_node(name)
        self.history.note(f"{name} dies with ledger {lid} open")

    def _on_ack(self, lid: int, n: int, future: asyncio.Future[int]) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        if future.result() != n:
            self.history.violate(
                "NoOutOfOrderEntries", f"ledger {lid}: append #{n} got entry id {future.result()}"
            )
        self.history.acked(lid, future.result())

    async def _tailer(self, lid: int) -> None:
        bk = self._client(f"tailer-{lid}")
        expected = 0
        try:
            reader = await bk.open_ledger(lid, PASSWORD, recovery=False)
            async for entry in reader.tail():
                if entry.entry_id != expected:
                    self.history.violate(
                        "NoOutOfOrderEntries",
                        f"tailer of {lid} got {entry.entry_id}, expected {expected}",
                    )
                self.history.read(f"tailer-{lid}", lid, entry.entry_id, entry.payload)
                expected = entry.entry_id + 1
        except (BookKeeperError, TimeoutError) as exc:
            self.history.note(f"tailer of {lid} stops at {expected}: {type(exc).__name__}")
        finally:
            await close_client(bk)

    async def _recoverer(self, k: int) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self.rng.uniform(0.1, self.sc.fault_phase_s))
        while True:
            if self.ledger_ids:
                await self._recover_one(f"recoverer-{k}")
            if not self.sc.storm or loop.time() > self.sc.fault_phase_s:
                return
            await asyncio.sleep(self.rng.uniform(0.05, 0.5))

    async def _recover_one(self, name: str) -> None:
        # Prefer a ledger still being written: recovery racing the writer is the hard case.
        open_ids = [
            i
            for i in self.ledger_ids
            if (md := self.world.ledger(i)) is not None and not md.value.is_closed
        ]
        lid = self.rng.choice(open_ids or self.ledger_ids)
        writer = self.writers.get(lid)
        if writer is not None and self.rng.random() < 0.8:
            # Strike while the writer has adds in flight (bounded wait).
            for _ in range(500):
                if writer.statistics()["pending_adds"]:
                    break
                await asyncio.sleep(0.002)
        await self._recover_and_read(name, lid)

    async def _recover_and_read(self, name: str, lid: int) -> bool:
        bk = self._client(name)
        try:
            reader = await bk.open_ledger(lid, PASSWORD, recovery=True)
            last = reader.metadata.last_entry_id
            self.history.note(f"{name} recovered ledger {lid}: last entry {last}")
            if last >= 0:
                for entry in await reader.read(0, last):
                    self.history.read(name, lid, entry.entry_id, entry.payload)
            return True
        except (BookKeeperError, TimeoutError) as exc:
            self.history.note(f"{name} on ledger {lid}: {type(exc).__name__}: {exc}")
            return False
        finally:
            await close_client(bk)

    def _client(self, name: str) -> BookKeeper:
        self.client_names.append(name)
        return self.world.client(name)

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
