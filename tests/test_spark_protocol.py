"""The Spark jobs' commit protocol on the simulated cluster (the real client, bookie and
metadata code in virtual time; no Spark): retried, speculative, failed, late and unrecorded
attempts; aborts; concurrent commits; stream batches; cleanup. The real-Spark tests are in
tests/test_spark_e2e.py."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bookkeeper_aio import BookKeeper, LogFencedError, NoSuchLogError
from bookkeeper_aio.config import SparkConfig
from bookkeeper_aio.errors import OperationTimeoutError, SparkJobError
from bookkeeper_aio.sim.world import World
from bookkeeper_aio.spark import admin
from bookkeeper_aio.spark.attempt import AttemptWriter
from bookkeeper_aio.spark.commit import abort_job, commit_job, open_job
from bookkeeper_aio.spark.model import (
    TAG_JOB,
    TAG_LOG,
    JobRecord,
    attempt_key,
    job_key,
)
from bookkeeper_aio.spark.records import create_record

from .simulated import Scenario, simulated_cluster

CONFIG = SparkConfig()


@pytest.fixture
def cluster() -> Iterator[Callable[[Scenario], Any]]:
    """``cluster(scenario)`` runs ``scenario(world)`` on 4 simulated bookies (bounded)."""
    with simulated_cluster(seed=27) as run:
        yield run


def rows(partition: int, n: int, tag: str = "r") -> list[bytes]:
    return [f"{tag}-{partition}-{i}".encode() for i in range(n)]


async def attempt(
    bk: BookKeeper, job_id: str, partition: int, task: int, payloads: list[bytes], *, stage: int = 0
) -> AttemptWriter:
    """A task attempt that wrote ``payloads`` (not finished)."""
    writer = AttemptWriter(bk, job_id, stage, partition, task, task % 3, CONFIG)
    await writer.start()
    await writer.write(payloads)
    return writer


async def log_records(bk: BookKeeper, log: str) -> list[bytes]:
    info = await bk.log_info(log)
    if info.next_offset == info.start_offset:
        return []
    return [r.payload for r in await bk.read_log(log, info.start_offset, info.next_offset - 1)]


async def spark_keys(bk: BookKeeper) -> list[str]:
    return [key async for key, _ in bk.ctx.metadata.list_prefix("spark/")]


async def assert_nothing_left(bk: BookKeeper) -> None:
    """No ledger outside the log "orders", no job record."""
    assert await ledgers_outside_logs(bk, "orders") == set()
    assert await spark_keys(bk) == []


async def ledgers_outside_logs(bk: BookKeeper, *logs: str) -> set[int]:
    kept = set()
    for log in logs:
        md = (await bk.log_info(log)).metadata
        kept |= {*md.ledger_ids, *md.trash}
    return set(await bk.list_ledgers()) - kept


def test_one_attempt_per_partition_lands_and_every_other_ledger_goes(cluster):
    """Retried (failed first), speculative (two finished) and killed (never recorded its
    ledger) attempts: the log holds each partition's rows once, in partition order."""

    async def scenario(world: World) -> None:
        bk = world.client("driver")
        await bk.create_log("orders")
        job = await open_job(bk, "orders", partitions=4)
        p0 = await attempt(bk, job.job_id, 0, 1, rows(0, 30))
        await p0.finish()
        failed = await attempt(bk, job.job_id, 1, 2, rows(1, 10))
        await failed.fail()  # its task raised: tombstoned, ledger deleted
        retry = await attempt(bk, job.job_id, 1, 6, rows(1, 25))
        await retry.finish()
        spec_a = await attempt(bk, job.job_id, 2, 3, rows(2, 40))
        spec_b = await attempt(bk, job.job_id, 2, 7, rows(2, 40))
        await spec_b.finish()
        await spec_a.finish()
        # A task killed between creating its ledger and recording it: only the tag knows.
        killed = AttemptWriter(bk, job.job_id, 0, 3, 4, 0, CONFIG)
        await killed.start()
        tags = {TAG_JOB: job.job_id.encode(), TAG_LOG: b"orders"}
        lost = await bk.create_ledger(3, 3, 2, custom_metadata=tags)
        await lost.append(b"never recorded")
        p3 = await attempt(bk, job.job_id, 3, 8, [])  # an empty partition: no ledger
        await p3.finish()

        accepted = [p0.key, retry.key, spec_b.key, p3.key]  # what Spark says succeeded
        summary = await commit_job(bk, job.job_id, CONFIG, winners=accepted)

        expected = rows(0, 30) + rows(1, 25) + rows(2, 40)
        assert await log_records(bk, "orders") == expected
        assert (summary.state, summary.rows, summary.partitions) == ("committed", 95, 4)
        assert (summary.first_offset, summary.next_offset) == (0, 95)
        # spec_a finished too (a killed copy may), but Spark did not accept it; and the lost one.
        assert summary.ledgers == 3 and summary.ledgers_deleted == 2
        await assert_nothing_left(bk)

    cluster(scenario)


