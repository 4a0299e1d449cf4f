"""Kafka consumer groups (the classic protocol) on a real 3-broker cluster, with clients no one
here wrote: confluent-kafka (librdkafka) and kafka-python share one group, aiokafka and
kafka-python another. Each member is its own process (tests/integration/group_member.py), so a
test can SIGKILL one: it sends no LeaveGroup, and only its session timeout (6 s) frees its
partitions.

Checked: every partition is owned by exactly one member ('range', common to all three
clients), each record is consumed once, by its partition's owner; after a member is killed its
partitions move to the others and new records on them are consumed; a member that closes
(LeaveGroup) hands its partitions over before any session timeout could.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import kafka
import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.client import Admin

pytestmark = pytest.mark.integration

PARTITIONS = 6
MEMBER = pathlib.Path(__file__).with_name("group_member.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("group-membership")
    settings = {
        "group.initial.rebalance.delay.ms": "0",
        "offsets.topic.num.partitions": "3",
    }
    with local_cluster(str(directory / "cluster"), brokers=3, settings=settings) as c:
        yield c


class Member:
    """A member process and what it printed: its latest assignment and its records."""

    def __init__(
        self, kind: str, bootstrap: str, group: str, topic: str, instance: str = ""
    ) -> None:
        self.kind = kind
        self.proc = subprocess.Popen(
            [sys.executable, str(MEMBER), kind, bootstrap, group, topic, instance],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.assigned: list[int] | None = None
        self.assignments = 0  # how many times its assignment changed
        self.generations: list[int] = []  # kafka-python's generations, in order
        self.records: list[tuple[int, int, str]] = []
        self.lock = threading.Lock()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self.lock:
                if "assigned" in event:
                    self.assigned = event["assigned"]
                    self.assignments += 1
                elif "generation" in event:
                    self.generations.append(event["generation"])
                elif "rec" in event:
                    p, offset, value = event["rec"]
                    self.records.append((p, offset, value))

    def snapshot(self) -> tuple[list[int] | None, list[tuple[int, int, str]]]:
        with self.lock:
            return self.assigned, list(self.records)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


@contextlib.contextmanager
def members(bootstrap: str, group: str, topic: str, *kinds: str) -> Iterator[list[Member]]:
    started: list[Member] = []
    try:
        for kind in kinds:
            started.append(Member(kind, bootstrap, group, topic))
        yield started
    finally:
        for m in started:
            if m.proc.poll() is None:
                m.kill()


def owners_split(group: list[Member], per_member: int) -> dict[int, Member] | None:
    """partition -> owner when every partition has exactly one owner and each member owns
    `per_member` of them (range over 6 partitions), else None."""
    owners: dict[int, Member] = {}
    for m in group:
        assigned, _ = m.snapshot()
        if assigned is None or len(assigned) != per_member:
            return None
        for p in assigned:
            if p in owners:
                return None
            owners[p] = m
    return owners if set(owners) == set(range(PARTITIONS)) else None


def produce(cluster: LocalCluster, topic: str, values: range) -> None:
    producer = kafka.KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all")
    try:
        for i in values:
            producer.send(topic, value=str(i).encode(), partition=i % PARTITIONS)
        producer.flush(30)
    finally:
        producer.close()


def consumed(group: list[Member]) -> dict[str, list[tuple[Member, int]]]:
    """value -> [(member, partition)] over every record each member printed."""
    out: dict[str, list[tuple[Member, int]]] = {}
    for m in group:
        for p, _offset, value in m.snapshot()[1]:
            out.setdefault(value, []).append((m, p))
    return out


def create_topic(cluster: LocalCluster, name: str) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(name, PARTITIONS, 3, {"min.insync.replicas": "2"})


def test_three_members_two_clients_then_one_killed(cluster: LocalCluster) -> None:
    topic = "shared"
    create_topic(cluster, topic)
    kinds = ("confluent", "kafka-python", "confluent")
    with members(cluster.kafka_bootstrap, "g-three", topic, *kinds) as group:
        owners = wait_until(lambda: owners_split(group, 2), 45, "6 partitions split 2/2/2")
        produce(cluster, topic, range(300))
        wait_until(lambda: len(consumed(group)) == 300, 30, "300 records consumed")
        seen = consumed(group)
        # once each, by the owner of its partition (no rebalance happened in between)
        assert all(len(by) == 1 for by in seen.values()), "a record consumed twice"
        for value, [(member, p)] in seen.items():
            assert p == int(value) % PARTITIONS and owners[p] is member
        assert owners_split(group, 2) == owners

        # SIGKILL a librdkafka member: no LeaveGroup; its session (6 s) must expire first
        victim = group[2]
        lost = sorted(p for p, m in owners.items() if m is victim)
        killed_at = time.monotonic()
        victim.kill()
        survivors = group[:2]
        moved = wait_until(lambda: owners_split(survivors, 3), 45, "partitions moved to 2")
        assert time.monotonic() - killed_at > 3.0  # only the session timeout freed them
        assert {p for p in lost if moved[p] in survivors} == set(lost)
        produce(cluster, topic, range(300, 420))
        fresh = [str(i) for i in range(300, 420)]
        wait_until(lambda: all(v in consumed(survivors) for v in fresh), 30, "new records consumed")
        seen = consumed(survivors)
        for v in fresh:
            # once, by the partition's new owner (the moved partitions are read again from the
            # start, as nothing was committed, so old values may repeat; new ones do not)
            [(member, p)] = seen[v]
            assert moved[p] is member


def test_aiokafka_and_kafka_python_share_a_group(cluster: LocalCluster) -> None:
    topic = "shared-aio"
    create_topic(cluster, topic)
    with members(cluster.kafka_bootstrap, "g-aio", topic, "aiokafka", "kafka-python") as group:
        owners = wait_until(lambda: owners_split(group, 3), 45, "6 partitions split 3/3")
        produce(cluster, topic, range(60))
        wait_until(lambda: len(consumed(group)) == 60, 30, "60 records consumed")
        for value, by in consumed(group).items():
            assert len(by) == 1
            member, p = by[0]
            assert owners[p] is member and p == int(value) % PARTITIONS
        # kafka-python closes (LeaveGroup): aiokafka owns all 6 well within a session (6 s)
        closed_at = time.monotonic()
        group[1].proc.send_signal(signal.SIGTERM)
        wait_until(lambda: owners_split(group[:1], 6), 20, "aiokafka owning all 6")
        assert time.monotonic() - closed_at < 5.0
        assert group[1].proc.wait(10) == 0


def test_a_static_member_restarts_without_a_rebalance(cluster: LocalCluster) -> None:
    """KIP-345: a librdkafka member with a group.instance.id is SIGKILLed and started again
    with the same id before its session expires: it takes its old place (the old member id is
    fenced) and gets its old partitions back, and the other member never rebalances."""
    topic = "shared-static"
    create_topic(cluster, topic)
    bootstrap = cluster.kafka_bootstrap
    with members(bootstrap, "g-static", topic, "kafka-python") as group:
        group.append(Member("confluent", bootstrap, "g-static", topic, "static-1"))
        owners = wait_until(lambda: owners_split(group, 3), 45, "6 partitions split 3/3")
        dynamic, static = group
        mine = sorted(p for p, m in owners.items() if m is static)
        time.sleep(1.5)  # settled: no assignment change pending on either side
        changes = dynamic.snapshot()[0], dynamic.assignments
        generations = list(dynamic.generations)
        assert generations and generations[-1] > 0
        restarted_at = time.monotonic()
        static.kill()
        again = Member("confluent", bootstrap, "g-static", topic, "static-1")
        group.append(again)
        wait_until(lambda: again.snapshot()[0] == mine, 30, "the static member's partitions back")
        assert time.monotonic() - restarted_at < 6.0  # within the session: no expiry
        produce(cluster, topic, range(60))
        wait_until(lambda: len(consumed([dynamic, again])) == 60, 30, "60 records consumed")
        assert (dynamic.snapshot()[0], dynamic.assignments) == changes
        assert dynamic.generations == generations  # never rebalanced
        for value, [(member, p)] in consumed([dynamic, again]).items():
            assert p == int(value) % PARTITIONS
            assert member is (again if p in mine else dynamic)
