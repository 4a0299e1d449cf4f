"""AlterPartition validation: the leader's ISR proposal against the controller's record.

Pure. The checks run in Kafka's order (ReplicationControlManager.validateAlterPartitionData;
docs/protocol.md §9), so a
request that is wrong in several ways gets the error a Kafka leader would get. The partition
epoch is the compare-and-set version: of two proposals made at the same epoch only the first
can pass; the second sees INVALID_UPDATE_VERSION and changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from minibroker.client.errors import ErrorCode
from minibroker.metadata.image import BrokerRegistration
from minibroker.metadata.records import (
    LEADER_RECOVERED,
    LEADER_RECOVERING,
    PartitionRecord,
)


@dataclass(frozen=True, slots=True)
class IsrMember:
    broker_id: int
    broker_epoch: int  # -1: not checked


@dataclass(frozen=True, slots=True)
class AlterPartitionProposal:
    topic_id: str
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: tuple[IsrMember, ...]
    leader_recovery_state: int = LEADER_RECOVERED


@dataclass(frozen=True, slots=True)
class Rejection:
    code: ErrorCode
    message: str


def validate_alter_partition(
    sender_id: int,
    proposal: AlterPartitionProposal,
    current: PartitionRecord | None,
    topic_known: bool,
    brokers: Mapping[int, BrokerRegistration],
) -> Rejection | None:
    """None when the proposal may be applied, else the error to answer with."""
    where = f"{proposal.topic_id}-{proposal.partition}"
    if not topic_known:
        return Rejection(ErrorCode.UNKNOWN_TOPIC_ID, f"unknown topic id {proposal.topic_id}")
    if current is None:
        return Rejection(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown partition {where}")
    if (
        proposal.leader_epoch > current.leader_epoch
        or proposal.partition_epoch > current.partition_epoch
    ):
        # The leader has seen epochs the controller has not: the controller's state is behind.
        return Rejection(
            ErrorCode.NOT_CONTROLLER,
            f"{where}: request epochs (leader {proposal.leader_epoch}, partition "
            f"{proposal.partition_epoch}) are ahead of the controller's (leader "
            f"{current.leader_epoch}, partition {current.partition_epoch})",
        )
    if proposal.leader_epoch < current.leader_epoch:
        return Rejection(
            ErrorCode.FENCED_LEADER_EPOCH,
            f"{where}: leader epoch {proposal.leader_epoch} is older than the current "
            f"{current.leader_epoch}",
        )
    if sender_id != current.leader:
        return Rejection(
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            f"{where}: broker {sender_id} is not the leader (leader is {current.leader})",
        )
    if proposal.partition_epoch < current.partition_epoch:
        return Rejection(
            ErrorCode.INVALID_UPDATE_VERSION,
            f"{where}: partition epoch {proposal.partition_epoch} is older than the current "
            f"{current.partition_epoch}",
        )
    ids = [m.broker_id for m in proposal.new_isr]
    if len(set(ids)) != len(ids):
        return Rejection(ErrorCode.INVALID_REQUEST, f"{where}: duplicate broker in ISR {ids}")
    not_replicas = [b for b in ids if b not in current.replicas]
    if not_replicas:
        return Rejection(
            ErrorCode.INVALID_REQUEST,
            f"{where}: ISR {ids} has non-replicas {not_replicas} "
            f"(replicas {list(current.replicas)})",
        )
    if current.leader not in ids:
        return Rejection(
            ErrorCode.INVALID_REQUEST, f"{where}: ISR {ids} leaves out the leader {current.leader}"
        )
    if proposal.leader_recovery_state not in (LEADER_RECOVERED, LEADER_RECOVERING):
        return Rejection(
            ErrorCode.INVALID_REQUEST,
            f"{where}: unknown leader recovery state {proposal.leader_recovery_state}",
        )
    if proposal.leader_recovery_state == LEADER_RECOVERING and len(ids) > 1:
        return Rejection(
            ErrorCode.INVALID_REQUEST, f"{where}: a RECOVERING partition's ISR must be the leader"
        )
    if (
        current.leader_recovery_state == LEADER_RECOVERED
        and proposal.leader_recovery_state == LEADER_RECOVERING
    ):
        return Rejection(
            ErrorCode.INVALID_REQUEST, f"{where}: cannot go from RECOVERED back to RECOVERING"
        )
    for member in proposal.new_isr:
        problem = _ineligible(member, brokers)
        if problem:
            return Rejection(ErrorCode.INELIGIBLE_REPLICA, f"{where}: {problem}")
    return None


def _ineligible(member: IsrMember, brokers: Mapping[int, BrokerRegistration]) -> str | None:
    broker = brokers.get(member.broker_id)
    if broker is None:
        return f"broker {member.broker_id} is not registered"
    if broker.fenced:
        return f"broker {member.broker_id} is fenced"
    if broker.in_controlled_shutdown:
        return f"broker {member.broker_id} is in controlled shutdown"
    if member.broker_epoch != -1 and member.broker_epoch != broker.broker_epoch:
        return (
            f"broker {member.broker_id} epoch {member.broker_epoch} is stale "
            f"(current {broker.broker_epoch})"
        )
    return None


def isr_delta(old: Sequence[int], new: Sequence[int]) -> tuple[list[int], list[int]]:
    """(added, removed) brokers between two ISRs."""
    return [b for b in new if b not in old], [b for b in old if b not in new]


__all__ = [
    "AlterPartitionProposal",
    "IsrMember",
    "Rejection",
    "isr_delta",
    "validate_alter_partition",
]
