"""controller/wire.py for the moving-replicas RPCs: what the client sends decodes to the core's
messages unchanged (round trips through both wires), and every malformed request is refused
whole with INVALID_REQUEST before the core is asked (the servicer never submits it).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.client import wire as client_wire
from minibroker.client.errors import (
    ErrorCode,
    InvalidRequestError,
    NoReassignmentInProgressError,
    ReassignmentInProgressError,
)
from minibroker.client.types import TopicPartition
from minibroker.controller import wire
from minibroker.controller.core.messages import (
    CONFIG_OP_APPEND,
    CONFIG_OP_DELETE,
    CONFIG_OP_SET,
    CONFIG_SOURCE_DEFAULT,
    CONFIG_SOURCE_DYNAMIC_TOPIC,
    AlterConfigOp,
    AlterConfigsResource,
    AlterConfigsResult,
    BrokerDescription,
    BrokerRegistration,
    ClusterDescription,
    ConfigEntry,
    CreatePartitionsResult,
    CreatePartitionsTopic,
    DecommissionReply,
    DescribeConfigsResource,
    DescribeConfigsResult,
    OngoingReassignment,
    Outcome,
    ReassignmentResult,
    ReassignmentTarget,
)
from minibroker.controller.service import ControllerServicer
from minibroker.metadata.records import CONFIG_RESOURCE_BROKER, CONFIG_RESOURCE_TOPIC
from minibroker.proto import minibroker_pb2 as pb

TP = TopicPartition

# -- round trips: client wire -> controller wire -> core messages, and back --------------------

topics = st.text(alphabet="abcxyz._-0", min_size=1, max_size=20)
targets = st.one_of(st.none(), st.lists(st.integers(0, 2**31 - 1), max_size=6).map(tuple))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.tuples(topics, st.integers(0, 2**31 - 1)), targets, max_size=20))
def test_reassignments_decode_to_the_targets_the_client_sent(
    moves: dict[tuple[str, int], tuple[int, ...] | None],
) -> None:
    request = client_wire.alter_reassignments_request(
        [(TP(*tp), t) for tp, t in moves.items()], 30_000
    )
    decoded = wire.reassignment_targets(
        pb.AlterPartitionReassignmentsRequest.FromString(request.SerializeToString())
    )
    assert decoded == [ReassignmentTarget(t, p, r) for (t, p), r in moves.items()]


def test_reassignment_results_come_back_by_partition_with_typed_errors() -> None:
    reply = wire.alter_reassignments_reply(
        (
            ReassignmentResult("a", 0, ErrorCode.NONE),
            ReassignmentResult("a", 1, ErrorCode.REASSIGNMENT_IN_PROGRESS, "busy"),
            ReassignmentResult("b", 0, ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, "none"),
        )
    )
    resp = pb.AlterPartitionReassignmentsResponse.FromString(reply.SerializeToString())
    assert client_wire.answer_error(resp) is None
    results = client_wire.reassignment_results(resp)
    assert results[TP("a", 0)] is None
    assert isinstance(results[TP("a", 1)], ReassignmentInProgressError)
    assert "busy" in str(results[TP("a", 1)])
    assert isinstance(results[TP("b", 0)], NoReassignmentInProgressError)


def test_list_reassignments_round_trip() -> None:
    everything = client_wire.list_reassignments_request(None)
    assert wire.listed_partitions(everything) is None
    some = client_wire.list_reassignments_request([TP("a", 1), TP("b", 0), TP("a", 0), TP("a", 1)])
    assert wire.listed_partitions(some) == [("a", 1), ("a", 0), ("b", 0)]
    reply = wire.list_reassignments_reply(
        (OngoingReassignment("a", 1, (4, 5, 1, 2), (4, 5), (1, 2)),)
    )
    assert client_wire.answer_error(reply) is None
    assert client_wire.ongoing_reassignments(reply) == {
        TP("a", 1): client_wire.OngoingAnswer((4, 5, 1, 2), (4, 5), (1, 2))
    }


def test_create_partitions_round_trip() -> None:
    request = client_wire.create_partitions_request(
        [("a", 3, None), ("b", 4, [(1, 2), (2, 3)])], 30_000, True
    )
    assert request.validate_only
    assert wire.create_partitions_topics(request) == [
        CreatePartitionsTopic("a", 3, None),
        CreatePartitionsTopic("b", 4, ((1, 2), (2, 3))),
    ]
    reply = wire.create_partitions_reply(
        (
            CreatePartitionsResult("a", ErrorCode.NONE),
            CreatePartitionsResult("b", ErrorCode.INVALID_PARTITIONS, "must grow"),
        )
    )
    results = client_wire.create_partitions_results(reply)
    assert results["a"] is None
    assert results["b"] is not None and results["b"].code == ErrorCode.INVALID_PARTITIONS


def test_alter_configs_round_trip() -> None:
    request = client_wire.alter_configs_request(
        [
            (
                ("topic", "t"),
                [("retention.ms", "set", "1000"), ("min.insync.replicas", "delete", "x")],
            ),
            (("broker", ""), [("leader.replication.throttled.rate", "set", "100")]),
            (("broker", "2"), [("follower.replication.throttled.rate", "append", "7")]),
        ],
        validate_only=False,
    )
    assert wire.alter_configs_resources(request) == [
        AlterConfigsResource(
            CONFIG_RESOURCE_TOPIC,
            "t",
            (
                AlterConfigOp("retention.ms", CONFIG_OP_SET, "1000"),
                AlterConfigOp("min.insync.replicas", CONFIG_OP_DELETE, None),
            ),
        ),
        AlterConfigsResource(
            CONFIG_RESOURCE_BROKER,
            "",
            (AlterConfigOp("leader.replication.throttled.rate", CONFIG_OP_SET, "100"),),
        ),
        AlterConfigsResource(
            CONFIG_RESOURCE_BROKER,
            "2",
            (AlterConfigOp("follower.replication.throttled.rate", CONFIG_OP_APPEND, "7"),),
        ),
    ]
    reply = wire.alter_configs_reply(
        (
            AlterConfigsResult(CONFIG_RESOURCE_TOPIC, "t", ErrorCode.NONE),
            AlterConfigsResult(CONFIG_RESOURCE_BROKER, "2", ErrorCode.INVALID_CONFIG, "<= 0"),
        )
    )
    results = client_wire.alter_configs_results(reply)
    assert results[("topic", "t")] is None
    error = results[("broker", "2")]
    assert error is not None and error.code == ErrorCode.INVALID_CONFIG and "<= 0" in str(error)


def test_describe_configs_round_trip_keeps_null_values_and_names_sources() -> None:
    request = client_wire.describe_configs_request(
        [("topic", "t"), ("broker", "1")], ["retention.ms", "retention.ms"]
    )
    assert wire.describe_configs_resources(request) == [
        DescribeConfigsResource(CONFIG_RESOURCE_TOPIC, "t", ("retention.ms",)),
        DescribeConfigsResource(CONFIG_RESOURCE_BROKER, "1", ("retention.ms",)),
    ]
    reply = wire.describe_configs_reply(
        (
            DescribeConfigsResult(
                CONFIG_RESOURCE_TOPIC,
                "t",
                ErrorCode.NONE,
                entries=(
                    ConfigEntry("retention.ms", "1000", CONFIG_SOURCE_DYNAMIC_TOPIC),
                    ConfigEntry("x", None, CONFIG_SOURCE_DEFAULT, True, "doc"),
                ),
            ),
            DescribeConfigsResult(CONFIG_RESOURCE_BROKER, "1", ErrorCode.UNKNOWN_SERVER_ERROR),
        )
    )
    answered = client_wire.described_configs(
        pb.DescribeConfigsResponse.FromString(reply.SerializeToString())
    )
    topic = answered[("topic", "t")]
    assert topic.error is None
    assert topic.entries == (
        client_wire.ConfigEntryAnswer("retention.ms", "1000", "DYNAMIC_TOPIC_CONFIG", False, ""),
        client_wire.ConfigEntryAnswer("x", None, "DEFAULT_CONFIG", True, "doc"),
    )
    assert answered[("broker", "1")].error is not None


def test_decommission_and_cluster_fields_round_trip() -> None:
    assert wire.decommission_request(client_wire.decommission_request(3, True)) == (3, True)
    reply = wire.decommission_reply(DecommissionReply(ErrorCode.NONE, "", 7))
    assert (reply.error_code, reply.partitions_moving) == (0, 7)
    reg = BrokerRegistration(
        broker_id=2,
        incarnation_id="i",
        host="h",
        port=1,
        rack="r",
        broker_epoch=5,
        fenced=False,
        in_controlled_shutdown=False,
        metrics_port=-1,
    )
    desc = ClusterDescription(
        "c",
        3000,
        9,
        (BrokerDescription(reg, 4, decommissioning=True, replica_count=6, leader_count=2),),
    )
    (broker,) = client_wire.cluster_answer(wire.describe_cluster_reply(desc)).brokers
    assert broker[-3:] == (True, 6, 2)


def test_the_metadata_answer_carries_adding_and_removing_replicas() -> None:
    resp = pb.MetadataResponse(
        topics=[
            pb.TopicMetadata(
                name="t",
                topic_id="id",
                partitions=[
                    pb.PartitionMetadata(
                        partition=0,
                        leader_id=1,
                        replicas=[4, 1, 2],
                        isr=[1, 2],
                        adding_replicas=[4],
                        removing_replicas=[2],
                    )
                ],
            )
        ]
    )
    info = client_wire.metadata_from_pb(resp, all_topics=False).topics["t"].partitions[0]
    assert (info.adding_replicas, info.removing_replicas) == ((4,), (2,))


# -- malformed requests: refused whole, INVALID_REQUEST ------------------------------------------


def _reassign(*parts: pb.ReassignablePartition) -> pb.AlterPartitionReassignmentsRequest:
    return pb.AlterPartitionReassignmentsRequest(partitions=list(parts))


BAD_REASSIGNMENTS = {
    "negative partition": _reassign(
        pb.ReassignablePartition(topic="t", partition=-1, replicas=[1])
    ),
    "empty topic": _reassign(pb.ReassignablePartition(topic="", partition=0, replicas=[1])),
    "long topic": _reassign(pb.ReassignablePartition(topic="t" * 300, partition=0, replicas=[1])),
    "twice": _reassign(
        pb.ReassignablePartition(topic="t", partition=0, replicas=[1]),
        pb.ReassignablePartition(topic="t", partition=0, cancel=True),
    ),
    "cancel with replicas": _reassign(
        pb.ReassignablePartition(topic="t", partition=0, replicas=[1], cancel=True)
    ),
    "huge replica list": _reassign(
        pb.ReassignablePartition(
            topic="t", partition=0, replicas=list(range(wire.MAX_REPLICAS + 1))
        )
    ),
    "too many partitions": _reassign(
        *(
            pb.ReassignablePartition(topic="t", partition=i, cancel=True)
            for i in range(wire.MAX_REQUEST_PARTITIONS + 1)
        )
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_REASSIGNMENTS))
def test_malformed_reassignments_are_invalid_requests(case: str) -> None:
    request = BAD_REASSIGNMENTS[case]
    with pytest.raises(InvalidRequestError):
        wire.reassignment_targets(request)
    refused = wire.alter_reassignments_error(request, InvalidRequestError("no"))
    assert refused.error_code == ErrorCode.INVALID_REQUEST
    assert len(refused.results) == min(len(request.partitions), wire.MAX_REQUEST_PARTITIONS)
    assert all(r.error_code == ErrorCode.INVALID_REQUEST for r in refused.results)


def test_empty_targets_and_unknown_broker_ids_are_the_cores_to_judge() -> None:
    # Well formed: the core answers INVALID_REPLICA_ASSIGNMENT per partition (Kafka's).
    decoded = wire.reassignment_targets(
        _reassign(
            pb.ReassignablePartition(topic="t", partition=0),
            pb.ReassignablePartition(topic="t", partition=1, replicas=[-5, 1, 1]),
        )
    )
    assert decoded == [ReassignmentTarget("t", 0, ()), ReassignmentTarget("t", 1, (-5, 1, 1))]


def test_malformed_list_requests_are_invalid_requests() -> None:
    for bad in (
        pb.TopicPartitions(topic="t", partitions=[0, -1]),
        pb.TopicPartitions(topic="", partitions=[0]),
    ):
        with pytest.raises(InvalidRequestError):
            wire.listed_partitions(pb.ListPartitionReassignmentsRequest(topics=[bad]))
    huge = pb.TopicPartitions(topic="t", partitions=range(wire.MAX_REQUEST_PARTITIONS + 1))
    with pytest.raises(InvalidRequestError, match="too many"):
        wire.listed_partitions(pb.ListPartitionReassignmentsRequest(topics=[huge]))
    assert wire.list_reassignments_error(InvalidRequestError("x")).error_code == (
        ErrorCode.INVALID_REQUEST
    )


def test_malformed_create_partitions_are_invalid_requests() -> None:
    ok = pb.CreatePartitionsTopic(name="t", count=3)
    for topics in (
        [ok, pb.CreatePartitionsTopic(name="t", count=4)],
        [pb.CreatePartitionsTopic(name="", count=4)],
        [
            pb.CreatePartitionsTopic(
                name="t",
                count=4,
                assignments=[pb.ReplicaList(broker_ids=range(wire.MAX_REPLICAS + 1))],
            )
        ],
    ):
        request = pb.CreatePartitionsRequest(topics=topics)
        with pytest.raises(InvalidRequestError):
            wire.create_partitions_topics(request)
        refused = wire.create_partitions_error(request, InvalidRequestError("no"))
        assert [r.name for r in refused.results] == [t.name for t in topics]
        assert {r.error_code for r in refused.results} == {ErrorCode.INVALID_REQUEST}
    # A count that does not grow, or assignments of the wrong length, are the core's to judge.
    assert wire.create_partitions_topics(
        pb.CreatePartitionsRequest(topics=[pb.CreatePartitionsTopic(name="t", count=-3)])
    ) == [CreatePartitionsTopic("t", -3, None)]


def _alter(
    resource_type: int, name: str, *configs: pb.AlterableConfig
) -> pb.IncrementalAlterConfigsRequest:
    return pb.IncrementalAlterConfigsRequest(
        resources=[
            pb.AlterConfigsResource(
                resource_type=resource_type, resource_name=name, configs=list(configs)
            )
        ]
    )


SET = pb.AlterableConfig(name="retention.ms", config_operation=0, value="1")
BAD_ALTERS = {
    "resource type 3": _alter(3, "t", SET),
    "resource type 0": _alter(0, "t", SET),
    "broker name not a number": _alter(4, "one", SET),
    "broker name with a sign": _alter(4, "+1", SET),
    "broker name with leading zero": _alter(4, "01", SET),
    "broker name with spaces": _alter(4, " 1", SET),
    "broker name of unicode digits": _alter(4, "\u0661", SET),
    "broker id past int32": _alter(4, "4294967296", SET),
    "empty topic": _alter(2, "", SET),
    "unknown op": _alter(2, "t", pb.AlterableConfig(name="a", config_operation=4, value="1")),
    "negative op": _alter(2, "t", pb.AlterableConfig(name="a", config_operation=-1, value="1")),
    "set without value": _alter(2, "t", pb.AlterableConfig(name="a", config_operation=0)),
    "append without value": _alter(2, "t", pb.AlterableConfig(name="a", config_operation=2)),
    "empty config name": _alter(2, "t", pb.AlterableConfig(name="", config_operation=1)),
    "config twice": _alter(2, "t", SET, SET),
    "huge value": _alter(
        2,
        "t",
        pb.AlterableConfig(
            name="a", config_operation=0, value="x" * (wire.MAX_CONFIG_VALUE_CHARS + 1)
        ),
    ),
    "too many configs": _alter(
        2,
        "t",
        *(
            pb.AlterableConfig(name=f"k{i}", config_operation=1)
            for i in range(wire.MAX_CONFIG_OPS + 1)
        ),
    ),
    "resource twice": pb.IncrementalAlterConfigsRequest(
        resources=[
            pb.AlterConfigsResource(resource_type=2, resource_name="t"),
            pb.AlterConfigsResource(resource_type=2, resource_name="t"),
        ]
    ),
    "too many resources": pb.IncrementalAlterConfigsRequest(
        resources=[
            pb.AlterConfigsResource(resource_type=2, resource_name=f"t{i}")
            for i in range(wire.MAX_CONFIG_RESOURCES + 1)
        ]
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_ALTERS))
def test_malformed_config_changes_are_invalid_requests(case: str) -> None:
    request = BAD_ALTERS[case]
    with pytest.raises(InvalidRequestError):
        wire.alter_configs_resources(request)
    refused = wire.alter_configs_error(request, InvalidRequestError("no"))
    assert len(refused.results) == min(len(request.resources), wire.MAX_CONFIG_RESOURCES)
    assert {r.error_code for r in refused.results} == {ErrorCode.INVALID_REQUEST}


def test_unknown_config_keys_and_bad_values_are_the_cores_to_judge() -> None:
    request = _alter(2, "t", pb.AlterableConfig(name="no.such.key", config_operation=0, value="-5"))
    (resource,) = wire.alter_configs_resources(request)
    assert resource.ops == (AlterConfigOp("no.such.key", CONFIG_OP_SET, "-5"),)


@pytest.mark.parametrize(
    "resource",
    [
        pb.DescribeConfigsResource(resource_type=1, resource_name="t"),
        pb.DescribeConfigsResource(resource_type=4, resource_name="x"),
        pb.DescribeConfigsResource(resource_type=2, resource_name="t", configuration_keys=[""]),
        pb.DescribeConfigsResource(
            resource_type=2, resource_name="t", configuration_keys=["k" * 300]
        ),
    ],
)
def test_malformed_describe_configs_are_invalid_requests(
    resource: pb.DescribeConfigsResource,
) -> None:
    request = pb.DescribeConfigsRequest(resources=[resource])
    with pytest.raises(InvalidRequestError):
        wire.describe_configs_resources(request)
    (refused,) = wire.describe_configs_error(request, InvalidRequestError("no")).results
    assert (refused.resource_type, refused.error_code) == (
        resource.resource_type,
        ErrorCode.INVALID_REQUEST,
    )


def test_a_negative_broker_id_is_an_invalid_decommission() -> None:
    with pytest.raises(InvalidRequestError):
        wire.decommission_request(pb.DecommissionBrokerRequest(broker_id=-1))
    assert wire.decommission_error(InvalidRequestError("x")).error_code == ErrorCode.INVALID_REQUEST


# -- the servicer: a malformed request never reaches the core ------------------------------------


class _RecordingCore:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        def method(*args: Any) -> Any:
            self.calls.append((name, args))
            if name == "list_partition_reassignments":
                return ()
            if name == "describe_configs":
                return ()
            if name == "decommission_broker":
                return Outcome(DecommissionReply(ErrorCode.NONE, "", 2))
            return Outcome(())

        return method


class _PlainContext:
    """A plaintext call's context: what the servicer's authentication reads."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"transport_security_type": [b"insecure"]}


