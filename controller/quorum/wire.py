"""QuorumService protobufs <-> the quorum core's domain messages (`messages.py`).

Pure conversions, no I/O. Every field from the network is untrusted: numbers are range-checked
here and a batch's records are decoded with `record_from_pb` (which refuses an unknown body),
so the core and the log only ever see well-formed values. `QuorumWireError` says what was wrong.
"""

from __future__ import annotations

from collections.abc import Sequence

from minibroker.controller.quorum.messages import (
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    EpochReply,
    FetchDecision,
    FetchRequest,
    FetchResponse,
    OffsetAndEpoch,
    VoteRequest,
    VoteResponse,
)
from minibroker.metadata.records import LogEntry
from minibroker.metadata.wire import entry_from_pb, entry_to_pb
from minibroker.proto import minibroker_pb2 as pb

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


class QuorumWireError(ValueError):
    """A QuorumService message that cannot be right (negative epoch, offsets out of order...)."""


def _epoch(value: int, what: str, *, allow_unknown: bool = False) -> int:
    low = -1 if allow_unknown else 0
    if not low <= value <= INT32_MAX:
        raise QuorumWireError(f"{what} {value} is out of range")
    return value


def _offset(value: int, what: str, *, allow_unknown: bool = False) -> int:
    low = -1 if allow_unknown else 0
    if not low <= value <= INT64_MAX:
        raise QuorumWireError(f"{what} {value} is out of range")
    return value


def error_name(code: int) -> str:
    if code == pb.NONE:
        return ""
    try:
        return pb.ErrorCode.Name(code)  # type: ignore[arg-type]
    except ValueError:
        return "UNKNOWN_SERVER_ERROR"


def error_code(name: str) -> int:
    return pb.NONE if not name else pb.ErrorCode.Value(name)


# -- Vote ------------------------------------------------------------------------------------


def vote_request_to_pb(req: VoteRequest, header: pb.QuorumHeader) -> pb.VoteRequest:
    return pb.VoteRequest(
        header=header,
        candidate_epoch=req.candidate_epoch,
        candidate_id=req.candidate_id,
        last_offset_epoch=req.last_offset_epoch,
        last_offset=req.last_offset,
        pre_vote=req.pre_vote,
    )


def vote_request_from_pb(msg: pb.VoteRequest) -> VoteRequest:
    candidate_epoch = _epoch(msg.candidate_epoch, "candidate epoch")
    last_offset_epoch = _epoch(msg.last_offset_epoch, "last offset epoch")
    # A candidate's log holds epochs it has been in, all below the one it asks votes for; a
    # higher claim would win any vote by Raft's up-to-date rule.
    if last_offset_epoch >= candidate_epoch:
        raise QuorumWireError(
            f"last offset epoch {last_offset_epoch} is not below the candidate epoch "
            f"{candidate_epoch}"
        )
    return VoteRequest(
        candidate_epoch=candidate_epoch,
        candidate_id=msg.candidate_id,
        last_offset_epoch=last_offset_epoch,
        last_offset=_offset(msg.last_offset, "last offset"),
        pre_vote=msg.pre_vote,
    )


def vote_response_to_pb(resp: VoteResponse) -> pb.VoteResponse:
    return pb.VoteResponse(
        error_code=error_code(resp.error),  # type: ignore[arg-type]
        leader_epoch=resp.leader_epoch,
        leader_id=resp.leader_id,
        vote_granted=resp.vote_granted,
        voter_id=resp.voter_id,
    )


def vote_response_from_pb(msg: pb.VoteResponse) -> VoteResponse:
    return VoteResponse(
        voter_id=msg.voter_id,
        leader_epoch=_epoch(msg.leader_epoch, "leader epoch"),
        leader_id=msg.leader_id,
        vote_granted=msg.vote_granted,
        error=error_name(msg.error_code),
    )


# -- BeginQuorumEpoch / EndQuorumEpoch ----------------------------------------------------------


def begin_request_from_pb(msg: pb.BeginQuorumEpochRequest) -> BeginQuorumEpochRequest:
    return BeginQuorumEpochRequest(_epoch(msg.leader_epoch, "leader epoch"), msg.leader_id)


def end_request_from_pb(msg: pb.EndQuorumEpochRequest) -> EndQuorumEpochRequest:
    return EndQuorumEpochRequest(
        _epoch(msg.leader_epoch, "leader epoch"),
        msg.leader_id,
        tuple(msg.preferred_successors),
    )


def epoch_reply_from_pb(msg: pb.BeginQuorumEpochResponse | pb.EndQuorumEpochResponse) -> EpochReply:
    return EpochReply(
        _epoch(msg.leader_epoch, "leader epoch"), msg.leader_id, error_name(msg.error_code)
    )


