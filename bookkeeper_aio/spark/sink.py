"""The foreachPartition adapter: ``LogSink(uri, log).job()``, ``write_to_log``, ``for_batch``.

Theory of operation
-------------------
The driver opens a job (``commit.open_job``: the log is checked — a wrong URI or a missing log
fails here, before any task runs — and the job recorded OPEN). Each task attempt runs
:func:`write_attempt` in its Python worker: the rows' values (``rows.row_values``) go in
bounded chunks to this process's client (``client.process_client``), which writes them into a
ledger of the attempt's own (``attempt.AttemptWriter``); the next chunk is built while the
previous one is written. When the Spark action returns, the driver commits (``commit_job``: the
attempts Spark accepted, one per partition — an accumulator names them — appended in one
compare-and-swap); when it raises, the driver aborts (everything the job wrote is deleted).
``for_batch`` does the same for each micro-batch of a streaming query and skips a batch id the
log says was committed already.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
from collections.abc import Awaitable, Iterable, Iterator
from typing import Any

from ..config import SparkConfig
from ..errors import NoSuchLogError, SparkInputError, SparkJobError
from .attempt import AttemptWriter
from .client import process_client
from .commit import JobSummary, abort_job, commit_job, open_job, read_batch
from .model import AttemptRecord, attempt_key, batch_property
from .rows import check_schema, chunks, row_values

log = logging.getLogger(__name__)
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # a SparkContext local property in foreachBatch


def write_attempt(
    uri: str, job_id: str, config: SparkConfig, values: Iterable[list[bytes]]
) -> AttemptRecord:
    """Write this task attempt's chunks of values into a ledger of its own and record it DONE
    (runs in a Spark task: TaskContext says which partition and attempt).

    Raises:
        SparkJobError: not in a Spark task; the job is no longer OPEN; the attempt lost.
        SparkInputError: a bad row (from ``values``).
        BookKeeperError: writing failed.
    """
    from pyspark import TaskContext

    task = TaskContext.get()
    if task is None:
        raise SparkJobError("write_partition runs in a Spark task: df.foreachPartition(...)")
    client, timeout_s = process_client(), config.step_timeout_s

    async def start(bk: Any) -> AttemptWriter:
        writer = AttemptWriter(
            bk, job_id, task.stageId(), task.partitionId(), task.taskAttemptId(),
            task.attemptNumber(), config,
        )  # fmt: skip
        await writer.start()
        return writer

    writer = client.run(uri, start, timeout_s)
    pending = None
    try:
        for chunk in values:
            if pending is not None:
                client.wait(pending, timeout_s)

            def write(_: Any, c: list[bytes] = chunk) -> Awaitable[None]:
                return writer.write(c)

            pending = client.submit(uri, write, timeout_s)
        if pending is not None:
            client.wait(pending, timeout_s)
        return client.run(uri, lambda _: writer.finish(), timeout_s)
    except BaseException:
        if pending is not None and not pending.done():
            pending.cancel()  # and let it end: never two steps of one writer at once
            concurrent.futures.wait([pending], timeout_s)
        try:
            client.run(uri, lambda _: writer.fail(), timeout_s)
        except Exception as exc:  # the task fails anyway; the sweep removes what is left
            log.warning("cleaning up attempt %s failed: %s", writer.key, exc)
        raise


class _Keys:
    """An accumulator of attempt keys (a pyspark AccumulatorParam: zero and addInPlace)."""

    def zero(self, value: list[str]) -> list[str]:
        return []

    def addInPlace(self, first: list[str], second: list[str]) -> list[str]:
        return first + second


class SinkJob:
    """One job of a :class:`LogSink` (picklable: Spark ships ``write_partition`` to tasks).

    ``accepted`` is a Spark accumulator of the attempts that finished: Spark merges the
    updates of successful tasks only, once per partition of an action, so it names the
    attempts Spark accepted — not an attempt whose input ended early because the task failed
    around it (a Python function sees such an end as a normal one), nor a killed copy.
    ``summary`` is set once the job committed or was skipped (:class:`JobSummary`).
    """

    def __init__(
        self,
        uri: str,
        log_name: str,
        job_id: str,
        skip_nulls: bool,
        config: SparkConfig,
        accepted: Any,
    ) -> None:
        self.uri = uri
        self.log = log_name
        self.job_id = job_id
        self.skip_nulls = skip_nulls
        self.config = config
        self.accepted = accepted
        self.summary: JobSummary | None = None

    def write_partition(self, rows: Iterable[Any]) -> None:
        """Write one partition's rows (``df.foreachPartition(job.write_partition)``).

        Raises:
            SparkInputError: a row without a binary or string value, or a null value.
            SparkJobError / BookKeeperError: as :func:`write_attempt`.
        """
        from pyspark import TaskContext

        task = TaskContext.get()
        partition = task.partitionId() if task is not None else -1
        cfg = self.config
        values = row_values(rows, partition, self.skip_nulls)
        batches = chunks(values, cfg.write_chunk_rows_max, cfg.write_chunk_bytes_max)
        record = write_attempt(self.uri, self.job_id, cfg, batches)
        self.accepted.add(
            [attempt_key(self.job_id, record.stage, record.partition, record.task_attempt)]
        )


class LogSink:
    """Writes DataFrames and RDDs to the log ``log`` exactly once (docs/spark.md).

    ``create``: create the log (default options) if it does not exist; ``skip_nulls``: skip
    rows whose value is null instead of failing; ``query``: the streaming query id
    ``for_batch`` records batches under (default: Spark's id of the running query).
    """

    def __init__(
        self,
        metadata_uri: str,
        log: str,
        *,
        create: bool = False,
        skip_nulls: bool = False,
        query: str | None = None,
        config: SparkConfig | None = None,
    ) -> None:
        self.uri = metadata_uri
        self.log = log
        self.create = create
        self.skip_nulls = skip_nulls
        self.query = query
        self.config = config or SparkConfig()
        self.config.validate()

    def _run(self, fn: Any) -> Any:
        return process_client().run(self.uri, fn, self.config.step_timeout_s)

    @contextlib.contextmanager
    def job(
        self, partitions: int | None = None, *, stream: tuple[str, int] | None = None
    ) -> Iterator[SinkJob]:
        """A job: committed when the block ends, aborted if it raises. ``partitions``: how
        many partitions the job writes, when known (the commit checks each has a finished
        attempt); ``stream``: (query id, batch id) of a micro-batch.

        Raises:
            NoSuchLogError: no such log (and not ``create``).
            ConfigError / MetadataUnavailableError: a malformed or unreachable metadata URI.
            SparkJobError: the commit found the job incomplete or not OPEN (it was aborted).
        """
        from pyspark import SparkContext

        context = SparkContext._active_spark_context
        if context is None:
            raise SparkJobError("LogSink.job() needs an active SparkContext (a SparkSession)")
        query, batch = stream if stream is not None else (None, None)
        record = self._run(
            lambda bk: open_job(
                bk, self.log, create=self.create, partitions=partitions, query=query, batch=batch
            )
        )
        # _Keys is an AccumulatorParam by its methods (pyspark is imported only when used).
        accepted: Any = context.accumulator([], _Keys())  # type: ignore[arg-type]
        job = SinkJob(self.uri, self.log, record.job_id, self.skip_nulls, self.config, accepted)
        try:
            yield job
        except BaseException:
            try:
                self._run(lambda bk: abort_job(bk, job.job_id, self.config))
            except Exception as exc:  # the job's own error is the one to raise
                log.warning("aborting job %s failed (cleanup removes it): %s", job.job_id, exc)
            raise
        winners = list(accepted.value)
        job.summary = self._run(lambda bk: commit_job(bk, job.job_id, self.config, winners=winners))

    def write(self, df: Any) -> JobSummary:
        """Write a DataFrame's ``value`` column (see :func:`write_to_log`)."""
        check_schema(df.schema)
        _register(df.sparkSession)  # so that format("bookkeeper") works in this session too
        rdd = df.select("value").rdd  # only the records travel to the Python workers
        with self.job(partitions=rdd.getNumPartitions()) as job:
            rdd.foreachPartition(job.write_partition)
        assert job.summary is not None
        return job.summary

    def for_batch(self, df: Any, batch_id: int) -> JobSummary:
        """``df.writeStream.foreachBatch(LogSink(uri, log).for_batch)``: commit each
        micro-batch once; a batch id at or below the last one committed for this query is
        skipped (Spark replays a batch after a failure).

        Raises:
            SparkInputError: no query id (not in foreachBatch and no ``query``), bad schema.
            as :meth:`job`.
        """
        query = self.query or df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
        if not query:
            raise SparkInputError("for_batch runs in foreachBatch, or give LogSink(query=...)")
        batch_property(query)  # a clear error for a bad id before anything runs
        check_schema(df.schema)
        try:
            last = self._run(lambda bk: read_batch(bk, self.log, query))
        except NoSuchLogError:
            if not self.create:
                raise
            last = None
        if last is not None and batch_id <= last:
            return JobSummary("", self.log, "skipped")
        rdd = df.select("value").rdd
        with self.job(rdd.getNumPartitions(), stream=(query, batch_id)) as job:
            rdd.foreachPartition(job.write_partition)
        assert job.summary is not None
        return job.summary

    def cleanup(self, older_than_s: float | None = None) -> dict[str, int]:
        """Remove unfinished jobs and leftover job ledgers older than ``older_than_s``
        (default ``job_ttl_s``) from the whole cluster (see ``admin.cleanup``)."""
        from .admin import cleanup

        ttl_s = self.config.job_ttl_s if older_than_s is None else older_than_s
        return self._run(lambda bk: cleanup(bk, ttl_s, self.config))


def _register(spark: Any) -> None:
    from .datasource import register

    register(spark)


def write_to_log(
    df: Any,
    metadata_uri: str,
    log: str,
    *,
    create: bool = False,
    skip_nulls: bool = False,
    config: SparkConfig | None = None,
) -> JobSummary:
    """Write the DataFrame's ``value`` column (binary or string) to ``log`` exactly once, in
    one Spark job; return what it did.

    Raises:
        SparkInputError: no usable ``value`` column (before any task runs), or a bad row.
        NoSuchLogError: no such log (and not ``create``).
        ConfigError / MetadataUnavailableError: a malformed or unreachable metadata URI.
        SparkJobError: the job failed (nothing of it is in the log).
    """
    sink = LogSink(metadata_uri, log, create=create, skip_nulls=skip_nulls, config=config)
    return sink.write(df)


__all__ = ["LogSink", "SinkJob", "write_attempt", "write_to_log"]
