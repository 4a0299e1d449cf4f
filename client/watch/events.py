"""The timeline of `minibroker watch`: what kinds of event there are and how each is found.

Pure: no I/O, no clock. A metadata record is diffed against the image before it is applied (a
PartitionRecord is the full state of a partition, so a leader change is an election, a leader of -1
an offline partition, a smaller ISR a shrink, a larger one an expansion); a snapshot that skipped
records is diffed image against image; a broker's last truncation, and a replica's last log
cleaner round, as DescribeReplicas reports them, become one event each. The model
(`minibroker.client.watch.model`) adds reachability and process events of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from minibroker.client.types import NO_LEADER
from minibroker.client.watch.observations import CleanerRunReport, ReplicaReport
from minibroker.metadata.image import BrokerRegistration, MetadataImage
from minibroker.metadata.records import (
    CONFIG_RESOURCE_BROKER,
    LEADER_RECOVERING,
    BrokerDecommissionRecord,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
)


class EventKind(StrEnum):
    ELECTION = "election"
    OFFLINE = "offline"
    ISR_SHRINK = "isr-shrink"
    ISR_EXPAND = "isr-expand"
    REASSIGNMENT = "reassignment"
    REASSIGNMENT_STARTED = "move-started"
    REPLICA_CAUGHT_UP = "caught-up"
    REASSIGNMENT_COMPLETED = "move-done"
    REASSIGNMENT_CANCELLED = "move-cancelled"
    DECOMMISSIONING = "decommissioning"
    DECOMMISSIONED = "decommissioned"
    CONFIG = "config"
    TRUNCATION = "truncation"
    CLEANER = "cleaner"
    REGISTERED = "registered"
    FENCED = "fenced"
    UNREGISTERED = "unregistered"
    UNFENCED = "unfenced"
    CONTROLLED_SHUTDOWN = "shutdown"
    TOPIC_CREATED = "topic-created"
    TOPIC_DELETED = "topic-deleted"
    UNREACHABLE = "unreachable"
    REACHABLE = "reachable"
    PROCESS = "process"
    CONTROLLER_ELECTION = "ctrl-election"
    CONTROLLER_RESIGNED = "ctrl-resigned"
    NETWORK = "network"


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    """One line of the timeline. `timestamp_ms` is the wall-clock time of the fact: the metadata
    record's timestamp, the broker's truncation time, or when `watch` observed it."""

    timestamp_ms: int
    kind: EventKind
    text: str
    topic: str | None = None
    partition: int | None = None
    broker_id: int | None = None


def _leader(broker_id: int) -> str:
    return "none" if broker_id == NO_LEADER else str(broker_id)


def _ids(ids: Iterable[int]) -> str:
    return "[" + ",".join(str(i) for i in ids) + "]"


def _because(reason: str) -> str:
    return f" ({reason})" if reason else ""


def partition_events(
    topic: str, old: PartitionRecord, new: PartitionRecord, timestamp_ms: int
) -> list[ClusterEvent]:
    """The timeline events of one partition's change from `old` to `new` (both full states)."""
    tp = f"{topic}-{new.partition}"
    why = _because(new.reason)
    out: list[ClusterEvent] = []

    def event(kind: EventKind, text: str) -> None:
        out.append(ClusterEvent(timestamp_ms, kind, text, topic, new.partition))

    if new.leader != old.leader or new.leader_epoch != old.leader_epoch:
        epochs = f"epoch {old.leader_epoch} -> {new.leader_epoch}"
        if new.leader == NO_LEADER:
            event(
                EventKind.OFFLINE,
                f"{tp} offline: leader {_leader(old.leader)} -> none, {epochs}{why}",
            )
        else:
            unclean = " UNCLEAN" if new.leader_recovery_state == LEADER_RECOVERING else ""
            event(
                EventKind.ELECTION,
                f"{tp}{unclean} leader {_leader(old.leader)} -> {new.leader}, {epochs}{why}",
            )
    removed = [r for r in old.isr if r not in new.isr]
    added = [r for r in new.isr if r not in old.isr]
    # A replica a reassignment adds that joins the ISR has caught up: its own event.
    caught_up = [r for r in added if r in old.adding_replicas]
    added = [r for r in added if r not in caught_up]
    if removed:
        event(
            EventKind.ISR_SHRINK,
            f"{tp} ISR {_ids(old.isr)} -> {_ids(new.isr)}, out {_ids(removed)}{why}",
        )
    if added:
        event(
            EventKind.ISR_EXPAND,
            f"{tp} ISR {_ids(old.isr)} -> {_ids(new.isr)}, in {_ids(added)}{why}",
        )
    for r in caught_up:
        in_sync = sum(1 for a in old.adding_replicas if a in new.isr)
        event(
            EventKind.REPLICA_CAUGHT_UP,
            f"{tp} new replica {r} caught up, joined the ISR {_ids(new.isr)} "
            f"({in_sync} of {len(old.adding_replicas)} new replicas in sync)",
        )
    out.extend(_reassignment_events(tp, old, new, why, timestamp_ms))
    return out


