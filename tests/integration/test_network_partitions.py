"""Network partitions between real processes (issue 15): the scenarios that must hold.

The launcher cuts links through the fault layer every process runs (`cluster partition`,
`isolate`, `heal`; docs/design.md): a cut link is silent, as in a real partition, its calls hang
until their deadlines. What is checked is docs/design.md §8 on what each test sees:

  1. no acks=all write is acknowledged and then lost: every acknowledged record is read back at
     the offset it was acknowledged with, none twice, offsets contiguous;
  2. replicas hold identical bytes up to the HW once everything is healed and caught up;
  4. a consumer is never given a record above the HW (asked of the zombie itself: every batch it
     returns ends below the HW it reports; and every record a tailing consumer was given is in
     the final log at that offset);
  and the zombie rules: a leader cut from the controller and its followers acknowledges no
  acks=all write, is fenced and replaced, is truncated on heal and rejoins the ISR; no two
  brokers ever lead one partition in the same leader epoch.

Short timers (lag 1.5 s, session 2.5 s) keep each test within ~40 s; every wait has a deadline,
and the harness kills every process by PID at the end.
"""

from __future__ import annotations

import json
import pathlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until
from test_reassignment_process import Reader
from test_replication import BackgroundProducer, log_bytes, read_all, wait_for_progress

from minibroker.client import Admin, NewTopic, TopicPartition
from minibroker.client import wire as cwire
from minibroker.client.batch import iter_batches
from minibroker.client.errors import ErrorCode
from minibroker.client.records.builder import encode_batch
from minibroker.deploy import cluster as launcher
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SETTINGS = {
    "replica.lag.time.max.ms": "1500",
    "broker.session.timeout.ms": "2500",
    "leader.imbalance.check.interval.seconds": "3600",
}
QUORUM_SETTINGS = {
    **SETTINGS,
    "controller.quorum.election.timeout.ms": "300",
    "controller.quorum.fetch.timeout.ms": "600",
    "controller.quorum.election.backoff.max.ms": "300",
}
TOPIC = "cut"
TP = TopicPartition(TOPIC, 0)


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    with local_cluster(str(tmp_path / "cluster"), brokers=3, settings=SETTINGS) as c:
        yield c


@pytest.fixture
def quorum_cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    with local_cluster(
        str(tmp_path / "cluster"), brokers=3, settings=QUORUM_SETTINGS, controllers=3
    ) as c:
        yield c


def active_other_than(cluster: LocalCluster, name: str) -> launcher.ProcessSpec | None:
    spec = launcher.active_controller(cluster.state)
    return spec if spec is not None and spec.name != name else None


# -- looking at each broker directly ----------------------------------------------------------
# During a partition the brokers disagree: an Admin answer depends on which broker it asked. So
# the tests ask a chosen broker for its own view (DescribeReplicas), as `watch` does.


def replica(cluster: LocalCluster, broker: int, tp: TopicPartition = TP) -> pb.ReplicaDescription:
    """`broker`'s own view of its replica of `tp` (role, leader epoch, ISR, HW, truncations)."""
    with grpc.insecure_channel(cluster.spec(broker).address) as channel:
        answer = pb_grpc.BrokerServiceStub(channel).DescribeReplicas(
            pb.DescribeReplicasRequest(topics=[tp.topic]), timeout=3
        )
    for r in answer.replicas:
        if r.partition == tp.partition:
            return r
    raise AssertionError(f"broker {broker} hosts no replica of {tp}")


def leading(cluster: LocalCluster, broker: int, tp: TopicPartition = TP) -> pb.ReplicaDescription:
    """`broker`'s view when it leads `tp`; AssertionError otherwise (for wait_until)."""
    r = replica(cluster, broker, tp)
    assert r.is_leader, f"broker {broker} does not lead {tp}"
    return r


def new_leader(
    cluster: LocalCluster, candidates: list[int], above_epoch: int, tp: TopicPartition = TP
) -> pb.ReplicaDescription | None:
    """The view of the candidate that leads `tp` in an epoch above `above_epoch`, if one does."""
    for broker in candidates:
        r = replica(cluster, broker, tp)
        if r.is_leader and r.leader_epoch > above_epoch:
            return r
    return None


