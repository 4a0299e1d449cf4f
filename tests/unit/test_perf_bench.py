"""The bench tools' pure parts: e2e latency summary and argument parsing (no sockets)."""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import io
import json
import os
import re
import time
from typing import Any

import pytest

from minibroker.client.cli import bench


def test_e2e_summary_keeps_fractional_milliseconds() -> None:
    latencies = [0.25 * (i + 1) for i in range(1000)]  # 0.25 .. 250.0 ms
    summary = bench.LatencySummary(list(reversed(latencies)))
    assert summary.pct(0.5) == 125.25
    assert summary.pct(0.99) == 247.75
    assert summary.pct(0.999) == 250.0
    line = summary.line(1000, 2.0, 1000 * 1024, 1000)
    pattern = (
        r"^1000 records received, 500\.0 records/sec \(0\.49 MB/sec\), 125\.12 ms avg latency, "
        r"250\.00 ms max latency, 125\.25 ms 50th, 237\.75 ms 95th, 247\.75 ms 99th, "
        r"250\.00 ms 99\.9th\.$"
    )
    assert re.match(pattern, line), line


def test_e2e_summary_reports_missing_records_and_survives_none() -> None:
    line = bench.LatencySummary([]).line(0, 1.0, 0, 5)
    assert line.startswith("0 records received, 0.0 records/sec")
    assert line.endswith("(5 of 5 never arrived)")


def test_e2e_parser_defaults_to_no_linger() -> None:
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["e2e", "--topic", "t", "--rate", "100", "--num-records", "10"])
    assert args.record_size == 1024 and args.acks == "all"
    assert bench._typed_props(args.producer_props) == {"linger_ms": 0}


def test_gc_threshold_option_defaults_and_zero_keeps_python_defaults() -> None:
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    for name in ("produce", "consume", "e2e"):
        required = {
            "produce": ["--num-records", "1", "--record-size", "1"],
            "consume": ["--messages", "1"],
            "e2e": ["--rate", "1", "--num-records", "1"],
        }[name]
        args = parser.parse_args([name, "--topic", "t", *required])
        assert args.gc_threshold == bench.DEFAULT_GC_THRESHOLD
    before = gc.get_threshold()
    try:
        bench.tune_gc(0)
        assert gc.get_threshold() == before
        bench.tune_gc(12_345)
        assert gc.get_threshold()[0] == 12_345
    finally:
        gc.set_threshold(*before)


def test_produce_and_consume_parsers_take_client_cpu_and_json_options() -> None:
    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    base = ["produce", "--topic", "t", "--num-records", "1", "--record-size", "1"]
    args = parser.parse_args(base)
    assert args.client == "async" and args.latency and not args.json and args.broker_pids == []
    args = parser.parse_args(
        [*base, "--client", "sync", "--no-latency", "--json", "--broker-pids", "7,8"]
    )
    assert args.client == "sync" and not args.latency and args.json
    assert args.broker_pids == [7, 8]
    args = parser.parse_args(["consume", "--topic", "t", "--messages", "1", "--json"])
    assert args.json and args.broker_pids == []
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--broker-pids", "x"])
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--client", "threads"])


def test_pid_cpu_reads_this_process_and_none_for_a_missing_one() -> None:
    before = bench.pid_cpu_s(os.getpid())
    assert before is not None and before >= 0
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # burn CPU (no sleep): the counter must move
        pass
    after = bench.pid_cpu_s(os.getpid())
    assert after is not None and after > before
    assert bench.pid_cpu_s(2**22 + 12_345) is None  # above pid_max's ceiling: never a process


def test_cpu_meter_divides_by_records_and_counts_only_live_pids() -> None:
    meter = bench.CpuMeter([os.getpid(), 2**22 + 12_345])
    meter.start()
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    usage = meter.stop(1000)
    assert usage.client_s >= 0.05 and usage.broker_pids == 1
    assert usage.broker_s is not None and usage.broker_s > 0
    assert usage.client_us_per_record == pytest.approx(usage.client_s * 1e3)
    fields = usage.fields()
    assert fields["client_cpu_us_per_record"] > 0 and fields["broker_cpu_us_per_record"] > 0
    text = usage.text()
    assert re.match(
        r"^client CPU [\d.]+ us/record \([\d.]+ s\), brokers' CPU [\d.]+ us/record "
        r"\([\d.]+ s, 1 processes\)\.$",
        text,
    ), text
    alone = bench.CpuUsage(4, 2e-6)
    assert alone.broker_us_per_record is None and "broker_cpu_s" not in alone.fields()
    assert alone.text() == "client CPU 0.50 us/record (0.00 s)."


