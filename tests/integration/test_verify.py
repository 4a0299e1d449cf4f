"""`minibroker verify --fresh --rounds 20` with every fault kind, as CI runs it (issue 15).

The command starts its own 3-broker, 3-controller cluster, causes 20 seeded faults (each kind
four times: the schedule draws kinds from a bag), checks the history and kills the cluster by
PID. The test asserts exit 0, the JSON's figures, and that no process of that cluster is left.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from minibroker.deploy.verify_schedule import FAULT_KINDS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROUNDS = 20


def processes_mentioning(text: str) -> list[int]:
    """PIDs whose command line contains `text` (the cluster's dir is in every one of its)."""
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmdline and int(proc.name) != os.getpid():
            found.append(int(proc.name))
    return found


def test_verify_twenty_rounds_of_every_fault_kind_finds_nothing(tmp_path: pathlib.Path) -> None:
    seed = int.from_bytes(os.urandom(4), "big") % (1 << 31)
    env = dict(os.environ, TMPDIR=str(tmp_path))  # the temporary cluster lives in tmp_path
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "minibroker.deploy",
            "verify",
            "--fresh",
            "--rounds",
            str(ROUNDS),
            "--faults",
            ",".join(FAULT_KINDS),
            "--seed",
            str(seed),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    detail = f"seed {seed}\nstderr:\n{result.stderr[-6000:]}\nstdout:\n{result.stdout[-4000:]}"
    assert result.returncode == 0, detail
    out = json.loads(result.stdout)
    assert out["ok"] and out["seed"] == seed, detail
    assert out["violations"] == [] and out["violation_counts"] == {} and out["problems"] == []
    assert out["rounds"] == ROUNDS

    # Each kind four times, and every fault followed by an acknowledged write.
    assert sorted(out["faults"]) == sorted(FAULT_KINDS), out["faults"]
    for kind, row in out["faults"].items():
        assert row["count"] == ROUNDS // len(FAULT_KINDS), (kind, row)
        assert row["recovered"] == row["count"], (kind, row)
        assert 0 <= row["median_s"] <= row["p95_s"] <= row["max_s"] < 60, (kind, row)
    kinds_run = {r["kind"] for r in out["rounds_detail"]}
    assert kinds_run == set(FAULT_KINDS)
    variants = {r["variant"] for r in out["rounds_detail"] if r["kind"] == "partition"}
    assert variants == {"zombie", "follower", "controller_only", "split"}

    totals = out["totals"]
    assert totals["acked"] > 1000, totals
    assert totals["lost"] == 0 and totals["duplicated"] == 0
    # Every acknowledged write is in the final logs; failed ones may be too, once.
    assert totals["acked"] <= totals["final_records"] <= totals["acked"] + totals["failed"]
    assert totals["read"] == totals["final_records"], totals
    assert len(out["throughput_per_s"]) == 60 and max(out["throughput_per_s"]) > 0
    # The faults moved leaders and shrank ISRs: the min ISR check had a timeline to check.
    assert out["isr_changes"] >= ROUNDS, out["isr_changes"]

    # The cluster was killed by PID and its dir removed: nothing of it is left.
    assert out["cluster_pids"], out
    assert not processes_mentioning(out["cluster_dir"])
    assert not pathlib.Path(out["cluster_dir"]).exists()
