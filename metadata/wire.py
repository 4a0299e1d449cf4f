"""Conversion between metadata records and their protobuf form (`minibroker_pb2.MetadataRecord`,
`MetadataBatch`).

Pure functions over generated protobuf messages: no I/O. Used by the controller (journal,
WatchMetadata) and by brokers and tools following the log, so that no core code sees `_pb2` types.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import (
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
from minibroker.proto import minibroker_pb2 as pb


def record_to_pb(
    record: MetadataRecord, offset: int = -1, timestamp_ms: int = 0
) -> pb.MetadataRecord:
    msg = pb.MetadataRecord(offset=offset, timestamp_ms=timestamp_ms)
    if isinstance(record, PartitionRecord):
        msg.partition.CopyFrom(
            pb.PartitionRecord(
                topic_id=record.topic_id,
                partition=record.partition,
                replicas=record.replicas,
                isr=record.isr,
                leader=record.leader,
                leader_epoch=record.leader_epoch,
                partition_epoch=record.partition_epoch,
                leader_recovery_state=record.leader_recovery_state,
                reason=record.reason,
                adding_replicas=record.adding_replicas,
                removing_replicas=record.removing_replicas,
            )
        )
    elif isinstance(record, RegisterBrokerRecord):
        msg.register_broker.CopyFrom(
            pb.RegisterBrokerRecord(
                broker_id=record.broker_id,
                incarnation_id=record.incarnation_id,
                broker_epoch=record.broker_epoch,
                host=record.host,
                port=record.port,
                rack=record.rack,
                fenced=record.fenced,
                metrics_port=record.metrics_port,
                kafka_host=record.kafka_host,
                kafka_port=record.kafka_port,
            )
        )
    elif isinstance(record, BrokerRegistrationChangeRecord):
        change = pb.BrokerRegistrationChangeRecord(
            broker_id=record.broker_id, broker_epoch=record.broker_epoch
        )
        if record.fenced is not None:
            change.fenced = record.fenced
        if record.in_controlled_shutdown is not None:
            change.in_controlled_shutdown = record.in_controlled_shutdown
        msg.broker_change.CopyFrom(change)
    elif isinstance(record, UnregisterBrokerRecord):
        msg.unregister_broker.CopyFrom(
            pb.UnregisterBrokerRecord(broker_id=record.broker_id, broker_epoch=record.broker_epoch)
        )
    elif isinstance(record, TopicRecord):
        msg.topic.CopyFrom(
            pb.TopicRecord(name=record.name, topic_id=record.topic_id, configs=dict(record.configs))
        )
    elif isinstance(record, RemoveTopicRecord):
        msg.remove_topic.CopyFrom(pb.RemoveTopicRecord(topic_id=record.topic_id))
    elif isinstance(record, ProducerIdsRecord):
        msg.producer_ids.CopyFrom(
            pb.ProducerIdsRecord(
                broker_id=record.broker_id,
                broker_epoch=record.broker_epoch,
                next_producer_id=record.next_producer_id,
            )
        )
    elif isinstance(record, ConfigRecord):
        config = pb.ConfigRecord(
            resource_name=record.resource_name,
            name=record.name,
            resource_type=record.resource_type,
        )
        if record.value is not None:
            config.value = record.value
        msg.config.CopyFrom(config)
    elif isinstance(record, NoOpRecord):
        msg.no_op.CopyFrom(pb.NoOpRecord())
    elif isinstance(record, BrokerDecommissionRecord):
        msg.broker_decommission.CopyFrom(
            pb.BrokerDecommissionRecord(
                broker_id=record.broker_id, decommissioning=record.decommissioning
            )
        )
    elif isinstance(record, LeaderChangeRecord):
        msg.leader_change.CopyFrom(
            pb.LeaderChangeRecord(
                leader_id=record.leader_id,
                leader_epoch=record.leader_epoch,
                voters=record.voters,
                granting_voters=record.granting_voters,
            )
        )
    elif isinstance(record, AccessControlEntryRecord):
        msg.access_control_entry.CopyFrom(
            pb.AccessControlEntryRecord(
                id=record.id,
                resource_type=record.resource_type,
                resource_name=record.resource_name,
                pattern_type=record.pattern_type,
                principal=record.principal,
                host=record.host,
                operation=record.operation,
                permission_type=record.permission_type,
            )
        )
    elif isinstance(record, RemoveAccessControlEntryRecord):
        msg.remove_access_control_entry.CopyFrom(pb.RemoveAccessControlEntryRecord(id=record.id))
    elif isinstance(record, UserScramCredentialRecord):
        msg.user_scram_credential.CopyFrom(
            pb.UserScramCredentialRecord(
                name=record.name,
                mechanism=record.mechanism,
                salt=record.salt,
                stored_key=record.stored_key,
                server_key=record.server_key,
                iterations=record.iterations,
            )
        )
    elif isinstance(record, RemoveUserScramCredentialRecord):
        msg.remove_user_scram_credential.CopyFrom(
            pb.RemoveUserScramCredentialRecord(name=record.name, mechanism=record.mechanism)
        )
    else:
        raise TypeError(f"not a metadata record: {record!r}")
    return msg


def record_from_pb(msg: pb.MetadataRecord) -> MetadataRecord:
    kind = msg.WhichOneof("record")
    if kind == "partition":
        p = msg.partition
        return PartitionRecord(
            topic_id=p.topic_id,
            partition=p.partition,
            replicas=tuple(p.replicas),
            isr=tuple(p.isr),
            leader=p.leader,
            leader_epoch=p.leader_epoch,
            partition_epoch=p.partition_epoch,
            leader_recovery_state=p.leader_recovery_state,
            reason=p.reason,
            adding_replicas=tuple(p.adding_replicas),
            removing_replicas=tuple(p.removing_replicas),
        )
    if kind == "register_broker":
        r = msg.register_broker
        return RegisterBrokerRecord(
            broker_id=r.broker_id,
            incarnation_id=r.incarnation_id,
            broker_epoch=r.broker_epoch,
            host=r.host,
            port=r.port,
            rack=r.rack,
            fenced=r.fenced,
            metrics_port=r.metrics_port,
            kafka_host=r.kafka_host,
            kafka_port=r.kafka_port,
        )
    if kind == "broker_change":
        c = msg.broker_change
        return BrokerRegistrationChangeRecord(
            broker_id=c.broker_id,
            broker_epoch=c.broker_epoch,
            fenced=c.fenced if c.HasField("fenced") else None,
            in_controlled_shutdown=(
                c.in_controlled_shutdown if c.HasField("in_controlled_shutdown") else None
            ),
        )
    if kind == "unregister_broker":
        u = msg.unregister_broker
        return UnregisterBrokerRecord(u.broker_id, u.broker_epoch)
    if kind == "topic":
        return TopicRecord(msg.topic.name, msg.topic.topic_id, dict(msg.topic.configs))
    if kind == "remove_topic":
        return RemoveTopicRecord(msg.remove_topic.topic_id)
    if kind == "producer_ids":
        i = msg.producer_ids
        return ProducerIdsRecord(i.broker_id, i.broker_epoch, i.next_producer_id)
    if kind == "config":
        c = msg.config
        return ConfigRecord(
            c.resource_name,
            c.name,
            c.value if c.HasField("value") else None,
            c.resource_type or CONFIG_RESOURCE_TOPIC,  # 0: written before broker configs
        )
    if kind == "no_op":
        return NoOpRecord()
    if kind == "broker_decommission":
        d = msg.broker_decommission
        return BrokerDecommissionRecord(d.broker_id, d.decommissioning)
    if kind == "leader_change":
        c = msg.leader_change
        return LeaderChangeRecord(
            c.leader_id, c.leader_epoch, tuple(c.voters), tuple(c.granting_voters)
        )
    if kind == "access_control_entry":
        a = msg.access_control_entry
        return AccessControlEntryRecord(
            a.id,
            a.resource_type,
            a.resource_name,
            a.pattern_type,
            a.principal,
            a.host,
            a.operation,
            a.permission_type,
        )
    if kind == "remove_access_control_entry":
        return RemoveAccessControlEntryRecord(msg.remove_access_control_entry.id)
    if kind == "user_scram_credential":
        u = msg.user_scram_credential
        return UserScramCredentialRecord(
            u.name, u.mechanism, u.salt, u.stored_key, u.server_key, u.iterations
        )
    if kind == "remove_user_scram_credential":
        r = msg.remove_user_scram_credential
        return RemoveUserScramCredentialRecord(r.name, r.mechanism)
    raise ValueError(f"metadata record without a known body: {kind!r}")


def entry_to_pb(entry: LogEntry) -> pb.MetadataRecord:
    return record_to_pb(entry.record, entry.offset, entry.timestamp_ms)


def entry_from_pb(msg: pb.MetadataRecord) -> LogEntry:
    return LogEntry(msg.offset, msg.timestamp_ms, record_from_pb(msg))


def batch_to_pb(entries: Iterable[LogEntry], high_offset: int) -> pb.MetadataBatch:
    """A live batch: consecutive entries and the controller's next offset after them."""
    return pb.MetadataBatch(records=[entry_to_pb(e) for e in entries], high_offset=high_offset)


