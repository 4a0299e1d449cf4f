"""The committed stubs are what `make proto` generates from proto/*.proto (a stale stub fails), and
the client's ErrorCode enum matches the wire enum name for name, number for number."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

from minibroker.client.errors import ErrorCode
from minibroker.proto import minibroker_pb2 as pb

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_generated_stubs_are_fresh(tmp_path: pathlib.Path) -> None:
    if shutil.which("git") is None:  # pragma: no cover - git is on every machine we use
        raise AssertionError("git is needed")
    out = tmp_path / "gen"
    out.mkdir()
    protos = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "proto").glob("*.proto"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-Iminibroker/proto=proto",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--pyi_out={out}",
            *protos,
        ],
        cwd=ROOT,
        check=True,
    )
    generated = sorted((out / "minibroker" / "proto").iterdir())
    assert generated, "protoc produced nothing"
    stale = [
        g.name
        for g in generated
        if not (ROOT / "proto" / g.name).exists()
        or (ROOT / "proto" / g.name).read_bytes() != g.read_bytes()
    ]
    assert not stale, f"stale generated files, run `make proto`: {stale}"


def test_error_codes_match_the_wire_enum() -> None:
    wire = {pb.ErrorCode.Name(v): v for v in pb.ErrorCode.values()}
    ours = {e.name: int(e) for e in ErrorCode}
    assert wire == ours
