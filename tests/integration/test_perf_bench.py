"""The bench tools against real brokers: produce, consume and e2e count every record and print
their summary lines (tiny runs: this checks the tools, it measures nothing)."""

from __future__ import annotations

import argparse
import asyncio
import io
import re
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from cluster_harness import LocalCluster, local_cluster

from minibroker.client import Admin
from minibroker.client.cli import bench

pytestmark = pytest.mark.integration
T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("perf") / "cluster"
    with local_cluster(str(directory), brokers=3) as c:
        with Admin(c.bootstrap) as admin:
            admin.create_topic("bench", 3, 3, {"min.insync.replicas": "2"})
        yield c


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_produce_then_consume_count_every_record(cluster: LocalCluster) -> None:
    produce = argparse.Namespace(
        topic="bench",
        num_records=600,
        record_size=100,
        acks="all",
        throughput=-1,
        producer_props=["linger_ms=2", "batch_size=4096"],
        bootstrap_server=cluster.bootstrap,
    )
    line = _run(bench.bench_produce(produce, io.StringIO()))
    assert re.match(r"^600 records sent, [\d.]+ records/sec .* ms 99\.9th\.$", line), line
    consume = argparse.Namespace(
        topic="bench", messages=600, timeout=10_000, bootstrap_server=cluster.bootstrap
    )
    csv, warning = _run(bench.bench_consume(consume))
    assert warning is None
    fields = csv.split(", ")
    assert fields[4] == "600", csv
    assert fields[2] == f"{600 * 100 / bench.MB:.4f}", csv


@pytest.mark.parametrize("same_process", [False, True], ids=["consumer-process", "one-loop"])
def test_e2e_sees_every_record_it_sent(cluster: LocalCluster, same_process: bool) -> None:
    args = argparse.Namespace(
        topic="bench",
        rate=400.0,
        num_records=200,
        record_size=64,
        acks="all",
        producer_props=["linger_ms=0"],
        timeout=10_000,
        bootstrap_server=cluster.bootstrap,
        same_process=same_process,
        gc_threshold=0,
    )
    line = _run(bench.bench_e2e(args, io.StringIO()))
    match = re.match(
        r"^200 records received, [\d.]+ records/sec \([\d.]+ MB/sec\), ([\d.]+) ms avg latency, "
        r"([\d.]+) ms max latency, ([\d.]+) ms 50th, [\d.]+ ms 95th, [\d.]+ ms 99th, "
        r"[\d.]+ ms 99\.9th\.$",
        line,
    )
    assert match, line
    avg, top, p50 = (float(g) for g in match.groups())
    assert 0 < p50 <= top and 0 < avg <= top, line


def test_e2e_consumer_process_error_reaches_the_caller(cluster: LocalCluster) -> None:
    from minibroker.client.errors import UnknownTopicOrPartitionError

    args = argparse.Namespace(
        topic="no-such-topic",
        rate=100.0,
        num_records=5,
        record_size=64,
        acks="all",
        producer_props=["linger_ms=0", "max_block_ms=2000"],
        timeout=2_000,
        bootstrap_server=cluster.bootstrap,
        same_process=False,
        gc_threshold=0,
    )
    with pytest.raises(UnknownTopicOrPartitionError, match="no-such-topic"):
        _run(bench.bench_e2e(args, io.StringIO()))
