"""`minibroker verify`'s checker on hand-made histories: each violation it must report, and a
clean history it must pass (deploy/verify_checker.py)."""

from __future__ import annotations

import dataclasses

import pytest

from minibroker.deploy.verify_checker import (
    Fault,
    History,
    Read,
    Write,
    check,
    isr_size_max,
    percentile,
    recovery,
    recovery_table,
    throughput,
)

TP = "t-0"


def clean() -> History:
    """Three acknowledged writes, one failed write that is not stored, a consumer that read
    everything below the HW, identical replicas, a full ISR."""
    writes = [
        Write("a", TP, sent=10.0, acked=10.1, offset=0),
        Write("b", TP, sent=10.2, acked=10.3, offset=1),
        Write("c", TP, sent=10.4, acked=10.5, offset=2),
        Write("x", TP, sent=10.6, error="NotEnoughReplicasError"),
    ]
    reads = [
        Read("c0", TP, 0, "a", at=10.2, hw=1, restart=True),
        Read("c0", TP, 1, "b", at=10.4, hw=2),
        Read("c0", TP, 2, "c", at=10.6, hw=3),
    ]
    return History(
        writes=writes,
        reads=reads,
        final={TP: [(0, "a"), (1, "b"), (2, "c")]},
        final_hw={TP: 3},
        replicas={TP: {1: "d1", 2: "d1", 3: "d1"}},
        isr={TP: [(0.0, (1, 2, 3))]},
        min_insync=2,
    )


def kinds(history: History) -> list[str]:
    return [v.kind for v in check(history).violations]


def test_a_clean_history_passes_with_its_totals() -> None:
    verdict = check(clean())
    assert verdict.ok, verdict.violations
    assert (verdict.acked, verdict.failed, verdict.read, verdict.final_records) == (3, 1, 3, 3)
    assert (verdict.lost, verdict.duplicated, verdict.indeterminate_stored) == (0, 0, 0)


def test_a_lost_write_is_reported() -> None:
    h = clean()
    h.final[TP] = [(0, "a"), (1, "b")]
    h.final_hw[TP] = 2
    h.reads = h.reads[:2]
    verdict = check(h)
    assert [v.kind for v in verdict.violations] == ["lost"]
    assert verdict.lost == 1
    assert "'c'" in verdict.violations[0].text() and "t-0@2" in verdict.violations[0].text()


def test_a_write_stored_at_another_offset_than_acknowledged_is_reported() -> None:
    h = clean()
    h.writes[2] = dataclasses.replace(h.writes[2], offset=1)
    assert "moved" in kinds(h)


def test_a_duplicate_in_the_log_is_reported() -> None:
    h = clean()
    h.final[TP] = [(0, "a"), (1, "b"), (2, "c"), (3, "b")]
    h.final_hw[TP] = 4
    verdict = check(h)
    assert [v.kind for v in verdict.violations] == ["duplicate"]
    assert verdict.duplicated == 1


def test_a_failed_write_stored_once_is_not_a_violation_but_is_counted() -> None:
    h = clean()
    h.final[TP].append((3, "x"))
    h.final_hw[TP] = 4
    verdict = check(h)
    assert verdict.ok and verdict.indeterminate_stored == 1


def test_an_offset_gap_in_the_final_log_is_reported() -> None:
    h = clean()
    h.final[TP] = [(0, "a"), (1, "b"), (3, "c")]
    h.final_hw[TP] = 4
    h.writes[2] = dataclasses.replace(h.writes[2], offset=3)
    h.reads = h.reads[:2]
    assert kinds(h) == ["gap"]


def test_a_final_read_that_stops_short_of_the_hw_is_a_gap() -> None:
    h = clean()
    h.final_hw[TP] = 5
    assert kinds(h) == ["gap"]


def test_a_consumer_that_skips_or_repeats_an_offset_is_reported() -> None:
    h = clean()
    h.reads = [h.reads[0], h.reads[2]]
    assert kinds(h) == ["gap"]
    h = clean()
    h.reads = [h.reads[0], h.reads[1], h.reads[1], h.reads[2]]
    assert "read_order" in kinds(h)


def test_a_consumer_restarting_at_an_offset_is_not_a_gap() -> None:
    h = clean()
    h.reads = [h.reads[0], dataclasses.replace(h.reads[2], restart=True)]
    assert kinds(h) == []


def test_a_read_above_the_hw_the_consumer_was_told_is_reported() -> None:
    h = clean()
    h.reads[2] = dataclasses.replace(h.reads[2], hw=2)
    assert kinds(h) == ["read_above_hw"]


