"""Chaos: writers, a recovering reader and random process faults against a real cluster.

``python -m bookkeeper_aio.chaos --duration 600 --seed 7`` (``make chaos``) starts etcd and 5
bookie processes on 127.0.0.1; ``tests/test_chaos.py`` runs a short round of the same code.

Theory of operation
-------------------
Several **writers** (one client each) append to a sequence of ledgers, alternating E3/WQ3/AQ2
and E3/WQ2/AQ2, a window of adds in flight, at a bounded rate. A payload is a pure function of
(seed, writer, ledger, entry id) -- header plus hash-derived filler of 0-1020 bytes -- so the
test keeps no copies: it records how far each ledger was *sent* and *acknowledged*. Adds
complete in entry order, so the acknowledged entries are always the prefix 0..acked_max; each
acknowledgement is checked to be the next entry id. A writer moves to a new ledger after a
random number of entries (closing the old one), or at once when its ledger is fenced or closed
under it.

A **recovering reader** (its own client) wakes every few seconds and picks a random live
ledger: usually it opens it with ``recovery=True`` (fencing the writer, which must then fail
with LedgerFencedError/LedgerClosedError and move on), sometimes without recovery, reading up
to the LAC. Whatever it reads must be byte-for-byte a payload the writer sent under that entry
id; a recovery must close the ledger at or past every entry acknowledged before it started,
and a LAC a reader saw must never be truncated later.

A **fault loop** draws actions from a ``random.Random(seed)``: kill -9 a bookie and restart it
a few seconds later, freeze one with SIGSTOP for 1-4 s (SIGCONT always follows, in a
``finally``), or restart one cleanly (SIGTERM). Some 40% of kills and freezes are *targeted*:
the victim is in a live ledger's current ensemble and that ledger is recovered 50 ms later, as
when a bookie and the writer's host fail together. At most ``max_unavailable`` (2 of 5)
bookies are dead or frozen at any moment, so an E3 ensemble can always be formed.

At the deadline the faults stop and the cluster is **healed** (every bookie thawed, dead ones
restarted), the writers close their ledgers, and a fresh client **verifies** every ledger:
it opens it with recovery (retrying while recovery cannot decide), requires it CLOSED, at the
entry any earlier close or recovery reported and at or past every acknowledged entry, and
reads it back in full: every acknowledged entry must be present with its exact payload, and
every entry present must be one the writer sent. Every wait has a timeout; a wait that runs
out is reported as an error (a liveness failure), never silently skipped. So is a bookie that
exits on its own (it is restarted), and a client call that raises CancelledError though
nothing cancelled its caller.

Determinism: the seed fixes the test's random choices (ledger sizes, fault kinds, victims,
delays, which ledger the reader picks) and the clients' rng (placement), not the ledger ids
(the metadata store draws them) nor the interleaving, which depends on timing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import hashlib
import itertools
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from . import (
    BookKeeper,
    BookKeeperError,
    ClientConfig,
    LedgerClosedError,
    LedgerFencedError,
    LedgerReader,
    LedgerRecoveryError,
    LedgerWriter,
    MetadataVersionError,
)
from .sandbox import Cluster

PASSWORD = b"chaos"
CONFIG = ClientConfig(
    request_timeout_s=3,
    connect_timeout_s=2,
    reconnect_backoff_max_s=1,
    explicit_lac_interval_s=0.2,
    long_poll_timeout_ms=1000,
    close_timeout_s=20,
)
QUORUMS = ((3, 3, 2), (3, 2, 2))  # (ensemble, write quorum, ack quorum), by writer index
WINDOW = 32  # adds in flight per writer
ENTRIES_PER_LEDGER = (200, 3000)
RECOVERY_EVERY_S = (1.0, 4.0)
FAULT_EVERY_S = (0.5, 2.5)
FAULTS, FAULT_WEIGHTS = ("kill", "freeze", "restart"), (4, 4, 1)
TARGETED_FRACTION = 0.4
DOWN_S = (1.0, 5.0)  # a killed bookie stays dead this long
FROZEN_S = (1.0, 4.0)  # SIGSTOP .. SIGCONT
APPEND_TIMEOUT_S = 60.0  # an add neither acknowledged nor failed by then is a stall
CREATE_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 45.0
OPEN_TIMEOUT_S = 30.0  # one open (with or without recovery)
READ_TIMEOUT_S = 30.0  # one chunk of reads
READ_CHUNK = 500
BOOKIE_START_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 90.0  # writers and reader finishing after the deadline
VERIFY_LEDGER_TIMEOUT_S = 60.0  # recovering + reading back one ledger at the end
VERIFY_TIMEOUT_S = 120.0  # all of them (plus 1 s per 2000 acknowledged entries)
DETAILS_MAX = 50
T = TypeVar("T")


class Stalled(Exception):
    """A wait ran out: the operation neither completed nor failed in time."""


class SpuriousCancel(BookKeeperError):
    """A client call raised CancelledError although nothing cancelled its caller.

    Seen from ``BookiePool.get`` before commit e9978a7: when the caller that owned a shared
    connection attempt was cancelled (a speculative read or a fencing request no longer
    needed), every other caller waiting on that attempt got its CancelledError. The workload
    treats it like any failed call (and retries), but it is counted in
    :attr:`ChaosReport.anomalies` and fails the run.
    """


async def _call(report: ChaosReport, what: str, awaitable: Awaitable[T]) -> T:
    """Await a client call, turning a CancelledError nobody asked for into SpuriousCancel."""
    try:
        return await awaitable
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise  # a real cancellation (ours, or a timeout's)
        report.anomaly(f"{what}: CancelledError although the caller was not cancelled")
        raise SpuriousCancel(f"{what}: spurious CancelledError") from None


@dataclass
class LedgerLog:
    """What the test knows about one ledger."""

    ledger_id: int
    writer: int
    quorums: tuple[int, int, int]
    sent_max: int = -1  # highest entry id handed to the writer
    acked_max: int = -1  # entries 0..acked_max were acknowledged to the writer
    live: bool = True  # its writer is still appending
    closed_at: int | None = None  # last entry id as a close or recovery reported it
    closed_by: str = ""
    lac_seen: int = -1  # highest LAC a non-recovery reader saw


@dataclass
class ChaosReport:
    """The outcome of :func:`run_chaos`; :attr:`ok` is the verdict."""

    seed: int
    duration_s: float
    elapsed_s: float = 0.0
    ledgers: int = 0
    acknowledged: int = 0
    sent: int = 0
    verified_entries: int = 0  # entries read back and compared in the final check
    lost: int = 0  # acknowledged entries missing, different or unreadable at the end
    corrupt: int = 0  # entries read that the writer never sent under that id
    unclosed: list[int] = field(default_factory=list)
    closed_ledgers: int = 0
    errors: list[str] = field(default_factory=list)  # stalls, failed restarts, surprises
    anomalies: collections.Counter[str] = field(default_factory=collections.Counter)
    details: list[str] = field(default_factory=list)  # the first problems, for the message
    kills: int = 0
    targeted: int = 0  # faults on a live ledger's ensemble, followed at once by its recovery
    freezes: int = 0
    clean_restarts: int = 0
    restarts: int = 0  # bookie processes started again (after kill or SIGTERM)
    recoveries: int = 0  # live ledgers recovered by the reader
    recovery_retries: int = 0  # recoveries that could not decide (yet) under faults
    peeks: int = 0  # live ledgers read up to the LAC without recovery
    read_retries: int = 0
    entries_checked_live: int = 0  # entries the reader compared while the faults ran
    fenced: int = 0  # writers that got LedgerFencedError and moved on
    closed_under_writer: int = 0  # writers that found their ledger closed by someone else
    writer_failures: collections.Counter[str] = field(default_factory=collections.Counter)
    ensemble_changes: int = 0

    @property
    def ok(self) -> bool:
        """Nothing acknowledged lost, nothing foreign read, every ledger closed, no errors."""
        return not (self.lost or self.corrupt or self.unclosed or self.errors or self.anomalies)

    def anomaly(self, text: str) -> None:
        """A client misbehaviour that the workload survives (it fails the run all the same)."""
        self.anomalies[text] += 1

    def problem(self, text: str) -> None:
        if len(self.details) < DETAILS_MAX:
            self.details.append(text)

    def summary(self) -> str:
        failures = ", ".join(f"{k} {v}" for k, v in sorted(self.writer_failures.items()))
        lines = [
            f"chaos seed {self.seed}: {self.elapsed_s:.0f}s ({self.duration_s:.0f}s of faults), "
            f"{self.ledgers} ledgers ({self.closed_ledgers} closed, {len(self.unclosed)} not), "
            f"acknowledged {self.acknowledged}, lost {self.lost}, corrupt {self.corrupt}",
            f"  faults: {self.kills} kill -9, {self.freezes} SIGSTOP, "
            f"{self.clean_restarts} SIGTERM ({self.targeted} targeted, then recovery); "
            f"{self.restarts} restarts",
            f"  reader: {self.recoveries} recoveries of live ledgers "
            f"({self.recovery_retries} undecided, retried), {self.peeks} reads to the LAC, "
            f"{self.entries_checked_live} entries checked live, {self.read_retries} read retries",
            f"  writers: {self.sent} entries sent, {self.fenced} fenced, "
            f"{self.closed_under_writer} closed under them, {self.ensemble_changes} ensemble "
            f"changes, other failures: {failures or 'none'}",
            f"  verified {self.verified_entries} entries; errors {len(self.errors)}",
        ]
        lines += [f"  ANOMALY x{n}: {text}" for text, n in self.anomalies.most_common()]
        lines += [f"  ERROR {e}" for e in self.errors[:DETAILS_MAX]]
        lines += [f"  PROBLEM {d}" for d in self.details]
        lines.append("OK" if self.ok else "FAILED")
        return "\n".join(lines)


async def _event_wait(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait for ``event`` at most ``timeout_s``; True if it is set."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        pass
    return event.is_set()


def payload(seed: int, writer: int, ledger_id: int, entry_id: int) -> bytes:
    """The payload of an entry: a header naming it, then 0-1020 bytes derived from it."""
    header = f"chaos {seed} w{writer} l{ledger_id} e{entry_id} ".encode()
    digest = hashlib.blake2b(header, digest_size=32).digest()
    size = digest[0] * 4
    return header + (digest * (size // 32 + 1))[:size]


def _diff(entry: Any, sent: bytes | None) -> str:
    """How an entry read differs from what the writer sent."""
    got = entry.payload
    if sent is None:
        return f"read {len(got)} bytes {got[:40]!r}, but the writer never sent this entry"
    common = min(len(got), len(sent))
    at = next((i for i in range(common) if got[i] != sent[i]), common)
    return (
        f"read {len(got)} bytes (id {entry.entry_id}), the writer sent {len(sent)}; they differ "
        f"from byte {at}: {got[at : at + 16]!r} vs {sent[at : at + 16]!r}"
    )


@contextlib.contextmanager
def thawed_on_exit(cluster: Cluster) -> Iterator[Cluster]:
    """SIGCONT every live bookie on the way out, so a SIGTERM teardown is never ignored."""
    try:
        yield cluster
    finally:
        for bookie in cluster.bookies:
            if bookie.running:
                with contextlib.suppress(ProcessLookupError):
                    bookie.signal(signal.SIGCONT)


class _Chaos:
    """One run; see the module docstring."""

    def __init__(
        self,
        cluster: Cluster,
        duration_s: float,
        seed: int,
        writers: int,
        rate: float,
        say: Callable[[str], None],
    ) -> None:
        self.cluster = cluster
        self.bookies = cluster.bookies
        self.duration_s = duration_s
        self.seed = seed
        self.writers = writers
        self.rate = rate  # entries per second per writer
        self._say = say
        self.report = ChaosReport(seed, duration_s)
        self.ledgers: dict[int, LedgerLog] = {}
        self.live: dict[int, LedgerWriter] = {}  # ledgers whose writer is appending
        self.unavailable: set[int] = set()  # bookie indexes dead or frozen
        self.frozen: set[int] = set()
        self.starting: set[int] = set()
        self.max_unavailable = max(0, min(2, len(self.bookies) - 3))
        self.stop_faults = asyncio.Event()
        self.stop_writers = asyncio.Event()
        self.fault_tasks: set[asyncio.Task[None]] = set()
        self.closed_final: set[int] = set()
        self.last_failure = ""  # of the ledger being verified, for the report
        self.t0 = time.monotonic()

    # --- reporting ------------------------------------------------------------------------

    def say(self, text: str) -> None:
        self._say(f"t={time.monotonic() - self.t0:6.1f}s  {text}")

    def error(self, text: str) -> None:
        self.report.errors.append(text)
        self.say(f"ERROR {text}")

    def name(self, index: int) -> str:
        return f"bookie-{index} ({self.bookies[index].address})"

    async def watch(self) -> None:
        """Every second: restart a bookie that died on its own (and report it); every five
        seconds: a progress line."""
        for tick in itertools.count(1):
            await asyncio.sleep(1)
            for index, bookie in enumerate(self.bookies):
                if bookie.running or index in self.unavailable or index in self.starting:
                    continue
                status = bookie.proc.returncode if bookie.proc is not None else None
                self.error(f"{self.name(index)} exited on its own (status {status})")
                self.unavailable.add(index)
                task = asyncio.create_task(self.start(index))
                self.fault_tasks.add(task)
                task.add_done_callback(self.fault_tasks.discard)
            if tick % 5:
                continue
            r = self.report
            acked = sum(log.acked_max + 1 for log in self.ledgers.values())
            down = ", ".join(
                f"bookie-{i}{' frozen' if i in self.frozen else ' dead'}"
                for i in sorted(self.unavailable)
            )
            self.say(
                f"acknowledged {acked} in {len(self.ledgers)} ledgers; kills {r.kills}, "
                f"freezes {r.freezes}, restarts {r.restarts}; recoveries {r.recoveries} "
                f"(undecided {r.recovery_retries}), fenced {r.fenced}; "
                f"unavailable: {down or 'none'}"
            )

    # --- faults ---------------------------------------------------------------------------

    async def fault_loop(self, reader_bk: BookKeeper) -> None:
        """Draw a fault every few seconds. A *targeted* fault hits a bookie of a live ledger's
        current ensemble and recovers that ledger at once, as when a bookie and the writer's
        host fail together."""
        rng = random.Random(f"{self.seed}/faults")
        while not await _event_wait(self.stop_faults, rng.uniform(*FAULT_EVERY_S)):
            action = rng.choices(FAULTS, weights=FAULT_WEIGHTS)[0]
            delay = rng.uniform(*(FROZEN_S if action == "freeze" else DOWN_S))
            targeted = rng.random() < TARGETED_FRACTION and action != "restart"
            candidates = [
                i
                for i, b in enumerate(self.bookies)
                if i not in self.unavailable and i not in self.starting and b.running
            ]
            target: LedgerLog | None = None
            live = sorted(self.live)
            if targeted and live:
                target = self.ledgers[rng.choice(live)]
                ensemble = set(self.live[target.ledger_id].statistics()["ensemble"])
                candidates = [i for i in candidates if self.bookies[i].address in ensemble]
            if len(self.unavailable) >= self.max_unavailable or not candidates:
                continue
            victim = rng.choice(candidates)
            self.unavailable.add(victim)
            faults = {"kill": self.kill, "freeze": self.freeze, "restart": self.clean_restart}
            recover = None
            if target is not None:
                self.report.targeted += 1
                why = f"after {action} of bookie-{victim}"
                recover = functools.partial(self.recover_live, reader_bk, target, why)
            fault = functools.partial(faults[action], victim, delay)
            task = asyncio.create_task(self.fault_then(fault, recover))
            self.fault_tasks.add(task)
            task.add_done_callback(self.fault_tasks.discard)

    async def fault_then(
        self, fault: Callable[[], Awaitable[None]], recover: Callable[[], Awaitable[None]] | None
    ) -> None:
        """Run a fault; start the recovery (if any) as soon as the fault has struck."""
        async with asyncio.TaskGroup() as group:
            group.create_task(fault())
            if recover is not None:
                await asyncio.sleep(0.05)  # the fault strikes at its first step
                group.create_task(recover())

    async def kill(self, index: int, down_s: float) -> None:
        self.say(f"kill -9 {self.name(index)}; restart in {down_s:.1f}s")
        self.bookies[index].kill()  # SIGKILL, then reaping: immediate
        self.report.kills += 1
        await _event_wait(self.stop_faults, down_s)
        await self.start(index)

    async def clean_restart(self, index: int, down_s: float) -> None:
        self.say(f"SIGTERM {self.name(index)}; restart in {down_s:.1f}s")
        status = await asyncio.to_thread(self.bookies[index].stop, 20.0)
        if status != 0:
            self.error(f"{self.name(index)} exited {status} after SIGTERM (expected 0)")
        self.report.clean_restarts += 1
        await _event_wait(self.stop_faults, down_s)
        await self.start(index)

    async def freeze(self, index: int, frozen_s: float) -> None:
        bookie = self.bookies[index]
        self.say(f"SIGSTOP {self.name(index)} for {frozen_s:.1f}s")
        bookie.signal(signal.SIGSTOP)
        self.frozen.add(index)
        self.report.freezes += 1
        try:
            await _event_wait(self.stop_faults, frozen_s)
        finally:  # never leave a bookie frozen, whatever happens to this task
            with contextlib.suppress(ProcessLookupError):
                bookie.signal(signal.SIGCONT)
            self.frozen.discard(index)
            self.unavailable.discard(index)
        self.say(f"SIGCONT {self.name(index)}")

    async def start(self, index: int) -> bool:
        """Start a dead bookie again (in a thread: it polls until the port listens)."""
        bookie = self.bookies[index]
        if bookie.running or index in self.starting:
            return bookie.running
        self.starting.add(index)
        try:
            await asyncio.to_thread(bookie.start, BOOKIE_START_TIMEOUT_S)
        except (RuntimeError, TimeoutError, OSError) as exc:
            self.error(f"{self.name(index)} did not restart: {exc}")
            return False
        finally:
            self.starting.discard(index)
        self.report.restarts += 1
        self.unavailable.discard(index)
        self.say(f"restarted {self.name(index)}")
        return True

    async def heal(self) -> None:
        """Thaw every bookie and restart the dead ones."""
        for bookie in self.bookies:
            if bookie.running:
                with contextlib.suppress(ProcessLookupError):
                    bookie.signal(signal.SIGCONT)
        self.frozen.clear()
        for index, bookie in enumerate(self.bookies):
            if not bookie.running and index not in self.starting:
                await self.start(index)
        self.say("healed: every bookie running")

    # --- writers --------------------------------------------------------------------------

    async def writer(self, index: int, bk: BookKeeper) -> None:
        rng = random.Random(f"{self.seed}/writer/{index}")
        quorums = QUORUMS[index % len(QUORUMS)]
        while not self.stop_writers.is_set():
            try:
                async with asyncio.timeout(CREATE_TIMEOUT_S):
                    w = await _call(
                        self.report, "create_ledger", bk.create_ledger(*quorums, password=PASSWORD)
                    )
            except BookKeeperError as exc:
                self.report.writer_failures[f"create: {type(exc).__name__}"] += 1
                await _event_wait(self.stop_writers, 0.5)
                continue
            except TimeoutError:
                self.error(f"writer {index}: create_ledger took over {CREATE_TIMEOUT_S}s")
                continue
            log = LedgerLog(w.ledger_id, index, quorums)
            self.ledgers[w.ledger_id] = log
            self.live[w.ledger_id] = w
            try:
                await self.fill(w, log, rng)
            finally:
                log.live = False
                del self.live[w.ledger_id]
                self.report.ensemble_changes += w.statistics()["ensemble_changes"]

    async def fill(self, w: LedgerWriter, log: LedgerLog, rng: random.Random) -> None:
        """Append until the ledger's quota or the deadline, then close; stop if fenced."""
        target = rng.randint(*ENTRIES_PER_LEDGER)
        window: collections.deque[tuple[int, asyncio.Future[int]]] = collections.deque()
        started = time.monotonic()
        tag = f"writer {log.writer}: ledger {log.ledger_id}"
        try:
            for n in range(target):
                if self.stop_writers.is_set():
                    break
                future = w.append_nowait(payload(self.seed, log.writer, log.ledger_id, n))
                if w.last_add_pushed != n:
                    self.error(f"{tag}: append #{n} was given entry id {w.last_add_pushed}")
                log.sent_max = n
                self.report.sent += 1
                window.append((n, future))
                if len(window) >= WINDOW:
                    await self.settle(log, *window.popleft())
                ahead = started + (n + 1) / self.rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
            while window:
                await self.settle(log, *window.popleft())
        except LedgerFencedError:
            self.report.fenced += 1
            await self.collect(log, window)
            self.say(f"{tag} fenced after {log.acked_max + 1} acks; starting a new ledger")
            return
        except LedgerClosedError:
            self.report.closed_under_writer += 1
            await self.collect(log, window)
            self.say(f"{tag} closed under the writer; starting a new ledger")
            return
        except BookKeeperError as exc:
            self.report.writer_failures[type(exc).__name__] += 1
            await self.collect(log, window)
            self.say(f"{tag} failed ({type(exc).__name__}: {exc}); closing it")
        except Stalled as exc:
            self.error(f"{tag}: {exc}")
            await self.collect(log, window)
        await self.close(w, log)

    async def settle(self, log: LedgerLog, entry_id: int, future: asyncio.Future[int]) -> None:
        """Wait for the oldest add; record it as acknowledged, or raise its error."""
        done, _ = await asyncio.wait({future}, timeout=APPEND_TIMEOUT_S)
        if not done:
            raise Stalled(
                f"entry {entry_id} neither acknowledged nor failed in {APPEND_TIMEOUT_S}s"
            )
        self.acked(log, entry_id, future.result())

    def acked(self, log: LedgerLog, entry_id: int, got: int) -> None:
        if got != entry_id or got != log.acked_max + 1:
            self.error(
                f"ledger {log.ledger_id}: the add sent as {entry_id} was acknowledged as {got} "
                f"after {log.acked_max} (out of order)"
            )
        log.acked_max = max(log.acked_max, got)

    async def collect(
        self, log: LedgerLog, window: collections.deque[tuple[int, asyncio.Future[int]]]
    ) -> None:
        """After a failure: record the adds of the window that were acknowledged anyway."""
        futures = {f for _, f in window}
        if futures:
            await asyncio.wait(futures, timeout=APPEND_TIMEOUT_S)
        for entry_id, future in window:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.acked(log, entry_id, future.result())
            elif not future.done():
                self.error(f"ledger {log.ledger_id}: add {entry_id} still pending after failure")
        window.clear()

    async def close(self, w: LedgerWriter, log: LedgerLog) -> None:
        tag = f"writer {log.writer}: ledger {log.ledger_id}"
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await w.close()
        except (LedgerFencedError, MetadataVersionError) as exc:
            self.report.closed_under_writer += 1
            self.say(f"{tag}: close lost to a recoverer ({type(exc).__name__})")
            return
        except BookKeeperError as exc:
            self.report.writer_failures[f"close: {type(exc).__name__}"] += 1
            self.say(f"{tag}: close failed ({type(exc).__name__}: {exc}); left to recovery")
            return
        except TimeoutError:
            self.error(f"{tag}: close took over {CLOSE_TIMEOUT_S}s")
            return
        self.closed(log, w.last_add_confirmed, f"writer {log.writer}")

    def closed(self, log: LedgerLog, last: int, by: str) -> None:
        """Note where a ledger was closed; every later look must agree."""
        if log.closed_at is None:
            log.closed_at, log.closed_by = last, by
        elif log.closed_at != last:
            self.error(
                f"ledger {log.ledger_id}: {log.closed_by} closed it at {log.closed_at}, "
                f"{by} at {last}"
            )

    async def open(self, bk: BookKeeper, ledger_id: int, *, recovery: bool) -> LedgerReader:
        opening = bk.open_ledger(ledger_id, PASSWORD, recovery=recovery)
        return await _call(self.report, f"open_ledger(recovery={recovery})", opening)

    # --- the recovering reader ------------------------------------------------------------

    async def reader(self, bk: BookKeeper) -> None:
        rng = random.Random(f"{self.seed}/reader")
        while not await _event_wait(self.stop_writers, rng.uniform(*RECOVERY_EVERY_S)):
            live = sorted(i for i, log in self.ledgers.items() if log.live and log.acked_max >= 0)
            if not live:
                continue
            log = self.ledgers[rng.choice(live)]
            if rng.random() < 0.25:
                await self.peek(bk, log)
            else:
                await self.recover_live(bk, log)

    async def recover_live(self, bk: BookKeeper, log: LedgerLog, why: str = "") -> None:
        acked_before = log.acked_max
        started = time.monotonic()
        try:
            async with asyncio.timeout(OPEN_TIMEOUT_S):
                reader = await self.open(bk, log.ledger_id, recovery=True)
        except (LedgerRecoveryError, BookKeeperError) as exc:
            self.report.recovery_retries += 1
            self.say(f"recovery of ledger {log.ledger_id} {why} undecided ({exc})")
            return
        except TimeoutError:
            self.error(f"recovery of ledger {log.ledger_id} took over {OPEN_TIMEOUT_S}s")
            return
        self.report.recoveries += 1
        last = reader.last_add_confirmed
        self.closed(log, last, "the recovering reader")
        if last < acked_before:
            self.report.problem(
                f"recovery closed ledger {log.ledger_id} at {last}, but entry {acked_before} "
                "was acknowledged before it started"
            )
        checked = await self.check_live(reader, log, last)
        self.say(
            f"recovered ledger {log.ledger_id} (writer {log.writer}) {why}{' ' if why else ''}"
            f"at entry {last} in {time.monotonic() - started:.1f}s; {checked} entries checked"
        )

    async def peek(self, bk: BookKeeper, log: LedgerLog) -> None:
        """Open without recovery and read up to the LAC (the last READ_CHUNK entries)."""
        try:
            async with asyncio.timeout(OPEN_TIMEOUT_S):
                reader = await self.open(bk, log.ledger_id, recovery=False)
        except BookKeeperError:
            self.report.read_retries += 1
            return
        except TimeoutError:
            self.error(f"opening ledger {log.ledger_id} took over {OPEN_TIMEOUT_S}s")
            return
        self.report.peeks += 1
        lac = reader.last_add_confirmed
        log.lac_seen = max(log.lac_seen, lac)
        await self.check_live(reader, log, lac, max(0, lac - READ_CHUNK + 1))

    async def check_live(
        self, reader: LedgerReader, log: LedgerLog, last: int, first: int = 0
    ) -> int:
        """Read ``first..last`` while faults go on; compare with what was sent."""
        checked = 0
        for lo in range(first, last + 1, READ_CHUNK):
            hi = min(last, lo + READ_CHUNK - 1)
            try:
                async with asyncio.timeout(READ_TIMEOUT_S):
                    entries = await _call(self.report, "LedgerReader.read", reader.read(lo, hi))
            except BookKeeperError:
                self.report.read_retries += 1  # replicas down right now: checked at the end
                break
            except TimeoutError:
                self.error(f"reading {lo}..{hi} of ledger {log.ledger_id} took over "
                           f"{READ_TIMEOUT_S}s")  # fmt: skip
                break
            checked += len(entries) - len(self.compare(log, lo, entries))
        self.report.entries_checked_live += checked
        return checked

    def compare(self, log: LedgerLog, first: int, entries: list[Any]) -> list[int]:
        """Compare entries read from ``first`` on with what was sent; the bad entry ids."""
        bad = []
        for entry_id, entry in enumerate(entries, first):
            sent = None
            if entry_id <= log.sent_max:
                sent = payload(self.seed, log.writer, log.ledger_id, entry_id)
            if entry.entry_id == entry_id and entry.payload == sent:
                continue
            bad.append(entry_id)
            self.report.corrupt += 1
            self.report.problem(f"ledger {log.ledger_id} entry {entry_id}: " + _diff(entry, sent))
        return bad

    # --- the final check ------------------------------------------------------------------

    async def verify(self, bk: BookKeeper) -> None:
        r = self.report
        r.ledgers = len(self.ledgers)
        r.acknowledged = sum(log.acked_max + 1 for log in self.ledgers.values())
        deadline = time.monotonic() + VERIFY_TIMEOUT_S + r.acknowledged / 2000
        for ledger_id in sorted(self.ledgers):
            log = self.ledgers[ledger_id]
            self.last_failure = "no failure"
            budget = max(5.0, min(VERIFY_LEDGER_TIMEOUT_S, deadline - time.monotonic()))
            try:
                async with asyncio.timeout(budget):
                    await self.verify_ledger(bk, log)
            except TimeoutError:
                if ledger_id not in self.closed_final:
                    r.unclosed.append(ledger_id)
                r.lost += log.acked_max + 1
                r.problem(
                    f"ledger {ledger_id}: not verified in {budget:.0f}s (last failure: "
                    f"{self.last_failure}); its {log.acked_max + 1} acknowledged entries count "
                    "as lost"
                )
        self.say(f"verified {len(self.ledgers)} ledgers")

    async def verify_ledger(self, bk: BookKeeper, log: LedgerLog) -> None:
        """Recover (retrying while it fails), then read the whole ledger back."""
        r = self.report
        while True:
            try:
                reader = await self.open(bk, log.ledger_id, recovery=True)
                break
            except BookKeeperError as exc:
                self.last_failure = f"open_ledger: {type(exc).__name__}: {exc}"
                await asyncio.sleep(0.5)
        if not reader.is_closed:
            r.unclosed.append(log.ledger_id)
            r.problem(f"ledger {log.ledger_id}: still {reader.metadata.state} after recovery")
            return
        r.closed_ledgers += 1
        self.closed_final.add(log.ledger_id)
        last = reader.last_add_confirmed
        self.closed(log, last, "the final check")
        if last < log.lac_seen:
            r.problem(f"ledger {log.ledger_id}: closed at {last}, a reader saw LAC {log.lac_seen}")
            r.errors.append(f"ledger {log.ledger_id}: a LAC seen by a reader was truncated")
        bad: list[int] = []
        for lo in range(0, last + 1, READ_CHUNK):
            hi = min(last, lo + READ_CHUNK - 1)
            entries = await self.read_retrying(reader, lo, hi)
            bad += self.compare(log, lo, entries)
            r.verified_entries += len(entries)
        missing = [e for e in bad if e <= log.acked_max] + list(range(last + 1, log.acked_max + 1))
        if missing:
            r.lost += len(missing)
            r.problem(
                f"ledger {log.ledger_id} (writer {log.writer}, E/WQ/AQ {log.quorums}) closed at "
                f"{last} by {log.closed_by}; acknowledged 0..{log.acked_max}: "
                f"{len(missing)} acknowledged entries missing or different, first {missing[:10]}"
            )

    async def read_retrying(self, reader: LedgerReader, lo: int, hi: int) -> list[Any]:
        """Read a chunk, retrying ReadError (bookies just restarted) until the caller's timeout."""
        while True:
            try:
                async with asyncio.timeout(READ_TIMEOUT_S):
                    return await _call(self.report, "LedgerReader.read", reader.read(lo, hi))
            except BookKeeperError as exc:
                self.last_failure = f"read {lo}..{hi}: {type(exc).__name__}: {exc}"
                self.report.read_retries += 1
                await asyncio.sleep(0.5)


