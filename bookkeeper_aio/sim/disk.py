"""Simulated bookie storage: what survives a crash, a journal with group commit on the virtual
clock, and an engine wrapper that fails I/O on demand.

Theory of operation
-------------------
A simulated bookie's durable state is a :class:`NodeDisk`: the engine's synced state (a
:class:`~engines.memory.MemoryDisk`) and the journal records whose simulated fdatasync
returned. Everything else — the engine's write buffer, journal records still queued — lives in
the running bookie's objects and is what a crash throws away:

* a *process* crash (``kill -9``) keeps the engine's unsynced writes (they were in the page
  cache) and loses the journal queue (never written, never acknowledged);
* a *power* crash keeps only a random prefix of the engine's unsynced writes.

:class:`SimJournal` implements the journal the server expects (append with a durability
callback, checkpoint, close): records queued while a "disk write" is in progress form the next
group commit, which completes after ``fsync_s`` (uniform) of virtual time. :class:`SimStorage`
puts these together behind the server's storage seam; everything runs inline on the loop.
"""

from __future__ import annotations

import asyncio
import errno
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from engines.memory import MemoryDisk, MemoryEngine

from ..bookie.cookie import CookieCheck
from ..bookie.disk import DiskUsage
from ..bookie.journal import Body, JournalRecord
from ..bookie.ledger_dirs import DirShard, LedgerDirs
from ..bookie.records import replay_into
from ..bookie.storage import BookieJournal, FailureCallback, PressureCallback
from ..engine import Engine, LedgerInfo, Record
from ..metadata.store import MetadataStore

Callback = Callable[[BaseException | None], None]


@dataclass
class DiskFaults:
    """Simulated disk speed and failures."""

    fsync_s: tuple[float, float] = (0.0001, 0.002)
    io_error_rate: float = 0.0  # per engine read or write


@dataclass
class NodeDisk:
    """The durable state of one simulated bookie (what a crash keeps)."""

    engine: MemoryDisk = field(default_factory=MemoryDisk)
    journal: list[JournalRecord] = field(default_factory=list)
    dirty: bool = False  # the unclean-shutdown marker
    failed: bool = False  # the ledger disk died (BP-31): every engine call fails with EIO


