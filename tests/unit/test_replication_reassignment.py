"""The broker's side of moving replicas (issue 14, KIP-455) and of live topic configs, over the
simulation's MemLog: the replica engine's decisions, no event loop, no files.

  * a broker newly named in `replicas` (adding) creates an empty log and follows the leader,
    from the leader's log start (an OFFSET_OUT_OF_RANGE answer at 0 restarts it there);
  * the leader tracks every member of `replicas` (adding ones too) as a remote replica, shows
    its progress (DescribeReplicas) and lets it join the ISR by the ordinary rule;
  * a broker no longer named stops fetching and deletes its log only once a record no longer
    names it (never while it is a removing replica); removed then re-added gets a fresh log;
    a log found on disk for a partition that no longer names this broker goes at startup;
  * a ConfigRecord for a topic takes effect at once (min.insync.replicas, max.message.bytes,
    message.timestamp.type, and the log's own configs through LogConfigChanged);
  * KIP-73 throttles: rates from the broker configs, lists from the topic configs, the leader
    withholding records from throttled out-of-sync followers over its quota, the follower
    recording what it fetched for throttled partitions.
"""

from __future__ import annotations

from typing import Any

from memlog import MemLog

from minibroker.broker.replication.engine import BrokerReplicas
from minibroker.broker.replication.events import FetchResponse, FollowerFetch, Role
from minibroker.broker.replication.outputs import (
    EngineConfig,
    FetchReply,
    LogConfigChanged,
    Output,
    ReplicaRemoved,
    SendAlterPartition,
    StartFollowing,
    StopFollowing,
    Truncated,
)
from minibroker.client.errors import ErrorCode
from minibroker.client.records import encode_batch
from minibroker.client.replication_throttle import (
    FOLLOWER_THROTTLED_RATE,
    FOLLOWER_THROTTLED_REPLICAS,
    LEADER_THROTTLED_RATE,
    LEADER_THROTTLED_REPLICAS,
    UNTHROTTLED,
)
from minibroker.client.types import TopicPartition
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import (
    CONFIG_RESOURCE_BROKER,
    ConfigRecord,
    LogEntry,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)

ME, B2, B3, B4 = 1, 2, 3, 4
TOPIC, TOPIC_ID = "events", "id-events"
TP = TopicPartition(TOPIC, 0)
NOW = 1_000_000


class Broker:
    """One broker's engine with its metadata image and logs; `deleted` holds the logs the
    shell deleted (ReplicaRemoved with delete)."""

    def __init__(self, broker_id: int = ME, **config: Any) -> None:
        self.id = broker_id
        self.image = MetadataImage()
        self.engine: BrokerReplicas[MemLog] = BrokerReplicas(
            EngineConfig(broker_id=broker_id, log_dir="/data", **config), self.image
        )
        self.logs: dict[TopicPartition, MemLog] = {}
        self.deleted: list[MemLog] = []
        self.offset = 0

    def record(self, record: Any) -> None:
        self.image.apply(LogEntry(self.offset, 0, record))
        self.offset += 1

    def act(self) -> list[Output]:
        new, out = self.engine.act_on_metadata(NOW)
        self._carry_out(out)
        for topic, record in new:
            tp = TopicPartition(topic.name, record.partition)
            log = self.logs.setdefault(tp, MemLog())
            self.engine.host(tp, topic.topic_id, log, dict(topic.configs), high_watermark=0)
            more = self.engine.act_on_partition(topic, record, NOW)
            self._carry_out(more)
            out += more
        return out

    def _carry_out(self, out: list[Output]) -> None:
        for o in out:
            if isinstance(o, ReplicaRemoved) and o.delete:
                self.deleted.append(self.logs.pop(o.tp))


