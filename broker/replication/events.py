"""The seam between the replication cores and their I/O shell: frozen inputs and effects.

Pure: no I/O. Every value that crosses between `PartitionReplica` (partition.py) and the replica
manager that drives it is one of these dataclasses, so the shell never reaches into core state
and the core never sees a protobuf, a future or a file (docs/design.md §2).

Inputs are facts ("this fetch arrived", "the controller answered"). Effects are decisions the
shell must carry out, in list order, before it feeds the core its next input for the same
partition (the etcd Ready contract: storage first, then RPCs, then completing waiters):

    AssignEpoch            add (epoch, start_offset) to the epoch cache, durably, before any
                           append in that epoch (KIP-279)
    TruncateTo             truncate the log at `offset` AND the epoch cache from `offset`, even
                           when offset >= LEO (KAFKA-10706); then call `on_log_truncated`
    TruncateFullyAndStartAt  drop the whole log, restart it empty at `offset`; then
                           `on_log_truncated(offset, offset)`
    AppendAsFollower       append the leader's batches as they are (no offset rewrite); the
                           storage layer adds each new batch epoch to the epoch cache; then
                           call `on_follower_appended`
    AdvanceLogStartOffset  raise the log start offset (follower copies the leader's)
    HighWatermarkChanged   wake fetch waiters; checkpoint the HW later
    CompleteProduce        answer a parked acks=all produce
    ProposeIsr             send AlterPartition (one in flight per partition)
    StartFetching / StopFetching  (re)start or stop the follower fetcher for this partition
    Backoff                do not fetch this partition for `delay_ms`
    IsrUpdated             an ISR change committed (logs and metrics only)

Concurrency contract: none of these objects is mutable, so they may be handed across tasks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from minibroker.client.errors import ErrorCode
from minibroker.client.types import (
    UNDEFINED_EPOCH,
    UNKNOWN_OFFSET,
)

UNKNOWN_BROKER_EPOCH = -1


class Role(enum.Enum):
    """What this broker is for the partition. NONE: not (or no longer) a replica of it."""

    NONE = "none"
    LEADER = "leader"
    FOLLOWER = "follower"


class LeaderRecoveryState(enum.IntEnum):
    """KIP-704: RECOVERING after an unclean election until the new leader reports RECOVERED."""

    RECOVERED = 0
    RECOVERING = 1


# ------------------------------------------------------------------------------------------
# Inputs


@dataclass(frozen=True, slots=True)
class PartitionState:
    """The controller's record for one partition (metadata PartitionRecord, minus names).

    Invariants the controller keeps: isr ⊆ replicas, leader ∈ isr unless leader == -1, and
    every leader_epoch bump comes with a partition_epoch bump.
    """

    replicas: tuple[int, ...]
    isr: frozenset[int]
    leader: int
    leader_epoch: int
    partition_epoch: int
    leader_recovery_state: LeaderRecoveryState = LeaderRecoveryState.RECOVERED


@dataclass(frozen=True, slots=True)
class FollowerFetch:
    """One partition of a follower's Fetch as the leader receives it (FetchRequest v17 fields).

    `fetch_offset` is the follower's LEO; `last_fetched_epoch` the epoch of its last batch
    (-1: skip the divergence check); `broker_epoch` the follower's broker epoch (-1: unknown).
    """

    replica_id: int
    broker_epoch: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class FetchPosition:
    """What a follower asks its leader for next (`PartitionReplica.next_fetch`)."""

    leader_id: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class FetchResponse:
    """One partition of the leader's Fetch answer, as the follower fetcher decoded it.

    For OFFSET_OUT_OF_RANGE the leader must still fill `log_start_offset` and `log_end_offset`
    (they stand in for Kafka's ListOffsets round trip, docs/protocol.md §11 step 7).
    """

    error: ErrorCode = ErrorCode.NONE
    high_watermark: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET
    log_end_offset: int = UNKNOWN_OFFSET
    diverging_epoch: tuple[int, int] | None = None  # (epoch, end offset)
    records: bytes = b""


@dataclass(frozen=True, slots=True)
class AlterPartitionResult:
    """The controller's answer to the ProposeIsr with `proposal_id` (or a transport error)."""

    proposal_id: int
    error: ErrorCode
    leader_epoch: int = UNDEFINED_EPOCH
    partition_epoch: int = UNDEFINED_EPOCH
    isr: frozenset[int] = frozenset()
    leader_recovery_state: LeaderRecoveryState = LeaderRecoveryState.RECOVERED


# ------------------------------------------------------------------------------------------
# Answers to requests (returned directly, with the effects the request caused)


@dataclass(frozen=True, slots=True)
class FollowerFetchAnswer:
    """The leader's answer to one FollowerFetch.

    On NONE without `diverging_epoch` the shell reads records from `fetch_offset` up to (not
    including) `read_until_offset` (the leader LEO taken before the read, docs/protocol.md §6) on
    batch boundaries and at most the partition's max bytes. HW, log start and LEO are the values
    to put in the response. The effects the fetch caused come beside it (`handle_follower_fetch`
    returns `(answer, effects)`), never inside it.
    """

    error: ErrorCode
    high_watermark: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET
    log_end_offset: int = UNKNOWN_OFFSET
    diverging_epoch: tuple[int, int] | None = None
    fetch_offset: int = UNKNOWN_OFFSET
    read_until_offset: int = UNKNOWN_OFFSET
    message: str = ""


@dataclass(frozen=True, slots=True)
class ConsumerFetchAnswer:
    """A consumer read: from the fetch offset up to `read_until_offset` (this replica's HW)."""

    error: ErrorCode
    high_watermark: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET
    log_end_offset: int = UNKNOWN_OFFSET
    read_until_offset: int = UNKNOWN_OFFSET
    message: str = ""


@dataclass(frozen=True, slots=True)
class EpochEndOffsetAnswer:
    """OffsetForLeaderEpoch for a client (KIP-320): where `leader_epoch` ends in the leader's log
    (the largest epoch <= the one asked for, and the start of the next higher epoch or the LEO);
    UNDEFINED_EPOCH / UNKNOWN_OFFSET when the log knows no epoch at or above it."""

    error: ErrorCode
    leader_epoch: int = UNDEFINED_EPOCH
    end_offset: int = UNKNOWN_OFFSET
    message: str = ""


@dataclass(frozen=True, slots=True)
class ListOffsetsAnswer:
    """ListOffsets for a client.

    EARLIEST and LATEST are answered in `offset`. For a timestamp lookup the shell searches the
    time index and passes what it found to `resolve(found_offset)` (KIP-207: a hit at or beyond
    the last fetchable offset is OFFSET_NOT_AVAILABLE while the new leader's HW lags).
    """

    error: ErrorCode
    offset: int = UNKNOWN_OFFSET
    leader_epoch: int = UNDEFINED_EPOCH
    needs_timestamp_lookup: bool = False
    last_fetchable_offset: int = UNKNOWN_OFFSET
    lagging_high_watermark: bool = False
    message: str = ""

    def resolve(self, found_offset: int | None) -> tuple[ErrorCode, int]:
        """(error, offset) for a timestamp lookup that found `found_offset` (None: no hit)."""
        if found_offset is None or found_offset >= self.last_fetchable_offset:
            if self.lagging_high_watermark:
                return ErrorCode.OFFSET_NOT_AVAILABLE, UNKNOWN_OFFSET
            return ErrorCode.NONE, UNKNOWN_OFFSET
        return ErrorCode.NONE, found_offset


@dataclass(frozen=True, slots=True)
class AppendPlan:
    """A produce the leader accepted: stamp offsets from `base_offset` and `leader_epoch`.

    The shell stamps the batches (client/batch.assign_offsets), appends them, and then calls
    `on_leader_appended(plan, ...)` with no other append or truncation in between.
    `next_offset` is the LEO after the append; `producer_batches` the stamped (producer id,
    producer epoch, first seq, last seq, first offset, last offset) the producer state records.
    """

    base_offset: int
    next_offset: int
    leader_epoch: int
    acks: int
    producer_batches: tuple[tuple[int, int, int, int, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class DuplicateAppend:
    """A successful retry of idempotent batches already in the log (Kafka's DuplicateSequence
    handling): nothing is appended, and the producer gets the original offsets. For acks=all the
    shell parks it (`park_produce`) until the HW passes `last_offset`."""

    base_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class ProduceRejected:
    """A produce refused without appending: always an error (never ErrorCode.NONE)."""

    error: ErrorCode
    message: str = ""

    def __post_init__(self) -> None:
        if self.error == ErrorCode.NONE:
            raise ValueError("a rejected produce needs an error; a duplicate is DuplicateAppend")


@dataclass(frozen=True, slots=True)
class FollowerView:
    """A follower's fetch state as the shell may read it (`PartitionReplica.follower_state`).

    `leader_high_watermark` is the HW from the leader's last answer (-1: none yet), which the
    shell's lag gauge subtracts the LEO from; `failed` means fetching stopped until new metadata.
    """

    leader_id: int
    leader_epoch: int
    leader_high_watermark: int
    leader_log_start_offset: int
    backoff_until_ms: int
    failed: bool


@dataclass(frozen=True, slots=True)
class RemoteReplicaView:
    """The leader's view of one follower (`PartitionReplica.remote_replicas`); leo -1: unknown."""

    replica_id: int
    leo: int
    log_start_offset: int
    last_caught_up_time_ms: int
    broker_epoch: int


# ------------------------------------------------------------------------------------------
# Effects


@dataclass(frozen=True, slots=True)
class AssignEpoch:
    leader_epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class TruncateTo:
    offset: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class TruncateFullyAndStartAt:
    offset: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class AppendAsFollower:
    records: bytes
    base_offset: int


@dataclass(frozen=True, slots=True)
class AdvanceLogStartOffset:
    offset: int


@dataclass(frozen=True, slots=True)
class HighWatermarkChanged:
    high_watermark: int


@dataclass(frozen=True, slots=True)
class CompleteProduce:
    token: object
    error: ErrorCode
    base_offset: int
    log_start_offset: int
    message: str = ""


class IsrChangeKind(enum.Enum):
    EXPAND = "expand"
    SHRINK = "shrink"


@dataclass(frozen=True, slots=True)
class ProposeIsr:
    """AlterPartition for this partition. `new_isr_with_epochs` holds (broker id, broker epoch)."""

    proposal_id: int
    kind: IsrChangeKind
    leader_epoch: int
    partition_epoch: int
    new_isr_with_epochs: tuple[tuple[int, int], ...]
    leader_recovery_state: LeaderRecoveryState
    delay_ms: int = 0  # > 0 on a retry: wait this long before sending

    @property
    def new_isr(self) -> frozenset[int]:
        return frozenset(broker_id for broker_id, _ in self.new_isr_with_epochs)


@dataclass(frozen=True, slots=True)
class IsrUpdated:
    kind: IsrChangeKind
    old_isr: frozenset[int]
    new_isr: frozenset[int]
    partition_epoch: int


@dataclass(frozen=True, slots=True)
class StartFetching:
    leader_id: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class StopFetching:
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Backoff:
    delay_ms: int
    reason: str = ""


Effect = (
    AssignEpoch
    | TruncateTo
    | TruncateFullyAndStartAt
    | AppendAsFollower
    | AdvanceLogStartOffset
    | HighWatermarkChanged
    | CompleteProduce
    | ProposeIsr
    | IsrUpdated
    | StartFetching
    | StopFetching
    | Backoff
)


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """The per-partition settings the core needs (topic configs over broker defaults)."""

    min_insync_replicas: int = 1
    replica_lag_time_max_ms: int = 30_000
    replica_fetch_backoff_ms: int = 1_000
    alter_partition_retry_ms: int = 100
    max_pending_produces: int = 10_000
    # The follower may append a leader's batch starting above its LEO (a compacted topic, or a
    # log that may have gaps already: a cleaned leader log has gaps; Kafka's rule). Otherwise
    # the first batch of a fetch answer must start exactly at the LEO.
    offset_gaps_allowed: bool = False