def test_a_read_of_a_record_later_truncated_away_is_reported() -> None:
    h = clean()
    # The consumer saw "z" at offset 2, which the final log holds "c" at: it was read from a
    # leader's tail that was never committed (above the HW), even though the HW it was told
    # (a stale leader's) said otherwise.
    h.reads[2] = dataclasses.replace(h.reads[2], value="z")
    assert kinds(h) == ["read_lost"]
    h = clean()
    h.reads.append(Read("c0", TP, 3, "y", at=11.0, hw=4))
    assert kinds(h) == ["read_lost"]


def test_a_consumer_given_one_value_at_two_offsets_is_a_duplicate() -> None:
    h = clean()
    h.reads.append(Read("c0", TP, 3, "a", at=11.0, hw=4, restart=True))
    h.final[TP].append((3, "q"))
    h.final_hw[TP] = 4
    got = kinds(h)
    assert "duplicate" in got


def test_two_acks_at_one_offset_are_reported() -> None:
    h = clean()
    h.writes.append(Write("d", TP, sent=10.7, acked=10.8, offset=2))
    got = kinds(h)
    assert "acked_twice" in got and "lost" in got


def test_replicas_that_differ_below_the_hw_are_reported() -> None:
    h = clean()
    h.replicas[TP][3] = "d2"
    assert kinds(h) == ["replica_divergence"]


def test_an_ack_while_the_isr_was_below_min_insync_is_reported() -> None:
    h = clean()
    # The ISR shrank to the leader alone before "c" was sent and grew back only later.
    h.isr[TP] = [(0.0, (1, 2, 3)), (10.35, (1,)), (20.0, (1, 2, 3))]
    violations = check(h, isr_grace_s=1.0).violations
    assert [(v.kind, v.offset) for v in violations] == [("ack_under_min_isr", 2)]


def test_an_ack_whose_isr_grew_back_within_the_grace_is_not_reported() -> None:
    h = clean()
    h.isr[TP] = [(0.0, (1, 2, 3)), (10.35, (1,)), (10.9, (1, 2))]
    assert check(h, isr_grace_s=1.0).ok


def test_isr_size_max_over_a_window() -> None:
    timeline = [(0.0, (1, 2, 3)), (5.0, (1,)), (8.0, (1, 2))]
    assert isr_size_max(timeline, 1.0, 2.0) == 3
    assert isr_size_max(timeline, 4.0, 6.0) == 3  # the shrink happened inside the window
    assert isr_size_max(timeline, 6.0, 7.0) == 1
    assert isr_size_max(timeline, 6.0, 8.0) == 2
    assert isr_size_max([], 0.0, 1.0) is None
    assert isr_size_max([(5.0, (1,))], 0.0, 1.0) is None  # nothing known yet


def test_recovery_is_the_first_ack_of_a_write_sent_after_the_fault_on_an_affected_partition() -> (
    None
):
    h = clean()
    h.writes += [
        Write("e", "t-1", sent=12.0, acked=12.1, offset=0),  # another partition: not counted
        Write("f", TP, sent=11.9, acked=12.2, offset=3),  # sent before the fault
        Write("g", TP, sent=12.5, acked=13.5, offset=4),
        Write("h", TP, sent=12.6, acked=13.4, offset=5),
    ]
    h.faults = [
        Fault("kill", "broker 1", started=12.0, ended=12.5, partitions=(TP,)),
        Fault("controller", "controller-1", started=12.0, ended=12.5),  # every partition
        Fault("pause", "broker 2", started=20.0, ended=21.0, partitions=(TP,)),
    ]
    assert recovery(h) == [pytest.approx(1.4), pytest.approx(0.1), None]
    table = recovery_table(h)
    assert table["kill"] == {
        "count": 1,
        "recovered": 1,
        "median_s": 1.4,
        "p95_s": 1.4,
        "max_s": 1.4,
    }
    assert table["pause"]["recovered"] == 0 and table["pause"]["median_s"] is None


def test_percentile_is_nearest_rank() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert percentile([float(i) for i in range(1, 21)], 0.95) == 19.0
    assert percentile([5.0], 0.95) == 5.0


def test_throughput_counts_acks_per_second_per_bucket() -> None:
    writes = [Write(str(i), TP, sent=0.0, acked=0.5 + i * 0.1, offset=i) for i in range(10)]
    writes.append(Write("no", TP, sent=0.0, error="x"))
    assert throughput(writes, 0.0, 2.0, 2) == [5.0, 5.0]
