"""The broker's asyncio shell reaches the replication cores only through the replica engine.

An AST walk over the shell (broker/*.py and broker/replicas/): no module there imports
broker/replication/partition.py (only the engine builds and drives `PartitionReplica` cores),
and none reads a core or its internals (`.core`, `.remotes`, `.follower`, `.producer_state`,
`.isr_state`): what the shell needs of a replica comes from the engine's replies, outputs and
views. A listed path that disappears fails the test rather than leaving the rule unchecked.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHELL = ["broker/replicas", "broker/app.py", "broker/service.py", "broker/fetcher.py"]
SHELL_GLOB = "broker/*.py"
CORE_MODULE = "minibroker.broker.replication.partition"
CORE_FIELDS = {"core", "remotes", "follower", "producer_state", "isr_state"}


def _shell_files() -> list[pathlib.Path]:
    files: set[pathlib.Path] = set(ROOT.glob(SHELL_GLOB))
    for entry in SHELL:
        target = ROOT / entry
        assert target.exists(), f"{entry} is listed in test_shell_boundary.py but does not exist"
        files |= {target} if entry.endswith(".py") else set(target.rglob("*.py"))
    return sorted(files)


def _violations(source: str, filename: str) -> list[str]:
    bad = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            if node.module == CORE_MODULE or node.module.startswith(CORE_MODULE + "."):
                bad.append(f"{filename}:{node.lineno} imports {node.module}")
        elif isinstance(node, ast.Import):
            bad += [
                f"{filename}:{node.lineno} imports {a.name}"
                for a in node.names
                if a.name == CORE_MODULE
            ]
        elif isinstance(node, ast.Attribute) and node.attr in CORE_FIELDS:
            bad.append(f"{filename}:{node.lineno} reads .{node.attr}")
    return bad


def test_the_shell_never_reads_core_fields() -> None:
    files = _shell_files()
    assert any(f.parent.name == "replicas" for f in files)
    bad = []
    for path in files:
        bad += _violations(path.read_text(), str(path.relative_to(ROOT)))
    assert not bad, "\n".join(bad)


def test_the_scan_sees_what_it_forbids() -> None:
    probe = (
        "from minibroker.broker.replication.partition import PartitionReplica\n"
        "x = hosted.core.role\n"
        "y = engine.follower\n"
    )
    assert len(_violations(probe, "probe")) == 3
    assert _violations("x = engine.role(tp)\n", "probe") == []
