"""A broker whose disk fails while it leads, and one started on a disk it cannot write.

Issue 11 item 5, with real processes on 127.0.0.1. The disk fills for real and without root:
the test lowers a running broker's RLIMIT_FSIZE (`resource.prlimit` on its pid) to a little above
what its files hold, so the kernel refuses the write that would grow a file past it with EFBIG
(CPython ignores SIGXFSZ, so the broker sees an OSError, as it would ENOSPC). Nothing is faked.

What the tests prove:
- the broker takes its log dir offline on the failed append, reports it to the controller in a
  heartbeat (Kafka's OfflineLogDirs), and the controller fences it at once (the session timeout
  is set far longer than the test's deadlines) and elects another ISR member;
- the acks=all producer's writes succeed again through the new leader, and every acknowledged
  record is read back once, at the offset it was acknowledged with (docs/design.md §8 invariants 1
  and 5);
- the failed broker exits with status 1 and a one-line error in its log naming the dir, what
  failed and what to do, with no traceback, and `minibroker cluster status` shows it stopped;
- started again on the still-full disk it gives the same kind of error and exits 1; started with
  space again it recovers and rejoins the ISR;
- a broker started on a data dir it cannot write exits 1 with a one-line error naming the file.
"""

from __future__ import annotations

import json
import os
import pathlib
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.client import Admin, Consumer, Producer, TopicPartition
from minibroker.deploy import cluster as launcher

pytestmark = pytest.mark.integration

TOPIC = "full"
# How far above the largest file of the broker the file size limit goes: room for its log to
# keep growing, and little enough that the produced records reach it within a second or two.
HEADROOM_BYTES = 256 * 1024


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    settings = {
        # Far longer than any deadline below: a leadership move can only come from the report
        # (or the broker's heartbeat stream ending), never from the session timeout.
        "broker.session.timeout.ms": "120000",
        "leader.imbalance.check.interval.seconds": "3600",
    }
    with local_cluster(str(tmp_path / "cluster"), brokers=3, settings=settings) as c:
        yield c


def describe(admin: Admin, topic: str = TOPIC):  # type: ignore[no-untyped-def]
    (desc,) = admin.describe_topics([topic])
    return desc.partitions[0]


class AcksAllProducer:
    """Sends numbered values with acks=all until stopped; keeps the offset of each ack."""

    def __init__(self, bootstrap: str) -> None:
        self.acked: dict[bytes, int] = {}
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._producer = Producer(
            bootstrap, acks="all", linger_ms=2, request_timeout_ms=5000, delivery_timeout_ms=90_000
        )
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            batch = []
            for _ in range(20):
                value = f"{i:07d}-".encode() + b"x" * 1000
                batch.append((value, self._producer.send(TOPIC, value, partition=0)))
                i += 1
            for value, future in batch:
                try:
                    offset = future.result(timeout=120).offset
                except Exception as err:
                    with self._lock:
                        self.failures.append(repr(err))
                    continue
                with self._lock:
                    self.acked[value] = offset

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def wait_for(self, more: int, timeout_s: float) -> None:
        target = self.count() + more
        wait_until(lambda: self.count() >= target, timeout_s, f"{more} more acks")

    def __enter__(self) -> AcksAllProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=150)
        self._producer.close()


def read_all(bootstrap: str, tp: TopicPartition, timeout_s: float = 30.0) -> list:  # type: ignore[type-arg]
    with Consumer(bootstrap) as consumer:
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        consumer.seek_to_beginning(tp)
        records = []
        deadline = time.monotonic() + timeout_s
        while (not records or records[-1].offset < end - 1) and end > 0:
            assert time.monotonic() < deadline, f"read {len(records)} records, HW is {end}"
            records.extend(consumer.poll(timeout_ms=500))
        return records


def largest_file(*roots: pathlib.Path) -> int:
    sizes = [0]
    for root in roots:
        paths = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        sizes.extend(p.stat().st_size for p in paths)
    return max(sizes)


def wait_exit_status(pid: int, timeout_s: float) -> int:
    """Reap our child `pid` and return its exit code (the launcher started it from here)."""

    def reaped() -> int | None:
        done, status = os.waitpid(pid, os.WNOHANG)
        return os.waitstatus_to_exitcode(status) if done == pid else None

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = reaped()
        if code is not None:
            return code
        time.sleep(0.05)
    raise AssertionError(f"broker process {pid} still running after {timeout_s}s")


def controller_events(cluster: LocalCluster, name: str) -> list[dict]:  # type: ignore[type-arg]
    text = pathlib.Path(cluster.spec("controller").log_file).read_text(errors="replace")
    events = []
    for line in text.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == name:
                events.append(event)
    return events


def assert_one_line_error(output: str, *needles: str) -> None:
    lines = [line for line in output.splitlines() if line.startswith("minibroker broker: ")]
    assert lines, f"no one-line error in:\n{output[-3000:]}"
    assert all(needle in lines[-1] for needle in needles), lines[-1]
    assert "Traceback" not in output, output[-3000:]


