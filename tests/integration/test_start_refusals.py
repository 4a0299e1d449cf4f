"""A broker or controller process started on a data dir it must not use exits with one clear line.

Real `minibroker broker` / `minibroker controller` processes (issue 11 item 9): a meta.properties
of random bytes, and a dir without meta.properties that holds another node's data, each end the
process with a non-zero status and a message on stderr naming the file and what to do, with no
traceback, and leave the files as they were. Neither start needs a peer: the data dir is checked
before anything connects, so the broker's controller address is a closed port.
"""

from __future__ import annotations

import pathlib
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

RANDOM_BYTES = bytes((i * 167 + 13) % 256 for i in range(2048))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "minibroker.deploy", *args, "--log-format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def start_broker(data_dir: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return run(
        "broker",
        "--node-id",
        "1",
        "--data-dir",
        str(data_dir),
        "--listen",
        "127.0.0.1:0",
        "--controller",
        f"127.0.0.1:{_closed_port()}",
        "--metrics-port",
        "-1",
    )


def start_controller(data_dir: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return run(
        "controller", "--data-dir", str(data_dir), "--listen", "127.0.0.1:0", "--metrics-port", "-1"
    )


def assert_refused(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0, result
    output = result.stdout + result.stderr
    assert "Traceback" not in output, output
    for needle in needles:
        assert needle in result.stderr, result.stderr


@pytest.mark.parametrize("starter", [start_broker, start_controller], ids=["broker", "controller"])
def test_meta_properties_of_random_bytes(tmp_path: pathlib.Path, starter) -> None:
    meta = tmp_path / "meta.properties"
    meta.write_bytes(RANDOM_BYTES)
    assert_refused(starter(tmp_path), str(meta), "not UTF-8", "restore it")
    assert meta.read_bytes() == RANDOM_BYTES


def test_broker_refuses_a_dir_holding_partitions_without_meta_properties(
    tmp_path: pathlib.Path,
) -> None:
    (tmp_path / "orders-0").mkdir()
    (tmp_path / "orders-0" / "00000000000000000000.log").write_bytes(b"x" * 100)
    (tmp_path / "replication-offset-checkpoint").write_text("0\n1\norders 0 1\n")
    assert_refused(
        start_broker(tmp_path),
        "has no meta.properties but holds broker data",
        "remove the directory or restore its meta.properties",
    )
    assert not (tmp_path / "meta.properties").exists()
    assert (tmp_path / "orders-0" / "00000000000000000000.log").read_bytes() == b"x" * 100


def test_controller_refuses_a_metadata_log_without_meta_properties(
    tmp_path: pathlib.Path,
) -> None:
    segment = tmp_path / "metadata-00000000000000000000.log"
    segment.write_bytes(b"\0" * 64)
    assert_refused(
        start_controller(tmp_path),
        "has no meta.properties but holds a metadata log",
        "remove the directory or restore its meta.properties",
    )
    assert not (tmp_path / "meta.properties").exists()
    assert segment.read_bytes() == b"\0" * 64
