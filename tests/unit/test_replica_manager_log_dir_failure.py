"""A failed disk operation takes the broker's data dir offline (Kafka's LogDirFailureChannel).

Issue 11 item 5: a broker has one log dir, so one failed append, read, flush, truncation or
checkpoint means it can serve none of its replicas any more. The replica manager then answers
KAFKA_STORAGE_ERROR to every produce, fetch and offset lookup (retriable: clients go to the new
leader once the controller has moved it), answers the acks=all produces it holds with it too,
stops following its leaders, never touches the dir again, and sets `log_dir_failed` for the
composition root, which reports the dir to the controller and exits (tests/integration/
test_disk_failure.py runs that with real processes).

Each test runs a real ReplicaManager (BrokerConfig, LogManager on tmp_path, BrokerMetrics) given
roles by controller metadata records, on one event loop, no sockets. The disk fails for real
from the storage's point of view: the storage modules' `os` is replaced by one whose named calls
raise OSError (ENOSPC, EIO), as test_storage_write_failure.py does.
"""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from minibroker.broker import wire
from minibroker.broker.config import build_config
from minibroker.broker.metrics import BrokerMetrics
from minibroker.broker.replicas.manager import ReplicaManager
from minibroker.broker.replication.events import Role
from minibroker.broker.storage import checkpoint as checkpoint_module
from minibroker.broker.storage import epoch_checkpoint as epoch_checkpoint_module
from minibroker.broker.storage import index as index_module
from minibroker.broker.storage import log as log_module
from minibroker.broker.storage import log_loader as log_loader_module
from minibroker.broker.storage import log_manager as log_manager_module
from minibroker.broker.storage import segment as segment_module
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
SOLO = TopicPartition(TOPIC, 0)  # replicas (ME,): led here
SHARED = TopicPartition(TOPIC, 1)  # replicas (ME, OTHER), ISR both: led here, acks=all waits
FOLLOWED = TopicPartition(TOPIC, 2)  # replicas (OTHER, ME): led by OTHER, followed here
LEADER_EPOCH = 3
STORAGE = ErrorCode.KAFKA_STORAGE_ERROR


class Disk:
    """Stands in for `os` in the storage modules: the calls named in `failing` raise OSError
    with the errno given there; every other call is the real one."""

    def __init__(self) -> None:
        self.failing: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        real = getattr(os, name)
        if name not in self.failing:
            return real

        def fail(*args: Any, **kwargs: Any) -> Any:
            code = self.failing[name]
            raise OSError(code, f"{os.strerror(code)} (injected into os.{name})")

        return fail


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[Disk]:
    injected = Disk()
    modules = (
        checkpoint_module,
        epoch_checkpoint_module,
        index_module,
        log_module,
        log_loader_module,
        log_manager_module,
        segment_module,
    )
    for module in modules:
        monkeypatch.setattr(module, "os", injected)
    yield injected
    injected.failing.clear()


@dataclass
class Broker:
    rm: ReplicaManager
    data_dir: Path


def partition(index: int, replicas: tuple[int, ...], leader: int) -> PartitionRecord:
    return PartitionRecord(
        topic_id=TOPIC_ID,
        partition=index,
        replicas=replicas,
        isr=replicas,
        leader=leader,
        leader_epoch=LEADER_EPOCH,
        partition_epoch=LEADER_EPOCH,
    )