def fenced(cluster: LocalCluster) -> set[int]:
    with Admin(cluster.bootstrap) as admin:
        return {b.broker_id for b in admin.describe_cluster().brokers if b.fenced}


def fenced_view(cluster: LocalCluster, bootstrap_broker: int) -> set[int]:
    """Which brokers the controller has fenced, asked through `bootstrap_broker`."""
    with Admin(cluster.spec(bootstrap_broker).address) as admin:
        return {b.broker_id for b in admin.describe_cluster().brokers if b.fenced}


def faults_seen(cluster: LocalCluster) -> bool:
    """Every process has loaded the current faults.json (its log says so): a fault counts from
    then on, not from the command (the processes poll the file)."""
    current = json.loads((pathlib.Path(cluster.directory) / "faults.json").read_text())
    generation = int(current["generation"])
    for spec in cluster.state.all():
        seen = -1
        for line in pathlib.Path(spec.log_file).read_text(errors="replace").splitlines():
            if '"network_faults_changed"' in line:
                seen = max(seen, int(json.loads(line).get("generation", -1)))
        if seen < generation:
            return False
    return True


def wait_faults_seen(cluster: LocalCluster) -> None:
    wait_until(lambda: faults_seen(cluster), 10, "every process to load the faults")


# -- a client that talks to one broker only -------------------------------------------------


@dataclass
class Answer:
    value: bytes
    acks: int
    sent_at: float
    error: int
    base_offset: int


@dataclass
class ZombieProbe:
    """Talks to one broker only, whatever the metadata says, as a client with a stale cache does:
    numbered acks=all and acks=1 produces, and consumer fetches whose answers are checked
    against the HW they carry."""

    address: str
    tp: TopicPartition = TP
    answers: list[Answer] = field(default_factory=list)
    above_hw: list[str] = field(default_factory=list)
    fetches: int = 0
    errors: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._produce, daemon=True),
            threading.Thread(target=self._fetch, daemon=True),
        ]

    def _produce(self) -> None:
        i = 0
        with grpc.insecure_channel(self.address) as channel:
            stub = pb_grpc.BrokerServiceStub(channel)
            while not self._stop.is_set():
                for acks in (-1, 1):
                    value = f"zombie-{'all' if acks == -1 else '1'}-{i:05d}".encode()
                    batch = encode_batch([(int(time.time() * 1000), None, value, [])])
                    request = cwire.produce_request(acks, 1000, [(self.tp, batch)])
                    sent = time.monotonic()
                    try:
                        response = stub.Produce(request, timeout=5)
                    except grpc.RpcError:
                        continue
                    result = cwire.produce_results(response)[self.tp]
                    self.answers.append(
                        Answer(value, acks, sent, result.error_code, result.base_offset)
                    )
                i += 1
                self._stop.wait(0.05)

    def _fetch(self) -> None:
        try:
            with grpc.insecure_channel(self.address) as channel:
                stub = pb_grpc.BrokerServiceStub(channel)
                position = 0
                while not self._stop.is_set():
                    request = cwire.fetch_request(
                        [cwire.FetchTarget(self.tp, -1, position)],
                        max_wait_ms=200,
                        min_bytes=1,
                        max_bytes=1 << 20,
                        partition_max_bytes=1 << 20,
                        rack_id="",
                    )
                    try:
                        response = stub.Fetch(request, timeout=5)
                    except grpc.RpcError:
                        self._stop.wait(0.05)
                        continue
                    self.fetches += 1
                    for part in cwire.fetched_partitions(response):
                        if part.error_code != ErrorCode.NONE:
                            continue
                        for _, header in iter_batches(part.records):
                            if header.last_offset >= part.high_watermark:
                                self.above_hw.append(
                                    f"batch {header.base_offset}..{header.last_offset} "
                                    f"given with HW {part.high_watermark}"
                                )
                        # Ask again just below the HW: a leader with records above it (the
                        # zombie's acks=1 tail) must still stop at the HW.
                        position = max(0, part.high_watermark - 2)
                    self._stop.wait(0.02)
        except BaseException as err:
            self.errors.append(err)

    def acked(self, acks: int) -> list[Answer]:
        return [a for a in self.answers if a.acks == acks and a.error == ErrorCode.NONE]

    def answered(self, acks: int) -> list[Answer]:
        return [a for a in self.answers if a.acks == acks]

    def __enter__(self) -> ZombieProbe:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)


