"""Storage faults with real brokers (issue 11 items 2, 3 and 6).

* a topic with a 249-character name is deleted for good, on the brokers that were up and on
  one that was down at the time, and re-created empty: no deleted record is served again;
* topic names from the network that no topic can have are answered with an error code
  (Metadata: INVALID_TOPIC_EXCEPTION, as Kafka does), and the broker keeps serving;
* a broker whose segment rotted between a clean shutdown and its restart comes up, cuts its
  log at the corrupt batch and re-fetches the rest from the leader, so the replicas hold
  identical bytes again (docs/design.md §8 invariant 2).
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import grpc
import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.client import Admin, Consumer, Producer, TopicPartition
from minibroker.client.batch import HEADER_SIZE, iter_batches
from minibroker.client.errors import ErrorCode
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

LONG_NAME = ("long-topic." * 25)[:249]


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    settings = {
        "replica.lag.time.max.ms": "1500",
        "broker.session.timeout.ms": "2500",
        "leader.imbalance.check.interval.seconds": "3600",
    }
    with local_cluster(str(tmp_path / "cluster"), brokers=3, settings=settings) as c:
        yield c


def describe(admin: Admin, topic: str, partition: int = 0):  # type: ignore[no-untyped-def]
    (desc,) = admin.describe_topics([topic])
    return next(p for p in desc.partitions if p.partition == partition)


def topic_dirs(cluster: LocalCluster, broker: int, topic: str) -> dict[str, str]:
    """The dirs in a broker's data dir named after `topic` (cut or not), with their topic id."""
    root = pathlib.Path(cluster.spec(broker).data_dir)
    found = {}
    for path in root.iterdir():
        if path.is_dir() and path.name.startswith(topic[:150]):
            meta = path / "partition.metadata"
            found[path.name] = meta.read_text() if meta.exists() else ""
    return found


