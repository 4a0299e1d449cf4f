"""The group coordinator's shell with an in-memory __consumer_offsets (tests/unit/group_support.py):
where a group lives (Java's String.hashCode), loading and unloading on leadership, writes that
become visible only once acknowledged, what a failed write answers, and offsets expiry."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kio.schema.errors import ErrorCode as KafkaError

from minibroker.broker.groups import coordinator as coordinator_module
from minibroker.broker.groups.coordinator import (
    OFFSETS_TOPIC,
    expired_offsets,
    group_write_error,
    java_string_hash,
    partition_for,
    produce_error,
)
from minibroker.broker.groups.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    encode_group_value,
    encode_key,
    encode_offset_value,
)
from minibroker.broker.replication.events import Role
from minibroker.client.errors import ErrorCode
from minibroker.client.records import encode_batch, iter_records
from minibroker.client.types import TopicPartition
from minibroker.metadata.records import PartitionRecord
from tests.unit.group_support import (
    OFFSETS_TOPIC_ID,
    PARTITIONS,
    Clock,
    FakeReplicaManager,
    coordinator,
    lead_all,
    settle,
)

# Computed with Java 17: String.hashCode() and Utils.abs(h) % 50.
JAVA = [
    ("group", 98629247, 47),
    ("", 0, 0),
    ("console-consumer-12345", 158455506, 6),
    ("my-group", -1906497762, 12),
    ("polygenelubricants", -2147483648, 0),  # Integer.MIN_VALUE: Utils.abs gives 0
    ("gr\u00fcppe", -1233264812, 12),
    ("g\U0001f600x", 58028462, 12),  # a surrogate pair counts as two chars
    ("a-very-long-consumer-group-name-with-many-characters-0123456789", -639976770, 20),
]


@pytest.mark.parametrize(("group", "hash_code", "partition"), JAVA)
def test_partition_for_is_javas(group: str, hash_code: int, partition: int) -> None:
    assert java_string_hash(group) == hash_code
    assert partition_for(group, 50) == partition


def group_in(p: int, prefix: str = "g") -> str:
    """A group id living in partition p of PARTITIONS."""
    for i in range(1000):
        if partition_for(f"{prefix}{i}", PARTITIONS) == p:
            return f"{prefix}{i}"
    raise AssertionError


async def test_check_answers_by_partition_state() -> None:
    rm = FakeReplicaManager()
    c, _ = coordinator(rm)
    g = group_in(1)
    assert c.check(g) == KafkaError.coordinator_not_available  # no __consumer_offsets yet
    assert c.check("") == KafkaError.invalid_group_id
    rm.create_offsets_topic()
    assert c.check(g) == KafkaError.not_coordinator
    rm.role(c, 1, Role.LEADER)
    assert c.check(g) == KafkaError.coordinator_load_in_progress
    await settle(c)
    assert c.check(g) == KafkaError.none
    assert c.check(group_in(0)) == KafkaError.not_coordinator
    rm.role(c, 1, Role.FOLLOWER)
    assert c.check(g) == KafkaError.not_coordinator


def batch(*records: tuple[bytes, bytes | None]) -> bytes:
    return encode_batch([(5, k, v, ()) for k, v in records])


def offset_record(group: str, topic: str, p: int, offset: int | None) -> tuple[bytes, bytes | None]:
    value = None if offset is None else encode_offset_value(OffsetCommitValue(offset, "m", 7))
    return encode_key(OffsetCommitKey(group, topic, p)), value


def group_record(group: str, value: GroupMetadataValue | None) -> tuple[bytes, bytes | None]:
    return encode_key(GroupMetadataKey(group)), None if value is None else encode_group_value(value)


MEMBER = MemberMetadata("m-1", None, "cli", "/127.0.0.1", 30000, 6000, b"s", b"a")


async def test_load_replays_the_log_last_record_wins() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, membership = coordinator(rm)
    a, b, gone = group_in(2, "a"), group_in(2, "b"), group_in(2, "x")
    log = rm.logs[2]
    stable = GroupMetadataValue("consumer", 3, "range", "m-1", 50, (MEMBER,))
    log.append(batch(offset_record(a, "events", 0, 10), offset_record(a, "events", 1, 20)))
    log.append(batch(offset_record(a, "events", 0, 11), offset_record(a, "events", 1, None)))
    log.append(batch(group_record(b, GroupMetadataValue("consumer", 1, "range", "m-1", 1))))
    log.append(batch(group_record(b, stable), group_record(gone, stable)))
    log.append(batch(group_record(gone, None), (b"\x00\x09junk", b"x")))  # unreadable: skipped
    rm.role(c, 2, Role.LEADER)
    await settle(c)
    assert c.committed(a) == {("events", 0): OffsetCommitValue(11, "m", 7)}
    assert membership.loaded_values == {b: stable}
    assert c.known_groups() == sorted([a, b])
    rm.role(c, 2, Role.FOLLOWER)
    assert sorted(membership.unloaded_groups) == sorted([a, b])
    assert c.committed(a) == {} and c.known_groups() == []


async def test_commit_is_written_with_acks_all_and_survives_a_reload() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    clock = Clock(5000)
    c, _ = coordinator(rm, clock, offsets_commit_timeout_ms=1234)
    await lead_all(rm, c)
    g = group_in(0)
    value = OffsetCommitValue(42, "meta", 5000, 3)
    assert await c.commit_offsets(g, {("events", 1): value}) == KafkaError.none
    acks, timeout, parts = rm.produced[-1]
    assert (acks, timeout) == (-1, 1234)
    assert [(p.topic, p.partition) for p in parts] == [(OFFSETS_TOPIC, 0)]
    [record] = list(iter_records(parts[0].records))
    assert record.key == encode_key(OffsetCommitKey(g, "events", 1))
    assert record.value == encode_offset_value(value)
    assert c.committed(g) == {("events", 1): value}
    # Lose and regain the partition: the same offsets come back from the log.
    rm.role(c, 0, Role.FOLLOWER)
    assert c.committed(g) == {}
    rm.role(c, 0, Role.LEADER)
    await settle(c)
    assert c.committed(g) == {("events", 1): value}


async def test_a_failed_commit_is_not_visible() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, _ = coordinator(rm)
    await lead_all(rm, c)
    g = group_in(1)
    rm.produce_error = ErrorCode.NOT_LEADER_OR_FOLLOWER
    code = await c.commit_offsets(g, {("events", 0): OffsetCommitValue(1, "", 1)})
    assert code == KafkaError.not_coordinator
    assert c.committed(g) == {}


async def test_store_group_and_deletion_write_tombstones() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, membership = coordinator(rm)
    await lead_all(rm, c)
    g = group_in(1)
    empty = GroupMetadataValue("consumer", 2, None, None, 10, ())
    assert await c.store_group(g, empty) == KafkaError.none
    await c.commit_offsets(g, {("events", 0): OffsetCommitValue(1, "", 1)})
    membership.states[g] = ("Stable", "consumer")
    assert await c.delete_group(g) == KafkaError.non_empty_group
    membership.states[g] = ("Empty", "consumer")
    assert await c.delete_group(g) == KafkaError.none
    assert membership.deleted == [g]
    last = list(iter_records(rm.produced[-1][2][0].records))
    assert [(r.key, r.value) for r in last] == [
        (encode_key(OffsetCommitKey(g, "events", 0)), None),
        (encode_key(GroupMetadataKey(g)), None),
    ]
    assert await c.delete_group(g) == KafkaError.group_id_not_found
    # A reload finds nothing of it.
    rm.role(c, 1, Role.FOLLOWER)
    rm.role(c, 1, Role.LEADER)
    await settle(c)
    assert c.known_groups() == [] and c.committed(g) == {}


def test_produce_errors_map_as_the_classic_coordinator() -> None:
    assert produce_error(ErrorCode.NONE) == KafkaError.none
    assert produce_error(ErrorCode.NOT_LEADER_OR_FOLLOWER) == KafkaError.not_coordinator
    assert produce_error(ErrorCode.KAFKA_STORAGE_ERROR) == KafkaError.not_coordinator
    for code in (
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ):
        assert produce_error(code) == KafkaError.coordinator_not_available
    assert produce_error(ErrorCode.MESSAGE_TOO_LARGE) == KafkaError.invalid_commit_offset_size
    assert produce_error(ErrorCode.CORRUPT_MESSAGE) == KafkaError.unknown_server_error


RETENTION = 1000


def test_expiry_rules() -> None:
    offsets = {
        ("t", 0): OffsetCommitValue(1, "", commit_timestamp=100),
        ("t", 1): OffsetCommitValue(1, "", commit_timestamp=900),
        ("t", 2): OffsetCommitValue(1, "", commit_timestamp=100, expire_timestamp=5000),
    }
    # Simple commits (no group): commit timestamp + retention, or the asked expire timestamp.
    assert expired_offsets(offsets, None, -1, RETENTION, 1099) == []
    assert expired_offsets(offsets, None, -1, RETENTION, 1100) == [("t", 0)]
    assert expired_offsets(offsets, None, -1, RETENTION, 5000) == [("t", 0), ("t", 1), ("t", 2)]
    # An Empty group: from when it became Empty, whatever the commit times.
    assert expired_offsets(offsets, "Empty", 2000, RETENTION, 2999) == []
    assert expired_offsets(offsets, "Empty", 2000, RETENTION, 3000) == [("t", 0), ("t", 1)]
    # A group with members never expires its offsets.
    for state in ("Stable", "PreparingRebalance", "CompletingRebalance"):
        assert expired_offsets(offsets, state, 0, RETENTION, 10**9) == []


async def test_expiry_pass_writes_tombstones_and_deletes_empty_groups() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    clock = Clock(0)
    c, membership = coordinator(rm, clock, offsets_retention_ms=RETENTION)
    await lead_all(rm, c)
    simple, empty, stable = group_in(0, "s"), group_in(1, "e"), group_in(2, "t")
    for g in (simple, empty, stable):
        await c.commit_offsets(g, {("events", 0): OffsetCommitValue(1, "", 0)})
    await c.store_group(empty, GroupMetadataValue("consumer", 1, None, None, 500, ()))
    membership.states[empty] = ("Empty", "consumer")
    membership.states[stable] = ("Stable", "consumer")
    clock.now = 1000
    assert await c.expire_once() == 1  # only the simple commit
    assert c.committed(simple) == {} and c.committed(empty) != {}
    clock.now = 1500
    assert await c.expire_once() == 1
    assert c.committed(empty) == {} and membership.deleted == [empty]
    last = list(iter_records(rm.produced[-1][2][0].records))
    assert [r.value for r in last] == [None, None]  # offset and group tombstones
    assert c.committed(stable) != {}
    assert c.known_groups() == [stable]


async def test_replica_removed_unloads() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, membership = coordinator(rm)
    await lead_all(rm, c)
    g = group_in(2)
    await c.commit_offsets(g, {("events", 0): OffsetCommitValue(1, "", 0)})
    rm.remove(2)
    assert c.check(g) == KafkaError.not_coordinator
    assert membership.unloaded_groups == [g]
    assert set(c.partitions) == {p for p in range(PARTITIONS) if p != 2}


async def test_offsets_of_deleted_topics_go_even_for_groups_with_members() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, membership = coordinator(rm, Clock(0), offsets_retention_ms=RETENTION)
    await lead_all(rm, c)
    g = group_in(1)
    await c.commit_offsets(
        g,
        {("events", 0): OffsetCommitValue(1, "", 0), ("events", 1): OffsetCommitValue(2, "", 0)},
    )
    membership.states[g] = ("Stable", "consumer")
    assert await c.expire_once() == 0
    # Partition 1 of events goes away (as if the topic were recreated with one partition).
    topic = rm.image.topic("events")
    assert topic is not None
    del topic.partitions[1]
    assert await c.expire_once() == 1
    assert c.committed(g) == {("events", 0): OffsetCommitValue(1, "", 0)}
    last = list(iter_records(rm.produced[-1][2][0].records))
    assert [(r.key, r.value) for r in last] == [(encode_key(OffsetCommitKey(g, "events", 1)), None)]


async def overlapped(rm: FakeReplicaManager, *coros: Any) -> list[Any]:
    """Run the writes so that each appends before any is acknowledged (in the given order)."""
    hold = rm.hold = asyncio.Event()
    tasks = []
    for coro in coros:
        tasks.append(asyncio.ensure_future(coro))
        for _ in range(5):
            await asyncio.sleep(0)
    hold.set()
    rm.hold = None
    return list(await asyncio.gather(*tasks))


async def test_commit_overlapping_an_expiry_pass_survives() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    clock = Clock(0)
    c, _ = coordinator(rm, clock, offsets_retention_ms=RETENTION)
    await lead_all(rm, c)
    g = group_in(1)
    await c.commit_offsets(g, {("events", 0): OffsetCommitValue(1, "", 0)})
    clock.now = 5000  # the old commit is due
    fresh = OffsetCommitValue(500, "", 5000)
    code, removed = await overlapped(
        rm, c.commit_offsets(g, {("events", 0): fresh}), c.expire_once()
    )
    assert code == KafkaError.none and removed == 0
    assert c.committed(g) == {("events", 0): fresh}  # the acknowledged commit is kept


async def test_commit_overlapping_a_delete_is_tombstoned_too() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, _ = coordinator(rm)
    await lead_all(rm, c)
    g = group_in(1)
    await c.commit_offsets(g, {("events", 0): OffsetCommitValue(1, "", 0)})
    codes = await overlapped(
        rm,
        c.commit_offsets(g, {("events", 1): OffsetCommitValue(2, "", 0)}),
        c.delete_group(g),
    )
    assert codes == [KafkaError.none, KafkaError.none]
    assert c.committed(g) == {}
    # And a reload agrees: no offset of the deleted group comes back.
    c2, _ = coordinator(rm)
    await lead_all(rm, c2)
    assert c2.committed(g) == {}


async def test_delete_spares_a_group_revived_during_the_write() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, membership = coordinator(rm)
    await lead_all(rm, c)
    g = group_in(1)
    await c.store_group(g, GroupMetadataValue("consumer", 1, None, None, 0, ()))
    membership.states[g] = ("Empty", "consumer")

    async def join() -> None:
        membership.states[g] = ("PreparingRebalance", "consumer")

    code, _ = await overlapped(rm, c.delete_group(g), join())
    assert code == KafkaError.non_empty_group
    assert membership.deleted == [] and membership.state(g) is not None


async def test_expiry_spares_a_group_revived_during_the_write() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    clock = Clock(0)
    c, membership = coordinator(rm, clock, offsets_retention_ms=RETENTION)
    await lead_all(rm, c)
    g = group_in(1)
    await c.store_group(g, GroupMetadataValue("consumer", 1, None, None, 0, ()))
    membership.states[g] = ("Empty", "consumer")
    clock.now = 5000

    async def join() -> None:
        membership.states[g] = ("PreparingRebalance", "consumer")

    await overlapped(rm, c.expire_once(), join())
    assert membership.deleted == [] and membership.state(g) is not None


async def test_unload_tells_the_membership_of_groups_it_alone_has() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, membership = coordinator(rm)
    await lead_all(rm, c)
    g = group_in(1)
    membership.states[g] = ("PreparingRebalance", "consumer")  # joining, nothing stored yet
    rm.role(c, 1, Role.FOLLOWER)
    assert membership.unloaded_groups == [g]


async def test_empty_group_expiry_counts_from_the_live_state_timestamp() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    clock = Clock(0)
    c, membership = coordinator(rm, clock, offsets_retention_ms=RETENTION)
    await lead_all(rm, c)
    g = group_in(1)
    await c.commit_offsets(g, {("events", 0): OffsetCommitValue(1, "", 0)})
    # Stored as Stable long ago; it became Empty at 10000 but that record failed to write.
    await c.store_group(g, GroupMetadataValue("consumer", 1, None, None, 0, ()))
    membership.states[g] = ("Empty", "consumer")
    membership.timestamps[g] = 10000
    clock.now = 10500
    assert await c.expire_once() == 0
    clock.now = 11000
    assert await c.expire_once() == 1


async def test_failed_data_dir_is_not_coordinated_and_an_abandoned_load_is_forgotten() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, _ = coordinator(rm)
    await lead_all(rm, c)
    g = group_in(1)
    assert c.check(g) == KafkaError.none
    rm.log_dir_failure = object()
    assert c.check(g) == KafkaError.not_coordinator
    rm.log_dir_failure = None
    # A load that finds its replica gone stops and leaves no "loading" partition behind.
    await c.commit_offsets(g, {("events", 0): OffsetCommitValue(1, "", 0)})
    await c.commit_offsets(g, {("events", 0): OffsetCommitValue(2, "", 0)})
    rm.role(c, 1, Role.FOLLOWER)
    rm.role(c, 1, Role.LEADER)
    await asyncio.sleep(0)  # the load read its first batch
    assert c.partitions[1] == "loading"
    del rm.partitions[TopicPartition(OFFSETS_TOPIC, 1)]
    await settle(c)
    assert 1 not in c.partitions and 1 not in c._loads
    assert c.check(g) == KafkaError.not_coordinator


async def test_store_group_acknowledged_after_an_unload_is_not_kept() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, _ = coordinator(rm)
    await lead_all(rm, c)
    g = group_in(1)

    async def unload() -> None:
        rm.role(c, 1, Role.FOLLOWER)

    await overlapped(
        rm, c.store_group(g, GroupMetadataValue("consumer", 1, None, None, 0, ())), unload()
    )
    assert g not in c.group_values


async def test_stop_stops_the_membership_and_the_tasks() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, membership = coordinator(rm)
    await lead_all(rm, c)
    expiry = c._expiry
    assert expiry is not None and not expiry.done()
    await c.stop()
    assert membership.stopped and expiry.done()


async def test_a_failed_load_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(coordinator_module, "LOAD_RETRY_S", 0.001)
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, _ = coordinator(rm)
    g = group_in(1)
    rm.logs[1].append(
        encode_batch(
            [
                (
                    0,
                    encode_key(OffsetCommitKey(g, "events", 0)),
                    encode_offset_value(OffsetCommitValue(7, "", 0), 3),
                    (),
                )
            ]
        )
    )
    read, failures = rm.logs[1].read, [OSError("damaged")]

    def flaky(offset: int, max_bytes: int) -> Any:
        if failures:
            raise failures.pop()
        return read(offset, max_bytes)

    monkeypatch.setattr(rm.logs[1], "read", flaky)
    rm.role(c, 1, Role.LEADER)
    for _ in range(200):
        if c.partitions.get(1) == "loaded":
            break
        await asyncio.sleep(0.001)
    assert c.check(g) == KafkaError.none and c.committed(g)[("events", 0)].offset == 7
    assert 1 not in c._loads


async def test_the_expiry_loop_logs_a_failed_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, _ = coordinator(rm, offsets_retention_check_interval_ms=1)
    logged: list[str] = []

    class Log:
        def error(self, event: str, **kw: Any) -> None:
            logged.append(event)

        def __getattr__(self, name: str) -> Any:
            return lambda *a, **k: None

    async def boom() -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(coordinator_module, "log", Log())
    monkeypatch.setattr(c, "expire_once", boom)
    await lead_all(rm, c)
    for _ in range(100):
        if logged:
            break
        await asyncio.sleep(0.002)
    assert "offsets_expiry_failed" in logged
    await c.stop()


def test_group_metadata_write_errors_map_as_kafkas() -> None:
    assert group_write_error(ErrorCode.MESSAGE_TOO_LARGE) == KafkaError.unknown_server_error
    assert group_write_error(ErrorCode.RECORD_LIST_TOO_LARGE) == KafkaError.unknown_server_error
    assert group_write_error(ErrorCode.NOT_LEADER_OR_FOLLOWER) == KafkaError.not_coordinator
    assert group_write_error(ErrorCode.REQUEST_TIMED_OUT) == KafkaError.coordinator_not_available
    assert group_write_error(ErrorCode.NOT_ENOUGH_REPLICAS) == KafkaError.coordinator_not_available
    assert group_write_error(ErrorCode.CORRUPT_MESSAGE) == KafkaError.corrupt_message


async def test_store_group_answers_the_group_metadata_mapping() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, _ = coordinator(rm)
    await lead_all(rm, c)
    rm.produce_error = ErrorCode.MESSAGE_TOO_LARGE
    value = GroupMetadataValue("consumer", 1, None, None, 0, ())
    assert await c.store_group(group_in(1), value) == KafkaError.unknown_server_error
    g = group_in(2)
    assert await c.commit_offsets(g, {("events", 0): OffsetCommitValue(1, "", 0)}) == (
        KafkaError.invalid_commit_offset_size
    )


def test_offset_metadata_max_bytes_is_capped_at_what_a_record_holds(tmp_path: Any) -> None:
    from minibroker.broker.config import build_config
    from minibroker.client.common.config import ConfigError

    base = {"node.id": 1, "log.dirs": str(tmp_path)}
    assert build_config({**base, "offset.metadata.max.bytes": 32767})
    with pytest.raises(ConfigError, match=r"offset\.metadata\.max\.bytes"):
        build_config({**base, "offset.metadata.max.bytes": 32768})


def test_a_group_id_longer_than_a_record_holds_is_invalid() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, _ = coordinator(rm)
    assert c.check("\u00e9" * 16384) == KafkaError.invalid_group_id  # 32768 UTF-8 bytes
    assert c.check("\u00e9" * 16383) == KafkaError.not_coordinator


async def test_the_partition_count_is_fixed_when_first_seen() -> None:
    rm = FakeReplicaManager()
    c, _ = coordinator(rm)
    rm.create_offsets_topic()
    assert c.num_partitions() == PARTITIONS
    # A partition added later (CreatePartitions) does not move the groups.
    rm.image.apply_record(PartitionRecord(OFFSETS_TOPIC_ID, PARTITIONS, (1, 2), (1, 2), 1, 1, 1))
    assert c.num_partitions() == PARTITIONS
