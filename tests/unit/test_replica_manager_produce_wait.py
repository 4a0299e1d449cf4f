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
from minibroker.broker.replica_manager import ReplicaManager
from minibroker.broker.replication.events import Role
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.data_dir import DataDir
from minibroker.broker.storage.log_manager import LogManager
from minibroker.client.errors import ErrorCode
from minibroker.client.metadata.records import (
    LogEntry,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from minibroker.client.metadata.wire import batch_to_pb
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition

ME = 1
OTHER = 2
TOPIC = "events"
TOPIC_ID = "topic-id-events"
TP = TopicPartition(TOPIC, 0)


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
        entries = [
            LogEntry(0, 0, RegisterBrokerRecord(ME, "incarnation-1", 0, "127.0.0.1", 1)),
            LogEntry(1, 0, TopicRecord(TOPIC, TOPIC_ID)),
            LogEntry(2, 0, record),
        ]
        await manager.apply_metadata_batch(batch_to_pb(entries, high_offset=len(entries)))
        assert manager.partitions[TP].core.role is Role.LEADER
        yield manager
    finally:
        await manager.stop()
        log_manager.close()
        data_dir.close()


def produce(manager: ReplicaManager, timeout_ms: int) -> asyncio.Task[list[wire.ProduceResult]]:
    records = encode_batch([(1_000, None, b"v", [])])
    return asyncio.ensure_future(
        manager.produce(-1, timeout_ms, [wire.ProducePartition(TP.topic, TP.partition, records)])
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
    assert hosted.produce_futures == {}


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
    assert hosted.core.pending_produce_count == 0 and hosted.produce_futures == {}