def _reassignment_events(
    tp: str, old: PartitionRecord, new: PartitionRecord, why: str, timestamp_ms: int
) -> list[ClusterEvent]:
    """Start, completion or cancellation of a reassignment (KIP-455), or a plain change of the
    replica list."""
    topic, _, _ = tp.rpartition("-")

    def event(kind: EventKind, text: str) -> ClusterEvent:
        return ClusterEvent(timestamp_ms, kind, text, topic, new.partition)

    if new.is_reassigning and (
        not old.is_reassigning or new.target_replicas != old.target_replicas
    ):
        return [
            event(
                EventKind.REASSIGNMENT_STARTED,
                f"{tp} reassignment started: {_ids(new.original_replicas)} -> "
                f"{_ids(new.target_replicas)}, adding {_ids(new.adding_replicas)}, "
                f"removing {_ids(new.removing_replicas)}{why}",
            )
        ]
    if old.is_reassigning and not new.is_reassigning:
        # Sets: the order of the replicas coming back after a cancel is the controller's.
        if set(new.replicas) == set(old.target_replicas):
            return [
                event(
                    EventKind.REASSIGNMENT_COMPLETED,
                    f"{tp} reassignment completed: {_ids(old.original_replicas)} -> "
                    f"{_ids(new.replicas)}{why}",
                )
            ]
        if set(new.replicas) == set(old.original_replicas):
            return [
                event(
                    EventKind.REASSIGNMENT_CANCELLED,
                    f"{tp} reassignment cancelled: back to {_ids(new.replicas)}{why}",
                )
            ]
    if new.replicas != old.replicas:
        return [
            event(
                EventKind.REASSIGNMENT,
                f"{tp} replicas {_ids(old.replicas)} -> {_ids(new.replicas)}{why}",
            )
        ]
    return []


def _hosts_elsewhere(image: MetadataImage, broker_id: int, skip: tuple[str, int]) -> bool:
    return any(
        broker_id in p.replicas for t, p in image.partitions() if (t.topic_id, p.partition) != skip
    )


def decommissioned_events(
    image: MetadataImage, old: PartitionRecord, new: PartitionRecord, timestamp_ms: int
) -> list[ClusterEvent]:
    """A decommissioning broker that this change leaves hosting nothing: safe to stop."""
    out = []
    for b in old.replicas:
        if b in new.replicas or b not in image.decommissioning:
            continue
        if not _hosts_elsewhere(image, b, (new.topic_id, new.partition)):
            out.append(
                ClusterEvent(
                    timestamp_ms,
                    EventKind.DECOMMISSIONED,
                    f"broker {b} decommissioned: it hosts no replicas, safe to stop",
                    broker_id=b,
                )
            )
    return out


def config_event(image: MetadataImage, record: ConfigRecord, timestamp_ms: int) -> ClusterEvent:
    """A topic or broker config set or deleted."""
    change = "deleted" if record.value is None else f"= {record.value}"
    if record.resource_type == CONFIG_RESOURCE_BROKER:
        who = (
            "brokers (default)" if record.resource_name == "" else f"broker {record.resource_name}"
        )
        broker_id = None
        if record.resource_name.isdigit():
            broker_id = int(record.resource_name)
        return ClusterEvent(
            timestamp_ms,
            EventKind.CONFIG,
            f"config of {who}: {record.name} {change}",
            broker_id=broker_id,
        )
    topic = image.topics_by_id.get(record.resource_name)
    name = record.resource_name if topic is None else topic.name
    return ClusterEvent(
        timestamp_ms,
        EventKind.CONFIG,
        f"config of topic {name}: {record.name} {change}",
        topic=name,
    )


