"""The pure half of `minibroker reassign-partitions`: Kafka's JSON files, throttle lists, output.

Pure: no I/O. Kafka's formats (kafka-reassign-partitions.sh), exactly:

- topics to move: `{"version":1,"topics":[{"topic":"foo"},{"topic":"bar"}]}`;
- a reassignment: `{"version":1,"partitions":[{"topic":"foo","partition":0,"replicas":[1,2,3],
  "log_dirs":["any","any","any"]}]}` (`log_dirs` optional; minibroker has one log directory per
  broker, so only "any" is accepted).

Every parser raises `ReassignInputError` (a ValueError: the CLI prints one line, exits 1) with a
message that names the bad entry, before anything is sent to the cluster.

Throttles follow Kafka's rule (KIP-73, `ReassignPartitionsCommand.calculateLeaderThrottles` /
`calculateFollowerThrottles`): for every partition that moves, the leader list names its current
replicas (a leader may be any of them while the move runs) and the follower list names the
replicas being added.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from minibroker.client.replication_throttle import (
    FOLLOWER_THROTTLED_RATE,
    FOLLOWER_THROTTLED_REPLICAS,
    LEADER_THROTTLED_RATE,
    LEADER_THROTTLED_REPLICAS,
    format_throttled_replicas,
)
from minibroker.client.types import TopicPartition

VERSION = 1
ANY_LOG_DIR = "any"


class ReassignInputError(ValueError):
    """A bad command line value or JSON file: nothing was changed."""


def _load(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ReassignInputError(f"{what} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ReassignInputError(f"{what} must be a JSON object, got {type(data).__name__}")
    version = data.get("version", VERSION)
    if type(version) is not int or version != VERSION:
        raise ReassignInputError(f"{what}: unsupported version {version!r} (only 1)")
    return data


def _is_int(value: Any) -> bool:
    return type(value) is int  # bool is an int subclass: true/false are not ids


def parse_topics_to_move(text: str) -> list[str]:
    """`{"version":1,"topics":[{"topic":"t"}]}` -> ["t"], in file order."""
    data = _load(text, "topics-to-move JSON")
    topics = data.get("topics")
    if not isinstance(topics, list) or not topics:
        raise ReassignInputError('topics-to-move JSON needs a non-empty "topics" list')
    out: list[str] = []
    for i, entry in enumerate(topics):
        name = entry.get("topic") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise ReassignInputError(f'topics[{i}] needs a "topic" name, got {entry!r}')
        if name in out:
            raise ReassignInputError(f"topic {name!r} is listed twice")
        out.append(name)
    return out


def parse_reassignment(text: str) -> dict[TopicPartition, tuple[int, ...]]:
    """Kafka's reassignment JSON -> {TopicPartition: target replicas}, in file order."""
    data = _load(text, "reassignment JSON")
    partitions = data.get("partitions")
    if not isinstance(partitions, list) or not partitions:
        raise ReassignInputError(
            'reassignment JSON needs a non-empty "partitions" list (partition reassignment list '
            "cannot be empty)"
        )
    out: dict[TopicPartition, tuple[int, ...]] = {}
    for i, entry in enumerate(partitions):
        where = f"partitions[{i}]"
        if not isinstance(entry, dict):
            raise ReassignInputError(f"{where} must be an object, got {entry!r}")
        topic = entry.get("topic")
        if not isinstance(topic, str) or not topic:
            raise ReassignInputError(f'{where} needs a "topic" name')
        partition = entry.get("partition")
        if not isinstance(partition, int) or not _is_int(partition) or partition < 0:
            raise ReassignInputError(f'{where} ({topic}) needs a "partition" number >= 0')
        tp = TopicPartition(topic, partition)
        replicas = entry.get("replicas")
        if not isinstance(replicas, list):
            raise ReassignInputError(f'{where} ({tp}) needs a "replicas" list')
        if not replicas:
            raise ReassignInputError(f"{tp}: the replica list is empty (replication factor 0)")
        if not all(_is_int(r) and r >= 0 for r in replicas):
            raise ReassignInputError(f"{tp}: replicas must be broker ids >= 0, got {replicas}")
        if len(set(replicas)) != len(replicas):
            raise ReassignInputError(f"{tp}: duplicate replica in {replicas}")
        log_dirs = entry.get("log_dirs")
        if log_dirs is not None:
            if not isinstance(log_dirs, list) or len(log_dirs) != len(replicas):
                raise ReassignInputError(
                    f"{tp}: log_dirs must list one directory per replica ({len(replicas)})"
                )
            if any(d != ANY_LOG_DIR for d in log_dirs):
                raise ReassignInputError(
                    f'{tp}: only "any" log_dirs are supported (one log directory per broker)'
                )
        if tp in out:
            raise ReassignInputError(f"partition {tp} is listed twice")
        out[tp] = tuple(replicas)
    return out


