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
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass

from ..errors import BookKeeperError
from .checkers import History, check_all
from .world import Faults, World, close_client

QUORUMS = ((3, 3, 2), (3, 2, 2), (4, 3, 2), (3, 3, 3), (4, 2, 2), (5, 3, 2), (2, 2, 2))
STORM_QUORUMS = ((2, 2, 2), (2, 2, 2), (3, 3, 3), (3, 3, 2))
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
    liveness_s: float = 120.0
    check_interval_s: float = 0.1


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
    return Scenario(
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


class Run:
    """One run of a scenario on a world (see the module docstring)."""

    def __init__(self, world: World, scenario: Scenario, history: History) -> None:
        self.world = world
        self.sc = scenario
        self.history = history
        self.rng = random.Random(world.rng.getrandbits(64))
        self.ledger_ids: list[int] = []
        self.tasks: list[asyncio.Task[None]] = []
        # Without the journal a power loss drops acknowledged copies until the integrity
        # check repairs them: AllCommittedEntriesReachAckQuorum does not hold then.
        self.quorum_check = scenario.journal_write_data
        self.last_power_loss_s = -1e9
        self.client_names: list[str] = []
        self.writers: dict[int, object] = {}  # ledger id -> its LedgerWriter (god's view)

    def spawn(self, coro, name: str) -> None:  # type: ignore[no-untyped-def]
        self.tasks.append(asyncio.create_task(coro, name=name))

    def check(self) -> None:
        check_all(self.world, self.history, quorum_check=self.quorum_check)

    async def play(self) -> None:
        world, sc = self.world, self.sc
        world.journal_write_data = sc.journal_write_data
        await asyncio.gather(*(self._start(world.add_bookie()) for _ in range(sc.bookies)))
        self.spawn(self._checker(), "checker")
        writers = [
            asyncio.create_task(self._writer(i), name=f"writer-{i}") for i in range(sc.writers)
        ]
        for k in range(sc.recoveries):
            self.spawn(self._recoverer(k), f"recoverer-{k}")
        faults = asyncio.create_task(self._faults(), name="faults")
        self.spawn(self._blips(), "blips")
        await asyncio.sleep(sc.fault_phase_s)
        await faults
        self.history.note("heal: faults stop, every bookie restarts")
        world.calm()
        await self._restart_all()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30.0):
                await asyncio.gather(*writers, return_exceptions=True)
        for task in writers:
            task.cancel()
        await self._liveness()
        self.check()

    # --- agents ---------------------------------------------------------------------------

    async def _checker(self) -> None:
        while True:
            await asyncio.sleep(self.sc.check_interval_s)
            self.check()

    async def _writer(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        for k in range(self.sc.ledgers_per_writer + 8 * self.sc.storm):
            if k >= self.sc.ledgers_per_writer and loop.time() > self.sc.fault_phase_s:
                break  # a storm's writers start new ledgers until the faults stop
            bk = self._client(f"writer-{index}-{k}")
            try:
                await self._write_ledger(bk, f"writer-{index}-{k}")
            except (BookKeeperError, TimeoutError) as exc:
                self.history.note(f"writer-{index}-{k}: {type(exc).__name__}: {exc}")
            finally:
                await close_client(bk)

    async def _write_ledger(self, bk, name: str) -> None:  # type: ignore[no-untyped-def]
        h, rng, (e, wq, aq) = self.history, self.rng, self.sc.quorum
        writer = await bk.create_ledger(e, wq, aq, PASSWORD)
        lid = writer.ledger_id
        self.ledger_ids.append(lid)
        h.ledger(lid)
        h.note(
            f"{name} created ledger {lid} E{e}/WQ{wq}/AQ{aq} on {writer.metadata.ensembles[0][1]}"
        )
        self.spawn(self._tailer(lid), f"tailer-{lid}")
        outstanding: list[asyncio.Future[int]] = []
        window = rng.randint(1, self.sc.outstanding_max)
        entries = rng.randint(1, self.sc.entries_max)
        # Bursts of adds with pauses between them, spread over the fault phase.
        pause_s = self.sc.fault_phase_s / self.sc.ledgers_per_writer / (entries / window + 1)
        self.writers[lid] = writer
        for n in range(entries):
            payload = f"{lid}:{n}".encode()
            h.sent(lid, n, payload)
            future = writer.append_nowait(payload)
            future.add_done_callback(lambda f, n=n: self._on_ack(lid, n, f))
            outstanding.append(future)
            if len(outstanding) >= window:
                await outstanding.pop(0)
            if rng.random() < 1 / window:
                await asyncio.sleep(rng.expovariate(1 / pause_s))
        for future in outstanding:
            await future
        if rng.random() < 0.75:
            await writer.close()
            h.writer_closed(lid, writer.last_add_confirmed)
        else:
            h.note(f"{name} vanishes without closing ledger {lid}")

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

    def _client(self, name: str):  # type: ignore[no-untyped-def]
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
            if action == "crash":
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
                world.net.slow_s[node.name] = rng.choice((0.05, 0.3, 1.5))
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

    def _crash_one(self) -> None:
        up = [b for b in self.world.bookies if b.up]
        if len(up) <= self.sc.quorum[0]:
            return
        if not self.sc.journal_write_data and (
            len(up) < len(self.world.bookies) or any(b.in_limbo() for b in up)
        ):
            # BP-46 bookies: every unclean restart puts open ledgers in limbo until repaired;
            # crashing a second ensemble member before that can leave no bookie able to
            # answer for the ledger (BookKeeper too would need an operator then).
            return
        node = self.rng.choice(up)
        power = self.rng.random() < self.sc.power_loss_share
        now = asyncio.get_running_loop().time()
        if power and not self.sc.journal_write_data:
            # Replication covers one lost copy at a time: no second power loss before the
            # last one's bookie is back and had time to repair (else data is really gone).
            power = len(up) == len(self.world.bookies) and now - self.last_power_loss_s > 5.0
        if power:
            self.last_power_loss_s = now
        node.crash(power_loss=power)
        self.history.note(f"{node.name} crashes ({'power loss' if power else 'kill -9'})")
        self.spawn(self._restart_later(node), f"restart-{node.name}")

    async def _restart_later(self, node) -> None:  # type: ignore[no-untyped-def]
        await asyncio.sleep(self.rng.uniform(0.2, 3.0))
        await self._start(node)

    async def _start(self, node) -> None:  # type: ignore[no-untyped-def]
        while not node.up:
            try:
                await node.start()
                self.history.note(f"{node.name} restarted")
            except Exception as exc:
                self.history.note(f"{node.name} failed to start: {exc}")
                await asyncio.sleep(0.5)

    async def _restart_all(self) -> None:
        await asyncio.gather(*(self._start(b) for b in self.world.bookies if not b.up))

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
