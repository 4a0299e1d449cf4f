"""Log compaction on real processes (issue 21): three brokers and a controller on 127.0.0.1.

A `cleanup.policy=compact` topic, RF 3, min.insync.replicas 2, small segments, under an acks=all
idempotent producer writing a small key space (with tombstones) while its leader is SIGKILLed and
restarted twice. Afterwards:
- every broker's cleaner has cleaned the partition (its `cleaner-offset-checkpoint` names it) and
  every replica's log holds fewer records than were written: compaction ran on each replica;
- each replica's log, read from its own files, has strictly increasing offsets and the same
  key -> latest value map as what the producer had acknowledged last for each key (the replica
  invariant of a compacted topic, docs/design.md: replicas agree on the latest value of every
  key below the HW, not on bytes, since each cleans its own log);
- a consumer reading from the beginning folds to that same map;
- a follower whose partition directory is wiped catches up from the compacted leader through its
  gaps, rejoins the ISR, and holds the same map.
"""

from __future__ import annotations

import pathlib
import shutil
import time
from collections.abc import Iterator

import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.client import Admin, Consumer, Producer, TopicPartition
from minibroker.client.records.decode import iter_records

pytestmark = pytest.mark.integration

TOPIC = "changelog"
TP = TopicPartition(TOPIC, 0)
KEYS = 20
RECORDS = 4000
WAIT_S = 90
# About 120 bytes a record: the log spans a dozen 32 KiB segments.
PADDING = b"." * 100
SETTINGS = {
    "replica.lag.time.max.ms": "1500",
    "broker.session.timeout.ms": "2500",
    "leader.imbalance.check.interval.seconds": "3600",
    "log.cleaner.backoff.ms": "200",
}
TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": "32768",
    "min.cleanable.dirty.ratio": "0.01",
    "min.insync.replicas": "2",
}


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    with local_cluster(str(tmp_path / "cluster"), brokers=3, settings=SETTINGS) as c:
        yield c


def partition_dir(cluster: LocalCluster, broker: int) -> pathlib.Path:
    return pathlib.Path(cluster.spec(broker).data_dir) / f"{TOPIC}-0"


def read_replica(cluster: LocalCluster, broker: int) -> tuple[dict[bytes, bytes], int]:
    """(key -> latest value, records held) of one replica's log, read from its segment files in
    offset order. Raises AssertionError on an offset that does not increase (the caller's
    wait_until retries while a swap is renaming files under it)."""
    latest: dict[bytes, bytes] = {}
    held = 0
    last = -1
    for path in sorted(partition_dir(cluster, broker).glob("*.log"), key=lambda p: int(p.stem)):
        for record in iter_records(path.read_bytes(), allow_partial_tail=True):
            assert record.offset > last, f"broker {broker}: offset {record.offset} after {last}"
            last = record.offset
            held += 1
            assert record.key is not None
            if record.value is None:
                latest.pop(record.key, None)
            else:
                latest[record.key] = record.value
    return latest, held


def cleaner_checkpoint(cluster: LocalCluster, broker: int) -> int | None:
    """The partition's offset in the broker's cleaner-offset-checkpoint (Kafka's format: version,
    count, then `topic partition offset` lines), None when it is not there."""
    path = pathlib.Path(cluster.spec(broker).data_dir) / "cleaner-offset-checkpoint"
    if not path.exists():
        return None
    lines = path.read_text().splitlines()
    assert lines[0] == "0" and int(lines[1]) == len(lines) - 2, lines
    for line in lines[2:]:
        topic, partition, offset = line.split()
        if (topic, int(partition)) == (TP.topic, TP.partition):
            return int(offset)
    return None


def describe(admin: Admin) -> object:
    (topic,) = admin.describe_topics([TOPIC])
    (part,) = topic.partitions
    return part


def produce_with_leader_kills(cluster: LocalCluster, admin: Admin) -> dict[bytes, bytes]:
    """Write RECORDS keyed records (every 7th a tombstone), SIGKILL the leader at 1/3 and 2/3 and
    restart it; return what each key's last acknowledged write left (tombstoned keys absent)."""
    expected: dict[bytes, bytes | None] = {}
    with Producer(
        cluster.bootstrap, acks="all", delivery_timeout_ms=600_000, batch_size=8192
    ) as producer:
        futures = []
        for i in range(RECORDS):
            key = b"key-%02d" % (i % KEYS)
            value = None if i % 7 == 3 else b"%s=%d;" % (key, i) + PADDING
            futures.append((key, value, producer.send(TOPIC, value, key=key, partition=0)))
            if i in (RECORDS // 3, 2 * RECORDS // 3):
                producer.flush()
                leader = describe(admin).leader  # type: ignore[attr-defined]
                cluster.kill(leader)
                wait_until(
                    lambda old=leader: describe(admin).leader not in (-1, old),  # type: ignore[attr-defined]
                    WAIT_S,
                    "a new leader after the kill",
                )
                cluster.start(leader)
        for key, value, future in futures:
            future.result(WAIT_S)
            expected[key] = value
    return {k: v for k, v in expected.items() if v is not None}


def test_replicas_of_a_compacted_topic_converge_through_leader_kills_and_a_wiped_follower(
    cluster: LocalCluster,
) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, 3, TOPIC_CONFIGS)
        expected = produce_with_leader_kills(cluster, admin)
        assert len(expected) > KEYS // 2

        def in_sync() -> bool:
            part = describe(admin)
            leos = set(part.log_end_offsets.values())  # type: ignore[attr-defined]
            return len(part.isr) == 3 and leos == {part.high_watermark}  # type: ignore[attr-defined]

        wait_until(in_sync, WAIT_S, "every replica in the ISR at the HW")
        brokers = (1, 2, 3)

        def every_replica_cleaned() -> bool:
            return all((cleaner_checkpoint(cluster, b) or 0) > 0 for b in brokers)

        wait_until(every_replica_cleaned, WAIT_S, "a cleaner round on every broker")

        def converged(among: tuple[int, ...]) -> bool:
            for broker in among:
                latest, held = read_replica(cluster, broker)
                if latest != expected or held >= RECORDS:
                    return False
            return True

        wait_until(lambda: converged(brokers), WAIT_S, "every replica holding each key's latest")

        with Consumer(cluster.bootstrap) as consumer:
            consumer.assign([TP])
            consumer.seek_to_beginning(TP)
            end = describe(admin).high_watermark  # type: ignore[attr-defined]
            folded: dict[bytes, bytes | None] = {}
            offsets: list[int] = []
            deadline = time.monotonic() + WAIT_S
            while consumer.position(TP) < end and time.monotonic() < deadline:
                for record in consumer.poll(timeout_ms=500):
                    offsets.append(record.offset)
                    assert record.key is not None
                    folded[record.key] = record.value
            assert consumer.position(TP) == end
        assert offsets == sorted(set(offsets)) and len(offsets) < RECORDS
        assert {k: v for k, v in folded.items() if v is not None} == expected

        # A follower wiped clean copies the compacted leader's log, gaps and all.
        leader = describe(admin).leader  # type: ignore[attr-defined]
        follower = next(b for b in brokers if b != leader)
        cluster.stop(follower)
        shutil.rmtree(partition_dir(cluster, follower))
        cluster.start(follower)
        wait_until(in_sync, WAIT_S, "the wiped follower back in the ISR at the HW")
        wait_until(lambda: converged((follower,)), WAIT_S, "the wiped follower's map")
