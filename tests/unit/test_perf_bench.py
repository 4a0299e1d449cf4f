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
