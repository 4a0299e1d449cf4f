"""The metadata log's record types as plain frozen dataclasses (KRaft's metadata records).

Pure: no I/O. These mirror the `MetadataRecord` oneof of proto/minibroker.proto one to one;
`minibroker.metadata.wire` converts between the two. The controller writes them, brokers
and tools apply them to a `MetadataImage` in offset order. A `LogEntry` is one record at its
offset in the log; the offset of a broker's RegisterBrokerRecord is its broker epoch (Kafka).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from minibroker.client.types import NO_LEADER

LEADER_RECOVERED = 0
LEADER_RECOVERING = 1  # after an unclean election (KIP-704)

# Kafka's ConfigResource types, as stored in ConfigRecord.resource_type.
CONFIG_RESOURCE_TOPIC = 2
CONFIG_RESOURCE_BROKER = 4


@dataclass(frozen=True, slots=True)
class RegisterBrokerRecord:
    """A broker process registered; a new incarnation replaces the old registration."""

    broker_id: int
    incarnation_id: str
    broker_epoch: int  # == the offset of this record
    host: str
    port: int
    rack: str = ""
    fenced: bool = True
    metrics_port: int = -1
    kafka_host: str = ""  # the Kafka-protocol listener; kafka_port 0: none
    kafka_port: int = 0


@dataclass(frozen=True, slots=True)
class BrokerRegistrationChangeRecord:
    """Fence/unfence a broker or mark its controlled shutdown; None leaves a flag unchanged."""

    broker_id: int
    broker_epoch: int
    fenced: bool | None = None
    in_controlled_shutdown: bool | None = None


@dataclass(frozen=True, slots=True)
class UnregisterBrokerRecord:
    """A broker's registration was removed (Kafka's UnregisterBrokerRecord, written by
    UnregisterBroker for a broker that is gone for good). Replica lists may still name it."""

    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """A topic was created. `configs` holds only the configs set on the topic (Kafka keeps
    defaults out of the log, so a changed default applies to every topic that did not set it)."""

    name: str
    topic_id: str
    configs: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class PartitionRecord:
    """The FULL state of one partition, written at creation and on every change.

    Invariants (docs/design.md §8.8): isr is a non-empty subset of replicas; leader is
    NO_LEADER or a member of isr; leader_epoch and partition_epoch only grow along the log, and
    every leader_epoch change comes with a partition_epoch change.
    """

    topic_id: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    leader_recovery_state: int = LEADER_RECOVERED
    reason: str = ""
    # A reassignment in progress (KIP-455): `replicas` is the target followed by the original
    # replicas not in the target; adding = target - original, removing = original - target.
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0] if self.replicas else NO_LEADER

    @property
    def is_reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

    @property
    def target_replicas(self) -> tuple[int, ...]:
        """Where the partition is going: replicas - removing, in order (== replicas when no
        reassignment runs)."""
        removing = self.removing_replicas
        return tuple(b for b in self.replicas if b not in removing)

    @property
    def original_replicas(self) -> tuple[int, ...]:
        """Where the partition was before the running reassignment: replicas - adding."""
        adding = self.adding_replicas
        return tuple(b for b in self.replicas if b not in adding)


@dataclass(frozen=True, slots=True)
class RemoveTopicRecord:
    topic_id: str


@dataclass(frozen=True, slots=True)
class ProducerIdsRecord:
    """A block of producer ids was handed to a broker; `next_producer_id` is the first id not
    yet handed out, so ids are never reused across controller restarts."""

    broker_id: int
    broker_epoch: int
    next_producer_id: int


@dataclass(frozen=True, slots=True)
class ConfigRecord:
    """A dynamic config was set (value) or removed (value None), Kafka's ConfigRecord.

    `resource_type` CONFIG_RESOURCE_TOPIC: `resource_name` is the topic id.
    `resource_type` CONFIG_RESOURCE_BROKER: `resource_name` is the broker id ("1"), or "" for
    the cluster-wide default of every broker."""

    resource_name: str
    name: str
    value: str | None
    resource_type: int = CONFIG_RESOURCE_TOPIC


@dataclass(frozen=True, slots=True)
class BrokerDecommissionRecord:
    """A broker was marked for decommissioning (its replicas move away and it gets no new ones)
    or the mark was removed. Not tied to a registration: it survives the broker's restarts."""

    broker_id: int
    decommissioning: bool