class LeaderMonitor:
    """Samples every broker's view of `tp` and keeps, per leader epoch, the brokers that said they
    led in it: two of them for one epoch would be a split brain."""

    def __init__(self, cluster: LocalCluster, brokers: list[int], tp: TopicPartition = TP):
        self.leaders: dict[int, set[int]] = {}
        self.samples = 0
        self._cluster, self._brokers, self._tp = cluster, brokers, tp
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for broker in self._brokers:
                try:
                    r = replica(self._cluster, broker, self._tp)
                except (grpc.RpcError, AssertionError):
                    continue
                if r.is_leader:
                    self.leaders.setdefault(r.leader_epoch, set()).add(broker)
            self.samples += 1

    def split_brains(self) -> dict[int, set[int]]:
        return {epoch: b for epoch, b in self.leaders.items() if len(b) > 1}

    def __enter__(self) -> LeaderMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# -- the invariants at the end ------------------------------------------------------------------


def create_topic(cluster: LocalCluster, partitions: int = 1) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, partitions, 3, {"min.insync.replicas": "2"})])
    wait_until(lambda: full_isr(cluster), 30, "a full ISR")


def full_isr(cluster: LocalCluster, tp: TopicPartition = TP) -> pb.ReplicaDescription | None:
    """The leader's view once its ISR holds every replica and every broker agrees who leads at
    which epoch (the metadata reached them all)."""
    views = {b: replica(cluster, b, tp) for b in (1, 2, 3)}
    leaders = [v for v in views.values() if v.is_leader]
    if len(leaders) != 1:
        return None
    leader = leaders[0]
    if set(leader.isr) != {1, 2, 3}:
        return None
    if any(
        (v.leader_id, v.leader_epoch) != (leader.leader_id, leader.leader_epoch)
        for v in views.values()
    ):
        return None
    return leader


def settled(cluster: LocalCluster, tp: TopicPartition = TP) -> pb.ReplicaDescription | None:
    """A full ISR with every replica at the leader's HW (writes stopped)."""
    leader = full_isr(cluster, tp)
    if leader is None:
        return None
    ends = {replica(cluster, b, tp).log_end_offset for b in (1, 2, 3)}
    return leader if ends == {leader.high_watermark} else None


def check_invariants(
    cluster: LocalCluster,
    producer: BackgroundProducer,
    reader: Reader | None,
    never_stored: set[bytes] = frozenset(),  # type: ignore[assignment]
) -> list:  # type: ignore[type-arg]
    """§8 1-4 on the final log: acknowledged records at their offsets, no value twice, contiguous
    offsets, the reader's records all in the log at their offsets, replicas byte-identical up to
    the HW, and none of `never_stored` (writes only the zombie ever held) in the log."""
    leader = wait_until(lambda: settled(cluster), 30, "every replica at the HW")
    records = read_all(cluster.bootstrap, TP, timeout_s=30)
    offsets = [r.offset for r in records]
    assert offsets == list(range(len(records))), "offsets are not contiguous"
    values = [r.value for r in records]
    assert len(set(values)) == len(values), "a value is stored twice"
    stored = {r.value: r.offset for r in records}
    lost = {v: o for v, o in producer.acked.items() if stored.get(v) != o}
    assert not lost, (
        f"{len(lost)} acknowledged records lost or moved, e.g. {list(lost.items())[:3]}"
    )
    kept = never_stored & set(stored)
    assert not kept, f"writes only the zombie held survived: {sorted(kept)[:3]}"
    if reader is not None:
        assert not reader.errors, reader.errors
        by_offset = {r.offset: r.value for r in records}
        phantom = {o: v for o, v in reader.seen.items() if by_offset.get(o) != v}
        assert not phantom, f"the reader was given {len(phantom)} records not in the log"
    images = {b: log_bytes(cluster.spec(b).data_dir, TP, leader.high_watermark) for b in (1, 2, 3)}
    assert len(set(images.values())) == 1, "replica logs differ below the HW"
    return records


