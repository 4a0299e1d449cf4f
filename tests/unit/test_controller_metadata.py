"""The shared metadata records, image and wire form (metadata/): every record type
survives the protobuf round trip; the image applies each record as brokers and tools expect;
snapshots rebuild an equal image; a resent prefix after a reconnect is skipped."""

from __future__ import annotations

import pytest

from minibroker.metadata.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import (
    AccessControlEntryRecord,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    LogEntry,
    NoOpRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveAccessControlEntryRecord,
    RemoveTopicRecord,
    RemoveUserScramCredentialRecord,
    TopicRecord,
    UserScramCredentialRecord,
)
from minibroker.metadata.wire import (
    apply_batch,
    batch_to_pb,
    record_from_pb,
    record_to_pb,
    snapshot_to_pb,
)

RECORDS = [
    RegisterBrokerRecord(1, "inc-1", 0, "127.0.0.1", 9092, "r1", True, 9100),
    BrokerRegistrationChangeRecord(1, 0, fenced=False),
    BrokerRegistrationChangeRecord(1, 0, in_controlled_shutdown=True),
    BrokerRegistrationChangeRecord(1, 0),
    TopicRecord("orders", "tid-1", {"min.insync.replicas": "2"}),
    PartitionRecord("tid-1", 0, (1, 2, 3), (1, 3), 1, 4, 9, 1, "why"),
    ConfigRecord("tid-1", "retention.ms", "1000"),
    ConfigRecord("tid-1", "retention.ms", None),
    ProducerIdsRecord(1, 0, 5000),
    RemoveTopicRecord("tid-1"),
    NoOpRecord(),
    AccessControlEntryRecord("acl-1", 2, "orders", 4, "User:alice", "*", 3, 3),
    RemoveAccessControlEntryRecord("acl-1"),
    UserScramCredentialRecord("alice", 1, b"salt", b"s" * 32, b"k" * 32, 4096),
    RemoveUserScramCredentialRecord("alice", 1),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_every_record_survives_the_wire(record) -> None:
    msg = record_to_pb(record, offset=7, timestamp_ms=99)
    assert (msg.offset, msg.timestamp_ms) == (7, 99)
    assert record_from_pb(msg) == record


def entries(*records) -> list[LogEntry]:
    return [LogEntry(i, 0, r) for i, r in enumerate(records)]


def test_image_applies_records_in_order() -> None:
    image = MetadataImage()
    for e in entries(*RECORDS[:7]):
        image.apply(e)
    broker = image.brokers[1]
    assert not broker.fenced and broker.in_controlled_shutdown and not broker.is_active
    topic = image.topic("orders")
    assert topic is not None and topic.configs == {
        "min.insync.replicas": "2",
        "retention.ms": "1000",
    }
    assert image.partition("tid-1", 0) == RECORDS[5]
    assert image.offline_partition_count() == 0 and image.partition_count() == 1
    image.apply(LogEntry(7, 0, RECORDS[7]))
    image.apply(LogEntry(8, 0, RECORDS[8]))
    image.apply(LogEntry(9, 0, RECORDS[9]))
    assert "retention.ms" not in topic.configs
    assert image.next_producer_id == 5000
    assert image.topic("orders") is None and image.topics_by_id == {}
    assert image.next_offset == 10
    with pytest.raises(ValueError):
        image.apply(LogEntry(3, 0, NoOpRecord()))


def test_change_for_an_older_incarnation_is_ignored() -> None:
    image = MetadataImage()
    image.apply(LogEntry(0, 0, RegisterBrokerRecord(1, "a", 0, "h", 1)))
    image.apply(LogEntry(1, 0, RegisterBrokerRecord(1, "b", 1, "h", 1)))
    image.apply(LogEntry(2, 0, BrokerRegistrationChangeRecord(1, 0, fenced=False)))
    assert image.brokers[1].fenced and image.brokers[1].incarnation_id == "b"


def test_partition_record_of_unknown_topic_is_ignored() -> None:
    image = MetadataImage()
    image.apply(LogEntry(0, 0, PartitionRecord("nope", 0, (1,), (1,), 1, 0, 0)))
    assert image.partition_count() == 0


def test_snapshot_and_live_batches() -> None:
    source = MetadataImage()
    log = entries(
        *RECORDS[:6],
        AccessControlEntryRecord("acl-1", 2, "or", 4, "User:alice", "*", 3, 3),
        AccessControlEntryRecord("acl-2", 4, "kafka-cluster", 3, "User:*", "10.0.0.1", 7, 2),
        ProducerIdsRecord(1, 0, 3000),
    )
    for e in log:
        source.apply(e)
    follower = MetadataImage()
    apply_batch(follower, snapshot_to_pb(source.to_records(), source.next_offset))
    assert follower == source
    # A live batch that resends entries the follower already has (after a reconnect).
    more = LogEntry(9, 0, PartitionRecord("tid-1", 1, (2,), (2,), 2, 0, 0))
    source.apply(more)
    decoded = apply_batch(follower, batch_to_pb([log[-1], more], 10))
    assert not decoded.is_snapshot and decoded.high_offset == 10
    assert follower == source
    # An empty keep-alive batch changes nothing.
    apply_batch(follower, batch_to_pb([], 10))
    assert follower == source
    assert set(follower.acls) == {"acl-1", "acl-2"}


ALICE_READ = AclBinding(
    ResourceType.TOPIC,
    "orders",
    PatternType.PREFIXED,
    "User:alice",
    "*",
    AclOperation.READ,
    AclPermissionType.ALLOW,
)


def test_image_applies_acl_records_and_keeps_its_view_through_a_snapshot() -> None:
    image = MetadataImage()
    view = image.acls
    image.apply(
        LogEntry(0, 0, AccessControlEntryRecord("a", 2, "orders", 4, "User:alice", "*", 3, 3))
    )
    assert dict(image.acls) == {"a": ALICE_READ}
    assert list(view.matching(ResourceType.TOPIC, "orders-eu")) == [ALICE_READ]
    # A snapshot refills the same object, so an authorizer holding it sees the new state.
    other = MetadataImage()
    other.apply(LogEntry(0, 0, AccessControlEntryRecord("b", 2, "x", 3, "User:bob", "*", 4, 2)))
    image.replace_with_snapshot(other.to_records(), 1)
    assert image.acls is view and set(view) == {"b"}
    assert list(view.matching(ResourceType.TOPIC, "orders-eu")) == []
    image.apply(LogEntry(1, 0, RemoveAccessControlEntryRecord("b")))
    image.apply(LogEntry(2, 0, RemoveAccessControlEntryRecord("b")))  # replayed: harmless
    assert len(view) == 0 and image.next_offset == 3


def test_scram_credentials_apply_and_survive_snapshots() -> None:
    alice256 = UserScramCredentialRecord("alice", 1, b"salt1", b"a" * 32, b"b" * 32, 4096)
    alice512 = UserScramCredentialRecord("alice", 2, b"salt2", b"c" * 64, b"d" * 64, 8192)
    bob = UserScramCredentialRecord("bob", 1, b"salt3", b"e" * 32, b"f" * 32, 4096)
    image = MetadataImage()
    for e in entries(alice256, alice512, bob, RemoveUserScramCredentialRecord("bob", 1)):
        image.apply(e)
    assert sorted(image.scram_credentials) == ["alice"]
    credential = image.scram_credential("alice", 2)
    assert credential is not None
    assert (credential.salt, credential.stored_key, credential.iterations) == (
        b"salt2",
        b"c" * 64,
        8192,
    )
    assert image.scram_credential("bob", 1) is None and image.scram_credential("alice", 9) is None
    # Replacing a credential keeps one per (user, mechanism).
    image.apply(
        LogEntry(4, 0, UserScramCredentialRecord("alice", 1, b"n", b"g" * 32, b"h" * 32, 5000))
    )
    assert image.scram_credential("alice", 1).iterations == 5000  # type: ignore[union-attr]
    # The snapshot (through the wire) rebuilds an equal image, keys and all.
    follower = MetadataImage()
    apply_batch(follower, snapshot_to_pb(image.to_records(), image.next_offset))
    assert follower == image and follower.scram_credentials == image.scram_credentials
    # Removing the last credential removes the user; removing an absent one changes nothing.
    image.apply(LogEntry(5, 0, RemoveUserScramCredentialRecord("alice", 1)))
    image.apply(LogEntry(6, 0, RemoveUserScramCredentialRecord("alice", 2)))
    image.apply(LogEntry(7, 0, RemoveUserScramCredentialRecord("carol", 1)))
    assert image.scram_credentials == {}
    assert "stored" not in repr(alice256) and "aaaa" not in repr(alice256)
