"""Moving replicas with real processes: reassignment, decommissioning, rebuilding, throttles.

Brokers and controllers run as processes on 127.0.0.1 through the launcher; an idempotent
acks=all producer and a reader run throughout. What must hold (docs/design.md §8, issue 14):
no acknowledged record is lost or moved, no value is stored twice, offsets stay contiguous, a
reader never sees a record that is not in the final log at the same offset (it read only below
the HW), the ISR never goes below what writes need, and a removed broker deletes its copy only
after the metadata stopped naming it.
"""

from __future__ import annotations

import pathlib
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until
from test_replication import BackgroundProducer, read_all, wait_for_progress

from minibroker.client import Admin, Consumer, NewTopic, TopicPartition
from minibroker.client.admin import AlterConfigOp, ConfigResource
from minibroker.deploy import cluster as launcher

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SETTINGS = {
    "replica.lag.time.max.ms": "2000",
    "leader.imbalance.check.interval.seconds": "3600",
}

TP = TopicPartition("moving", 0)


class StallMeter:
    """The producer's longest wait between two acknowledgements, sampled from its ack count."""

    def __init__(self, producer: BackgroundProducer) -> None:
        self.longest_s = 0.0
        self._producer = producer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last_count = self._producer.count()
        last_change = time.monotonic()
        while not self._stop.wait(0.01):
            count = self._producer.count()
            now = time.monotonic()
            if count != last_count:
                last_count, last_change = count, now
            self.longest_s = max(self.longest_s, now - last_change)

    def __enter__(self) -> StallMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class Reader:
    """Tails a partition from the log start, keeping every (offset, value) it was given."""

    def __init__(self, bootstrap: str, tp: TopicPartition) -> None:
        self.seen: dict[int, bytes] = {}
        self._tp = tp
        self._consumer = Consumer(bootstrap)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.errors: list[BaseException] = []

    def _run(self) -> None:
        try:
            self._consumer.assign([self._tp])
            self._consumer.seek_to_beginning(self._tp)
            while not self._stop.is_set():
                for record in self._consumer.poll(timeout_ms=200):
                    assert record.value is not None
                    self.seen[record.offset] = record.value
        except BaseException as err:
            self.errors.append(err)

    def __enter__(self) -> Reader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._consumer.close()


def partition(admin: Admin, tp: TopicPartition):  # type: ignore[no-untyped-def]
    (desc,) = admin.describe_topics([tp.topic], include_offsets=False)
    return next(p for p in desc.partitions if p.partition == tp.partition)


def partition_at(admin: Admin, replicas: list[int] | tuple[int, ...]):  # type: ignore[no-untyped-def]
    """TP once the brokers' metadata (which may lag the controller's) shows `replicas`, with
    no move running and the whole replica set in the ISR."""

    def there():  # type: ignore[no-untyped-def]
        p = partition(admin, TP)
        done = not p.adding_replicas and not p.removing_replicas and set(p.isr) == set(p.replicas)
        return p if done and list(p.replicas) == list(replicas) else None

    return wait_until(there, 30, f"{TP} on {list(replicas)} in the brokers' metadata")


def settled(admin: Admin, topics: list[str]) -> bool:
    for desc in admin.describe_topics(topics, include_offsets=False):
        for p in desc.partitions:
            if p.leader < 0 or set(p.isr) != set(p.replicas):
                return False
    return True


def no_reassignments(admin: Admin) -> bool:
    return not admin.list_partition_reassignments()


def check_log(cluster: LocalCluster, producer: BackgroundProducer, reader: Reader | None) -> None:
    """Nothing acknowledged lost or moved, no value twice, contiguous offsets, and every
    record the reader was given is in the log at that offset."""
    records = read_all(cluster.bootstrap, TP, timeout_s=60)
    offsets = [r.offset for r in records]
    assert offsets == list(range(len(records))), "offsets are not contiguous"
    values = [r.value for r in records if r.value in producer.acked or r.value.startswith(b"v")]
    assert len(set(values)) == len(values), "a value is stored twice"
    stored = {r.value: r.offset for r in records}
    lost = {v: o for v, o in producer.acked.items() if stored.get(v) != o}
    assert not lost, f"{len(lost)} acknowledged records lost or moved"
    if reader is not None:
        assert not reader.errors, reader.errors
        by_offset = {r.offset: r.value for r in records}
        phantom = {o: v for o, v in reader.seen.items() if by_offset.get(o) != v}
        assert not phantom, f"the reader saw {len(phantom)} records that are not in the log"
        assert reader.seen, "the reader read nothing"


