"""The replica manager: the asyncio shell around the replica engine.

I/O shell, event-loop thread only. The decisions live in `BrokerReplicas`
(broker/replication/engine.py); this class holds what only a shell can: the produce futures, the
long-poll signals, the fetchers, the controller link, timers, the worker thread that creates
logs, and the log files themselves (through the LogManager). Every request or fact becomes one
engine call, and the outputs it returns are carried out here, in order (`run`). The jobs are
split by module: metadata_apply.py (metadata batches, log creation, strays), produce.py,
fetch.py (long polls, offsets, the follower fetch plumbing for fetcher.py), producer_ids.py and
background.py (ticks, checkpoints, retention, gauges).

A failed disk operation takes the data dir offline (Kafka's LogDirFailureChannel): the engine
answers KAFKA_STORAGE_ERROR from then on; here fetching and background writes stop,
`log_dir_failure` is set and `log_dir_failed` fires, and the composition root reports the dir
to the controller and exits (Kafka halts when its last log dir fails).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from minibroker.broker import wire
from minibroker.broker.cleaner.manager import CleanerSettings, LogCleaner
from minibroker.broker.config import BrokerConfig
from minibroker.broker.fetcher import FetcherManager
from minibroker.broker.metrics import BrokerMetrics
from minibroker.broker.purgatory import KeySignals
from minibroker.broker.replicas.background import Background
from minibroker.broker.replicas.fetch import FetchAnswer, FetchHandler
from minibroker.broker.replicas.metadata_apply import MetadataApplier
from minibroker.broker.replicas.produce import ProduceHandler
from minibroker.broker.replicas.producer_ids import ProducerIds
from minibroker.broker.replication.engine import BrokerReplicas
from minibroker.broker.replication.events import (
    AlterPartitionResult,
    CompleteProduce,
    IsrChangeKind,
    Role,
)
from minibroker.broker.replication.hosted import HostedReplica
from minibroker.broker.replication.outputs import (
    Appended,
    CorruptProduce,
    EngineConfig,
    FetchBackoff,
    FollowerAppendFailed,
    HighWatermarkMoved,
    IsrChanged,
    LogConfigChanged,
    LogDirFailed,
    Output,
    PartitionApplyFailed,
    ReplicaRemoved,
    RoleChanged,
    SendAlterPartition,
    StartFollowing,
    StopFollowing,
    Truncated,
    WakeFetches,
    WakeFollowerFetches,
)
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.errors import disk_error_advice
from minibroker.broker.storage.log import PartitionLog
from minibroker.broker.storage.log_manager import LogManager
from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.common.log import get_logger
from minibroker.client.common.netfaults import NetFaults
from minibroker.client.common.scram import ScramCredential
from minibroker.client.common.tls import TlsSettings
from minibroker.client.errors import ErrorCode, MiniBrokerError
from minibroker.client.types import TopicPartition
from minibroker.metadata.image import MetadataImage
from minibroker.proto import minibroker_pb2 as pb

log = get_logger("minibroker.broker.replica_manager")


@dataclass(frozen=True, slots=True)
class LogDirFailure:
    """The data dir failed (Kafka's offline log dir): where, during what, and how."""

    log_dir: str
    operation: str  # what the broker was doing: "produce to events-0", "checkpoint_..."
    error: str  # the storage error's text
    advice: str  # what the operator should do (from the errno)
    message: str  # what every KAFKA_STORAGE_ERROR answers from now on

    def serving_error(self) -> str:
        return self.message


def engine_config(config: BrokerConfig, log_dir: str) -> EngineConfig:
    return EngineConfig(
        broker_id=config.node_id,
        log_dir=log_dir,
        rack=config.rack or "",
        rack_aware_selector=config["replica.selector.class"] == "RackAwareReplicaSelector",
        replica_lag_time_max_ms=config["replica.lag.time.max.ms"],
        replica_fetch_backoff_ms=config["replica.fetch.backoff.ms"],
        replica_fetch_max_bytes=config["replica.fetch.max.bytes"],
        max_pending_produces=config["queued.max.requests"],
        topic_defaults=config.topic_defaults,
    )


# The most ISR proposals one AlterPartition request carries (the rest wait for the next one).
ALTER_PARTITION_BATCH_MAX = 2000


class ReplicaManager:
    """The broker's replicas as its servicer, controller link and fetchers see them."""

    def __init__(
        self,
        config: BrokerConfig,
        log_manager: LogManager,
        metrics: BrokerMetrics,
        controller_address: tuple[str, int],
        faults: NetFaults | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        self.config = config
        self.broker_id = config.node_id
        self.log_manager = log_manager
        self.metrics = metrics
        self.image = MetadataImage()
        # Set once this broker's image has caught up with the controller's log as the first
        # metadata answer found it: the ACLs and credentials it authorizes with are then whole.
        self.metadata_loaded = asyncio.Event()
        self.engine: BrokerReplicas[PartitionLog] = BrokerReplicas(
            engine_config(config, str(log_manager.data_dir.path)), self.image
        )
        # Long polls park on one of two signals, as Kafka's delayed fetches complete: a
        # follower's on new data (it reads to the LEO), a consumer's on a HW move (it reads to
        # the HW). Waking the other kind would only make it look and park again.
        self.fetch_signals = KeySignals(config["queued.max.requests"])
        self.hw_signals = KeySignals(config["queued.max.requests"])
        # acks=all produces waiting, by the engine's token; completed only from the core's
        # CompleteProduce outputs.
        self.produce_futures: dict[object, asyncio.Future[CompleteProduce]] = {}
        # Per hosted replica: follower truncations that removed records since this process began
        # hosting it, and the last one, for DescribeReplicas (`watch` shows them).
        self.truncations: dict[TopicPartition, tuple[int, wire.TruncationState]] = {}
        self.controller_address = controller_address
        self.link: Any = None  # ControllerLink, attached after construction
        self.tasks: set[asyncio.Task[Any]] = set()
        # ISR proposals waiting for the next AlterPartition request, and its sender task.
        self._alter_queue: list[SendAlterPartition] = []
        self._alter_sender: asyncio.Task[None] | None = None
        # Set once, never cleared: a failed dir comes back only with a new broker process.
        self.log_dir_failure: LogDirFailure | None = None
        self.log_dir_failed = asyncio.Event()
        # The log cleaner (broker/cleaner/manager.py): its threads are started and stopped by
        # the composition root; truncations and deletions of logs tell it here.
        self.cleaner = LogCleaner(
            CleanerSettings.from_config(config.values),
            log_manager.data_dir.path,
            self._cleanable_logs,
            observer=metrics.cleaner,
            on_disk_failure=self.maybe_take_log_dir_offline,
        )
        # Topics whose compact policy this broker warned about (only while its cleaner is off).
        self._compact_warned: set[str] = set()
        # Called with each RoleChanged and ReplicaRemoved after it is carried out (the group
        # coordinator loads and unloads __consumer_offsets partitions on them).
        self.role_listeners: list[Callable[[Output], None]] = []
        self.metadata = MetadataApplier(self)
        self.producing = ProduceHandler(self)
        self.fetching = FetchHandler(self)
        self.producer_ids = ProducerIds(self)
        self.background = Background(self)
        self.fetchers = FetcherManager(
            self.fetching,
            self._broker_address,
            faults,
            tls,
            max_wait_ms=config["replica.fetch.wait.max.ms"],
            min_bytes=config["replica.fetch.min.bytes"],
            max_bytes=config["replica.fetch.max.bytes"],
            response_max_bytes=config["replica.fetch.response.max.bytes"],
            backoff_ms=config["replica.fetch.backoff.ms"],
        )

    def attach(self, link: Any) -> None:
        self.link = link

    # -- what the rest of the broker calls ----------------------------------------------

    @property
    def partitions(self) -> Mapping[TopicPartition, HostedReplica[PartitionLog]]:
        """The hosted replicas (read only)."""
        return self.engine.hosted()

    def broker_epoch(self) -> int:
        return int(self.link.broker_epoch) if self.link is not None else -1

    def metadata_offset(self) -> int:
        return self.image.next_offset

    def applied_metadata_offset(self) -> int:
        """The next metadata offset not acted on in full yet (what heartbeats report; read on
        the heartbeat thread)."""
        return self.metadata.applied_offset

    def load_existing_logs(self) -> None:
        self.metadata.load_existing_logs()

    def scram_credential(self, user: str, mechanism: int) -> ScramCredential | None:
        """`user`'s SCRAM credential for Kafka's mechanism number, from the image this broker
        follows: the lookup of its SaslVerifier (client/common/sasl.py)."""
        return self.image.scram_credential(user, mechanism)

    async def apply_metadata_batch(self, batch: pb.MetadataBatch) -> None:
        await self.metadata.apply_batch(batch)
        if not self.metadata_loaded.is_set() and self.image.next_offset >= batch.high_offset:
            self.metadata_loaded.set()

    async def produce(
        self, acks: int, timeout_ms: int, partitions: list[wire.ProducePartition]
    ) -> list[wire.ProduceResult]:
        return await self.producing.produce(acks, timeout_ms, partitions)

    async def fetch(
        self,
        params: wire.FetchParams,
        *,
        owner: Hashable = None,
        topic_allowed: Callable[[str], bool] | None = None,
    ) -> FetchAnswer:
        return await self.fetching.fetch(params, owner=owner, topic_allowed=topic_allowed)

    def list_offsets(
        self, partitions: list[wire.ListOffsetsPartition]
    ) -> list[wire.ListOffsetsResult]:
        return self.fetching.list_offsets(partitions)

    def offset_for_leader_epoch(
        self, partitions: list[wire.OffsetForLeaderPartition]
    ) -> list[wire.EpochEndOffsetResult]:
        return self.fetching.offset_for_leader_epoch(partitions)

    def follower_fetch_state(
        self, tp: TopicPartition, leader_id: int
    ) -> wire.FetchPartitionRequest | None:
        return self.fetching.follower_fetch_state(tp, leader_id)

    async def apply_follower_fetch(
        self,
        leader_id: int,
        sent: wire.FetchPartitionRequest,
        result: wire.FetchPartitionResult,
    ) -> None:
        await self.fetching.apply_follower_fetch(leader_id, sent, result)

    def metadata_response(self, topics: list[str], all_topics: bool) -> pb.MetadataResponse:
        return wire.encode_metadata(
            self.image,
            topics,
            all_topics,
            cluster_id=self.link.cluster_id if self.link is not None else "",
            # The active controller as the link believes it (a quorum's leader moves).
            controller_address=(
                self.link.controller_address() if self.link is not None else self.controller_address
            ),
            controller_id=self.link.controller_id if self.link is not None else -1,
        )

    async def init_producer_id(self) -> pb.InitProducerIdResponse:
        return await self.producer_ids.init_producer_id()

    def prefetch_producer_ids(self) -> None:
        self.producer_ids.prefetch()

    def describe_replicas(self, topics: set[str]) -> list[wire.ReplicaState]:
        states = []
        now = wall_clock_ms()
        for replica in self.engine.describe(topics):
            partition_log = self.engine.log(replica.tp)
            truncations = self.truncations.get(replica.tp)
            point = (
                self.cleaner.describe(partition_log, replica.high_watermark, now)
                if partition_log is not None
                else None
            )
            runs, last_run = self.cleaner.book.last_run(replica.tp)
            states.append(
                wire.ReplicaState(
                    topic=replica.tp.topic,
                    partition=replica.tp.partition,
                    is_leader=replica.is_leader,
                    leader_id=replica.leader_id,
                    leader_epoch=replica.leader_epoch,
                    partition_epoch=replica.partition_epoch,
                    log_start_offset=replica.log_start_offset,
                    log_end_offset=replica.log_end_offset,
                    high_watermark=replica.high_watermark,
                    isr=list(replica.isr),
                    maximal_isr=list(replica.maximal_isr),
                    size_bytes=partition_log.size_bytes if partition_log is not None else 0,
                    followers=[
                        wire.FollowerState(f.replica_id, f.log_end_offset, f.last_caught_up_time_ms)
                        for f in replica.followers
                    ],
                    truncations=truncations[0] if truncations else 0,
                    last_truncation=truncations[1] if truncations else None,
                    compacted=point is not None,
                    cleaner_point=point.cleaner_point if point is not None else -1,
                    dirty_ratio=point.dirty_ratio if point is not None else -1.0,
                    cleaner_runs=runs,
                    last_cleaner_run=wire.cleaner_run_state(last_run),
                )
            )
        return states

    def _cleanable_logs(self) -> list[tuple[PartitionLog, int]]:
        """Each hosted log with its HW, for the cleaner's look (event loop); none once the data
        dir failed."""
        if self.log_dir_failure is not None:
            return []
        out = []
        for tp, high_watermark in self.engine.high_watermarks().items():
            partition_log = self.engine.log(tp)
            if partition_log is not None:
                out.append((partition_log, high_watermark))
        return out

    def delete_log(self, tp: TopicPartition) -> None:
        """Delete the log of `tp`, its cleaner round aborted and its cleaner checkpoint dropped
        first (Kafka's LogManager.asyncDelete: abortCleaning, then the delete)."""
        self.cleaner.forget(tp)
        self.log_manager.delete_log(tp)

    async def run_background(self, stop: asyncio.Event) -> None:
        await self.background.run(stop)

    def led_partitions(self) -> int:
        return self.engine.led_partitions()

    async def stop(self) -> None:
        await self.fetchers.stop()
        for task in list(self.tasks):
            task.cancel()
        # The HWs are the cores': checkpointed here, before the logs close (Kafka's
        # ReplicaManager.shutdown). Skipped once the dir failed; a failure takes it offline.
        self.background.guarded(
            "checkpoint_high_watermarks", self.background.checkpoint_high_watermarks
        )
        self.run(self.engine.shutdown("broker shutting down"))

    # -- helpers for the job modules ----------------------------------------------------

    def spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def log_config(self, raw: Mapping[str, str], topic: str | None = None) -> LogConfig:
        """A topic's LogConfig; warns once per topic whose cleanup.policy includes compact
        while this broker's cleaner is off (log.cleaner.enable=false or log.cleaner.threads=0,
        Kafka's settings that leave compacted topics uncompacted)."""
        config = LogConfig.from_configs(raw, self.config.topic_defaults)
        if (
            topic is not None
            and config.compact
            and not self.cleaner.settings.active
            and topic not in self._compact_warned
        ):
            self._compact_warned.add(topic)
            log.warning(
                "compaction_disabled",
                topic=topic,
                cleanup_policy=("compact,delete" if config.delete else "compact"),
                message="cleanup.policy includes compact, but this broker's log cleaner is off "
                "(log.cleaner.enable=false or log.cleaner.threads=0): the topic is NOT "
                "compacted here, every record is kept"
                + (
                    " until retention.ms or retention.bytes removes it"
                    if config.delete
                    else " and the log grows without bound"
                ),
            )
        return config

    def maybe_take_log_dir_offline(self, err: BaseException, operation: str) -> bool:
        """Take the data dir offline when `err` is a failure of it; True when it was one."""
        failed, outputs = self.engine.storage_failed(err, operation)
        self.run(outputs)
        return failed

    def _broker_address(self, broker_id: int) -> str | None:
        broker = self.image.brokers.get(broker_id)
        if broker is None:
            return None
        return f"{broker.host}:{broker.port}"

    def maybe_flush(self, tp: TopicPartition, now: int) -> None:
        """flush.messages / flush.ms after an append the core already counts: a failed fsync
        must not fail that append (the background flush tries again)."""
        partition_log = self.engine.log(tp)
        if partition_log is None:
            return
        try:
            partition_log.maybe_flush(now)
        except MiniBrokerError as err:
            log.warning("flush_failed", topic=tp.topic, partition=tp.partition, error=str(err))
            self.maybe_take_log_dir_offline(err, f"flush of {tp}")

    # -- carrying out the engine's outputs ----------------------------------------------

    def run(self, outputs: Iterable[Output]) -> None:
        """Carry out the engine's outputs in order."""
        for output in outputs:
            if isinstance(output, CompleteProduce):
                future = self.produce_futures.pop(output.token, None)
                if future is not None and not future.done():
                    future.set_result(output)
            elif isinstance(output, WakeFollowerFetches):
                self.fetch_signals.notify(output.tp)
                self.fetching.changed(output.tp)
            elif isinstance(output, HighWatermarkMoved):
                self.hw_signals.notify(output.tp)
                self.fetching.changed(output.tp)
            elif isinstance(output, WakeFetches):
                self.fetch_signals.notify(output.tp)
                self.hw_signals.notify(output.tp)
                self.fetching.changed(output.tp)
            elif isinstance(output, Appended):
                self._on_appended(output)
            elif isinstance(output, SendAlterPartition):
                self._propose(output)
            elif isinstance(output, StartFollowing):
                self.fetchers.follow(output.tp, output.leader_id)
            elif isinstance(output, StopFollowing):
                self.fetchers.unfollow(output.tp)
                self.fetching.forget(output.tp)
            else:
                self._log_output(output)
                if self.role_listeners and isinstance(output, RoleChanged | ReplicaRemoved):
                    for listener in self.role_listeners:
                        listener(output)

    def _on_appended(self, output: Appended) -> None:
        if output.as_leader:
            self.metrics.messages_in.inc(output.records)
            self.metrics.bytes_in.inc(output.size)
        else:
            self.metrics.replication_bytes_in.inc(output.size)
        self.maybe_flush(output.tp, wall_clock_ms())

    def _log_output(self, output: Output) -> None:
        """The outputs that are logs, metrics, or a log's file-level change."""
        if isinstance(output, IsrChanged):
            shrink = output.update.kind is IsrChangeKind.SHRINK
            (self.metrics.isr_shrinks if shrink else self.metrics.isr_expands).inc()
            log.info(
                "isr_shrink" if shrink else "isr_expand",
                topic=output.tp.topic,
                partition=output.tp.partition,
                old_isr=sorted(output.update.old_isr),
                new_isr=sorted(output.update.new_isr),
                partition_epoch=output.update.partition_epoch,
                leader_epoch=output.leader_epoch,
                high_watermark=output.high_watermark,
            )
        elif isinstance(output, Truncated):
            self.metrics.truncations.inc()
            # Same turn of the loop as the truncation: no cleaner swap came in between.
            self.cleaner.after_truncation(output.tp, output.to_offset, output.fully)
            if output.fully or output.to_offset < output.from_offset:
                # A divergence check may truncate at the LEO, removing nothing: not counted, so
                # it cannot hide the last real truncation.
                count = self.truncations.get(output.tp, (0, None))[0] + 1
                self.truncations[output.tp] = (
                    count,
                    wire.TruncationState(
                        wall_clock_ms(),
                        output.from_offset,
                        output.to_offset,
                        output.fully,
                        output.reason,
                        output.leader_epoch,
                    ),
                )
            where = {"start_offset" if output.fully else "to_offset": output.to_offset}
            log.info(
                "truncated_fully" if output.fully else "truncated",
                topic=output.tp.topic,
                partition=output.tp.partition,
                from_offset=output.from_offset,
                reason=output.reason,
                leader_epoch=output.leader_epoch,
                **where,
            )
        elif isinstance(output, RoleChanged):
            log.info(
                "became_leader" if output.role is Role.LEADER else "became_follower",
                topic=output.tp.topic,
                partition=output.tp.partition,
                leader=output.leader,
                leader_epoch=output.leader_epoch,
                partition_epoch=output.partition_epoch,
                isr=list(output.isr),
                leo=output.leo,
                high_watermark=output.high_watermark,
            )
        elif isinstance(output, LogConfigChanged):
            partition_log = self.engine.log(output.tp)
            if partition_log is not None:
                partition_log.update_config(self.log_config(output.configs, output.tp.topic))
        elif isinstance(output, ReplicaRemoved):
            self.truncations.pop(output.tp, None)
            if output.delete:
                self.delete_log(output.tp)
            log.info(
                "replica_removed",
                topic=output.tp.topic,
                partition=output.tp.partition,
                reason=output.reason,
            )
        elif isinstance(output, CorruptProduce):
            self.metrics.invalid_crc.inc()
        elif isinstance(output, FetchBackoff):
            log.debug(
                "fetch_backoff",
                topic=output.tp.topic,
                partition=output.tp.partition,
                delay_ms=output.delay_ms,
                reason=output.reason,
            )
        elif isinstance(output, FollowerAppendFailed):
            log.warning(
                "follower_append_failed",
                topic=output.tp.topic,
                partition=output.tp.partition,
                leader=output.leader_id,
                error=output.error,
            )
        elif isinstance(output, PartitionApplyFailed):
            log.error(
                "partition_metadata_apply_failed",
                topic=output.tp.topic,
                partition=output.tp.partition,
                exc_info=output.error,
            )
        elif isinstance(output, LogDirFailed):
            self._on_log_dir_failed(output)
        else:  # pragma: no cover - a new output type without a handler is a bug
            raise TypeError(f"unhandled output {output!r}")

    def _on_log_dir_failed(self, output: LogDirFailed) -> None:
        failure = LogDirFailure(
            str(self.log_manager.data_dir.path),
            output.operation,
            str(output.error),
            disk_error_advice(output.error),
            output.serving_error,
        )
        self.log_dir_failure = failure
        # Not one more swap into a failed dir: every cleaning round is aborted (and the
        # cleaner's looks find no log from now on).
        self.cleaner.book.abort_all()
        log.error(
            "log_dir_offline",
            log_dir=failure.log_dir,
            operation=failure.operation,
            error=failure.error,
            partitions=output.partitions,
            leaderships=output.leaderships,
        )
        self.log_dir_failed.set()

    def _propose(self, output: SendAlterPartition) -> None:
        """Queue an ISR proposal for the next AlterPartition request (after its delay, if the
        core asked for one)."""
        if output.proposal.delay_ms > 0:
            self.spawn(self._propose_later(output), f"alter-partition-{output.tp}")
            return
        self._alter_queue.append(output)
        if self._alter_sender is None or self._alter_sender.done():
            self._alter_sender = self.spawn(self._send_proposals(), "alter-partition")

    async def _propose_later(self, output: SendAlterPartition) -> None:
        await asyncio.sleep(output.proposal.delay_ms / 1000.0)
        self._alter_queue.append(output)
        if self._alter_sender is None or self._alter_sender.done():
            self._alter_sender = self.spawn(self._send_proposals(), "alter-partition")

    async def _send_proposals(self) -> None:
        """Kafka's AlterPartitionManager: one AlterPartition request in flight, carrying every
        proposal queued meanwhile (a partition at most once per request), so a broker that
        rejoins a thousand ISRs sends a few requests, not a thousand."""
        while self._alter_queue:
            batch: list[SendAlterPartition] = []
            keys: set[tuple[str, int]] = set()
            rest: list[SendAlterPartition] = []
            for output in self._alter_queue:
                key = (output.topic_id, output.tp.partition)
                if key in keys or len(batch) >= ALTER_PARTITION_BATCH_MAX:
                    rest.append(output)
                else:
                    keys.add(key)
                    batch.append(output)
            self._alter_queue = rest
            request = wire.encode_alter_partitions(
                [(o.topic_id, o.tp.partition, o.proposal) for o in batch]
            )
            try:
                response = await self.link.alter_partition(request)
                results = wire.decode_alter_partitions(
                    [(o.topic_id, o.tp.partition, o.proposal.proposal_id) for o in batch], response
                )
            except Exception as err:  # transport failure: each core retries the same proposal
                log.debug("alter_partition_failed", partitions=len(batch), error=repr(err))
                results = [
                    AlterPartitionResult(o.proposal.proposal_id, ErrorCode.REQUEST_TIMED_OUT)
                    for o in batch
                ]
            now = wall_clock_ms()
            for output, result in zip(batch, results, strict=True):
                tp, proposal = output.tp, output.proposal
                if result.error != ErrorCode.NONE:
                    self.metrics.failed_isr_updates.inc()
                    log.info(
                        "alter_partition_rejected",
                        topic=tp.topic,
                        partition=tp.partition,
                        error=result.error.name,
                        proposed_isr=sorted(proposal.new_isr),
                    )
                self.run(self.engine.on_alter_partition_result(tp, output.generation, result, now))
