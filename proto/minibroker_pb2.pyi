from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONE: _ClassVar[ErrorCode]
    UNKNOWN_SERVER_ERROR: _ClassVar[ErrorCode]
    OFFSET_OUT_OF_RANGE: _ClassVar[ErrorCode]
    CORRUPT_MESSAGE: _ClassVar[ErrorCode]
    UNKNOWN_TOPIC_OR_PARTITION: _ClassVar[ErrorCode]
    INVALID_FETCH_SIZE: _ClassVar[ErrorCode]
    LEADER_NOT_AVAILABLE: _ClassVar[ErrorCode]
    NOT_LEADER_OR_FOLLOWER: _ClassVar[ErrorCode]
    REQUEST_TIMED_OUT: _ClassVar[ErrorCode]
    BROKER_NOT_AVAILABLE: _ClassVar[ErrorCode]
    REPLICA_NOT_AVAILABLE: _ClassVar[ErrorCode]
    MESSAGE_TOO_LARGE: _ClassVar[ErrorCode]
    OFFSET_METADATA_TOO_LARGE: _ClassVar[ErrorCode]
    NETWORK_EXCEPTION: _ClassVar[ErrorCode]
    COORDINATOR_LOAD_IN_PROGRESS: _ClassVar[ErrorCode]
    COORDINATOR_NOT_AVAILABLE: _ClassVar[ErrorCode]
    NOT_COORDINATOR: _ClassVar[ErrorCode]
    INVALID_TOPIC_EXCEPTION: _ClassVar[ErrorCode]
    RECORD_LIST_TOO_LARGE: _ClassVar[ErrorCode]
    NOT_ENOUGH_REPLICAS: _ClassVar[ErrorCode]
    NOT_ENOUGH_REPLICAS_AFTER_APPEND: _ClassVar[ErrorCode]
    INVALID_REQUIRED_ACKS: _ClassVar[ErrorCode]
    ILLEGAL_GENERATION: _ClassVar[ErrorCode]
    INCONSISTENT_GROUP_PROTOCOL: _ClassVar[ErrorCode]
    INVALID_GROUP_ID: _ClassVar[ErrorCode]
    UNKNOWN_MEMBER_ID: _ClassVar[ErrorCode]
    INVALID_SESSION_TIMEOUT: _ClassVar[ErrorCode]
    REBALANCE_IN_PROGRESS: _ClassVar[ErrorCode]
    INVALID_COMMIT_OFFSET_SIZE: _ClassVar[ErrorCode]
    TOPIC_AUTHORIZATION_FAILED: _ClassVar[ErrorCode]
    GROUP_AUTHORIZATION_FAILED: _ClassVar[ErrorCode]
    CLUSTER_AUTHORIZATION_FAILED: _ClassVar[ErrorCode]
    INVALID_TIMESTAMP: _ClassVar[ErrorCode]
    UNSUPPORTED_SASL_MECHANISM: _ClassVar[ErrorCode]
    UNSUPPORTED_VERSION: _ClassVar[ErrorCode]
    TOPIC_ALREADY_EXISTS: _ClassVar[ErrorCode]
    INVALID_PARTITIONS: _ClassVar[ErrorCode]
    INVALID_REPLICATION_FACTOR: _ClassVar[ErrorCode]
    INVALID_REPLICA_ASSIGNMENT: _ClassVar[ErrorCode]
    INVALID_CONFIG: _ClassVar[ErrorCode]
    NOT_CONTROLLER: _ClassVar[ErrorCode]
    INVALID_REQUEST: _ClassVar[ErrorCode]
    POLICY_VIOLATION: _ClassVar[ErrorCode]
    OUT_OF_ORDER_SEQUENCE_NUMBER: _ClassVar[ErrorCode]
    DUPLICATE_SEQUENCE_NUMBER: _ClassVar[ErrorCode]
    INVALID_PRODUCER_EPOCH: _ClassVar[ErrorCode]
    INVALID_PRODUCER_ID_MAPPING: _ClassVar[ErrorCode]
    SECURITY_DISABLED: _ClassVar[ErrorCode]
    OPERATION_NOT_ATTEMPTED: _ClassVar[ErrorCode]
    KAFKA_STORAGE_ERROR: _ClassVar[ErrorCode]
    SASL_AUTHENTICATION_FAILED: _ClassVar[ErrorCode]
    UNKNOWN_PRODUCER_ID: _ClassVar[ErrorCode]
    REASSIGNMENT_IN_PROGRESS: _ClassVar[ErrorCode]
    FETCH_SESSION_ID_NOT_FOUND: _ClassVar[ErrorCode]
    INVALID_FETCH_SESSION_EPOCH: _ClassVar[ErrorCode]
    FENCED_LEADER_EPOCH: _ClassVar[ErrorCode]
    UNKNOWN_LEADER_EPOCH: _ClassVar[ErrorCode]
    STALE_BROKER_EPOCH: _ClassVar[ErrorCode]
    OFFSET_NOT_AVAILABLE: _ClassVar[ErrorCode]
    MEMBER_ID_REQUIRED: _ClassVar[ErrorCode]
    PREFERRED_LEADER_NOT_AVAILABLE: _ClassVar[ErrorCode]
    FENCED_INSTANCE_ID: _ClassVar[ErrorCode]
    ELIGIBLE_LEADERS_NOT_AVAILABLE: _ClassVar[ErrorCode]
    ELECTION_NOT_NEEDED: _ClassVar[ErrorCode]
    NO_REASSIGNMENT_IN_PROGRESS: _ClassVar[ErrorCode]
    INVALID_RECORD: _ClassVar[ErrorCode]
    RESOURCE_NOT_FOUND: _ClassVar[ErrorCode]
    DUPLICATE_RESOURCE: _ClassVar[ErrorCode]
    UNACCEPTABLE_CREDENTIAL: _ClassVar[ErrorCode]
    INVALID_UPDATE_VERSION: _ClassVar[ErrorCode]
    UNKNOWN_TOPIC_ID: _ClassVar[ErrorCode]
    DUPLICATE_BROKER_REGISTRATION: _ClassVar[ErrorCode]
    BROKER_ID_NOT_REGISTERED: _ClassVar[ErrorCode]
    INCONSISTENT_CLUSTER_ID: _ClassVar[ErrorCode]
    INELIGIBLE_REPLICA: _ClassVar[ErrorCode]
    NEW_LEADER_ELECTED: _ClassVar[ErrorCode]
    INCONSISTENT_VOTER_SET: _ClassVar[ErrorCode]

class ElectionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PREFERRED: _ClassVar[ElectionType]
    UNCLEAN: _ClassVar[ElectionType]
