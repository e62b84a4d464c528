"""The data pipeline on Spark: an exactly-once sink, a source, and a Python data source.

from bookkeeper_aio.spark import LogSink, write_to_log, read_log
with LogSink(metadata_uri, "orders").job() as job:   # commits on success, aborts on exception
    df.foreachPartition(job.write_partition)
write_to_log(df, metadata_uri, "orders")              # the same in one call; returns a summary
df2 = read_log(spark, metadata_uri, "orders", from_offset=0, to_offset=None)
df.write.format("bookkeeper").option("metadata", uri).option("log", "orders").mode("append").save()

Needs ``pip install bookkeeper-aio[spark]`` (pyspark, pyarrow); docs/spark.md says how it works.
pyspark is imported only where Spark is used, so the shell's job commands work without it.
"""

from .commit import JobSummary
from .session import local_session
from .sink import LogSink, SinkJob, write_to_log
from .source import read_log


def register(spark: object) -> None:
    """Register the "bookkeeper" data source with a SparkSession (idempotent)."""
    from .datasource import register as register_source

    register_source(spark)


__all__ = [
    "JobSummary",
    "LogSink",
    "SinkJob",
    "local_session",
    "read_log",
    "register",
    "write_to_log",
]
