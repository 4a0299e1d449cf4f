"""The local cluster launcher as a user drives it: `minibroker cluster ...` subprocesses.

Round trip: up, status --json, kill, start, pause, resume, stop (controlled), down, up again with
the data kept; metrics ports serve Kafka-named metrics; a bad --set key is refused. A quorum of
three controllers (once the controller has `controller.quorum.voters`): status names the leader,
`kill controller` kills the active one, another is elected, metadata changes go on, and
`start controller-N` brings it back as a voter.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import urllib.request

import pytest
from cluster_harness import wait_until

from minibroker.client import Admin, Consumer, Producer, TopicPartition

pytestmark = pytest.mark.integration


def cli(*args: str, check: bool = True, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "minibroker.deploy", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{args} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


def status(directory: str) -> dict:  # type: ignore[type-arg]
    return json.loads(cli("cluster", "--dir", directory, "status", "--json").stdout)


def kill_everything(directory: str) -> None:
    path = pathlib.Path(directory) / "cluster.json"
    if not path.exists():
        return
    data = json.loads(path.read_text())
    for spec in [*(data.get("controllers") or [data["controller"]]), *data["brokers"]]:
        if spec.get("pid"):
            try:
                os.kill(spec["pid"], signal.SIGCONT)
                os.kill(spec["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def metric_value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name} not found")


def test_cluster_round_trip(tmp_path: pathlib.Path) -> None:
    directory = str(tmp_path / "mb")
    try:
        up = cli(
            "cluster", "--dir", directory, "up", "--base-port", "0", "--racks", "2",
            "--controllers", "1",
        )  # fmt: skip
        assert "Cluster ready" in up.stdout
        info = status(directory)
        assert info["controller"]["state"] == "running"
        assert [c["name"] for c in info["controllers"]] == ["controller-1"]
        assert info["quorum"]["leader"] == "controller-1"
        assert [b["state"] for b in info["brokers"]] == ["running"] * 3
        assert [b["rack"] for b in info["brokers"]] == ["rack-0", "rack-1", "rack-0"]
        for key in ("node_id", "pid", "state", "address", "data_dir", "log_file", "metrics_port"):
            assert key in info["brokers"][0]
        bootstrap = info["bootstrap_servers"]

        with Admin(bootstrap) as admin:
            admin.create_topic("kept", 1, 3, {"min.insync.replicas": "2"})
        with Producer(bootstrap, acks="all") as producer:
            for i in range(20):
                producer.send("kept", f"m{i}".encode(), partition=0)
            producer.flush()

        # Metrics: every process serves Kafka's names (gauges refresh a few times a second).
        wait_until(
            lambda: (
                metric_value(
                    scrape(info["controller"]["metrics_port"]),
                    "kafka_controller_KafkaController_ActiveBrokerCount",
                )
                == 3
            ),
            10,
            "ActiveBrokerCount 3",
        )
        wait_until(
            lambda: (
                sum(
                    metric_value(
                        scrape(b["metrics_port"]), "kafka_server_ReplicaManager_LeaderCount"
                    )
                    for b in info["brokers"]
                )
                == 1
            ),
            10,
            "one LeaderCount across the brokers",
        )

        cli("cluster", "--dir", directory, "kill", "2")
        assert status(directory)["brokers"][1]["state"] == "stopped"
        cli("cluster", "--dir", directory, "start", "2")
        assert status(directory)["brokers"][1]["state"] == "running"

        cli("cluster", "--dir", directory, "pause", "3")
        assert status(directory)["brokers"][2]["state"] == "paused"
        cli("cluster", "--dir", directory, "resume", "3")
        assert status(directory)["brokers"][2]["state"] == "running"

        stopped = cli("cluster", "--dir", directory, "stop", "1")
        assert "controlled shutdown" in stopped.stdout
        assert status(directory)["brokers"][0]["state"] == "stopped"
        log_text = pathlib.Path(info["brokers"][0]["log_file"]).read_text()
        assert "controlled_shutdown_granted" in log_text

        logs = cli("cluster", "--dir", directory, "logs", "controller", "-n", "5")
        assert logs.stdout.strip(), "no controller log lines"
        assert cli("cluster", "--dir", directory, "logs", "controller-1", "-n", "5").stdout.strip()

        # A quorum of one: `controller` is controller-1; kill it and start it by either name.
        assert (
            "killed controller-1" in cli("cluster", "--dir", directory, "kill", "controller").stdout
        )
        assert "NO LEADER" in cli("cluster", "--dir", directory, "status").stdout
        cli("cluster", "--dir", directory, "start", "controller-1")
        assert status(directory)["quorum"]["leader"] == "controller-1"
        # The size of an existing cluster's quorum is not changed by a restart.
        refused = cli("cluster", "--dir", directory, "up", "--controllers", "3", check=False)
        assert refused.returncode == 1 and "voter set" in refused.stderr

        cli("cluster", "--dir", directory, "down")
        info = status(directory)
        assert info["controller"]["state"] == "stopped"
        assert all(b["state"] == "stopped" for b in info["brokers"])

        # Up again on the same dir: same ports, data kept.
        cli("cluster", "--dir", directory, "up")
        assert status(directory)["bootstrap_servers"] == bootstrap
        tp = TopicPartition("kept", 0)
        with Consumer(bootstrap) as consumer:
            consumer.assign([tp])
            wait_until(lambda: consumer.end_offsets([tp])[tp] == 20, 30, "HW 20 after restart")
            consumer.seek_to_beginning(tp)
            values: list[bytes] = []
            wait_until(
                lambda: (
                    values.extend(r.value for r in consumer.poll(timeout_ms=200))
                    or len(values) >= 20
                ),
                30,
                "20 records",
            )
        assert values == [f"m{i}".encode() for i in range(20)]
    finally:
        kill_everything(directory)


def test_unknown_setting_is_refused(tmp_path: pathlib.Path) -> None:
    directory = str(tmp_path / "bad")
    try:
        result = cli(
            "cluster",
            "--dir",
            directory,
            "up",
            "--base-port",
            "0",
            "--set",
            "no.such.setting=1",
            check=False,
        )
        assert result.returncode != 0
        assert "no.such.setting" in result.stderr
        assert not (pathlib.Path(directory) / "cluster.json").exists()
    finally:
        kill_everything(directory)


def controller_has_quorum() -> bool:
    from minibroker.controller.config import ALL_KEYS

    return "controller.quorum.voters" in {k.name for k in ALL_KEYS}


@pytest.mark.skipif(
    not controller_has_quorum(), reason="the controller has no controller.quorum.voters yet"
)
def test_quorum_of_three(tmp_path: pathlib.Path) -> None:
    directory = str(tmp_path / "q")
    try:
        up = cli("cluster", "--dir", directory, "up", "--base-port", "0", "--controllers", "3")
        assert "Controller quorum: 1000@" in up.stdout
        info = status(directory)
        assert [c["node_id"] for c in info["controllers"]] == [1000, 1001, 1002]
        assert len(info["cluster_id"]) == 22
        first = info["quorum"]
        assert first["leader"] is not None and first["epoch"] is not None
        roles = sorted(v["role"] for v in first["voters"])
        assert roles == ["follower", "follower", "leader"]
        assert (
            "controller quorum: 3 voters, leader"
            in cli("cluster", "--dir", directory, "status").stdout
        )
        bootstrap = info["bootstrap_servers"]

        killed = cli("cluster", "--dir", directory, "kill", "controller").stdout
        assert f"killed {first['leader']}" in killed
        after = wait_until(
            lambda: (
                (q := status(directory)["quorum"])["leader"] not in (None, first["leader"]) and q
            ),
            30,
            "a new active controller",
        )
        assert after["epoch"] > first["epoch"]
        with Admin(bootstrap) as admin:
            admin.create_topic("after-failover", 1, 3)
            assert "after-failover" in admin.list_topics()

        cli("cluster", "--dir", directory, "start", first["leader"])
        back = status(directory)["quorum"]
        assert all(v["state"] == "running" for v in back["voters"])
        cli("cluster", "--dir", directory, "down")
        cli("cluster", "--dir", directory, "up")  # same cluster id, same voters
        assert status(directory)["cluster_id"] == info["cluster_id"]
    finally:
        kill_everything(directory)