def test_consumer_line_adds_cpu_columns_matching_its_header() -> None:
    cpu = bench.CpuUsage(400, 0.002, 0.004, 3)
    line = bench.consumer_line(1000.0, 1002.0, 4 * 1024 * 1024, 400, cpu)
    header = bench.consumer_header(cpu).split(", ")
    assert header[-2:] == [bench.CPU_COLUMN, bench.BROKER_CPU_COLUMN]
    assert line.split(", ")[len(header) - 2 :] == ["5.0000", "10.0000"]
    no_brokers = bench.CpuUsage(400, 0.002)
    assert bench.consumer_header(no_brokers).split(", ")[-1] == bench.CPU_COLUMN
    assert bench.consumer_line(1000.0, 1002.0, 0, 400, no_brokers).endswith(
        ", 0, 2000, 0.0000, 200.0000, 5.0000"
    )


class _FailingAsyncProducer:
    """Stands in for AsyncProducer: every other send's future fails once flush is called."""

    def __init__(self, bootstrap: str, **config: Any) -> None:
        self.futures: list[asyncio.Future[Any]] = []

    async def __aenter__(self) -> _FailingAsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def partitions_for(self, topic: str) -> list[int]:
        return [0]

    async def send(self, topic: str, value: bytes) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        return future

    async def flush(self) -> None:
        for i, future in enumerate(self.futures):
            if i % 2:
                future.set_exception(RuntimeError("refused"))
            else:
                future.set_result(None)
        await asyncio.sleep(0)  # the done callbacks run


class _FailingAsyncProducerOwnFutures(_FailingAsyncProducer):
    """An AsyncProducer whose futures are not asyncio's (add_done_callback takes no context)."""

    async def send(self, topic: str, value: bytes) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.futures.append(future)  # type: ignore[arg-type]
        return future


class _FailingSyncProducer:
    def __init__(self, bootstrap: str, **config: Any) -> None:
        self.futures: list[concurrent.futures.Future[Any]] = []

    def __enter__(self) -> _FailingSyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def partitions_for(self, topic: str) -> list[int]:
        return [0]

    def send(self, topic: str, value: bytes) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.futures.append(future)
        return future

    def flush(self) -> None:
        for i, future in enumerate(self.futures):
            if i % 2:
                future.set_exception(RuntimeError("refused"))
            else:
                future.set_result(None)


@pytest.mark.parametrize("client", ["async", "async-own-futures", "sync"])
@pytest.mark.parametrize("latency", [True, False], ids=["timed", "no-latency"])
def test_produce_counts_failures_and_reports_cpu(
    monkeypatch: pytest.MonkeyPatch, client: str, latency: bool
) -> None:
    import minibroker.client.producer
    import minibroker.client.sync

    fake = _FailingAsyncProducerOwnFutures if client == "async-own-futures" else None
    monkeypatch.setattr(minibroker.client.producer, "AsyncProducer", fake or _FailingAsyncProducer)
    client = client.removesuffix("-own-futures")
    monkeypatch.setattr(minibroker.client.sync, "Producer", _FailingSyncProducer)
    args = argparse.Namespace(
        topic="t",
        num_records=10,
        record_size=100,
        acks="all",
        throughput=-1,
        producer_props=[],
        bootstrap_server="127.0.0.1:1",
        client=client,
        latency=latency,
        broker_pids=[os.getpid()],
    )
    if client == "sync":
        result = bench.bench_produce_sync(args, io.StringIO())
    else:
        result = asyncio.run(bench.bench_produce(args, io.StringIO()))
    assert result.fields["records"] == 5 and result.fields["failed"] == 5, result.fields
    assert result.fields["records_sent"] == 10 and result.fields["client"] == client
    assert "(5 failed: RuntimeError: refused)" in result.line, result.line
    assert result.line.startswith("5 records sent, "), result.line
    assert result.fields["client_cpu_us_per_record"] > 0
    assert result.fields["broker_pids"] == 1 and result.fields["broker_cpu_s"] >= 0
    json.dumps(result.fields)


