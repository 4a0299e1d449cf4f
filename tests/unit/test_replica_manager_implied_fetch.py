"""A follower's fetch session keeps an idle partition's follower in sync (KIP-227, lag rule).

Kafka reads every session partition on every request, so a caught-up follower of an idle
partition is "caught up as of its last request". minibroker's sessions read only what changed
(`FetchHandler`'s dirty sets), so when a partition changes, `FetchHandler.changed` first records
an implied fetch for each follower session where it was still clean, at that session's last
request. Without it the first record after a quiet spell finds the followers caught up only as
of their last real read, possibly long ago, and the ISR shrinks before their next request.

A real ReplicaManager (BrokerConfig, LogManager on tmp_path) leads a partition; its follower's
requests are made by the test through `ReplicaManager.fetch`, as the service would. No sockets.
"""

from __future__ import annotations

import asyncio
import time
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
from minibroker.client.common.clock import wall_clock_ms
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
FOLLOWER = 2
TOPIC = "events"
TOPIC_ID = "topic-id-events"
TP = TopicPartition(TOPIC, 0)
OWNER = (FOLLOWER, "User:ANONYMOUS")


@pytest.fixture
async def rm(tmp_path: Path) -> AsyncIterator[ReplicaManager]:
    config = build_config({"node.id": ME, "log.dirs": str(tmp_path / "data")})
    data_dir = DataDir.open(config.data_dir, config.node_id)
    log_manager = LogManager.open(data_dir, LogConfig.from_configs(defaults=config.topic_defaults))
    manager = ReplicaManager(config, log_manager, BrokerMetrics(), config.controller)
    try:
        record = PartitionRecord(TOPIC_ID, 0, (ME, FOLLOWER), (ME, FOLLOWER), ME, 1, 1)
        entries = [
            LogEntry(0, 0, RegisterBrokerRecord(ME, "incarnation-1", 0, "127.0.0.1", 1)),
            LogEntry(1, 0, RegisterBrokerRecord(FOLLOWER, "incarnation-2", 0, "127.0.0.1", 2)),
            LogEntry(2, 0, TopicRecord(TOPIC, TOPIC_ID)),
            LogEntry(3, 0, record),
        ]
        await manager.apply_metadata_batch(batch_to_pb(entries, high_offset=len(entries)))
        assert manager.partitions[TP].core.role is Role.LEADER
        yield manager
    finally:
        await manager.stop()
        log_manager.close()
        data_dir.close()


def _params(session_id: int, epoch: int, fetch_offset: int | None) -> wire.FetchParams:
    wanted = (
        ()
        if fetch_offset is None
        else (wire.FetchPartitionRequest(TOPIC, 0, 1, fetch_offset, -1, 0, 1 << 20),)
    )
    return wire.FetchParams(FOLLOWER, 0, 0, 0, 1 << 20, "", wanted, session_id, epoch)


def _caught_up_ms(manager: ReplicaManager) -> int:
    (view,) = [r for r in manager.partitions[TP].core.remote_replicas if r.replica_id == FOLLOWER]
    return view.last_caught_up_time_ms


async def _after(ms: int) -> None:
    """Wait (deadline 5 s) until the wall clock has passed `ms`."""
    deadline = time.monotonic() + 5
    while wall_clock_ms() <= ms:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.001)


async def test_a_change_credits_a_clean_follower_session_with_its_last_request(
    rm: ReplicaManager,
) -> None:
    full = await rm.fetch(_params(0, 0, 0), owner=OWNER)  # opens a session; reads offset 0
    assert full.session_id != 0
    first_read = _caught_up_ms(rm)
    await _after(first_read)
    # An incremental request naming nothing: the idle partition is not read.
    await rm.fetch(_params(full.session_id, 1, None), owner=OWNER)
    session = rm.fetching.sessions.get(full.session_id)
    assert session is not None and TP not in session.dirty
    last_request = session.last_used_ms
    assert last_request > first_read
    assert _caught_up_ms(rm) == first_read
    # A record arrives: the follower was caught up as of its last request, not its last read.
    answer = await rm.produce(
        1, 1_000, [wire.ProducePartition(TOPIC, 0, encode_batch([(1, None, b"v", [])]))]
    )
    assert answer[0].error == 0
    assert TP in session.dirty
    assert _caught_up_ms(rm) == last_request
