"""Logs found on disk at start that the metadata does not name are never served (issue 11 item 2).

A broker that was down while a topic was deleted (and maybe re-created under the same name)
loads the old partition dirs at start. Once its metadata has caught up with the controller's
(Kafka's stray replica check), a log whose topic id the metadata does not know is deleted; a
log whose topic has another id now, or that has no topic id at all, is deleted and created
again empty. Before the metadata has caught up, nothing is deleted: a topic may be named only
by a later batch.

On a real ReplicaManager (BrokerConfig, LogManager on tmp_path, BrokerMetrics) fed metadata
batches as the controller's watch stream sends them; no sockets (no broker address is known).
"""

from __future__ import annotations

from pathlib import Path

from minibroker.broker.config import build_config
from minibroker.broker.metrics import BrokerMetrics
from minibroker.broker.replicas.manager import ReplicaManager
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.data_dir import DataDir
from minibroker.broker.storage.log_manager import LogManager, read_partition_metadata
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

ME = 1
GONE = TopicPartition("gone", 0)  # deleted while the broker was down
KEPT = TopicPartition("kept", 0)
RECREATED = TopicPartition("recreated", 0)  # deleted and created again under another id
ANONYMOUS = TopicPartition("anonymous", 0)  # a dir without partition.metadata


def _partition(topic_id: str) -> PartitionRecord:
    return PartitionRecord(
        topic_id=topic_id,
        partition=0,
        replicas=(ME,),
        isr=(ME,),
        leader=ME,
        leader_epoch=1,
        partition_epoch=1,
    )


async def test_strays_go_once_the_metadata_has_caught_up(tmp_path: Path) -> None:
    config = build_config({"node.id": ME, "log.dirs": str(tmp_path / "data")})
    with DataDir.open(config.data_dir, config.node_id) as data_dir:
        logs = LogManager.open(data_dir)
        for tp, topic_id in (
            (GONE, "id-gone"),
            (KEPT, "id-kept"),
            (RECREATED, "id-old"),
            (ANONYMOUS, None),
        ):
            log = logs.get_or_create_log(tp, topic_id=topic_id)
            log.append_as_leader(encode_batch([(1, None, b"old", ())]), leader_epoch=0, now_ms=0)
        logs.close()

    data_dir = DataDir.open(config.data_dir, config.node_id)
    log_manager = LogManager.open(data_dir, LogConfig.from_configs(defaults=config.topic_defaults))
    rm = ReplicaManager(config, log_manager, BrokerMetrics(), config.controller)
    rm.load_existing_logs()
    try:
        records: list[MetadataRecord] = [
            RegisterBrokerRecord(ME, "incarnation-1", 0, "127.0.0.1", 1),
            TopicRecord("kept", "id-kept"),
            _partition("id-kept"),
            TopicRecord("recreated", "id-new"),
            _partition("id-new"),
            TopicRecord("anonymous", "id-anon"),
            _partition("id-anon"),
        ]
        entries = [LogEntry(i, 0, record) for i, record in enumerate(records)]
        # The first part of the log: the controller is further on, so nothing is a stray yet.
        await rm.apply_metadata_batch(batch_to_pb(entries[:3], high_offset=len(entries)))
        assert set(rm.partitions) == {GONE, KEPT, RECREATED, ANONYMOUS}
        assert (Path(config.data_dir) / "gone-0").is_dir()

        await rm.apply_metadata_batch(batch_to_pb(entries[3:], high_offset=len(entries)))
        assert set(rm.partitions) == {KEPT, RECREATED, ANONYMOUS}
        assert not (Path(config.data_dir) / "gone-0").exists()
        assert rm.partitions[KEPT].log.leo == 1
        for tp, topic_id in ((RECREATED, "id-new"), (ANONYMOUS, "id-anon")):
            hosted = rm.partitions[tp]
            assert (hosted.topic_id, hosted.log.leo) == (topic_id, 0)
            assert read_partition_metadata(hosted.log.directory) == topic_id
        assert log_manager.pending_deletes == ()
    finally:
        await rm.stop()
        log_manager.close()
        data_dir.close()