NONE: ErrorCode
UNKNOWN_SERVER_ERROR: ErrorCode
OFFSET_OUT_OF_RANGE: ErrorCode
CORRUPT_MESSAGE: ErrorCode
UNKNOWN_TOPIC_OR_PARTITION: ErrorCode
INVALID_FETCH_SIZE: ErrorCode
LEADER_NOT_AVAILABLE: ErrorCode
NOT_LEADER_OR_FOLLOWER: ErrorCode
REQUEST_TIMED_OUT: ErrorCode
BROKER_NOT_AVAILABLE: ErrorCode
REPLICA_NOT_AVAILABLE: ErrorCode
MESSAGE_TOO_LARGE: ErrorCode
OFFSET_METADATA_TOO_LARGE: ErrorCode
NETWORK_EXCEPTION: ErrorCode
COORDINATOR_LOAD_IN_PROGRESS: ErrorCode
COORDINATOR_NOT_AVAILABLE: ErrorCode
NOT_COORDINATOR: ErrorCode
INVALID_TOPIC_EXCEPTION: ErrorCode
RECORD_LIST_TOO_LARGE: ErrorCode
NOT_ENOUGH_REPLICAS: ErrorCode
NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode
INVALID_REQUIRED_ACKS: ErrorCode
ILLEGAL_GENERATION: ErrorCode
INCONSISTENT_GROUP_PROTOCOL: ErrorCode
INVALID_GROUP_ID: ErrorCode
UNKNOWN_MEMBER_ID: ErrorCode
INVALID_SESSION_TIMEOUT: ErrorCode
REBALANCE_IN_PROGRESS: ErrorCode
INVALID_COMMIT_OFFSET_SIZE: ErrorCode
TOPIC_AUTHORIZATION_FAILED: ErrorCode
GROUP_AUTHORIZATION_FAILED: ErrorCode
CLUSTER_AUTHORIZATION_FAILED: ErrorCode
INVALID_TIMESTAMP: ErrorCode
UNSUPPORTED_SASL_MECHANISM: ErrorCode
UNSUPPORTED_VERSION: ErrorCode
TOPIC_ALREADY_EXISTS: ErrorCode
INVALID_PARTITIONS: ErrorCode
INVALID_REPLICATION_FACTOR: ErrorCode
INVALID_REPLICA_ASSIGNMENT: ErrorCode
INVALID_CONFIG: ErrorCode
NOT_CONTROLLER: ErrorCode
INVALID_REQUEST: ErrorCode
POLICY_VIOLATION: ErrorCode
OUT_OF_ORDER_SEQUENCE_NUMBER: ErrorCode
DUPLICATE_SEQUENCE_NUMBER: ErrorCode
INVALID_PRODUCER_EPOCH: ErrorCode
INVALID_PRODUCER_ID_MAPPING: ErrorCode
SECURITY_DISABLED: ErrorCode
OPERATION_NOT_ATTEMPTED: ErrorCode
KAFKA_STORAGE_ERROR: ErrorCode
SASL_AUTHENTICATION_FAILED: ErrorCode
UNKNOWN_PRODUCER_ID: ErrorCode
REASSIGNMENT_IN_PROGRESS: ErrorCode
FETCH_SESSION_ID_NOT_FOUND: ErrorCode
INVALID_FETCH_SESSION_EPOCH: ErrorCode
FENCED_LEADER_EPOCH: ErrorCode
UNKNOWN_LEADER_EPOCH: ErrorCode
STALE_BROKER_EPOCH: ErrorCode
OFFSET_NOT_AVAILABLE: ErrorCode
MEMBER_ID_REQUIRED: ErrorCode
PREFERRED_LEADER_NOT_AVAILABLE: ErrorCode
FENCED_INSTANCE_ID: ErrorCode
ELIGIBLE_LEADERS_NOT_AVAILABLE: ErrorCode
ELECTION_NOT_NEEDED: ErrorCode
NO_REASSIGNMENT_IN_PROGRESS: ErrorCode
INVALID_RECORD: ErrorCode
RESOURCE_NOT_FOUND: ErrorCode
DUPLICATE_RESOURCE: ErrorCode
UNACCEPTABLE_CREDENTIAL: ErrorCode
INVALID_UPDATE_VERSION: ErrorCode
UNKNOWN_TOPIC_ID: ErrorCode
DUPLICATE_BROKER_REGISTRATION: ErrorCode
BROKER_ID_NOT_REGISTERED: ErrorCode
INCONSISTENT_CLUSTER_ID: ErrorCode
INELIGIBLE_REPLICA: ErrorCode
NEW_LEADER_ELECTED: ErrorCode
INCONSISTENT_VOTER_SET: ErrorCode
PREFERRED: ElectionType
UNCLEAN: ElectionType

class TopicPartitions(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class EpochEndOffset(_message.Message):
    __slots__ = ("epoch", "end_offset")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    end_offset: int
    def __init__(self, epoch: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class LeaderIdAndEpoch(_message.Message):
    __slots__ = ("leader_id", "leader_epoch")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    leader_id: int
    leader_epoch: int
    def __init__(self, leader_id: _Optional[int] = ..., leader_epoch: _Optional[int] = ...) -> None: ...

class KafkaFrame(_message.Message):
    __slots__ = ("frame",)
    FRAME_FIELD_NUMBER: _ClassVar[int]
    frame: bytes
    def __init__(self, frame: _Optional[bytes] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("acks", "timeout_ms", "topics", "correlation_id")
    ACKS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    acks: int
    timeout_ms: int
    topics: _containers.RepeatedCompositeFieldContainer[TopicProduceData]
    correlation_id: int
    def __init__(self, acks: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[TopicProduceData, _Mapping]]] = ..., correlation_id: _Optional[int] = ...) -> None: ...

class TopicProduceData(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionProduceData]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionProduceData, _Mapping]]] = ...) -> None: ...

class PartitionProduceData(_message.Message):
    __slots__ = ("partition", "records")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    records: bytes
    def __init__(self, partition: _Optional[int] = ..., records: _Optional[bytes] = ...) -> None: ...

class ProduceResponse(_message.Message):
    __slots__ = ("topics", "throttle_time_ms", "correlation_id")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicProduceResponse]
    throttle_time_ms: int
    correlation_id: int
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicProduceResponse, _Mapping]]] = ..., throttle_time_ms: _Optional[int] = ..., correlation_id: _Optional[int] = ...) -> None: ...

class TopicProduceResponse(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionProduceResponse]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionProduceResponse, _Mapping]]] = ...) -> None: ...

class PartitionProduceResponse(_message.Message):
    __slots__ = ("partition", "error_code", "error_message", "base_offset", "log_append_time_ms", "log_start_offset", "current_leader")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_APPEND_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: ErrorCode
    error_message: str
    base_offset: int
    log_append_time_ms: int
    log_start_offset: int
    current_leader: LeaderIdAndEpoch
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., base_offset: _Optional[int] = ..., log_append_time_ms: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., current_leader: _Optional[_Union[LeaderIdAndEpoch, _Mapping]] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("replica_id", "replica_epoch", "max_wait_ms", "min_bytes", "max_bytes", "isolation_level", "topics", "rack_id", "correlation_id", "session_id", "session_epoch", "forgotten_topics_data")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    RACK_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FORGOTTEN_TOPICS_DATA_FIELD_NUMBER: _ClassVar[int]
    replica_id: int
    replica_epoch: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    topics: _containers.RepeatedCompositeFieldContainer[FetchTopic]
    rack_id: str
    correlation_id: int
    session_id: int
    session_epoch: int
    forgotten_topics_data: _containers.RepeatedCompositeFieldContainer[ForgottenTopic]
    def __init__(self, replica_id: _Optional[int] = ..., replica_epoch: _Optional[int] = ..., max_wait_ms: _Optional[int] = ..., min_bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ..., isolation_level: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[FetchTopic, _Mapping]]] = ..., rack_id: _Optional[str] = ..., correlation_id: _Optional[int] = ..., session_id: _Optional[int] = ..., session_epoch: _Optional[int] = ..., forgotten_topics_data: _Optional[_Iterable[_Union[ForgottenTopic, _Mapping]]] = ...) -> None: ...

class ForgottenTopic(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class FetchTopic(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[FetchPartition]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[FetchPartition, _Mapping]]] = ...) -> None: ...

class FetchPartition(_message.Message):
    __slots__ = ("partition", "current_leader_epoch", "fetch_offset", "last_fetched_epoch", "log_start_offset", "partition_max_bytes")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FETCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_FETCHED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PARTITION_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    partition: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    log_start_offset: int
    partition_max_bytes: int
    def __init__(self, partition: _Optional[int] = ..., current_leader_epoch: _Optional[int] = ..., fetch_offset: _Optional[int] = ..., last_fetched_epoch: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., partition_max_bytes: _Optional[int] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("error_code", "topics", "throttle_time_ms", "correlation_id", "session_id")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    topics: _containers.RepeatedCompositeFieldContainer[FetchTopicResponse]
    throttle_time_ms: int
    correlation_id: int
    session_id: int
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., topics: _Optional[_Iterable[_Union[FetchTopicResponse, _Mapping]]] = ..., throttle_time_ms: _Optional[int] = ..., correlation_id: _Optional[int] = ..., session_id: _Optional[int] = ...) -> None: ...

class FetchTopicResponse(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[FetchPartitionResponse]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[FetchPartitionResponse, _Mapping]]] = ...) -> None: ...

class FetchPartitionResponse(_message.Message):
    __slots__ = ("partition", "error_code", "error_message", "high_watermark", "last_stable_offset", "log_start_offset", "diverging_epoch", "current_leader", "preferred_read_replica", "records", "log_end_offset")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LAST_STABLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DIVERGING_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_READ_REPLICA_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: ErrorCode
    error_message: str
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    diverging_epoch: EpochEndOffset
    current_leader: LeaderIdAndEpoch
    preferred_read_replica: int
    records: bytes
    log_end_offset: int
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., high_watermark: _Optional[int] = ..., last_stable_offset: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., diverging_epoch: _Optional[_Union[EpochEndOffset, _Mapping]] = ..., current_leader: _Optional[_Union[LeaderIdAndEpoch, _Mapping]] = ..., preferred_read_replica: _Optional[int] = ..., records: _Optional[bytes] = ..., log_end_offset: _Optional[int] = ...) -> None: ...

class ListOffsetsRequest(_message.Message):
    __slots__ = ("replica_id", "isolation_level", "topics")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_LEVEL_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    replica_id: int
    isolation_level: int
    topics: _containers.RepeatedCompositeFieldContainer[ListOffsetsTopic]
    def __init__(self, replica_id: _Optional[int] = ..., isolation_level: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[ListOffsetsTopic, _Mapping]]] = ...) -> None: ...

