"""Real Spark against a real etcd and real bookie processes (127.0.0.1 only): 60,000 rows
in 4 partitions, one task failing on its first attempt, through each write path (the
foreachPartition adapter, write_to_log, the data source); failing jobs; streaming with a
replayed batch (foreachBatch and the data source's stream writer); reading back with a Spark
aggregation; bad input refused on the driver. One SparkSession and one cluster serve the
whole module (a session starts in 4-15 s on this machine)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from bookkeeper_aio import BookKeeper, NoSuchLogError
from bookkeeper_aio.config import SparkConfig
from bookkeeper_aio.errors import ConfigError, SparkInputError, SparkJobError
from bookkeeper_aio.metadata.store import open_metadata_store
from bookkeeper_aio.sandbox import bookies, free_port, wait_registered
from bookkeeper_aio.spark import (
    LogSink,
    local_session,
    read_log,
    register,
    write_to_log,
)
from bookkeeper_aio.spark.attempt import AttemptWriter
from bookkeeper_aio.spark.commit import open_job
from bookkeeper_aio.spark.source import LogSlice, read_slice

pytestmark = pytest.mark.process
ROWS, PARTITIONS = 60_000, 4  # 15,000 rows (entries) a partition (ledger)


@pytest.fixture(scope="module")
def cluster_uri(etcd, tmp_path_factory) -> Iterator[str]:
    """3 bookie processes (RocksDB) registered in the session's etcd under a root of ours."""
    uri = etcd.uri(f"spark-{uuid.uuid4().hex[:8]}")

    async def init() -> None:
        async with open_metadata_store(uri) as store:
            await store.init_cluster()

    asyncio.run(init())
    root = tmp_path_factory.mktemp("spark-bookies")
    with bookies(root, 3, "rocksdb", "--metadata", uri, "--set", "lease_ttl_s=3"):
        asyncio.run(wait_registered(uri, 3))
        yield uri


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    """A local session: 2 cores, a failed task tried again once (local[2,2]), loopback only,
    no UI, the workers on this venv's interpreter."""
    conf = {"spark.sql.shuffle.partitions": "4", "spark.sql.streaming.stopTimeout": "30s"}
    session = local_session("bookkeeper-aio-tests", "local[2,2]", **conf)
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


def bk_run(uri: str, fn: Any) -> Any:
    async def main() -> Any:
        async with BookKeeper.connect(uri) as bk:
            return await fn(bk)

    return asyncio.run(main())


def new_log(uri: str, **options: Any) -> str:
    name = f"orders-{uuid.uuid4().hex[:8]}"
    bk_run(uri, lambda bk: bk.create_log(name, **options))
    return name


