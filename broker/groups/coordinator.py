"""The group coordinator's shell: `__consumer_offsets`, its partitions' loading and unloading,
the committed offsets table, and the writes of offsets and group metadata (GROUPS-SPEC.md).

I/O shell, event-loop thread only. A group belongs to partition abs(javaHashCode(group)) % N of
`__consumer_offsets` (Kafka's GroupCoordinatorService.partitionFor); this broker coordinates it
while it leads that partition and has loaded it. Leadership arrives as the replica manager's
RoleChanged outputs (broker/replicas/manager.py `role_listeners`): on becoming leader the
partition is read from its log start to its end through the log's own read path, the records
decoded (client/records, then client/consumer_offsets.py) into the offsets table, and each
group's last GroupMetadata value handed to `membership.loaded`; until that is done the
partition's groups answer COORDINATOR_LOAD_IN_PROGRESS. On becoming follower (or losing the
replica) the partition's groups are forgotten here and `membership.unloaded` is told.

Writes are one v2 batch of key/value records appended with acks=all through the replica
manager (no user ACLs: the coordinator writes for itself); the table changes only after the
append is acknowledged, so an OffsetFetch never sees a commit that could still be lost.

Offsets expiry follows Kafka 2.1+ (KIP-211): an Empty group's offsets expire
offsets.retention.minutes after the group became Empty (its current state timestamp); offsets
of a group that is unknown to the membership (simple commits, generation -1) expire that long
after their commit (or at the expire timestamp a v2-v4 OffsetCommit asked for); a group with
members never has its offsets expired. Offsets of deleted topics go at the next pass whatever the
group's state. An Empty group left with no offsets gets a tombstone too and is forgotten (Kafka
deletes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kio.schema.errors import ErrorCode

from minibroker.broker import wire
from minibroker.broker.groups import membership
from minibroker.broker.groups.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordFormatError,
    decode_key,
    decode_value,
    encode_group_value,
    encode_key,
    encode_offset_value,
)
from minibroker.broker.replication.events import Role
from minibroker.broker.replication.outputs import ReplicaRemoved, RoleChanged
from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.common.log import get_logger
from minibroker.client.records import encode_batch, iter_decoded_batches
from minibroker.client.types import NO_LEADER, TopicPartition
from minibroker.proto import minibroker_pb2 as pb

if TYPE_CHECKING:
    from minibroker.broker.replicas.manager import ReplicaManager

log = get_logger("minibroker.broker.groups")

OFFSETS_TOPIC = "__consumer_offsets"
# How much of a partition one read of the load takes (the loop runs other work in between).
LOAD_READ_BYTES = 1 << 20
# The first wait before a failed load is tried again, and the longest (doubling between).
LOAD_RETRY_S = 0.5
LOAD_RETRY_MAX_S = 30.0
# The longest string a record's field holds (a Kafka string: int16 length of UTF-8 bytes).
MAX_STRING_BYTES = 32767
# How long the creation of __consumer_offsets may wait for the controller.
CREATE_TIMEOUT_MS = 30000


def utf16_length(text: str) -> int:
    """Java's String.length(): UTF-16 code units (a character beyond the BMP counts two)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def java_string_hash(text: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... + s[n-1] over UTF-16 code units, in int32."""
    h = 0
    data = text.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def kafka_abs(n: int) -> int:
    """Kafka's Utils.abs: Integer.MIN_VALUE maps to 0, not to itself."""
    return 0 if n == -(2**31) else abs(n)


