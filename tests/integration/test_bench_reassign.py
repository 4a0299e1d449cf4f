"""`bench reassign` end to end on its own tiny cluster: a 4 MiB partition moved there and back
(unthrottled, then throttled), every figure present. It measures nothing: no figure is compared
with a goal, only checked to exist and to be consistent (the move went where it was sent)."""

from __future__ import annotations

import argparse
import json

import pytest

from minibroker.deploy import bench_reassign

pytestmark = pytest.mark.integration


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_reassign.register(parser.add_subparsers())
    return parser.parse_args(["reassign", *argv])


def test_reassign_bench_moves_a_tiny_partition_there_and_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A producer capped at ~0.5 MB/s and a 4 MiB/s throttle: the throttled move can finish even
    # while the producer runs; one run, a 1 s idle window.
    args = _args(
        "--size",
        "4MiB",
        "--runs",
        "1",
        "--window",
        "1",
        "--throttle",
        "4MiB",
        "--throughput",
        "500",
        "--move-timeout",
        "120",
        "--json",
    )
    assert args.func(args) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["bench"] == "reassign" and result["brokers"] == 2, result
    assert result["fill"]["bytes"] >= 4 * 1024 * 1024, result["fill"]
    (run,) = result["runs"]
    assert run["idle"]["records_per_sec"] > 0, run
    move, throttled = run["move"], run["throttled_move"]
    assert move["completed"] and throttled["completed"], run
    # There and back: every replica replaced each time.
    assert move["to"] != move["from"] and throttled["from"] == move["to"], run
    assert throttled["to"] == move["from"], run
    for m in (move, throttled):
        # A 4 MiB move may take a tenth of a second: no acknowledgement need fall inside it.
        assert m["move_s"] > 0 and m["records_per_sec"] >= 0 and m["ratio"] is not None, m
        assert m["moved_bytes"] is not None and m["moved_bytes"] > 0, m
    assert throttled["throttle_bytes_per_s"] == 4 * 1024 * 1024
    assert "leader_byte_rate_samples" in throttled, throttled
    assert set(result["summary"]) == {"idle", "move", "throttled_move"}, result["summary"]
    assert result["producer_failed_records"] == 0, result
    assert "run 1: throttled move" in captured.err


def test_reassign_bench_text_table(capsys: pytest.CaptureFixture[str]) -> None:
    args = _args(
        "--size", "1MiB", "--runs", "1", "--window", "0.5", "--throttle", "8MiB",
        "--throughput", "200", "--move-timeout", "120",
    )  # fmt: skip
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "reassign: 1 partition of 1 MiB, RF 1, 2 brokers" in out, out
    assert "nothing moving" in out and "move, no throttle" in out, out
    assert "move, throttle 8 MB/s" in out and "throttled rate measured by the brokers" in out, out
