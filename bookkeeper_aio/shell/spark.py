"""Spark job commands (docs/spark.md): list-spark-jobs, abort-spark-job ID, cleanup-spark-jobs.

They need no Spark: a job's state is its records in the metadata store and its ledgers.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..client.bookkeeper import BookKeeper
from ..config import SparkConfig
from ..errors import ConfigError
from ..spark.admin import abort, cleanup, describe_jobs


def add_commands(commands: Any) -> None:
    """Add the Spark commands to the shell's subparsers."""
    listing = commands.add_parser(
        "list-spark-jobs", help="Spark jobs writing to logs: id, log, state, age, attempts"
    )
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.set_defaults(run=_run)
    abort = commands.add_parser(
        "abort-spark-job",
        help="delete what a Spark job wrote and its records (a COMMITTING one is settled)",
        description="Abort one job whatever its age: every ledger it wrote is deleted. A job "
        "found COMMITTING is settled from its log instead: finished if its append landed.",
    )
    abort.add_argument("job_id", metavar="ID")
    abort.set_defaults(run=_run)
    cleanup = commands.add_parser(
        "cleanup-spark-jobs",
        help="abort jobs older than a time-to-live and delete their tasks' leftover ledgers",
    )
    cleanup.add_argument(
        "--older-than",
        type=float,
        default=SparkConfig().job_ttl_s,
        metavar="SECONDS",
        help="the time-to-live (default %(default)s): longer than your longest job",
    )
    cleanup.set_defaults(run=_run)


async def _run(args: argparse.Namespace) -> str:
    if not args.metadata:
        raise ConfigError(f"{args.command} needs --metadata URI (before the command)")
    if args.command == "list-spark-jobs":
        return await list_spark_jobs(args.metadata, as_json=args.json)
    if args.command == "abort-spark-job":
        return await abort_spark_job(args.metadata, args.job_id)
    return await cleanup_spark_jobs(args.metadata, args.older_than)


async def list_spark_jobs(uri: str, as_json: bool = False) -> str:
    """One line per job: id, log, state, age in seconds, attempts, rows of finished ones."""
    async with BookKeeper.connect(uri) as bk:
        jobs = await describe_jobs(bk, SparkConfig())
    if as_json:
        return "\n".join(json.dumps(job, sort_keys=True) for job in jobs)
    lines = [
        f"{j['job_id']}\t{j['log']}\t{j['state']}\tage {j['age_s']} s\t{j['attempts']} attempts"
        f"\t{j['rows_done']} rows done" + (f"\tstream {j['stream']}" if j["stream"] else "")
        for j in jobs
    ]
    return "\n".join(lines) if lines else "no Spark jobs"


async def abort_spark_job(uri: str, job_id: str) -> str:
    """Abort one job (see ``spark.admin.abort``).

    Raises:
        SparkJobError: no such job, or its records contradict its log.
    """
    async with BookKeeper.connect(uri) as bk:
        summary = await abort(bk, job_id, SparkConfig())
    verb = "aborted" if summary.state == "aborted" else "found committed, finished"
    return f"job {job_id} {verb}: {summary.ledgers_deleted} ledgers deleted"


async def cleanup_spark_jobs(uri: str, older_than_s: float) -> str:
    """Abort jobs older than ``older_than_s`` and delete leftover job ledgers that old."""
    async with BookKeeper.connect(uri) as bk:
        counts = await cleanup(bk, older_than_s, SparkConfig())
    return json.dumps(counts, sort_keys=True)
