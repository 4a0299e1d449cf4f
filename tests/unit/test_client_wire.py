"""client/wire.py: the requests the client builds, the answers it reads, and failed calls mapped
to Kafka's errors; and that the producer's, consumer's and admin's modules leave all of that to it.
"""

from __future__ import annotations

import ast
import asyncio
import pathlib

import grpc
import pytest

from minibroker.client import wire
from minibroker.client.admin import BrokerDescription
from minibroker.client.errors import (
    ElectionNotNeededError,
    ErrorCode,
    FencedLeaderEpochError,
    NetworkExceptionError,
    PolicyViolationError,
    RecordListTooLargeError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from minibroker.client.stream import rpc_error
from minibroker.client.types import EARLIEST_TIMESTAMP, TopicPartition
from minibroker.proto import minibroker_pb2 as pb

ROOT = pathlib.Path(__file__).resolve().parents[2]
A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)

# The client modules that talk to brokers only through wire.py.
THROUGH_WIRE = [
    "client/admin.py",
    "client/consumer.py",
    "client/producer.py",
    "client/fetcher.py",
    "client/offsets.py",
    "client/sender.py",
    "client/wakeable.py",
]


@pytest.mark.parametrize("path", THROUGH_WIRE)
def test_the_client_modules_neither_build_protobufs_nor_catch_grpc_errors(path: str) -> None:
    tree = ast.parse((ROOT / path).read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    # Without the imports neither a protobuf nor a gRPC status can be named.
    assert not {m for m in imported if m == "grpc" or m.startswith("minibroker.proto")}


def test_a_produce_request_groups_batches_by_topic() -> None:
    request = wire.produce_request(-1, 3000, [(A0, b"x"), (B0, b"y"), (A1, b"z")])
    assert (request.acks, request.timeout_ms) == (-1, 3000)
    got = {(t.topic, p.partition): p.records for t in request.topics for p in t.partitions}
    assert got == {("a", 0): b"x", ("b", 0): b"y", ("a", 1): b"z"}
    assert [t.topic for t in request.topics] == ["a", "b"]


def test_produce_results_are_read_per_partition() -> None:
    resp = pb.ProduceResponse(
        topics=[
            pb.TopicProduceResponse(
                topic="a",
                partitions=[
                    pb.PartitionProduceResponse(
                        partition=1, error_code=0, base_offset=7, log_append_time_ms=-1
                    ),
                    pb.PartitionProduceResponse(
                        partition=0, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER, error_message="m"
                    ),
                ],
            )
        ]
    )
    results = wire.produce_results(resp)
    assert results[A1] == wire.ProduceResult(0, "", 7, -1)
    assert results[A0].error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert results[A0].error_message == "m"


def test_a_fetch_request_carries_the_consumers_fields() -> None:
    request = wire.fetch_request(
        [wire.FetchTarget(A0, 4, 10), wire.FetchTarget(B0, 2, 0)],
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=1000,
        partition_max_bytes=100,
        rack_id="r1",
    )
    assert (request.replica_id, request.max_wait_ms, request.min_bytes) == (-1, 500, 1)
    assert (request.max_bytes, request.rack_id, request.isolation_level) == (1000, "r1", 0)
    a = request.topics[0].partitions[0]
    assert (request.topics[0].topic, a.partition, a.current_leader_epoch, a.fetch_offset) == (
        "a",
        0,
        4,
        10,
    )
    assert (a.last_fetched_epoch, a.log_start_offset, a.partition_max_bytes) == (-1, -1, 100)


def test_fetched_partitions_are_read_with_their_topic_partition() -> None:
    resp = pb.FetchResponse(
        topics=[
            pb.FetchTopicResponse(
                topic="b",
                partitions=[
                    pb.FetchPartitionResponse(
                        partition=0,
                        high_watermark=9,
                        log_start_offset=2,
                        preferred_read_replica=3,
                        records=b"raw",
                    )
                ],
            )
        ]
    )
    assert list(wire.fetched_partitions(resp)) == [
        wire.FetchedPartition(B0, 0, "", 9, 2, 3, b"raw")
    ]


def test_list_offsets_round_trip_maps_errors_to_exceptions() -> None:
    request = wire.list_offsets_request({A0: EARLIEST_TIMESTAMP, B0: 55}, {A0: 3, B0: 1})
    sent = {
        (t.topic, p.partition): (p.current_leader_epoch, p.timestamp)
        for t in request.topics
        for p in t.partitions
    }
    assert sent == {("a", 0): (3, EARLIEST_TIMESTAMP), ("b", 0): (1, 55)}
    resp = pb.ListOffsetsResponse(
        topics=[
            pb.ListOffsetsTopicResponse(
                topic="a",
                partitions=[
                    pb.ListOffsetsPartitionResponse(
                        partition=0, offset=12, timestamp=-1, leader_epoch=3
                    ),
                    pb.ListOffsetsPartitionResponse(
                        partition=1, error_code=ErrorCode.FENCED_LEADER_EPOCH
                    ),
                ],
            )
        ]
    )
    results = wire.list_offsets_results(resp)
    assert results[A0] == (12, -1, 3)
    assert isinstance(results[A1], FencedLeaderEpochError)


def test_offset_for_leader_epoch_round_trip() -> None:
    request = wire.offset_for_leader_epoch_request([(A0, 5, 4)])
    p = request.topics[0].partitions[0]
    assert (request.replica_id, p.partition, p.current_leader_epoch, p.leader_epoch) == (
        -1,
        0,
        5,
        4,
    )
    resp = pb.OffsetForLeaderEpochResponse(
        topics=[
            pb.OffsetForLeaderTopicResult(
                topic="a",
                partitions=[
                    pb.OffsetForLeaderPartitionResult(partition=0, leader_epoch=4, end_offset=17)
                ],
            )
        ]
    )
    assert list(wire.epoch_end_answers(resp)) == [wire.EpochEndAnswer(A0, 0, "", 4, 17)]


def test_create_topics_round_trip() -> None:
    request = wire.create_topics_request(
        [("a", 3, 2, {"cleanup.policy": "compact"}), ("b", -1, -1, {})], 5000, True
    )
    assert (request.timeout_ms, request.validate_only) == (5000, True)
    assert [
        (t.name, t.num_partitions, t.replication_factor, dict(t.configs)) for t in request.topics
    ] == [("a", 3, 2, {"cleanup.policy": "compact"}), ("b", -1, -1, {})]
    resp = pb.CreateTopicsResponse(
        topics=[
            pb.CreatableTopicResult(
                name="a", topic_id="t1", num_partitions=3, replication_factor=2
            ),
            pb.CreatableTopicResult(
                name="b", error_code=ErrorCode.TOPIC_ALREADY_EXISTS, error_message="there"
            ),
        ]
    )
    created, exists = wire.created_topics(resp)
    assert created == wire.CreatedTopicAnswer("a", None, "t1", 3, 2)
    assert exists.name == "b" and isinstance(exists.error, TopicAlreadyExistsError)


def test_delete_topics_failures_name_each_topic_with_its_error() -> None:
    request = wire.delete_topics_request(["a", "b", "c"], 700)
    assert (list(request.topic_names), request.timeout_ms) == (["a", "b", "c"], 700)
    resp = pb.DeleteTopicsResponse(
        results=[
            pb.DeletableTopicResult(name="a"),
            pb.DeletableTopicResult(name="b", error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
            pb.DeletableTopicResult(name="c", error_code=ErrorCode.POLICY_VIOLATION),
        ]
    )
    (b, unknown), (c, refused) = wire.delete_topics_failures(resp)
    assert (b, c) == ("b", "c")
    assert isinstance(unknown, UnknownTopicOrPartitionError) and "'b'" in str(unknown)
    assert isinstance(refused, PolicyViolationError)


def test_a_cluster_answer_lists_brokers_by_id_with_admins_fields() -> None:
    resp = pb.DescribeClusterResponse(
        cluster_id="c",
        controller_id=3000,
        metadata_offset=42,
        brokers=[
            pb.ClusterBroker(broker_id=2, host="h", port=2, fenced=True, broker_epoch=7),
            pb.ClusterBroker(broker_id=1, host="h", port=1, rack="r", last_heartbeat_ms_ago=5),
        ],
    )
    assert wire.answer_error(resp) is None
    answer = wire.cluster_answer(resp)
    assert answer[:3] == ("c", 3000, 42)
    # admin builds BrokerDescription(*fields): the fields must be its own, in its order.
    assert tuple(BrokerDescription(*b) for b in answer.brokers) == (
        BrokerDescription(1, "h", 1, "r", False, False, 0, 5),
        BrokerDescription(2, "h", 2, "", True, False, 7, 0),
    )
    refused = pb.DescribeClusterResponse(error_code=ErrorCode.NOT_CONTROLLER, error_message="no")
    assert wire.answer_error(refused) is not None


def test_elect_leaders_round_trip() -> None:
    everything = wire.elect_leaders_request("unclean", None, 900)
    assert (everything.election_type, everything.all_partitions) == (pb.UNCLEAN, True)
    assert list(everything.topic_partitions) == []
    some = wire.elect_leaders_request("preferred", [A0, B0, A1], 900)
    assert (some.election_type, some.all_partitions, some.timeout_ms) == (pb.PREFERRED, False, 900)
    assert [(t.topic, list(t.partitions)) for t in some.topic_partitions] == [
        ("a", [0, 1]),
        ("b", [0]),
    ]
    assert {"preferred", "unclean"} == wire.ELECTION_TYPES
    resp = pb.ElectLeadersResponse(
        results=[
            pb.ElectionResult(topic="a", partition=0),
            pb.ElectionResult(topic="a", partition=1, error_code=ErrorCode.ELECTION_NOT_NEEDED),
        ]
    )
    results = wire.election_results(resp)
    assert results[A0] is None and isinstance(results[A1], ElectionNotNeededError)


def test_replica_offsets_carry_the_answering_broker() -> None:
    assert list(wire.describe_replicas_request(["a", "b"]).topics) == ["a", "b"]
    assert wire.unregister_broker_request(4).broker_id == 4
    resp = pb.DescribeReplicasResponse(
        broker_id=2,
        replicas=[
            pb.ReplicaDescription(
                topic="a", partition=1, is_leader=True, high_watermark=5, log_end_offset=9
            )
        ],
    )
    assert list(wire.replica_offsets(resp)) == [wire.ReplicaOffsets("a", 1, 2, True, 5, 9)]


@pytest.mark.parametrize(
    ("status", "details", "expected", "unreachable"),
    [
        (grpc.StatusCode.UNAVAILABLE, "down", NetworkExceptionError, True),
        (grpc.StatusCode.CANCELLED, "gone", NetworkExceptionError, False),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "slow", RequestTimedOutError, False),
        (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "Received message larger than max (9 vs. 4)",
            RecordListTooLargeError,
            False,
        ),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "too many connections", NetworkExceptionError, False),
        (grpc.StatusCode.INTERNAL, "bug", UnknownServerError, False),
    ],
)
def test_a_failed_call_becomes_the_kafka_error_a_client_acts_on(
    status: grpc.StatusCode, details: str, expected: type, unreachable: bool
) -> None:
    async def failing() -> None:
        raise rpc_error(status, details)

    with pytest.raises(wire.CallFailed) as info:
        asyncio.run(wire.call(failing(), "h:1"))
    assert type(info.value.error) is expected and info.value.unreachable is unreachable
    assert "h:1" in str(info.value.error)


def test_an_answered_call_is_returned_as_is() -> None:
    async def answering() -> int:
        return 42

    assert asyncio.run(wire.call(answering(), "h:1")) == 42
