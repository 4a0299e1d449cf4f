"""The local cluster launcher as a user drives it: `minibroker cluster ...` subprocesses.

Round trip: up, status --json, kill, start, pause, resume, stop (controlled), down, up again with
the data kept; metrics ports serve Kafka-named metrics; a bad --set key is refused.
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
    for spec in [data["controller"], *data["brokers"]]:
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
        up = cli("cluster", "--dir", directory, "up", "--base-port", "0", "--racks", "2")
        assert "Cluster ready" in up.stdout
        info = status(directory)
        assert info["controller"]["state"] == "running"
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