def test_an_attempt_too_late_or_tombstoned_removes_what_it_wrote(cluster):
    async def scenario(world: World) -> None:
        bk = world.client("driver")
        await bk.create_log("orders")
        job = await open_job(bk, "orders")
        done = await attempt(bk, job.job_id, 0, 1, rows(0, 5))
        await done.finish()
        slow = await attempt(bk, job.job_id, 0, 2, rows(0, 5, "slow"))  # still writing
        await commit_job(bk, job.job_id, CONFIG, winners=[done.key])
        with pytest.raises(SparkJobError):
            await slow.finish()  # tombstoned by the commit: cannot become DONE
        await slow.fail()
        late = AttemptWriter(bk, job.job_id, 0, 1, 9, 1, CONFIG)
        with pytest.raises(SparkJobError, match="too late"):
            await late.start()  # the job was committed: it records nothing
        assert await log_records(bk, "orders") == rows(0, 5)
        await assert_nothing_left(bk)

    cluster(scenario)


def test_an_abort_or_an_incomplete_job_leaves_nothing(cluster):
    async def scenario(world: World) -> None:
        bk = world.client("driver")
        await bk.create_log("orders")
        job = await open_job(bk, "orders")
        for p in range(3):
            await (await attempt(bk, job.job_id, p, p + 1, rows(p, 20))).finish()
        writing = await attempt(bk, job.job_id, 3, 4, rows(3, 20))
        summary = await abort_job(bk, job.job_id, CONFIG)
        assert (summary.state, summary.ledgers_deleted) == ("aborted", 4)
        with pytest.raises(SparkJobError):
            await writing.finish()
        incomplete = await open_job(bk, "orders", partitions=3)
        keys = []
        for p in (0, 2):
            w = await attempt(bk, incomplete.job_id, p, 10 + p, rows(p, 20))
            await w.finish()
            keys.append(w.key)
        with pytest.raises(SparkJobError, match="cover only"):
            await commit_job(bk, incomplete.job_id, CONFIG, winners=keys)
        stray = await open_job(bk, "orders")  # Spark accepted an attempt that never finished
        w = await attempt(bk, stray.job_id, 0, 1, rows(0, 3))
        with pytest.raises(SparkJobError, match="WRITING, not DONE"):
            await commit_job(bk, stray.job_id, CONFIG, winners=[w.key])
        assert await log_records(bk, "orders") == []
        await assert_nothing_left(bk)

    cluster(scenario)


def test_two_jobs_committing_at_once_both_land_and_a_live_writer_is_fenced(cluster):
    async def scenario(world: World) -> None:
        bk, other = world.client("driver-1"), world.client("driver-2")
        await bk.create_log("orders")
        async with bk.open_log_writer("orders") as lw:
            acked = [await lw.append(f"app-{i}".encode()) for i in range(10)]
            jobs = [await open_job(c, "orders") for c in (bk, other)]
            keys: list[list[str]] = [[], []]
            for n, (client, job) in enumerate(zip((bk, other), jobs, strict=True)):
                for p in range(2):
                    w = await attempt(client, job.job_id, p, p + 1, rows(p, 50, f"job{n}"))
                    await w.finish()
                    keys[n].append(w.key)
            summaries = await asyncio.gather(
                commit_job(bk, jobs[0].job_id, CONFIG, winners=keys[0]),
                commit_job(other, jobs[1].job_id, CONFIG, winners=keys[1]),
            )
            with pytest.raises(LogFencedError):
                await lw.append(b"after the commits")
        assert [s.state for s in summaries] == ["committed", "committed"]
        ranges = sorted((s.first_offset, s.next_offset) for s in summaries)
        assert ranges == [(10, 110), (110, 210)]  # one after the other, dense
        records = await log_records(bk, "orders")
        assert records[: len(acked)] == [f"app-{i}".encode() for i in range(10)]
        for summary, n in zip(summaries, (0, 1), strict=True):
            got = records[summary.first_offset : summary.next_offset]
            assert got == rows(0, 50, f"job{n}") + rows(1, 50, f"job{n}")

    cluster(scenario)


