"""The metadata image: the cluster state that the metadata log builds, record by record.

Pure: no I/O. The controller keeps one as its state; brokers and tools keep one by following
`WatchMetadata`. `apply(entry)` must be called in offset order; `replace_with_snapshot` loads a
snapshot (the whole image as records, as of an offset). `to_records()` is the inverse: a list of
records that rebuilds an equal image. Not thread-safe: one owner mutates it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from minibroker.client.common.scram import ScramCredential, ScramMechanism
from minibroker.client.types import NO_LEADER
from minibroker.metadata.acl import (
    AclBinding,
    AclIndex,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    enum_or_unknown,
)
from minibroker.metadata.records import (
    CONFIG_RESOURCE_BROKER,
    CONFIG_RESOURCE_TOPIC,
    AccessControlEntryRecord,
    BrokerDecommissionRecord,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    LeaderChangeRecord,
    LogEntry,
    MetadataRecord,
    NoOpRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveAccessControlEntryRecord,
    RemoveTopicRecord,
    RemoveUserScramCredentialRecord,
    TopicRecord,
    UnregisterBrokerRecord,
    UserScramCredentialRecord,
)


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    """A registered broker as of the latest record about it."""

    broker_id: int
    incarnation_id: str
    broker_epoch: int
    host: str
    port: int
    rack: str
    fenced: bool
    in_controlled_shutdown: bool
    metrics_port: int
    kafka_host: str = ""  # the Kafka-protocol listener; kafka_port 0: none
    kafka_port: int = 0

    @property
    def is_active(self) -> bool:
        """May lead and be in an ISR: 'acceptable' in docs/protocol.md §17."""
        return not self.fenced and not self.in_controlled_shutdown


@dataclass(slots=True)
class TopicImage:
    name: str
    topic_id: str
    configs: dict[str, str] = field(default_factory=dict)
    partitions: dict[int, PartitionRecord] = field(default_factory=dict)


class MetadataImage:
    """Brokers, topics (by name and by id) with their partitions, and the producer-id cursor.

    `next_offset` is the offset after the last applied entry (the `from_offset` to watch from).
    """

    def __init__(self) -> None:
        self.brokers: dict[int, BrokerRegistration] = {}
        self.topics_by_id: dict[str, TopicImage] = {}
        self.topic_ids_by_name: dict[str, str] = {}
        self.next_producer_id: int = 0
        self.next_offset: int = 0
        # (leader id, epoch) of the controller quorum's leader, from the last LeaderChangeRecord.
        self.quorum_leader: tuple[int, int] | None = None
        # Dynamic broker configs by resource name: "" the cluster-wide default, "1" broker 1.
        self.broker_configs: dict[str, dict[str, str]] = {}
        # Brokers marked for decommissioning (BrokerDecommissionRecord).
        self.decommissioning: set[int] = set()
        # ACLs by id (AccessControlEntryRecord), indexed for the authorizer, which reads this
        # same object (a snapshot load refills it in place).
        self.acls: AclIndex = AclIndex()
        # SCRAM credentials: user name -> mechanism -> credential (UserScramCredentialRecord).
        self.scram_credentials: dict[str, dict[ScramMechanism, ScramCredential]] = {}

    # -- queries ------------------------------------------------------------------------------

    def topic(self, name: str) -> TopicImage | None:
        topic_id = self.topic_ids_by_name.get(name)
        return None if topic_id is None else self.topics_by_id.get(topic_id)

    def partition(self, topic_id: str, partition: int) -> PartitionRecord | None:
        topic = self.topics_by_id.get(topic_id)
        return None if topic is None else topic.partitions.get(partition)

    def partitions(self) -> Iterator[tuple[TopicImage, PartitionRecord]]:
        """Every partition, in topic-name then partition order (deterministic)."""
        for name in sorted(self.topic_ids_by_name):
            topic = self.topics_by_id[self.topic_ids_by_name[name]]
            for index in sorted(topic.partitions):
                yield topic, topic.partitions[index]

    def partition_count(self) -> int:
        return sum(len(t.partitions) for t in self.topics_by_id.values())

    def is_active(self, broker_id: int) -> bool:
        broker = self.brokers.get(broker_id)
        return broker is not None and broker.is_active

    def broker_config(self, broker_id: int) -> dict[str, str]:
        """The dynamic configs in force on `broker_id`: its own over the cluster default."""
        merged = dict(self.broker_configs.get("", {}))
        merged.update(self.broker_configs.get(str(broker_id), {}))
        return merged

    def scram_credential(self, user: str, mechanism: int) -> ScramCredential | None:
        """`user`'s credential for `mechanism` (Kafka's number), None when it has none."""
        return self.scram_credentials.get(user, {}).get(ScramMechanism.of(mechanism))

    def reassignments(self) -> Iterator[tuple[TopicImage, PartitionRecord]]:
        """Every partition with a reassignment in progress, in `partitions()` order."""
        return ((t, p) for t, p in self.partitions() if p.is_reassigning)

    def offline_partition_count(self) -> int:
        return sum(1 for _, p in self.partitions() if p.leader == NO_LEADER)

    def preferred_imbalance_count(self) -> int:
        """Partitions whose leader is not the preferred replica (Kafka's
        PreferredReplicaImbalanceCount)."""
        return sum(1 for _, p in self.partitions() if p.leader != p.preferred_leader)

    # -- applying records ---------------------------------------------------------------------

    def apply(self, entry: LogEntry) -> None:
        """Apply one log entry; entries must come in offset order."""
        if entry.offset < self.next_offset:
            raise ValueError(f"entry offset {entry.offset} is below next offset {self.next_offset}")
        self.apply_record(entry.record)
        self.next_offset = entry.offset + 1

    def apply_record(self, record: MetadataRecord) -> None:
        """Apply a record's effect without moving `next_offset` (snapshot loading)."""
        if isinstance(record, PartitionRecord):
            topic = self.topics_by_id.get(record.topic_id)
            if topic is not None:
                topic.partitions[record.partition] = record
        elif isinstance(record, BrokerRegistrationChangeRecord):
            broker = self.brokers.get(record.broker_id)
            # A change for an older incarnation is stale: the new registration superseded it.
            if broker is not None and broker.broker_epoch == record.broker_epoch:
                if record.fenced is not None:
                    broker = replace(broker, fenced=record.fenced)
                if record.in_controlled_shutdown is not None:
                    broker = replace(broker, in_controlled_shutdown=record.in_controlled_shutdown)
                self.brokers[record.broker_id] = broker
        elif isinstance(record, RegisterBrokerRecord):
            self.brokers[record.broker_id] = BrokerRegistration(
                broker_id=record.broker_id,
                incarnation_id=record.incarnation_id,
                broker_epoch=record.broker_epoch,
                host=record.host,
                port=record.port,
                rack=record.rack,
                fenced=record.fenced,
                in_controlled_shutdown=False,
                metrics_port=record.metrics_port,
                kafka_host=record.kafka_host,
                kafka_port=record.kafka_port,
            )
        elif isinstance(record, UnregisterBrokerRecord):
            broker = self.brokers.get(record.broker_id)
            # Only the incarnation it names: a later registration has replaced that one.
            if broker is not None and broker.broker_epoch == record.broker_epoch:
                del self.brokers[record.broker_id]
        elif isinstance(record, TopicRecord):
            self.topics_by_id[record.topic_id] = TopicImage(
                record.name, record.topic_id, dict(record.configs)
            )
            self.topic_ids_by_name[record.name] = record.topic_id
        elif isinstance(record, RemoveTopicRecord):
            removed = self.topics_by_id.pop(record.topic_id, None)
            if removed is not None and self.topic_ids_by_name.get(removed.name) == record.topic_id:
                del self.topic_ids_by_name[removed.name]
        elif isinstance(record, ProducerIdsRecord):
            self.next_producer_id = max(self.next_producer_id, record.next_producer_id)
        elif isinstance(record, ConfigRecord):
            if record.resource_type == CONFIG_RESOURCE_BROKER:
                configs = self.broker_configs.setdefault(record.resource_name, {})
                if record.value is None:
                    configs.pop(record.name, None)
                    if not configs:
                        del self.broker_configs[record.resource_name]
                else:
                    configs[record.name] = record.value
                return
            topic = self.topics_by_id.get(record.resource_name)
            if topic is not None and record.resource_type == CONFIG_RESOURCE_TOPIC:
                if record.value is None:
                    topic.configs.pop(record.name, None)
                else:
                    topic.configs[record.name] = record.value
        elif isinstance(record, BrokerDecommissionRecord):
            if record.decommissioning:
                self.decommissioning.add(record.broker_id)
            else:
                self.decommissioning.discard(record.broker_id)
        elif isinstance(record, AccessControlEntryRecord):
            self.acls.add(record.id, binding_of(record))
        elif isinstance(record, RemoveAccessControlEntryRecord):
            self.acls.remove(record.id)
        elif isinstance(record, UserScramCredentialRecord):
            mechanism = ScramMechanism.of(record.mechanism)
            self.scram_credentials.setdefault(record.name, {})[mechanism] = ScramCredential(
                mechanism, record.salt, record.stored_key, record.server_key, record.iterations
            )
        elif isinstance(record, RemoveUserScramCredentialRecord):
            credentials = self.scram_credentials.get(record.name, {})
            credentials.pop(ScramMechanism.of(record.mechanism), None)
            if not credentials:
                self.scram_credentials.pop(record.name, None)
        elif isinstance(record, NoOpRecord):
            return
        elif isinstance(record, LeaderChangeRecord):
            self.quorum_leader = (record.leader_id, record.leader_epoch)
        else:
            raise TypeError(f"not a metadata record: {record!r}")

    def replace_with_snapshot(
        self, records: Iterable[MetadataRecord], snapshot_offset: int
    ) -> None:
        """Replace the whole state with a snapshot taken as of `snapshot_offset` (the next
        offset at the time of the snapshot)."""
        acls = self.acls
        self.__init__()  # type: ignore[misc]
        acls.clear()  # the same object: whoever holds the image's ACL view keeps seeing it
        self.acls = acls
        for record in records:
            self.apply_record(record)
        self.next_offset = snapshot_offset

    def to_records(self) -> list[MetadataRecord]:
        """Records that rebuild this image (brokers, topics with configs, partitions, the
        producer-id cursor, SCRAM credentials), in an order `apply_record` accepts."""
        out: list[MetadataRecord] = []
        for broker_id in sorted(self.brokers):
            b = self.brokers[broker_id]
            out.append(
                RegisterBrokerRecord(
                    b.broker_id,
                    b.incarnation_id,
                    b.broker_epoch,
                    b.host,
                    b.port,
                    b.rack,
                    b.fenced,
                    b.metrics_port,
                    b.kafka_host,
                    b.kafka_port,
                )
            )
            if b.in_controlled_shutdown:
                out.append(
                    BrokerRegistrationChangeRecord(
                        b.broker_id, b.broker_epoch, in_controlled_shutdown=True
                    )
                )
        for name in sorted(self.topic_ids_by_name):
            topic = self.topics_by_id[self.topic_ids_by_name[name]]
            out.append(TopicRecord(topic.name, topic.topic_id, dict(topic.configs)))
            out.extend(topic.partitions[i] for i in sorted(topic.partitions))
        for resource in sorted(self.broker_configs):
            for name, value in sorted(self.broker_configs[resource].items()):
                out.append(ConfigRecord(resource, name, value, CONFIG_RESOURCE_BROKER))
        out.extend(BrokerDecommissionRecord(b, True) for b in sorted(self.decommissioning))
        out.extend(acl_record(acl_id, self.acls[acl_id]) for acl_id in sorted(self.acls))
        for user in sorted(self.scram_credentials):
            for mechanism, c in sorted(self.scram_credentials[user].items()):
                out.append(
                    UserScramCredentialRecord(
                        user, int(mechanism), c.salt, c.stored_key, c.server_key, c.iterations
                    )
                )
        if self.next_producer_id:
            out.append(ProducerIdsRecord(-1, -1, self.next_producer_id))
        if self.quorum_leader is not None:
            out.append(LeaderChangeRecord(*self.quorum_leader))
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MetadataImage):
            return NotImplemented
        return self.next_offset == other.next_offset and self.to_records() == other.to_records()

    __hash__ = None  # type: ignore[assignment]


def binding_of(record: AccessControlEntryRecord) -> AclBinding:
    """The ACL a record carries (numbers no member names become UNKNOWN)."""
    return AclBinding(
        ResourceType(enum_or_unknown(ResourceType, record.resource_type)),
        record.resource_name,
        PatternType(enum_or_unknown(PatternType, record.pattern_type)),
        record.principal,
        record.host,
        AclOperation(enum_or_unknown(AclOperation, record.operation)),
        AclPermissionType(enum_or_unknown(AclPermissionType, record.permission_type)),
    )


def acl_record(acl_id: str, b: AclBinding) -> AccessControlEntryRecord:
    """The record that stores ACL `b` under `acl_id`."""
    return AccessControlEntryRecord(
        acl_id,
        int(b.resource_type),
        b.resource_name,
        int(b.pattern_type),
        b.principal,
        b.host,
        int(b.operation),
        int(b.permission_type),
    )


__all__ = ["BrokerRegistration", "MetadataImage", "TopicImage", "acl_record", "binding_of"]