class _FakeApp:
    def __init__(self) -> None:
        self.core = _RecordingCore()

    async def submit(self, command: Any) -> Any:
        return command(self.core, 1234).reply


def _serve(method: str, request: Any) -> tuple[Any, list[tuple[str, tuple[Any, ...]]]]:
    app = _FakeApp()
    servicer = ControllerServicer(app)  # type: ignore[arg-type]
    reply = asyncio.run(getattr(servicer, method)(request, _PlainContext()))
    return reply, app.core.calls


def test_the_servicer_refuses_malformed_requests_without_asking_the_core() -> None:
    cases = [
        ("AlterPartitionReassignments", BAD_REASSIGNMENTS["negative partition"]),
        (
            "ListPartitionReassignments",
            pb.ListPartitionReassignmentsRequest(
                topics=[pb.TopicPartitions(topic="t", partitions=[-1])]
            ),
        ),
        (
            "CreatePartitions",
            pb.CreatePartitionsRequest(topics=[pb.CreatePartitionsTopic(name="", count=2)]),
        ),
        ("IncrementalAlterConfigs", BAD_ALTERS["resource type 3"]),
        (
            "DescribeConfigs",
            pb.DescribeConfigsRequest(
                resources=[pb.DescribeConfigsResource(resource_type=4, resource_name="b1")]
            ),
        ),
        ("DecommissionBroker", pb.DecommissionBrokerRequest(broker_id=-2)),
    ]
    for method, request in cases:
        reply, calls = _serve(method, request)
        assert calls == [], method
        codes = (
            [reply.error_code]
            if hasattr(reply, "error_code")
            else [r.error_code for r in reply.results]
        )
        assert codes and set(codes) == {ErrorCode.INVALID_REQUEST}, method


