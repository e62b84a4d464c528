"""Simulated bookie storage: what survives a crash, a journal with group commit on the virtual
clock, and an engine wrapper that fails I/O on demand.

Theory of operation
-------------------
A simulated bookie's durable state is a :class:`NodeDisk`: the engine's synced state (a
:class:`~engines.memory.MemoryDisk`) and the journal records whose simulated fdatasync
returned. Everything else — the engine's write buffer, journal records still queued — lives in
the running bookie's objects and is what a crash throws away:

* a *process* crash (``kill -9``) loses the journal queue (never written, never
  acknowledged); it keeps the engine's unsynced writes (in the page cache, or in RocksDB's WAL
  on a BP-46 bookie), except, on a journaled bookie, its entries (the rocksdb engine's
  memtable, no WAL: the journal's replay puts back those it had);
* a *power* crash keeps only a random prefix of the engine's unsynced writes.

:class:`SimJournal` keeps the real journal's contract (docs/simulation.md#the-journal-contract;
both pass ``tests/test_journal_contract.py``): one write at a time, which gathers what is
queued for ``fsync_s`` (uniform) of virtual time and is then durable at once (the shape of the
real journal with ``journal_batch_wait_ms``; the real one's default writes the first record at
once and groups what arrives during its write), taking at most ``journal_batch_bytes_max``
(the rest is the next write); callbacks run in append order once their batch is on the
:class:`NodeDisk`; past ``journal_queue_bytes_max`` not yet durable it reports pressure until
the queue drains below half; an injected write error (``journal_error_rate`` per batch, or a
dead journal disk) fails the batch and everything after it, as the real journal's fail-stop
does. Below the bounds it draws exactly as the twin before the contract did, so the seeds'
schedules did not move. :class:`SimStorage` puts these together behind the
server's storage seam; everything runs inline on the loop.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import logging
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from engines.memory import MemoryDisk, MemoryEngine

from ..bookie.cookie import CookieCheck
from ..bookie.disk import DiskUsage
from ..bookie.journal import Body, JournalRecord
from ..bookie.journal_format import RECORD_HEADER
from ..bookie.ledger_dirs import DirShard, LedgerDirs
from ..bookie.records import replay_into
from ..bookie.storage import BookieJournal, FailureCallback, PressureCallback
from ..config import BookieConfig
from ..engine import Engine, LedgerInfo, Record
from ..errors import JournalFailedError
from ..metadata.store import MetadataStore

Callback = Callable[[BaseException | None], None]
_Queued = tuple[JournalRecord, Callback]
_OVERHEAD = RECORD_HEADER.size + 1  # per record, as the real journal counts its queue
log = logging.getLogger(__name__)


@dataclass
class DiskFaults:
    """Simulated disk speed and failures."""

    fsync_s: tuple[float, float] = (0.0001, 0.002)
    io_error_rate: float = 0.0  # per engine read or write
    journal_error_rate: float = 0.0  # per journal batch write: the journal fails (fail-stop)
    journal_errors_next: int = 0  # the next this many journal batch writes fail


@dataclass
class NodeDisk:
    """The durable state of one simulated bookie (what a crash keeps)."""

    engine: MemoryDisk = field(default_factory=MemoryDisk)
    journal: list[JournalRecord] = field(default_factory=list)
    dirty: bool = False  # the unclean-shutdown marker
    dirty_boot: int = 0  # the node's boot it names (bookie/storage.py)
    boot: int = 0  # the node's operating system boots: a power loss is a new one
    failed: bool = False  # the ledger disk died (BP-31): every engine call fails with EIO
    journal_failed: bool = False  # the journal disk died: every write fails, boots fail


class SimJournal:
    """A journal on the virtual clock that keeps the real journal's contract (see the module
    docstring and docs/simulation.md#the-journal-contract)."""

    def __init__(
        self,
        disk: NodeDisk,
        rng: random.Random,
        faults: DiskFaults,
        config: BookieConfig | None = None,
        *,
        on_pressure: PressureCallback | None = None,
        on_failure: FailureCallback | None = None,
    ) -> None:
        self.disk = disk
        self.rng = rng
        self.faults = faults
        self.config = config or BookieConfig()
        self._on_pressure = on_pressure
        self._on_failure = on_failure
        self._queue: collections.deque[_Queued] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None  # the write in progress, if any
        self._queued_bytes = 0  # appended, not yet durable (the real journal's count)
        self._pressure = False
        self._failed: JournalFailedError | None = None
        self._broken: OSError | None = None  # the write error; nothing is written after it
        self._closing = False
        self._stats: Counter[str] = Counter()

    def replay(self) -> list[JournalRecord]:
        return list(self.disk.journal)

    @property
    def failed(self) -> BaseException | None:
        """The failure that stopped the journal, if any."""
        return self._failed

    @property
    def queued_bytes(self) -> int:
        """Bytes appended but not yet durable."""
        return self._queued_bytes

    def append(self, rtype: int, body: Body, callback: Callback) -> None:
        """Queue a record; ``callback(None)`` once it is durable, ``callback(exc)`` on failure.

        Raises:
            JournalFailedError: the journal has failed or is closed.
        """
        if self._failed is not None:
            raise JournalFailedError(f"journal failed: {self._failed}") from self._failed
        if self._closing:
            raise JournalFailedError("journal is not running")
        data = b"".join(body) if isinstance(body, tuple) else bytes(body)
        self._queue.append((JournalRecord(rtype, data), callback))
        self._queued_bytes += len(data) + _OVERHEAD
        if not self._pressure and self._queued_bytes > self.config.journal_queue_bytes_max:
            self._set_pressure(True)
        if self._timer is None:
            self._start_write()

    def _set_pressure(self, full: bool) -> None:
        self._pressure = full
        if self._on_pressure is not None:
            self._on_pressure(full)

    def _start_write(self) -> None:
        """A write: it gathers what is queued for one simulated fsync time, then is durable at
        once (below). After a failure nothing is written: the next batches fail at once."""
        delay = 0.0 if self._broken is not None else self.rng.uniform(*self.faults.fsync_s)
        self._timer = asyncio.get_running_loop().call_later(delay, self._written)

    def _take_batch(self) -> list[_Queued]:
        """The queued records up to ``journal_batch_bytes_max`` (the real journal's rule)."""
        limit = self.config.journal_batch_bytes_max
        first = self._queue.popleft()
        batch, size = [first], len(first[0].body) + _OVERHEAD
        while self._queue and size < limit:
            body_size = len(self._queue[0][0].body)
            if size + body_size > limit:
                break
            batch.append(self._queue.popleft())
            size += body_size + _OVERHEAD
        return batch

    def _write_fails(self) -> bool:
        """Does this write fail? A dead journal disk, a scripted error, or the error rate
        (no draw at rate 0: seeds without journal errors replay as before)."""
        faults = self.faults
        if self.disk.journal_failed:
            return True
        if faults.journal_errors_next > 0:
            faults.journal_errors_next -= 1
            return True
        rate = faults.journal_error_rate
        return bool(rate) and self.rng.random() < rate

    def _written(self) -> None:
        """The batch's write and sync returned: on the disk, or failed (fail-stop)."""
        self._timer = None
        batch = self._take_batch()
        if self._broken is None and self._write_fails():
            self._stats["write_errors"] += 1
            self._broken = OSError(errno.EIO, "simulated journal write error")
        error = None
        if self._broken is None:
            self.disk.journal.extend(record for record, _ in batch)
            self._stats["batches"] += 1
            self._stats["records"] += len(batch)
        else:
            error = JournalFailedError(f"journal write failed: {self._broken}")
            error.__cause__ = self._broken
            if self._failed is None:
                self._failed = error
                if self._on_failure is not None:
                    self._on_failure(error)
        self._queued_bytes -= sum(len(record.body) + _OVERHEAD for record, _ in batch)
        if self._pressure and self._queued_bytes < self.config.journal_queue_bytes_max // 2:
            self._set_pressure(False)
        if self._queue:
            self._start_write()  # what did not fit: the next write, at once
        for _, callback in batch:
            try:
                callback(error)
            except Exception:  # one broken callback must not strand the batch's other answers
                log.exception("journal callback failed")

    async def checkpoint(self, sync_engine: Callable[[], None]) -> None:
        # Every record in the journal was applied to the engine before it was appended, so
        # once the engine is synced the journal up to here is redundant.
        mark = len(self.disk.journal)
        sync_engine()
        del self.disk.journal[:mark]
        self._stats["checkpoints"] += 1

    async def close(self) -> None:
        """Make everything appended durable (callbacks run, or fail), then stop."""
        self._closing = True
        while self._timer is not None:  # the writes in progress end now (the old schedule)
            self._timer.cancel()
            self._written()

    def crash(self) -> None:
        """Lose the queue and the write in progress: never durable, their callbacks never
        run."""
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._queue.clear()

    def statistics(self) -> dict[str, int | float]:
        return {
            **self._stats,
            "queued_bytes": self._queued_bytes,
            "queued_records": len(self._queue),
        }


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
        self,
        ledger_id: int,
        entries: list[tuple[int, Record]],
        packed: bytes | None = None,
        recovery: bool = False,
        deferred: bool = False,
    ) -> None:
        for entry_id, record in entries:  # one fault draw per entry, as separate puts made
            self.put_entry(ledger_id, entry_id, record)

    def write_pressure(self) -> bool:
        return self.inner.write_pressure()  # no fault draw: the seed's draws stay the same

    def get_entry(self, ledger_id: int, entry_id: int) -> bytes | None:
        self._maybe_fail("get_entry")
        return self.inner.get_entry(ledger_id, entry_id)

    def can_read_now(self, ledger_id: int, entry_id: int) -> bool:
        return self.inner.can_read_now(ledger_id, entry_id)

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
        self,
        disk: NodeDisk,
        rng: random.Random,
        faults: DiskFaults,
        guard_dirs: bool = False,
        config: BookieConfig | None = None,
    ) -> None:
        self.disk = disk
        self.rng = rng
        self.faults = faults
        self.config = config or BookieConfig()  # the bookie's: the journal's bounds
        self.engine = MemoryEngine(disk.engine)
        self.journal: SimJournal | None = None  # opened by open()
        # Called first when the journal fails (the world cuts the node off the network then:
        # its stop must not reach peers in an order no seed fixes).
        self.on_journal_failure: Callable[[], None] | None = None
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
        if self.disk.journal_failed:
            raise OSError(errno.EIO, "simulated disk failure: the journal disk is dead")
        self.faulty = FaultyEngine(self.engine, self.rng, self.faults)
        engine: Engine = self.faulty

        def failed(exc: BaseException) -> None:
            if self.on_journal_failure is not None:
                self.on_journal_failure()
            on_failure(exc)

        journal = SimJournal(self.disk, self.rng, self.faults, self.config,
                             on_pressure=on_pressure, on_failure=failed)  # fmt: skip
        replayed = replay_into(self.engine, iter(journal.replay()))
        self.journal = journal
        if self.guard_dirs:
            engine = LedgerDirs([DirShard(engine, "/ledgers")])
        return engine, journal, replayed

    async def disk_usage(self) -> DiskUsage:
        return DiskUsage(0.1, 9 << 30, 10 << 30)

    async def close_engine(self, engine: Engine) -> None:
        engine.close()

    async def reclaim_space(self, engine: Engine, live_ratio_min: float) -> int:
        return engine.reclaim_space(live_ratio_min)

    async def unclean_shutdown(self) -> bool:
        return self.disk.dirty

    async def mark_running(self, running: bool) -> None:
        self.disk.dirty, self.disk.dirty_boot = running, self.disk.boot

    async def crash_kept_writes(self) -> bool:
        # The model (crash() below): a crash without a power loss keeps every write a
        # journal-less bookie's engine made; a power loss is a new boot of the node.
        return self.disk.dirty and self.disk.dirty_boot == self.disk.boot

    def crash(self, *, power_loss: bool) -> None:
        """What a crash leaves on the :class:`NodeDisk` (see the module docstring)."""
        if self.journal is not None:
            self.journal.crash()
        if power_loss:
            self.disk.boot += 1
        unsynced = self.engine.unsynced_writes()
        if not power_loss and self.config.journal_write_data:
            # The rocksdb engine of a journaled bookie writes no WAL: its memtable dies with
            # the process. The journal's replay puts back every entry it had; the entries
            # that were never journaled (deferred-sync copies, bookie/deferred.py) are gone.
            unsynced = [w for w in unsynced if w[0] != "entry"]
        keep = self.rng.randint(0, len(unsynced)) if power_loss else len(unsynced)
        self.disk.engine.apply(unsynced[:keep])
