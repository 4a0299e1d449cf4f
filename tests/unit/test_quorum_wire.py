"""QuorumService protobufs -> domain messages (controller/quorum/wire.py): every byte from the
network is untrusted. A fetch answer whose batches have gaps, go backwards in epoch, claim an
epoch above the leader's, are empty, carry negative offsets or an unknown record body is refused
whole (QuorumWireError / ValueError) before anything reaches the log; vote and fetch requests
with out-of-range epochs or offsets are refused; an error code we do not know reads as
UNKNOWN_SERVER_ERROR. The good cases round-trip, so each refusal is about the one bad field."""

from __future__ import annotations

import pytest

from minibroker.controller.quorum import wire
from minibroker.controller.quorum.messages import (
    FetchAnswer,
    FetchDecision,
    OffsetAndEpoch,
    VoteRequest,
    VoteResponse,
)
from minibroker.controller.quorum.wire import QuorumWireError
from minibroker.metadata.records import LeaderChangeRecord, LogEntry, NoOpRecord
from minibroker.metadata.wire import entry_to_pb
from minibroker.proto import minibroker_pb2 as pb

HEADER = pb.QuorumHeader(cluster_id="c", sender_id=1000, voters="1000@h:1,1001@h:2")
INT32_MIN = -(2**31)
INT64_MIN = -(2**63)


def _record(offset: int) -> pb.MetadataRecord:
    return entry_to_pb(LogEntry(offset, 1, NoOpRecord()))


def _batch(epoch: int, *offsets: int) -> pb.QuorumBatch:
    return pb.QuorumBatch(leader_epoch=epoch, records=[_record(o) for o in offsets])


def _response(
    *batches: pb.QuorumBatch, leader_epoch: int = 5, **kw: object
) -> pb.QuorumFetchResponse:
    fields: dict[str, object] = {
        "leader_epoch": leader_epoch,
        "leader_id": 1000,
        "high_watermark": 3,
        "log_start_offset": 0,
    }
    fields.update(kw)
    return pb.QuorumFetchResponse(batches=list(batches), **fields)  # type: ignore[arg-type]


# -- fetch responses: the good case ----------------------------------------------------------


def test_consecutive_batches_of_rising_epochs_decode() -> None:
    summary, batches = wire.fetch_response_from_pb(
        _response(_batch(3, 10, 11), _batch(3, 12), _batch(5, 13, 14))
    )
    assert [(e, [x.offset for x in entries]) for e, entries in batches] == [
        (3, [10, 11]),
        (3, [12]),
        (5, [13, 14]),
    ]
    assert summary.has_records and summary.leader_epoch == 5 and summary.error == ""
    assert summary.diverging is None and summary.snapshot_id is None


def test_a_leaders_answer_round_trips() -> None:
    decision = FetchDecision(
        FetchAnswer.RECORDS, leader_epoch=4, leader_id=1001, high_watermark=7, log_start_offset=2
    )
    entries = (LogEntry(7, 9, LeaderChangeRecord(1001, 4, (1000, 1001), (1000, 1001))),)
    summary, batches = wire.fetch_response_from_pb(
        wire.fetch_response_to_pb(decision, [(4, entries)])
    )
    assert batches == [(4, entries)]
    assert (summary.leader_epoch, summary.leader_id, summary.high_watermark) == (4, 1001, 7)
    assert summary.log_start_offset == 2


def test_diverging_and_snapshot_ids_decode_and_their_absence_is_none() -> None:
    decision = FetchDecision(
        FetchAnswer.DIVERGING,
        leader_epoch=4,
        leader_id=1001,
        high_watermark=7,
        log_start_offset=0,
        diverging=OffsetAndEpoch(5, 2),
    )
    summary, _ = wire.fetch_response_from_pb(wire.fetch_response_to_pb(decision, []))
    assert summary.diverging == OffsetAndEpoch(5, 2)
    assert summary.snapshot_id is None  # sent as (-1, -1)
    snap = FetchDecision(
        FetchAnswer.SNAPSHOT,
        leader_epoch=4,
        leader_id=1001,
        high_watermark=7,
        log_start_offset=6,
        snapshot_id=OffsetAndEpoch(6, 3),
    )
    summary, _ = wire.fetch_response_from_pb(wire.fetch_response_to_pb(snap, []))
    assert summary.snapshot_id == OffsetAndEpoch(6, 3)
    assert summary.diverging is None


