"""Status codes on the wire and the exception tree of bookkeeper-aio.

Theory of operation
-------------------
A bookie answers every request with a :class:`StatusCode`. The numbers mirror BookKeeper's v2
binary protocol (``BookieProtocol.java``) so that logs read the same; ``BAD_DIGEST`` is ours
(BP-31's end-to-end checksum: the bookie verifies the writer's digest before storing).

BookKeeper's one sacred distinction (BP-46, "A note on Response Codes"): only
``NO_SUCH_LEDGER`` and ``NO_SUCH_ENTRY`` are **explicit negatives**. Every other non-OK answer,
a timeout or a broken connection is **unknown**: the entry may or may not be there. Recovery
may truncate a ledger only on explicit negatives, so :func:`is_explicit_negative` is the one
place that decides it.

Operating errors are exceptions of the :class:`BookKeeperError` tree, each carrying a client
error ``code`` in BookKeeper's numbering (``BKException.Code``) and, when a bookie said it, the
wire ``status``. Programmer errors are ``assert``.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .metadata.model import Versioned


class StatusCode(IntEnum):
    """A bookie's answer to one request (v2 numbering of BookKeeper, plus BAD_DIGEST)."""

    OK = 0
    NO_SUCH_LEDGER = 1
    NO_SUCH_ENTRY = 2
    BAD_REQUEST = 100
    IO_ERROR = 101
    UNAUTHORIZED = 102
    BAD_VERSION = 103
    FENCED = 104
    READ_ONLY = 105
    TOO_MANY_REQUESTS = 106
    UNKNOWN = 107  # EUNKNOWNLEDGERSTATE: the ledger is in limbo, a missing entry may have existed
    BAD_DIGEST = 108


EXPLICIT_NEGATIVES = frozenset({StatusCode.NO_SUCH_LEDGER, StatusCode.NO_SUCH_ENTRY})


def is_explicit_negative(status: int) -> bool:
    """True only for NO_SUCH_LEDGER and NO_SUCH_ENTRY: the bookie positively lacks the data."""
    return status in EXPLICIT_NEGATIVES


class BookKeeperError(Exception):
    """Base of every operating error. ``code`` is BookKeeper's client code (BKException.Code)."""

    code: int = -999  # UnexpectedConditionException
    status: StatusCode | None = None

    def __init__(self, message: str = "", *, status: StatusCode | None = None) -> None:
        super().__init__(message or self.__class__.__doc__ or self.__class__.__name__)
        if status is not None:
            self.status = status


# --- errors a bookie reports through a status code ---------------------------------------


class BookieStatusError(BookKeeperError):
    """A bookie answered with a non-OK status."""


class NoSuchLedgerError(BookieStatusError):
    """The bookie holds no such ledger (explicit negative)."""

    code = -7
    status = StatusCode.NO_SUCH_LEDGER


class NoSuchEntryError(BookieStatusError):
    """The bookie holds no such entry (explicit negative)."""

    code = -13
    status = StatusCode.NO_SUCH_ENTRY


class BadRequestError(BookieStatusError):
    """The request was malformed or not supported."""

    code = -100  # IllegalOpException
    status = StatusCode.BAD_REQUEST


class BookieIOError(BookieStatusError):
    """The bookie failed to read or write its disks."""

    code = -12  # WriteException / ReadException
    status = StatusCode.IO_ERROR


class UnauthorizedError(BookieStatusError):
    """Wrong password: the master key does not match the one stored with the ledger."""

    code = -102
    status = StatusCode.UNAUTHORIZED


class ProtocolVersionError(BookieStatusError):
    """The peer speaks another protocol version."""

    code = -16
    status = StatusCode.BAD_VERSION


class LedgerFencedError(BookieStatusError):
    """The ledger is fenced: the add may or may not have been written (treat like a timeout)."""

    code = -101
    status = StatusCode.FENCED


class ReadOnlyBookieError(BookieStatusError):
    """The bookie is read-only (a ledger dir crossed its disk-usage threshold)."""

    code = -104
    status = StatusCode.READ_ONLY


class TooManyRequestsError(BookieStatusError):
    """The bookie is over one of its limits; back off and retry."""

    code = -105
    status = StatusCode.TOO_MANY_REQUESTS


class DataUnknownError(BookieStatusError):
    """The ledger is in limbo on that bookie: a missing entry may have existed."""

    code = -108
    status = StatusCode.UNKNOWN


class BadDigestError(BookieStatusError):
    """An entry's digest does not match its contents."""

    code = -5  # DigestMatchException
    status = StatusCode.BAD_DIGEST


_BY_STATUS: dict[StatusCode, type[BookieStatusError]] = {
    cls.status: cls
    for cls in (
        NoSuchLedgerError,
        NoSuchEntryError,
        BadRequestError,
        BookieIOError,
        UnauthorizedError,
        ProtocolVersionError,
        LedgerFencedError,
        ReadOnlyBookieError,
        TooManyRequestsError,
        DataUnknownError,
        BadDigestError,
    )
}


