"""Multi-replica scenarios of docs/design.md §8 (first test layer), driven step by step.

Each test scripts one known failure (KIP-101 #1 and #2, KIP-279, KIP-320 fencing and zombie
leaders, strict min ISR with acks=all) against the product's replica engine (`BrokerReplicas`,
its cores and its one effect interpreter) over in-memory logs with real v2 batches and the real
EpochCache (the simulation's MemLog), and checks the outcome the KIP promises. No sockets, no
event loop: every "network" hop is a direct call, and the controller is the test itself.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "sim"))

from memlog import MemLog

from minibroker.broker.replication.engine import BrokerReplicas
from minibroker.broker.replication.events import CompleteProduce, FetchResponse, FollowerFetch
from minibroker.broker.replication.outputs import (
    EngineConfig,
    Output,
    StartFollowing,
    StopFollowing,
)
from minibroker.client.errors import ErrorCode
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition
from minibroker.metadata.image import BrokerRegistration, MetadataImage, TopicImage
from minibroker.metadata.records import PartitionRecord

A, B, C = 1, 2, 3
TOPIC, TOPIC_ID = "scenario", "scenario-topic-id"
TP = TopicPartition(TOPIC, 0)


class ScenarioLog(MemLog):
    """A MemLog that can lose the epoch entries a new leader asks for (the KIP-279 negative
    control: the log as it would be without the election entry)."""

    forget_epoch_assignments = False

    def maybe_assign_epoch_start_offset(self, leader_epoch: int, start_offset: int) -> bool:
        if self.forget_epoch_assignments:
            return False
        return super().maybe_assign_epoch_start_offset(leader_epoch, start_offset)


class Node:
    """One broker: the partition's log (its disk) and a BrokerReplicas engine hosting it (its
    process); `restart` keeps only the disk."""

    def __init__(self, broker_id: int, cluster: Cluster) -> None:
        self.broker_id = broker_id
        self.cluster = cluster
        self.log = ScenarioLog()
        self.completed: list[CompleteProduce] = []
        self.tokens: dict[object, object] = {}  # the engine's produce token -> the test's
        self.engine = self._start()

    def _start(self) -> BrokerReplicas[ScenarioLog]:
        config = EngineConfig(self.broker_id, replica_lag_time_max_ms=1_000)
        engine: BrokerReplicas[ScenarioLog] = BrokerReplicas(config, self.cluster.image)
        engine.act_on_metadata(self.cluster.now_ms)  # takes the brokers' registrations
        engine.host(
            TP, TOPIC_ID, self.log, self.cluster.configs, high_watermark=self.log.hw_checkpoint
        )
        self.fetching_from: int | None = None
        return engine

    @property
    def high_watermark(self) -> int:
        return self.engine.high_watermark(TP)

    def restart(self, *, lose_unflushed: bool) -> None:
        if lose_unflushed:
            self.log.lose_unflushed()  # power loss that keeps exactly the flushed prefix
        self.log.hw_checkpoint = min(self.log.hw_checkpoint, self.log.leo)
        self.engine = self._start()

    def handle(self, outputs: list[Output]) -> None:
        """The shell's part: produce answers and whom to fetch from (AlterPartition requests
        go nowhere: the test is the controller)."""
        for output in outputs:
            if isinstance(output, CompleteProduce):
                token = self.tokens.pop(output.token, output.token)
                self.completed.append(dataclasses.replace(output, token=token))
            elif isinstance(output, StartFollowing):
                self.fetching_from = output.leader_id
            elif isinstance(output, StopFollowing):
                self.fetching_from = None

    def values(self) -> list[tuple[int, int, bytes]]:
        """(base offset, epoch, batch bytes) along the log."""
        return [
            (h.base_offset, h.partition_leader_epoch, b)
            for h, b in zip(self.log.headers, self.log.batches)
        ]


class Cluster:
    def __init__(self, replicas: tuple[int, ...] = (A, B, C), min_isr: int = 1) -> None:
        self.replicas = replicas
        self.image = MetadataImage()
        for broker_id in replicas:
            self.image.brokers[broker_id] = BrokerRegistration(
                broker_id,
                f"i{broker_id}",
                100 + broker_id,
                "127.0.0.1",
                9_000 + broker_id,
                "",
                False,
                False,
                0,
            )
        self.configs = {"min.insync.replicas": str(min_isr)}
        self.partition_epoch = 0
        self.now_ms = 0
        self.nodes = {b: Node(b, self) for b in replicas}

    def elect(
        self,
        leader: int,
        leader_epoch: int,
        isr: tuple[int, ...],
        to: tuple[int, ...] | None = None,
        *,
        skip_assign: bool = False,
    ) -> PartitionRecord:
        """The controller writes a record; `to` lists the brokers that receive it now."""
        self.partition_epoch += 1
        record = PartitionRecord(
            TOPIC_ID, 0, self.replicas, isr, leader, leader_epoch, self.partition_epoch
        )
        for broker_id in to if to is not None else self.replicas:
            self.deliver(broker_id, record, skip_assign=skip_assign)
        return record

    def deliver(
        self, broker_id: int, record: PartitionRecord, *, skip_assign: bool = False
    ) -> None:
        node = self.nodes[broker_id]
        topic = TopicImage(TOPIC, TOPIC_ID, dict(self.configs), {0: record})
        node.log.forget_epoch_assignments = skip_assign
        try:
            node.handle(node.engine.act_on_partition(topic, record, self.now_ms))
        finally:
            node.log.forget_epoch_assignments = False

    def produce(self, leader: int, value: bytes, *, acks: int = 1, token: object = None) -> int:
        node = self.nodes[leader]
        raw = encode_batch([(0, None, value, ())])
        reply, outputs = node.engine.produce(
            TP, acks, raw, self.now_ms, deadline_ms=self.now_ms + 10_000
        )
        assert reply.error == ErrorCode.NONE, reply
        if reply.token is not None:
            node.tokens[reply.token] = token if token is not None else value
        node.handle(outputs)
        return reply.base_offset

    def fetch(self, follower: int, leader: int | None = None) -> FetchResponse | None:
        """One fetch round trip from `follower` to `leader` (default: whom it follows)."""
        node = self.nodes[follower]
        following = node.fetching_from
        if following is None:
            return None
        position = node.engine.next_fetch(TP, following, self.now_ms)
        if position is None:
            return None
        target = self.nodes[leader if leader is not None else following]
        reply, outputs = target.engine.follower_fetch(
            TP,
            FollowerFetch(
                follower,
                100 + follower,
                position.current_leader_epoch,
                position.fetch_offset,
                position.last_fetched_epoch,
                position.log_start_offset,
            ),
            1 << 20,
            self.now_ms,
        )
        target.handle(outputs)
        response = FetchResponse(
            reply.error,
            reply.high_watermark,
            reply.log_start_offset,
            reply.log_end_offset,
            reply.diverging_epoch,
            reply.records,
        )
        node.handle(node.engine.on_fetch_response(TP, following, position, response, self.now_ms))
        return response

    def settle(self, followers: tuple[int, ...], rounds: int = 6) -> None:
        for _ in range(rounds):
            for follower in followers:
                self.fetch(follower)


# -- KIP-101 -------------------------------------------------------------------------------


def test_kip_101_1_no_hw_truncation_on_restart_keeps_an_acked_write() -> None:
    """KIP-101's first scenario: the follower's HW excludes m2 when it restarts; m2 must survive."""
    cluster = Cluster(replicas=(B, A), min_isr=1)
    cluster.elect(B, 1, (B, A))
    cluster.produce(B, b"m1")
    cluster.settle((A,), rounds=2)
    cluster.produce(B, b"m2", acks=-1, token="m2")
    cluster.fetch(A)  # A gets m2, but the answer carried the HW from before the read
    cluster.fetch(A)  # B's HW moves to 2 on this fetch: m2 is acknowledged
    node_a, node_b = cluster.nodes[A], cluster.nodes[B]
    assert CompleteProduce("m2", ErrorCode.NONE, 1, 0) in node_b.completed
    assert node_a.high_watermark == 1 and node_a.log.leo == 2
    node_a.log.flush(node_a.high_watermark)  # HW checkpoint = 1, data flushed
    node_a.restart(lose_unflushed=False)
    assert node_a.log.leo == 2  # no truncation to the HW on restart (KIP-101)
    cluster.elect(A, 2, (A,), to=(A,))  # B died; A is elected
    assert [v for _, _, v in node_a.values()] == [node_b.log.batches[0], node_b.log.batches[1]]


def test_kip_101_2_divergence_after_both_replicas_crash_is_repaired() -> None:
    """KIP-101's second scenario: B loses its unflushed m2, leads with m3 at 1; A must truncate."""
    cluster = Cluster(replicas=(A, B), min_isr=1)
    cluster.elect(A, 1, (A, B))
    cluster.produce(A, b"m1")
    cluster.settle((B,), rounds=2)
    node_a, node_b = cluster.nodes[A], cluster.nodes[B]
    node_b.log.flush(node_b.high_watermark)  # B flushed m1 only
    cluster.produce(A, b"m2")
    cluster.settle((B,), rounds=3)
    assert node_a.high_watermark == 2 and node_b.log.leo == 2
    node_a.log.flush(2)
    node_a.restart(lose_unflushed=True)
    node_b.restart(lose_unflushed=True)
    assert node_b.log.leo == 1 and node_a.log.leo == 2
    cluster.elect(B, 2, (B,), to=(B,))
    cluster.produce(B, b"m3")
    cluster.elect(B, 2, (B,), to=(A,))
    cluster.settle((A,))
    assert node_a.values() == node_b.values()
    assert [epoch for _, epoch, _ in node_a.values()] == [1, 2]


