"""A consumer notices the log truncated under it by an unclean election (KIP-320), with real
brokers and a controller on 127.0.0.1.

The consumer reads 15 records that only the leader had (its followers were dead, the ISR was the
leader alone, min.insync.replicas=1); the leader dies and a follower with 10 of them is elected
uncleanly and takes 3 new records at offsets 10..12. The consumer's position (15, epoch e) is
validated against the new leader with OffsetForLeaderEpoch: epoch e ends at 10 there, so offsets
10..14 that it returned are gone. Kafka's consumer then raises LogTruncationError (no reset
policy) or moves to the divergence point, 10, and reads the new leader's records from there.
Without the validation it would fetch at 15, get OFFSET_OUT_OF_RANGE and reset to the log start
or end, or raise that error (checked with the validation switched off: the "earliest" case reads
from offset 0 and the "none" case gets OffsetOutOfRangeError; "latest" can coincide, when its reset
lands before the new records are written).

The second scenario (at the end) gets there with a SIGSTOPped follower instead of killed ones:
the same process, resumed, is elected uncleanly with RF 2.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator

import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.client import (
    Admin,
    Consumer,
    LogTruncationError,
    OffsetOutOfRangeError,
    Producer,
    TopicPartition,
)

pytestmark = pytest.mark.integration

TP = TopicPartition("t", 0)


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    settings = {
        "replica.lag.time.max.ms": "1500",
        "broker.session.timeout.ms": "2500",
        "leader.imbalance.check.interval.seconds": "3600",
    }
    with local_cluster(str(tmp_path / "cluster"), brokers=3, settings=settings) as c:
        yield c


def partition(admin: Admin):  # type: ignore[no-untyped-def]
    (desc,) = admin.describe_topics([TP.topic])
    return desc.partitions[0]


def produce(bootstrap: str, values: list[bytes], acks: str) -> list[int]:
    with Producer(bootstrap, acks=acks) as producer:
        futures = [producer.send(TP.topic, v, partition=0) for v in values]
        return [f.result(timeout=30).offset for f in futures]


def read(consumer: Consumer, count: int, timeout_s: float = 30.0) -> list:  # type: ignore[type-arg]
    records: list = []  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout_s
    while len(records) < count:
        assert time.monotonic() < deadline, f"read {len(records)} of {count} records"
        records.extend(consumer.poll(timeout_ms=200))
    return records


def truncate_under(cluster: LocalCluster, admin: Admin, consumer: Consumer) -> tuple[int, int]:
    """Drive the scenario up to the 3 new records on the unclean leader; returns (old leader
    epoch, new leader epoch)."""
    admin.create_topic(
        TP.topic,
        1,
        3,
        {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"},
    )
    wait_until(lambda: len(partition(admin).isr) == 3, 30, "a full ISR")
    assert produce(cluster.bootstrap, [b"old-%d" % i for i in range(10)], "all") == list(range(10))
    first = partition(admin)
    leader = first.leader
    followers = [b for b in first.replicas if b != leader]
    wait_until(
        lambda: all(leo == 10 for leo in partition(admin).log_end_offsets.values()),
        30,
        "every replica at offset 10",
    )

    # The followers die: the ISR shrinks to the leader, which takes 5 records alone.
    for b in followers:
        cluster.kill(b)
    wait_until(lambda: partition(admin).isr == (leader,), 30, "the ISR shrunk to the leader")
    assert produce(cluster.bootstrap, [b"lost-%d" % i for i in range(10, 15)], "1") == list(
        range(10, 15)
    )
    old_epoch = partition(admin).leader_epoch

    # The consumer reads all 15, the last 5 of which no other replica has.
    records = read(consumer, 15)
    assert [r.offset for r in records] == list(range(15))
    assert records[-1].value == b"lost-14" and records[-1].leader_epoch == old_epoch

    # The leader dies; the followers come back and one of them is elected uncleanly, with 10.
    cluster.kill(leader)
    for b in followers:
        cluster.start(b)
    wait_until(lambda: partition(admin).leader in followers, 60, "an unclean election")
    new = partition(admin)
    assert new.leader_epoch > old_epoch
    assert produce(cluster.bootstrap, [b"new-%d" % i for i in range(3)], "1") == [10, 11, 12]
    return old_epoch, new.leader_epoch


@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_with_a_reset_policy_the_consumer_moves_to_the_divergence_point(
    cluster: LocalCluster, reset: str
) -> None:
    with (
        Admin(cluster.bootstrap) as admin,
        Consumer(cluster.bootstrap, auto_offset_reset=reset) as consumer,
    ):
        consumer.assign([TP])
        consumer.seek(TP, 0)
        _, new_epoch = truncate_under(cluster, admin, consumer)
        records = read(consumer, 3)
        # Neither the log start (0) nor its end (13): the first offset known to diverge.
        assert [(r.offset, r.value) for r in records] == [
            (10, b"new-0"),
            (11, b"new-1"),
            (12, b"new-2"),
        ]
        assert {r.leader_epoch for r in records} == {new_epoch}
        assert consumer.position(TP) == 13
        assert consumer.poll(timeout_ms=500) == []


def test_without_a_reset_policy_poll_raises_log_truncation(cluster: LocalCluster) -> None:
    with (
        Admin(cluster.bootstrap) as admin,
        Consumer(cluster.bootstrap, auto_offset_reset="none") as consumer,
    ):
        consumer.assign([TP])
        consumer.seek(TP, 0)
        truncate_under(cluster, admin, consumer)
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "no LogTruncationError within 30 s"
            try:
                leaked = consumer.poll(timeout_ms=200)
            except LogTruncationError as err:
                assert err.divergent_offsets == {TP: 10}
                assert isinstance(err, OffsetOutOfRangeError)
                break
            assert leaked == [], f"records returned past the truncation: {leaked}"
        # It stays raised until the application seeks; then it reads on from there.
        with pytest.raises(LogTruncationError):
            read(consumer, 1, timeout_s=10)
        consumer.seek(TP, 10)
        assert [r.value for r in read(consumer, 3)] == [b"new-0", b"new-1", b"new-2"]


# -- A paused follower elected uncleanly -------------------------------------------------------
#
# Replication factor 2. The follower B is SIGSTOPped rather than killed, so it is the same
# process (same broker epoch, same in-memory replica state) that is resumed and elected after the
# leader A dies: it leaves the ISR by lag, is fenced by its session timeout, comes back through
# heartbeats alone and leads from its 10 records at a higher leader epoch. The consumer read 25
# records from A (epoch e), 15 of which B never had.
#
# A SIGSTOPped broker black-holes requests: a client call that lands on it waits out its whole
# deadline (Metadata up to 10 s, DescribeReplicas 5 s with the default request timeout), so the
# admin and producers driving the scenario use a short one. The consumer under test keeps its
# defaults.

PAUSED_TP = TopicPartition("p", 0)
DRIVER_TIMEOUT_MS = 2000


def describe_paused(admin: Admin):  # type: ignore[no-untyped-def]
    (desc,) = admin.describe_topics([PAUSED_TP.topic])
    return desc.partitions[0]


def produce_paused(bootstrap: str, values: list[bytes], acks: str) -> list[int]:
    with Producer(bootstrap, acks=acks, request_timeout_ms=DRIVER_TIMEOUT_MS) as producer:
        futures = [producer.send(PAUSED_TP.topic, v, partition=0) for v in values]
        return [f.result(timeout=30).offset for f in futures]


def truncate_under_paused_follower(
    cluster: LocalCluster, admin: Admin, consumer: Consumer
) -> tuple[int, int]:
    """Drive the scenario up to the 5 new records at offsets 10..14 on the resumed follower;
    returns (the consumed records' leader epoch, the new leader epoch)."""
    admin.create_topic(
        PAUSED_TP.topic,
        1,
        2,
        {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"},
    )
    wait_until(lambda: len(describe_paused(admin).isr) == 2, 30, "a full ISR")
    first = describe_paused(admin)
    a = first.leader
    (b,) = (r for r in first.replicas if r != a)
    old = [b"old-%d" % i for i in range(10)]
    assert produce_paused(cluster.bootstrap, old, "all") == list(range(10))
    wait_until(
        lambda: (
            (p := describe_paused(admin)).leader == a
            and p.high_watermark == 10
            and p.log_end_offsets.get(b) == 10
        ),
        30,
        f"HW 10 on leader {a} and LEO 10 on follower {b}",
    )

    # B freezes: it leaves the ISR and A takes 15 more records alone.
    cluster.pause(b)
    wait_until(lambda: describe_paused(admin).isr == (a,), 30, f"the ISR shrunk to [{a}]")
    lost = [b"lost-%d" % i for i in range(10, 25)]
    assert produce_paused(cluster.bootstrap, lost, "1") == list(range(10, 25))
    wait_until(lambda: describe_paused(admin).high_watermark == 25, 30, f"HW 25 on leader {a}")
    old_epoch = describe_paused(admin).leader_epoch

    # The consumer reads all 25 from A.
    records = read(consumer, 25)
    assert [(r.offset, r.value) for r in records] == list(enumerate(old + lost))
    assert {r.leader_epoch for r in records} == {old_epoch}

    # A dies, B thaws and is elected uncleanly with its 10 records.
    cluster.kill(a)
    cluster.resume(b)
    new = wait_until(
        lambda: (p := describe_paused(admin)).leader == b and p.leader_epoch > old_epoch and p,
        60,
        f"an unclean election of broker {b}",
    )
    new_values = [b"new-%d" % i for i in range(5)]
    assert produce_paused(cluster.bootstrap, new_values, "1") == list(range(10, 15))
    # B's log is its 10 replicated records and the 5 new ones, nothing of A's lost tail.
    wait_until(
        lambda: (
            (p := describe_paused(admin)).log_end_offsets.get(b) == 15 and p.high_watermark == 15
        ),
        30,
        f"LEO and HW 15 on broker {b}",
    )
    return old_epoch, new.leader_epoch


@pytest.mark.parametrize("reset", ["none", "earliest"])
def test_a_resumed_follower_elected_uncleanly_is_detected(
    cluster: LocalCluster, reset: str
) -> None:
    with (
        Admin(cluster.bootstrap, request_timeout_ms=DRIVER_TIMEOUT_MS) as admin,
        Consumer(cluster.bootstrap, auto_offset_reset=reset) as consumer,
    ):
        consumer.assign([PAUSED_TP])
        consumer.seek(PAUSED_TP, 0)
        _, new_epoch = truncate_under_paused_follower(cluster, admin, consumer)
        if reset == "none":
            deadline = time.monotonic() + 30
            while True:
                assert time.monotonic() < deadline, "no LogTruncationError within 30 s"
                try:
                    leaked = consumer.poll(timeout_ms=200)
                except LogTruncationError as err:
                    assert err.divergent_offsets == {PAUSED_TP: 10}
                    break
                assert leaked == [], f"records returned past the truncation: {leaked}"
            consumer.seek(PAUSED_TP, 10)
        # The new leader's records from the divergence point on: not a re-read from 0, not a
        # jump to the end, none of A's lost offsets 15..24.
        records = read(consumer, 5)
        assert [(r.offset, r.value) for r in records] == [(10 + i, b"new-%d" % i) for i in range(5)]
        assert {r.leader_epoch for r in records} == {new_epoch}
        assert consumer.position(PAUSED_TP) == 15
        assert consumer.poll(timeout_ms=500) == []
