"""Partition reassignment (KIP-455) as pure record transitions.

Pure: each function takes the current `PartitionRecord` (and an "is this broker acceptable"
predicate: registered, unfenced, not in controlled shutdown) and returns the next record, a
`Rejection` (Kafka's error code; nothing changes), or None (nothing to do). The caller writes the
record through `ControlBase._apply_change`, whose `check_partition_change` re-checks every
invariant. Rules and their Kafka sources (docs/protocol.md "Reassignment (KIP-455)"):

- start (ReplicationControlManager.changePartitionReassignment, PartitionReassignmentReplicas):
  replicas = T + [O - T], adding = T - O, removing = O - T; ISR and leader unchanged; partition
  epoch + 1. When T is already in the ISR, the same record completes it (PartitionChangeBuilder
  completes a reassignment while it builds the record that starts it).
- completion (PartitionReassignmentReplicas.maybeCompleteReassignment): once EVERY target
  replica is in the ISR: replicas = T, ISR = ISR ∩ T, adding = removing = (); a leader outside T
  (or not acceptable) is replaced by T[0] when in the ISR and acceptable, else the first such
  member of T (leader epoch + 1).
- cancel (PartitionReassignmentRevert): replicas = O = replicas - adding, ISR = ISR ∩ O; when
  that is empty, only a topic that allows unclean election may revert (its first acceptable
  original replica leads, RECOVERING, KIP-704), else INVALID_REPLICA_ASSIGNMENT.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from minibroker.client.errors import ErrorCode
from minibroker.client.types import NO_LEADER
from minibroker.controller.core.isr import Rejection
from minibroker.metadata.records import LEADER_RECOVERING, PartitionRecord

Acceptable = Callable[[int], bool]


def validate_target(
    current: PartitionRecord,
    target: Sequence[int],
    *,
    registered: Collection[int],
    decommissioning: Collection[int],
    min_isr: int,
) -> Rejection | None:
    """Why `target` may not be the partition's new replica list, or None (Kafka's
    validateManualPartitionAssignment, then minibroker's own rules: min ISR, decommissioning)."""
    where = f"partition {current.topic_id}-{current.partition}"
    if current.is_reassigning:
        return Rejection(
            ErrorCode.REASSIGNMENT_IN_PROGRESS,
            f"{where} is already being reassigned to {list(current.target_replicas)} (cancel it "
            "first)",
        )
    if not target:
        return Rejection(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"{where}: the target replica list is empty"
        )
    if len(set(target)) != len(target):
        return Rejection(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"{where}: the target {list(target)} names a broker twice",
        )
    unknown = [b for b in target if b not in registered]
    if unknown:
        return Rejection(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"{where}: the target {list(target)} names broker(s) {unknown}, which are not "
            "registered",
        )
    leaving = [b for b in target if b in decommissioning]
    if leaving:
        return Rejection(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"{where}: the target {list(target)} names decommissioning broker(s) {leaving}",
        )
    if len(target) < min_isr:
        return Rejection(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"{where}: the target has {len(target)} replica(s), fewer than the topic's "
            f"min.insync.replicas={min_isr} (acks=all writes would fail)",
        )
    return None


def start_reassignment(
    current: PartitionRecord, target: Sequence[int], acceptable: Acceptable, reason: str = ""
) -> PartitionRecord | None:
    """The record that starts moving `current` to `target` (validated by `validate_target`),
    completed at once when the target is already in sync; None when `target` is the current
    replica list (nothing to do)."""
    target = tuple(target)
    original = current.replicas
    if target == original:
        return None
    started = replace(
        current,
        replicas=target + tuple(b for b in original if b not in target),
        adding_replicas=tuple(b for b in target if b not in original),
        removing_replicas=tuple(b for b in original if b not in target),
        partition_epoch=current.partition_epoch + 1,
        reason=reason or f"reassignment to {list(target)} started",
    )
    if not started.is_reassigning:
        # A reorder of the same brokers: nothing to add or remove, only the order changes
        # (the preferred leader); Kafka writes the new order in one record.
        return started
    completed = complete_reassignment(started, acceptable)
    if completed is None:
        return started
    # One record, one partition epoch step (Kafka's builder completes while it starts).
    return replace(completed, partition_epoch=current.partition_epoch + 1)


