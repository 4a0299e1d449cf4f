"""broker/wire.py: ISR proposals of many partitions in one AlterPartition request, and each
partition's answer matched back to its proposal (Kafka's AlterPartitionManager batching)."""

from __future__ import annotations

from minibroker.broker import wire
from minibroker.broker.replication.events import IsrChangeKind, LeaderRecoveryState, ProposeIsr
from minibroker.client.errors import ErrorCode
from minibroker.controller import wire as cwire
from minibroker.proto import minibroker_pb2 as pb


def proposal(pid: int, isr: tuple[int, ...]) -> ProposeIsr:
    return ProposeIsr(
        pid,
        IsrChangeKind.EXPAND,
        3,
        7,
        tuple((b, 10 + b) for b in isr),
        LeaderRecoveryState.RECOVERED,
    )


ASKED = [
    ("t1", 0, proposal(1, (1, 2))),
    ("t2", 5, proposal(2, (1, 3))),
    ("t1", 4, proposal(3, (1,))),
]


def test_one_request_groups_the_proposals_by_topic_and_the_controller_reads_them_all() -> None:
    request = wire.encode_alter_partitions(ASKED)
    assert [(t.topic_id, [p.partition for p in t.partitions]) for t in request.topics] == [
        ("t1", [0, 4]),
        ("t2", [5]),
    ]
    decoded = cwire.alter_partition_request(request)
    assert sorted(
        (p.topic_id, p.partition, tuple(m.broker_id for m in p.new_isr)) for p in decoded.proposals
    ) == [
        ("t1", 0, (1, 2)),
        ("t1", 4, (1,)),
        ("t2", 5, (1, 3)),
    ]
    assert {(p.leader_epoch, p.partition_epoch) for p in decoded.proposals} == {(3, 7)}


def _answer(
    topic_id: str, partition: int, code: ErrorCode, isr: list[int]
) -> pb.AlterPartitionTopicResponse:
    return pb.AlterPartitionTopicResponse(
        topic_id=topic_id,
        partitions=[
            pb.AlterPartitionPartitionResponse(
                partition=partition,
                error_code=int(code),
                leader_epoch=3,
                partition_epoch=8,
                isr=isr,  # type: ignore[arg-type]
            )
        ],
    )


def test_each_answer_goes_to_its_own_proposal_and_a_missing_one_is_an_error() -> None:
    response = pb.AlterPartitionResponse(
        topics=[
            _answer("t2", 5, ErrorCode.NONE, [1, 3]),
            _answer("t1", 0, ErrorCode.FENCED_LEADER_EPOCH, []),
        ]
    )
    asked = [(t, p, prop.proposal_id) for t, p, prop in ASKED]
    results = wire.decode_alter_partitions(asked, response)
    assert [(r.proposal_id, r.error) for r in results] == [
        (1, ErrorCode.FENCED_LEADER_EPOCH),
        (2, ErrorCode.NONE),
        (3, ErrorCode.UNKNOWN_SERVER_ERROR),  # the controller left t1-4 out
    ]
    assert results[1].isr == frozenset({1, 3}) and results[1].partition_epoch == 8


def test_a_top_level_error_answers_every_proposal_with_it() -> None:
    response = pb.AlterPartitionResponse(error_code=int(ErrorCode.STALE_BROKER_EPOCH))  # type: ignore[arg-type]
    asked = [(t, p, prop.proposal_id) for t, p, prop in ASKED]
    results = wire.decode_alter_partitions(asked, response)
    assert [(r.proposal_id, r.error) for r in results] == [
        (1, ErrorCode.STALE_BROKER_EPOCH),
        (2, ErrorCode.STALE_BROKER_EPOCH),
        (3, ErrorCode.STALE_BROKER_EPOCH),
    ]
