"""The replica manager applies a leader's fetch answer only to the request it is the answer to.

`ReplicaManager.follower_fetch_state` records the position it planned (the engine's
`HostedReplica.pending_fetch`) and the request it built from it (`FetchHandler.asked`) and hands
that request to the
fetcher; `apply_follower_fetch(leader_id, sent, result)` applies the answer only when `sent` IS
the pending request and the pending position is for `leader_id`. Anything else, such as the late
answer of a stopping fetcher or an answer to a request from before the position was re-planned,
is dropped without an append or any other state change (see `FetchHandler.asked`; the core
adds its own KIP-320 checks, which an answer from the same position in the same epoch passes, so
only this rule catches these cases). docs/design.md §5 (Follower): one fetcher per leader broker
applies the answers to its long poll; KIP-320 for why an answer must match what was asked.

What the tests prove, each on a real ReplicaManager (BrokerConfig, LogManager on tmp_path,
BrokerMetrics) made a follower by applying controller metadata records:
- the answer to the pending request is appended, moves the LEO and clears the pending state;
- an answer to an older request object is dropped once a newer one is pending, and the newer one
  still applies afterwards;
- an answer said to come from another leader is dropped, and the same answer from the partition's
  leader still applies afterwards.

asyncio on one event loop (the replica manager's methods are coroutines), no sockets: the leader
is never registered in the metadata, so the replica manager knows no address for it and starts no
fetcher (no connection, and no fetcher task re-planning the pending request under the test).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from minibroker.broker import wire
from minibroker.broker.config import build_config
from minibroker.broker.metrics import BrokerMetrics
from minibroker.broker.replicas.manager import ReplicaManager
from minibroker.broker.replication.events import Role
from minibroker.broker.replication.hosted import HostedReplica
from minibroker.broker.storage.checkpoint import OffsetCheckpointFile
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.data_dir import DataDir
from minibroker.broker.storage.log import PartitionLog
from minibroker.broker.storage.log_manager import LogManager
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition
from minibroker.metadata.records import (
    LogEntry,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from minibroker.metadata.wire import batch_to_pb

ME = 2
LEADER = 1
OTHER_BROKER = 3
LEADER_EPOCH = 4
TOPIC = "events"
TOPIC_ID = "topic-id-events"
TP = TopicPartition(TOPIC, 0)
RECORD_COUNT = 3


@dataclass
class Follower:
    rm: ReplicaManager
    hosted: HostedReplica[PartitionLog]


@pytest.fixture
async def follower(tmp_path: Path) -> AsyncIterator[Follower]:
    """A replica manager on broker ME following LEADER for TP, built as broker/app.py builds it."""
    config = build_config({"node.id": ME, "log.dirs": str(tmp_path / "data")})
    data_dir = DataDir.open(config.data_dir, config.node_id)
    log_manager = LogManager.open(data_dir, LogConfig.from_configs(defaults=config.topic_defaults))
    rm = ReplicaManager(config, log_manager, BrokerMetrics(), config.controller)
    rm.load_existing_logs()
    try:
        # The controller's metadata log as the broker's watch stream delivers it: this broker's
        # registration, the topic, then the partition led by LEADER with ME in the ISR.
        entries = [
            LogEntry(0, 0, RegisterBrokerRecord(ME, "incarnation-2", 0, "127.0.0.1", 1)),
            LogEntry(1, 0, TopicRecord(TOPIC, TOPIC_ID)),
            LogEntry(
                2,
                0,
                PartitionRecord(
                    topic_id=TOPIC_ID,
                    partition=TP.partition,
                    replicas=(LEADER, ME),
                    isr=(LEADER, ME),
                    leader=LEADER,
                    leader_epoch=LEADER_EPOCH,
                    partition_epoch=LEADER_EPOCH,
                ),
            ),
        ]
        await rm.apply_metadata_batch(batch_to_pb(entries, high_offset=len(entries)))
        hosted = rm.partitions[TP]
        assert hosted.core.role is Role.FOLLOWER
        assert (follower := hosted.core.follower_state) is not None and follower.leader_id == LEADER
        # No address for LEADER, so no fetcher competes with the test for the pending request.
        assert rm.fetchers.leader_of(TP) is None
        assert hosted.log.leo == 0
        yield Follower(rm, hosted)
    finally:
        await rm.stop()
        log_manager.close()
        data_dir.close()


def leader_answer(sent: wire.FetchPartitionRequest) -> wire.FetchPartitionResult:
    """The leader's answer to `sent`: RECORD_COUNT records from the fetch offset, all committed."""
    records = encode_batch(
        [(1_000 + i, f"k{i}".encode(), f"v{i}".encode(), []) for i in range(RECORD_COUNT)],
        base_offset=sent.fetch_offset,
        partition_leader_epoch=sent.current_leader_epoch,
    )
    end = sent.fetch_offset + RECORD_COUNT
    return wire.FetchPartitionResult(
        topic=sent.topic,
        partition=sent.partition,
        high_watermark=end,
        log_start_offset=0,
        log_end_offset=end,
        records=records,
    )


