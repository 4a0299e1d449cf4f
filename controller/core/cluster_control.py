"""The broker commands of the controller (Kafka's ClusterControlManager and
BrokerHeartbeatManager): registration and unregistration, heartbeats and the fencing, unfencing
and controlled shutdown they drive, producer-id blocks, and the cluster description.

Pure. Rules and where they come from (docs/protocol.md): registration, heartbeats, fencing and
controlled shutdown §15, §16; what a registration may contain `registration.py`; a heartbeat
reporting the broker's log dir offline (Kafka's OfflineLogDirs, KIP-858) fences it at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from minibroker.client.errors import ErrorCode
from minibroker.client.types import NO_LEADER
from minibroker.controller.core.control_base import ControlBase
from minibroker.controller.core.election import build_partition_change, remove_from_isr
from minibroker.controller.core.liveness import BrokerSession
from minibroker.controller.core.messages import (
    BrokerDescription,
    ClusterDescription,
    HeartbeatReply,
    HeartbeatRequest,
    Outcome,
    ProducerIdBlock,
    RegisterReply,
    RegisterRequest,
    UnregisterBrokerReply,
)
from minibroker.controller.core.registration import invalid_cluster_id, invalid_registration
from minibroker.metadata.records import (
    BrokerRegistrationChangeRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    UnregisterBrokerRecord,
)

# A heartbeat's offline-log-dir report (Kafka's OfflineLogDirs): one dir per broker, a path.
MAX_OFFLINE_LOG_DIRS = 1
MAX_LOG_DIR_PATH_BYTES = 4096


class ClusterControl(ControlBase):
    """Broker membership and liveness commands."""

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
        self.fenced_since.setdefault(broker_id, now_ms)

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
        self.fenced_since.pop(broker_id, None)
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
                kafka_host=req.kafka_host,
                kafka_port=req.kafka_port,
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
        replicas: Counter[int] = Counter()
        leaders: Counter[int] = Counter()
        for _, p in self.image.partitions():
            replicas.update(p.replicas)
            leaders[p.leader] += 1
        brokers = []
        for broker_id in sorted(self.image.brokers):
            session = self.liveness.get(broker_id)
            ago = (
                now_ms - session.last_contact_ms
                if session is not None and session.heard_since_start
                else -1
            )
            brokers.append(
                BrokerDescription(
                    self.image.brokers[broker_id],
                    ago,
                    decommissioning=broker_id in self.image.decommissioning,
                    replica_count=replicas[broker_id],
                    leader_count=leaders[broker_id],
                )
            )
        return ClusterDescription(
            self.cluster_id, self.settings.node_id, self.image.next_offset, tuple(brokers)
        )


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
