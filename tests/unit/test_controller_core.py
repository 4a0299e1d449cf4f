"""ControllerCore scenarios: every control-plane rule, driven without I/O.

Each test feeds commands with explicit `now_ms` and checks replies, records and the image.
Rules: docs/design.md §3.4 (liveness), §6 (placement); docs/protocol.md §9 (AlterPartition),
§15 (registration, new incarnations), §16 (heartbeats, fencing, controlled shutdown), §17
(elections, epochs), §19 (rebalance); docs/design.md §8.8, §8.11 (invariants).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.client.errors import ErrorCode
from minibroker.client.types import NO_LEADER
from minibroker.controller.core.controller import ControllerCore, ControllerSettings
from minibroker.controller.core.election import Election
from minibroker.controller.core.isr import AlterPartitionProposal, IsrMember
from minibroker.controller.core.messages import (
    AlterPartitionRequest,
    CreatableTopic,
    HeartbeatRequest,
    Outcome,
    RegisterRequest,
)
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import (
    BrokerRegistrationChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from minibroker.metadata.wire import entry_from_pb, entry_to_pb, record_from_pb, record_to_pb

CLUSTER = "cluster-A"


class Harness:
    """A core plus a journal of every entry it produced (what the shell would fsync)."""

    def __init__(self, **overrides) -> None:
        base = {"auto_leader_rebalance_enable": False, "session_timeout_ms": 3000}
        base.update(overrides)
        self.settings = ControllerSettings(**base)
        self.now = 1_000_000
        self.core = ControllerCore(self.settings, CLUSTER, random.Random(7), self.now)
        self.log: list = []
        self.events: list = []
        self.epochs: dict[int, int] = {}
        self.streams: dict[int, int] = {}
        self._next_stream = 0

    def take(self, outcome: Outcome):
        self.log.extend(outcome.entries)
        self.events.extend(outcome.events)
        check_invariants(self.core.image)
        return outcome.reply

    def register(self, b: int, incarnation: str | None = None, rack: str = "", cluster=""):
        reply = self.take(
            self.core.register_broker(
                RegisterRequest(b, cluster, incarnation or f"inc-{b}", "127.0.0.1", 9000 + b, rack),
                self.now,
            )
        )
        if reply.error == ErrorCode.NONE:
            self.epochs[b] = reply.broker_epoch
        return reply

    def heartbeat(
        self,
        b: int,
        offset: int | None = None,
        *,
        fence=False,
        shut=False,
        stream=None,
        offline=(),
        epoch=None,
    ):
        if stream is None:
            if b not in self.streams:
                self._next_stream += 1
                self.streams[b] = self._next_stream
            stream = self.streams[b]
        req = HeartbeatRequest(
            b,
            self.epochs.get(b, -1) if epoch is None else epoch,
            self.core.image.next_offset if offset is None else offset,
            fence,
            shut,
            tuple(offline),
        )
        return self.take(self.core.heartbeat(req, stream, self.now))

    def start(self, *brokers: int, racks: dict[int, str] | None = None) -> None:
        for b in brokers:
            assert self.register(b, rack=(racks or {}).get(b, "")).error == ErrorCode.NONE
        for b in brokers:
            assert not self.heartbeat(b).is_fenced

    def close_stream(self, b: int):
        stream = self.streams.pop(b)
        return self.take(self.core.heartbeat_stream_closed(b, self.epochs[b], stream, self.now))

    def tick(self, advance_ms: int = 0):
        self.now += advance_ms
        return self.take(self.core.tick(self.now))

    def create(self, name="t", partitions=1, rf=1, configs=None, validate_only=False):
        (result,) = self.take(
            self.core.create_topics(
                [CreatableTopic(name, partitions, rf, configs or {})], validate_only, self.now
            )
        )
        return result

    def part(self, name="t", index=0) -> PartitionRecord:
        topic = self.core.image.topic(name)
        assert topic is not None
        return topic.partitions[index]

    def alter(self, sender: int, p: PartitionRecord, isr, le=None, pe=None, epochs=None):
        prop = AlterPartitionProposal(
            p.topic_id,
            p.partition,
            p.leader_epoch if le is None else le,
            p.partition_epoch if pe is None else pe,
            tuple(IsrMember(b, (epochs or {}).get(b, -1)) for b in isr),
        )
        reply = self.take(
            self.core.alter_partition(
                AlterPartitionRequest(sender, self.epochs[sender], (prop,)), self.now
            )
        )
        return reply.results[0]

    def event_names(self) -> list[str]:
        return [e.name for e in self.events]


def check_invariants(image: MetadataImage) -> None:
    """I11: ISR non-empty subset of replicas, leader in ISR; no fenced or shutting-down broker
    in an ISR except as the last member kept while the partition is offline."""
    for _, p in image.partitions():
        assert p.isr, p
        assert set(p.isr) <= set(p.replicas), p
        assert len(set(p.replicas)) == len(p.replicas), p
        if p.leader != NO_LEADER:
            assert p.leader in p.isr, p
            assert image.is_active(p.leader), p
            for b in p.isr:
                assert image.is_active(b), (p, b)
        else:
            inactive = [b for b in p.isr if not image.is_active(b)]
            assert len(inactive) <= 1, p


def replay(entries) -> MetadataImage:
    """What a restarted controller rebuilds: every entry through the wire form, in order."""
    image = MetadataImage()
    for e in entries:
        image.apply(entry_from_pb(entry_to_pb(e)))
    return image


# -- registration and heartbeats ----------------------------------------------------------


def test_broker_registers_fenced_with_epoch_equal_to_record_offset():
    h = Harness()
    h.tick()
    reply = h.register(1)
    assert reply.error == ErrorCode.NONE and reply.cluster_id == CLUSTER
    (entry,) = h.log
    assert isinstance(entry.record, RegisterBrokerRecord)
    assert reply.broker_epoch == entry.offset == entry.record.broker_epoch
    assert h.core.image.brokers[1].fenced


def test_unfenced_only_once_caught_up_with_its_registration():
    h = Harness()
    h.register(1)
    h.register(2)
    epoch1 = h.epochs[1]
    behind = h.heartbeat(1, offset=epoch1 - 1)
    assert behind.is_fenced and not behind.is_caught_up
    wants_fence = h.heartbeat(1, offset=epoch1, fence=True)
    assert wants_fence.is_fenced and wants_fence.is_caught_up
    ok = h.heartbeat(1, offset=epoch1)
    assert not ok.is_fenced and ok.is_caught_up
    assert "broker_unfenced" in h.event_names()
    assert not h.core.image.brokers[1].fenced


def test_inconsistent_cluster_id_is_refused_naming_both_ids():
    h = Harness()
    reply = h.register(1, cluster="other-cluster")
    assert reply.error == ErrorCode.INCONSISTENT_CLUSTER_ID
    assert "other-cluster" in reply.message and CLUSTER in reply.message
    assert h.log == []
    assert h.register(1, cluster=CLUSTER).error == ErrorCode.NONE


def test_duplicate_registration_while_session_alive():
    h = Harness()
    h.start(1)
    h.now += 1000
    dup = h.register(1, incarnation="second")
    assert dup.error == ErrorCode.DUPLICATE_BROKER_REGISTRATION
    # After the session times out (no stream traffic) the new incarnation is accepted.
    h.now += 2001
    assert h.register(1, incarnation="second").error == ErrorCode.NONE


def test_new_incarnation_accepted_once_stream_closed_and_leaves_every_isr():
    h = Harness()
    h.start(1, 2)
    h.create("t", 2, 2)
    old_epoch = h.epochs[1]
    h.close_stream(1)
    reply = h.register(1, incarnation="restarted")
    assert reply.error == ErrorCode.NONE and reply.broker_epoch > old_epoch
    for i in (0, 1):
        p = h.part("t", i)
        assert 1 not in p.isr and p.leader == 2
    # A heartbeat with the old epoch is stale.
    h.epochs[1] = old_epoch
    assert h.heartbeat(1).error == ErrorCode.STALE_BROKER_EPOCH


def test_new_incarnation_of_a_live_but_timed_out_broker_removes_it_from_isr():
    h = Harness()
    h.start(1, 2)
    h.create("t", 1, 2)
    h.now += 5000  # no heartbeats, but the timeout tick has not run yet
    assert h.register(1, incarnation="again").error == ErrorCode.NONE
    p = h.part()
    assert p.isr == (2,) and p.leader == 2


def test_same_incarnation_re_registering_gets_same_epoch_without_a_record():
    h = Harness()
    h.register(1)
    n = len(h.log)
    again = h.register(1)
    assert again.broker_epoch == h.epochs[1] and len(h.log) == n


def test_unknown_broker_heartbeat():
    h = Harness()
    h.epochs[9] = 0
    assert h.heartbeat(9).error == ErrorCode.BROKER_ID_NOT_REGISTERED


# -- fencing -------------------------------------------------------------------------------


def test_fenced_by_session_timeout_one_per_tick_oldest_first():
    h = Harness()
    h.start(1, 2, 3)
    h.now += 1000
    h.heartbeat(3)
    h.now += 500
    h.heartbeat(2)
    h.tick(2600)  # 1 silent for 4100 ms, 3 for 3100, 2 for 2600
    assert h.core.image.brokers[1].fenced and not h.core.image.brokers[3].fenced
    h.tick()
    assert h.core.image.brokers[3].fenced and not h.core.image.brokers[2].fenced
    h.tick()
    assert not h.core.image.brokers[2].fenced
    fenced = [e for e in h.events if e.name == "broker_fenced"]
    assert [e.fields["broker_id"] for e in fenced] == [1, 3]
    assert "session timed out" in fenced[0].fields["reason"]


def test_heartbeats_keep_the_session_alive():
    h = Harness()
    h.start(1)
    for _ in range(10):
        h.now += 1000
        h.heartbeat(1)
        h.tick()
    assert not h.core.image.brokers[1].fenced


def test_stream_break_fences_at_once_and_moves_leadership():
    h = Harness()
    h.start(1, 2, 3)
    h.create("t", 3, 3)
    led_by_1 = [i for i in range(3) if h.part("t", i).leader == 1]
    assert led_by_1
    before = {i: h.part("t", i) for i in range(3)}
    h.close_stream(1)
    assert h.core.image.brokers[1].fenced
    for i in range(3):
        p = h.part("t", i)
        assert 1 not in p.isr
        assert p.partition_epoch == before[i].partition_epoch + 1
        if i in led_by_1:
            assert p.leader != 1 and p.leader_epoch == before[i].leader_epoch + 1
            assert p.leader == next(b for b in p.replicas if b != 1)  # assignment order
        else:
            assert p.leader_epoch == before[i].leader_epoch
    fence = next(e for e in h.events if e.name == "broker_fenced")
    assert fence.fields["reason"] == "heartbeat stream closed"
    assert any(e.name == "leader_elected" for e in h.events)


def test_stale_stream_close_is_ignored():
    h = Harness()
    h.start(1)
    old_stream = h.streams[1]
    h.heartbeat(1, stream=old_stream + 100)  # the broker reconnected its stream
    h.streams[1] = old_stream
    h.close_stream(1)
    assert not h.core.image.brokers[1].fenced


def test_fencing_the_last_isr_member_makes_partition_offline_and_it_returns():
    h = Harness()
    h.start(1, 2)
    h.create("t", 1, 2)
    p0 = h.part()
    leader, follower = p0.leader, next(b for b in p0.replicas if b != p0.leader)
    h.close_stream(follower)
    assert h.part().isr == (leader,)
    h.close_stream(leader)
    p = h.part()
    assert p.leader == NO_LEADER and p.isr == (leader,)
    assert "partition_offline" in h.event_names()
    assert h.core.image.offline_partition_count() == 1
    # The out-of-sync follower coming back does not lead (unclean is off).
    h.register(follower, incarnation="f2")
    h.heartbeat(follower)
    assert h.part().leader == NO_LEADER
    # The last ISR member coming back leads again, in a new epoch.
    h.register(leader, incarnation="l2")
    h.heartbeat(leader)
    p2 = h.part()
    assert p2.leader == leader and p2.leader_epoch == p.leader_epoch + 1


def test_unclean_election_when_topic_enables_it():
    h = Harness()
    h.start(1, 2)
    h.create("t", 1, 2, {"unclean.leader.election.enable": "true"})
    p0 = h.part()
    leader, follower = p0.leader, next(b for b in p0.replicas if b != p0.leader)
    h.alter(leader, p0, [leader])  # the follower fell behind
    h.close_stream(leader)
    p = h.part()
    assert p.leader == follower and p.isr == (follower,) and p.leader_recovery_state == 1
    unclean = [e for e in h.events if e.name == "unclean_leader_elected"]
    assert len(unclean) == 1 and unclean[0].fields["new_leader"] == follower


def test_unclean_broker_default_applies_to_topics_without_the_config():
    h = Harness(topic_defaults={"unclean.leader.election.enable": True})
    h.start(1, 2)
    h.create("t", 1, 2)
    p0 = h.part()
    h.alter(p0.leader, p0, [p0.leader])
    h.close_stream(p0.leader)
    assert h.part().leader not in (NO_LEADER, p0.leader)


# -- controlled shutdown -------------------------------------------------------------------


def test_controlled_shutdown_moves_leaderships_then_grants_after_peers_caught_up():
    h = Harness()
    h.start(1, 2, 3)
    h.create("t", 6, 3)
    assert any(h.part("t", i).leader == 2 for i in range(6))
    peers_offset = h.core.image.next_offset
    first = h.heartbeat(2, shut=True)
    assert not first.should_shut_down  # peers have not seen the leader moves yet
    assert h.core.image.brokers[2].in_controlled_shutdown
    for i in range(6):
        p = h.part("t", i)
        assert p.leader != 2 and 2 not in p.isr
    assert peers_offset < h.core.image.next_offset
    h.heartbeat(1)
    assert not h.heartbeat(2, shut=True).should_shut_down
    h.heartbeat(3)
    assert h.heartbeat(2, shut=True).should_shut_down
    # After the grant, the stream ending is expected: fenced as a completed shutdown.
    h.close_stream(2)
    fence = [e for e in h.events if e.name == "broker_fenced"][-1]
    assert fence.fields["reason"] == "controlled shutdown complete"
    # A shutting-down broker may not rejoin an ISR.
    p = h.part("t", 0)
    res = h.alter(p.leader, p, [*p.isr, 2])
    assert res.error == ErrorCode.INELIGIBLE_REPLICA


def test_controlled_shutdown_of_sole_replica_leaves_partition_offline_and_grants():
    h = Harness()
    h.start(1)
    h.create("t", 1, 1)
    reply = h.heartbeat(1, shut=True)
    assert reply.should_shut_down
    p = h.part()
    assert p.leader == NO_LEADER and p.isr == (1,)


def test_fenced_broker_asking_to_shut_down_may_go_at_once():
    h = Harness()
    h.register(1)
    assert h.heartbeat(1, offset=-1, shut=True).should_shut_down


# -- offline log dirs (Kafka's OfflineLogDirs, KIP-858) -------------------------------------
#
# A broker whose only log dir failed reports it in its next heartbeat. The controller fences it
# at once (no session timeout): it leaves every ISR (never emptying one) and its leaderships move
# to in-sync replicas, so acknowledged acks=all writes stay readable. The report is untrusted:
# it speaks only for the sender, whose broker epoch must be current, and a malformed one is
# refused without any change.


def test_offline_log_dir_fences_the_broker_and_moves_its_leaderships_to_isr_members():
    h = Harness()
    h.start(1, 2, 3)
    h.create("t", 6, 3)
    led_by_1 = [i for i in range(6) if h.part("t", i).leader == 1]
    assert led_by_1
    before = {i: h.part("t", i) for i in range(6)}
    reply = h.heartbeat(1, offline=["/data/broker-1"])
    assert reply.error == ErrorCode.NONE and reply.is_fenced
    assert h.core.image.brokers[1].fenced
    for i in range(6):
        p = h.part("t", i)
        assert 1 not in p.isr and p.partition_epoch == before[i].partition_epoch + 1
        if i in led_by_1:
            assert p.leader in before[i].isr and p.leader != 1
            assert p.leader_epoch == before[i].leader_epoch + 1
            assert "log dir /data/broker-1 offline" in p.reason
        else:
            assert p.leader == before[i].leader and p.leader_epoch == before[i].leader_epoch
    offline = next(e for e in h.events if e.name == "log_dir_offline")
    assert offline.fields == {
        "broker_id": 1,
        "broker_epoch": h.epochs[1],
        "log_dirs": ["/data/broker-1"],
    }
    fence = next(e for e in h.events if e.name == "broker_fenced")
    assert fence.fields["reason"] == "log dir /data/broker-1 offline"
    # Replayed by a restarted controller, the log gives the same image (the fence is durable).
    assert replay(h.log).brokers[1].fenced


def test_offline_log_dir_of_the_last_isr_member_leaves_the_partition_offline_not_unclean():
    h = Harness()
    h.start(1, 2)
    h.create("t", 1, 2)
    p0 = h.part()
    leader = p0.leader
    h.alter(leader, p0, [leader])  # the follower fell behind: the leader alone has every write
    h.heartbeat(leader, offline=["/data/leader"])
    p = h.part()
    # No out-of-sync replica leads (unclean is off): the partition waits for its last ISR member.
    assert p.leader == NO_LEADER and p.isr == (leader,)


def test_broker_with_an_offline_log_dir_stays_fenced_for_the_rest_of_its_session():
    h = Harness()
    h.start(1, 2)
    h.heartbeat(1, offline=["/data/broker-1"])
    n = len(h.log)
    for _ in range(3):
        h.now += 100
        # Caught up, not asking to be fenced, and even without the report: it stays fenced.
        assert h.heartbeat(1).is_fenced
        assert h.heartbeat(1, offline=["/data/broker-1"]).is_fenced
    assert h.core.image.brokers[1].fenced and len(h.log) == n
    assert h.event_names().count("log_dir_offline") == 1
    # Its stream ending (the broker exits) changes nothing more.
    h.close_stream(1)
    assert len(h.log) == n
    # A restart is a new incarnation: once caught up it is unfenced again.
    h.register(1, incarnation="restarted")
    assert not h.heartbeat(1).is_fenced


def test_offline_log_dir_with_a_stale_broker_epoch_is_ignored():
    h = Harness()
    h.start(1, 2)
    h.create("t", 2, 2)
    old_epoch = h.epochs[1]
    h.close_stream(1)
    h.register(1, incarnation="restarted")
    h.heartbeat(1)
    before = [h.part("t", i) for i in range(2)]
    n = len(h.log)
    reply = h.heartbeat(1, offline=["/data/broker-1"], epoch=old_epoch, stream=99)
    assert reply.error == ErrorCode.STALE_BROKER_EPOCH
    assert not h.core.image.brokers[1].fenced and len(h.log) == n
    assert [h.part("t", i) for i in range(2)] == before
    assert "log_dir_offline" not in h.event_names()
    # The current incarnation is not marked either: its next heartbeat keeps it unfenced.
    assert not h.heartbeat(1).is_fenced


def test_offline_log_dir_report_speaks_only_for_the_sender():
    h = Harness()
    h.start(1, 2, 3)
    h.create("t", 3, 3)
    h.heartbeat(2, offline=["/data/broker-1"])  # a path that is not its own changes nothing else
    assert h.core.image.brokers[2].fenced
    assert not h.core.image.brokers[1].fenced and not h.core.image.brokers[3].fenced
    for i in range(3):
        assert {1, 3} <= set(h.part("t", i).isr)


@pytest.mark.parametrize(
    ("dirs", "needle"),
    [
        (["/a", "/b"], "reports 2 offline log dirs"),
        ([""], "empty path"),
        (["/" + "x" * 4096], "4097 bytes"),
    ],
)
def test_malformed_offline_log_dir_report_is_refused_and_changes_nothing(dirs, needle):
    h = Harness()
    h.start(1, 2)
    h.create("t", 1, 2)
    before = h.part()
    n = len(h.log)
    reply = h.heartbeat(1, offline=dirs)
    assert reply.error == ErrorCode.INVALID_REQUEST and needle in reply.message
    assert len(h.log) == n and h.part() == before
    assert not h.core.image.brokers[1].fenced
    assert not h.heartbeat(1).is_fenced  # nothing was remembered either


def test_offline_log_dir_during_controlled_shutdown_fences_at_once():
    h = Harness()
    h.start(1, 2, 3)
    h.create("t", 3, 3)
    h.heartbeat(1, shut=True)
    assert h.core.image.brokers[1].in_controlled_shutdown
    h.heartbeat(1, shut=True, offline=["/data/broker-1"])
    assert h.core.image.brokers[1].fenced
    assert h.heartbeat(1, shut=True, offline=["/data/broker-1"]).should_shut_down


# -- topics --------------------------------------------------------------------------------


def test_create_topic_writes_topic_and_partitions_with_epoch_zero():
    h = Harness()
    h.start(1, 2, 3)
    n = len(h.log)
    result = h.create("orders", 6, 3, {"min.insync.replicas": "2"})
    assert result.error == ErrorCode.NONE and result.topic_id
    assert result.configs["min.insync.replicas"] == "2"
    assert result.configs["unclean.leader.election.enable"] == "false"
    new = h.log[n:]
    assert isinstance(new[0].record, TopicRecord)
    assert dict(new[0].record.configs) == {"min.insync.replicas": "2"}
    parts = [e.record for e in new[1:]]
    assert [p.partition for p in parts] == list(range(6))
    for p in parts:
        assert p.leader == p.replicas[0] and p.isr == p.replicas
        assert (p.leader_epoch, p.partition_epoch) == (0, 0)
    assert sorted(p.leader for p in parts) == [1, 1, 2, 2, 3, 3]


def test_create_topic_defaults_from_settings():
    h = Harness(num_partitions=3, default_replication_factor=2)
    h.start(1, 2)
    result = h.create("d", -1, -1)
    assert (result.num_partitions, result.replication_factor) == (3, 2)


@pytest.mark.parametrize(
    ("name", "partitions", "rf", "configs", "code", "needle"),
    [
        ("bad name", 1, 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "illegal"),
        ("x" * 250, 1, 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "249"),
        ("..", 1, 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, ".."),
        ("ok", 0, 1, {}, ErrorCode.INVALID_PARTITIONS, "at least 1"),
        ("ok", -5, 1, {}, ErrorCode.INVALID_PARTITIONS, "-5"),
        ("ok", 1, 0, {}, ErrorCode.INVALID_REPLICATION_FACTOR, "at least 1"),
        ("ok", 1, 3, {}, ErrorCode.INVALID_REPLICATION_FACTOR, "2"),
        ("ok", 1, 1, {"no.such.config": "1"}, ErrorCode.INVALID_CONFIG, "no.such.config"),
        ("ok", 1, 1, {"min.insync.replicas": "zero"}, ErrorCode.INVALID_CONFIG, "min.insync"),
        ("ok", 1, 1, {"cleanup.policy": "compactt"}, ErrorCode.INVALID_CONFIG, "cleanup.policy"),
    ],
)
def test_create_topic_validation(name, partitions, rf, configs, code, needle):
    h = Harness()
    h.start(1, 2)
    n = len(h.log)
    result = h.create(name, partitions, rf, configs)
    assert result.error == code
    assert needle in result.message
    assert len(h.log) == n and h.core.image.topic(name) is None


def test_fenced_brokers_do_not_count_for_replication_factor():
    h = Harness()
    h.start(1, 2)
    h.register(3)  # registered, still fenced
    assert h.create("t", 1, 3).error == ErrorCode.INVALID_REPLICATION_FACTOR


def test_create_existing_duplicate_and_colliding_names():
    h = Harness()
    h.start(1)
    assert h.create("a.b").error == ErrorCode.NONE
    assert h.create("a.b").error == ErrorCode.TOPIC_ALREADY_EXISTS
    assert h.create("a_b").error == ErrorCode.INVALID_TOPIC_EXCEPTION
    results = h.take(
        h.core.create_topics(
            [CreatableTopic("dup", 1, 1), CreatableTopic("dup", 1, 1), CreatableTopic("z", 1, 1)],
            False,
            h.now,
        )
    )
    assert [r.error for r in results] == [
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.NONE,
    ]
    assert h.core.image.topic("dup") is None and h.core.image.topic("z") is not None


def test_validate_only_writes_nothing():
    h = Harness()
    h.start(1)
    n = len(h.log)
    result = h.create("v", 2, 1, validate_only=True)
    assert result.error == ErrorCode.NONE and result.num_partitions == 2
    assert len(h.log) == n and h.core.image.topic("v") is None


def test_delete_topics():
    h = Harness()
    h.start(1)
    created = h.create("gone", 2, 1)
    results = h.take(h.core.delete_topics(["gone", "never"], h.now))
    assert results[0].error == ErrorCode.NONE and results[0].topic_id == created.topic_id
    assert results[1].error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert h.core.image.topic("gone") is None
    again = h.create("gone", 1, 1)
    assert again.error == ErrorCode.NONE and again.topic_id != created.topic_id


# -- AlterPartition ------------------------------------------------------------------------


def test_alter_partition_shrink_and_expand_bump_partition_epoch_only():
    h = Harness()
    h.start(1, 2, 3)
    h.create("t", 1, 3)
    p = h.part()
    shrunk = h.alter(p.leader, p, [b for b in p.isr if b != p.replicas[2]])
    assert shrunk.error == ErrorCode.NONE
    assert shrunk.record.partition_epoch == p.partition_epoch + 1
    assert shrunk.record.leader_epoch == p.leader_epoch
    grown = h.alter(p.leader, shrunk.record, list(p.replicas))
    assert grown.error == ErrorCode.NONE and set(grown.record.isr) == set(p.replicas)
    assert [n for n in h.event_names() if n.startswith("isr_")] == ["isr_shrink", "isr_expand"]


def test_two_alter_partitions_on_the_same_partition_epoch():
    """The compare-and-set: only the first of two proposals made at one epoch applies."""
    h = Harness()
    h.start(1, 2, 3)
    h.create("t", 1, 3)
    p = h.part()
    first = h.alter(p.leader, p, [p.leader, p.replicas[1]])
    assert first.error == ErrorCode.NONE
    after_first = h.part()
    second = h.alter(p.leader, p, [p.leader, p.replicas[2]])
    assert second.error == ErrorCode.INVALID_UPDATE_VERSION
    assert h.part() == after_first


def test_alter_partition_identical_isr_is_a_noop():
    h = Harness()
    h.start(1, 2)
    h.create("t", 1, 2)
    p = h.part()
    n = len(h.log)
    res = h.alter(p.leader, p, list(reversed(p.isr)))
    assert res.error == ErrorCode.NONE and res.record == p and len(h.log) == n


def test_alter_partition_from_old_leader_after_fencing_is_fenced():
    """Fencing during an election: the deposed leader's in-flight proposal must not apply."""
    h = Harness()
    h.start(1, 2, 3)
    h.create("t", 1, 3)
    p = h.part()
    old_leader = p.leader
    h.heartbeat(old_leader, fence=True)  # fenced: leadership moves, leader epoch bumps
    new = h.part()
    assert new.leader != old_leader
    res = h.alter(old_leader, p, list(p.isr))
    assert res.error == ErrorCode.FENCED_LEADER_EPOCH
    assert h.part() == new