class Cluster:
    """The same metadata records applied to several brokers' engines."""

    def __init__(self, *ids: int, **config: Any) -> None:
        self.brokers = {b: Broker(b, **config) for b in ids}
        for b in (ME, B2, B3, B4):
            self.record(RegisterBrokerRecord(b, f"inc-{b}", 100 + b, "h", 9000 + b, "", False))

    def __getitem__(self, broker_id: int) -> Broker:
        return self.brokers[broker_id]

    def record(self, record: Any) -> None:
        for broker in self.brokers.values():
            broker.record(record)

    def act(self) -> dict[int, list[Output]]:
        return {b: broker.act() for b, broker in self.brokers.items()}

    def partition(
        self,
        replicas: tuple[int, ...],
        isr: tuple[int, ...],
        leader: int,
        epoch: int,
        adding: tuple[int, ...] = (),
        removing: tuple[int, ...] = (),
        leader_epoch: int | None = None,
    ) -> dict[int, list[Output]]:
        self.record(
            PartitionRecord(
                TOPIC_ID,
                0,
                replicas,
                isr,
                leader,
                epoch if leader_epoch is None else leader_epoch,
                epoch,
                adding_replicas=adding,
                removing_replicas=removing,
            )
        )
        return self.act()


def new_topic(
    *ids: int,
    replicas: tuple[int, ...] = (ME, B2),
    isr: tuple[int, ...] | None = None,
    leader: int = ME,
    configs: dict[str, str] | None = None,
    **config: Any,
) -> Cluster:
    cluster = Cluster(*ids, **config)
    cluster.record(TopicRecord(TOPIC, TOPIC_ID, dict(configs or {})))
    cluster.partition(replicas, isr if isr is not None else replicas, leader, 1)
    return cluster


def of(outputs: list[Output], kind: type) -> list[Any]:
    return [o for o in outputs if isinstance(o, kind)]


def batch(value: bytes = b"v", *, timestamp: int = NOW) -> bytes:
    return encode_batch([(timestamp, None, value, ())])


def produce(broker: Broker, n: int, value: bytes = b"v") -> None:
    for _ in range(n):
        reply, _ = broker.engine.produce(TP, 1, batch(value), NOW, NOW + 5_000)
        assert reply.error == ErrorCode.NONE, reply.message


def serve(
    leader: Broker, follower_id: int, offset: int, epoch: int = 1, now: int = NOW
) -> FetchReply:
    fetch = FollowerFetch(follower_id, 100 + follower_id, epoch, offset, -1, 0)
    reply, _ = leader.engine.follower_fetch(TP, fetch, 1 << 20, now)
    return reply


def fetch_round(
    leader: Broker, follower: Broker, now: int = NOW
) -> tuple[FetchReply, list[Output]]:
    """One follower fetch: the follower plans it, the leader answers, the follower applies."""
    position = follower.engine.next_fetch(TP, leader.id, now)
    assert position is not None
    fetch = FollowerFetch(
        follower.id,
        100 + follower.id,
        position.current_leader_epoch,
        position.fetch_offset,
        position.last_fetched_epoch,
        position.log_start_offset,
    )
    reply, _ = leader.engine.follower_fetch(TP, fetch, 1 << 20, now)
    response = FetchResponse(
        reply.error,
        reply.high_watermark,
        reply.log_start_offset,
        reply.log_end_offset,
        reply.diverging_epoch,
        reply.records,
    )
    return reply, follower.engine.on_fetch_response(TP, leader.id, position, response, now)


# ------------------------------------------------------------------------------------------
# An adding replica


def test_an_adding_replica_creates_an_empty_log_and_follows_the_leader() -> None:
    cluster = new_topic(ME, B3)
    assert TP not in cluster[B3].engine
    produce(cluster[ME], 3)
    out = cluster.partition((ME, B2, B3), (ME, B2), ME, 2, adding=(B3,))[B3]
    log = cluster[B3].logs[TP]
    assert log.leo == 0 and log.log_start_offset == 0
    assert of(out, StartFollowing) == [StartFollowing(TP, ME)]
    assert cluster[B3].engine.role(TP) is Role.FOLLOWER
    _, out = fetch_round(cluster[ME], cluster[B3])
    assert log.leo == 3  # every batch, from offset 0


