"""Spark's Python data source "bookkeeper": batch reads, batch writes and streaming writes.

Theory of operation
-------------------
``spark.read.format("bookkeeper")`` plans with ``source.plan`` (on the driver side) and reads
each slice with ``source.read_slice`` (Arrow batches). ``df.write.format("bookkeeper")``
opens a job when Spark asks for the writer (on the driver side, so a wrong URI, a missing log
or a bad ``value`` column fails before any task runs); each task writes its Arrow batches with
``sink.write_attempt`` and returns its attempt's key; ``commit`` gets the keys of the attempts
Spark accepted — one per partition — and commits exactly those (``commit.commit_job``);
``abort`` deletes everything the job wrote. Spark runs ``commit``/``abort`` in another Python
process than the driver's, and never tells them about failed or killed attempts: the job's
records in etcd do.

Streaming writes (``writeStream.format("bookkeeper")``): a micro-batch's job is named after
the log, the query, the query's run and the batch id (tasks read them from Spark's local
properties), created by whichever task comes first, and committed like a batch job, with the
query's batch id recorded in the log in the same compare-and-swap: a batch id the log holds
already is skipped (a replay after a failure), so each batch lands once.

Options: ``metadata`` and ``log`` (required); ``create`` and ``skip_nulls`` (true/false);
``from_offset`` and ``to_offset`` (reads); any field of :class:`~bookkeeper_aio.config.
SparkConfig` by name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    InputPartition,
    WriterCommitMessage,
)

from ..config import SparkConfig
from ..errors import ConfigError, SparkInputError, SparkJobError
from .client import process_client
from .commit import abort_job, commit_job, log_quorums, open_job
from .model import attempt_key
from .rows import arrow_values, check_schema, chunks
from .sink import write_attempt
from .source import SCHEMA, LogSlice, plan, read_slice

log = logging.getLogger(__name__)
NAME = "bookkeeper"


@dataclasses.dataclass(frozen=True)
class Options:
    """The data source's options, checked."""

    uri: str
    log: str
    create: bool = False
    skip_nulls: bool = False
    from_offset: int = 0
    to_offset: int | None = None
    config: SparkConfig = dataclasses.field(default_factory=SparkConfig)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Options:
        """Raises SparkInputError / ConfigError: a missing or malformed option."""
        values = {k.lower(): v for k, v in options.items()}
        for required, example in (("metadata", "etcd://HOST:PORT/ROOT"), ("log", "orders")):
            if not values.get(required):
                raise SparkInputError(f"option '{required}' is required, e.g. {example!r}")
        hints = typing.get_type_hints(SparkConfig)
        config = SparkConfig.from_mapping(
            {k: _parse(k, v, hints[k]) for k, v in values.items() if k in hints}, "options"
        )
        to_offset = values.get("to_offset")
        create, skip_nulls = (_parse(f, values.get(f, "false"), bool)
                              for f in ("create", "skip_nulls"))  # fmt: skip
        return cls(
            values["metadata"], values["log"], create, skip_nulls,
            _parse("from_offset", values.get("from_offset", "0"), int),
            None if to_offset in (None, "") else _parse("to_offset", to_offset, int), config,
        )  # fmt: skip

    def run(self, fn: Any) -> Any:
        return process_client().run(self.uri, fn, self.config.step_timeout_s)


def _parse(key: str, text: str, kind: Any) -> Any:
    try:
        if kind is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        return kind(text)
    except ValueError:
        raise ConfigError(f"option {key}={text!r} is not a {kind.__name__}") from None