def test_alter_partition_adding_a_broker_fenced_meanwhile_is_ineligible():
    h = Harness()
    h.start(1, 2, 3)
    h.create("t", 1, 3)
    p = h.part()
    dropped = p.replicas[2]
    shrunk = h.alter(p.leader, p, [b for b in p.isr if b != dropped]).record
    h.close_stream(dropped)
    res = h.alter(p.leader, shrunk, [*shrunk.isr, dropped])
    assert res.error == ErrorCode.INELIGIBLE_REPLICA
    assert h.part() == shrunk


def test_alter_partition_stale_broker_epoch_and_non_leader():
    h = Harness()
    h.start(1, 2)
    h.create("t", 1, 2)
    p = h.part()
    follower = next(b for b in p.replicas if b != p.leader)
    assert h.alter(follower, p, list(p.isr)).error == ErrorCode.NOT_LEADER_OR_FOLLOWER
    h.epochs[p.leader] -= 1
    assert h.alter(p.leader, p, list(p.isr)).error == ErrorCode.STALE_BROKER_EPOCH


# -- elections on demand and rebalance -----------------------------------------------------


def _move_leader_away(h: Harness, name="t", index=0) -> PartitionRecord:
    p = h.part(name, index)
    h.heartbeat(p.leader, fence=True)
    h.heartbeat(p.replicas[0])  # unfence again (caught up)
    q = h.part(name, index)
    res = h.alter(q.leader, q, list(q.replicas))  # the preferred replica rejoins the ISR
    assert res.error == ErrorCode.NONE
    return h.part(name, index)