def test_a_stream_batch_lands_once_even_when_two_runs_commit_it(cluster):
    async def scenario(world: World) -> None:
        bk = world.client("driver")
        await bk.create_log("orders")

        async def run_batch(batch: int, tag: str) -> tuple[str, list[str]]:
            job = await open_job(bk, "orders", query="q-1", batch=batch)
            w = await attempt(bk, job.job_id, 0, 1, rows(batch, 10, tag))
            await w.finish()
            return job.job_id, [w.key]

        async def commit(job: tuple[str, list[str]]) -> str:
            return (await commit_job(bk, job[0], CONFIG, winners=job[1])).state

        assert await commit(await run_batch(0, "a")) == "committed"
        assert await commit(await run_batch(0, "replay")) == "skipped"  # replayed: skipped
        racers = [await run_batch(1, "x"), await run_batch(1, "y")]  # two runs of batch 1
        states = sorted(await asyncio.gather(*(commit(j) for j in racers)))
        assert states == ["committed", "skipped"]
        records = await log_records(bk, "orders")
        assert records[:10] == rows(0, 10, "a")
        assert records[10:] in (rows(1, 10, "x"), rows(1, 10, "y"))
        props = (await bk.log_info("orders")).metadata.properties
        assert props == {"spark-batch/q-1": "1"}
        await assert_nothing_left(bk)

    cluster(scenario)


def test_a_stale_batch_check_is_caught_by_the_compare_and_swap(cluster, monkeypatch):
    """Two runs both read "batch 4 not committed yet" before either commits: the batch id
    is checked again inside the log's compare-and-swap, so the second one lands nothing."""
    from bookkeeper_aio.spark import commit

    async def stale(bk: BookKeeper, log: str, query: str) -> int | None:
        return 3

    async def scenario(world: World) -> None:
        bk = world.client("driver")
        await bk.create_log("orders")
        jobs = []
        for tag in ("x", "y"):
            job = await open_job(bk, "orders", query="q-2", batch=4)
            w = await attempt(bk, job.job_id, 0, 1, rows(4, 10, tag))
            await w.finish()
            jobs.append((job.job_id, [w.key]))
        await bk.append_ledgers_to_log("orders", [], properties={"spark-batch/q-2": "3"})
        monkeypatch.setattr(commit, "read_batch", stale)
        states = [(await commit_job(bk, j, CONFIG, winners=k)).state for j, k in jobs]
        assert states == ["committed", "skipped"]
        assert await log_records(bk, "orders") == rows(4, 10, "x")
        assert await ledgers_outside_logs(bk, "orders") == set()

    cluster(scenario)


@pytest.mark.parametrize("seed", range(12))
def test_a_commit_through_a_failing_metadata_store_lands_once_or_not_at_all(seed):
    """Metadata calls fail or lose their replies during the commit (and the tasks' last
    steps): whatever the commit reports, once the store is calm and the job is settled
    (abort-spark-job), the log holds the job's rows once (committed) or not at all, and no
    ledger or record is left."""

    async def scenario(world: World) -> tuple[str, list[bytes]]:
        bk = world.client("driver")
        await bk.create_log("orders")
        job = await open_job(bk, "orders", partitions=3)
        keys = []
        for p in range(3):
            w = await attempt(bk, job.job_id, p, p + 1, rows(p, 20))
            keys.append(w.key)
            if p == 2:
                world.faults.metadata_failure_rate = 0.15
                world.faults.metadata_lost_reply_rate = 0.15
                world.calm_rates_changed()
            try:
                await w.finish()
            except Exception:
                await w.fail()
        try:
            outcome = (await commit_job(bk, job.job_id, CONFIG, winners=keys)).state
        except Exception as exc:
            outcome = type(exc).__name__
        world.calm()
        await abort_job(bk, job.job_id, CONFIG)  # settles whatever is left (none: no-op)
        records = await log_records(bk, "orders")
        await assert_nothing_left(bk)
        return outcome, records

    with simulated_cluster(seed) as run:
        outcome, records = run(scenario)
    expected = rows(0, 20) + rows(1, 20) + rows(2, 20)
    assert records in ([], expected), outcome
    if outcome == "committed":
        assert records == expected


def test_a_job_has_one_committer(cluster):
    async def scenario(world: World) -> None:
        bk = world.client("driver")
        await bk.create_log("orders")
        job = await open_job(bk, "orders")
        w = await attempt(bk, job.job_id, 0, 1, rows(0, 5))
        await w.finish()
        first, second = await asyncio.gather(
            commit_job(bk, job.job_id, CONFIG, winners=[w.key]),
            commit_job(bk, job.job_id, CONFIG, winners=[w.key]),
            return_exceptions=True,
        )
        outcomes = sorted([type(first).__name__, type(second).__name__])
        assert outcomes == ["JobSummary", "SparkJobError"]
        assert await log_records(bk, "orders") == rows(0, 5)

    cluster(scenario)


