"""Small frozen value types shared by every component: TopicPartition, RecordMetadata, Record.

Pure: no I/O.
"""

from __future__ import annotations

from typing import NamedTuple

# Sentinels with Kafka's values.
NO_LEADER = -1
UNKNOWN_EPOCH = -1
UNKNOWN_OFFSET = -1
# OffsetsForLeaderEpoch's EpochEndOffset: no epoch / no end offset known
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
EARLIEST_TIMESTAMP = -2  # ListOffsets: the log start offset
LATEST_TIMESTAMP = -1  # ListOffsets: the high watermark
MAX_TIMESTAMP = -3  # ListOffsets: the offset of the record with the largest timestamp
CONSUMER_REPLICA_ID = -1


class TopicPartition(NamedTuple):
    """One partition of a topic. Orders and hashes by (topic, partition)."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class RecordMetadata(NamedTuple):
    """Where an acknowledged record landed."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class Record(NamedTuple):
    """One record as a consumer sees it. key/value are None for null.

    NamedTuples rather than frozen dataclasses: one is built per record on the consumer's and
    producer's hottest paths, and a tuple is built about 3x faster.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_type: int = 0  # 0 CreateTime, 1 LogAppendTime
    leader_epoch: int = UNKNOWN_EPOCH