def reassignment_complete(current: PartitionRecord) -> bool:
    """True when a reassignment runs and every target replica is in the ISR."""
    isr = set(current.isr)
    return current.is_reassigning and all(b in isr for b in current.target_replicas)


def complete_reassignment(
    current: PartitionRecord, acceptable: Acceptable
) -> PartitionRecord | None:
    """The record that completes the running reassignment, or None when none runs or some
    target replica is not in the ISR yet."""
    if not reassignment_complete(current):
        return None
    target = current.target_replicas
    isr = tuple(b for b in current.isr if b in target)
    leader = current.leader
    if leader not in target or not acceptable(leader):
        leader = _elect_from(target, isr, acceptable)
        if leader == NO_LEADER and current.leader != NO_LEADER:
            # No target replica can lead now (all fenced or shutting down): completing would
            # take a partition that has a leader offline. Wait for the next ISR change.
            return None
    return replace(
        current,
        replicas=target,
        isr=isr,
        leader=leader,
        # Kafka's triggerLeaderEpochBumpForReplicaReassignmentIfNeeded: dropping a replica
        # bumps the leader epoch even when the leader stays, so a fetch still in flight from
        # the removed replica is fenced (it could otherwise land after the broker is added
        # back with an empty log, and count its old log end offset).
        leader_epoch=current.leader_epoch
        + (1 if leader != current.leader or current.removing_replicas else 0),
        partition_epoch=current.partition_epoch + 1,
        adding_replicas=(),
        removing_replicas=(),
        reason=f"reassignment to {list(target)} completed",
    )


def cancel_reassignment(
    current: PartitionRecord, acceptable: Acceptable, unclean_allowed: bool
) -> PartitionRecord | Rejection:
    """The record that reverts the running reassignment to the original replicas."""
    where = f"partition {current.topic_id}-{current.partition}"
    if not current.is_reassigning:
        return Rejection(
            ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, f"no reassignment of {where} is in progress"
        )
    original = current.original_replicas
    isr = tuple(b for b in current.isr if b in original)
    recovery = current.leader_recovery_state
    leader = current.leader
    if not isr:
        if not unclean_allowed:
            return Rejection(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"cannot revert {where} to {list(original)}: no original replica is in the ISR "
                f"{list(current.isr)}, so it would need an unclean leader election, which the "
                "topic does not allow",
            )
        candidates = [b for b in original if acceptable(b)]
        if not candidates:
            # An ISR of an out-of-sync replica with no leader would let it lead later as if
            # it were clean (no RECOVERING state, no unclean election on record).
            return Rejection(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"cannot revert {where} to {list(original)}: no original replica is in the ISR "
                "and none is alive to lead it (unclean election needs a live replica)",
            )
        leader = candidates[0]
        isr = (leader,)
        recovery = LEADER_RECOVERING
    elif leader not in original or not acceptable(leader):
        leader = _elect_from(original, isr, acceptable)
    return replace(
        current,
        replicas=original,
        isr=isr,
        leader=leader,
        # Adding replicas dropped: a new epoch fences them (see complete_reassignment).
        leader_epoch=current.leader_epoch
        + (1 if leader != current.leader or current.adding_replicas else 0),
        partition_epoch=current.partition_epoch + 1,
        leader_recovery_state=recovery,
        adding_replicas=(),
        removing_replicas=(),
        reason=f"reassignment cancelled, back to {list(original)}",
    )


def _elect_from(replicas: Sequence[int], isr: Sequence[int], acceptable: Acceptable) -> int:
    """replicas[0] when in the ISR and acceptable, else the first such replica, else none."""
    for b in replicas:
        if b in isr and acceptable(b):
            return b
    return NO_LEADER


__all__ = [
    "cancel_reassignment",
    "complete_reassignment",
    "reassignment_complete",
    "start_reassignment",
    "validate_target",
]
