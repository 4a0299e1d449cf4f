"""Logs with offset gaps (issue 21): the `.may-have-gaps` marker and every storage path that
meets a gap.

A compacted log keeps each surviving batch at its original offsets, so offsets go missing
between batches, at a segment's start, between segments, and a non-active segment may be empty.
A log whose partition dir holds the sticky marker accepts those gaps; a log without it keeps
treating a gap as damage (the baseOffset field sits outside the CRC).
"""

from __future__ import annotations

import os
import pathlib
import random
import shutil
import struct
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.errors import UnexpectedAppendOffsetError
from minibroker.broker.storage.log import PartitionLog
from minibroker.broker.storage.log_append import plan_follower_append
from minibroker.broker.storage.log_loader import GAPS_MARKER
from minibroker.broker.storage.segment import LogSegment
from minibroker.client.batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER_SIZE,
    crc_of,
    iter_batches,
    read_header,
)
from minibroker.client.errors import KafkaStorageError
from minibroker.client.log_format import LOG_SUFFIX, segment_file_name
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition

TP = TopicPartition("changes", 0)
CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=100)
COMPACT = LogConfig(segment_bytes=700, index_interval_bytes=120, compact=True)
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def open_log(
    directory: pathlib.Path, *, clean: bool = False, config: LogConfig = CONFIG
) -> PartitionLog:
    return PartitionLog.open(directory, TP, config, now_ms=0, had_clean_shutdown=clean)


def batch(base: int, count: int = 1, *, span: int | None = None, ts: int = 1_000) -> bytes:
    """A batch of `count` keyed records at `base`; `span` stretches its lastOffsetDelta to
    span - 1, as a cleaned batch keeps its original last offset with records removed."""
    data = bytearray(
        encode_batch(
            [(ts + i, b"k%d" % (base + i), b"v%d" % (base + i), ()) for i in range(count)],
            base_offset=base,
            partition_leader_epoch=0,
        )
    )
    if span is not None:
        struct.pack_into(">i", data, 23, span - 1)
        struct.pack_into(">I", data, CRC_OFFSET, crc_of(data, ATTRIBUTES_OFFSET, len(data)))
    return bytes(data)


def empty_batch(base: int, last: int, ts: int = 1_000) -> bytes:
    """A batch with no records left (Kafka keeps one for an idempotent producer's state)."""
    data = bytearray(batch(base, 1, ts=ts)[:HEADER_SIZE])
    struct.pack_into(">i", data, 8, HEADER_SIZE - 12)
    struct.pack_into(">i", data, 23, last - base)
    struct.pack_into(">i", data, 57, 0)
    struct.pack_into(">I", data, CRC_OFFSET, crc_of(data, ATTRIBUTES_OFFSET, len(data)))
    return bytes(data)