def partition_for(group_id: str, partitions: int) -> int:
    return kafka_abs(java_string_hash(group_id)) % partitions


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """The group coordinator's settings (broker/config.py GROUP_KEYS), in ms where timed."""

    offsets_topic_num_partitions: int = 50
    offsets_topic_replication_factor: int = 3
    offsets_topic_segment_bytes: int = 104857600
    offsets_retention_ms: int = 10080 * 60000
    offsets_retention_check_interval_ms: int = 600000
    offsets_commit_timeout_ms: int = 5000
    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1800000
    group_initial_rebalance_delay_ms: int = 3000
    group_max_size: int = 2147483647
    offset_metadata_max_bytes: int = 4096

    @classmethod
    def from_config(cls, values: Any) -> GroupConfig:
        return cls(
            offsets_topic_num_partitions=int(values["offsets.topic.num.partitions"]),
            offsets_topic_replication_factor=int(values["offsets.topic.replication.factor"]),
            offsets_topic_segment_bytes=int(values["offsets.topic.segment.bytes"]),
            offsets_retention_ms=int(values["offsets.retention.minutes"]) * 60000,
            offsets_retention_check_interval_ms=int(values["offsets.retention.check.interval.ms"]),
            offsets_commit_timeout_ms=int(values["offsets.commit.timeout.ms"]),
            group_min_session_timeout_ms=int(values["group.min.session.timeout.ms"]),
            group_max_session_timeout_ms=int(values["group.max.session.timeout.ms"]),
            group_initial_rebalance_delay_ms=int(values["group.initial.rebalance.delay.ms"]),
            group_max_size=int(values["group.max.size"]),
            offset_metadata_max_bytes=int(values["offset.metadata.max.bytes"]),
        )

    def offsets_topic_configs(self) -> dict[str, str]:
        """The configs __consumer_offsets is created with (Kafka's)."""
        return {
            "cleanup.policy": "compact",
            "min.insync.replicas": str(min(2, self.offsets_topic_replication_factor)),
            "segment.bytes": str(self.offsets_topic_segment_bytes),
        }


class MembershipApi(Protocol):
    """What the coordinator and the offset handlers use of G2's Membership."""

    def loaded(self, group_id: str, value: GroupMetadataValue) -> None: ...
    def unloaded(self, group_ids: Iterable[str]) -> None: ...
    def validate_commit(
        self, group_id: str, member_id: str, generation: int, instance_id: str | None
    ) -> ErrorCode: ...
    def state(self, group_id: str) -> tuple[str, str] | None: ...
    def deletable(self, group_id: str) -> ErrorCode: ...
    def delete(self, group_id: str) -> None: ...
    def groups(self) -> Iterable[str]: ...
    def state_timestamp(self, group_id: str) -> int | None: ...
    def stop(self) -> Awaitable[None] | None: ...


def produce_error(code: int) -> ErrorCode:
    """A failed append's code as the classic coordinator answers it."""
    if code == ErrorCode.none:
        return ErrorCode.none
    if code in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
        return ErrorCode.not_coordinator
    if code in (
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.not_enough_replicas,
        ErrorCode.not_enough_replicas_after_append,
        ErrorCode.request_timed_out,
    ):
        return ErrorCode.coordinator_not_available
    if code in (
        ErrorCode.message_too_large,
        ErrorCode.record_list_too_large,
        ErrorCode.invalid_fetch_size,
    ):
        return ErrorCode.invalid_commit_offset_size
    return ErrorCode.unknown_server_error


def group_write_error(code: int) -> ErrorCode:
    """A failed group-metadata append's code (Kafka's appendGroupMetadataErrorToResponseError):
    not the offset commits' mapping, and codes it does not name are passed through."""
    if code in (
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.not_enough_replicas,
        ErrorCode.not_enough_replicas_after_append,
        ErrorCode.request_timed_out,
    ):
        return ErrorCode.coordinator_not_available
    if code in (ErrorCode.not_leader_or_follower, ErrorCode.kafka_storage_error):
        return ErrorCode.not_coordinator
    if code in (
        ErrorCode.message_too_large,
        ErrorCode.record_list_too_large,
        ErrorCode.invalid_fetch_size,
    ):
        return ErrorCode.unknown_server_error
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.unknown_server_error


def expired_offsets(
    offsets: dict[tuple[str, int], OffsetCommitValue],
    state: str | None,
    current_state_timestamp: int,
    retention_ms: int,
    now: int,
) -> list[tuple[str, int]]:
    """The partitions whose offsets expire now (Kafka 2.1+). `state`: the group's state as the
    membership names it (None: the membership does not know it: a simple-commit group)."""
    if state is not None and state != "Empty":
        return []  # a group with members keeps its offsets
    expired = []
    for tp, value in offsets.items():
        if value.expire_timestamp >= 0:
            deadline = value.expire_timestamp  # asked for by an OffsetCommit v2-v4
        elif state == "Empty" and current_state_timestamp >= 0:
            deadline = current_state_timestamp + retention_ms
        else:
            deadline = value.commit_timestamp + retention_ms
        if now >= deadline:
            expired.append(tp)
    return sorted(expired)


