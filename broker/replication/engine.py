"""The broker's replica engine: every hosted partition, the one effect interpreter, the decisions.

Pure and synchronous: no asyncio, no clock, no files but through the `Storage` (storage.py) each
partition is handed. `BrokerReplicas` owns the partitions this broker hosts (tp -> log,
`PartitionReplica` core, topic id, follower fetch in flight: a `HostedReplica`, hosted.py), the
broker-eligibility view the cores read, and THE one place a core's effects are carried out,
`_interpret`, in list order: storage first, then what the I/O shell must do. The engine's jobs
live in one room each:

  * here: acting on the controller's partition records (host, remove, reconfigure, change role),
    the log dir going offline, the interpreter, the follower side (its fetch positions and the
    answers to them), AlterPartition answers and the ticks (produce expiry, ISR shrink, log
    start);
  * serving.py (`ReplicaServing`, a mixin): the requests answered from the hosted replicas,
    Produce, Fetch (KIP-392's preferred read replica included), ListOffsets,
    OffsetForLeaderEpoch;
  * views.py (`ReplicaViews`, a mixin): read-only views (describe, gauges, followed leaders);
  * hosted.py: the per-partition work that touches the log (a leader's append, reads,
    timestamp lookups); outputs.py: the config, replies and outputs.

Every entry point returns what only an I/O shell can do as a list of outputs (outputs.py), in
the order they must be done: answer a produce future by token, send AlterPartition, start or
stop a fetcher, wake long polls, log and count ISR changes and truncations, delete a removed
log, take the log dir offline. The broker's asyncio shell (broker/replicas/) and the simulation
(tests/sim) both drive this class, so the code the simulation checks is the code that runs.

A storage call that fails with a log-dir failure (Kafka's LogDirFailureChannel: any I/O error
of the dir) takes the whole dir offline here: from then on every partition answers
KAFKA_STORAGE_ERROR, fetching stops, parked produces are answered, and `LogDirFailed` tells the
shell to report it.

Concurrency contract: single-threaded; per partition, nothing may run between a core's
`plan_append` and `on_leader_appended` (serving.py's `produce` calls both).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

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
    HighWatermarkChanged,
    IsrUpdated,
    LeaderRecoveryState,
    PartitionState,
    ProposeIsr,
    ReplicaConfig,
    StartFetching,
    StopFetching,
    TruncateFullyAndStartAt,
    TruncateTo,
)
from minibroker.broker.replication.hosted import FollowerAppendError, HostedReplica
from minibroker.broker.replication.outputs import (
    Appended,
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
)
from minibroker.broker.replication.partition import PartitionReplica
from minibroker.broker.replication.quota import RateQuota, follower_throttles
from minibroker.broker.replication.serving import ReplicaServing
from minibroker.broker.replication.storage import Storage
from minibroker.broker.replication.views import ReplicaViews
from minibroker.broker.storage.errors import is_log_dir_failure
from minibroker.client.errors import ErrorCode, MiniBrokerError
from minibroker.client.records import RecordValidation
from minibroker.client.replication_throttle import (
    FOLLOWER_THROTTLED_REPLICAS,
    LEADER_THROTTLED_REPLICAS,
    parse_throttled_replicas,
    throttle_rates,
)
from minibroker.client.topic_config import (
    CLEANUP_POLICY_COMPACT,
    cleanup_policies,
    resolve_topic_config,
)
from minibroker.client.types import TopicPartition
from minibroker.metadata.delta import EVERYTHING, MetadataDelta
from minibroker.metadata.image import MetadataImage, TopicImage
from minibroker.metadata.records import PartitionRecord

S = TypeVar("S", bound=Storage)


class BrokerReplicas(ReplicaServing[S], ReplicaViews[S]):
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
        self._next_token = 0  # the last acks=all produce token (serving.py's `produce`)
        # Partitions that may have acks=all produces parked (a superset: emptied lazily), so a
        # broker with thousands of idle partitions does not look at each one every tick.
        self._produces_waiting: set[TopicPartition] = set()
        self._next_generation = 0
        # The KAFKA_STORAGE_ERROR message once the dir is offline; never cleared (a failed dir
        # comes back only with a new broker process).
        self.offline: str | None = None
        # KIP-73 replication quotas, their rates from this broker's dynamic configs (synced on
        # every metadata batch): what this leader sends to, and this follower fetches for,
        # throttled replicas (quota.py).
        self.leader_quota = RateQuota()
        self.follower_quota = RateQuota()

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
            self._replica_config(configs, log),
            high_watermark,
            str(tp),
        )
        self._next_generation += 1
        hosted = HostedReplica(tp, topic_id, log, core, self._next_generation, self._storage_failed)
        hosted.topic_configs = None if topic_configs is None else dict(topic_configs)
        hosted.record_validation = RecordValidation.from_topic_config(configs)
        _set_throttled(hosted, configs)
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
        self, now_ms: int, delta: MetadataDelta = EVERYTHING
    ) -> tuple[list[tuple[TopicImage, PartitionRecord]], list[Output]]:
        """Act on the image as the shell last applied it: registrations, deleted topics, then
        every partition record naming this broker (or a hosted one) that `delta` says the
        last batch touched (all of them by default, and after a snapshot).

        Returns the records that need a new log (a replica here with no log of that topic id):
        any old log of that name is removed already; the shell creates the logs, `host`s
        them and calls `act_on_partition` for each. Once offline, nothing is acted on.
        """
        out: list[Output] = []
        self._sync_brokers()
        self._sync_throttle_rates()
        if self.offline is not None:
            return [], out
        # Topics that disappeared since the last act: stop and delete their replicas here.
        for topic_id, name in self._known_topics.items():
            if topic_id not in self.image.topics_by_id:
                for tp in [tp for tp, h in self._hosted.items() if h.topic_id == topic_id]:
                    out += self.remove(tp, delete=True, reason=f"topic {name} deleted")
        self._known_topics = {tid: t.name for tid, t in self.image.topics_by_id.items()}
        new: list[tuple[TopicImage, PartitionRecord]] = []
        touched = self.image.partitions() if delta.everything else self._touched(delta)
        for topic, record in touched:
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

    def touched_partitions(self, delta: MetadataDelta) -> list[TopicPartition]:
        """The partitions `delta` names (every partition of the image when it says everything)."""
        touched = self.image.partitions() if delta.everything else self._touched(delta)
        return [TopicPartition(topic.name, record.partition) for topic, record in touched]

    def _touched(self, delta: MetadataDelta) -> list[tuple[TopicImage, PartitionRecord]]:
        """The image's records of the partitions `delta` names, in `image.partitions()` order."""
        topics = self.image.topics_by_id
        out: dict[tuple[str, int], tuple[TopicImage, PartitionRecord]] = {}
        for topic_id in delta.topics:
            topic = topics.get(topic_id)
            if topic is not None:
                for index, record in topic.partitions.items():
                    out[(topic.name, index)] = (topic, record)
        for topic_id, index in delta.partitions:
            topic = topics.get(topic_id)
            found = topic.partitions.get(index) if topic is not None else None
            if topic is not None and found is not None:
                out[(topic.name, index)] = (topic, found)
        return [out[key] for key in sorted(out)]

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
        hosted.replication_factor = len(record.target_replicas)
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
            hosted,
            hosted.core.update_config(
                self._replica_config(configs, hosted.log, hosted.core.config), now_ms
            )[1],
            out,
        )
        hosted.topic_configs = dict(raw)
        hosted.record_validation = RecordValidation.from_topic_config(configs)
        _set_throttled(hosted, configs)

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

    def _sync_throttle_rates(self) -> None:
        """The KIP-73 rates in force here: this broker's dynamic configs over the default."""
        leader_rate, follower_rate = throttle_rates(self.image.broker_config(self.broker_id))
        self.leader_quota.set_limit(leader_rate)
        self.follower_quota.set_limit(follower_rate)

    def follower_throttled(self, tp: TopicPartition) -> bool:
        """This broker's fetch of `tp` is throttled (KIP-73: it is named in the topic's
        follower.replication.throttled.replicas, is not in the ISR, and a rate is set)."""
        hosted = self._hosted.get(tp)
        if hosted is None or self.follower_quota.unlimited:
            return False
        core = hosted.core
        return follower_throttles(hosted.follower_throttled, tp.partition, self.broker_id, core.isr)

    def _typed_configs(self, raw: Mapping[str, str]) -> dict[str, Any]:
        return resolve_topic_config(raw, self.config.topic_defaults)

    def _replica_config(
        self, configs: Mapping[str, Any], log: S, previous: ReplicaConfig | None = None
    ) -> ReplicaConfig:
        """The core's settings; a follower may append past an offset gap of its leader's log
        when the topic is compacted or its own log may have gaps already, and once allowed it
        stays so (a topic compacted before keeps the gaps its leader's cleaner made: altered
        to delete, its log gets the marker, PartitionLog.update_config)."""
        return ReplicaConfig(
            min_insync_replicas=int(configs["min.insync.replicas"]),
            replica_lag_time_max_ms=self.config.replica_lag_time_max_ms,
            replica_fetch_backoff_ms=self.config.replica_fetch_backoff_ms,
            max_pending_produces=self.config.max_pending_produces,
            offset_gaps_allowed=(
                CLEANUP_POLICY_COMPACT in cleanup_policies(str(configs["cleanup.policy"]))
                or log.may_have_gaps
                or (previous is not None and previous.offset_gaps_allowed)
            ),
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

    # -- the effect interpreter ---------------------------------------------------------

    def _interpret(
        self, hosted: HostedReplica[S], effects: Iterable[Effect], out: list[Output]
    ) -> None:
        """Carry out a core's effects in order: storage now, the rest as outputs. The effects
        a storage fact returns run before the remaining ones (depth first), as the core's
        contract asks. The one effect interpreter of the product and the simulation."""
        core, log, tp = hosted.core, hosted.log, hosted.tp
        effects = list(effects)
        for i, effect in enumerate(effects):
            try:
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
                    appended = core.on_follower_appended(log.leo, info.batches)[1]
                    self._interpret(hosted, appended, out)
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
            except BaseException:
                # The core handed the produces it completes over in these effects and holds
                # them no longer: when an earlier effect fails (a disk error), they are
                # still answered, as the core decided, before the error goes on.
                out.extend(e for e in effects[i + 1 :] if isinstance(e, CompleteProduce))
                raise

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
        if response.records and self.follower_throttled(tp):
            self.follower_quota.record(len(response.records), now_ms)
        try:
            self._interpret(
                hosted, hosted.core.on_fetch_response(position, response, now_ms)[1], out
            )
        except FollowerAppendError as err:
            out.append(FollowerAppendFailed(tp, leader_id, str(err)))
            failed = FetchResponse(error=ErrorCode.CORRUPT_MESSAGE)
            self._interpret(hosted, hosted.core.on_fetch_response(position, failed, now_ms)[1], out)
        return out

    # -- AlterPartition, produce expiry, ticks, retention, shutdown -----------------------

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

    def expire_produce(self, tp: TopicPartition, token: int) -> list[Output]:
        """The request's timeout_ms ran out before the acks=all produce under `token` was
        answered: the core answers it REQUEST_TIMED_OUT (nothing when it was answered already,
        e.g. with its replica removed)."""
        out: list[Output] = []
        hosted = self._hosted.get(tp)
        if hosted is not None:
            self._interpret(hosted, hosted.core.expire_produce(token)[1], out)
        return out

    def produces_waiting(self) -> list[TopicPartition]:
        """The partitions with acks=all produces parked now (`expire_produces` needs no other)."""
        hosted = self._hosted
        waiting = self._produces_waiting
        for tp in list(waiting):
            entry = hosted.get(tp)
            if entry is None or not entry.core.pending_produce_count:
                waiting.discard(tp)
        return list(waiting)

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

    def shutdown(self, reason: str = "broker shutting down") -> list[Output]:
        """The broker stops: every parked produce is answered NOT_LEADER_OR_FOLLOWER."""
        out: list[Output] = []
        for hosted in self._hosted.values():
            effects = hosted.core.abort_produces(ErrorCode.NOT_LEADER_OR_FOLLOWER, reason)[1]
            self._interpret(hosted, effects, out)
        return out


# ------------------------------------------------------------------------------------------
# Where the engine meets the core's and storage's current shapes (one place each)


def _set_throttled(hosted: HostedReplica[Any], configs: Mapping[str, Any]) -> None:
    hosted.leader_throttled = parse_throttled_replicas(str(configs[LEADER_THROTTLED_REPLICAS]))
    hosted.follower_throttled = parse_throttled_replicas(str(configs[FOLLOWER_THROTTLED_REPLICAS]))


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
