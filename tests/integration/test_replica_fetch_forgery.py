"""Issue 16's first forgery, against a real cluster: a client sends a follower Fetch with the
replica id of a paused follower and no broker epoch (`replica_epoch` -1, which used to skip the
stale-broker check), or a made-up one. Each is refused with STALE_BROKER_EPOCH; the leader's HW
and its view of the follower do not move, and an acks=all write the follower has not copied is
not acknowledged until the real follower, resumed, fetches it."""

from __future__ import annotations

import pathlib

import grpc
import pytest
from cluster_harness import local_cluster, wait_until

from minibroker.client import Admin, Producer
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

TOPIC = "forged"
# The paused follower must stay in the ISR (and registered, unfenced) for the whole test: only
# it holds the HW back, so only a fetch counted as its own could move it.
SETTINGS = {
    "replica.lag.time.max.ms": "120000",
    "broker.session.timeout.ms": "120000",
    "leader.imbalance.check.interval.seconds": "3600",
}


def leader_replica(address: str) -> pb.ReplicaDescription:
    with grpc.insecure_channel(address) as channel:
        answer = pb_grpc.BrokerServiceStub(channel).DescribeReplicas(
            pb.DescribeReplicasRequest(topics=[TOPIC]), timeout=5
        )
    (replica,) = [r for r in answer.replicas if r.partition == 0]
    assert replica.is_leader
    return replica


def forged_fetch(address: str, replica_id: int, replica_epoch: int, leader_epoch: int, offset: int):  # type: ignore[no-untyped-def]
    request = pb.FetchRequest(
        replica_id=replica_id, replica_epoch=replica_epoch, max_wait_ms=0, min_bytes=0
    )
    request.max_bytes = 1 << 20
    request.topics.add(topic=TOPIC).partitions.add(
        partition=0,
        current_leader_epoch=leader_epoch,
        fetch_offset=offset,
        last_fetched_epoch=leader_epoch,
        log_start_offset=0,
        partition_max_bytes=1 << 20,
    )
    with grpc.insecure_channel(address) as channel:
        answer = pb_grpc.BrokerServiceStub(channel).Fetch(request, timeout=10)
    (topic,) = answer.topics
    (partition,) = topic.partitions
    return partition


def test_forged_follower_fetch_is_refused_and_moves_nothing(tmp_path: pathlib.Path) -> None:
    with local_cluster(str(tmp_path / "cluster"), brokers=3, settings=SETTINGS) as cluster:
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, 1, 2, {"min.insync.replicas": "1"})
            wait_until(
                lambda: len(admin.describe_topics([TOPIC])[0].partitions[0].isr) == 2,
                30,
                "a full ISR",
            )
            (partition,) = admin.describe_topics([TOPIC])[0].partitions
            registered = {b.broker_id: b.broker_epoch for b in admin.describe_cluster().brokers}
        leader = partition.leader
        (follower,) = [r for r in partition.replicas if r != leader]
        leader_address = cluster.spec(leader).address
        with Producer(cluster.bootstrap, acks="all", request_timeout_ms=60_000) as producer:
            assert producer.send(TOPIC, b"copied", partition=0).result(timeout=30).offset == 0
            wait_until(lambda: leader_replica(leader_address).high_watermark == 1, 30, "HW 1")

            cluster.pause(follower)
            pending = producer.send(TOPIC, b"only-on-the-leader", partition=0)
            wait_until(
                lambda: leader_replica(leader_address).log_end_offset == 2, 30, "leader LEO 2"
            )
            before = leader_replica(leader_address)
            assert before.high_watermark == 1 and set(before.isr) == {leader, follower}
            follower_leo = {f.replica_id: f.log_end_offset for f in before.followers}[follower]

            epoch = registered[follower]
            for forged_epoch in (-1, epoch - 1, epoch + 1):
                answer = forged_fetch(
                    leader_address, follower, forged_epoch, before.leader_epoch, offset=2
                )
                assert answer.error_code == pb.STALE_BROKER_EPOCH, (forged_epoch, answer)
                assert answer.records == b""

            after = leader_replica(leader_address)
            assert after.high_watermark == 1
            assert set(after.isr) == {leader, follower}
            assert {f.replica_id: f.log_end_offset for f in after.followers}[follower] == (
                follower_leo
            )
            # The produce is answered when the HW passes it, in the same step: not yet.
            assert not pending.done()

            cluster.resume(follower)  # the real follower fetches with its epoch: acknowledged
            assert pending.result(timeout=60).offset == 1
            wait_until(lambda: leader_replica(leader_address).high_watermark == 2, 30, "HW 2")
