"""Kafka's error codes and the exception hierarchy every minibroker component shares.

Pure: no I/O. The numbers are Kafka's (clients/.../protocol/Errors.java) and match the
`ErrorCode` enum of proto/minibroker.proto; tests/unit/test_proto.py keeps the two in step.
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
    OFFSET_METADATA_TOO_LARGE = 12
    NETWORK_EXCEPTION = 13
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    INVALID_COMMIT_OFFSET_SIZE = 28
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
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
    SECURITY_DISABLED = 54
    OPERATION_NOT_ATTEMPTED = 55
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    UNKNOWN_PRODUCER_ID = 59
    REASSIGNMENT_IN_PROGRESS = 60
    INCONSISTENT_VOTER_SET = 68
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    STALE_BROKER_EPOCH = 77
    OFFSET_NOT_AVAILABLE = 78
    MEMBER_ID_REQUIRED = 79
    PREFERRED_LEADER_NOT_AVAILABLE = 80
    FENCED_INSTANCE_ID = 82
    ELIGIBLE_LEADERS_NOT_AVAILABLE = 83
    ELECTION_NOT_NEEDED = 84
    NO_REASSIGNMENT_IN_PROGRESS = 85
    INVALID_RECORD = 87
    RESOURCE_NOT_FOUND = 91
    DUPLICATE_RESOURCE = 92
    UNACCEPTABLE_CREDENTIAL = 93
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
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.NOT_CONTROLLER,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.FETCH_SESSION_ID_NOT_FOUND,
        ErrorCode.INVALID_FETCH_SESSION_EPOCH,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.OFFSET_NOT_AVAILABLE,
        ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
        ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
    }
)


# The exception class for each code, filled by `MiniBrokerError.__init_subclass__` as the classes
# below are defined; `error_for` looks codes up here.
_BY_CODE: dict[ErrorCode, type[MiniBrokerError]] = {}


class MiniBrokerError(Exception):
    """Base of every error minibroker raises on purpose. `code` is the Kafka error code.

    Each class of this module that sets `code` is THE class for that code (`error_for`), and
    derives from RetriableError exactly when the code is in RETRIABLE (checked as it is defined).
    Subclasses that refine a code without setting it (LogTruncationError) are not registered.
    """

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        code = cls.__dict__.get("code")
        if cls.__module__ != __name__ or code is None:
            return
        if issubclass(cls, RetriableError) != (code in RETRIABLE):
            raise TypeError(f"{cls.__name__}: RetriableError base must match RETRIABLE for {code}")
        _BY_CODE.setdefault(code, cls)

    def __init__(self, message: str = "", *, code: ErrorCode | None = None) -> None:
        if code is not None:
            self.code = code
        super().__init__(message or self.code.name)

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE


class ClientClosedError(MiniBrokerError, RuntimeError):
    """The producer, consumer or admin client was closed; create a new one to continue."""


class RetriableError(MiniBrokerError):
    """An error a client may retry after refreshing metadata."""


class OffsetOutOfRangeError(MiniBrokerError):
    """The offset is outside the log."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE


class CorruptMessageError(RetriableError):
    """A record batch failed its checks."""

    code = ErrorCode.CORRUPT_MESSAGE


class UnknownTopicOrPartitionError(RetriableError):
    """The topic or partition does not exist."""

    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


class InvalidFetchSizeError(MiniBrokerError):
    """The fetch size is invalid."""

    code = ErrorCode.INVALID_FETCH_SIZE


class LeaderNotAvailableError(RetriableError):
    """The partition has no leader."""

    code = ErrorCode.LEADER_NOT_AVAILABLE


class NotLeaderOrFollowerError(RetriableError):
    """This broker is not the leader (or a follower) of the partition."""

    code = ErrorCode.NOT_LEADER_OR_FOLLOWER


class RequestTimedOutError(RetriableError):
    """The request timed out."""

    code = ErrorCode.REQUEST_TIMED_OUT


class BrokerNotAvailableError(RetriableError):
    """The broker is not available."""

    code = ErrorCode.BROKER_NOT_AVAILABLE


