"""Kafka's error codes and the exception hierarchy every minibroker component shares.

Pure: no I/O. The numbers are Kafka's (clients/.../protocol/Errors.java) and match the
`ErrorCode` enum of proto/minibroker.proto; tests/unit/test_errors.py keeps the two in step.
Each code maps to one exception class; `retriable` says whether a client should refresh metadata
and try again (Kafka's RetriableException subclasses).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minibroker.client.types import TopicPartition


class ErrorCode(enum.IntEnum):
    NONE = 0
    UNKNOWN_SERVER_ERROR = -1
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    INVALID_FETCH_SIZE = 4
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    BROKER_NOT_AVAILABLE = 8
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    NETWORK_EXCEPTION = 13
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    INVALID_REQUEST = 42
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    INVALID_PRODUCER_ID_MAPPING = 49
    OPERATION_NOT_ATTEMPTED = 55
    KAFKA_STORAGE_ERROR = 56
    UNKNOWN_PRODUCER_ID = 59
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    STALE_BROKER_EPOCH = 77
    OFFSET_NOT_AVAILABLE = 78
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    INVALID_RECORD = 87
    INVALID_UPDATE_VERSION = 95
    UNKNOWN_TOPIC_ID = 100
    DUPLICATE_BROKER_REGISTRATION = 101
    BROKER_ID_NOT_REGISTERED = 102
    INCONSISTENT_CLUSTER_ID = 104
    INELIGIBLE_REPLICA = 107
    NEW_LEADER_ELECTED = 108


# Kafka's RetriableException subclasses: a client refreshes metadata and retries these.
RETRIABLE: frozenset[ErrorCode] = frozenset(
    {
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.BROKER_NOT_AVAILABLE,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.NOT_CONTROLLER,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.OFFSET_NOT_AVAILABLE,
        ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
        ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
    }
)


class MiniBrokerError(Exception):
    """Base of every error minibroker raises on purpose. `code` is the Kafka error code."""

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str = "", *, code: ErrorCode | None = None) -> None:
        if code is not None:
            self.code = code
        super().__init__(message or self.code.name)

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE


class RetriableError(MiniBrokerError):
    """An error a client may retry after refreshing metadata."""


_BY_CODE: dict[ErrorCode, type[MiniBrokerError]] = {}


def _define(code: ErrorCode, doc: str) -> type[MiniBrokerError]:
    base = RetriableError if code in RETRIABLE else MiniBrokerError
    name = "".join(part.capitalize() for part in code.name.split("_")) + "Error"
    cls = type(name, (base,), {"code": code, "__doc__": doc, "__module__": __name__})
    _BY_CODE[code] = cls
    return cls


OffsetOutOfRangeError = _define(ErrorCode.OFFSET_OUT_OF_RANGE, "The offset is outside the log.")
CorruptMessageError = _define(ErrorCode.CORRUPT_MESSAGE, "A record batch failed its checks.")
UnknownTopicOrPartitionError = _define(
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "The topic or partition does not exist."
)
InvalidFetchSizeError = _define(ErrorCode.INVALID_FETCH_SIZE, "The fetch size is invalid.")
LeaderNotAvailableError = _define(ErrorCode.LEADER_NOT_AVAILABLE, "The partition has no leader.")
NotLeaderOrFollowerError = _define(
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    "This broker is not the leader (or a follower) of the partition.",
)
RequestTimedOutError = _define(ErrorCode.REQUEST_TIMED_OUT, "The request timed out.")
BrokerNotAvailableError = _define(ErrorCode.BROKER_NOT_AVAILABLE, "The broker is not available.")
ReplicaNotAvailableError = _define(ErrorCode.REPLICA_NOT_AVAILABLE, "The replica is not available.")
MessageTooLargeError = _define(ErrorCode.MESSAGE_TOO_LARGE, "The batch is larger than allowed.")
NetworkExceptionError = _define(ErrorCode.NETWORK_EXCEPTION, "The connection to a peer failed.")
InvalidTopicError = _define(ErrorCode.INVALID_TOPIC_EXCEPTION, "The topic name is invalid.")
RecordListTooLargeError = _define(
    ErrorCode.RECORD_LIST_TOO_LARGE,
    "The batch exceeds the segment, or the request the broker's socket.request.max.bytes.",
)
NotEnoughReplicasError = _define(
    ErrorCode.NOT_ENOUGH_REPLICAS, "The ISR is smaller than min.insync.replicas."
)
NotEnoughReplicasAfterAppendError = _define(
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    "Appended, but the ISR fell below min.insync.replicas before the write was committed.",
)
InvalidRequiredAcksError = _define(ErrorCode.INVALID_REQUIRED_ACKS, "acks must be 0, 1 or all.")
InvalidTimestampError = _define(ErrorCode.INVALID_TIMESTAMP, "The timestamp is invalid.")
UnsupportedVersionError = _define(ErrorCode.UNSUPPORTED_VERSION, "The format is not supported.")
TopicAlreadyExistsError = _define(ErrorCode.TOPIC_ALREADY_EXISTS, "The topic already exists.")
InvalidPartitionsError = _define(ErrorCode.INVALID_PARTITIONS, "The partition count is invalid.")
InvalidReplicationFactorError = _define(
    ErrorCode.INVALID_REPLICATION_FACTOR, "The replication factor is invalid."
)
InvalidReplicaAssignmentError = _define(
    ErrorCode.INVALID_REPLICA_ASSIGNMENT, "The replica assignment is invalid."
)
InvalidConfigError = _define(ErrorCode.INVALID_CONFIG, "A configuration is unknown or invalid.")
NotControllerError = _define(ErrorCode.NOT_CONTROLLER, "This is not the active controller.")
InvalidRequestError = _define(ErrorCode.INVALID_REQUEST, "The request is invalid.")
PolicyViolationError = _define(ErrorCode.POLICY_VIOLATION, "The request violates a policy.")
OutOfOrderSequenceError = _define(
    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, "The broker saw a gap in the producer's sequence."
)
DuplicateSequenceError = _define(
    ErrorCode.DUPLICATE_SEQUENCE_NUMBER, "The batch duplicates one the broker already has."
)
InvalidProducerEpochError = _define(ErrorCode.INVALID_PRODUCER_EPOCH, "The producer is fenced.")
InvalidProducerIdMappingError = _define(
    ErrorCode.INVALID_PRODUCER_ID_MAPPING, "The producer id is unknown."
)
OperationNotAttemptedError = _define(
    ErrorCode.OPERATION_NOT_ATTEMPTED, "The operation was not attempted."
)
KafkaStorageError = _define(ErrorCode.KAFKA_STORAGE_ERROR, "The broker's disk failed.")
UnknownProducerIdError = _define(ErrorCode.UNKNOWN_PRODUCER_ID, "The producer id is unknown.")
FencedLeaderEpochError = _define(
    ErrorCode.FENCED_LEADER_EPOCH, "The request's leader epoch is older than the broker's."
)
UnknownLeaderEpochError = _define(
    ErrorCode.UNKNOWN_LEADER_EPOCH, "The request's leader epoch is newer than the broker's."
)
StaleBrokerEpochError = _define(ErrorCode.STALE_BROKER_EPOCH, "The broker epoch is stale.")
OffsetNotAvailableError = _define(
    ErrorCode.OFFSET_NOT_AVAILABLE,
    "The new leader's high watermark has not caught up yet; retry shortly.",
)
PreferredLeaderNotAvailableError = _define(
    ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE, "The preferred leader is not in the ISR or not alive."
)
EligibleLeadersNotAvailableError = _define(
    ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, "No replica can be elected leader."
)
ElectionNotNeededError = _define(
    ErrorCode.ELECTION_NOT_NEEDED, "The leader is already the one asked."
)
InvalidRecordError = _define(ErrorCode.INVALID_RECORD, "A record is invalid.")
InvalidUpdateVersionError = _define(
    ErrorCode.INVALID_UPDATE_VERSION, "The partition epoch is stale (compare-and-set failed)."
)
UnknownTopicIdError = _define(ErrorCode.UNKNOWN_TOPIC_ID, "The topic id is unknown.")
DuplicateBrokerRegistrationError = _define(
    ErrorCode.DUPLICATE_BROKER_REGISTRATION, "Another live process is registered with this node id."
)
BrokerIdNotRegisteredError = _define(
    ErrorCode.BROKER_ID_NOT_REGISTERED, "The broker is not registered."
)
InconsistentClusterIdError = _define(
    ErrorCode.INCONSISTENT_CLUSTER_ID, "The data dir belongs to another cluster."
)
IneligibleReplicaError = _define(
    ErrorCode.INELIGIBLE_REPLICA, "A proposed ISR member is fenced, shutting down or stale."
)
NewLeaderElectedError = _define(ErrorCode.NEW_LEADER_ELECTED, "A new leader was elected.")
UnknownServerError = _define(ErrorCode.UNKNOWN_SERVER_ERROR, "An unexpected server error.")


class LogTruncationError(OffsetOutOfRangeError):  # type: ignore[misc,valid-type]
    """The log was truncated below the consumer's position: records it already returned are
    gone from the partition's new leader (an unclean election). Kafka's LogTruncationException
    (KIP-320), raised from poll() when auto_offset_reset is 'none'.

    `divergent_offsets` maps each partition to the first offset known to diverge (where the
    epoch of the last returned record ends on the new leader), or None when the new leader
    knows nothing of that epoch; seek() to go on.
    """

    def __init__(
        self, message: str, divergent_offsets: Mapping[TopicPartition, int | None]
    ) -> None:
        super().__init__(message)
        self.divergent_offsets: dict[TopicPartition, int | None] = dict(divergent_offsets)


def error_for(code: int, message: str = "") -> MiniBrokerError:
    """The exception for a wire error code (an unknown code becomes UnknownServerError)."""
    try:
        ec = ErrorCode(code)
    except ValueError:
        return UnknownServerError(f"unknown error code {code}: {message}")
    cls = _BY_CODE.get(ec, UnknownServerError)
    return cls(message or ec.name)


def raise_for(code: int, message: str = "") -> None:
    """Raise the exception for `code` unless it is NONE."""
    if code != ErrorCode.NONE:
        raise error_for(code, message)
