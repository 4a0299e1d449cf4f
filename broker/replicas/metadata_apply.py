"""Metadata batches from the controller: the image, new logs on a worker thread, strays.

I/O shell (event-loop thread; log creation on a worker thread). The decisions (which records
need a log, which replicas go, what each record changes) are the engine's `act_on_metadata` /
`act_on_partition`; this module applies the batch to the image, makes the logs the engine asks
for, and hands them to it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from minibroker.broker.replication.outputs import PartitionApplyFailed
from minibroker.broker.storage.errors import InconsistentTopicIdError
from minibroker.broker.storage.log import PartitionLog
from minibroker.broker.storage.log_manager import NewLog
from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.common.log import get_logger
from minibroker.client.types import TopicPartition
from minibroker.metadata.delta import EVERYTHING, delta_of
from minibroker.metadata.image import TopicImage
from minibroker.metadata.records import PartitionRecord
from minibroker.metadata.wire import apply_batch
from minibroker.proto import minibroker_pb2 as pb

if TYPE_CHECKING:
    from minibroker.broker.replicas.manager import ReplicaManager

log = get_logger(__name__)

_SCRAM_RECORDS = ("user_scram_credential", "remove_user_scram_credential")


class MetadataApplier:
    def __init__(self, rm: ReplicaManager) -> None:
        self._rm = rm
        self._engine = rm.engine
        self.applied_offset = 0  # the image's next offset once a batch is acted on in full
        self._strays_removed = False
        # Act on every partition on the next batch (the first one, and after a partition's
        # metadata could not be acted on); otherwise only on what a batch touched.
        self._act_on_everything = True

    def load_existing_logs(self) -> None:
        """Host every partition found on disk; roles come later, from metadata."""
        for tp, partition_log in self._rm.log_manager.logs.items():
            self._host(tp, self._rm.log_manager.topic_id(tp) or "", partition_log, None)

    def _host(
        self,
        tp: TopicPartition,
        topic_id: str,
        partition_log: PartitionLog,
        configs: dict[str, str] | None,
    ) -> None:
        self._engine.host(
            tp,
            topic_id,
            partition_log,
            configs,
            high_watermark=self._rm.log_manager.checkpointed_high_watermark(tp),
            max_message_bytes=partition_log.config.max_message_bytes,
        )

    async def apply_batch(self, batch: pb.MetadataBatch) -> None:
        """Apply a batch from the controller's metadata log, then act on what changed for us.

        The logs the batch adds to this broker are created on a worker thread, all together
        (`_create_logs`), while the event loop goes on serving; the other partitions' changes
        are acted on first, at once. `applied_offset` moves past the batch when everything in
        it has been acted on. Once the dir is offline the image follows (metadata answers stay
        current), the replicas do not.
        """
        rm = self._rm
        applied_from = rm.image.next_offset
        decoded = apply_batch(rm.image, batch)
        if decoded.is_snapshot or self._act_on_everything:
            delta = EVERYTHING
            self._act_on_everything = False
        else:
            delta = delta_of(decoded.entries, applied_from)
        if any(r.WhichOneof("record") in _SCRAM_RECORDS for r in batch.records):
            # Who can log in here changed (SASL PLAIN checks these): names only, never keys.
            log.info(
                "scram_credentials_changed",
                users=sorted(rm.image.scram_credentials),
                metadata_offset=rm.image.next_offset,
            )
        new, outputs = self._engine.act_on_metadata(wall_clock_ms(), delta)
        if any(isinstance(o, PartitionApplyFailed) for o in outputs):
            self._act_on_everything = True  # one partition failed: the next batch retries all
        rm.run(outputs)
        if new and self._engine.offline is None:
            await self._create_logs(new)
            now = wall_clock_ms()
            for topic, record in new:
                if self._engine.offline is not None:
                    break
                self._act_on_new(topic, record, now)
        if (
            not self._strays_removed
            and self._engine.offline is None
            and rm.image.next_offset >= batch.high_offset
        ):
            self._strays_removed = True
            rm.run(self._engine.remove_strays())
        if delta.everything or delta.brokers:
            self._resync_fetchers()
        elif delta.touches_partitions:
            # Only the partitions the batch named: a failover's batches touch thousands of the
            # partitions followed here, not all of them.
            self._resync_fetchers(self._engine.touched_partitions(delta))
        self.applied_offset = rm.image.next_offset

    def _act_on_new(self, topic: TopicImage, record: PartitionRecord, now: int) -> None:
        """Act on a record whose log `_create_logs` made; a log it could not make is tried
        again here, on the loop, and its failure reported as ever."""
        rm = self._rm
        if self._engine.needs_log(topic, record):
            tp = TopicPartition(topic.name, record.partition)
            try:
                self._host(tp, topic.topic_id, self._open_log(tp, topic), dict(topic.configs))
            except Exception as err:
                # One partition's failure must not stop this broker from following metadata
                # for every other partition; a disk failure takes the whole dir offline.
                self._act_on_everything = True
                if not rm.maybe_take_log_dir_offline(err, f"applying metadata to {tp}"):
                    log.exception(
                        "partition_metadata_apply_failed",
                        topic=topic.name,
                        partition=record.partition,
                    )
                return
        rm.run(self._engine.act_on_partition(topic, record, now))

    async def _create_logs(self, new: list[tuple[TopicImage, PartitionRecord]]) -> None:
        """Create the logs of partitions new to this broker, on a worker thread.

        Creating a log takes a dir and several files, made durable before it is used: a few ms
        each, far more on a busy disk, and up to `max.broker.partitions` of them may come in
        one batch. On the event loop that stalled every request of the broker for seconds.
        Here the loop only decides (`LogManager.plan_new_logs`) and takes the logs over
        (`add_new_logs`); `make_new_logs` runs on a thread and makes all of them durable in
        one pass. A log it could not make is left to `_act_on_new`, which tries again on the
        loop (a disk failure takes the dir offline here already). A log this broker is to lead
        starts with its leader epoch, so becoming its leader writes nothing more.
        """
        rm = self._rm
        wanted = []
        for topic, record in new:
            tp = TopicPartition(topic.name, record.partition)
            leader_epoch = record.leader_epoch if record.leader == rm.broker_id else -1
            wanted.append(
                NewLog(tp, topic.topic_id, rm.log_config(topic.configs, topic.name), leader_epoch)
            )
        try:
            planned = rm.log_manager.plan_new_logs(wanted)
        except OSError as err:
            if not rm.maybe_take_log_dir_offline(err, "checkpoints before creating logs"):
                raise
            return
        if not planned:
            return
        work = asyncio.ensure_future(
            asyncio.to_thread(rm.log_manager.make_new_logs, planned, wall_clock_ms())
        )
        try:
            made = await asyncio.shield(work)
        except asyncio.CancelledError:
            # Stopping: the thread finishes what it began, and the logs it made are taken
            # over, so that closing the log manager flushes and closes them.
            await asyncio.wait({work})
            if not work.cancelled() and work.exception() is None:
                rm.log_manager.add_new_logs(planned, work.result())
            raise
        rm.log_manager.add_new_logs(planned, made)
        configs = {TopicPartition(t.name, r.partition): t for t, r in new}
        for entry, result in zip(planned, made, strict=True):
            if isinstance(result, OSError):
                where = f"creating the log of {entry.tp}"
                if not rm.maybe_take_log_dir_offline(result, where):
                    log.warning(
                        "log_create_failed",
                        topic=entry.tp.topic,
                        partition=entry.tp.partition,
                        error=str(result),
                    )
                continue
            topic = configs[entry.tp]
            self._host(entry.tp, topic.topic_id, result, dict(topic.configs))

    def _open_log(self, tp: TopicPartition, topic: TopicImage) -> PartitionLog:
        manager = self._rm.log_manager
        config = self._rm.log_config(topic.configs, topic.name)
        try:
            return manager.get_or_create_log(tp, topic.topic_id, config)
        except InconsistentTopicIdError:
            # The dir is from an earlier topic of the same name, deleted while we were away.
            self._rm.delete_log(tp)
            return manager.get_or_create_log(tp, topic.topic_id, config)

    def _resync_fetchers(self, among: list[TopicPartition] | None = None) -> None:
        """Point fetchers at leaders whose address arrived or changed since the partition's
        record did (a leader that re-registered on another port, or was not known yet); only
        `among` when given."""
        fetchers = self._rm.fetchers
        for tp, leader_id in self._engine.followed_leaders(among):
            if fetchers.needs_follow(tp, leader_id):
                fetchers.follow(tp, leader_id)