def test_an_adding_replica_below_the_leaders_log_start_restarts_there() -> None:
    """Kafka's follower: OFFSET_OUT_OF_RANGE with our LEO below the leader's log start
    truncates fully and fetches from the leader's log start."""
    cluster = new_topic(ME, B3, replicas=(ME,))
    leader = cluster[ME]
    produce(leader, 5)
    assert leader.logs[TP].maybe_increment_log_start_offset(3)
    leader.engine.on_log_start_offset_advanced(TP)
    cluster.partition((ME, B3), (ME,), ME, 2, adding=(B3,), leader_epoch=1)
    follower = cluster[B3]
    reply, out = fetch_round(leader, follower)
    assert (reply.error, reply.log_start_offset, reply.log_end_offset) == (
        ErrorCode.OFFSET_OUT_OF_RANGE,
        3,
        5,
    )
    (truncated,) = of(out, Truncated)
    assert truncated.fully and truncated.to_offset == 3
    log = follower.logs[TP]
    assert (log.log_start_offset, log.leo) == (3, 3)
    fetch_round(leader, follower)
    assert log.leo == 5


def test_the_leader_tracks_an_adding_replica_and_lets_it_join_the_isr() -> None:
    cluster = new_topic(ME, B3, isr=(ME, B2))
    leader = cluster[ME]
    produce(leader, 2)
    serve(leader, B2, 2)  # B2 is in sync: HW 2
    cluster.partition((ME, B2, B3), (ME, B2), ME, 2, adding=(B3,), leader_epoch=1)
    core = leader.engine.hosted()[TP].core
    assert {r.replica_id for r in core.remote_replicas} == {B2, B3}
    (desc,) = leader.engine.describe([TOPIC])
    assert {f.replica_id: f.log_end_offset for f in desc.followers} == {B2: 2, B3: -1}
    # Not in the ISR: it does not hold the HW back.
    produce(leader, 1)
    serve(leader, B2, 3)
    assert core.high_watermark == 3
    # Caught up: the leader proposes it for the ISR, like any follower.
    fetch = FollowerFetch(B3, 100 + B3, 1, 3, -1, 0)
    _, out = leader.engine.follower_fetch(TP, fetch, 1 << 20, NOW)
    (proposal,) = of(out, SendAlterPartition)
    assert proposal.proposal.new_isr == frozenset({ME, B2, B3})
    (desc,) = leader.engine.describe([TOPIC])
    assert {f.replica_id: f.log_end_offset for f in desc.followers}[B3] == 3


def test_a_moving_partition_is_under_replicated_against_its_target_only() -> None:
    """Kafka: the replication factor of a reassigning partition is replicas - removing."""
    cluster = new_topic(ME, replicas=(ME, B2))
    cluster.partition((ME, B3, B2), (ME, B2), ME, 2, adding=(B3,), removing=(B2,), leader_epoch=1)
    assert cluster[ME].engine.gauges().under_replicated == 0
    cluster.partition((ME, B3, B2), (ME,), ME, 3, adding=(B3,), removing=(B2,), leader_epoch=1)
    assert cluster[ME].engine.gauges().under_replicated == 1


# ------------------------------------------------------------------------------------------
# A removing replica


def test_a_removing_replica_keeps_its_log_until_a_record_no_longer_names_it() -> None:
    cluster = new_topic(B3, replicas=(ME, B3), leader=ME)
    follower = cluster[B3]
    log = follower.logs[TP]
    out = cluster.partition((ME, B2, B3), (ME, B3), ME, 2, adding=(B2,), removing=(B3,))[B3]
    assert of(out, ReplicaRemoved) == [] and of(out, StopFollowing) == []
    assert TP in follower.engine and follower.engine.next_fetch(TP, ME, NOW) is not None
    out = cluster.partition((ME, B2), (ME, B2), ME, 3, leader_epoch=2)[B3]
    assert TP not in follower.engine and follower.deleted == [log]
    kinds = [type(o) for o in out if isinstance(o, StopFollowing | ReplicaRemoved)]
    assert kinds == [StopFollowing, ReplicaRemoved]  # fetching stops before the log goes
    assert of(out, ReplicaRemoved) == [ReplicaRemoved(TP, True, "no longer a replica")]