# -- the scenarios ------------------------------------------------------------------------------


def test_a_zombie_leader_acknowledges_nothing_and_is_truncated_after_heal(
    cluster: LocalCluster,
) -> None:
    """The leader cut from the controller and its followers while its clients still reach it:
    it takes writes but acknowledges no acks=all one (its old ISR gates the HW until the
    controller commits a shrink, which it cannot reach), never serves a record above its HW,
    is fenced and replaced in a higher epoch, and after the heal truncates what only it held and
    rejoins the ISR."""
    zombie_leader(cluster)


def test_a_zombie_leader_with_a_controller_quorum(quorum_cluster: LocalCluster) -> None:
    """The same with three controllers: the zombie's heartbeat stream stalls and it asks the
    quorum, which it cannot reach either; after the heal it finds the active one again."""
    zombie_leader(quorum_cluster)


def zombie_leader(cluster: LocalCluster) -> None:
    create_topic(cluster)
    before = full_isr(cluster)
    assert before is not None
    zombie = before.leader_id
    others = [b for b in (1, 2, 3) if b != zombie]
    with (
        BackgroundProducer(cluster.bootstrap, TOPIC) as producer,
        Reader(cluster.bootstrap, TP) as reader,
        LeaderMonitor(cluster, [1, 2, 3]) as monitor,
    ):
        wait_for_progress(producer, 100)
        cluster.isolate(zombie)
        wait_faults_seen(cluster)
        cut_at = time.monotonic()
        with ZombieProbe(cluster.spec(zombie).address) as probe:
            replaced = wait_until(
                lambda: new_leader(cluster, others, before.leader_epoch),
                20,
                "a new leader in a higher epoch",
            )
            assert zombie not in replaced.isr
            wait_until(lambda: zombie in fenced_view(cluster, others[0]), 10, "the zombie fenced")
            wait_for_progress(producer, 100)  # writes go on through the new leader
            # The zombie still believes it leads in the old epoch, and has written since.
            wait_until(
                lambda: len(probe.answered(-1)) >= 2 and len(probe.acked(1)) >= 3,
                20,
                "acks=all answers and acks=1 writes from the zombie",
            )
            still = replica(cluster, zombie)
            assert still.is_leader and still.leader_epoch == before.leader_epoch
            assert set(still.maximal_isr) == {1, 2, 3}, "the zombie's HW left its old ISR"
            assert still.log_end_offset > still.high_watermark
            assert probe.fetches > 0
        cluster.heal()
        wait_until(
            lambda: (
                not replica(cluster, zombie).is_leader
                and zombie in leading(cluster, replaced.leader_id).isr
            ),
            30,
            f"broker {zombie} following and back in the ISR",
        )
        assert replica(cluster, zombie).truncations >= 1, "the zombie never truncated"
        wait_for_progress(producer, 100)
    acked_by_zombie = [a for a in probe.acked(-1) if a.sent_at >= cut_at]
    assert not acked_by_zombie, f"the zombie acknowledged acks=all writes: {acked_by_zombie[:3]}"
    assert not probe.above_hw, probe.above_hw[:3]
    assert not probe.errors, probe.errors
    assert not monitor.split_brains(), monitor.split_brains()
    assert monitor.samples > 0
    zombie_only = {a.value for a in probe.answers}
    check_invariants(cluster, producer, reader, never_stored=zombie_only)


