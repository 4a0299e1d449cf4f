"""Replication end to end: real brokers and a controller on 127.0.0.1, broken on purpose.

Each test checks docs/design.md §8's invariants on what it sees:
  1. acks=all writes are never lost while at most RF - min.insync replicas fail at once, and are
     read back at the offsets they were acknowledged with;
  2. replicas hold identical bytes up to the HW once truncation settles;
  3. consumers see contiguous, ascending, unrepeated offsets;
  5. with the idempotent producer a retried batch is stored once.
"""

from __future__ import annotations

import json
import pathlib
import threading
import time
from collections.abc import Iterator

import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.client import (
    Admin,
    Consumer,
    NotEnoughReplicasError,
    Producer,
    TopicPartition,
)
from minibroker.client.batch import iter_batches

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    settings = {
        "replica.lag.time.max.ms": "1500",
        "broker.session.timeout.ms": "2500",
        "leader.imbalance.check.interval.seconds": "3600",
    }
    with local_cluster(str(tmp_path / "cluster"), brokers=3, settings=settings) as c:
        yield c


def describe(admin: Admin, topic: str, partition: int = 0):  # type: ignore[no-untyped-def]
    (desc,) = admin.describe_topics([topic])
    return next(p for p in desc.partitions if p.partition == partition)


def read_all(bootstrap: str, tp: TopicPartition, timeout_s: float = 30.0) -> list:  # type: ignore[type-arg]
    """Every record of `tp` from the log start up to the HW."""
    with Consumer(bootstrap) as consumer:
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        consumer.seek_to_beginning(tp)
        records = []
        deadline = time.monotonic() + timeout_s
        while (not records or records[-1].offset < end - 1) and end > 0:
            assert time.monotonic() < deadline, f"read {len(records)} records, HW is {end}"
            records.extend(consumer.poll(timeout_ms=500))
        return records


def log_bytes(data_dir: str, tp: TopicPartition, high_watermark: int) -> bytes:
    """The bytes of every batch below `high_watermark` in a replica's segment files."""
    out = bytearray()
    part = pathlib.Path(data_dir) / f"{tp.topic}-{tp.partition}"
    for segment in sorted(part.glob("*.log")):
        data = segment.read_bytes()
        for pos, header in iter_batches(data):
            if header.last_offset < high_watermark:
                out += data[pos : pos + header.size]
    return bytes(out)


