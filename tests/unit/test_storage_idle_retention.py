"""Retention of the active segment (issue 21): when every record of an idle partition has expired
(`retention.ms`) and lies below the HW, the log rolls an empty active segment at the LEO and
deletes the old ones, so the log start reaches the LEO (Kafka's UnifiedLog.deletableSegments and
deleteSegments). An empty active segment is never rolled again, the log start rule never takes the
active segment, and `retention.bytes` takes it only at 0, as in Kafka."""

from __future__ import annotations

import pathlib

import pytest

from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.epoch_cache import EpochEntry
from minibroker.broker.storage.log import PartitionLog
from minibroker.broker.storage.log_deletion import LogDeletion
from minibroker.broker.storage.segment import LogSegment
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition

TP = TopicPartition("idle", 0)
TS = 1_000_000  # the records' timestamps start here


def batch(count: int, ts: int) -> bytes:
    return encode_batch([(ts + i, None, b"value", ()) for i in range(count)])


def open_log(path: pathlib.Path, **config: int) -> PartitionLog:
    return PartitionLog.open(path / "idle-0", TP, LogConfig(**config), now_ms=TS)  # type: ignore[arg-type]


def filled(path: pathlib.Path, records: int = 60, **config: int) -> PartitionLog:
    """`records` records in batches of 10 (one segment unless segment_bytes says otherwise)."""
    log = open_log(path, **config)
    for i in range(0, records, 10):
        log.append_as_leader(batch(10, TS + i), leader_epoch=3, now_ms=TS + i)
    return log


def files(log: PartitionLog) -> list[str]:
    return sorted(p.name for p in log.directory.iterdir() if p.name.endswith(".log"))


def name(offset: int) -> str:
    return f"{offset:020d}.log"


def test_an_expired_active_segment_is_rolled_then_deleted(tmp_path: pathlib.Path) -> None:
    # The case: 60 records, retention.ms=3000, 6 s later.
    log = filled(tmp_path, retention_ms=3_000)
    assert len(log.segments) == 1
    deleted = log.delete_retention(now_ms=TS + 6_000, high_watermark=60)
    assert [(d.base_offset, d.next_offset, d.reason) for d in deleted] == [(0, 60, "retention.ms")]
    assert (log.log_start_offset, log.leo) == (60, 60)
    assert [(s.base_offset, s.size) for s in log.segments] == [(60, 0)]
    assert files(log) == [name(60)]
    assert log.recovery_point == 60
    # Kafka's truncateFromStart: the last epoch is kept, starting at the new log start.
    assert list(log.epoch_cache.entries) == [EpochEntry(3, 60)]
    info = log.append_as_leader(batch(1, TS + 7_000), leader_epoch=3, now_ms=TS + 7_000)
    assert info.first_offset == 60
    assert log.read(60, 1 << 20).first_offset == 60


def test_many_segments_all_expired_all_go(tmp_path: pathlib.Path) -> None:
    log = filled(tmp_path, segment_bytes=400, retention_ms=3_000)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 3
    deleted = log.delete_retention(now_ms=TS + 6_000, high_watermark=60)
    assert [d.base_offset for d in deleted] == bases
    assert [(s.base_offset, s.size) for s in log.segments] == [(60, 0)]
    assert log.log_start_offset == 60 and files(log) == [name(60)]


def test_the_active_segment_stays_while_any_record_in_it_is_not_expired(
    tmp_path: pathlib.Path,
) -> None:
    log = filled(tmp_path, retention_ms=3_000)
    # The newest record (TS + 59) is 3000 ms old, not more: the segment stays.
    assert log.delete_retention(now_ms=TS + 59 + 3_000, high_watermark=60) == []
    assert log.log_start_offset == 0 and files(log) == [name(0)]
    assert log.delete_retention(now_ms=TS + 59 + 3_001, high_watermark=60) != []
    assert log.log_start_offset == 60


def test_the_active_segment_stays_while_the_high_watermark_is_below_the_leo(
    tmp_path: pathlib.Path,
) -> None:
    log = filled(tmp_path, segment_bytes=400, retention_ms=3_000)
    bases = [s.base_offset for s in log.segments]
    deleted = log.delete_retention(now_ms=TS + 60_000, high_watermark=59)
    # Every segment but the active one: nothing at or above the HW goes.
    assert [d.base_offset for d in deleted] == bases[:-1]
    assert [s.base_offset for s in log.segments] == bases[-1:]
    assert log.log_start_offset == bases[-1] and log.leo == 60


def test_an_emptied_log_is_left_alone_by_later_passes(tmp_path: pathlib.Path) -> None:
    # No churn on an idle empty log: an empty active segment is never rolled or deleted.
    log = filled(tmp_path, retention_ms=3_000, retention_bytes=0)
    assert log.delete_retention(now_ms=TS + 6_000, high_watermark=60)
    (segment,) = log.segments
    before = (segment.created_ms, sorted(p.name for p in log.directory.iterdir()))
    for later in (6_001, 60_000, 10**9):
        assert log.delete_retention(now_ms=TS + later, high_watermark=60) == []
        assert log.segments == (segment,)
        assert (segment.created_ms, sorted(p.name for p in log.directory.iterdir())) == before
    assert log.log_start_offset == 60


