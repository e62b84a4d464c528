"""The journal contract suite: the real journal and the simulator's twin must pass all of it.

The contract is what the bookie relies on (docs/simulation.md#the-journal-contract). A
:class:`Harness` is where a journal lives and can be reopened: a directory with real files and
fdatasync on an ordinary event loop (``real``), or a :class:`NodeDisk` on the virtual-time loop
(``sim``). Each harness can hold the disk mid-write (to see what happens while a write is in
progress), fail its writes, and crash the process.
"""

from __future__ import annotations

import asyncio
import errno
import random
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from bookkeeper_aio.bookie.journal import REC_ENTRIES, REC_ENTRY, REC_FENCE, Journal
from bookkeeper_aio.config import BookieConfig
from bookkeeper_aio.errors import JournalFailedError
from bookkeeper_aio.sim.disk import DiskFaults, NodeDisk, SimJournal, SimStorage
from bookkeeper_aio.sim.loop import VirtualTimeLoop

KiB = 1024
REPO = Path(__file__).resolve().parent.parent
Records = list[tuple[int, bytes]]


class AnyJournal(Protocol):
    """The surface both journals share (the bookie's ``BookieJournal`` plus failure state)."""

    failed: BaseException | None
    queued_bytes: int

    def append(self, rtype: int, body: Any, callback: Callable[[Any], None]) -> None: ...

    async def checkpoint(self, sync_engine: Callable[[], None]) -> None: ...

    async def close(self) -> None: ...

    def statistics(self) -> dict[str, int | float]: ...


def config(**kw: Any) -> BookieConfig:
    base = dict(journal_preallocate_bytes=64 * KiB, journal_file_bytes_max=6 * 1024 * KiB,
                frame_bytes_max=1024 * KiB, journal_batch_bytes_max=64 * KiB)  # fmt: skip
    return BookieConfig(**{**base, **kw})