class BackgroundProducer:
    """Sends numbered values with acks=all until stopped; keeps what was acknowledged where."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.acked: dict[bytes, int] = {}
        self.failed = 0
        self._stop = threading.Event()
        self._producer = Producer(
            bootstrap, acks="all", linger_ms=2, request_timeout_ms=5000, delivery_timeout_ms=60_000
        )
        self._topic = topic
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._lock = threading.Lock()

    def _run(self) -> None:
        i = 0
        in_flight = []
        while not self._stop.is_set():
            value = f"v{i:07d}".encode()
            in_flight.append((value, self._producer.send(self._topic, value, partition=0)))
            i += 1
            if len(in_flight) >= 50:
                self._settle(in_flight)
                in_flight = []
        self._settle(in_flight)

    def _settle(self, in_flight: list) -> None:  # type: ignore[type-arg]
        for value, future in in_flight:
            try:
                metadata = future.result(timeout=90)
            except Exception:
                with self._lock:
                    self.failed += 1
                continue
            with self._lock:
                self.acked[value] = metadata.offset

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def __enter__(self) -> BackgroundProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        self._producer.close()


def wait_for_progress(producer: BackgroundProducer, more: int, timeout_s: float = 30.0) -> None:
    target = producer.count() + more
    wait_until(lambda: producer.count() >= target, timeout_s, f"{more} more acks")


def test_acks_all_survives_leader_kill_follower_pause_and_a_second_kill(
    cluster: LocalCluster,
) -> None:
    """docs/design.md §8 invariants 1-3 through SIGKILL of the leader, its restart, a SIGSTOP of a
    follower past replica.lag.time.max.ms, SIGCONT, and a SIGKILL of a second broker."""
    tp = TopicPartition("chaos", 0)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("chaos", 1, 3, {"min.insync.replicas": "2"})
        wait_until(lambda: len(describe(admin, "chaos").isr) == 3, 20, "a full ISR")
        with BackgroundProducer(cluster.bootstrap, "chaos") as producer:
            wait_for_progress(producer, 200)

            leader = describe(admin, "chaos").leader
            cluster.kill(leader)
            wait_until(
                lambda: describe(admin, "chaos").leader not in (leader, -1), 20, "a new leader"
            )
            wait_for_progress(producer, 200)
            cluster.start(leader)
            wait_until(
                lambda: leader in describe(admin, "chaos").isr,
                30,
                f"broker {leader} back in the ISR",
            )

            current = describe(admin, "chaos")
            follower = next(r for r in current.replicas if r != current.leader)
            cluster.pause(follower)
            try:
                wait_until(
                    lambda: follower not in describe(admin, "chaos").isr,
                    30,
                    f"broker {follower} dropped from the ISR",
                )
                wait_for_progress(producer, 200)
            finally:
                cluster.resume(follower)
            wait_until(
                lambda: follower in describe(admin, "chaos").isr,
                30,
                f"broker {follower} back in the ISR",
            )
            wait_for_progress(producer, 200)

            current = describe(admin, "chaos")
            second = next(r for r in current.replicas if r != current.leader)
            cluster.kill(second)
            wait_for_progress(producer, 200)

        assert producer.count() > 1000
        cluster.start(second)
        wait_until(lambda: len(describe(admin, "chaos").isr) == 3, 30, "a full ISR again")
        final = describe(admin, "chaos")
        wait_until(
            lambda: (
                set(describe(admin, "chaos").log_end_offsets.values())
                == {describe(admin, "chaos").high_watermark}
            ),
            30,
            "every replica caught up to the HW",
        )
        final = describe(admin, "chaos")

    records = read_all(cluster.bootstrap, tp)
    offsets = [r.offset for r in records]
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), "offsets not contiguous"
    by_value: dict[bytes, int] = {}
    for record in records:
        assert record.value not in by_value, f"{record.value!r} stored twice"
        by_value[record.value] = record.offset
    lost = {v: o for v, o in producer.acked.items() if by_value.get(v) != o}
    assert not lost, f"{len(lost)} acknowledged records missing or moved, e.g. {list(lost)[:3]}"

    images = {
        broker: log_bytes(cluster.spec(broker).data_dir, tp, final.high_watermark)
        for broker in final.replicas
    }
    assert len(set(images.values())) == 1, "replica logs differ below the HW"


def test_min_insync_violation_rejects_acks_all_and_stores_nothing(cluster: LocalCluster) -> None:
    """With the ISR below min.insync.replicas an acks=all produce gets NOT_ENOUGH_REPLICAS
    before anything is appended (docs/protocol.md §2 step 3): the leader's LEO does not move."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("strict", 1, 3, {"min.insync.replicas": "2"})
        wait_until(lambda: len(describe(admin, "strict").isr) == 3, 20, "a full ISR")
        with Producer(cluster.bootstrap, acks="all") as producer:
            producer.send("strict", b"before", partition=0).result(timeout=20)
        current = describe(admin, "strict")
        others = [r for r in current.replicas if r != current.leader]
        for broker in others:
            cluster.kill(broker)
        wait_until(
            lambda: set(describe(admin, "strict").isr) == {current.leader},
            20,
            "the ISR shrunk to the leader",
        )
        leo_before = describe(admin, "strict").log_end_offsets[current.leader]
        with (
            Producer(
                cluster.bootstrap,
                acks="all",
                retries=0,
                request_timeout_ms=3000,
                delivery_timeout_ms=5000,
                linger_ms=0,
            ) as producer,
            pytest.raises(NotEnoughReplicasError),
        ):
            producer.send("strict", b"rejected", partition=0).result(timeout=20)
        after = describe(admin, "strict")
        assert after.log_end_offsets[current.leader] == leo_before == 1
        assert after.high_watermark == 1