def write_segment(directory: pathlib.Path, base: int, batches: list[bytes]) -> None:
    """A segment's `.log` as a cleaner leaves it (no index files: the load rebuilds them)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / segment_file_name(base, LOG_SUFFIX)).write_bytes(b"".join(batches))
    if not batches:
        # Recovery writes index entries, not files: an empty segment's come with it.
        for suffix in (".index", ".timeindex"):
            (directory / segment_file_name(base, suffix)).touch()


def mark(directory: pathlib.Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / GAPS_MARKER).touch()


def stored(log: PartitionLog) -> list[bytes]:
    """Every batch of the log, read from the log start through `read`, each validated."""
    out: list[bytes] = []
    offset = log.log_start_offset
    while offset < log.leo:
        info = log.read(offset, 1 << 20)
        if not info.records:
            break
        for position, header in iter_batches(info.records):
            out.append(info.records[position : position + header.size])
        offset = info.next_offset
    return out


# A gapped log: gaps inside segment 0, at segment 20's start, between segments, an empty
# non-active segment (40), and an active segment (50).
GAPPED = {
    0: [batch(0, 2), batch(5, 1, span=3), empty_batch(9, 10)],
    20: [batch(25, 2), batch(27, 1)],
    40: [],
    50: [batch(50, 2)],
}
ALL = [b for base in sorted(GAPPED) for b in GAPPED[base]]


def write_gapped(directory: pathlib.Path, *, marker: bool = True) -> None:
    for base, batches in GAPPED.items():
        write_segment(directory, base, batches)
    if marker:
        mark(directory)


def first_batch_at_or_after(offset: int) -> int:
    """The base offset of the batch a read of `offset` must start with."""
    for data in ALL:
        header = read_header(data)
        if header.last_offset >= offset:
            return header.base_offset
    raise AssertionError(offset)


# -- the marker ---------------------------------------------------------------------------------


def test_marker_is_written_once_and_read_at_load(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "changes-0"
    log = open_log(directory)
    assert not log.may_have_gaps
    assert not (directory / GAPS_MARKER).exists()
    log.mark_may_have_gaps()
    assert log.may_have_gaps
    assert (directory / GAPS_MARKER).exists()
    assert (directory / GAPS_MARKER).stat().st_size == 0
    log.mark_may_have_gaps()  # idempotent
    assert log.may_have_gaps
    log.close()
    again = open_log(directory)
    assert again.may_have_gaps
    again.close()


def test_marker_write_failure_raises_storage_error_and_changes_nothing(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "changes-0"
    log = open_log(directory)
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(KafkaStorageError, match="may-have-gaps"):
        log.mark_may_have_gaps()
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert not log.may_have_gaps
    assert not (directory / GAPS_MARKER).exists()
    log.mark_may_have_gaps()
    assert log.may_have_gaps
    log.close()


# -- loading ------------------------------------------------------------------------------------


@pytest.mark.parametrize("clean", [False, True])
def test_a_marked_log_loads_with_all_its_gaps(tmp_path: pathlib.Path, clean: bool) -> None:
    directory = tmp_path / "changes-0"
    write_gapped(directory)
    log = open_log(directory, clean=clean)
    assert log.may_have_gaps
    assert [s.base_offset for s in log.segments] == [0, 20, 40, 50]
    assert log.leo == 52
    assert stored(log) == ALL
    log.close()
    # Loaded again (now with the indexes the first load wrote, and a clean shutdown).
    again = open_log(directory, clean=True)
    assert [s.base_offset for s in again.segments] == [0, 20, 40, 50]
    assert stored(again) == ALL
    again.close()


def test_a_clean_load_of_a_gapped_log_finds_no_damage(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "changes-0"
    write_gapped(directory)
    open_log(directory).close()  # builds the indexes
    capsys.readouterr()
    log = open_log(directory, clean=True)
    output = capsys.readouterr().out
    assert "corrupt_batch_found_on_load" not in output
    assert "log_recovered" not in output
    assert stored(log) == ALL
    log.close()


def test_a_segment_opens_with_gaps_only_when_allowed(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "changes-0"
    write_gapped(directory)
    open_log(directory).close()  # builds the indexes
    opened = LogSegment.open(directory, 0, CONFIG.index_interval_bytes, 0, allow_gaps=True)
    assert not opened.needs_recovery
    assert opened.next_offset == 11
    assert opened.find_damage(allow_gaps=True) is None
    opened.release()
    strict = LogSegment.open(directory, 0, CONFIG.index_interval_bytes, 0)
    # Opening checks the tail after the last index entry only (here: past the gap).
    assert strict.find_damage() == f"baseOffset 5, expected 2 at position {len(batch(0, 2))}"
    strict.release()
    # Segment 20 starts with a gap (its first batch is at 25) and has no index entry.
    gapped = LogSegment.open(directory, 20, CONFIG.index_interval_bytes, 0, allow_gaps=True)
    assert not gapped.needs_recovery
    assert gapped.next_offset == 28
    gapped.release()
    strict = LogSegment.open(directory, 20, CONFIG.index_interval_bytes, 0)
    assert strict.needs_recovery
    assert strict.find_damage() == "baseOffset 25, expected 20 at position 0"
    strict.release()
    # Going back is damage either way.
    write_segment(directory, 0, [batch(0, 2), batch(1, 1)])
    for suffix in (".index", ".timeindex"):  # no entries: opening checks every batch
        (directory / segment_file_name(0, suffix)).write_bytes(b"")
    back = LogSegment.open(directory, 0, CONFIG.index_interval_bytes, 0, allow_gaps=True)
    assert back.needs_recovery
    assert back.find_damage(allow_gaps=True) == (
        f"baseOffset 1, expected 2 at position {len(batch(0, 2))}"
    )
    back.release()


@pytest.mark.parametrize("clean", [False, True])
def test_a_log_without_the_marker_still_takes_a_gap_for_damage(
    tmp_path: pathlib.Path, clean: bool
) -> None:
    directory = tmp_path / "changes-0"
    write_gapped(directory, marker=False)
    log = open_log(directory, clean=clean)
    assert not log.may_have_gaps
    # Cut at the first gap (offset 2 -> 5): the batches before it stay, later segments go.
    assert stored(log) == [GAPPED[0][0]]
    assert log.leo == 2
    assert [s.base_offset for s in log.segments] == [0]
    assert sorted(p.name for p in directory.glob("*.log")) == [segment_file_name(0, LOG_SUFFIX)]
    log.close()


def test_without_the_marker_a_gap_between_segments_deletes_the_later_ones(
    tmp_path: pathlib.Path,
) -> None:
    directory = tmp_path / "changes-0"
    write_segment(directory, 0, [batch(0, 2)])
    write_segment(directory, 5, [batch(5, 1)])
    log = open_log(directory, clean=True)
    assert [s.base_offset for s in log.segments] == [0]
    assert log.leo == 2
    log.close()


def test_with_the_marker_a_segment_overlapping_the_previous_one_is_damage(
    tmp_path: pathlib.Path,
) -> None:
    directory = tmp_path / "changes-0"
    write_segment(directory, 0, [batch(0, 2), batch(8, 2)])
    write_segment(directory, 5, [batch(12, 1)])  # starts below offset 10, the end of segment 0
    write_segment(directory, 20, [batch(20, 1)])
    mark(directory)
    log = open_log(directory, clean=True)
    assert [s.base_offset for s in log.segments] == [0]
    assert log.leo == 10
    log.close()


@pytest.mark.parametrize("clean", [False, True])
def test_with_the_marker_a_batch_going_back_is_still_damage(
    tmp_path: pathlib.Path, clean: bool
) -> None:
    directory = tmp_path / "changes-0"
    write_segment(directory, 0, [batch(0, 2), batch(6, 2), batch(7, 1), batch(9, 1)])
    mark(directory)
    log = open_log(directory, clean=clean)
    assert stored(log) == [batch(0, 2), batch(6, 2)]
    assert log.leo == 8
    log.close()


def test_with_the_marker_a_first_batch_below_the_segment_base_is_damage(
    tmp_path: pathlib.Path,
) -> None:
    directory = tmp_path / "changes-0"
    write_segment(directory, 0, [batch(0, 2)])
    write_segment(directory, 10, [batch(8, 1), batch(12, 1)])
    mark(directory)
    log = open_log(directory)
    assert stored(log) == [batch(0, 2)]
    assert log.leo == 10  # the emptied segment stays, as the active one
    log.close()


# -- reads --------------------------------------------------------------------------------------


def test_a_read_of_an_offset_in_a_gap_serves_the_next_batch(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "changes-0"
    write_gapped(directory)
    log = open_log(directory)
    for offset in range(log.leo):
        info = log.read(offset, 1)  # one batch (KIP-74)
        assert info.first_offset == first_batch_at_or_after(offset), offset
        # The offset after the batch, or the next batch's base offset (past the gap): no
        # batch is skipped either way.
        end = read_header(info.records).next_offset
        assert info.next_offset in (end, first_batch_at_or_after(end) if end < log.leo else end)
    # Bounded by a max offset (the HW) inside a gap: nothing past it.
    info = log.read(12, 1 << 20, max_offset=22)
    assert info.records == b""
    assert info.next_offset == 12
    info = log.read(3, 1 << 20, max_offset=22)
    assert [h.base_offset for _, h in iter_batches(info.records)] == [5, 9]
    assert info.next_offset == 11
    log.close()


def test_offset_for_timestamp_across_gaps(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "changes-0"
    write_segment(directory, 0, [batch(0, 2, ts=100), batch(5, 1, ts=200)])
    write_segment(directory, 10, [])
    write_segment(directory, 20, [batch(25, 1, ts=300)])
    mark(directory)
    log = open_log(directory)
    assert log.offset_for_timestamp(50) == (0, 101)
    assert log.offset_for_timestamp(150) == (5, 200)
    assert log.offset_for_timestamp(250) == (25, 300)
    assert log.offset_for_timestamp(301) is None
    # A log start inside a gap: the answer is never below it.
    log.maybe_increment_log_start_offset(3)
    assert log.offset_for_timestamp(50) == (5, 200)
    log.close()


# -- the log start, truncation and retention ----------------------------------------------------


def test_a_log_start_in_a_gap(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "changes-0"
    write_gapped(directory)
    log = open_log(directory)
    assert log.maybe_increment_log_start_offset(13)  # between segment 0's end (11) and 25
    info = log.read(13, 1)
    assert info.first_offset == 25
    # Kafka's rule: a segment goes once the next one starts at or below the log start. Segment
    # 0's batches all lie below 13, but segment 20 starts above it: segment 0 stays, and the
    # log start stays where it was raised (inside the gap, above no batch).
    assert log.delete_retention(now_ms=0, high_watermark=log.leo) == []
    assert log.log_start_offset == 13
    assert stored(log) == ALL[3:]
    assert log.maybe_increment_log_start_offset(20)
    deleted = log.delete_retention(now_ms=0, high_watermark=log.leo)
    assert [(d.base_offset, d.reason) for d in deleted] == [(0, "log_start_offset")]
    assert log.log_start_offset == 20
    assert stored(log) == ALL[3:]
    log.close()


def test_a_cleaned_empty_first_segment_is_not_below_the_log_start(tmp_path: pathlib.Path) -> None:
    """The cleaner can empty the first segment (its next offset is then its base offset). The
    log start rule asks whether the NEXT segment starts at or below the log start (Kafka's
    deleteLogStartOffsetBreachedSegments): here it does not, so nothing goes and the log
    start stays 0. Judged by the segment's own next offset, the segment went and the log start
    jumped to 10, which a reader from offset 0 saw as data loss."""
    directory = tmp_path / "changes-0"
    write_segment(directory, 0, [])
    write_segment(directory, 10, [batch(12)])
    write_segment(directory, 20, [batch(20)])
    mark(directory)
    log = open_log(directory, config=COMPACT)
    assert log.log_start_offset == 0
    assert log.delete_retention(now_ms=10**12, high_watermark=log.leo) == []
    assert log.log_start_offset == 0
    assert log.read(0, 1).first_offset == 12
    log.close()


def test_retention_deletes_an_empty_segment_and_segments_with_gaps(
    tmp_path: pathlib.Path,
) -> None:
    directory = tmp_path / "changes-0"
    write_gapped(directory)
    config = LogConfig(segment_bytes=4096, index_interval_bytes=100, retention_ms=1_000)
    log = PartitionLog.open(directory, TP, config, now_ms=0)
    # An empty segment's largest timestamp is its file's modification time: make it old.
    os.utime(directory / segment_file_name(40, LOG_SUFFIX), (0, 0))
    # Every batch is stamped about 1_000 ms: at 10_000 all but the HW rule allow deletion.
    deleted = log.delete_retention(now_ms=10_000, high_watermark=50)
    assert [d.base_offset for d in deleted] == [0, 20, 40]
    assert log.log_start_offset == 50
    assert stored(log) == [GAPPED[50][0]]
    log.close()


def test_truncation_to_an_offset_inside_a_gap(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "changes-0"
    write_gapped(directory)
    log = open_log(directory)
    # Inside segment 0, between the batch ending at 1 and the one at 5.
    assert log.truncate_to(3)
    assert log.leo == 3
    assert stored(log) == [GAPPED[0][0]]
    assert [s.base_offset for s in log.segments] == [0]
    # The next append goes on from there.
    info = log.append_as_follower(batch(3, 1), now_ms=0)
    assert info.first_offset == 3
    assert log.leo == 4
    log.close()


def test_truncation_to_a_gap_between_segments(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "changes-0"
    write_gapped(directory)
    log = open_log(directory)
    # Past segment 20's last batch (ends at 28), below the empty segment 40.
    assert log.truncate_to(33)
    assert [s.base_offset for s in log.segments] == [0, 20]
    assert log.leo == 33
    assert stored(log) == ALL[:5]
    # At the start of segment 20's first batch: the batch goes, the LEO is the target.
    assert log.truncate_to(22)
    assert log.leo == 22
    assert stored(log) == ALL[:3]
    log.close()
    again = open_log(directory, clean=True)
    assert stored(again) == ALL[:3]
    again.close()


def test_truncation_of_a_log_without_gaps_stays_batch_granular(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "changes-0"
    write_segment(directory, 0, [batch(0, 3), batch(3, 3)])
    log = open_log(directory)
    assert log.truncate_to(4)
    assert log.leo == 3  # the batch holding 4 goes whole
    log.close()


# -- follower appends ---------------------------------------------------------------------------


def test_a_compacted_follower_appends_past_gaps_and_writes_the_marker_first(
    tmp_path: pathlib.Path,
) -> None:
    directory = tmp_path / "changes-0"
    log = open_log(directory, config=COMPACT)
    log.append_as_follower(batch(0, 2), now_ms=0)
    assert not log.may_have_gaps  # no gap yet
    log.append_as_follower(batch(7, 1) + batch(9, 2, span=5), now_ms=0)
    assert log.may_have_gaps
    assert (directory / GAPS_MARKER).exists()
    assert log.leo == 14
    with pytest.raises(UnexpectedAppendOffsetError, match="at or above 14"):
        log.append_as_follower(batch(13, 1), now_ms=0)
    assert log.leo == 14
    log.close()
    again = open_log(directory)
    assert stored(again) == [batch(0, 2), batch(7, 1), batch(9, 2, span=5)]
    again.close()


def test_a_follower_of_a_delete_topic_keeps_the_strict_rule(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "changes-0"
    log = open_log(directory)
    log.append_as_follower(batch(0, 2), now_ms=0)
    with pytest.raises(UnexpectedAppendOffsetError, match="expected at 2"):
        log.append_as_follower(batch(3, 1), now_ms=0)
    assert not log.may_have_gaps
    assert not (directory / GAPS_MARKER).exists()
    assert log.leo == 2
    # Once the log has the marker (a topic compacted before), gaps are fine again.
    log.mark_may_have_gaps()
    log.append_as_follower(batch(3, 1), now_ms=0)
    assert log.leo == 4
    log.close()


def test_a_failed_marker_write_appends_nothing(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "changes-0"
    log = open_log(directory, config=COMPACT)
    log.append_as_follower(batch(0, 2), now_ms=0)

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(KafkaStorageError):
        log.append_as_follower(batch(5, 1), now_ms=0)
    monkeypatch.undo()
    assert log.leo == 2
    assert stored(log) == [batch(0, 2)]
    log.close()


def test_plan_follower_append_rules() -> None:
    # Strict: exactly at the LEO, each batch right after the previous.
    plan = plan_follower_append(batch(4, 2) + batch(6, 1), TP, 4, None, 0)
    assert not plan.has_gap
    assert plan.info.first_offset == 4 and plan.info.last_offset == 6
    with pytest.raises(UnexpectedAppendOffsetError):
        plan_follower_append(batch(5, 1), TP, 4, None, 0)
    with pytest.raises(UnexpectedAppendOffsetError):
        plan_follower_append(batch(4, 1) + batch(6, 1), TP, 4, None, 0)
    # Gaps allowed: at or above, never below.
    plan = plan_follower_append(batch(9, 1) + batch(12, 2), TP, 4, None, 0, allow_gaps=True)
    assert plan.has_gap
    assert [e[2] for e in plan.entries] == [9, 13]
    assert plan.info.first_offset == 9 and plan.info.last_offset == 13
    plan = plan_follower_append(batch(4, 1) + batch(5, 1), TP, 4, None, 0, allow_gaps=True)
    assert not plan.has_gap
    with pytest.raises(UnexpectedAppendOffsetError, match="first batch"):
        plan_follower_append(batch(3, 1), TP, 4, None, 0, allow_gaps=True)
    with pytest.raises(UnexpectedAppendOffsetError, match="position"):
        plan_follower_append(batch(9, 3) + batch(10, 1), TP, 4, None, 0, allow_gaps=True)


# -- random damage to a gapped log --------------------------------------------------------------


def _batches_of(data: bytes) -> list[bytes]:
    return [data[p : p + h.size] for p, h in iter_batches(data)]


def build_gapped(directory: pathlib.Path, seed: int) -> list[bytes]:
    """A compacted follower log with random gaps, several segments; returns its batches."""
    rng = random.Random(seed)
    log = open_log(directory, config=COMPACT)
    written: list[bytes] = []
    offset = 0
    for _ in range(24):
        offset += rng.choice([0, 0, 1, 3, 10])
        count = rng.randint(1, 3)
        span = count + rng.choice([0, 0, 2])
        data = batch(offset, count, span=span, ts=1_000 + offset)
        log.append_as_follower(data, now_ms=0)
        written.append(data)
        offset += span
    log.mark_may_have_gaps()
    log.close()  # no flush: an unclean stop
    return written


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), damage=st.data(), clean=st.booleans())
def test_random_damage_to_a_gapped_log_leaves_a_prefix(
    seed: int, damage: st.DataObject, clean: bool
) -> None:
    """A torn or flipped segment of a gapped log is cut at the damage and the later segments
    go; a segment cut exactly at a batch boundary cannot be told from one a cleaner emptied
    (a gapped log may have short and empty segments, as in Kafka, which checks no segment
    contiguity at all), so the later segments then stay."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="mb-gaps-", dir=SCRATCH))
    try:
        directory = root / "changes-0"
        written = build_gapped(directory, seed)
        files = sorted(directory.glob("*.log"))
        assert len(files) > 2
        per_file = [_batches_of(f.read_bytes()) for f in files]
        assert [b for batches in per_file for b in batches] == written
        k = damage.draw(st.integers(0, len(files) - 1))
        data = bytearray(files[k].read_bytes())
        ends = []
        for batch_bytes in per_file[k]:
            ends.append((ends[-1] if ends else 0) + len(batch_bytes))
        starts = [0, *ends[:-1]]
        if data and damage.draw(st.booleans()):
            # Flip a byte that is not a baseOffset (those sit outside the CRC: a raised one
            # in a log with gaps is a gap; a lowered one is the next test's).
            at = damage.draw(
                st.integers(0, len(data) - 1).filter(
                    lambda i: not any(s <= i < s + 8 for s in starts)
                )
            )
            data[at] ^= damage.draw(st.integers(1, 255))
            boundary = False
        else:
            at = damage.draw(st.integers(0, len(data)))
            del data[at:]
            boundary = at == 0 or at in ends
        whole = sum(1 for end in ends if end <= at)
        files[k].write_bytes(bytes(data))
        log = open_log(directory, clean=clean, config=COMPACT)
        expected = [b for batches in per_file[:k] for b in batches] + per_file[k][:whole]
        if boundary:
            expected += [b for batches in per_file[k + 1 :] for b in batches]
        assert stored(log) == expected
        # Offsets only increase through the log, and the LEO is past every batch.
        offsets = [read_header(b).base_offset for b in expected]
        assert offsets == sorted(set(offsets))
        if expected:
            assert log.leo >= read_header(expected[-1]).next_offset
        log.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("clean", [False, True])
