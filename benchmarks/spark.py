"""``spark``: rows through the Spark sink and source against the client's own rates, and the
cost of a commit.

    python -m benchmarks spark --rows 200000 --partitions 4 --entry-size 1024

One local SparkSession (``local[2]``: this machine's two cores, 127.0.0.1) and one cluster
(its own etcd + bookies, or ``--metadata URI``), in this order:

1. **client** (the baseline): one client in this process writes ``--rows`` entries into
   ``--partitions`` ledgers at once, pipelined as a task writes them (``wait_for_room``,
   ``append_callback``), with the log's quorums; the ledgers are appended to a log, and
   ``read_log`` reads them back in batches of the sink's read size.
2. **sink**: ``write_to_log`` of a DataFrame of ``--rows`` values of ``--entry-size`` bytes in
   ``--partitions`` partitions (generated in the JVM), wall time from the call to the commit.
   The same DataFrame through the data source (``df.write.format("bookkeeper")``: Arrow
   batches instead of pickled rows), wall time.
3. **source**: ``read_log(...)`` counted and summed in Spark (every value reaches Python's
   Arrow batches and the JVM), wall time.
4. **commit**: ``--commits`` jobs of one row per partition for 1, 4 and 16 partitions: the
   driver's commit (seal, list, record, sweep, append in one compare-and-swap, delete) from
   the job's summary.

Rows/s of the sink and the source are also given as ratios of the client's rates.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

from bookkeeper_aio import BookKeeper
from bookkeeper_aio.config import SparkConfig

from .cluster import mode_target
from .load import payload_pool
from .options import add_client_arguments
from .stats import latency_summary, print_table, write_json


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_client_arguments(p)
    p.add_argument("--rows", type=int, default=200_000, metavar="N", help="rows per phase")
    p.add_argument("--partitions", type=int, default=4, metavar="P")
    p.add_argument("--commits", type=int, default=5, metavar="N", help="small jobs per size")


async def client_baseline(uri: str, log: str, args: argparse.Namespace) -> dict[str, float]:
    """Phase 1: the client's own write and read rates over the same rows."""
    payloads = payload_pool(args.entry_size)
    share = args.rows // args.partitions
    async with BookKeeper.connect(uri) as bk:
        await bk.create_log(log, ensemble_size=args.ensemble, write_quorum=args.write_quorum,
                            ack_quorum=args.ack_quorum)  # fmt: skip
        errors: list[BaseException] = []

        def added(_: int, error: BaseException | None) -> None:
            if error is not None:
                errors.append(error)

        async def one(index: int) -> int:
            ledger = await bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum)
            for i in range(share):
                payload = payloads[(index + i) % len(payloads)]
                await ledger.wait_for_room(len(payload))
                ledger.append_callback(payload, added)
            await ledger.close()
            return ledger.ledger_id

        started = time.perf_counter()
        ledgers = await asyncio.gather(*(one(i) for i in range(args.partitions)))
        write_s = time.perf_counter() - started
        if errors:
            raise RuntimeError(f"client writes failed: {errors[0]}")
        await bk.append_ledgers_to_log(log, ledgers)
        started = time.perf_counter()
        step, offset, total = SparkConfig().read_batch_entries_max, 0, share * args.partitions
        while offset < total:
            offset += len(await bk.read_log(log, offset, min(total, offset + step) - 1))
        read_s = time.perf_counter() - started
    return {"client_write_rows_per_s": total / write_s, "client_read_rows_per_s": total / read_s}


def session() -> Any:
    from bookkeeper_aio.spark import local_session

    spark = local_session("benchmarks spark")
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def values(spark: Any, rows: int, partitions: int, size: int) -> Any:
    """``rows`` binary values of ``size`` bytes (a zero-padded id, then filler)."""
    return spark.range(rows, numPartitions=partitions).selectExpr(
        f"CAST(concat(lpad(CAST(id AS STRING), 12, '0'), repeat('x', {max(0, size - 12)})) "
        "AS BINARY) AS value"
    )