def check_log(spark: SparkSession, uri: str, log: str, expected: int, df: Any = None) -> int:
    """The log holds ids 0..expected-1 once each, at dense offsets (read back through the data
    source, or ``df``), and no job ledger or record is left anywhere; how many ledgers the
    records came from."""

    async def inspect(bk: BookKeeper) -> tuple[int, int, set[int], list[str]]:
        info = await bk.log_info(log)
        leftovers = set(await bk.list_ledgers())
        for name in await bk.list_logs():
            md = (await bk.log_info(name)).metadata
            leftovers -= {*md.ledger_ids, *md.trash}
        keys = [key async for key, _ in bk.ctx.metadata.list_prefix("spark/")]
        return info.start_offset, info.next_offset, leftovers, keys

    start, end, leftovers, keys = bk_run(uri, inspect)
    assert (start, end) == (0, expected)
    assert leftovers == set(), "ledgers no log holds"
    assert keys == [], "job records left"
    if df is None:
        df = spark.read.format("bookkeeper").option("metadata", uri).option("log", log).load()
    ids = F.col("value").cast("string").cast("long")
    got = df.agg(
        F.count("*"), F.countDistinct(ids), F.min(ids), F.max(ids), F.min("offset"),
        F.max("offset"), F.sum(ids), F.countDistinct("ledger_id"),
    ).first()  # fmt: skip
    if expected:
        last = expected - 1
        assert tuple(got)[:7] == (expected, expected, 0, last, 0, last, expected * last // 2), got
    else:
        assert got[0] == 0
    return got[7]


def failing(partition: int, after_rows: int, first_attempt_only: bool = True):
    """A mapPartitions function: partition ``partition`` raises once it has passed
    ``after_rows`` rows on (on its first attempt only, or on every attempt)."""

    def run(rows: Iterator[Any]) -> Iterator[Any]:
        task = TaskContext.get()
        doomed = task.partitionId() == partition and (
            task.attemptNumber() == 0 or not first_attempt_only
        )
        for seen, row in enumerate(rows):
            if doomed and seen >= after_rows:
                raise RuntimeError(f"injected failure (always: {not first_attempt_only})")
            yield row

    return run


def numbered(spark: SparkSession, rows: int = ROWS, fail: Any = None) -> Any:
    """Ids 0..rows-1 as a string ``value``, in 4 partitions; ``fail`` (a ``failing``
    function) runs in the same task as the write, so its failure fails the writing task."""
    ids = spark.sparkContext.parallelize(range(rows), PARTITIONS)
    if fail is not None:
        ids = ids.mapPartitions(fail)
    return spark.createDataFrame(ids.map(lambda i: (str(i),)), "value string")


FLAKY = failing(2, 10_000)  # partition 2's first attempt fails after 10,000 rows


def test_foreach_partition_adapter_writes_each_row_once(spark, cluster_uri):
    log = new_log(cluster_uri)
    sink = LogSink(cluster_uri, log)
    with sink.job(partitions=PARTITIONS) as job:
        numbered(spark, fail=FLAKY).rdd.foreachPartition(job.write_partition)
    assert job.summary is not None
    assert (job.summary.rows, job.summary.partitions, job.summary.ledgers) == (ROWS, 4, 4)
    check_log(spark, cluster_uri, log, ROWS)


def test_write_to_log_writes_each_row_once_and_read_log_aggregates(spark, cluster_uri):
    log = new_log(cluster_uri)
    summary = write_to_log(numbered(spark, fail=FLAKY), cluster_uri, log)
    assert (summary.state, summary.rows, summary.first_offset, summary.next_offset) == (
        "committed", ROWS, 0, ROWS,
    )  # fmt: skip
    df = read_log(spark, cluster_uri, log, config=SparkConfig(partition_entries_max=10_000))
    assert df.rdd.getNumPartitions() >= 8  # 4 ledgers of 15,000 in slices of 10,000
    assert df.columns == ["offset", "value", "ledger_id", "entry_id"]
    assert check_log(spark, cluster_uri, log, ROWS, df) == 4  # one ledger per partition
    window = read_log(spark, cluster_uri, log, from_offset=500, to_offset=1_499)
    assert window.count() == 1_000
    assert window.agg(F.min("offset"), F.max("offset")).first() == (500, 1_499)
    # A task's read asks for more than the log returns at once (10,000): it goes on.
    info = bk_run(cluster_uri, lambda bk: bk.log_info(log))
    first = info.segments[1]
    piece = LogSlice(first.ledger_id, 0, first.last_offset - first.first_offset, first.first_offset)
    big = SparkConfig(read_batch_entries_max=15_000)
    batches = list(read_slice(cluster_uri, log, piece, big))
    assert [b.num_rows for b in batches] == [10_000, 5_000]
    assert batches[0].column("offset")[0].as_py() == first.first_offset
    assert batches[-1].column("entry_id")[-1].as_py() == 14_999


def test_the_data_source_writes_each_row_once_and_reads_back(spark, cluster_uri):
    log = new_log(cluster_uri)
    (
        numbered(spark, fail=FLAKY)
        .write.format("bookkeeper")
        .option("metadata", cluster_uri)
        .option("log", log)
        .mode("append")
        .save()
    )
    check_log(spark, cluster_uri, log, ROWS)


def test_failing_jobs_leave_nothing_in_the_log_and_no_ledger(spark, cluster_uri):
    log = new_log(cluster_uri)
    bad = numbered(spark, 20_000, fail=failing(3, 1_000, first_attempt_only=False))
    with pytest.raises(Exception, match=r"injected failure \(always: True\)"):
        write_to_log(bad, cluster_uri, log)
    with pytest.raises(Exception, match=r"injected failure \(always: True\)"):
        bad.write.format("bookkeeper").option("metadata", cluster_uri).option("log", log).mode(
            "append"
        ).save()
    with (
        pytest.raises(RuntimeError, match="driver gave up"),
        LogSink(cluster_uri, log).job() as job,
    ):
        numbered(spark, 20_000).rdd.foreachPartition(job.write_partition)
        raise RuntimeError("the driver gave up after the tasks wrote")
    check_log(spark, cluster_uri, log, 0)


def test_streaming_batches_land_once_when_a_batch_is_replayed(spark, cluster_uri, tmp_path):
    """The checkpoint loses its last commit (as when the driver dies after our commit and
    before Spark's): the restarted query replays that batch, and the log keeps one copy."""
    source = tmp_path / "in"
    source.mkdir()
    for n in range(3):
        lines = "\n".join(json.dumps({"id": n * 100 + i}) for i in range(100))
        (source / f"part-{n}.json").write_text(lines)
    for kind in ("foreachBatch", "data source"):
        log = new_log(cluster_uri)
        checkpoint = tmp_path / f"checkpoint-{log}"
        for _ in range(2):  # the second run replays batch 2
            stream = (
                spark.readStream.schema("id long")
                .option("maxFilesPerTrigger", 1)
                .json(str(source))
                .selectExpr("CAST(id AS STRING) AS value")
                .writeStream.option("checkpointLocation", str(checkpoint))
                .trigger(availableNow=True)
            )
            if kind == "foreachBatch":
                stream = stream.foreachBatch(LogSink(cluster_uri, log).for_batch)
            else:
                stream = (
                    stream.format("bookkeeper").option("metadata", cluster_uri).option("log", log)
                )
            query = stream.start()
            assert query.awaitTermination(120), f"{kind}: the query did not finish"
            assert query.exception() is None
            last_commit = checkpoint / "commits" / "2"
            assert last_commit.exists(), sorted(p.name for p in (checkpoint / "commits").iterdir())
            last_commit.unlink()
            (checkpoint / "commits" / ".2.crc").unlink(missing_ok=True)
        check_log(spark, cluster_uri, log, 300)
        info = bk_run(cluster_uri, lambda bk, name=log: bk.log_info(name))
        props = info.metadata.properties
        assert sorted(props.values()) == ["2"], f"{kind}: {props}"


def no_jobs_ran(spark: SparkSession, group: str) -> bool:
    return spark.sparkContext.statusTracker().getJobIdsForGroup(group) == []


def test_bad_input_is_refused_on_the_driver_before_any_task_runs(spark, cluster_uri):
    log = new_log(cluster_uri)
    group = f"bad-input-{uuid.uuid4().hex[:6]}"
    spark.sparkContext.setJobGroup(group, "bad input")
    ids = spark.range(0, 10, numPartitions=2)
    try:
        with pytest.raises(SparkInputError, match=r"no 'value' column.*to_json\(struct"):
            write_to_log(ids, cluster_uri, log)
        with pytest.raises(SparkInputError, match="'value' column is bigint"):
            write_to_log(ids.withColumnRenamed("id", "value"), cluster_uri, log)
        with pytest.raises(NoSuchLogError, match="create=True"):
            write_to_log(numbered(spark, 10), cluster_uri, "no-such-log")
        with pytest.raises(ConfigError, match=r"etcd\[s\]://\[USER:PASSWORD@\]HOST:PORT"):
            write_to_log(numbered(spark, 10), "etcd:/nowhere", log)
        with pytest.raises(Exception, match=r"no 'value' column"):
            ids.write.format("bookkeeper").option("metadata", cluster_uri).option("log", log).mode(
                "append"
            ).save()
        with pytest.raises(Exception, match="append-only"):
            numbered(spark, 10).write.format("bookkeeper").option("metadata", cluster_uri).option(
                "log", log
            ).mode("overwrite").save()
        with pytest.raises(Exception, match=r"unreachable"):
            write_to_log(numbered(spark, 10), f"etcd://127.0.0.1:{free_port()}/x", log)
        assert no_jobs_ran(spark, group)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    nulls = spark.createDataFrame([("a",), (None,), ("c",)], "value string").coalesce(1)
    with pytest.raises(Exception, match=r"partition 0, row 1: the value is null"):
        write_to_log(nulls, cluster_uri, log)
    created = f"created-{uuid.uuid4().hex[:6]}"
    summary = write_to_log(nulls, cluster_uri, created, create=True, skip_nulls=True)
    assert summary.rows == 2
    records = bk_run(cluster_uri, lambda bk: bk.read_log(created, 0, 1))
    assert [r.payload for r in records] == [b"a", b"c"]


def test_job_is_refused_outside_a_spark_task(spark, cluster_uri):
    log = new_log(cluster_uri)
    with (
        pytest.raises(SparkJobError, match="runs in a Spark task"),
        LogSink(cluster_uri, log).job() as job,
    ):
        job.write_partition(iter([b"x"]))
    check_log(spark, cluster_uri, log, 0)


def shell(uri: str, *argv: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "bookkeeper_aio.shell", "--metadata", uri, *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_the_shell_lists_and_aborts_a_dead_drivers_job(spark, cluster_uri):
    log = new_log(cluster_uri)

    async def dead_driver(bk: BookKeeper) -> str:
        job = await open_job(bk, log)
        writer = AttemptWriter(bk, job.job_id, 0, 0, 1, 0, SparkConfig())
        await writer.start()
        await writer.write([b"left behind"])
        return job.job_id

    job_id = bk_run(cluster_uri, dead_driver)
    listed = shell(cluster_uri, "list-spark-jobs")
    assert listed.returncode == 0 and f"{job_id}\t{log}\tOPEN" in listed.stdout
    aborted = shell(cluster_uri, "abort-spark-job", job_id)
    assert aborted.returncode == 0, aborted.stderr
    assert "aborted: 1 ledgers deleted" in aborted.stdout
    assert shell(cluster_uri, "list-spark-jobs").stdout.strip() == "no Spark jobs"
    unknown = shell(cluster_uri, "abort-spark-job", job_id)
    assert unknown.returncode == 1 and "no Spark job" in unknown.stderr
    cleaned = shell(cluster_uri, "cleanup-spark-jobs", "--older-than", "3600")
    assert json.loads(cleaned.stdout) == {
        "jobs_aborted": 0,
        "jobs_finished": 0,
        "ledgers_deleted": 0,
    }
    check_log(spark, cluster_uri, log, 0)


def test_the_benchmark_measures_the_sink_the_source_and_the_commit(spark, cluster_uri):
    """``python -m benchmarks spark`` in small (its phases, in this module's session)."""
    from benchmarks.__main__ import build_parser
    from benchmarks.spark import client_baseline, spark_phases

    argv = ["spark", "--rows", "2000", "--partitions", "2", "--commits", "1"]
    args = build_parser().parse_args([*argv, "--metadata", cluster_uri])
    base = asyncio.run(client_baseline(cluster_uri, f"bench-{uuid.uuid4().hex[:6]}", args))
    phases = spark_phases(cluster_uri, args, spark)
    assert base["client_write_rows_per_s"] > 0 and base["client_read_rows_per_s"] > 0
    assert phases["sink_rows_per_s"] > 0 and phases["source_rows_per_s"] > 0
    assert set(phases["commit_ms_p50_by_partitions"]) == {"1", "4", "16"}
    assert all(ms > 0 for ms in phases["commit_ms_p50_by_partitions"].values())


def test_the_example_pipeline_writes_and_aggregates(spark, cluster_uri):
    """examples/spark_pipeline.py, in this module's session (on its own it starts one)."""
    path = Path(__file__).parent.parent / "examples" / "spark_pipeline.py"
    spec = importlib.util.spec_from_file_location("spark_pipeline", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    log = f"example-{uuid.uuid4().hex[:6]}"
    assert example.main([cluster_uri, "--count", "2000", "--log", log]) == 0
    info = bk_run(cluster_uri, lambda bk: bk.log_info(log))
    assert info.next_offset == sum(1 for i in range(2000) if i % 97 - 3 > 0)  # amount > 0
