"""A job's driver side: open, commit (all of the job to the log in one compare-and-swap), abort.

Theory of operation
-------------------
:func:`open_job` checks the log (creating it if asked), takes its quorums for the job's
ledgers and records the job OPEN. :func:`commit_job`:

1. seals the job (OPEN -> SEALED): an attempt recorded from now on finds it closed;
2. lists the attempts and takes the ones Spark accepted, one per partition
   (``model.plan_commit``);
3. records the chosen ledgers (SEALED -> COMMITTING), so that whoever finds the job later
   can tell whether the append landed (``model.committed_by_membership``);
4. tombstones every other attempt and deletes its ledgers (``sweep``);
5. appends the chosen ledgers to the log in one compare-and-swap, as a writer of the log
   (``BookKeeper.append_ledgers_to_log``: a live writer of the log is fenced and its open
   ledger recovered first, as any new writer would). A commit that lost the log to another
   writer meanwhile appended nothing and tries again; a stream batch sets its query's batch
   property in the same compare-and-swap, on condition that it still holds what was read;
6. deletes the job's records.

A failure before the append, or one that surely appended nothing, aborts the job. One whose
outcome is unknown (the store did not answer) is tried again: the append is idempotent (a log
that holds exactly these ledgers returns their offsets and changes nothing). If the store stays
unreachable the job stays COMMITTING, and whoever finds it later settles it by looking at the
log (``membership``): the append is one compare-and-swap, so either every chosen ledger is in
the log or none is.
:func:`abort_job` seals nothing: it moves the job to ABORTING, tombstones every attempt and
deletes every ledger the job wrote.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..client.bookkeeper import BookKeeper
from ..config import SparkConfig
from ..errors import (
    BookKeeperError,
    LogFencedError,
    LogPropertyConflictError,
    MetadataUnavailableError,
    MetadataVersionError,
    NoSuchLedgerError,
    NoSuchLogError,
    OperationTimeoutError,
    SparkJobError,
)
from ..metadata.model import Versioned
from .attempt import wall_clock_ms
from .model import (
    CommitPlan,
    JobRecord,
    JobState,
    batch_property,
    committed_by_membership,
    job_key,
    plan_abort,
    plan_commit,
)
from .records import create_record, delete_job_records, list_attempts, read_job, update_job
from .sweep import bounded_map, sweep

UNKNOWN_OUTCOME = (MetadataUnavailableError, OperationTimeoutError, TimeoutError)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobSummary:
    """What a job did. ``state``: committed, aborted, or skipped (a stream batch that was
    committed before). ``first_offset``/``next_offset``: the offsets its rows got (None when
    it appended nothing); ``commit_s``: the driver's commit, from seal to records deleted."""

    job_id: str
    log: str
    state: str
    partitions: int = 0
    rows: int = 0
    bytes: int = 0
    ledgers: int = 0
    ledgers_deleted: int = 0
    first_offset: int | None = None
    next_offset: int | None = None
    commit_s: float = 0.0


