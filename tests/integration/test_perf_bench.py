"""The bench tools against real brokers: produce, consume and e2e count every record and print
their summary lines (tiny runs: this checks the tools, it measures nothing)."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
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


def _positive(fields: dict[str, Any], *names: str) -> None:
    for name in names:
        value = fields.get(name)
        assert isinstance(value, (int, float)) and value > 0, (name, fields)


def _produce_args(cluster: LocalCluster, num_records: int, **extra: Any) -> argparse.Namespace:
    return argparse.Namespace(
        topic="bench",
        num_records=num_records,
        record_size=100,
        acks="all",
        throughput=-1,
        producer_props=["linger_ms=2", "batch_size=4096"],
        bootstrap_server=cluster.bootstrap,
        **extra,
    )


def _broker_pids(cluster: LocalCluster) -> list[int]:
    return [spec.pid for spec in cluster.state.brokers]


def test_produce_then_consume_count_every_record(cluster: LocalCluster) -> None:
    produce = _produce_args(cluster, 600, broker_pids=_broker_pids(cluster))
    result = _run(bench.bench_produce(produce, io.StringIO()))
    assert re.match(
        r"^600 records sent, [\d.]+ records/sec .* ms 99\.9th\. client CPU [\d.]+ us/record "
        r"\([\d.]+ s\), brokers' CPU [\d.]+ us/record \([\d.]+ s, 3 processes\)\.$",
        result.line,
    ), result.line
    assert result.fields["records"] == 600 and result.fields["failed"] == 0, result.fields
    assert result.fields["client"] == "async" and result.fields["broker_pids"] == 3
    _positive(result.fields, "records_per_sec", "client_cpu_s", "client_cpu_us_per_record")
    # /proc counts CPU in clock ticks (10 ms): a tiny run may see none on the brokers' side.
    assert result.fields["broker_cpu_s"] >= 0 and result.fields["broker_cpu_us_per_record"] >= 0
    json.dumps(result.fields)  # the --json output
    consume = argparse.Namespace(
        topic="bench",
        messages=600,
        timeout=10_000,
        bootstrap_server=cluster.bootstrap,
        broker_pids=_broker_pids(cluster),
    )
    consumed = _run(bench.bench_consume(consume))
    assert consumed.warning is None
    fields = consumed.line.split(", ")
    header = bench.consumer_header(bench.CpuUsage(1, 0.0, 0.0)).split(", ")
    assert len(fields) == len(header) == 12, consumed.line
    assert fields[4] == "600", consumed.line
    assert fields[2] == f"{600 * 100 / bench.MB:.4f}", consumed.line
    assert float(fields[10]) > 0 and float(fields[11]) >= 0, consumed.line
    assert consumed.fields["records"] == 600 and consumed.fields["bytes"] == 600 * 100
    _positive(consumed.fields, "records_per_sec", "client_cpu_us_per_record")
    assert consumed.fields["broker_cpu_us_per_record"] >= 0


@pytest.mark.parametrize("latency", [True, False], ids=["timed", "no-latency"])
def test_sync_producer_counts_every_record(cluster: LocalCluster, latency: bool) -> None:
    args = _produce_args(cluster, 300, client="sync", latency=latency)
    result = bench.bench_produce_sync(args, io.StringIO())
    assert result.line.startswith("300 records sent, "), result.line
    assert "client CPU " in result.line and "brokers' CPU" not in result.line, result.line
    assert result.fields["client"] == "sync" and result.fields["records"] == 300
    assert result.fields["failed"] == 0 and "broker_cpu_s" not in result.fields
    _positive(result.fields, "records_per_sec", "client_cpu_s", "client_cpu_us_per_record")
    if latency:
        _positive(result.fields, "p50_ms", "max_latency_ms")
    else:
        assert result.fields["max_latency_ms"] == 0


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


def _bench_args(*argv: str) -> argparse.Namespace:
    from minibroker.deploy import bench_failover

    parser = argparse.ArgumentParser()
    bench_failover.register(parser.add_subparsers())
    return parser.parse_args(list(argv))


def test_controller_failover_one_round_reports_every_step(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`bench failover --target controller --rounds 1 --json` on its own 3-voter cluster: the
    round names another leader in a later epoch, and every time it reports is after the signal
    and in the order things must happen (measures nothing: no figure is compared with a goal)."""
    args = _bench_args("failover", "--target", "controller", "--rounds", "1", "--json")
    assert args.func(args) == 0
    out = capsys.readouterr().out
    result = json.loads(out)
    assert result["target"] == "controller" and result["controllers"] == 3, result
    assert result["signal"] == "SIGKILL" and len(result["rounds"]) == 1, result
    r = result["rounds"][0]
    assert r["new_leader"] != r["killed"] and r["new_epoch"] > r["old_epoch"], r
    assert r["elected_ms"] > 0 and r["accepted_ms"] > 0, r
    assert r["activated_ms"] is not None and r["activated_ms"] <= r["accepted_ms"], r
    assert r["topic_committed_ms"] is not None, r
    assert result["summary"]["accepted"]["n"] == 1, result


def test_metadata_bench_times_every_creation(capsys: pytest.CaptureFixture[str]) -> None:
    args = _bench_args(
        "metadata", "--controllers", "3", "--topics", "6", "--concurrency", "3", "--json"
    )
    assert args.func(args) == 0
    result = json.loads(capsys.readouterr().out)
    (run,) = result["runs"]
    assert run["controllers"] == 3
    assert [(p["callers"], p["topics"]) for p in run["phases"]] == [(1, 6), (3, 6)], run
    assert all(p["median_ms"] > 0 and p["topics_per_s"] > 0 for p in run["phases"]), run
    assert run["commit_latency_avg_ms"] is not None, run
