"""What `watch` observes of the cluster besides the metadata log: the brokers' DescribeReplicas
answers (replica states and truncations), the controller's DescribeCluster answer, the local
launcher's processes, and whether each process answered. Plain values; pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

CONTROLLER = "controller"  # the key of the controller among the local processes


@dataclass(frozen=True, slots=True)
class FollowerReport:
    """The leader's view of one follower; `leo` is -1 until it fetched in this leader epoch."""

    replica_id: int
    leo: int
    last_caught_up_time_ms: int


@dataclass(frozen=True, slots=True)
class TruncationReport:
    """A replica's last follower truncation as its broker described it; `to_offset` is the new
    log start offset when `fully` (the whole log was dropped)."""

    timestamp_ms: int
    from_offset: int
    to_offset: int
    fully: bool = False
    reason: str = ""
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """One replica as its broker described it (DescribeReplicas). hw <= leo."""

    topic: str
    partition: int
    is_leader: bool
    leader_id: int
    leader_epoch: int
    partition_epoch: int
    log_start_offset: int
    leo: int
    high_watermark: int
    isr: tuple[int, ...] = ()
    maximal_isr: tuple[int, ...] = ()
    followers: tuple[FollowerReport, ...] = ()
    size_bytes: int = 0
    truncations: int = 0  # since the broker process began hosting it
    last_truncation: TruncationReport | None = None


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """Where a broker listens, as the launcher's cluster.json or a Metadata answer says."""

    host: str
    port: int
    rack: str = ""


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """The controller's DescribeCluster answer, in the parts `watch` shows."""

    cluster_id: str
    controller_id: int
    metadata_offset: int
    heartbeat_ms_ago: Mapping[int, int] = field(default_factory=dict)  # -1: not since it started


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """A local process as the launcher's cluster.json and /proc say: running, paused, stopped."""

    state: str
    pid: int = 0


@dataclass(slots=True)
class Reachability:
    """Whether the last RPC to a process worked; `since_ms` is when that last changed."""

    reachable: bool | None = None  # None: not tried yet
    since_ms: int = 0
    error: str = ""


@dataclass(slots=True)
class BrokerProbe:
    reach: Reachability = field(default_factory=Reachability)
    reports: dict[tuple[str, int], ReplicaReport] = field(default_factory=dict)
    # Per replica, the truncation count and last truncation already on the timeline.
    truncations: dict[tuple[str, int], tuple[int, TruncationReport]] = field(default_factory=dict)
