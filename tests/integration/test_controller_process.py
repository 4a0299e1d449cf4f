"""The controller as a real process (docs/design.md §3): registration, fencing by stream break and
by session timeout, controlled shutdown, elections, WatchMetadata with snapshots, bad requests, and
kill -9 at any moment losing nothing that was acknowledged. Test code acts as the brokers.
"""

from __future__ import annotations

import pathlib
import signal
import statistics
import threading
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from minibroker.client.errors import ErrorCode
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import LeaderChangeRecord
from minibroker.metadata.wire import apply_batch
from minibroker.proto import minibroker_pb2 as pb
from tests.integration.controller_harness import (
    ControllerProcess,
    FakeBroker,
    FakeBrokerProcess,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def start_controller(tmp_path: pathlib.Path):
    """Start a controller with extra settings; every one started is killed at the end."""
    started: list[ControllerProcess] = []

    def start(settings: dict[str, str] | None = None) -> ControllerProcess:
        merged = {"auto.leader.rebalance.enable": "false", **(settings or {})}
        proc = ControllerProcess(tmp_path / f"controller-data-{len(started)}", merged)
        started.append(proc)
        proc.start()
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.kill()


@pytest.fixture
def controller(start_controller) -> ControllerProcess:
    return start_controller()


@pytest.fixture
def brokers():
    started: list[FakeBroker | FakeBrokerProcess] = []
    try:
        yield started
    finally:
        for b in started:
            if isinstance(b, FakeBrokerProcess):
                b.kill()
            else:
                b.stop()


def create(controller: ControllerProcess, name: str, partitions: int, rf: int, **configs: str):
    reply = controller.stub.CreateTopics(
        pb.CreateTopicsRequest(
            topics=[
                pb.CreatableTopic(
                    name=name,
                    num_partitions=partitions,
                    replication_factor=rf,
                    configs={k.replace("_", "."): v for k, v in configs.items()},
                )
            ]
        ),
        timeout=10,
    )
    return reply.topics[0]


def start_brokers(controller, brokers, ids, *, processes=False, tmp_path=None):
    for b in ids:
        if processes:
            brokers.append(FakeBrokerProcess(controller.address, b, tmp_path))
        else:
            brokers.append(FakeBroker(controller.address, b).start())
    for b in ids:
        wait_until(lambda b=b: controller.is_unfenced(b), 15, f"broker {b} unfenced")


def partition_state(controller: ControllerProcess, topic: str, index: int):
    image = controller.snapshot_image()
    t = image.topic(topic)
    assert t is not None
    return t.partitions[index]


def scrape_metrics(controller: ControllerProcess) -> dict[str, float]:
    port = controller.events("controller_started")[-1]["metrics_port"]
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            # Kafka's names without their JMX domain prefix, e.g. ActiveBrokerCount.
            for prefix in (
                "kafka_controller_KafkaController_",
                "kafka_controller_ControllerStats_",
            ):
                name = name.removeprefix(prefix)
            out[name] = float(value)
    return out


def test_registration_heartbeats_health_and_metrics(controller, brokers):
    health = health_pb2_grpc.HealthStub(controller.channel)
    status = health.Check(health_pb2.HealthCheckRequest(service="minibroker.ControllerService"))
    assert status.status == health_pb2.HealthCheckResponse.SERVING

    b = FakeBroker(controller.address, 1, rack="r1")
    brokers.append(b)
    b.start()
    desc = controller.describe()
    assert desc.cluster_id and b.cluster_id == desc.cluster_id
    assert desc.controller_id == 1000
    (entry,) = desc.brokers
    assert (entry.broker_id, entry.rack, entry.broker_epoch) == (1, "r1", b.broker_epoch)
    wait_until(lambda: controller.is_unfenced(1), 10, "broker 1 unfenced")
    assert not b.is_fenced or wait_until(lambda: not b.is_fenced, 5, "reply says unfenced")
    assert controller.describe().brokers[0].last_heartbeat_ms_ago >= 0
    assert [e["broker_id"] for e in controller.events("broker_registered")] == [1]
    assert [e["broker_id"] for e in controller.events("broker_unfenced")] == [1]

    metrics = scrape_metrics(controller)
    assert metrics["ActiveControllerCount"] == 1
    assert metrics["ActiveBrokerCount"] == 1 and metrics["FencedBrokerCount"] == 0


def test_registration_errors(controller, brokers):
    first = FakeBroker(controller.address, 1)
    brokers.append(first)
    first.start()
    wait_until(lambda: controller.is_unfenced(1), 10, "broker 1 unfenced")
    # Another live process with the same node id is refused while the first session lives.
    dup = FakeBroker(controller.address, 1)
    brokers.append(dup)
    reply = dup.register()
    assert reply.error_code == ErrorCode.DUPLICATE_BROKER_REGISTRATION
    # A data dir of another cluster is refused with both ids in the message.
    stranger = FakeBroker(controller.address, 2, cluster_id="someone-elses-cluster")
    brokers.append(stranger)
    reply = stranger.register()
    assert reply.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID
    assert "someone-elses-cluster" in reply.error_message
    assert controller.describe().cluster_id in reply.error_message
    # Once the first process's stream breaks, the new incarnation is accepted.
    first.close_stream()
    wait_until(lambda: controller.is_fenced(1), 10, "broker 1 fenced")
    assert dup.register().error_code == ErrorCode.NONE


def test_stream_break_fences_fast_and_moves_leadership(controller, brokers, tmp_path):
    """SIGKILL of a broker process -> fenced by the stream break, leaderships moved. Prints the
    median kill-to-fenced time over several kills (the goal is under 1 s)."""
    start_brokers(controller, brokers, [1, 2, 3], processes=True, tmp_path=tmp_path)
    assert create(controller, "t", 3, 3).error_code == ErrorCode.NONE
    latencies = []
    for round_ in range(5):
        victim_id = 1 + round_ % 3
        victim = next(b for b in reversed(brokers) if b.broker_id == victim_id)
        led = [i for i in range(3) if partition_state(controller, "t", i).leader == victim_id]
        t0 = time.monotonic()
        victim.proc.send_signal(signal.SIGKILL)
        wait_until(lambda v=victim_id: controller.is_fenced(v), 10, "fenced", interval_s=0.005)
        latencies.append(time.monotonic() - t0)
        victim.proc.wait(10)
        for i in led:
            p = partition_state(controller, "t", i)
            assert p.leader != victim_id
            if p.leader == -1:
                # Restarted brokers are not back in the ISR (nobody expands it here): the
                # victim was the last member, so it stays as the one that may lead again.
                assert round_ > 0 and p.isr == (victim_id,)
            else:
                assert victim_id not in p.isr
        # Bring it back as a new process (a new incarnation) for the next round.
        replacement = FakeBrokerProcess(controller.address, victim_id, tmp_path)
        brokers.append(replacement)
        wait_until(lambda v=victim_id: controller.is_unfenced(v), 15, "back and unfenced")
    fences = controller.events("broker_fenced")
    assert len(fences) == 5
    assert all(f["reason"] == "heartbeat stream closed" for f in fences)
    print(
        f"\nstream-break fencing latency: median {statistics.median(latencies) * 1000:.1f} ms, "
        f"all {[round(x * 1000, 1) for x in latencies]} ms"
    )


def test_session_timeout_fences_a_silent_broker(start_controller, brokers, tmp_path):
    controller = start_controller({"broker.session.timeout.ms": "1000"})
    start_brokers(controller, brokers, [1, 2], processes=True, tmp_path=tmp_path)
    frozen = brokers[0]
    frozen.signal(signal.SIGSTOP)  # its socket stays open: only the timeout can catch it
    try:
        wait_until(lambda: controller.is_fenced(1), 15, "broker 1 fenced by the timeout")
    finally:
        frozen.signal(signal.SIGCONT)
    (fence,) = controller.events("broker_fenced")
    assert fence["broker_id"] == 1 and fence["reason"].startswith("session timed out")
    assert controller.is_unfenced(2)


def test_controlled_shutdown(controller, brokers, tmp_path):
    start_brokers(controller, brokers, [1, 2, 3], processes=True, tmp_path=tmp_path)
    assert create(controller, "t", 6, 3).error_code == ErrorCode.NONE
    leaving = brokers[1]
    assert any(partition_state(controller, "t", i).leader == 2 for i in range(6))
    leaving.signal(signal.SIGTERM)
    assert leaving.proc.wait(15) == 0
    assert [e["event"] for e in leaving.lines()][-2:] == ["shutdown_granted", "exiting"]
    image = controller.snapshot_image()
    for _, p in image.partitions():
        assert p.leader != 2 and 2 not in p.isr
    wait_until(lambda: controller.is_fenced(2), 10, "broker 2 fenced after exiting")
    assert controller.events("broker_fenced")[-1]["reason"] == "controlled shutdown complete"
    granted = controller.events("broker_shutdown_granted")
    assert [e["broker_id"] for e in granted] == [2]


def test_elections_and_alter_partition(controller, brokers):
    start_brokers(controller, brokers, [1, 2, 3])
    created = create(controller, "e", 1, 3)
    assert created.error_code == ErrorCode.NONE
    p = partition_state(controller, "e", 0)
    leader = next(b for b in brokers if b.broker_id == p.leader)
    others = [b for b in p.replicas if b != p.leader]

    def alter(isr, le=p.leader_epoch, pe=p.partition_epoch, sender=leader):
        request = pb.AlterPartitionRequest(
            broker_id=sender.broker_id,
            broker_epoch=sender.broker_epoch,
            topics=[
                pb.AlterPartitionTopic(
                    topic_id=created.topic_id,
                    partitions=[
                        pb.AlterPartitionPartition(
                            partition=0,
                            leader_epoch=le,
                            partition_epoch=pe,
                            new_isr_with_epochs=[
                                pb.BrokerState(broker_id=b, broker_epoch=-1) for b in isr
                            ],
                        )
                    ],
                )
            ],
        )
        return controller.stub.AlterPartition(request, timeout=5).topics[0].partitions[0]

    shrunk = alter([p.leader, others[0]])
    assert shrunk.error_code == ErrorCode.NONE
    assert shrunk.partition_epoch == p.partition_epoch + 1
    assert shrunk.leader_epoch == p.leader_epoch
    # The same proposal again, at the old partition epoch: the compare-and-set refuses it.
    again = alter([p.leader, others[1]])
    assert again.error_code == ErrorCode.INVALID_UPDATE_VERSION
    follower = next(b for b in brokers if b.broker_id == others[0])
    assert alter([p.leader], pe=shrunk.partition_epoch, sender=follower).error_code == (
        ErrorCode.NOT_LEADER_OR_FOLLOWER
    )
    # Preferred election: move leadership away, then back on request.
    leader.close_stream()
    wait_until(lambda: partition_state(controller, "e", 0).leader == others[0], 10, "failover")
    moved = partition_state(controller, "e", 0)
    assert moved.leader_epoch == p.leader_epoch + 1
    stale = alter([p.leader], pe=moved.partition_epoch)
    assert stale.error_code == ErrorCode.STALE_BROKER_EPOCH or stale.error_code == (
        ErrorCode.FENCED_LEADER_EPOCH
    )
    reply = controller.stub.ElectLeaders(
        pb.ElectLeadersRequest(
            election_type=pb.PREFERRED,
            topic_partitions=[
                pb.TopicPartitions(topic="e", partitions=[0]),
                pb.TopicPartitions(topic="nope", partitions=[0]),
            ],
        ),
        timeout=5,
    )
    codes = [(r.topic, r.error_code) for r in reply.results]
    assert codes == [
        ("e", ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE),
        ("nope", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    elected = [e for e in controller.events("leader_elected") if e["topic"] == "e"]
    assert elected[-1]["old_leader"] == p.leader and elected[-1]["new_leader"] == others[0]
    assert elected[-1]["leader_epoch"] == moved.leader_epoch
    metrics = scrape_metrics(controller)
    assert metrics["LeaderElectionRate_total"] >= 1
    assert metrics["PreferredReplicaImbalanceCount"] == 1
    assert metrics["GlobalTopicCount"] == 1 and metrics["GlobalPartitionCount"] == 1
    assert metrics["OfflinePartitionsCount"] == 0
    assert metrics["FencedBrokerCount"] == 1 and metrics["ActiveBrokerCount"] == 2


def test_bad_requests(controller, brokers):
    start_brokers(controller, brokers, [1, 2])
    cases = [
        (
            pb.CreatableTopic(name="bad/name", num_partitions=1, replication_factor=1),
            ErrorCode.INVALID_TOPIC_EXCEPTION,
        ),
        (
            pb.CreatableTopic(name="x" * 250, num_partitions=1, replication_factor=1),
            ErrorCode.INVALID_TOPIC_EXCEPTION,
        ),
        (
            pb.CreatableTopic(name="ok1", num_partitions=0, replication_factor=1),
            ErrorCode.INVALID_PARTITIONS,
        ),
        (
            pb.CreatableTopic(name="ok2", num_partitions=1, replication_factor=3),
            ErrorCode.INVALID_REPLICATION_FACTOR,
        ),
        (
            pb.CreatableTopic(
                name="ok3", num_partitions=1, replication_factor=1, configs={"retention.ms": "soon"}
            ),
            ErrorCode.INVALID_CONFIG,
        ),
        (
            pb.CreatableTopic(
                name="ok4", num_partitions=1, replication_factor=1, configs={"made.up": "1"}
            ),
            ErrorCode.INVALID_CONFIG,
        ),
    ]
    reply = controller.stub.CreateTopics(
        pb.CreateTopicsRequest(topics=[c for c, _ in cases]), timeout=5
    )
    assert [r.error_code for r in reply.topics] == [code for _, code in cases]
    assert all(r.error_message for r in reply.topics)
    assert controller.snapshot_image().topics_by_id == {}
    ok = create(controller, "ok", -1, -1)
    assert (ok.error_code, ok.num_partitions, ok.replication_factor) == (ErrorCode.NONE, 1, 1)
    assert create(controller, "ok", 1, 1).error_code == ErrorCode.TOPIC_ALREADY_EXISTS
    deleted = controller.stub.DeleteTopics(
        pb.DeleteTopicsRequest(topic_names=["ok", "never"]), timeout=5
    )
    assert [r.error_code for r in deleted.results] == [
        ErrorCode.NONE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ]
    hb = controller.stub.Heartbeat(
        iter([pb.BrokerHeartbeatRequest(broker_id=77, broker_epoch=5)]), timeout=5
    )
    assert [r.error_code for r in hb] == [ErrorCode.BROKER_ID_NOT_REGISTERED]
    ids = controller.stub.AllocateProducerIds(
        pb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=brokers[0].broker_epoch + 1)
    )
    assert ids.error_code == ErrorCode.STALE_BROKER_EPOCH


def test_watch_metadata_snapshot_then_live_then_keepalive(start_controller, brokers):
    controller = start_controller({"metadata.snapshot.interval.records": "10"})
    start_brokers(controller, brokers, [1])
    for i in range(8):
        assert create(controller, f"w{i}", 2, 1).error_code == ErrorCode.NONE
    assert list(controller.data_dir.glob("snapshot-*.snap"))
    image = MetadataImage()
    call = controller.stub.WatchMetadata(pb.WatchMetadataRequest(from_offset=0, broker_id=-1))
    batches = iter(call)
    try:
        first = next(batches)
        assert first.is_snapshot and first.snapshot_offset > 0
        apply_batch(image, first)
        target = controller.describe().metadata_offset
        while image.next_offset < target:
            apply_batch(image, next(batches))
        assert sorted(image.topic_ids_by_name) == [f"w{i}" for i in range(8)]
        assert create(controller, "live", 1, 1).error_code == ErrorCode.NONE
        live = next(batches)
        while not live.records:
            live = next(batches)
        assert not live.is_snapshot
        apply_batch(image, live)
        assert image.topic("live") is not None
        keepalive = next(batches)
        assert not keepalive.records and keepalive.high_offset == image.next_offset
    finally:
        call.cancel()
    assert brokers[0].metadata_offset() == image.next_offset or wait_until(
        lambda: brokers[0].metadata_offset() == image.next_offset, 5, "broker caught up"
    )
    assert controller.snapshot_image() == image


def _without_leader_change(image: MetadataImage) -> list[object]:
    return [r for r in image.to_records() if not isinstance(r, LeaderChangeRecord)]


def test_restart_after_kill9_keeps_everything(controller, brokers):
    start_brokers(controller, brokers, [1, 2, 3])
    created = [create(controller, f"k{i}", 3, 2) for i in range(3)]
    assert all(c.error_code == ErrorCode.NONE for c in created)
    ids = controller.stub.AllocateProducerIds(
        pb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=brokers[0].broker_epoch)
    )
    before = controller.snapshot_image()
    cluster_id = controller.describe().cluster_id
    controller.kill()
    for b in brokers:
        b.stop()
    brokers.clear()
    controller.start()
    assert controller.describe().cluster_id == cluster_id
    after = controller.snapshot_image()
    # Everything is kept; the restarted controller only adds its LeaderChangeRecord (it leads
    # the quorum of one in a new epoch, docs/design.md §6.1).
    assert _without_leader_change(after) == _without_leader_change(before)
    assert after.quorum_leader is not None and before.quorum_leader is not None
    assert after.quorum_leader[1] > before.quorum_leader[1]
    again = controller.stub.AllocateProducerIds(
        pb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=after.brokers[1].broker_epoch)
    )
    assert again.producer_id_start >= ids.producer_id_start + ids.producer_id_len
    # The brokers never came back: the restarted controller fences them by the timeout.
    wait_until(lambda: all(b.fenced for b in controller.describe().brokers), 15, "fenced")


