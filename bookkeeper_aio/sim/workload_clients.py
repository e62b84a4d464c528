"""The client agents of a run: writers that create ledgers and append (several adds
outstanding), then close them or vanish without closing; a tailer following each ledger;
recoverers opening ledgers with recovery, racing their writers (sim/workload.py says how a run
plays them).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import BookKeeperError
from .checkers import History
from .gwq import GwqCoin
from .workload_scenario import SHARED_TICK_S, Scenario
from .world import World, close_client

if TYPE_CHECKING:
    from ..client.bookkeeper import BookKeeper
    from ..client.writer import LedgerWriter

PASSWORD = b"sim"


class ClientAgents:
    """Writers (``_writer``), tailers (``_tailer``) and recoverers (``_recoverer``,
    ``_recover_and_read``). The state is :class:`~.workload.Run`'s (its ``__init__``)."""

    world: World
    sc: Scenario
    history: History
    rng: random.Random
    gwq_coin: GwqCoin
    ledger_ids: list[int]
    client_names: list[str]
    shared: BookKeeper | None
    writers: dict[int, LedgerWriter]
    sessions: dict[int, tuple[str, asyncio.Task[Any]]]
    draining: dict[int, int]

    if TYPE_CHECKING:  # the run's and the fault agent's (sim/workload.py, workload_faults.py)

        def spawn(self, coro: Coroutine[Any, Any, object], name: str) -> None: ...

        def _power_cut(self, ensemble: list[str]) -> None: ...

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
