"""Broker registration as untrusted input, unregistration, and unknown election types.

Pure: the validation rules (`controller/core/registration.py`) as tables, the core's answers to
junk registrations (INVALID_REQUEST, nothing written), UnregisterBroker's rules (Kafka's
ReplicationControlManager.unregisterBroker: BROKER_ID_NOT_REGISTERED for an unknown id; a live
broker is refused here; otherwise its ISR memberships go and an UnregisterBrokerRecord is
written, while replica lists keep naming it), and the ElectLeaders decoding of an unknown
election type (Kafka: InvalidRequestException "Unknown election type N").
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minibroker.client.errors import ErrorCode, InvalidRequestError
from minibroker.client.types import NO_LEADER
from minibroker.controller import wire
from minibroker.controller.core.election import Election
from minibroker.controller.core.messages import RegisterRequest
from minibroker.controller.core.registration import (
    invalid_host,
    invalid_port,
    invalid_registration,
)
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import UnregisterBrokerRecord
from minibroker.metadata.wire import entry_from_pb, entry_to_pb
from minibroker.proto import minibroker_pb2 as pb
from tests.unit.test_controller_core import CLUSTER, Harness

GOOD = RegisterRequest(
    broker_id=1,
    cluster_id="",
    incarnation_id="0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    host="127.0.0.1",
    port=9092,
    rack="rack-a",
    metrics_port=10092,
    previous_broker_epoch=-1,
)

# -- address validation tables ------------------------------------------------------------------

VALID_HOSTS = [
    "127.0.0.1",
    "10.0.0.255",
    "0.0.0.0",  # binds every interface; a local client can still reach it
    "localhost",
    "localhost.",
    "broker-1",
    "broker_1",  # docker service names
    "kafka-0.kafka-headless.default.svc.cluster.local",
    "[::1]",
    "[2001:db8::8a2e:370:7334]",
    "a" * 63 + ".example",
    ".".join(["a" * 63] * 3) + "." + "b" * 61,  # 253 characters
]

INVALID_HOSTS = [
    ("", "empty"),
    (" ", "space"),
    ("my host", "space"),
    ("host\n", "newline"),
    ("ho\x00st", "NUL"),
    ("host\x1b[31m", "escape"),
    ("\t", "tab"),
    ("exämple.com", "non-ASCII"),
    ("-broker", "leading hyphen"),
    ("broker-", "trailing hyphen"),
    ("a..b", "empty label"),
    (".broker", "empty label"),
    ("a" * 64 + ".example", "label too long"),
    (".".join(["a" * 63] * 4), "too long"),
    ("host:9092", "colon"),
    ("::1", "bare IPv6"),
    ("[::1", "unclosed bracket"),
    ("[not-an-ip]", "bad IPv6"),
    ("[127.0.0.1]", "IPv4 in brackets"),
    ("[fe80::1%eth0]", "IPv6 scope id"),
    ("[fe80::1%a b\n\x00]", "IPv6 scope id with control characters"),
    ("999.1.1.1", "bad IPv4"),
    ("1.2.3", "numeric TLD"),
    ("256.256.256.256", "bad IPv4"),
    ("http://broker", "URL"),
    ("broker/1", "slash"),
    ("broker@1", "at sign"),
]


@pytest.mark.parametrize("host", VALID_HOSTS)
def test_valid_hosts(host: str) -> None:
    assert invalid_host(host) is None


@pytest.mark.parametrize(("host", "why"), INVALID_HOSTS, ids=[w for _, w in INVALID_HOSTS])
def test_invalid_hosts(host: str, why: str) -> None:
    problem = invalid_host(host)
    assert problem is not None, why
    assert "\n" not in problem and "\x00" not in problem and "\x1b" not in problem


@pytest.mark.parametrize("port", [1, 80, 9092, 65535])
def test_valid_ports(port: int) -> None:
    assert invalid_port(port, "port") is None


@pytest.mark.parametrize("port", [0, -1, -5, 65536, 70000, 2**31 - 1, -(2**31)])
def test_invalid_ports(port: int) -> None:
    problem = invalid_port(port, "port")
    assert problem is not None and str(port) in problem


def test_metrics_port_may_be_off_but_not_junk() -> None:
    assert invalid_port(-1, "metrics port", optional=True) is None
    assert invalid_port(-2, "metrics port", optional=True) is not None
    assert invalid_port(0, "metrics port", optional=True) is not None
    assert invalid_port(70000, "metrics port", optional=True) is not None


# -- the whole registration ---------------------------------------------------------------------

INVALID_FIELDS = [
    ({"broker_id": -1}, "broker id"),
    ({"broker_id": -(2**31)}, "broker id"),
    ({"host": ""}, "host"),
    ({"host": "a b"}, "host"),
    ({"port": -5}, "port"),
    ({"port": 0}, "port"),
    ({"port": 70000}, "port"),
    ({"metrics_port": 70000}, "metrics port"),
    ({"metrics_port": -7}, "metrics port"),
    ({"rack": "rack a"}, "rack"),
    ({"rack": "r\x00"}, "rack"),
    ({"rack": "r\n"}, "rack"),
    ({"rack": "r" * 256}, "rack"),
    ({"incarnation_id": ""}, "incarnation id"),
    ({"incarnation_id": "x" * 65}, "incarnation id"),
    ({"incarnation_id": "a b"}, "incarnation id"),
    ({"cluster_id": "c" * 65}, "cluster id"),
    ({"cluster_id": "c\x00"}, "cluster id"),
    ({"previous_broker_epoch": -2}, "previous broker epoch"),
]


def test_a_good_registration_passes() -> None:
    assert invalid_registration(GOOD) is None
    assert invalid_registration(dataclasses.replace(GOOD, rack="", metrics_port=-1)) is None
    assert invalid_registration(dataclasses.replace(GOOD, rack="eu-west-1a/ünï")) is None
    assert (
        invalid_registration(dataclasses.replace(GOOD, cluster_id="MkU3OEVBNTcwNTJENDM2Qk")) is None
    )


@pytest.mark.parametrize(("change", "field"), INVALID_FIELDS, ids=[f for _, f in INVALID_FIELDS])
def test_each_invalid_field_is_named(change: dict, field: str) -> None:
    problem = invalid_registration(dataclasses.replace(GOOD, **change))
    assert problem is not None and field in problem
    assert problem.isprintable(), problem  # junk is quoted, never echoed raw
    assert len(problem) < 200


@given(st.text(max_size=300))
def test_any_host_is_either_valid_or_refused_with_a_printable_message(host: str) -> None:
    problem = invalid_host(host)
    if problem is None:
        assert host and host.isascii() and host.isprintable() and " " not in host
        assert len(host) <= 253
    else:
        assert problem.isprintable() and len(problem) < 200


@pytest.mark.parametrize(("change", "field"), INVALID_FIELDS, ids=[f for _, f in INVALID_FIELDS])
def test_the_core_refuses_junk_and_writes_nothing(change: dict, field: str) -> None:
    h = Harness()
    before = h.core.image.next_offset
    reply = h.take(h.core.register_broker(dataclasses.replace(GOOD, **change), h.now))
    assert reply.error == ErrorCode.INVALID_REQUEST
    assert field in reply.message
    assert h.log == [] and h.core.image.next_offset == before
    assert h.core.image.brokers == {} and h.core.liveness.get(GOOD.broker_id) is None


def test_junk_cluster_id_is_invalid_not_inconsistent() -> None:
    h = Harness()
    reply = h.take(h.core.register_broker(dataclasses.replace(GOOD, cluster_id="x" * 10_000), 0))
    assert reply.error == ErrorCode.INVALID_REQUEST and len(reply.message) < 200
    reply = h.take(h.core.register_broker(dataclasses.replace(GOOD, cluster_id="other"), 0))
    assert reply.error == ErrorCode.INCONSISTENT_CLUSTER_ID and CLUSTER in reply.message


# -- unregistration ------------------------------------------------------------------------------


def test_unregister_an_unknown_broker() -> None:
    h = Harness()
    reply = h.take(h.core.unregister_broker(7, h.now))
    assert reply.error == ErrorCode.BROKER_ID_NOT_REGISTERED and "7" in reply.message
    assert h.log == []


def test_unregister_refuses_a_live_broker() -> None:
    h = Harness()
    h.start(1, 2)
    reply = h.take(h.core.unregister_broker(1, h.now))
    assert reply.error == ErrorCode.INVALID_REQUEST
    assert "broker 1 is alive" in reply.message
    assert h.log[-1].offset == h.core.image.next_offset - 1  # nothing new
    assert 1 in h.core.image.brokers


def test_unregister_refuses_a_fenced_broker_that_still_heartbeats() -> None:
    h = Harness()
    h.register(1)  # registered, fenced until it catches up, but heartbeating
    h.heartbeat(1, offset=-1)
    assert h.core.image.brokers[1].fenced
    before = len(h.log)
    reply = h.take(h.core.unregister_broker(1, h.now))
    assert reply.error == ErrorCode.INVALID_REQUEST and "heartbeat" in reply.message
    assert len(h.log) == before


def test_unregister_a_dead_broker_removes_its_registration_not_its_replicas() -> None:
    h = Harness()
    h.start(1, 2, 3)
    assert h.create("t", partitions=3, rf=3).error == ErrorCode.NONE
    assert h.create("solo", partitions=1, rf=1).error == ErrorCode.NONE
    solo_owner = h.part("solo").leader
    h.close_stream(solo_owner)  # its process died: fenced at once, leaderships moved
    assert h.core.image.brokers[solo_owner].fenced
    epoch = h.core.image.brokers[solo_owner].broker_epoch
    # The sole replica of "solo" stays its only ISR member (Kafka never empties an ISR
    # without ELR), leaderless.
    assert h.part("solo").isr == (solo_owner,) and h.part("solo").leader == NO_LEADER
    before = len(h.log)
    reply = h.take(h.core.unregister_broker(solo_owner, h.now))
    assert reply.error == ErrorCode.NONE, reply.message
    written = [e.record for e in h.log[before:]]
    assert written[-1] == UnregisterBrokerRecord(solo_owner, epoch)
    assert solo_owner not in h.core.image.brokers
    assert h.core.liveness.get(solo_owner) is None
    for index in range(3):
        p = h.part("t", index)
        assert solo_owner in p.replicas  # an offline replica now, as in Kafka
        assert solo_owner not in p.isr and p.leader != solo_owner
    assert h.part("solo").replicas == (solo_owner,)
    assert [e.name for e in h.events].count("broker_unregistered") == 1
    # A second unregister: not registered any more.
    assert h.take(h.core.unregister_broker(solo_owner, h.now)).error == (
        ErrorCode.BROKER_ID_NOT_REGISTERED
    )
    # Durable: replaying the log gives the same image, without the broker.
    replayed = MetadataImage()
    for entry in h.log:
        replayed.apply(entry_from_pb(entry_to_pb(entry)))
    assert replayed == h.core.image
    snap = MetadataImage()
    snap.replace_with_snapshot(h.core.image.to_records(), h.core.image.next_offset)
    assert snap == h.core.image and solo_owner not in snap.brokers
    # The broker may come back later: it registers as new.
    assert h.register(solo_owner, incarnation="back-again").error == ErrorCode.NONE


def test_unregister_record_for_an_older_incarnation_is_ignored() -> None:
    image = MetadataImage()
    h = Harness()
    h.register(1)
    for entry in h.log:
        image.apply(entry)
    epoch = image.brokers[1].broker_epoch
    image.apply_record(UnregisterBrokerRecord(1, epoch - 1))
    assert 1 in image.brokers
    image.apply_record(UnregisterBrokerRecord(1, epoch))
    assert 1 not in image.brokers


# -- election types ---------------------------------------------------------------------------


def test_known_election_types_decode() -> None:
    kind, parts = wire.election(pb.ElectLeadersRequest(election_type=pb.UNCLEAN))
    assert kind is Election.UNCLEAN
    kind, parts = wire.election(
        pb.ElectLeadersRequest(
            election_type=pb.PREFERRED,
            topic_partitions=[pb.TopicPartitions(topic="t", partitions=[0, 1])],
        )
    )
    assert kind is Election.PREFERRED and parts == [("t", 0), ("t", 1)]


@pytest.mark.parametrize("value", [2, 7, -1, 2**31 - 1])
def test_an_unknown_election_type_is_an_invalid_request(value: int) -> None:
    request = pb.ElectLeadersRequest(
        election_type=value,
        topic_partitions=[pb.TopicPartitions(topic="t", partitions=[0, 3])],
    )
    with pytest.raises(InvalidRequestError, match=f"Unknown election type {value}"):
        wire.election(request)
    reply = wire.elect_leaders_error(request, InvalidRequestError(f"Unknown election type {value}"))
    assert reply.error_code == ErrorCode.INVALID_REQUEST
    assert [(r.topic, r.partition, r.error_code) for r in reply.results] == [
        ("t", 0, ErrorCode.INVALID_REQUEST),
        ("t", 3, ErrorCode.INVALID_REQUEST),
    ]
