"""The acks=all wait is decided by the replica core alone; the shell only holds futures.

Issue 12: the wait used to be kept twice, by the core's purgatory and by the replica manager,
which answered a timed-out produce (and, on removal, a failed dir or shutdown, every parked
one) itself while the core kept its own record until its expiry tick. Now the shell asks the
core (`expire_produce`, `abort_produces`) and completes futures from the CompleteProduce
effects only, so the core's purgatory and the shell's futures agree at every moment.

A real ReplicaManager (BrokerConfig, LogManager on tmp_path) leads a partition whose other
replica never fetches, so an acks=all produce can only time out or be aborted. No sockets.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from minibroker.broker import wire
from minibroker.broker.config import build_config
from minibroker.broker.metrics import BrokerMetrics
from minibroker.broker.replicas.manager import ReplicaManager
from minibroker.broker.replication.events import Role
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.data_dir import DataDir
from minibroker.broker.storage.log_manager import LogManager
from minibroker.client.errors import ErrorCode
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition
from minibroker.metadata.records import (
    LogEntry,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from minibroker.metadata.wire import batch_to_pb

ME = 1
OTHER = 2
TOPIC = "events"
TOPIC_ID = "topic-id-events"
TP = TopicPartition(TOPIC, 0)
SOLO = TopicPartition(TOPIC, 1)  # replicas (ME,): every write commits at once


@pytest.fixture
async def rm(tmp_path: Path) -> AsyncIterator[ReplicaManager]:
    """Broker ME leads TP (replicas ME, OTHER; both in the ISR). OTHER is never registered, so
    it never fetches and the HW never passes a new write."""
    config = build_config({"node.id": ME, "log.dirs": str(tmp_path / "data")})
    data_dir = DataDir.open(config.data_dir, config.node_id)
    log_manager = LogManager.open(data_dir, LogConfig.from_configs(defaults=config.topic_defaults))
    manager = ReplicaManager(config, log_manager, BrokerMetrics(), config.controller)
    try:
        record = PartitionRecord(
            topic_id=TOPIC_ID,
            partition=TP.partition,
            replicas=(ME, OTHER),
            isr=(ME, OTHER),
            leader=ME,
            leader_epoch=1,
            partition_epoch=1,
        )
        solo = PartitionRecord(
            topic_id=TOPIC_ID,
            partition=SOLO.partition,
            replicas=(ME,),
            isr=(ME,),
            leader=ME,
            leader_epoch=1,
            partition_epoch=1,
        )
        entries = [
            LogEntry(0, 0, RegisterBrokerRecord(ME, "incarnation-1", 0, "127.0.0.1", 1)),
            LogEntry(1, 0, TopicRecord(TOPIC, TOPIC_ID)),
            LogEntry(2, 0, record),
            LogEntry(3, 0, solo),
        ]
        await manager.apply_metadata_batch(batch_to_pb(entries, high_offset=len(entries)))
        assert manager.partitions[TP].core.role is Role.LEADER
        yield manager
    finally:
        await manager.stop()
        log_manager.close()
        data_dir.close()


def produce(
    manager: ReplicaManager,
    timeout_ms: int,
    *,
    tp: TopicPartition = TP,
    acks: int = -1,
    records: bytes | None = None,
) -> asyncio.Task[list[wire.ProduceResult]]:
    raw = records if records is not None else encode_batch([(1_000, None, b"v", [])])
    return asyncio.ensure_future(
        manager.produce(acks, timeout_ms, [wire.ProducePartition(tp.topic, tp.partition, raw)])
    )


def idempotent_batch(count: int = 3) -> bytes:
    return encode_batch(
        [(1_000 + i, None, f"v{i}".encode(), []) for i in range(count)],
        producer_id=7,
        producer_epoch=0,
        base_sequence=0,
    )


async def test_a_timed_out_produce_is_answered_and_forgotten_by_the_core(
    rm: ReplicaManager,
) -> None:
    (result,) = await produce(rm, timeout_ms=50)
    assert (result.error, result.base_offset) == (ErrorCode.REQUEST_TIMED_OUT, -1)
    assert result.message == "the ISR did not acknowledge the write within timeout_ms"
    hosted = rm.partitions[TP]
    # The core answered it, so nothing of it is left on either side.
    assert hosted.core.pending_produce_count == 0
    assert rm.produce_futures == {}


async def test_shutdown_answers_parked_produces_through_the_core(rm: ReplicaManager) -> None:
    task = produce(rm, timeout_ms=60_000)
    hosted = rm.partitions[TP]
    while hosted.core.pending_produce_count == 0:
        await asyncio.sleep(0)
    await rm.stop()
    (result,) = await task
    assert (result.error, result.message) == (
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        "broker shutting down",
    )
    assert hosted.core.pending_produce_count == 0 and rm.produce_futures == {}


@pytest.mark.parametrize("acks", [1, -1])
async def test_an_idempotent_retry_gets_the_original_offsets_and_is_stored_once(
    rm: ReplicaManager, acks: int
) -> None:
    batch = idempotent_batch()
    (first,) = await produce(rm, 5_000, tp=SOLO, acks=acks, records=batch)
    (retry,) = await produce(rm, 5_000, tp=SOLO, acks=acks, records=batch)
    assert (first.error, first.base_offset) == (ErrorCode.NONE, 0)
    assert (retry.error, retry.base_offset) == (ErrorCode.NONE, 0)
    assert rm.partitions[SOLO].core.leo == 3


async def test_an_acks_all_retry_waits_for_the_hw_like_the_first_write(rm: ReplicaManager) -> None:
    """A duplicate of a batch the ISR has not acknowledged yet is not acknowledged either: it
    parks until the HW passes it (here it never does, so it times out like the first)."""
    batch = idempotent_batch()
    (first,) = await produce(rm, 50, records=batch)
    (retry,) = await produce(rm, 50, records=batch)
    assert first.error == retry.error == ErrorCode.REQUEST_TIMED_OUT
    assert rm.partitions[TP].core.leo == 3 and rm.partitions[TP].core.high_watermark == 0
