"""The blocking Consumer's iterator: leaving the loop early leaves each partition's position at
its first record not yet yielded, so a commit never covers records the loop did not see."""

from __future__ import annotations

from typing import Any

from minibroker.client.sync import Consumer
from minibroker.client.types import Record, TopicPartition


class _Polled(Consumer):
    """A Consumer whose poll, seek and assignment are the test's (no client behind it)."""

    def __init__(self, batches: list[list[Record]], assigned: set[TopicPartition]) -> None:
        self._batches = batches
        self._assigned = assigned
        self._closed = False
        self.seeks: list[tuple[TopicPartition, int]] = []

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[Record]:
        return self._batches.pop(0) if self._batches else []

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    def close(self) -> None:
        self._closed = True


def record(partition: int, offset: int, topic: str = "t") -> Record:
    fields: Any = dict.fromkeys(Record._fields)
    fields.update(topic=topic, partition=partition, offset=offset, timestamp=0)
    return Record(**fields)


def test_break_seeks_each_partition_back_to_its_first_unseen_record() -> None:
    batch = [record(0, 10), record(1, 5), record(0, 11), record(1, 6), record(0, 12)]
    consumer = _Polled([batch], {TopicPartition("t", 0), TopicPartition("t", 1)})
    seen = []
    for r in consumer:
        seen.append((r.partition, r.offset))
        if len(seen) == 2:
            break
    assert seen == [(0, 10), (1, 5)]
    assert sorted(consumer.seeks) == [(TopicPartition("t", 0), 11), (TopicPartition("t", 1), 6)]


def test_a_batch_read_to_its_end_needs_no_seek() -> None:
    consumer = _Polled([[record(0, 1)], [record(0, 2), record(0, 3)]], {TopicPartition("t", 0)})
    seen = []
    for r in consumer:
        seen.append(r.offset)
        if r.offset == 3:
            break
    assert seen == [1, 2, 3]
    assert consumer.seeks == []


def test_partitions_no_longer_assigned_are_not_rewound() -> None:
    consumer = _Polled([[record(0, 1), record(1, 1), record(0, 2)]], {TopicPartition("t", 0)})
    for _ in consumer:
        break
    assert consumer.seeks == [(TopicPartition("t", 0), 2)]
