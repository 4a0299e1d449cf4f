"""The pure parts of `configs`, `topics alter`, the reassignment columns of `topics describe`
and the decommission states of `brokers` (issue 14)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from minibroker.client.admin import PartitionDescription, TopicDescription
from minibroker.client.cli import brokers, configs, topics
from minibroker.client.cli.configs import ConfigsInputError, ConfigTarget
from minibroker.client.types import TopicPartition
from minibroker.deploy.cli import build_parser


def _configs(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["configs", *argv])


def test_add_config_splits_on_commas_outside_brackets_like_kafka() -> None:
    assert configs.parse_add_config("min.insync.replicas=2") == {"min.insync.replicas": "2"}
    assert configs.parse_add_config(
        "a=1,leader.replication.throttled.replicas=[0:1,0:2,1:3],b=x=y"
    ) == {"a": "1", "leader.replication.throttled.replicas": "0:1,0:2,1:3", "b": "x=y"}
    assert configs.parse_add_config(" a = 1 , b=[] ") == {"a": "1", "b": ""}
    for bad, message in [("novalue", "k=v"), ("=1", "k=v"), ("a=1,a=2", "twice"), (",", "empty")]:
        with pytest.raises(ConfigsInputError, match=message):
            configs.parse_add_config(bad)


def test_delete_config_and_alter_ops() -> None:
    assert configs.parse_delete_config("a, b,") == ["a", "b"]
    with pytest.raises(ConfigsInputError):
        configs.parse_delete_config(" , ")
    assert configs.alter_ops("a=1", "b") == [("a", "set", "1"), ("b", "delete", None)]
    with pytest.raises(ConfigsInputError, match="both added and deleted"):
        configs.alter_ops("a=1", "a")
    with pytest.raises(ConfigsInputError, match="--add-config and/or --delete-config"):
        configs.alter_ops(None, None)


def test_entity_targets() -> None:
    t = configs.target_of(_configs("--describe", "--entity-type", "topics", "--entity-name", "t"))
    assert t == ConfigTarget("topic", "t") and t.describe() == "config for topic t"
    b = configs.target_of(_configs("--alter", "--entity-type", "brokers", "--entity-name", "2"))
    assert b == ConfigTarget("broker", "2")
    d = configs.target_of(_configs("--alter", "--entity-type", "brokers", "--entity-default"))
    assert d == ConfigTarget("broker", "")
    assert d.describe() == "default config for brokers in the cluster"
    for argv, message in [
        (["--entity-type", "brokers", "--entity-name", "one"], "must be a broker id"),
        (["--entity-type", "brokers", "--entity-name", "-1"], "must be a broker id"),
        (["--entity-type", "topics", "--entity-default"], "only goes with --entity-type brokers"),
        (["--entity-type", "topics"], "--entity-name is required"),
        (["--entity-type", "brokers", "--entity-name", "1", "--entity-default"], "not both"),
    ]:
        with pytest.raises(ConfigsInputError, match=message):
            configs.target_of(_configs("--alter", *argv))
    with pytest.raises(SystemExit):
        _configs("--alter", "--entity-type", "users", "--entity-name", "x")
    with pytest.raises(SystemExit):
        _configs("--alter", "--describe", "--entity-type", "topics", "--entity-name", "x")


@dataclass
class _Entry:
    name: str
    value: str | None
    source: str


def test_describe_lines_in_kafka_configs_shape() -> None:
    entries = [
        _Entry("retention.ms", "604800000", "DEFAULT_CONFIG"),
        _Entry("segment.bytes", "1024", "STATIC_BROKER_CONFIG"),
        _Entry("min.insync.replicas", "2", "DYNAMIC_TOPIC_CONFIG"),
    ]
    assert configs.describe_lines(ConfigTarget("topic", "t"), entries) == [
        "Dynamic configs for topic t are:",
        "  min.insync.replicas=2 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:"
        "min.insync.replicas=2}",
    ]
    lines = configs.describe_lines(ConfigTarget("topic", "t"), entries, all_configs=True)
    assert lines[0] == "All configs for topic t are:" and len(lines) == 4
    assert lines[2].startswith("  retention.ms=604800000 ")
    rates = [
        _Entry("leader.replication.throttled.rate", "10", "DYNAMIC_DEFAULT_BROKER_CONFIG"),
        _Entry("follower.replication.throttled.rate", None, "DYNAMIC_BROKER_CONFIG"),
    ]
    assert configs.describe_lines(ConfigTarget("broker", ""), rates) == [
        "Default configs for brokers in the cluster are:",
        "  leader.replication.throttled.rate=10 sensitive=false synonyms="
        "{DYNAMIC_DEFAULT_BROKER_CONFIG:leader.replication.throttled.rate=10}",
    ]
    assert configs.describe_lines(ConfigTarget("broker", "1"), rates) == [
        "Dynamic configs for broker 1 are:",
        "  follower.replication.throttled.rate=null sensitive=false synonyms="
        "{DYNAMIC_BROKER_CONFIG:follower.replication.throttled.rate=null}",
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["--alter", "--entity-type", "topics", "--entity-name", "t"],
        ["--alter", "--entity-type", "topics", "--entity-name", "t", "--add-config", "bad"],
        ["--alter", "--entity-type", "brokers", "--entity-name", "x", "--add-config", "a=1"],
        ["--describe", "--entity-type", "topics", "--entity-name", "t", "--add-config", "a=1"],
        [
            "--alter",
            "--entity-type",
            "topics",
            "--entity-name",
            "t",
            "--all",
            "--add-config",
            "a=1",
        ],
    ],
)
def test_configs_bad_command_lines_exit_1_without_connecting(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    args = _configs(*argv, "--bootstrap-server", "127.0.0.1:1")
    assert args.func(args) == 1
    assert capsys.readouterr().err.startswith("error: ")


def test_topics_alter_replica_assignment() -> None:
    assert topics.parse_replica_assignment("1:2,2:3, 3:1") == [[1, 2], [2, 3], [3, 1]]
    with pytest.raises(ValueError, match="partition 1"):
        topics.parse_replica_assignment("1:2,x")
    with pytest.raises(ValueError, match="twice"):
        topics.parse_replica_assignment("1:1")
    assert topics.new_partition_assignments([[1], [2], [3]], 2, 3) == [[3]]
    with pytest.raises(ValueError, match="lists 2 partition"):
        topics.new_partition_assignments([[1], [2]], 1, 3)
    args = build_parser().parse_args(["topics", "alter", "--topic", "t", "--partitions", "4"])
    assert (args.topic, args.partitions, args.replica_assignment) == ("t", 4, None)
    args = build_parser().parse_args(["topics", "alter", "--topic", "t", "--partitions", "0"])
    assert args.func(args) == 1


def _moving_topic() -> TopicDescription:
    part = PartitionDescription(
        "foo",
        0,
        1,
        3,
        7,
        (4, 5, 1, 2),
        (1, 2, 4),
        (),
        10,
        {1: 100, 2: 100, 4: 60, 5: None},
        adding_replicas=(4, 5),
        removing_replicas=(1, 2),
    )
    return TopicDescription("foo", "tid", (part,), {})


def test_topics_describe_shows_a_reassignment_in_progress() -> None:
    lines = topics.format_describe([_moving_topic()])
    assert lines[1] == (
        "\tTopic: foo\tPartition: 0\tLeader: 1\tLeaderEpoch: 3\tReplicas: 4,5,1,2\t"
        "Isr: 1,2,4\tAdding Replicas: 4,5\tRemoving Replicas: 1,2\tOfflineReplicas: \t"
        "HighWatermark: 10\tLogEndOffsets: 1=100,2=100,4=60,5=?\tCatchingUp: 4=40,5=?"
    )
    row = topics.describe_json([_moving_topic()])[0]
    assert row["adding_replicas"] == [4, 5] and row["removing_replicas"] == [1, 2]


def test_catching_up_is_never_negative_and_unknown_without_the_leader() -> None:
    p = SimpleNamespace(leader=1, log_end_offsets={1: 5, 4: 9})
    assert topics.catching_up(p, (4,)) == "4=0"
    p = SimpleNamespace(leader=-1, log_end_offsets={4: 9})
    assert topics.catching_up(p, (4,)) == "4=?"


def _broker(**kw: object) -> SimpleNamespace:
    base: dict[str, object] = dict(
        broker_id=1,
        host="h",
        port=1,
        rack="",
        fenced=False,
        in_controlled_shutdown=False,
        broker_epoch=3,
        last_heartbeat_ms_ago=5,
        decommissioning=False,
        replica_count=4,
        leader_count=2,
    )
    base.update(kw)
    return SimpleNamespace(**base)


def test_broker_states() -> None:
    assert brokers.broker_state(_broker()) == "active"
    assert brokers.broker_state(_broker(fenced=True)) == "fenced"
    assert brokers.broker_state(_broker(in_controlled_shutdown=True)) == "shutting-down"
    assert brokers.broker_state(_broker(decommissioning=True)) == "decommissioning"
    assert brokers.broker_state(_broker(decommissioning=True, replica_count=0)) == "decommissioned"
    # Stopped once it held nothing: still safe, still decommissioned.
    gone = _broker(decommissioning=True, replica_count=0, fenced=True)
    assert brokers.broker_state(gone) == "decommissioned"
    assert brokers.broker_state(_broker(decommissioning=True, fenced=True)) == "fenced"
    line = brokers.format_brokers([_broker(decommissioning=True)])[0]
    assert "\tState: decommissioning\tReplicas: 4\tLeaders: 2\t" in line


@dataclass
class _Ongoing:
    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]


def test_decommission_progress_lines() -> None:
    ongoing = {
        TopicPartition("t", 0): _Ongoing((2, 3, 1), (3,), (1,)),
        TopicPartition("t", 1): _Ongoing((2, 4, 5), (4,), (5,)),
    }
    line, done = brokers.decommission_progress(1, _broker(replica_count=3, leader_count=0), ongoing)
    assert not done
    assert line == (
        "Broker 1: 3 replica(s) and 0 leadership(s) left, 1 of 2 running reassignment(s) "
        "moving off it"
    )
    line, done = brokers.decommission_progress(1, _broker(replica_count=0, leader_count=0), {})
    assert done and line.startswith("Broker 1 holds no replicas: it can be stopped")
    # A leadership left is not done, even with no replica counted yet.
    _, done = brokers.decommission_progress(1, _broker(replica_count=0, leader_count=1), {})
    assert not done
    line, done = brokers.decommission_progress(1, None, {})
    assert done and line == "Broker 1 is no longer registered."


def test_rebalance_places_only_on_active_brokers() -> None:
    cluster = SimpleNamespace(
        brokers=[
            _broker(broker_id=3, rack="b"),
            _broker(broker_id=1, rack="a"),
            _broker(broker_id=2, fenced=True),
            _broker(broker_id=4, decommissioning=True),
        ]
    )
    slots = brokers.rebalance_brokers(cluster)
    assert [(s.broker_id, s.rack) for s in slots] == [(1, "a"), (3, "b")]


def test_brokers_subcommands_parse() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["brokers", "decommission", "3", "--wait", "--bootstrap-server", "h:1"]
    )
    assert (args.id, args.wait, args.cancel, args.bootstrap_server) == (3, True, False, "h:1")
    args = parser.parse_args(["brokers", "rebalance", "--execute", "--throttle", "100"])
    assert args.execute and args.throttle == "100"
    args = parser.parse_args(["brokers", "rebalance", "--throttle", "0"])
    assert args.func(args) == 1, "a throttle of 0 is refused before connecting"


def test_every_command_of_the_readme_moving_replicas_section_parses() -> None:
    import pathlib
    import shlex

    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("## Moving replicas", 1)[1].split("\n## ", 1)[0]
    commands = [
        line.split("#", 1)[0].split(">", 1)[0].strip()
        for line in section.splitlines()
        if line.startswith("minibroker ")
    ]
    assert len(commands) >= 10
    parser = build_parser()
    for command in commands:
        args = parser.parse_args(shlex.split(command)[1:])
        assert callable(args.func), command