def parse_broker_list(text: str) -> list[int]:
    """`"1,2,4"` -> [1, 2, 4]."""
    out: list[int] = []
    for item in text.split(","):
        try:
            broker = int(item.strip())
        except ValueError:
            raise ReassignInputError(
                f"--broker-list: {item.strip()!r} is not a broker id"
            ) from None
        if broker < 0:
            raise ReassignInputError(f"--broker-list: {broker} is not a broker id")
        if broker in out:
            raise ReassignInputError(f"--broker-list: broker {broker} is listed twice")
        out.append(broker)
    return out


def parse_throttle(text: str | None) -> int | None:
    """`--throttle BYTES`: a positive number of bytes per second (None: no throttle)."""
    if text is None:
        return None
    try:
        rate = int(text.strip())
    except ValueError:
        raise ReassignInputError(f"--throttle: {text!r} is not a number of bytes/s") from None
    if rate <= 0:
        raise ReassignInputError(f"--throttle must be a positive number of bytes/s, got {rate}")
    return rate


def format_assignment(assignment: Mapping[TopicPartition, Sequence[int]]) -> str:
    """Kafka's reassignment JSON on one line, partitions in (topic, partition) order."""
    partitions = [
        {
            "topic": tp.topic,
            "partition": tp.partition,
            "replicas": list(replicas),
            "log_dirs": [ANY_LOG_DIR] * len(replicas),
        }
        for tp, replicas in sorted(assignment.items())
    ]
    return json.dumps({"version": VERSION, "partitions": partitions}, separators=(",", ":"))


def format_topics_to_move(topics: Iterable[str]) -> str:
    return json.dumps(
        {"version": VERSION, "topics": [{"topic": t} for t in topics]}, separators=(",", ":")
    )


def generate_output(
    current: Mapping[TopicPartition, Sequence[int]],
    proposed: Mapping[TopicPartition, Sequence[int]],
) -> list[str]:
    """`--generate`'s lines, as Kafka prints them."""
    return [
        "Current partition replica assignment",
        format_assignment(current),
        "",
        "Proposed partition reassignment configuration",
        format_assignment(proposed),
    ]


def rollback_output(current: Mapping[TopicPartition, Sequence[int]]) -> list[str]:
    """What `--execute` prints before it starts anything (Kafka's rollback hint)."""
    return [
        "Current partition replica assignment",
        "",
        format_assignment(current),
        "",
        "Save this to use as the --reassignment-json-file option during rollback",
    ]


@dataclass(frozen=True, slots=True)
class ThrottlePlan:
    """What `--execute --throttle` sets: the rates on `brokers`, and per topic the
    `partition:broker` pairs of its leader and follower throttled replica lists."""

    brokers: tuple[int, ...]
    leader_replicas: Mapping[str, frozenset[tuple[int, int]]]
    follower_replicas: Mapping[str, frozenset[tuple[int, int]]]


def throttle_plan(
    current: Mapping[TopicPartition, Sequence[int]],
    targets: Mapping[TopicPartition, Sequence[int]],
) -> ThrottlePlan:
    """Kafka's rule: for each partition whose replicas change, leader list = its current
    replicas, follower list = the target replicas it does not have yet; the rates go on every
    broker that is a current or a target replica of a moving partition."""
    leaders: dict[str, set[tuple[int, int]]] = {}
    followers: dict[str, set[tuple[int, int]]] = {}
    brokers: set[int] = set()
    for tp, target in targets.items():
        now = tuple(current.get(tp, ()))
        if tuple(target) == now:
            continue
        adding = [b for b in target if b not in now]
        leaders.setdefault(tp.topic, set()).update((tp.partition, b) for b in now)
        if adding:
            followers.setdefault(tp.topic, set()).update((tp.partition, b) for b in adding)
        brokers.update(now)
        brokers.update(target)
    return ThrottlePlan(
        tuple(sorted(brokers)),
        {t: frozenset(p) for t, p in leaders.items()},
        {t: frozenset(p) for t, p in followers.items()},
    )


# (resource type "topic"|"broker", resource name, ((config name, op "set"|"delete", value), ...))
ConfigChange = tuple[str, str, tuple[tuple[str, str, str | None], ...]]


