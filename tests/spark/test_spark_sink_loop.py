"""The sink's event loop in a reused Python worker: no "Event loop is closed" tracebacks.

Spark reuses a Python worker process for task after task, and the same process runs the source's
blocking clients (on the process's shared client loop) and the sink's writes. grpc.aio binds every
event loop it sees to its one completion-queue poller and hands each completion to the loop of the
call it belongs to; a loop that a task closed while grpc still had completions for it makes the
next loop that reads the poller log `Exception in callback ...PollerCompletionQueue._handle_events
... RuntimeError: Event loop is closed`. The tracebacks come and go with timing, so besides the
log this checks the rule that rules them out: no event loop in the worker is ever closed.

The worker is a subprocess (a fresh grpc state, its stderr read as a user reads Spark's log); it
runs the sink's `produce` as Spark tasks do, without a JVM, so the check takes seconds.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from cluster_harness import LocalCluster

pytestmark = pytest.mark.spark

TASKS = 40

WORKER = textwrap.dedent(
    """
    import asyncio, gc, sys, time

    import pyarrow as pa

    from minibroker.client import Admin, Consumer, TopicPartition
    from minibroker.client.spark.sink import SinkOptions, produce

    bootstrap, topic, tasks = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, 3, 3)
    opts = SinkOptions(bootstrap, topic, {"acks": "all"}, ("value",))
    # The source side of the same worker: a blocking consumer on the shared client loop.
    consumer = Consumer(bootstrap, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(topic, p) for p in range(3)])
    written = read = 0
    for task in range(tasks):
        batch = pa.RecordBatch.from_pydict({"value": [b"%d-%d" % (task, i) for i in range(50)]})
        written += produce(opts, iter([batch])).records
        read += len(consumer.poll(timeout_ms=50))
    deadline = time.monotonic() + 60
    while read < written and time.monotonic() < deadline:
        read += len(consumer.poll(timeout_ms=500))
    consumer.close()
    gc.collect()
    closed = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop)
              and o.is_closed()]
    print(f"written {written} read {read} closed loops {len(closed)}")
    """
)


def test_reused_worker_closes_no_loop_and_logs_no_traceback(cluster: LocalCluster) -> None:
    result = subprocess.run(
        [sys.executable, "-c", WORKER, cluster.bootstrap, "sink-loop", str(TASKS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "Event loop is closed" not in result.stderr, result.stderr
    written = TASKS * 50
    # Every record arrived, and no loop that grpc had seen was closed.
    assert result.stdout.split() == f"written {written} read {written} closed loops 0".split()