class ReplicaNotAvailableError(RetriableError):
    """The replica is not available."""

    code = ErrorCode.REPLICA_NOT_AVAILABLE


class MessageTooLargeError(MiniBrokerError):
    """The batch is larger than allowed."""

    code = ErrorCode.MESSAGE_TOO_LARGE


class NetworkExceptionError(RetriableError):
    """The connection to a peer failed."""

    code = ErrorCode.NETWORK_EXCEPTION


class InvalidTopicError(MiniBrokerError):
    """The topic name is invalid."""

    code = ErrorCode.INVALID_TOPIC_EXCEPTION


class RecordListTooLargeError(MiniBrokerError):
    """The batch exceeds the segment, or the request the broker's socket.request.max.bytes."""

    code = ErrorCode.RECORD_LIST_TOO_LARGE


class NotEnoughReplicasError(RetriableError):
    """The ISR is smaller than min.insync.replicas."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS


class NotEnoughReplicasAfterAppendError(RetriableError):
    """Appended, but the ISR fell below min.insync.replicas before the write was committed."""

    code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


class InvalidRequiredAcksError(MiniBrokerError):
    """acks must be 0, 1 or all."""

    code = ErrorCode.INVALID_REQUIRED_ACKS


class InvalidTimestampError(MiniBrokerError):
    """The timestamp is invalid."""

    code = ErrorCode.INVALID_TIMESTAMP


class UnsupportedVersionError(MiniBrokerError):
    """The format is not supported."""

    code = ErrorCode.UNSUPPORTED_VERSION


class TopicAlreadyExistsError(MiniBrokerError):
    """The topic already exists."""

    code = ErrorCode.TOPIC_ALREADY_EXISTS


class InvalidPartitionsError(MiniBrokerError):
    """The partition count is invalid."""

    code = ErrorCode.INVALID_PARTITIONS


class InvalidReplicationFactorError(MiniBrokerError):
    """The replication factor is invalid."""

    code = ErrorCode.INVALID_REPLICATION_FACTOR


class InvalidReplicaAssignmentError(MiniBrokerError):
    """The replica assignment is invalid."""

    code = ErrorCode.INVALID_REPLICA_ASSIGNMENT


class InvalidConfigError(MiniBrokerError):
    """A configuration is unknown or invalid."""

    code = ErrorCode.INVALID_CONFIG


class NotControllerError(RetriableError):
    """This is not the active controller."""

    code = ErrorCode.NOT_CONTROLLER


class InvalidRequestError(MiniBrokerError):
    """The request is invalid."""

    code = ErrorCode.INVALID_REQUEST


class PolicyViolationError(MiniBrokerError):
    """The request violates a policy."""

    code = ErrorCode.POLICY_VIOLATION


class OutOfOrderSequenceError(MiniBrokerError):
    """The broker saw a gap in the producer's sequence."""

    code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


class DuplicateSequenceError(MiniBrokerError):
    """The batch duplicates one the broker already has."""

    code = ErrorCode.DUPLICATE_SEQUENCE_NUMBER


class InvalidProducerEpochError(MiniBrokerError):
    """The producer is fenced."""

    code = ErrorCode.INVALID_PRODUCER_EPOCH


class InvalidProducerIdMappingError(MiniBrokerError):
    """The producer id is unknown."""

    code = ErrorCode.INVALID_PRODUCER_ID_MAPPING


class OperationNotAttemptedError(MiniBrokerError):
    """The operation was not attempted."""

    code = ErrorCode.OPERATION_NOT_ATTEMPTED


class KafkaStorageError(RetriableError):
    """The broker's disk failed."""

    code = ErrorCode.KAFKA_STORAGE_ERROR


class UnknownProducerIdError(MiniBrokerError):
    """The producer id is unknown."""

    code = ErrorCode.UNKNOWN_PRODUCER_ID


class FencedLeaderEpochError(RetriableError):
    """The request's leader epoch is older than the broker's."""

    code = ErrorCode.FENCED_LEADER_EPOCH


class UnknownLeaderEpochError(RetriableError):
    """The request's leader epoch is newer than the broker's."""

    code = ErrorCode.UNKNOWN_LEADER_EPOCH