def broker_events(
    old: BrokerRegistration | None, new: BrokerRegistration, timestamp_ms: int
) -> list[ClusterEvent]:
    """Timeline events of a broker registration change (a new incarnation or a flag change)."""
    b = new.broker_id
    out: list[ClusterEvent] = []

    def event(kind: EventKind, text: str) -> None:
        out.append(ClusterEvent(timestamp_ms, kind, text, broker_id=b))

    if old is None or old.incarnation_id != new.incarnation_id:
        again = "" if old is None else "re-"
        rack = f", rack {new.rack}" if new.rack else ""
        event(
            EventKind.REGISTERED,
            f"broker {b} {again}registered at {new.host}:{new.port}, "
            f"broker epoch {new.broker_epoch}{rack}",
        )
        return out
    if new.fenced != old.fenced:
        if new.fenced:
            event(EventKind.FENCED, f"broker {b} fenced")
        else:
            event(EventKind.UNFENCED, f"broker {b} unfenced")
    if new.in_controlled_shutdown and not old.in_controlled_shutdown:
        event(EventKind.CONTROLLED_SHUTDOWN, f"broker {b} in controlled shutdown")
    return out


def truncation_event(report: ReplicaReport, broker_id: int, missed: int = 0) -> ClusterEvent | None:
    """The timeline event of `report`'s last truncation, or None when it has none or it removed
    nothing (the LEO was already at or below the target). `missed`: truncations of the replica
    since the last look that the broker no longer describes."""
    t = report.last_truncation
    if t is None:
        return None
    if t.fully:
        what = f"truncated fully at LEO {t.from_offset}, restarts at {t.to_offset}"
    elif t.to_offset >= t.from_offset:
        return None
    else:
        removed = t.from_offset - t.to_offset
        what = f"truncated {t.from_offset} -> {t.to_offset}, {removed} offsets removed"
    more = f", {missed} more since the last look" if missed > 0 else ""
    return ClusterEvent(
        t.timestamp_ms,
        EventKind.TRUNCATION,
        f"{report.topic}-{report.partition} on broker {broker_id} {what}{more}{_because(t.reason)}",
        report.topic,
        report.partition,
        broker_id,
    )


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"  # pragma: no cover


def cleaner_event(report: ReplicaReport, broker_id: int, missed: int = 0) -> ClusterEvent | None:
    """The timeline event of `report`'s last log cleaner round (None when it has none).
    `missed`: rounds of the replica since the last look that the broker no longer describes."""
    c: CleanerRunReport | None = report.last_cleaner_run
    if c is None:
        return None
    if c.outcome == "cleaned":
        what = (
            f"cleaned offsets {c.first_dirty_offset}..{c.end_offset - 1}: "
            f"{_size(c.bytes_read)} -> {_size(c.bytes_written)}, records "
            f"{c.records_read} -> {c.records_written} in {c.elapsed_ms} ms"
        )
    elif c.outcome == "aborted":
        what = f"cleaning from {c.first_dirty_offset} aborted{_because(c.error)}"
    else:
        what = f"cleaning from {c.first_dirty_offset} FAILED, log uncleanable{_because(c.error)}"
    more = f", {missed} more since the last look" if missed > 0 else ""
    return ClusterEvent(
        c.timestamp_ms,
        EventKind.CLEANER,
        f"{report.topic}-{report.partition} on broker {broker_id} {what}{more}",
        report.topic,
        report.partition,
        broker_id,
    )


def controller_election_event(
    leader_id: int,
    epoch: int,
    previous: tuple[int, int] | None,
    timestamp_ms: int,
    granting: tuple[int, ...] = (),
) -> ClusterEvent:
    """A controller became the quorum's leader at `epoch` (`previous`: (leader, epoch) before,
    leader -1 when there was none)."""
    text = f"controller {leader_id} leads the quorum, epoch "
    text += f"{previous[1]} -> {epoch}" if previous is not None and previous[1] >= 0 else str(epoch)
    if previous is not None and previous[0] not in (-1, leader_id):
        text += f", replacing controller {previous[0]}"
    if granting:
        text += f", votes from {_ids(granting)}"
    return ClusterEvent(timestamp_ms, EventKind.CONTROLLER_ELECTION, text)