def test_preferred_election():
    h = Harness()
    h.start(1, 2, 3)
    h.create("t", 1, 3)
    results = h.take(h.core.elect_leaders(Election.PREFERRED, [("t", 0), ("nope", 0)], h.now))
    assert [r.error for r in results] == [
        ErrorCode.ELECTION_NOT_NEEDED,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ]
    moved = _move_leader_away(h)
    assert moved.leader != moved.replicas[0]
    (res,) = h.take(h.core.elect_leaders(Election.PREFERRED, None, h.now))
    assert res.error == ErrorCode.NONE
    p = h.part()
    assert p.leader == p.replicas[0] and p.leader_epoch == moved.leader_epoch + 1


def test_preferred_election_not_available_when_preferred_out_of_isr():
    h = Harness()
    h.start(1, 2)
    h.create("t", 1, 2)
    p = h.part()
    h.heartbeat(p.leader, fence=True)
    h.heartbeat(p.replicas[0])  # back and unfenced, but not in the ISR
    (res,) = h.take(h.core.elect_leaders(Election.PREFERRED, [("t", 0)], h.now))
    assert res.error == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE


def test_manual_unclean_election():
    h = Harness()
    h.start(1, 2)
    h.create("t", 1, 2)
    p = h.part()
    leader, follower = p.leader, next(b for b in p.replicas if b != p.leader)
    (res,) = h.take(h.core.elect_leaders(Election.UNCLEAN, [("t", 0)], h.now))
    assert res.error == ErrorCode.ELECTION_NOT_NEEDED
    h.alter(leader, p, [leader])
    h.close_stream(leader)
    assert h.part().leader == NO_LEADER
    (res,) = h.take(h.core.elect_leaders(Election.UNCLEAN, [("t", 0)], h.now))
    assert res.error == ErrorCode.NONE
    assert h.part().leader == follower
    assert "unclean_leader_elected" in h.event_names()
    h.close_stream(follower)
    (res,) = h.take(h.core.elect_leaders(Election.UNCLEAN, [("t", 0)], h.now))
    assert res.error == ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE


