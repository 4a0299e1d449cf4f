"""Committed offsets of consumer groups on a real 3-broker cluster, through Kafka clients that no
one here wrote (kafka-python, confluent-kafka): FindCoordinator creates __consumer_offsets,
simple commits (manual assignment, generation -1) are read back with committed(), survive a
SIGKILL of the group's coordinator (the new leader of its partition loads them from its log),
ListGroups and DeleteGroups through both admin clients, and `dump-log --offsets-decoder` on a
replica's segment shows the commit.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
from collections.abc import Iterator

import confluent_kafka
import kafka
import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until
from confluent_kafka.admin import AdminClient
from kafka.admin import KafkaAdminClient
from kafka.structs import OffsetAndMetadata

from minibroker.broker.groups.coordinator import partition_for
from minibroker.client import Admin

pytestmark = pytest.mark.integration

OFFSETS_PARTITIONS = 3
TOPIC = "orders"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("group-offsets")
    settings = {
        "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
        "group.initial.rebalance.delay.ms": "0",
    }
    with local_cluster(str(directory / "cluster"), brokers=3, settings=settings) as c:
        with Admin(c.bootstrap) as admin:
            admin.create_topic(TOPIC, 3, 3, {"min.insync.replicas": "2"})
        yield c


def confluent_consumer(cluster: LocalCluster, group: str) -> confluent_kafka.Consumer:
    return confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )


def confluent_committed(cluster: LocalCluster, group: str, partitions: list[int]) -> list[int]:
    consumer = confluent_consumer(cluster, group)
    try:
        asked = [confluent_kafka.TopicPartition(TOPIC, p) for p in partitions]
        return [tp.offset for tp in consumer.committed(asked, timeout=30)]
    finally:
        consumer.close()


def coordinator_of(cluster: LocalCluster, group: str) -> int:
    with Admin(cluster.bootstrap) as admin:
        [topic] = admin.describe_topics(["__consumer_offsets"])
    p = partition_for(group, OFFSETS_PARTITIONS)
    return next(d.leader for d in topic.partitions if d.partition == p)


def test_kafka_python_commits_and_reads_back(cluster: LocalCluster) -> None:
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap,
        group_id="kp-group",
        enable_auto_commit=False,
        request_timeout_ms=30000,
    )
    try:
        tps = [kafka.TopicPartition(TOPIC, p) for p in range(3)]
        consumer.assign(tps)
        consumer.commit({tp: OffsetAndMetadata(10 + tp.partition, "kp", -1) for tp in tps})
        assert [consumer.committed(tp) for tp in tps] == [10, 11, 12]
        consumer.commit({tps[0]: OffsetAndMetadata(20, "", -1)})
        assert consumer.committed(tps[0]) == 20
    finally:
        consumer.close()
    # The other client reads what this one committed.
    assert confluent_committed(cluster, "kp-group", [0, 1, 2]) == [20, 11, 12]


def test_confluent_kafka_commits_and_reads_back(cluster: LocalCluster) -> None:
    consumer = confluent_consumer(cluster, "ck-group")
    try:
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, p) for p in range(3)])
        consumer.commit(
            offsets=[confluent_kafka.TopicPartition(TOPIC, p, 7 + p) for p in range(3)],
            asynchronous=False,
        )
    finally:
        consumer.close()
    assert confluent_committed(cluster, "ck-group", [0, 1, 2]) == [7, 8, 9]
    # Metadata calls the offsets topic internal.
    client = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        [meta] = client.describe_topics(["__consumer_offsets"])
        assert meta["is_internal"] is True
    finally:
        client.close()


def test_list_and_delete_groups(cluster: LocalCluster) -> None:
    for group in ("del-a", "del-b"):
        consumer = confluent_consumer(cluster, group)
        try:
            consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0)])
            consumer.commit(
                offsets=[confluent_kafka.TopicPartition(TOPIC, 0, 3)], asynchronous=False
            )
        finally:
            consumer.close()
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    listed = admin.list_consumer_groups(request_timeout=30).result()
    assert {"del-a", "del-b"} <= {g.group_id for g in listed.valid}
    [future] = admin.delete_consumer_groups(["del-a"], request_timeout=30).values()
    future.result()
    listed = admin.list_consumer_groups(request_timeout=30).result()
    assert "del-a" not in {g.group_id for g in listed.valid}
    assert confluent_committed(cluster, "del-a", [0]) == [confluent_kafka.OFFSET_INVALID]
    # kafka-python's admin: the same through its own requests (ListGroups on every broker).
    client = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        groups = {g["group_id"] for g in client.list_groups()}
        assert "del-b" in groups and "del-a" not in groups
        offsets = client.list_group_offsets("del-b")["del-b"]
        assert {tp.partition: o.offset for tp, o in offsets.items()} == {0: 3}
        assert client.delete_groups(["del-b"]) == {"del-b": "OK"}
        assert "del-b" not in {g["group_id"] for g in client.list_groups()}
        assert client.delete_groups(["del-b"]) == {"del-b": "GroupIdNotFoundError"}
    finally:
        client.close()


def test_dump_log_offsets_decoder_shows_a_commit(cluster: LocalCluster) -> None:
    p = partition_for("ck-group", OFFSETS_PARTITIONS)
    spec = cluster.spec(1)
    segments = sorted(pathlib.Path(spec.data_dir).glob(f"__consumer_offsets-{p}/*.log"))
    assert segments
    out = subprocess.run(
        [sys.executable, "-m", "minibroker.deploy", "dump-log", "--offsets-decoder", "--files"]
        + [str(s) for s in segments],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert (
        'key: {"type":"1","data":{"group":"ck-group","topic":"orders","partition":2}} '
        'payload: {"version":"3","data":{"offset":9,' in out.stdout
    )


def test_commits_survive_a_coordinator_sigkill(cluster: LocalCluster) -> None:
    group = "ck-group"
    victim = coordinator_of(cluster, group)
    cluster.kill(victim)
    try:
        wait_until(
            lambda: coordinator_of(cluster, group) not in (victim, -1),
            30,
            "a new leader of the group's __consumer_offsets partition",
        )
        assert confluent_committed(cluster, group, [0, 1, 2]) == [7, 8, 9]
        # The new coordinator takes new commits (2 in-sync replicas are enough).
        consumer = confluent_consumer(cluster, group)
        try:
            consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0)])
            consumer.commit(
                offsets=[confluent_kafka.TopicPartition(TOPIC, 0, 70)], asynchronous=False
            )
        finally:
            consumer.close()
        assert confluent_committed(cluster, group, [0, 1, 2]) == [70, 8, 9]
    finally:
        cluster.start(victim)
