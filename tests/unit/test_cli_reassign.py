"""`minibroker reassign-partitions`' pure parts: Kafka's JSON formats, bad input, throttle lists,
the verify/list wording, and the option checks."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minibroker.client.cli import reassign
from minibroker.client.cli.reassign_plan import (
    PartitionState,
    ReassignInputError,
    check_against_cluster,
    clear_throttle_changes,
    format_assignment,
    format_topics_to_move,
    generate_output,
    list_lines,
    parse_broker_list,
    parse_reassignment,
    parse_throttle,
    parse_topics_to_move,
    rollback_output,
    throttle_changes,
    throttle_plan,
    verify_lines,
)
from minibroker.client.types import TopicPartition
from minibroker.deploy.cli import build_parser

TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)
KAFKA_JSON = (
    '{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,2,3],'
    '"log_dirs":["any","any","any"]}]}'
)


def test_kafka_reassignment_json_round_trips_byte_for_byte() -> None:
    parsed = parse_reassignment(KAFKA_JSON)
    assert parsed == {TP0: (1, 2, 3)}
    assert format_assignment(parsed) == KAFKA_JSON


def test_log_dirs_are_optional_and_partitions_keep_file_order() -> None:
    text = json.dumps(
        {
            "version": 1,
            "partitions": [
                {"topic": "b", "partition": 1, "replicas": [4]},
                {"topic": "a", "partition": 0, "replicas": [2, 1]},
            ],
        }
    )
    parsed = parse_reassignment(text)
    assert list(parsed) == [TopicPartition("b", 1), TopicPartition("a", 0)]
    assert parsed[TopicPartition("a", 0)] == (2, 1), "replica order is the preferred order"
    # Output is sorted by topic then partition.
    assert format_assignment(parsed).index('"a"') < format_assignment(parsed).index('"b"')


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1,2]", "must be a JSON object"),
        ('{"version":2,"partitions":[]}', "unsupported version 2"),
        ('{"version":"1","partitions":[]}', "unsupported version"),
        ('{"version":1}', 'non-empty "partitions"'),
        ('{"version":1,"partitions":[]}', "cannot be empty"),
        ('{"version":1,"partitions":[3]}', "must be an object"),
        ('{"version":1,"partitions":[{"partition":0,"replicas":[1]}]}', '"topic"'),
        ('{"version":1,"partitions":[{"topic":"t","replicas":[1]}]}', '"partition"'),
        ('{"version":1,"partitions":[{"topic":"t","partition":-1,"replicas":[1]}]}', ">= 0"),
        ('{"version":1,"partitions":[{"topic":"t","partition":true,"replicas":[1]}]}', ">= 0"),
        ('{"version":1,"partitions":[{"topic":"t","partition":0}]}', '"replicas"'),
        ('{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[]}]}', "factor 0"),
        ('{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,1]}]}', "duplicate"),
        ('{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":["1"]}]}', "broker ids"),
        ('{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[-1]}]}', "broker ids"),
        (
            '{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,2],'
            '"log_dirs":["any"]}]}',
            "one directory per replica",
        ),
        (
            '{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1],'
            '"log_dirs":["/data"]}]}',
            '"any"',
        ),
        (
            '{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1]},'
            '{"topic":"t","partition":0,"replicas":[2]}]}',
            "listed twice",
        ),
    ],
)
def test_bad_reassignment_json_is_refused_with_a_clear_message(text: str, message: str) -> None:
    with pytest.raises(ReassignInputError, match=message):
        parse_reassignment(text)


def test_bad_input_is_a_value_error_so_the_cli_exits_1() -> None:
    assert issubclass(ReassignInputError, ValueError)


def test_topics_to_move_json() -> None:
    text = '{"version":1,"topics":[{"topic":"foo"},{"topic":"bar"}]}'
    assert parse_topics_to_move(text) == ["foo", "bar"]
    assert format_topics_to_move(["foo", "bar"]) == text
    for bad, message in [
        ('{"version":1,"topics":[]}', "non-empty"),
        ('{"version":3,"topics":[{"topic":"a"}]}', "version"),
        ('{"version":1,"topics":[{"name":"a"}]}', 'needs a "topic"'),
        ('{"version":1,"topics":[{"topic":"a"},{"topic":"a"}]}', "twice"),
        ("nope", "not valid JSON"),
    ]:
        with pytest.raises(ReassignInputError, match=message):
            parse_topics_to_move(bad)


def test_broker_list_and_throttle() -> None:
    assert parse_broker_list("1,2, 4") == [1, 2, 4]
    for bad in ["1,x", "1,1", "-1", ""]:
        with pytest.raises(ReassignInputError):
            parse_broker_list(bad)
    assert parse_throttle(None) is None
    assert parse_throttle("1048576") == 1048576
    for bad in ["0", "-5", "fast", "1.5"]:
        with pytest.raises(ReassignInputError):
            parse_throttle(bad)


def test_generate_and_rollback_output_shapes() -> None:
    current = {TP0: (1, 2)}
    proposed = {TP0: (3, 4)}
    lines = generate_output(current, proposed)
    assert lines[0] == "Current partition replica assignment"
    assert json.loads(lines[1])["partitions"][0]["replicas"] == [1, 2]
    assert lines[3] == "Proposed partition reassignment configuration"
    assert json.loads(lines[4])["partitions"][0]["replicas"] == [3, 4]
    rollback = rollback_output(current)
    assert rollback[0] == "Current partition replica assignment"
    assert parse_reassignment(rollback[2]) == current, "the rollback JSON is a valid input"
    assert rollback[-1] == "Save this to use as the --reassignment-json-file option during rollback"


def test_throttle_plan_is_kafkas_rule() -> None:
    current = {TP0: (1, 2, 3), TP1: (2, 3, 4), TopicPartition("u", 0): (1,)}
    targets = {TP0: (1, 5, 6), TP1: (2, 3, 4), TopicPartition("u", 0): (2,)}
    plan = throttle_plan(current, targets)
    # Leader list: every current replica of a moving partition (any may lead during the move).
    assert plan.leader_replicas == {
        "t": frozenset({(0, 1), (0, 2), (0, 3)}),
        "u": frozenset({(0, 1)}),
    }
    # Follower list: only the replicas being added.
    assert plan.follower_replicas == {"t": frozenset({(0, 5), (0, 6)}), "u": frozenset({(0, 2)})}
    # t-1 does not move: its brokers are not involved unless another move names them.
    assert plan.brokers == (1, 2, 3, 5, 6)


def test_throttle_changes_and_their_removal() -> None:
    plan = throttle_plan({TP0: (1, 2)}, {TP0: (2, 3)})
    changes = throttle_changes(plan, 1000)
    assert (
        "broker",
        "1",
        (
            ("leader.replication.throttled.rate", "set", "1000"),
            ("follower.replication.throttled.rate", "set", "1000"),
        ),
    ) in changes
    assert [c[1] for c in changes if c[0] == "broker"] == ["1", "2", "3"]
    (topic,) = [c for c in changes if c[0] == "topic"]
    assert topic == (
        "topic",
        "t",
        (
            ("leader.replication.throttled.replicas", "set", "0:1,0:2"),
            ("follower.replication.throttled.replicas", "set", "0:3"),
        ),
    )
    cleared = clear_throttle_changes([3, 1, 1], ["t"])
    assert [(k, n) for k, n, _ in cleared] == [("broker", "1"), ("broker", "3"), ("topic", "t")]
    assert all(op == "delete" and value is None for _, _, ops in cleared for _, op, value in ops)
    assert {name for _, _, ops in cleared for name, _, _ in ops} == {
        "leader.replication.throttled.rate",
        "follower.replication.throttled.rate",
        "leader.replication.throttled.replicas",
        "follower.replication.throttled.replicas",
    }


@given(
    st.dictionaries(
        st.integers(0, 5),
        st.tuples(
            st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True),
            st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True),
        ),
        max_size=6,
    )
)
def test_throttle_plan_properties(moves: dict[int, tuple[list[int], list[int]]]) -> None:
    current = {TopicPartition("t", p): tuple(c) for p, (c, _) in moves.items()}
    targets = {TopicPartition("t", p): tuple(t) for p, (_, t) in moves.items()}
    plan = throttle_plan(current, targets)
    followers = plan.follower_replicas.get("t", frozenset())
    leaders = plan.leader_replicas.get("t", frozenset())
    for p, (c, t) in moves.items():
        moving = tuple(c) != tuple(t)
        for b in set(c) | set(t):
            assert ((p, b) in followers) == (moving and b not in c)
            assert ((p, b) in leaders) == (moving and b in c)
            assert (b in plan.brokers) or not moving


def test_check_against_cluster_refuses_unknown_things() -> None:
    counts = {"t": 2}
    check_against_cluster({TP1: (1, 2)}, counts, [1, 2, 3])
    with pytest.raises(ReassignInputError, match="topic 'x' does not exist"):
        check_against_cluster({TopicPartition("x", 0): (1,)}, counts, [1])
    with pytest.raises(ReassignInputError, match="partition t-2 does not exist"):
        check_against_cluster({TopicPartition("t", 2): (1,)}, counts, [1])
    with pytest.raises(ReassignInputError, match="unknown broker id"):
        check_against_cluster({TP0: (1, 9)}, counts, [1, 2])


def test_verify_lines() -> None:
    targets = {TP0: (3, 4), TP1: (1, 2), TopicPartition("t", 2): (5,)}
    states = {
        TP0: PartitionState((3, 4, 1, 2), True),
        TP1: PartitionState((1, 2), False),
        TopicPartition("t", 2): PartitionState((6,), False),
    }
    lines, done = verify_lines(targets, states)
    assert lines == [
        "Status of partition reassignment:",
        "Reassignment of partition t-0 is still in progress.",
        "Reassignment of partition t-1 is completed.",
        "There is no active reassignment of partition t-2, but replica set is 6 rather than 5.",
    ]
    assert not done
    lines, done = verify_lines({TP1: (1, 2)}, states)
    assert done
    _, done = verify_lines({TopicPartition("gone", 0): (1,)}, states)
    assert not done


@dataclass
class _Ongoing:
    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]


def test_list_lines_in_kafkas_wording() -> None:
    assert list_lines({}) == ["No partition reassignments found."]
    assert list_lines({TP0: _Ongoing((4, 2, 1), (4,), (1,))}) == [
        "Current partition reassignments:",
        "t-0: replicas: 4,2,1. adding: 4. removing: 1.",
    ]


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["reassign-partitions", *argv])


def test_the_command_parses_and_checks_which_options_go_together() -> None:
    args = _args(
        "--execute",
        "--reassignment-json-file",
        "f.json",
        "--throttle",
        "-5",
        "--bootstrap-server",
        "h:1",
    )
    assert args.execute and args.throttle == "-5" and args.bootstrap_server == "h:1"
    reassign.check_options(args)
    with pytest.raises(ReassignInputError, match="--throttle only goes with --execute"):
        reassign.check_options(
            _args("--verify", "--reassignment-json-file", "f", "--throttle", "1")
        )
    with pytest.raises(ReassignInputError, match="needs --topics-to-move-json-file"):
        reassign.check_options(_args("--generate", "--broker-list", "1,2"))
    with pytest.raises(ReassignInputError, match="--reassignment-json-file"):
        reassign.check_options(_args("--cancel"))
    reassign.check_options(_args("--list"))
    with pytest.raises(SystemExit):
        _args("--list", "--verify")
    with pytest.raises(SystemExit):
        _args()


def _write(tmp_path, text: str) -> str:  # type: ignore[no-untyped-def]
    path = tmp_path / "r.json"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "argv",
    [
        ["--execute", "--reassignment-json-file", "{file}", "--throttle", "0"],
        ["--execute", "--reassignment-json-file", "{file}", "--throttle", "-1"],
        ["--execute", "--reassignment-json-file", "/nonexistent/r.json"],
        ["--verify", "--reassignment-json-file", "{bad}"],
        ["--cancel", "--reassignment-json-file", "{bad}"],
        ["--execute", "--reassignment-json-file", "{bad}"],
    ],
)
def test_bad_input_exits_1_before_any_connection(
    tmp_path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],  # type: ignore[no-untyped-def]
) -> None:
    good = _write(tmp_path, KAFKA_JSON)
    bad = tmp_path / "bad.json"
    bad.write_text('{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[]}]}')
    argv = [a.format(file=good, bad=bad) for a in argv]
    # An address nobody listens on: reaching the network would fail differently (and slowly).
    args = _args(*argv, "--bootstrap-server", "127.0.0.1:1")
    assert args.func(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_original_replicas_drop_the_adding_ones() -> None:
    @dataclass
    class P:
        partition: int
        replicas: tuple[int, ...]
        adding_replicas: tuple[int, ...] = ()

    @dataclass
    class T:
        name: str
        partitions: tuple[P, ...]

    topics = [T("t", (P(0, (4, 5, 1, 2), (4, 5)), P(1, (1, 2))))]
    assert reassign.current_assignment(topics) == {TP0: (1, 2), TP1: (1, 2)}
    assert reassign.plan_keys({("t", 0): [3, 1]}) == {TP0: (3, 1)}


def test_report_started(capsys: pytest.CaptureFixture[str]) -> None:
    from minibroker.client.errors import InvalidReplicaAssignmentError

    assert reassign.report_started({TP0: None, TP1: None}) == 0
    assert capsys.readouterr().out == "Successfully started partition reassignments for t-0, t-1\n"
    failed = {TP0: None, TP1: InvalidReplicaAssignmentError("broker 9 is not registered")}
    assert reassign.report_started(failed) == 1
    captured = capsys.readouterr()
    assert captured.out == "Successfully started partition reassignment for t-0\n"
    assert captured.err == (
        "Error reassigning partition(s):\n"
        "t-1: InvalidReplicaAssignmentError: broker 9 is not registered\n"
    )


def test_generate_and_rebalance_plans_from_described_topics() -> None:
    from minibroker.client.admin import PartitionDescription, TopicDescription
    from minibroker.client.cli.reassign_plan import generate_output
    from minibroker.metadata.assignment_plan import plan_generate, plan_rebalance
    from minibroker.metadata.placement import BrokerSlot

    parts = tuple(PartitionDescription("t", p, 1, 0, 0, (1, 2), (1, 2), ()) for p in range(4))
    topics = [TopicDescription("t", "tid", parts)]
    records = reassign.partition_records(topics)
    assert {r.topic_id for r in records} == {"t"}, "the name stands in for the topic id"
    slots = [BrokerSlot(3, ""), BrokerSlot(4, "")]
    proposed = reassign.plan_keys(plan_generate(records, slots))
    assert set(proposed) == {TopicPartition("t", p) for p in range(4)}
    assert all(set(r) == {3, 4} for r in proposed.values())
    lines = generate_output(reassign.current_assignment(topics), proposed)
    assert parse_reassignment(lines[4]) == dict(sorted(proposed.items()))
    everyone = [BrokerSlot(b, "") for b in (1, 2, 3, 4)]
    moves = reassign.plan_keys(plan_rebalance(records, everyone))
    assert moves, "brokers 3 and 4 hold nothing: replicas move onto them"
    assert all(len(set(r)) == 2 for r in moves.values())
