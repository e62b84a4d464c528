"""Reading a log into Spark: partitions by ledger and entry range, Arrow batches, ``read_log``.

Theory of operation
-------------------
The driver takes a snapshot of the log (``BookKeeper.log_info``: its segments and how far
each is confirmed) and splits ``from_offset .. to_offset`` along it (:func:`plan_slices`): a
slice never spans two ledgers and holds at most ``partition_entries_max`` entries, so a log
of ten ledgers reads with at least ten tasks. The end is the last confirmed offset at
planning time: a slice never reaches past what a reader may see (``read_log`` of the logs
API returns only confirmed records). A task reads its slice through its process's client in
requests of ``read_batch_entries_max`` records, one request ahead of the Arrow batch it
hands Spark, so a task holds at most two batches.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..config import SparkConfig
from ..errors import IncorrectParameterError, LogTruncatedError, SparkJobError
from .client import process_client

SCHEMA = "offset bigint, value binary, ledger_id bigint, entry_id bigint"


@dataclass(frozen=True)
class LogSlice:
    """Entries ``first_entry .. last_entry`` of one ledger: offsets from ``first_offset``."""

    ledger_id: int
    first_entry: int
    last_entry: int
    first_offset: int

    @property
    def last_offset(self) -> int:
        return self.first_offset + self.last_entry - self.first_entry


def plan_slices(
    segments: Sequence[tuple[int, int, int]],
    from_offset: int,
    to_offset: int | None,
    entries_max: int,
) -> list[LogSlice]:
    """Split ``from_offset .. to_offset`` (inclusive; None: to the end) of a log whose
    ``segments`` are ``(ledger id, first offset, last confirmed offset)`` in order.

    Raises:
        IncorrectParameterError: a negative offset, ``to_offset < from_offset - 1``, or
            ``entries_max < 1``.
    """
    if type(from_offset) is not int or from_offset < 0:
        raise IncorrectParameterError(f"from_offset must be an int >= 0, got {from_offset!r}")
    if to_offset is not None and (type(to_offset) is not int or to_offset < from_offset - 1):
        raise IncorrectParameterError(
            f"to_offset must be None or an int >= from_offset - 1, got {to_offset!r}"
        )
    if entries_max < 1:
        raise IncorrectParameterError(f"entries_max must be >= 1, got {entries_max}")
    slices = []
    for ledger_id, first, last in segments:
        low = max(first, from_offset)
        high = last if to_offset is None else min(last, to_offset)
        while low <= high:
            end = min(high, low + entries_max - 1)
            slices.append(LogSlice(ledger_id, low - first, end - first, low))
            low = end + 1
    return slices


async def snapshot(bk: Any, log: str, from_offset: int) -> list[tuple[int, int, int]]:
    """The log's segments as ``plan_slices`` wants them.

    Raises:
        NoSuchLogError: no such log.
        LogTruncatedError: ``from_offset`` is below the first offset the log keeps.
    """
    info = await bk.log_info(log)
    if from_offset < info.start_offset:
        raise LogTruncatedError(
            f"log {log}: offset {from_offset} was truncated; the first kept is {info.start_offset}",
            start_offset=info.start_offset,
        )
    return [(s.ledger_id, s.first_offset, s.last_offset) for s in info.segments]


def plan(
    uri: str, log: str, from_offset: int, to_offset: int | None, config: SparkConfig
) -> list[LogSlice]:
    """:func:`plan_slices` of the log as it is now (runs on the driver side)."""
    segments = process_client().run(
        uri, lambda bk: snapshot(bk, log, from_offset), config.step_timeout_s
    )
    return plan_slices(segments, from_offset, to_offset, config.partition_entries_max)


def read_slice(uri: str, log: str, piece: LogSlice, config: SparkConfig) -> Iterator[Any]:
    """The slice's records as Arrow record batches (offset, value, ledger_id, entry_id).

    Raises:
        LogTruncatedError: the log was truncated past the slice since planning.
        SparkJobError: the log returned other records than the slice's.
        BookKeeperError: reading failed.
    """
    import pyarrow as pa

    client, timeout_s = process_client(), config.step_timeout_s
    step = config.read_batch_entries_max

    def fetch(low: int) -> Any:
        high = min(piece.last_offset, low + step - 1)
        return client.submit(uri, lambda bk: bk.read_log(log, low, high), timeout_s)

    low = piece.first_offset
    pending = fetch(low)
    while pending is not None:
        records = client.wait(pending, timeout_s)
        offsets = [r.offset for r in records]
        # The log may return fewer than asked (its own bound per call), never others.
        if not offsets or offsets != list(range(low, low + len(offsets))):
            raise SparkJobError(f"log {log}: asked for offsets from {low}, got {offsets[:3]}...")
        low += len(offsets)
        pending = fetch(low) if low <= piece.last_offset else None  # read while Spark works
        entry = piece.first_entry + (offsets[0] - piece.first_offset)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(offsets, pa.int64()),
                pa.array([r.payload for r in records], pa.binary()),
                pa.array([piece.ledger_id] * len(records), pa.int64()),
                pa.array(range(entry, entry + len(records)), pa.int64()),
            ],
            names=["offset", "value", "ledger_id", "entry_id"],
        )


def read_log(
    spark: Any,
    metadata_uri: str,
    log: str,
    from_offset: int = 0,
    to_offset: int | None = None,
    *,
    config: SparkConfig | None = None,
) -> Any:
    """A DataFrame of the log's confirmed records ``from_offset .. to_offset`` (inclusive;
    None: up to the last confirmed one now): columns offset (long), value (binary),
    ledger_id (long), entry_id (long); one or more partitions per ledger.

    Raises:
        NoSuchLogError / LogTruncatedError / IncorrectParameterError: when Spark plans the
            read (on ``load``).
    """
    from .datasource import register

    register(spark)
    reader = (
        spark.read.format("bookkeeper")
        .option("metadata", metadata_uri)
        .option("log", log)
        .option("from_offset", str(from_offset))
    )
    if to_offset is not None:
        reader = reader.option("to_offset", str(to_offset))
    for key, value in vars(config).items() if config is not None else ():
        reader = reader.option(key, str(value))
    return reader.load()


__all__ = ["SCHEMA", "LogSlice", "plan", "plan_slices", "read_log", "read_slice", "snapshot"]