def test_sigterm_stops_cleanly_and_a_second_controller_cannot_share_the_dir(controller):
    intruder = ControllerProcess(controller.data_dir)
    try:
        with pytest.raises(AssertionError, match="in use"):
            intruder.start(timeout_s=15)
    finally:
        intruder.kill()
    assert controller.terminate() == 0
    assert controller.events("controller_stopped")


def test_kill9_during_topic_creation_and_elections_loses_nothing_acknowledged(
    start_controller, brokers
):
    """Done-criterion of the issue: kill -9 in the middle of topic creation and elections, then
    restart: every acknowledged topic and partition epoch is there."""
    controller = start_controller({"metadata.snapshot.interval.records": "25"})
    start_brokers(controller, brokers, [1, 2, 3])
    acked_topics: dict[str, str] = {}
    acked_epochs: dict[tuple[str, int], int] = {}
    stop = threading.Event()
    errors: list[BaseException] = []

    def create_loop() -> None:
        i = 0
        while not stop.is_set():
            try:
                r = create(controller, f"c{i}", 2, 2)
            except grpc.RpcError:
                return
            if r.error_code == ErrorCode.NONE:
                acked_topics[r.name] = r.topic_id
            i += 1

    def elect_loop() -> None:
        while not stop.is_set():
            try:
                reply = controller.stub.ElectLeaders(
                    pb.ElectLeadersRequest(election_type=pb.PREFERRED, all_partitions=True),
                    timeout=5,
                )
                image = controller.snapshot_image()
            except grpc.RpcError:
                return
            except Exception as err:  # the image read raced the kill
                errors.append(err)
                return
            assert reply.error_code == ErrorCode.NONE
            for t, p in image.partitions():
                acked_epochs[(t.name, p.partition)] = p.partition_epoch

    def churn_loop() -> None:
        # Broker 3 flaps: while it is up, new topics place leaders on it; every stream break
        # fences it and moves those leaderships (elections); every return unfences it.
        while not stop.is_set():
            try:
                wait_until(lambda: controller.is_unfenced(3), 10, "broker 3 unfenced")
            except AssertionError:
                return
            stop.wait(0.2)
            b3 = next(b for b in brokers if b.broker_id == 3)
            b3.close_stream()
            b3.stop()
            brokers.remove(b3)
            fresh = FakeBroker(controller.address, 3)
            brokers.append(fresh)
            try:
                # The old stream's end may reach the controller after this registration:
                # DUPLICATE_BROKER_REGISTRATION until it does, as for a real restart.
                wait_until(lambda f=fresh: f.register().error_code == 0, 10, "re-registered")
                fresh.start()
            except (grpc.RpcError, AssertionError):
                return

    threads = [threading.Thread(target=f) for f in (create_loop, elect_loop, churn_loop)]
    for t in threads:
        t.start()
    wait_until(lambda: len(acked_topics) >= 15, 60, "topics created under churn")
    wait_until(lambda: len(controller.events("leader_elected")) >= 3, 60, "elections under churn")
    controller.kill()
    stop.set()
    for t in threads:
        t.join(15)
    for b in brokers:
        b.stop()
    brokers.clear()
    assert not errors
    assert acked_epochs, "no election round was acknowledged before the kill"
    controller.start()
    image = controller.snapshot_image()
    print(
        f"\nkill -9 under churn: {len(acked_topics)} topics and "
        f"{len(acked_epochs)} partition epochs acknowledged, all present after restart"
    )
    for name, topic_id in acked_topics.items():
        topic = image.topic(name)
        assert topic is not None and topic.topic_id == topic_id, name
        assert sorted(topic.partitions) == [0, 1]
    for (name, index), epoch in acked_epochs.items():
        topic = image.topic(name)
        assert topic is not None and topic.partitions[index].partition_epoch >= epoch
    loaded = controller.events("metadata_loaded")[0]
    assert loaded["snapshot_offset"] > 0  # snapshots were taken and replay started from one