def _membership(coordinator: GroupCoordinator, config: GroupConfig) -> MembershipApi:
    """G2's Membership, given its config (broker/groups/membership.py's GroupConfig) from
    ours."""
    settings = membership.GroupConfig(
        min_session_timeout_ms=config.group_min_session_timeout_ms,
        max_session_timeout_ms=config.group_max_session_timeout_ms,
        initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
        max_size=config.group_max_size,
    )
    return membership.Membership(coordinator, settings)  # type: ignore[return-value,unused-ignore]


class GroupCoordinator:
    """One per broker, built in broker/app.py next to KafkaHandlers and given to it."""

    def __init__(
        self,
        rm: ReplicaManager,
        config: GroupConfig,
        clock: Callable[[], int] = wall_clock_ms,
        membership: Callable[[GroupCoordinator, GroupConfig], MembershipApi] | None = None,
    ) -> None:
        self.rm = rm
        self.config = config
        self.clock = clock
        # partition -> state: "loading" while its load runs, "loaded" once done.
        self.partitions: dict[int, str] = {}
        self._loads: dict[int, asyncio.Task[None]] = {}
        # group -> (topic, partition) -> committed value (only loaded partitions' groups).
        self.offsets: dict[str, dict[tuple[str, int], OffsetCommitValue]] = {}
        # group -> its last GroupMetadata value written or loaded.
        self.group_values: dict[str, GroupMetadataValue] = {}
        self._creating: asyncio.Task[None] | None = None
        self._expiry: asyncio.Task[None] | None = None
        # group -> [its lock, how many hold or wait for it]: each group's check -> append ->
        # apply runs under it, so a commit, an expiry pass, a delete and a metadata store of
        # one group never interleave around an append's await.
        self._locks: dict[str, list[Any]] = {}
        self._partition_count: int | None = None  # __consumer_offsets' once first seen
        self.membership: MembershipApi = (membership or _membership)(self, config)
        rm.role_listeners.append(self.on_role_output)

    # -- where groups live ---------------------------------------------------------------

    def num_partitions(self) -> int:
        """The partitions __consumer_offsets has (the config until it exists), fixed when this
        coordinator first sees the topic, as Kafka fixes it at startup: groups never move
        between partitions under their members."""
        if self._partition_count is not None:
            return self._partition_count
        topic = self.rm.image.topic(OFFSETS_TOPIC)
        if topic is not None and topic.partitions:
            self._partition_count = len(topic.partitions)
            return self._partition_count
        return self.config.offsets_topic_num_partitions

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.num_partitions())

    def check(self, group_id: str) -> ErrorCode:
        """Whether this broker coordinates `group_id` now."""
        if not group_id or len(group_id.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES:
            return ErrorCode.invalid_group_id  # a longer one could not be written
        if self.rm.image.topic(OFFSETS_TOPIC) is None:
            return ErrorCode.coordinator_not_available
        if self.rm.log_dir_failure is not None:
            return ErrorCode.not_coordinator  # the data dir is offline: nothing is served here
        state = self.partitions.get(self.partition_for(group_id))
        if state == "loaded":
            return ErrorCode.none
        if state == "loading":
            return ErrorCode.coordinator_load_in_progress
        return ErrorCode.not_coordinator

    def coordinator_of(self, group_id: str) -> tuple[ErrorCode, int]:
        """FindCoordinator's answer: (error, leader broker id of the group's partition).
        Starts creating __consumer_offsets when it does not exist."""
        if not group_id:
            return ErrorCode.invalid_group_id, -1
        topic = self.rm.image.topic(OFFSETS_TOPIC)
        if topic is None:
            self.ensure_offsets_topic()
            return ErrorCode.coordinator_not_available, -1
        record = topic.partitions.get(self.partition_for(group_id))
        if record is None or record.leader == NO_LEADER:
            return ErrorCode.coordinator_not_available, -1
        return ErrorCode.none, record.leader

    def ensure_offsets_topic(self) -> None:
        """Ask the controller for __consumer_offsets (once at a time), as Kafka's broker
        does on the first FindCoordinator."""
        if self._creating is not None and not self._creating.done():
            return
        self._creating = self.rm.spawn(self._create_offsets_topic(), "create-offsets-topic")

    async def _create_offsets_topic(self) -> None:
        link = self.rm.link
        if link is None:
            return
        request = pb.CreateTopicsRequest(timeout_ms=CREATE_TIMEOUT_MS, validate_only=False)
        request.topics.add(
            name=OFFSETS_TOPIC,
            num_partitions=self.config.offsets_topic_num_partitions,
            replication_factor=self.config.offsets_topic_replication_factor,
            configs=self.config.offsets_topic_configs(),
        )
        try:
            response = await link.forward("CreateTopics", request, CREATE_TIMEOUT_MS / 1000 + 5)
        except Exception as err:
            log.warning("offsets_topic_create_failed", error=str(err))
            return
        for topic in response.topics:
            if topic.error_code not in (ErrorCode.none, ErrorCode.topic_already_exists):
                log.warning(
                    "offsets_topic_create_refused",
                    error_code=topic.error_code,
                    error=topic.error_message,
                )
            else:
                log.info("offsets_topic_created", partitions=topic.num_partitions)

    # -- loading and unloading -----------------------------------------------------------

    def on_role_output(self, output: Any) -> None:
        if output.tp.topic != OFFSETS_TOPIC:
            return
        p = output.tp.partition
        if isinstance(output, RoleChanged) and output.role is Role.LEADER:
            if p not in self.partitions:
                self.partitions[p] = "loading"
                self._loads[p] = self.rm.spawn(self._load(p), f"load-offsets-{p}")
            self._ensure_expiry()
        elif isinstance(output, RoleChanged | ReplicaRemoved):
            self.unload(p)

    def unload(self, p: int) -> None:
        task = self._loads.pop(p, None)
        if task is not None and not task.done():
            task.cancel()
        if self.partitions.pop(p, None) is None:
            return
        n = self.num_partitions()
        names = set(self.offsets) | set(self.group_values) | set(self.membership.groups())
        gone = sorted(g for g in names if partition_for(g, n) == p)
        for g in gone:
            self.offsets.pop(g, None)
            self.group_values.pop(g, None)
        self.membership.unloaded(gone)
        log.info("offsets_partition_unloaded", partition=p, groups=len(gone))

    async def _load(self, p: int, delay: float = 0.0) -> None:
        if delay:
            await asyncio.sleep(delay)  # a retry (cancelled by an unload)
        tp = TopicPartition(OFFSETS_TOPIC, p)
        offsets: dict[str, dict[tuple[str, int], OffsetCommitValue]] = {}
        groups: dict[str, GroupMetadataValue | None] = {}
        records = 0
        try:
            partition_log = self.rm.partitions[tp].log
            position = partition_log.log_start_offset
            while True:
                if tp not in self.rm.partitions:  # the replica went (or its dir failed)
                    if self.partitions.get(p) == "loading":  # not unloaded: forget it here
                        self._loads.pop(p, None)
                        self.partitions.pop(p, None)
                    return
                info = partition_log.read(position, LOAD_READ_BYTES)
                if not info.records:  # the end (a read returns a batch while there is one)
                    break
                for batch in iter_decoded_batches(info.records):
                    if batch.header.is_control:
                        continue
                    for record in batch.records:
                        if record.offset < position:
                            continue
                        records += 1
                        _apply_record(record.key, record.value, offsets, groups)
                position = info.next_offset
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a damaged read: tried again later, loading meanwhile
            retry = min(max(2 * delay, LOAD_RETRY_S), LOAD_RETRY_MAX_S)
            log.error("offsets_partition_load_failed", partition=p, error=str(err), retry_s=retry)
            if self.partitions.get(p) == "loading":
                self._loads[p] = self.rm.spawn(self._load(p, retry), f"load-offsets-{p}")
            else:
                self._loads.pop(p, None)
            return
        if self.partitions.get(p) != "loading":
            return
        self.offsets.update(offsets)
        for group, value in groups.items():
            if value is not None:
                self.group_values[group] = value
                self.membership.loaded(group, value)
        self.partitions[p] = "loaded"
        self._loads.pop(p, None)
        log.info(
            "offsets_partition_loaded",
            partition=p,
            records=records,
            groups=len(set(offsets) | {g for g, v in groups.items() if v is not None}),
        )

    # -- writes --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _group_lock(self, group_id: str) -> AsyncIterator[None]:
        """Hold `group_id`'s lock: its writes and the table changes after them in order."""
        entry = self._locks.get(group_id)
        if entry is None:
            entry = self._locks[group_id] = [asyncio.Lock(), 0]
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if entry[1] == 0:
                del self._locks[group_id]

    async def append(
        self,
        group_id: str,
        records: Sequence[tuple[bytes, bytes | None]],
        errors: Callable[[int], ErrorCode] = produce_error,
    ) -> ErrorCode:
        """Append key/value records to the group's partition with acks=all; a failure's code
        as `errors` maps it (the offset commits' mapping unless told)."""
        now = self.clock()
        batch = encode_batch([(now, key, value, ()) for key, value in records])
        results = await self.rm.produce(
            -1,
            self.config.offsets_commit_timeout_ms,
            [wire.ProducePartition(OFFSETS_TOPIC, self.partition_for(group_id), batch)],
        )
        code = errors(int(results[0].error)) if results else ErrorCode.unknown_server_error
        if code != ErrorCode.none:
            log.warning(
                "group_write_failed",
                group=group_id,
                error=results[0].error if results else None,
                answered=code.name,
            )
        return code

    async def store_group(self, group_id: str, value: GroupMetadataValue | None) -> ErrorCode:
        key = encode_key(GroupMetadataKey(group_id))
        async with self._group_lock(group_id):
            code = await self.append(
                group_id,
                [(key, None if value is None else encode_group_value(value))],
                group_write_error,
            )
            if code != ErrorCode.none or self.check(group_id) != ErrorCode.none:
                return code  # failed, or unloaded meanwhile (the table went with it)
            if value is None:
                self.group_values.pop(group_id, None)
            else:
                self.group_values[group_id] = value
        return code

    async def commit_offsets(
        self, group_id: str, offsets: dict[tuple[str, int], OffsetCommitValue]
    ) -> ErrorCode:
        """Write the commits (one record each); visible to fetches once acknowledged."""
        if not offsets:
            return ErrorCode.none
        records = [
            (
                encode_key(OffsetCommitKey(group_id, topic, partition)),
                encode_offset_value(value, 1 if value.expire_timestamp >= 0 else 3),
            )
            for (topic, partition), value in offsets.items()
        ]
        async with self._group_lock(group_id):
            code = await self.append(group_id, records)
            if code == ErrorCode.none and self.check(group_id) == ErrorCode.none:
                self.offsets.setdefault(group_id, {}).update(offsets)
        return code

    def committed(self, group_id: str) -> dict[tuple[str, int], OffsetCommitValue]:
        return self.offsets.get(group_id, {})

    def known_groups(self) -> list[str]:
        """Every group coordinated here: the membership's and those with offsets only."""
        n = self.num_partitions()
        names = set(self.membership.groups()) | set(self.offsets) | set(self.group_values)
        return sorted(g for g in names if self.partitions.get(partition_for(g, n)) == "loaded")

    async def delete_group(self, group_id: str) -> ErrorCode:
        """DeleteGroups for one group this broker coordinates (check() said NONE): tombstones
        for its offsets and its metadata, then it is forgotten."""
        state = self.membership.state(group_id)
        if state is None and group_id not in self.offsets and group_id not in self.group_values:
            return ErrorCode.group_id_not_found
        async with self._group_lock(group_id):
            # Under the lock: no commit of this group is between its append and its apply, so
            # the tombstones cover every offset the table (and a reload) has.
            code = self.membership.deletable(group_id)
            if code != ErrorCode.none:
                return code
            tombstoned = list(self.committed(group_id))
            code = await self.append(group_id, self._tombstones(group_id, tombstoned))
            if code != ErrorCode.none:
                return code
            if self.check(group_id) != ErrorCode.none:
                return ErrorCode.not_coordinator  # unloaded meanwhile: the tables went with it
            self._forget_offsets(group_id, tombstoned)
            self.group_values.pop(group_id, None)
            # The group may have come back to life during the write (a JoinGroup): it stays.
            code = self.membership.deletable(group_id)
            if code == ErrorCode.none:
                self.membership.delete(group_id)
        return code

    def _forget_offsets(self, group_id: str, tps: Iterable[tuple[str, int]]) -> None:
        kept = self.offsets.get(group_id)
        if kept is None:
            return
        for tp in tps:
            kept.pop(tp, None)
        if not kept:
            self.offsets.pop(group_id, None)

    def _tombstones(
        self, group_id: str, offsets: Iterable[tuple[str, int]], group: bool = True
    ) -> list[tuple[bytes, bytes | None]]:
        records: list[tuple[bytes, bytes | None]] = [
            (encode_key(OffsetCommitKey(group_id, topic, partition)), None)
            for topic, partition in sorted(offsets)
        ]
        if group:
            records.append((encode_key(GroupMetadataKey(group_id)), None))
        return records

    # -- expiry --------------------------------------------------------------------------

    def _ensure_expiry(self) -> None:
        if self._expiry is None or self._expiry.done():
            self._expiry = self.rm.spawn(self._expiry_loop(), "offsets-expiry")

    async def _expiry_loop(self) -> None:
        while self.partitions:
            await asyncio.sleep(self.config.offsets_retention_check_interval_ms / 1000)
            try:
                await self.expire_once()
            except Exception as err:  # the next pass tries again
                log.error("offsets_expiry_failed", error=repr(err), exc_info=True)

    async def expire_once(self) -> int:
        """One expiry pass over the loaded groups; the number of offsets removed."""
        now = self.clock()
        removed = 0
        for group_id in self.known_groups():
            async with self._group_lock(group_id):
                removed += await self._expire_group(group_id, now)
        return removed

    async def _expire_group(self, group_id: str, now: int) -> int:
        """One group's expiry, under its lock (its state read after any write in flight)."""
        if self.check(group_id) != ErrorCode.none:
            return 0
        state_pair = self.membership.state(group_id)
        state = None if state_pair is None else state_pair[0]
        # When the group entered its state: the live group's (its Empty record may have failed
        # to write), else the stored one.
        timestamp = None if state is None else self.membership.state_timestamp(group_id)
        if timestamp is None:
            value = self.group_values.get(group_id)
            timestamp = value.current_state_timestamp if value is not None else -1
        offsets = self.committed(group_id)
        expired = expired_offsets(
            offsets,
            state,
            timestamp,
            self.config.offsets_retention_ms,
            now,
        )
        # Offsets of partitions that no longer exist go too, whatever the group's state
        # (Kafka removes them when a topic is deleted).
        expired = sorted(set(expired) | set(self._deleted_partitions(offsets)))
        # An Empty group left without offsets is deleted too (a simple-commit group that
        # has a metadata record as well).
        drop_group = (
            state in (None, "Empty")
            and len(expired) == len(offsets)
            and (state is not None or group_id in self.group_values)
        )
        if not expired and not drop_group:
            return 0
        records = self._tombstones(group_id, expired, group=drop_group)
        if await self.append(group_id, records) != ErrorCode.none:
            return 0
        if self.check(group_id) != ErrorCode.none:
            return 0  # unloaded meanwhile: the tables went with it
        self._forget_offsets(group_id, expired)
        if drop_group:
            self.group_values.pop(group_id, None)
            # Deleted only while still deletable: a JoinGroup during the write revived it.
            if state is not None and self.membership.deletable(group_id) == ErrorCode.none:
                self.membership.delete(group_id)
        log.info("offsets_expired", group=group_id, partitions=len(expired), deleted=drop_group)
        return len(expired)

    def _deleted_partitions(
        self, offsets: dict[tuple[str, int], OffsetCommitValue]
    ) -> list[tuple[str, int]]:
        image = self.rm.image
        gone = []
        for topic, partition in offsets:
            record = image.topic(topic)
            if record is None or partition not in record.partitions:
                gone.append((topic, partition))
        return gone

    async def stop(self) -> None:
        """The membership first (its timers and waiters end, no more stores), then our own
        loads, expiry and topic creation are cancelled and awaited."""
        stopped = self.membership.stop()  # whether G2 made it a coroutine or not
        if inspect.isawaitable(stopped):
            await stopped
        tasks = [t for t in [*self._loads.values(), self._expiry, self._creating] if t is not None]
        for task in tasks:
            if not task.done():
                task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._loads.clear()


def _apply_record(
    key_bytes: bytes | None,
    value_bytes: bytes | None,
    offsets: dict[str, dict[tuple[str, int], OffsetCommitValue]],
    groups: dict[str, GroupMetadataValue | None],
) -> None:
    """One record of the partition being loaded, on top of the earlier ones (last wins)."""
    try:
        key = decode_key(key_bytes)
        value = decode_value(key, value_bytes)
    except RecordFormatError as err:
        log.warning("offsets_record_skipped", error=str(err))
        return
    if isinstance(key, OffsetCommitKey):
        tp = (key.topic, key.partition)
        if value is None:
            group = offsets.get(key.group)
            if group is not None:
                group.pop(tp, None)
                if not group:
                    del offsets[key.group]
        else:
            assert isinstance(value, OffsetCommitValue)
            offsets.setdefault(key.group, {})[tp] = value
    else:
        assert value is None or isinstance(value, GroupMetadataValue)
        groups[key.group] = value
