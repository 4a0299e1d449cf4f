"""The simulation and the scenario tests drive the product's replica engine, and nothing under
tests/ carries out a core's effects itself.

A simulation that runs its own copy of the effect interpreter can pass while the product is
wrong (the copies drift: one once assigned the log start where the product calls
`maybe_increment_log_start_offset`). So: the simulation's brokers host their partitions in
`BrokerReplicas` (broker/replication/engine.py) over MemLogs; no function but the engine's
`_interpret`, under tests/ or in the product, dispatches on the storage effects (an `isinstance`
chain over AssignEpoch, TruncateTo, AppendAsFollower, ...), which is what an interpreter is; and
the drivers neither import the core's effects nor call a core's entry points, so everything they
do goes through the engine.
"""

from __future__ import annotations

import ast
import inspect
import pathlib

from memlog import MemLog
from options import SimOptions
from replsim import Simulation

from minibroker.broker.replication import engine as engine_module
from minibroker.broker.replication.engine import BrokerReplicas
from minibroker.broker.replication.partition import PartitionReplica

TESTS = pathlib.Path(__file__).resolve().parents[1]
REPO = TESTS.parent
# The drivers: every module of the simulation and the scenario tests.
DRIVERS = [*sorted((TESTS / "sim").glob("*.py")), TESTS / "unit/test_replication_scenarios.py"]

# Effects that change a replica's log: dispatching on two of them is interpreting effects.
STORAGE_EFFECTS = {
    "AssignEpoch",
    "TruncateTo",
    "TruncateFullyAndStartAt",
    "AppendAsFollower",
    "AdvanceLogStartOffset",
}
# Every effect a core returns that the engine turns into something else (CompleteProduce is
# handed through as an engine output, so the drivers may name it).
CORE_ONLY_EFFECTS = STORAGE_EFFECTS | {
    "HighWatermarkChanged",
    "ProposeIsr",
    "StartFetching",
    "StopFetching",
    "Backoff",
    "IsrUpdated",
}
# PartitionReplica's commands and queries: the engine's to call (its public methods, bar the
# self-check the checker runs and the KIP-392 LEO view).
CORE_ENTRY_POINTS = {
    name
    for name, member in inspect.getmembers(PartitionReplica, inspect.isfunction)
    if not name.startswith("_")
} - {"check_invariants", "replica_leo"}


def _isinstance_names(node: ast.AST) -> set[str]:
    """The class names an isinstance() check or a `case X():` pattern inside `node` tests."""
    names: set[str] = set()

    def collect(expr: ast.AST) -> None:
        if isinstance(expr, ast.Name):
            names.add(expr.id)
        elif isinstance(expr, ast.Attribute):
            names.add(expr.attr)
        elif isinstance(expr, ast.Tuple):
            for element in expr.elts:
                collect(element)
        elif isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
            collect(expr.left)
            collect(expr.right)

    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Name)
            and sub.func.id == "isinstance"
            and len(sub.args) == 2
        ):
            collect(sub.args[1])
        elif isinstance(sub, ast.MatchClass):
            collect(sub.cls)
    return names


def interpreters(path: pathlib.Path) -> list[str]:
    """The functions in `path` that dispatch on two or more storage effects."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            dispatched = _isinstance_names(node) & STORAGE_EFFECTS
            if len(dispatched) >= 2:
                found.append(f"{path.relative_to(REPO)}:{node.name} ({sorted(dispatched)})")
    return found


def test_the_detector_finds_the_engines_interpreter() -> None:
    """The positive control: the one interpreter there is, is found."""
    found = interpreters(pathlib.Path(engine_module.__file__))
    assert any(":_interpret " in entry for entry in found), found


def test_the_engines_is_the_only_interpreter() -> None:
    """Nothing under tests/, nor anywhere in the product, carries out effects but the engine."""
    found = [
        entry
        for root in ("broker", "client", "controller", "tests")
        for path in sorted((REPO / root).rglob("*.py"))
        for entry in interpreters(path)
    ]
    assert [entry.split(" (")[0] for entry in found] == [
        "broker/replication/engine.py:_interpret"
    ], f"a second effect interpreter: {found}"


def test_the_drivers_go_through_the_engine() -> None:
    """No driver imports a core-only effect or calls a core's entry point (`x.core.f(...)`)."""
    problems = []
    for path in DRIVERS:
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(REPO)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name in CORE_ONLY_EFFECTS:
                        problems.append(f"{where}:{node.lineno} imports {alias.name}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in CORE_ENTRY_POINTS
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "core"
            ):
                problems.append(f"{where}:{node.lineno} calls core.{node.func.attr}")
    assert problems == [], problems


def test_the_simulation_runs_the_products_engine() -> None:
    """A short quiet run: every broker's partitions are hosted in the product's BrokerReplicas
    over the broker's own MemLogs, and those logs hold what was replicated."""
    quiet = SimOptions(safety_ms=600, scheduled_faults=False, drop_rate=0.0, crash_rate=0.0)
    sim = Simulation(1, quiet)
    sim.run()
    for broker in sim.brokers.values():
        engine = broker.engine
        assert isinstance(engine, BrokerReplicas)
        hosted = engine.hosted()
        assert {tp.partition for tp in hosted} == set(range(quiet.partitions))
        for tp, replica in hosted.items():
            assert isinstance(replica.log, MemLog)
            assert replica.log is broker.logs[tp.partition]
    assert sim.acked, "nothing was acknowledged"
    for (pid, offset), data in sim.acked.items():
        for broker in sim.brokers.values():
            assert broker.logs[pid].batch_at(offset) == data