def test_unknown_high_watermark_and_log_start_are_allowed() -> None:
    summary, _ = wire.fetch_response_from_pb(_response(high_watermark=-1, log_start_offset=-1))
    assert summary.high_watermark == -1 and summary.log_start_offset == -1


# -- fetch responses: refused ----------------------------------------------------------------


@pytest.mark.parametrize(
    "batches",
    [
        pytest.param([_batch(3, 10, 12)], id="gap-inside-a-batch"),
        pytest.param([_batch(3, 10, 11), _batch(3, 13)], id="gap-between-batches"),
        pytest.param([_batch(3, 10, 11), _batch(3, 11)], id="overlap-between-batches"),
        pytest.param([_batch(3, 11, 10)], id="offsets-backwards"),
        pytest.param([_batch(3, 10, 10)], id="offset-repeated"),
    ],
)
def test_batches_with_gaps_or_out_of_order_offsets_are_refused(
    batches: list[pb.QuorumBatch],
) -> None:
    with pytest.raises(QuorumWireError, match="does not follow"):
        wire.fetch_response_from_pb(_response(*batches))


def test_a_batch_epoch_going_down_is_refused() -> None:
    with pytest.raises(QuorumWireError, match="out of order"):
        wire.fetch_response_from_pb(_response(_batch(4, 10), _batch(3, 11)))


@pytest.mark.parametrize("epoch", [6, 2**31 - 1], ids=["leader+1", "int32-max"])
def test_a_batch_epoch_above_the_leaders_is_refused(epoch: int) -> None:
    with pytest.raises(QuorumWireError, match="out of order"):
        wire.fetch_response_from_pb(_response(_batch(epoch, 10), leader_epoch=5))


def test_a_batch_at_the_leaders_epoch_is_fine() -> None:
    _, batches = wire.fetch_response_from_pb(_response(_batch(5, 10), leader_epoch=5))
    assert batches[0][0] == 5


@pytest.mark.parametrize("epoch", [-1, INT32_MIN])
def test_a_negative_batch_epoch_is_refused(epoch: int) -> None:
    with pytest.raises(QuorumWireError, match="batch epoch"):
        wire.fetch_response_from_pb(_response(_batch(epoch, 10)))


@pytest.mark.parametrize("where", ["only", "after-a-good-one"])
def test_an_empty_batch_is_refused(where: str) -> None:
    batches = [_batch(3)] if where == "only" else [_batch(3, 10), _batch(3)]
    with pytest.raises(QuorumWireError, match="empty batch"):
        wire.fetch_response_from_pb(_response(*batches))


@pytest.mark.parametrize("offset", [-1, INT64_MIN])
def test_a_negative_record_offset_is_refused(offset: int) -> None:
    with pytest.raises(QuorumWireError, match="does not follow"):
        wire.fetch_response_from_pb(_response(_batch(3, offset)))


def test_a_record_without_a_known_body_is_refused() -> None:
    bodiless = pb.MetadataRecord(offset=11, timestamp_ms=1)  # no oneof set: unknown to us
    response = _response(_batch(3, 10))
    response.batches[0].records.append(bodiless)
    with pytest.raises(ValueError, match="known body"):
        wire.fetch_response_from_pb(response)


