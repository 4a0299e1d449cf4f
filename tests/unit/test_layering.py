"""Dependencies point one way (docs/design.md §1) and pure cores do no I/O (docs/design.md §2).

An AST walk over the source: broker and controller never import each other, client imports
neither, and the pure modules import no asyncio, grpc, os, time, random, socket, threading,
subprocess or generated stubs.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Pure cores: folders (every module inside) and single modules.
PURE = [
    "broker/replication",
    "client/errors.py",
    "client/common/limits.py",
    "client/batch.py",
    "client/records.py",
    "client/compression.py",
    "client/partitioner.py",
    "client/topic_name.py",
    "client/accumulator.py",
    "client/metadata_cache.py",
    "client/metadata/records.py",
    "client/metadata/image.py",
    "client/spark/options.py",
    "client/watch/model.py",
    "client/watch/render.py",
    "controller/core",
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
# package folder -> packages it must never import
FORBIDDEN_EDGES = {
    "client": {"minibroker.broker", "minibroker.controller", "minibroker.deploy"},
    "broker": {"minibroker.controller", "minibroker.deploy"},
    "controller": {"minibroker.broker", "minibroker.deploy"},
    "proto": {
        "minibroker.broker",
        "minibroker.controller",
        "minibroker.client",
        "minibroker.deploy",
    },
}


def _imports(path: pathlib.Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _matches(name: str, prefixes: set[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_pure_cores_do_not_import_io() -> None:
    bad = []
    for entry in PURE:
        target = ROOT / entry
        files = [target] if entry.endswith(".py") else sorted(target.rglob("*.py"))
        for path in files:
            if not path.exists():
                continue
            bad += [
                f"{path.relative_to(ROOT)} imports {n}"
                for n in _imports(path)
                if _matches(n, FORBIDDEN_IN_PURE)
            ]
    assert not bad, "\n".join(bad)


def test_dependencies_point_one_way() -> None:
    bad = []
    for folder, forbidden in FORBIDDEN_EDGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            bad += [
                f"{path.relative_to(ROOT)} imports {n}"
                for n in _imports(path)
                if _matches(n, forbidden)
            ]
    assert not bad, "\n".join(bad)
