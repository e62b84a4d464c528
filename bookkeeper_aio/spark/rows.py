"""What the sink writes: the ``value`` of each row as bytes (Spark's Kafka sink convention).

Theory of operation
-------------------
A record is the row's ``value`` column, binary or string (UTF-8). A DataFrame without one,
or with another type, is refused on the driver before any task runs (:func:`check_schema`);
rows of an RDD are checked one by one (:func:`row_values`), and so are Arrow batches of the
data source (:func:`arrow_values`). A null value is refused with its partition and index
(the row's position in its partition), or skipped with ``skip_nulls``. The chunks handed to the
client are bounded in rows and bytes (:func:`chunks`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ..errors import SparkInputError

HOW_TO_BUILD = (
    "build one, e.g. df.select(to_json(struct(*)).alias('value')) "
    "(pyspark.sql.functions.to_json and struct), or df.selectExpr('CAST(x AS BINARY) AS value')"
)


def check_schema(schema: Any) -> None:
    """Refuse a schema (a pyspark StructType) whose ``value`` column is missing or is not
    binary or string.

    Raises:
        SparkInputError: with what to do about it.
    """
    from pyspark.sql.types import BinaryType, StringType

    fields = {f.name: f for f in schema.fields}
    if "value" not in fields:
        raise SparkInputError(
            f"the DataFrame has no 'value' column (it has {sorted(fields)}): {HOW_TO_BUILD}"
        )
    kind = fields["value"].dataType
    if not isinstance(kind, BinaryType | StringType):
        raise SparkInputError(
            f"the 'value' column is {kind.simpleString()}, not binary or string: cast it, or "
            f"{HOW_TO_BUILD}"
        )


def _bytes(value: object, partition: int, index: int) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise SparkInputError(
        f"partition {partition}, row {index}: value is {type(value).__name__}, not binary "
        f"or string: {HOW_TO_BUILD}"
    )


def _null(partition: int, index: int) -> SparkInputError:
    return SparkInputError(
        f"partition {partition}, row {index}: the value is null (filter such rows, or "
        "pass skip_nulls=True to skip them)"
    )


def row_values(rows: Iterable[Any], partition: int, skip_nulls: bool) -> Iterator[bytes]:
    """The record of each row: a Row's (or dict's) ``value``, or the element itself when it
    is bytes or a string (an RDD of records).

    Raises:
        SparkInputError: no value, a value of another type, or a null (unless ``skip_nulls``).
    """
    position: int | None = None  # index of 'value' among a Row's fields, found once
    for index, row in enumerate(rows):
        if isinstance(row, bytes | str | bytearray | memoryview):
            value: object = row
        elif isinstance(row, tuple) and hasattr(row, "__fields__"):  # a pyspark Row
            if position is None:
                if "value" not in row.__fields__:
                    raise SparkInputError(
                        f"partition {partition}: rows have no 'value' field "
                        f"(they have {list(row.__fields__)}): {HOW_TO_BUILD}"
                    )
                position = row.__fields__.index("value")
            value = row[position]
        elif isinstance(row, dict) and "value" in row:
            value = row["value"]
        elif row is None:
            value = None
        else:
            raise SparkInputError(
                f"partition {partition}, row {index}: a {type(row).__name__} is neither a "
                f"Row with a 'value' nor bytes or a string: {HOW_TO_BUILD}"
            )
        if value is None:
            if skip_nulls:
                continue
            raise _null(partition, index)
        yield _bytes(value, partition, index)


def arrow_values(batches: Iterable[Any], partition: int, skip_nulls: bool) -> Iterator[list[bytes]]:
    """The records of each Arrow record batch (the data source's writer), as lists.

    Raises:
        SparkInputError: as :func:`row_values`.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    seen = 0
    for batch in batches:
        if "value" not in batch.schema.names:
            raise SparkInputError(f"partition {partition}: no 'value' column: {HOW_TO_BUILD}")
        column = batch.column("value")
        if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
            if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
                raise SparkInputError(
                    f"partition {partition}: the value column is {column.type}, not binary "
                    f"or string: {HOW_TO_BUILD}"
                )
            column = column.cast(pa.binary())  # UTF-8 bytes as they are
        if column.null_count:
            if not skip_nulls:
                first = pc.index(column.is_null(), True).as_py()
                raise _null(partition, seen + first)
            column = column.drop_null()
        seen += batch.num_rows
        yield column.to_pylist()


def chunks(values: Iterable[bytes], rows_max: int, bytes_max: int) -> Iterator[list[bytes]]:
    """``values`` in lists of at most ``rows_max`` rows and about ``bytes_max`` bytes (a
    larger single value goes alone)."""
    chunk: list[bytes] = []
    size = 0
    for value in values:
        if chunk and (len(chunk) >= rows_max or size + len(value) > bytes_max):
            yield chunk
            chunk, size = [], 0
        chunk.append(value)
        size += len(value)
    if chunk:
        yield chunk


__all__ = ["arrow_values", "check_schema", "chunks", "row_values"]
