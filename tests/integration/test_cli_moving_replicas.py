"""The issue 14 command lines against a real cluster (processes): reassign-partitions' whole
cycle with a throttle (generate, bad input refused with nothing changed, execute, verify until
complete and the throttles gone), configs, topics alter, and a decommission that ends with the
broker holding nothing. Needs the controller core and broker sides of issue 14 (r-core,
r-broker) merged."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from tests.integration.cluster_harness import local_cluster, wait_until

RECORDS = 200
RATE = 10_000_000


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "minibroker.deploy", *args],
        capture_output=True,
        text=True,
        timeout=90,
        input=stdin,
    )


def ok(*args: str, stdin: str | None = None) -> str:
    done = cli(*args, stdin=stdin)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def test_reassign_configs_alter_and_decommission_from_the_command_line(
    tmp_path: pathlib.Path,
) -> None:
    with local_cluster(str(tmp_path / "cluster"), brokers=4) as cluster:
        boot = ["--bootstrap-server", cluster.bootstrap]
        ok("topics", "create", "moved", "--partitions", "2", "--replication-factor", "2", *boot)
        values = "".join(f"v{i}\n" for i in range(RECORDS))
        ok("produce", "moved", *boot, stdin=values)

        def replicas() -> dict[int, list[int]]:
            rows = json.loads(ok("topics", "describe", "moved", "--json", *boot))
            return {r["partition"]: r["replicas"] for r in rows}

        before = replicas()

        # --generate: a proposal on brokers 3 and 4 only; nothing changes.
        topics_file = tmp_path / "topics.json"
        topics_file.write_text('{"version":1,"topics":[{"topic":"moved"}]}')
        out = ok(
            "reassign-partitions",
            "--generate",
            "--topics-to-move-json-file",
            str(topics_file),
            "--broker-list",
            "3,4",
            *boot,
        ).splitlines()
        assert out[0] == "Current partition replica assignment"
        assert out[3] == "Proposed partition reassignment configuration"
        proposal = json.loads(out[4])
        assert proposal["version"] == 1 and len(proposal["partitions"]) == 2
        assert all(set(p["replicas"]) == {3, 4} for p in proposal["partitions"])
        assert replicas() == before

        # Bad input: exit 1, one error line, nothing started.
        target = tmp_path / "target.json"
        target.write_text(out[4])
        bad = tmp_path / "bad.json"
        bad.write_text(
            '{"version":1,"partitions":[{"topic":"moved","partition":0,"replicas":[1,9]}]}'
        )
        for argv in (
            ["--execute", "--reassignment-json-file", str(target), "--throttle", "0"],
            ["--execute", "--reassignment-json-file", str(bad)],
            ["--execute", "--reassignment-json-file", str(tmp_path / "missing.json")],
        ):
            refused = cli("reassign-partitions", *argv, *boot)
            assert refused.returncode == 1, refused
            assert refused.stderr.startswith("error: ") and "Traceback" not in refused.stderr
        listed = ok("reassign-partitions", "--list", *boot)
        assert listed == "No partition reassignments found.\n"
        assert replicas() == before

        # --execute with a throttle: rollback JSON first, throttles set, moves started.
        started = ok(
            "reassign-partitions",
            "--execute",
            "--reassignment-json-file",
            str(target),
            "--throttle",
            str(RATE),
            *boot,
        ).splitlines()
        assert started[0] == "Current partition replica assignment"
        rollback = json.loads(started[2])
        assert {p["partition"]: p["replicas"] for p in rollback["partitions"]} == before
        assert any(
            line.startswith("Successfully started partition reassignment") for line in started
        )
        described = ok(
            "configs", "--describe", "--entity-type", "brokers", "--entity-name", "3", *boot
        )
        assert f"leader.replication.throttled.rate={RATE}" in described

        def verified() -> str | None:
            text = ok(
                "reassign-partitions", "--verify", "--reassignment-json-file", str(target), *boot
            )
            return text if "still in progress" not in text else None

        text = wait_until(verified, 60, "the reassignment to complete", interval_s=0.5)
        assert text.count("is completed.") == 2, text
        assert "Clearing broker-level throttles" in text
        described = ok(
            "configs", "--describe", "--entity-type", "brokers", "--entity-name", "3", *boot
        )
        assert "throttled.rate" not in described
        topic_configs = ok(
            "configs", "--describe", "--entity-type", "topics", "--entity-name", "moved", *boot
        )
        assert "throttled.replicas" not in topic_configs
        expected = {p["partition"]: p["replicas"] for p in proposal["partitions"]}
        # The brokers' metadata (topics describe) may lag the controller's a little.
        wait_until(lambda: replicas() == expected, 30, "the brokers' metadata to show the move")
        consumed = ok(
            "consume",
            "moved",
            "--from-beginning",
            "--max-messages",
            str(RECORDS),
            "--timeout-ms",
            "20000",
            *boot,
        )
        assert sorted(consumed.split()) == sorted(f"v{i}" for i in range(RECORDS))

        # configs and topics alter.
        ok(
            "configs",
            "--alter",
            "--entity-type",
            "topics",
            "--entity-name",
            "moved",
            "--add-config",
            "min.insync.replicas=2,retention.ms=3600000",
            *boot,
        )
        topic_configs = ok(
            "configs", "--describe", "--entity-type", "topics", "--entity-name", "moved", *boot
        )
        assert (
            "min.insync.replicas=2 " in topic_configs and "retention.ms=3600000 " in topic_configs
        )
        unknown = cli(
            "configs",
            "--alter",
            "--entity-type",
            "topics",
            "--entity-name",
            "moved",
            "--add-config",
            "no.such.config=1",
            *boot,
        )
        assert unknown.returncode == 1 and "InvalidConfigError" in unknown.stderr
        ok("topics", "alter", "--topic", "moved", "--partitions", "3", *boot)
        assert len(replicas()) == 3
        shrink = cli("topics", "alter", "--topic", "moved", "--partitions", "2", *boot)
        assert shrink.returncode == 1 and "InvalidPartitionsError" in shrink.stderr

        # Decommission broker 3: it ends up holding nothing.
        progress = ok("brokers", "decommission", "3", "--wait", "--timeout-s", "60", *boot)
        assert progress.startswith("Decommissioning broker 3: ")
        assert "Broker 3 holds no replicas: it can be stopped" in progress
        wait_until(
            lambda: all(3 not in r for r in replicas().values()),
            30,
            "the brokers' metadata without broker 3",
        )
        line = next(
            line
            for line in ok("brokers", "list", *boot).splitlines()
            if line.startswith("Broker: 3\t")
        )
        assert "State: decommissioned\tReplicas: 0\tLeaders: 0" in line