def replica_dir(cluster: LocalCluster, broker: int, tp: TopicPartition) -> pathlib.Path:
    return pathlib.Path(cluster.spec(broker).data_dir) / f"{tp.topic}-{tp.partition}"


def scrape(cluster: LocalCluster, broker: int) -> dict[str, float]:
    port = cluster.spec(broker).metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def metric(values: dict[str, float], name: str) -> float:
    return sum(v for k, v in values.items() if k == name or k.startswith(name + "{"))


def fill(cluster: LocalCluster, tp: TopicPartition, megabytes: int) -> None:
    from minibroker.client import Producer

    value = b"x" * 10_000
    # 16 kB batches: a fetch returns at least one whole batch, so the batch size is the grain
    # of a throttle.
    with Producer(cluster.bootstrap, acks="all", linger_ms=5, batch_size=16384) as producer:
        futures = [
            producer.send(tp.topic, value, partition=tp.partition) for _ in range(megabytes * 100)
        ]
        producer.flush()
        for f in futures:
            f.result(timeout=60)


def throttle(admin: Admin, brokers: list[int], rate: int, topic: str) -> None:
    ops = [
        AlterConfigOp("leader.replication.throttled.rate", "set", str(rate)),
        AlterConfigOp("follower.replication.throttled.rate", "set", str(rate)),
    ]
    changes = {ConfigResource("broker", str(b)): ops for b in brokers}
    changes[ConfigResource("topic", topic)] = [
        AlterConfigOp("leader.replication.throttled.replicas", "set", "*"),
        AlterConfigOp("follower.replication.throttled.replicas", "set", "*"),
    ]
    admin.incremental_alter_configs(changes)


def unthrottle(admin: Admin, brokers: list[int], topic: str) -> None:
    ops = [
        AlterConfigOp("leader.replication.throttled.rate", "delete", None),
        AlterConfigOp("follower.replication.throttled.rate", "delete", None),
    ]
    changes = {ConfigResource("broker", str(b)): ops for b in brokers}
    changes[ConfigResource("topic", topic)] = [
        AlterConfigOp("leader.replication.throttled.replicas", "delete", None),
        AlterConfigOp("follower.replication.throttled.replicas", "delete", None),
    ]
    admin.incremental_alter_configs(changes)


