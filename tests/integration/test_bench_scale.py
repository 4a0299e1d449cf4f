"""`bench scale` end to end on its own tiny cluster: 3 brokers, 6 partitions of RF 2, a 1 s idle
window. It measures nothing: no figure is compared with a goal, only checked to exist, to be
positive and to be consistent (the killed broker led partitions, every phase completed)."""

from __future__ import annotations

import argparse
import json

import pytest

from minibroker.deploy import bench_scale

pytestmark = pytest.mark.integration


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_scale.register(parser.add_subparsers())
    return parser.parse_args(["scale", *argv])


def test_scale_bench_tiny_run(capsys: pytest.CaptureFixture[str]) -> None:
    args = _args(
        "--brokers", "3", "--partitions", "6", "--rf", "2", "--idle-seconds", "1",
        "--records", "600", "--phase-timeout", "60", "--json",
    )  # fmt: skip
    assert args.func(args) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["bench"] == "scale" and result["brokers"] == 3 and result["rf"] == 2, result
    (size,) = result["sizes"]
    assert size["partitions"] == 6 and "error" not in size, size

    def completed(phase: dict[str, object]) -> float:
        assert phase["timed_out"] is False, phase
        s = phase["s"]
        assert isinstance(s, float) and s >= 0, phase
        return s

    assert completed(size["create"]) > 0
    assert size["create"]["progress"] == {"seen": 6, "with_leader": 6, "full_isr": 6}

    idle = size["idle"]
    # The window waits for replication to settle (no partition read for a fetch between two
    # scrapes); a 6-partition cluster settles well within the phase deadline.
    assert 0 <= idle["settled_s"] < 60, idle
    assert set(idle["brokers"]) == {"1", "2", "3"}, idle
    for b in idle["brokers"].values():
        assert b["cpu_pct"] is not None and b["cpu_pct"] >= 0, idle
        assert b["rss_mib"] is not None and 5 < b["rss_mib"] < 4096, idle
    assert idle["broker_cpu_pct_max"] >= idle["broker_cpu_pct_median"] >= 0, idle
    assert idle["broker_rss_mib_max"] >= idle["broker_rss_mib_median"] > 5, idle
    assert idle["controller_cpu_pct"] >= 0 and idle["controller_rss_mib"] > 5, idle
    assert idle["metrics_scraped"] == 3, idle
    assert isinstance(idle["fetch_session_metrics"], dict), idle

    kill = size["kill"]
    completed(kill)
    assert kill["broker"] in (1, 2, 3) and kill["leaderships"] >= 2, kill  # 6 over 3: >= 2
    assert kill["not_moved"] == 0 and kill["first_moved_s"] is not None, kill

    rejoin = size["rejoin"]
    assert completed(rejoin) > 0
    assert rejoin["broker"] == kill["broker"] and rejoin["replicas"] == 4, rejoin  # 12 / 3
    assert rejoin["not_in_isr"] == 0, rejoin

    election = size["election"]
    completed(election)
    assert election["not_preferred"] == 0 and election["call_s"] is not None, election
    # The killed broker's leaderships moved away and nothing moved them back before the call.
    assert election["to_move"] >= 1 and election["elected"] >= 1, election

    produce = size["produce"]
    completed(produce["small_topic_create"])
    for which, partitions, placement in (
        ("all", 6, "round-robin"),
        ("sticky", 6, "sticky"),
        ("three", 3, "round-robin"),
    ):
        p = produce[which]
        assert completed(p) > 0 and p["partitions"] == partitions, p
        assert p["placement"] == placement, p
        assert p["records"] == 600 and p["failed"] == 0 and p["records_per_sec"] > 0, p
        assert 1 <= p["batches"] <= 600, p
        # The brokers' CPU comes from /proc/<pid>/stat in clock ticks (10 ms): a run of 600
        # records may cost them less than a tick each, so 0 is a valid reading there.
        assert p["client_cpu_us_per_batch"] > 0 and p["brokers_cpu_us_per_batch"] >= 0, p
    assert produce["ratio"] is not None and produce["ratio"] > 0, produce
    assert produce["sticky_ratio"] is not None and produce["sticky_ratio"] > 0, produce

    assert size["metadata_poll_ms"] > 0 and size["metadata_polls"] > 0, size
    assert len(size["load_before"]) == 3 and len(size["load_after"]) == 3, size
    assert "[6 partitions] kill:" in captured.err


def test_scale_table_marks_timeouts_and_missing_figures() -> None:
    # The table alone (pure): a creation past its deadline skips the rest; '-' where no figure.
    result = {
        "brokers": 5, "rf": 3, "idle_seconds": 10.0, "records": 100, "record_size": 1024,
        "phase_timeout_s": 120.0,
        "sizes": [{
            "partitions": 10000,
            "create": {"s": None, "timed_out": True, "timeout_s": 120.0,
                       "progress": {"seen": 10000, "with_leader": 9000, "full_isr": 12}},
            "load_before": [1.0, 1.0, 1.0], "load_after": [2.0, 2.0, 2.0],
            "error": "topic creation not complete after 120 s",
        }],
    }  # fmt: skip
    lines = bench_scale.format_table(result)
    row = next(line for line in lines if line.startswith("| 10000 "))
    assert ">120 s (9000 led, 12 full ISR)" in row, row
    assert row.count(" - ") >= 10, row
    assert any("error: topic creation not complete" in line for line in lines), lines
