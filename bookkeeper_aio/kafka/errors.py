"""Kafka's error codes (the numbers every Kafka client knows) and the gateway's exceptions.

Theory of operation
-------------------
A Kafka answer carries an int16 error code per topic partition (or per group). The gateway's
own failures are :class:`KafkaError` exceptions that carry the code to answer with, so a
handler turns any operating error into a code in one place (:func:`code_for`); storage errors
of the layers below (a fenced log, too few bookies, a timeout) map onto the retriable codes
Kafka clients already handle.
"""

from __future__ import annotations

from enum import IntEnum

from ..errors import (
    BookKeeperError,
    MetadataUnavailableError,
    NotEnoughBookiesError,
    OperationTimeoutError,
)


class ErrorCode(IntEnum):
    """Kafka error codes (``org.apache.kafka.common.protocol.Errors``) the gateway answers."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    NOT_ENOUGH_REPLICAS = 19
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REQUEST = 42
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    KAFKA_STORAGE_ERROR = 56
    GROUP_MAX_SIZE_REACHED = 81


class KafkaError(Exception):
    """An operating error answered with a Kafka error code (``code``)."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str = "", code: ErrorCode | None = None) -> None:
        super().__init__(message or self.__class__.__doc__ or self.__class__.__name__)
        if code is not None:
            self.code = code


class UnknownTopicError(KafkaError):
    """No such topic or partition (and auto-creation is off)."""

    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class NotLeaderError(KafkaError):
    """Another gateway owns the partition, or this one was fenced out of its log."""

    code = ErrorCode.NOT_LEADER_OR_FOLLOWER


class NotCoordinatorError(KafkaError):
    """Another gateway coordinates the group."""

    code = ErrorCode.NOT_COORDINATOR


class CorruptBatchError(KafkaError):
    """A record batch failed validation: length, magic, CRC or record count."""

    code = ErrorCode.CORRUPT_MESSAGE


class BatchTooLargeError(KafkaError):
    """A record batch is larger than ``kafka_batch_bytes_max``."""

    code = ErrorCode.MESSAGE_TOO_LARGE


class TopicExistsError(KafkaError):
    """``create-topic`` of a topic that exists."""

    code = ErrorCode.TOPIC_ALREADY_EXISTS


class InvalidTopicError(KafkaError):
    """A topic name Kafka would refuse (empty, '.', '..', over 249 chars, other characters)."""

    code = ErrorCode.INVALID_TOPIC_EXCEPTION


class ProtocolDecodeError(KafkaError):
    """A request's bytes do not decode as the API and version its header names."""

    code = ErrorCode.INVALID_REQUEST


def code_for(exc: BaseException) -> ErrorCode:
    """The Kafka error code to answer for an operating error of this layer or the ones below.

    A partition store raises :class:`NotLeaderError` when another writer fenced its log (the
    producer refreshes its metadata); too few bookies, timeouts and an unreachable metadata
    store are retriable codes; anything else from storage is ``KAFKA_STORAGE_ERROR`` (also
    retriable).
    """
    if isinstance(exc, KafkaError):
        return exc.code
    if isinstance(exc, NotEnoughBookiesError):
        return ErrorCode.NOT_ENOUGH_REPLICAS
    if isinstance(exc, OperationTimeoutError | TimeoutError):
        return ErrorCode.REQUEST_TIMED_OUT
    if isinstance(exc, MetadataUnavailableError):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if isinstance(exc, BookKeeperError):
        return ErrorCode.KAFKA_STORAGE_ERROR
    return ErrorCode.UNKNOWN_SERVER_ERROR