class ListOffsetsTopic(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[ListOffsetsPartition]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[ListOffsetsPartition, _Mapping]]] = ...) -> None: ...

class ListOffsetsPartition(_message.Message):
    __slots__ = ("partition", "current_leader_epoch", "timestamp")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    partition: int
    current_leader_epoch: int
    timestamp: int
    def __init__(self, partition: _Optional[int] = ..., current_leader_epoch: _Optional[int] = ..., timestamp: _Optional[int] = ...) -> None: ...

class ListOffsetsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[ListOffsetsTopicResponse]
    def __init__(self, topics: _Optional[_Iterable[_Union[ListOffsetsTopicResponse, _Mapping]]] = ...) -> None: ...

class ListOffsetsTopicResponse(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[ListOffsetsPartitionResponse]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[ListOffsetsPartitionResponse, _Mapping]]] = ...) -> None: ...

class ListOffsetsPartitionResponse(_message.Message):
    __slots__ = ("partition", "error_code", "error_message", "timestamp", "offset", "leader_epoch")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: ErrorCode
    error_message: str
    timestamp: int
    offset: int
    leader_epoch: int
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., timestamp: _Optional[int] = ..., offset: _Optional[int] = ..., leader_epoch: _Optional[int] = ...) -> None: ...

class OffsetForLeaderEpochRequest(_message.Message):
    __slots__ = ("replica_id", "topics")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    replica_id: int
    topics: _containers.RepeatedCompositeFieldContainer[OffsetForLeaderTopic]
    def __init__(self, replica_id: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[OffsetForLeaderTopic, _Mapping]]] = ...) -> None: ...

class OffsetForLeaderTopic(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[OffsetForLeaderPartition]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[OffsetForLeaderPartition, _Mapping]]] = ...) -> None: ...

class OffsetForLeaderPartition(_message.Message):
    __slots__ = ("partition", "current_leader_epoch", "leader_epoch")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    partition: int
    current_leader_epoch: int
    leader_epoch: int
    def __init__(self, partition: _Optional[int] = ..., current_leader_epoch: _Optional[int] = ..., leader_epoch: _Optional[int] = ...) -> None: ...

class OffsetForLeaderEpochResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[OffsetForLeaderTopicResult]
    def __init__(self, topics: _Optional[_Iterable[_Union[OffsetForLeaderTopicResult, _Mapping]]] = ...) -> None: ...

class OffsetForLeaderTopicResult(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedCompositeFieldContainer[OffsetForLeaderPartitionResult]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[OffsetForLeaderPartitionResult, _Mapping]]] = ...) -> None: ...

class OffsetForLeaderPartitionResult(_message.Message):
    __slots__ = ("partition", "error_code", "error_message", "leader_epoch", "end_offset")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: ErrorCode
    error_message: str
    leader_epoch: int
    end_offset: int
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class MetadataRequest(_message.Message):
    __slots__ = ("topics", "all_topics")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    ALL_TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    all_topics: bool
    def __init__(self, topics: _Optional[_Iterable[str]] = ..., all_topics: _Optional[bool] = ...) -> None: ...

class MetadataResponse(_message.Message):
    __slots__ = ("cluster_id", "controller_id", "brokers", "topics", "controller_host", "controller_port")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_HOST_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_PORT_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    controller_id: int
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerMetadata]
    topics: _containers.RepeatedCompositeFieldContainer[TopicMetadata]
    controller_host: str
    controller_port: int
    def __init__(self, cluster_id: _Optional[str] = ..., controller_id: _Optional[int] = ..., brokers: _Optional[_Iterable[_Union[BrokerMetadata, _Mapping]]] = ..., topics: _Optional[_Iterable[_Union[TopicMetadata, _Mapping]]] = ..., controller_host: _Optional[str] = ..., controller_port: _Optional[int] = ...) -> None: ...

class BrokerMetadata(_message.Message):
    __slots__ = ("node_id", "host", "port", "rack", "fenced")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    host: str
    port: int
    rack: str
    fenced: bool
    def __init__(self, node_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., rack: _Optional[str] = ..., fenced: _Optional[bool] = ...) -> None: ...

class TopicMetadata(_message.Message):
    __slots__ = ("error_code", "name", "topic_id", "partitions", "configs")
    class ConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    name: str
    topic_id: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionMetadata]
    configs: _containers.ScalarMap[str, str]
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., name: _Optional[str] = ..., topic_id: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionMetadata, _Mapping]]] = ..., configs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PartitionMetadata(_message.Message):
    __slots__ = ("error_code", "partition", "leader_id", "leader_epoch", "replicas", "isr", "offline_replicas", "partition_epoch", "adding_replicas", "removing_replicas")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ADDING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REMOVING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    partition: int
    leader_id: int
    leader_epoch: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    isr: _containers.RepeatedScalarFieldContainer[int]
    offline_replicas: _containers.RepeatedScalarFieldContainer[int]
    partition_epoch: int
    adding_replicas: _containers.RepeatedScalarFieldContainer[int]
    removing_replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., partition: _Optional[int] = ..., leader_id: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., isr: _Optional[_Iterable[int]] = ..., offline_replicas: _Optional[_Iterable[int]] = ..., partition_epoch: _Optional[int] = ..., adding_replicas: _Optional[_Iterable[int]] = ..., removing_replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class InitProducerIdRequest(_message.Message):
    __slots__ = ("transactional_id", "transaction_timeout_ms", "producer_id", "producer_epoch")
    TRANSACTIONAL_ID_FIELD_NUMBER: _ClassVar[int]
    TRANSACTION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    transactional_id: str
    transaction_timeout_ms: int
    producer_id: int
    producer_epoch: int
    def __init__(self, transactional_id: _Optional[str] = ..., transaction_timeout_ms: _Optional[int] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ...) -> None: ...

class InitProducerIdResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "producer_id", "producer_epoch")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    producer_id: int
    producer_epoch: int
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., producer_id: _Optional[int] = ..., producer_epoch: _Optional[int] = ...) -> None: ...

class DescribeReplicasRequest(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeReplicasResponse(_message.Message):
    __slots__ = ("broker_id", "replicas")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaDescription]
    def __init__(self, broker_id: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaDescription, _Mapping]]] = ...) -> None: ...

class ReplicaDescription(_message.Message):
    __slots__ = ("topic", "partition", "is_leader", "leader_id", "leader_epoch", "partition_epoch", "log_start_offset", "log_end_offset", "high_watermark", "isr", "maximal_isr", "followers", "size_bytes", "truncations", "last_truncation", "compacted", "cleaner_point", "dirty_ratio", "cleaner_runs", "last_cleaner_run")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    MAXIMAL_ISR_FIELD_NUMBER: _ClassVar[int]
    FOLLOWERS_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATIONS_FIELD_NUMBER: _ClassVar[int]
    LAST_TRUNCATION_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_FIELD_NUMBER: _ClassVar[int]
    CLEANER_POINT_FIELD_NUMBER: _ClassVar[int]
    DIRTY_RATIO_FIELD_NUMBER: _ClassVar[int]
    CLEANER_RUNS_FIELD_NUMBER: _ClassVar[int]
    LAST_CLEANER_RUN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    is_leader: bool
    leader_id: int
    leader_epoch: int
    partition_epoch: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    isr: _containers.RepeatedScalarFieldContainer[int]
    maximal_isr: _containers.RepeatedScalarFieldContainer[int]
    followers: _containers.RepeatedCompositeFieldContainer[FollowerDescription]
    size_bytes: int
    truncations: int
    last_truncation: TruncationDescription
    compacted: bool
    cleaner_point: int
    dirty_ratio: float
    cleaner_runs: int
    last_cleaner_run: CleanerRunDescription
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., is_leader: _Optional[bool] = ..., leader_id: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., partition_epoch: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., isr: _Optional[_Iterable[int]] = ..., maximal_isr: _Optional[_Iterable[int]] = ..., followers: _Optional[_Iterable[_Union[FollowerDescription, _Mapping]]] = ..., size_bytes: _Optional[int] = ..., truncations: _Optional[int] = ..., last_truncation: _Optional[_Union[TruncationDescription, _Mapping]] = ..., compacted: _Optional[bool] = ..., cleaner_point: _Optional[int] = ..., dirty_ratio: _Optional[float] = ..., cleaner_runs: _Optional[int] = ..., last_cleaner_run: _Optional[_Union[CleanerRunDescription, _Mapping]] = ...) -> None: ...

