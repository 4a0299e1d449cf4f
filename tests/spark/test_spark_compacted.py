"""The Spark source over a compacted topic (issue 21): offsets have gaps once the cleaner ran.

- A batch read from the beginning returns the surviving records, offsets increasing with gaps,
  and folding them by key gives every key's latest value.
- A range whose end falls inside a gap (the record at end - 1 was cleaned away, and every one
  before it) finishes with no row: the source never waits for an absent offset.
"""

from __future__ import annotations

import json
import pathlib
import time
from typing import Any

import pytest
from cluster_harness import LocalCluster, wait_until

from minibroker.client import Admin, Consumer, Producer, TopicPartition

pytestmark = pytest.mark.spark

TOPIC = "compacted-source"
TP = TopicPartition(TOPIC, 0)
KEYS = 10
RECORDS = 1500
WAIT_S = 90


def surviving_offsets(cluster: LocalCluster, end: int) -> list[tuple[int, bytes, bytes]]:
    with Consumer(cluster.bootstrap) as consumer:
        consumer.assign([TP])
        consumer.seek_to_beginning(TP)
        got: list[tuple[int, bytes, bytes]] = []
        deadline = time.monotonic() + WAIT_S
        while consumer.position(TP) < end and time.monotonic() < deadline:
            got.extend((r.offset, r.key, r.value) for r in consumer.poll(timeout_ms=500))
        assert consumer.position(TP) == end
    return got


def cleaned(cluster: LocalCluster, leader: int) -> bool:
    path = pathlib.Path(cluster.spec(leader).data_dir) / "cleaner-offset-checkpoint"
    if not path.exists():
        return False
    for line in path.read_text().splitlines()[2:]:
        topic, partition, offset = line.split()
        if topic == TOPIC and int(partition) == 0 and int(offset) > 0:
            return True
    return False


def test_the_source_reads_a_compacted_topic_and_ranges_ending_in_a_gap(
    spark: Any, cluster: LocalCluster
) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(
            TOPIC,
            1,
            3,
            {
                "cleanup.policy": "compact",
                "segment.bytes": "4096",
                "min.cleanable.dirty.ratio": "0.01",
            },
        )
        # Batches well under segment.bytes, so the log spans many segments.
        with Producer(cluster.bootstrap, acks="all", batch_size=1024) as producer:
            sent = []
            for i in range(RECORDS):
                key = b"k%d" % (i % KEYS)
                sent.append(producer.send(TOPIC, b"%s=%d" % (key, i), key=key, partition=0))
            assert [f.result(WAIT_S).offset for f in sent] == list(range(RECORDS))
        expected = {b"k%d" % k: b"k%d=%d" % (k, RECORDS - KEYS + k) for k in range(KEYS)}
        (topic,) = admin.describe_topics([TOPIC])
        leader = topic.partitions[0].leader
    wait_until(lambda: cleaned(cluster, leader), WAIT_S, "the leader's cleaner round")
    survivors = surviving_offsets(cluster, RECORDS)
    offsets = [o for o, _, _ in survivors]
    assert offsets == sorted(set(offsets)) and len(offsets) < RECORDS

    rows = (
        spark.read.format("minibroker")
        .option("bootstrap.servers", cluster.bootstrap)
        .option("subscribe", TOPIC)
        .load()
        .select("offset", "key", "value")
        .collect()
    )
    # Cleaning may have gone on since the consumer read: Spark's rows are a subset of those
    # survivors (offsets never change), and folding either gives every key's latest value.
    assert {r.offset for r in rows} <= set(offsets)
    folded = {}
    for r in sorted(rows, key=lambda r: r.offset):
        folded[bytes(r.key)] = bytes(r.value)
    assert folded == expected

    # The cleaned part lies below the first survivor: a range [0, first) ends where offset
    # first - 1 holds no record, and holds none at all.
    gap = offsets[0] - 1
    assert gap > 0
    ranged = (
        spark.read.format("minibroker")
        .option("bootstrap.servers", cluster.bootstrap)
        .option("subscribe", TOPIC)
        .option("startingOffsets", json.dumps({TOPIC: {"0": 0}}))
        .option("endingOffsets", json.dumps({TOPIC: {"0": gap + 1}}))
        .load()
        .select("offset")
        .collect()
    )
    # It finished (the source did not wait for offset gap, which is absent), with nothing.
    assert ranged == []