def test_a_record_body_from_a_newer_schema_is_refused() -> None:
    # Field 99 of MetadataRecord is unknown here: it parses as an unknown field, no body.
    future = pb.MetadataRecord.FromString(
        pb.MetadataRecord(offset=10, timestamp_ms=1).SerializeToString() + b"\x9a\x06\x00"
    )
    response = _response()
    response.batches.add(leader_epoch=3).records.append(future)
    with pytest.raises(ValueError, match="known body"):
        wire.fetch_response_from_pb(response)


@pytest.mark.parametrize(
    "field,value",
    [
        ("leader_epoch", -1),
        ("high_watermark", -2),
        ("high_watermark", INT64_MIN),
        ("log_start_offset", -2),
    ],
)
def test_out_of_range_summary_numbers_are_refused(field: str, value: int) -> None:
    with pytest.raises(QuorumWireError, match="out of range"):
        wire.fetch_response_from_pb(_response(**{field: value}))


def test_a_diverging_epoch_with_a_negative_end_offset_is_refused() -> None:
    response = _response(diverging_epoch=pb.EpochEndOffset(epoch=2, end_offset=-1))
    with pytest.raises(QuorumWireError, match="diverging end offset"):
        wire.fetch_response_from_pb(response)


@pytest.mark.parametrize(
    "field,value",
    [
        ("diverging_epoch", pb.EpochEndOffset(epoch=6, end_offset=3)),
        ("snapshot_id", pb.SnapshotId(end_offset=3, epoch=6)),
    ],
)
def test_a_diverging_or_snapshot_epoch_above_the_leaders_is_refused(
    field: str, value: object
) -> None:
    with pytest.raises(QuorumWireError, match="above the leader epoch 5"):
        wire.fetch_response_from_pb(_response(leader_epoch=5, **{field: value}))
    at_leader = type(value)()  # type: ignore[operator]
    at_leader.CopyFrom(value)
    at_leader.epoch = 5
    assert wire.fetch_response_from_pb(_response(leader_epoch=5, **{field: at_leader}))


def test_a_snapshot_id_with_a_negative_epoch_is_refused() -> None:
    response = _response(snapshot_id=pb.SnapshotId(end_offset=5, epoch=-1))
    with pytest.raises(QuorumWireError, match="snapshot epoch"):
        wire.fetch_response_from_pb(response)


# -- requests --------------------------------------------------------------------------------


def _vote(**kw: object) -> pb.VoteRequest:
    fields: dict[str, object] = {
        "header": HEADER,
        "candidate_epoch": 4,
        "candidate_id": 1001,
        "last_offset_epoch": 3,
        "last_offset": 10,
    }
    fields.update(kw)
    return pb.VoteRequest(**fields)  # type: ignore[arg-type]


def test_a_vote_request_round_trips() -> None:
    req = VoteRequest(4, 1001, 3, 10, pre_vote=True)
    assert wire.vote_request_from_pb(wire.vote_request_to_pb(req, HEADER)) == req


@pytest.mark.parametrize(
    "field,value",
    [
        ("candidate_epoch", -1),
        ("candidate_epoch", INT32_MIN),
        ("last_offset_epoch", -1),
        ("last_offset", -1),
        ("last_offset", INT64_MIN),
    ],
)
def test_vote_requests_with_out_of_range_numbers_are_refused(field: str, value: int) -> None:
    with pytest.raises(QuorumWireError, match="out of range"):
        wire.vote_request_from_pb(_vote(**{field: value}))


@pytest.mark.parametrize("last_offset_epoch", [4, 5, 2**31 - 1])
def test_a_vote_request_claiming_a_log_epoch_at_or_above_its_candidate_epoch_is_refused(
    last_offset_epoch: int,
) -> None:
    # Such a log would win every vote by the up-to-date rule; no candidate can hold one.
    with pytest.raises(QuorumWireError, match="not below the candidate epoch"):
        wire.vote_request_from_pb(_vote(candidate_epoch=4, last_offset_epoch=last_offset_epoch))
    assert wire.vote_request_from_pb(_vote(candidate_epoch=4, last_offset_epoch=3))