def test_a_follower_cut_from_its_leader_leaves_the_isr_and_rejoins_after_heal(
    cluster: LocalCluster,
) -> None:
    create_topic(cluster)
    before = full_isr(cluster)
    assert before is not None
    leader = before.leader_id
    follower, other = [b for b in (1, 2, 3) if b != leader]
    with (
        BackgroundProducer(cluster.bootstrap, TOPIC) as producer,
        Reader(cluster.bootstrap, TP) as reader,
    ):
        wait_for_progress(producer, 100)
        cluster.partition(str(follower), str(leader))
        wait_faults_seen(cluster)
        shrunk = wait_until(
            lambda: (lambda r: r if set(r.isr) == {leader, other} else None)(
                leading(cluster, leader)
            ),
            20,
            f"broker {follower} out of the ISR",
        )
        # Nothing else moved: same leader, same epoch, the follower still registered and unfenced
        # (it reaches the controller), and acks=all writes go on with two replicas.
        assert shrunk.leader_epoch == before.leader_epoch
        assert follower not in fenced(cluster)
        wait_for_progress(producer, 100)
        lagging = replica(cluster, follower)
        assert lagging.log_end_offset < leading(cluster, leader).log_end_offset
        cluster.heal()
        wait_until(
            lambda: follower in leading(cluster, leader).isr, 30, f"broker {follower} rejoining"
        )
        assert leading(cluster, leader).leader_epoch == before.leader_epoch
        wait_for_progress(producer, 100)
    check_invariants(cluster, producer, reader)


def test_a_broker_cut_from_the_controller_only_is_fenced_replaced_and_back_after_heal(
    cluster: LocalCluster,
) -> None:
    """The leader loses the controller but not its peers: the controller fences it and moves its
    leadership; its followers learn that from the metadata and stop fetching from it, so it can
    acknowledge no acks=all write; no two brokers ever lead in one epoch; after the heal it is
    unfenced, follows the new leader and rejoins the ISR."""
    create_topic(cluster)
    before = full_isr(cluster)
    assert before is not None
    cut = before.leader_id
    others = [b for b in (1, 2, 3) if b != cut]
    with (
        BackgroundProducer(cluster.bootstrap, TOPIC) as producer,
        Reader(cluster.bootstrap, TP) as reader,
        LeaderMonitor(cluster, [1, 2, 3]) as monitor,
    ):
        wait_for_progress(producer, 100)
        cluster.isolate(cut, scope="controller")
        wait_faults_seen(cluster)
        with ZombieProbe(cluster.spec(cut).address) as probe:
            replaced = wait_until(
                lambda: new_leader(cluster, others, before.leader_epoch),
                20,
                "a new leader in a higher epoch",
            )
            lost_at = time.monotonic()
            wait_until(lambda: cut in fenced_view(cluster, others[0]), 10, f"broker {cut} fenced")
            assert cut not in replaced.isr
            wait_for_progress(producer, 100)
            # Its peers follow the new leader (the metadata reached them), so the cut broker's
            # old ISR never acknowledges again: its acks=all answers are all failures.
            wait_until(
                lambda: any(a.sent_at > lost_at for a in probe.answered(-1)),
                20,
                "an acks=all answer from the cut broker after it was replaced",
            )
        cluster.heal()
        wait_until(lambda: cut not in fenced(cluster), 20, f"broker {cut} unfenced")
        wait_until(
            lambda: (
                not replica(cluster, cut).is_leader
                and cut in leading(cluster, replaced.leader_id).isr
            ),
            30,
            f"broker {cut} following and back in the ISR",
        )
        wait_for_progress(producer, 100)
    late = [a for a in probe.acked(-1) if a.sent_at > lost_at]
    assert not late, f"the replaced leader acknowledged acks=all writes: {late[:3]}"
    assert not probe.above_hw, probe.above_hw[:3]
    assert not monitor.split_brains(), monitor.split_brains()
    # What it acknowledged with acks=all before it was replaced its followers held: kept.
    records = check_invariants(cluster, producer, reader)
    stored = {r.value: r.offset for r in records}
    early = {a.value: a.base_offset for a in probe.acked(-1)}
    assert all(stored.get(v) == o for v, o in early.items()), "an acknowledged write was lost"