def test_cleanup_settles_dead_drivers_jobs_and_deletes_orphan_ledgers(cluster):
    async def scenario(world: World) -> None:
        bk = world.client("driver")
        store = bk.ctx.metadata
        await bk.create_log("orders")
        # A driver died before committing (its record is old).
        dead = JobRecord("dead-open", "orders", created_ms=1)
        await create_record(store, job_key(dead.job_id), dead)
        await (await attempt(bk, dead.job_id, 0, 1, rows(0, 5))).finish()
        # A driver died after its append landed, before deleting its records.
        landed = await open_job(bk, "orders")
        w = await attempt(bk, landed.job_id, 0, 1, rows(0, 7, "landed"))
        record = await w.finish()
        await bk.append_ledgers_to_log("orders", record.ledgers)
        await _mark_committing(bk, landed.job_id, record.ledgers)
        # A driver died while COMMITTING, before the append.
        stuck = await open_job(bk, "orders")
        stuck_w = await attempt(bk, stuck.job_id, 0, 1, rows(0, 3, "stuck"))
        stuck_record = await stuck_w.finish()
        await _mark_committing(bk, stuck.job_id, stuck_record.ledgers)
        # A ledger of a job long gone, and a running job that must be left alone.
        orphan = await bk.create_ledger(3, 3, 2, custom_metadata={TAG_JOB: b"gone"})
        await orphan.close()
        running = await open_job(bk, "orders")
        await (await attempt(bk, running.job_id, 0, 1, rows(0, 4, "running"))).finish()

        listed = {j["job_id"]: j for j in await admin.describe_jobs(bk, CONFIG)}
        assert listed[running.job_id]["rows_done"] == 4

        await admin.abort(bk, stuck.job_id, CONFIG)  # abort-spark-job: not landed, aborted
        counts = await admin.cleanup(bk, ttl_s=-1, config=CONFIG)  # everything is "old"
        assert counts["jobs_finished"] == 1  # landed: finished, its ledger kept
        assert await log_records(bk, "orders") == rows(0, 7, "landed")
        await assert_nothing_left(bk)
        with pytest.raises(SparkJobError, match="no Spark job"):
            await admin.abort(bk, "never-was", CONFIG)

    cluster(scenario)


async def _mark_committing(bk: BookKeeper, job_id: str, ledgers: tuple[int, ...]) -> None:
    store = bk.ctx.metadata
    stored = await store.get(job_key(job_id))
    job = JobRecord.from_json_bytes(stored.value).sealed().committing(ledgers)
    await store.put(job_key(job_id), job.to_json_bytes(), expected_version=stored.version)


def test_a_missing_log_is_refused_unless_created(cluster):
    async def scenario(world: World) -> None:
        bk = world.client("driver")
        with pytest.raises(NoSuchLogError, match="create=True"):
            await open_job(bk, "nope")
        job = await open_job(bk, "fresh", create=True)
        assert (await bk.log_info("fresh")).next_offset == 0
        await abort_job(bk, job.job_id, CONFIG)

    cluster(scenario)


def test_attempt_keys_sort_by_stage_partition_and_attempt():
    keys = [attempt_key("j", s, p, t) for s, p, t in [(1, 0, 5), (0, 10, 1), (0, 2, 30), (0, 2, 4)]]
    assert sorted(keys) == [keys[3], keys[2], keys[1], keys[0]]


def test_a_process_keeps_one_client_per_cluster_and_its_loop_in_a_thread():
    from bookkeeper_aio.errors import ConfigError
    from bookkeeper_aio.spark.client import ProcessClient

    client = ProcessClient()
    try:

        async def which(bk: BookKeeper) -> tuple[int, str]:
            return id(bk), threading.current_thread().name

        first = client.run("memory://spark-client", which, 5)
        assert client.run("memory://spark-client", which, 5) == first  # reused
        assert first[1] == "bookkeeper-aio-spark"  # on the client's own loop thread
        assert client.run("memory://other", which, 5)[0] != first[0]
        with pytest.raises(ConfigError):
            client.run("nonsense", which, 5)
        with pytest.raises(ConfigError):
            client.run("nonsense", which, 5)  # a failed connect is not kept

        async def hang(bk: BookKeeper) -> None:
            await asyncio.sleep(60)

        with pytest.raises(OperationTimeoutError):
            client.run("memory://spark-client", hang, 0.05)
        assert client.statistics()["clusters"] == 2
    finally:
        client.close()
    assert not client._thread.is_alive()