@pytest.fixture
async def broker(tmp_path: Path, disk: Disk) -> AsyncIterator[Broker]:
    """Broker ME leading SOLO and SHARED and following FOLLOWED, built as broker/app.py does.
    OTHER is never registered, so no fetcher starts (no address, no connection)."""
    config = build_config(
        {
            "node.id": ME,
            "log.dirs": str(tmp_path / "data"),
            "replica.high.watermark.checkpoint.interval.ms": 10,
        }
    )
    data_dir = DataDir.open(config.data_dir, config.node_id)
    log_manager = LogManager.open(data_dir, LogConfig.from_configs(defaults=config.topic_defaults))
    rm = ReplicaManager(config, log_manager, BrokerMetrics(), config.controller)
    rm.load_existing_logs()
    try:
        entries = [
            LogEntry(0, 0, RegisterBrokerRecord(ME, "incarnation-1", 0, "127.0.0.1", 1)),
            LogEntry(1, 0, TopicRecord(TOPIC, TOPIC_ID)),
            LogEntry(2, 0, partition(SOLO.partition, (ME,), ME)),
            LogEntry(3, 0, partition(SHARED.partition, (ME, OTHER), ME)),
            LogEntry(4, 0, partition(FOLLOWED.partition, (OTHER, ME), OTHER)),
        ]
        await rm.apply_metadata_batch(batch_to_pb(entries, high_offset=len(entries)))
        assert rm.partitions[SOLO].core.role is Role.LEADER
        assert rm.partitions[SHARED].core.role is Role.LEADER
        assert rm.partitions[FOLLOWED].core.role is Role.FOLLOWER
        yield Broker(rm, Path(config.data_dir))
    finally:
        disk.failing.clear()
        await rm.stop()
        if rm.log_dir_failure is None:
            log_manager.close()
        data_dir.close()


def records(count: int = 3, base_offset: int = 0, epoch: int = -1) -> bytes:
    return encode_batch(
        [(1_000 + i, None, f"v{i}".encode(), []) for i in range(count)],
        base_offset=base_offset,
        partition_leader_epoch=epoch,
    )


async def produce(rm: ReplicaManager, tp: TopicPartition, acks: int = 1) -> wire.ProduceResult:
    (result,) = await rm.produce(
        acks, 5_000, [wire.ProducePartition(tp.topic, tp.partition, records())]
    )
    return result


async def consume(
    rm: ReplicaManager, tp: TopicPartition, replica_id: int = -1
) -> wire.FetchPartitionResult:
    request = wire.FetchPartitionRequest(tp.topic, tp.partition, LEADER_EPOCH, 0, -1, 0, 1 << 20)
    params = wire.FetchParams(replica_id, -1, 0, 1, 1 << 20, "", (request,))
    (result,) = (await rm.fetch(params)).partitions
    return result


def lookups(rm: ReplicaManager, tp: TopicPartition) -> list[ErrorCode]:
    (listed,) = rm.list_offsets(
        [wire.ListOffsetsPartition(tp.topic, tp.partition, LEADER_EPOCH, -1)]
    )
    (epoch_end,) = rm.offset_for_leader_epoch(
        [wire.OffsetForLeaderPartition(tp.topic, tp.partition, LEADER_EPOCH, LEADER_EPOCH)]
    )
    return [listed.error, epoch_end.error]


def files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


async def test_a_failed_leader_append_takes_the_dir_offline_and_nothing_is_served_after(
    broker: Broker, disk: Disk
) -> None:
    rm = broker.rm
    assert (await produce(rm, SOLO)).error == ErrorCode.NONE
    assert not rm.log_dir_failed.is_set()

    disk.failing["write"] = errno.ENOSPC
    failed = await produce(rm, SOLO)

    assert failed.error == STORAGE and "No space left on device" in failed.message
    assert rm.log_dir_failed.is_set()
    failure = rm.log_dir_failure
    assert failure is not None
    assert failure.log_dir == str(broker.data_dir) and failure.operation == f"produce to {SOLO}"
    assert "free space" in failure.advice
    # The disk works again, yet nothing is written or served any more: the dir stays offline
    # for the life of the process, as in Kafka.
    disk.failing.clear()
    on_disk = files(broker.data_dir)
    leo = rm.partitions[SOLO].log.leo
    for tp in (SOLO, SHARED, FOLLOWED):
        again = await produce(rm, tp)
        assert again.error == STORAGE and broker.data_dir.name in again.message
        assert (await consume(rm, tp)).error == STORAGE
        assert (await consume(rm, tp, replica_id=OTHER)).error == STORAGE
        assert lookups(rm, tp) == [STORAGE, STORAGE]
    assert rm.partitions[SOLO].log.leo == leo
    assert rm.follower_fetch_state(FOLLOWED, OTHER) is None  # it stopped following too
    assert files(broker.data_dir) == on_disk


