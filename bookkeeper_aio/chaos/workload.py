"""The writers and the recovering reader, and the checks they make as they go."""

from __future__ import annotations

import asyncio
import collections
import random
import time
from typing import Any

from .. import (
    BookKeeper,
    BookKeeperError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerReader,
    LedgerRecoveryError,
    LedgerWriter,
    MetadataVersionError,
)
from .base import (
    APPEND_TIMEOUT_S,
    CLOSE_TIMEOUT_S,
    CREATE_TIMEOUT_S,
    ENTRIES_PER_LEDGER,
    OPEN_TIMEOUT_S,
    PASSWORD,
    QUORUMS,
    READ_CHUNK,
    READ_TIMEOUT_S,
    RECOVERY_EVERY_S,
    WINDOW,
    LedgerLog,
    Stalled,
    _call,
    _ChaosState,
    _diff,
    _event_wait,
    payload,
)


class _Workload(_ChaosState):
    """Methods of :class:`~bookkeeper_aio.chaos.run._Chaos` (its state is theirs)."""

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