class SimJournal:
    """A journal on the virtual clock (see the module docstring)."""

    def __init__(self, disk: NodeDisk, rng: random.Random, faults: DiskFaults) -> None:
        self.disk = disk
        self.rng = rng
        self.faults = faults
        self._queue: list[tuple[JournalRecord, Callback]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._stats: Counter[str] = Counter()

    def replay(self) -> list[JournalRecord]:
        return list(self.disk.journal)

    def append(self, rtype: int, body: Body, callback: Callback) -> None:
        data = b"".join(body) if isinstance(body, tuple) else bytes(body)
        self._queue.append((JournalRecord(rtype, data), callback))
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.rng.uniform(*self.faults.fsync_s), self._commit)

    def _commit(self) -> None:
        self._timer = None
        batch, self._queue = self._queue, []
        self.disk.journal.extend(record for record, _ in batch)
        self._stats["batches"] += 1
        self._stats["records"] += len(batch)
        for _, callback in batch:
            callback(None)

    async def checkpoint(self, sync_engine: Callable[[], None]) -> None:
        # Every record in the journal was applied to the engine before it was appended, so
        # once the engine is synced the journal up to here is redundant.
        mark = len(self.disk.journal)
        sync_engine()
        del self.disk.journal[:mark]
        self._stats["checkpoints"] += 1

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._commit()

    def crash(self) -> None:
        """Lose the queue: its records were never durable, their callbacks never run."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._queue.clear()

    def statistics(self) -> dict[str, int | float]:
        return {**self._stats, "queued": len(self._queue)}


class FaultyEngine:
    """An engine wrapper that raises ``OSError`` on reads and writes at ``io_error_rate``."""

    def __init__(self, inner: MemoryEngine, rng: random.Random, faults: DiskFaults) -> None:
        self.inner = inner
        self.rng = rng
        self.faults = faults
        self.errors = 0

    dead = False  # the disk failed: EIO on everything (LedgerDirs takes it out of service)

    def _check_dead(self, what: str) -> None:
        if self.dead:
            raise OSError(errno.EIO, f"simulated disk failure on {what}")

    def _maybe_fail(self, what: str) -> None:
        self._check_dead(what)
        if self.faults.io_error_rate and self.rng.random() < self.faults.io_error_rate:
            self.errors += 1
            raise OSError(f"simulated I/O error on {what}")

    def put_entry(self, ledger_id: int, entry_id: int, record: Record) -> None:
        self._maybe_fail("put_entry")
        self.inner.put_entry(ledger_id, entry_id, record)

    def put_entries(
        self, ledger_id: int, entries: list[tuple[int, Record]], packed: bytes | None = None
    ) -> None:
        for entry_id, record in entries:  # one fault draw per entry, as separate puts made
            self.put_entry(ledger_id, entry_id, record)

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        self._maybe_fail("get_entry")
        return self.inner.get_entry(ledger_id, entry_id)

    def last_entry_id(self, ledger_id: int) -> int:
        self._check_dead("last_entry_id")
        return self.inner.last_entry_id(ledger_id)

    def list_entries(self, ledger_id: int, start_entry_id: int, max_count: int) -> list[int]:
        self._check_dead("list_entries")
        return self.inner.list_entries(ledger_id, start_entry_id, max_count)

    def get_ledger(self, ledger_id: int) -> LedgerInfo | None:
        self._check_dead("get_ledger")
        return self.inner.get_ledger(ledger_id)

    def put_ledger(self, ledger_id: int, info: LedgerInfo) -> None:
        self._check_dead("put_ledger")
        self.inner.put_ledger(ledger_id, info)

    def delete_ledger(self, ledger_id: int) -> None:
        self.inner.delete_ledger(ledger_id)

    def reclaim_space(self, live_ratio_min: float) -> int:
        self._check_dead("reclaim_space")
        return self.inner.reclaim_space(live_ratio_min)

    def ledgers(self) -> list[int]:
        return self.inner.ledgers()

    def sync(self) -> None:
        self._check_dead("sync")
        self.inner.sync()

    def close(self) -> None:
        self.inner.close()


class SimStorage:
    """The bookie storage seam over a :class:`NodeDisk` (see the module docstring)."""

    def __init__(
        self, disk: NodeDisk, rng: random.Random, faults: DiskFaults, guard_dirs: bool = False
    ) -> None:
        self.disk = disk
        self.rng = rng
        self.faults = faults
        self.engine = MemoryEngine(disk.engine)
        self.journal = SimJournal(disk, rng, faults)
        self.guard_dirs = guard_dirs  # autorecovery seeds: the bookie's LedgerDirs on top
        self.faulty: FaultyEngine | None = None

    async def check_cookies(self, metadata: MetadataStore) -> CookieCheck:
        return CookieCheck("simulated")

    async def restamp_cookies(self, metadata: MetadataStore, check: CookieCheck) -> None:
        pass  # simulated dirs never lose their cookies

    async def open(
        self, on_pressure: PressureCallback, on_failure: FailureCallback
    ) -> tuple[Engine, BookieJournal, int]:
        if self.disk.failed:
            raise OSError(errno.EIO, "simulated disk failure: the ledger disk is dead")
        self.faulty = FaultyEngine(self.engine, self.rng, self.faults)
        engine: Engine = self.faulty
        replayed = replay_into(self.engine, iter(self.journal.replay()))
        if self.guard_dirs:
            engine = LedgerDirs([DirShard(engine, "/ledgers")])
        return engine, self.journal, replayed

    async def disk_usage(self) -> DiskUsage:
        return DiskUsage(0.1, 9 << 30, 10 << 30)

    async def close_engine(self, engine: Engine) -> None:
        engine.close()

    async def reclaim_space(self, engine: Engine, live_ratio_min: float) -> int:
        return engine.reclaim_space(live_ratio_min)

    async def unclean_shutdown(self) -> bool:
        return self.disk.dirty

    async def mark_running(self, running: bool) -> None:
        self.disk.dirty = running

    def crash(self, *, power_loss: bool) -> None:
        """What a crash leaves on the :class:`NodeDisk` (see the module docstring)."""
        self.journal.crash()
        unsynced = self.engine.unsynced_writes()
        keep = self.rng.randint(0, len(unsynced)) if power_loss else len(unsynced)
        self.disk.engine.apply(unsynced[:keep])