# -- KIP-279 -------------------------------------------------------------------------------


def _kip_279(skip_assign: bool) -> Cluster:
    """A leads epoch 1 with [0, 1]; B has only 0; B leads epoch 2 and writes 1:e2 alone;
    then A leads epoch 3 with its old log and B returns as a follower (KIP-279's scenario)."""
    cluster = Cluster(replicas=(A, B), min_isr=1)
    cluster.elect(A, 1, (A, B))
    cluster.produce(A, b"a0")
    cluster.settle((B,), rounds=2)
    cluster.produce(A, b"a1")  # never replicated
    cluster.elect(B, 2, (B,), to=(B,))  # A died
    cluster.produce(B, b"b1")  # never replicated
    cluster.elect(A, 3, (A,), to=(A,), skip_assign=skip_assign)  # B died, A is back
    cluster.elect(A, 3, (A,), to=(B,))  # B is back as a follower
    cluster.settle((B,))
    return cluster


def test_kip_279_fast_successive_elections_converge() -> None:
    cluster = _kip_279(skip_assign=False)
    node_a, node_b = cluster.nodes[A], cluster.nodes[B]
    assert node_a.values() == node_b.values()
    assert [epoch for _, epoch, _ in node_b.values()] == [1, 1]
    assert node_b.log.epoch_cache.entries == node_a.log.epoch_cache.entries[:1]


