"""The replica manager (the asyncio shell) for moving replicas and live configs, on real logs:

* a topic ConfigRecord reconfigures the PartitionLog at once (retention, segment, flush);
* a broker removed from a partition's replicas deletes the log dir, once the record says so;
* the follower's fetch plan leaves a throttled partition out when its quota is exceeded, and
  the quota's rate and totals reach /metrics (Kafka's FollowerReplication byte-rate).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from minibroker.broker.config import build_config
from minibroker.broker.metrics import BrokerMetrics
from minibroker.broker.replicas.manager import ReplicaManager
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.data_dir import DataDir
from minibroker.broker.storage.log_manager import LogManager
from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.replication_throttle import (
    FOLLOWER_THROTTLED_RATE,
    FOLLOWER_THROTTLED_REPLICAS,
)
from minibroker.client.types import TopicPartition
from minibroker.metadata.records import (
    CONFIG_RESOURCE_BROKER,
    ConfigRecord,
    LogEntry,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from minibroker.metadata.wire import batch_to_pb

ME, LEADER, OTHER = 2, 1, 3
TOPIC, TOPIC_ID = "events", "topic-id-events"
TP = TopicPartition(TOPIC, 0)


class Shell:
    def __init__(self, rm: ReplicaManager) -> None:
        self.rm = rm
        self.offset = 0

    async def apply(self, *records: Any) -> None:
        entries = []
        for record in records:
            entries.append(LogEntry(self.offset, 0, record))
            self.offset += 1
        await self.rm.apply_metadata_batch(batch_to_pb(entries, high_offset=self.offset))


@pytest.fixture
async def shell(tmp_path: Path) -> AsyncIterator[Shell]:
    """Broker ME following LEADER (no address: no fetcher runs) for TP, not in the ISR."""
    config = build_config({"node.id": ME, "log.dirs": str(tmp_path / "data")})
    data_dir = DataDir.open(config.data_dir, config.node_id)
    log_manager = LogManager.open(data_dir, LogConfig.from_configs(defaults=config.topic_defaults))
    rm = ReplicaManager(config, log_manager, BrokerMetrics(), config.controller)
    rm.load_existing_logs()
    shell = Shell(rm)
    try:
        await shell.apply(
            RegisterBrokerRecord(ME, "incarnation-2", 0, "127.0.0.1", 1),
            TopicRecord(TOPIC, TOPIC_ID),
            PartitionRecord(
                TOPIC_ID, 0, (LEADER, ME), (LEADER,), LEADER, 1, 1, adding_replicas=(ME,)
            ),
        )
        assert TP in rm.partitions
        yield shell
    finally:
        await rm.stop()
        log_manager.close()
        data_dir.close()


async def test_a_topic_config_record_reconfigures_the_log_at_once(shell: Shell) -> None:
    log = shell.rm.engine.log(TP)
    assert log is not None and log.config.retention_ms != 1234
    await shell.apply(
        ConfigRecord(TOPIC_ID, "retention.ms", "1234"),
        ConfigRecord(TOPIC_ID, "segment.bytes", "65536"),
        ConfigRecord(TOPIC_ID, "flush.messages", "7"),
        ConfigRecord(TOPIC_ID, "retention.bytes", "99999"),
    )
    assert (
        log.config.retention_ms,
        log.config.segment_bytes,
        log.config.flush_messages,
        log.config.retention_bytes,
    ) == (1234, 65536, 7, 99999)


async def test_a_replica_no_longer_named_deletes_its_log_dir(shell: Shell) -> None:
    log = shell.rm.engine.log(TP)
    assert log is not None
    directory = Path(log.directory)
    assert directory.is_dir()
    await shell.apply(PartitionRecord(TOPIC_ID, 0, (LEADER, OTHER), (LEADER,), LEADER, 1, 2))
    assert TP not in shell.rm.partitions and TP not in shell.rm.log_manager.logs
    assert not directory.exists()


def metric(rm: ReplicaManager, name: str) -> float:
    for line in generate_latest(rm.metrics.registry).decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


async def test_the_follower_leaves_a_throttled_partition_out_over_its_quota(shell: Shell) -> None:
    rm = shell.rm
    assert rm.fetching.throttle_fetch([TP], 0) == ([TP], 0)  # no rate, no list
    await shell.apply(
        ConfigRecord("", FOLLOWER_THROTTLED_RATE, "1000", CONFIG_RESOURCE_BROKER),
        ConfigRecord(TOPIC_ID, FOLLOWER_THROTTLED_REPLICAS, f"0:{ME}"),
    )
    assert rm.fetching.throttle_fetch([TP], 0) == ([TP], 1)  # under the quota: asked
    quota = rm.engine.follower_quota
    quota.record(50_000, wall_clock_ms())
    assert rm.fetching.throttle_fetch([TP], 1) == ([], 1)  # over it: left out
    rm.background._update_gauges()
    assert metric(rm, "kafka_server_follower_replication_byte_rate") > 1000
    assert metric(rm, "kafka_server_follower_replication_throttled_rate") == 1000
    assert metric(rm, "kafka_server_follower_replication_throttled_bytes_total") == 50_000
    assert metric(rm, "kafka_server_follower_replication_throttled_partitions_total") == 1
    assert metric(rm, "kafka_server_leader_replication_throttled_rate") == -1
    rm.background._update_gauges()  # counters grow by what is new only
    assert metric(rm, "kafka_server_follower_replication_throttled_bytes_total") == 50_000