def read_values(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    """Every record value of `topic` from the beginning up to the HW."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(bootstrap) as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        consumer.seek_to_beginning(*tps)
        values: list[bytes] = []
        want = sum(ends.values())
        wait_until(
            lambda: (
                values.extend(r.value for r in consumer.poll(timeout_ms=200)) or len(values) >= want
            ),
            30,
            f"{want} records of {topic}",
        )
        return values


def test_a_deleted_249_character_topic_never_comes_back(cluster: LocalCluster) -> None:
    with Admin(cluster.bootstrap) as admin:
        old_id = admin.create_topic(LONG_NAME, 2, 3).topic_id
        for p in (0, 1):
            wait_until(lambda p=p: len(describe(admin, LONG_NAME, p).isr) == 3, 20, "full ISR")
        with Producer(cluster.bootstrap, acks="all") as producer:
            for i in range(20):
                producer.send(LONG_NAME, f"old-{i}".encode(), partition=i % 2)
            producer.flush()
        assert all(topic_dirs(cluster, b, LONG_NAME) for b in (1, 2, 3))

        cluster.stop(3)  # broker 3 misses the delete
        admin.delete_topics([LONG_NAME])
        for broker in (1, 2):
            wait_until(
                lambda b=broker: not topic_dirs(cluster, b, LONG_NAME),
                20,
                f"broker {broker} to delete the topic's dirs (rename to a 255-byte name)",
            )
        cluster.start(3)
        wait_until(
            lambda: not topic_dirs(cluster, 3, LONG_NAME),
            30,
            "broker 3 to delete the dirs of the topic deleted while it was down",
        )
        wait_until(
            lambda: not any(b.fenced for b in admin.describe_cluster().brokers),
            30,
            "broker 3 unfenced",
        )

        new_id = admin.create_topic(LONG_NAME, 2, 3).topic_id
        assert new_id != old_id
        for p in (0, 1):
            wait_until(lambda p=p: len(describe(admin, LONG_NAME, p).isr) == 3, 20, "full ISR")
    assert read_values(cluster.bootstrap, LONG_NAME, 2) == []
    with Producer(cluster.bootstrap, acks="all") as producer:
        producer.send(LONG_NAME, b"new", partition=0).result(20)
    assert read_values(cluster.bootstrap, LONG_NAME, 2) == [b"new"]
    for broker in (1, 2, 3):
        dirs = topic_dirs(cluster, broker, LONG_NAME)
        assert sorted(dirs) == [f"{LONG_NAME}-0", f"{LONG_NAME}-1"]
        assert all(f"topic_id: {new_id}" in meta for meta in dirs.values())


def test_names_no_topic_can_have_are_answered_not_crashed_on(cluster: LocalCluster) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("fine", 1, 3)
    bad = ["orders\n", "", ".", "..", "x" * 250, "a/b", "sp ace", "nul\x00", "\u2028"]
    broker = cluster.spec(1)
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.BrokerServiceStub(channel)
        meta = stub.Metadata(pb.MetadataRequest(topics=[*bad, "fine", "missing"]), timeout=10)
        codes = {t.name: t.error_code for t in meta.topics}
        assert {name: codes[name] for name in bad} == {
            name: ErrorCode.INVALID_TOPIC_EXCEPTION for name in bad
        }
        assert codes["missing"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert codes["fine"] == ErrorCode.NONE
        produce = stub.Produce(
            pb.ProduceRequest(
                acks=-1,
                timeout_ms=1000,
                topics=[
                    pb.TopicProduceData(
                        topic=name, partitions=[pb.PartitionProduceData(partition=0, records=b"")]
                    )
                    for name in bad
                ],
            ),
            timeout=10,
        )
        assert {p.error_code for t in produce.topics for p in t.partitions} == {
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        }
        fetch = stub.Fetch(
            pb.FetchRequest(
                replica_id=-1,
                replica_epoch=-1,
                max_wait_ms=0,
                max_bytes=1 << 20,
                topics=[
                    pb.FetchTopic(topic=name, partitions=[pb.FetchPartition(partition=0)])
                    for name in bad
                ],
            ),
            timeout=10,
        )
        assert {p.error_code for t in fetch.topics for p in t.partitions} == {
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        }
    # Still serving.
    with Producer(cluster.bootstrap, acks="all") as producer:
        producer.send("fine", b"after", partition=0).result(20)
    assert read_values(cluster.bootstrap, "fine", 1) == [b"after"]


def replica_bytes(cluster: LocalCluster, broker: int, tp: TopicPartition) -> bytes:
    """Every batch in a replica's segment files, in order."""
    part = pathlib.Path(cluster.spec(broker).data_dir) / f"{tp.topic}-{tp.partition}"
    out = bytearray()
    for segment in sorted(part.glob("*.log")):
        data = segment.read_bytes()
        for pos, header in iter_batches(data):
            out += data[pos : pos + header.size]
    return bytes(out)


def test_a_segment_corrupted_after_a_clean_shutdown_is_cut_and_fetched_again(
    cluster: LocalCluster,
) -> None:
    tp = TopicPartition("rot", 0)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("rot", 1, 3, {"min.insync.replicas": "2"})
        wait_until(lambda: len(describe(admin, "rot").isr) == 3, 20, "a full ISR")
        with Producer(cluster.bootstrap, acks="all", linger_ms=0) as producer:
            for i in range(30):  # one batch each
                producer.send("rot", f"value-{i}".encode() * 20, partition=0).result(20)
        leader = describe(admin, "rot").leader
        victim = next(b for b in (1, 2, 3) if b != leader)
        expected = replica_bytes(cluster, leader, tp)
        wait_until(
            lambda: all(replica_bytes(cluster, b, tp) == expected for b in (1, 2, 3)),
            20,
            "identical replicas",
        )

        cluster.stop(victim)  # SIGTERM: a controlled, clean shutdown
        data_dir = pathlib.Path(cluster.spec(victim).data_dir)
        assert (data_dir / ".kafka_cleanshutdown").exists()
        segment = data_dir / "rot-0" / "00000000000000000000.log"
        data = bytearray(segment.read_bytes())
        positions = [pos for pos, _ in iter_batches(data)]
        assert len(positions) == 30
        middle = positions[15]
        data[middle + HEADER_SIZE + 10] ^= 0x20  # a record byte, under the CRC
        segment.write_bytes(bytes(data))

        cluster.start(victim)
        wait_until(lambda: victim in describe(admin, "rot").isr, 30, "the victim back in the ISR")
        wait_until(
            lambda: replica_bytes(cluster, victim, tp) == expected,
            30,
            "the victim's log identical to the leader's again",
        )
    log_text = pathlib.Path(cluster.spec(victim).log_file).read_text()
    assert "corrupt_batch_found_on_load" in log_text
    values = read_values(cluster.bootstrap, "rot", 1)
    assert values == [f"value-{i}".encode() * 20 for i in range(30)]
