"""The seam of the quorum core (`core.py`): its inputs, its effects and the log view it reads.

Pure: frozen dataclasses and one Protocol, no I/O. Names follow KIP-595 and Kafka's
`raft/` module (KafkaRaftClient, QuorumState, EpochState). Offsets are END offsets
(exclusive), as in Kafka: a log holding offsets 0..9 has end offset 10.

The shell (`controller/quorum/shell.py`) applies a list of effects IN ORDER: `PersistState`
before any send (a vote or an epoch is durable before anyone hears of it), log changes
(`Truncate`, `AppendLeaderChange`) before sends, and reports back through the core's
`on_*` methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

NO_LEADER = -1
NO_VOTE = -1


class Role(StrEnum):
    UNATTACHED = "unattached"  # knows the epoch, no leader, has not voted in it (or has: voted_for)
    PROSPECTIVE = "prospective"  # KIP-996: asking for pre-votes, epoch not bumped
    CANDIDATE = "candidate"  # epoch bumped, voted for itself, asking for votes
    LEADER = "leader"
    FOLLOWER = "follower"  # knows the leader of its epoch and fetches from it
    RESIGNED = "resigned"  # was leader in this epoch, stepped down (shutdown or check-quorum)


# `QuorumState.catching_up_to` values (see the core's "wiped voter" rule).
CAUGHT_UP = -1  # votes by Raft's rule
CATCH_UP_UNKNOWN = -2  # empty log, no quorum-state file: votes only for empty-log candidates


@dataclass(frozen=True, slots=True)
class QuorumState:
    """What survives a restart (the `quorum-state` file, written atomically before any send)."""

    epoch: int = 0
    voted_for: int = NO_VOTE  # in `epoch`; never two different votes in one epoch
    leader_id: int = NO_LEADER  # of `epoch`, when known
    # A voter that came up with an empty log and no quorum-state file may have lost its disk: it
    # grants votes only to candidates whose log is empty too, until it has fetched from a leader
    # up to that leader's high watermark (then this becomes CAUGHT_UP). >= 0: the HW to reach.
    catching_up_to: int = CAUGHT_UP


@dataclass(frozen=True, slots=True)
class OffsetAndEpoch:
    offset: int
    epoch: int


class RaftLogView(Protocol):
    """What the core may read of the local log (the shell's durable log, the sim's memory log).
    Only durable (fsynced) records are visible here."""

    @property
    def start_offset(self) -> int:
        """The end offset of the latest snapshot (0 with none): the first offset held."""
        ...

    @property
    def end_offset(self) -> int: ...

    def last_fetched_epoch(self) -> int:
        """Epoch of the last record, or of the snapshot when the log holds no record after it;
        0 for an empty log."""
        ...

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        """Kafka's `endOffsetForEpoch`: the largest epoch <= `epoch` held, with the end offset
        of that epoch (the start offset of the next epoch, or the log end). For an epoch below
        the log's first epoch: OffsetAndEpoch(start_offset, snapshot epoch) when the snapshot
        covers it, else OffsetAndEpoch(-1, -1)."""
        ...

    def epoch_of(self, offset: int) -> int:
        """The epoch of the record at `offset` (start_offset <= offset < end_offset); the
        snapshot's epoch for offset == start_offset - 1; -1 when not held."""
        ...


@dataclass(frozen=True, slots=True)
class VoterAddress:
    voter_id: int
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.voter_id}@{self.host}:{self.port}"


# -- requests and responses (domain form of the QuorumService protobufs) --------------------


@dataclass(frozen=True, slots=True)
class VoteRequest:
    candidate_epoch: int
    candidate_id: int
    last_offset_epoch: int
    last_offset: int  # the candidate's log end offset
    pre_vote: bool = False


@dataclass(frozen=True, slots=True)
class VoteResponse:
    voter_id: int
    leader_epoch: int  # the responder's epoch
    leader_id: int
    vote_granted: bool
    error: str = ""  # "" or an ErrorCode name (FENCED_LEADER_EPOCH, INCONSISTENT_VOTER_SET...)
    # Which request this answers (the shell copies it from the request it sent): a pre-vote
    # grant must never be counted as a real vote, even when it arrives late in the same epoch.
    pre_vote: bool = False


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochRequest:
    leader_epoch: int
    leader_id: int


@dataclass(frozen=True, slots=True)
class EndQuorumEpochRequest:
    leader_epoch: int
    leader_id: int
    preferred_successors: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class EpochReply:
    """BeginQuorumEpoch's and EndQuorumEpoch's answer: the responder's view after handling."""

    leader_epoch: int
    leader_id: int
    error: str = ""


@dataclass(frozen=True, slots=True)
class FetchRequest:
    replica_id: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int


class FetchAnswer(StrEnum):
    RECORDS = "records"  # read from fetch_offset (maybe nothing yet: the shell long-polls)
    DIVERGING = "diverging"  # the follower must truncate: see `diverging`
    SNAPSHOT = "snapshot"  # fetch_offset is below the log start: see `snapshot_id`
    ERROR = "error"  # see `error`


