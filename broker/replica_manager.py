"""The replica manager: the effect interpreter where storage, the replication cores and RPCs meet.

I/O shell, event-loop thread only (the logs a metadata batch adds are made on a worker thread,
see `_create_logs`). It is the only module that joins `broker/storage` (the partition logs),
`broker/replication` (the pure `PartitionReplica` cores) and the network (the controller link,
fetchers, purgatories). Its loop is always the same (docs/design.md §2): turn a request or
a fact into a core call, then apply the returned effects in order — storage first, then RPCs,
then waking waiters.

Per partition, appends and truncations run synchronously on the event loop between two awaits,
so nothing else can interleave between a core's `plan_append` and `on_leader_appended` (the core's
contract). Writes go to the page cache; fsync follows the topic's flush policy.

A failed disk operation (append, roll, flush, truncation, checkpoint, retention, a read) takes the
data dir offline, as Kafka's LogDirFailureChannel does: the broker's one log dir holds every
replica, so from then on it serves nothing (KAFKA_STORAGE_ERROR to produce, fetch and offset
lookups, pending acks=all produces answered with it too), stops fetching and stops all background
writes, and sets `log_dir_failed`; the composition root reports the dir to the controller, which
moves the leaderships, and exits (Kafka halts when its last log dir fails).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from minibroker.broker import wire
from minibroker.broker.config import BrokerConfig
from minibroker.broker.fetcher import FetcherManager
from minibroker.broker.metrics import BrokerMetrics
from minibroker.broker.purgatory import KeySignals, PurgatoryFullError
from minibroker.broker.replication.events import (
    AdvanceLogStartOffset,
    AlterPartitionResult,
    AppendAsFollower,
    AssignEpoch,
    Backoff,
    CompleteProduce,
    DuplicateAppend,
    FetchPosition,
    FetchResponse,
    FollowerFetch,
    HighWatermarkChanged,
    IsrChangeKind,
    IsrUpdated,
    LeaderRecoveryState,
    PartitionState,
    ProduceRejected,
    ProposeIsr,
    ReplicaConfig,
    Role,
    StartFetching,
    StopFetching,
    TruncateFullyAndStartAt,
    TruncateTo,
)
from minibroker.broker.replication.partition import BrokerEligibilityView, PartitionReplica
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.errors import (
    InconsistentTopicIdError,
    disk_error_advice,
    is_log_dir_failure,
)
from minibroker.broker.storage.log import PartitionLog
from minibroker.broker.storage.log_manager import LogManager, NewLog
from minibroker.client import batch as batchlib
from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.common.invariant import invariant
from minibroker.client.common.log import get_logger
from minibroker.client.errors import ErrorCode, MiniBrokerError
from minibroker.client.metadata.image import MetadataImage, TopicImage
from minibroker.client.metadata.records import PartitionRecord
from minibroker.client.metadata.wire import apply_batch
from minibroker.client.records import RecordValidation, validate_producer_records
from minibroker.client.topic_config import resolve_topic_config
from minibroker.client.topic_name import invalid_topic_name
from minibroker.client.types import NO_LEADER, TopicPartition
from minibroker.proto import minibroker_pb2 as pb

log = get_logger(__name__)

PRODUCER_ID_PREFETCH_LEFT = 100  # prefetch the next block when this few ids are left (90%)


class FollowerAppendFailedError(MiniBrokerError):
    """The leader's batches could not be appended here (bad CRC, gap, overlap, a storage
    error), or a truncation it asked for stopped part way."""


FULL_PURGATORY_RECHECK_S = 0.05


@dataclass(frozen=True, slots=True)
class LogDirFailure:
    """The data dir failed (Kafka's offline log dir): where, during what, and how."""

    log_dir: str
    operation: str  # what the broker was doing: "produce to events-0", "checkpoint_..."
    error: str  # the storage error's text
    advice: str  # what the operator should do (from the errno)

    def serving_error(self) -> str:
        """The message of every KAFKA_STORAGE_ERROR answered from now on."""
        return f"the broker's log dir {self.log_dir} is offline ({self.operation}: {self.error})"


@dataclass(slots=True)
class Hosted:
    """One partition replica hosted here: its log, its core, and its in-flight proposal."""

    tp: TopicPartition
    topic_id: str
    log: PartitionLog
    core: PartitionReplica
    pending_fetch: FetchPosition | None = None
    # The request handed to the fetcher for `pending_fetch`: an answer is applied only when the
    # fetcher hands back this very object, so a late answer to an older request (a stopping
    # fetcher's, or one from before the position was re-planned) is dropped.
    pending_request: wire.FetchPartitionRequest | None = None
    # Keyed by the token handed to the core, which gives it back opaque (CompleteProduce.token).
    produce_futures: dict[object, asyncio.Future[CompleteProduce]] = field(default_factory=dict)
    # The topic configs the core and log were last configured with (None: broker defaults only,
    # for a log opened from disk before metadata arrived).
    topic_configs: dict[str, str] | None = None
    # What produced records are checked against (timestamp type and bounds), from those configs.
    record_validation: RecordValidation = field(default_factory=RecordValidation)


class ReplicaManager:
    def __init__(
        self,
        config: BrokerConfig,
        log_manager: LogManager,
        metrics: BrokerMetrics,
        controller_address: tuple[str, int],
    ) -> None:
        self.config = config
        self.broker_id = config.node_id
        self.log_manager = log_manager
        self.metrics = metrics
        self.image = MetadataImage()
        self.brokers = BrokerEligibilityView()
        self.partitions: dict[TopicPartition, Hosted] = {}
        # Long polls park on one of two signals, as Kafka's delayed fetches complete: a
        # follower's on new data (it reads to the LEO), a consumer's on a HW move (it reads to
        # the HW). Waking the other kind would only make it look and park again.
        self.fetch_signals = KeySignals(config["queued.max.requests"])
        self.hw_signals = KeySignals(config["queued.max.requests"])
        self._controller_address = controller_address
        self._link: Any = None  # ControllerLink, attached after construction
        self._metadata_ready = asyncio.Event()
        self._applied_offset = 0  # the image's next offset once a batch is acted on in full
        self._strays_removed = False
        self._produce_seq = 0
        self._producer_ids: tuple[int, int] = (0, 0)  # next id, end (exclusive)
        self._next_producer_ids: tuple[int, int] | None = None  # (start, length), prefetched
        self._prefetching = False
        self._producer_id_lock = asyncio.Lock()
        self.fetchers = FetcherManager(
            self,
            self._broker_address,
            max_wait_ms=config["replica.fetch.wait.max.ms"],
            min_bytes=config["replica.fetch.min.bytes"],
            max_bytes=config["replica.fetch.max.bytes"],
            response_max_bytes=config["replica.fetch.response.max.bytes"],
            backoff_ms=config["replica.fetch.backoff.ms"],
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        # Set once, never cleared: a failed dir comes back only with a new broker process.
        self.log_dir_failure: LogDirFailure | None = None
        self.log_dir_failed = asyncio.Event()

    def attach(self, link: Any) -> None:
        self._link = link

    # -- helpers --------------------------------------------------------------------------------

    def broker_epoch(self) -> int:
        return int(self._link.broker_epoch) if self._link is not None else -1

    def metadata_offset(self) -> int:
        return self.image.next_offset

    def _broker_address(self, broker_id: int) -> str | None:
        broker = self.image.brokers.get(broker_id)
        if broker is None:
            return None
        return f"{broker.host}:{broker.port}"

    def _replica_config(self, topic_configs: dict[str, Any]) -> ReplicaConfig:
        return ReplicaConfig(
            min_insync_replicas=int(topic_configs["min.insync.replicas"]),
            replica_lag_time_max_ms=self.config["replica.lag.time.max.ms"],
            replica_fetch_backoff_ms=self.config["replica.fetch.backoff.ms"],
            max_pending_produces=self.config["queued.max.requests"],
        )

    def _topic_configs(self, raw: dict[str, str]) -> dict[str, Any]:
        return resolve_topic_config(raw, self.config.topic_defaults)

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- log dir failure ------------------------------------------------------------------------

    def maybe_take_log_dir_offline(self, err: BaseException, operation: str) -> bool:
        """Take the data dir offline when `err` is a failure of it; True when it was one.

        Kafka's rule: any I/O error of a log dir takes the dir offline, whatever the operation
        (an append, a roll, a flush, a truncation, a checkpoint, a read). Retrying on a failing
        disk would keep this broker leading while its followers could serve.
        """
        if not is_log_dir_failure(err):
            return False
        if self.log_dir_failure is None:
            self._take_log_dir_offline(
                LogDirFailure(
                    str(self.log_manager.data_dir.path),
                    operation,
                    str(err),
                    disk_error_advice(err),
                )
            )
        return True

    def _take_log_dir_offline(self, failure: LogDirFailure) -> None:
        """Stop serving every replica: no fetching, no more writes; answer what waits."""
        self.log_dir_failure = failure
        log.error(
            "log_dir_offline",
            log_dir=failure.log_dir,
            operation=failure.operation,
            error=failure.error,
            partitions=len(self.partitions),
            leaderships=self.led_partitions(),
        )
        message = failure.serving_error()
        for tp, hosted in self.partitions.items():
            self.fetchers.unfollow(tp)
            hosted.pending_fetch = None
            hosted.pending_request = None
            for future in hosted.produce_futures.values():
                if not future.done():
                    future.set_result(
                        CompleteProduce(None, ErrorCode.KAFKA_STORAGE_ERROR, -1, -1, message)
                    )
            hosted.produce_futures.clear()
            self._notify_fetches(tp)  # parked long polls answer now, with the storage error
        self.log_dir_failed.set()

    def _offline_error(self) -> tuple[ErrorCode, str] | None:
        """(KAFKA_STORAGE_ERROR, why) once the data dir is offline, else None."""
        return None if self.log_dir_failure is None else self._storage_error()

    def _storage_error(self) -> tuple[ErrorCode, str]:
        failure = self.log_dir_failure
        why = failure.serving_error() if failure is not None else "the log dir failed"
        return ErrorCode.KAFKA_STORAGE_ERROR, why

    # -- startup ------------------------------------------------------------------------------

    def load_existing_logs(self) -> None:
        """Open every partition found on disk; roles come later, from metadata."""
        for tp, partition_log in self.log_manager.logs.items():
            hosted = self._host(tp, self.log_manager.topic_id(tp) or "", partition_log, {})
            hosted.topic_configs = None  # the topic's configs come with the metadata

    def _host(
        self,
        tp: TopicPartition,
        topic_id: str,
        partition_log: PartitionLog,
        raw_configs: dict[str, str],
    ) -> Hosted:
        configs = self._topic_configs(raw_configs)
        core = PartitionReplica(
            self.broker_id,
            partition_log.epoch_cache,
            self.brokers,
            self._replica_config(configs),
            leo=partition_log.leo,
            log_start_offset=partition_log.log_start_offset,
            high_watermark=partition_log.high_watermark,
            producer_batches=partition_log.producer_batch_headers(),
            name=str(tp),
        )
        hosted = Hosted(tp, topic_id, partition_log, core)
        hosted.topic_configs = dict(raw_configs)
        hosted.record_validation = RecordValidation.from_topic_config(configs)
        self.partitions[tp] = hosted
        return hosted

    # -- metadata -----------------------------------------------------------------------------

    async def apply_metadata_batch(self, batch: pb.MetadataBatch) -> None:
        """Apply a batch from the controller's metadata log, then act on what changed for us.

        The logs the batch adds to this broker are created on a worker thread, all together
        (`_create_logs`), while the event loop goes on serving; the other partitions' changes
        are acted on first, at once. `applied_metadata_offset` moves past the batch when
        everything in it has been acted on.
        """
        before = {topic_id: topic.name for topic_id, topic in self.image.topics_by_id.items()}
        apply_batch(self.image, batch)
        self._sync_brokers()
        if self.log_dir_failure is not None:
            # Nothing may touch the failed dir: the image follows (metadata answers stay
            # current), the replicas do not.
            self._applied_offset = self.image.next_offset
            self._metadata_ready.set()
            return
        now = wall_clock_ms()
        # Topics that disappeared: stop and delete their replicas here.
        for topic_id, name in before.items():
            if topic_id not in self.image.topics_by_id:
                for tp in [tp for tp, h in self.partitions.items() if h.topic_id == topic_id]:
                    self._remove_partition(tp, delete=True, reason=f"topic {name} deleted")
        new: list[tuple[TopicImage, PartitionRecord]] = []
        for topic, record in self.image.partitions():
            if self.log_dir_failure is not None:
                break
            if self._needs_new_log(topic, record):
                new.append((topic, record))
            else:
                self._apply_guarded(topic, record, now)
        if new and self.log_dir_failure is None:
            await self._create_logs(new)
            now = wall_clock_ms()
            for topic, record in new:
                if self.log_dir_failure is not None:
                    break
                self._apply_guarded(topic, record, now)
        if (
            not self._strays_removed
            and self.log_dir_failure is None
            and self.image.next_offset >= batch.high_offset
        ):
            self._strays_removed = True
            self._remove_strays()
        self._resync_fetchers()
        self._applied_offset = self.image.next_offset
        self._metadata_ready.set()

    def applied_metadata_offset(self) -> int:
        """The next metadata offset not acted on in full yet (what heartbeats report; read on
        the heartbeat thread)."""
        return self._applied_offset

    def _apply_guarded(self, topic: TopicImage, record: PartitionRecord, now: int) -> None:
        try:
            self._apply_partition_record(topic, record, now)
        except Exception as err:
            # One partition's state failure must not stop this broker from following
            # metadata for every other partition: log it, keep going. A disk failure
            # takes the whole dir offline (and is logged as that).
            where = f"applying metadata to {topic.name}-{record.partition}"
            if not self.maybe_take_log_dir_offline(err, where):
                log.exception(
                    "partition_metadata_apply_failed",
                    topic=topic.name,
                    partition=record.partition,
                )

    def _needs_new_log(self, topic: TopicImage, record: PartitionRecord) -> bool:
        """This broker is a replica of `record` and hosts no log of this topic id for it."""
        if self.broker_id not in record.replicas:
            return False
        hosted = self.partitions.get(TopicPartition(topic.name, record.partition))
        return hosted is None or hosted.topic_id != topic.topic_id

    async def _create_logs(self, new: list[tuple[TopicImage, PartitionRecord]]) -> None:
        """Create the logs of partitions new to this broker, on a worker thread.

        Creating a log takes a dir and several files, made durable before it is used: a few ms
        each, far more on a busy disk, and up to `max.broker.partitions` of them may come in
        one batch. On the event loop that stalled every request of the broker for seconds.
        Here the loop only decides (`LogManager.plan_new_logs`) and takes the logs over
        (`add_new_logs`); `make_new_logs` runs on a thread and makes all of them durable in
        one pass. A log it could not make is left to `_apply_partition_record`, which tries
        again on the loop and reports the failure as ever (a disk failure takes the dir
        offline here already). A log this broker is to lead starts with its leader epoch, so
        becoming its leader writes nothing more.
        """
        wanted = []
        for topic, record in new:
            tp = TopicPartition(topic.name, record.partition)
            hosted = self.partitions.get(tp)
            if hosted is not None:
                # Another topic id (see `_apply_partition_record`): the old log goes first.
                self._remove_partition(tp, delete=True, reason="topic re-created")
            leader_epoch = record.leader_epoch if record.leader == self.broker_id else -1
            wanted.append(NewLog(tp, topic.topic_id, self._log_config(topic.configs), leader_epoch))
        try:
            planned = self.log_manager.plan_new_logs(wanted)
        except OSError as err:
            if not self.maybe_take_log_dir_offline(err, "checkpoints before creating logs"):
                raise
            return
        if not planned:
            return
        work = asyncio.ensure_future(
            asyncio.to_thread(self.log_manager.make_new_logs, planned, wall_clock_ms())
        )
        try:
            made = await asyncio.shield(work)
        except asyncio.CancelledError:
            # Stopping: the thread finishes what it began, and the logs it made are taken
            # over, so that closing the log manager flushes and closes them.
            await asyncio.wait({work})
            if not work.cancelled() and work.exception() is None:
                self.log_manager.add_new_logs(planned, work.result())
            raise
        self.log_manager.add_new_logs(planned, made)
        for entry, result in zip(planned, made, strict=True):
            if isinstance(result, OSError):
                where = f"creating the log of {entry.tp}"
                if not self.maybe_take_log_dir_offline(result, where):
                    log.warning(
                        "log_create_failed",
                        topic=entry.tp.topic,
                        partition=entry.tp.partition,
                        error=str(result),
                    )

    def _remove_strays(self) -> None:
        """Delete the logs loaded from disk whose topic id the caught-up metadata does not know
        (deleted while this broker was away; Kafka's stray replicas): never served again."""
        for tp, hosted in list(self.partitions.items()):
            if hosted.topic_id not in self.image.topics_by_id:
                self._remove_partition(
                    tp,
                    delete=True,
                    reason=f"stray: topic id {hosted.topic_id!r} is not in the metadata",
                )

    def _apply_partition_record(self, topic: TopicImage, record: PartitionRecord, now: int) -> None:
        """Act on the controller's record of one partition (create, reconfigure, change role)."""
        tp = TopicPartition(topic.name, record.partition)
        hosted = self.partitions.get(tp)
        if self.broker_id not in record.replicas:
            if hosted is not None and hosted.topic_id == topic.topic_id:
                self._remove_partition(tp, delete=True, reason="no longer a replica")
            return
        if hosted is not None and hosted.topic_id != topic.topic_id:
            # A topic of the same name was deleted and re-created: the old log goes. So does a
            # log without a topic id (Kafka: stray); its `partition.metadata` is written before
            # any data, so it holds none of this topic's records. (`_create_logs` has done this
            # already for a metadata batch.)
            self._remove_partition(tp, delete=True, reason="topic re-created")
            hosted = None
        if hosted is None:
            partition_log = self._open_log(tp, topic.topic_id, topic.configs)
            hosted = self._host(tp, topic.topic_id, partition_log, topic.configs)
        else:
            if hosted.topic_configs != topic.configs:
                # A log opened from disk before metadata arrived ran with the broker's
                # defaults; the topic's own configs (min.insync.replicas, ...) apply now.
                self._reconfigure(hosted, topic.configs, now)
        state = PartitionState(
            replicas=tuple(record.replicas),
            isr=frozenset(record.isr),
            leader=record.leader,
            leader_epoch=record.leader_epoch,
            partition_epoch=record.partition_epoch,
            leader_recovery_state=LeaderRecoveryState(record.leader_recovery_state),
        )
        old_role = hosted.core.role
        old_epoch = hosted.core.leader_epoch
        self._apply(hosted, hosted.core.apply_partition_state(state, now)[1])
        if hosted.core.role != old_role or hosted.core.leader_epoch != old_epoch:
            self._notify_fetches(tp)  # parked fetches answer now (NOT_LEADER, fenced epoch)
            log.info(
                "became_leader" if hosted.core.role is Role.LEADER else "became_follower",
                topic=tp.topic,
                partition=tp.partition,
                leader=record.leader,
                leader_epoch=record.leader_epoch,
                partition_epoch=record.partition_epoch,
                isr=sorted(record.isr),
                leo=hosted.core.leo,
                high_watermark=hosted.core.high_watermark,
            )

    def _reconfigure(self, hosted: Hosted, raw_configs: dict[str, str], now: int) -> None:
        configs = self._topic_configs(raw_configs)
        hosted.log.update_config(self._log_config(raw_configs))
        self._apply(hosted, hosted.core.update_config(self._replica_config(configs), now)[1])
        hosted.topic_configs = dict(raw_configs)
        hosted.record_validation = RecordValidation.from_topic_config(configs)

    def _resync_fetchers(self) -> None:
        """Point fetchers at leaders whose address arrived or changed since the partition's
        record did (a leader that re-registered on another port, or was not known yet)."""
        for tp, hosted in self.partitions.items():
            follower = hosted.core.follower_state
            if follower is None or follower.failed:
                continue
            if self.fetchers.needs_follow(tp, follower.leader_id):
                self.fetchers.follow(tp, follower.leader_id)

    def _sync_brokers(self) -> None:
        for broker_id, reg in self.image.brokers.items():
            self.brokers.update(
                broker_id,
                reg.broker_epoch,
                fenced=reg.fenced,
                in_controlled_shutdown=reg.in_controlled_shutdown,
            )

    def _open_log(self, tp: TopicPartition, topic_id: str, raw: dict[str, str]) -> PartitionLog:
        config = self._log_config(raw)
        try:
            return self.log_manager.get_or_create_log(tp, topic_id, config)
        except InconsistentTopicIdError:
            # The dir is from an earlier topic of the same name, deleted while we were away.
            self.log_manager.delete_log(tp)
            return self.log_manager.get_or_create_log(tp, topic_id, config)

    def _log_config(self, raw: dict[str, str]) -> LogConfig:
        return LogConfig.from_configs(raw, self.config.topic_defaults)

    def _remove_partition(self, tp: TopicPartition, *, delete: bool, reason: str) -> None:
        hosted = self.partitions.pop(tp, None)
        if hosted is None:
            return
        self.fetchers.unfollow(tp)
        for future in hosted.produce_futures.values():
            if not future.done():
                future.set_result(
                    CompleteProduce(None, ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, -1, reason)
                )
        self._notify_fetches(tp)
        if delete:
            self.log_manager.delete_log(tp)
        log.info("replica_removed", topic=tp.topic, partition=tp.partition, reason=reason)

    def _notify_fetches(self, tp: TopicPartition) -> None:
        self.fetch_signals.notify(tp)
        self.hw_signals.notify(tp)

    # -- effects ------------------------------------------------------------------------------

    def _apply(self, hosted: Hosted, effects: Iterable[Any]) -> None:
        """Carry out a core's effects in order (storage, then RPCs, then waiters)."""
        queue = list(effects)
        while queue:
            effect = queue.pop(0)
            core = hosted.core
            tp = hosted.tp
            if isinstance(effect, AssignEpoch):
                hosted.log.maybe_assign_epoch_start_offset(effect.leader_epoch, effect.start_offset)
            elif isinstance(effect, HighWatermarkChanged):
                hosted.log.update_high_watermark(effect.high_watermark)
                self.hw_signals.notify(tp)
            elif isinstance(effect, CompleteProduce):
                future = hosted.produce_futures.pop(effect.token, None)
                if future is not None and not future.done():
                    future.set_result(effect)
            elif isinstance(effect, AppendAsFollower):
                try:
                    info = hosted.log.append_as_follower(effect.records)
                except MiniBrokerError as err:
                    # The log is unchanged and the core's LEO did not move; the caller turns
                    # this into a fetch error so the follower backs off before asking again
                    # (or, on a disk failure, stops with the rest of the dir).
                    self.maybe_take_log_dir_offline(err, f"follower append to {tp}")
                    raise FollowerAppendFailedError(str(err)) from err
                self.metrics.replication_bytes_in.inc(len(effect.records))
                queue[:0] = core.on_follower_appended(hosted.log.leo, info.batches)[1]
                self._maybe_flush(hosted, wall_clock_ms())
            elif isinstance(effect, TruncateTo | TruncateFullyAndStartAt):
                old_leo = hosted.log.leo
                fully = isinstance(effect, TruncateFullyAndStartAt)
                try:
                    if fully:
                        hosted.log.truncate_fully_and_start_at(effect.offset)
                    else:
                        hosted.log.truncate_to(effect.offset)
                except MiniBrokerError as err:
                    # The storage stopped part way: the log is a whole-batch prefix of what it
                    # was. The core learns where it really ends, and the fetch fails like a
                    # failed append, so the follower backs off and the leader's divergence
                    # check asks for the rest of the truncation on the next fetch.
                    _, effects = core.on_log_truncated(hosted.log.leo, hosted.log.log_start_offset)
                    self._apply(hosted, effects)
                    self.maybe_take_log_dir_offline(err, f"truncation of {tp}")
                    raise FollowerAppendFailedError(f"truncation failed: {err}") from err
                self.metrics.truncations.inc()
                # `watch` reads these two events from the log (to_offset / start_offset).
                where = {"start_offset" if fully else "to_offset": hosted.log.leo}
                log.info(
                    "truncated_fully" if fully else "truncated",
                    topic=tp.topic,
                    partition=tp.partition,
                    from_offset=old_leo,
                    reason=effect.reason,
                    leader_epoch=core.leader_epoch,
                    **where,
                )
                queue[:0] = core.on_log_truncated(hosted.log.leo, hosted.log.log_start_offset)[1]
            elif isinstance(effect, AdvanceLogStartOffset):
                hosted.log.maybe_increment_log_start_offset(effect.offset)
            elif isinstance(effect, ProposeIsr):
                self._send_proposal(hosted, effect)
            elif isinstance(effect, IsrUpdated):
                if effect.kind is IsrChangeKind.SHRINK:
                    self.metrics.isr_shrinks.inc()
                else:
                    self.metrics.isr_expands.inc()
                log.info(
                    "isr_shrink" if effect.kind is IsrChangeKind.SHRINK else "isr_expand",
                    topic=tp.topic,
                    partition=tp.partition,
                    old_isr=sorted(effect.old_isr),
                    new_isr=sorted(effect.new_isr),
                    partition_epoch=effect.partition_epoch,
                    leader_epoch=core.leader_epoch,
                    high_watermark=core.high_watermark,
                )
                self._notify_fetches(tp)
            elif isinstance(effect, StartFetching):
                self.fetchers.follow(tp, effect.leader_id)
            elif isinstance(effect, StopFetching):
                self.fetchers.unfollow(tp)
            elif isinstance(effect, Backoff):
                log.debug(
                    "fetch_backoff",
                    topic=tp.topic,
                    partition=tp.partition,
                    delay_ms=effect.delay_ms,
                    reason=effect.reason,
                )
            else:  # pragma: no cover - a new effect type without a handler is a bug
                raise TypeError(f"unhandled effect {effect!r}")

    def _send_proposal(self, hosted: Hosted, proposal: ProposeIsr) -> None:
        async def send() -> None:
            if proposal.delay_ms > 0:
                await asyncio.sleep(proposal.delay_ms / 1000.0)
            request = pb.AlterPartitionRequest(
                topics=[
                    pb.AlterPartitionTopic(
                        topic_id=hosted.topic_id,
                        partitions=[
                            pb.AlterPartitionPartition(
                                partition=hosted.tp.partition,
                                leader_epoch=proposal.leader_epoch,
                                partition_epoch=proposal.partition_epoch,
                                new_isr_with_epochs=[
                                    pb.BrokerState(broker_id=b, broker_epoch=e)
                                    for b, e in proposal.new_isr_with_epochs
                                ],
                                leader_recovery_state=int(proposal.leader_recovery_state),
                            )
                        ],
                    )
                ]
            )
            try:
                response = await self._link.alter_partition(request)
                result = _alter_partition_result(proposal.proposal_id, response)
            except Exception as err:  # transport failure: the core retries the same proposal
                log.debug(
                    "alter_partition_failed",
                    topic=hosted.tp.topic,
                    partition=hosted.tp.partition,
                    error=repr(err),
                )
                result = AlterPartitionResult(proposal.proposal_id, ErrorCode.REQUEST_TIMED_OUT)
            if result.error != ErrorCode.NONE:
                self.metrics.failed_isr_updates.inc()
                log.info(
                    "alter_partition_rejected",
                    topic=hosted.tp.topic,
                    partition=hosted.tp.partition,
                    error=result.error.name,
                    proposed_isr=sorted(proposal.new_isr),
                )
            if self.partitions.get(hosted.tp) is hosted:
                _, effects = hosted.core.on_alter_partition_result(result, wall_clock_ms())
                self._apply(hosted, effects)

        self._spawn(send(), f"alter-partition-{hosted.tp}")

    # -- produce ------------------------------------------------------------------------------

    async def produce(
        self, acks: int, timeout_ms: int, partitions: list[wire.ProducePartition]
    ) -> list[wire.ProduceResult]:
        self.metrics.produce_requests.inc()
        if acks not in (-1, 0, 1):
            return [
                wire.ProduceResult(
                    p.topic,
                    p.partition,
                    ErrorCode.INVALID_REQUIRED_ACKS,
                    f"acks must be 0, 1 or -1 (all), got {acks}",
                )
                for p in partitions
            ]
        results: list[wire.ProduceResult] = []
        waits: list[tuple[wire.ProduceResult, asyncio.Future[CompleteProduce]]] = []
        deadline = wall_clock_ms() + max(timeout_ms, 0)
        for part in partitions:
            offline = self._offline_error()
            if offline is not None:
                # Also for the partitions after the one whose append took the dir offline.
                results.append(wire.ProduceResult(part.topic, part.partition, *offline))
                continue
            result, future = self._produce_one(acks, deadline, part)
            results.append(result)
            if future is not None:
                waits.append((result, future))
        if waits:
            timeout_s = max(timeout_ms, 0) / 1000.0
            await asyncio.wait([f for _, f in waits], timeout=timeout_s)
            for result, future in waits:
                if future.done():
                    completion = future.result()
                    result.error = completion.error
                    result.message = completion.message
                    if completion.error != ErrorCode.NONE:
                        result.base_offset = -1
                else:
                    result.error = ErrorCode.REQUEST_TIMED_OUT
                    result.message = "the ISR did not acknowledge the write within timeout_ms"
                    result.base_offset = -1
                    # The core expires its own record of this produce at the same deadline.
                    future.cancel()
        for result in results:
            if result.error != ErrorCode.NONE:
                self.metrics.failed_produce_requests.inc()
        return results

    def _produce_one(
        self, acks: int, deadline_ms: int, part: wire.ProducePartition
    ) -> tuple[wire.ProduceResult, asyncio.Future[CompleteProduce] | None]:
        tp = TopicPartition(part.topic, part.partition)
        result = wire.ProduceResult(part.topic, part.partition)
        hosted = self.partitions.get(tp)
        if hosted is None:
            known = self.image.topic(part.topic)
            if known is None or part.partition not in known.partitions:
                result.error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                result.message = f"{tp} does not exist"
            else:
                result.error = ErrorCode.NOT_LEADER_OR_FOLLOWER
                result.message = f"broker {self.broker_id} does not host {tp}"
                record = known.partitions[part.partition]
                result.leader = (record.leader, record.leader_epoch)
            return result, None
        core = hosted.core
        if core.role is not Role.LEADER:
            result.error = ErrorCode.NOT_LEADER_OR_FOLLOWER
            result.message = f"broker {self.broker_id} is not the leader of {tp}"
            result.leader = (core.leader_id, core.leader_epoch)
            return result, None
        now = wall_clock_ms()
        try:
            # Headers for the core's idempotence and acks checks; the log reuses this validation
            # when it appends (one CRC32C pass per batch).
            batches = batchlib.validate_producer_batches(
                part.records, hosted.log.config.max_message_bytes
            )
            # Then the records themselves (Kafka's LogValidator), on this leader path only.
            validate_producer_records(part.records, batches, now, hosted.record_validation)
        except batchlib.CorruptRecordError as err:
            self.metrics.invalid_crc.inc()
            result.error, result.message = ErrorCode.CORRUPT_MESSAGE, str(err)
            return result, None
        except MiniBrokerError as err:
            result.error, result.message = err.code, str(err)
            return result, None
        plan, _ = core.plan_append(acks, [h for _, h in batches])
        if isinstance(plan, DuplicateAppend):
            result.log_start_offset = core.log_start_offset
            result.base_offset = plan.base_offset
            if acks == -1:
                return result, self._park(hosted, plan.base_offset, plan.last_offset, deadline_ms)
            return result, None
        if isinstance(plan, ProduceRejected):
            result.error, result.message = plan.error, plan.message
            result.log_start_offset = core.log_start_offset
            return result, None
        try:
            info = hosted.log.append_as_leader(
                part.records, plan.leader_epoch, now, validated=batches
            )
        except MiniBrokerError as err:
            self.maybe_take_log_dir_offline(err, f"produce to {tp}")
            result.error, result.message = err.code, str(err)
            return result, None
        invariant(
            info.first_offset == plan.base_offset,
            f"{tp}: the log appended at {info.first_offset}, the core planned {plan.base_offset}",
        )
        result.log_append_time_ms = info.log_append_time_ms
        records = sum(h.records_count for _, h in batches)
        self.metrics.messages_in.inc(records)
        self.metrics.bytes_in.inc(info.valid_bytes)
        result.base_offset = plan.base_offset
        result.log_start_offset = hosted.log.log_start_offset
        future: asyncio.Future[CompleteProduce] | None = None
        token: int | None = None
        if acks == -1:
            self._produce_seq += 1
            token = self._produce_seq
            future = asyncio.get_running_loop().create_future()
            hosted.produce_futures[token] = future
        _, effects = core.on_leader_appended(plan, now, token=token, deadline_ms=deadline_ms)
        self._apply(hosted, effects)
        self.fetch_signals.notify(tp)  # wake followers' long polls
        self._maybe_flush(hosted, now)
        return result, future

    def _maybe_flush(self, hosted: Hosted, now: int) -> None:
        """flush.messages / flush.ms after an append the core already counts: a failed fsync
        must not fail that append (the background flush tries again)."""
        try:
            hosted.log.maybe_flush(now)
        except MiniBrokerError as err:
            log.warning(
                "flush_failed", topic=hosted.tp.topic, partition=hosted.tp.partition, error=str(err)
            )
            self.maybe_take_log_dir_offline(err, f"flush of {hosted.tp}")

    def _park(
        self, hosted: Hosted, base_offset: int, last_offset: int, deadline_ms: int
    ) -> asyncio.Future[CompleteProduce]:
        self._produce_seq += 1
        token = self._produce_seq
        future: asyncio.Future[CompleteProduce] = asyncio.get_running_loop().create_future()
        hosted.produce_futures[token] = future
        _, effects = hosted.core.park_produce(token, base_offset, last_offset, deadline_ms)
        self._apply(hosted, effects)
        return future

    # -- fetch ----------------------------------------------------------------------------------

    async def fetch(self, params: wire.FetchParams) -> list[wire.FetchPartitionResult]:
        self.metrics.fetch_requests.inc()
        deadline = time.monotonic() + max(params.max_wait_ms, 0) / 1000.0
        keys = [TopicPartition(p.topic, p.partition) for p in params.partitions]
        while True:
            results = [self._fetch_one(params, p) for p in params.partitions]
            total = sum(len(r.records) for r in results)
            enough = total >= max(params.min_bytes, 1) or any(
                r.error != ErrorCode.NONE
                or r.diverging_epoch is not None
                or r.preferred_read_replica >= 0
                for r in results
            )
            remaining = deadline - time.monotonic()
            if enough or remaining <= 0:
                break
            signals = self.fetch_signals if params.is_follower else self.hw_signals
            try:
                await signals.wait_any(keys, remaining)
            except PurgatoryFullError:
                # No room to park: look again shortly instead of answering at once, which
                # would have the fetcher ask again at once (a busy loop on both ends).
                await asyncio.sleep(min(remaining, FULL_PURGATORY_RECHECK_S))
        out_bytes = sum(len(r.records) for r in results)
        if params.is_follower:
            self.metrics.replication_bytes_out.inc(out_bytes)
        else:
            self.metrics.bytes_out.inc(out_bytes)
        return results

    def _fetch_one(
        self, params: wire.FetchParams, req: wire.FetchPartitionRequest
    ) -> wire.FetchPartitionResult:
        tp = TopicPartition(req.topic, req.partition)
        result = wire.FetchPartitionResult(req.topic, req.partition)
        hosted = self.partitions.get(tp)
        offline = self._offline_error()
        if offline is not None:
            result.error, result.message = offline
            return result
        if hosted is None:
            known = self.image.topic(req.topic)
            if known is None or req.partition not in known.partitions:
                result.error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            else:
                result.error = ErrorCode.NOT_LEADER_OR_FOLLOWER
                record = known.partitions[req.partition]
                result.current_leader = (record.leader, record.leader_epoch)
            return result
        core = hosted.core
        max_bytes = req.max_bytes if req.max_bytes > 0 else self.config["replica.fetch.max.bytes"]
        if params.is_follower:
            answer, effects = core.handle_follower_fetch(
                FollowerFetch(
                    replica_id=params.replica_id,
                    broker_epoch=params.replica_epoch,
                    current_leader_epoch=req.current_leader_epoch,
                    fetch_offset=req.fetch_offset,
                    last_fetched_epoch=req.last_fetched_epoch,
                    log_start_offset=req.log_start_offset,
                ),
                wall_clock_ms(),
            )
            self._apply(hosted, effects)
            result.error, result.message = answer.error, answer.message
            result.high_watermark = answer.high_watermark
            result.log_start_offset = answer.log_start_offset
            result.log_end_offset = answer.log_end_offset
            result.diverging_epoch = answer.diverging_epoch
            result.current_leader = (core.leader_id, core.leader_epoch)
            readable = answer.error == ErrorCode.NONE and answer.diverging_epoch is None
            if readable and answer.read_until_offset > answer.fetch_offset:
                self._read_records(
                    hosted, result, answer.fetch_offset, max_bytes, answer.read_until_offset
                )
            return result
        # A consumer: the leader, or an in-sync follower in the client's rack (KIP-392).
        allow_follower = bool(params.rack_id) and self._serves_rack(params.rack_id)
        answer_c, _ = core.check_consumer_fetch(
            req.current_leader_epoch, req.fetch_offset, allow_follower=allow_follower
        )
        result.error, result.message = answer_c.error, answer_c.message
        result.high_watermark = answer_c.high_watermark
        result.log_start_offset = answer_c.log_start_offset
        result.log_end_offset = answer_c.log_end_offset
        result.current_leader = (core.leader_id, core.leader_epoch)
        if answer_c.error != ErrorCode.NONE:
            return result
        if core.is_leader and params.rack_id:
            preferred = self._preferred_read_replica(hosted, params.rack_id, req.fetch_offset)
            if preferred is not None:
                result.preferred_read_replica = preferred
                return result
        if answer_c.read_until_offset > req.fetch_offset:
            self._read_records(
                hosted, result, req.fetch_offset, max_bytes, answer_c.read_until_offset
            )
        return result

    def _read_records(
        self,
        hosted: Hosted,
        result: wire.FetchPartitionResult,
        offset: int,
        max_bytes: int,
        max_offset: int,
    ) -> None:
        """Fill `result.records`; a read the disk fails takes the dir offline and answers
        KAFKA_STORAGE_ERROR."""
        try:
            result.records = hosted.log.read(offset, max_bytes, max_offset=max_offset).records
        except Exception as err:
            if not self.maybe_take_log_dir_offline(err, f"read from {hosted.tp}"):
                raise
            result.error, result.message = self._storage_error()

    def _serves_rack(self, rack: str) -> bool:
        return (
            self.config["replica.selector.class"] == "RackAwareReplicaSelector"
            and bool(self.config.rack)
            and self.config.rack == rack
        )

    def _preferred_read_replica(self, hosted: Hosted, rack: str, fetch_offset: int) -> int | None:
        """KIP-392: an in-sync follower in the client's rack that holds the offset."""
        if self.config["replica.selector.class"] != "RackAwareReplicaSelector":
            return None
        if self.config.rack == rack:
            return None  # the leader is in the client's rack already
        core = hosted.core
        for replica_id in core.replicas:
            if replica_id == self.broker_id or replica_id not in core.isr:
                continue
            broker = self.image.brokers.get(replica_id)
            if broker is None or broker.rack != rack or not broker.is_active:
                continue
            if core.replica_leo(replica_id) >= fetch_offset:
                return replica_id
        return None

    # -- follower fetch plumbing (FollowerHost for fetcher.py) ----------------------------------

    def follower_fetch_state(
        self, tp: TopicPartition, leader_id: int
    ) -> wire.FetchPartitionRequest | None:
        hosted = self.partitions.get(tp)
        if hosted is None or self.log_dir_failure is not None:
            return None
        position, _ = hosted.core.next_fetch(wall_clock_ms())
        if position is None or position.leader_id != leader_id:
            hosted.pending_fetch = None
            hosted.pending_request = None
            return None
        hosted.pending_fetch = position
        hosted.pending_request = sent = wire.FetchPartitionRequest(
            topic=tp.topic,
            partition=tp.partition,
            current_leader_epoch=position.current_leader_epoch,
            fetch_offset=position.fetch_offset,
            last_fetched_epoch=position.last_fetched_epoch,
            log_start_offset=position.log_start_offset,
            max_bytes=self.config["replica.fetch.max.bytes"],
        )
        return sent

    async def apply_follower_fetch(
        self,
        leader_id: int,
        sent: wire.FetchPartitionRequest,
        result: wire.FetchPartitionResult,
    ) -> None:
        """Apply the leader's answer to `sent` (what `follower_fetch_state` returned for it)."""
        tp = TopicPartition(result.topic, result.partition)
        hosted = self.partitions.get(tp)
        if hosted is None or hosted.pending_fetch is None or hosted.pending_request is not sent:
            return
        if self.log_dir_failure is not None:
            return
        request = hosted.pending_fetch
        if request.leader_id != leader_id:
            return
        hosted.pending_fetch = None
        hosted.pending_request = None
        response = FetchResponse(
            error=result.error,
            high_watermark=result.high_watermark,
            log_start_offset=result.log_start_offset,
            log_end_offset=result.log_end_offset,
            diverging_epoch=result.diverging_epoch,
            records=result.records,
        )
        try:
            _, effects = hosted.core.on_fetch_response(request, response, wall_clock_ms())
            self._apply(hosted, effects)
        except FollowerAppendFailedError as err:
            log.warning(
                "follower_append_failed",
                topic=tp.topic,
                partition=tp.partition,
                leader=leader_id,
                error=str(err),
            )
            failed = FetchResponse(error=ErrorCode.CORRUPT_MESSAGE)
            _, effects = hosted.core.on_fetch_response(request, failed, wall_clock_ms())
            self._apply(hosted, effects)

    # -- list offsets, metadata, producer ids, describe -----------------------------------------

    def list_offsets(
        self, partitions: list[wire.ListOffsetsPartition]
    ) -> list[wire.ListOffsetsResult]:
        results = []
        for req in partitions:
            tp = TopicPartition(req.topic, req.partition)
            result = wire.ListOffsetsResult(req.topic, req.partition)
            hosted = self.partitions.get(tp)
            offline = self._offline_error()
            if offline is not None:
                result.error, result.message = offline
                results.append(result)
                continue
            if hosted is None:
                result.error = self._not_hosted_error(tp)
                results.append(result)
                continue
            answer, _ = hosted.core.list_offsets(req.current_leader_epoch, req.timestamp)
            result.error, result.message = answer.error, answer.message
            result.leader_epoch = answer.leader_epoch
            if answer.error == ErrorCode.NONE:
                if answer.needs_timestamp_lookup:
                    try:
                        found = hosted.log.offset_for_timestamp(req.timestamp)
                    except Exception as err:
                        if not self.maybe_take_log_dir_offline(err, f"timestamp lookup in {tp}"):
                            raise
                        result.error, result.message = self._storage_error()
                        results.append(result)
                        continue
                    found_offset = found[0] if found is not None else None
                    error, offset = answer.resolve(found_offset)
                    result.error, result.offset = error, offset
                    result.timestamp = found[1] if found is not None and offset >= 0 else -1
                else:
                    result.offset = answer.offset
            results.append(result)
        return results

    def offset_for_leader_epoch(
        self, partitions: list[wire.OffsetForLeaderPartition]
    ) -> list[wire.EpochEndOffsetResult]:
        results = []
        for req in partitions:
            tp = TopicPartition(req.topic, req.partition)
            result = wire.EpochEndOffsetResult(req.topic, req.partition)
            hosted = self.partitions.get(tp)
            offline = self._offline_error()
            if offline is not None:
                result.error, result.message = offline
            elif hosted is None:
                result.error = self._not_hosted_error(tp)
            else:
                answer, _ = hosted.core.offset_for_leader_epoch(
                    req.current_leader_epoch, req.leader_epoch
                )
                result.error, result.message = answer.error, answer.message
                result.leader_epoch, result.end_offset = answer.leader_epoch, answer.end_offset
            results.append(result)
        return results

    def _not_hosted_error(self, tp: TopicPartition) -> ErrorCode:
        """The error for a partition this broker does not host: it does not exist at all, or
        lives on other brokers."""
        known = self.image.topic(tp.topic)
        if known is None or tp.partition not in known.partitions:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        return ErrorCode.NOT_LEADER_OR_FOLLOWER

    def metadata_response(self, topics: list[str], all_topics: bool) -> pb.MetadataResponse:
        image = self.image
        response = pb.MetadataResponse(
            cluster_id=self._link.cluster_id if self._link is not None else "",
            controller_id=1000,
            controller_host=self._controller_address[0],
            controller_port=self._controller_address[1],
        )
        for broker in sorted(image.brokers.values(), key=lambda b: b.broker_id):
            response.brokers.append(
                pb.BrokerMetadata(
                    node_id=broker.broker_id,
                    host=broker.host,
                    port=broker.port,
                    rack=broker.rack,
                    fenced=broker.fenced,
                )
            )
        names = sorted(image.topic_ids_by_name) if all_topics or not topics else topics
        for name in names:
            topic = image.topic(name)
            if topic is None:
                # Kafka's answer for a name that cannot exist: INVALID_TOPIC_EXCEPTION.
                error = (
                    ErrorCode.INVALID_TOPIC_EXCEPTION
                    if invalid_topic_name(name)
                    else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                )
                response.topics.append(
                    pb.TopicMetadata(name=name, error_code=wire.pb_error_code(error))
                )
                continue
            tm = pb.TopicMetadata(name=name, topic_id=topic.topic_id, configs=topic.configs)
            for index in sorted(topic.partitions):
                record = topic.partitions[index]
                offline = [
                    r for r in record.replicas if r not in image.brokers or image.brokers[r].fenced
                ]
                tm.partitions.append(
                    pb.PartitionMetadata(
                        error_code=wire.pb_error_code(
                            ErrorCode.LEADER_NOT_AVAILABLE
                            if record.leader == NO_LEADER
                            else ErrorCode.NONE
                        ),
                        partition=index,
                        leader_id=record.leader,
                        leader_epoch=record.leader_epoch,
                        replicas=list(record.replicas),
                        isr=list(record.isr),
                        offline_replicas=offline,
                        partition_epoch=record.partition_epoch,
                    )
                )
            response.topics.append(tm)
        return response

    async def init_producer_id(self) -> pb.InitProducerIdResponse:
        """Hand out the next producer id of this broker's block (Kafka's ProducerIdManager).

        Blocks come from the controller. The next one is fetched in the background once 90% of
        the current one is used, and the first right after registration, so new idempotent
        producers keep starting while the controller is briefly away.
        """
        async with self._producer_id_lock:
            next_id, end = self._producer_ids
            if next_id >= end:
                if self._next_producer_ids is None:
                    try:
                        self._next_producer_ids = await self._link.allocate_producer_ids()
                    except Exception as err:
                        return pb.InitProducerIdResponse(
                            error_code=wire.pb_error_code(ErrorCode.NOT_CONTROLLER),
                            error_message=f"cannot allocate producer ids: {err}",
                            producer_id=-1,
                            producer_epoch=-1,
                        )
                start, length = self._next_producer_ids
                self._next_producer_ids = None
                next_id, end = start, start + length
            self._producer_ids = (next_id + 1, end)
            if self._next_producer_ids is None and end - next_id <= PRODUCER_ID_PREFETCH_LEFT:
                self.prefetch_producer_ids()
        return pb.InitProducerIdResponse(
            error_code=wire.pb_error_code(ErrorCode.NONE), producer_id=next_id, producer_epoch=0
        )

    def prefetch_producer_ids(self) -> None:
        """Fetch the next producer-id block in the background (retrying while the controller is
        away), unless one is already fetched or on its way."""
        if self._next_producer_ids is not None or self._prefetching:
            return
        self._prefetching = True

        async def fetch() -> None:
            try:
                delay = 0.1
                while self._next_producer_ids is None:
                    try:
                        self._next_producer_ids = await self._link.allocate_producer_ids()
                    except Exception:
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 2.0)
            finally:
                self._prefetching = False

        self._spawn(fetch(), "prefetch-producer-ids")

    def describe_replicas(self, topics: set[str]) -> list[wire.ReplicaState]:
        states = []
        for tp, hosted in sorted(self.partitions.items()):
            if topics and tp.topic not in topics:
                continue
            core = hosted.core
            followers = (
                [
                    wire.FollowerState(r.replica_id, r.leo, r.last_caught_up_time_ms)
                    for r in core.remote_replicas
                ]
                if core.is_leader
                else []
            )
            states.append(
                wire.ReplicaState(
                    topic=tp.topic,
                    partition=tp.partition,
                    is_leader=core.is_leader,
                    leader_id=core.leader_id,
                    leader_epoch=core.leader_epoch,
                    partition_epoch=core.partition_epoch,
                    log_start_offset=core.log_start_offset,
                    log_end_offset=core.leo,
                    high_watermark=core.high_watermark,
                    isr=sorted(core.isr),
                    maximal_isr=sorted(core.maximal_isr),
                    size_bytes=hosted.log.size_bytes,
                    followers=followers,
                )
            )
        return states

    # -- background work ------------------------------------------------------------------------

    async def run_background(self, stop: asyncio.Event) -> None:
        """ISR shrink checks, produce expiry, checkpoints, retention, metrics gauges."""
        lag_ms = self.config["replica.lag.time.max.ms"]
        shrink_every = max(lag_ms / 2, 10) / 1000.0
        hw_every = self.config["replica.high.watermark.checkpoint.interval.ms"] / 1000.0
        rp_every = self.config["log.flush.offset.checkpoint.interval.ms"] / 1000.0
        retention_every = self.config["log.retention.check.interval.ms"] / 1000.0
        last = {"shrink": 0.0, "hw": 0.0, "rp": 0.0, "retention": 0.0}
        tick_s = min(shrink_every, 0.25)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), tick_s)
            except TimeoutError:
                pass
            if self.log_dir_failure is not None:
                return  # no more checkpoints, flushes or retention on a failed dir
            try:
                self._background_tick(last, shrink_every, hw_every, rp_every, retention_every)
            except Exception as err:
                # One failing partition or checkpoint must not stop ISR checks, produce expiry
                # and checkpoints for every other partition: log it and carry on next tick.
                if not self.maybe_take_log_dir_offline(err, "background work"):
                    log.exception("background_tick_failed")

    def _background_tick(
        self,
        last: dict[str, float],
        shrink_every: float,
        hw_every: float,
        rp_every: float,
        retention_every: float,
    ) -> None:
        mono = time.monotonic()
        now = wall_clock_ms()

        def expire(hosted: Hosted) -> None:
            if hosted.core.pending_produce_count:
                self._apply(hosted, hosted.core.expire_produces(now)[1])

        def shrink(hosted: Hosted) -> None:
            if hosted.core.is_leader:
                self._apply(hosted, hosted.core.maybe_shrink_isr(now)[1])

        self._each_partition("expire_produces", expire)
        if mono - last["shrink"] >= shrink_every:
            last["shrink"] = mono
            self._each_partition("maybe_shrink_isr", shrink)
        if mono - last["hw"] >= hw_every:
            last["hw"] = mono
            # On the loop thread: the checkpoint reads every log's HW (a few ms of fsync).
            self._guarded("checkpoint_high_watermarks", self.log_manager.checkpoint_high_watermarks)
        if mono - last["rp"] >= rp_every:
            last["rp"] = mono
            self._guarded("retry_log_deletes", self.log_manager.retry_deletes)
            self._guarded("maybe_flush", lambda: self.log_manager.maybe_flush(now))
            self._guarded("checkpoint_recovery_points", self.log_manager.checkpoint_recovery_points)
            self._guarded(
                "checkpoint_log_start_offsets", self.log_manager.checkpoint_log_start_offsets
            )
        if mono - last["retention"] >= retention_every:
            last["retention"] = mono
            self._each_partition("retention", lambda hosted: self._run_retention(hosted, now))
        self._update_gauges()

    def _guarded(self, step: str, fn: Any) -> None:
        """Run one background step; a failure is logged and the other steps still run."""
        if self.log_dir_failure is not None:
            return
        try:
            fn()
        except Exception as err:
            if not self.maybe_take_log_dir_offline(err, step):
                log.exception("background_step_failed", step=step)

    def _each_partition(self, step: str, fn: Any) -> None:
        """Run one background step per partition; one partition's failure spares the others."""
        for hosted in list(self.partitions.values()):
            if self.log_dir_failure is not None:
                return
            try:
                fn(hosted)
            except Exception as err:
                if not self.maybe_take_log_dir_offline(err, f"{step} of {hosted.tp}"):
                    log.exception(
                        "background_step_failed",
                        step=step,
                        topic=hosted.tp.topic,
                        partition=hosted.tp.partition,
                    )

    def _run_retention(self, hosted: Hosted, now: int) -> None:
        deleted = hosted.log.delete_retention(now)
        if deleted:
            self._apply(
                hosted, hosted.core.on_log_start_offset_advanced(hosted.log.log_start_offset)[1]
            )
            log.info(
                "segments_deleted",
                topic=hosted.tp.topic,
                partition=hosted.tp.partition,
                count=len(deleted),
                log_start_offset=hosted.log.log_start_offset,
            )

    def _update_gauges(self) -> None:
        under_replicated = under_min = at_min = leaders = 0
        max_lag = 0
        for hosted in self.partitions.values():
            core = hosted.core
            if core.is_leader:
                leaders += 1
                isr = len(core.isr)
                under_replicated += isr < len(core.replicas)
                under_min += isr < core.effective_min_isr
                at_min += isr == core.effective_min_isr
            elif (follower := core.follower_state) is not None:
                lag = follower.leader_high_watermark - core.leo
                max_lag = max(max_lag, lag)
        m = self.metrics
        m.under_replicated.set(under_replicated)
        m.under_min_isr.set(under_min)
        m.at_min_isr.set(at_min)
        m.leader_count.set(leaders)
        m.partition_count.set(len(self.partitions))
        m.max_lag.set(max_lag)
        m.fetch_purgatory.set(len(self.fetch_signals) + len(self.hw_signals))
        m.produce_purgatory.set(sum(h.core.pending_produce_count for h in self.partitions.values()))

    def led_partitions(self) -> int:
        return sum(1 for h in self.partitions.values() if h.core.is_leader)

    async def stop(self) -> None:
        await self.fetchers.stop()
        for task in list(self._tasks):
            task.cancel()
        for hosted in self.partitions.values():
            for future in hosted.produce_futures.values():
                if not future.done():
                    future.set_result(
                        CompleteProduce(
                            None, ErrorCode.NOT_LEADER_OR_FOLLOWER, -1, -1, "broker shutting down"
                        )
                    )


def _alter_partition_result(
    proposal_id: int, response: pb.AlterPartitionResponse
) -> AlterPartitionResult:
    if response.error_code != ErrorCode.NONE:
        return AlterPartitionResult(proposal_id, ErrorCode(response.error_code))
    for topic in response.topics:
        for p in topic.partitions:
            return AlterPartitionResult(
                proposal_id,
                ErrorCode(p.error_code),
                leader_epoch=p.leader_epoch,
                partition_epoch=p.partition_epoch,
                isr=frozenset(p.isr),
                leader_recovery_state=LeaderRecoveryState(p.leader_recovery_state),
            )
    return AlterPartitionResult(proposal_id, ErrorCode.UNKNOWN_SERVER_ERROR)
