"""Operating Spark jobs: list them, abort one, clean up what dead drivers and tasks left.

Theory of operation
-------------------
A driver that dies between opening and committing a job leaves its records and its tasks'
ledgers; a task killed between creating a ledger and recording it leaves a ledger only its
tag names. :func:`cleanup` removes, for the whole cluster: jobs whose record is older than the
time-to-live (OPEN, SEALED or ABORTING: aborted; COMMITTING: settled from the log, finished if
the append landed, aborted if not — ``commit.abort_job``); attempt records whose job record is
gone; and ledgers tagged by a job that has no record any more, that are not in their log and
are older than the time-to-live (``model.orphan_ledger``). The time-to-live must exceed the
longest job: a job still running when cleanup aborts it fails its commit (nothing of it
reaches the log), and a driver stalled longer than that in the middle of its commit could
find its chosen ledgers deleted.
"""

from __future__ import annotations

from ..client.bookkeeper import BookKeeper
from ..config import SparkConfig
from ..errors import IncorrectParameterError, NoSuchLogError, SparkJobError
from .attempt import delete_ledger, wall_clock_ms
from .commit import JobSummary, abort_job
from .model import TAG_JOB, TAG_LOG, orphan_ledger
from .records import jobs_with_attempts, list_attempts, list_jobs
from .sweep import bounded_map, job_ledgers


async def describe_jobs(bk: BookKeeper, config: SparkConfig) -> list[dict[str, object]]:
    """Every job: id, log, state, age, attempts, and rows of its DONE attempts."""
    now_ms = wall_clock_ms()
    rows: list[dict[str, object]] = []
    for stored in await list_jobs(bk.ctx.metadata):
        job = stored.value
        attempts = await list_attempts(bk.ctx.metadata, job.job_id, config.job_attempts_max)
        rows.append(
            {
                "job_id": job.job_id,
                "log": job.log,
                "state": job.state.value,
                "age_s": round(job.age_s(now_ms), 1),
                "attempts": len(attempts),
                "rows_done": sum(
                    a.value.rows for a in attempts.values() if a.value.state.value == "DONE"
                ),
                "stream": None if job.query is None else f"{job.query}#{job.batch}",
            }
        )
    return rows


async def abort(bk: BookKeeper, job_id: str, config: SparkConfig) -> JobSummary:
    """Abort one job whatever its age (``commit.abort_job``: a COMMITTING job is settled).

    Raises:
        SparkJobError: no such job (no record, no attempts), or its records contradict the log.
    """
    known = {j.value.job_id for j in await list_jobs(bk.ctx.metadata)}
    if job_id not in known and job_id not in await jobs_with_attempts(bk.ctx.metadata):
        raise SparkJobError(f"no Spark job {job_id!r} (list-spark-jobs shows them)")
    return await abort_job(bk, job_id, config)


async def cleanup(bk: BookKeeper, ttl_s: float, config: SparkConfig) -> dict[str, int]:
    """See the module docstring; returns counts of what was removed."""
    now_ms = wall_clock_ms()
    jobs = [j.value for j in await list_jobs(bk.ctx.metadata)]
    expired = [j.job_id for j in jobs if j.age_s(now_ms) > ttl_s]
    live = {j.job_id for j in jobs} - set(expired)
    headless = sorted(await jobs_with_attempts(bk.ctx.metadata) - {j.job_id for j in jobs})
    summaries = [await abort_job(bk, job_id, config) for job_id in [*expired, *headless]]
    orphans = await _orphan_ledgers(bk, live, now_ms, ttl_s, config)
    deleted = await bounded_map(orphans, lambda i: delete_ledger(bk, i), config.sweep_parallel_max)
    return {
        "jobs_aborted": sum(s.state == "aborted" for s in summaries),
        "jobs_finished": sum(s.state == "committed" for s in summaries),
        "ledgers_deleted": sum(s.ledgers_deleted for s in summaries) + sum(deleted),
    }


async def _orphan_ledgers(
    bk: BookKeeper, live: set[str], now_ms: int, ttl_s: float, config: SparkConfig
) -> list[int]:
    in_logs: dict[str, set[int]] = {}
    orphans = []
    for ledger_id, md in await job_ledgers(bk, config.sweep_parallel_max):
        if md.custom_metadata[TAG_JOB].decode(errors="replace") in live:
            continue  # its job's own commit or abort deals with it
        log = md.custom_metadata.get(TAG_LOG, b"").decode(errors="replace")
        if log not in in_logs:
            in_logs[log] = await _log_ledgers(bk, log)
        tags, in_log = md.custom_metadata, ledger_id in in_logs[log]
        if orphan_ledger(tags, md.ctime_ms, now_ms, ttl_s, live, in_log):
            orphans.append(ledger_id)
    return orphans


async def _log_ledgers(bk: BookKeeper, log: str) -> set[int]:
    """The ledgers a log lists (segments and trash); none if there is no such log (or the
    tag names none)."""
    try:
        md = (await bk.log_info(log)).metadata
    except (NoSuchLogError, IncorrectParameterError):
        return set()
    return {*md.ledger_ids, *md.trash}


__all__ = ["abort", "cleanup", "describe_jobs"]