async def run_chaos(
    cluster: Cluster,
    duration_s: float,
    seed: int,
    *,
    writers: int = 3,
    rate: float = 250.0,
    bugs: frozenset[str] = frozenset(),
    say: Callable[[str], None] = print,
) -> ChaosReport:
    """Run writers, a recovering reader and faults for ``duration_s``; heal; verify.

    ``cluster`` must be started (at least 4 bookies; 5 allow two faults at once). ``rate`` is
    entries per second per writer; ``bugs`` re-introduces known client bugs (the simulator's
    switches, e.g. ``unknown-as-negative``) in the reader's client, to see the check catch
    them. Every bookie runs and none is frozen when this returns.
    """
    chaos = _Chaos(cluster, duration_s, seed, writers, rate, say)
    loop = asyncio.get_running_loop()
    previous_handler = loop.get_exception_handler()

    def on_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        trace = "".join(traceback.format_exception(exc)) if exc is not None else ""
        chaos.error(f"event loop: {context.get('message')} {trace}".strip())
        loop.default_exception_handler(context)

    loop.set_exception_handler(on_loop_error)
    tasks: list[asyncio.Task[Any]] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            clients = []
            for i in range(writers + 1):  # 0: the reader; then one per writer
                rng = random.Random(f"{seed}/client/{i}")
                client_bugs = bugs if i == 0 else frozenset()
                connecting = BookKeeper.connect(cluster.uri, CONFIG, rng=rng, bugs=client_bugs)
                clients.append(await stack.enter_async_context(connecting))
            say(
                f"chaos seed {seed}: {writers} writers, a recovering reader, faults for "
                f"{duration_s:.0f}s on {len(cluster.bookies)} bookies "
                f"(at most {chaos.max_unavailable} unavailable)"
            )
            work = [asyncio.create_task(chaos.writer(i, c)) for i, c in enumerate(clients[1:])]
            work.append(asyncio.create_task(chaos.reader(clients[0])))
            faults = asyncio.create_task(chaos.fault_loop(clients[0]))
            tasks = [*work, faults, asyncio.create_task(chaos.watch())]
            await asyncio.sleep(duration_s)

            chaos.stop_faults.set()
            await asyncio.wait([faults, *chaos.fault_tasks], timeout=BOOKIE_START_TIMEOUT_S + 10)
            await chaos.heal()
            chaos.stop_writers.set()
            done, pending = await asyncio.wait(work, timeout=DRAIN_TIMEOUT_S)
            for task in pending:
                chaos.error(f"{task.get_coro()!r} did not finish in {DRAIN_TIMEOUT_S}s")
            for task in done:
                if task.cancelled():
                    chaos.error(f"{task.get_coro()!r} ended cancelled")
                elif (exc := task.exception()) is not None:
                    chaos.error("".join(traceback.format_exception(exc)))
            chaos.say("writers stopped; verifying every ledger with a fresh client")
        async with BookKeeper.connect(cluster.uri, CONFIG) as bk:
            await chaos.verify(bk)
    finally:
        for task in [*tasks, *chaos.fault_tasks]:
            task.cancel()
        await asyncio.gather(*tasks, *chaos.fault_tasks, return_exceptions=True)
        for bookie in cluster.bookies:  # nothing stays frozen, even after an exception
            if bookie.running:
                with contextlib.suppress(ProcessLookupError):
                    bookie.signal(signal.SIGCONT)
        loop.set_exception_handler(previous_handler)
    chaos.report.elapsed_s = time.monotonic() - chaos.t0
    return chaos.report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bookkeeper_aio.chaos",
        description="Chaos test against etcd and real bookie processes on 127.0.0.1; "
        "exit status 1 if an acknowledged entry was lost or a ledger did not close.",
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of faults")
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock")
    parser.add_argument("--bookies", type=int, default=5)
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--rate", type=float, default=250.0, help="entries/s per writer")
    parser.add_argument("--engine", default="rocksdb", choices=("rocksdb", "files"))
    parser.add_argument("--dir", help="keep the cluster's data and logs here")
    parser.add_argument(
        "--bug", action="append", default=[], help="a known client bug for the reader to have"
    )
    args = parser.parse_args(argv)
    if args.bookies < 4:
        parser.error("--bookies must be at least 4 (E3 ensembles and one fault)")
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="bookkeeper-aio-chaos-"))
    print(f"starting etcd and {args.bookies} bookies under {root}", flush=True)
    replay = f"python -m bookkeeper_aio.chaos --duration {args.duration:g} --seed {seed}"
    _interrupt_on_signals()
    report: ChaosReport | None = None
    try:
        with Cluster(root, args.bookies, args.engine) as cluster, thawed_on_exit(cluster):
            report = asyncio.run(
                run_chaos(
                    cluster, args.duration, seed, writers=args.writers, rate=args.rate,
                    bugs=frozenset(args.bug), say=lambda text: print(text, flush=True),
                )
            )  # fmt: skip
    except KeyboardInterrupt:
        print(f"interrupted; every process stopped; data and logs kept under {root}", flush=True)
        return 130
    if report.ok and not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"data and bookie logs kept under {root}", flush=True)
    print(report.summary(), flush=True)
    print(f"to replay: {replay}", flush=True)
    return 0 if report.ok else 1


def _interrupt_on_signals() -> None:
    """SIGTERM (and SIGINT, unless ignored) raise KeyboardInterrupt once: the tasks are
    cancelled, frozen bookies thawed and every process stopped; later signals are ignored so
    that the teardown finishes."""

    def interrupt(signum: int, frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupt)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, interrupt)


if __name__ == "__main__":
    sys.exit(main())
