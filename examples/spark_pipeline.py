"""A small pipeline on Spark: orders (generated, or read from a CSV) are cleaned and written to
a log exactly once; a second job reads the log back and aggregates revenue per customer.

    python examples/spark_pipeline.py etcd://127.0.0.1:2379/bookkeeper
    python examples/spark_pipeline.py URI --csv orders.csv --log orders
    spark-submit --master spark://HOST:7077 examples/spark_pipeline.py URI   # a cluster

(`python -m bookkeeper_aio.sandbox --bookies 3` prints a metadata URI to use. Without
spark-submit or --master the job runs in this process on 2 cores, bound to 127.0.0.1. On a
cluster every executor needs the package: docs/spark.md, "Running on a cluster".)
"""

from __future__ import annotations

import argparse
import sys
import uuid

from pyspark import SparkConf
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bookkeeper_aio.spark import local_session, read_log, write_to_log

APP = "bookkeeper-aio spark_pipeline"
ORDER = "order_id long, customer string, amount double, country string"


def session(master: str | None) -> SparkSession:
    if master is None and SparkConf().contains("spark.master"):
        return SparkSession.builder.appName(APP).getOrCreate()  # spark-submit's master
    master = master or "local[2]"
    if master.startswith("local"):
        return local_session(APP, master)  # here, on 127.0.0.1, workers on this Python
    return SparkSession.builder.master(master).appName(APP).getOrCreate()


def orders(spark: SparkSession, csv: str | None, count: int) -> DataFrame:
    """Orders from ``csv`` (header, columns of ORDER), or ``count`` generated ones."""
    if csv is not None:
        return spark.read.option("header", True).schema(ORDER).csv(csv)
    ids = spark.range(count, numPartitions=4)
    return ids.select(
        F.col("id").alias("order_id"),
        F.concat(F.lit("customer-"), (F.col("id") % 50).cast("string")).alias("customer"),
        ((F.col("id") % 97) - 3).cast("double").alias("amount"),  # a few refunds (< 0)
        F.element_at(
            F.array(*map(F.lit, ["FR", "DE", "NL", "IT"])), ((F.col("id") % 4) + 1).cast("int")
        ).alias("country"),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("metadata", metavar="URI", help="etcd://HOST:PORT/ROOT")
    parser.add_argument("--csv", help="read orders from this CSV instead of generating them")
    parser.add_argument("--count", type=int, default=10_000, help="orders to generate")
    parser.add_argument("--log", default=f"orders-{uuid.uuid4().hex[:6]}")
    parser.add_argument("--master", help="a Spark master (default: spark-submit's, or local)")
    args = parser.parse_args(argv)
    running = SparkSession.getActiveSession()  # called from code that has a session: use it
    spark = running or session(args.master)
    try:
        # Job 1: clean and write. Each order becomes one record (JSON), exactly once: a task
        # that fails and is retried, or a speculative copy, never adds a duplicate.
        cleaned = orders(spark, args.csv, args.count).where(F.col("amount") > 0)
        records = cleaned.select(F.to_json(F.struct("*")).alias("value"))
        summary = write_to_log(records, args.metadata, args.log, create=True)
        print(
            f"wrote {summary.rows} orders to log {args.log!r} at offsets "
            f"{summary.first_offset}..{summary.next_offset} (exclusive) "
            f"({summary.partitions} partitions, commit {summary.commit_s * 1000:.0f} ms)"
        )

        # Job 2: read the log back (one or more tasks per ledger) and aggregate.
        first, end = summary.first_offset or 0, (summary.next_offset or 1) - 1
        back = read_log(spark, args.metadata, args.log, from_offset=first, to_offset=end)
        parsed = back.select(F.from_json(F.col("value").cast("string"), ORDER).alias("o"))
        revenue = (
            parsed.groupBy("o.customer")
            .agg(F.count("*").alias("orders"), F.round(F.sum("o.amount"), 2).alias("revenue"))
            .orderBy(F.desc("revenue"))
        )
        revenue.show(5, truncate=False)
        total = parsed.count()
        print(f"read {total} orders back from {back.rdd.getNumPartitions()} partitions")
        return 0 if total == summary.rows else 1
    finally:
        if running is None:
            spark.stop()


if __name__ == "__main__":
    sys.exit(main())