def test_automatic_rebalance_after_interval():
    """I16: after a run, leader = preferred wherever the preferred replica is acceptable and
    in the ISR."""
    h = Harness(auto_leader_rebalance_enable=True, leader_imbalance_check_interval_ms=30_000)
    h.start(1, 2, 3)
    h.create("t", 3, 3)
    _move_leader_away(h, "t", 0)
    assert h.core.image.preferred_imbalance_count() == 1
    h.tick(1000)
    assert h.core.image.preferred_imbalance_count() == 1  # not yet due
    for b in (1, 2, 3):
        h.heartbeat(b)
    h.now += 30_000
    for b in (1, 2, 3):
        h.heartbeat(b)
    h.tick()
    assert h.core.image.preferred_imbalance_count() == 0
    reasons = {e.fields["reason"] for e in h.events if e.name == "leader_elected"}
    assert "automatic preferred leader rebalance" in reasons


# -- producer ids and durability -----------------------------------------------------------


def test_producer_id_blocks_never_overlap_across_replay():
    h = Harness()
    h.start(1)
    a = h.take(h.core.allocate_producer_ids(1, h.epochs[1], h.now))
    b = h.take(h.core.allocate_producer_ids(1, h.epochs[1], h.now))
    assert (a.producer_id_start, a.producer_id_len, b.producer_id_start) == (0, 1000, 1000)
    restarted = ControllerCore(h.settings, CLUSTER, random.Random(1), h.now, replay(h.log))
    c = restarted.allocate_producer_ids(1, h.epochs[1], h.now).reply
    assert c.producer_id_start == 2000
    stale = restarted.allocate_producer_ids(1, h.epochs[1] - 1, h.now).reply
    assert stale.error == ErrorCode.STALE_BROKER_EPOCH