async def test_pending_acks_all_produces_are_answered_with_the_storage_error(
    broker: Broker, disk: Disk
) -> None:
    rm = broker.rm
    waiting = asyncio.ensure_future(produce(rm, SHARED, acks=-1))  # OTHER never fetches it
    await asyncio.sleep(0)
    assert not waiting.done()

    disk.failing["write"] = errno.EIO
    assert (await produce(rm, SOLO)).error == STORAGE

    answered = await asyncio.wait_for(waiting, 5)
    assert answered.error == STORAGE and answered.base_offset == -1


async def test_a_failed_read_takes_the_dir_offline(broker: Broker, disk: Disk) -> None:
    rm = broker.rm
    assert (await produce(rm, SOLO)).error == ErrorCode.NONE
    disk.failing["pread"] = errno.EIO

    result = await consume(rm, SOLO)

    assert result.error == STORAGE and result.records == b""
    assert rm.log_dir_failure is not None
    assert rm.log_dir_failure.operation == f"read from {SOLO}"
    assert "check the disk" in rm.log_dir_failure.advice


async def test_a_failed_follower_append_takes_the_dir_offline(broker: Broker, disk: Disk) -> None:
    rm = broker.rm
    sent = rm.follower_fetch_state(FOLLOWED, OTHER)
    assert sent is not None
    answer = wire.FetchPartitionResult(
        topic=FOLLOWED.topic,
        partition=FOLLOWED.partition,
        high_watermark=3,
        log_start_offset=0,
        log_end_offset=3,
        records=records(base_offset=0, epoch=LEADER_EPOCH),
    )
    disk.failing["write"] = errno.ENOSPC

    await rm.apply_follower_fetch(OTHER, sent, answer)

    assert rm.partitions[FOLLOWED].log.leo == 0
    assert rm.log_dir_failure is not None
    assert rm.log_dir_failure.operation == f"follower append to {FOLLOWED}"
    assert rm.follower_fetch_state(FOLLOWED, OTHER) is None


async def test_a_failed_checkpoint_takes_the_dir_offline_and_stops_the_background_work(
    broker: Broker, disk: Disk
) -> None:
    rm = broker.rm
    disk.failing["fsync"] = errno.EIO  # the HW checkpoint's write_atomic fsyncs its temp file
    stop = asyncio.Event()
    background = asyncio.ensure_future(rm.run_background(stop))
    try:
        await asyncio.wait_for(rm.log_dir_failed.wait(), 10)
        # It stops by itself: nothing more is written to the failed dir.
        await asyncio.wait_for(background, 10)
    finally:
        stop.set()
        background.cancel()
    assert rm.log_dir_failure is not None
    assert rm.log_dir_failure.operation == "checkpoint_high_watermarks"


async def test_metadata_after_the_failure_moves_the_image_but_touches_no_file(
    broker: Broker, disk: Disk
) -> None:
    rm = broker.rm
    disk.failing["write"] = errno.ENOSPC
    assert (await produce(rm, SOLO)).error == STORAGE
    disk.failing.clear()
    on_disk = files(broker.data_dir)

    entries = [
        LogEntry(5, 0, TopicRecord("later", "topic-id-later")),
        LogEntry(
            6,
            0,
            PartitionRecord(
                topic_id="topic-id-later",
                partition=0,
                replicas=(ME,),
                isr=(ME,),
                leader=ME,
                leader_epoch=0,
                partition_epoch=0,
            ),
        ),
    ]
    await rm.apply_metadata_batch(batch_to_pb(entries, high_offset=7))

    assert rm.image.topic("later") is not None  # metadata answers stay current
    assert TopicPartition("later", 0) not in rm.partitions
    assert files(broker.data_dir) == on_disk