@pytest.mark.parametrize("controller_side", ["majority", "minority"])
def test_a_symmetric_split_one_against_two(cluster: LocalCluster, controller_side: str) -> None:
    """1 | 2,3 with the leader alone. Controller with the majority: the lone leader is a
    zombie, replaced by one of the two, which go on taking acks=all writes. Controller with the
    lone leader: the two are fenced, the ISR shrinks to the leader alone, below
    min.insync.replicas, so no acks=all write is acknowledged until the heal; nothing moves."""
    create_topic(cluster)
    before = full_isr(cluster)
    assert before is not None
    alone = before.leader_id
    pair = [b for b in (1, 2, 3) if b != alone]
    group_pair = ",".join(str(b) for b in pair)
    with (
        BackgroundProducer(cluster.bootstrap, TOPIC) as producer,
        Reader(cluster.bootstrap, TP) as reader,
        LeaderMonitor(cluster, [1, 2, 3]) as monitor,
    ):
        wait_for_progress(producer, 100)
        if controller_side == "majority":
            cluster.partition(str(alone), f"{group_pair},controller")
        else:
            cluster.partition(f"{alone},controller", group_pair)
        wait_faults_seen(cluster)
        with ZombieProbe(cluster.spec(alone).address) as probe:
            if controller_side == "majority":
                replaced = wait_until(
                    lambda: new_leader(cluster, pair, before.leader_epoch),
                    20,
                    "a new leader among the two",
                )
                wait_until(
                    lambda: alone in fenced_view(cluster, pair[0]), 10, "the lone one fenced"
                )
                wait_for_progress(producer, 100)
                new_leader_id = replaced.leader_id
            else:
                wait_until(lambda: set(pair) <= fenced(cluster), 20, "the two fenced")
                shrunk = wait_until(
                    lambda: (lambda r: r if list(r.isr) == [alone] else None)(
                        leading(cluster, alone)
                    ),
                    20,
                    "the ISR shrunk to the lone leader",
                )
                assert shrunk.leader_epoch == before.leader_epoch
                new_leader_id = alone
            split_at = time.monotonic()
            wait_until(
                lambda: len([a for a in probe.answered(-1) if a.sent_at > split_at]) >= 2,
                20,
                "acks=all answers from the lone broker",
            )
            acked_during = producer.count()
            alone_acked = [a for a in probe.acked(-1) if a.sent_at > split_at]
            assert not alone_acked, (
                f"the lone broker acknowledged acks=all writes: {alone_acked[:3]}"
            )
        cluster.heal()
        wait_until(lambda: not fenced(cluster), 20, "every broker unfenced")
        wait_until(lambda: full_isr(cluster), 30, "a full ISR again")
        assert leading(cluster, new_leader_id).leader_id == new_leader_id
        wait_for_progress(producer, 100)
        assert producer.count() > acked_during
    assert not probe.above_hw, probe.above_hw[:3]
    assert not monitor.split_brains(), monitor.split_brains()
    check_invariants(cluster, producer, reader)


def test_the_active_controller_cut_from_the_other_voters_resigns_and_brokers_follow(
    quorum_cluster: LocalCluster,
) -> None:
    """Three controllers; the active one loses the other two voters but not the brokers. It
    resigns (check-quorum: no majority fetched from it within the fetch timeout), the other two
    elect a leader, the brokers move their heartbeats and metadata watch to it (a topic created
    now reaches them all, nobody is fenced), and after the heal the old one follows."""
    cluster = quorum_cluster
    create_topic(cluster)
    old = wait_until(lambda: launcher.active_controller(cluster.state), 20, "a leader")
    with (
        BackgroundProducer(cluster.bootstrap, TOPIC) as producer,
        Reader(cluster.bootstrap, TP) as reader,
    ):
        wait_for_progress(producer, 100)
        cluster.isolate(old.name, scope="controller")
        wait_faults_seen(cluster)
        resigned = wait_until(
            lambda: [
                e for e in events(old, "quorum_resigned") if e.get("reason") == "check_quorum"
            ],
            20,
            "the cut controller resigning (check-quorum)",
        )
        assert resigned
        new = wait_until(
            lambda: active_other_than(cluster, old.name), 20, "a new active controller"
        )
        # The brokers follow it: a topic created now reaches every broker's metadata.
        with Admin(cluster.bootstrap) as admin:
            admin.create_topics([NewTopic("after-cut", 1, 3)])
        wait_until(
            lambda: all(
                replica(cluster, b, TopicPartition("after-cut", 0)).leader_id > 0 for b in (1, 2, 3)
            ),
            20,
            "the new topic on every broker",
        )
        wait_for_progress(producer, 100)
        cluster.heal()
        wait_until(
            lambda: follows(cluster, old, new), 20, "the old controller following the new one"
        )
        wait_for_progress(producer, 100)
    assert not fencings(cluster), fencings(cluster)
    check_invariants(cluster, producer, reader)


