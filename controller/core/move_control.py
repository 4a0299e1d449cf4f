"""The controller commands that move replicas (Kafka's ReplicationControlManager reassignment
paths): AlterPartitionReassignments, ListPartitionReassignments, CreatePartitions, broker
decommissioning and failure decommissioning (rebuilding the replicas of a broker fenced too
long).

Pure. The record transitions are `reassignment.py`'s; where replicas go is
`minibroker.metadata.assignment_plan`'s. Rules and sources: docs/protocol.md "Reassignment
(KIP-455)".
"""

from __future__ import annotations

from collections.abc import Sequence

from minibroker.client.errors import ErrorCode
from minibroker.client.types import NO_LEADER
from minibroker.controller.core.control_base import ControlBase
from minibroker.controller.core.election import (
    Election,
    PartitionChange,
    build_partition_change,
    check_partition_change,
)
from minibroker.controller.core.isr import Rejection
from minibroker.controller.core.messages import (
    CreatePartitionsResult,
    CreatePartitionsTopic,
    DecommissionReply,
    OngoingReassignment,
    Outcome,
    ReassignmentResult,
    ReassignmentTarget,
)
from minibroker.controller.core.partition_limits import (
    assignment_problem,
    brokers_with_room,
    cluster_problem,
    hosted_replicas,
    replica_room_problem,
)
from minibroker.controller.core.reassignment import (
    cancel_reassignment,
    start_reassignment,
    validate_target,
)
from minibroker.metadata.assignment_plan import plan_replacements
from minibroker.metadata.image import TopicImage
from minibroker.metadata.placement import BrokerSlot, PlacementError, place_replicas
from minibroker.metadata.records import BrokerDecommissionRecord, PartitionRecord

# The group coordinator's topic (broker/groups/coordinator.py OFFSETS_TOPIC).
OFFSETS_TOPIC = "__consumer_offsets"