class FetchSessionIdNotFoundError(RetriableError):
    """The fetch session is not (or no longer) in the broker's cache; send a full request."""

    code = ErrorCode.FETCH_SESSION_ID_NOT_FOUND


class InvalidFetchSessionEpochError(RetriableError):
    """The fetch session epoch is not the one the broker expects; send a full request."""

    code = ErrorCode.INVALID_FETCH_SESSION_EPOCH


class StaleBrokerEpochError(MiniBrokerError):
    """The broker epoch is stale."""

    code = ErrorCode.STALE_BROKER_EPOCH


class OffsetNotAvailableError(RetriableError):
    """The new leader's high watermark has not caught up yet; retry shortly."""

    code = ErrorCode.OFFSET_NOT_AVAILABLE


class PreferredLeaderNotAvailableError(RetriableError):
    """The preferred leader is not in the ISR or not alive."""

    code = ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE


class EligibleLeadersNotAvailableError(RetriableError):
    """No replica can be elected leader."""

    code = ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE


class ElectionNotNeededError(MiniBrokerError):
    """The leader is already the one asked."""

    code = ErrorCode.ELECTION_NOT_NEEDED


class ReassignmentInProgressError(MiniBrokerError):
    """The partition is being reassigned already (cancel it first)."""

    code = ErrorCode.REASSIGNMENT_IN_PROGRESS


class NoReassignmentInProgressError(MiniBrokerError):
    """A cancel named a partition that is not being reassigned."""

    code = ErrorCode.NO_REASSIGNMENT_IN_PROGRESS


class InvalidRecordError(MiniBrokerError):
    """A record is invalid."""

    code = ErrorCode.INVALID_RECORD


class TopicAuthorizationFailedError(MiniBrokerError):
    """The principal may not do this to the topic (no ACL allows it, or one denies it)."""

    code = ErrorCode.TOPIC_AUTHORIZATION_FAILED


class GroupAuthorizationFailedError(MiniBrokerError):
    """The principal may not do this to the group."""

    code = ErrorCode.GROUP_AUTHORIZATION_FAILED


class ClusterAuthorizationFailedError(MiniBrokerError):
    """The principal may not do this to the cluster (or act as the node it names)."""

    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


class UnsupportedSaslMechanismError(MiniBrokerError):
    """The listener does not take this SASL mechanism."""

    code = ErrorCode.UNSUPPORTED_SASL_MECHANISM


class SecurityDisabledError(MiniBrokerError):
    """The request needs a security feature the cluster does not have on (e.g. no authorizer)."""

    code = ErrorCode.SECURITY_DISABLED


class SaslAuthenticationFailedError(MiniBrokerError):
    """The user name or password is wrong, or the user does not exist."""

    code = ErrorCode.SASL_AUTHENTICATION_FAILED


class ResourceNotFoundError(MiniBrokerError):
    """The resource (e.g. a user's credential) does not exist."""

    code = ErrorCode.RESOURCE_NOT_FOUND


class DuplicateResourceError(MiniBrokerError):
    """The request names the same resource twice."""

    code = ErrorCode.DUPLICATE_RESOURCE


class UnacceptableCredentialError(MiniBrokerError):
    """The credential is not acceptable (empty name, too few iterations, ...)."""

    code = ErrorCode.UNACCEPTABLE_CREDENTIAL


class InvalidUpdateVersionError(MiniBrokerError):
    """The partition epoch is stale (compare-and-set failed)."""

    code = ErrorCode.INVALID_UPDATE_VERSION


class UnknownTopicIdError(MiniBrokerError):
    """The topic id is unknown."""

    code = ErrorCode.UNKNOWN_TOPIC_ID


class DuplicateBrokerRegistrationError(MiniBrokerError):
    """Another live process is registered with this node id."""

    code = ErrorCode.DUPLICATE_BROKER_REGISTRATION


class BrokerIdNotRegisteredError(MiniBrokerError):
    """The broker is not registered."""

    code = ErrorCode.BROKER_ID_NOT_REGISTERED


