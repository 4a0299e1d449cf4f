"""What `watch` observes of the cluster besides the metadata log: the brokers' DescribeReplicas
answers (replica states and truncations), the controller's DescribeCluster answer, the controller
quorum's DescribeQuorum answers, the local launcher's processes and network faults
(`faults.json`), and whether each process answered. Plain values; pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# The key of the controller among the local processes (a quorum of one); the voters of a larger
# quorum are keyed controller-1, controller-2, ... (the launcher's names).
CONTROLLER = "controller"
NO_QUORUM_LEADER = -1


def is_controller_key(key: str) -> bool:
    return key == CONTROLLER or key.startswith(CONTROLLER + "-")


@dataclass(frozen=True, slots=True)
class QuorumAnswer:
    """One voter's DescribeQuorum answer, in the parts `watch` shows."""

    node_id: int
    role: str
    leader_id: int = NO_QUORUM_LEADER
    leader_epoch: int = -1
    leader_address: str = ""
    high_watermark: int = -1
    why_no_leader: str = ""


@dataclass(frozen=True, slots=True)
class QuorumInfo:
    """The controller quorum as the voters that answered describe it. `leader_id` -1: none
    known; `epoch` -1: unknown. `voters`: how many were asked, `answered`: how many answered."""

    leader_id: int
    epoch: int
    leader_address: str = ""
    high_watermark: int = -1
    why_no_leader: str = ""
    voters: int = 0
    answered: int = 0


@dataclass(frozen=True, slots=True)
class FaultsInfo:
    """The local launcher's network faults (`faults.json`, deploy/netfaults.py): whether any is
    set, and the sentences of the commands that set them, (wall-clock ms, text) oldest first."""

    generation: int = 0
    active: bool = False
    events: tuple[tuple[int, str], ...] = ()


def faults_from_json(data: object) -> FaultsInfo | None:
    """faults.json's content as `watch` needs it; None for anything that is not a fault table
    (the processes ignore such a file too)."""
    if not isinstance(data, dict) or data.get("version") != 1:
        return None
    try:
        active = bool(data.get("cut") or data.get("no_clients") or data.get("slow"))
        events = tuple(
            (round(float(e["at"]) * 1000), str(e["text"])) for e in data.get("events") or []
        )
        return FaultsInfo(int(data.get("generation") or 0), active, events)
    except (TypeError, ValueError, KeyError):
        return None


def merge_quorum_answers(answers: Sequence[QuorumAnswer], asked: int) -> QuorumInfo | None:
    """One view of the quorum from several voters' answers: the voter that says it leads at the
    highest epoch, else the leader the others name at the highest epoch, else no leader with
    the reasons they give. None when nobody answered."""
    if not answers:
        return None
    leaders = [a for a in answers if a.role == "leader"]
    if leaders:
        best = max(leaders, key=lambda a: a.leader_epoch)
        return QuorumInfo(
            best.node_id,
            best.leader_epoch,
            best.leader_address,
            best.high_watermark,
            "",
            asked,
            len(answers),
        )
    named = [a for a in answers if a.leader_id != NO_QUORUM_LEADER]
    epoch = max(a.leader_epoch for a in answers)
    if named:
        best = max(named, key=lambda a: a.leader_epoch)
        return QuorumInfo(
            best.leader_id, best.leader_epoch, best.leader_address, -1, "", asked, len(answers)
        )
    reasons = list(dict.fromkeys(a.why_no_leader for a in answers if a.why_no_leader))
    if len(answers) * 2 <= asked:
        reasons.insert(0, f"no majority: {asked - len(answers)} of {asked} voters not answering")
    return QuorumInfo(
        NO_QUORUM_LEADER,
        epoch,
        "",
        -1,
        "; ".join(reasons) or "election in progress",
        asked,
        len(answers),
    )


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
class CleanerRunReport:
    """A replica's last log cleaner round as its broker described it (issue 21): `outcome` is
    cleaned, aborted (the log changed under it) or failed; offsets below `end_offset` are clean
    after a cleaned round."""

    timestamp_ms: int
    outcome: str
    first_dirty_offset: int
    end_offset: int
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0
    elapsed_ms: int = 0
    error: str = ""


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
    cleaner_runs: int = 0  # cleaner rounds ended for it since the broker process started
    last_cleaner_run: CleanerRunReport | None = None


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
    # Per replica, the cleaner round count and last round already on the timeline.
    cleaner_runs: dict[tuple[str, int], tuple[int, CleanerRunReport]] = field(default_factory=dict)
