"""`LogManager`: every partition log of one data dir, and the data dir's offset checkpoints.

Does file I/O under the data dir: opens every `<topic>-<partition>/` at start (recovering what
an unclean stop left, research/kafka-replication.md §2.13), creates and deletes partition dirs
(with their `partition.metadata`: `version: 0` / `topic_id: <id>`), and writes
`replication-offset-checkpoint` (HW), `recovery-point-offset-checkpoint` and
`log-start-offset-checkpoint` atomically (checkpoint.py).

Typical life (the broker's composition root):

    data_dir = DataDir.open(path, node_id, cluster_id)
    logs = LogManager.open(data_dir, LogConfig.from_configs(defaults=...))
    log = logs.get_or_create_log(tp, topic_id, config)
    ...  # timers: checkpoint_high_watermarks(), delete_retention(now), maybe_flush(now)
    logs.close()                        # flush, checkpoints, close files
    data_dir.mark_clean_shutdown(broker_epoch); data_dir.close()

Concurrency contract: not thread-safe; one owner thread (the broker's event loop).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Mapping

from minibroker.broker.storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
    fsync_dir,
    write_atomic,
)
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.data_dir import DELETE_DIR_SUFFIX, DataDir, partition_dir_name
from minibroker.broker.storage.errors import CorruptCheckpointError, InconsistentTopicIdError
from minibroker.broker.storage.log import DeletedSegment, PartitionLog
from minibroker.client.common.log import get_logger
from minibroker.client.errors import KafkaStorageError
from minibroker.client.types import TopicPartition

PARTITION_METADATA = "partition.metadata"

_log = get_logger("minibroker.broker.storage")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def read_partition_metadata(directory: os.PathLike[str] | str) -> str | None:
    """The topic id in `partition.metadata`, or None when the file is missing or unreadable."""
    path = os.path.join(directory, PARTITION_METADATA)
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    if fields.get("version", "").strip() != "0":
        _log.warning("partition_metadata_unreadable", path=path)
        return None
    topic_id = fields.get("topic_id", "").strip()
    return topic_id or None


def write_partition_metadata(directory: os.PathLike[str] | str, topic_id: str) -> None:
    write_atomic(
        os.path.join(directory, PARTITION_METADATA), f"version: 0\ntopic_id: {topic_id}\n".encode()
    )


class LogManager:
    """One PartitionLog per TopicPartition under one data dir."""

    def __init__(self, data_dir: DataDir, default_config: LogConfig) -> None:
        self.data_dir = data_dir
        self.default_config = default_config
        self._logs: dict[TopicPartition, PartitionLog] = {}
        self._topic_ids: dict[TopicPartition, str | None] = {}
        self._hw_file = OffsetCheckpointFile(data_dir.path / REPLICATION_OFFSET_CHECKPOINT)
        self._recovery_file = OffsetCheckpointFile(data_dir.path / RECOVERY_POINT_CHECKPOINT)
        self._log_start_file = OffsetCheckpointFile(data_dir.path / LOG_START_OFFSET_CHECKPOINT)

    @classmethod
    def open(
        cls,
        data_dir: DataDir,
        default_config: LogConfig | None = None,
        topic_configs: Mapping[str, LogConfig] | None = None,
        now_ms: int | None = None,
    ) -> LogManager:
        """Open every partition dir; recovery runs unless the data dir had a clean shutdown."""
        manager = cls(data_dir, default_config or LogConfig())
        now = _now_ms() if now_ms is None else now_ms
        high_watermarks = manager._read_checkpoint(manager._hw_file)
        recovery_points = manager._read_checkpoint(manager._recovery_file)
        log_starts = manager._read_checkpoint(manager._log_start_file)
        configs = topic_configs or {}
        for tp, path in data_dir.partition_dirs().items():
            log = PartitionLog.open(
                path,
                tp,
                configs.get(tp.topic, manager.default_config),
                now,
                recovery_point=recovery_points.get(tp, 0),
                log_start_offset=log_starts.get(tp, 0),
                high_watermark=high_watermarks.get(tp, 0),
                had_clean_shutdown=data_dir.had_clean_shutdown,
            )
            manager._logs[tp] = log
            manager._topic_ids[tp] = read_partition_metadata(path)
        _log.info(
            "logs_loaded",
            partitions=len(manager._logs),
            had_clean_shutdown=data_dir.had_clean_shutdown,
        )
        return manager

    @staticmethod
    def _read_checkpoint(file: OffsetCheckpointFile) -> dict[TopicPartition, int]:
        try:
            return file.read()
        except CorruptCheckpointError as err:
            # Losing a checkpoint is safe: 0 means "recover everything" / "HW from replication".
            _log.warning("checkpoint_unreadable", path=str(file.path), error=str(err))
            return {}

    # -- lookups ------------------------------------------------------------------------------

    def get_log(self, tp: TopicPartition) -> PartitionLog | None:
        return self._logs.get(tp)

    @property
    def logs(self) -> dict[TopicPartition, PartitionLog]:
        return dict(self._logs)

    def topic_id(self, tp: TopicPartition) -> str | None:
        return self._topic_ids.get(tp)

    # -- create / delete ----------------------------------------------------------------------

    def get_or_create_log(
        self,
        tp: TopicPartition,
        topic_id: str | None = None,
        config: LogConfig | None = None,
        now_ms: int | None = None,
    ) -> PartitionLog:
        """The log of `tp`, created empty at offset 0 when missing.

        Raises InconsistentTopicIdError when the dir on disk belongs to another incarnation
        of the topic (deleted and re-created while this broker was away): the caller decides
        whether to `delete_log` and create again.
        """
        log = self._logs.get(tp)
        if log is not None:
            stored = self._topic_ids.get(tp)
            if topic_id is not None and stored is not None and stored != topic_id:
                raise InconsistentTopicIdError(
                    f"partition dir {log.directory} holds topic id {stored}, expected {topic_id}",
                    on_disk=stored,
                    expected=topic_id,
                )
            if topic_id is not None and stored is None:
                write_partition_metadata(log.directory, topic_id)
                self._topic_ids[tp] = topic_id
            if config is not None:
                log.update_config(config)
            return log
        path = self.data_dir.partition_path(tp)
        path.mkdir(parents=True, exist_ok=True)
        if topic_id is not None:
            # Before the first data write, as Kafka does, so the dir is never anonymous.
            write_partition_metadata(path, topic_id)
        fsync_dir(self.data_dir.path)
        log = PartitionLog.open(
            path,
            tp,
            config or self.default_config,
            _now_ms() if now_ms is None else now_ms,
            had_clean_shutdown=True,
        )
        self._logs[tp] = log
        self._topic_ids[tp] = topic_id
        _log.info("log_created", topic=tp.topic, partition=tp.partition, topic_id=topic_id)
        return log

    def delete_log(self, tp: TopicPartition) -> bool:
        """Close and remove the partition dir; False when there is no such log."""
        log = self._logs.pop(tp, None)
        self._topic_ids.pop(tp, None)
        if log is None:
            return False
        log.close()
        # Rename first so a crash mid-delete never leaves a half-deleted log that loads.
        doomed = self.data_dir.path / (
            f"{partition_dir_name(tp)}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"
        )
        os.replace(log.directory, doomed)
        fsync_dir(self.data_dir.path)
        shutil.rmtree(doomed, ignore_errors=True)
        _log.info("log_deleted", topic=tp.topic, partition=tp.partition)
        return True

    def update_topic_config(self, topic: str, config: LogConfig) -> None:
        for tp, log in self._logs.items():
            if tp.topic == topic:
                log.update_config(config)

    # -- periodic work ------------------------------------------------------------------------

    def checkpoint_high_watermarks(self) -> None:
        self._hw_file.write({tp: log.high_watermark for tp, log in self._logs.items()})

    def checkpoint_recovery_points(self) -> None:
        self._recovery_file.write({tp: log.recovery_point for tp, log in self._logs.items()})

    def checkpoint_log_start_offsets(self) -> None:
        self._log_start_file.write({tp: log.log_start_offset for tp, log in self._logs.items()})

    def checkpoint_all(self) -> None:
        self.checkpoint_high_watermarks()
        self.checkpoint_recovery_points()
        self.checkpoint_log_start_offsets()

    def delete_retention(self, now_ms: int) -> dict[TopicPartition, list[DeletedSegment]]:
        """Run retention on every log; returns the segments deleted, per partition.

        A log whose deletion fails part of the way (KafkaStorageError) does not stop the others;
        the log starts are checkpointed, then the first failure is raised.
        """
        deleted: dict[TopicPartition, list[DeletedSegment]] = {}
        failure: KafkaStorageError | None = None
        for tp, log in self._logs.items():
            try:
                gone = log.delete_retention(now_ms)
            except KafkaStorageError as err:
                failure = failure or err
                continue
            if gone:
                deleted[tp] = gone
        if deleted or failure is not None:
            self.checkpoint_log_start_offsets()
        if failure is not None:
            raise failure
        return deleted

    def maybe_flush(self, now_ms: int) -> list[TopicPartition]:
        """Apply each log's flush.messages / flush.ms policy; returns the partitions flushed."""
        flushed = [tp for tp, log in self._logs.items() if log.maybe_flush(now_ms)]
        if flushed:
            self.checkpoint_recovery_points()
        return flushed

    def flush_all(self, now_ms: int | None = None) -> None:
        for log in self._logs.values():
            log.flush(now_ms)
        self.checkpoint_recovery_points()

    def close(self) -> None:
        """Flush every log, write the three checkpoints and close the files.

        Every log is closed even when a flush or a checkpoint fails; the first failure is then
        raised, so the caller does not mark the shutdown clean (recovery runs at the next start).
        """
        failure: BaseException | None = None
        try:
            self.flush_all()
            self.checkpoint_all()
        except BaseException as err:
            failure = err
        for log in self._logs.values():
            try:
                log.close()
            except BaseException as err:
                failure = failure or err
        if failure is not None:
            raise failure
        _log.info("logs_closed", partitions=len(self._logs))