class InconsistentClusterIdError(MiniBrokerError):
    """The data dir belongs to another cluster."""

    code = ErrorCode.INCONSISTENT_CLUSTER_ID


class InconsistentVoterSetError(MiniBrokerError):
    """A controller's `controller.quorum.voters` differs from the quorum's (KIP-595)."""

    code = ErrorCode.INCONSISTENT_VOTER_SET


class IneligibleReplicaError(MiniBrokerError):
    """A proposed ISR member is fenced, shutting down or stale."""

    code = ErrorCode.INELIGIBLE_REPLICA


class NewLeaderElectedError(MiniBrokerError):
    """A new leader was elected."""

    code = ErrorCode.NEW_LEADER_ELECTED


class UnknownServerError(MiniBrokerError):
    """An unexpected server error."""

    code = ErrorCode.UNKNOWN_SERVER_ERROR


class LogTruncationError(OffsetOutOfRangeError):
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


# -- consumer groups (Kafka's group coordinator codes) ---------------------------------------


class OffsetMetadataTooLargeError(MiniBrokerError):
    """A committed offset's metadata is longer than offset.metadata.max.bytes."""

    code = ErrorCode.OFFSET_METADATA_TOO_LARGE


class CoordinatorLoadInProgressError(RetriableError):
    """The group coordinator is still loading the group's offsets partition."""

    code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS


class CoordinatorNotAvailableError(RetriableError):
    """The group coordinator is not available (no leader for its offsets partition yet)."""

    code = ErrorCode.COORDINATOR_NOT_AVAILABLE


class NotCoordinatorError(RetriableError):
    """This broker is not the group's coordinator: find the coordinator again."""

    code = ErrorCode.NOT_COORDINATOR


class IllegalGenerationError(MiniBrokerError):
    """The group's generation moved on: rejoin the group."""

    code = ErrorCode.ILLEGAL_GENERATION


class InconsistentGroupProtocolError(MiniBrokerError):
    """The member's protocols share none with the group's (or its protocol type differs)."""

    code = ErrorCode.INCONSISTENT_GROUP_PROTOCOL


class InvalidGroupIdError(MiniBrokerError):
    """The group id is empty or invalid."""

    code = ErrorCode.INVALID_GROUP_ID


class UnknownMemberIdError(MiniBrokerError):
    """The coordinator does not know this member id: rejoin with an empty one."""

    code = ErrorCode.UNKNOWN_MEMBER_ID


class InvalidSessionTimeoutError(MiniBrokerError):
    """session.timeout.ms is outside group.min/max.session.timeout.ms of the broker."""

    code = ErrorCode.INVALID_SESSION_TIMEOUT


class RebalanceInProgressError(MiniBrokerError):
    """The group is rebalancing: rejoin."""

    code = ErrorCode.REBALANCE_IN_PROGRESS


class InvalidCommitOffsetSizeError(MiniBrokerError):
    """The offset commit request is too large."""

    code = ErrorCode.INVALID_COMMIT_OFFSET_SIZE


class MemberIdRequiredError(MiniBrokerError):
    """The coordinator gave the member an id: join again with it (KIP-394)."""

    code = ErrorCode.MEMBER_ID_REQUIRED


class FencedInstanceIdError(MiniBrokerError):
    """Another member with the same group.instance.id joined."""

    code = ErrorCode.FENCED_INSTANCE_ID


class GroupError(MiniBrokerError):
    """A group coordinator answer whose Kafka code this module has no class for (such as
    NON_EMPTY_GROUP 68 or GROUP_ID_NOT_FOUND 69); `kafka_code` holds it."""

    def __init__(self, message: str = "", *, kafka_code: int = -1) -> None:
        super().__init__(message)
        self.kafka_code = kafka_code


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


# Refusals of who the caller is or what it may do: never retried (Kafka's are not retriable),
# whether they come as an error code or as a gRPC status (UNAUTHENTICATED, PERMISSION_DENIED).
REFUSALS: tuple[type[MiniBrokerError], ...] = (
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    ClusterAuthorizationFailedError,
    SaslAuthenticationFailedError,
)
