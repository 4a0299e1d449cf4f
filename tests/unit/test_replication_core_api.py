"""The API convention of the replica core (broker/replication/partition.py, events.py).

Every public entry point of `PartitionReplica` returns `(reply, effects)` and nothing else is a
channel for effects; the shell reads the core only through read-only properties; a successful
idempotent retry is a `DuplicateAppend`, never a `ProduceRejected`. Pure: no I/O.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any

import pytest

from minibroker.broker.replication.eligibility import BrokerEligibilityView
from minibroker.broker.replication.events import (
    AlterPartitionResult,
    AppendPlan,
    DuplicateAppend,
    FetchPosition,
    FetchResponse,
    FollowerFetch,
    FollowerFetchAnswer,
    PartitionState,
    ProduceRejected,
    ReplicaConfig,
)
from minibroker.broker.replication.partition import PartitionReplica
from minibroker.broker.storage.epoch_cache import EpochCache
from minibroker.client.batch import iter_batches
from minibroker.client.errors import ErrorCode
from minibroker.client.records import encode_batch

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The replica core's own modules: the only code that may touch its private state or build a
# produce's answer. Everything else in broker/ (shells, an engine beside the core) and tests/
# goes through the public API.
CORE = ROOT / "broker" / "replication"
CORE_MODULES = {
    CORE / f"{name}.py"
    for name in (
        "acks",
        "eligibility",
        "events",
        "follower",
        "high_watermark",
        "invariants",
        "isr",
        "partition",
        "producer_state",
        "reads",
        "remote",
        "state",
    )
}

ENTRY_POINTS = {
    "apply_partition_state",
    "update_config",
    "plan_append",
    "on_leader_appended",
    "park_produce",
    "expire_produces",
    "expire_produce",
    "abort_produces",
    "handle_follower_fetch",
    "note_implied_fetch",
    "check_consumer_fetch",
    "list_offsets",
    "offset_for_leader_epoch",
    "maybe_shrink_isr",
    "on_alter_partition_result",
    "next_fetch",
    "on_fetch_response",
    "on_follower_appended",
    "on_log_truncated",
    "on_log_start_offset_advanced",
}
READ_ONLY = {
    "broker_id",
    "name",
    "config",
    "role",
    "leader_id",
    "leader_epoch",
    "partition_epoch",
    "replicas",
    "isr",
    "maximal_isr",
    "leader_recovery_state",
    "leader_epoch_start_offset",
    "leo",
    "log_start_offset",
    "high_watermark",
    "is_leader",
    "effective_min_isr",
    "pending_produce_count",
    "alter_partition_in_flight",
    "follower_state",
    "remote_replicas",
}
QUERIES = {"replica_leo", "check_invariants"}


def test_the_public_surface_is_entry_points_and_read_only_views() -> None:
    public = {name for name in dir(PartitionReplica) if not name.startswith("_")}
    assert public == ENTRY_POINTS | READ_ONLY | QUERIES
    for name in READ_ONLY:
        attr = getattr(PartitionReplica, name)
        assert isinstance(attr, property) and attr.fset is None, name


def test_a_view_cannot_be_assigned() -> None:
    replica = PartitionReplica(1, EpochCache(), BrokerEligibilityView())
    with pytest.raises(AttributeError):
        replica.high_watermark = 5  # type: ignore[misc]


def test_the_fetch_answer_carries_no_effects() -> None:
    assert "effects" not in {f.name for f in dataclasses.fields(FollowerFetchAnswer)}


def test_a_rejection_is_always_an_error() -> None:
    with pytest.raises(ValueError, match="DuplicateAppend"):
        ProduceRejected(ErrorCode.NONE)


def _headers(pid: int = -1, seq: int = -1, records: int = 1) -> list[Any]:
    raw = encode_batch(
        [(0, None, b"v", ())] * records, producer_id=pid, producer_epoch=0, base_sequence=seq
    )
    return [h for _, h in iter_batches(raw)]


def _leader() -> PartitionReplica:
    view = BrokerEligibilityView()
    for broker_id in (1, 2):
        view.update(broker_id, 100 + broker_id)
    replica = PartitionReplica(1, EpochCache(), view, ReplicaConfig(min_insync_replicas=1))
    replica.apply_partition_state(PartitionState((1, 2), frozenset({1, 2}), 1, 3, 4), 0)
    return replica


def _follower() -> PartitionReplica:
    replica = PartitionReplica(2, EpochCache(), BrokerEligibilityView())
    replica.apply_partition_state(PartitionState((1, 2), frozenset({1, 2}), 1, 3, 4), 0)
    return replica


def test_duplicate_append_is_a_success_with_the_original_offsets() -> None:
    """An idempotent retry of a batch in the log is answered like the first write; only a real
    error is a ProduceRejected."""
    replica = _leader()
    plan, effects = replica.plan_append(1, _headers(pid=7, seq=0, records=3))
    assert isinstance(plan, AppendPlan) and effects == []
    replica.on_leader_appended(plan, 0)
    retry, effects = replica.plan_append(1, _headers(pid=7, seq=0, records=3))
    assert retry == DuplicateAppend(base_offset=0, last_offset=2) and effects == []
    gap, _ = replica.plan_append(1, _headers(pid=7, seq=9))
    assert isinstance(gap, ProduceRejected)
    assert gap.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert replica.leo == 3


def test_a_parked_duplicate_completes_through_an_effect() -> None:
    replica = _leader()
    plan, _ = replica.plan_append(-1, _headers(pid=7, seq=0))
    assert isinstance(plan, AppendPlan)
    replica.on_leader_appended(plan, 0, token="first", deadline_ms=500)
    retry, _ = replica.plan_append(-1, _headers(pid=7, seq=0))
    assert isinstance(retry, DuplicateAppend)
    reply, effects = replica.park_produce("retry", retry.base_offset, retry.last_offset, 500)
    assert reply is None and effects == []  # the HW has not passed it yet
    _, effects = replica.handle_follower_fetch(FollowerFetch(2, 102, 3, 1, -1, 0), 10)
    assert {getattr(e, "token", None) for e in effects} >= {"first", "retry"}


def _steps() -> list[tuple[str, Callable[[], tuple[object, object]]]]:
    leader, follower = _leader(), _follower()
    position = FetchPosition(1, 3, 0, -1, 0)
    return [
        ("update_config", lambda: leader.update_config(ReplicaConfig(), 0)),
        (
            "apply_partition_state",
            lambda: leader.apply_partition_state(
                PartitionState((1, 2), frozenset({1, 2}), 1, 3, 5), 0
            ),
        ),
        ("plan_append", lambda: leader.plan_append(1, _headers())),
        ("park_produce", lambda: leader.park_produce("t", 0, 0, 10)),
        ("expire_produces", lambda: leader.expire_produces(100)),
        ("expire_produce", lambda: leader.expire_produce("t")),
        ("abort_produces", lambda: leader.abort_produces(ErrorCode.NOT_LEADER_OR_FOLLOWER, "x")),
        (
            "handle_follower_fetch",
            lambda: leader.handle_follower_fetch(FollowerFetch(2, 102, 3, 0, -1, 0), 0),
        ),
        ("note_implied_fetch", lambda: leader.note_implied_fetch(2, 5)),
        ("check_consumer_fetch", lambda: leader.check_consumer_fetch(-1, 0)),
        ("list_offsets", lambda: leader.list_offsets(-1, -1)),
        ("offset_for_leader_epoch", lambda: leader.offset_for_leader_epoch(-1, 3)),
        ("maybe_shrink_isr", lambda: leader.maybe_shrink_isr(0)),
        (
            "on_alter_partition_result",
            lambda: leader.on_alter_partition_result(AlterPartitionResult(9, ErrorCode.NONE), 0),
        ),
        ("next_fetch", lambda: follower.next_fetch(0)),
        ("on_fetch_response", lambda: follower.on_fetch_response(position, FetchResponse(), 0)),
        ("on_follower_appended", lambda: follower.on_follower_appended(0)),
        ("on_log_truncated", lambda: follower.on_log_truncated(0, 0)),
        ("on_log_start_offset_advanced", lambda: follower.on_log_start_offset_advanced(0)),
    ]


def test_every_entry_point_returns_reply_and_effects() -> None:
    steps = _steps()
    # on_leader_appended needs a plan from the same replica.
    leader = _leader()
    plan, _ = leader.plan_append(1, _headers())
    assert isinstance(plan, AppendPlan)
    steps.append(("on_leader_appended", lambda: leader.on_leader_appended(plan, 0)))
    assert {name for name, _ in steps} == ENTRY_POINTS
    for name, call in steps:
        result = call()
        assert isinstance(result, tuple) and len(result) == 2, name
        assert isinstance(result[1], list), name


def _private_core_reads(path: pathlib.Path) -> list[str]:
    """`x.core._field` / `core._field` reads, and the internals the shell used to reach into."""
    found = []
    internals = {"remotes", "follower", "producer_state", "isr_state"}
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        owner_name = (
            owner.id
            if isinstance(owner, ast.Name)
            else owner.attr
            if isinstance(owner, ast.Attribute)
            else ""
        )
        private = node.attr.startswith("_") and not node.attr.startswith("__")
        if owner_name == "core" and (private or node.attr in internals):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: core.{node.attr}")
    return found


def test_no_shell_or_simulation_reads_core_internals() -> None:
    assert all(path.exists() for path in CORE_MODULES)  # the list follows the code
    paths = [*(ROOT / "broker").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    found = [hit for path in paths if path not in CORE_MODULES for hit in _private_core_reads(path)]
    assert found == []


def test_only_the_core_answers_a_parked_produce() -> None:
    """The acks=all wait is decided in one place: the core's purgatory. A shell keeps futures
    keyed by token and completes them only from CompleteProduce effects, never by building its
    own answer (a timeout, a removed replica, a failed dir and shutdown go through the core)."""
    built = []
    for path in (ROOT / "broker").rglob("*.py"):
        if path in CORE_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "CompleteProduce"
            ):
                built.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert built == []


def test_a_shell_timeout_and_an_abort_are_answered_by_the_core() -> None:
    replica = _leader()
    for token in ("a", "b", "c"):
        plan, _ = replica.plan_append(-1, _headers())
        assert isinstance(plan, AppendPlan)
        replica.on_leader_appended(plan, 0, token=token, deadline_ms=10_000)
    assert replica.pending_produce_count == 3
    reply, effects = replica.expire_produce("b")
    assert reply is None and [(e.token, e.error) for e in effects] == [  # type: ignore[union-attr]
        ("b", ErrorCode.REQUEST_TIMED_OUT)
    ]
    assert replica.expire_produce("b") == (None, [])  # answered once only
    _, effects = replica.abort_produces(ErrorCode.KAFKA_STORAGE_ERROR, "the log dir failed")
    assert [(e.token, e.error, e.message) for e in effects] == [  # type: ignore[union-attr]
        ("a", ErrorCode.KAFKA_STORAGE_ERROR, "the log dir failed"),
        ("c", ErrorCode.KAFKA_STORAGE_ERROR, "the log dir failed"),
    ]
    assert replica.pending_produce_count == 0
