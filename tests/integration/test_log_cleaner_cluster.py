"""The log cleaner on real processes (issue 21): a compacted RF 3 topic on three brokers.

One controller and three brokers on 127.0.0.1 (each broker's cleaner looks every 100 ms,
`log.cleaner.backoff.ms`), one partition with 16 KiB segments and `min.insync.replicas=2`, an
acks=all Producer writing 3,000 records (4 KiB batches) over 12 keys. Then, without fixed sleeps:
- every broker's cleaner cleans its own replica: its `cleaned` rounds counter
  (`minibroker_log_cleaner_rounds_total`) moves, its `cleaner-offset-checkpoint` names the
  partition, `topics describe` shows each replica's cleaner point past the middle of the log and
  the gauges with Kafka's names are served;
- a Consumer reading from the start gets every key's latest acknowledged value, offsets strictly
  increasing, and far fewer records than were written;
- every replica's segment files, read on disk, hold the same key -> latest value map below the
  HW (replicas agree on values, not on bytes: each compacted on its own), and fewer records than
  were written.
A second test kills the leader while the producer runs and restarts it: it catches up through
the new leader's gaps, its first cleaner round starts at the checkpoint it wrote before it was
killed (read back from `cleaner-offset-checkpoint`), and after more records every replica has
cleaned past them and the same checks hold.
"""

from __future__ import annotations

import json
import pathlib
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.broker.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from minibroker.client import Admin, Consumer, Producer, TopicPartition
from minibroker.client.records import iter_decoded_batches

pytestmark = pytest.mark.integration

KEYS = 12
RECORDS = 3000
WAIT_S = 90
TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.bytes": "16384",
    "min.cleanable.dirty.ratio": "0.1",
    "min.insync.replicas": "2",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = pathlib.Path(tmp_path_factory.mktemp("cleaner")) / "cluster"
    with local_cluster(str(directory), brokers=3, settings={"log.cleaner.backoff.ms": "100"}) as c:
        yield c


def key(i: int) -> bytes:
    return b"key-%02d" % (i % KEYS)


def value(i: int) -> bytes:
    return b"value-%05d-" % i + b"x" * 40


def produce(bootstrap: str, topic: str, first: int, count: int) -> dict[bytes, bytes]:
    """Send records first..first+count-1 (acks=all, one partition, in order); every one must be
    acknowledged. Returns each key's last value."""
    latest: dict[bytes, bytes] = {}
    with Producer(
        bootstrap, acks="all", linger_ms=5, batch_size=4096, delivery_timeout_ms=120_000
    ) as producer:
        futures = []
        for i in range(first, first + count):
            futures.append(producer.send(topic, value(i), key=key(i), partition=0))
            latest[key(i)] = value(i)
        for future in futures:
            future.result(WAIT_S)
    return latest


def scrape(cluster: LocalCluster, broker: int) -> dict[str, float]:
    port = cluster.spec(broker).metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, number = line.rpartition(" ")
            samples[name] = float(number)
    return samples


def cleaned_rounds(cluster: LocalCluster, broker: int) -> float:
    return scrape(cluster, broker).get('minibroker_log_cleaner_rounds_total{outcome="cleaned"}', 0)


def cleaner_checkpoint(cluster: LocalCluster, broker: int, tp: TopicPartition) -> int | None:
    path = pathlib.Path(cluster.spec(broker).data_dir) / CLEANER_OFFSET_CHECKPOINT
    return OffsetCheckpointFile(path).read().get(tp)


def partition_state(admin: Admin, topic: str) -> object:
    (described,) = admin.describe_topics([topic])
    (part,) = described.partitions
    return part


def replica_values(
    cluster: LocalCluster, broker: int, tp: TopicPartition, high_watermark: int
) -> tuple[dict[bytes, bytes | None], int]:
    """A replica's key -> latest value below the HW, read from its segment files on disk, and
    how many records it holds there. Batches must come in increasing offset order."""
    part = pathlib.Path(cluster.spec(broker).data_dir) / f"{tp.topic}-{tp.partition}"
    values: dict[bytes, bytes | None] = {}
    count = 0
    last = -1
    for segment in sorted(part.glob("*.log")):
        for batch in iter_decoded_batches(segment.read_bytes()):
            assert batch.base_offset > last, f"broker {broker}: batches out of order"
            last = batch.last_offset
            for r in batch.records:
                if r.offset < high_watermark:
                    assert r.key is not None
                    values[r.key] = r.value
                    count += 1
    return values, count