class CleanerRunDescription(_message.Message):
    __slots__ = ("timestamp_ms", "outcome", "first_dirty_offset", "end_offset", "bytes_read", "bytes_written", "records_read", "records_written", "elapsed_ms", "error")
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    FIRST_DIRTY_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    RECORDS_READ_FIELD_NUMBER: _ClassVar[int]
    RECORDS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    timestamp_ms: int
    outcome: str
    first_dirty_offset: int
    end_offset: int
    bytes_read: int
    bytes_written: int
    records_read: int
    records_written: int
    elapsed_ms: int
    error: str
    def __init__(self, timestamp_ms: _Optional[int] = ..., outcome: _Optional[str] = ..., first_dirty_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., bytes_read: _Optional[int] = ..., bytes_written: _Optional[int] = ..., records_read: _Optional[int] = ..., records_written: _Optional[int] = ..., elapsed_ms: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class TruncationDescription(_message.Message):
    __slots__ = ("timestamp_ms", "from_offset", "to_offset", "fully", "reason", "leader_epoch")
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TO_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FULLY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    timestamp_ms: int
    from_offset: int
    to_offset: int
    fully: bool
    reason: str
    leader_epoch: int
    def __init__(self, timestamp_ms: _Optional[int] = ..., from_offset: _Optional[int] = ..., to_offset: _Optional[int] = ..., fully: _Optional[bool] = ..., reason: _Optional[str] = ..., leader_epoch: _Optional[int] = ...) -> None: ...

class FollowerDescription(_message.Message):
    __slots__ = ("replica_id", "log_end_offset", "last_caught_up_time_ms")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_CAUGHT_UP_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    replica_id: int
    log_end_offset: int
    last_caught_up_time_ms: int
    def __init__(self, replica_id: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., last_caught_up_time_ms: _Optional[int] = ...) -> None: ...

class BrokerRegistrationRequest(_message.Message):
    __slots__ = ("broker_id", "cluster_id", "incarnation_id", "host", "port", "rack", "previous_broker_epoch", "metrics_port", "kafka_host", "kafka_port")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    KAFKA_HOST_FIELD_NUMBER: _ClassVar[int]
    KAFKA_PORT_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    cluster_id: str
    incarnation_id: str
    host: str
    port: int
    rack: str
    previous_broker_epoch: int
    metrics_port: int
    kafka_host: str
    kafka_port: int
    def __init__(self, broker_id: _Optional[int] = ..., cluster_id: _Optional[str] = ..., incarnation_id: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., rack: _Optional[str] = ..., previous_broker_epoch: _Optional[int] = ..., metrics_port: _Optional[int] = ..., kafka_host: _Optional[str] = ..., kafka_port: _Optional[int] = ...) -> None: ...

class BrokerRegistrationResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "broker_epoch", "cluster_id")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    broker_epoch: int
    cluster_id: str
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., broker_epoch: _Optional[int] = ..., cluster_id: _Optional[str] = ...) -> None: ...

class BrokerHeartbeatRequest(_message.Message):
    __slots__ = ("broker_id", "broker_epoch", "current_metadata_offset", "want_fence", "want_shut_down", "offline_log_dirs")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_METADATA_OFFSET_FIELD_NUMBER: _ClassVar[int]
    WANT_FENCE_FIELD_NUMBER: _ClassVar[int]
    WANT_SHUT_DOWN_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_LOG_DIRS_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    current_metadata_offset: int
    want_fence: bool
    want_shut_down: bool
    offline_log_dirs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., current_metadata_offset: _Optional[int] = ..., want_fence: _Optional[bool] = ..., want_shut_down: _Optional[bool] = ..., offline_log_dirs: _Optional[_Iterable[str]] = ...) -> None: ...

class BrokerHeartbeatResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "is_caught_up", "is_fenced", "should_shut_down")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    IS_CAUGHT_UP_FIELD_NUMBER: _ClassVar[int]
    IS_FENCED_FIELD_NUMBER: _ClassVar[int]
    SHOULD_SHUT_DOWN_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    is_caught_up: bool
    is_fenced: bool
    should_shut_down: bool
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., is_caught_up: _Optional[bool] = ..., is_fenced: _Optional[bool] = ..., should_shut_down: _Optional[bool] = ...) -> None: ...

class WatchMetadataRequest(_message.Message):
    __slots__ = ("from_offset", "broker_id")
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    from_offset: int
    broker_id: int
    def __init__(self, from_offset: _Optional[int] = ..., broker_id: _Optional[int] = ...) -> None: ...

class MetadataBatch(_message.Message):
    __slots__ = ("is_snapshot", "snapshot_offset", "records", "high_offset", "leader_epoch")
    IS_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    HIGH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    is_snapshot: bool
    snapshot_offset: int
    records: _containers.RepeatedCompositeFieldContainer[MetadataRecord]
    high_offset: int
    leader_epoch: int
    def __init__(self, is_snapshot: _Optional[bool] = ..., snapshot_offset: _Optional[int] = ..., records: _Optional[_Iterable[_Union[MetadataRecord, _Mapping]]] = ..., high_offset: _Optional[int] = ..., leader_epoch: _Optional[int] = ...) -> None: ...

class MetadataRecord(_message.Message):
    __slots__ = ("offset", "timestamp_ms", "register_broker", "broker_change", "topic", "partition", "remove_topic", "producer_ids", "config", "no_op", "unregister_broker", "leader_change", "broker_decommission", "user_scram_credential", "remove_user_scram_credential", "access_control_entry", "remove_access_control_entry")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    REGISTER_BROKER_FIELD_NUMBER: _ClassVar[int]
    BROKER_CHANGE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REMOVE_TOPIC_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_IDS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    NO_OP_FIELD_NUMBER: _ClassVar[int]
    UNREGISTER_BROKER_FIELD_NUMBER: _ClassVar[int]
    LEADER_CHANGE_FIELD_NUMBER: _ClassVar[int]
    BROKER_DECOMMISSION_FIELD_NUMBER: _ClassVar[int]
    USER_SCRAM_CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    REMOVE_USER_SCRAM_CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    ACCESS_CONTROL_ENTRY_FIELD_NUMBER: _ClassVar[int]
    REMOVE_ACCESS_CONTROL_ENTRY_FIELD_NUMBER: _ClassVar[int]
    offset: int
    timestamp_ms: int
    register_broker: RegisterBrokerRecord
    broker_change: BrokerRegistrationChangeRecord
    topic: TopicRecord
    partition: PartitionRecord
    remove_topic: RemoveTopicRecord
    producer_ids: ProducerIdsRecord
    config: ConfigRecord
    no_op: NoOpRecord
    unregister_broker: UnregisterBrokerRecord
    leader_change: LeaderChangeRecord
    broker_decommission: BrokerDecommissionRecord
    user_scram_credential: UserScramCredentialRecord
    remove_user_scram_credential: RemoveUserScramCredentialRecord
    access_control_entry: AccessControlEntryRecord
    remove_access_control_entry: RemoveAccessControlEntryRecord
    def __init__(self, offset: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., register_broker: _Optional[_Union[RegisterBrokerRecord, _Mapping]] = ..., broker_change: _Optional[_Union[BrokerRegistrationChangeRecord, _Mapping]] = ..., topic: _Optional[_Union[TopicRecord, _Mapping]] = ..., partition: _Optional[_Union[PartitionRecord, _Mapping]] = ..., remove_topic: _Optional[_Union[RemoveTopicRecord, _Mapping]] = ..., producer_ids: _Optional[_Union[ProducerIdsRecord, _Mapping]] = ..., config: _Optional[_Union[ConfigRecord, _Mapping]] = ..., no_op: _Optional[_Union[NoOpRecord, _Mapping]] = ..., unregister_broker: _Optional[_Union[UnregisterBrokerRecord, _Mapping]] = ..., leader_change: _Optional[_Union[LeaderChangeRecord, _Mapping]] = ..., broker_decommission: _Optional[_Union[BrokerDecommissionRecord, _Mapping]] = ..., user_scram_credential: _Optional[_Union[UserScramCredentialRecord, _Mapping]] = ..., remove_user_scram_credential: _Optional[_Union[RemoveUserScramCredentialRecord, _Mapping]] = ..., access_control_entry: _Optional[_Union[AccessControlEntryRecord, _Mapping]] = ..., remove_access_control_entry: _Optional[_Union[RemoveAccessControlEntryRecord, _Mapping]] = ...) -> None: ...

class RegisterBrokerRecord(_message.Message):
    __slots__ = ("broker_id", "incarnation_id", "broker_epoch", "host", "port", "rack", "fenced", "metrics_port", "kafka_host", "kafka_port")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    KAFKA_HOST_FIELD_NUMBER: _ClassVar[int]
    KAFKA_PORT_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    incarnation_id: str
    broker_epoch: int
    host: str
    port: int
    rack: str
    fenced: bool
    metrics_port: int
    kafka_host: str
    kafka_port: int
    def __init__(self, broker_id: _Optional[int] = ..., incarnation_id: _Optional[str] = ..., broker_epoch: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., rack: _Optional[str] = ..., fenced: _Optional[bool] = ..., metrics_port: _Optional[int] = ..., kafka_host: _Optional[str] = ..., kafka_port: _Optional[int] = ...) -> None: ...