def test_ack_times_prints_due_windows_and_keeps_only_successes() -> None:
    out = io.StringIO()
    stats = bench.LatencyStats(4, out)
    acks = bench.AckTimes(stats, 100)
    futures: list[concurrent.futures.Future[Any]] = []
    for i in range(4):
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        acks.sent_at[future] = time.monotonic()
        future.add_done_callback(acks.done)
        if i == 3:
            future.set_exception(RuntimeError("refused"))
        else:
            future.set_result(None)
        futures.append(future)
    assert not acks.sent_at and len(acks.acks) == 4
    acks.window(stats.window_start + 1.0)  # not due yet: nothing printed
    assert out.getvalue() == ""
    acks.window(stats.window_start + bench.REPORT_INTERVAL_S)
    assert out.getvalue().startswith("4 records sent, "), out.getvalue()
    failures: list[BaseException] = []
    acks.finish(failures, concurrent.futures.CancelledError)
    assert [str(f) for f in failures] == ["refused"]
    assert len(stats.latencies) == 3 and stats.bytes == 300
    assert all(latency >= 0 for latency in stats.latencies)


# -- bench failover / bench metadata (deploy/bench_failover.py): the pure parts ------------------


def _bench_parser() -> argparse.ArgumentParser:
    from minibroker.deploy import bench_failover

    parser = argparse.ArgumentParser()
    bench_failover.register(parser.add_subparsers())
    return parser


def test_failover_parser_defaults_keep_the_broker_bench() -> None:
    from minibroker.deploy import bench_failover

    args = _bench_parser().parse_args(["failover"])
    assert args.target == "broker" and args.rounds == 10 and args.controllers is None
    assert not args.graceful and not args.json and args.settings == []
    assert args.retry_backoff_ms == 100 and args.brokers == 3
    assert bench_failover.controllers_for(args) == 1
    old = _bench_parser().parse_args(["failover", "--kills", "4", "--controllers", "3"])
    assert old.rounds == 4 and bench_failover.controllers_for(old) == 3