def spark_phases(uri: str, args: argparse.Namespace, spark: Any = None) -> dict[str, Any]:
    """Phases 2-4 (blocking: Spark's driver API), in ``spark`` or a session of their own."""
    from pyspark.sql import functions as F

    from bookkeeper_aio.spark import read_log, write_to_log

    own = spark is None
    spark = spark or session()
    try:
        warm = f"warmup-{uuid.uuid4().hex[:6]}"  # workers started, modules imported
        write_to_log(values(spark, 1000, args.partitions, args.entry_size), uri, warm, create=True)
        read_log(spark, uri, warm).count()

        log = f"bench-sink-{uuid.uuid4().hex[:6]}"
        df = values(spark, args.rows, args.partitions, args.entry_size)
        started = time.perf_counter()
        summary = write_to_log(df, uri, log, create=True)
        sink_s = time.perf_counter() - started
        assert summary.rows == args.rows, summary

        source_log = f"bench-source-{uuid.uuid4().hex[:6]}"
        writer = df.write.format("bookkeeper").option("metadata", uri).option("log", source_log)
        started = time.perf_counter()
        writer.option("create", "true").mode("append").save()
        data_source_s = time.perf_counter() - started

        started = time.perf_counter()
        totals = read_log(spark, uri, log).agg(F.count("*"), F.sum(F.length("value"))).first()
        source_s = time.perf_counter() - started
        assert totals[0] == args.rows and totals[1] == args.rows * args.entry_size, totals

        commits: dict[str, list[float]] = {}
        for partitions in (1, 4, 16):
            small = values(spark, partitions, partitions, args.entry_size)
            commits[str(partitions)] = [
                write_to_log(small, uri, log).commit_s for _ in range(args.commits)
            ]
    finally:
        if own:
            spark.stop()
    return {
        "sink_rows_per_s": args.rows / sink_s,
        "data_source_write_rows_per_s": args.rows / data_source_s,
        "source_rows_per_s": args.rows / source_s,
        "sink_commit_ms": summary.commit_s * 1000,
        "commit_ms_p50_by_partitions": {p: statistics.median(s) * 1000 for p, s in commits.items()},
        "commit_latencies_s": [s for series in commits.values() for s in series],
    }


async def run_spark(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """The ``spark`` mode: print a table, write the JSON, return the results."""
    async with mode_target(args) as tgt:
        base = await client_baseline(tgt.uri, f"bench-client-{uuid.uuid4().hex[:6]}", args)
        phases = await asyncio.to_thread(spark_phases, tgt.uri, args)
    commit = latency_summary(phases.pop("commit_latencies_s"))
    result = {
        "rows": args.rows,
        "partitions": args.partitions,
        "entry_size": args.entry_size,
        **base,
        **phases,
        "ratio_sink_vs_client": phases["sink_rows_per_s"] / base["client_write_rows_per_s"],
        "ratio_source_vs_client": phases["source_rows_per_s"] / base["client_read_rows_per_s"],
        # The suite's common keys: the sink's rate, and the small jobs' commit latencies.
        "entries_per_s": phases["sink_rows_per_s"],
        "mb_per_s": phases["sink_rows_per_s"] * args.entry_size / 1e6,
        "p50_ms": commit["p50_ms"],
        "p99_ms": commit["p99_ms"],
    }
    if not quiet:
        rows = [
            {"path": "client writes (baseline)", "rows/s": base["client_write_rows_per_s"],
             "x client": None},
            {"path": "sink (write_to_log)", "rows/s": phases["sink_rows_per_s"],
             "x client": result["ratio_sink_vs_client"]},
            {"path": "data source writes", "rows/s": phases["data_source_write_rows_per_s"],
             "x client": phases["data_source_write_rows_per_s"]
             / base["client_write_rows_per_s"]},
            {"path": "client reads (baseline)", "rows/s": base["client_read_rows_per_s"],
             "x client": None},
            {"path": "source (read_log)", "rows/s": phases["source_rows_per_s"],
             "x client": result["ratio_source_vs_client"]},
        ]  # fmt: skip
        print_table(
            f"spark: {args.rows} rows of {args.entry_size} B in {args.partitions} partitions",
            rows,
        )
        by_size = phases["commit_ms_p50_by_partitions"]
        print_table(
            "commit (seal .. records deleted), median ms",
            [{"partitions": p, "commit_ms": ms} for p, ms in by_size.items()]
            + [{"partitions": f"{args.partitions} ({args.rows} rows)",
                "commit_ms": phases["sink_commit_ms"]}],
        )  # fmt: skip
    write_json(args.json, result)
    return result
