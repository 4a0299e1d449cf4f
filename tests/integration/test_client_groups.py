"""minibroker's own client in consumer groups on one shared 3-broker cluster (KafkaGroupCall):
commits and committed offsets (surviving a SIGKILL of the coordinator), three of our consumers
sharing a topic (each partition owned once, every record consumed once), a closed member's
partitions taken over, a group mixing our consumer with a confluent-kafka one (range), and the
`consumer-groups` CLI (--describe with lag, --reset-offsets --to-earliest --execute).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest
from cluster_harness import LocalCluster, local_cluster

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
        [
            sys.executable,
            "-m",
            "minibroker.deploy.cli",
            "consumer-groups",
            *args,
            "--bootstrap-server",
            cluster.bootstrap,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_commit_and_committed_survive_a_coordinator_sigkill(cluster: LocalCluster) -> None:
    make_topic(cluster, "c-orders", 3, 0)
    tps = [TopicPartition("c-orders", p) for p in range(3)]
    with Consumer(
        cluster.bootstrap, group_id="c-commits", enable_auto_commit=False, **GROUP_SETTINGS
    ) as consumer:
        consumer.assign(tps)
        consumer.commit({tp: 5 + tp.partition for tp in tps})
        assert consumer.committed(tps) == {tp: 5 + tp.partition for tp in tps}
    coordinator = coordinator_of(cluster, "c-commits")
    cluster.kill(coordinator)  # SIGKILL
    try:
        with Consumer(
            cluster.bootstrap, group_id="c-commits", enable_auto_commit=False, **GROUP_SETTINGS
        ) as consumer:
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


def drain(consumers: list[Consumer], want: int, timeout_s: float = 40) -> dict[int, list[Any]]:
    """Poll every consumer in turn until `want` records arrived in all and every consumer holds
    partitions (or the time is up)."""
    got: dict[int, list[Any]] = {i: [] for i in range(len(consumers))}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for i, c in enumerate(consumers):
            got[i].extend(c.poll(50))
        settled = all(c.assignment() for c in consumers)
        if settled and sum(len(v) for v in got.values()) >= want:
            break
    return got


def test_three_consumers_share_a_topic_and_take_over_a_closed_ones_partitions(
    cluster: LocalCluster,
) -> None:
    topic, n = "g-share", 60
    make_topic(cluster, topic, 6, n)
    consumers = [
        Consumer(cluster.bootstrap, group_id="g-share", client_id=f"ours-{i}", **GROUP_SETTINGS)
        for i in range(3)
    ]
    try:
        for c in consumers:
            c.subscribe([topic])
        got = drain(consumers, n)
        # Each partition owned by exactly one member, every record consumed once.
        owned = [c.assignment() for c in consumers]
        assert all(owned)
        assert sum(len(a) for a in owned) == 6
        assert set().union(*owned) == {TopicPartition(topic, p) for p in range(6)}
        values = sorted(r.value for rs in got.values() for r in rs)
        assert values == sorted(f"v{i}".encode() for i in range(n))
        for c in consumers:
            c.commit()
        # A member leaves: the others take its partitions over, from the committed offsets.
        gone = consumers.pop()
        gone.close()
        with Producer(cluster.bootstrap) as producer:
            for i in range(n, n + 12):
                producer.send(topic, f"v{i}".encode(), partition=i % 6)
            producer.flush()
        later = drain(consumers, 12)
        assert sorted(r.value for rs in later.values() for r in rs) == sorted(
            f"v{i}".encode() for i in range(n, n + 12)
        )
        owned = [c.assignment() for c in consumers]
        assert set().union(*owned) == {TopicPartition(topic, p) for p in range(6)}
        assert not owned[0] & owned[1]
    finally:
        for c in consumers:
            c.close()


def test_our_consumer_and_a_confluent_consumer_split_partitions(cluster: LocalCluster) -> None:
    topic, group, n = "g-mixed", "g-mixed", 40
    make_topic(cluster, topic, 4, n)
    ours = Consumer(
        cluster.bootstrap,
        group_id=group,
        partition_assignment_strategy=["range"],
        **GROUP_SETTINGS,
    )
    theirs = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": group,
            "partition.assignment.strategy": "range",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 300,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        ours.subscribe([topic])
        theirs.subscribe([topic])
        mine: list[Any] = []
        their_values: list[bytes] = []
        their_parts: set[int] = set()
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            if len(mine) + len(their_values) >= n and ours.assignment() and theirs.assignment():
                break
            mine.extend(ours.poll(100))
            msg = theirs.poll(0.1)
            if msg is not None and msg.error() is None:
                their_values.append(msg.value())
                their_parts.add(msg.partition())
        # Both members hold partitions, none twice, and the records were consumed once in all.
        their_assignment = {tp.partition for tp in theirs.assignment()}
        our_assignment = {tp.partition for tp in ours.assignment()}
        assert our_assignment and their_assignment
        assert not our_assignment & their_assignment
        assert our_assignment | their_assignment == {0, 1, 2, 3}
        values = sorted([r.value for r in mine] + their_values)
        assert values == sorted(f"v{i}".encode() for i in range(n))
    finally:
        theirs.close()
        ours.close()


def test_cli_describe_shows_lag_and_reset_to_earliest_rewinds(cluster: LocalCluster) -> None:
    topic, group, n = "g-cli", "cli-group", 30
    make_topic(cluster, topic, 3, n)
    with Consumer(
        cluster.bootstrap, group_id=group, enable_auto_commit=False, **GROUP_SETTINGS
    ) as consumer:
        consumer.subscribe([topic])
        got = drain([consumer], n)
        assert len(got[0]) == n
        # Commit 5 records short of the end on partition 0: a lag of 5 there.
        tp0 = TopicPartition(topic, 0)
        consumer.commit({TopicPartition(topic, p): 10 for p in (1, 2)} | {tp0: 5})
        out = cli(cluster, "--describe", "--group", group)
        assert out.returncode == 0, out.stderr
        rows = [line.split() for line in out.stdout.splitlines() if line.startswith(group)]
        by_partition = {int(r[2]): r for r in rows}
        # CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID
        assert by_partition[0][3:7] == ["5", "10", "5", consumer.member_id()]
        assert by_partition[1][3:6] == ["10", "10", "0"]
        # watch shows the group, its state, members and total lag (HW - committed: 5).
        watched = subprocess.run(
            [
                sys.executable,
                "-m",
                "minibroker.deploy.cli",
                "watch",
                "--once",
                "--bootstrap-server",
                cluster.bootstrap,
                "--topic",
                topic,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        line = next(
            (x.split() for x in watched.stdout.splitlines() if x.strip().startswith(group)), None
        )
        assert line == [group, "Stable", "1", "range", "5"], watched.stdout[-3000:]
        refused = cli(
            cluster,
            "--reset-offsets",
            "--group",
            group,
            "--all-topics",
            "--to-earliest",
            "--execute",
        )
        assert refused.returncode == 1 and "inactive" in refused.stderr
    listed = cli(cluster, "--list")
    assert group in listed.stdout.split()
    done = cli(
        cluster,
        "--reset-offsets",
        "--group",
        group,
        "--topic",
        topic,
        "--to-earliest",
        "--execute",
    )
    assert done.returncode == 0, done.stderr
    with Admin(cluster.bootstrap) as admin:
        assert {tp.partition: c.offset for tp, c in admin.list_group_offsets(group).items()} == {
            0: 0,
            1: 0,
            2: 0,
        }
    deleted = cli(cluster, "--delete", "--group", group)
    assert deleted.returncode == 0, deleted.stderr
    with Admin(cluster.bootstrap) as admin:
        assert group not in {g.group_id for g in admin.list_groups()}


def test_the_leader_rejoins_when_a_subscribed_topic_gains_partitions(cluster: LocalCluster) -> None:
    topic = "g-grow"
    make_topic(cluster, topic, 2, 4)
    with Consumer(
        cluster.bootstrap, group_id="g-grow", metadata_max_age_ms=500, **GROUP_SETTINGS
    ) as consumer:
        consumer.subscribe([topic])
        got = drain([consumer], 4)
        assert len(got[0]) == 4 and len(consumer.assignment()) == 2
        with Admin(cluster.bootstrap) as admin:
            admin.create_partitions({topic: 3})
        with Producer(cluster.bootstrap) as producer:
            producer.send(topic, b"new", partition=2).result()
        records: list[Any] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(r.value == b"new" for r in records):
            records.extend(consumer.poll(100))
        assert TopicPartition(topic, 2) in consumer.assignment()
        assert [r.value for r in records] == [b"new"]
