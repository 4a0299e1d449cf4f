"""`bench reassign`'s pure parts (deploy/bench_reassign.py): argument parsing, sizes, the
throttle configs, metrics parsing, medians and ratios, the table. No sockets."""

from __future__ import annotations

import argparse
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minibroker.client.replication_throttle import parse_throttled_replicas
from minibroker.deploy import bench_reassign as br

MB = 1024 * 1024


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    br.register(parser.add_subparsers())
    return parser


def test_defaults() -> None:
    args = _parser().parse_args(["reassign"])
    assert args.size == 1024 * MB and args.runs == 3 and args.throttle == 50 * MB
    assert args.replication_factor == 1 and args.brokers is None and not args.json
    assert args.window == 10.0 and args.record_size == 1024 and args.throughput == -1
    assert args.settings == [] and args.func is br.main
    assert br.brokers_for(args) == 2


def test_options_parse() -> None:
    args = _parser().parse_args(
        [
            "reassign",
            "--size",
            "256MiB",
            "--runs",
            "5",
            "--throttle",
            "10485760",
            "--brokers",
            "5",
            "--replication-factor",
            "2",
            "--json",
            "--set",
            "a.b = 1",
        ]
    )
    assert args.size == 256 * MB and args.runs == 5 and args.throttle == 10 * MB
    assert args.json and args.settings == [("a.b", "1")]
    assert br.brokers_for(args) == 5