def test_kip_279_without_the_election_entry_the_logs_diverge() -> None:
    """The negative control: skip the AssignEpoch the new leader asked for and B keeps b1."""
    cluster = _kip_279(skip_assign=True)
    assert cluster.nodes[A].values() != cluster.nodes[B].values()


# -- KIP-320 -------------------------------------------------------------------------------


def test_kip_320_fencing_with_stale_and_early_metadata() -> None:
    """KIP-320: C holds back the new epoch; then C knows it before the new leader."""
    cluster = Cluster(min_isr=1)
    cluster.elect(A, 1, (A, B, C))
    cluster.produce(A, b"x")
    cluster.settle((B, C), rounds=2)
    new = cluster.elect(B, 2, (A, B, C), to=(A, B))  # C does not hear of epoch 2 yet
    # C, still in epoch 1, asks its old leader A, which has learned epoch 2: fenced.
    assert cluster.fetch(C).error == ErrorCode.FENCED_LEADER_EPOCH  # type: ignore[union-attr]
    # C's epoch-1 fetch reaching the new leader B is fenced too.
    assert cluster.fetch(C, leader=B) is None  # C stopped fetching until new metadata
    cluster.deliver(C, new)
    newer = cluster.elect(C, 3, (A, B, C), to=(A,))  # only A hears of epoch 3 for now
    cluster.deliver(A, newer)
    # A follows C in epoch 3 but C does not know it leads: UNKNOWN_LEADER_EPOCH, back off.
    response = cluster.fetch(A, leader=C)
    assert response is not None and response.error == ErrorCode.UNKNOWN_LEADER_EPOCH


