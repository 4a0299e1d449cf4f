"""Partition changes and leader elections: the analogue of Kafka's PartitionChangeBuilder.

Pure: a function from the current partition record, a target ISR, the election kind and an
"is this broker acceptable" predicate to the next partition record, or None for "no change"
(docs/protocol.md §17). Acceptable = registered, unfenced, not in controlled shutdown.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from minibroker.client.common.invariant import InvariantViolation
from minibroker.client.types import NO_LEADER
from minibroker.metadata.records import LEADER_RECOVERED, LEADER_RECOVERING, PartitionRecord


class Election(enum.Enum):
    ONLINE = "online"  # keep a valid leader, else the first valid replica in assignment order
    PREFERRED = "preferred"  # replicas[0] first if valid
    UNCLEAN = "unclean"  # ONLINE, then any acceptable replica even if out of sync


@dataclass(frozen=True, slots=True)
class PartitionChange:
    """The next record, and whether its leader came from outside the ISR (unclean)."""

    record: PartitionRecord
    leader_changed: bool
    unclean: bool


def elect_leader(
    current: PartitionRecord,
    target_isr: Sequence[int],
    election: Election,
    acceptable: Callable[[int], bool],
) -> tuple[int, bool]:
    """(leader, unclean) chosen for `current` with ISR `target_isr` (Kafka's
    PartitionChangeBuilder.electLeader; docs/protocol.md §17)."""
    replicas = current.replicas

    def valid(broker_id: int) -> bool:
        return broker_id in target_isr and acceptable(broker_id)

    if election is Election.PREFERRED:
        if replicas and valid(replicas[0]):
            return replicas[0], False
        if current.leader != NO_LEADER and valid(current.leader):
            return current.leader, False
        for broker_id in replicas[1:]:
            if valid(broker_id):
                return broker_id, False
        return NO_LEADER, False
    if current.leader != NO_LEADER and valid(current.leader):
        return current.leader, False
    # During a reassignment the target replicas come first (Kafka elects from the target when
    # it can): `replicas` is target + removing, but say so rather than rely on the order.
    candidates = current.target_replicas + current.removing_replicas
    for broker_id in candidates:
        if valid(broker_id):
            return broker_id, False
    if election is Election.UNCLEAN:
        for broker_id in candidates:
            if acceptable(broker_id):
                return broker_id, True
    return NO_LEADER, False


def build_partition_change(
    current: PartitionRecord,
    *,
    acceptable: Callable[[int], bool],
    election: Election = Election.ONLINE,
    target_isr: Sequence[int] | None = None,
    leader_recovery_state: int | None = None,
    reason: str,
) -> PartitionChange | None:
    """The next record for `current`, or None when nothing would change.

    The ISR never becomes empty: when `target_isr` is empty the current ISR is kept, so the last
    member can lead again when it returns (pre-KIP-966 "last replica standing"). Every leader
    change (to NO_LEADER too) bumps the leader epoch; every change bumps the partition epoch.
    """
    isr = tuple(current.isr if target_isr is None else target_isr)
    if not isr:
        isr = current.isr
    leader, unclean = elect_leader(current, isr, election, acceptable)
    recovery = current.leader_recovery_state
    if leader_recovery_state is not None:
        recovery = leader_recovery_state
    if unclean:
        # The new leader's log is the truth now; nobody else is known to match it (KIP-704).
        isr = (leader,)
        recovery = LEADER_RECOVERING
    leader_changed = leader != current.leader
    if not leader_changed and isr == current.isr and recovery == current.leader_recovery_state:
        return None
    record = replace(
        current,
        isr=isr,
        leader=leader,
        leader_epoch=current.leader_epoch + 1 if leader_changed else current.leader_epoch,
        partition_epoch=current.partition_epoch + 1,
        leader_recovery_state=recovery,
        reason=reason,
    )
    return PartitionChange(record, leader_changed, unclean)


def check_partition_change(old: PartitionRecord | None, new: PartitionRecord) -> None:
    """Always-on checks of I7 and I11 for a record about to be written (not `assert`, which
    vanishes under -O): the ISR is a non-empty subset of the replicas, the leader is NO_LEADER
    or an ISR member, epochs never go back, a leader epoch change comes with a partition
    epoch change and with a new leader or dropped replicas (and dropped replicas with a new
    leader epoch); a reassignment's adding and removing sets (KIP-455) are disjoint subsets of
    the replicas and leave a non-empty target."""
    problems = []
    if not new.isr or not set(new.isr) <= set(new.replicas) or len(set(new.isr)) != len(new.isr):
        problems.append(f"ISR {list(new.isr)} is not a non-empty subset of {list(new.replicas)}")
    if new.leader != NO_LEADER and new.leader not in new.isr:
        problems.append(f"leader {new.leader} is not in the ISR {list(new.isr)}")
    if len(set(new.replicas)) != len(new.replicas):
        problems.append(f"replicas {list(new.replicas)} name a broker twice")
    adding, removing, replicas = (
        set(new.adding_replicas),
        set(new.removing_replicas),
        set(new.replicas),
    )
    if not adding <= replicas or not removing <= replicas:
        problems.append(
            f"adding {list(new.adding_replicas)} / removing {list(new.removing_replicas)} are "
            f"not within the replicas {list(new.replicas)}"
        )
    if adding & removing:
        problems.append(f"brokers {sorted(adding & removing)} are both adding and removing")
    if new.is_reassigning and not new.target_replicas:
        problems.append(f"reassignment target is empty (removing {list(new.removing_replicas)})")
    if old is not None:
        if new.partition_epoch != old.partition_epoch + 1:
            problems.append(f"partition epoch {old.partition_epoch} -> {new.partition_epoch}")
        if new.leader_epoch < old.leader_epoch:
            problems.append(f"leader epoch went back {old.leader_epoch} -> {new.leader_epoch}")
        dropped = set(old.replicas) - set(new.replicas)
        if new.leader != old.leader and new.leader_epoch == old.leader_epoch:
            problems.append("the leader changed in the same leader epoch")
        if new.leader_epoch != old.leader_epoch and new.leader == old.leader and not dropped:
            # Kafka bumps the epoch of a kept leader only when replicas are dropped
            # (a reassignment completed or cancelled), to fence the dropped ones' fetches.
            problems.append("the leader epoch changed without a new leader or a dropped replica")
        if dropped and new.leader_epoch == old.leader_epoch:
            problems.append(f"replicas {sorted(dropped)} dropped in the same leader epoch")
    if problems:
        raise InvariantViolation(f"{new.topic_id}-{new.partition}: " + "; ".join(problems))


def remove_from_isr(isr: Sequence[int], broker_id: int) -> tuple[int, ...]:
    """`isr` without `broker_id`; empty when it was the last member (the builder keeps it)."""
    return tuple(b for b in isr if b != broker_id)


__all__ = [
    "LEADER_RECOVERED",
    "Election",
    "PartitionChange",
    "build_partition_change",
    "check_partition_change",
    "elect_leader",
    "remove_from_isr",
]
