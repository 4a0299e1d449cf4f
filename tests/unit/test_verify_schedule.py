"""`minibroker verify`'s seeded nemesis schedule and report text (deploy/verify_schedule.py,
deploy/verify_report.py)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from minibroker.deploy.verify_report import chart, fault_table
from minibroker.deploy.verify_schedule import (
    FAULT_KINDS,
    PARTITION_VARIANTS,
    Schedule,
    Timing,
    parse_duration,
    parse_kinds,
)


def test_the_same_seed_gives_the_same_schedule() -> None:
    assert Schedule(7, FAULT_KINDS).take(50) == Schedule(7, FAULT_KINDS).take(50)
    assert Schedule(7, FAULT_KINDS).take(50) != Schedule(8, FAULT_KINDS).take(50)


def test_every_kind_comes_once_per_cycle_and_partitions_cycle_through_their_variants() -> None:
    faults = Schedule(3, FAULT_KINDS).take(20)
    for start in range(0, 20, len(FAULT_KINDS)):
        cycle = faults[start : start + len(FAULT_KINDS)]
        assert sorted(f.kind for f in cycle) == sorted(FAULT_KINDS)
    variants = [f.variant for f in faults if f.kind == "partition"]
    assert sorted(variants) == sorted(PARTITION_VARIANTS)
    assert [f.round for f in faults] == list(range(1, 21))


def test_holds_outlast_the_cluster_timeouts_they_are_meant_to_trip() -> None:
    timing = Timing(lag_s=1.5, session_s=2.5)
    faults = Schedule(11, FAULT_KINDS, timing).take(200)
    for f in faults:
        if f.kind == "pause":
            assert f.hold_s > timing.lag_s
        if f.kind == "partition":
            assert f.hold_s > timing.session_s
        if f.kind == "disk":
            assert f.hold_s == 0.0 and f.variant == "one"
    two = Counter(f.variant for f in faults if f.kind in ("kill", "pause"))
    assert two["two"] > 0 and two["one"] > two["two"]


def test_only_the_chosen_kinds_are_scheduled() -> None:
    faults = Schedule(1, ("kill", "disk")).take(10)
    assert {f.kind for f in faults} == {"kill", "disk"}
    with pytest.raises(ValueError):
        Schedule(1, ())


def test_parse_kinds_and_durations() -> None:
    assert parse_kinds("all") == FAULT_KINDS
    assert parse_kinds("kill, pause,kill") == ("kill", "pause")
    with pytest.raises(ValueError, match="unknown fault kind"):
        parse_kinds("kill,flood")
    assert parse_duration("60s") == 60.0
    assert parse_duration("10m") == 600.0
    assert parse_duration("500ms") == 0.5
    assert parse_duration("90") == 90.0
    for bad in ("", "ten", "0s", "-5s"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_chart_marks_each_fault_where_it_started_and_while_it_lasted() -> None:
    lines = chart([10.0] * 10, 10.0, [(2.0, 4.0, "kill"), (7.0, 7.5, "partition")], height=2)
    bars, marks = lines[0], lines[2]
    assert bars.endswith("│" + "█" * 10)
    assert marks.endswith("└  K──  N  ")
    assert "K kill" in lines[-1] and "N partition" in lines[-1]


def test_fault_table_lists_every_chosen_kind() -> None:
    table = {"kill": {"count": 2, "recovered": 2, "median_s": 1.0, "p95_s": 2.0, "max_s": 2.0}}
    lines = fault_table(table, ("kill", "disk"))
    assert "1.00s" in lines[1] and lines[2].split()[:2] == ["disk", "0"]


def _line(event: str, at: str, **fields: object) -> str:
    return json.dumps({"event": event, "timestamp": at, **fields})


def test_isr_timeline_reads_committed_changes_once_per_partition_epoch() -> None:
    from minibroker.deploy.verify import first_event_at, isr_timeline

    t1, t2, t3 = "2026-01-01T00:00:01+00:00", "2026-01-01T00:00:02+00:00", "2026-01-01T00:00:03Z"
    common = {"topic": "v", "partition": 0}
    lines = [
        "not json",
        _line("isr_shrink", t2, new_isr=[1], partition_epoch=3, **common),
        # Another controller logged the same change later: the earliest line counts.
        _line("isr_shrink", t3, new_isr=[1], partition_epoch=3, **common),
        _line("leader_elected", t1, isr=[1, 2], partition_epoch=2, **common),
        _line("isr_expand", t3, new_isr=[1, 2, 3], partition_epoch=4, **common),
        _line("isr_shrink", t1, new_isr=[9], partition_epoch=3, topic="other", partition=0),
        _line("log_dir_offline", t2, broker_id=2),
        _line("log_dir_offline", t3, broker_id=3),
    ]
    timeline = isr_timeline(lines, ["v"])
    base = 1767225600.0
    assert timeline == {
        "v-0": [(base + 1, 2, (1, 2)), (base + 2, 3, (1,)), (base + 3, 4, (1, 2, 3))]
    }
    assert first_event_at(lines, "log_dir_offline", base, broker_id=3) == base + 3
    assert first_event_at(lines, "log_dir_offline", base + 2.5, broker_id=2) is None
