"""Named logs built from chained ledgers (docs/logs.md).

One writer at a time (an epoch and the fencing of the previous writer's ledger), dense offsets
across ledgers, tailing readers with bounded read-ahead, cursors, truncation and retention.
The metadata of a log is one key (``logs/<name>``) changed by compare-and-swap only.

Modules, each one concept: ``options`` (names, key layout, creation options), ``model``
(the pure metadata and its transforms), ``keys`` (the key and the compare-and-swap loop),
``takeover`` (how a writer takes a log over), ``segment`` (a writer's states and its ledger as
offsets), ``writer`` and ``rollover`` (the writer), ``reader``, ``admin`` (create, describe,
delete, truncate, retention, cursors, appending ledgers), ``api`` (``Logs``, what
``BookKeeper``'s log methods delegate to).
"""

from .admin import LogInfo, LogSegmentInfo
from .api import LOG_PASSWORD, LOG_TAG, Logs
from .model import LogMetadata, LogSegment, SegmentState
from .options import LogOptions
from .reader import LogReader, LogRecord
from .segment import WriterState
from .writer import LogWriter

__all__ = [
    "LOG_PASSWORD",
    "LOG_TAG",
    "LogInfo",
    "LogMetadata",
    "LogOptions",
    "LogReader",
    "LogRecord",
    "LogSegment",
    "LogSegmentInfo",
    "LogWriter",
    "Logs",
    "SegmentState",
    "WriterState",
]
