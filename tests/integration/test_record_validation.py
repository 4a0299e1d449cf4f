"""A real leader refuses batches whose CRC is right and whose records are not (issue 11, item 1).

Issue 11 found that a batch with a valid CRC but a wrong record count, a garbage body, codec 7
or the gzip flag on plain bytes was stored, replicated and served, after which every consumer
failed at its offset (`consume --from-beginning` exited 1). Here a 3-broker cluster (real
processes on 127.0.0.1, RF=3, min.insync.replicas=2) gets every batch of `bad_batches.CASES`
through the gRPC stubs, sent straight to the partition's leader as a hostile client would, with
good batches before and after. For each: the leader answers the case's error code (CORRUPT_MESSAGE,
INVALID_RECORD or INVALID_TIMESTAMP) and no offset; the HW and every replica's LEO are unchanged;
afterwards a consumer reading from the beginning gets every good record, in order and nothing
else, and so does `minibroker consume --from-beginning` (exit status 0).
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import pytest
from bad_batches import CASES, good_batch
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.client import Admin, Consumer, TopicPartition
from minibroker.client.errors import ErrorCode
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

TOPIC = "checked"
TP = TopicPartition(TOPIC, 0)


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    with local_cluster(str(tmp_path / "cluster"), brokers=3) as c:
        yield c


def now_ms() -> int:
    return int(time.time() * 1000)


def produce(stub: pb_grpc.BrokerServiceStub, records: bytes) -> pb.PartitionProduceResponse:
    request = pb.ProduceRequest(acks=-1, timeout_ms=10_000)
    topic = request.topics.add(topic=TOPIC)
    topic.partitions.add(partition=0, records=records)
    response = stub.Produce(request, timeout=30)
    (answer,) = [p for t in response.topics for p in t.partitions]
    return answer


def produce_acknowledged(
    stub: pb_grpc.BrokerServiceStub, records: bytes
) -> pb.PartitionProduceResponse | None:
    answer = produce(stub, records)
    return answer if answer.error_code == ErrorCode.NONE else None


def offsets(admin: Admin) -> tuple[int, dict[int, int | None]]:
    """(HW, LEO of each replica) of TP, once every replica has answered and agrees."""

    def settled() -> tuple[int, dict[int, int | None]] | None:
        (topic,) = admin.describe_topics([TOPIC])
        (part,) = topic.partitions
        leos = dict(part.log_end_offsets)
        if len(leos) == 3 and len(set(leos.values())) == 1 and part.high_watermark in leos.values():
            return part.high_watermark, leos
        return None

    return wait_until(settled, 30, "the replicas of the topic to agree on their LEO")


def test_leader_refuses_crc_valid_corrupt_batches(cluster: LocalCluster) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, 3, {"min.insync.replicas": "2"})
        wait_until(
            lambda: admin.describe_topics([TOPIC])[0].partitions[0].leader >= 0, 30, "a leader"
        )
        leader = admin.describe_topics([TOPIC])[0].partitions[0].leader
        channel = grpc.insecure_channel(cluster.spec(leader).address)
        stub = pb_grpc.BrokerServiceStub(channel)
        try:
            # The first write waits until the leader knows its followers are in sync.
            first = wait_until(
                lambda: produce_acknowledged(stub, good_batch(now_ms(), 3)),
                30,
                "the first good batch to be acknowledged",
            )
            assert first.base_offset == 0
            expected = 3
            for case, (build, code) in sorted(CASES.items()):
                answer = produce(stub, build(now_ms()))
                assert answer.error_code == code, f"{case}: {answer}"
                assert answer.error_message, case
                assert answer.base_offset == -1, case
                # Nothing moved, on the leader or on any follower.
                assert offsets(admin) == (expected, {b: expected for b in (1, 2, 3)}), case
                good = produce(stub, good_batch(now_ms(), 2))
                assert (good.error_code, good.base_offset) == (ErrorCode.NONE, expected), case
                expected += 2
        finally:
            channel.close()

    with Consumer(cluster.bootstrap) as consumer:
        consumer.assign([TP])
        consumer.seek_to_beginning(TP)
        records = []
        deadline = time.monotonic() + 60
        while len(records) < expected and time.monotonic() < deadline:
            records.extend(consumer.poll(timeout_ms=500))
    assert [r.offset for r in records] == list(range(expected))
    assert all(r.value.startswith(b"value-") for r in records)

    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "minibroker.deploy",
            "consume",
            TOPIC,
            "--from-beginning",
            "--timeout-ms",
            "3000",
            "--bootstrap-server",
            cluster.bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    assert len(cli.stdout.splitlines()) == expected