class MoveControl(ControlBase):
    """Reassignment, partition creation and decommissioning commands."""

    # -- reassignment -------------------------------------------------------------------------

    def alter_partition_reassignments(
        self, targets: Sequence[ReassignmentTarget], now_ms: int
    ) -> Outcome[tuple[ReassignmentResult, ...]]:
        """Start (replicas given) or cancel (None) one reassignment per target; a refused one
        changes nothing."""
        results = []
        for t in targets:
            rejection = self._reassign_one(t, now_ms, reason="")
            code, message = (
                (rejection.code, rejection.message) if rejection else (ErrorCode.NONE, "")
            )
            results.append(ReassignmentResult(t.topic, t.partition, code, message))
        return self._done(tuple(results))

    def _reassign_one(self, t: ReassignmentTarget, now_ms: int, reason: str) -> Rejection | None:
        topic = self.image.topic(t.topic)
        current = topic.partitions.get(t.partition) if topic else None
        if topic is None or current is None:
            return Rejection(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown partition {t.topic}-{t.partition}"
            )
        if t.replicas is None:
            reverted = cancel_reassignment(
                current, self._acceptable(), self._unclean_enabled(topic)
            )
            if isinstance(reverted, Rejection):
                return _named(reverted, current, topic)
            self._write(topic, current, reverted, now_ms)
            self._event(
                "reassignment_cancelled",
                topic=topic.name,
                partition=t.partition,
                replicas=list(reverted.replicas),
                dropped=list(current.adding_replicas),
                leader=reverted.leader,
            )
            return None
        problem = validate_target(
            current,
            t.replicas,
            registered=self.image.brokers.keys(),
            decommissioning=self.image.decommissioning,
            min_isr=self._min_isr(topic),
        )
        if problem is not None:
            return _named(problem, current, topic)
        self._start(topic, current, t.replicas, now_ms, reason)
        return None

    def _start(
        self,
        topic: TopicImage,
        current: PartitionRecord,
        target: Sequence[int],
        now_ms: int,
        reason: str,
    ) -> bool:
        """Write the record that starts (and maybe at once completes) a reassignment; False
        when there was nothing to do."""
        new = start_reassignment(current, target, self._acceptable(), reason)
        if new is None:
            return False
        self._write(topic, current, new, now_ms)
        self._event(
            "reassignment_started",
            topic=topic.name,
            partition=current.partition,
            target=list(target),
            original=list(current.replicas),
            replicas=list(new.replicas),
            adding=list(new.adding_replicas),
            removing=list(new.removing_replicas),
            reason=new.reason,
        )
        if not new.is_reassigning:
            self._event(
                "reassignment_completed",
                topic=topic.name,
                partition=current.partition,
                replicas=list(new.replicas),
                removed=[b for b in current.replicas if b not in new.replicas],
                added=[b for b in new.replicas if b not in current.replicas],
                leader=new.leader,
                leader_moved=new.leader != current.leader,
                partition_epoch=new.partition_epoch,
            )
        return True

    def _write(
        self, topic: TopicImage, current: PartitionRecord, new: PartitionRecord, now_ms: int
    ) -> None:
        changed = new.leader != current.leader
        unclean = changed and new.leader != NO_LEADER and new.leader not in current.isr
        self._apply_change(topic, PartitionChange(new, changed, unclean), now_ms)

    def list_partition_reassignments(
        self, partitions: Sequence[tuple[str, int]] | None
    ) -> tuple[OngoingReassignment, ...]:
        """The running reassignments (of the named partitions, or all); read-only."""
        wanted = None if partitions is None else set(partitions)
        return tuple(
            OngoingReassignment(
                t.name, p.partition, p.replicas, p.adding_replicas, p.removing_replicas
            )
            for t, p in self.image.reassignments()
            if wanted is None or (t.name, p.partition) in wanted
        )

    # -- create partitions --------------------------------------------------------------------

    def create_partitions(
        self, topics: Sequence[CreatePartitionsTopic], validate_only: bool, now_ms: int
    ) -> Outcome[tuple[CreatePartitionsResult, ...]]:
        counts: dict[str, int] = {}
        for t in topics:
            counts[t.name] = counts.get(t.name, 0) + 1
        results = []
        for t in topics:
            if counts[t.name] > 1:
                code, message = (
                    ErrorCode.INVALID_REQUEST,
                    f"topic {t.name!r} appears more than once in the request",
                )
            else:
                code, message = self._create_partitions_one(t, validate_only, now_ms)
            results.append(CreatePartitionsResult(t.name, code, message))
        return self._done(tuple(results))

    def _create_partitions_one(
        self, t: CreatePartitionsTopic, validate_only: bool, now_ms: int
    ) -> tuple[ErrorCode, str]:
        topic = self.image.topic(t.name)
        if topic is None or not topic.partitions:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {t.name!r}"
        if t.name == OFFSETS_TOPIC:
            # Its partition count places the groups (abs(hash(group)) % count): more partitions
            # would move them between coordinators under their members.
            return (
                ErrorCode.INVALID_REQUEST,
                f"partitions cannot be added to {OFFSETS_TOPIC!r}: it places the consumer groups",
            )
        existing = len(topic.partitions)
        if t.count <= existing:
            return (
                ErrorCode.INVALID_PARTITIONS,
                f"topic {t.name!r} has {existing} partition(s); the new count {t.count} must be "
                "larger (partitions can only be added)",
            )
        new = t.count - existing
        rf = len(topic.partitions[min(topic.partitions)].target_replicas)
        limits = self.partition_limits
        hosted = hosted_replicas(p.replicas for _, p in self.image.partitions())
        problem = cluster_problem(self.image.partition_count(), new, limits)
        if problem:
            return ErrorCode.POLICY_VIOLATION, f"topic {t.name!r}: {problem}"
        if t.assignments is not None:
            assignment = [tuple(a) for a in t.assignments]
            bad = self._bad_assignment(assignment, new, rf)
            if bad:
                return ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"topic {t.name!r}: {bad}"
        else:
            usable = self._placeable_brokers()
            if rf > len(usable):
                return (
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"topic {t.name!r} has replication factor {rf} but only {len(usable)} "
                    "broker(s) are available (unfenced, not decommissioning)",
                )
            with_room = brokers_with_room(usable, hosted, limits)
            problem = replica_room_problem(new, rf, usable, with_room, hosted, limits)
            if problem:
                return ErrorCode.POLICY_VIOLATION, f"topic {t.name!r}: {problem}"
            try:
                # The tail of a whole-topic placement: the new partitions continue its pattern.
                assignment = place_replicas(with_room, t.count, rf, self.image.partition_count())[
                    existing:
                ]
            except PlacementError as err:
                return ErrorCode.INVALID_REPLICATION_FACTOR, f"topic {t.name!r}: {err}"
        problem = assignment_problem(assignment, hosted, limits)
        if problem:
            return ErrorCode.POLICY_VIOLATION, f"topic {t.name!r}: {problem}"
        if validate_only:
            return ErrorCode.NONE, ""
        for offset, replicas in enumerate(assignment):
            isr = tuple(b for b in replicas if self.image.is_active(b))
            record = PartitionRecord(
                topic_id=topic.topic_id,
                partition=existing + offset,
                replicas=replicas,
                isr=isr,
                leader=isr[0],
                leader_epoch=0,
                partition_epoch=0,
                reason="partition created",
            )
            check_partition_change(None, record)
            self._append(record, now_ms)
        self._event(
            "partitions_created",
            topic=t.name,
            topic_id=topic.topic_id,
            old_count=existing,
            new_count=t.count,
            assignment=[list(r) for r in assignment],
        )
        return ErrorCode.NONE, ""

    def _bad_assignment(self, assignment: list[tuple[int, ...]], new: int, rf: int) -> str | None:
        if len(assignment) != new:
            return f"{len(assignment)} assignment(s) given for {new} new partition(s)"
        for replicas in assignment:
            if len(replicas) != rf:
                return (
                    f"assignment {list(replicas)} has {len(replicas)} replica(s); the topic's "
                    f"replication factor is {rf}"
                )
            if len(set(replicas)) != len(replicas):
                return f"assignment {list(replicas)} names a broker twice"
            unknown = [b for b in replicas if b not in self.image.brokers]
            if unknown:
                return f"assignment {list(replicas)} names unregistered broker(s) {unknown}"
            leaving = [b for b in replicas if b in self.image.decommissioning]
            if leaving:
                return f"assignment {list(replicas)} names decommissioning broker(s) {leaving}"
            if not any(self.image.is_active(b) for b in replicas):
                return (
                    f"every broker of assignment {list(replicas)} is fenced or shutting down "
                    "(no leader could be elected)"
                )
        return None

    # -- decommissioning ----------------------------------------------------------------------

    def decommission_broker(
        self, broker_id: int, cancel: bool, now_ms: int
    ) -> Outcome[DecommissionReply]:
        """Mark `broker_id` for decommissioning, move its leaderships away, and start moving
        every replica it hosts (or, `cancel`, remove the mark; moves already started go on)."""
        hosts = any(broker_id in p.replicas for _, p in self.image.partitions())
        if broker_id not in self.image.brokers and not hosts:
            return self._done(
                DecommissionReply(
                    ErrorCode.BROKER_ID_NOT_REGISTERED,
                    f"broker {broker_id} is not registered and hosts no replica",
                )
            )
        if cancel:
            if broker_id in self.image.decommissioning:
                self._append(BrokerDecommissionRecord(broker_id, False), now_ms)
                self._event("broker_decommission_cancelled", broker_id=broker_id)
            return self._done(DecommissionReply(ErrorCode.NONE, ""))
        leaving = set(self.image.decommissioning) | {broker_id}
        remaining = [b for b in self.image.brokers if b not in leaving]
        for topic, p in self.image.partitions():
            if broker_id in p.replicas and len(p.target_replicas) > len(remaining):
                return self._done(
                    DecommissionReply(
                        ErrorCode.INVALID_REQUEST,
                        f"cannot decommission broker {broker_id}: topic {topic.name!r} "
                        f"partition {p.partition} needs {len(p.target_replicas)} replicas but "
                        f"only {len(remaining)} registered broker(s) would remain "
                        f"({sorted(remaining)})",
                    )
                )
        if broker_id not in self.image.decommissioning:
            self._append(BrokerDecommissionRecord(broker_id, True), now_ms)
        self._move_leaderships_off(broker_id, now_ms)
        moving = self._replace_replicas(
            broker_id, now_ms, reason=f"broker {broker_id} decommissioning"
        )
        self._event("broker_decommissioning", broker_id=broker_id, partitions_moving=moving)
        return self._done(DecommissionReply(ErrorCode.NONE, "", moving))

    def _move_leaderships_off(self, broker_id: int, now_ms: int) -> None:
        """Elect another in-sync active replica wherever `broker_id` leads (as controlled
        shutdown does), keeping it in the ISR; a partition with no other candidate keeps it."""
        acceptable = self._acceptable(exclude=broker_id)
        for topic, p in list(self.image.partitions()):
            if p.leader != broker_id:
                continue
            change = build_partition_change(
                p,
                acceptable=acceptable,
                election=Election.ONLINE,
                reason=f"broker {broker_id} decommissioning: leadership moved",
            )
            if change is not None and change.record.leader != NO_LEADER:
                self._apply_change(topic, change, now_ms)

    def _replace_replicas(
        self, broker_id: int, now_ms: int, reason: str, live_only: bool = False
    ) -> int:
        """Start a reassignment for every partition that names `broker_id` (and is not being
        reassigned already) replacing it per `plan_replacements`; the number started. Targets
        are live brokers when they can hold every partition (always, `live_only`), else any
        registered broker that is not leaving."""
        leaving = set(self.image.decommissioning) | {broker_id}
        parts = [p for _, p in self.image.partitions()]
        active = [
            BrokerSlot(b.broker_id, b.rack)
            for b in self.image.brokers.values()
            if b.broker_id not in leaving and b.is_active
        ]
        registered = [
            BrokerSlot(b.broker_id, b.rack)
            for b in self.image.brokers.values()
            if b.broker_id not in leaving
        ]
        named = [p for p in parts if broker_id in p.replicas and not p.is_reassigning]
        # Live brokers when they can hold every partition; fenced ones only when needed.
        biggest = max((len(p.replicas) for p in named), default=0)
        slots = active if live_only or biggest <= len(active) else registered
        plan = plan_replacements(parts, slots, {broker_id})
        started = 0
        by_id = self.image.topics_by_id
        for key, target in plan.items():
            topic = by_id[key[0]]
            current = topic.partitions[key[1]]
            if self._start(topic, current, target, now_ms, reason):
                started += 1
        return started

    def _decommission_sweep(self, now_ms: int) -> None:
        """Timers: every partition still naming a decommissioning broker and not moving gets a
        reassignment (one cancelled, or left over by a controller failover)."""
        marked = self.image.decommissioning
        # One pass over the partitions (not one per marked broker, and not sorted): the marked
        # brokers still named by a partition that is not moving.
        pending = {
            b
            for topic in self.image.topics_by_id.values()
            for p in topic.partitions.values()
            if not p.is_reassigning
            for b in p.replicas
            if b in marked
        }
        for b in sorted(pending):
            self._replace_replicas(b, now_ms, reason=f"broker {b} decommissioning")

    def _rebuild_lost_replicas(self, now_ms: int) -> None:
        """Failure decommissioning: a broker fenced (or unregistered) for at least
        `replica_rebuild_delay_ms` has its replicas rebuilt on live brokers."""
        for b, reg in self.image.brokers.items():
            # A broker registered fenced and never unfenced did not pass through `_fence`
            # (`_unfence` ends the clock).
            if reg.fenced:
                self.fenced_since.setdefault(b, now_ms)
        delay = self.settings.replica_rebuild_delay_ms
        if delay < 0:
            return
        named = {r for _, p in self.image.partitions() for r in p.replicas}
        for b in named - self.image.brokers.keys():
            self.fenced_since.setdefault(b, now_ms)
        for b in [b for b in self.fenced_since if b not in named and b not in self.image.brokers]:
            del self.fenced_since[b]
        for b, since in sorted(self.fenced_since.items()):
            if now_ms - since < delay or b not in named:
                continue
            moving = self._replace_replicas(
                b, now_ms, reason=f"rebuilding replicas of broker {b}", live_only=True
            )
            if moving:
                self._event(
                    "replicas_rebuilt",
                    broker_id=b,
                    partitions_moving=moving,
                    fenced_for_ms=now_ms - since,
                )


def _named(rejection: Rejection, current: PartitionRecord, topic: TopicImage) -> Rejection:
    """The rejection with the topic's name instead of its id."""
    return Rejection(
        rejection.code,
        rejection.message.replace(
            f"{current.topic_id}-{current.partition}", f"{topic.name}-{current.partition}"
        ),
    )


__all__ = ["MoveControl"]
