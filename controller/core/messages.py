"""The controller core's inputs and outputs: small frozen dataclasses, the whole seam between
`ControllerCore` and its gRPC shell (`controller/service.py` converts protobuf to and from these).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from minibroker.client.errors import ErrorCode
from minibroker.controller.core.isr import AlterPartitionProposal
from minibroker.metadata.image import BrokerRegistration
from minibroker.metadata.records import LogEntry, PartitionRecord

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Event:
    """One state transition, for the shell to log (structlog event name + fields) and count."""

    name: str
    fields: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Outcome(Generic[R]):
    """A command's reply and the log entries it produced.

    Contract (etcd's Ready rule): the caller makes `entries` durable (journal, fsync) BEFORE it
    sends `reply` or publishes the entries to watchers. The core has already applied them to its
    image; if they cannot be made durable the process must stop, because the core's state is
    ahead of the log.
    """

    reply: R
    entries: tuple[LogEntry, ...] = ()
    events: tuple[Event, ...] = ()


@dataclass(frozen=True, slots=True)
class RegisterRequest:
    broker_id: int
    cluster_id: str
    incarnation_id: str
    host: str
    port: int
    rack: str = ""
    metrics_port: int = -1
    previous_broker_epoch: int = -1
    kafka_host: str = ""  # the Kafka-protocol listener; kafka_port 0: none
    kafka_port: int = 0


@dataclass(frozen=True, slots=True)
class RegisterReply:
    error: ErrorCode
    message: str = ""
    broker_epoch: int = -1
    cluster_id: str = ""


@dataclass(frozen=True, slots=True)
class UnregisterBrokerReply:
    error: ErrorCode
    message: str = ""


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    broker_id: int
    broker_epoch: int
    current_metadata_offset: int
    want_fence: bool = False
    want_shut_down: bool = False
    # Kafka's OfflineLogDirs: the broker's failed log dirs (paths; untrusted, checked by the
    # core). Non-empty means the broker's only log dir failed and it can serve nothing.
    offline_log_dirs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    error: ErrorCode
    message: str = ""
    is_caught_up: bool = False
    is_fenced: bool = True
    should_shut_down: bool = False


@dataclass(frozen=True, slots=True)
class AlterPartitionRequest:
    broker_id: int
    broker_epoch: int
    proposals: tuple[AlterPartitionProposal, ...]


@dataclass(frozen=True, slots=True)
class AlterPartitionResult:
    topic_id: str
    partition: int
    error: ErrorCode
    message: str = ""
    record: PartitionRecord | None = None  # the committed state on success


@dataclass(frozen=True, slots=True)
class AlterPartitionReply:
    error: ErrorCode
    message: str = ""
    results: tuple[AlterPartitionResult, ...] = ()


@dataclass(frozen=True, slots=True)
class CreatableTopic:
    name: str
    num_partitions: int = -1  # -1: num.partitions
    replication_factor: int = -1  # -1: default.replication.factor
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CreateTopicResult:
    name: str
    error: ErrorCode
    message: str = ""
    topic_id: str = ""
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeleteTopicResult:
    name: str
    error: ErrorCode
    message: str = ""
    topic_id: str = ""


@dataclass(frozen=True, slots=True)
class ElectionResult:
    topic: str
    partition: int
    error: ErrorCode
    message: str = ""


@dataclass(frozen=True, slots=True)
class ProducerIdBlock:
    error: ErrorCode
    message: str = ""
    producer_id_start: int = -1
    producer_id_len: int = 0


@dataclass(frozen=True, slots=True)
class BrokerDescription:
    registration: BrokerRegistration
    last_heartbeat_ms_ago: int  # -1: not heard from since this controller started
    decommissioning: bool = False
    replica_count: int = 0  # partitions whose replicas (adding ones too) name this broker
    leader_count: int = 0


# -- moving replicas (KIP-455), CreatePartitions, dynamic configs, decommissioning ---------------


@dataclass(frozen=True, slots=True)
class ReassignmentTarget:
    """One partition of AlterPartitionReassignments: `replicas` is the target list (preferred
    leader first); None cancels the running reassignment (Kafka's null replicas)."""

    topic: str
    partition: int
    replicas: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class ReassignmentResult:
    topic: str
    partition: int
    error: ErrorCode
    message: str = ""


@dataclass(frozen=True, slots=True)
class OngoingReassignment:
    topic: str
    partition: int
    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CreatePartitionsTopic:
    name: str
    count: int  # the new total
    assignments: tuple[tuple[int, ...], ...] | None = None  # one per new partition; None: place


@dataclass(frozen=True, slots=True)
class CreatePartitionsResult:
    name: str
    error: ErrorCode
    message: str = ""


# IncrementalAlterConfigs operations (Kafka's AlterConfigOp.OpType ids).
CONFIG_OP_SET = 0
CONFIG_OP_DELETE = 1
CONFIG_OP_APPEND = 2
CONFIG_OP_SUBTRACT = 3

# DescribeConfigs sources (Kafka's DescribeConfigsResponse.ConfigSource ids).
CONFIG_SOURCE_DYNAMIC_TOPIC = 1
CONFIG_SOURCE_DYNAMIC_BROKER = 2
CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER = 3
CONFIG_SOURCE_STATIC_BROKER = 4
CONFIG_SOURCE_DEFAULT = 5


@dataclass(frozen=True, slots=True)
class AlterConfigOp:
    name: str
    op: int  # CONFIG_OP_*
    value: str | None = None


@dataclass(frozen=True, slots=True)
class AlterConfigsResource:
    """resource_type: metadata.records.CONFIG_RESOURCE_TOPIC (name = topic name) or
    CONFIG_RESOURCE_BROKER (name = broker id, "" = the cluster-wide default)."""

    resource_type: int
    resource_name: str
    ops: tuple[AlterConfigOp, ...]


@dataclass(frozen=True, slots=True)
class AlterConfigsResult:
    resource_type: int
    resource_name: str
    error: ErrorCode
    message: str = ""


@dataclass(frozen=True, slots=True)
class DescribeConfigsResource:
    resource_type: int
    resource_name: str
    keys: tuple[str, ...] = ()  # empty: every config


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: int  # CONFIG_SOURCE_*
    read_only: bool = False
    documentation: str = ""


@dataclass(frozen=True, slots=True)
class DescribeConfigsResult:
    resource_type: int
    resource_name: str
    error: ErrorCode
    message: str = ""
    entries: tuple[ConfigEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class DecommissionReply:
    error: ErrorCode
    message: str = ""
    partitions_moving: int = 0  # reassignments this request started


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    cluster_id: str
    controller_id: int
    metadata_offset: int  # the next offset of the metadata log
    brokers: tuple[BrokerDescription, ...]


__all__ = [
    "CONFIG_OP_APPEND",
    "CONFIG_OP_DELETE",
    "CONFIG_OP_SET",
    "CONFIG_OP_SUBTRACT",
    "CONFIG_SOURCE_DEFAULT",
    "CONFIG_SOURCE_DYNAMIC_BROKER",
    "CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER",
    "CONFIG_SOURCE_DYNAMIC_TOPIC",
    "CONFIG_SOURCE_STATIC_BROKER",
    "AlterConfigOp",
    "AlterConfigsResource",
    "AlterConfigsResult",
    "AlterPartitionReply",
    "AlterPartitionRequest",
    "AlterPartitionResult",
    "BrokerDescription",
    "ClusterDescription",
    "ConfigEntry",
    "CreatableTopic",
    "CreatePartitionsResult",
    "CreatePartitionsTopic",
    "CreateTopicResult",
    "DecommissionReply",
    "DeleteTopicResult",
    "DescribeConfigsResource",
    "DescribeConfigsResult",
    "ElectionResult",
    "Event",
    "HeartbeatReply",
    "HeartbeatRequest",
    "OngoingReassignment",
    "Outcome",
    "ProducerIdBlock",
    "ReassignmentResult",
    "ReassignmentTarget",
    "RegisterReply",
    "RegisterRequest",
    "UnregisterBrokerReply",
]