def test_a_lowered_base_offset_in_a_gapped_log_is_cut(tmp_path: pathlib.Path, clean: bool) -> None:
    directory = tmp_path / "changes-0"
    written = build_gapped(directory, 7)
    path = sorted(directory.glob("*.log"))[0]
    data = bytearray(path.read_bytes())
    positions = [p for p, _ in iter_batches(bytes(data))]
    assert len(positions) >= 3
    victim = positions[2]
    previous_last = read_header(bytes(data), positions[1]).last_offset
    struct.pack_into(">q", data, victim, previous_last)
    path.write_bytes(bytes(data))
    log = open_log(directory, clean=clean, config=COMPACT)
    assert stored(log) == written[:2]
    log.close()


def test_a_gap_wider_than_a_segment_index_rolls_even_an_empty_segment(
    tmp_path: pathlib.Path,
) -> None:
    directory = tmp_path / "changes-0"
    log = open_log(directory, config=COMPACT)
    far = 2**31 + 10  # past what segment 0's index can hold relative to its base
    log.append_as_follower(batch(far, 2), now_ms=0)
    assert [s.base_offset for s in log.segments] == [0, far]
    assert log.segments[0].size == 0
    assert log.leo == far + 2
    log.append_as_follower(batch(2 * far, 1), now_ms=0)  # and from a non-empty one
    assert [s.base_offset for s in log.segments] == [0, far, 2 * far]
    log.close()
    again = open_log(directory)
    assert [s.base_offset for s in again.segments] == [0, far, 2 * far]
    assert stored(again) == [batch(far, 2), batch(2 * far, 1)]
    again.close()


