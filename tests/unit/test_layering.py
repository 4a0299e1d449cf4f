"""Dependencies point one way (docs/design.md §1) and pure cores do no I/O (docs/design.md §2).

An AST walk over the source: broker and controller never import each other, client imports
neither, broker/storage imports nothing from broker/replication (Kafka keeps the leader-epoch
cache in storage), and the pure modules import no asyncio, grpc, os, time, random, socket,
threading, subprocess or generated stubs. Every listed path must exist, so a module that moves
or is renamed fails the test instead of silently leaving the rule unchecked. Relative imports
are resolved to their absolute names, so they cannot slip past either rule.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Pure cores: folders (every module inside) and single modules.
PURE = [
    "broker/replication",
    "broker/fetch_session.py",
    "broker/cleaner/offset_map.py",
    "broker/cleaner/selection.py",
    "broker/storage/epoch_cache.py",
    "broker/storage/log_append.py",
    "broker/storage/segment_scan.py",
    "client/errors.py",
    "client/common/invariant.py",
    "client/common/limits.py",
    "client/common/listeners.py",
    "client/common/scram.py",
    "client/batch.py",
    "client/records",
    "client/compression.py",
    "client/log_format.py",
    "client/partitioner.py",
    "client/topic_name.py",
    "client/consumer_offsets.py",
    "broker/groups/records.py",
    "client/accumulator.py",
    "client/subscription.py",
    "client/groups/assignors.py",
    "client/groups/protocol.py",
    "client/completed_fetch.py",
    "client/producer_record.py",
    "client/metadata_cache.py",
    "client/fetch_session.py",
    "metadata/acl.py",
    "metadata/records.py",
    "metadata/image.py",
    "metadata/delta.py",
    "metadata/placement.py",
    "metadata/assignment_plan.py",
    "client/spark/options.py",
    "client/watch/events.py",
    "client/watch/model.py",
    "client/watch/observations.py",
    "client/watch/render.py",
    "client/watch/rows.py",
    "controller/core",
    "controller/quorum/core.py",
    "controller/quorum/messages.py",
]
FORBIDDEN_IN_PURE = {
    "asyncio",
    "grpc",
    "socket",
    "os",
    "time",
    "random",
    "threading",
    "subprocess",
    "minibroker.proto",
}
# The one exception, by file and name: the module that picks the record encoder reads the
# MINIBROKER_PURE_CODEC environment variable once, at import (no other I/O).
ALLOWED_IN_PURE = {"client/records/encoder_choice.py": {"os"}}
# package folder -> packages it must never import
FORBIDDEN_EDGES = {
    "broker/storage": {"minibroker.broker.replication"},
    "client": {"minibroker.broker", "minibroker.controller", "minibroker.deploy"},
    "broker": {"minibroker.controller", "minibroker.deploy"},
    "controller": {"minibroker.broker", "minibroker.deploy"},
    # The cluster metadata model is shared by controller, brokers and tools: it knows none of them.
    "metadata": {"minibroker.broker", "minibroker.controller", "minibroker.deploy"},
    "proto": {
        "minibroker.broker",
        "minibroker.controller",
        "minibroker.client",
        "minibroker.deploy",
        "minibroker.metadata",
    },
}


def _imports(path: pathlib.Path) -> set[str]:
    """Every module `path` imports, by absolute name (relative imports resolved)."""
    package = ["minibroker", *path.relative_to(ROOT).parent.parts]
    return _imported_names(path.read_text(), package, str(path))


def _imported_names(source: str, package: list[str], filename: str = "<probe>") -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            names.add(".".join([*base, *([node.module] if node.module else [])]))
    return names


def _files(entry: str) -> list[pathlib.Path]:
    """The modules a listed path names; a path that no longer exists fails the test."""
    target = ROOT / entry
    assert target.exists(), f"{entry} is listed in test_layering.py but does not exist"
    files = [target] if entry.endswith(".py") else sorted(target.rglob("*.py"))
    assert files, f"{entry} is listed in test_layering.py but holds no module"
    return files


def _matches(name: str, prefixes: set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_pure_cores_do_not_import_io() -> None:
    bad = []
    for entry in PURE:
        for path in _files(entry):
            bad += [
                f"{path.relative_to(ROOT)} imports {n}"
                for n in _imports(path)
                if _matches(n, FORBIDDEN_IN_PURE)
                and n not in ALLOWED_IN_PURE.get(str(path.relative_to(ROOT)), set())
            ]
    assert not bad, "\n".join(bad)


def test_dependencies_point_one_way() -> None:
    bad = []
    for folder, forbidden in FORBIDDEN_EDGES.items():
        for path in _files(folder):
            bad += [
                f"{path.relative_to(ROOT)} imports {n}"
                for n in _imports(path)
                if _matches(n, forbidden)
            ]
    assert not bad, "\n".join(bad)


def test_relative_imports_resolve_to_absolute_names() -> None:
    storage = ["minibroker", "broker", "storage"]
    assert _imported_names("from ..replication import events", storage) == {
        "minibroker.broker.replication"
    }
    assert _imported_names("from . import segment", storage) == {"minibroker.broker.storage"}
    assert _imported_names("from .log import X", storage) == {"minibroker.broker.storage.log"}
    assert _imported_names("import os.path", storage) == {"os.path"}
