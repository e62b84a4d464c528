"""One task attempt writing one partition into a ledger of its own (the executor's side).

Theory of operation
-------------------
:meth:`AttemptWriter.start` records the attempt (CREATING) and only then checks that the job
is still OPEN: the driver's commit moves the job out of OPEN before it lists the attempts, so
an attempt recorded too late to be listed is one that sees the job closed, and removes what it
recorded itself. The first row creates the ledger (tagged with job, partition and attempt; the
log's quorums; the empty password logs use) and records its id (WRITING) before anything is
written to it. Rows are appended pipelined: ``wait_for_room`` is the writer's backpressure, an
add's failure is kept and raised at the next step. :meth:`finish` closes the ledger, checks
that it holds exactly the rows pushed (assert twice: counted here, counted by the close), and
marks the attempt DONE. Any record change that finds the attempt tombstoned (the driver
chose another copy, or the job ended) fails the task; :meth:`fail` deletes the attempt's
ledger and tombstones it, best effort (the driver's sweep deletes what it could not).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Coroutine
from typing import Any

from ..client.bookkeeper import BookKeeper
from ..client.writer import LedgerWriter
from ..config import SparkConfig
from ..errors import BookKeeperError, MetadataVersionError, NoSuchLedgerError, SparkJobError
from ..metadata.model import Versioned
from ..metadata.store import MetadataStore
from .model import (
    TAG_ATTEMPT,
    TAG_JOB,
    TAG_LOG,
    TAG_PARTITION,
    AttemptRecord,
    AttemptState,
    JobRecord,
    JobState,
    attempt_key,
)
from .records import create_record, read_job, update_attempt

log = logging.getLogger(__name__)


def wall_clock_ms() -> int:
    """Record timestamps (for people and for cleanup's time-to-live), never for ordering."""
    return int(time.time() * 1000)


class AttemptWriter:
    """See the module docstring. One per task attempt; used from the client's event loop."""

    def __init__(
        self,
        bk: BookKeeper,
        job_id: str,
        stage: int,
        partition: int,
        task_attempt: int,
        attempt_number: int,
        config: SparkConfig,
    ) -> None:
        self.bk = bk
        self.job_id = job_id
        self.key = attempt_key(job_id, stage, partition, task_attempt)
        self.config = config
        self._record = AttemptRecord(
            stage, partition, task_attempt, attempt_number, wall_clock_ms()
        )
        self._versioned: Versioned[AttemptRecord] | None = None
        self._job: JobRecord | None = None
        self._ledger: LedgerWriter | None = None
        self._error: BaseException | None = None
        self.rows = 0
        self.bytes = 0

    @property
    def store(self) -> MetadataStore:
        return self.bk.ctx.metadata

    async def start(self) -> None:
        """Record the attempt, then check the job is OPEN.

        Raises:
            SparkJobError: the job is not OPEN (committed, aborted, cleaned up, unknown).
        """
        stored = await create_record(self.store, self.key, self._record)
        self._versioned = Versioned(self._record, stored.version)
        job = await read_job(self.store, self.job_id)
        if job is None or job.value.state is not JobState.OPEN:
            state = "gone" if job is None else job.value.state.value
            await self._forget()
            raise SparkJobError(f"job {self.job_id} is {state}: this task attempt is too late")
        self._job = job.value

    async def write(self, payloads: list[bytes]) -> None:
        """Append ``payloads`` (pipelined; returns once they are handed to the ledger).

        Raises:
            BookKeeperError: an earlier add failed, or the attempt was tombstoned.
        """
        if not payloads:
            return
        ledger = self._ledger or await self._create_ledger()
        for payload in payloads:
            if self._error is not None:
                raise self._error
            await ledger.wait_for_room(len(payload))
            ledger.append_callback(payload, self._added)
            self.rows += 1
            self.bytes += len(payload)

    def _added(self, entry_id: int, error: BaseException | None) -> None:
        if error is not None and self._error is None:
            self._error = error

    async def _create_ledger(self) -> LedgerWriter:
        job = self._job
        assert job is not None and self._versioned is not None, "start() first"
        tags = {
            TAG_JOB: self.job_id.encode(),
            TAG_LOG: job.log.encode(),
            TAG_PARTITION: str(self._record.partition).encode(),
            TAG_ATTEMPT: str(self._record.task_attempt).encode(),
        }
        ledger = await self.bk.create_ledger(
            job.ensemble_size, job.write_quorum, job.ack_quorum, custom_metadata=tags
        )
        self._ledger = ledger
        # Recorded before the first add: a tombstone that won the race makes this fail, and
        # fail() deletes the ledger (the sweep cannot know it).
        self._versioned = await update_attempt(
            self.store, self.key, lambda r: r.writing(ledger.ledger_id),
            self.config.commit_attempts_max, self._versioned,
        )  # fmt: skip
        return ledger

    async def finish(self) -> AttemptRecord:
        """Close the ledger, check its length, mark the attempt DONE.

        Raises:
            SparkJobError: the ledger does not hold the rows written, or the attempt was
                tombstoned meanwhile.
            BookKeeperError: an add or the close failed.
        """
        if self._ledger is not None:
            try:
                await self._ledger.close()
            except NoSuchLedgerError as exc:  # the commit or abort deleted it
                raise SparkJobError(f"attempt {self.key} was aborted (its ledger is gone)") from exc
            if self._error is not None:
                raise self._error
            written = self._ledger.metadata.last_entry_id + 1
            if written != self.rows:
                raise SparkJobError(
                    f"ledger {self._ledger.ledger_id} closed with {written} entries, "
                    f"{self.rows} rows were written"
                )

        def done(record: AttemptRecord) -> AttemptRecord:
            if record.state is AttemptState.ABORTED:
                raise SparkJobError(f"attempt {self.key} was aborted (another copy won)")
            return record.done(self.rows, self.bytes)

        self._versioned = await update_attempt(
            self.store, self.key, done, self.config.commit_attempts_max, self._versioned
        )
        return self._versioned.value

    async def fail(self) -> None:
        """Tombstone the attempt, close and delete its ledger: best effort, for a task that
        fails anyway (what goes wrong here is logged; the driver's sweep removes the rest)."""
        ledger, self._ledger = self._ledger, None
        if self._versioned is not None:
            tombstone = update_attempt(
                self.store, self.key, lambda r: r.aborted(),
                self.config.commit_attempts_max, self._versioned,
            )  # fmt: skip
            await _logged(tombstone, f"tombstoning {self.key}")
        if ledger is not None:
            # Closing stops the handle's own task (a long-lived worker would keep it).
            await _logged(ledger.close(), f"closing ledger {ledger.ledger_id}")
            await _logged(delete_ledger(self.bk, ledger.ledger_id), "deleting the ledger")

    async def _forget(self) -> None:
        """Remove a record the job will never look at (it is not OPEN any more)."""
        assert self._versioned is not None
        try:
            await self.store.delete(self.key, self._versioned.version)
        except MetadataVersionError:
            pass  # changed or gone: whoever changed it owns it now
        self._versioned = None


async def delete_ledger(bk: BookKeeper, ledger_id: int) -> bool:
    """Delete a ledger; False if it was gone already (a sweep and a task may race)."""
    try:
        await bk.delete_ledger(ledger_id)
        return True
    except NoSuchLedgerError:
        return False


async def _logged(step: Coroutine[Any, Any, object], what: str) -> None:
    try:
        await step
    except (BookKeeperError, OSError) as exc:
        log.warning("%s failed (left to the sweep): %s: %s", what, type(exc).__name__, exc)


__all__ = ["AttemptWriter", "delete_ledger", "wall_clock_ms"]
