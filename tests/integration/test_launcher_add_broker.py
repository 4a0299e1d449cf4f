"""Growing and shrinking the local cluster as the README's tour does, with real processes.

`cluster up --brokers 3` (free ports), a topic with RF 3 and data, `cluster add-broker`,
`brokers rebalance --execute` until nothing moves any more and broker 4 holds replicas; a
`remove-broker` of a broker that holds replicas is refused with nothing changed; `brokers
decommission 1 --wait`, `cluster remove-broker 1`; every record still readable and every ISR
full; `cluster down` and `up` restart the added broker. The client commands run in the cluster's
parent dir and find it through `.minibroker/cluster.json`, as a user's do.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import pytest
from cluster_harness import wait_until

pytestmark = pytest.mark.integration

RECORDS = 300


class Cli:
    """`minibroker ...` subprocesses run in `cwd`; remembers every PID the cluster reported."""

    def __init__(self, cwd: pathlib.Path):
        self.cwd = cwd
        self.pids: set[int] = set()
        self.env = {k: v for k, v in os.environ.items() if k != "MINIBROKER_BOOTSTRAP_SERVER"}

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "minibroker.deploy", *args],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=150,
            input=stdin,
        )

    def ok(self, *args: str, stdin: str | None = None) -> str:
        done = self.run(*args, stdin=stdin)
        assert done.returncode == 0, f"{args} ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        self.remember()
        return done.stdout

    @property
    def state_file(self) -> pathlib.Path:
        return self.cwd / ".minibroker" / "cluster.json"

    def remember(self) -> None:
        if self.state_file.exists():
            data = json.loads(self.state_file.read_text())
            self.pids |= {s["pid"] for s in [*data["controllers"], *data["brokers"]] if s["pid"]}

    def status(self) -> dict[str, Any]:
        return json.loads(self.ok("cluster", "status", "--json"))

    def brokers(self) -> dict[int, dict[str, Any]]:
        return {b["broker_id"]: b for b in json.loads(self.ok("brokers", "list", "--json"))}

    def partitions(self) -> list[dict[str, Any]]:
        return json.loads(self.ok("topics", "describe", "events", "--json"))

    def kill_all(self) -> None:
        """SIGKILL every process this test's cluster ran, by PID (only while its command line
        still names the cluster's dir: a reused PID is left alone)."""
        self.remember()
        marker = str((self.cwd / ".minibroker").resolve()).encode()
        for pid in self.pids:
            try:
                if marker not in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes():
                    continue
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass


def no_reassignment_runs(cli: Cli) -> bool:
    return cli.ok("reassign-partitions", "--list").strip() == "No partition reassignments found."


def isrs_full(cli: Cli, brokers: set[int]) -> list[dict[str, Any]] | None:
    rows = cli.partitions()
    for row in rows:
        if len(row["replicas"]) != 3 or set(row["isr"]) != set(row["replicas"]):
            return None
        if not set(row["replicas"]) <= brokers:
            return None
    return rows


def read_all(cli: Cli) -> list[str]:
    out = cli.ok(
        "consume", "events", "--from-beginning", "--max-messages", str(RECORDS),
        "--timeout-ms", "30000",
    )  # fmt: skip
    return sorted(out.split())


def test_add_rebalance_decommission_remove(tmp_path: pathlib.Path) -> None:
    cli = Cli(tmp_path)
    try:
        up = cli.ok("cluster", "up", "--brokers", "3", "--base-port", "0")
        assert "Cluster ready" in up
        cli.ok(
            "topics", "create", "events", "--partitions", "3", "--replication-factor", "3",
            "--config", "min.insync.replicas=2",
        )  # fmt: skip
        cli.ok("produce", "events", stdin="".join(f"v{i}\n" for i in range(RECORDS)))
        expected = sorted(f"v{i}" for i in range(RECORDS))

        # add-broker: the next id, registered and unfenced, known to status and the bootstrap.
        added = cli.ok("cluster", "add-broker")
        assert added.startswith("added broker 4 (pid ")
        info = cli.status()
        assert [b["node_id"] for b in info["brokers"]] == [1, 2, 3, 4]
        assert all(b["state"] == "running" for b in info["brokers"])
        four = info["brokers"][3]
        assert four["address"] in info["bootstrap_servers"]
        assert four["address"] in added
        assert len({b["address"] for b in info["brokers"]}) == 4
        assert cli.brokers()[4]["state"] == "active"
        assert cli.brokers()[4]["replicas"] == 0
        assert cli.ok("cluster", "logs", "4", "-n", "3").strip()

        # Rebalance until there is nothing left to move.
        def balanced() -> bool:
            out = cli.ok("brokers", "rebalance", "--execute")
            if "nothing to move" in out:
                return True
            assert "Successfully started partition reassignment" in out, out
            wait_until(lambda: no_reassignment_runs(cli), 90, "the rebalance moves to finish")
            return False

        wait_until(balanced, 180, "a balanced cluster", interval_s=0.2)
        counts = {b: row["replicas"] for b, row in cli.brokers().items()}
        assert counts[4] > 0, counts
        assert sum(counts.values()) == 9 and max(counts.values()) - min(counts.values()) <= 1

        # A broker that holds replicas is not removed: exit 1, one line, nothing changed.
        before = cli.state_file.read_text()
        refused = cli.run("cluster", "remove-broker", "2")
        assert refused.returncode == 1, refused
        assert refused.stderr.startswith("minibroker cluster: broker 2 still holds ")
        assert "brokers decommission 2 --wait" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert cli.state_file.read_text() == before
        assert cli.status()["brokers"][1]["state"] == "running"
        assert cli.brokers()[2]["state"] == "active"

        # Decommission broker 1, then remove it.
        progress = cli.ok("brokers", "decommission", "1", "--wait", "--timeout-s", "120")
        assert "Broker 1 holds no replicas: it can be stopped" in progress
        assert cli.brokers()[1]["state"] == "decommissioned"
        one = next(b for b in cli.status()["brokers"] if b["node_id"] == 1)
        removed = cli.ok("cluster", "remove-broker", "1")
        assert removed.startswith("removed broker 1: stopped, unregistered")
        info = cli.status()
        assert [b["node_id"] for b in info["brokers"]] == [2, 3, 4]
        assert one["address"] not in info["bootstrap_servers"]
        assert not pathlib.Path(f"/proc/{one['pid']}").exists() or (
            str(one["data_dir"]).encode()
            not in pathlib.Path(f"/proc/{one['pid']}/cmdline").read_bytes()
        )
        assert sorted(cli.brokers()) == [2, 3, 4]
        log = pathlib.Path(one["log_file"]).read_text()
        assert "controlled_shutdown_granted" in log

        wait_until(lambda: isrs_full(cli, {2, 3, 4}), 60, "every ISR full on brokers 2, 3, 4")
        assert read_all(cli) == expected

        # down and up: the added broker is restarted with the others, the removed one is not.
        cli.ok("cluster", "down")
        assert all(b["state"] == "stopped" for b in cli.status()["brokers"])
        cli.ok("cluster", "up")
        info = cli.status()
        assert [(b["node_id"], b["state"]) for b in info["brokers"]] == [
            (2, "running"),
            (3, "running"),
            (4, "running"),
        ]
        assert {b: row["state"] for b, row in cli.brokers().items()} == {
            2: "active",
            3: "active",
            4: "active",
        }
        wait_until(lambda: isrs_full(cli, {2, 3, 4}), 60, "every ISR full after the restart")
        assert read_all(cli) == expected
    finally:
        cli.kill_all()