def throttle_changes(plan: ThrottlePlan, rate: int) -> list[ConfigChange]:
    """The config changes `--execute --throttle rate` makes: both rates on every broker of
    the plan, and each topic's two throttled replica lists (SET, as Kafka does)."""
    out: list[ConfigChange] = [
        (
            "broker",
            str(b),
            (
                (LEADER_THROTTLED_RATE, "set", str(rate)),
                (FOLLOWER_THROTTLED_RATE, "set", str(rate)),
            ),
        )
        for b in plan.brokers
    ]
    for topic in sorted(set(plan.leader_replicas) | set(plan.follower_replicas)):
        ops: list[tuple[str, str, str | None]] = []
        leader = plan.leader_replicas.get(topic, frozenset())
        follower = plan.follower_replicas.get(topic, frozenset())
        if leader:
            ops.append((LEADER_THROTTLED_REPLICAS, "set", format_throttled_replicas(leader)))
        if follower:
            ops.append((FOLLOWER_THROTTLED_REPLICAS, "set", format_throttled_replicas(follower)))
        out.append(("topic", topic, tuple(ops)))
    return out


def clear_throttle_changes(brokers: Iterable[int], topics: Iterable[str]) -> list[ConfigChange]:
    """What `--verify` (once complete) and `--cancel` remove: the rates on `brokers`, the
    throttled replica lists of `topics` (Kafka's clearAllThrottles)."""
    rates = ((LEADER_THROTTLED_RATE, "delete", None), (FOLLOWER_THROTTLED_RATE, "delete", None))
    lists = (
        (LEADER_THROTTLED_REPLICAS, "delete", None),
        (FOLLOWER_THROTTLED_REPLICAS, "delete", None),
    )
    out: list[ConfigChange] = [("broker", str(b), rates) for b in sorted(set(brokers))]
    out += [("topic", t, lists) for t in sorted(set(topics))]
    return out


def check_against_cluster(
    targets: Mapping[TopicPartition, Sequence[int]],
    partition_counts: Mapping[str, int],
    broker_ids: Iterable[int],
) -> None:
    """Refuse (before changing anything) a target naming an unknown topic, partition or broker."""
    known = set(broker_ids)
    for tp, replicas in targets.items():
        count = partition_counts.get(tp.topic)
        if count is None:
            raise ReassignInputError(f"topic {tp.topic!r} does not exist")
        if tp.partition >= count:
            raise ReassignInputError(f"partition {tp} does not exist ({tp.topic} has {count})")
        unknown = sorted(set(replicas) - known)
        if unknown:
            raise ReassignInputError(
                f"{tp}: unknown broker id(s) {','.join(map(str, unknown))} "
                f"(registered: {','.join(map(str, sorted(known)))})"
            )


@dataclass(frozen=True, slots=True)
class PartitionState:
    """How a partition stands against its target: `replicas` now, and whether the controller
    still reports a reassignment for it."""

    replicas: tuple[int, ...]
    reassigning: bool


def verify_lines(
    targets: Mapping[TopicPartition, Sequence[int]],
    states: Mapping[TopicPartition, PartitionState],
) -> tuple[list[str], bool]:
    """Kafka's `--verify` lines per partition, and whether every one is complete."""
    lines = ["Status of partition reassignment:"]
    all_done = True
    for tp, target in sorted(targets.items()):
        state = states.get(tp)
        if state is None:
            lines.append(f"Partition {tp} does not exist.")
            all_done = False
        elif state.reassigning:
            lines.append(f"Reassignment of partition {tp} is still in progress.")
            all_done = False
        elif tuple(state.replicas) == tuple(target):
            lines.append(f"Reassignment of partition {tp} is completed.")
        else:
            lines.append(
                f"There is no active reassignment of partition {tp}, but replica set is "
                f"{_ids(state.replicas)} rather than {_ids(target)}."
            )
            all_done = False
    return lines, all_done


def list_lines(reassignments: Mapping[TopicPartition, Any]) -> list[str]:
    """`--list`, as Kafka: one line per ongoing reassignment (objects with replicas,
    adding_replicas, removing_replicas)."""
    if not reassignments:
        return ["No partition reassignments found."]
    lines = ["Current partition reassignments:"]
    for tp, r in sorted(reassignments.items()):
        lines.append(
            f"{tp}: replicas: {_ids(r.replicas)}. adding: {_ids(r.adding_replicas)}. "
            f"removing: {_ids(r.removing_replicas)}."
        )
    return lines


def _ids(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in ids)


def partitions_text(tps: Iterable[TopicPartition]) -> str:
    return ", ".join(str(tp) for tp in sorted(tps))


__all__ = [
    "ANY_LOG_DIR",
    "ConfigChange",
    "PartitionState",
    "ReassignInputError",
    "ThrottlePlan",
    "check_against_cluster",
    "clear_throttle_changes",
    "format_assignment",
    "format_topics_to_move",
    "generate_output",
    "list_lines",
    "parse_broker_list",
    "parse_reassignment",
    "parse_throttle",
    "parse_topics_to_move",
    "partitions_text",
    "rollback_output",
    "throttle_changes",
    "throttle_plan",
    "verify_lines",
]
