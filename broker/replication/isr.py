"""The leader's ISR: its states while an AlterPartition is in flight, and the expand/shrink rules.

Pure: no I/O, no clock. Kafka's `Partition` keeps the ISR as one of three states
(docs/protocol.md §8, §9):

    CommittedIsr      no AlterPartition in flight: the controller's ISR
    PendingExpandIsr  AlterPartition(isr + r) in flight: r already gates the HW (maximal ISR)
    PendingShrinkIsr  AlterPartition(isr - out) in flight: the old ISR keeps gating the HW

The leader proposes one change at a time and only from CommittedIsr. A follower joins once it
holds the HW and this epoch's start and its broker is eligible (`should_expand`); members that
fell behind for replica.lag.time.max.ms leave (`out_of_sync_replicas`). `answer_action` sorts the
controller's AlterPartition answers.

Concurrency contract: immutable values and pure functions.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from minibroker.broker.replication.events import UNKNOWN_BROKER_EPOCH, ProposeIsr
from minibroker.broker.replication.remote import RemoteReplica
from minibroker.client.errors import ErrorCode


@dataclass(frozen=True, slots=True)
class CommittedIsr:
    """No AlterPartition in flight: `isr` is the controller's."""

    isr: frozenset[int]

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.isr


@dataclass(frozen=True, slots=True)
class PendingExpandIsr:
    """AlterPartition(isr + new_replica) in flight; the new replica already gates the HW."""

    isr: frozenset[int]
    new_replica: int
    proposal: ProposeIsr

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.isr | {self.new_replica}


@dataclass(frozen=True, slots=True)
class PendingShrinkIsr:
    """AlterPartition(isr - out_of_sync) in flight; the old ISR keeps gating the HW."""

    isr: frozenset[int]
    out_of_sync: frozenset[int]
    proposal: ProposeIsr

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.isr


IsrState = CommittedIsr | PendingExpandIsr | PendingShrinkIsr


def should_expand(
    state: IsrState,
    replica_id: int,
    leo: int,
    high_watermark: int,
    epoch_start_offset: int,
    eligible: bool,
) -> bool:
    """Kafka's `Partition.maybeExpandIsr` (docs/protocol.md §8): propose adding `replica_id` when
    no change is in flight, it is not a member yet, its LEO reached the HW and this leader
    epoch's start (KIP-320's `HasHighWatermarkReachedCurrentEpoch`), and its broker is eligible
    (registered, unfenced, not shutting down, current broker epoch)."""
    return (
        isinstance(state, CommittedIsr)
        and replica_id not in state.isr
        and leo >= high_watermark
        and leo >= epoch_start_offset
        and eligible
    )


def out_of_sync_replicas(
    isr: Iterable[int],
    leader_id: int,
    remotes: Mapping[int, RemoteReplica],
    leader_leo: int,
    now_ms: int,
    lag_time_max_ms: int,
) -> frozenset[int]:
    """Kafka's `Partition.getOutOfSyncReplicas` (docs/protocol.md §8): the ISR members other than
    the leader that have not been caught up within `lag_time_max_ms` (an unknown one is not)."""
    out = set()
    for replica_id in isr:
        if replica_id == leader_id:
            continue
        remote = remotes.get(replica_id)
        if remote is None or not remote.is_caught_up(leader_leo, now_ms, lag_time_max_ms):
            out.add(replica_id)
    return frozenset(out)


def isr_with_epochs(
    isr: Iterable[int],
    leader_id: int,
    leader_broker_epoch: int,
    remotes: Mapping[int, RemoteReplica],
) -> tuple[tuple[int, int], ...]:
    """(broker id, broker epoch) for AlterPartition's newIsrWithEpochs (KIP-903): the leader's
    registered epoch, each follower's epoch from its fetches (-1 when none was seen)."""
    pairs = []
    for broker_id in sorted(isr):
        if broker_id == leader_id:
            pairs.append((broker_id, leader_broker_epoch))
        else:
            remote = remotes.get(broker_id)
            pairs.append((broker_id, remote.broker_epoch if remote else UNKNOWN_BROKER_EPOCH))
    return tuple(pairs)


class AnswerAction(enum.Enum):
    """What the leader does with the controller's answer to its proposal (docs/protocol.md §9)."""

    COMMIT = "commit"  # NONE: adopt the returned ISR and partition epoch
    REVERT = "revert"  # drop the proposal, back to the committed ISR; no retry
    WAIT_FOR_METADATA = "wait"  # keep the pending state; the next PartitionRecord settles it
    RETRY = "retry"  # transport errors, NOT_CONTROLLER, timeouts: send the same proposal again


# Retrying cannot help after these; the next PartitionRecord settles the ISR.
_WAIT_FOR_METADATA = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.INVALID_UPDATE_VERSION,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.NEW_LEADER_ELECTED,
    }
)
_REVERT = frozenset({ErrorCode.OPERATION_NOT_ATTEMPTED, ErrorCode.INELIGIBLE_REPLICA})


def answer_action(error: ErrorCode) -> AnswerAction:
    if error == ErrorCode.NONE:
        return AnswerAction.COMMIT
    if error in _REVERT:
        return AnswerAction.REVERT
    if error in _WAIT_FOR_METADATA:
        return AnswerAction.WAIT_FOR_METADATA
    return AnswerAction.RETRY


def retry_of(proposal: ProposeIsr, delay_ms: int) -> ProposeIsr:
    """The same proposal (same id, same CAS epochs), sent again after `delay_ms`."""
    return dataclasses.replace(proposal, delay_ms=delay_ms)
