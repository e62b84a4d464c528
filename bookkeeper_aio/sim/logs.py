"""The log act of a simulated run: named logs written by writers that crash and are replaced.

Theory of operation
-------------------
After the ledger workload of a seed (``workload.Run.play``) has healed and been checked, the
same cluster plays a log act, drawn from its own rng (so the ledger part of every seed plays
exactly as it would without it). Half of the seeds play one (:func:`has_log_act`, a coin of
its own):

1. **Faults**: one or two logs with small segments (a rollover every few records); writer
   agents that keep starting sessions — take the log over, append a burst (several appends
   outstanding), then close or vanish without closing (a crashed process) — so that sessions
   overlap and most takeovers find the previous writer's ledger open, often with appends in
   flight; tailing readers from random offsets (re-opened after an error, jumping forward on
   truncation); ``read_log`` of random ranges; truncations; jobs that append ledgers written
   elsewhere (``append_ledgers_to_log``); bookie crashes, lossy and reordering links, brief
   partitions and metadata faults.
2. **Heal**: faults stop, every bookie restarts, the writers stop.
3. **Liveness**: a last writer takes each log over and closes it; the whole log must read back
   (every acknowledged record with its payload) and every reader reach the end, within
   ``liveness_s`` virtual seconds.

The checkers (``log_checkers.py``) run on every write of a log's key, every ``check_interval_s``
and at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import BookKeeperError, LogFencedError, LogTruncatedError
from .log_checkers import LogChecks
from .world import close_client

if TYPE_CHECKING:
    from .workload import Run

LOG_BUGS = ("log-takeover-without-recovery",)
LOG_ACT_SHARE = 0.5  # of the seeds (its own coin: a seed without it plays as before)


def has_log_act(seed: int) -> bool:
    """Whether ``seed`` plays a log act."""
    return random.Random(f"log-act-{seed}").random() < LOG_ACT_SHARE


@dataclass
class LogScenario:
    """What the log act of a seed does (drawn up front from its own rng)."""

    logs: int
    quorum: tuple[int, int, int]
    segment_entries_max: int
    writers: int  # per log, each starting sessions one after another
    records_max: int  # per session
    outstanding_max: int
    vanish_share: float  # a session ends without close (the process dies)
    readers: int  # per log
    truncations: int
    commits: int  # jobs appending ledgers written elsewhere
    retention_bytes: int | None
    crashes: int
    fault_phase_s: float
    liveness_s: float = 60.0
    check_interval_s: float = 0.25


def draw_log_scenario(rng: random.Random, bookies: int) -> LogScenario:
    """A bounded log act for a cluster of ``bookies`` (at most ``bookies - E`` down at once)."""
    quorums = [q for q in ((3, 3, 2), (3, 2, 2), (2, 2, 2), (3, 3, 3)) if q[0] < bookies]
    return LogScenario(
        logs=rng.choice((1, 1, 1, 2)),
        quorum=rng.choice(quorums),
        segment_entries_max=rng.randint(2, 12),
        writers=rng.randint(2, 3),
        records_max=rng.randint(4, 30),
        outstanding_max=rng.randint(1, 8),
        vanish_share=rng.choice((0.3, 0.5, 0.7)),
        readers=rng.randint(1, 2),
        truncations=rng.randint(0, 2),
        commits=rng.randint(0, 2),
        retention_bytes=rng.choice((None, None, 300)),
        crashes=rng.randint(0, 2),
        fault_phase_s=rng.uniform(1.5, 3.0),
    )


class LogAct:
    """The log act on a run's world (see the module docstring)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.world = run.world
        self.history = run.history
        self.rng = random.Random(f"logs-{run.world.seed}")
        self.sc = draw_log_scenario(self.rng, run.sc.bookies)
        self.checks = LogChecks(self.world, self.history)
        self.names = [f"log{i}" for i in range(self.sc.logs)]
        self.fault_end = 0.0
        self.readers: dict[str, int] = {}  # reader -> next offset it expects
        self.stats = {"sessions": 0, "takeovers_of_open_ledgers": 0, "acked": 0, "commits": 0}

    async def play(self) -> None:
        if not has_log_act(self.world.seed):
            return
        sc, world, loop = self.sc, self.world, asyncio.get_running_loop()
        world.state.keys.on_key = self.checks.key_written
        self.history.note(f"log act: {sc}")
        admin = self.run._client("log-admin")
        for name in self.names:
            await self._retry(lambda n=name: admin.create_log(
                n, ensemble_size=sc.quorum[0], write_quorum=sc.quorum[1],
                ack_quorum=sc.quorum[2], segment_entries_max=sc.segment_entries_max,
                retention_bytes=sc.retention_bytes, exist_ok=True,
            ))  # fmt: skip
        self.fault_end = loop.time() + sc.fault_phase_s
        self._faults_on()
        agents = [self._spawn(self._checker(), "log-checker")]
        for name in self.names:
            agents += [self._spawn(self._writer(name, i), f"{name}-writer-{i}")
                       for i in range(sc.writers)]  # fmt: skip
            for i in range(sc.readers):
                self._spawn(self._reader(name, f"{name}-reader-{i}"), f"{name}-reader-{i}")
            for k in range(sc.commits):
                agents.append(self._spawn(self._commit(name, k), f"{name}-commit-{k}"))
        agents.append(self._spawn(self._chores(admin), "log-chores"))
        await asyncio.sleep(sc.fault_phase_s)
        self.history.note("log act: heal")
        world.calm()
        await self.run._restart_all()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(20.0):
                await asyncio.gather(*agents[1:], return_exceptions=True)
        for task in agents[1:]:
            task.cancel()
        await self._liveness(admin)
        await close_client(admin)
        self.checks.check(scan=True)
        self.run.log_stats = self.stats

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        self.run.spawn(coro, name)
        return self.run.tasks[-1]

    def _faults_on(self) -> None:
        """Faults for the act (the ledger part ended calm)."""
        rng, faults = self.rng, self.world.faults
        faults.net.loss_rate = rng.choice((0.0, 0.005, 0.02))
        faults.net.duplicate_rate = rng.choice((0.0, 0.01))
        faults.net.reorder_rate = rng.choice((0.0, 0.1, 0.3))
        faults.net.reorder_delay_s = rng.choice((0.02, 0.1))
        faults.metadata_latency_s_max = rng.choice((0.0, 0.002, 0.01))
        faults.metadata_failure_rate = rng.choice((0.0, 0.0, 0.01))
        faults.metadata_lost_reply_rate = rng.choice((0.0, 0.0, 0.01))
        self.world.calm_rates_changed()

    async def _checker(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(self.sc.check_interval_s)
            ticks += 1
            self.checks.check(scan=ticks % 8 == 0)

    async def _retry(self, call: Any, attempts: int = 20) -> Any:
        for attempt in range(attempts):
            try:
                return await call()
            except (BookKeeperError, TimeoutError) as exc:
                if attempt + 1 == attempts:
                    raise
                self.history.note(f"log act: {type(exc).__name__}: {exc}; again")
                await asyncio.sleep(0.5)
        return None

    # --- agents ---------------------------------------------------------------------------

    async def _writer(self, name: str, index: int) -> None:
        loop = asyncio.get_running_loop()
        k = 0
        while loop.time() < self.fault_end:
            await asyncio.sleep(self.rng.uniform(0.1, 0.8))
            writer = f"{name}-w{index}-{k}"
            k += 1
            bk = self.run._client(writer)
            try:
                await self._session(bk, name, writer)
            except (BookKeeperError, TimeoutError) as exc:
                self.history.note(f"{writer}: {type(exc).__name__}: {exc}")
            finally:
                await close_client(bk)  # aborts a writer still open: a crashed process

    async def _session(self, bk: Any, name: str, writer: str) -> None:
        sc, rng = self.sc, self.rng
        md = self.checks.log(name).md
        was_open = md is not None and md.open_segment is not None
        lw = bk.open_log_writer(name)
        await lw.open()
        self.stats["sessions"] += 1
        self.stats["takeovers_of_open_ledgers"] += was_open
        self.checks.session_opened(name, writer, lw.next_offset)
        self.history.note(f"{writer} took {name} over: epoch {lw.epoch}, at {lw.next_offset}")
        window = rng.randint(1, sc.outstanding_max)
        outstanding: list[asyncio.Future[int]] = []
        try:
            for n in range(rng.randint(1, sc.records_max)):
                payload = f"{name}/{writer}/{n}".encode()
                self.checks.sent(name, payload)
                await lw.wait_for_room(len(payload))
                future = lw.append_nowait(payload)
                future.add_done_callback(partial(self._on_ack, name, writer, lw, payload))
                outstanding.append(future)
                if len(outstanding) >= window:
                    await outstanding.pop(0)
                if rng.random() < 1 / window:
                    await asyncio.sleep(rng.expovariate(5.0))
            for future in outstanding:
                await future
        except LogFencedError:
            self.history.note(f"{writer} fenced at {lw.next_offset}")
            return
        if rng.random() < sc.vanish_share:
            self.history.note(f"{writer} vanishes with its ledger open")
            return
        await lw.close()
        self.history.note(f"{writer} closed {name} at {lw.next_offset}")

    def _on_ack(self, name: str, writer: str, lw: Any, payload: bytes, future: Any) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        offset = future.result()
        ledger_id, first = next((i, f) for i, f in reversed(lw.segments) if f <= offset)
        self.stats["acked"] += 1
        self.checks.acked(name, writer, offset, payload, ledger_id, offset - first)

    async def _reader(self, name: str, reader: str) -> None:
        await asyncio.sleep(self.rng.uniform(0.0, self.sc.fault_phase_s / 2))
        acked = sorted(self.checks.log(name).acked)
        start = self.rng.choice([0, 0, *acked[-5:]]) if acked else 0
        bk = self.run._client(reader)
        self.readers[reader] = start
        expected: int | None = None
        try:
            while True:
                try:
                    async with bk.open_log_reader(name, from_offset=start) as records:
                        async for record in records:
                            if expected is not None and record.offset != expected:
                                self.history.violate(
                                    "LogOffsetsDenseAndStable",
                                    f"log {name}: {reader} got {record.offset} after "
                                    f"{expected - 1}",
                                )
                            self.checks.read(name, reader, record.offset, record.payload)
                            expected = start = record.offset + 1
                            self.readers[reader] = start
                except LogTruncatedError as exc:
                    start, expected = exc.start_offset, None
                    self.history.note(f"{reader} jumps to {start}: truncated")
                except (BookKeeperError, TimeoutError) as exc:
                    self.history.note(f"{reader} reopens at {start}: {type(exc).__name__}")
                    await asyncio.sleep(0.5)
        finally:
            await close_client(bk)

    async def _commit(self, name: str, k: int) -> None:
        """A job: ledgers written elsewhere, appended to the log in one step."""
        await asyncio.sleep(self.rng.uniform(0.0, self.sc.fault_phase_s))
        job = f"{name}-job-{k}"
        bk = self.run._client(job)
        e, wq, aq = self.sc.quorum
        try:
            ledgers, payloads = [], []
            for part in range(self.rng.randint(1, 2)):
                writer = await bk.create_ledger(e, wq, aq)
                for n in range(self.rng.randint(0, 4)):
                    payload = f"{name}/{job}/{part}/{n}".encode()
                    self.checks.sent(name, payload)
                    await writer.append(payload)
                    payloads.append((writer.ledger_id, n, payload))
                await writer.close()
                ledgers.append(writer.ledger_id)
            self.checks.commit_started(name, ledgers)
            offsets = await bk.append_ledgers_to_log(name, ledgers)
            self.stats["commits"] += 1
            self.history.note(f"{job} appended {ledgers} to {name} at {offsets}")
            self.checks.session_opened(name, job, offsets.start)
            for offset, (ledger_id, entry_id, payload) in zip(offsets, payloads, strict=True):
                self.checks.acked(name, job, offset, payload, ledger_id, entry_id)
        except (BookKeeperError, TimeoutError) as exc:
            self.history.note(f"{job}: {type(exc).__name__}: {exc}")
        finally:
            await close_client(bk)

    async def _chores(self, admin: Any) -> None:
        """Truncations, reads of random ranges, bookie crashes and brief partitions."""
        sc, rng, loop = self.sc, self.rng, asyncio.get_running_loop()
        actions = ["truncate"] * sc.truncations + ["crash"] * sc.crashes + ["read"] * 3
        actions += ["blip"] * 4
        rng.shuffle(actions)
        for action in actions:
            await asyncio.sleep(rng.uniform(0.05, sc.fault_phase_s / (len(actions) + 1)))
            if loop.time() >= self.fault_end:
                return
            name = rng.choice(self.names)
            acked = sorted(self.checks.log(name).acked)
            try:
                if action == "truncate" and acked:
                    before = rng.choice(acked[: len(acked) // 2 + 1])
                    start = await admin.truncate_log(name, before)
                    self.history.note(f"truncated {name} below {before}: starts at {start}")
                elif action == "read" and acked:
                    await self._read_range(admin, name, rng.choice(acked))
                elif action == "crash" and self.run._may_crash():
                    node = rng.choice([b for b in self.world.bookies if b.up])
                    power = rng.random() < self.run.sc.power_loss_share
                    self.run._crash(node, power=power and self.run._may_lose_power())
                elif action == "blip" and self.run.client_names:
                    a = rng.choice(self.run.client_names[-6:])
                    b = rng.choice(self.world.bookies).name
                    self.world.net.partition(a, b)
                    loop.call_later(rng.uniform(0.01, 0.2), self.world.net.unpartition, a, b)
            except (BookKeeperError, TimeoutError) as exc:
                self.history.note(f"log chore {action} on {name}: {type(exc).__name__}: {exc}")

    async def _read_range(self, bk: Any, name: str, first: int) -> None:
        try:
            records = await bk.read_log(name, first, first + 20)
        except LogTruncatedError:
            return
        for offset, record in enumerate(records, first):
            if record.offset != offset:
                self.history.violate(
                    "LogOffsetsDenseAndStable",
                    f"log {name}: read_log from {first} gave {record.offset} at {offset}",
                )
                return
            self.checks.read(name, "read_log", record.offset, record.payload)

    # --- liveness -------------------------------------------------------------------------

    async def _liveness(self, admin: Any) -> None:
        try:
            async with asyncio.timeout(self.sc.liveness_s):
                for name in self.names:
                    end = await self._retry(lambda n=name: self._last_writer(n), attempts=100)
                    start, payloads = await self._retry(lambda n=name: self._read_all(admin, n))
                    self.checks.verify_read_back(name, start, payloads)
                    await self._readers_reach(name, end)
        except TimeoutError:
            self.history.violate(
                "Liveness",
                f"logs not taken over, read back and followed to the end within "
                f"{self.sc.liveness_s} s after healing (readers at {self.readers})",
            )
        for task in list(self.run.tasks):
            if "-reader-" in task.get_name():
                task.cancel()

    async def _last_writer(self, name: str) -> int:
        bk = self.run._client(f"{name}-last-writer")
        try:
            async with bk.open_log_writer(name) as lw:
                self.checks.session_opened(name, "last-writer", lw.next_offset)
                payload = f"{name}/last".encode()
                self.checks.sent(name, payload)
                offset = await lw.append(payload)
                ledger_id, first = lw.segments[-1]
                self.checks.acked(name, "last-writer", offset, payload, ledger_id, offset - first)
                return offset + 1
        finally:
            await close_client(bk)

    async def _read_all(self, bk: Any, name: str) -> tuple[int, list[bytes]]:
        start = (await bk.log_info(name)).start_offset
        payloads: list[bytes] = []
        while True:
            records = await bk.read_log(name, start + len(payloads))
            if not records:
                return start, payloads
            payloads += [r.payload for r in records]

    async def _readers_reach(self, name: str, end: int) -> None:
        readers = [r for r in self.readers if r.startswith(f"{name}-reader")]
        while any(self.readers[r] < end for r in readers):  # noqa: ASYNC110 (virtual time)
            await asyncio.sleep(0.1)
