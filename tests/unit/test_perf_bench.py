"""The bench tools' pure parts: e2e latency summary and argument parsing (no sockets)."""

from __future__ import annotations

import argparse
import gc
import re

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