def test_a_replica_removed_then_re_added_gets_a_fresh_log() -> None:
    cluster = new_topic(ME, B3, replicas=(ME, B3))
    produce(cluster[ME], 2)
    fetch_round(cluster[ME], cluster[B3])
    old = cluster[B3].logs[TP]
    assert old.leo == 2
    cluster.partition((ME,), (ME,), ME, 2)
    assert cluster[B3].deleted == [old]
    cluster.partition((ME, B3), (ME,), ME, 3, adding=(B3,))
    fresh = cluster[B3].logs[TP]
    assert fresh is not old and fresh.leo == 0
    fetch_round(cluster[ME], cluster[B3])
    assert fresh.leo == 2


def test_a_log_on_disk_for_a_partition_no_longer_naming_this_broker_goes_at_startup() -> None:
    broker = Broker(B3)
    log = MemLog()
    broker.logs[TP] = log
    broker.engine.host(TP, TOPIC_ID, log, None, high_watermark=0)  # found on disk
    broker.record(RegisterBrokerRecord(ME, "i", 101, "h", 1, "", False))
    broker.record(TopicRecord(TOPIC, TOPIC_ID))
    broker.record(PartitionRecord(TOPIC_ID, 0, (ME, B2), (ME, B2), ME, 4, 4))
    out = broker.act()
    assert of(out, ReplicaRemoved) == [ReplicaRemoved(TP, True, "no longer a replica")]
    assert broker.deleted == [log]


def test_the_leader_leaving_the_replicas_answers_its_parked_produces() -> None:
    cluster = new_topic(ME, replicas=(ME, B2))
    reply, _ = cluster[ME].engine.produce(TP, -1, batch(), NOW, NOW + 5_000)
    assert reply.token is not None
    out = cluster.partition((B3, B2), (B2,), B2, 3, leader_epoch=2)[ME]
    done = [o for o in out if getattr(o, "token", None) == reply.token]
    assert [d.error for d in done] == [ErrorCode.NOT_LEADER_OR_FOLLOWER]


# ------------------------------------------------------------------------------------------
# Live topic configs


def test_min_insync_replicas_takes_effect_at_once() -> None:
    cluster = new_topic(ME, replicas=(ME, B2), isr=(ME,))
    engine = cluster[ME].engine
    reply, _ = engine.produce(TP, -1, batch(), NOW, NOW + 5_000)
    assert reply.error == ErrorCode.NONE
    cluster.record(ConfigRecord(TOPIC_ID, "min.insync.replicas", "2"))
    out = cluster.act()[ME]
    assert of(out, LogConfigChanged) == [LogConfigChanged(TP, {"min.insync.replicas": "2"})]
    reply, _ = engine.produce(TP, -1, batch(), NOW, NOW + 5_000)
    assert reply.error == ErrorCode.NOT_ENOUGH_REPLICAS
    assert engine.gauges().under_min_isr == 1
    cluster.record(ConfigRecord(TOPIC_ID, "min.insync.replicas", None))
    cluster.act()
    reply, _ = engine.produce(TP, -1, batch(), NOW, NOW + 5_000)
    assert reply.error == ErrorCode.NONE