def read_from_start(bootstrap: str, tp: TopicPartition, high_watermark: int) -> list[object]:
    records: list[object] = []
    with Consumer(bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            records.extend(consumer.poll(timeout_ms=500))
            if consumer.position(tp) >= high_watermark:
                break
    return records


def check_compacted(
    cluster: LocalCluster,
    admin: Admin,
    tp: TopicPartition,
    expected: dict[bytes, bytes],
    written: int,
) -> None:
    part = partition_state(admin, tp.topic)
    hw = part.high_watermark  # type: ignore[attr-defined]
    assert hw == written, f"HW {hw}, {written} acknowledged"
    records = read_from_start(cluster.bootstrap, tp, hw)
    offsets = [r.offset for r in records]  # type: ignore[attr-defined]
    assert offsets == sorted(set(offsets)), "offsets strictly increasing"
    got = {r.key: r.value for r in records}  # type: ignore[attr-defined]
    assert got == expected
    assert len(records) < written // 2, f"{len(records)} of {written} records read: not compacted"

    def replicas_agree() -> bool:
        maps = {}
        for broker in (1, 2, 3):
            values, count = replica_values(cluster, broker, tp, hw)
            assert count < written // 2, f"broker {broker} holds {count} of {written} records"
            maps[broker] = values
        assert maps[1] == maps[2] == maps[3] == expected
        return True

    # A cleaner may swap segments while they are read (a file gone): read again.
    wait_until(replicas_agree, WAIT_S, "every replica's key -> latest value map")


def wait_cleaned_everywhere(
    cluster: LocalCluster,
    admin: Admin,
    tp: TopicPartition,
    past: int,
    rounds_before: dict[int, float],
) -> None:
    """Each broker cleaned at least once more, its checkpoint for `tp` is past `past`, and
    describe shows the cleaner points past it too."""
    for broker in (1, 2, 3):
        wait_until(
            lambda b=broker: cleaned_rounds(cluster, b) > rounds_before.get(b, 0),
            WAIT_S,
            f"a cleaned round on broker {broker}",
        )
        wait_until(
            lambda b=broker: (cleaner_checkpoint(cluster, b, tp) or 0) > past,
            WAIT_S,
            f"broker {broker}'s cleaner checkpoint past {past}",
        )

    def described_points() -> bool:
        points = partition_state(admin, tp.topic).cleaner_points  # type: ignore[attr-defined]
        return sorted(points) == [1, 2, 3] and all(
            p is not None and p > past for p in points.values()
        )

    wait_until(described_points, WAIT_S, "describe's cleaner points")


def test_every_replica_compacts_to_the_same_latest_values(cluster: LocalCluster) -> None:
    topic = "changelog"
    tp = TopicPartition(topic, 0)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, 1, 3, TOPIC_CONFIGS)
        wait_until(lambda: len(partition_state(admin, topic).isr) == 3, WAIT_S, "a full ISR")  # type: ignore[attr-defined]
        before = {b: cleaned_rounds(cluster, b) for b in (1, 2, 3)}
        expected = produce(cluster.bootstrap, topic, 0, RECORDS)
        wait_cleaned_everywhere(cluster, admin, tp, RECORDS // 2, before)
        metrics = scrape(cluster, 1)
        for name in (
            "kafka_log_LogCleaner_max_clean_time_secs",
            "kafka_log_LogCleaner_cleaner_recopy_percent",
            "kafka_log_LogCleaner_max_buffer_utilization_percent",
            "kafka_log_LogCleanerManager_max_dirty_percent",
            "kafka_log_LogCleanerManager_uncleanable_partitions_count",
        ):
            assert name in metrics, name
        assert metrics["kafka_log_LogCleanerManager_uncleanable_partitions_count"] == 0
        assert 0 < metrics["kafka_log_LogCleaner_cleaner_recopy_percent"] < 100
        check_compacted(cluster, admin, tp, expected, RECORDS)


def first_round_after_restart(cluster: LocalCluster, broker: int, topic: str) -> dict | None:  # type: ignore[type-arg]
    """The first cleaner round of `topic` the broker's process log shows after its last start."""
    lines = pathlib.Path(cluster.spec(broker).log_file).read_text(errors="replace").splitlines()
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    starts = [i for i, e in enumerate(events) if e.get("event") == "log_cleaner_started"]
    for e in events[starts[-1] if starts else 0 :]:
        if e.get("event") == "cleaner_round" and e.get("topic") == topic:
            return e
    return None


def test_a_killed_leader_restarts_and_its_cleaner_carries_on(cluster: LocalCluster) -> None:
    topic = "changelog-kill"
    tp = TopicPartition(topic, 0)
    third = RECORDS // 3
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, 1, 3, TOPIC_CONFIGS)
        wait_until(lambda: len(partition_state(admin, topic).isr) == 3, WAIT_S, "a full ISR")  # type: ignore[attr-defined]
        expected = produce(cluster.bootstrap, topic, 0, third)
        leader = partition_state(admin, topic).leader  # type: ignore[attr-defined]
        wait_until(
            lambda: (cleaner_checkpoint(cluster, leader, tp) or 0) > 0,
            WAIT_S,
            f"the leader (broker {leader}) cleaned once",
        )
        # Kill the leader while acks=all records keep coming (the others take over).
        more: dict[bytes, bytes] = {}
        producing = threading.Thread(
            target=lambda: more.update(produce(cluster.bootstrap, topic, third, third))
        )
        producing.start()
        cluster.kill(leader)
        producing.join(WAIT_S * 2)
        assert not producing.is_alive()
        assert len(more) == KEYS, "every record of the second third was acknowledged"
        expected.update(more)
        checkpoint = cleaner_checkpoint(cluster, leader, tp)
        assert checkpoint is not None and checkpoint > 0
        cluster.start(leader)
        wait_until(
            lambda: len(partition_state(admin, topic).isr) == 3, WAIT_S, "the ISR whole again"
        )  # type: ignore[attr-defined]
        # More records roll every replica's active segment, so every cleaner cleans past the
        # records it fetched after the restart too.
        expected.update(produce(cluster.bootstrap, topic, 2 * third, RECORDS - 2 * third))
        wait_cleaned_everywhere(cluster, admin, tp, 2 * third, {})
        # The restarted broker read its checkpoint back: its first round started there, not at
        # 0 (its log was not truncated below it: a checkpoint never passes the HW).
        first = first_round_after_restart(cluster, leader, topic)
        assert first is not None and first["first_dirty_offset"] == checkpoint, first
        check_compacted(cluster, admin, tp, expected, RECORDS)
