"""ControllerCore: CreatePartitions, dynamic configs (IncrementalAlterConfigs, DescribeConfigs),
decommissioning and failure decommissioning, the cluster description's counts; and the image's
round trip of what they write (reassigning partitions, broker configs, decommission marks)."""

from __future__ import annotations

import pytest

from minibroker.client.errors import ErrorCode
from minibroker.client.replication_throttle import (
    LEADER_THROTTLED_RATE,
    LEADER_THROTTLED_REPLICAS,
)
from minibroker.controller.config import build_config
from minibroker.controller.core.messages import (
    CONFIG_OP_APPEND,
    CONFIG_OP_DELETE,
    CONFIG_OP_SET,
    CONFIG_OP_SUBTRACT,
    CONFIG_SOURCE_DEFAULT,
    CONFIG_SOURCE_DYNAMIC_BROKER,
    CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER,
    CONFIG_SOURCE_DYNAMIC_TOPIC,
    CONFIG_SOURCE_STATIC_BROKER,
    AlterConfigOp,
    AlterConfigsResource,
    CreatePartitionsTopic,
    DescribeConfigsResource,
)
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import (
    CONFIG_RESOURCE_BROKER,
    CONFIG_RESOURCE_TOPIC,
    BrokerDecommissionRecord,
    ConfigRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from minibroker.metadata.wire import record_from_pb, record_to_pb
from tests.unit.test_controller_core import Harness, replay
from tests.unit.test_reassignment import catch_up

# -- CreatePartitions -----------------------------------------------------------------------


def grow(h: Harness, count, name="t", assignments=None, validate_only=False):
    (result,) = h.take(
        h.core.create_partitions(
            [CreatePartitionsTopic(name, count, assignments)], validate_only, h.now
        )
    )
    return result


def test_create_partitions_places_new_partitions_and_skips_decommissioning_brokers():
    h = Harness()
    h.start(1, 2, 3, 4)
    h.create(partitions=2, rf=2)
    h.take(h.core.decommission_broker(4, False, h.now))
    assert grow(h, 5).error == ErrorCode.NONE
    topic = h.core.image.topic("t")
    assert topic is not None and sorted(topic.partitions) == [0, 1, 2, 3, 4]
    for i in (2, 3, 4):
        p = topic.partitions[i]
        assert len(p.replicas) == 2 and 4 not in p.replicas and p.isr == p.replicas
        assert p.leader == p.replicas[0] and p.partition_epoch == 0
    assert "partitions_created" in h.event_names()
    assert replay(h.log) == h.core.image


@pytest.mark.parametrize(
    ("count", "assignments", "code", "needle"),
    [
        (2, None, ErrorCode.INVALID_PARTITIONS, "larger"),
        (1, None, ErrorCode.INVALID_PARTITIONS, "larger"),
        (3, ((1, 2),), ErrorCode.INVALID_REPLICA_ASSIGNMENT, "1 assignment(s) given for 1"[:14]),
        (3, ((1,),), ErrorCode.INVALID_REPLICA_ASSIGNMENT, "replication factor is 2"),
        (3, ((1, 1),), ErrorCode.INVALID_REPLICA_ASSIGNMENT, "twice"),
        (3, ((1, 9),), ErrorCode.INVALID_REPLICA_ASSIGNMENT, "unregistered"),
        (4, ((1, 2),), ErrorCode.INVALID_REPLICA_ASSIGNMENT, "1 assignment(s) given for 2"),
    ],
)
def test_create_partitions_bad_input(count, assignments, code, needle):
    h = Harness()
    h.start(1, 2, 3)
    h.create(partitions=2, rf=2)
    offset = h.core.image.next_offset
    result = grow(h, count, assignments=assignments)
    if code == ErrorCode.INVALID_REPLICA_ASSIGNMENT and assignments == ((1, 2),) and count == 3:
        assert result.error == ErrorCode.NONE  # a valid manual assignment
        return
    assert result.error == code and needle in result.message, result
    assert h.core.image.next_offset == offset


def test_create_partitions_unknown_topic_validate_only_and_manual():
    h = Harness()
    h.start(1, 2, 3)
    h.create(partitions=1, rf=2)
    assert grow(h, 3, name="nope").error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    offset = h.core.image.next_offset
    assert grow(h, 3, validate_only=True).error == ErrorCode.NONE
    assert h.core.image.next_offset == offset
    assert grow(h, 2, assignments=((3, 1),)).error == ErrorCode.NONE
    assert h.part("t", 1).replicas == (3, 1)


# -- configs --------------------------------------------------------------------------------


def alter(h: Harness, rtype, name, *ops, validate_only=False):
    (result,) = h.take(
        h.core.incremental_alter_configs(
            [AlterConfigsResource(rtype, name, tuple(AlterConfigOp(*o) for o in ops))],
            validate_only,
            h.now,
        )
    )
    return result


def describe(h: Harness, rtype, name, keys=()):
    (result,) = h.core.describe_configs([DescribeConfigsResource(rtype, name, tuple(keys))])
    return result


def test_topic_config_set_delete_append_subtract_one_record_per_changed_key():
    h = Harness(topic_defaults={"retention.ms": 5000})
    h.start(1, 2)
    h.create(rf=2)
    topic_id = h.core.image.topic("t").topic_id  # type: ignore[union-attr]
    start = len(h.log)
    r = alter(
        h,
        CONFIG_RESOURCE_TOPIC,
        "t",
        ("min.insync.replicas", CONFIG_OP_SET, "2"),
        (LEADER_THROTTLED_REPLICAS, CONFIG_OP_APPEND, "0:1,0:2"),
    )
    assert r.error == ErrorCode.NONE
    records = [e.record for e in h.log[start:]]
    assert records == [
        ConfigRecord(topic_id, LEADER_THROTTLED_REPLICAS, "0:1,0:2", CONFIG_RESOURCE_TOPIC),
        ConfigRecord(topic_id, "min.insync.replicas", "2", CONFIG_RESOURCE_TOPIC),
    ]
    alter(h, CONFIG_RESOURCE_TOPIC, "t", (LEADER_THROTTLED_REPLICAS, CONFIG_OP_SUBTRACT, "0:1"))
    assert h.core.image.topic("t").configs[LEADER_THROTTLED_REPLICAS] == "0:2"  # type: ignore[union-attr]
    alter(h, CONFIG_RESOURCE_TOPIC, "t", ("min.insync.replicas", CONFIG_OP_DELETE, None))
    entries = {e.name: e for e in describe(h, CONFIG_RESOURCE_TOPIC, "t").entries}
    assert entries["min.insync.replicas"].source == CONFIG_SOURCE_DEFAULT
    assert entries["min.insync.replicas"].value == "1"
    assert entries["retention.ms"].source == CONFIG_SOURCE_STATIC_BROKER
    assert entries["retention.ms"].value == "5000"
    assert entries[LEADER_THROTTLED_REPLICAS].source == CONFIG_SOURCE_DYNAMIC_TOPIC
    same = len(h.log)
    alter(h, CONFIG_RESOURCE_TOPIC, "t", (LEADER_THROTTLED_REPLICAS, CONFIG_OP_SET, "0:2"))
    assert len(h.log) == same  # nothing changed, nothing written
    assert "config_changed" in h.event_names()
    assert replay(h.log) == h.core.image


@pytest.mark.parametrize(
    ("rtype", "name", "ops", "code"),
    [
        (CONFIG_RESOURCE_TOPIC, "nope", [("retention.ms", CONFIG_OP_SET, "1")], "UNKNOWN"),
        (CONFIG_RESOURCE_TOPIC, "t", [("no.such.key", CONFIG_OP_SET, "1")], "INVALID_CONFIG"),
        (
            CONFIG_RESOURCE_TOPIC,
            "t",
            [("min.insync.replicas", CONFIG_OP_SET, "0")],
            "INVALID_CONFIG",
        ),
        (CONFIG_RESOURCE_TOPIC, "t", [("retention.ms", CONFIG_OP_APPEND, "1")], "INVALID_CONFIG"),
        (
            CONFIG_RESOURCE_TOPIC,
            "t",
            [(LEADER_THROTTLED_REPLICAS, CONFIG_OP_SET, "x")],
            "INVALID_CONFIG",
        ),
        (
            CONFIG_RESOURCE_BROKER,
            "1",
            [(LEADER_THROTTLED_RATE, CONFIG_OP_SET, "0")],
            "INVALID_CONFIG",
        ),
        (
            CONFIG_RESOURCE_BROKER,
            "1",
            [(LEADER_THROTTLED_RATE, CONFIG_OP_SET, "-5")],
            "INVALID_CONFIG",
        ),
        (CONFIG_RESOURCE_BROKER, "", [("retention.ms", CONFIG_OP_SET, "5")], "INVALID_CONFIG"),
        (
            CONFIG_RESOURCE_BROKER,
            "one",
            [(LEADER_THROTTLED_RATE, CONFIG_OP_SET, "5")],
            "INVALID_REQUEST",
        ),
        (
            CONFIG_RESOURCE_TOPIC,
            "t",
            [("retention.ms", CONFIG_OP_SET, "5"), ("segment.ms", CONFIG_OP_SET, "-9")],
            "INVALID_CONFIG",
        ),
    ],
)
def test_bad_config_changes_change_nothing(rtype, name, ops, code):
    h = Harness()
    h.start(1)
    h.create()
    offset = h.core.image.next_offset
    result = alter(h, rtype, name, *ops)
    expected = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if code == "UNKNOWN" else ErrorCode[code]
    assert result.error == expected, result
    assert h.core.image.next_offset == offset


def test_broker_throttle_rates_per_broker_and_default():
    h = Harness()
    h.start(1, 2)
    assert (
        alter(h, CONFIG_RESOURCE_BROKER, "", (LEADER_THROTTLED_RATE, CONFIG_OP_SET, "1000")).error
        == ErrorCode.NONE
    )
    assert (
        alter(h, CONFIG_RESOURCE_BROKER, "2", (LEADER_THROTTLED_RATE, CONFIG_OP_SET, "50")).error
        == ErrorCode.NONE
    )
    assert h.core.image.broker_config(1)[LEADER_THROTTLED_RATE] == "1000"
    assert h.core.image.broker_config(2)[LEADER_THROTTLED_RATE] == "50"
    one = {e.name: e for e in describe(h, CONFIG_RESOURCE_BROKER, "1").entries}
    two = {
        e.name: e for e in describe(h, CONFIG_RESOURCE_BROKER, "2", [LEADER_THROTTLED_RATE]).entries
    }
    assert one[LEADER_THROTTLED_RATE].source == CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER
    assert set(two) == {LEADER_THROTTLED_RATE}
    assert two[LEADER_THROTTLED_RATE].source == CONFIG_SOURCE_DYNAMIC_BROKER
    alter(h, CONFIG_RESOURCE_BROKER, "2", (LEADER_THROTTLED_RATE, CONFIG_OP_DELETE, None))
    assert h.core.image.broker_config(2)[LEADER_THROTTLED_RATE] == "1000"
    assert describe(h, CONFIG_RESOURCE_TOPIC, "nope").error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert replay(h.log) == h.core.image


def test_validate_only_alters_nothing():
    h = Harness()
    h.start(1)
    h.create()
    offset = h.core.image.next_offset
    r = alter(
        h, CONFIG_RESOURCE_TOPIC, "t", ("retention.ms", CONFIG_OP_SET, "9"), validate_only=True
    )
    assert r.error == ErrorCode.NONE and h.core.image.next_offset == offset


def test_replica_rebuild_delay_config_key():
    assert build_config({}).settings().replica_rebuild_delay_ms == -1
    assert (
        build_config({"replica.rebuild.delay.ms": "60000"}).settings().replica_rebuild_delay_ms
        == 60000
    )


# -- decommissioning ------------------------------------------------------------------------


def finish_moves(h: Harness) -> None:
    """Every adding replica catches up (what the brokers would report)."""
    for t, p in list(h.core.image.reassignments()):
        catch_up(h, *p.adding_replicas, name=t.name, index=p.partition)


def test_decommission_moves_leaders_first_then_every_replica_and_balances():
    h = Harness()
    racks = {1: "a", 2: "b", 3: "a", 4: "b", 5: "a"}
    h.start(1, 2, 3, 4, 5, racks=racks)
    h.create(partitions=6, rf=2)
    led = [p.partition for _, p in h.core.image.partitions() if p.leader == 1]
    hosted = sum(1 for _, p in h.core.image.partitions() if 1 in p.replicas)
    assert led
    reply = h.take(h.core.decommission_broker(1, False, h.now))
    assert reply.error == ErrorCode.NONE and reply.partitions_moving == hosted
    assert h.core.image.decommissioning == {1}
    for _, p in h.core.image.partitions():
        assert p.leader != 1  # leaderships moved before any data
        if 1 in p.replicas:
            assert p.removing_replicas == (1,)
            assert {racks[b] for b in p.target_replicas} == {"a", "b"}  # racks kept
    desc = {b.registration.broker_id: b for b in h.core.describe_cluster(h.now).brokers}
    assert desc[1].decommissioning and desc[1].replica_count == hosted
    assert desc[1].leader_count == 0
    finish_moves(h)
    desc = {b.registration.broker_id: b for b in h.core.describe_cluster(h.now).brokers}
    assert desc[1].replica_count == 0  # decommissioned: safe to stop
    assert sum(d.replica_count for d in desc.values()) == 12
    # Rack a has 3 and 5 left: they share its replicas within one.
    assert abs(desc[3].replica_count - desc[5].replica_count) <= 1
    # New topics never land on it.
    h.create("u", partitions=6, rf=3)
    assert all(1 not in p.replicas for t, p in h.core.image.partitions() if t.name == "u")
    assert "broker_decommissioning" in h.event_names()
    assert replay(h.log) == h.core.image


def test_decommission_refusals_and_cancel():
    h = Harness()
    h.start(1, 2, 3)
    h.create(partitions=1, rf=3)
    offset = h.core.image.next_offset
    unknown = h.take(h.core.decommission_broker(9, False, h.now))
    assert unknown.error == ErrorCode.BROKER_ID_NOT_REGISTERED
    no_room = h.take(h.core.decommission_broker(1, False, h.now))
    assert no_room.error == ErrorCode.INVALID_REQUEST and "'t'" in no_room.message
    assert h.core.image.next_offset == offset
    h.start(4)
    assert h.take(h.core.decommission_broker(1, False, h.now)).partitions_moving == 1
    assert h.take(h.core.decommission_broker(1, True, h.now)).error == ErrorCode.NONE
    assert h.core.image.decommissioning == set()
    assert h.part().is_reassigning  # a move already started goes on


def test_decommission_sweep_restarts_a_cancelled_move():
    h = Harness()
    h.start(1, 2, 3)
    h.create(partitions=1, rf=2)
    h.take(h.core.decommission_broker(1, False, h.now))
    from minibroker.controller.core.messages import ReassignmentTarget

    h.take(h.core.alter_partition_reassignments([ReassignmentTarget("t", 0, None)], h.now))
    assert not h.part().is_reassigning
    h.tick(1)
    assert h.part().is_reassigning and 1 in h.part().removing_replicas


def test_failure_decommissioning_rebuilds_after_the_delay_only():
    h = Harness(replica_rebuild_delay_ms=10_000, session_timeout_ms=3000)
    h.start(1, 2, 3, 4)
    h.create(partitions=2, rf=3)
    named = [p for _, p in h.core.image.partitions() if 4 in p.replicas]
    assert named
    h.close_stream(4)  # broker 4 dies: fenced at once
    for b in (1, 2, 3):
        h.heartbeat(b)
    h.tick(9_000)
    assert not any(p.is_reassigning for _, p in h.core.image.partitions())
    for b in (1, 2, 3):
        h.heartbeat(b)
    h.tick(1_500)
    moving = [p for _, p in h.core.image.partitions() if p.is_reassigning]
    assert len(moving) == len(named)
    assert all(p.removing_replicas == (4,) for p in moving)
    assert "replicas_rebuilt" in h.event_names()


def test_failure_decommissioning_a_broker_back_in_time_moves_nothing():
    h = Harness(replica_rebuild_delay_ms=10_000)
    h.start(1, 2, 3, 4)
    h.create(partitions=2, rf=3)
    h.close_stream(4)
    h.tick(5_000)
    h.register(4, incarnation="inc-4b")
    for b in (1, 2, 3, 4):
        h.heartbeat(b)
    assert not h.core.image.brokers[4].fenced
    h.tick(6_000)
    for b in (1, 2, 3, 4):
        h.heartbeat(b)
    h.tick(20_000)
    assert not any(p.is_reassigning for _, p in h.core.image.partitions())


def test_failure_decommissioning_is_off_by_default():
    h = Harness()
    h.start(1, 2, 3, 4)
    h.create(partitions=2, rf=3)
    h.close_stream(4)
    h.now += 10**9
    for b in (1, 2, 3):
        h.heartbeat(b)
    h.tick()
    assert not any(p.is_reassigning for _, p in h.core.image.partitions())


# -- the image round trip -------------------------------------------------------------------


def test_image_round_trip_with_reassignments_broker_configs_and_decommission_marks():
    records = [
        RegisterBrokerRecord(1, "i1", 0, "h", 1),
        RegisterBrokerRecord(2, "i2", 1, "h", 2),
        TopicRecord("t", "tid", {"min.insync.replicas": "1"}),
        PartitionRecord("tid", 0, (2, 1), (1,), 1, 0, 1, 0, "", (2,), (1,)),
        ConfigRecord("", LEADER_THROTTLED_RATE, "100", CONFIG_RESOURCE_BROKER),
        ConfigRecord("2", LEADER_THROTTLED_RATE, "7", CONFIG_RESOURCE_BROKER),
        ConfigRecord("tid", LEADER_THROTTLED_REPLICAS, "*", CONFIG_RESOURCE_TOPIC),
        BrokerDecommissionRecord(1, True),
        BrokerDecommissionRecord(2, True),
        BrokerDecommissionRecord(2, False),
    ]
    image = MetadataImage()
    image.replace_with_snapshot(records, 10)
    assert image.decommissioning == {1}
    assert image.broker_config(2)[LEADER_THROTTLED_RATE] == "7"
    assert [p.partition for _, p in image.reassignments()] == [0]
    again = MetadataImage()
    again.replace_with_snapshot([record_from_pb(record_to_pb(r)) for r in image.to_records()], 10)
    assert again == image
    assert again.topic("t").configs[LEADER_THROTTLED_REPLICAS] == "*"  # type: ignore[union-attr]


def test_create_partitions_refuses_the_offsets_topic():
    h = Harness()
    h.start(1, 2, 3)
    h.create(name="__consumer_offsets", partitions=2, rf=2)
    offset = h.core.image.next_offset
    result = grow(h, 3, name="__consumer_offsets")
    assert result.error == ErrorCode.INVALID_REQUEST and "consumer groups" in result.message
    assert h.core.image.next_offset == offset