def catch_up(leader: PartitionLog, follower: PartitionLog, max_bytes: int) -> int:
    """Fetch from the follower's LEO and append what the leader serves, until it holds the
    leader's log; returns the number of fetches."""
    fetches = 0
    while follower.leo < leader.leo:
        info = leader.read(follower.leo, max_bytes)
        assert info.records, f"nothing served at {follower.leo}"
        follower.append_as_follower(info.records, now_ms=0)
        fetches += 1
        assert fetches < 100
    return fetches


@pytest.mark.parametrize("max_bytes", [1, 1 << 20])
def test_a_new_follower_catches_up_through_the_gaps_of_a_cleaned_leader(
    tmp_path: pathlib.Path, max_bytes: int
) -> None:
    write_gapped(tmp_path / "leader" / "changes-0")
    leader = open_log(tmp_path / "leader" / "changes-0")
    follower = open_log(tmp_path / "follower" / "changes-0", config=COMPACT)
    catch_up(leader, follower, max_bytes)
    assert follower.leo == leader.leo == 52
    assert follower.may_have_gaps
    assert stored(follower) == ALL
    # A truncation into a gap (a diverging epoch's end offset), then the same catch-up again.
    assert follower.truncate_to(23)
    assert follower.leo == 23
    catch_up(leader, follower, max_bytes)
    assert stored(follower) == ALL
    follower.close()
    again = open_log(tmp_path / "follower" / "changes-0", config=COMPACT)
    assert stored(again) == ALL and again.leo == 52
    again.close()
    leader.close()


def test_a_compacted_log_altered_to_delete_keeps_accepting_gaps(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "changes-0"
    log = open_log(directory, config=COMPACT)
    log.append_as_follower(batch(0, 1), now_ms=0)
    delete = LogConfig(segment_bytes=700, index_interval_bytes=120)

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    # The marker cannot be written now: the log still takes gaps while it is open.
    monkeypatch.setattr(os, "fsync", failing_fsync)
    log.update_config(delete)
    monkeypatch.undo()
    assert not log.may_have_gaps and not log.config.compact
    log.append_as_follower(batch(3, 1), now_ms=0)  # writes the marker first
    assert log.may_have_gaps and log.leo == 4
    log.close()
    # Altered again with the disk well: the marker is written at once.
    other = open_log(tmp_path / "other-0", config=COMPACT)
    other.update_config(delete)
    assert other.may_have_gaps
    assert (tmp_path / "other-0" / GAPS_MARKER).exists()
    other.close()
    # A delete log altered to another delete config gets no marker.
    plain = open_log(tmp_path / "plain-0")
    plain.update_config(delete)
    assert not plain.may_have_gaps
    plain.close()
