"""The broker's replica engine: every hosted partition, the one effect interpreter, the decisions.

Pure and synchronous: no asyncio, no clock, no files but through the `Storage` each partition is
handed. `BrokerReplicas` owns the partitions this broker hosts (tp -> log, `PartitionReplica`
core, topic id, follower fetch in flight), the broker-eligibility view the cores read, and the
decisions around the cores: acting on the controller's partition records (host, remove,
reconfigure, change role), produce (record validation, `plan_append` -> `append_as_leader` ->
`on_leader_appended`, duplicates parked for acks=all), follower and consumer fetches (KIP-392's
preferred read replica included), ListOffsets, OffsetForLeaderEpoch, the follower's fetch
positions and the answers to them, AlterPartition answers, and the ticks (produce expiry, ISR
shrink). A core's effects are carried out in one place only, `_interpret`, in list order:
storage first, then what the I/O shell must do. The per-partition work that touches the log
(a leader's append, reads, timestamp lookups) is `HostedReplica`'s (hosted.py).

Every entry point returns what only an I/O shell can do as a list of outputs (outputs.py,
re-exported here), in the order they must be done: answer a produce future by token, send
AlterPartition, start or stop a fetcher, wake long polls, log and count ISR changes and
truncations, delete a removed log, take the log dir offline. The broker's asyncio shell
(broker/replicas/) and the simulation (tests/sim) both drive this class, so the code the
simulation checks is the code that runs.

A storage call that fails with a log-dir failure (Kafka's LogDirFailureChannel: any I/O error
of the dir) takes the whole dir offline here: from then on every partition answers
KAFKA_STORAGE_ERROR, fetching stops, parked produces are answered, and `LogDirFailed` tells the
shell to report it.

Concurrency contract: single-threaded; per partition, nothing may run between a core's
`plan_append` and `on_leader_appended` (this class calls both within `produce`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from minibroker.broker.replication.eligibility import BrokerEligibilityView
from minibroker.broker.replication.events import (
    AdvanceLogStartOffset,
    AlterPartitionResult,
    AppendAsFollower,
    AssignEpoch,
    Backoff,
    CompleteProduce,
    Effect,
    FetchPosition,
    FetchResponse,
    FollowerFetch,
    HighWatermarkChanged,
    IsrUpdated,
    LeaderRecoveryState,
    PartitionState,
    ProposeIsr,
    ReplicaConfig,
    Role,
    StartFetching,
    StopFetching,
    TruncateFullyAndStartAt,
    TruncateTo,
)
from minibroker.broker.replication.hosted import FollowerAppendError, HostedReplica
from minibroker.broker.replication.outputs import (
    Appended,
    CorruptProduce,
    EngineConfig,
    EpochEndOffsetReply,
    FetchBackoff,
    FetchReply,
    FollowerAppendFailed,
    FollowerProgress,
    Gauges,
    HighWatermarkMoved,
    IsrChanged,
    ListOffsetsReply,
    LogConfigChanged,
    LogDirFailed,
    Output,
    PartitionApplyFailed,
    ProduceReply,
    ReplicaDescription,
    ReplicaRemoved,
    RoleChanged,
    SendAlterPartition,
    StartFollowing,
    StopFollowing,
    Truncated,
    WakeFetches,
    WakeFollowerFetches,
)
from minibroker.broker.replication.partition import PartitionReplica
from minibroker.broker.storage.epoch_cache import EpochCache
from minibroker.broker.storage.errors import is_log_dir_failure
from minibroker.client.batch import BatchHeader
from minibroker.client.common.invariant import invariant
from minibroker.client.errors import ErrorCode, MiniBrokerError
from minibroker.client.records import RecordValidation
from minibroker.client.topic_config import resolve_topic_config
from minibroker.client.types import TopicPartition
from minibroker.metadata.image import MetadataImage, TopicImage
from minibroker.metadata.records import PartitionRecord

__all__ = [
    "AppendResult",
    "Appended",
    "BrokerReplicas",
    "CorruptProduce",
    "EngineConfig",
    "EpochEndOffsetReply",
    "FetchBackoff",
    "FetchReply",
    "FollowerAppendFailed",
    "FollowerProgress",
    "Gauges",
    "HighWatermarkMoved",
    "HostedReplica",
    "IsrChanged",
    "ListOffsetsReply",
    "LogConfigChanged",
    "LogDirFailed",
    "Output",
    "PartitionApplyFailed",
    "ProduceReply",
    "ReadResult",
    "ReplicaDescription",
    "ReplicaRemoved",
    "RoleChanged",
    "SendAlterPartition",
    "StartFollowing",
    "StopFollowing",
    "Storage",
    "Truncated",
    "WakeFetches",
    "WakeFollowerFetches",
]

# ------------------------------------------------------------------------------------------
# The storage a partition is hosted on


class AppendResult(Protocol):
    """What an append wrote (PartitionLog's AppendInfo)."""

    @property
    def first_offset(self) -> int: ...
    @property
    def batches(self) -> Sequence[BatchHeader]: ...
    @property
    def log_append_time_ms(self) -> int: ...
    @property
    def valid_bytes(self) -> int: ...


class ReadResult(Protocol):
    @property
    def records(self) -> bytes: ...


class Storage(Protocol):
    """One partition's log as the engine uses it. `PartitionLog` (broker/storage/log.py) and the
    simulation's in-memory log satisfy it structurally. A failed call raises; a log-dir failure
    (`is_log_dir_failure`) takes the dir offline. The log does not hold the high watermark: the
    core does."""

    @property
    def leo(self) -> int: ...
    @property
    def log_start_offset(self) -> int: ...
    @property
    def epoch_cache(self) -> EpochCache: ...

    def maybe_assign_epoch_start_offset(self, leader_epoch: int, start_offset: int, /) -> bool: ...

    def append_as_leader(
        self,
        records: bytes,
        leader_epoch: int,
        now_ms: int,
        /,
        *,
        validated: list[tuple[int, BatchHeader]] | None = ...,
    ) -> AppendResult: ...

    def append_as_follower(self, records: bytes, /) -> AppendResult: ...
    def truncate_to(self, offset: int, /) -> bool: ...
    def truncate_fully_and_start_at(self, offset: int, /) -> None: ...
    def maybe_increment_log_start_offset(self, offset: int, /) -> bool: ...
    def read(self, offset: int, max_bytes: int, /, *, max_offset: int) -> ReadResult: ...
    def offset_for_timestamp(self, timestamp: int, /) -> tuple[int, int] | None: ...
    def producer_batch_headers(self) -> list[BatchHeader]: ...


S = TypeVar("S", bound=Storage)


# ------------------------------------------------------------------------------------------
# The engine


class BrokerReplicas(Generic[S]):
    """Every partition replica this broker hosts, over one `Storage` each."""

    def __init__(self, config: EngineConfig, image: MetadataImage | None = None) -> None:
        self.config = config
        self.broker_id = config.broker_id
        # The metadata as the shell applied it (read only here): topic names and leaders for
        # partitions not hosted, broker racks and liveness for KIP-392.
        self.image = image if image is not None else MetadataImage()
        self.brokers = BrokerEligibilityView()
        self._hosted: dict[TopicPartition, HostedReplica[S]] = {}
        self._known_topics: dict[str, str] = {}  # topic id -> name, as last acted on
        self._next_token = 0
        self._next_generation = 0
        # The KAFKA_STORAGE_ERROR message once the dir is offline; never cleared (a failed dir
        # comes back only with a new broker process).
        self.offline: str | None = None

    # -- views --------------------------------------------------------------------------

    def __contains__(self, tp: object) -> bool:
        return tp in self._hosted

    def __len__(self) -> int:
        return len(self._hosted)

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(list(self._hosted))

    def get(self, tp: TopicPartition) -> HostedReplica[S] | None:
        return self._hosted.get(tp)

    def hosted(self) -> Mapping[TopicPartition, HostedReplica[S]]:
        """Read-only view of the hosted replicas (for tests and the simulation's checks)."""
        return self._hosted

    def log(self, tp: TopicPartition) -> S | None:
        hosted = self._hosted.get(tp)
        return None if hosted is None else hosted.log

    def topic_id(self, tp: TopicPartition) -> str | None:
        hosted = self._hosted.get(tp)
        return None if hosted is None else hosted.topic_id

    def role(self, tp: TopicPartition) -> Role:
        hosted = self._hosted.get(tp)
        return Role.NONE if hosted is None else hosted.core.role

    def high_watermark(self, tp: TopicPartition) -> int:
        hosted = self._hosted.get(tp)
        invariant(hosted is not None, f"{tp} is not hosted")
        return hosted.core.high_watermark  # type: ignore[union-attr]

    def high_watermarks(self) -> dict[TopicPartition, int]:
        """Every hosted replica's HW (what the HW checkpoint writes)."""
        return {tp: h.core.high_watermark for tp, h in self._hosted.items()}

    def led_partitions(self) -> int:
        return sum(1 for h in self._hosted.values() if h.core.is_leader)

    def followed_leaders(self) -> Iterator[tuple[TopicPartition, int]]:
        """(tp, leader id) for every replica that follows a leader and may fetch."""
        for tp, hosted in self._hosted.items():
            leader_id = _fetching_leader(hosted.core)
            if leader_id is not None:
                yield tp, leader_id

    def describe(self, topics: Iterable[str] = ()) -> list[ReplicaDescription]:
        wanted = set(topics)
        out = []
        for tp, hosted in sorted(self._hosted.items()):
            if wanted and tp.topic not in wanted:
                continue
            core = hosted.core
            out.append(
                ReplicaDescription(
                    tp=tp,
                    is_leader=core.is_leader,
                    leader_id=core.leader_id,
                    leader_epoch=core.leader_epoch,
                    partition_epoch=core.partition_epoch,
                    log_start_offset=core.log_start_offset,
                    log_end_offset=core.leo,
                    high_watermark=core.high_watermark,
                    isr=tuple(sorted(core.isr)),
                    maximal_isr=tuple(sorted(core.maximal_isr)),
                    followers=_follower_progress(core) if core.is_leader else (),
                )
            )
        return out

    def gauges(self) -> Gauges:
        under_replicated = under_min = at_min = leaders = 0
        max_lag = pending = 0
        for hosted in self._hosted.values():
            core = hosted.core
            pending += core.pending_produce_count
            if core.is_leader:
                leaders += 1
                isr = len(core.isr)
                under_replicated += isr < len(core.replicas)
                under_min += isr < core.effective_min_isr
                at_min += isr == core.effective_min_isr
            else:
                lag = _follower_lag(core)
                if lag is not None:
                    max_lag = max(max_lag, lag)
        return Gauges(
            under_replicated, under_min, at_min, leaders, len(self._hosted), max_lag, pending
        )

    # -- hosting and metadata -----------------------------------------------------------

    def host(
        self,
        tp: TopicPartition,
        topic_id: str,
        log: S,
        topic_configs: dict[str, str] | None,
        *,
        high_watermark: int,
        max_message_bytes: int | None = None,
    ) -> HostedReplica[S]:
        """Host `log` for `tp` (a log opened from disk, or one the shell created for a record
        `act_on_metadata` asked a log for). `high_watermark` is the checkpointed HW; None
        configs: the topic's are not known yet (broker defaults until metadata arrives)."""
        configs = self._typed_configs(topic_configs or {})
        core = _new_core(
            self.broker_id,
            log,
            self.brokers,
            self._replica_config(configs),
            high_watermark,
            str(tp),
        )
        self._next_generation += 1
        hosted = HostedReplica(tp, topic_id, log, core, self._next_generation, self._storage_failed)
        hosted.topic_configs = None if topic_configs is None else dict(topic_configs)
        hosted.record_validation = RecordValidation.from_topic_config(configs)
        hosted.max_message_bytes = (
            max_message_bytes
            if max_message_bytes is not None
            else int(configs["max.message.bytes"])
        )
        self._hosted[tp] = hosted
        return hosted

    def needs_log(self, topic: TopicImage, record: PartitionRecord) -> bool:
        """This broker is a replica of `record` and hosts no log of this topic id for it."""
        if self.broker_id not in record.replicas:
            return False
        hosted = self._hosted.get(TopicPartition(topic.name, record.partition))
        return hosted is None or hosted.topic_id != topic.topic_id

    def act_on_metadata(
        self, now_ms: int
    ) -> tuple[list[tuple[TopicImage, PartitionRecord]], list[Output]]:
        """Act on the image as the shell last applied it: registrations, deleted topics, then
        every partition record naming this broker (or a hosted one).

        Returns the records that need a new log (a replica here with no log of that topic id):
        any old log of that name is removed already; the shell creates the logs, `host`s
        them and calls `act_on_partition` for each. Once offline, nothing is acted on.
        """
        out: list[Output] = []
        self._sync_brokers()
        if self.offline is not None:
            return [], out
        # Topics that disappeared since the last act: stop and delete their replicas here.
        for topic_id, name in self._known_topics.items():
            if topic_id not in self.image.topics_by_id:
                for tp in [tp for tp, h in self._hosted.items() if h.topic_id == topic_id]:
                    out += self.remove(tp, delete=True, reason=f"topic {name} deleted")
        self._known_topics = {tid: t.name for tid, t in self.image.topics_by_id.items()}
        new: list[tuple[TopicImage, PartitionRecord]] = []
        for topic, record in self.image.partitions():
            if self.offline is not None:
                break
            if self.needs_log(topic, record):
                tp = TopicPartition(topic.name, record.partition)
                if tp in self._hosted:
                    # A topic of the same name was deleted and re-created: the old log goes.
                    # So does a log without a topic id (Kafka: stray); its metadata file is
                    # written before any data, so it holds none of this topic's records.
                    out += self.remove(tp, delete=True, reason="topic re-created")
                new.append((topic, record))
            else:
                out += self.act_on_partition(topic, record, now_ms)
        return new, out

    def act_on_partition(
        self, topic: TopicImage, record: PartitionRecord, now_ms: int
    ) -> list[Output]:
        """Act on the controller's record of one partition (reconfigure, change role, or
        remove). A replica here must be hosted first (`needs_log`). One partition's failure
        does not stop the others: a storage failure takes the dir offline, any other error is
        reported as PartitionApplyFailed."""
        out: list[Output] = []
        tp = TopicPartition(topic.name, record.partition)
        if self.offline is not None:
            return out
        try:
            self._act_on_partition(tp, topic, record, now_ms, out)
        except Exception as err:
            if not self._storage_failed(err, f"applying metadata to {tp}", out):
                out.append(PartitionApplyFailed(tp, err))
        return out

    def _act_on_partition(
        self,
        tp: TopicPartition,
        topic: TopicImage,
        record: PartitionRecord,
        now_ms: int,
        out: list[Output],
    ) -> None:
        hosted = self._hosted.get(tp)
        if self.broker_id not in record.replicas:
            if hosted is not None and hosted.topic_id == topic.topic_id:
                out += self.remove(tp, delete=True, reason="no longer a replica")
            return
        if hosted is None or hosted.topic_id != topic.topic_id:
            raise MiniBrokerError(f"{tp}: no log of topic id {topic.topic_id} is hosted")
        if hosted.topic_configs != topic.configs:
            # A log opened from disk before metadata arrived ran with the broker's defaults;
            # the topic's own configs (min.insync.replicas, ...) apply now.
            self._reconfigure(hosted, topic.configs, now_ms, out)
        state = PartitionState(
            replicas=tuple(record.replicas),
            isr=frozenset(record.isr),
            leader=record.leader,
            leader_epoch=record.leader_epoch,
            partition_epoch=record.partition_epoch,
            leader_recovery_state=LeaderRecoveryState(record.leader_recovery_state),
        )
        core = hosted.core
        old_role, old_epoch = core.role, core.leader_epoch
        self._interpret(hosted, core.apply_partition_state(state, now_ms)[1], out)
        if core.role != old_role or core.leader_epoch != old_epoch:
            out.append(WakeFetches(tp))  # parked fetches answer now (NOT_LEADER, fenced)
            out.append(
                RoleChanged(
                    tp,
                    core.role,
                    record.leader,
                    record.leader_epoch,
                    record.partition_epoch,
                    tuple(sorted(record.isr)),
                    core.leo,
                    core.high_watermark,
                )
            )

    def _reconfigure(
        self, hosted: HostedReplica[S], raw: dict[str, str], now_ms: int, out: list[Output]
    ) -> None:
        configs = self._typed_configs(raw)
        out.append(LogConfigChanged(hosted.tp, dict(raw)))
        hosted.max_message_bytes = int(configs["max.message.bytes"])
        self._interpret(
            hosted, hosted.core.update_config(self._replica_config(configs), now_ms)[1], out
        )
        hosted.topic_configs = dict(raw)
        hosted.record_validation = RecordValidation.from_topic_config(configs)

    def remove(self, tp: TopicPartition, *, delete: bool, reason: str) -> list[Output]:
        """Stop hosting `tp`: the core answers its waiting produces NOT_LEADER_OR_FOLLOWER, its
        long polls are woken; the shell stops its fetcher and deletes the log when `delete`."""
        hosted = self._hosted.pop(tp, None)
        if hosted is None:
            return []
        out: list[Output] = [StopFollowing(tp, reason)]
        self._interpret(
            hosted, hosted.core.abort_produces(ErrorCode.NOT_LEADER_OR_FOLLOWER, reason)[1], out
        )
        out.append(WakeFetches(tp))
        out.append(ReplicaRemoved(tp, delete, reason))
        return out

    def remove_strays(self) -> list[Output]:
        """Remove the logs whose topic id the caught-up metadata does not know (deleted while
        this broker was away; Kafka's stray replicas): never served again."""
        out: list[Output] = []
        for tp, hosted in list(self._hosted.items()):
            if hosted.topic_id not in self.image.topics_by_id:
                out += self.remove(
                    tp,
                    delete=True,
                    reason=f"stray: topic id {hosted.topic_id!r} is not in the metadata",
                )
        return out

    def _sync_brokers(self) -> None:
        for broker_id, reg in self.image.brokers.items():
            self.brokers.update(
                broker_id,
                reg.broker_epoch,
                fenced=reg.fenced,
                in_controlled_shutdown=reg.in_controlled_shutdown,
            )

    def _typed_configs(self, raw: Mapping[str, str]) -> dict[str, Any]:
        return resolve_topic_config(raw, self.config.topic_defaults)

    def _replica_config(self, configs: Mapping[str, Any]) -> ReplicaConfig:
        return ReplicaConfig(
            min_insync_replicas=int(configs["min.insync.replicas"]),
            replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
            replica_fetch_backoff_ms=self.config.replica_fetch_backoff_ms,
            max_pending_produces=self.config.max_pending_produces,
        )

    # -- the log dir --------------------------------------------------------------------

    def storage_failed(self, err: BaseException, operation: str) -> tuple[bool, list[Output]]:
        """The shell's own storage work (log creation, checkpoints, retention, flushes) failed
        with `err`: (True, outputs) when it is a log-dir failure, which takes the dir offline."""
        out: list[Output] = []
        return self._storage_failed(err, operation, out) is not None, out

    def _storage_failed(self, err: BaseException, operation: str, out: list[Output]) -> str | None:
        """Take the dir offline on a log-dir failure (Kafka: any I/O error of a log dir,
        whatever the operation: retrying on a failing disk would keep this broker leading
        while its followers could serve). The KAFKA_STORAGE_ERROR message when `err` was
        one, else None."""
        if not is_log_dir_failure(err):
            return None
        if self.offline is None:
            message = f"the broker's log dir {self.config.log_dir} is offline ({operation}: {err})"
            self.offline = message
            out.append(
                LogDirFailed(operation, err, message, len(self._hosted), self.led_partitions())
            )
            for tp, hosted in self._hosted.items():
                out.append(StopFollowing(tp, "log dir offline"))
                hosted.pending_fetch = None
                effects = hosted.core.abort_produces(ErrorCode.KAFKA_STORAGE_ERROR, message)[1]
                self._interpret(hosted, effects, out)
                out.append(WakeFetches(tp))  # parked long polls answer now, with the error
        return self.offline

    def _offline_error(self) -> tuple[ErrorCode, str] | None:
        if self.offline is None:
            return None
        return ErrorCode.KAFKA_STORAGE_ERROR, self.offline

    # -- the effect interpreter ---------------------------------------------------------

    def _interpret(
        self, hosted: HostedReplica[S], effects: Iterable[Effect], out: list[Output]
    ) -> None:
        """Carry out a core's effects in order: storage now, the rest as outputs. The effects
        a storage fact returns run before the remaining ones (depth first), as the core's
        contract asks. The one effect interpreter of the product and the simulation."""
        core, log, tp = hosted.core, hosted.log, hosted.tp
        for effect in effects:
            if isinstance(effect, AssignEpoch):
                log.maybe_assign_epoch_start_offset(effect.leader_epoch, effect.start_offset)
            elif isinstance(effect, HighWatermarkChanged):
                out.append(HighWatermarkMoved(tp, effect.high_watermark))
            elif isinstance(effect, CompleteProduce):
                out.append(effect)
            elif isinstance(effect, AppendAsFollower):
                try:
                    info = log.append_as_follower(effect.records)
                except MiniBrokerError as err:
                    # The log is unchanged and the core's LEO did not move; the fetch fails so
                    # the follower backs off (or, on a disk failure, stops with the dir).
                    self._storage_failed(err, f"follower append to {tp}", out)
                    raise FollowerAppendError(str(err)) from err
                out.append(
                    Appended(
                        tp,
                        False,
                        effect.base_offset,
                        log.leo,
                        core.leader_epoch,
                        0,
                        len(effect.records),
                    )
                )
                self._interpret(hosted, core.on_follower_appended(log.leo, info.batches)[1], out)
            elif isinstance(effect, TruncateTo | TruncateFullyAndStartAt):
                self._truncate(hosted, effect, out)
            elif isinstance(effect, AdvanceLogStartOffset):
                log.maybe_increment_log_start_offset(effect.offset)
            elif isinstance(effect, ProposeIsr):
                out.append(SendAlterPartition(tp, hosted.topic_id, hosted.generation, effect))
            elif isinstance(effect, IsrUpdated):
                out.append(IsrChanged(tp, effect, core.leader_epoch, core.high_watermark))
                out.append(WakeFetches(tp))
            elif isinstance(effect, StartFetching):
                out.append(StartFollowing(tp, effect.leader_id))
            elif isinstance(effect, StopFetching):
                out.append(StopFollowing(tp, effect.reason))
            elif isinstance(effect, Backoff):
                out.append(FetchBackoff(tp, effect.delay_ms, effect.reason))
            else:  # pragma: no cover - a new effect type without a handler is a bug
                raise TypeError(f"unhandled effect {effect!r}")

    def _truncate(
        self,
        hosted: HostedReplica[S],
        effect: TruncateTo | TruncateFullyAndStartAt,
        out: list[Output],
    ) -> None:
        core, log, tp = hosted.core, hosted.log, hosted.tp
        old_leo = log.leo
        fully = isinstance(effect, TruncateFullyAndStartAt)
        try:
            if fully:
                log.truncate_fully_and_start_at(effect.offset)
            else:
                log.truncate_to(effect.offset)
        except MiniBrokerError as err:
            # The storage stopped part way: the log is a whole-batch prefix of what it was. The
            # core learns where it really ends, and the fetch fails like a failed append, so the
            # follower backs off and the leader's divergence check asks for the rest next time.
            self._interpret(hosted, core.on_log_truncated(log.leo, log.log_start_offset)[1], out)
            self._storage_failed(err, f"truncation of {tp}", out)
            raise FollowerAppendError(f"truncation failed: {err}") from err
        out.append(Truncated(tp, fully, old_leo, log.leo, effect.reason, core.leader_epoch))
        self._interpret(hosted, core.on_log_truncated(log.leo, log.log_start_offset)[1], out)

    # -- produce ------------------------------------------------------------------------

    def produce(
        self, tp: TopicPartition, acks: int, records: bytes, now_ms: int, deadline_ms: int
    ) -> tuple[ProduceReply, list[Output]]:
        """Append a produce request's records for `tp` as the leader (Kafka's
        `appendRecordsToLeader`): check the batches and records, plan, append, and for acks=all
        park the produce until the HW passes it (reply.token)."""
        reply = ProduceReply()
        out: list[Output] = []
        if acks not in (-1, 0, 1):
            reply.error = ErrorCode.INVALID_REQUIRED_ACKS
            reply.message = f"acks must be 0, 1 or -1 (all), got {acks}"
            return reply, out
        offline = self._offline_error()
        if offline is not None:
            reply.error, reply.message = offline
            return reply, out
        hosted = self._hosted.get(tp)
        if hosted is None:
            known = self.image.topic(tp.topic)
            if known is None or tp.partition not in known.partitions:
                reply.error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                reply.message = f"{tp} does not exist"
            else:
                reply.error = ErrorCode.NOT_LEADER_OR_FOLLOWER
                reply.message = f"broker {self.broker_id} does not host {tp}"
                record = known.partitions[tp.partition]
                reply.leader = (record.leader, record.leader_epoch)
            return reply, out
        core = hosted.core
        if core.role is not Role.LEADER:
            reply.error = ErrorCode.NOT_LEADER_OR_FOLLOWER
            reply.message = f"broker {self.broker_id} is not the leader of {tp}"
            reply.leader = (core.leader_id, core.leader_epoch)
            return reply, out
        appended, effects = hosted.append_produce(
            reply, acks, records, now_ms, deadline_ms, self._new_token, out
        )
        self._interpret(hosted, effects, out)
        if appended:
            out.append(WakeFollowerFetches(tp))  # wake followers' long polls
        return reply, out

    def _new_token(self) -> int:
        self._next_token += 1
        return self._next_token

    def expire_produce(self, tp: TopicPartition, token: int) -> list[Output]:
        """The request's timeout_ms ran out before the acks=all produce under `token` was
        answered: the core answers it REQUEST_TIMED_OUT (nothing when it was answered already,
        e.g. with its replica removed)."""
        out: list[Output] = []
        hosted = self._hosted.get(tp)
        if hosted is not None:
            self._interpret(hosted, hosted.core.expire_produce(token)[1], out)
        return out

    def shutdown(self, reason: str = "broker shutting down") -> list[Output]:
        """The broker stops: every parked produce is answered NOT_LEADER_OR_FOLLOWER."""
        out: list[Output] = []
        for hosted in self._hosted.values():
            effects = hosted.core.abort_produces(ErrorCode.NOT_LEADER_OR_FOLLOWER, reason)[1]
            self._interpret(hosted, effects, out)
        return out

    # -- fetch (leader side) ------------------------------------------------------------

    def _not_hosted(self, tp: TopicPartition) -> tuple[ErrorCode, tuple[int, int] | None]:
        """The error for a partition not hosted here: it does not exist at all, or lives on
        other brokers (with its leader, when the image knows it)."""
        known = self.image.topic(tp.topic)
        if known is None or tp.partition not in known.partitions:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None
        record = known.partitions[tp.partition]
        return ErrorCode.NOT_LEADER_OR_FOLLOWER, (record.leader, record.leader_epoch)

    def follower_fetch(
        self, tp: TopicPartition, fetch: FollowerFetch, max_bytes: int, now_ms: int
    ) -> tuple[FetchReply, list[Output]]:
        """A follower's fetch of `tp` (leader side): the core's checks and state update, then
        the records up to the LEO taken before the read."""
        reply = FetchReply()
        out: list[Output] = []
        hosted = self._serving(tp, reply)
        if hosted is None:
            return reply, out
        core = hosted.core
        answer, effects = core.handle_follower_fetch(fetch, now_ms)
        self._interpret(hosted, effects, out)
        reply.error, reply.message = answer.error, answer.message
        reply.high_watermark = answer.high_watermark
        reply.log_start_offset = answer.log_start_offset
        reply.log_end_offset = answer.log_end_offset
        reply.diverging_epoch = answer.diverging_epoch
        reply.current_leader = (core.leader_id, core.leader_epoch)
        readable = answer.error == ErrorCode.NONE and answer.diverging_epoch is None
        if readable and answer.read_until_offset > answer.fetch_offset:
            hosted.read(reply, answer.fetch_offset, max_bytes, answer.read_until_offset, out)
        return reply, out

    def consumer_fetch(
        self,
        tp: TopicPartition,
        current_leader_epoch: int,
        fetch_offset: int,
        max_bytes: int,
        rack_id: str = "",
    ) -> tuple[FetchReply, list[Output]]:
        """A consumer's fetch of `tp`: from the leader, or an in-sync follower in the client's
        rack (KIP-392), up to the HW; the leader may point a client in another rack at a
        follower there (`preferred_read_replica`)."""
        reply = FetchReply()
        out: list[Output] = []
        hosted = self._serving(tp, reply)
        if hosted is None:
            return reply, out
        core = hosted.core
        allow_follower = bool(rack_id) and self._serves_rack(rack_id)
        answer, _ = core.check_consumer_fetch(
            current_leader_epoch, fetch_offset, allow_follower=allow_follower
        )
        reply.error, reply.message = answer.error, answer.message
        reply.high_watermark = answer.high_watermark
        reply.log_start_offset = answer.log_start_offset
        reply.log_end_offset = answer.log_end_offset
        reply.current_leader = (core.leader_id, core.leader_epoch)
        if answer.error != ErrorCode.NONE:
            return reply, out
        if core.is_leader and rack_id:
            preferred = self._preferred_read_replica(core, rack_id, fetch_offset)
            if preferred is not None:
                reply.preferred_read_replica = preferred
                return reply, out
        if answer.read_until_offset > fetch_offset:
            hosted.read(reply, fetch_offset, max_bytes, answer.read_until_offset, out)
        return reply, out

    def fetch_max_bytes(self, requested: int) -> int:
        """A partition's fetch size: the request's, or replica.fetch.max.bytes when unset."""
        return requested if requested > 0 else self.config.replica_fetch_max_bytes

    def _serving(self, tp: TopicPartition, reply: FetchReply) -> HostedReplica[S] | None:
        offline = self._offline_error()
        if offline is not None:
            reply.error, reply.message = offline
            return None
        hosted = self._hosted.get(tp)
        if hosted is None:
            reply.error, reply.current_leader = self._not_hosted(tp)
        return hosted

    def _serves_rack(self, rack: str) -> bool:
        return (
            self.config.rack_aware_selector and bool(self.config.rack) and self.config.rack == rack
        )

    def _preferred_read_replica(
        self, core: PartitionReplica, rack: str, fetch_offset: int
    ) -> int | None:
        """KIP-392: an in-sync follower in the client's rack that holds the offset."""
        if not self.config.rack_aware_selector:
            return None
        if self.config.rack == rack:
            return None  # the leader is in the client's rack already
        for replica_id in core.replicas:
            if replica_id == self.broker_id or replica_id not in core.isr:
                continue
            broker = self.image.brokers.get(replica_id)
            if broker is None or broker.rack != rack or not broker.is_active:
                continue
            if core.replica_leo(replica_id) >= fetch_offset:
                return replica_id
        return None

    # -- offsets --------------------------------------------------------------------------

    def list_offsets(
        self, tp: TopicPartition, current_leader_epoch: int, timestamp: int
    ) -> tuple[ListOffsetsReply, list[Output]]:
        reply = ListOffsetsReply()
        out: list[Output] = []
        offline = self._offline_error()
        if offline is not None:
            reply.error, reply.message = offline
            return reply, out
        hosted = self._hosted.get(tp)
        if hosted is None:
            reply.error = self._not_hosted(tp)[0]
            return reply, out
        answer, _ = hosted.core.list_offsets(current_leader_epoch, timestamp)
        reply.error, reply.message = answer.error, answer.message
        reply.leader_epoch = answer.leader_epoch
        if answer.error != ErrorCode.NONE:
            return reply, out
        if not answer.needs_timestamp_lookup:
            reply.offset = answer.offset
            return reply, out
        hosted.look_up_timestamp(reply, answer, timestamp, out)
        return reply, out

    def offset_for_leader_epoch(
        self, tp: TopicPartition, current_leader_epoch: int, leader_epoch: int
    ) -> tuple[EpochEndOffsetReply, list[Output]]:
        reply = EpochEndOffsetReply()
        offline = self._offline_error()
        if offline is not None:
            reply.error, reply.message = offline
            return reply, []
        hosted = self._hosted.get(tp)
        if hosted is None:
            reply.error = self._not_hosted(tp)[0]
            return reply, []
        answer, _ = hosted.core.offset_for_leader_epoch(current_leader_epoch, leader_epoch)
        reply.error, reply.message = answer.error, answer.message
        reply.leader_epoch, reply.end_offset = answer.leader_epoch, answer.end_offset
        return reply, []

    # -- follower side --------------------------------------------------------------------

    def next_fetch(self, tp: TopicPartition, leader_id: int, now_ms: int) -> FetchPosition | None:
        """What the follower of `tp` asks `leader_id` for now (None: nothing, e.g. backing off,
        another leader, or offline). Only the answer to this very position is applied."""
        hosted = self._hosted.get(tp)
        if hosted is None or self.offline is not None:
            return None
        position, _ = hosted.core.next_fetch(now_ms)
        if position is None or position.leader_id != leader_id:
            hosted.pending_fetch = None
            return None
        hosted.pending_fetch = position
        return position

    def pending_fetch(self, tp: TopicPartition) -> FetchPosition | None:
        hosted = self._hosted.get(tp)
        return None if hosted is None else hosted.pending_fetch

    def on_fetch_response(
        self,
        tp: TopicPartition,
        leader_id: int,
        position: FetchPosition,
        response: FetchResponse,
        now_ms: int,
    ) -> list[Output]:
        """The leader's answer to `position` (what `next_fetch` returned). A failed append or
        truncation is fed back to the core as a failed fetch, so the follower backs off."""
        out: list[Output] = []
        hosted = self._hosted.get(tp)
        if hosted is None or hosted.pending_fetch is not position or self.offline is not None:
            return out
        if position.leader_id != leader_id:
            return out
        hosted.pending_fetch = None
        try:
            self._interpret(
                hosted, hosted.core.on_fetch_response(position, response, now_ms)[1], out
            )
        except FollowerAppendError as err:
            out.append(FollowerAppendFailed(tp, leader_id, str(err)))
            failed = FetchResponse(error=ErrorCode.CORRUPT_MESSAGE)
            self._interpret(hosted, hosted.core.on_fetch_response(position, failed, now_ms)[1], out)
        return out

    # -- AlterPartition, ticks, retention -----------------------------------------------

    def on_alter_partition_result(
        self, tp: TopicPartition, generation: int, result: AlterPartitionResult, now_ms: int
    ) -> list[Output]:
        """The controller's answer to a SendAlterPartition (dropped when the replica it was
        sent for is gone)."""
        out: list[Output] = []
        hosted = self._hosted.get(tp)
        if hosted is None or hosted.generation != generation:
            return out
        self._interpret(hosted, hosted.core.on_alter_partition_result(result, now_ms)[1], out)
        return out

    def expire_produces(self, tp: TopicPartition, now_ms: int) -> list[Output]:
        """Answer the acks=all produces of `tp` past their deadline (REQUEST_TIMED_OUT)."""
        out: list[Output] = []
        hosted = self._hosted.get(tp)
        if hosted is not None and hosted.core.pending_produce_count:
            self._interpret(hosted, hosted.core.expire_produces(now_ms)[1], out)
        return out

    def maybe_shrink_isr(self, tp: TopicPartition, now_ms: int) -> list[Output]:
        """Propose dropping the followers of `tp` that lag (replica.lag.time.max.ms)."""
        out: list[Output] = []
        hosted = self._hosted.get(tp)
        if hosted is not None and hosted.core.is_leader:
            self._interpret(hosted, hosted.core.maybe_shrink_isr(now_ms)[1], out)
        return out

    def on_log_start_offset_advanced(self, tp: TopicPartition) -> list[Output]:
        """Retention deleted segments of `tp`: the core takes the log's new start offset."""
        out: list[Output] = []
        hosted = self._hosted.get(tp)
        if hosted is not None:
            effects = hosted.core.on_log_start_offset_advanced(hosted.log.log_start_offset)[1]
            self._interpret(hosted, effects, out)
        return out


# ------------------------------------------------------------------------------------------
# Where the engine meets the core's and storage's current shapes (one place each)


def _new_core(
    broker_id: int,
    log: Storage,
    brokers: BrokerEligibilityView,
    config: ReplicaConfig,
    high_watermark: int,
    name: str,
) -> PartitionReplica:
    return PartitionReplica(
        broker_id,
        log.epoch_cache,
        brokers,
        config,
        leo=log.leo,
        log_start_offset=log.log_start_offset,
        high_watermark=high_watermark,
        producer_batches=log.producer_batch_headers(),
        name=name,
    )


def _fetching_leader(core: PartitionReplica) -> int | None:
    follower = core.follower_state
    if core.role is not Role.FOLLOWER or follower is None or follower.failed:
        return None
    return follower.leader_id


def _follower_lag(core: PartitionReplica) -> int | None:
    follower = core.follower_state
    if core.role is not Role.FOLLOWER or follower is None:
        return None
    return follower.leader_high_watermark - core.leo


def _follower_progress(core: PartitionReplica) -> tuple[FollowerProgress, ...]:
    return tuple(
        FollowerProgress(r.replica_id, r.leo, r.last_caught_up_time_ms)
        for r in core.remote_replicas
    )