def new_job_id(rng_bits: int) -> str:
    """A job id that sorts by creation time (UTC), then random."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.UUID(int=rng_bits).hex[:12]


async def log_quorums(bk: BookKeeper, log: str, create: bool) -> tuple[int, int, int]:
    """The quorums of the log's ledgers (the job's ledgers get the same).

    Raises:
        NoSuchLogError: no such log and not ``create``.
    """
    try:
        info = await bk.log_info(log)
    except NoSuchLogError as exc:
        if not create:
            raise NoSuchLogError(
                f"{exc}: create it first (BookKeeper.create_log), or pass create=True"
            ) from None
        info = await bk.create_log(log, exist_ok=True)
    options = info.metadata.options
    return options.ensemble_size, options.write_quorum, options.ack_quorum


async def open_job(
    bk: BookKeeper,
    log: str,
    *,
    create: bool = False,
    partitions: int | None = None,
    query: str | None = None,
    batch: int | None = None,
    job_id: str | None = None,
) -> JobRecord:
    """Record a new OPEN job writing to ``log`` (with ``job_id``: that job, or the one
    recorded under it already, for tasks of a stream batch that create it).

    Raises:
        NoSuchLogError: no such log and not ``create``.
        MetadataUnavailableError: the metadata store cannot be reached.
    """
    quorums = await log_quorums(bk, log, create)
    record = JobRecord(
        job_id or new_job_id(bk.ctx.rng.getrandbits(128)), log, wall_clock_ms(), *quorums,
        partitions=partitions, query=query, batch=batch,
    )  # fmt: skip
    try:
        await create_record(bk.ctx.metadata, job_key(record.job_id), record)
    except MetadataVersionError:
        if job_id is None:
            raise
        found = await read_job(bk.ctx.metadata, job_id)
        if found is None:
            raise SparkJobError(f"job {job_id} vanished while it was created") from None
        return found.value
    return record


async def read_batch(bk: BookKeeper, log: str, query: str) -> int | None:
    """The last batch id of streaming query ``query`` committed to ``log``, or None."""
    info = await bk.log_info(log)
    value = info.metadata.properties.get(batch_property(query))
    return None if value is None else int(value)


async def commit_job(
    bk: BookKeeper,
    job_id: str,
    config: SparkConfig,
    *,
    winners: Sequence[str],
) -> JobSummary:
    """Commit the job (module docstring) with ``winners``, the attempts Spark accepted (one
    per partition). A stream batch already committed (its job's query and batch id) is
    aborted and reported skipped. A failure before the append aborts the job (best effort:
    what an abort leaves, cleanup removes); once the append landed, the job is committed,
    whatever happens to the deletion of its records (cleanup finishes it).

    Raises:
        SparkJobError: unknown job, not OPEN, or incomplete (then it is aborted); or the
            outcome is unknown (the job stays COMMITTING: ``abort_job`` or cleanup settles it).
        NoSuchLogError / LogFencedError / ...: the append failed (the job was aborted).
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    # Sealing is ours alone (OPEN -> SEALED once): a second committer of the job stops here,
    # before it could abort what the first one is committing.
    retries = config.commit_attempts_max
    sealed = await update_job(bk.ctx.metadata, job_id, lambda j: j.sealed(), retries)
    try:
        prepared = await _prepare(bk, sealed.value, winners, config)
    except BaseException:
        await _abort_quietly(bk, job_id, config)
        raise
    if prepared is None:  # a stream batch committed before: nothing of this job is kept
        await _abort_quietly(bk, job_id, config)
        return JobSummary(job_id, "", "skipped", commit_s=loop.time() - started)
    job, plan, expected, deleted = prepared
    try:
        offsets = await _append(bk, job, expected, config)
    except _BatchTaken:
        await _abort_quietly(bk, job_id, config)
        return JobSummary(job_id, job.log, "skipped", commit_s=loop.time() - started)
    except UNKNOWN_OUTCOME as exc:
        raise SparkJobError(
            f"job {job_id}: the commit's outcome is unknown ({type(exc).__name__}: {exc}); "
            "it stays COMMITTING: abort-spark-job or cleanup() settles it from the log"
        ) from exc
    except BaseException:
        await _abort_quietly(bk, job_id, config)
        raise
    try:
        await delete_job_records(bk.ctx.metadata, job_id)
    except BookKeeperError as exc:  # committed all the same: cleanup finishes it
        log.warning("job %s committed; deleting its records failed: %s", job_id, exc)
    return JobSummary(
        job_id, job.log, "committed", len(plan.winners), plan.rows, plan.bytes,
        len(plan.append), deleted, offsets.start if offsets else None,
        offsets.stop if offsets else None, loop.time() - started,
    )  # fmt: skip


async def _prepare(
    bk: BookKeeper, job: JobRecord, winners: Sequence[str], config: SparkConfig
) -> tuple[JobRecord, CommitPlan, dict[str, str | None], int] | None:
    """Steps 2-4 of the module docstring for a sealed job: the COMMITTING job, its plan, the
    properties the append expects, the ledgers deleted; None for a stream batch committed
    before."""
    store, job_id = bk.ctx.metadata, job.job_id
    attempts = await list_attempts(store, job_id, config.job_attempts_max)
    plan = plan_commit({key: v.value for key, v in attempts.items()}, winners, job.partitions)
    expected: dict[str, str | None] = {}
    if job.query is not None:
        last = await read_batch(bk, job.log, job.query)
        if last is not None and last >= (job.batch or 0):
            return None
        expected[batch_property(job.query)] = None if last is None else str(last)
    retries = config.commit_attempts_max
    job = (await update_job(store, job_id, lambda j: j.committing(plan.append), retries)).value
    losers = {key: attempts[key] for key in plan.losers}
    deleted = await sweep(bk, job_id, losers, set(plan.append), plan.tag_scan, config)
    return job, plan, expected, deleted


async def _abort_quietly(bk: BookKeeper, job_id: str, config: SparkConfig) -> None:
    """Abort for a commit that failed anyway (what goes wrong is logged; cleanup removes the
    rest)."""
    try:
        await abort_job(bk, job_id, config)
    except BookKeeperError as exc:
        log.warning("aborting job %s failed (cleanup removes it): %s", job_id, exc)


class _BatchTaken(Exception):
    """The stream batch was committed by someone else meanwhile."""


async def _append(
    bk: BookKeeper, job: JobRecord, expected: Mapping[str, str | None], config: SparkConfig
) -> range | None:
    """Append the COMMITTING job's ledgers (module docstring, step 5); None when there is
    nothing to append (an empty job, or an empty stream batch: a replay writes nothing
    either)."""
    if not job.ledgers:
        return None
    properties = {key: str(job.batch) for key in expected}
    for attempt in range(config.commit_attempts_max):
        last = attempt + 1 == config.commit_attempts_max
        try:
            return await bk.append_ledgers_to_log(
                job.log, job.ledgers, properties=properties, expected_properties=expected
            )
        except LogPropertyConflictError as exc:
            raise _BatchTaken() from exc
        except LogFencedError:
            if last:
                raise
        except UNKNOWN_OUTCOME:
            # The append is idempotent: a retry finds the ledgers in the log if it landed.
            if last:
                raise
        # Another writer (or job) took the log over during ours, or the store did not
        # answer: jittered backoff, then again.
        await asyncio.sleep(0.05 * (1 + bk.ctx.rng.random()) * 2**attempt)
    raise AssertionError("unreachable")


async def membership(bk: BookKeeper, job: JobRecord) -> bool | None:
    """Whether a COMMITTING job's append landed (``model.committed_by_membership``)."""
    md = (await bk.log_info(job.log)).metadata
    in_log = {*md.ledger_ids, *md.trash} & set(job.ledgers)

    async def exists(ledger_id: int) -> int | None:
        try:
            await bk.ctx.metadata.read_ledger(ledger_id)
            return ledger_id
        except NoSuchLedgerError:
            return None

    found = await bounded_map(job.ledgers, exists, 32)
    return committed_by_membership(job.ledgers, in_log, {i for i in found if i is not None})


async def abort_job(bk: BookKeeper, job_id: str, config: SparkConfig) -> JobSummary:
    """Delete everything the job wrote and its records. A COMMITTING job whose append landed
    is finished instead (its losers swept, its records deleted).

    Raises:
        SparkJobError: a COMMITTING job whose records contradict the log (left as it is).
    """
    store = bk.ctx.metadata
    job = await read_job(store, job_id)
    log = job.value.log if job is not None else ""
    if job is not None and job.value.state is JobState.COMMITTING:
        landed = await membership(bk, job.value)
        if landed is None:
            raise SparkJobError(f"job {job_id}: some chosen ledgers are in the log, some not")
        if landed:
            return await _finish_landed(bk, job, config)
    if job is not None:
        job = await update_job(store, job_id, lambda j: j.aborting(), config.commit_attempts_max)
    attempts = await list_attempts(store, job_id, config.job_attempts_max)
    plan = plan_abort({key: v.value for key, v in attempts.items()})
    deleted = await sweep(bk, job_id, attempts, set(), plan.tag_scan, config)
    await delete_job_records(store, job_id)
    return JobSummary(job_id, log, "aborted", ledgers_deleted=deleted)


async def _finish_landed(
    bk: BookKeeper, job: Versioned[JobRecord], config: SparkConfig
) -> JobSummary:
    attempts = await list_attempts(bk.ctx.metadata, job.value.job_id, config.job_attempts_max)
    keep = set(job.value.ledgers)
    losers = {k: v for k, v in attempts.items() if not keep & set(v.value.ledgers)}
    deleted = await sweep(bk, job.value.job_id, losers, keep, False, config)
    await delete_job_records(bk.ctx.metadata, job.value.job_id)
    return JobSummary(job.value.job_id, job.value.log, "committed", ledgers_deleted=deleted)