def error_for_status(status: int, message: str = "") -> BookKeeperError:
    """The exception for a non-OK wire status. A bookie that says OK in an error answer, or
    a number no bookie sends, is not making sense: that is a :class:`ProtocolError` (which a
    client treats like a broken connection), never an assertion or a guess."""
    try:
        code = StatusCode(status)
    except (ValueError, TypeError):
        return ProtocolError(f"bookie answered an unknown status {status!r:.20}: {message}")
    if code is StatusCode.OK:
        return ProtocolError(f"bookie answered an error with status OK: {message}")
    return _BY_STATUS[code](message or f"bookie answered {code.name}")


KNOWN_STATUSES = frozenset(int(code) for code in StatusCode)


# --- errors of the local side -----------------------------------------------------------


class ProtocolError(BookKeeperError):
    """The byte stream is not a valid frame sequence (garbage, oversize, wrong types)."""

    code = -16


class FrameTooLargeError(ProtocolError):
    """A frame's declared length exceeds the configured frame_bytes_max."""


class BookieUnavailableError(BookKeeperError):
    """The bookie could not be reached or the connection broke (unknown outcome)."""

    code = -8  # BookieHandleNotAvailableException


class OperationTimeoutError(BookKeeperError):
    """An operation did not complete within its deadline (unknown outcome)."""

    code = -23


class ClientClosedError(BookKeeperError):
    """The client or connection was closed while the operation was pending."""

    code = -19


class ConfigError(BookKeeperError):
    """A configuration value is missing, unknown or out of range."""

    code = -14  # IncorrectParameterException


class IncorrectParameterError(BookKeeperError):
    """An argument is out of range (for example E >= WQ >= AQ >= 1 does not hold)."""

    code = -14


class JournalFailedError(BookKeeperError):
    """The bookie's journal could not write or sync; the bookie stops (fail-stop)."""

    code = -12


# --- metadata and ledger-level errors -----------------------------------------------------


class MetadataVersionError(BookKeeperError):
    """A compare-and-swap lost: the metadata changed since it was read.

    ``current`` is the value now in the store (a ``Versioned``), or None if it was deleted.
    """

    code = -17

    def __init__(self, message: str = "", *, current: Versioned[Any] | None = None) -> None:
        super().__init__(message)
        self.current = current


class MetadataUnavailableError(BookKeeperError):
    """The metadata store cannot be reached (the message names the endpoints)."""

    code = -18


class LeaseNotFoundError(MetadataUnavailableError):
    """The metadata store no longer knows a lease (it expired or was revoked)."""


class LedgerClosedError(BookKeeperError):
    """The ledger is closed: nothing more can be appended."""

    code = -11


class WriteQuorumTimeoutError(OperationTimeoutError):
    """Guaranteed write quorum: entries could not reach the write quorum (within
    ``close_timeout_s``, or a pinned bookie kept failing). The writer stops and the ledger
    stays OPEN: a recovery closes it once enough bookies are back (docs/protocol.md)."""


class NotEnoughBookiesError(BookKeeperError):
    """Too few writable bookies satisfy the ensemble and placement constraints."""

    code = -6


class LedgerRecoveryError(BookKeeperError):
    """Recovery could not decide the ledger's end (retry later; nothing was truncated)."""

    code = -10


class ReadError(BookKeeperError):
    """No replica could return a good copy of an entry."""

    code = -1


class MetadataFormatError(BookKeeperError, ValueError):
    """A stored metadata value is not valid (corrupt, or written by an unknown format version)."""

    code = -107  # MetadataSerializationException


class IllegalLedgerTransitionError(IncorrectParameterError):
    """A metadata change the ledger state machine forbids (e.g. changing a CLOSED ledger)."""


class LedgerNotArchivedError(BookKeeperError):
    """The cluster requires archival before delete (``cluster-config
    require-archival-before-delete true``) and the ledger's archival bit is not set: nothing
    was changed (BP-31 "Archival bit")."""

    code = -26  # no BookKeeper equivalent: a refusal of this project


class LedgerOfLogError(IncorrectParameterError):
    """The ledger belongs to a log: delete or truncate the log instead (docs/logs.md)."""


# --- logs (bookkeeper_aio/logs, docs/logs.md) -------------------------------------------


class LogFencedError(BookKeeperError):
    """Another writer took the log over: this writer's appends stop (an append that got this
    error may or may not be in the log, as with LedgerFencedError)."""

    code = -101


class NoSuchLogError(BookKeeperError):
    """No log of that name (or it is being deleted)."""

    code = -25


class LogExistsError(BookKeeperError):
    """A log of that name exists already."""

    code = -20


class LogTruncatedError(IncorrectParameterError):
    """An offset below the first one the log still keeps (truncation or retention removed it).

    ``start_offset`` is the first offset still kept.
    """

    def __init__(self, message: str = "", *, start_offset: int = 0) -> None:
        super().__init__(message)
        self.start_offset = start_offset


class LogPropertyConflictError(BookKeeperError):
    """A log's property does not hold the value a conditional change expected (another
    writer changed it first, e.g. a stream batch committed by another run)."""

    code = -103


# --- Spark pipeline (bookkeeper_aio/spark, docs/spark.md) ---------------------------------


class SparkJobError(BookKeeperError):
    """A Spark job's write cannot go on: the job is no longer open (committed, aborted or
    cleaned up), or what its tasks recorded does not make a whole job."""

    code = -102


class SparkInputError(IncorrectParameterError):
    """A DataFrame or row the sink cannot write: no ``value`` column, a value that is neither
    binary nor a string, or a null value (the message names the partition and row index)."""
