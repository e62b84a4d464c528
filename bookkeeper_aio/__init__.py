"""bookkeeper-aio: an asyncio re-implementation of Apache BookKeeper.

from bookkeeper_aio import BookKeeper
async with BookKeeper.connect("etcd://127.0.0.1:2379/bookkeeper") as bk:
    w = await bk.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw")
    await w.append(b"payload")
"""

from .client.bookkeeper import BookKeeper
from .client.context import LedgerEntry
from .client.reader import LedgerReader
from .client.writer import LedgerWriter
from .config import BookieConfig, ClientConfig, MetadataConfig
from .errors import (
    BadDigestError,
    BookieUnavailableError,
    BookKeeperError,
    ClientClosedError,
    IncorrectParameterError,
    LedgerClosedError,
    LedgerFencedError,
    LedgerNotArchivedError,
    LedgerOfLogError,
    LedgerRecoveryError,
    LogExistsError,
    LogFencedError,
    LogPropertyConflictError,
    LogTruncatedError,
    MetadataUnavailableError,
    MetadataVersionError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NoSuchLogError,
    NotEnoughBookiesError,
    OperationTimeoutError,
    ReadError,
    UnauthorizedError,
)
from .logs import LogInfo, LogReader, LogRecord, LogSegmentInfo, LogWriter

__all__ = [
    "BadDigestError",
    "BookKeeper",
    "BookKeeperError",
    "BookieConfig",
    "BookieUnavailableError",
    "ClientClosedError",
    "ClientConfig",
    "IncorrectParameterError",
    "LedgerClosedError",
    "LedgerEntry",
    "LedgerFencedError",
    "LedgerNotArchivedError",
    "LedgerOfLogError",
    "LedgerReader",
    "LedgerRecoveryError",
    "LedgerWriter",
    "LogExistsError",
    "LogFencedError",
    "LogInfo",
    "LogPropertyConflictError",
    "LogReader",
    "LogRecord",
    "LogSegmentInfo",
    "LogTruncatedError",
    "LogWriter",
    "MetadataConfig",
    "MetadataUnavailableError",
    "MetadataVersionError",
    "NoSuchEntryError",
    "NoSuchLedgerError",
    "NoSuchLogError",
    "NotEnoughBookiesError",
    "OperationTimeoutError",
    "ReadError",
    "UnauthorizedError",
]