def test_kip_320_zombie_leader_cannot_commit_or_truncate_others() -> None:
    """KIP-320 and a paused leader: a leader that missed its demotion keeps writing; its HW cannot
    move past what the real ISR holds and a stale answer never truncates a follower."""
    cluster = Cluster(min_isr=2)
    cluster.elect(A, 1, (A, B, C))
    cluster.produce(A, b"x")
    cluster.settle((B, C), rounds=2)
    cluster.elect(B, 2, (B, C), to=(B,))  # A (zombie) and C miss the change for now
    zombie = cluster.nodes[A]
    cluster.produce(A, b"zombie", acks=-1, token="z")
    cluster.settle((C,), rounds=3)  # C still follows A in epoch 1 and copies the write
    assert zombie.high_watermark == 1  # B never fetches from A: the HW is stuck
    assert not [c for c in zombie.completed if c.token == "z"]
    node_c = cluster.nodes[C]
    position = node_c.engine.next_fetch(TP, A, 0)
    assert position is not None and position.current_leader_epoch == 1
    cluster.elect(B, 2, (B, C), to=(A, C))
    # The answer to C's epoch-1 fetch arrives after C moved to epoch 2: dropped, no truncation.
    late = FetchResponse(diverging_epoch=(0, 0))
    assert node_c.engine.on_fetch_response(TP, A, position, late, 0) == []
    assert [c.error for c in zombie.completed if c.token == "z"] == [
        ErrorCode.NOT_LEADER_OR_FOLLOWER
    ]
    cluster.settle((A, C))
    # The zombie's unacknowledged write is gone everywhere; logs agree with the leader.
    assert cluster.nodes[A].values() == cluster.nodes[B].values() == node_c.values()
    assert len(node_c.values()) == 1


def test_min_isr_acks_all_and_isr_shrink() -> None:
    """Jepsen 2013's scenario with m=2: once the ISR shrinks to the leader, acks=all is refused and
    the HW stops, so nothing acknowledged depends on one replica."""
    cluster = Cluster(min_isr=2)
    cluster.elect(A, 1, (A, B, C))
    cluster.produce(A, b"x", acks=-1, token="x")
    cluster.settle((B, C), rounds=2)
    leader = cluster.nodes[A]
    assert [c.error for c in leader.completed] == [ErrorCode.NONE]
    cluster.elect(A, 1, (A,), to=(A, B, C))  # both followers were dropped (partitioned away)
    cluster.produce(A, b"y", acks=1)
    cluster.settle((B, C), rounds=2)
    assert leader.high_watermark == 1  # strict min ISR: y is not committed
    reply, _ = leader.engine.produce(
        TP, -1, encode_batch([(0, None, b"z", ())]), 0, deadline_ms=10_000
    )
    assert getattr(reply, "error", None) == ErrorCode.NOT_ENOUGH_REPLICAS
