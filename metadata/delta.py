"""What a metadata batch changed, for a broker to act on only that (docs/design.md §3.2).

Pure. A broker used to act on every partition of the image after every batch, an empty
keep-alive batch included: at thousands of partitions that pass was most of an idle broker's
CPU. `MetadataDelta` names the partitions and topics the batch's records touched; a snapshot
(the image replaced whole) touches everything.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from minibroker.metadata.records import (
    CONFIG_RESOURCE_TOPIC,
    BrokerDecommissionRecord,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    LogEntry,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
)

_BROKER_RECORDS = (
    RegisterBrokerRecord,
    BrokerRegistrationChangeRecord,
    UnregisterBrokerRecord,
    BrokerDecommissionRecord,
)


@dataclass(slots=True)
class MetadataDelta:
    """`everything`: act on every partition. Else `partitions` (topic id, partition) and every
    partition of `topics` (created, deleted or reconfigured); `brokers`: a registration,
    fencing, unregistration or decommission mark changed (leader addresses may have moved)."""

    everything: bool = False
    partitions: set[tuple[str, int]] = field(default_factory=set)
    topics: set[str] = field(default_factory=set)
    brokers: bool = False

    @property
    def touches_partitions(self) -> bool:
        return self.everything or bool(self.partitions) or bool(self.topics)

    def merge(self, other: MetadataDelta) -> None:
        self.everything |= other.everything
        self.partitions |= other.partitions
        self.topics |= other.topics
        self.brokers |= other.brokers


EVERYTHING = MetadataDelta(everything=True)


def delta_of(entries: Iterable[LogEntry], applied_from: int) -> MetadataDelta:
    """The delta of the live entries at offsets >= `applied_from` (those the image applied)."""
    delta = MetadataDelta()
    for entry in entries:
        if entry.offset < applied_from:
            continue
        record = entry.record
        if isinstance(record, PartitionRecord):
            delta.partitions.add((record.topic_id, record.partition))
        elif isinstance(record, TopicRecord | RemoveTopicRecord):
            delta.topics.add(record.topic_id)
        elif isinstance(record, ConfigRecord):
            if record.resource_type == CONFIG_RESOURCE_TOPIC:
                delta.topics.add(record.resource_name)
        elif isinstance(record, _BROKER_RECORDS):
            delta.brokers = True
    return delta


__all__ = ["EVERYTHING", "MetadataDelta", "delta_of"]
