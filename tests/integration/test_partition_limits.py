"""Partition limits end to end (issue 11 item 8): `minibroker topics create` against a real
controller and broker. A topic past `max.partitions` or `max.broker.partitions` fails with a
one-line POLICY_VIOLATION naming the limit, and nothing reaches the metadata log; a CreateTopics
of a million partitions is refused by a controller with default settings without its peak RSS
moving (before, it was placed, written and applied: 1.6 GB).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest
from cluster_harness import LocalCluster, local_cluster

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    settings = {"leader.imbalance.check.interval.seconds": "3600", "max.broker.partitions": "8"}
    with local_cluster(str(tmp_path / "cluster"), brokers=1, settings=settings) as c:
        yield c


def cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "minibroker.deploy", *args, "--bootstrap-server", cluster.bootstrap],
        capture_output=True,
        text=True,
        timeout=120,
    )


def peak_rss_kb(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_topics_past_the_partition_limits_are_refused_and_nothing_is_written(
    cluster: LocalCluster,
) -> None:
    controller = cluster.state.controller
    assert cli(cluster, "topics", "create", "fits", "--partitions", "5").returncode == 0
    over = cli(cluster, "topics", "create", "over", "--partitions", "4")
    assert over.returncode == 1
    assert "PolicyViolationError" in over.stderr and "max.broker.partitions=8" in over.stderr
    assert over.stderr.count("\n") == 1, over.stderr  # one line, no traceback

    before_kb = peak_rss_kb(controller.pid)
    huge = cli(cluster, "topics", "create", "huge", "--partitions", "1000000")
    assert huge.returncode == 1
    assert "PolicyViolationError" in huge.stderr and "max.partitions=10000" in huge.stderr
    grown_mb = (peak_rss_kb(controller.pid) - before_kb) / 1024
    assert grown_mb < 20, f"the controller's peak RSS grew by {grown_mb:.0f} MB"

    assert cli(cluster, "topics", "list").stdout.split() == ["fits"]
    created = [
        json.loads(line)["topic"]
        for line in pathlib.Path(controller.log_file).read_text().splitlines()
        if '"topic_created"' in line
    ]
    assert created == ["fits"]  # the controller wrote no record of the refused ones
    assert cli(cluster, "topics", "create", "fits2", "--partitions", "3").returncode == 0
