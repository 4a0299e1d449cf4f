"""Stand-ins for the group coordinator's unit tests: a replica manager whose
`__consumer_offsets` partitions are in-memory logs, and a small membership (G2's real one is
used in process tests only)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode as KafkaError

from minibroker.broker import wire
from minibroker.broker.groups.coordinator import (
    OFFSETS_TOPIC,
    GroupConfig,
    GroupCoordinator,
)
from minibroker.broker.groups.records import GroupMetadataValue
from minibroker.broker.replication.events import Role
from minibroker.broker.replication.outputs import ReplicaRemoved, RoleChanged
from minibroker.client.batch import set_base_offset
from minibroker.client.errors import ErrorCode
from minibroker.client.records import iter_decoded_batches
from minibroker.client.types import TopicPartition
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import PartitionRecord, RegisterBrokerRecord, TopicRecord

OFFSETS_TOPIC_ID = "00000000-0000-0000-0000-0000000000cc"
EVENTS_TOPIC_ID = "00000000-0000-0000-0000-0000000000ee"
PARTITIONS = 3


@dataclass
class Read:
    records: bytes
    next_offset: int


@dataclass
class FakeLog:
    batches: list[tuple[int, int, bytes]] = field(default_factory=list)  # (base, next, bytes)
    log_start_offset: int = 0

    @property
    def leo(self) -> int:
        return self.batches[-1][1] if self.batches else 0

    def append(self, records: bytes) -> int:
        base = self.leo
        data = bytearray(records)
        set_base_offset(data, 0, base)
        count = sum(len(b.records) for b in iter_decoded_batches(bytes(data)))
        self.batches.append((base, base + count, bytes(data)))
        return base

    def read(self, offset: int, max_bytes: int) -> Read:
        for _base, nxt, data in self.batches:
            if nxt > offset:
                return Read(data, nxt)
        return Read(b"", offset)


@dataclass
class FakeHosted:
    log: FakeLog


class FakeReplicaManager:
    def __init__(self, leader: int = 1) -> None:
        self.broker_id = 1
        self.link: Any = None
        self.role_listeners: list[Any] = []
        self.image = MetadataImage()
        for broker_id in (1, 2):
            self.image.apply_record(
                RegisterBrokerRecord(
                    broker_id=broker_id,
                    incarnation_id=f"i{broker_id}",
                    broker_epoch=broker_id,
                    host="127.0.0.1",
                    port=9000 + broker_id,
                    fenced=False,
                    kafka_host="127.0.0.1",
                    kafka_port=19090 + broker_id,
                )
            )
        self.image.apply_record(TopicRecord("events", EVENTS_TOPIC_ID))
        for p in (0, 1):
            self.image.apply_record(PartitionRecord(EVENTS_TOPIC_ID, p, (1, 2), (1, 2), 1, 1, 1))
        self.logs = {p: FakeLog() for p in range(PARTITIONS)}
        self.partitions: dict[TopicPartition, FakeHosted] = {}
        self.produced: list[tuple[int, int, list[wire.ProducePartition]]] = []
        self.produce_error: ErrorCode = ErrorCode.NONE
        self.tasks: set[asyncio.Task[Any]] = set()
        # When set: each produce appends at once, then waits for it before answering (the
        # acks=all wait), so writes can overlap.
        self.hold: asyncio.Event | None = None
        self.log_dir_failure: Any = None

    def create_offsets_topic(self, leader: int = 1) -> None:
        self.image.apply_record(TopicRecord(OFFSETS_TOPIC, OFFSETS_TOPIC_ID))
        for p in range(PARTITIONS):
            self.image.apply_record(
                PartitionRecord(OFFSETS_TOPIC_ID, p, (1, 2), (1, 2), leader, 1, 1)
            )

    def spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        return task

    async def produce(
        self, acks: int, timeout_ms: int, partitions: list[wire.ProducePartition]
    ) -> list[wire.ProduceResult]:
        self.produced.append((acks, timeout_ms, partitions))
        results = []
        for p in partitions:
            if self.produce_error != ErrorCode.NONE:
                results.append(wire.ProduceResult(p.topic, p.partition, self.produce_error))
                continue
            base = self.logs[p.partition].append(p.records)
            results.append(wire.ProduceResult(p.topic, p.partition, base_offset=base))
        if self.hold is not None:
            await self.hold.wait()
        return results

    def role(self, coordinator: GroupCoordinator, partition: int, role: Role) -> None:
        tp = TopicPartition(OFFSETS_TOPIC, partition)
        if role is Role.LEADER:
            self.partitions[tp] = FakeHosted(self.logs[partition])
        out = RoleChanged(tp, role, 1 if role is Role.LEADER else 2, 1, 1, (1, 2), 0, 0)
        for listener in self.role_listeners:
            listener(out)

    def remove(self, partition: int) -> None:
        tp = TopicPartition(OFFSETS_TOPIC, partition)
        self.partitions.pop(tp, None)
        for listener in self.role_listeners:
            listener(ReplicaRemoved(tp, False, "deleted"))


class StandInMembership:
    """Groups with a state and protocol type; simple commits allowed for unknown groups."""

    def __init__(self, coordinator: GroupCoordinator, config: GroupConfig) -> None:
        self.coordinator = coordinator
        self.states: dict[str, tuple[str, str]] = {}
        self.loaded_values: dict[str, GroupMetadataValue] = {}
        self.unloaded_groups: list[str] = []
        self.deleted: list[str] = []
        self.timestamps: dict[str, int] = {}
        self.stopped = False

    def loaded(self, group_id: str, value: GroupMetadataValue) -> None:
        self.loaded_values[group_id] = value
        self.states[group_id] = ("Empty" if not value.members else "Stable", value.protocol_type)

    def unloaded(self, group_ids: Iterable[str]) -> None:
        for g in group_ids:
            self.unloaded_groups.append(g)
            self.states.pop(g, None)

    def validate_commit(
        self, group_id: str, member_id: str, generation: int, instance_id: str | None
    ) -> KafkaError:
        state = self.states.get(group_id)
        if state is None or state[0] == "Empty":
            return (
                KafkaError.none
                if generation < 0 and not member_id
                else KafkaError.illegal_generation
            )
        return KafkaError.none if generation >= 0 else KafkaError.unknown_member_id

    def state(self, group_id: str) -> tuple[str, str] | None:
        return self.states.get(group_id)

    def deletable(self, group_id: str) -> KafkaError:
        state = self.states.get(group_id)
        return KafkaError.non_empty_group if state and state[0] != "Empty" else KafkaError.none

    def delete(self, group_id: str) -> None:
        self.deleted.append(group_id)
        self.states.pop(group_id, None)

    def groups(self) -> Iterable[str]:
        return list(self.states)

    def state_timestamp(self, group_id: str) -> int | None:
        return self.timestamps.get(group_id) if group_id in self.states else None

    def stop(self) -> None:
        self.stopped = True


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def coordinator(
    rm: FakeReplicaManager, clock: Clock | None = None, **config: Any
) -> tuple[GroupCoordinator, StandInMembership]:
    c = GroupCoordinator(
        rm,  # type: ignore[arg-type]
        GroupConfig(offsets_topic_num_partitions=PARTITIONS, **config),
        clock or Clock(),
        membership=StandInMembership,
    )
    assert isinstance(c.membership, StandInMembership)
    return c, c.membership


async def lead_all(rm: FakeReplicaManager, c: GroupCoordinator) -> None:
    """Become leader of every partition and wait for the loads."""
    for p in range(PARTITIONS):
        rm.role(c, p, Role.LEADER)
    await settle(c)


async def settle(c: GroupCoordinator) -> None:
    for _ in range(100):
        if "loading" not in c.partitions.values():
            return
        await asyncio.sleep(0)
    raise AssertionError("the loads did not finish")