def test_a_new_empty_log_is_left_alone(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path, retention_ms=0, retention_bytes=0)
    (segment,) = log.segments
    assert log.delete_retention(now_ms=TS + 10**9, high_watermark=0) == []
    assert log.segments == (segment,) and files(log) == [name(0)]


def test_retention_bytes_takes_the_active_segment_only_at_zero(tmp_path: pathlib.Path) -> None:
    # Kafka's size rule on every segment, the active one included: it goes when the log is
    # still at least retention.bytes without it, which for the last segment means 0.
    log = filled(tmp_path, segment_bytes=400)
    bases = [s.base_offset for s in log.segments]
    log.update_config(LogConfig(segment_bytes=400, retention_bytes=1))
    deleted = log.delete_retention(now_ms=TS, high_watermark=60)
    assert [d.base_offset for d in deleted] == bases[:-1]
    assert [d.reason for d in deleted] == ["retention.bytes"] * len(deleted)
    assert log.log_start_offset == bases[-1] and files(log) == [name(bases[-1])]
    log.update_config(LogConfig(segment_bytes=400, retention_bytes=0))
    deleted = log.delete_retention(now_ms=TS, high_watermark=60)
    assert [(d.base_offset, d.reason) for d in deleted] == [(bases[-1], "retention.bytes")]
    assert log.log_start_offset == 60 and files(log) == [name(60)]


def test_the_log_start_rule_never_takes_the_active_segment(tmp_path: pathlib.Path) -> None:
    # Kafka's deleteLogStartOffsetBreachedSegments needs a next segment: a follower told the
    # leader's log start (the LEO) keeps its active segment until its own retention takes it.
    log = filled(tmp_path, segment_bytes=400, retention_ms=-1)
    bases = [s.base_offset for s in log.segments]
    assert log.maybe_increment_log_start_offset(60)
    deleted = log.delete_retention(now_ms=TS + 10**9, high_watermark=60)
    assert [(d.base_offset, d.reason) for d in deleted[-1:]] == [(bases[-2], "log_start_offset")]
    assert [s.base_offset for s in log.segments] == bases[-1:]
    assert log.log_start_offset == 60 and log.leo == 60


@pytest.mark.parametrize("deletions_before_crash", [0, 1, 2, 3])
def test_a_crash_at_any_step_of_roll_and_delete_leaves_a_log_that_loads(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, deletions_before_crash: int
) -> None:
    """SIGKILL after the roll and after each segment deletion, the last one included (every file
    operation before it is in the page cache, so it survives): loading with the checkpoints of
    before (log start 0, recovery point 0, unclean) gives a contiguous log that ends at the same
    LEO, starts at its first segment, and takes appends at the LEO."""
    log = filled(tmp_path, segment_bytes=400, retention_ms=3_000)
    assert len(log.segments) == 3
    real_delete = LogSegment.delete
    done = 0

    class Killed(BaseException):
        pass

    def delete(segment: LogSegment) -> None:
        nonlocal done
        if done == deletions_before_crash:
            raise Killed
        done += 1
        real_delete(segment)

    def after_deletion(_log: LogDeletion) -> None:
        raise Killed  # the segments are gone; the log start and epoch cache not yet moved

    monkeypatch.setattr(LogSegment, "delete", delete)
    monkeypatch.setattr(LogDeletion, "_after_deletion", after_deletion)
    with pytest.raises(Killed):
        log.delete_retention(now_ms=TS + 6_000, high_watermark=60)
    monkeypatch.undo()
    left = files(log)
    assert left[-1] == name(60)  # rolled before anything was deleted
    reopened = PartitionLog.open(
        tmp_path / "idle-0",
        TP,
        LogConfig(segment_bytes=400, retention_ms=3_000),
        now_ms=TS + 6_000,
        recovery_point=0,
        log_start_offset=0,
        had_clean_shutdown=False,
    )
    try:
        assert reopened.leo == 60
        assert reopened.log_start_offset == reopened.segments[0].base_offset
        assert [name(s.base_offset) for s in reopened.segments] == left
        assert reopened.epoch_cache.entries[-1].epoch == 3
        assert reopened.epoch_cache.entries[0].start_offset >= reopened.log_start_offset
        # Retention finishes the job, then the log goes on at the LEO.
        reopened.delete_retention(now_ms=TS + 6_000, high_watermark=60)
        assert (reopened.log_start_offset, files(reopened)) == (60, [name(60)])
        info = reopened.append_as_leader(batch(1, TS + 7_000), leader_epoch=3, now_ms=TS + 7_000)
        assert info.first_offset == 60
    finally:
        reopened.close()