def test_max_message_bytes_and_timestamp_checks_take_effect_at_once() -> None:
    cluster = new_topic(ME, replicas=(ME,))
    engine = cluster[ME].engine
    big = batch(b"x" * 2000)
    reply, _ = engine.produce(TP, 1, big, NOW, NOW)
    assert reply.error == ErrorCode.NONE
    cluster.record(ConfigRecord(TOPIC_ID, "max.message.bytes", "1000"))
    cluster.act()
    reply, _ = engine.produce(TP, 1, big, NOW, NOW)
    assert reply.error == ErrorCode.MESSAGE_TOO_LARGE
    old = batch(timestamp=NOW - 500_000)
    reply, _ = engine.produce(TP, 1, old, NOW, NOW)
    assert reply.error == ErrorCode.NONE
    cluster.record(ConfigRecord(TOPIC_ID, "message.timestamp.before.max.ms", "60000"))
    out = cluster.act()[ME]
    (changed,) = of(out, LogConfigChanged)
    assert changed.configs["message.timestamp.before.max.ms"] == "60000"
    reply, _ = engine.produce(TP, 1, old, NOW, NOW)
    assert reply.error == ErrorCode.INVALID_TIMESTAMP


def test_an_unchanged_topic_config_reconfigures_nothing() -> None:
    cluster = new_topic(ME, replicas=(ME,), configs={"retention.ms": "1000"})
    cluster.record(ConfigRecord(TOPIC_ID, "retention.ms", "1000"))
    assert of(cluster.act()[ME], LogConfigChanged) == []
    cluster.record(ConfigRecord(TOPIC_ID, "retention.ms", "2000"))
    assert of(cluster.act()[ME], LogConfigChanged) == [
        LogConfigChanged(TP, {"retention.ms": "2000"})
    ]


# ------------------------------------------------------------------------------------------
# KIP-73 throttles in the engine


def broker_config(cluster: Cluster, resource: str, name: str, value: str | None) -> None:
    cluster.record(ConfigRecord(resource, name, value, CONFIG_RESOURCE_BROKER))
    cluster.act()


def test_throttle_rates_come_from_the_broker_configs_on_every_batch() -> None:
    cluster = new_topic(ME, B2, replicas=(ME, B2))
    engine = cluster[ME].engine
    assert engine.leader_quota.unlimited and engine.follower_quota.unlimited
    broker_config(cluster, "", LEADER_THROTTLED_RATE, "5000")
    assert engine.leader_quota.limit == 5000 and cluster[B2].engine.leader_quota.limit == 5000
    broker_config(cluster, str(ME), LEADER_THROTTLED_RATE, "7000")
    broker_config(cluster, str(ME), FOLLOWER_THROTTLED_RATE, "9000")
    assert (engine.leader_quota.limit, engine.follower_quota.limit) == (7000, 9000)
    assert cluster[B2].engine.leader_quota.limit == 5000  # the default still
    broker_config(cluster, str(ME), LEADER_THROTTLED_RATE, None)
    broker_config(cluster, "", LEADER_THROTTLED_RATE, None)
    assert engine.leader_quota.limit == UNTHROTTLED


def throttled_move(rate: int, leader_list: str) -> Cluster:
    """ME leads (ME, B2) in sync; B3 is being added; ME's leader quota is `rate`."""
    cluster = new_topic(ME, replicas=(ME, B2), configs={LEADER_THROTTLED_REPLICAS: leader_list})
    broker_config(cluster, "", LEADER_THROTTLED_RATE, str(rate))
    produce(cluster[ME], 4, b"x" * 1000)
    cluster.partition((ME, B2, B3), (ME, B2), ME, 2, adding=(B3,), leader_epoch=1)
    return cluster