def snapshot_to_pb(records: Iterable[MetadataRecord], snapshot_offset: int) -> pb.MetadataBatch:
    """A snapshot batch: the whole image as of `snapshot_offset` (its next offset)."""
    return pb.MetadataBatch(
        is_snapshot=True,
        snapshot_offset=snapshot_offset,
        records=[record_to_pb(r) for r in records],
        high_offset=snapshot_offset,
    )


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """A `MetadataBatch` in domain form. For a snapshot, `records` is the image and `entries`
    is empty; for a live batch, `entries` carries the records at their offsets."""

    is_snapshot: bool
    snapshot_offset: int
    records: tuple[MetadataRecord, ...]
    entries: tuple[LogEntry, ...]
    high_offset: int


def batch_from_pb(msg: pb.MetadataBatch) -> DecodedBatch:
    if msg.is_snapshot:
        return DecodedBatch(
            True,
            msg.snapshot_offset,
            tuple(record_from_pb(r) for r in msg.records),
            (),
            msg.high_offset,
        )
    return DecodedBatch(
        False, -1, (), tuple(entry_from_pb(r) for r in msg.records), msg.high_offset
    )


__all__ = [
    "DecodedBatch",
    "apply_batch",
    "batch_from_pb",
    "batch_to_pb",
    "entry_from_pb",
    "entry_to_pb",
    "record_from_pb",
    "record_to_pb",
    "snapshot_to_pb",
]


def apply_batch(image: MetadataImage, msg: pb.MetadataBatch) -> DecodedBatch:
    """Apply a WatchMetadata batch to `image` (a snapshot replaces it) and return it decoded.
    Entries below `image.next_offset` (a resent prefix after a reconnect) are skipped."""
    decoded = batch_from_pb(msg)
    if decoded.is_snapshot:
        image.replace_with_snapshot(decoded.records, decoded.snapshot_offset)
    else:
        for entry in decoded.entries:
            if entry.offset >= image.next_offset:
                image.apply(entry)
    return decoded
