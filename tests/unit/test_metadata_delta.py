"""metadata/delta.py: which partitions a metadata batch touched (a broker acts on those only)."""

from __future__ import annotations

import pytest

from minibroker.metadata.delta import MetadataDelta, delta_of
from minibroker.metadata.records import (
    CONFIG_RESOURCE_BROKER,
    CONFIG_RESOURCE_TOPIC,
    BrokerDecommissionRecord,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    LogEntry,
    NoOpRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
)

PART = PartitionRecord("tid", 3, (1, 2), (1, 2), 1, 0, 0)


def entries(*records: object, start: int = 10) -> list[LogEntry]:
    return [LogEntry(start + i, 0, r) for i, r in enumerate(records)]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("record", "partitions", "topics", "brokers"),
    [
        (PART, {("tid", 3)}, set(), False),
        (TopicRecord("t", "tid"), set(), {"tid"}, False),
        (RemoveTopicRecord("tid"), set(), {"tid"}, False),
        (ConfigRecord("tid", "retention.ms", "1", CONFIG_RESOURCE_TOPIC), set(), {"tid"}, False),
        (ConfigRecord("1", "x", "1", CONFIG_RESOURCE_BROKER), set(), set(), False),
        (RegisterBrokerRecord(1, "i", 2, "h", 1), set(), set(), True),
        (BrokerRegistrationChangeRecord(1, 2, fenced=True), set(), set(), True),
        (UnregisterBrokerRecord(1, 2), set(), set(), True),
        (BrokerDecommissionRecord(1, True), set(), set(), True),
        (ProducerIdsRecord(1, 2, 1000), set(), set(), False),
        (NoOpRecord(), set(), set(), False),
    ],
)
def test_each_record_kind_touches_what_it_changes(
    record: object, partitions: set[tuple[str, int]], topics: set[str], brokers: bool
) -> None:
    delta = delta_of(entries(record), 0)
    assert (delta.partitions, delta.topics, delta.brokers, delta.everything) == (
        partitions,
        topics,
        brokers,
        False,
    )
    assert delta.touches_partitions == bool(partitions or topics)


def test_entries_the_image_had_already_applied_touch_nothing() -> None:
    assert delta_of(entries(PART, start=10), 11) == MetadataDelta()
    assert delta_of(entries(TopicRecord("t", "tid"), PART, start=10), 11).partitions == {("tid", 3)}


def test_an_empty_keep_alive_batch_touches_nothing() -> None:
    delta = delta_of([], 0)
    assert not delta.touches_partitions and not delta.brokers and not delta.everything
