"""minibroker's own client in consumer groups on one shared 3-broker cluster (KafkaGroupCall):
commits and committed offsets (surviving a SIGKILL of the coordinator), three of our consumers
sharing a topic (each partition owned once, every record consumed once), a closed member's
partitions taken over, a group mixing our consumer with a confluent-kafka one (range), and the
`consumer-groups` CLI (--describe with lag, --reset-offsets --to-earliest --execute).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.client import Admin, Consumer, Producer, TopicPartition

pytestmark = pytest.mark.integration

OFFSETS_PARTITIONS = 3
GROUP_SETTINGS = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 300,
    "max_poll_interval_ms": 20_000,
    "auto_offset_reset": "earliest",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("client-groups")
    settings = {
        "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
        "group.initial.rebalance.delay.ms": "0",
    }
    with local_cluster(str(directory / "cluster"), brokers=3, settings=settings) as c:
        yield c


def make_topic(cluster: LocalCluster, name: str, partitions: int, records: int) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(name, partitions, 3, {"min.insync.replicas": "2"})
    with Producer(cluster.bootstrap) as producer:
        for i in range(records):
            producer.send(name, f"v{i}".encode(), key=f"k{i}".encode(), partition=i % partitions)
        producer.flush()


def cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "minibroker.deploy.cli", "consumer-groups", *args,
         "--bootstrap-server", cluster.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_commit_and_committed_survive_a_coordinator_sigkill(cluster: LocalCluster) -> None:
    make_topic(cluster, "c-orders", 3, 0)
    tps = [TopicPartition("c-orders", p) for p in range(3)]
    with Consumer(cluster.bootstrap, group_id="c-commits", enable_auto_commit=False, **GROUP_SETTINGS) as consumer:
        consumer.assign(tps)
        consumer.commit({tp: 5 + tp.partition for tp in tps})
        assert consumer.committed(tps) == {tp: 5 + tp.partition for tp in tps}
    coordinator = coordinator_of(cluster, "c-commits")
    cluster.kill(coordinator)  # SIGKILL
    try:
        with Consumer(cluster.bootstrap, group_id="c-commits", enable_auto_commit=False, **GROUP_SETTINGS) as consumer:
            assert consumer.committed(tps) == {tp: 5 + tp.partition for tp in tps}
            consumer.assign(tps)
            consumer.commit({tps[0]: 42})
            assert consumer.committed([tps[0]]) == {tps[0]: 42}
    finally:
        cluster.start(coordinator)


def coordinator_of(cluster: LocalCluster, group: str) -> int:
    from minibroker.client.groups.transport import coordinator_answer  # noqa: F401

    with Admin(cluster.bootstrap) as admin:
        [topic] = admin.describe_topics(["__consumer_offsets"])
    from minibroker.broker.groups.coordinator import partition_for

    p = partition_for(group, OFFSETS_PARTITIONS)
    return next(d.leader for d in topic.partitions if d.partition == p)