def controller_resigned_event(
    previous: tuple[int, int], epoch: int, why: str, timestamp_ms: int
) -> ClusterEvent:
    """The quorum's leader `previous` stopped leading and no voter leads yet."""
    text = f"controller {previous[0]} no longer leads (epoch {previous[1]}"
    text += f", now {epoch})" if epoch > previous[1] else ")"
    text += f": no leader{_because(why)}"
    return ClusterEvent(timestamp_ms, EventKind.CONTROLLER_RESIGNED, text)


def record_events(
    image: MetadataImage, record: MetadataRecord, timestamp_ms: int
) -> list[ClusterEvent]:
    """The timeline events of metadata `record` against `image`, the image before it is applied."""
    if isinstance(record, PartitionRecord):
        topic = image.topics_by_id.get(record.topic_id)
        old = None if topic is None else topic.partitions.get(record.partition)
        if topic is None or old is None:
            return []  # creation: the topic's own event covers its partitions
        return partition_events(topic.name, old, record, timestamp_ms) + decommissioned_events(
            image, old, record, timestamp_ms
        )
    if isinstance(record, ConfigRecord):
        return [config_event(image, record, timestamp_ms)]
    if isinstance(record, BrokerDecommissionRecord):
        b = record.broker_id
        if record.decommissioning == (b in image.decommissioning):
            return []
        text = (
            f"broker {b} decommissioning"
            if record.decommissioning
            else (f"broker {b} decommission cancelled")
        )
        return [ClusterEvent(timestamp_ms, EventKind.DECOMMISSIONING, text, broker_id=b)]
    if isinstance(record, RegisterBrokerRecord | BrokerRegistrationChangeRecord):
        old_reg = image.brokers.get(record.broker_id)
        probe = MetadataImage()
        if old_reg is not None:
            probe.brokers[record.broker_id] = old_reg
        probe.apply_record(record)
        new_reg = probe.brokers.get(record.broker_id)
        if new_reg is None or new_reg == old_reg:
            return []  # a change for an older incarnation: the image ignores it too
        return broker_events(old_reg, new_reg, timestamp_ms)
    if isinstance(record, UnregisterBrokerRecord):
        reg = image.brokers.get(record.broker_id)
        if reg is None or reg.broker_epoch != record.broker_epoch:
            return []
        return [
            ClusterEvent(
                timestamp_ms,
                EventKind.UNREGISTERED,
                f"broker {record.broker_id} unregistered",
                broker_id=record.broker_id,
            )
        ]
    if isinstance(record, TopicRecord):
        return [
            ClusterEvent(
                timestamp_ms,
                EventKind.TOPIC_CREATED,
                f"topic {record.name} created",
                topic=record.name,
            )
        ]
    if isinstance(record, RemoveTopicRecord):
        topic = image.topics_by_id.get(record.topic_id)
        if topic is None:
            return []
        name = topic.name
        return [
            ClusterEvent(timestamp_ms, EventKind.TOPIC_DELETED, f"topic {name} deleted", topic=name)
        ]
    return []


def image_diff(old: MetadataImage, new: MetadataImage, now_ms: int) -> list[ClusterEvent]:
    """What changed between two images (a snapshot that skipped records we never saw)."""
    out: list[ClusterEvent] = []
    for broker_id in sorted(set(old.brokers) | set(new.brokers)):
        new_reg = new.brokers.get(broker_id)
        if new_reg is not None and new_reg != old.brokers.get(broker_id):
            out += broker_events(old.brokers.get(broker_id), new_reg, now_ms)
    for topic_id, topic in new.topics_by_id.items():
        old_topic = old.topics_by_id.get(topic_id)
        if old_topic is None:
            out.append(
                ClusterEvent(
                    now_ms,
                    EventKind.TOPIC_CREATED,
                    f"topic {topic.name} created",
                    topic=topic.name,
                )
            )
            continue
        for index in sorted(topic.partitions):
            before = old_topic.partitions.get(index)
            if before is not None:
                out += partition_events(topic.name, before, topic.partitions[index], now_ms)
    for topic_id, topic in old.topics_by_id.items():
        if topic_id not in new.topics_by_id:
            out.append(
                ClusterEvent(
                    now_ms,
                    EventKind.TOPIC_DELETED,
                    f"topic {topic.name} deleted",
                    topic=topic.name,
                )
            )
    return out