def observable(hosted: HostedReplica[PartitionLog]) -> tuple[Any, ...]:
    """Everything an applied answer would change: log, core offsets and follower bookkeeping."""
    follower = hosted.core.follower_state
    assert follower is not None
    return (
        hosted.log.leo,
        hosted.core.leo,
        hosted.core.high_watermark,
        hosted.core.log_start_offset,
        follower.leader_high_watermark,
        follower.leader_log_start_offset,
        follower.backoff_until_ms,
        follower.failed,
    )


def planned(rm: ReplicaManager) -> wire.FetchPartitionRequest:
    sent = rm.follower_fetch_state(TP, LEADER)
    assert sent is not None
    assert sent.fetch_offset == 0 and sent.current_leader_epoch == LEADER_EPOCH
    return sent


async def test_the_answer_to_the_pending_request_is_appended(follower: Follower) -> None:
    """The answer to the request that is pending is applied: its batch is appended at the fetch
    offset with the leader's epoch, the LEO and HW move, and nothing is pending any more."""
    rm, hosted = follower.rm, follower.hosted
    sent = planned(rm)
    assert rm.fetching.asked(TP) is sent and hosted.pending_fetch is not None

    await rm.apply_follower_fetch(LEADER, sent, leader_answer(sent))

    assert hosted.log.leo == RECORD_COUNT
    assert hosted.core.leo == RECORD_COUNT
    assert hosted.core.high_watermark == RECORD_COUNT
    assert hosted.log.epoch_cache.latest_epoch == LEADER_EPOCH
    assert hosted.pending_fetch is None and rm.fetching.asked(TP) is None
    # The next request asks for what follows the appended records.
    following = rm.follower_fetch_state(TP, LEADER)
    assert following is not None and following.fetch_offset == RECORD_COUNT


async def test_an_answer_to_an_older_request_is_dropped(follower: Follower) -> None:
    """Once the position was re-planned (a new request object is pending), the answer to the
    older request is dropped even though it asks for the same offset in the same epoch: no
    append, no state change, the new request still pending, and its own answer still applies."""
    rm, hosted = follower.rm, follower.hosted
    older = planned(rm)
    newer = planned(rm)
    assert newer is not older and newer == older  # same position: only identity tells them apart
    pending_fetch = hosted.pending_fetch
    before = observable(hosted)

    await rm.apply_follower_fetch(LEADER, older, leader_answer(older))

    assert observable(hosted) == before
    assert rm.fetching.asked(TP) is newer and hosted.pending_fetch is pending_fetch

    await rm.apply_follower_fetch(LEADER, newer, leader_answer(newer))
    assert hosted.log.leo == RECORD_COUNT
    assert rm.fetching.asked(TP) is None


async def test_an_answer_from_another_leader_is_dropped(follower: Follower) -> None:
    """An answer handed in for a leader other than the one the pending fetch was planned for
    (a fetcher for another broker) is dropped: no append, no state change, the request still
    pending, and the same answer from the partition's leader still applies."""
    rm, hosted = follower.rm, follower.hosted
    sent = planned(rm)
    pending_fetch = hosted.pending_fetch
    before = observable(hosted)

    await rm.apply_follower_fetch(OTHER_BROKER, sent, leader_answer(sent))

    assert observable(hosted) == before
    assert rm.fetching.asked(TP) is sent and hosted.pending_fetch is pending_fetch

    await rm.apply_follower_fetch(LEADER, sent, leader_answer(sent))
    assert hosted.log.leo == RECORD_COUNT
    assert rm.fetching.asked(TP) is None


async def test_the_cores_high_watermark_is_checkpointed_at_stop_and_seeds_the_next_start(
    follower: Follower, tmp_path: Path
) -> None:
    """The core alone holds the HW: stopping the replica manager writes each core's HW to the
    data dir's checkpoint (Kafka's ReplicaManager.shutdown), and the next start hands it to the
    new core through the LogManager."""
    rm = follower.rm
    sent = planned(rm)
    await rm.apply_follower_fetch(LEADER, sent, leader_answer(sent))
    assert follower.hosted.core.high_watermark == RECORD_COUNT

    await rm.stop()

    checkpoint = OffsetCheckpointFile(tmp_path / "data" / "replication-offset-checkpoint")
    assert checkpoint.read() == {TP: RECORD_COUNT}
    rm.log_manager.flush_all()
    config = build_config({"node.id": ME, "log.dirs": str(tmp_path / "data")})
    again = LogManager.open(rm.log_manager.data_dir, LogConfig())
    try:
        assert again.checkpointed_high_watermark(TP) == RECORD_COUNT
        restarted = ReplicaManager(config, again, BrokerMetrics(), config.controller)
        restarted.load_existing_logs()
        assert restarted.partitions[TP].core.high_watermark == RECORD_COUNT
    finally:
        for log in again.logs.values():
            log.close()