def test_replayed_log_and_snapshot_rebuild_the_same_image():
    h = Harness()
    h.start(1, 2, 3)
    h.create("a", 3, 3)
    h.create("b", 2, 2, {"retention.ms": "1000"})
    h.heartbeat(2, shut=True)
    h.close_stream(3)
    h.take(h.core.delete_topics(["b"], h.now))
    image = replay(h.log)
    assert image == h.core.image
    snap = MetadataImage()
    snap.replace_with_snapshot(
        [record_from_pb(record_to_pb(r)) for r in h.core.image.to_records()],
        h.core.image.next_offset,
    )
    assert snap == h.core.image
    assert snap.brokers[2].in_controlled_shutdown and snap.brokers[3].fenced


def test_restarted_core_times_out_brokers_that_never_come_back():
    h = Harness()
    h.start(1, 2)
    core = ControllerCore(h.settings, CLUSTER, random.Random(1), h.now, replay(h.log))
    assert not core.tick(h.now + 2000).entries
    out = core.tick(h.now + 3001)
    assert any(
        isinstance(e.record, BrokerRegistrationChangeRecord) and e.record.fenced
        for e in out.entries
    )


def test_describe_cluster():
    h = Harness(node_id=1000)
    h.start(1, 2)
    h.now += 250
    desc = h.core.describe_cluster(h.now)
    assert desc.cluster_id == CLUSTER and desc.controller_id == 1000
    assert desc.metadata_offset == h.core.image.next_offset
    assert [b.registration.broker_id for b in desc.brokers] == [1, 2]
    assert all(b.last_heartbeat_ms_ago == 250 for b in desc.brokers)