def test_diverged_follower_truncates_and_rejoins(cluster: LocalCluster) -> None:
    """KIP-101/279 divergence with real processes: a leader takes acks=1 writes its followers never
    fetch, dies, a follower leads a new epoch and writes over those offsets; the old leader comes
    back, gets a diverging epoch, truncates, catches up and rejoins the ISR. The acks=1 writes the
    new leader never got are lost (the documented acks=1 window); no acks=all write is."""
    tp = TopicPartition("diverge", 0)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("diverge", 1, 3, {"min.insync.replicas": "1"})
        wait_until(lambda: len(describe(admin, "diverge").isr) == 3, 20, "a full ISR")
        with Producer(cluster.bootstrap, acks="all") as producer:
            for i in range(10):
                producer.send("diverge", f"committed-{i}".encode(), partition=0)
            producer.flush()
        old = describe(admin, "diverge")
        old_leader = old.leader
        followers = [r for r in old.replicas if r != old_leader]
        # The producer learns the metadata first: while the followers are paused it must only
        # talk to the leader, and quickly, before their sessions expire and they are fenced.
        with Producer(cluster.bootstrap, acks=1, linger_ms=0) as producer:
            producer.partitions_for("diverge")
            for broker in followers:
                cluster.pause(broker)
            try:
                lost_window = [
                    producer.send("diverge", f"acks1-{i}".encode(), partition=0).result(10)
                    for i in range(5)
                ]
                cluster.kill(old_leader)
            finally:
                for broker in followers:
                    cluster.resume(broker)
        assert [m.offset for m in lost_window] == list(range(10, 15))
        wait_until(lambda: describe(admin, "diverge").leader in followers, 20, "a new leader")
        with Producer(cluster.bootstrap, acks="all") as producer:
            new_epoch = [
                producer.send("diverge", f"new-{i}".encode(), partition=0).result(20)
                for i in range(8)
            ]
        # The new epoch starts at the new leader's LEO: the old HW (10), or a little above when
        # a long-poll answer the old leader sent just before the pause reached it after SIGCONT.
        start = new_epoch[0].offset
        assert 10 <= start < 15, f"new epoch starts at {start}"

        cluster.start(old_leader)
        wait_until(
            lambda: old_leader in describe(admin, "diverge").isr,
            30,
            "the old leader back in the ISR",
        )
        truncations = [
            json.loads(line)
            for line in pathlib.Path(cluster.spec(old_leader).log_file).read_text().splitlines()
            if '"truncated"' in line and "diverging epoch" in line
        ]
        assert truncations, "the returning broker never truncated on a diverging epoch"
        assert truncations[-1]["to_offset"] == start

    values = [r.value for r in read_all(cluster.bootstrap, tp)]
    assert values == (
        [f"committed-{i}".encode() for i in range(10)]
        + [f"acks1-{i}".encode() for i in range(start - 10)]
        + [f"new-{i}".encode() for i in range(8)]
    )


def test_rolling_restart_with_controlled_shutdown_fails_no_write(cluster: LocalCluster) -> None:
    """docs/design.md §6: SIGTERM moves a broker's leaderships away before it stops, so a rolling
    restart of every broker under acks=all load loses nothing and fails no write."""
    tp = TopicPartition("rolling", 0)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("rolling", 1, 3, {"min.insync.replicas": "2"})
        wait_until(lambda: len(describe(admin, "rolling").isr) == 3, 20, "a full ISR")
        with BackgroundProducer(cluster.bootstrap, "rolling") as producer:
            wait_for_progress(producer, 100)
            for broker in (1, 2, 3):
                cluster.stop(broker)
                assert broker not in describe(admin, "rolling").isr
                wait_for_progress(producer, 100)
                cluster.start(broker)
                wait_until(
                    lambda b=broker: b in describe(admin, "rolling").isr,
                    30,
                    f"broker {broker} back in the ISR",
                )
            wait_for_progress(producer, 100)
        assert producer.failed == 0, f"{producer.failed} writes failed during the rolling restart"
        for broker in (1, 2, 3):
            log_text = pathlib.Path(cluster.spec(broker).log_file).read_text()
            assert "controlled_shutdown_granted" in log_text
    records = read_all(cluster.bootstrap, tp)
    stored = {r.value: r.offset for r in records}
    assert len(stored) == len(records), "a value was stored twice"
    assert all(stored.get(v) == o for v, o in producer.acked.items())


def test_consumer_fetches_from_a_follower_in_its_rack(tmp_path: pathlib.Path) -> None:
    """KIP-392: a consumer with client_rack reads from the in-sync replica in its rack, up to
    that replica's HW; the leader answers its first fetch with a preferred read replica."""
    import urllib.request

    def bytes_out(port: int) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        for line in text.splitlines():
            if line.startswith("kafka_server_BrokerTopicMetrics_BytesOutPerSec_total "):
                return float(line.split()[1])
        raise AssertionError("BytesOutPerSec not exported")

    with local_cluster(str(tmp_path / "racks"), brokers=3, racks=3) as cluster:
        tp = TopicPartition("racked", 0)
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic("racked", 1, 3, {"min.insync.replicas": "2"})
            wait_until(lambda: len(describe(admin, "racked").isr) == 3, 20, "a full ISR")
            leader = describe(admin, "racked").leader
        follower = next(b for b in (1, 2, 3) if b != leader)
        rack = cluster.spec(follower).rack
        with Producer(cluster.bootstrap, acks="all") as producer:
            for i in range(50):
                producer.send("racked", f"r{i}".encode(), partition=0)
            producer.flush()
        before = {b: bytes_out(cluster.spec(b).metrics_port) for b in (1, 2, 3)}
        with Consumer(cluster.bootstrap, client_rack=rack) as consumer:
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            values: list[bytes] = []
            wait_until(
                lambda: (
                    values.extend(r.value for r in consumer.poll(timeout_ms=200))
                    or len(values) >= 50
                ),
                30,
                "50 records",
            )
        assert values == [f"r{i}".encode() for i in range(50)]
        after = {b: bytes_out(cluster.spec(b).metrics_port) for b in (1, 2, 3)}
        assert after[follower] > before[follower], "the rack-local follower served nothing"
        assert after[leader] == before[leader], "the leader served records to the consumer"


