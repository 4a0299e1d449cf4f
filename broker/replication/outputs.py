"""What the replica engine (engine.py) is configured with and hands back: replies and outputs.

Pure: frozen (or per-call) dataclasses, no I/O. Every entry point of `BrokerReplicas` returns
`(reply, outputs)`: the reply answers the request (a produce, a fetch, an offset lookup), the
outputs are what only an I/O shell can do, in the order it must do them (answer a produce
future by token, send AlterPartition, start or stop a fetcher, wake long polls, log and count,
reconfigure or delete a log, report the log dir failed). The broker's shell (broker/replicas/)
and the simulation (tests/sim) carry them out, importing them from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from minibroker.broker.replication.events import (
    CompleteProduce,
    IsrUpdated,
    ProposeIsr,
    Role,
)
from minibroker.client.errors import ErrorCode
from minibroker.client.types import TopicPartition

# ------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The broker settings the engine decides with (broker/config.py names in comments)."""

    broker_id: int  # node.id
    log_dir: str = ""  # the data dir, named in KAFKA_STORAGE_ERROR messages
    rack: str = ""  # broker.rack
    rack_aware_selector: bool = False  # replica.selector.class == RackAwareReplicaSelector
    replica_lag_time_max_ms: int = 30_000
    replica_fetch_backoff_ms: int = 1_000
    replica_fetch_max_bytes: int = 1_048_576
    max_pending_produces: int = 1_000  # queued.max.requests
    topic_defaults: Mapping[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------
# Outputs: what the I/O shell must do, in list order


@dataclass(frozen=True, slots=True)
class SendAlterPartition:
    """Send `proposal` to the controller (after `proposal.delay_ms`); hand its answer to
    `on_alter_partition_result(tp, generation, ...)`."""

    tp: TopicPartition
    topic_id: str
    generation: int
    proposal: ProposeIsr


@dataclass(frozen=True, slots=True)
class StartFollowing:
    """(Re)start fetching `tp` from `leader_id`."""

    tp: TopicPartition
    leader_id: int


@dataclass(frozen=True, slots=True)
class StopFollowing:
    tp: TopicPartition
    reason: str = ""


@dataclass(frozen=True, slots=True)
class FetchBackoff:
    """The follower waits `delay_ms` before fetching `tp` again (logged only)."""

    tp: TopicPartition
    delay_ms: int
    reason: str


@dataclass(frozen=True, slots=True)
class WakeFollowerFetches:
    """New data at the leader: wake the followers' long polls on `tp`."""

    tp: TopicPartition


@dataclass(frozen=True, slots=True)
class HighWatermarkMoved:
    """The HW of `tp` moved: wake the consumers' long polls (they read up to the HW)."""

    tp: TopicPartition
    high_watermark: int


@dataclass(frozen=True, slots=True)
class WakeFetches:
    """Wake every long poll on `tp` (its role, ISR or hosting changed: they answer now)."""

    tp: TopicPartition


@dataclass(frozen=True, slots=True)
class Appended:
    """Batches were appended to `tp` (for metrics and the flush policy)."""

    tp: TopicPartition
    as_leader: bool
    base_offset: int
    next_offset: int
    leader_epoch: int
    records: int  # record count (0 for a follower append: not counted)
    size: int  # bytes: valid bytes on the leader, fetched bytes on a follower


@dataclass(frozen=True, slots=True)
class CorruptProduce:
    """A produce's batches failed their CRC check (counted)."""

    tp: TopicPartition


@dataclass(frozen=True, slots=True)
class Truncated:
    tp: TopicPartition
    fully: bool
    from_offset: int
    to_offset: int  # the LEO after (the new start offset when `fully`)
    reason: str
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class IsrChanged:
    tp: TopicPartition
    update: IsrUpdated
    leader_epoch: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class RoleChanged:
    """This replica's role or leader epoch changed on a partition record."""

    tp: TopicPartition
    role: Role
    leader: int
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]
    leo: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class LogConfigChanged:
    """The topic's configs changed: reconfigure the log of `tp` with them."""

    tp: TopicPartition
    configs: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class ReplicaRemoved:
    """`tp` is no longer hosted: stop fetching it, delete its log when `delete`."""

    tp: TopicPartition
    delete: bool
    reason: str


@dataclass(frozen=True, slots=True)
class FollowerAppendFailed:
    """The leader's batches for `tp` could not be appended (or a truncation stopped part
    way); the fetch counts as failed and the follower backs off."""

    tp: TopicPartition
    leader_id: int
    error: str


@dataclass(frozen=True, slots=True)
class PartitionApplyFailed:
    """Acting on the record of `tp` failed with a non-storage error (logged; the others go
    on)."""

    tp: TopicPartition
    error: BaseException


@dataclass(frozen=True, slots=True)
class LogDirFailed:
    """The data dir failed during `operation`: report it; every partition serves
    KAFKA_STORAGE_ERROR with `serving_error` from now on."""

    operation: str
    error: BaseException
    serving_error: str
    partitions: int
    leaderships: int


Output = (
    CompleteProduce
    | SendAlterPartition
    | StartFollowing
    | StopFollowing
    | FetchBackoff
    | WakeFollowerFetches
    | HighWatermarkMoved
    | WakeFetches
    | Appended
    | CorruptProduce
    | Truncated
    | IsrChanged
    | RoleChanged
    | LogConfigChanged
    | ReplicaRemoved
    | FollowerAppendFailed
    | PartitionApplyFailed
    | LogDirFailed
)


# ------------------------------------------------------------------------------------------
# Replies


@dataclass(slots=True)
class ProduceReply:
    """One partition's produce answer. With `token`, an acks=all produce waits: the shell
    awaits the CompleteProduce output carrying this token (possibly in this very call's
    outputs) and answers REQUEST_TIMED_OUT at its deadline."""

    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    leader: tuple[int, int] | None = None  # (leader id, leader epoch) with NOT_LEADER
    token: int | None = None


@dataclass(slots=True)
class FetchReply:
    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    diverging_epoch: tuple[int, int] | None = None
    current_leader: tuple[int, int] | None = None
    preferred_read_replica: int = -1
    records: bytes = b""


@dataclass(slots=True)
class ListOffsetsReply:
    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    timestamp: int = -1
    offset: int = -1
    leader_epoch: int = -1


@dataclass(slots=True)
class EpochEndOffsetReply:
    error: ErrorCode = ErrorCode.NONE
    message: str = ""
    leader_epoch: int = -1
    end_offset: int = -1


@dataclass(frozen=True, slots=True)
class FollowerProgress:
    replica_id: int
    log_end_offset: int
    last_caught_up_time_ms: int


@dataclass(frozen=True, slots=True)
class ReplicaDescription:
    """One hosted replica as DescribeReplicas shows it."""

    tp: TopicPartition
    is_leader: bool
    leader_id: int
    leader_epoch: int
    partition_epoch: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    isr: tuple[int, ...]
    maximal_isr: tuple[int, ...]
    followers: tuple[FollowerProgress, ...]


@dataclass(frozen=True, slots=True)
class Gauges:
    under_replicated: int
    under_min_isr: int
    at_min_isr: int
    leaders: int
    partitions: int
    max_lag: int
    pending_produces: int