class BrokerRegistrationChangeRecord(_message.Message):
    __slots__ = ("broker_id", "broker_epoch", "fenced", "in_controlled_shutdown")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    IN_CONTROLLED_SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    fenced: bool
    in_controlled_shutdown: bool
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., fenced: _Optional[bool] = ..., in_controlled_shutdown: _Optional[bool] = ...) -> None: ...

class UnregisterBrokerRecord(_message.Message):
    __slots__ = ("broker_id", "broker_epoch")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class TopicRecord(_message.Message):
    __slots__ = ("name", "topic_id", "configs")
    class ConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    topic_id: str
    configs: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., topic_id: _Optional[str] = ..., configs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PartitionRecord(_message.Message):
    __slots__ = ("topic_id", "partition", "replicas", "isr", "leader", "leader_epoch", "partition_epoch", "leader_recovery_state", "reason", "adding_replicas", "removing_replicas")
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_RECOVERY_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ADDING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REMOVING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    topic_id: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    isr: _containers.RepeatedScalarFieldContainer[int]
    leader: int
    leader_epoch: int
    partition_epoch: int
    leader_recovery_state: int
    reason: str
    adding_replicas: _containers.RepeatedScalarFieldContainer[int]
    removing_replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic_id: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., isr: _Optional[_Iterable[int]] = ..., leader: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., partition_epoch: _Optional[int] = ..., leader_recovery_state: _Optional[int] = ..., reason: _Optional[str] = ..., adding_replicas: _Optional[_Iterable[int]] = ..., removing_replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class RemoveTopicRecord(_message.Message):
    __slots__ = ("topic_id",)
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    topic_id: str
    def __init__(self, topic_id: _Optional[str] = ...) -> None: ...

class ProducerIdsRecord(_message.Message):
    __slots__ = ("broker_id", "broker_epoch", "next_producer_id")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEXT_PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    next_producer_id: int
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., next_producer_id: _Optional[int] = ...) -> None: ...

class ConfigRecord(_message.Message):
    __slots__ = ("resource_name", "name", "value", "resource_type")
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    resource_name: str
    name: str
    value: str
    resource_type: int
    def __init__(self, resource_name: _Optional[str] = ..., name: _Optional[str] = ..., value: _Optional[str] = ..., resource_type: _Optional[int] = ...) -> None: ...

class BrokerDecommissionRecord(_message.Message):
    __slots__ = ("broker_id", "decommissioning")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    DECOMMISSIONING_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    decommissioning: bool
    def __init__(self, broker_id: _Optional[int] = ..., decommissioning: _Optional[bool] = ...) -> None: ...

class NoOpRecord(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LeaderChangeRecord(_message.Message):
    __slots__ = ("leader_id", "leader_epoch", "voters", "granting_voters")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    GRANTING_VOTERS_FIELD_NUMBER: _ClassVar[int]
    leader_id: int
    leader_epoch: int
    voters: _containers.RepeatedScalarFieldContainer[int]
    granting_voters: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, leader_id: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., voters: _Optional[_Iterable[int]] = ..., granting_voters: _Optional[_Iterable[int]] = ...) -> None: ...

class AlterPartitionRequest(_message.Message):
    __slots__ = ("broker_id", "broker_epoch", "topics")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    topics: _containers.RepeatedCompositeFieldContainer[AlterPartitionTopic]
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[AlterPartitionTopic, _Mapping]]] = ...) -> None: ...

class AlterPartitionTopic(_message.Message):
    __slots__ = ("topic_id", "partitions")
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic_id: str
    partitions: _containers.RepeatedCompositeFieldContainer[AlterPartitionPartition]
    def __init__(self, topic_id: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[AlterPartitionPartition, _Mapping]]] = ...) -> None: ...

class BrokerState(_message.Message):
    __slots__ = ("broker_id", "broker_epoch")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class AlterPartitionPartition(_message.Message):
    __slots__ = ("partition", "leader_epoch", "partition_epoch", "new_isr_with_epochs", "leader_recovery_state")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEW_ISR_WITH_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    LEADER_RECOVERY_STATE_FIELD_NUMBER: _ClassVar[int]
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr_with_epochs: _containers.RepeatedCompositeFieldContainer[BrokerState]
    leader_recovery_state: int
    def __init__(self, partition: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., partition_epoch: _Optional[int] = ..., new_isr_with_epochs: _Optional[_Iterable[_Union[BrokerState, _Mapping]]] = ..., leader_recovery_state: _Optional[int] = ...) -> None: ...

class AlterPartitionResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "topics")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    topics: _containers.RepeatedCompositeFieldContainer[AlterPartitionTopicResponse]
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., topics: _Optional[_Iterable[_Union[AlterPartitionTopicResponse, _Mapping]]] = ...) -> None: ...

class AlterPartitionTopicResponse(_message.Message):
    __slots__ = ("topic_id", "partitions")
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic_id: str
    partitions: _containers.RepeatedCompositeFieldContainer[AlterPartitionPartitionResponse]
    def __init__(self, topic_id: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[AlterPartitionPartitionResponse, _Mapping]]] = ...) -> None: ...

class AlterPartitionPartitionResponse(_message.Message):
    __slots__ = ("partition", "error_code", "error_message", "leader_id", "leader_epoch", "isr", "leader_recovery_state", "partition_epoch")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    LEADER_RECOVERY_STATE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    partition: int
    error_code: ErrorCode
    error_message: str
    leader_id: int
    leader_epoch: int
    isr: _containers.RepeatedScalarFieldContainer[int]
    leader_recovery_state: int
    partition_epoch: int
    def __init__(self, partition: _Optional[int] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., leader_id: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., isr: _Optional[_Iterable[int]] = ..., leader_recovery_state: _Optional[int] = ..., partition_epoch: _Optional[int] = ...) -> None: ...

class AllocateProducerIdsRequest(_message.Message):
    __slots__ = ("broker_id", "broker_epoch")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class AllocateProducerIdsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "producer_id_start", "producer_id_len")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_START_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_LEN_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    producer_id_start: int
    producer_id_len: int
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., producer_id_start: _Optional[int] = ..., producer_id_len: _Optional[int] = ...) -> None: ...

class CreateTopicsRequest(_message.Message):
    __slots__ = ("topics", "timeout_ms", "validate_only")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[CreatableTopic]
    timeout_ms: int
    validate_only: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[CreatableTopic, _Mapping]]] = ..., timeout_ms: _Optional[int] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class CreatableTopic(_message.Message):
    __slots__ = ("name", "num_partitions", "replication_factor", "configs")
    class ConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    num_partitions: int
    replication_factor: int
    configs: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., num_partitions: _Optional[int] = ..., replication_factor: _Optional[int] = ..., configs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CreateTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[CreatableTopicResult]
    def __init__(self, topics: _Optional[_Iterable[_Union[CreatableTopicResult, _Mapping]]] = ...) -> None: ...

class CreatableTopicResult(_message.Message):
    __slots__ = ("name", "topic_id", "error_code", "error_message", "num_partitions", "replication_factor", "configs")
    class ConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    topic_id: str
    error_code: ErrorCode
    error_message: str
    num_partitions: int
    replication_factor: int
    configs: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., topic_id: _Optional[str] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., num_partitions: _Optional[int] = ..., replication_factor: _Optional[int] = ..., configs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class DeleteTopicsRequest(_message.Message):
    __slots__ = ("topic_names", "timeout_ms")
    TOPIC_NAMES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    topic_names: _containers.RepeatedScalarFieldContainer[str]
    timeout_ms: int
    def __init__(self, topic_names: _Optional[_Iterable[str]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class DeleteTopicsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DeletableTopicResult]
    def __init__(self, results: _Optional[_Iterable[_Union[DeletableTopicResult, _Mapping]]] = ...) -> None: ...

class DeletableTopicResult(_message.Message):
    __slots__ = ("name", "topic_id", "error_code", "error_message")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    topic_id: str
    error_code: ErrorCode
    error_message: str
    def __init__(self, name: _Optional[str] = ..., topic_id: _Optional[str] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class DescribeClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeClusterResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "cluster_id", "controller_id", "metadata_offset", "brokers")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    cluster_id: str
    controller_id: int
    metadata_offset: int
    brokers: _containers.RepeatedCompositeFieldContainer[ClusterBroker]
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., cluster_id: _Optional[str] = ..., controller_id: _Optional[int] = ..., metadata_offset: _Optional[int] = ..., brokers: _Optional[_Iterable[_Union[ClusterBroker, _Mapping]]] = ...) -> None: ...