class BookKeeperDataSource(DataSource):
    """``format("bookkeeper")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return LogReader(Options.parse(self.options))

    def writer(self, schema: Any, overwrite: bool) -> LogWriter:
        options = _for_writing(self.options, schema, overwrite)
        job = options.run(lambda bk: open_job(bk, options.log, create=options.create))
        return LogWriter(options, job.job_id)

    def streamWriter(self, schema: Any, overwrite: bool) -> LogStreamWriter:
        options = _for_writing(self.options, schema, overwrite)
        options.run(lambda bk: log_quorums(bk, options.log, options.create))  # fail early
        return LogStreamWriter(options)


def _for_writing(options: Mapping[str, str], schema: Any, overwrite: bool) -> Options:
    if overwrite:
        raise SparkInputError('a log is append-only: use mode("append")')
    check_schema(schema)
    return Options.parse(options)


class SlicePartition(InputPartition):
    """One :class:`~bookkeeper_aio.spark.source.LogSlice` (None: an empty read)."""


class LogReader(DataSourceReader):
    def __init__(self, options: Options) -> None:
        self.options = options

    def partitions(self) -> list[SlicePartition]:
        o = self.options
        slices = plan(o.uri, o.log, o.from_offset, o.to_offset, o.config)
        return [SlicePartition(s) for s in slices] or [SlicePartition(None)]

    def read(self, partition: InputPartition) -> Iterator[Any]:  # a SlicePartition
        piece: LogSlice | None = partition.value
        if piece is None:
            return iter(())
        return read_slice(self.options.uri, self.options.log, piece, self.options.config)


@dataclasses.dataclass
class AttemptMessage(WriterCommitMessage):
    """What a task tells the committer: its attempt's key (and its job's id)."""

    job_id: str
    key: str
    rows: int


def _ours(messages: list[WriterCommitMessage | None]) -> list[AttemptMessage | None]:
    """The messages Spark hands a committer: what our writers' write() returned."""
    return typing.cast(list[AttemptMessage | None], messages)


def _write_batches(options: Options, job_id: str, batches: Any) -> AttemptMessage:
    from pyspark import TaskContext

    task = TaskContext.get()
    partition = task.partitionId() if task is not None else -1
    cfg = options.config
    values = itertools.chain.from_iterable(arrow_values(batches, partition, options.skip_nulls))
    pieces = chunks(values, cfg.write_chunk_rows_max, cfg.write_chunk_bytes_max)
    record = write_attempt(options.uri, job_id, cfg, pieces)
    key = attempt_key(job_id, record.stage, record.partition, record.task_attempt)
    return AttemptMessage(job_id, key, record.rows)


class LogWriter(DataSourceArrowWriter):
    def __init__(self, options: Options, job_id: str) -> None:
        self.options = options
        self.job_id = job_id

    def write(self, iterator: Iterator[Any]) -> AttemptMessage:
        return _write_batches(self.options, self.job_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        winners = [m.key for m in _ours(messages) if m is not None]
        cfg = self.options.config
        summary = self.options.run(lambda bk: commit_job(bk, self.job_id, cfg, winners=winners))
        log.info("bookkeeper data source: %s", summary)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.options.run(lambda bk: abort_job(bk, self.job_id, self.options.config))


def _property(task: Any, name: str) -> str:
    """A local property Spark sets in the tasks of a streaming query's micro-batch."""
    value: str | None = task.getLocalProperty(name)
    if value is None:
        raise SparkJobError(f"no {name} in this task: not a micro-batch of a streaming query")
    return value


def stream_job_id(log_name: str, query: str, run: str, batch: int) -> str:
    """The job of one micro-batch of one run of a query writing to a log."""
    digest = hashlib.sha256(f"{log_name}\0{query}\0{run}".encode()).hexdigest()[:20]
    return f"stream-{digest}-{batch}"


class LogStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Options) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> AttemptMessage:
        from pyspark import TaskContext

        task = TaskContext.get()
        if task is None:
            raise SparkJobError("a stream writer writes in a Spark task")
        query = _property(task, "sql.streaming.queryId")
        run = task.getLocalProperty("spark.jobGroup.id") or ""
        batch = int(_property(task, "streaming.sql.batchId"))
        o = self.options
        job_id = stream_job_id(o.log, query, run, batch)
        o.run(lambda bk: open_job(bk, o.log, job_id=job_id, query=query, batch=batch))
        return _write_batches(o, job_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        winners = [m for m in _ours(messages) if m is not None]
        if not winners:
            return  # no partitions: nothing was written, nothing to record
        job_id, cfg = winners[0].job_id, self.options.config
        keys = [m.key for m in winners]
        summary = self.options.run(lambda bk: commit_job(bk, job_id, cfg, winners=keys))
        log.info("bookkeeper stream batch %d: %s", batchId, summary)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Spark may hand no message at all (every task failed): then the job's records are
        # left to cleanup(); the tasks tombstoned and deleted what they could themselves.
        for job_id in sorted({m.job_id for m in _ours(messages) if m is not None}):
            self.options.run(lambda bk, j=job_id: abort_job(bk, j, self.options.config))


def register(spark: Any) -> None:
    """Register the data source as "bookkeeper" with this session (idempotent)."""
    spark.dataSource.register(BookKeeperDataSource)


__all__ = ["NAME", "BookKeeperDataSource", "register", "stream_job_id"]
