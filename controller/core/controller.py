"""ControllerCore: the whole control plane as one sans-I/O state machine (docs/design.md §2, §6).

Pure: no I/O, no clock, no randomness of its own (`now_ms` comes in with every command, a
random source for topic ids at construction). The state is a `MetadataImage` plus broker
liveness. Every command returns an `Outcome`: the reply, the log entries written (already
applied to the image) and the events to log. The caller must make the entries durable before it
sends the reply (see `Outcome`). Single-threaded: one caller feeds commands one at a time.

The rules and where they come from (sections of docs/protocol.md):
- registration, heartbeats, fencing, controlled shutdown: §15, §16 (Kafka's
  ClusterControlManager, BrokerHeartbeatManager);
  what a registration may contain: `registration.py`; unregistration: Kafka's
  ReplicationControlManager.unregisterBroker;
- a heartbeat reporting the broker's log dir offline (Kafka's OfflineLogDirs, KIP-858) fences
  it at once, which moves its leaderships to in-sync replicas (`_log_dirs_offline`);
- elections and the epochs they bump: §17 (`election.py`);
- AlterPartition: §9 (`isr.py`);
- placement and topic validation: `placement.py`, `topics.py`;
- partition limits (KIP-578's max.partitions, max.broker.partitions): `partition_limits.py`;
- automatic preferred-leader rebalance: §19 (`rebalance.py`).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from minibroker.client.common.config import ConfigError
from minibroker.client.errors import ErrorCode
from minibroker.client.metadata.image import MetadataImage, TopicImage
from minibroker.client.metadata.records import (
    BrokerRegistrationChangeRecord,
    LogEntry,
    MetadataRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
)
from minibroker.client.topic_config import resolve_topic_config, validate_topic_configs
from minibroker.client.types import NO_LEADER
from minibroker.controller.core.election import (
    Election,
    PartitionChange,
    build_partition_change,
    check_partition_change,
    remove_from_isr,
)
from minibroker.controller.core.isr import isr_delta, validate_alter_partition
from minibroker.controller.core.liveness import BrokerSession, Liveness
from minibroker.controller.core.messages import (
    AlterPartitionReply,
    AlterPartitionRequest,
    AlterPartitionResult,
    BrokerDescription,
    ClusterDescription,
    CreatableTopic,
    CreateTopicResult,
    DeleteTopicResult,
    ElectionResult,
    Event,
    HeartbeatReply,
    HeartbeatRequest,
    Outcome,
    ProducerIdBlock,
    RegisterReply,
    RegisterRequest,
    UnregisterBrokerReply,
)
from minibroker.controller.core.partition_limits import (
    DEFAULT_MAX_BROKER_PARTITIONS,
    DEFAULT_MAX_PARTITIONS,
    PartitionLimits,
    assignment_problem,
    brokers_with_room,
    cluster_problem,
    hosted_replicas,
    replica_room_problem,
)
from minibroker.controller.core.placement import BrokerSlot, PlacementError, place_replicas
from minibroker.controller.core.rebalance import partitions_to_rebalance
from minibroker.controller.core.registration import invalid_cluster_id, invalid_registration
from minibroker.controller.core.topics import collision_key, invalid_topic_name

R = TypeVar("R")

# A heartbeat's offline-log-dir report (Kafka's OfflineLogDirs): one dir per broker, a path.
MAX_OFFLINE_LOG_DIRS = 1
MAX_LOG_DIR_PATH_BYTES = 4096


class RandomSource(Protocol):
    """What the core needs of `random.Random` (topic ids)."""

    def getrandbits(self, k: int, /) -> int: ...


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """The controller's rule parameters (controller/config.py maps Kafka's keys onto these)."""

    node_id: int = 1000
    session_timeout_ms: int = 3000
    num_partitions: int = 1
    default_replication_factor: int = 1
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_check_interval_ms: int = 30_000
    leader_imbalance_per_broker_percentage: int = 10
    producer_id_block_size: int = 1000
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    max_broker_partitions: int = DEFAULT_MAX_BROKER_PARTITIONS
    # Broker-level defaults for topic configs (typed), under the topic config names.
    topic_defaults: Mapping[str, Any] = field(default_factory=dict)


class ControllerCore:
    def __init__(
        self,
        settings: ControllerSettings,
        cluster_id: str,
        rng: RandomSource,
        now_ms: int,
        image: MetadataImage | None = None,
    ) -> None:
        self.settings = settings
        self.cluster_id = cluster_id
        self.image = image if image is not None else MetadataImage()
        self.liveness = Liveness(settings.session_timeout_ms)
        self._rng = rng
        # A restarted controller gives every known broker a fresh session (KAFKA-18138), so a
        # broker that died while the controller was down is still fenced by the timeout.
        for reg in self.image.brokers.values():
            self.liveness.start_session(reg.broker_id, reg.broker_epoch, now_ms)
        self.next_rebalance_ms = now_ms + settings.leader_imbalance_check_interval_ms
        self.partition_limits = PartitionLimits(
            settings.max_partitions, settings.max_broker_partitions
        )
        self._entries: list[LogEntry] = []
        self._events: list[Event] = []

    # -- plumbing -----------------------------------------------------------------------------

    def _append(self, record: MetadataRecord, now_ms: int) -> LogEntry:
        entry = LogEntry(self.image.next_offset, now_ms, record)
        self.image.apply(entry)
        self._entries.append(entry)
        return entry

    def _event(self, name: str, **fields: Any) -> None:
        self._events.append(Event(name, fields))

    def _done(self, reply: R) -> Outcome[R]:
        outcome = Outcome(reply, tuple(self._entries), tuple(self._events))
        self._entries = []
        self._events = []
        return outcome

    def take_pending(self) -> Outcome[None]:
        """The entries and events of a command that raised midway. They are already applied to
        the image, so the caller must still make them durable to keep log and image equal."""
        return self._done(None)

    def _acceptable(self, exclude: int | None = None) -> Callable[[int], bool]:
        def acceptable(broker_id: int) -> bool:
            return broker_id != exclude and self.image.is_active(broker_id)

        return acceptable

    def _unclean_enabled(self, topic: TopicImage) -> bool:
        effective = resolve_topic_config(topic.configs, self.settings.topic_defaults)
        return bool(effective["unclean.leader.election.enable"])

    def _online_election(self, topic: TopicImage) -> Election:
        return Election.UNCLEAN if self._unclean_enabled(topic) else Election.ONLINE

    def _apply_change(self, topic: TopicImage, change: PartitionChange, now_ms: int) -> None:
        old = topic.partitions[change.record.partition]
        new = change.record
        check_partition_change(old, new)
        self._append(new, now_ms)
        common = {
            "topic": topic.name,
            "partition": new.partition,
            "leader_epoch": new.leader_epoch,
            "partition_epoch": new.partition_epoch,
            "reason": new.reason,
        }
        if change.leader_changed:
            if new.leader == NO_LEADER:
                self._event("partition_offline", old_leader=old.leader, isr=list(new.isr), **common)
            else:
                self._event(
                    "unclean_leader_elected" if change.unclean else "leader_elected",
                    old_leader=old.leader,
                    new_leader=new.leader,
                    isr=list(new.isr),
                    **common,
                )
        added, removed = isr_delta(old.isr, new.isr)
        if removed:
            self._event(
                "isr_shrink",
                old_isr=list(old.isr),
                new_isr=list(new.isr),
                leader=new.leader,
                **common,
            )
        if added:
            self._event(
                "isr_expand",
                old_isr=list(old.isr),
                new_isr=list(new.isr),
                leader=new.leader,
                **common,
            )

    def _remove_broker(self, broker_id: int, now_ms: int, reason: str) -> None:
        """Take `broker_id` out of every ISR (never emptying one) and move its leaderships."""
        acceptable = self._acceptable(exclude=broker_id)
        for topic, p in list(self.image.partitions()):
            if broker_id not in p.isr and p.leader != broker_id:
                continue
            change = build_partition_change(
                p,
                acceptable=acceptable,
                election=self._online_election(topic),
                target_isr=remove_from_isr(p.isr, broker_id),
                reason=reason,
            )
            if change is not None:
                self._apply_change(topic, change, now_ms)

    def _elect_leaderless(self, broker_id: int, now_ms: int, reason: str) -> None:
        """After `broker_id` became acceptable: elect leaders where it can end an outage."""
        acceptable = self._acceptable()
        for topic, p in list(self.image.partitions()):
            if p.leader != NO_LEADER or broker_id not in p.replicas:
                continue
            change = build_partition_change(
                p, acceptable=acceptable, election=self._online_election(topic), reason=reason
            )
            if change is not None:
                self._apply_change(topic, change, now_ms)

    def _fence(self, broker_id: int, now_ms: int, reason: str) -> None:
        reg = self.image.brokers[broker_id]
        self._remove_broker(broker_id, now_ms, reason=f"broker {broker_id} fenced: {reason}")
        self._append(
            BrokerRegistrationChangeRecord(broker_id, reg.broker_epoch, fenced=True), now_ms
        )
        self._event(
            "broker_fenced", broker_id=broker_id, broker_epoch=reg.broker_epoch, reason=reason
        )

    def _unfence(self, broker_id: int, now_ms: int) -> None:
        reg = self.image.brokers[broker_id]
        self._append(
            BrokerRegistrationChangeRecord(
                broker_id,
                reg.broker_epoch,
                fenced=False,
                in_controlled_shutdown=False if reg.in_controlled_shutdown else None,
            ),
            now_ms,
        )
        self._event("broker_unfenced", broker_id=broker_id, broker_epoch=reg.broker_epoch)
        self._elect_leaderless(broker_id, now_ms, reason=f"broker {broker_id} unfenced")

    def _leads_any(self, broker_id: int) -> bool:
        return any(p.leader == broker_id for _, p in self.image.partitions())

    # -- brokers ------------------------------------------------------------------------------

    def register_broker(self, req: RegisterRequest, now_ms: int) -> Outcome[RegisterReply]:
        # A malformed cluster id is junk, not another cluster's: INVALID_REQUEST, and never
        # echoed back at length.
        problem = invalid_cluster_id(req.cluster_id)
        if problem is None and req.cluster_id and req.cluster_id != self.cluster_id:
            return self._done(
                RegisterReply(
                    ErrorCode.INCONSISTENT_CLUSTER_ID,
                    f"broker {req.broker_id} has cluster id {req.cluster_id!r} in its data dir "
                    f"but this controller's cluster id is {self.cluster_id!r}",
                )
            )
        problem = problem or invalid_registration(req)
        if problem is not None:
            return self._done(
                RegisterReply(ErrorCode.INVALID_REQUEST, f"broker registration refused: {problem}")
            )
        existing = self.image.brokers.get(req.broker_id)
        if existing is not None and existing.incarnation_id == req.incarnation_id:
            # The same process asking again (a lost reply): same epoch, nothing new to write.
            if self.liveness.get(req.broker_id) is None:
                self.liveness.start_session(req.broker_id, existing.broker_epoch, now_ms)
            return self._done(
                RegisterReply(ErrorCode.NONE, "", existing.broker_epoch, self.cluster_id)
            )
        if existing is not None and self.liveness.is_alive(req.broker_id, now_ms):
            return self._done(
                RegisterReply(
                    ErrorCode.DUPLICATE_BROKER_REGISTRATION,
                    f"broker {req.broker_id} is already registered by a live process "
                    f"(incarnation {existing.incarnation_id}); its session must end first",
                )
            )
        broker_epoch = self.image.next_offset
        self._append(
            RegisterBrokerRecord(
                broker_id=req.broker_id,
                incarnation_id=req.incarnation_id,
                broker_epoch=broker_epoch,
                host=req.host,
                port=req.port,
                rack=req.rack,
                fenced=True,
                metrics_port=req.metrics_port,
            ),
            now_ms,
        )
        self._event(
            "broker_registered",
            broker_id=req.broker_id,
            broker_epoch=broker_epoch,
            incarnation_id=req.incarnation_id,
            host=req.host,
            port=req.port,
            rack=req.rack,
            previous_broker_epoch=existing.broker_epoch if existing else -1,
        )
        if existing is not None:
            # Every new incarnation counts as an unclean restart (docs/protocol.md §15): its log
            # may have lost unflushed data, so it leaves every ISR and must catch up again.
            self._remove_broker(req.broker_id, now_ms, reason=f"broker {req.broker_id} restarted")
        self.liveness.start_session(req.broker_id, broker_epoch, now_ms)
        return self._done(RegisterReply(ErrorCode.NONE, "", broker_epoch, self.cluster_id))

    def unregister_broker(self, broker_id: int, now_ms: int) -> Outcome[UnregisterBrokerReply]:
        """Remove the registration of a broker that is gone for good (Kafka's UnregisterBroker).

        As in Kafka, the broker leaves every ISR (never emptying one) and an
        UnregisterBrokerRecord follows; replica lists keep naming it (offline replicas until
        the partitions are reassigned), and it leads nothing since it is fenced. Kafka also
        unregisters a live broker (which then registers again); here a broker that is unfenced
        or still heartbeating is refused, since it is evidently not gone.
        """
        reg = self.image.brokers.get(broker_id)
        if reg is None:
            return self._done(
                UnregisterBrokerReply(
                    ErrorCode.BROKER_ID_NOT_REGISTERED,
                    f"broker {broker_id} is not registered",
                )
            )
        heartbeating = self.liveness.is_alive(broker_id, now_ms)
        if not reg.fenced or heartbeating:
            detail = (
                f"it is heartbeating ({'fenced' if reg.fenced else 'unfenced'})"
                if heartbeating
                else "it stays unfenced until its session times out"
            )
            return self._done(
                UnregisterBrokerReply(
                    ErrorCode.INVALID_REQUEST,
                    f"broker {broker_id} is alive: {detail}; stop its process first (only a "
                    "broker that is gone for good can be unregistered)",
                )
            )
        self._remove_broker(broker_id, now_ms, reason=f"broker {broker_id} unregistered")
        self._append(UnregisterBrokerRecord(broker_id, reg.broker_epoch), now_ms)
        self.liveness.forget(broker_id)
        self._event("broker_unregistered", broker_id=broker_id, broker_epoch=reg.broker_epoch)
        return self._done(UnregisterBrokerReply(ErrorCode.NONE, ""))

    def heartbeat(
        self, req: HeartbeatRequest, stream_id: int, now_ms: int
    ) -> Outcome[HeartbeatReply]:
        """One heartbeat on stream `stream_id` (the state table of docs/protocol.md §16)."""
        reg = self.image.brokers.get(req.broker_id)
        if reg is None:
            return self._done(
                HeartbeatReply(
                    ErrorCode.BROKER_ID_NOT_REGISTERED, f"broker {req.broker_id} is not registered"
                )
            )
        if reg.broker_epoch != req.broker_epoch:
            return self._done(
                HeartbeatReply(
                    ErrorCode.STALE_BROKER_EPOCH,
                    f"broker {req.broker_id} epoch {req.broker_epoch} is stale "
                    f"(current {reg.broker_epoch})",
                )
            )
        problem = invalid_offline_log_dirs(req.offline_log_dirs)
        if problem is not None:
            return self._done(
                HeartbeatReply(ErrorCode.INVALID_REQUEST, f"broker {req.broker_id}: {problem}")
            )
        session = self.liveness.get(req.broker_id)
        if session is None or session.broker_epoch != reg.broker_epoch:
            session = self.liveness.start_session(req.broker_id, reg.broker_epoch, now_ms)
        self.liveness.touch(req.broker_id, stream_id, req.current_metadata_offset, now_ms)
        caught_up = req.current_metadata_offset >= reg.broker_epoch
        if req.offline_log_dirs and not session.offline_log_dirs:
            self._log_dirs_offline(req, session, now_ms)
            reg = self.image.brokers[req.broker_id]
        if reg.fenced:
            if req.want_shut_down:
                session.shutdown_granted = True
            elif not req.want_fence and caught_up and not session.offline_log_dirs:
                self._unfence(req.broker_id, now_ms)
        elif req.want_fence:
            self._fence(req.broker_id, now_ms, reason="broker asked to be fenced")
            session.shutdown_granted = req.want_shut_down
        elif req.want_shut_down:
            if not reg.in_controlled_shutdown:
                self._append(
                    BrokerRegistrationChangeRecord(
                        req.broker_id, reg.broker_epoch, in_controlled_shutdown=True
                    ),
                    now_ms,
                )
                self._event(
                    "broker_controlled_shutdown",
                    broker_id=req.broker_id,
                    broker_epoch=reg.broker_epoch,
                )
                self._remove_broker(
                    req.broker_id, now_ms, reason=f"broker {req.broker_id} controlled shutdown"
                )
                session.shutdown_offset = self.image.next_offset - 1
            elif session.shutdown_offset is None:
                # The registration says "in controlled shutdown" but this session never saw it
                # start: the controller restarted since (sessions are not durable). Its leader
                # moves are all in the log by now, so peers must reach the current end (Kafka
                # sets the offset on the first such heartbeat after a failover,
                # maybeUpdateControlledShutdownOffset). Without this it is never granted.
                session.shutdown_offset = self.image.next_offset - 1
            if self._may_shut_down(req.broker_id):
                if not session.shutdown_granted:
                    self._event("broker_shutdown_granted", broker_id=req.broker_id)
                session.shutdown_granted = True
        final = self.image.brokers[req.broker_id]
        return self._done(
            HeartbeatReply(
                ErrorCode.NONE,
                "",
                is_caught_up=caught_up,
                is_fenced=final.fenced,
                should_shut_down=session.shutdown_granted,
            )
        )

    def _log_dirs_offline(self, req: HeartbeatRequest, session: BrokerSession, now_ms: int) -> None:
        """The broker's log dir failed (Kafka's handleDirectoriesOffline): it can serve no
        replica, so fence it now rather than at the session timeout. Fencing takes it out of
        every ISR (never emptying one) and elects new leaders among the in-sync replicas left,
        so acknowledged acks=all writes, which every ISR member holds, stay readable.

        The report can only speak for the sender: it names no broker, and the caller checked
        that (broker id, broker epoch) is the current registration. Minibroker brokers have a
        single log dir, so any valid report means the broker's only dir.
        """
        session.offline_log_dirs = req.offline_log_dirs
        reg = self.image.brokers[req.broker_id]
        dirs = ", ".join(req.offline_log_dirs)
        self._event(
            "log_dir_offline",
            broker_id=req.broker_id,
            broker_epoch=reg.broker_epoch,
            log_dirs=list(req.offline_log_dirs),
        )
        if not reg.fenced:
            self._fence(req.broker_id, now_ms, reason=f"log dir {dirs} offline")

    def _may_shut_down(self, broker_id: int) -> bool:
        """A broker in controlled shutdown may exit once it leads nothing and every other
        active broker has seen the records that moved its leaderships (docs/protocol.md §16), so
        followers are already fetching from the new leaders when it goes."""
        session = self.liveness.get(broker_id)
        if session is None or session.shutdown_offset is None or self._leads_any(broker_id):
            return False
        for reg in self.image.brokers.values():
            if reg.broker_id == broker_id or not reg.is_active:
                continue
            peer = self.liveness.get(reg.broker_id)
            if peer is None or peer.metadata_offset < session.shutdown_offset:
                return False
        return True

    def heartbeat_stream_closed(
        self, broker_id: int, broker_epoch: int, stream_id: int, now_ms: int
    ) -> Outcome[None]:
        """A heartbeat stream ended. If it spoke for the current incarnation, the broker is
        gone: fence it at once (the fast path of docs/design.md §3.4) unless it may shut down."""
        if not self.liveness.close_stream(broker_id, broker_epoch, stream_id):
            return self._done(None)
        reg = self.image.brokers.get(broker_id)
        session = self.liveness.get(broker_id)
        if reg is None or reg.fenced or session is None:
            return self._done(None)
        reason = (
            "controlled shutdown complete"
            if session.shutdown_granted
            else "heartbeat stream closed"
        )
        self._fence(broker_id, now_ms, reason=reason)
        return self._done(None)

    def tick(self, now_ms: int) -> Outcome[None]:
        """Timers: the session timeout (one stale broker per tick, as Kafka) and the automatic
        preferred-leader rebalance."""
        unfenced = [b.broker_id for b in self.image.brokers.values() if not b.fenced]
        stale = self.liveness.oldest_expired(unfenced, now_ms)
        if stale is not None:
            session = self.liveness.get(stale)
            silent_ms = now_ms - session.last_contact_ms if session else -1
            self._fence(stale, now_ms, reason=f"session timed out after {silent_ms} ms")
        if self.settings.auto_leader_rebalance_enable and now_ms >= self.next_rebalance_ms:
            self.next_rebalance_ms = now_ms + self.settings.leader_imbalance_check_interval_ms
            self._rebalance(now_ms)
        return self._done(None)

    def _rebalance(self, now_ms: int) -> None:
        acceptable = self._acceptable()
        topics = {t.topic_id: t for t in self.image.topics_by_id.values()}
        parts = [p for _, p in self.image.partitions()]
        chosen = partitions_to_rebalance(
            parts, acceptable, self.settings.leader_imbalance_per_broker_percentage
        )
        for p in chosen:
            change = build_partition_change(
                p,
                acceptable=acceptable,
                election=Election.PREFERRED,
                reason="automatic preferred leader rebalance",
            )
            if change is not None:
                self._apply_change(topics[p.topic_id], change, now_ms)

    def allocate_producer_ids(
        self, broker_id: int, broker_epoch: int, now_ms: int
    ) -> Outcome[ProducerIdBlock]:
        reg = self.image.brokers.get(broker_id)
        if reg is None:
            return self._done(
                ProducerIdBlock(
                    ErrorCode.BROKER_ID_NOT_REGISTERED, f"broker {broker_id} is not registered"
                )
            )
        if reg.broker_epoch != broker_epoch:
            return self._done(
                ProducerIdBlock(
                    ErrorCode.STALE_BROKER_EPOCH,
                    f"broker {broker_id} epoch {broker_epoch} is stale "
                    f"(current {reg.broker_epoch})",
                )
            )
        start = self.image.next_producer_id
        size = self.settings.producer_id_block_size
        self._append(ProducerIdsRecord(broker_id, broker_epoch, start + size), now_ms)
        self._event("producer_ids_allocated", broker_id=broker_id, start=start, length=size)
        return self._done(ProducerIdBlock(ErrorCode.NONE, "", start, size))

    def describe_cluster(self, now_ms: int) -> ClusterDescription:
        brokers = []
        for broker_id in sorted(self.image.brokers):
            session = self.liveness.get(broker_id)
            ago = (
                now_ms - session.last_contact_ms
                if session is not None and session.heard_since_start
                else -1
            )
            brokers.append(BrokerDescription(self.image.brokers[broker_id], ago))
        return ClusterDescription(
            self.cluster_id, self.settings.node_id, self.image.next_offset, tuple(brokers)
        )

    # -- partitions ---------------------------------------------------------------------------

    def alter_partition(
        self, req: AlterPartitionRequest, now_ms: int
    ) -> Outcome[AlterPartitionReply]:
        reg = self.image.brokers.get(req.broker_id)
        top: tuple[ErrorCode, str] | None = None
        if reg is None:
            top = (ErrorCode.BROKER_ID_NOT_REGISTERED, f"broker {req.broker_id} is not registered")
        elif reg.broker_epoch != req.broker_epoch:
            top = (
                ErrorCode.STALE_BROKER_EPOCH,
                f"broker {req.broker_id} epoch {req.broker_epoch} is stale "
                f"(current {reg.broker_epoch})",
            )
        if top is not None:
            results = tuple(
                AlterPartitionResult(p.topic_id, p.partition, top[0], top[1]) for p in req.proposals
            )
            return self._done(AlterPartitionReply(top[0], top[1], results))
        out: list[AlterPartitionResult] = []
        for proposal in req.proposals:
            topic = self.image.topics_by_id.get(proposal.topic_id)
            current = topic.partitions.get(proposal.partition) if topic else None
            rejection = validate_alter_partition(
                req.broker_id, proposal, current, topic is not None, self.image.brokers
            )
            if rejection is not None or topic is None or current is None:
                code = rejection.code if rejection else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                message = rejection.message if rejection else "unknown partition"
                out.append(
                    AlterPartitionResult(proposal.topic_id, proposal.partition, code, message)
                )
                continue
            new_isr = tuple(m.broker_id for m in proposal.new_isr)
            if (
                set(new_isr) == set(current.isr)
                and proposal.leader_recovery_state == current.leader_recovery_state
            ):
                out.append(
                    AlterPartitionResult(
                        proposal.topic_id, proposal.partition, ErrorCode.NONE, "", current
                    )
                )
                continue
            change = build_partition_change(
                current,
                acceptable=self._acceptable(),
                election=Election.ONLINE,
                target_isr=new_isr,
                leader_recovery_state=proposal.leader_recovery_state,
                reason=f"AlterPartition from leader {req.broker_id}",
            )
            if change is not None:
                self._apply_change(topic, change, now_ms)
            committed = topic.partitions[proposal.partition]
            out.append(
                AlterPartitionResult(
                    proposal.topic_id, proposal.partition, ErrorCode.NONE, "", committed
                )
            )
        return self._done(AlterPartitionReply(ErrorCode.NONE, "", tuple(out)))

    def elect_leaders(
        self,
        election: Election,
        partitions: Sequence[tuple[str, int]] | None,
        now_ms: int,
    ) -> Outcome[tuple[ElectionResult, ...]]:
        """Manual PREFERRED or UNCLEAN election, per partition or (None) for every partition."""
        if election is Election.ONLINE:
            raise ValueError("manual elections are PREFERRED or UNCLEAN")
        targets: Iterable[tuple[str, int]]
        if partitions is None:
            targets = [(t.name, p.partition) for t, p in self.image.partitions()]
        else:
            targets = partitions
        results = [self._elect_one(election, name, index, now_ms) for name, index in targets]
        return self._done(tuple(results))

    def _elect_one(self, election: Election, name: str, index: int, now_ms: int) -> ElectionResult:
        topic = self.image.topic(name)
        current = topic.partitions.get(index) if topic else None
        if topic is None or current is None:
            return ElectionResult(
                name,
                index,
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"unknown partition {name}-{index}",
            )
        acceptable = self._acceptable()
        if election is Election.PREFERRED:
            preferred = current.preferred_leader
            if current.leader == preferred:
                return ElectionResult(
                    name,
                    index,
                    ErrorCode.ELECTION_NOT_NEEDED,
                    f"broker {preferred} already leads {name}-{index}",
                )
            if preferred not in current.isr or not acceptable(preferred):
                return ElectionResult(
                    name,
                    index,
                    ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                    f"preferred replica {preferred} of {name}-{index} is not "
                    + ("in the ISR" if preferred not in current.isr else "alive and unfenced"),
                )
            change = build_partition_change(
                current,
                acceptable=acceptable,
                election=Election.PREFERRED,
                reason="preferred leader election",
            )
        else:
            if current.leader != NO_LEADER:
                return ElectionResult(
                    name,
                    index,
                    ErrorCode.ELECTION_NOT_NEEDED,
                    f"{name}-{index} has a leader ({current.leader})",
                )
            change = build_partition_change(
                current,
                acceptable=acceptable,
                election=Election.UNCLEAN,
                reason="unclean leader election",
            )
            if change is None or change.record.leader == NO_LEADER:
                return ElectionResult(
                    name,
                    index,
                    ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
                    f"no replica of {name}-{index} is alive and unfenced",
                )
        if change is not None:
            self._apply_change(topic, change, now_ms)
        return ElectionResult(name, index, ErrorCode.NONE, "")

    # -- topics -------------------------------------------------------------------------------

    def create_topics(
        self, topics: Sequence[CreatableTopic], validate_only: bool, now_ms: int
    ) -> Outcome[tuple[CreateTopicResult, ...]]:
        """Create each valid topic atomically (its TopicRecord and every PartitionRecord go in
        this command's entries together); an invalid topic writes nothing."""
        counts: dict[str, int] = {}
        for t in topics:
            counts[t.name] = counts.get(t.name, 0) + 1
        # Replicas per broker, kept up to date as this request creates topics.
        hosted = hosted_replicas(
            p.replicas
            for topic in self.image.topics_by_id.values()
            for p in topic.partitions.values()
        )
        results = []
        for t in topics:
            if counts[t.name] > 1:
                results.append(
                    CreateTopicResult(
                        t.name,
                        ErrorCode.INVALID_REQUEST,
                        f"topic {t.name!r} appears more than once in the request",
                    )
                )
                continue
            results.append(self._create_one(t, validate_only, now_ms, hosted))
        return self._done(tuple(results))

    def _create_one(
        self, t: CreatableTopic, validate_only: bool, now_ms: int, hosted: Counter[int]
    ) -> CreateTopicResult:
        def fail(code: ErrorCode, message: str) -> CreateTopicResult:
            return CreateTopicResult(t.name, code, message)

        problem = invalid_topic_name(t.name)
        if problem:
            return fail(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        if self.image.topic(t.name) is not None:
            return fail(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {t.name!r} already exists")
        key = collision_key(t.name)
        clash = next((n for n in self.image.topic_ids_by_name if collision_key(n) == key), None)
        if clash is not None:
            return fail(
                ErrorCode.INVALID_TOPIC_EXCEPTION,
                f"topic {t.name!r} collides with existing topic {clash!r} ('.' and '_' "
                "map to the same metric names)",
            )
        num_partitions = (
            self.settings.num_partitions if t.num_partitions == -1 else t.num_partitions
        )
        if num_partitions < 1:
            return fail(
                ErrorCode.INVALID_PARTITIONS,
                f"number of partitions must be at least 1 (or -1 for the default), got "
                f"{t.num_partitions}",
            )
        rf = (
            self.settings.default_replication_factor
            if t.replication_factor == -1
            else t.replication_factor
        )
        if rf < 1:
            return fail(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor must be at least 1 (or -1 for the default), got "
                f"{t.replication_factor}",
            )
        usable = [
            BrokerSlot(b.broker_id, b.rack) for b in self.image.brokers.values() if b.is_active
        ]
        if rf > len(usable):
            return fail(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor {rf} is larger than the number of available (unfenced) "
                f"brokers: {len(usable)}",
            )
        try:
            validate_topic_configs(t.configs)
        except ConfigError as err:
            return fail(ErrorCode.INVALID_CONFIG, f"topic {t.name!r}: {err}")
        # Counted before any placement is built: a million partitions cost nothing to refuse.
        limits = self.partition_limits
        existing = self.image.partition_count()
        with_room = brokers_with_room(usable, hosted, limits)
        problem = cluster_problem(existing, num_partitions, limits) or replica_room_problem(
            num_partitions, rf, usable, with_room, hosted, limits
        )
        if problem:
            return fail(ErrorCode.POLICY_VIOLATION, f"topic {t.name!r}: {problem}")
        try:
            assignment = place_replicas(with_room, num_partitions, rf, existing)
        except PlacementError as err:
            return fail(ErrorCode.INVALID_REPLICATION_FACTOR, str(err))
        problem = assignment_problem(assignment, hosted, limits)
        if problem:
            return fail(ErrorCode.POLICY_VIOLATION, f"topic {t.name!r}: {problem}")
        effective = {
            k: _config_str(v)
            for k, v in resolve_topic_config(t.configs, self.settings.topic_defaults).items()
        }
        topic_id = (
            "" if validate_only else str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        )
        if not validate_only:
            hosted.update(hosted_replicas(assignment))
            self._append(TopicRecord(t.name, topic_id, dict(t.configs)), now_ms)
            for index, replicas in enumerate(assignment):
                record = PartitionRecord(
                    topic_id=topic_id,
                    partition=index,
                    replicas=replicas,
                    isr=replicas,
                    leader=replicas[0],
                    leader_epoch=0,
                    partition_epoch=0,
                    reason="topic created",
                )
                check_partition_change(None, record)
                self._append(record, now_ms)
            self._event(
                "topic_created",
                topic=t.name,
                topic_id=topic_id,
                num_partitions=num_partitions,
                replication_factor=rf,
                configs=dict(t.configs),
                assignment=[list(r) for r in assignment],
            )
        return CreateTopicResult(
            t.name, ErrorCode.NONE, "", topic_id, num_partitions, rf, effective
        )

    def delete_topics(
        self, names: Sequence[str], now_ms: int
    ) -> Outcome[tuple[DeleteTopicResult, ...]]:
        results = []
        for name in names:
            topic = self.image.topic(name)
            if topic is None:
                results.append(
                    DeleteTopicResult(
                        name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
                    )
                )
                continue
            self._append(RemoveTopicRecord(topic.topic_id), now_ms)
            self._event("topic_deleted", topic=name, topic_id=topic.topic_id)
            results.append(DeleteTopicResult(name, ErrorCode.NONE, "", topic.topic_id))
        return self._done(tuple(results))


def invalid_offline_log_dirs(dirs: Sequence[str]) -> str | None:
    """Why a heartbeat's offline-log-dir report is malformed, or None when it is fine.

    A broker has one log dir, so a report names at most one: a non-empty path of at most
    MAX_LOG_DIR_PATH_BYTES bytes (Linux's PATH_MAX).
    """
    if len(dirs) > MAX_OFFLINE_LOG_DIRS:
        return f"reports {len(dirs)} offline log dirs, but a broker has {MAX_OFFLINE_LOG_DIRS}"
    for path in dirs:
        if not path:
            return "reports an offline log dir with an empty path"
        size = len(path.encode())
        if size > MAX_LOG_DIR_PATH_BYTES:
            return (
                f"reports an offline log dir path of {size} bytes "
                f"(at most {MAX_LOG_DIR_PATH_BYTES})"
            )
    return None


def _config_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


__all__ = ["ControllerCore", "ControllerSettings", "RandomSource", "invalid_offline_log_dirs"]
