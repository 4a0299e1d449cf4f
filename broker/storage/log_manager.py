"""`LogManager`: every partition log of one data dir, and the data dir's offset checkpoints.

Does file I/O under the data dir: opens every `<topic>-<partition>/` at start (recovering what
an unclean stop left, docs/design.md §4.5), creates and deletes partition dirs
(with their `partition.metadata`: `version: 0` / `topic_id: <id>`), and writes
`replication-offset-checkpoint` (HW), `recovery-point-offset-checkpoint` and
`log-start-offset-checkpoint` atomically (checkpoint.py). The high watermarks are the replication
core's: the manager writes the ones its caller passes (`checkpoint_high_watermarks`) and hands out
the ones it read at start (`checkpointed_high_watermark`), holding none of its own.

Deleting a log renames its dir to `<topic>-<partition>.<uuid>-delete` (the topic cut so the name
fits 255 bytes, as Kafka's LocalLog.logDeleteDirName does), then removes it; a dir with that
suffix is never loaded and is removed at start. A rename or removal that fails is remembered and
retried (`retry_deletes`), and no log of the same partition is created while the old dir still
stands under its live name, so a topic deleted and re-created never serves the old records. A
dir found on disk for a topic id other than the one asked for is never adopted either.

New logs are created in bulk: `plan_new_logs` (owner thread) picks the ones that need a new dir,
`make_new_logs` (any thread) writes every dir and file without fsync and then makes them durable
in one pass (each file with content, each new dir, the data dir once: Kafka too keeps fsyncs of
`partition.metadata` off the request path), and `add_new_logs` (owner thread) takes the logs
over. A crash before the pass ends may leave a dir whose `partition.metadata` is missing or cut
short; `read_partition_metadata` takes only a whole file, so loading gives such a dir no topic
id (the replica manager deletes it and creates the log again: it held no data yet) and never a
wrong one.

Typical life (the broker's composition root):

    data_dir = DataDir.open(path, node_id, cluster_id)
    logs = LogManager.open(data_dir, LogConfig.from_configs(defaults=...))
    log = logs.get_or_create_log(tp, topic_id, config)
    hw = logs.checkpointed_high_watermark(tp)   # the replication core's first HW
    ...  # timers: checkpoint_high_watermarks({tp: core HW}), maybe_flush(now), retention
    logs.close()                        # flush, log start / recovery checkpoints, close files
    data_dir.mark_clean_shutdown(broker_epoch); data_dir.close()

Concurrency contract: not thread-safe; one owner thread (the broker's event loop), which may run
`make_new_logs` on a worker thread meanwhile (it touches only the dirs it creates).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from minibroker.broker.storage.checkpoint import (
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
    fsync_dir,
    fsync_file,
    write_atomic,
    write_new_file,
)
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.data_dir import DELETE_DIR_SUFFIX, DataDir
from minibroker.broker.storage.errors import CorruptCheckpointError, InconsistentTopicIdError
from minibroker.broker.storage.log import DeletedSegment, PartitionLog
from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.common.log import get_logger
from minibroker.client.errors import KafkaStorageError
from minibroker.client.types import TopicPartition

PARTITION_METADATA = "partition.metadata"
_PARTITION_METADATA_TEXT = re.compile(rb"version: 0\ntopic_id: ([\x21-\x7e]+)\n")
_PARTITION_METADATA_MAX_BYTES = 4096
# NAME_MAX of Linux file systems (and of most others): a longer name fails with ENAMETOOLONG.
MAX_FILE_NAME_BYTES = 255
_DELETE_DIR = re.compile(
    r"([a-zA-Z0-9._-]+)-([0-9]+)\.([0-9a-f]{32})" + re.escape(DELETE_DIR_SUFFIX)
)

_log = get_logger("minibroker.broker.storage")


class DeleteDirName(NamedTuple):
    """What a `<topic>-<partition>.<uuid>-delete` name says (the topic may be cut short)."""

    topic_prefix: str
    partition: int
    unique_id: str


def log_delete_dir_name(tp: TopicPartition, unique_id: str | None = None) -> str:
    """The name a deleted partition dir is renamed to: `<topic>-<partition>.<uuid>-delete`.

    Kafka's LocalLog.logDeleteDirName: the topic part is cut so the whole name fits
    MAX_FILE_NAME_BYTES, since `<249-char topic>-<p>.<32 hex>-delete` would not.
    """
    suffix = f"-{tp.partition}.{unique_id or uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"
    budget = MAX_FILE_NAME_BYTES - len(suffix.encode())
    return tp.topic.encode()[:budget].decode(errors="ignore") + suffix


def parse_delete_dir_name(name: str) -> DeleteDirName | None:
    """The parts of a name `log_delete_dir_name` made, or None."""
    match = _DELETE_DIR.fullmatch(name)
    if match is None:
        return None
    return DeleteDirName(match.group(1), int(match.group(2)), match.group(3))


@dataclass
class _PendingDelete:
    """A partition dir whose deletion failed part of the way; `renamed` once it is a -delete."""

    tp: TopicPartition
    path: pathlib.Path
    renamed: bool


def read_partition_metadata(directory: os.PathLike[str] | str) -> str | None:
    """The topic id in `partition.metadata`, or None when the file is missing or is not whole.

    Only the exact text `write_partition_metadata` writes is taken: a file cut short by a crash
    (a new dir's file is fsynced only after it is written) never yields a part of an id.
    """
    path = os.path.join(directory, PARTITION_METADATA)
    try:
        with open(path, "rb") as f:
            raw = f.read(_PARTITION_METADATA_MAX_BYTES)
    except FileNotFoundError:
        return None
    match = _PARTITION_METADATA_TEXT.fullmatch(raw)
    if match is None:
        _log.warning("partition_metadata_unreadable", path=path, size=len(raw))
        return None
    return match.group(1).decode()


def partition_metadata_text(topic_id: str) -> bytes:
    return f"version: 0\ntopic_id: {topic_id}\n".encode()


def write_partition_metadata(directory: os.PathLike[str] | str, topic_id: str) -> None:
    write_atomic(os.path.join(directory, PARTITION_METADATA), partition_metadata_text(topic_id))


@dataclass(frozen=True, slots=True)
class NewLog:
    """A log to create empty, at offset 0, in a dir of its own (`LogManager.create_logs`)."""

    tp: TopicPartition
    topic_id: str | None  # None: no `partition.metadata` (tests; the broker always has one)
    config: LogConfig | None = None
    # The leader epoch this broker leads the new log at (-1: it does not lead it), recorded
    # with the log so that becoming its leader has nothing left to write.
    leader_epoch: int = -1


class LogManager:
    """One PartitionLog per TopicPartition under one data dir."""

    def __init__(self, data_dir: DataDir, default_config: LogConfig) -> None:
        self.data_dir = data_dir
        self.default_config = default_config
        self._logs: dict[TopicPartition, PartitionLog] = {}
        self._topic_ids: dict[TopicPartition, str | None] = {}
        self._pending_deletes: list[_PendingDelete] = []
        # Deleted since the checkpoints were last written: their stale entries must not reach
        # a new log of the same partition if the broker crashes before the next checkpoint.
        self._deleted_since_checkpoint: set[TopicPartition] = set()
        self._hw_file = OffsetCheckpointFile(data_dir.path / REPLICATION_OFFSET_CHECKPOINT)
        self._hw_written: dict[TopicPartition, int] | None = None  # what the file holds now
        self._recovery_file = OffsetCheckpointFile(data_dir.path / RECOVERY_POINT_CHECKPOINT)
        self._log_start_file = OffsetCheckpointFile(data_dir.path / LOG_START_OFFSET_CHECKPOINT)
        # What the HW checkpoint held at start for each loaded log, until the log is deleted:
        # the replication core starts from it (`checkpointed_high_watermark`).
        self._loaded_high_watermarks: dict[TopicPartition, int] = {}

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
        now = wall_clock_ms() if now_ms is None else now_ms
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
                had_clean_shutdown=data_dir.had_clean_shutdown,
                system_restarted=data_dir.system_restarted,
            )
            manager._logs[tp] = log
            if tp in high_watermarks:
                manager._loaded_high_watermarks[tp] = high_watermarks[tp]
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

    def checkpointed_high_watermark(self, tp: TopicPartition) -> int:
        """The HW the checkpoint held for `tp` when the logs were loaded, for the replication
        core's initial value: clamped to the log's [log start, LEO] (the log may have been
        recovered to less), and 0 ("learn it from replication") for a log created or adopted
        since, or one without an entry."""
        log = self._logs.get(tp)
        if log is None:
            return 0
        high_watermark = self._loaded_high_watermarks.get(tp, 0)
        return min(max(high_watermark, log.log_start_offset), log.leo)

    @property
    def pending_deletes(self) -> tuple[TopicPartition, ...]:
        """Partitions with a dir whose deletion failed and is to be retried."""
        return tuple(pending.tp for pending in self._pending_deletes)

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
        self._clear_the_way(tp)
        path = self.data_dir.partition_path(tp)
        now = wall_clock_ms() if now_ms is None else now_ms
        if path.is_dir():
            return self._adopt(tp, path, topic_id, config, now)
        (made,) = self.create_logs([NewLog(tp, topic_id, config)], now)
        if isinstance(made, BaseException):
            raise made
        return made

    def create_logs(
        self, wanted: Sequence[NewLog], now_ms: int | None = None
    ) -> list[PartitionLog | OSError]:
        """Create the logs of `wanted` (which have neither a log nor a dir) in the calling
        thread: `make_new_logs` then `add_new_logs`. One result per entry, in order."""
        now = wall_clock_ms() if now_ms is None else now_ms
        if any(new.tp in self._deleted_since_checkpoint for new in wanted):
            self.checkpoint_all()
        made = self.make_new_logs(wanted, now)
        self.add_new_logs(wanted, made)
        return made

    def plan_new_logs(self, wanted: Iterable[NewLog]) -> list[NewLog]:
        """Those of `wanted` that `make_new_logs` may create, each once. Owner thread.

        Left out: a partition with a log, or with a dir on disk under its name
        (`get_or_create_log` adopts the dir or refuses another topic id, as ever), and one
        whose deleted predecessor's dir cannot be removed yet (`get_or_create_log` raises for
        it). Writes the offset checkpoints first when one of them was deleted since they were
        last written, so that no stale entry reaches its new log.
        """
        planned: dict[TopicPartition, NewLog] = {}
        for new in wanted:
            if new.tp in planned or new.tp in self._logs:
                continue
            try:
                self._clear_the_way(new.tp)
            except KafkaStorageError:
                continue
            if os.path.lexists(self.data_dir.partition_path(new.tp)):
                continue
            planned[new.tp] = new
        if any(tp in self._deleted_since_checkpoint for tp in planned):
            self.checkpoint_all()
        return list(planned.values())

    def make_new_logs(self, new: Sequence[NewLog], now_ms: int) -> list[PartitionLog | OSError]:
        """Create the dirs and files of new logs, then make them durable in one pass; returns
        each log, or the error that kept it from being made. Any thread: it reads this object's
        settings only and writes only under the new dirs (which `plan_new_logs` chose); the logs
        are nobody's until `add_new_logs`.

        Per log: its dir, `partition.metadata` (before any data, as Kafka writes it, so the dir
        is never anonymous), the first segment's files and, for a log this broker leads, the
        leader epoch checkpoint; nothing is fsynced on the way. Then the durability pass: each
        `partition.metadata` and epoch checkpoint, each partition dir (which holds the new
        names), and the data dir once. Kafka flushes `partition.metadata` off the request
        path too; here the logs are handed over only after the pass, so a log in use always
        has a durable dir and topic id. A crash before the pass ends leaves dirs whose files
        may be missing or cut short: loading takes such a dir without a whole
        `partition.metadata` as a log without a topic id, which the replica manager deletes
        and creates again (it was empty), and never adopts under a wrong id.
        """
        results: list[PartitionLog | OSError] = []
        made: list[PartitionLog] = []
        for entry in new:
            path = self.data_dir.partition_path(entry.tp)
            try:
                path.mkdir()
            except OSError as err:
                results.append(err)
                continue
            try:
                if entry.topic_id is not None:
                    metadata = partition_metadata_text(entry.topic_id)
                    write_new_file(path / PARTITION_METADATA, metadata)
                log = PartitionLog.create(
                    path,
                    entry.tp,
                    entry.config or self.default_config,
                    now_ms,
                    leader_epoch=entry.leader_epoch,
                )
            except OSError as err:
                shutil.rmtree(path, ignore_errors=True)  # nothing half-made is left to adopt
                results.append(err)
                continue
            results.append(log)
            made.append(log)
        if not made:
            return results
        try:
            for entry, result in zip(new, results, strict=True):
                if not isinstance(result, PartitionLog):
                    continue
                if entry.topic_id is not None:
                    fsync_file(result.directory / PARTITION_METADATA)
                if len(result.epoch_cache):
                    fsync_file(result.directory / LEADER_EPOCH_CHECKPOINT)
                fsync_dir(result.directory)
            fsync_dir(self.data_dir.path)
        except OSError as err:
            for log in made:
                with contextlib.suppress(OSError):
                    log.close()
                # Never made durable: removed, as a log that failed to be made is, so that no
                # later create adopts it by its partition.metadata.
                shutil.rmtree(log.directory, ignore_errors=True)
            return [err if isinstance(r, PartitionLog) else r for r in results]
        return results

    def add_new_logs(
        self, new: Sequence[NewLog], made: Sequence[PartitionLog | OSError]
    ) -> list[TopicPartition]:
        """Take over the logs `make_new_logs` made (owner thread); returns their partitions."""
        added = []
        for entry, log in zip(new, made, strict=True):
            if isinstance(log, OSError):
                continue
            self._logs[entry.tp] = log
            self._topic_ids[entry.tp] = entry.topic_id
            added.append(entry.tp)
            _log.info(
                "log_created",
                topic=entry.tp.topic,
                partition=entry.tp.partition,
                topic_id=entry.topic_id,
            )
        return added

    def _adopt(
        self,
        tp: TopicPartition,
        path: pathlib.Path,
        topic_id: str | None,
        config: LogConfig | None,
        now_ms: int,
    ) -> PartitionLog:
        """Load a partition dir that was not loaded at start (it appeared later, or its name
        did not parse then), only if it belongs to the same topic id; recovered in full."""
        stored = read_partition_metadata(path)
        if stored != topic_id:
            raise InconsistentTopicIdError(
                f"partition dir {path} holds topic id {stored}, expected {topic_id}",
                on_disk=stored or "",
                expected=topic_id or "",
            )
        log = PartitionLog.open(path, tp, config or self.default_config, now_ms)
        self._logs[tp] = log
        self._topic_ids[tp] = stored
        _log.warning("log_found_on_disk", topic=tp.topic, partition=tp.partition, leo=log.leo)
        return log

    def delete_log(self, tp: TopicPartition) -> bool:
        """Close the log of `tp` and delete its dir; False when there is neither.

        Also deletes a dir of `tp` that is on disk but not loaded (one `get_or_create_log`
        refused to adopt). Never raises for a file system failure: the delete is remembered,
        retried by `retry_deletes` and before a log of `tp` is created again.
        """
        log = self._logs.pop(tp, None)
        self._topic_ids.pop(tp, None)
        self._loaded_high_watermarks.pop(tp, None)
        if log is not None:
            directory = log.directory
            try:
                log.close()
            except OSError as err:
                # The descriptors are released anyway; the files go with the dir.
                _log.warning(
                    "log_close_failed", topic=tp.topic, partition=tp.partition, error=str(err)
                )
        else:
            directory = self.data_dir.partition_path(tp)
            already = any(p.path == directory for p in self._pending_deletes)
            if already or not directory.is_dir():
                return already
        self._deleted_since_checkpoint.add(tp)
        pending = _PendingDelete(tp, directory, renamed=False)
        if self._delete_dir(pending) is not None:
            self._pending_deletes.append(pending)
        return True

    def retry_deletes(self) -> list[TopicPartition]:
        """Try the deletes that failed again; returns the partitions with no dir left to delete."""
        if not self._pending_deletes:
            return []
        done: list[TopicPartition] = []
        still: list[_PendingDelete] = []
        for pending in self._pending_deletes:
            if self._delete_dir(pending) is None:
                done.append(pending.tp)
            else:
                still.append(pending)
        self._pending_deletes = still
        waiting = {p.tp for p in still}
        return list(dict.fromkeys(tp for tp in done if tp not in waiting))

    def _clear_the_way(self, tp: TopicPartition) -> None:
        """Finish a failed delete of `tp`'s live dir before a new log takes its name.

        Raises KafkaStorageError when it still fails: serving a new log in the old dir would
        serve the deleted records.
        """
        for pending in [p for p in self._pending_deletes if p.tp == tp and not p.renamed]:
            err = self._delete_dir(pending)
            if err is not None:
                raise KafkaStorageError(
                    f"cannot create the log of {tp}: the dir {pending.path} of its deleted "
                    f"predecessor could not be deleted yet ({err}); retrying"
                )
            self._pending_deletes.remove(pending)

    def _delete_dir(self, pending: _PendingDelete) -> OSError | None:
        """One attempt to rename (once) and remove a partition dir; the error, or None."""
        tp = pending.tp
        try:
            if not pending.renamed:
                # Rename first so a crash mid-delete never leaves a half-deleted log that loads.
                doomed = self.data_dir.path / log_delete_dir_name(tp)
                try:
                    os.replace(pending.path, doomed)
                except FileNotFoundError:
                    return None  # gone already
                pending.path, pending.renamed = doomed, True
                fsync_dir(self.data_dir.path)
            try:
                shutil.rmtree(pending.path)
            except FileNotFoundError:
                pass
        except OSError as err:
            _log.error(
                "log_delete_failed",
                topic=tp.topic,
                partition=tp.partition,
                path=str(pending.path),
                renamed=pending.renamed,
                error=str(err),
            )
            return err
        _log.info("log_deleted", topic=tp.topic, partition=tp.partition)
        return None

    def update_topic_config(self, topic: str, config: LogConfig) -> None:
        for tp, log in self._logs.items():
            if tp.topic == topic:
                log.update_config(config)

    # -- periodic work ------------------------------------------------------------------------

    def checkpoint_high_watermarks(self, high_watermarks: Mapping[TopicPartition, int]) -> None:
        """Write `replication-offset-checkpoint` from the caller's HWs (the replication core
        holds them), for the partitions with a log here. A loaded log the caller does not host
        yet (the metadata has not reached it since the start) keeps the HW it was loaded with,
        as Kafka keeps a partition's HW until its replica is made; a log with neither is left
        out, which reads back as "learn it from replication"."""
        logs = self._logs
        written = {tp: hw for tp, hw in high_watermarks.items() if tp in logs}
        for tp in self._loaded_high_watermarks.keys() - written.keys():
            if tp in logs:
                written[tp] = self.checkpointed_high_watermark(tp)
        if written == self._hw_written:
            return  # nothing moved since the last write (an idle broker writes nothing)
        self._hw_file.write(written)
        self._hw_written = written

    def _drop_deleted_high_watermarks(self) -> None:
        """Rewrite the HW checkpoint without the partitions deleted since it was written, so a
        new log of the same partition never starts from the old one's HW (the others keep the
        HW last written, which is at most theirs now)."""
        deleted = self._deleted_since_checkpoint
        self._hw_written = None
        kept = self._read_checkpoint(self._hw_file)
        if any(tp in deleted for tp in kept):
            self._hw_file.write({tp: hw for tp, hw in kept.items() if tp not in deleted})

    def checkpoint_recovery_points(self) -> None:
        self._recovery_file.write({tp: log.recovery_point for tp, log in self._logs.items()})

    def checkpoint_log_start_offsets(self) -> None:
        self._log_start_file.write({tp: log.log_start_offset for tp, log in self._logs.items()})

    def checkpoint_all(self) -> None:
        """Write the recovery point and log start checkpoints, and drop the entries of deleted
        partitions from the HW checkpoint (whose values are the caller's to write)."""
        self._drop_deleted_high_watermarks()
        self.checkpoint_recovery_points()
        self.checkpoint_log_start_offsets()
        self._deleted_since_checkpoint.clear()

    def delete_retention(
        self, now_ms: int, high_watermarks: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, list[DeletedSegment]]:
        """Run retention on every log with a HW in `high_watermarks` (the replication core's);
        returns the segments deleted, per partition.

        A log whose deletion fails part of the way (KafkaStorageError) does not stop the others;
        the log starts are checkpointed, then the first failure is raised.
        """
        deleted: dict[TopicPartition, list[DeletedSegment]] = {}
        failure: KafkaStorageError | None = None
        for tp, log in self._logs.items():
            high_watermark = high_watermarks.get(tp)
            if high_watermark is None:
                continue
            try:
                gone = log.delete_retention(now_ms, high_watermark)
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
        """Flush every log, write the checkpoints (`checkpoint_all`) and close the files.

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