def limited_fsize(limit: int):  # type: ignore[no-untyped-def]
    def set_limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return set_limit


def test_leader_whose_disk_fills_hands_over_to_an_isr_member_and_exits(
    cluster: LocalCluster,
) -> None:
    tp = TopicPartition(TOPIC, 0)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, 3, {"min.insync.replicas": "2"})
        wait_until(lambda: len(describe(admin).isr) == 3, 20, "a full ISR")
        failed = describe(admin).leader
        spec = cluster.spec(failed)
        data_dir = pathlib.Path(spec.data_dir)
        with AcksAllProducer(cluster.bootstrap) as producer:
            producer.wait_for(100, 30)
            # The disk is full from now on: no file of the broker may grow much past its size.
            limit = largest_file(data_dir, pathlib.Path(spec.log_file)) + HEADROOM_BYTES
            resource.prlimit(spec.pid, resource.RLIMIT_FSIZE, (limit, limit))
            acked_before = producer.count()

            wait_until(
                lambda: describe(admin).leader not in (failed, -1), 30, "a leader on another broker"
            )
            moved = describe(admin)
            assert failed not in moved.isr
            assert wait_exit_status(spec.pid, 60) == 1
            producer.wait_for(300, 60)  # acks=all writes succeed again, through the new leader
        assert not producer.failures, producer.failures[:3]
        assert producer.count() > acked_before + 300

        # The controller acted on the broker's report, not on a timeout or a guess.
        (offline,) = controller_events(cluster, "log_dir_offline")
        assert offline["broker_id"] == failed and offline["log_dirs"] == [str(data_dir)]
        fenced = [
            e for e in controller_events(cluster, "broker_fenced") if e["broker_id"] == failed
        ]
        assert fenced[0]["reason"] == f"log dir {data_dir} offline"
        log_text = pathlib.Path(spec.log_file).read_text(errors="replace")
        assert_one_line_error(
            log_text, f"log dir {data_dir} failed", "File too large", "free space"
        )
        status = launcher.status(cluster.directory)
        (row,) = [b for b in status["brokers"] if b["node_id"] == failed]
        assert row["state"] == "stopped"

        # Every acknowledged record is there once, where it was acknowledged.
        records = read_all(cluster.bootstrap, tp)
        by_value: dict[bytes, int] = {}
        for record in records:
            assert record.value not in by_value, f"{record.value[:8]!r} stored twice"
            by_value[record.value] = record.offset
        lost = {v[:8]: o for v, o in producer.acked.items() if by_value.get(v) != o}
        assert not lost, f"{len(lost)} acknowledged records missing or moved: {list(lost)[:3]}"

        # Started again on the still-full disk: the same kind of one-line error, status 1.
        state = launcher.load_state(cluster.directory)
        assert state is not None
        again = subprocess.Popen(
            launcher.command_for(spec, state),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=limited_fsize(limit),
            start_new_session=True,
        )
        try:
            output, _ = again.communicate(timeout=90)
        finally:
            if again.poll() is None:
                again.kill()
                again.wait()
        text = output.decode(errors="replace")
        assert again.returncode == 1, text[-3000:]
        assert_one_line_error(text, str(data_dir), "File too large", "free space")

        # With space again it recovers its log and rejoins the ISR.
        cluster.start(failed)
        wait_until(lambda: failed in describe(admin).isr, 60, f"broker {failed} back in the ISR")


def broker_command(data_dir: pathlib.Path) -> list[str]:
    # No controller listens on port 1: a broker that got past its data dir would keep retrying.
    return [
        sys.executable,
        "-m",
        "minibroker.deploy",
        "broker",
        "--node-id",
        "1",
        "--data-dir",
        str(data_dir),
        "--listen",
        "127.0.0.1:0",
        "--controller",
        "127.0.0.1:1",
        "--metrics-port",
        "-1",
    ]


@pytest.mark.parametrize(
    ("limit", "failing_file"),
    [(0, ".lock"), (16, "meta.properties")],  # the pid fits in 16 bytes, meta.properties does not
)
def test_broker_started_on_a_data_dir_it_cannot_write_exits_with_a_one_line_error(
    tmp_path: pathlib.Path, limit: int, failing_file: str
) -> None:
    data_dir = tmp_path / "data"
    result = subprocess.run(
        broker_command(data_dir),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        preexec_fn=limited_fsize(limit),
        timeout=60,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert_one_line_error(
        result.stderr, f"data dir {data_dir}", str(data_dir / failing_file), "File too large"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a read-only dir anyway")
def test_broker_started_on_a_read_only_data_dir_exits_with_a_one_line_error(
    tmp_path: pathlib.Path,
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o555)
    try:
        result = subprocess.run(
            broker_command(data_dir),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        data_dir.chmod(0o755)
    assert result.returncode == 1, result.stderr[-3000:]
    assert_one_line_error(result.stderr, str(data_dir / ".lock"), "make it writable")
