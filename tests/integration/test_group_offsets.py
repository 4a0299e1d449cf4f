"""Committed offsets of consumer groups on a real 3-broker cluster, through Kafka clients that
no one here wrote (kafka-python, confluent-kafka, aiokafka): FindCoordinator creates
__consumer_offsets, simple commits (manual assignment, generation -1) are read back with
committed() by the client that made them and by another, survive a SIGKILL of the group's
coordinator (the new leader of its partition loads them from its log), ListGroups and
DeleteGroups through both admin clients, FindCoordinator and OffsetFetch over KafkaGroupCall
(minibroker's own client's path), and `dump-log --offsets-decoder` on a replica's segment
shows the commit.
"""

from __future__ import annotations

import asyncio
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import aiokafka
import confluent_kafka
import grpc
import kafka
import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until
from confluent_kafka.admin import AdminClient
from kafka.admin import KafkaAdminClient
from kafka.structs import OffsetAndMetadata
from kio.schema.errors import ErrorCode
from kio.schema.offset_fetch.v8 import request as fetch_v8

from minibroker.broker.groups.coordinator import partition_for
from minibroker.broker.kafka import codec
from minibroker.client import Admin
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc
from tests.unit.test_kafka_protocol import read_response, request_bytes

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


def test_aiokafka_commits_and_reads_back(cluster: LocalCluster) -> None:
    async def run() -> list[int | None]:
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=cluster.kafka_bootstrap,
            group_id="aio-group",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            tps = [aiokafka.TopicPartition(TOPIC, p) for p in range(3)]
            consumer.assign(tps)
            await consumer.commit({tp: 30 + tp.partition for tp in tps})
            return [await consumer.committed(tp) for tp in tps]
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == [30, 31, 32]
    assert confluent_committed(cluster, "aio-group", [0, 1, 2]) == [30, 31, 32]


def group_call(address: str, api_key: int, version: int, body: Any) -> Any:
    """One Kafka request over BrokerService.KafkaGroupCall (minibroker's own client's path)."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.BrokerServiceStub(channel)
        answer = stub.KafkaGroupCall(
            pb.KafkaFrame(frame=request_bytes(api_key, version, 5, body)), timeout=30
        )
    correlation_id, read = read_response(api_key, version, answer.frame)
    assert correlation_id == 5
    return read


def test_offsets_over_kafka_group_call(cluster: LocalCluster) -> None:
    find = codec.make(codec.request_class(10, 4), key_type=0, coordinator_keys=("ck-group",))
    [coordinator] = group_call(cluster.bootstrap.split(",")[0], 10, 4, find).coordinators
    assert coordinator.error_code == ErrorCode.none
    assert coordinator.node_id == coordinator_of(cluster, "ck-group")
    fetch = codec.make(
        fetch_v8.OffsetFetchRequest,
        groups=(codec.make(fetch_v8.OffsetFetchRequestGroup, group_id="ck-group", topics=None),),
        require_stable=True,
    )
    grpc_address = cluster.spec(coordinator.node_id).address
    [group] = group_call(grpc_address, 9, 8, fetch).groups
    assert group.error_code == ErrorCode.none
    assert sorted(
        (p.partition_index, p.committed_offset) for t in group.topics for p in t.partitions
    ) == [(0, 7), (1, 8), (2, 9)]
    # Another broker is not the coordinator.
    other = next(
        s.address for s in cluster.state.brokers if s.name != cluster.spec(coordinator.node_id).name
    )
    assert group_call(other, 9, 8, fetch).groups[0].error_code == ErrorCode.not_coordinator


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


def test_a_subscribed_member_commits_with_its_generation(cluster: LocalCluster) -> None:
    """With G2's membership: a member's commits carry its generation; the group is listed
    Stable while it is there, Empty after it leaves, and its offsets stay."""
    consumer = confluent_consumer(cluster, "sub-group")
    try:
        consumer.subscribe([TOPIC])
        wait_until(
            lambda: consumer.poll(0.2) is None and len(consumer.assignment()) == 3,
            30,
            "the member's assignment",
        )
        consumer.commit(
            offsets=[confluent_kafka.TopicPartition(TOPIC, p, 40 + p) for p in range(3)],
            asynchronous=False,
        )
        admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
        listed = admin.list_consumer_groups(request_timeout=30).result()
        [group] = [g for g in listed.valid if g.group_id == "sub-group"]
        assert group.state == confluent_kafka.ConsumerGroupState.STABLE
        # A non-empty group cannot be deleted.
        [future] = admin.delete_consumer_groups(["sub-group"], request_timeout=30).values()
        with pytest.raises(confluent_kafka.KafkaException, match="NON_EMPTY_GROUP"):
            future.result()
    finally:
        consumer.close()
    assert confluent_committed(cluster, "sub-group", [0, 1, 2]) == [40, 41, 42]

    def state() -> Any:
        listed = admin.list_consumer_groups(request_timeout=30).result()
        return next((g.state for g in listed.valid if g.group_id == "sub-group"), None)

    wait_until(lambda: state() == confluent_kafka.ConsumerGroupState.EMPTY, 30, "Empty")


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