def test_failover_parser_controller_target() -> None:
    from minibroker.deploy import bench_failover

    parser = _bench_parser()
    args = parser.parse_args(
        ["failover", "--target", "controller", "--rounds", "2", "--graceful", "--json"]
    )
    assert args.target == "controller" and args.rounds == 2 and args.graceful and args.json
    assert bench_failover.controllers_for(args) == 3
    args = parser.parse_args(["failover", "--target", "controller", "--controllers", "5"])
    assert bench_failover.controllers_for(args) == 5
    args = parser.parse_args(["failover", "--target", "controller", "--controllers", "1"])
    with pytest.raises(ValueError, match="controllers 3 or 5"):
        bench_failover.controllers_for(args)
    args = parser.parse_args(["failover", "--rounds", "0"])
    with pytest.raises(ValueError, match="--rounds"):
        bench_failover.controllers_for(args)
    for bad in (["--controllers", "2"], ["--target", "nobody"], ["--set", "novalue"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["failover", *bad])
    args = parser.parse_args(
        ["failover", "--set", "controller.quorum.fetch.timeout.ms = 1000", "--set", "a=b=c"]
    )
    assert args.settings == [("controller.quorum.fetch.timeout.ms", "1000"), ("a", "b=c")]


def test_metadata_parser_and_alternating_runs() -> None:
    from minibroker.deploy import bench_failover

    parser = _bench_parser()
    args = parser.parse_args(["metadata"])
    assert args.controllers == (1, 3) and args.topics == 200 and args.concurrency == 8
    assert args.runs == 1 and args.replication_factor == 3 and args.partitions == 1
    args = parser.parse_args(["metadata", "--controllers", "3, 1,3", "--runs", "2"])
    assert args.controllers == (3, 1)
    assert bench_failover.alternate(args.controllers, args.runs) == [3, 1, 3, 1]
    for bad in ("2", "1,x", ""):
        with pytest.raises(SystemExit):
            parser.parse_args(["metadata", "--controllers", bad])


def test_percentile_is_nearest_rank_and_summary_skips_unobserved() -> None:
    from minibroker.deploy.bench_failover import percentile, summarize

    values = [float(v) for v in range(1, 11)]  # 1 .. 10
    assert percentile(values, 0.5) == 5.0
    assert percentile(values, 0.99) == 10.0
    assert percentile(values, 0.0) == 1.0
    assert percentile(list(range(1, 101)), 0.99) == 99
    with pytest.raises(ValueError):
        percentile([], 0.5)
    summary = summarize([3.0, None, 1.0, 2.0, 10.0])
    assert summary is not None
    assert (summary.n, summary.median, summary.minimum, summary.maximum) == (4, 2.5, 1.0, 10.0)
    assert summary.p99 == 10.0
    assert summary.fields() == {
        "n": 4,
        "median_ms": 2.5,
        "min_ms": 1.0,
        "max_ms": 10.0,
        "p99_ms": 10.0,
    }
    assert summary.text() == "median 2 ms, min 1 ms, max 10 ms (n=4)"
    assert summarize([None, None]) is None and summarize([]) is None


def _answer(node: int, role: str, leader: int, epoch: int, **extra: Any) -> Any:
    from minibroker.deploy.quorum import QuorumAnswer

    return QuorumAnswer(node_id=node, role=role, leader_id=leader, leader_epoch=epoch, **extra)


def test_new_leader_named_needs_another_voter_in_a_later_epoch() -> None:
    from minibroker.deploy.bench_failover import new_leader_named

    old, epoch = 1000, 4
    # A follower still naming the killed leader, one that knows none, no answer at all.
    assert new_leader_named([_answer(1001, "follower", old, 4), None], old, epoch) is None
    assert new_leader_named([_answer(1001, "prospective", -1, 4)], old, epoch) is None
    # A stale answer naming another voter in the old epoch does not count.
    assert new_leader_named([_answer(1001, "follower", 1002, 4)], old, epoch) is None
    answers = [_answer(1001, "follower", 1002, 5), _answer(1002, "leader", 1002, 6)]
    assert new_leader_named(answers, old, epoch) == (1002, 6)


def test_leader_of_and_follows() -> None:
    from minibroker.deploy.bench_failover import follows, leader_of

    leader = _answer(1001, "leader", 1001, 7, high_watermark=40, log_end_offset=41)
    stale = _answer(1000, "leader", 1000, 6)
    assert leader_of([stale, None, leader]) is leader
    assert leader_of([_answer(1002, "follower", 1001, 7), None]) is None
    caught_up = _answer(1000, "follower", 1001, 7, log_end_offset=40)
    behind = _answer(1000, "follower", 1001, 7, log_end_offset=39)
    old_epoch = _answer(1000, "follower", 1001, 6, log_end_offset=40)
    assert follows(caught_up, leader)
    assert not follows(behind, leader) and not follows(old_epoch, leader)
    assert not follows(None, leader) and not follows(caught_up, None)
    assert not follows(_answer(1000, "unattached", 1001, 7, log_end_offset=40), leader)


def _log_line(at: str, event: str, **fields: Any) -> str:
    return json.dumps({"event": event, "timestamp": at, "level": "info", **fields}) + "\n"


def test_log_times_reads_the_new_leaders_events_after_the_signal() -> None:
    import datetime

    from minibroker.deploy.bench_failover import log_times

    t0 = datetime.datetime(2025, 1, 2, 3, 4, 5, tzinfo=datetime.UTC).timestamp()
    lines = [
        _log_line("2025-01-02T03:04:04.000000Z", "controller_activated", epoch=1),  # before
        _log_line("2025-01-02T03:04:04.500000Z", "broker_unfenced", broker=1),  # before
        "Traceback (most recent call last):\n",
        "{not json\n",
        _log_line("2025-01-02T03:04:07.100000Z", "quorum_role_changed", role="leader"),
        _log_line("2025-01-02T03:04:07.150000Z", "controller_activated", epoch=2),
        _log_line("2025-01-02T03:04:07.200000Z", "topic_created", topic="other"),
        _log_line("2025-01-02T03:04:07.250000Z", "isr_shrink", topic="t"),
        _log_line("2025-01-02T03:04:07.300000Z", "topic_created", topic="mine"),
        _log_line("2025-01-02T03:04:07.400000Z", "controller_activated", epoch=3),
        _log_line("2025-01-02T03:04:09.000000Z", "broker_registered", broker=2),
    ]
    times = log_times(lines, t0, "mine")
    assert times.activated_ms == pytest.approx(2150.0)
    assert times.topic_created_ms == pytest.approx(2300.0)
    assert times.broker_change_ms == pytest.approx(2250.0)
    assert times.broker_change == "isr_shrink"
    bounded = log_times(lines, t0, "nothing", until_wall_s=t0 + 2.2)
    assert bounded.activated_ms == pytest.approx(2150.0)
    assert bounded.topic_created_ms is None and bounded.broker_change_ms is None
    assert bounded.broker_change == ""


def test_metric_value_reads_an_unlabelled_sample() -> None:
    from minibroker.deploy.bench_failover import COMMIT_LATENCY_METRIC, metric_value

    text = (
        f"# HELP {COMMIT_LATENCY_METRIC} ms from a leader's append to its commit\n"
        f"# TYPE {COMMIT_LATENCY_METRIC} gauge\n"
        f"{COMMIT_LATENCY_METRIC}_max 12.5\n"
        f"{COMMIT_LATENCY_METRIC} 3.25\n"
    )
    assert metric_value(text, COMMIT_LATENCY_METRIC) == 3.25
    assert metric_value(text, COMMIT_LATENCY_METRIC + "_max") == 12.5
    assert metric_value(text, "absent") is None
    assert metric_value(f"{COMMIT_LATENCY_METRIC} NaN-ish\n", COMMIT_LATENCY_METRIC) is None


def test_metadata_phase_and_summary_take_medians_over_runs() -> None:
    from minibroker.deploy.bench_failover import Phase, metadata_summary

    phase = Phase(callers=2, elapsed_s=0.5, latencies_ms=[4.0, 2.0, 6.0, 8.0])
    assert phase.fields() == {
        "callers": 2,
        "topics": 4,
        "topics_per_s": 8.0,
        "median_ms": 5.0,
        "p99_ms": 8.0,
        "max_ms": 8.0,
    }
    assert Phase(callers=1).fields() == {"callers": 1, "topics": 0, "topics_per_s": 0.0}

    def run(size: int, rate: float, commit: float | None) -> dict[str, Any]:
        row = {"callers": 1, "topics_per_s": rate, "median_ms": 1000 / rate, "p99_ms": 2.0}
        return {"controllers": size, "phases": [row], "commit_latency_avg_ms": commit}

    runs = [run(1, 100.0, 0.1), run(3, 50.0, 9.0), run(1, 200.0, None), run(3, 40.0, 7.0)]
    runs.append(run(1, 300.0, 0.3))
    summary = metadata_summary(runs)
    assert summary == [
        {
            "controllers": 1,
            "callers": 1,
            "runs": 3,
            "topics_per_s": 200.0,
            "median_ms": 5.0,
            "p99_ms": 2.0,
        },
        {"controllers": 1, "commit_latency_avg_ms": 0.2, "runs": 2},
        {
            "controllers": 3,
            "callers": 1,
            "runs": 2,
            "topics_per_s": 45.0,
            "median_ms": 22.5,
            "p99_ms": 2.0,
        },
        {"controllers": 3, "commit_latency_avg_ms": 8.0, "runs": 2},
    ]


def test_failover_refuses_a_quorum_of_one_before_starting_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = _bench_parser()
    args = parser.parse_args(["failover", "--target", "controller", "--controllers", "1"])
    assert args.func(args) == 1
    assert "controllers 3 or 5" in capsys.readouterr().err
    args = parser.parse_args(["metadata", "--topics", "0"])
    assert args.func(args) == 1
    assert "--topics" in capsys.readouterr().err