# -- Fetch -----------------------------------------------------------------------------------


def fetch_request_from_pb(msg: pb.QuorumFetchRequest) -> FetchRequest:
    current = _epoch(msg.current_leader_epoch, "current leader epoch")
    last_fetched = _epoch(msg.last_fetched_epoch, "last fetched epoch")
    if last_fetched > current:
        raise QuorumWireError(
            f"last fetched epoch {last_fetched} is above the current leader epoch {current}"
        )
    return FetchRequest(
        replica_id=msg.replica_id,
        current_leader_epoch=current,
        fetch_offset=_offset(msg.fetch_offset, "fetch offset"),
        last_fetched_epoch=last_fetched,
    )


def _pair(value: OffsetAndEpoch | None) -> pb.EpochEndOffset:
    if value is None:
        return pb.EpochEndOffset(epoch=-1, end_offset=-1)
    return pb.EpochEndOffset(epoch=value.epoch, end_offset=value.offset)


def fetch_response_to_pb(
    decision: FetchDecision, batches: Sequence[tuple[int, Sequence[LogEntry]]]
) -> pb.QuorumFetchResponse:
    snap = decision.snapshot_id
    return pb.QuorumFetchResponse(
        error_code=error_code(decision.error),  # type: ignore[arg-type]
        leader_epoch=decision.leader_epoch,
        leader_id=decision.leader_id,
        high_watermark=decision.high_watermark,
        log_start_offset=decision.log_start_offset,
        diverging_epoch=_pair(decision.diverging),
        snapshot_id=pb.SnapshotId(
            end_offset=snap.offset if snap else -1, epoch=snap.epoch if snap else -1
        ),
        batches=[
            pb.QuorumBatch(leader_epoch=epoch, records=[entry_to_pb(e) for e in entries])
            for epoch, entries in batches
        ],
    )


def fetch_response_from_pb(
    msg: pb.QuorumFetchResponse,
) -> tuple[FetchResponse, list[tuple[int, tuple[LogEntry, ...]]]]:
    """The core's summary and the decoded batches (epoch, entries). Batches must be non-empty,
    hold consecutive offsets and follow one another; epochs (of batches, of the diverging epoch
    and of the snapshot id) never go down and never exceed the leader's epoch."""
    leader_epoch = _epoch(msg.leader_epoch, "leader epoch")
    batches: list[tuple[int, tuple[LogEntry, ...]]] = []
    expected: int | None = None
    last_epoch = -1
    for batch in msg.batches:
        epoch = _epoch(batch.leader_epoch, "batch epoch")
        if epoch > leader_epoch or epoch < last_epoch:
            raise QuorumWireError(
                f"batch epoch {epoch} is out of order (leader epoch {leader_epoch}, "
                f"previous {last_epoch})"
            )
        if not batch.records:
            raise QuorumWireError("empty batch")
        entries = tuple(entry_from_pb(r) for r in batch.records)
        for entry in entries:
            if entry.offset < 0 or (expected is not None and entry.offset != expected):
                raise QuorumWireError(f"batch offset {entry.offset} does not follow {expected}")
            expected = entry.offset + 1
        batches.append((epoch, entries))
        last_epoch = epoch
    div = msg.diverging_epoch
    snap = msg.snapshot_id
    for what, epoch in (("diverging epoch", div.epoch), ("snapshot epoch", snap.epoch)):
        if epoch > leader_epoch:
            raise QuorumWireError(f"{what} {epoch} is above the leader epoch {leader_epoch}")
    summary = FetchResponse(
        leader_epoch=leader_epoch,
        leader_id=msg.leader_id,
        high_watermark=_offset(msg.high_watermark, "high watermark", allow_unknown=True),
        log_start_offset=_offset(msg.log_start_offset, "log start offset", allow_unknown=True),
        diverging=(
            OffsetAndEpoch(_offset(div.end_offset, "diverging end offset"), div.epoch)
            if msg.HasField("diverging_epoch") and div.epoch >= 0
            else None
        ),
        snapshot_id=(
            OffsetAndEpoch(snap.end_offset, _epoch(snap.epoch, "snapshot epoch"))
            if msg.HasField("snapshot_id") and snap.end_offset >= 0
            else None
        ),
        has_records=bool(batches),
        error=error_name(msg.error_code),
    )
    return summary, batches


__all__ = [
    "QuorumWireError",
    "begin_request_from_pb",
    "end_request_from_pb",
    "epoch_reply_from_pb",
    "error_code",
    "error_name",
    "fetch_request_from_pb",
    "fetch_response_from_pb",
    "fetch_response_to_pb",
    "vote_request_from_pb",
    "vote_request_to_pb",
    "vote_response_from_pb",
    "vote_response_to_pb",
]
