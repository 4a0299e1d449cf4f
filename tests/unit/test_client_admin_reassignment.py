"""Admin's moving-replicas calls: bad arguments raise TypeError/ValueError before anything is
sent, and the controller's answers come back as Kafka's typed errors (no cluster needed: the
controller call is replaced by a recorder)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from minibroker.client.admin import (
    AlterConfigOp,
    AsyncAdmin,
    ConfigEntry,
    ConfigResource,
    PartitionReassignment,
)
from minibroker.client.errors import (
    BrokerIdNotRegisteredError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidRequestError,
    InvalidTopicError,
    ReassignmentInProgressError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
)
from minibroker.client.sync import Admin
from minibroker.client.types import TopicPartition
from minibroker.proto import minibroker_pb2 as pb

TP = TopicPartition


class _Recorder:
    """Stands in for the controller: records each request, answers with `answer`."""

    def __init__(self, answer: Any = None, resent: bool = False) -> None:
        self.answer = answer
        self.resent = resent
        self.sent: list[tuple[str, Any]] = []

    async def call_sent(self, method: str, request: Any) -> tuple[Any, bool]:
        self.sent.append((method, request))
        if self.answer is None:
            raise AssertionError(f"{method} was sent")
        return self.answer, self.resent

    async def call(self, method: str, request: Any) -> Any:
        return (await self.call_sent(method, request))[0]


def _run(recorder: _Recorder, body: Callable[[AsyncAdmin], Coroutine[Any, Any, Any]]) -> Any:
    async def main() -> Any:
        admin = AsyncAdmin("127.0.0.1:1", default_api_timeout_ms=100)
        admin._controller_call_sent = recorder.call_sent  # type: ignore[method-assign]
        admin._controller_call = recorder.call  # type: ignore[method-assign]
        admin._wait_for_partitions = _no_wait  # type: ignore[method-assign]
        try:
            return await body(admin)
        finally:
            await admin.close()

    return asyncio.run(main())


async def _no_wait(counts: Any) -> None:
    return None


# -- argument checks: nothing is sent -------------------------------------------------------------

BAD_CALLS: list[tuple[str, type[Exception], Callable[[AsyncAdmin], Any]]] = [
    (
        "reassign not a mapping",
        TypeError,
        lambda a: a.alter_partition_reassignments([(TP("t", 0), [1])]),
    ),
    ("reassign key not a tp", TypeError, lambda a: a.alter_partition_reassignments({"t": [1]})),
    (
        "reassign partition str",
        TypeError,
        lambda a: a.alter_partition_reassignments({("t", "0"): [1]}),
    ),
    (
        "reassign partition bool",
        TypeError,
        lambda a: a.alter_partition_reassignments({("t", True): [1]}),
    ),
    (
        "reassign negative partition",
        ValueError,
        lambda a: a.alter_partition_reassignments({TP("t", -1): [1]}),
    ),
    (
        "reassign bad topic",
        InvalidTopicError,
        lambda a: a.alter_partition_reassignments({TP("a b", 0): [1]}),
    ),
    (
        "reassign target str",
        TypeError,
        lambda a: a.alter_partition_reassignments({TP("t", 0): "12"}),
    ),
    (
        "reassign target set",
        TypeError,
        lambda a: a.alter_partition_reassignments({TP("t", 0): {1, 2}}),
    ),
    (
        "reassign broker str",
        TypeError,
        lambda a: a.alter_partition_reassignments({TP("t", 0): ["1"]}),
    ),
    (
        "reassign broker negative",
        ValueError,
        lambda a: a.alter_partition_reassignments({TP("t", 0): [-1]}),
    ),
    (
        "reassign broker huge",
        ValueError,
        lambda a: a.alter_partition_reassignments({TP("t", 0): [2**31]}),
    ),
    ("list str", TypeError, lambda a: a.list_partition_reassignments("t")),
    ("list negative", ValueError, lambda a: a.list_partition_reassignments([TP("t", -2)])),
    ("create not a mapping", TypeError, lambda a: a.create_partitions([("t", 3)])),
    ("create count str", TypeError, lambda a: a.create_partitions({"t": "3"})),
    ("create count zero", ValueError, lambda a: a.create_partitions({"t": 0})),
    ("create count huge", ValueError, lambda a: a.create_partitions({"t": 2**31})),
    ("create bad topic", InvalidTopicError, lambda a: a.create_partitions({"..": 3})),
    (
        "create assignment for another topic",
        ValueError,
        lambda a: a.create_partitions({"t": 3}, {"u": [[1]]}),
    ),
    (
        "create assignment not lists",
        TypeError,
        lambda a: a.create_partitions({"t": 3}, {"t": [1, 2]}),
    ),
    (
        "create assignment broker negative",
        ValueError,
        lambda a: a.create_partitions({"t": 3}, {"t": [[-1]]}),
    ),
    ("create validate_only not bool", TypeError, lambda a: a.create_partitions({"t": 3}, None, 1)),
    ("alter not a mapping", TypeError, lambda a: a.incremental_alter_configs([])),
    (
        "alter key not a resource",
        TypeError,
        lambda a: a.incremental_alter_configs({("topic", "t"): []}),
    ),
    (
        "alter ops not ops",
        TypeError,
        lambda a: a.incremental_alter_configs({ConfigResource("topic", "t"): [("a", "set", "1")]}),
    ),
    (
        "alter op twice",
        ValueError,
        lambda a: a.incremental_alter_configs(
            {
                ConfigResource("topic", "t"): [
                    AlterConfigOp("a", "set", "1"),
                    AlterConfigOp("a", "delete"),
                ]
            }
        ),
    ),
    ("describe not resources", TypeError, lambda a: a.describe_configs([("topic", "t")])),
    (
        "describe str keys",
        TypeError,
        lambda a: a.describe_configs([ConfigResource("topic", "t")], "retention.ms"),
    ),
    (
        "describe empty key",
        TypeError,
        lambda a: a.describe_configs([ConfigResource("topic", "t")], [""]),
    ),
    ("decommission str", TypeError, lambda a: a.decommission_broker("1")),
    ("decommission bool", TypeError, lambda a: a.decommission_broker(True)),
    ("decommission negative", ValueError, lambda a: a.decommission_broker(-1)),
    ("decommission cancel not bool", TypeError, lambda a: a.decommission_broker(1, cancel="yes")),
]


@pytest.mark.parametrize("case", [c[0] for c in BAD_CALLS])
def test_bad_arguments_raise_before_anything_is_sent(case: str) -> None:
    _, error, call = next(c for c in BAD_CALLS if c[0] == case)
    recorder = _Recorder()
    with pytest.raises(error):
        _run(recorder, call)
    assert recorder.sent == []


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("queue", "t"), ValueError),
        ((2, "t"), TypeError),
        (("topic", 5), TypeError),
        (("topic", ""), InvalidTopicError),
        (("broker", "b1"), ValueError),
        (("broker", "01"), ValueError),
        (("broker", "-1"), ValueError),
        (("broker", str(2**31)), ValueError),
    ],
)
def test_config_resources_are_checked_when_made(args: tuple[Any, Any], error: type) -> None:
    with pytest.raises(error):
        ConfigResource(*args)


def test_config_resources_and_ops_take_kafkas_names_in_any_case() -> None:
    assert ConfigResource("TOPIC", "t") == ConfigResource("topic", "t")
    assert ConfigResource("Broker", "") == ConfigResource("broker", "")
    assert AlterConfigOp("a", "SET", "1").op == "set"
    assert AlterConfigOp("a", "delete").value is None
    for args, error in [
        (("", "set", "1"), ValueError),
        ((1, "set", "1"), TypeError),
        (("a", "put", "1"), ValueError),
        (("a", "set"), ValueError),
        (("a", "append"), ValueError),
        (("a", "set", 5), TypeError),
    ]:
        with pytest.raises(error):
            AlterConfigOp(*args)


def test_empty_requests_send_nothing() -> None:
    recorder = _Recorder()
    assert _run(recorder, lambda a: a.alter_partition_reassignments({})) == {}
    assert _run(recorder, lambda a: a.list_partition_reassignments([])) == {}
    assert _run(recorder, lambda a: a.create_partitions({})) is None
    assert _run(recorder, lambda a: a.incremental_alter_configs({})) is None
    assert _run(recorder, lambda a: a.describe_configs([])) == {}
    assert recorder.sent == []


# -- answers ---------------------------------------------------------------------------------------


def test_reassignment_outcomes_by_partition() -> None:
    answer = pb.AlterPartitionReassignmentsResponse(
        results=[
            pb.ReassignmentResult(topic="t", partition=0),
            pb.ReassignmentResult(
                topic="t",
                partition=1,
                error_code=pb.INVALID_REPLICA_ASSIGNMENT,
                error_message="dup",
            ),
        ]
    )
    recorder = _Recorder(answer)
    out = _run(
        recorder,
        lambda a: a.alter_partition_reassignments(
            {TP("t", 0): (3, 4), ("t", 1): [3, 3], TP("t", 2): None}
        ),
    )
    assert out[TP("t", 0)] is None
    assert isinstance(out[TP("t", 1)], InvalidReplicaAssignmentError)
    assert isinstance(out[TP("t", 2)], UnknownServerError)  # not answered
    ((method, request),) = recorder.sent
    assert method == "AlterPartitionReassignments"
    assert [(p.topic, p.partition, list(p.replicas), p.cancel) for p in request.partitions] == [
        ("t", 0, [3, 4], False),
        ("t", 1, [3, 3], False),
        ("t", 2, [], True),
    ]


def test_a_refused_reassignment_request_fills_every_partition_and_a_resend_says_so() -> None:
    refused = pb.AlterPartitionReassignmentsResponse(
        error_code=pb.INVALID_REQUEST, error_message="bad"
    )
    out = _run(_Recorder(refused), lambda a: a.alter_partition_reassignments({TP("t", 0): [1]}))
    assert isinstance(out[TP("t", 0)], InvalidRequestError)
    busy = pb.AlterPartitionReassignmentsResponse(
        results=[
            pb.ReassignmentResult(topic="t", partition=0, error_code=pb.REASSIGNMENT_IN_PROGRESS)
        ]
    )
    out = _run(
        _Recorder(busy, resent=True), lambda a: a.alter_partition_reassignments({TP("t", 0): [1]})
    )
    assert isinstance(out[TP("t", 0)], ReassignmentInProgressError)
    assert "re-sent" in str(out[TP("t", 0)])


def test_listed_reassignments_only_those_asked_for() -> None:
    answer = pb.ListPartitionReassignmentsResponse(
        reassignments=[
            pb.OngoingReassignment(
                topic="t", partition=0, replicas=[3, 1], adding_replicas=[3], removing_replicas=[1]
            ),
            pb.OngoingReassignment(topic="u", partition=0, replicas=[1]),
        ]
    )
    out = _run(_Recorder(answer), lambda a: a.list_partition_reassignments([TP("t", 0)]))
    assert out == {TP("t", 0): PartitionReassignment((3, 1), (3,), (1,))}
    assert out[TP("t", 0)].target_replicas == (3,)
    every = _run(_Recorder(answer), lambda a: a.list_partition_reassignments())
    assert sorted(every) == [TP("t", 0), TP("u", 0)]
    refused = pb.ListPartitionReassignmentsResponse(error_code=pb.INVALID_REQUEST)
    with pytest.raises(InvalidRequestError):
        _run(_Recorder(refused), lambda a: a.list_partition_reassignments())


def test_create_partitions_raises_the_first_failure() -> None:
    answer = pb.CreatePartitionsResponse(
        results=[
            pb.CreatePartitionsTopicResult(name="t"),
            pb.CreatePartitionsTopicResult(
                name="u", error_code=pb.INVALID_PARTITIONS, error_message="must grow"
            ),
        ]
    )
    with pytest.raises(InvalidPartitionsError, match="must grow"):
        _run(_Recorder(answer), lambda a: a.create_partitions({"t": 3, "u": 1}))
    ok = pb.CreatePartitionsResponse(results=[pb.CreatePartitionsTopicResult(name="t")])
    recorder = _Recorder(ok)
    assert _run(recorder, lambda a: a.create_partitions({"t": 3}, {"t": [[1, 2]]})) is None
    ((_, request),) = recorder.sent
    assert [list(r.broker_ids) for r in request.topics[0].assignments] == [[1, 2]]
    with pytest.raises(UnknownServerError):  # a topic the answer does not name
        _run(_Recorder(ok), lambda a: a.create_partitions({"t": 3, "v": 2}))


def test_config_changes_and_descriptions() -> None:
    answer = pb.IncrementalAlterConfigsResponse(
        results=[
            pb.AlterConfigsResourceResult(resource_type=2, resource_name="t"),
            pb.AlterConfigsResourceResult(
                resource_type=4, resource_name="1", error_code=pb.INVALID_CONFIG, error_message="0"
            ),
        ]
    )
    changes = {
        ConfigResource("topic", "t"): [AlterConfigOp("retention.ms", "set", "5")],
        ConfigResource("broker", "1"): [
            AlterConfigOp("leader.replication.throttled.rate", "set", "0")
        ],
    }
    with pytest.raises(InvalidConfigError, match="broker 1"):
        _run(_Recorder(answer), lambda a: a.incremental_alter_configs(changes))
    described = pb.DescribeConfigsResponse(
        results=[
            pb.DescribeConfigsResult(
                resource_type=2,
                resource_name="t",
                configs=[pb.DescribeConfigsEntry(name="retention.ms", value="5", config_source=1)],
            )
        ]
    )
    out = _run(_Recorder(described), lambda a: a.describe_configs([ConfigResource("topic", "t")]))
    assert out == {
        ConfigResource("topic", "t"): [ConfigEntry("retention.ms", "5", "DYNAMIC_TOPIC_CONFIG")]
    }
    unknown = pb.DescribeConfigsResponse(
        results=[
            pb.DescribeConfigsResult(
                resource_type=2, resource_name="x", error_code=pb.UNKNOWN_TOPIC_OR_PARTITION
            )
        ]
    )
    with pytest.raises(UnknownTopicOrPartitionError):
        _run(_Recorder(unknown), lambda a: a.describe_configs([ConfigResource("topic", "x")]))


def test_decommission_returns_the_partitions_moving_or_raises() -> None:
    ok = pb.DecommissionBrokerResponse(partitions_moving=4)
    assert _run(_Recorder(ok), lambda a: a.decommission_broker(2)) == 4
    unknown = pb.DecommissionBrokerResponse(error_code=pb.BROKER_ID_NOT_REGISTERED)
    with pytest.raises(BrokerIdNotRegisteredError):
        _run(_Recorder(unknown), lambda a: a.decommission_broker(9, cancel=True))


def test_the_blocking_admin_checks_arguments_too() -> None:
    with Admin("127.0.0.1:1", default_api_timeout_ms=100) as admin:
        with pytest.raises(ValueError):
            admin.decommission_broker(-1)
        with pytest.raises(TypeError):
            admin.alter_partition_reassignments({TP("t", 0): "1"})
        with pytest.raises(ValueError):
            admin.create_partitions({"t": 0})
        assert admin.describe_configs([]) == {}
        assert admin.list_partition_reassignments([]) == {}