class ClusterBroker(_message.Message):
    __slots__ = ("broker_id", "host", "port", "rack", "fenced", "in_controlled_shutdown", "broker_epoch", "metrics_port", "last_heartbeat_ms_ago", "decommissioning", "replica_count", "leader_count")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    IN_CONTROLLED_SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    METRICS_PORT_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_MS_AGO_FIELD_NUMBER: _ClassVar[int]
    DECOMMISSIONING_FIELD_NUMBER: _ClassVar[int]
    REPLICA_COUNT_FIELD_NUMBER: _ClassVar[int]
    LEADER_COUNT_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    host: str
    port: int
    rack: str
    fenced: bool
    in_controlled_shutdown: bool
    broker_epoch: int
    metrics_port: int
    last_heartbeat_ms_ago: int
    decommissioning: bool
    replica_count: int
    leader_count: int
    def __init__(self, broker_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., rack: _Optional[str] = ..., fenced: _Optional[bool] = ..., in_controlled_shutdown: _Optional[bool] = ..., broker_epoch: _Optional[int] = ..., metrics_port: _Optional[int] = ..., last_heartbeat_ms_ago: _Optional[int] = ..., decommissioning: _Optional[bool] = ..., replica_count: _Optional[int] = ..., leader_count: _Optional[int] = ...) -> None: ...

class ElectLeadersRequest(_message.Message):
    __slots__ = ("election_type", "topic_partitions", "all_partitions", "timeout_ms")
    ELECTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    ALL_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    election_type: ElectionType
    topic_partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitions]
    all_partitions: bool
    timeout_ms: int
    def __init__(self, election_type: _Optional[_Union[ElectionType, str]] = ..., topic_partitions: _Optional[_Iterable[_Union[TopicPartitions, _Mapping]]] = ..., all_partitions: _Optional[bool] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ElectLeadersResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "results")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    results: _containers.RepeatedCompositeFieldContainer[ElectionResult]
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., results: _Optional[_Iterable[_Union[ElectionResult, _Mapping]]] = ...) -> None: ...

class ElectionResult(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: ErrorCode
    error_message: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class UnregisterBrokerRequest(_message.Message):
    __slots__ = ("broker_id",)
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    def __init__(self, broker_id: _Optional[int] = ...) -> None: ...

class UnregisterBrokerResponse(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class ReassignablePartition(_message.Message):
    __slots__ = ("topic", "partition", "replicas", "cancel")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    cancel: bool
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., cancel: _Optional[bool] = ...) -> None: ...

class AlterPartitionReassignmentsRequest(_message.Message):
    __slots__ = ("partitions", "timeout_ms")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[ReassignablePartition]
    timeout_ms: int
    def __init__(self, partitions: _Optional[_Iterable[_Union[ReassignablePartition, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ReassignmentResult(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: ErrorCode
    error_message: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class AlterPartitionReassignmentsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "results")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    results: _containers.RepeatedCompositeFieldContainer[ReassignmentResult]
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., results: _Optional[_Iterable[_Union[ReassignmentResult, _Mapping]]] = ...) -> None: ...

class ListPartitionReassignmentsRequest(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicPartitions]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicPartitions, _Mapping]]] = ...) -> None: ...

class OngoingReassignment(_message.Message):
    __slots__ = ("topic", "partition", "replicas", "adding_replicas", "removing_replicas")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ADDING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REMOVING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    adding_replicas: _containers.RepeatedScalarFieldContainer[int]
    removing_replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., adding_replicas: _Optional[_Iterable[int]] = ..., removing_replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class ListPartitionReassignmentsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "reassignments")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    reassignments: _containers.RepeatedCompositeFieldContainer[OngoingReassignment]
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., reassignments: _Optional[_Iterable[_Union[OngoingReassignment, _Mapping]]] = ...) -> None: ...

class ReplicaList(_message.Message):
    __slots__ = ("broker_ids",)
    BROKER_IDS_FIELD_NUMBER: _ClassVar[int]
    broker_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, broker_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CreatePartitionsTopic(_message.Message):
    __slots__ = ("name", "count", "assignments")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    assignments: _containers.RepeatedCompositeFieldContainer[ReplicaList]
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ..., assignments: _Optional[_Iterable[_Union[ReplicaList, _Mapping]]] = ...) -> None: ...

class CreatePartitionsRequest(_message.Message):
    __slots__ = ("topics", "timeout_ms", "validate_only")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[CreatePartitionsTopic]
    timeout_ms: int
    validate_only: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[CreatePartitionsTopic, _Mapping]]] = ..., timeout_ms: _Optional[int] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class CreatePartitionsTopicResult(_message.Message):
    __slots__ = ("name", "error_code", "error_message")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    error_code: ErrorCode
    error_message: str
    def __init__(self, name: _Optional[str] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class CreatePartitionsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[CreatePartitionsTopicResult]
    def __init__(self, results: _Optional[_Iterable[_Union[CreatePartitionsTopicResult, _Mapping]]] = ...) -> None: ...

class AlterableConfig(_message.Message):
    __slots__ = ("name", "config_operation", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_OPERATION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    config_operation: int
    value: str
    def __init__(self, name: _Optional[str] = ..., config_operation: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...

class AlterConfigsResource(_message.Message):
    __slots__ = ("resource_type", "resource_name", "configs")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    resource_type: int
    resource_name: str
    configs: _containers.RepeatedCompositeFieldContainer[AlterableConfig]
    def __init__(self, resource_type: _Optional[int] = ..., resource_name: _Optional[str] = ..., configs: _Optional[_Iterable[_Union[AlterableConfig, _Mapping]]] = ...) -> None: ...

class IncrementalAlterConfigsRequest(_message.Message):
    __slots__ = ("resources", "validate_only")
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.RepeatedCompositeFieldContainer[AlterConfigsResource]
    validate_only: bool
    def __init__(self, resources: _Optional[_Iterable[_Union[AlterConfigsResource, _Mapping]]] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class AlterConfigsResourceResult(_message.Message):
    __slots__ = ("resource_type", "resource_name", "error_code", "error_message")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    resource_type: int
    resource_name: str
    error_code: ErrorCode
    error_message: str
    def __init__(self, resource_type: _Optional[int] = ..., resource_name: _Optional[str] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class IncrementalAlterConfigsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AlterConfigsResourceResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AlterConfigsResourceResult, _Mapping]]] = ...) -> None: ...

class DescribeConfigsResource(_message.Message):
    __slots__ = ("resource_type", "resource_name", "configuration_keys")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIGURATION_KEYS_FIELD_NUMBER: _ClassVar[int]
    resource_type: int
    resource_name: str
    configuration_keys: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, resource_type: _Optional[int] = ..., resource_name: _Optional[str] = ..., configuration_keys: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeConfigsRequest(_message.Message):
    __slots__ = ("resources",)
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.RepeatedCompositeFieldContainer[DescribeConfigsResource]
    def __init__(self, resources: _Optional[_Iterable[_Union[DescribeConfigsResource, _Mapping]]] = ...) -> None: ...

class DescribeConfigsEntry(_message.Message):
    __slots__ = ("name", "value", "read_only", "config_source", "is_sensitive", "documentation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    CONFIG_SOURCE_FIELD_NUMBER: _ClassVar[int]
    IS_SENSITIVE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    read_only: bool
    config_source: int
    is_sensitive: bool
    documentation: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ..., read_only: _Optional[bool] = ..., config_source: _Optional[int] = ..., is_sensitive: _Optional[bool] = ..., documentation: _Optional[str] = ...) -> None: ...

class DescribeConfigsResult(_message.Message):
    __slots__ = ("resource_type", "resource_name", "error_code", "error_message", "configs")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    resource_type: int
    resource_name: str
    error_code: ErrorCode
    error_message: str
    configs: _containers.RepeatedCompositeFieldContainer[DescribeConfigsEntry]
    def __init__(self, resource_type: _Optional[int] = ..., resource_name: _Optional[str] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., configs: _Optional[_Iterable[_Union[DescribeConfigsEntry, _Mapping]]] = ...) -> None: ...

class DescribeConfigsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DescribeConfigsResult]
    def __init__(self, results: _Optional[_Iterable[_Union[DescribeConfigsResult, _Mapping]]] = ...) -> None: ...

class DecommissionBrokerRequest(_message.Message):
    __slots__ = ("broker_id", "cancel")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    cancel: bool
    def __init__(self, broker_id: _Optional[int] = ..., cancel: _Optional[bool] = ...) -> None: ...

class DecommissionBrokerResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "partitions_moving")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_MOVING_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    partitions_moving: int
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., partitions_moving: _Optional[int] = ...) -> None: ...

class QuorumHeader(_message.Message):
    __slots__ = ("cluster_id", "sender_id", "sender_directory_id", "voters")
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_DIRECTORY_ID_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    cluster_id: str
    sender_id: int
    sender_directory_id: str
    voters: str
    def __init__(self, cluster_id: _Optional[str] = ..., sender_id: _Optional[int] = ..., sender_directory_id: _Optional[str] = ..., voters: _Optional[str] = ...) -> None: ...

class VoteRequest(_message.Message):
    __slots__ = ("header", "candidate_epoch", "candidate_id", "last_offset_epoch", "last_offset", "pre_vote")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    header: QuorumHeader
    candidate_epoch: int
    candidate_id: int
    last_offset_epoch: int
    last_offset: int
    pre_vote: bool
    def __init__(self, header: _Optional[_Union[QuorumHeader, _Mapping]] = ..., candidate_epoch: _Optional[int] = ..., candidate_id: _Optional[int] = ..., last_offset_epoch: _Optional[int] = ..., last_offset: _Optional[int] = ..., pre_vote: _Optional[bool] = ...) -> None: ...

class VoteResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "leader_epoch", "leader_id", "vote_granted", "voter_id")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    VOTE_GRANTED_FIELD_NUMBER: _ClassVar[int]
    VOTER_ID_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    leader_epoch: int
    leader_id: int
    vote_granted: bool
    voter_id: int
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., leader_id: _Optional[int] = ..., vote_granted: _Optional[bool] = ..., voter_id: _Optional[int] = ...) -> None: ...

class BeginQuorumEpochRequest(_message.Message):
    __slots__ = ("header", "leader_epoch", "leader_id")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    header: QuorumHeader
    leader_epoch: int
    leader_id: int
    def __init__(self, header: _Optional[_Union[QuorumHeader, _Mapping]] = ..., leader_epoch: _Optional[int] = ..., leader_id: _Optional[int] = ...) -> None: ...

class BeginQuorumEpochResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "leader_epoch", "leader_id")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    leader_epoch: int
    leader_id: int
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., leader_id: _Optional[int] = ...) -> None: ...

class EndQuorumEpochRequest(_message.Message):
    __slots__ = ("header", "leader_epoch", "leader_id", "preferred_successors")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_SUCCESSORS_FIELD_NUMBER: _ClassVar[int]
    header: QuorumHeader
    leader_epoch: int
    leader_id: int
    preferred_successors: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[QuorumHeader, _Mapping]] = ..., leader_epoch: _Optional[int] = ..., leader_id: _Optional[int] = ..., preferred_successors: _Optional[_Iterable[int]] = ...) -> None: ...

class EndQuorumEpochResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "leader_epoch", "leader_id")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    leader_epoch: int
    leader_id: int
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., leader_id: _Optional[int] = ...) -> None: ...

class QuorumFetchRequest(_message.Message):
    __slots__ = ("header", "replica_id", "current_leader_epoch", "fetch_offset", "last_fetched_epoch", "max_wait_ms", "max_bytes")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FETCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_FETCHED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    header: QuorumHeader
    replica_id: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    max_wait_ms: int
    max_bytes: int
    def __init__(self, header: _Optional[_Union[QuorumHeader, _Mapping]] = ..., replica_id: _Optional[int] = ..., current_leader_epoch: _Optional[int] = ..., fetch_offset: _Optional[int] = ..., last_fetched_epoch: _Optional[int] = ..., max_wait_ms: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class QuorumBatch(_message.Message):
    __slots__ = ("leader_epoch", "records")
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    leader_epoch: int
    records: _containers.RepeatedCompositeFieldContainer[MetadataRecord]
    def __init__(self, leader_epoch: _Optional[int] = ..., records: _Optional[_Iterable[_Union[MetadataRecord, _Mapping]]] = ...) -> None: ...

class QuorumFetchResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "leader_epoch", "leader_id", "high_watermark", "log_start_offset", "diverging_epoch", "snapshot_id", "batches")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DIVERGING_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    leader_epoch: int
    leader_id: int
    high_watermark: int
    log_start_offset: int
    diverging_epoch: EpochEndOffset
    snapshot_id: SnapshotId
    batches: _containers.RepeatedCompositeFieldContainer[QuorumBatch]
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., leader_id: _Optional[int] = ..., high_watermark: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., diverging_epoch: _Optional[_Union[EpochEndOffset, _Mapping]] = ..., snapshot_id: _Optional[_Union[SnapshotId, _Mapping]] = ..., batches: _Optional[_Iterable[_Union[QuorumBatch, _Mapping]]] = ...) -> None: ...

class SnapshotId(_message.Message):
    __slots__ = ("end_offset", "epoch")
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    end_offset: int
    epoch: int
    def __init__(self, end_offset: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class FetchSnapshotRequest(_message.Message):
    __slots__ = ("header", "replica_id", "current_leader_epoch", "snapshot_id")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    header: QuorumHeader
    replica_id: int
    current_leader_epoch: int
    snapshot_id: SnapshotId
    def __init__(self, header: _Optional[_Union[QuorumHeader, _Mapping]] = ..., replica_id: _Optional[int] = ..., current_leader_epoch: _Optional[int] = ..., snapshot_id: _Optional[_Union[SnapshotId, _Mapping]] = ...) -> None: ...

class FetchSnapshotResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "leader_epoch", "leader_id", "snapshot_id", "records")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    leader_epoch: int
    leader_id: int
    snapshot_id: SnapshotId
    records: _containers.RepeatedCompositeFieldContainer[MetadataRecord]
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., leader_id: _Optional[int] = ..., snapshot_id: _Optional[_Union[SnapshotId, _Mapping]] = ..., records: _Optional[_Iterable[_Union[MetadataRecord, _Mapping]]] = ...) -> None: ...

class DescribeQuorumRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QuorumVoter(_message.Message):
    __slots__ = ("voter_id", "address", "log_end_offset", "last_fetch_ms_ago", "last_caught_up_ms_ago")
    VOTER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_FETCH_MS_AGO_FIELD_NUMBER: _ClassVar[int]
    LAST_CAUGHT_UP_MS_AGO_FIELD_NUMBER: _ClassVar[int]
    voter_id: int
    address: str
    log_end_offset: int
    last_fetch_ms_ago: int
    last_caught_up_ms_ago: int
    def __init__(self, voter_id: _Optional[int] = ..., address: _Optional[str] = ..., log_end_offset: _Optional[int] = ..., last_fetch_ms_ago: _Optional[int] = ..., last_caught_up_ms_ago: _Optional[int] = ...) -> None: ...

class DescribeQuorumResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "cluster_id", "node_id", "role", "leader_id", "leader_epoch", "leader_address", "high_watermark", "log_end_offset", "voters", "why_no_leader")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    WHY_NO_LEADER_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    cluster_id: str
    node_id: int
    role: str
    leader_id: int
    leader_epoch: int
    leader_address: str
    high_watermark: int
    log_end_offset: int
    voters: _containers.RepeatedCompositeFieldContainer[QuorumVoter]
    why_no_leader: str
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., cluster_id: _Optional[str] = ..., node_id: _Optional[int] = ..., role: _Optional[str] = ..., leader_id: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., leader_address: _Optional[str] = ..., high_watermark: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., voters: _Optional[_Iterable[_Union[QuorumVoter, _Mapping]]] = ..., why_no_leader: _Optional[str] = ...) -> None: ...

class AccessControlEntryRecord(_message.Message):
    __slots__ = ("id", "resource_type", "resource_name", "pattern_type", "principal", "host", "operation", "permission_type")
    ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_TYPE_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_TYPE_FIELD_NUMBER: _ClassVar[int]
    id: str
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int
    def __init__(self, id: _Optional[str] = ..., resource_type: _Optional[int] = ..., resource_name: _Optional[str] = ..., pattern_type: _Optional[int] = ..., principal: _Optional[str] = ..., host: _Optional[str] = ..., operation: _Optional[int] = ..., permission_type: _Optional[int] = ...) -> None: ...

