"""Retention of an idle partition on real brokers (issue 21): with `retention.ms` small, once every
record has expired the leader rolls an empty active segment at the LEO and deletes the old one, so
its log start reaches the LEO; each follower does the same with its own retention pass (the
leader's log start reaches it through the fetch answers, as for any retention). The log then
takes writes at the old LEO, also on a follower killed (SIGKILL) and restarted on the emptied log.

No fixed sleep: every wait polls with a deadline (`wait_until`); every process is killed by PID
when the test ends (`local_cluster`).
"""

from __future__ import annotations

import pathlib

import grpc
import pytest
from cluster_harness import local_cluster, wait_until

from minibroker.client import Admin, Producer
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

TOPIC = "idle"
RECORDS = 60
MAX_BYTES = 1 << 20


def segment_files(data_dir: str) -> list[tuple[str, int]]:
    """(name, size) of the `.log` files of partition 0 of TOPIC in one broker's data dir."""
    directory = pathlib.Path(data_dir) / f"{TOPIC}-0"
    return sorted((p.name, p.stat().st_size) for p in directory.glob("*.log"))


def leader_offsets(address: str) -> tuple[int, int, int]:
    """(log start, high watermark, LEO) in the leader's answer to a consumer fetch at 0."""
    request = pb.FetchRequest(
        replica_id=-1, replica_epoch=-1, max_wait_ms=0, min_bytes=0, max_bytes=MAX_BYTES
    )
    request.topics.add(topic=TOPIC).partitions.add(
        partition=0,
        current_leader_epoch=-1,
        fetch_offset=0,
        last_fetched_epoch=-1,
        log_start_offset=-1,
        partition_max_bytes=MAX_BYTES,
    )
    with grpc.insecure_channel(address) as channel:
        response = pb_grpc.BrokerServiceStub(channel).Fetch(request, timeout=10)
    (partition,) = response.topics[0].partitions
    return partition.log_start_offset, partition.high_watermark, partition.log_end_offset


def test_an_idle_partition_is_emptied_on_every_replica(tmp_path: pathlib.Path) -> None:
    settings = {
        "log.retention.check.interval.ms": "200",
        "replica.lag.time.max.ms": "3000",
        "leader.imbalance.check.interval.seconds": "3600",
    }
    with (
        local_cluster(str(tmp_path / "cluster"), brokers=3, settings=settings) as cluster,
        Admin(cluster.bootstrap) as admin,
    ):
        admin.create_topic(TOPIC, 1, 3, {"retention.ms": "3000"})

        def described():  # type: ignore[no-untyped-def]
            (desc,) = admin.describe_topics([TOPIC])
            return desc.partitions[0]

        wait_until(lambda: len(described().isr) == 3, 30, "a full ISR")
        with Producer(cluster.bootstrap, acks="all") as producer:
            sent = [producer.send(TOPIC, f"r{i}".encode(), partition=0) for i in range(RECORDS)]
            assert [f.result(timeout=30).offset for f in sent] == list(range(RECORDS))
        partition = described()
        replicas = [int(r) for r in partition.replicas]
        leader = int(partition.leader)

        emptied = [(f"{RECORDS:020d}.log", 0)]
        wait_until(
            lambda: all(segment_files(cluster.spec(r).data_dir) == emptied for r in replicas),
            60,
            f"every replica's log to be one empty segment at {RECORDS}",
        )
        assert leader_offsets(cluster.spec(leader).address) == (RECORDS,) * 3

        # A follower SIGKILLed and restarted loads the emptied log; writes go on at the LEO.
        follower = next(r for r in replicas if r != leader)
        cluster.kill(follower)
        cluster.start(follower)
        wait_until(lambda: len(described().isr) == 3, 60, "the follower back in the ISR")
        with Producer(cluster.bootstrap, acks="all") as producer:
            acked = producer.send(TOPIC, b"after", partition=0).result(timeout=30)
        assert acked.offset == RECORDS

        def has_the_new_record(replica: int) -> bool:
            # Still in a segment at RECORDS, or already gone by retention itself (3 s).
            files = segment_files(cluster.spec(replica).data_dir)
            return files[0][0] >= emptied[0][0] and files != emptied

        for r in replicas:
            wait_until(lambda r=r: has_the_new_record(r), 30, f"broker {r} to hold {RECORDS}")