def events(spec: launcher.ProcessSpec, name: str) -> list[dict]:  # type: ignore[type-arg]
    out = []
    for line in pathlib.Path(spec.log_file).read_text(errors="replace").splitlines():
        if f'"{name}"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def fencings(cluster: LocalCluster) -> list[dict]:  # type: ignore[type-arg]
    return [e for spec in cluster.state.controllers for e in events(spec, "broker_fenced")]


def follows(cluster: LocalCluster, old: launcher.ProcessSpec, new: launcher.ProcessSpec) -> bool:
    inputs = launcher.quorum_inputs(cluster.state)
    answers = {i.name: i.answer for i in inputs if getattr(i, "answer", None) is not None}
    answer = answers.get(old.name)
    return answer is not None and answer.role == "follower" and answer.leader_id == new.node_id


def test_the_active_controller_cut_from_every_node_is_replaced_and_nobody_is_fenced(
    quorum_cluster: LocalCluster,
) -> None:
    """Three controllers; the active one is cut from the other voters AND from the brokers. It
    resigns, the other two elect a leader, and the brokers, whose streams to the old one just
    hang, find the new one (a stalled heartbeat stream makes them ask the quorum) in time: no
    broker is fenced, a topic created now reaches every broker, writes go on."""
    cluster = quorum_cluster
    create_topic(cluster)
    old = wait_until(lambda: launcher.active_controller(cluster.state), 20, "a leader")
    with (
        BackgroundProducer(cluster.bootstrap, TOPIC) as producer,
        Reader(cluster.bootstrap, TP) as reader,
    ):
        wait_for_progress(producer, 100)
        cluster.isolate(old.name)
        wait_faults_seen(cluster)
        new = wait_until(
            lambda: active_other_than(cluster, old.name), 20, "a new active controller"
        )
        with Admin(cluster.bootstrap) as admin:
            admin.create_topics([NewTopic("after-cut", 1, 3)])
        wait_until(
            lambda: all(
                replica(cluster, b, TopicPartition("after-cut", 0)).leader_id > 0 for b in (1, 2, 3)
            ),
            20,
            "the new topic on every broker",
        )
        wait_for_progress(producer, 100)
        cluster.heal()
        wait_until(lambda: follows(cluster, old, new), 20, "the old controller following")
        wait_for_progress(producer, 100)
    assert not fencings(cluster), fencings(cluster)
    check_invariants(cluster, producer, reader)


def test_a_quorum_split_the_leader_and_the_active_controller_against_the_rest(
    quorum_cluster: LocalCluster,
) -> None:
    """broker L + the active controller | the other two brokers + the other two controllers:
    the lone controller resigns, the majority elects a new one, which fences L (it can only
    reach the old controller) and elects a new partition leader; L acknowledges no acks=all
    write; after the heal L is truncated and back in the ISR, the old controller follows."""
    cluster = quorum_cluster
    create_topic(cluster)
    before = full_isr(cluster)
    assert before is not None
    alone = before.leader_id
    pair = [b for b in (1, 2, 3) if b != alone]
    old = wait_until(lambda: launcher.active_controller(cluster.state), 20, "a leader")
    rest = [c.name for c in cluster.state.controllers if c.name != old.name]
    with (
        BackgroundProducer(cluster.bootstrap, TOPIC) as producer,
        Reader(cluster.bootstrap, TP) as reader,
        LeaderMonitor(cluster, [1, 2, 3]) as monitor,
    ):
        wait_for_progress(producer, 100)
        cluster.partition(f"{alone},{old.name}", ",".join([*map(str, pair), *rest]))
        wait_faults_seen(cluster)
        split_at = time.monotonic()
        with ZombieProbe(cluster.spec(alone).address) as probe:
            new = wait_until(
                lambda: active_other_than(cluster, old.name), 20, "a new active controller"
            )
            replaced = wait_until(
                lambda: new_leader(cluster, pair, before.leader_epoch), 20, "a new leader"
            )
            wait_until(lambda: alone in fenced_view(cluster, pair[0]), 10, "the lone one fenced")
            wait_for_progress(producer, 100)
            wait_until(
                lambda: len([a for a in probe.answered(-1) if a.sent_at > split_at]) >= 2,
                20,
                "acks=all answers from the lone broker",
            )
        cluster.heal()
        wait_until(lambda: follows(cluster, old, new), 20, "the old controller following")
        wait_until(
            lambda: (
                not replica(cluster, alone).is_leader
                and alone in leading(cluster, replaced.leader_id).isr
            ),
            30,
            f"broker {alone} following and back in the ISR",
        )
        wait_for_progress(producer, 100)
    late = [a for a in probe.acked(-1) if a.sent_at > split_at]
    assert not late, f"the lone broker acknowledged acks=all writes: {late[:3]}"
    assert not probe.above_hw, probe.above_hw[:3]
    assert not monitor.split_brains(), monitor.split_brains()
    check_invariants(cluster, producer, reader, never_stored={a.value for a in probe.answers})