@pytest.fixture
def six(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    with local_cluster(str(tmp_path / "cluster"), brokers=6, settings=SETTINGS) as c:
        yield c


def test_a_partition_moves_to_three_new_brokers_under_load(six: LocalCluster) -> None:
    with Admin(six.bootstrap) as admin:
        admin.create_topics([NewTopic(TP.topic, 1, 3, {"min.insync.replicas": "2"})])
        wait_until(lambda: settled(admin, [TP.topic]), 30, "the topic settled")
        original = partition(admin, TP).replicas
        target = [b for b in range(1, 7) if b not in original]
        with (
            BackgroundProducer(six.bootstrap, TP.topic) as producer,
            Reader(six.bootstrap, TP) as reader,
            StallMeter(producer) as stall,
        ):
            wait_for_progress(producer, 300)
            results = admin.alter_partition_reassignments({TP: target})
            assert results == {TP: None}
            ongoing = admin.list_partition_reassignments()
            # Done at once is possible only if the new brokers caught up in a few ms.
            if ongoing:
                assert set(ongoing[TP].adding_replicas) == set(target)
                assert set(ongoing[TP].removing_replicas) == set(original)
            wait_until(lambda: no_reassignments(admin), 60, "the reassignment to complete")
            wait_for_progress(producer, 300)
        p = partition_at(admin, target)
        assert p.leader in target
        assert not p.adding_replicas and not p.removing_replicas
        check_log(six, producer, reader)
        # The old brokers delete their copies once the metadata no longer names them.
        for broker in original:
            wait_until(
                lambda b=broker: not replica_dir(six, b, TP).exists(),
                30,
                f"broker {broker} to delete its copy",
            )
        print(
            f"\nmoved {TP} {list(original)} -> {target}: {producer.count()} acks, "
            f"longest producer stall {stall.longest_s * 1000:.0f} ms"
        )


def test_cancel_mid_way_reverts_to_the_original_replicas(six: LocalCluster) -> None:
    with Admin(six.bootstrap) as admin:
        admin.create_topics([NewTopic(TP.topic, 1, 2, {"min.insync.replicas": "1"})])
        wait_until(lambda: settled(admin, [TP.topic]), 30, "the topic settled")
        fill(six, TP, 8)
        original = partition(admin, TP).replicas
        newcomer = next(b for b in range(1, 7) if b not in original)
        throttle(admin, list(range(1, 7)), 200_000, TP.topic)
        with BackgroundProducer(six.bootstrap, TP.topic) as producer:
            wait_for_progress(producer, 100)
            admin.alter_partition_reassignments({TP: [newcomer, *original]})
            wait_until(lambda: replica_dir(six, newcomer, TP).exists(), 30, "the new replica's log")
            assert TP in admin.list_partition_reassignments()
            assert newcomer not in partition(admin, TP).isr  # 8 MB at 200 kB/s: still behind
            assert admin.alter_partition_reassignments({TP: None}) == {TP: None}
            assert no_reassignments(admin)
            wait_for_progress(producer, 100)
        partition_at(admin, original)
        wait_until(
            lambda: not replica_dir(six, newcomer, TP).exists(), 30, "the cancelled copy deleted"
        )
        # Cancelling again is Kafka's NO_REASSIGNMENT_IN_PROGRESS.
        (error,) = admin.alter_partition_reassignments({TP: None}).values()
        assert error is not None and type(error).__name__ == "NoReassignmentInProgressError"
        unthrottle(admin, list(range(1, 7)), TP.topic)
        check_log(six, producer, None)


@pytest.fixture
def six_small_fetches(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    # A throttle cannot be finer than one fetch: with Kafka's 1 MiB replica fetches a
    # 500 kB/s quota admits a whole MiB in its first second (Kafka's quota does the same).
    settings = {**SETTINGS, "replica.fetch.max.bytes": "65536"}
    with local_cluster(str(tmp_path / "cluster"), brokers=6, settings=settings) as c:
        yield c


def test_a_throttled_move_stays_within_its_rate(six_small_fetches: LocalCluster) -> None:
    six = six_small_fetches
    rate = 500_000
    with Admin(six.bootstrap) as admin:
        admin.create_topics([NewTopic(TP.topic, 1, 1)])
        wait_until(lambda: settled(admin, [TP.topic]), 30, "the topic settled")
        fill(six, TP, 6)
        (source,) = partition(admin, TP).replicas
        newcomer = next(b for b in range(1, 7) if b != source)
        throttle(admin, [source, newcomer], rate, TP.topic)
        admin.alter_partition_reassignments({TP: [newcomer]})
        samples: list[tuple[float, float]] = []

        def moving() -> bool:
            leader_rate = metric(scrape(six, source), "kafka_server_leader_replication_byte_rate")
            follower_rate = metric(
                scrape(six, newcomer), "kafka_server_follower_replication_byte_rate"
            )
            samples.append((leader_rate, follower_rate))
            return no_reassignments(admin)

        wait_until(moving, 120, "the throttled move to complete", interval_s=0.5)
        unthrottle(admin, [source, newcomer], TP.topic)
        partition_at(admin, [newcomer])
        busy = [s for s in samples if max(s) > 0]
        assert len(busy) >= 3, f"the broker metrics showed no throttled traffic: {samples}"
        highest = max(max(s) for s in samples)
        assert highest <= rate * 1.2, f"throttled at {rate} B/s, measured {highest:.0f} B/s"
        print(f"\nthrottle {rate} B/s: broker-measured rates peaked at {highest:.0f} B/s")


def test_decommissioning_a_leader_heavy_broker_under_load(tmp_path: pathlib.Path) -> None:
    with (
        local_cluster(str(tmp_path / "c"), brokers=4, settings=SETTINGS, racks=2) as cluster,
        Admin(cluster.bootstrap) as admin,
    ):
        admin.create_topics(
            [
                NewTopic(TP.topic, 1, 2, {"min.insync.replicas": "2"}),
                NewTopic("other", 8, 2),
            ]
        )
        wait_until(lambda: settled(admin, [TP.topic, "other"]), 30, "topics settled")
        victim = partition(admin, TP).leader
        # Make the victim lead everything it can (leader-heavy): put it first in every
        # replica list that names it (a reorder completes at once) and elect preferred leaders.
        (other,) = admin.describe_topics(["other"], include_offsets=False)
        reorder = {
            TopicPartition("other", p.partition): [victim, *(b for b in p.replicas if b != victim)]
            for p in other.partitions
            if victim in p.replicas and p.replicas[0] != victim
        }
        if reorder:
            assert set(admin.alter_partition_reassignments(reorder).values()) == {None}

        def leader_heavy() -> bool:
            # The brokers' metadata (what describe_topics reads) may lag the controller's.
            (other,) = admin.describe_topics(["other"], include_offsets=False)
            if any(p.replicas[0] != victim for p in other.partitions if victim in p.replicas):
                return False
            admin.elect_leaders("preferred", [TopicPartition("other", p) for p in range(8)])
            (other,) = admin.describe_topics(["other"], include_offsets=False)
            return sum(1 for p in other.partitions if p.leader == victim) >= 4

        wait_until(leader_heavy, 30, f"broker {victim} to lead 4 partitions of 'other'")
        with (
            BackgroundProducer(cluster.bootstrap, TP.topic) as producer,
            Reader(cluster.bootstrap, TP) as reader,
        ):
            wait_for_progress(producer, 300)
            moving = admin.decommission_broker(victim)
            assert moving > 0

            def drained() -> bool:
                (b,) = [b for b in admin.describe_cluster().brokers if b.broker_id == victim]
                assert b.decommissioning
                return b.replica_count == 0 and no_reassignments(admin)

            wait_until(drained, 90, f"broker {victim} to hold nothing")
            wait_for_progress(producer, 300)
        for desc in admin.describe_topics([TP.topic, "other"], include_offsets=False):
            for p in desc.partitions:
                assert victim not in p.replicas
        cluster.stop(victim)
        wait_until(lambda: settled(admin, [TP.topic, "other"]), 30, "no under-replicated partition")
        check_log(cluster, producer, reader)
        # A decommissioned broker gets no new replicas.
        admin.create_topics([NewTopic("after", 6, 2)])

        def placed() -> list[int]:
            # The brokers' metadata (what describe_topics reads) may lag the controller's.
            # wait_until retries while it raises UnknownTopicOrPartitionError.
            (after,) = admin.describe_topics(["after"], include_offsets=False)
            return [b for p in after.partitions for b in p.replicas]

        assert victim not in wait_until(placed, 30, "topic 'after' in the brokers' metadata")


def test_controller_and_new_replica_killed_mid_reassignment_it_completes(
    tmp_path: pathlib.Path,
) -> None:
    settings = {
        **SETTINGS,
        "controller.quorum.election.timeout.ms": "300",
        "controller.quorum.fetch.timeout.ms": "600",
        "controller.quorum.election.backoff.max.ms": "300",
    }
    with (
        local_cluster(str(tmp_path / "c"), brokers=4, settings=settings, controllers=3) as cluster,
        Admin(cluster.bootstrap) as admin,
    ):
        admin.create_topics([NewTopic(TP.topic, 1, 2, {"min.insync.replicas": "2"})])
        wait_until(lambda: settled(admin, [TP.topic]), 30, "the topic settled")
        fill(cluster, TP, 4)
        original = partition(admin, TP).replicas
        spare = [b for b in range(1, 5) if b not in original]
        throttle(admin, list(range(1, 5)), 300_000, TP.topic)
        with BackgroundProducer(cluster.bootstrap, TP.topic) as producer:
            wait_for_progress(producer, 200)
            admin.alter_partition_reassignments({TP: spare})
            wait_until(
                lambda: replica_dir(cluster, spare[0], TP).exists(), 30, "a new replica's log"
            )
            victim = wait_until(
                lambda: launcher.active_controller(cluster.state), 30, "an active controller"
            )
            cluster.kill(victim.name)
            cluster.kill(spare[0])
            wait_for_progress(producer, 100)
            cluster.start(victim.name)
            cluster.start(spare[0])
            assert TP in admin.list_partition_reassignments()
            unthrottle(admin, list(range(1, 5)), TP.topic)
            wait_until(lambda: no_reassignments(admin), 90, "the reassignment to complete")
            wait_for_progress(producer, 200)
        partition_at(admin, spare)
        check_log(cluster, producer, None)


def test_failure_decommissioning_restores_the_replication_factor(tmp_path: pathlib.Path) -> None:
    settings = {**SETTINGS, "replica.rebuild.delay.ms": "3000"}
    with (
        local_cluster(str(tmp_path / "c"), brokers=4, settings=settings) as cluster,
        Admin(cluster.bootstrap) as admin,
    ):
        admin.create_topics([NewTopic(TP.topic, 1, 3, {"min.insync.replicas": "2"})])
        wait_until(lambda: settled(admin, [TP.topic]), 30, "the topic settled")
        with BackgroundProducer(cluster.bootstrap, TP.topic) as producer:
            wait_for_progress(producer, 200)
            dead = partition(admin, TP).replicas[-1]
            cluster.kill(dead)

            def rebuilt() -> bool:
                p = partition(admin, TP)
                return (
                    dead not in p.replicas
                    and len(p.replicas) == 3
                    and set(p.isr) == set(p.replicas)
                    and no_reassignments(admin)
                )

            wait_until(rebuilt, 60, "the replica rebuilt on a live broker")
            wait_for_progress(producer, 200)
        admin.unregister_broker(dead)
        assert all(b.broker_id != dead for b in admin.describe_cluster().brokers)
        check_log(cluster, producer, None)
