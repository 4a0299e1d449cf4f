"""A whole cluster on a controller quorum: three controllers, three brokers, acks=all writes.

Real processes on 127.0.0.1 through the launcher (`cluster up --controllers 3`): the active
controller is SIGKILLed again and again, paused, and the quorum is left without a majority while
a leader broker dies. What must hold (docs/design.md §6.1, §8): no acknowledged metadata change
and no acknowledged record is lost, a controller failover never fences a healthy broker, and
every partition ends with a leader and its full ISR.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until
from test_replication import BackgroundProducer, read_all, wait_for_progress

from minibroker.client import Admin, NewTopic, TopicPartition
from minibroker.deploy import cluster as launcher

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

SETTINGS = {
    "replica.lag.time.max.ms": "1500",
    "leader.imbalance.check.interval.seconds": "3600",
    "controller.quorum.election.timeout.ms": "300",
    "controller.quorum.fetch.timeout.ms": "600",
    "controller.quorum.election.backoff.max.ms": "300",
}


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    with local_cluster(str(tmp_path / "cluster"), brokers=3, settings=SETTINGS, controllers=3) as c:
        yield c


def active(cluster: LocalCluster) -> launcher.ProcessSpec:
    return wait_until(lambda: launcher.active_controller(cluster.state), 30, "an active controller")


def settled(admin: Admin, topics: list[str]) -> bool:
    """Every partition of `topics` has a leader and its whole replica set in the ISR."""
    for desc in admin.describe_topics(topics):
        for p in desc.partitions:
            if p.leader < 0 or set(p.isr) != set(p.replicas):
                return False
    return True


def fencings(cluster: LocalCluster) -> list[str]:
    out = []
    for spec in cluster.state.controllers:
        text = pathlib.Path(spec.log_file).read_text(errors="replace")
        out += [line for line in text.splitlines() if '"broker_fenced"' in line]
    return out


def test_ten_active_controller_kills_lose_no_record_no_topic_and_fence_no_broker(
    cluster: LocalCluster,
) -> None:
    admin = Admin(cluster.bootstrap)
    try:
        admin.create_topics([NewTopic("q", 3, 3, {"min.insync.replicas": "2"})])
        wait_until(lambda: settled(admin, ["q"]), 30, "topic q settled")
        created = []
        with BackgroundProducer(cluster.bootstrap, "q") as producer:
            wait_for_progress(producer, 200)
            for i in range(10):
                victim = active(cluster)
                cluster.kill(victim.name)
                # A topic created during the failover: the admin follows NOT_CONTROLLER hints.
                name = f"during-{i}"
                admin.create_topics([NewTopic(name, 1, 3)])
                created.append(name)
                wait_for_progress(producer, 100)
                cluster.start(victim.name)
            wait_for_progress(producer, 200)
        assert producer.count() > 0
        wait_until(lambda: settled(admin, ["q", *created]), 60, "every partition settled")
        assert {t.name for t in admin.describe_topics(created)} == set(created)
        records = read_all(cluster.bootstrap, TopicPartition("q", 0))
        stored = {r.value: r.offset for r in records}
        lost = {v: o for v, o in producer.acked.items() if stored.get(v) != o}
        assert not lost, f"{len(lost)} acknowledged records lost or moved"
        assert [r.offset for r in records] == list(range(len(records)))
        # Each new active controller gives every broker a fresh session: none is fenced.
        assert fencings(cluster) == []
    finally:
        admin.close()


def test_a_leader_broker_dies_while_the_quorum_has_no_majority(cluster: LocalCluster) -> None:
    admin = Admin(cluster.bootstrap)
    try:
        admin.create_topics([NewTopic("m", 1, 3, {"min.insync.replicas": "2"})])
        wait_until(lambda: settled(admin, ["m"]), 30, "topic m settled")
        with BackgroundProducer(cluster.bootstrap, "m") as producer:
            wait_for_progress(producer, 200)
            leader = active(cluster)
            others = [c for c in cluster.state.controllers if c.name != leader.name]
            cluster.kill(others[0].name)
            cluster.kill(others[1].name)
            # The lone voter resigns: no controller is active, the data plane keeps serving.
            wait_until(
                lambda: launcher.active_controller(cluster.state) is None,
                30,
                "the quorum without a leader",
            )
            wait_for_progress(producer, 200)
            (desc,) = admin.describe_topics(["m"])
            broker = desc.partitions[0].leader
            cluster.kill(broker)
            # Nobody can elect a new partition leader until the quorum is back.
            cluster.start(others[0].name)
            active(cluster)
            wait_for_progress(producer, 200, timeout_s=60)
            cluster.start(broker)
            cluster.start(others[1].name)
            wait_until(lambda: settled(admin, ["m"]), 60, "m settled with every replica")
        records = read_all(cluster.bootstrap, TopicPartition("m", 0))
        stored = {r.value: r.offset for r in records}
        lost = {v: o for v, o in producer.acked.items() if stored.get(v) != o}
        assert not lost, f"{len(lost)} acknowledged records lost or moved"
    finally:
        admin.close()


def test_a_paused_active_controller_is_replaced_and_the_cluster_follows(
    cluster: LocalCluster,
) -> None:
    admin = Admin(cluster.bootstrap)
    try:
        old = active(cluster)
        cluster.pause(old.name)
        try:
            new = wait_until(
                lambda: _active_other_than(cluster, old.name), 30, "a new active controller"
            )
            admin.create_topics([NewTopic("after-pause", 3, 3)])
            wait_until(lambda: settled(admin, ["after-pause"]), 30, "the new topic settled")
        finally:
            cluster.resume(old.name)
        status = wait_until(
            lambda: _follows(cluster, old, new), 30, "the resumed controller following"
        )
        assert status
        assert fencings(cluster) == []
    finally:
        admin.close()


def _active_other_than(cluster: LocalCluster, name: str) -> launcher.ProcessSpec | None:
    spec = launcher.active_controller(cluster.state)
    return spec if spec is not None and spec.name != name else None


def _follows(cluster: LocalCluster, old: launcher.ProcessSpec, new: launcher.ProcessSpec) -> bool:
    inputs = launcher.quorum_inputs(cluster.state)
    roles = {i.name: i.answer for i in inputs if getattr(i, "answer", None) is not None}
    answer = roles.get(old.name)
    return answer is not None and answer.role == "follower" and answer.leader_id == new.node_id
