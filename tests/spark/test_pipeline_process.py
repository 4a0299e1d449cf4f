"""examples/pipeline.py as a real process, stopped the way `docker compose stop` stops it.

Run 1 writes its sample events (`--generate`) and processes them in several micro-batches; it gets
SIGTERM once its first batch is committed and must stop the query and exit 0. More events are
produced while it is down. Run 2 starts with the same arguments and the same checkpoint: its
`--generate` must write nothing (the sample data is a one-time step), and the per-user totals it
ends with must count every input event exactly once (a batch counted twice or skipped after the
restart would show). Neither run may log a traceback (the Spark sink's event loop, the stop).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from typing import Any

import pytest
from cluster_harness import LocalCluster

from minibroker.client import Consumer, Producer, TopicPartition

pytestmark = pytest.mark.spark

ROOT = pathlib.Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "examples" / "pipeline.py"
GENERATED = 600
MORE = 150
# Lines that must never appear in the pipeline's log (its own, Spark's and the Python workers').
BAD = ("Traceback", "Exception in", "StackOverflowError", " ERROR ", "Event loop is closed")


def wait_for(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.2) -> None:
    """Poll until `predicate()` is true; its AssertionErrors (the pipeline died) end the wait."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(interval_s)


def read_all(bootstrap: str, topic: str) -> list[Any]:
    """Every record of `topic` up to the end offsets taken first."""
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        seen = dict.fromkeys(tps, 0)
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while any(seen[tp] < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"read {seen} of {ends}"
            for r in consumer.poll(timeout_ms=300):
                tp = TopicPartition(r.topic, r.partition)
                if r.offset < ends[tp]:
                    records.append(r)
                    seen[tp] = r.offset + 1
        return records


def latest_totals(bootstrap: str, topic: str) -> dict[str, dict[str, int]]:
    """The output as its readers see it: per user, the total with the most events."""
    latest: dict[str, dict[str, int]] = {}
    for r in read_all(bootstrap, topic):
        value = json.loads(r.value)
        if value["events"] > latest.get(value["user"], {}).get("events", -1):
            latest[value["user"]] = value
    return latest


class Pipeline:
    def __init__(self, bootstrap: str, tmp: pathlib.Path, topics: tuple[str, str]) -> None:
        self.checkpoint = tmp / "checkpoint"
        self.argv = [
            sys.executable,
            str(PIPELINE),
            "--bootstrap-servers",
            bootstrap,
            "--input",
            topics[0],
            "--output",
            topics[1],
            "--checkpoint",
            str(self.checkpoint),
            "--generate",
            str(GENERATED),
            # Several small micro-batches, so a stop can land while they run.
            "--max-offsets-per-trigger",
            "200",
            "--trigger-seconds",
            "0.5",
            "--master",
            "local[2]",
        ]
        self.tmp = tmp
        self.runs = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = tmp / "pipeline-0.log"

    def start(self) -> None:
        self.runs += 1
        self.log = self.tmp / f"pipeline-{self.runs}.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"pipeline exited with {self.proc.returncode}:\n{self.text()}")
        return True

    def terminate(self) -> int:
        """SIGTERM to the Python process only, as tini in the container passes it on."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=90)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def assert_clean(log: str) -> None:
    bad = [line for line in log.splitlines() if any(b in line for b in BAD)]
    assert not bad, "the pipeline logged:\n" + "\n".join(bad[:20]) + "\n--- log ---\n" + log


def test_sigterm_stops_cleanly_and_a_restart_resumes_exactly(
    cluster: LocalCluster, tmp_path: pathlib.Path
) -> None:
    bootstrap = cluster.bootstrap
    topics = ("pipeline-events", "pipeline-totals")
    pipeline = Pipeline(bootstrap, tmp_path, topics)
    commits = pipeline.checkpoint / "commits"
    try:
        pipeline.start()
        # SIGTERM once the first micro-batch is committed, while the others still run.
        wait_for(lambda: pipeline.alive() and (commits / "0").exists(), 180, "batch 0 committed")
        assert pipeline.terminate() == 0, pipeline.text()
        first = pipeline.text()
        assert_clean(first)
        assert f"generate: wrote {GENERATED} sample events" in first
        assert "pipeline: stopped on SIGTERM" in first

        # Events that arrive while the pipeline is down.
        users = ("alice", "bob", "carol", "dave", "erin")
        with Producer(bootstrap, acks="all") as producer:
            for seq in range(GENERATED, GENERATED + MORE):
                user = users[seq % 3]
                value = {"seq": seq, "user": user, "amount": seq % 11}
                producer.send(topics[0], json.dumps(value).encode(), key=user.encode())
            producer.flush()

        pipeline.start()
        total = GENERATED + MORE

        def caught_up() -> bool:
            pipeline.alive()
            totals = latest_totals(bootstrap, topics[1])
            return sum(t["events"] for t in totals.values()) >= total

        wait_for(caught_up, 180, f"totals over all {total} events", interval_s=1.0)
        assert pipeline.terminate() == 0, pipeline.text()
        second = pipeline.text()
        assert_clean(second)
        assert "generate: wrote 0 sample events" in second, "a restart wrote the sample again"
    finally:
        pipeline.kill()

    # The input holds each event once; the totals count each of them once.
    events = [json.loads(r.value) for r in read_all(bootstrap, topics[0])]
    assert sorted(e["seq"] for e in events) == list(range(total))
    expected: dict[str, dict[str, int]] = defaultdict(dict)
    counts = Counter(e["user"] for e in events)
    for e in events:
        want = expected[e["user"]]
        want.update(
            user=e["user"],
            events=counts[e["user"]],
            total=want.get("total", 0) + e["amount"],
            last_seq=max(want.get("last_seq", -1), e["seq"]),
        )
    assert latest_totals(bootstrap, topics[1]) == expected