class Harness:
    """Where one journal lives; see the module docstring."""

    def run(self, body: Callable[[], Awaitable[Any]]) -> Any:
        raise NotImplementedError

    async def open(
        self,
        cfg: BookieConfig,
        on_pressure: Callable[[bool], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> AnyJournal:
        """A started journal on this harness's disk (after its replay)."""
        raise NotImplementedError

    def replay(self) -> Records:
        """What a restart would replay (the journal need not be closed)."""
        raise NotImplementedError

    def hold(self) -> None:
        """From now on a write blocks, before its sync returns, until :meth:`release`."""
        raise NotImplementedError

    async def wait_held(self, journal: AnyJournal) -> None:
        """Until a write is blocked by :meth:`hold`."""
        raise NotImplementedError

    def release(self) -> None:
        raise NotImplementedError

    def fail_next_write(self) -> None:
        """The next write (or its sync) fails with EIO; the disk works again after it."""
        raise NotImplementedError

    def crash_run(self, count: int, seed: int, acked_min: int) -> list[int]:
        """Append ``records_of(count, seed)`` in a fresh process (or incarnation) that dies
        (kill -9) once ``acked_min`` callbacks ran; the indices whose callback ran."""
        raise NotImplementedError


class RealHarness(Harness):
    """The bookie's :class:`Journal` on ``tmp_path``: real files, real fdatasync; new files
    preallocated by ``preallocate`` (``journal_preallocate_mode``)."""

    def __init__(self, directory: Path, preallocate: str) -> None:
        self.directory = directory
        self.preallocate = preallocate
        self._gate = threading.Event()
        self._gate.set()
        self._entered = threading.Event()
        self._failing = False

    def run(self, body: Callable[[], Awaitable[Any]]) -> Any:
        async def bounded() -> Any:
            async with asyncio.timeout(30):
                return await body()

        try:
            return asyncio.run(bounded())
        finally:
            self._gate.set()  # never leave the journal thread blocked

    async def open(
        self,
        cfg: BookieConfig,
        on_pressure: Callable[[bool], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> AnyJournal:
        cfg = cfg.replace(journal_preallocate_mode=self.preallocate)
        journal = Journal(self.directory, cfg, on_pressure=on_pressure, on_failure=on_failure)
        list(journal.replay())
        await journal.start()
        write_sync = journal._write_sync

        def gated(pieces: list[bytes], pos: int, size: int) -> tuple[float, float]:
            # The journal thread: the batch is taken; the disk "is busy" until released.
            if not self._gate.is_set():
                self._entered.set()
                self._gate.wait(20)
            if self._failing:
                self._failing = False
                raise OSError(errno.EIO, "injected journal write error")
            return write_sync(pieces, pos, size)

        journal._write_sync = gated  # type: ignore[method-assign]
        return journal

    def replay(self) -> Records:
        return [(r.type, r.body) for r in Journal(self.directory, config()).replay()]

    def hold(self) -> None:
        self._entered.clear()
        self._gate.clear()

    async def wait_held(self, journal: AnyJournal) -> None:
        await until(self._entered.is_set)

    def release(self) -> None:
        self._gate.set()

    def fail_next_write(self) -> None:
        self._failing = True

    def crash_run(self, count: int, seed: int, acked_min: int) -> list[int]:
        # A child process appends and SIGKILLs itself: what its journal made durable (and the
        # page cache holds) is what a restart finds.
        script = CRASH_CHILD.format(directory=str(self.directory), acked_min=acked_min,
                                    count=count, seed=seed, mode=self.preallocate)  # fmt: skip
        done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                              timeout=60, text=True)  # fmt: skip
        assert done.returncode == -9, done.stderr
        return [int(line) for line in done.stdout.split()]


CRASH_CHILD = """
import asyncio, os, signal, sys
from bookkeeper_aio.bookie.journal import Journal
from bookkeeper_aio.config import BookieConfig
from tests.test_journal_contract import records_of

async def main():
    j = Journal({directory!r}, BookieConfig(journal_preallocate_bytes=1 << 16,
                journal_file_bytes_max=6 << 20, frame_bytes_max=1 << 20,
                journal_batch_bytes_max=1 << 16, journal_preallocate_mode={mode!r}))
    list(j.replay())
    await j.start()
    acked = []
    def done(exc, i):
        assert exc is None
        acked.append(i)
        print(i, flush=True)
        if len(acked) == {acked_min}:
            os.kill(os.getpid(), signal.SIGKILL)
    for i, (rtype, body) in enumerate(records_of({count}, {seed})):
        j.append(rtype, body, lambda exc, i=i: done(exc, i))
        if i % 7 == 0:
            await asyncio.sleep(0)  # let some batches complete while appending
    await asyncio.sleep(30)

asyncio.run(main())
"""


class SimHarness(Harness):
    """The simulator's :class:`SimJournal` on a :class:`NodeDisk`, on the virtual-time loop."""

    def __init__(self) -> None:
        self.disk = NodeDisk()
        self.faults = DiskFaults(fsync_s=(0.0001, 0.002))
        self.rng = random.Random(7)
        self._journal: SimJournal | None = None

    def run(self, body: Callable[[], Awaitable[Any]]) -> Any:
        loop = VirtualTimeLoop()
        try:
            return loop.run_until_complete(body())
        finally:
            loop.close()

    async def open(
        self,
        cfg: BookieConfig,
        on_pressure: Callable[[bool], None] | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> AnyJournal:
        self._journal = SimJournal(self.disk, self.rng, self.faults, cfg,
                                   on_pressure=on_pressure, on_failure=on_failure)  # fmt: skip
        return self._journal

    def replay(self) -> Records:
        return [(r.type, r.body) for r in SimJournal(self.disk, self.rng, self.faults).replay()]

    def hold(self) -> None:
        # Virtual time: a write that takes an hour holds the disk until the test awaits it.
        self.faults.fsync_s = (3600.0, 3600.0)

    async def wait_held(self, journal: AnyJournal) -> None:
        await until(lambda: journal.statistics()["queued_records"] > 0)

    def release(self) -> None:
        self.faults.fsync_s = (0.0001, 0.002)

    def fail_next_write(self) -> None:
        self.faults.journal_errors_next = 1

    def crash_run(self, count: int, seed: int, acked_min: int) -> list[int]:
        acked: list[int] = []

        async def body() -> None:
            journal = await self.open(config())
            crashed = asyncio.get_running_loop().create_future()

            def done(exc: BaseException | None, i: int) -> None:
                assert exc is None
                if crashed.done():
                    return  # the process is dead: the rest of the batch is never answered
                acked.append(i)
                if len(acked) == acked_min:
                    journal.crash()  # the process dies inside the callback, as the child does
                    crashed.set_result(None)

            for i, (rtype, data) in enumerate(records_of(count, seed)):
                if crashed.done():
                    break
                journal.append(rtype, data, lambda exc, i=i: done(exc, i))
                if i % 7 == 0:
                    await asyncio.sleep(0.0005)
            await crashed

        self.run(body)
        return acked


async def until(condition: Callable[[], bool], deadline_s: float = 10.0) -> None:
    """Wait for ``condition`` (polled), at most ``deadline_s``."""
    async with asyncio.timeout(deadline_s):
        while not condition():  # noqa: ASYNC110 (a thread's event, or the twin's state)
            await asyncio.sleep(0.001)


@pytest.fixture(params=["real", "real-zeros", "sim"])
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    if request.param == "sim":
        yield SimHarness()
    else:  # the default preallocation (fallocate) and real zeros
        yield RealHarness(tmp_path, "zeros" if request.param == "real-zeros" else "fallocate")


def records_of(count: int, seed: int = 1) -> Records:
    rng = random.Random(seed)
    return [(rng.choice((REC_ENTRY, REC_FENCE)), rng.randbytes(rng.randint(0, 3000)))
            for _ in range(count)]  # fmt: skip


def start_all(journal: AnyJournal, records: list[tuple[int, Any]]) -> asyncio.Future[list[Any]]:
    """Append every record now; a future of each one's callback result."""
    loop = asyncio.get_running_loop()
    futures = []
    for rtype, body in records:
        future = loop.create_future()
        journal.append(rtype, body, lambda exc, f=future: f.set_result(exc))
        futures.append(future)
    return asyncio.gather(*futures)


async def append_all(journal: AnyJournal, records: list[tuple[int, Any]]) -> list[Any]:
    """Append every record; each one's callback result, once all have arrived."""
    return list(await start_all(journal, records))


# --- the contract -------------------------------------------------------------------------


def test_callbacks_run_once_in_append_order_only_after_the_record_is_durable(harness):
    records = records_of(300)
    calls: list[tuple[int, BaseException | None]] = []
    durable_at_callback: list[bool] = []

    async def body() -> None:
        journal = await harness.open(config())
        loop = asyncio.get_running_loop()
        last = loop.create_future()

        def durable(exc: BaseException | None, i: int) -> None:
            calls.append((i, exc))
            if i % 50 == 0:  # a restart now would find it
                replay = harness.replay()
                durable_at_callback.append(len(replay) > i and replay[i] == records[i])
            if i == len(records) - 1:
                last.set_result(None)

        for i, (rtype, data) in enumerate(records):
            journal.append(rtype, data, lambda exc, i=i: durable(exc, i))
            if i % 10 == 0:
                await asyncio.sleep(0)
        await last
        await journal.close()

    harness.run(body)
    assert calls == [(i, None) for i in range(len(records))]
    assert durable_at_callback == [True] * 6
    assert harness.replay() == records


def test_a_body_in_pieces_is_one_record(harness):
    async def body() -> list[Any]:
        journal = await harness.open(config())
        pieces = (b"ledger", b"", b"x" * 5000, b"tail")
        results = await append_all(journal, [(REC_ENTRIES, pieces), (REC_ENTRY, b"after")])
        await journal.close()
        return results

    assert harness.run(body) == [None, None]
    assert harness.replay() == [(REC_ENTRIES, b"ledger" + b"x" * 5000 + b"tail"),
                                (REC_ENTRY, b"after")]  # fmt: skip


def test_records_appended_during_a_write_form_the_next_batch(harness):
    answered: list[int] = []

    async def body() -> tuple[list[int], dict[str, int | float]]:
        journal = await harness.open(config())
        harness.hold()
        futures = [asyncio.get_running_loop().create_future() for _ in range(51)]
        journal.append(REC_ENTRY, b"first", lambda exc: futures[0].set_result(exc))
        await harness.wait_held(journal)
        for i in range(1, 51):
            journal.append(REC_ENTRY, b"%d" % i, lambda exc, i=i: futures[i].set_result(exc))
        answered_while_held = [i for i, f in enumerate(futures) if f.done()]
        harness.release()
        assert await asyncio.gather(*futures) == [None] * 51
        stats = journal.statistics()
        await journal.close()
        return answered_while_held, stats

    answered, stats = harness.run(body)
    assert answered == []  # nothing is acknowledged while its write has not returned
    # Group commit: the burst behind one write is one batch (the real journal: the first
    # record, then the 50 that came during its write; the twin gathers all 51 in its write).
    assert stats["batches"] <= 2 and stats["records"] == 51
    assert len(harness.replay()) == 51


def test_a_batch_holds_at_most_journal_batch_bytes_max(harness):
    async def body() -> dict[str, int | float]:
        journal = await harness.open(config(journal_batch_bytes_max=4 * KiB))
        harness.hold()
        first = asyncio.get_running_loop().create_future()
        journal.append(REC_ENTRY, b"first", first.set_result)
        await harness.wait_held(journal)
        pending = start_all(journal, [(REC_ENTRY, bytes(1500))] * 20)
        harness.release()
        assert await first is None and await pending == [None] * 20
        stats = journal.statistics()
        await journal.close()
        return stats

    stats = harness.run(body)
    # Two 1500-byte records (with their headers) fill a 4 KiB batch: 20 need ten batches.
    assert stats["batches"] >= 10
    assert stats["records"] == 21


def test_pressure_past_the_queue_bound_until_it_drains_below_half(harness):
    events: list[tuple[bool, int]] = []

    async def body() -> None:
        cfg = config(journal_queue_bytes_max=64 * KiB, journal_batch_bytes_max=16 * KiB)
        journal: AnyJournal

        def pressure(full: bool) -> None:
            events.append((full, journal.queued_bytes))

        journal = await harness.open(cfg, on_pressure=pressure)
        harness.hold()
        first = asyncio.get_running_loop().create_future()
        journal.append(REC_ENTRY, bytes(8 * KiB), first.set_result)
        await harness.wait_held(journal)
        pending = start_all(journal, [(REC_ENTRY, bytes(8 * KiB))] * 12)
        # Backpressure is a signal, not a refusal: every append was queued.
        assert len(events) == 1 and events[0][0] is True
        assert 64 * KiB < events[0][1] <= 64 * KiB + 9 * KiB
        harness.release()
        assert await first is None and await pending == [None] * 12
        assert journal.queued_bytes == 0
        await journal.close()

    harness.run(body)
    assert [full for full, _ in events] == [True, False]
    assert events[1][1] < 32 * KiB  # released only below half of journal_queue_bytes_max
    assert len(harness.replay()) == 13


def test_a_write_error_is_fail_stop(harness):
    failures: list[BaseException] = []

    async def body() -> tuple[list[Any], list[Any], AnyJournal]:
        cfg = config(journal_batch_bytes_max=4 * KiB)  # two of these records a batch
        journal = await harness.open(cfg, on_failure=failures.append)
        ok = await append_all(journal, [(REC_ENTRY, b"ok-0"), (REC_ENTRY, b"ok-1")])
        harness.hold()
        loop = asyncio.get_running_loop()
        first = loop.create_future()
        journal.append(REC_ENTRY, b"lost-0" + bytes(1500), first.set_result)
        await harness.wait_held(journal)
        queued = start_all(journal, [(REC_ENTRY, b"lost-1" + bytes(1500))] * 5)
        harness.fail_next_write()  # one write fails; the batches after it are never written
        harness.release()
        failed = [await first, *await queued]
        with pytest.raises(JournalFailedError):
            journal.append(REC_ENTRY, b"after", lambda exc: None)
        await journal.close()  # closes after a failure too
        return ok, failed, journal

    ok, failed, journal = harness.run(body)
    assert ok == [None, None]
    # The failed write and every record queued behind it (in later batches, on a disk that
    # works again) are answered with the error: fail-stop.
    assert len(failed) == 6 and all(isinstance(e, JournalFailedError) for e in failed)
    assert all(isinstance(e.__cause__, OSError) for e in failed)
    assert failures == [failed[0]] and journal.failed is failed[0]
    replay = harness.replay()
    assert replay[:2] == [(REC_ENTRY, b"ok-0"), (REC_ENTRY, b"ok-1")]
    assert all(body.startswith(b"lost-") for _, body in replay[2:])  # may or may not be there


def test_close_makes_everything_appended_durable_first(harness):
    records = records_of(40, seed=2)

    async def body() -> list[Any]:
        journal = await harness.open(config())
        results: list[Any] = []
        for rtype, data in records:
            journal.append(rtype, data, results.append)
        await journal.close()
        answered = list(results)
        with pytest.raises(JournalFailedError):
            journal.append(REC_ENTRY, b"late", results.append)
        await journal.close()  # a second close is harmless
        return answered

    assert harness.run(body) == [None] * 40
    assert harness.replay() == records


def test_a_crash_keeps_every_acknowledged_record_in_order(harness):
    records = records_of(400, seed=3)
    acked = harness.crash_run(400, 3, acked_min=100)
    replay = harness.replay()
    assert acked[:100] == list(range(100))
    # A prefix of what was appended, holding everything acknowledged (real: also what was
    # written but not yet answered when the process died).
    assert replay == records[: len(replay)]
    assert len(replay) >= len(acked)


def test_replay_crosses_restarts(harness):
    first, second = records_of(30, seed=4), records_of(30, seed=5)

    async def one_run(records: Records) -> None:
        journal = await harness.open(config())
        assert await append_all(journal, records) == [None] * len(records)
        await journal.close()

    harness.run(lambda: one_run(first))
    harness.run(lambda: one_run(second))
    assert harness.replay() == first + second


def test_a_checkpoint_drops_what_the_synced_engine_covers(harness):
    syncs: list[int] = []

    def broken_sync() -> None:
        raise OSError(errno.EIO, "engine sync failed")

    async def body() -> None:
        journal = await harness.open(config())
        await append_all(journal, [(REC_ENTRY, b"before")])
        await journal.checkpoint(lambda: syncs.append(1))
        await append_all(journal, [(REC_ENTRY, b"after")])
        with pytest.raises(OSError):
            await journal.checkpoint(broken_sync)  # drops nothing
        await append_all(journal, [(REC_ENTRY, b"last")])
        await journal.close()

    harness.run(body)
    assert syncs == [1]
    assert harness.replay() == [(REC_ENTRY, b"after"), (REC_ENTRY, b"last")]


def test_a_callback_that_raises_does_not_strand_the_rest_of_its_batch(harness):
    def broken(exc: BaseException | None) -> None:
        raise RuntimeError("callback bug")

    async def body() -> list[Any]:
        journal = await harness.open(config())
        harness.hold()
        first = asyncio.get_running_loop().create_future()
        journal.append(REC_ENTRY, b"first", first.set_result)
        await harness.wait_held(journal)
        journal.append(REC_ENTRY, b"broken", broken)
        rest = start_all(journal, [(REC_ENTRY, b"rest")] * 3)
        harness.release()
        results = [await first, *await rest]
        await journal.close()
        return results

    assert harness.run(body) == [None] * 4
    assert len(harness.replay()) == 5


def test_the_twins_dead_journal_disk_fails_every_write_and_every_boot() -> None:
    """The simulator's other journal fault (``NodeDisk.journal_failed``), beyond the contract."""
    harness = SimHarness()
    harness.disk.journal_failed = True

    async def body() -> list[Any]:
        journal = await harness.open(config())
        first = await append_all(journal, [(REC_ENTRY, b"a")] * 3)
        storage = SimStorage(harness.disk, harness.rng, harness.faults)
        with pytest.raises(OSError, match="journal disk is dead"):
            await storage.open(lambda full: None, lambda exc: None)
        return first

    assert all(isinstance(e, JournalFailedError) for e in harness.run(body))
    assert harness.replay() == []