def test_three_zombie_leaders_in_a_row_each_cut_right_after_the_previous_heal(
    cluster: LocalCluster,
) -> None:
    """Cut the leader, and as soon as it is replaced heal and cut the new one (once it has a
    second in-sync replica), three times, so a cut can land while the previous zombie is still
    truncating and catching up (its held heartbeats and AlterPartition arriving late): the ISR
    goes down to one replica, writes wait, and nothing acknowledged is lost."""
    create_topic(cluster)
    leader = full_isr(cluster)
    assert leader is not None
    epoch, current = leader.leader_epoch, leader.leader_id
    with (
        BackgroundProducer(cluster.bootstrap, TOPIC) as producer,
        Reader(cluster.bootstrap, TP) as reader,
        LeaderMonitor(cluster, [1, 2, 3]) as monitor,
    ):
        wait_for_progress(producer, 100)
        for _ in range(3):
            cluster.isolate(current)
            wait_faults_seen(cluster)
            others = [b for b in (1, 2, 3) if b != current]
            replaced = wait_until(
                lambda o=others, e=epoch: new_leader(cluster, o, e),  # type: ignore[misc]
                20,
                f"a leader other than broker {current}",
            )
            cluster.heal()
            epoch, current = replaced.leader_epoch, replaced.leader_id
            # A clean election needs another in-sync replica: cut the new leader as soon as it
            # has one (the last zombie may still be catching up).
            wait_until(
                lambda c=current: len(leading(cluster, c).isr) >= 2,  # type: ignore[misc]
                20,
                f"a second in-sync replica beside broker {current}",
            )
        wait_until(lambda: full_isr(cluster), 30, "a full ISR after the last heal")
        wait_for_progress(producer, 100)
    assert not monitor.split_brains(), monitor.split_brains()
    check_invariants(cluster, producer, reader)


def test_a_leader_cut_from_everyone_its_clients_too_loses_its_clients_to_the_new_leader(
    cluster: LocalCluster,
) -> None:
    """`isolate --from all`: the leader's server holds every incoming call as well. The
    producer's requests to it time out, it refreshes its metadata from another broker and
    goes on writing to the new leader while the cut lasts; after the heal the old leader
    truncates and rejoins."""
    create_topic(cluster)
    before = full_isr(cluster)
    assert before is not None
    silent = before.leader_id
    others = [b for b in (1, 2, 3) if b != silent]
    with (
        BackgroundProducer(cluster.bootstrap, TOPIC) as producer,
        Reader(cluster.bootstrap, TP) as reader,
    ):
        wait_for_progress(producer, 100)
        cluster.isolate(silent, scope="all")
        wait_faults_seen(cluster)
        replaced = wait_until(
            lambda: new_leader(cluster, others, before.leader_epoch), 20, "a new leader"
        )
        wait_for_progress(producer, 100, timeout_s=30)
        cluster.heal()
        wait_until(
            lambda: (
                not replica(cluster, silent).is_leader
                and silent in leading(cluster, replaced.leader_id).isr
            ),
            30,
            f"broker {silent} following and back in the ISR",
        )
        wait_for_progress(producer, 100)
    check_invariants(cluster, producer, reader)