def test_brokers_keep_serving_while_the_controller_is_down(cluster: LocalCluster) -> None:
    """docs/design.md §3.2: brokers keep their last metadata while the controller is away, so
    produce and fetch go on; a restarted controller (durable log) fences nobody and elections
    resume."""
    tp = TopicPartition("steady", 0)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("steady", 1, 3, {"min.insync.replicas": "2"})
        wait_until(lambda: len(describe(admin, "steady").isr) == 3, 20, "a full ISR")
        before = describe(admin, "steady")
    cluster.kill("controller")
    with Producer(cluster.bootstrap, acks="all") as producer:
        acked = [
            producer.send("steady", f"c{i}".encode(), partition=0).result(30) for i in range(50)
        ]
    assert [m.offset for m in acked] == list(range(50))
    assert [r.value for r in read_all(cluster.bootstrap, tp)] == [
        f"c{i}".encode() for i in range(50)
    ]

    cluster.start("controller")
    with Admin(cluster.bootstrap) as admin:
        wait_until(
            lambda: all(not b.fenced for b in admin.describe_cluster().brokers),
            20,
            "every broker unfenced after the controller restart",
        )
        after = describe(admin, "steady")
        assert (after.leader, after.leader_epoch) == (before.leader, before.leader_epoch)
        # Elections work again: kill the leader, a new one is chosen.
        cluster.kill(after.leader)
        wait_until(
            lambda: describe(admin, "steady").leader not in (after.leader, -1),
            20,
            "a new leader after the controller came back",
        )


def test_automatic_rebalance_returns_leadership_to_the_preferred_replica(
    tmp_path: pathlib.Path,
) -> None:
    """docs/protocol.md §19: after a preferred leader restarts and rejoins the ISR, the controller's
    periodic check moves leadership back to it (leader.imbalance.check.interval.seconds)."""
    settings = {"leader.imbalance.check.interval.seconds": "2", "replica.lag.time.max.ms": "1500"}
    with (
        local_cluster(str(tmp_path / "rebalance"), brokers=3, settings=settings) as cluster,
        Admin(cluster.bootstrap) as admin,
    ):
        admin.create_topic("balanced", 3, 3)
        wait_until(
            lambda: all(
                p.leader == p.replicas[0] and len(p.isr) == 3
                for p in admin.describe_topics(["balanced"])[0].partitions
            ),
            20,
            "preferred leaders",
        )
        (partition,) = [
            p for p in admin.describe_topics(["balanced"])[0].partitions if p.partition == 0
        ]
        preferred = partition.replicas[0]
        cluster.kill(preferred)
        wait_until(lambda: describe(admin, "balanced").leader != preferred, 20, "failover")
        cluster.start(preferred)
        wait_until(
            lambda: describe(admin, "balanced").leader == preferred,
            30,
            f"leadership back on broker {preferred}",
        )
        assert all(
            p.leader == p.replicas[0] for p in admin.describe_topics(["balanced"])[0].partitions
        )


def test_topic_configs_still_apply_after_a_broker_restart(cluster: LocalCluster) -> None:
    """A restarted broker opens its logs before metadata arrives; the topic's own
    min.insync.replicas must still govern acks=all once it does (not the broker default 1)."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("strict3", 1, 3, {"min.insync.replicas": "3"})
        wait_until(lambda: len(describe(admin, "strict3").isr) == 3, 20, "a full ISR")
        for broker in (1, 2, 3):
            cluster.stop(broker)
            cluster.start(broker)
            wait_until(
                lambda b=broker: b in describe(admin, "strict3").isr,
                30,
                f"broker {broker} back in the ISR",
            )
        current = describe(admin, "strict3")
        victim = next(r for r in current.replicas if r != current.leader)
        cluster.kill(victim)
        wait_until(lambda: victim not in describe(admin, "strict3").isr, 20, "ISR of 2")
    with (
        Producer(
            cluster.bootstrap,
            acks="all",
            retries=0,
            request_timeout_ms=3000,
            delivery_timeout_ms=5000,
            linger_ms=0,
        ) as producer,
        pytest.raises(NotEnoughReplicasError),
    ):
        producer.send("strict3", b"needs three", partition=0).result(timeout=20)