@dataclass(frozen=True, slots=True)
class FetchDecision:
    """The leader's decision on a Fetch; the shell fills in the records for RECORDS."""

    answer: FetchAnswer
    leader_epoch: int
    leader_id: int
    high_watermark: int
    log_start_offset: int
    diverging: OffsetAndEpoch | None = None  # (end offset, epoch)
    snapshot_id: OffsetAndEpoch | None = None  # (end offset, epoch)
    error: str = ""  # NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, ...


@dataclass(frozen=True, slots=True)
class FetchResponse:
    """What a follower's shell tells the core of a Fetch answer (records are the shell's)."""

    leader_epoch: int
    leader_id: int
    high_watermark: int
    log_start_offset: int
    diverging: OffsetAndEpoch | None = None
    snapshot_id: OffsetAndEpoch | None = None
    has_records: bool = False
    error: str = ""


class FetchAction(StrEnum):
    APPEND = "append"  # append the response's batches (epochs <= leader epoch), then call
    # `core.follower_appended(leader_hw, now)`
    TRUNCATE = "truncate"  # truncate the log to `offset`, then fetch again
    FETCH_SNAPSHOT = "fetch_snapshot"  # load the snapshot `snapshot_id` from the leader
    IGNORE = "ignore"  # stale or refused: drop the response (maybe the role changed)


@dataclass(frozen=True, slots=True)
class FetchResponseDecision:
    action: FetchAction
    offset: int = -1  # TRUNCATE's target
    snapshot_id: OffsetAndEpoch | None = None


# -- effects ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PersistState:
    state: QuorumState


@dataclass(frozen=True, slots=True)
class SendVote:
    to: int
    request: VoteRequest


@dataclass(frozen=True, slots=True)
class SendBeginQuorumEpoch:
    to: int
    request: BeginQuorumEpochRequest


@dataclass(frozen=True, slots=True)
class SendEndQuorumEpoch:
    to: int
    request: EndQuorumEpochRequest


@dataclass(frozen=True, slots=True)
class AppendLeaderChange:
    """This node just became leader of `epoch`: append a LeaderChangeRecord at the log end with
    this epoch (the first record of the epoch), then call `core.leader_appended(now)`."""

    epoch: int
    voters: tuple[int, ...]
    granting_voters: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RoleChanged:
    """The role, epoch or leader changed. The shell re-points its fetcher, fails a lost
    leadership's pending commands with NOT_CONTROLLER, starts the controller once the leader's
    LeaderChange is committed (see `HighWatermark`)."""

    role: Role
    epoch: int
    leader_id: int
    reason: str  # "elected", "higher_epoch", "fetch_timeout", "check_quorum", "shutdown", ...


@dataclass(frozen=True, slots=True)
class HighWatermark:
    """The committed offset moved forward: everything below `offset` is committed and may be
    applied, answered and streamed. Never goes backwards (a restart starts from the log start
    and learns it again)."""

    offset: int


@dataclass(frozen=True, slots=True)
class Event:
    """Something an operator wants in the log and the timeline (name and fields)."""

    name: str
    fields: dict[str, object] = field(default_factory=dict)


Effect = (
    PersistState
    | SendVote
    | SendBeginQuorumEpoch
    | SendEndQuorumEpoch
    | AppendLeaderChange
    | RoleChanged
    | HighWatermark
    | Event
)


@dataclass(frozen=True, slots=True)
class QuorumSettings:
    node_id: int
    voters: tuple[int, ...]  # sorted voter ids (controller.quorum.voters)
    election_timeout_ms: int = 1000
    fetch_timeout_ms: int = 2000
    election_backoff_max_ms: int = 1000


@dataclass(frozen=True, slots=True)
class VoterProgress:
    """The leader's view of one voter (DescribeQuorum)."""

    voter_id: int
    log_end_offset: int  # -1 unknown
    last_fetch_ms: int  # -1 never
    last_caught_up_ms: int  # -1 never


__all__ = [
    "CATCH_UP_UNKNOWN",
    "CAUGHT_UP",
    "NO_LEADER",
    "NO_VOTE",
    "AppendLeaderChange",
    "BeginQuorumEpochRequest",
    "Effect",
    "EndQuorumEpochRequest",
    "EpochReply",
    "Event",
    "FetchAction",
    "FetchAnswer",
    "FetchDecision",
    "FetchRequest",
    "FetchResponse",
    "FetchResponseDecision",
    "HighWatermark",
    "OffsetAndEpoch",
    "PersistState",
    "QuorumSettings",
    "QuorumState",
    "RaftLogView",
    "Role",
    "RoleChanged",
    "SendBeginQuorumEpoch",
    "SendEndQuorumEpoch",
    "SendVote",
    "VoteRequest",
    "VoteResponse",
    "VoterAddress",
    "VoterProgress",
]