def test_the_servicer_hands_well_formed_requests_to_the_core_with_the_specs_signatures() -> None:
    _, calls = _serve(
        "AlterPartitionReassignments",
        _reassign(
            pb.ReassignablePartition(topic="t", partition=0, replicas=[2, 3]),
            pb.ReassignablePartition(topic="t", partition=1, cancel=True),
        ),
    )
    assert calls == [
        (
            "alter_partition_reassignments",
            ([ReassignmentTarget("t", 0, (2, 3)), ReassignmentTarget("t", 1, None)], 1234),
        )
    ]
    _, calls = _serve("ListPartitionReassignments", pb.ListPartitionReassignmentsRequest())
    assert calls == [("list_partition_reassignments", (None,))]
    _, calls = _serve(
        "CreatePartitions",
        pb.CreatePartitionsRequest(
            topics=[pb.CreatePartitionsTopic(name="t", count=2)], validate_only=True
        ),
    )
    assert calls == [("create_partitions", ([CreatePartitionsTopic("t", 2)], True, 1234))]
    _, calls = _serve("IncrementalAlterConfigs", _alter(4, "", SET))
    assert calls == [
        (
            "incremental_alter_configs",
            (
                [
                    AlterConfigsResource(
                        CONFIG_RESOURCE_BROKER, "", (AlterConfigOp("retention.ms", 0, "1"),)
                    )
                ],
                False,
                1234,
            ),
        )
    ]
    _, calls = _serve(
        "DescribeConfigs",
        pb.DescribeConfigsRequest(
            resources=[pb.DescribeConfigsResource(resource_type=2, resource_name="t")]
        ),
    )
    assert calls == [("describe_configs", ([DescribeConfigsResource(2, "t")],))]
    reply, calls = _serve("DecommissionBroker", pb.DecommissionBrokerRequest(broker_id=4))
    assert calls == [("decommission_broker", (4, False, 1234))]
    assert reply.partitions_moving == 2


def test_a_brokers_metadata_answer_names_the_replicas_being_added_and_removed() -> None:
    from minibroker.broker.wire import encode_metadata
    from minibroker.metadata.image import MetadataImage
    from minibroker.metadata.records import PartitionRecord, TopicRecord

    image = MetadataImage()
    image.apply_record(TopicRecord("t", "id"))
    image.apply_record(
        PartitionRecord(
            "id", 0, (4, 1, 2), (1, 2), 1, 3, 5, adding_replicas=(4,), removing_replicas=(2,)
        )
    )
    image.apply_record(PartitionRecord("id", 1, (1, 2), (1, 2), 1, 0, 0))
    resp = encode_metadata(image, ["t"], False, cluster_id="c", controller_address=("h", 1))
    p0, p1 = resp.topics[0].partitions
    assert (list(p0.adding_replicas), list(p0.removing_replicas)) == ([4], [2])
    assert (list(p1.adding_replicas), list(p1.removing_replicas)) == ([], [])