@pytest.mark.parametrize(
    "bad",
    [
        ["--size", "lots"],
        ["--size", "0"],
        ["--size", "-1G"],
        ["--throttle", "0"],
        ["--throttle", "5 parsecs"],
        ["--set", "novalue"],
        ["--runs", "x"],
    ],
)
def test_bad_options_exit(bad: list[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["reassign", *bad])


def test_brokers_for_refuses_what_cannot_make_a_bench() -> None:
    parser = _parser()
    assert br.brokers_for(parser.parse_args(["reassign", "--replication-factor", "2"])) == 4
    cases = [
        (["--replication-factor", "2", "--brokers", "3"], "4 brokers"),
        (["--replication-factor", "0"], "--replication-factor"),
        (["--runs", "0"], "--runs"),
        (["--window", "0"], "--window"),
        (["--move-timeout", "-1"], "--move-timeout"),
        (["--record-size", "0"], "--record-size"),
        (["--size", "1MiB", "--record-size", "31745"], "--record-size must be 1 to 31744"),
    ]
    for argv, message in cases:
        with pytest.raises(ValueError, match=message):
            br.brokers_for(parser.parse_args(["reassign", *argv]))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1GiB", 1024 * MB),
        ("1G", 1024 * MB),
        ("1gb", 1024 * MB),
        ("256MiB", 256 * MB),
        ("256M", 256 * MB),
        ("4MB", 4 * MB),
        ("512k", 512 * 1024),
        ("512KiB", 512 * 1024),
        ("1048576", 1048576),
        ("100B", 100),
        ("1.5G", 1536 * MB),
        (" 2 MiB ", 2 * MB),
        ("1T", 1024 * 1024 * MB),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert br.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "G", "1 X", "1GiBs", "-4M", "0", "0.1B", "1,5G", "1iB"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        br.parse_size(text)


@given(st.integers(min_value=1, max_value=2**40))
def test_parse_size_round_trips_plain_bytes(n: int) -> None:
    assert br.parse_size(str(n)) == n
    assert br.parse_size(f"{n}K") == n * 1024


def test_format_size() -> None:
    assert br.format_size(1024 * MB) == "1 GiB"
    assert br.format_size(256 * MB) == "256 MiB"
    assert br.format_size(1536) == "1.5 KiB"
    assert br.format_size(100) == "100 B"


def test_segment_bytes_stay_within_bounds() -> None:
    assert br.segment_bytes_for(1024 * MB) == 64 * MB
    assert br.segment_bytes_for(4096 * MB) == 64 * MB
    assert br.segment_bytes_for(256 * MB) == 16 * MB
    assert br.segment_bytes_for(4 * MB) == 256 * 1024
    assert br.segment_bytes_for(100) == 64 * 1024


def test_batches_fit_in_half_a_segment() -> None:
    assert br.batch_bytes_for(1024 * MB, MB) == MB
    assert br.batch_bytes_for(1024 * MB, 256 * 1024) == 256 * 1024
    assert br.batch_bytes_for(4 * MB, MB) == 128 * 1024
    assert br.batch_bytes_for(100, MB) == 32 * 1024


def test_move_target_replaces_every_replica() -> None:
    assert br.move_target([1], [1, 2]) == (2,)
    assert br.move_target([2], [1, 2]) == (1,)
    assert br.move_target([3, 1], [4, 3, 2, 1]) == (2, 4)
    assert br.move_target([1, 2], [1, 2, 3, 4, 5]) == (3, 4)
    with pytest.raises(ValueError, match="no 2 brokers"):
        br.move_target([1, 2], [1, 2, 3])


@given(
    st.lists(st.integers(0, 20), min_size=2, max_size=12, unique=True),
    st.integers(1, 6),
)
def test_move_target_is_disjoint_and_keeps_the_replica_count(brokers: list[int], rf: int) -> None:
    current = brokers[:rf]
    if len(brokers) < 2 * len(current):
        with pytest.raises(ValueError):
            br.move_target(current, brokers)
        return
    target = br.move_target(current, brokers)
    assert len(target) == len(current) == len(set(target))
    assert not set(target) & set(current) and set(target) <= set(brokers)


def test_throttle_configs_are_kafka_reassign_partitions_shapes() -> None:
    configs = br.throttle_configs("t", 0, [1, 2], [3, 2], 1000)
    assert set(configs) == {("broker", "1"), ("broker", "2"), ("broker", "3"), ("topic", "t")}
    for broker in ("1", "2", "3"):
        assert configs[("broker", broker)] == {
            "leader.replication.throttled.rate": "1000",
            "follower.replication.throttled.rate": "1000",
        }
    topic = configs[("topic", "t")]
    # Kafka: leader throttle on the current replicas, follower throttle on the moving ones.
    assert topic["leader.replication.throttled.replicas"] == "0:1,0:2"
    assert topic["follower.replication.throttled.replicas"] == "0:3"
    # The values parse with the shared KIP-73 parser.
    assert (0, 3) in parse_throttled_replicas(topic["follower.replication.throttled.replicas"])
    assert (0, 2) not in parse_throttled_replicas(topic["follower.replication.throttled.replicas"])


METRICS = """\
# HELP kafka_server_leader_replication_byte_rate bytes/s sent to throttled replicas
# TYPE kafka_server_leader_replication_byte_rate gauge
kafka_server_leader_replication_byte_rate 5.24288e+07
kafka_server_follower_replication_byte_rate{topic="a"} 100.0
kafka_server_follower_replication_byte_rate{topic="b",partition="0"} 50.5
kafka_server_BrokerTopicMetrics_ReplicationBytesInPerSec_total 1234.0
kafka_server_BrokerTopicMetrics_ReplicationBytesInPerSec_created 1.7e9
kafka_server_leader_replication_byte_rate_extra 7
broken_line NaNish
"""


def test_metric_total_sums_labelled_samples_and_matches_whole_names() -> None:
    assert br.metric_total(METRICS, br.LEADER_BYTE_RATE) == 52428800.0
    assert br.metric_total(METRICS, br.FOLLOWER_BYTE_RATE) == 150.5
    assert br.metric_total(METRICS, br.REPLICATION_BYTES_IN) == 1234.0
    assert br.metric_total(METRICS, "absent") is None
    assert br.metric_total(METRICS, "broken_line") is None
    assert br.metric_total("", br.LEADER_BYTE_RATE) is None


def test_ratio_rate_and_medians() -> None:
    assert br.ratio(50.0, 100.0) == 0.5
    assert br.ratio(None, 100.0) is None and br.ratio(5.0, None) is None
    assert br.ratio(5.0, 0.0) is None
    assert br.rate(10, 4.0) == 2.5 and br.rate(10, 0.0) == 0.0
    assert br.median_of([3, None, 1, "x", True, 2.0]) == 2.0
    assert br.median_of([4, 1]) == 2.5
    assert br.median_of([None]) is None
    assert br.nonzero_median([0.0, None, 10.0, 30.0, 0.0, 20.0]) == 20.0
    assert br.nonzero_median([0.0, None]) is None


def test_throughput_between_snapshots() -> None:
    start = br.Snapshot(10.0, 100, 100 * 1024, 0)
    end = br.Snapshot(12.0, 2148, 2148 * 1024, 1)
    out = br.throughput(start, end)
    assert out == {
        "elapsed_s": 2.0,
        "records": 2048,
        "records_per_sec": 1024.0,
        "mb_per_sec": 1.0,
        "failed": 1,
    }


def _run(n: int, idle: float, move: float, tmove: float, completed: bool = True) -> dict:
    return {
        "run": n,
        "idle": {"records_per_sec": idle, "mb_per_sec": idle / 1024},
        "move": {
            "records_per_sec": move,
            "mb_per_sec": move / 1024,
            "ratio": move / idle,
            "move_s": 10.0 * n,
            "moved_bytes": 1024 * MB,
            "move_mb_per_sec": 1024 / (10.0 * n),
            "completed": True,
        },
        "throttled_move": {
            "records_per_sec": tmove,
            "mb_per_sec": tmove / 1024,
            "ratio": tmove / idle,
            "move_s": 30.0,
            "moved_bytes": None,
            "move_mb_per_sec": None,
            "leader_byte_rate_mb_per_sec": 49.0 + n,
            "follower_byte_rate_mb_per_sec": None,
            "completed": completed,
        },
    }


def test_summarize_runs_takes_medians_per_phase() -> None:
    runs = [_run(1, 1000, 500, 900), _run(2, 3000, 600, 2700, False), _run(3, 2000, 400, 1900)]
    summary = br.summarize_runs(runs)
    assert summary["idle"] == {"runs": 3, "records_per_sec": 2000.0, "mb_per_sec": 1.9531}
    move = summary["move"]
    assert move["records_per_sec"] == 500.0 and move["move_s"] == 20.0
    assert move["ratio"] == 0.2  # the median of the ratios (0.5, 0.2, 0.2), not 500 / 2000
    assert move["completed"] == 3 and move["moved_bytes"] == 1024 * MB
    t = summary["throttled_move"]
    assert t["completed"] == 2 and t["leader_byte_rate_mb_per_sec"] == 51.0
    assert t["moved_bytes"] is None and t["follower_byte_rate_mb_per_sec"] is None
    assert t["ratio"] == 0.9
    assert br.summarize_runs([]) == {}


def _result(runs: list[dict]) -> dict:
    return {
        "size_bytes": 1024 * MB,
        "replication_factor": 1,
        "brokers": 2,
        "record_size": 1024,
        "throttle_bytes_per_s": 50 * MB,
        "runs_requested": len(runs),
        "fill": {"bytes": 1024 * MB, "elapsed_s": 8.0, "mb_per_sec": 128.0, "record_size": 32768},
        "runs": runs,
        "summary": br.summarize_runs(runs),
        "load_average": [1.0, 2.0, 3.0],
    }


def test_format_table() -> None:
    result = _result([_run(1, 2000, 1000, 1800), _run(2, 2000, 1000, 1800)])
    lines = br.format_table(result)
    assert lines[0].startswith("reassign: 1 partition of 1 GiB, RF 1, 2 brokers")
    assert "medians over 2 run(s)" in lines[0]
    assert lines[1].split() == [
        "phase",
        "move",
        "s",
        "moved",
        "MB",
        "move",
        "MB/s",
        "records/s",
        "MB/s",
        "ratio",
        "done",
    ]
    idle, move, throttled = lines[2:5]
    assert idle.split() == ["nothing", "moving", "-", "-", "-", "2000", "1.95", "1.00", "-"]
    assert move.split() == [
        "move,", "no", "throttle", "15.0", "1024.0", "76.8", "1000", "0.98", "0.50", "2/2"
    ]  # fmt: skip
    assert throttled.split()[:4] == ["move,", "throttle", "50", "MB/s"]
    assert throttled.split()[4:] == ["30.0", "-", "-", "1800", "1.76", "0.90", "2/2"]
    assert "leader 50.5 MB/s, follower - MB/s (throttle 50 MB/s)" in lines[5]
    assert lines[6].startswith("  (moved MB: what the new replicas fetched")
    assert lines[7] == "  fill: 1 GiB in 8.0 s (128.0 MB/s, acks=all, 32768 B records)"
    assert lines[-1] == "  load average 1.00 2.00 3.00"
    json.dumps(result)  # the --json output


def test_main_reports_bad_arguments_without_a_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["reassign", "--replication-factor", "3", "--brokers", "4"])
    assert br.main(args) == 1
    assert "6 brokers" in capsys.readouterr().err