def test_the_leader_withholds_records_from_a_throttled_follower_over_its_quota() -> None:
    cluster = throttled_move(100, f"0:{B3}")
    leader = cluster[ME]
    quota = leader.engine.leader_quota
    first = serve(leader, B3, 0)
    assert first.error == ErrorCode.NONE and first.records  # under quota: served
    assert quota.recorded_bytes == len(first.records) and quota.is_exceeded(NOW)
    second = serve(leader, B3, 4)  # nothing new past 4 anyway: no read, no count
    assert second.records == b"" and quota.throttled_count == 0
    produce(leader, 1)
    third = serve(leader, B3, 4)
    assert third.error == ErrorCode.NONE and third.records == b"" and third.high_watermark >= 0
    assert quota.throttled_count == 1
    # An in-sync follower is never throttled, nor is its traffic counted.
    in_sync = serve(leader, B2, 0)
    assert in_sync.records and quota.recorded_bytes == len(first.records)
    # Once the rate has fallen under the limit, the throttled follower is served again.
    later = NOW + 60_000
    assert not quota.is_exceeded(later)
    assert serve(leader, B3, 4, now=later).records


def test_the_leader_throttles_only_listed_out_of_sync_replicas() -> None:
    cluster = throttled_move(1, "0:4")  # B4: not this follower, not this leader
    leader = cluster[ME]
    leader.engine.leader_quota.record(10**6, NOW)
    assert serve(leader, B3, 0).records  # not listed: never throttled
    # Kafka's own reading of the list names the leader: its out-of-sync followers are throttled.
    cluster.record(ConfigRecord(TOPIC_ID, LEADER_THROTTLED_REPLICAS, f"0:{ME}"))
    cluster.act()
    assert serve(leader, B3, 0).records == b""
    cluster.record(ConfigRecord(TOPIC_ID, LEADER_THROTTLED_REPLICAS, "*"))
    cluster.act()
    assert serve(leader, B3, 0).records == b""
    # In the ISR: not throttled any more.
    cluster.partition((ME, B2, B3), (ME, B2, B3), ME, 3, adding=(B3,), leader_epoch=1)
    assert serve(leader, B3, 0).records


def test_the_follower_throttles_listed_partitions_while_out_of_sync() -> None:
    cluster = new_topic(ME, B3, replicas=(ME, B2))
    broker_config(cluster, "", FOLLOWER_THROTTLED_RATE, "100")
    produce(cluster[ME], 3, b"y" * 500)
    cluster.partition((ME, B2, B3), (ME, B2), ME, 2, adding=(B3,), leader_epoch=1)
    follower = cluster[B3]
    assert not follower.engine.follower_throttled(TP)  # not listed
    cluster.record(ConfigRecord(TOPIC_ID, FOLLOWER_THROTTLED_REPLICAS, f"0:{B3}"))
    cluster.act()
    assert follower.engine.follower_throttled(TP)
    reply, _ = fetch_round(cluster[ME], follower)
    quota = follower.engine.follower_quota
    assert quota.recorded_bytes == len(reply.records) > 0 and quota.is_exceeded(NOW)
    # Without a rate nothing is throttled; in the ISR neither.
    broker_config(cluster, "", FOLLOWER_THROTTLED_RATE, None)
    assert not follower.engine.follower_throttled(TP)
    broker_config(cluster, "", FOLLOWER_THROTTLED_RATE, "100")
    cluster.partition((ME, B2, B3), (ME, B2, B3), ME, 3, adding=(B3,), leader_epoch=1)
    assert not follower.engine.follower_throttled(TP)


def test_a_record_with_the_same_epochs_but_other_replicas_is_applied():
    # An AlterPartition answer can hand the leader a partition epoch whose record changed the
    # replicas (the answer carries only the ISR); the record itself must still be applied, or
    # the leader keeps the dropped replica (found by the simulation, seed 33).
    cluster = new_topic(ME, replicas=(ME, B2, B3), leader=ME)
    core = cluster[ME].engine._hosted[TP].core

    def remotes() -> list[int]:
        return [r.replica_id for r in core.remote_replicas]

    assert remotes() == [B2, B3]
    cluster.partition((ME, B2, B3), (ME, B2, B3), ME, 2, removing=(B3,))
    cluster.partition((ME, B2), (ME, B2), ME, 2)  # same partition and leader epochs
    assert core.replicas == (ME, B2) and remotes() == [B2]