@dataclass(frozen=True, slots=True)
class NoOpRecord:
    """Keeps the log moving; changes nothing."""


@dataclass(frozen=True, slots=True)
class LeaderChangeRecord:
    """The first record a new quorum leader appends in its epoch (KIP-595's LeaderChangeMessage).

    Its commit makes the leader's earlier records committed too (Raft commits only an entry of
    the leader's own epoch by counting replicas). It changes nothing in the image but which
    controller leads (`MetadataImage.quorum_leader`)."""

    leader_id: int
    leader_epoch: int
    voters: tuple[int, ...] = ()
    granting_voters: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class AccessControlEntryRecord:
    """An ACL was created (Kafka's AccessControlEntryRecord). The numbers are Kafka's
    (`minibroker.metadata.acl`: ResourceType, PatternType, AclOperation, AclPermissionType);
    `id` is the ACL's id, which a RemoveAccessControlEntryRecord names."""

    id: str
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int


@dataclass(frozen=True, slots=True)
class RemoveAccessControlEntryRecord:
    """The ACL `id` was deleted (Kafka's RemoveAccessControlEntryRecord)."""

    id: str


@dataclass(frozen=True, slots=True)
class UserScramCredentialRecord:
    """A user's SCRAM credential for one mechanism was set (Kafka's UserScramCredentialRecord):
    the salt, stored key and server key of RFC 5802, never the password. `mechanism` is Kafka's
    ScramMechanism number (1 SCRAM-SHA-256, 2 SCRAM-SHA-512)."""

    name: str
    mechanism: int
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __repr__(self) -> str:  # keys stay out of log lines
        return (
            f"UserScramCredentialRecord(name={self.name!r}, mechanism={self.mechanism}, "
            f"iterations={self.iterations})"
        )


@dataclass(frozen=True, slots=True)
class RemoveUserScramCredentialRecord:
    """A user's SCRAM credential for one mechanism was deleted."""

    name: str
    mechanism: int


MetadataRecord = (
    RegisterBrokerRecord
    | BrokerRegistrationChangeRecord
    | UnregisterBrokerRecord
    | TopicRecord
    | PartitionRecord
    | RemoveTopicRecord
    | ProducerIdsRecord
    | ConfigRecord
    | NoOpRecord
    | LeaderChangeRecord
    | BrokerDecommissionRecord
    | AccessControlEntryRecord
    | RemoveAccessControlEntryRecord
    | UserScramCredentialRecord
    | RemoveUserScramCredentialRecord
)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One record at its place in the metadata log."""

    offset: int
    timestamp_ms: int
    record: MetadataRecord


__all__ = [
    "CONFIG_RESOURCE_BROKER",
    "CONFIG_RESOURCE_TOPIC",
    "LEADER_RECOVERED",
    "LEADER_RECOVERING",
    "NO_LEADER",
    "AccessControlEntryRecord",
    "BrokerDecommissionRecord",
    "BrokerRegistrationChangeRecord",
    "ConfigRecord",
    "LeaderChangeRecord",
    "LogEntry",
    "MetadataRecord",
    "NoOpRecord",
    "PartitionRecord",
    "ProducerIdsRecord",
    "RegisterBrokerRecord",
    "RemoveAccessControlEntryRecord",
    "RemoveTopicRecord",
    "RemoveUserScramCredentialRecord",
    "TopicRecord",
    "UnregisterBrokerRecord",
    "UserScramCredentialRecord",
]
