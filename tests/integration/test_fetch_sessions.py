"""Incremental fetch sessions (KIP-227) between real brokers, and with real consumers.

- An idle cluster of 1,000 partitions: once every follower holds a session, its long polls and
  their answers carry no partition at all, and the leaders read none (counted from the brokers'
  own metrics over a number of fetches, never timed); an idle consumer's polls neither.
- Sessions through leader moves and a broker's SIGKILL and restart: every acknowledged record is
  read back at its offset, none twice, and the replicas hold the same bytes below the HW.
- The session rules on the wire of a real broker: a full request opens a session, an
  incremental one names nothing and still answers new data, a replayed epoch gets
  INVALID_FETCH_SESSION_EPOCH, an unknown session FETCH_SESSION_ID_NOT_FOUND.
"""

from __future__ import annotations

import pathlib
import threading
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until
from test_replication import describe, log_bytes

from minibroker.client import Admin, Consumer, Producer, TopicPartition
from minibroker.client.errors import ErrorCode
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

SETTINGS = {
    "replica.lag.time.max.ms": "3000",
    "broker.session.timeout.ms": "3000",
    "leader.imbalance.check.interval.seconds": "3600",
    "max.broker.partitions": "4000",
}


def scrape(cluster: LocalCluster, broker: int) -> dict[str, float]:
    """A broker's /metrics as {name{labels}: value}."""
    port = cluster.spec(broker).metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


FETCHES = "kafka_server_BrokerTopicMetrics_TotalFetchRequestsPerSec_total"
SESSIONS = "kafka_server_FetchSessionCache_NumIncrementalFetchSessions"


def partition_entries(metrics: dict[str, float], kind: str) -> dict[str, float]:
    """The partition-level fetch counters of one kind (follower or consumer)."""
    return {
        name: metrics.get(f'minibroker_fetch_{name}_total{{kind="{kind}"}}', 0.0)
        for name in ("request_partitions", "response_partitions", "partitions_evaluated")
    }


def idle_window(
    cluster: LocalCluster, brokers: list[int], kind: str, fetches: int, poll: object = None
) -> dict[int, dict[str, float]]:
    """The growth of each broker's partition-level counters while it serves `fetches` more
    fetch requests (`poll`, when given, is called meanwhile: a consumer's poll)."""
    before = {b: scrape(cluster, b) for b in brokers}

    def served() -> bool:
        if callable(poll):
            poll()
        return all(scrape(cluster, b)[FETCHES] >= before[b][FETCHES] + fetches for b in brokers)

    wait_until(served, 60, f"{fetches} more fetches on every broker", interval_s=0.2)
    after = {b: scrape(cluster, b) for b in brokers}
    return {
        b: {
            name: partition_entries(after[b], kind)[name] - value
            for name, value in partition_entries(before[b], kind).items()
        }
        for b in brokers
    }


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    with local_cluster(str(tmp_path / "cluster"), brokers=3, settings=SETTINGS) as c:
        yield c


def test_an_idle_cluster_of_1000_partitions_fetches_no_partition_at_all(
    cluster: LocalCluster,
) -> None:
    brokers = [1, 2, 3]
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("idle", 1000, 3)

        def settled() -> bool:
            (topic,) = admin.describe_topics(["idle"])
            return all(len(p.isr) == 3 and p.leader >= 0 for p in topic.partitions)

        wait_until(settled, 120, "1000 partitions with a leader and a full ISR", interval_s=0.5)
    # Every broker leads some partitions, so it has a session for each of its two followers.
    wait_until(
        lambda: all(scrape(cluster, b)[SESSIONS] >= 2 for b in brokers),
        60,
        "two follower sessions on every broker",
    )

    # Two clean windows in a row of at least 6 fetches per broker (3 per follower session):
    # a follower that kept sending (or a leader that kept reading) any partition fails this.
    clean = 0
    last: dict[int, dict[str, float]] = {}

    def two_clean_windows() -> bool:
        nonlocal clean, last
        last = idle_window(cluster, brokers, "follower", 6)
        clean = clean + 1 if all(v == 0 for d in last.values() for v in d.values()) else 0
        return clean >= 2

    wait_until(two_clean_windows, 120, f"two idle windows (last: {last})", interval_s=0)
    for b in brokers:
        assert scrape(cluster, b)[SESSIONS] >= 2

    # A consumer assigned every partition, with nothing to read: after its first full fetch
    # per broker, its polls name no partition and are answered with none.
    tps = [TopicPartition("idle", p) for p in range(1000)]
    with Consumer(cluster.bootstrap, fetch_max_wait_ms=200) as consumer:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        wait_until(
            lambda: all(scrape(cluster, b)[SESSIONS] >= 3 for b in brokers),
            60,
            "a consumer session on every broker",
            interval_s=0.2,
        )
        clean = 0

        def two_clean_consumer_windows() -> bool:
            nonlocal clean, last
            last = idle_window(
                cluster, brokers, "consumer", 6, poll=lambda: consumer.poll(timeout_ms=0)
            )
            clean = clean + 1 if all(v == 0 for d in last.values() for v in d.values()) else 0
            return clean >= 2

        wait_until(two_clean_consumer_windows, 120, f"two idle windows (last: {last})", 0)

        # Not idle any more: one record reaches the consumer through its session.
        with Producer(cluster.bootstrap, acks="all") as producer:
            producer.send("idle", b"wake", partition=417).result(timeout=30)
        got: list[object] = []
        wait_until(
            lambda: got.extend(consumer.poll(timeout_ms=200)) or got,
            30,
            "the record written to an idle partition",
        )
        (record,) = got
        assert (record.partition, record.offset, record.value) == (417, 0, b"wake")  # type: ignore[attr-defined]
        with_consumer = {b: scrape(cluster, b)[SESSIONS] for b in brokers}

    # Closing the consumer closes its session on every broker (a request (id, -1)), rather
    # than leaving it to take a cache slot until it goes stale.
    wait_until(
        lambda: all(scrape(cluster, b)[SESSIONS] == with_consumer[b] - 1 for b in brokers),
        30,
        f"the consumer's sessions closed (with it: {with_consumer})",
        interval_s=0.2,
    )