# -- random command sequences -------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(1, 4), st.integers(0, 5)), max_size=60))
def test_random_command_sequences_keep_invariants(commands):
    """I7 and I11 under any interleaving of registration, heartbeats, stream breaks, timeouts,
    shutdowns, offline log dirs, ISR changes and elections; the replayed log always equals the
    live image."""
    h = Harness(auto_leader_rebalance_enable=True, leader_imbalance_check_interval_ms=5000)
    h.start(1, 2, 3, 4)
    h.create("t", 4, 3)
    h.create("u", 2, 2, {"unclean.leader.election.enable": "true"})
    last: dict[tuple[str, int], tuple[int, int]] = {}
    for op, b, x in commands:
        if op == 0:
            h.close_stream(b) if b in h.streams else h.tick(x * 1000)
        elif op == 1:
            h.register(b, incarnation=f"inc-{b}-{len(h.log)}")
        elif op == 2:
            if b in h.epochs:
                offline = [f"/data/broker-{b}"] if x == 2 else []
                h.heartbeat(b, shut=x == 0, fence=x == 1, offline=offline)
        elif op == 3:
            h.tick(x * 700)
        elif op == 4:
            for _, p in list(h.core.image.partitions()):
                if p.leader != NO_LEADER and p.leader in h.epochs:
                    isr = list(p.replicas[: x % 4]) or [p.leader]
                    if p.leader not in isr:
                        isr.append(p.leader)
                    h.alter(p.leader, p, isr)
                    break
        elif op == 5:
            kind = Election.PREFERRED if x % 2 else Election.UNCLEAN
            h.take(h.core.elect_leaders(kind, None, h.now))
        elif op == 6:
            h.now += x * 400
            for broker in list(h.epochs):
                h.heartbeat(broker)
        elif op == 7:
            h.create(f"n{len(h.log)}", x + 1, 1 + b % 3)
        else:
            h.take(h.core.delete_topics([f"n{x}"], h.now))
        for topic, p in h.core.image.partitions():
            key = (topic.topic_id, p.partition)
            if key in last:
                le, pe = last[key]
                assert p.leader_epoch >= le and p.partition_epoch >= pe
                assert (p.leader_epoch > le) <= (p.partition_epoch > pe)
            last[key] = (p.leader_epoch, p.partition_epoch)
    assert replay(h.log) == h.core.image
    offsets = [e.offset for e in h.log]
    assert offsets == list(range(len(offsets)))