class RemoveAccessControlEntryRecord(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class AclCreation(_message.Message):
    __slots__ = ("resource_type", "resource_name", "resource_pattern_type", "principal", "host", "operation", "permission_type")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_PATTERN_TYPE_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_TYPE_FIELD_NUMBER: _ClassVar[int]
    resource_type: int
    resource_name: str
    resource_pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int
    def __init__(self, resource_type: _Optional[int] = ..., resource_name: _Optional[str] = ..., resource_pattern_type: _Optional[int] = ..., principal: _Optional[str] = ..., host: _Optional[str] = ..., operation: _Optional[int] = ..., permission_type: _Optional[int] = ...) -> None: ...

class CreateAclsRequest(_message.Message):
    __slots__ = ("creations",)
    CREATIONS_FIELD_NUMBER: _ClassVar[int]
    creations: _containers.RepeatedCompositeFieldContainer[AclCreation]
    def __init__(self, creations: _Optional[_Iterable[_Union[AclCreation, _Mapping]]] = ...) -> None: ...

class AclCreationResult(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class CreateAclsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AclCreationResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AclCreationResult, _Mapping]]] = ...) -> None: ...

class AclFilter(_message.Message):
    __slots__ = ("resource_type_filter", "resource_name_filter", "pattern_type_filter", "principal_filter", "host_filter", "operation", "permission_type")
    RESOURCE_TYPE_FILTER_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FILTER_FIELD_NUMBER: _ClassVar[int]
    PATTERN_TYPE_FILTER_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FILTER_FIELD_NUMBER: _ClassVar[int]
    HOST_FILTER_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_TYPE_FIELD_NUMBER: _ClassVar[int]
    resource_type_filter: int
    resource_name_filter: str
    pattern_type_filter: int
    principal_filter: str
    host_filter: str
    operation: int
    permission_type: int
    def __init__(self, resource_type_filter: _Optional[int] = ..., resource_name_filter: _Optional[str] = ..., pattern_type_filter: _Optional[int] = ..., principal_filter: _Optional[str] = ..., host_filter: _Optional[str] = ..., operation: _Optional[int] = ..., permission_type: _Optional[int] = ...) -> None: ...

class DeleteAclsRequest(_message.Message):
    __slots__ = ("filters",)
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    filters: _containers.RepeatedCompositeFieldContainer[AclFilter]
    def __init__(self, filters: _Optional[_Iterable[_Union[AclFilter, _Mapping]]] = ...) -> None: ...

class DeleteAclsMatchingAcl(_message.Message):
    __slots__ = ("error_code", "error_message", "resource_type", "resource_name", "pattern_type", "principal", "host", "operation", "permission_type")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_TYPE_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_TYPE_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., resource_type: _Optional[int] = ..., resource_name: _Optional[str] = ..., pattern_type: _Optional[int] = ..., principal: _Optional[str] = ..., host: _Optional[str] = ..., operation: _Optional[int] = ..., permission_type: _Optional[int] = ...) -> None: ...

class DeleteAclsFilterResult(_message.Message):
    __slots__ = ("error_code", "error_message", "matching_acls")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MATCHING_ACLS_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    matching_acls: _containers.RepeatedCompositeFieldContainer[DeleteAclsMatchingAcl]
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., matching_acls: _Optional[_Iterable[_Union[DeleteAclsMatchingAcl, _Mapping]]] = ...) -> None: ...

class DeleteAclsResponse(_message.Message):
    __slots__ = ("filter_results",)
    FILTER_RESULTS_FIELD_NUMBER: _ClassVar[int]
    filter_results: _containers.RepeatedCompositeFieldContainer[DeleteAclsFilterResult]
    def __init__(self, filter_results: _Optional[_Iterable[_Union[DeleteAclsFilterResult, _Mapping]]] = ...) -> None: ...

class DescribeAclsRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: AclFilter
    def __init__(self, filter: _Optional[_Union[AclFilter, _Mapping]] = ...) -> None: ...

class AclDescription(_message.Message):
    __slots__ = ("principal", "host", "operation", "permission_type")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_TYPE_FIELD_NUMBER: _ClassVar[int]
    principal: str
    host: str
    operation: int
    permission_type: int
    def __init__(self, principal: _Optional[str] = ..., host: _Optional[str] = ..., operation: _Optional[int] = ..., permission_type: _Optional[int] = ...) -> None: ...

class DescribeAclsResource(_message.Message):
    __slots__ = ("resource_type", "resource_name", "pattern_type", "acls")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_TYPE_FIELD_NUMBER: _ClassVar[int]
    ACLS_FIELD_NUMBER: _ClassVar[int]
    resource_type: int
    resource_name: str
    pattern_type: int
    acls: _containers.RepeatedCompositeFieldContainer[AclDescription]
    def __init__(self, resource_type: _Optional[int] = ..., resource_name: _Optional[str] = ..., pattern_type: _Optional[int] = ..., acls: _Optional[_Iterable[_Union[AclDescription, _Mapping]]] = ...) -> None: ...

class DescribeAclsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "resources")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    resources: _containers.RepeatedCompositeFieldContainer[DescribeAclsResource]
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., resources: _Optional[_Iterable[_Union[DescribeAclsResource, _Mapping]]] = ...) -> None: ...

class UserScramCredentialRecord(_message.Message):
    __slots__ = ("name", "mechanism", "salt", "stored_key", "server_key", "iterations")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    STORED_KEY_FIELD_NUMBER: _ClassVar[int]
    SERVER_KEY_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    mechanism: int
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int
    def __init__(self, name: _Optional[str] = ..., mechanism: _Optional[int] = ..., salt: _Optional[bytes] = ..., stored_key: _Optional[bytes] = ..., server_key: _Optional[bytes] = ..., iterations: _Optional[int] = ...) -> None: ...

class RemoveUserScramCredentialRecord(_message.Message):
    __slots__ = ("name", "mechanism")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    name: str
    mechanism: int
    def __init__(self, name: _Optional[str] = ..., mechanism: _Optional[int] = ...) -> None: ...

class ScramCredentialDeletion(_message.Message):
    __slots__ = ("name", "mechanism")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    name: str
    mechanism: int
    def __init__(self, name: _Optional[str] = ..., mechanism: _Optional[int] = ...) -> None: ...

class ScramCredentialUpsertion(_message.Message):
    __slots__ = ("name", "mechanism", "iterations", "salt", "salted_password")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    SALTED_PASSWORD_FIELD_NUMBER: _ClassVar[int]
    name: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes
    def __init__(self, name: _Optional[str] = ..., mechanism: _Optional[int] = ..., iterations: _Optional[int] = ..., salt: _Optional[bytes] = ..., salted_password: _Optional[bytes] = ...) -> None: ...

class AlterUserScramCredentialsRequest(_message.Message):
    __slots__ = ("deletions", "upsertions")
    DELETIONS_FIELD_NUMBER: _ClassVar[int]
    UPSERTIONS_FIELD_NUMBER: _ClassVar[int]
    deletions: _containers.RepeatedCompositeFieldContainer[ScramCredentialDeletion]
    upsertions: _containers.RepeatedCompositeFieldContainer[ScramCredentialUpsertion]
    def __init__(self, deletions: _Optional[_Iterable[_Union[ScramCredentialDeletion, _Mapping]]] = ..., upsertions: _Optional[_Iterable[_Union[ScramCredentialUpsertion, _Mapping]]] = ...) -> None: ...

class AlterUserScramCredentialsResult(_message.Message):
    __slots__ = ("user", "error_code", "error_message")
    USER_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    user: str
    error_code: ErrorCode
    error_message: str
    def __init__(self, user: _Optional[str] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class AlterUserScramCredentialsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AlterUserScramCredentialsResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AlterUserScramCredentialsResult, _Mapping]]] = ...) -> None: ...

class UserName(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DescribeUserScramCredentialsRequest(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[UserName]
    def __init__(self, users: _Optional[_Iterable[_Union[UserName, _Mapping]]] = ...) -> None: ...

class CredentialInfo(_message.Message):
    __slots__ = ("mechanism", "iterations")
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    mechanism: int
    iterations: int
    def __init__(self, mechanism: _Optional[int] = ..., iterations: _Optional[int] = ...) -> None: ...

class DescribeUserScramCredentialsResult(_message.Message):
    __slots__ = ("user", "error_code", "error_message", "credential_infos")
    USER_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_INFOS_FIELD_NUMBER: _ClassVar[int]
    user: str
    error_code: ErrorCode
    error_message: str
    credential_infos: _containers.RepeatedCompositeFieldContainer[CredentialInfo]
    def __init__(self, user: _Optional[str] = ..., error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., credential_infos: _Optional[_Iterable[_Union[CredentialInfo, _Mapping]]] = ...) -> None: ...

class DescribeUserScramCredentialsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "results")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error_code: ErrorCode
    error_message: str
    results: _containers.RepeatedCompositeFieldContainer[DescribeUserScramCredentialsResult]
    def __init__(self, error_code: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., results: _Optional[_Iterable[_Union[DescribeUserScramCredentialsResult, _Mapping]]] = ...) -> None: ...