class KeyedProducer:
    """acks=all writes over every partition of a topic until stopped; what was acked where."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.acked: dict[bytes, tuple[int, int]] = {}
        self._producer = Producer(
            bootstrap, acks="all", linger_ms=2, request_timeout_ms=5000, delivery_timeout_ms=60_000
        )
        self._topic, self._partitions = topic, partitions
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            batch = []
            for _ in range(60):
                value = f"v{i:07d}".encode()
                batch.append(
                    (value, self._producer.send(self._topic, value, partition=i % self._partitions))
                )
                i += 1
            for value, future in batch:
                try:
                    meta = future.result(timeout=90)
                except Exception:
                    continue
                with self._lock:
                    self.acked[value] = (meta.partition, meta.offset)

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def progress(self, more: int) -> None:
        target = self.count() + more
        wait_until(lambda: self.count() >= target, 60, f"{more} more acks")

    def __enter__(self) -> KeyedProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        self._producer.close()


def test_sessions_carry_replication_through_leader_moves_and_a_broker_restart(
    cluster: LocalCluster,
) -> None:
    topic, count = "moving", 12
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, count, 3, {"min.insync.replicas": "2"})
        wait_until(
            lambda: all(len(describe(admin, topic, p).isr) == 3 for p in range(count)),
            30,
            "a full ISR everywhere",
        )
        with KeyedProducer(cluster.bootstrap, topic, count) as producer:
            producer.progress(300)
            leaders = [describe(admin, topic, p).leader for p in range(count)]
            victim = max(set(leaders), key=leaders.count)
            cluster.kill(victim)
            wait_until(
                lambda: all(
                    describe(admin, topic, p).leader not in (victim, -1) for p in range(count)
                ),
                30,
                f"every leadership off broker {victim}",
            )
            producer.progress(300)
            cluster.start(victim)
            wait_until(
                lambda: all(victim in describe(admin, topic, p).isr for p in range(count)),
                60,
                f"broker {victim} back in every ISR",
            )
            producer.progress(300)
            # Leadership moves back to the preferred replicas: partitions move between the
            # followers' sessions (forgotten in one, added to another).
            admin.elect_leaders("preferred")
            wait_until(
                lambda: (
                    [describe(admin, topic, p).leader for p in range(count)]
                    == [describe(admin, topic, p).replicas[0] for p in range(count)]
                ),
                30,
                "preferred leaders",
            )
            producer.progress(300)
        assert producer.count() >= 1200

        def caught_up() -> bool:
            return all(
                set(d.log_end_offsets.values()) == {d.high_watermark} and len(d.isr) == 3
                for d in (describe(admin, topic, p) for p in range(count))
            )

        wait_until(caught_up, 60, "every replica at the HW")
        final = {p: describe(admin, topic, p) for p in range(count)}

    # The restarted broker's followers opened new sessions with it, and it with its leaders:
    # every broker leads a third of the partitions again, so each holds a session per follower.
    # (Waited for: a session is gone for the length of the full request that replaces it.)
    wait_until(
        lambda: all(scrape(cluster, b)[SESSIONS] >= 2 for b in (1, 2, 3)),
        30,
        "two follower sessions on every broker",
    )

    stored: dict[bytes, tuple[int, int]] = {}
    with Consumer(cluster.bootstrap) as consumer:
        tps = [TopicPartition(topic, p) for p in range(count)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        offsets: dict[int, list[int]] = {p: [] for p in range(count)}

        def read_everything() -> bool:
            for record in consumer.poll(timeout_ms=300):
                assert record.value not in stored, f"{record.value!r} stored twice"
                stored[record.value] = (record.partition, record.offset)
                offsets[record.partition].append(record.offset)
            return all(len(offsets[tp.partition]) >= ends[tp] for tp in tps)

        wait_until(read_everything, 60, "every record up to the HW", interval_s=0)
    for p, seen in offsets.items():
        assert seen == list(range(len(seen))), f"partition {p}: offsets not contiguous"
    lost = {v: where for v, where in producer.acked.items() if stored.get(v) != where}
    assert not lost, f"{len(lost)} acknowledged records missing or moved, e.g. {list(lost)[:3]}"
    for p, d in final.items():
        tp = TopicPartition(topic, p)
        images = {log_bytes(cluster.spec(b).data_dir, tp, d.high_watermark) for b in d.replicas}
        assert len(images) == 1, f"replica logs of {tp} differ below the HW"


def _fetch(
    stub: pb_grpc.BrokerServiceStub,
    offsets: dict[int, int],
    session_id: int,
    epoch: int,
    forgotten: tuple[int, ...] = (),
) -> pb.FetchResponse:
    request = pb.FetchRequest(
        replica_id=-1,
        replica_epoch=-1,
        max_wait_ms=0,
        min_bytes=1,
        max_bytes=1 << 20,
        session_id=session_id,
        session_epoch=epoch,
    )
    if offsets:
        topic = request.topics.add(topic="wire")
        for partition, offset in offsets.items():
            topic.partitions.add(
                partition=partition,
                current_leader_epoch=-1,
                fetch_offset=offset,
                last_fetched_epoch=-1,
                log_start_offset=-1,
                partition_max_bytes=1 << 20,
            )
    if forgotten:
        request.forgotten_topics_data.add(topic="wire", partitions=list(forgotten))
    response: pb.FetchResponse = stub.Fetch(request, timeout=10)
    return response


def _named(response: pb.FetchResponse) -> set[int]:
    return {p.partition for t in response.topics for p in t.partitions}


def test_the_session_rules_on_a_real_broker(cluster: LocalCluster) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("wire", 1, 1, {})
        leader = wait_until(lambda: describe(admin, "wire").leader, 20, "a leader")
    with grpc.insecure_channel(cluster.spec(leader).address) as channel:
        stub = pb_grpc.BrokerServiceStub(channel)

        def settled() -> bool:
            # The new partition as a leader serves it for good (HW and log start at 0, no
            # error), so that nothing about it changes between the session's first fetches
            # (on a loaded machine the first full answer came before, and the next one named it).
            answer = _fetch(stub, {0: 0}, 0, -1)
            parts = [p for t in answer.topics for p in t.partitions]
            return answer.error_code == ErrorCode.NONE and [
                (p.error_code, p.high_watermark, p.log_start_offset) for p in parts
            ] == [(ErrorCode.NONE, 0, 0)]

        wait_until(settled, 20, "the new partition served at HW 0")
        opened = _fetch(stub, {0: 0}, 0, 0)
        assert opened.error_code == ErrorCode.NONE and opened.session_id > 0
        assert _named(opened) == {0}  # a full answer names every partition
        session = opened.session_id
        idle = _fetch(stub, {}, session, 1)
        assert idle.error_code == ErrorCode.NONE and idle.session_id == session
        assert _named(idle) == set()  # nothing changed: nothing named, both ways
        with Producer(cluster.bootstrap, acks="all") as producer:
            producer.send("wire", b"x", partition=0).result(timeout=30)
        news = _fetch(stub, {}, session, 2)
        assert _named(news) == {0}  # an implied partition with new data is answered
        (p,) = [p for t in news.topics for p in t.partitions]
        assert p.high_watermark == 1 and p.records
        replayed = _fetch(stub, {}, session, 2)
        assert replayed.error_code == ErrorCode.INVALID_FETCH_SESSION_EPOCH
        assert not replayed.topics
        unknown = _fetch(stub, {}, session + 1, 1)
        assert unknown.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        assert (unknown.session_id, len(unknown.topics)) == (0, 0)
        # A new full request closes the old session and opens another one.
        reopened = _fetch(stub, {0: 1}, session, 0)
        assert reopened.session_id not in (0, session) and _named(reopened) == {0}
        gone = _fetch(stub, {}, session, 3)
        assert gone.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        # Forgetting the last partition leaves the session empty: it is closed (session id 0).
        emptied = _fetch(stub, {}, reopened.session_id, 1, forgotten=(0,))
        assert emptied.error_code == ErrorCode.NONE and emptied.session_id == 0
        # A sessionless request (epoch -1, as every client before KIP-227) still works.
        legacy = _fetch(stub, {0: 0}, 0, -1)
        assert legacy.session_id == 0 and _named(legacy) == {0}
        (p,) = [p for t in legacy.topics for p in t.partitions]
        assert p.records
