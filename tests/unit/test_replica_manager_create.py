"""A metadata batch that adds many partitions to a broker creates their logs off the event loop.

Creating a thousand logs on the broker's event loop stalled it for seconds (and, while its
heartbeats were sent from it, got it fenced). Now the replica manager makes the new logs of a
batch on a worker thread, while the loop goes on; the batch counts as applied (the offset the
heartbeats report) only once they are all there; a led partition starts with its leader epoch
recorded, so becoming its leader fsyncs nothing on the loop. A dir a crash left behind with no
whole `partition.metadata` is never served under the new topic: it is deleted and created again.

A real ReplicaManager (BrokerConfig, LogManager on tmp_path, BrokerMetrics) fed metadata batches
as the controller's watch stream sends them, on one event loop, no sockets.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from minibroker.broker.config import build_config
from minibroker.broker.metrics import BrokerMetrics
from minibroker.broker.replicas.manager import ReplicaManager
from minibroker.broker.replication.events import Role
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.data_dir import DataDir
from minibroker.broker.storage.epoch_cache import EpochEntry
from minibroker.broker.storage.log_manager import (
    PARTITION_METADATA,
    LogManager,
    NewLog,
    read_partition_metadata,
)
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition
from minibroker.metadata.records import (
    LogEntry,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from minibroker.metadata.wire import batch_to_pb
from minibroker.proto import minibroker_pb2 as pb

ME = 1
OTHER = 2  # never registered: no fetcher starts
TOPIC = "many"
TOPIC_ID = "id-many"
PARTITIONS = 40
EPOCH = 7


def partition(index: int) -> PartitionRecord:
    leader = ME if index % 2 == 0 else OTHER
    replicas = (leader, OTHER if leader == ME else ME)
    return PartitionRecord(
        topic_id=TOPIC_ID,
        partition=index,
        replicas=replicas,
        isr=replicas,
        leader=leader,
        leader_epoch=EPOCH,
        partition_epoch=EPOCH,
    )


def batch(records: list[MetadataRecord], first_offset: int = 0) -> pb.MetadataBatch:
    entries = [LogEntry(first_offset + i, 0, r) for i, r in enumerate(records)]
    return batch_to_pb(entries, high_offset=first_offset + len(entries))


def topic_batch() -> pb.MetadataBatch:
    return batch(
        [
            RegisterBrokerRecord(ME, "incarnation-1", 0, "127.0.0.1", 1),
            TopicRecord(TOPIC, TOPIC_ID),
            *(partition(p) for p in range(PARTITIONS)),
        ]
    )


async def open_broker(data: Path) -> ReplicaManager:
    config = build_config({"node.id": ME, "log.dirs": str(data)})
    data_dir = DataDir.open(config.data_dir, config.node_id)
    log_manager = LogManager.open(data_dir, LogConfig.from_configs(defaults=config.topic_defaults))
    rm = ReplicaManager(config, log_manager, BrokerMetrics(), config.controller)
    rm.load_existing_logs()
    return rm


async def close_broker(rm: ReplicaManager) -> None:
    await rm.stop()
    rm.log_manager.close()
    rm.log_manager.data_dir.close()


@pytest.fixture
async def rm(tmp_path: Path) -> AsyncIterator[ReplicaManager]:
    manager = await open_broker(tmp_path / "data")
    try:
        yield manager
    finally:
        await close_broker(manager)


async def test_new_logs_are_made_on_a_worker_thread_while_the_loop_goes_on(
    rm: ReplicaManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    making = threading.Event()
    release = threading.Event()
    real = rm.log_manager.make_new_logs
    threads = []

    def held(new: list[NewLog], now_ms: int) -> list[object]:
        threads.append(threading.current_thread())
        making.set()
        # Only the event loop can release it: made on the loop, this would wait in vain.
        assert release.wait(10), "the event loop did not run while the logs were being made"
        return real(new, now_ms)  # type: ignore[return-value]

    monkeypatch.setattr(rm.log_manager, "make_new_logs", held)
    applying = asyncio.create_task(rm.apply_metadata_batch(topic_batch()))
    while not making.is_set():
        await asyncio.sleep(0.01)
    # The loop runs meanwhile; the batch is not applied yet, and the heartbeats say so.
    assert not applying.done()
    assert rm.applied_metadata_offset() == 0 and rm.partitions == {}
    release.set()
    await applying

    assert threads and threads[0] is not threading.main_thread()
    assert rm.applied_metadata_offset() == PARTITIONS + 2
    assert sorted(tp.partition for tp in rm.partitions) == list(range(PARTITIONS))
    for tp, hosted in rm.partitions.items():
        leads = tp.partition % 2 == 0
        assert hosted.core.role is (Role.LEADER if leads else Role.FOLLOWER)
        assert hosted.log.epoch_cache.entries == ((EpochEntry(EPOCH, 0),) if leads else ())
        assert read_partition_metadata(hosted.log.directory) == TOPIC_ID


async def test_new_logs_and_their_leaders_fsync_nothing_on_the_loop(
    rm: ReplicaManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.current_thread()
    on_loop: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if threading.current_thread() is loop_thread:
            on_loop.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    await rm.apply_metadata_batch(topic_batch())
    assert len(rm.partitions) == PARTITIONS
    assert rm.partitions[TopicPartition(TOPIC, 0)].core.role is Role.LEADER
    assert on_loop == []


async def test_dirs_a_crash_left_without_a_whole_topic_id_are_created_again(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    rm = await open_broker(data)
    try:
        await rm.apply_metadata_batch(topic_batch())
        log = rm.partitions[TopicPartition(TOPIC, 0)].log
        log.append_as_leader(encode_batch([(1, None, b"v", ())]), leader_epoch=EPOCH, now_ms=1)
    finally:
        await close_broker(rm)
    # A crash before the durability pass: partition.metadata missing or cut short.
    (data / "many-0" / PARTITION_METADATA).write_bytes(b"version: 0\ntopic_id: id-ma")
    (data / "many-1" / PARTITION_METADATA).unlink()

    rm = await open_broker(data)
    try:
        assert {rm.partitions[TopicPartition(TOPIC, p)].topic_id for p in (0, 1)} == {""}
        await rm.apply_metadata_batch(topic_batch())
        for p in (0, 1):
            hosted = rm.partitions[TopicPartition(TOPIC, p)]
            assert (hosted.topic_id, hosted.log.leo) == (TOPIC_ID, 0)
            assert read_partition_metadata(hosted.log.directory) == TOPIC_ID
        assert rm.partitions[TopicPartition(TOPIC, 0)].core.role is Role.LEADER
        assert len(rm.partitions) == PARTITIONS
        assert rm.log_manager.pending_deletes == ()
    finally:
        await close_broker(rm)
