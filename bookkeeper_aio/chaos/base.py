"""What every part of a chaos run shares: limits and timeouts, the report, payloads."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from .. import (
    BookKeeper,
    BookKeeperError,
    ClientConfig,
    LedgerReader,
    LedgerWriter,
)
from ..sandbox import BookieProcess, Cluster

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
    lost_for_good: int = 0  # bookies killed and never started again (autorecovery's job)
    back_at_wq: int = 0  # ledgers with every copy on live bookies at the end

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
            f"  autorecovery: {self.lost_for_good} bookies lost for good, {self.back_at_wq} of "
            f"{self.ledgers} ledgers back at WQ",
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


class _ChaosState:
    """The state a run's parts share (chaos/faults.py, workload.py, verify.py and
    autorecovery.py: the bases of :class:`~bookkeeper_aio.chaos.run._Chaos`, which sets it),
    and the reporting they all use. Declared here so that each part is checked against it."""

    cluster: Cluster
    bookies: list[BookieProcess]
    duration_s: float
    seed: int
    writers: int
    rate: float  # entries per second per writer
    _say: Callable[[str], None]
    report: ChaosReport
    ledgers: dict[int, LedgerLog]
    live: dict[int, LedgerWriter]  # ledgers whose writer is appending
    unavailable: set[int]  # bookie indexes dead or frozen
    frozen: set[int]
    lost: set[int]  # killed for good: never started again
    starting: set[int]
    max_unavailable: int
    stop_faults: asyncio.Event
    stop_writers: asyncio.Event
    fault_tasks: set[asyncio.Task[Any]]  # faults, and restarts of bookies that exited
    closed_final: set[int]
    last_failure: str  # of the ledger being verified, for the report
    t0: float

    def say(self, text: str) -> None:
        self._say(f"t={time.monotonic() - self.t0:6.1f}s  {text}")

    def error(self, text: str) -> None:
        self.report.errors.append(text)
        self.say(f"ERROR {text}")

    def name(self, index: int) -> str:
        return f"bookie-{index} ({self.bookies[index].address})"

    if TYPE_CHECKING:  # one part's methods another part calls (chaos/workload.py)

        async def recover_live(self, bk: BookKeeper, log: LedgerLog, why: str = "") -> None: ...

        async def open(self, bk: BookKeeper, ledger_id: int, *, recovery: bool) -> LedgerReader: ...

        def closed(self, log: LedgerLog, last: int, by: str) -> None: ...

        def compare(self, log: LedgerLog, first: int, entries: list[Any]) -> list[int]: ...