def _fetch(**kw: object) -> pb.QuorumFetchRequest:
    fields: dict[str, object] = {
        "header": HEADER,
        "replica_id": 1000,
        "current_leader_epoch": 4,
        "fetch_offset": 10,
        "last_fetched_epoch": 3,
    }
    fields.update(kw)
    return pb.QuorumFetchRequest(**fields)  # type: ignore[arg-type]


def test_a_fetch_request_decodes() -> None:
    req = wire.fetch_request_from_pb(_fetch())
    assert (req.replica_id, req.current_leader_epoch, req.fetch_offset) == (1000, 4, 10)
    assert req.last_fetched_epoch == 3


@pytest.mark.parametrize(
    "field,value",
    [
        ("current_leader_epoch", -1),
        ("current_leader_epoch", INT32_MIN),
        ("fetch_offset", -1),
        ("fetch_offset", INT64_MIN),
        ("last_fetched_epoch", -1),
    ],
)
def test_fetch_requests_with_out_of_range_numbers_are_refused(field: str, value: int) -> None:
    with pytest.raises(QuorumWireError, match="out of range"):
        wire.fetch_request_from_pb(_fetch(**{field: value}))


def test_a_fetch_request_whose_last_fetched_epoch_passes_its_leader_epoch_is_refused() -> None:
    with pytest.raises(QuorumWireError, match="above the current leader epoch"):
        wire.fetch_request_from_pb(_fetch(current_leader_epoch=4, last_fetched_epoch=5))
    assert wire.fetch_request_from_pb(_fetch(current_leader_epoch=4, last_fetched_epoch=4))


@pytest.mark.parametrize(
    "decode,msg",
    [
        (wire.begin_request_from_pb, pb.BeginQuorumEpochRequest(leader_epoch=-1, leader_id=1)),
        (wire.end_request_from_pb, pb.EndQuorumEpochRequest(leader_epoch=-1, leader_id=1)),
        (wire.vote_response_from_pb, pb.VoteResponse(leader_epoch=-1)),
        (wire.epoch_reply_from_pb, pb.BeginQuorumEpochResponse(leader_epoch=-1)),
    ],
    ids=["begin", "end", "vote-response", "epoch-reply"],
)
def test_other_messages_with_a_negative_epoch_are_refused(decode: object, msg: object) -> None:
    with pytest.raises(QuorumWireError, match="out of range"):
        decode(msg)  # type: ignore[operator]


# -- error codes -----------------------------------------------------------------------------


def test_known_error_codes_keep_their_names_and_none_is_empty() -> None:
    assert wire.error_name(pb.NONE) == ""
    assert wire.error_name(pb.FENCED_LEADER_EPOCH) == "FENCED_LEADER_EPOCH"
    assert wire.error_code("") == pb.NONE
    assert wire.error_code("NOT_LEADER_OR_FOLLOWER") == pb.NOT_LEADER_OR_FOLLOWER


@pytest.mark.parametrize("code", [9999, -77, 2**31 - 1])
def test_unknown_error_codes_read_as_unknown_server_error(code: int) -> None:
    assert wire.error_name(code) == "UNKNOWN_SERVER_ERROR"
    # The same through a parsed message (proto3 keeps unknown enum values as ints).
    raw = pb.VoteResponse(leader_epoch=2, leader_id=1, voter_id=1001)
    raw.error_code = code  # type: ignore[assignment]
    parsed = wire.vote_response_from_pb(pb.VoteResponse.FromString(raw.SerializeToString()))
    assert parsed == VoteResponse(1001, 2, 1, False, "UNKNOWN_SERVER_ERROR")
    fetch = _response()
    fetch.error_code = code  # type: ignore[assignment]
    summary, _ = wire.fetch_response_from_pb(
        pb.QuorumFetchResponse.FromString(fetch.SerializeToString())
    )
    assert summary.error == "UNKNOWN_SERVER_ERROR"
