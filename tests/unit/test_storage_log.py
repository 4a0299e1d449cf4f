"""PartitionLog operations and bad inputs (docs/design.md §4.4).

Every bad input must raise a typed error and leave the log exactly as it was: same LEO, same
bytes on disk, same epoch cache.
"""

from __future__ import annotations

import pathlib
import struct

import pytest

from minibroker.broker.storage.checkpoint import LeaderEpochCheckpointFile
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.epoch_cache import EpochEntry
from minibroker.broker.storage.errors import UnexpectedAppendOffsetError
from minibroker.broker.storage.log import PartitionLog
from minibroker.client.batch import (
    CONTROL_MASK,
    TIMESTAMP_TYPE_MASK,
    CorruptRecordError,
    crc_of,
    iter_batches,
    read_header,
)
from minibroker.client.errors import (
    InvalidRecordError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    RecordListTooLargeError,
)
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition

TP = TopicPartition("orders", 0)


def batch(
    count: int = 3,
    *,
    ts: int = 1_000,
    base_offset: int = 0,
    epoch: int = -1,
    value: bytes = b"value",
) -> bytes:
    return encode_batch(
        [(ts + i, None, value, ()) for i in range(count)],
        base_offset=base_offset,
        partition_leader_epoch=epoch,
    )


def open_log(path: pathlib.Path, **config: int | str) -> PartitionLog:
    return PartitionLog.open(path / "orders-0", TP, LogConfig(**config), now_ms=0)  # type: ignore[arg-type]


def snapshot(log: PartitionLog) -> tuple[object, ...]:
    files = {p.name: p.read_bytes() for p in sorted(log.directory.iterdir()) if p.is_file()}
    return (log.leo, log.log_start_offset, log.epoch_cache.entries, files)


def stored_batches(log: PartitionLog) -> list[tuple[int, int, int]]:
    """(base offset, last offset, epoch) of every batch, read back through the log."""
    out = []
    offset = log.log_start_offset
    while offset < log.leo:
        info = log.read(offset, 1 << 20)
        for _, header in iter_batches(info.records):
            out.append((header.base_offset, header.last_offset, header.partition_leader_epoch))
        offset = info.next_offset
    return out


# -- leader appends -------------------------------------------------------------------------


def test_leader_append_assigns_offsets_from_leo_and_stamps_epoch(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path)
    first = log.append_as_leader(batch(3), leader_epoch=5, now_ms=10)
    second = log.append_as_leader(batch(2, ts=2_000), leader_epoch=5, now_ms=11)
    assert (first.first_offset, first.last_offset) == (0, 2)
    assert (second.first_offset, second.last_offset, second.max_timestamp) == (3, 4, 2_001)
    assert log.leo == 5
    assert [(h.base_offset, h.partition_leader_epoch) for h in second.batches] == [(3, 5)]
    assert second.received[0].base_offset == 0  # as the producer sent it
    assert stored_batches(log) == [(0, 2, 5), (3, 4, 5)]
    # The restamp does not touch the CRC'd region: every stored batch still validates.
    data = log.read(0, 1 << 20).records
    assert [read_header(data, p).crc for p, _ in iter_batches(data)] == [
        h.crc for h in first.batches + second.batches
    ]


def test_leader_append_of_several_batches_in_one_call(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path)
    info = log.append_as_leader(batch(2) + batch(4) + batch(1), leader_epoch=0, now_ms=0)
    assert (info.first_offset, info.last_offset, info.records_count) == (0, 6, 7)
    assert [(h.base_offset, h.last_offset) for h in info.batches] == [(0, 1), (2, 5), (6, 6)]
    assert stored_batches(log) == [(0, 1, 0), (2, 5, 0), (6, 6, 0)]


def test_first_append_of_an_epoch_persists_the_epoch_cache(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path)
    log.append_as_leader(batch(), leader_epoch=1, now_ms=0)
    log.append_as_leader(batch(), leader_epoch=1, now_ms=0)
    log.append_as_leader(batch(), leader_epoch=3, now_ms=0)
    expected = [EpochEntry(1, 0), EpochEntry(3, 6)]
    assert list(log.epoch_cache.entries) == expected
    on_disk = LeaderEpochCheckpointFile(log.directory / "leader-epoch-checkpoint").read()
    assert on_disk == expected


def test_new_leader_assigns_its_epoch_at_the_leo_before_writing(tmp_path: pathlib.Path) -> None:
    # KIP-279: (epoch, LEO) goes into the cache at election, before any write.
    log = open_log(tmp_path)
    log.append_as_leader(batch(), leader_epoch=1, now_ms=0)
    assert log.maybe_assign_epoch_start_offset(2, log.leo)
    assert not log.maybe_assign_epoch_start_offset(2, log.leo)
    assert log.epoch_cache.end_offset_for(1, log.leo) == (1, 3)
    assert log.epoch_cache.end_offset_for(2, log.leo) == (2, 3)


def _corrupt_crc(data: bytes) -> bytes:
    buf = bytearray(data)
    buf[-1] ^= 0xFF
    return bytes(buf)


def _bad_magic(data: bytes) -> bytes:
    buf = bytearray(data)
    buf[16] = 1
    return bytes(buf)


def _control(data: bytes) -> bytes:
    buf = bytearray(data)
    (attributes,) = struct.unpack_from(">h", buf, 21)
    struct.pack_into(">h", buf, 21, attributes | CONTROL_MASK)
    struct.pack_into(">I", buf, 17, crc_of(buf, 21, len(buf)))
    return bytes(buf)


def _zero_records(data: bytes) -> bytes:
    buf = bytearray(data[:61])
    struct.pack_into(">i", buf, 8, 49)
    struct.pack_into(">i", buf, 23, 0)
    struct.pack_into(">i", buf, 57, 0)
    struct.pack_into(">I", buf, 17, crc_of(buf, 21, len(buf)))
    return bytes(buf)


@pytest.mark.parametrize(
    ("mangle", "error"),
    [
        (_corrupt_crc, CorruptRecordError),
        (_bad_magic, CorruptRecordError),
        (lambda d: d[:-5], CorruptRecordError),  # torn: batchLength says more than is there
        (lambda d: d[:40], CorruptRecordError),  # not even a header
        (lambda d: d + b"\x00" * 7, CorruptRecordError),  # trailing garbage
        (lambda d: b"", InvalidRecordError),
        (_control, InvalidRecordError),
        (_zero_records, InvalidRecordError),
        (lambda d: batch(50, value=b"x" * 100), MessageTooLargeError),
        (lambda d: d + _corrupt_crc(d), CorruptRecordError),  # a good batch then a bad one
    ],
    ids=[
        "crc",
        "magic",
        "torn",
        "short-header",
        "trailing-bytes",
        "empty",
        "control",
        "no-records",
        "too-large",
        "second-bad",
    ],
)
def test_bad_leader_input_raises_and_changes_nothing(
    tmp_path: pathlib.Path, mangle: object, error: type[Exception]
) -> None:
    log = open_log(tmp_path, max_message_bytes=2_000)
    log.append_as_leader(batch(), leader_epoch=1, now_ms=0)
    before = snapshot(log)
    with pytest.raises(error):
        log.append_as_leader(mangle(batch()), leader_epoch=2, now_ms=0)  # type: ignore[operator]
    assert snapshot(log) == before


def test_batch_larger_than_a_segment_is_rejected(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path, segment_bytes=300)
    before = snapshot(log)
    with pytest.raises(RecordListTooLargeError):
        log.append_as_leader(batch(10, value=b"x" * 50), leader_epoch=0, now_ms=0)
    assert snapshot(log) == before


def test_explicit_max_message_bytes_overrides_the_topic_config(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path)
    with pytest.raises(MessageTooLargeError):
        log.append_as_leader(batch(), leader_epoch=0, now_ms=0, max_message_bytes=50)
    assert log.leo == 0


def test_log_append_time_stamps_max_timestamp_and_keeps_the_crc_valid(
    tmp_path: pathlib.Path,
) -> None:
    log = open_log(tmp_path, message_timestamp_type="LogAppendTime")
    info = log.append_as_leader(batch(ts=5), leader_epoch=0, now_ms=777)
    assert info.log_append_time_ms == 777
    header = read_header(log.read(0, 1 << 20).records)  # raises if the CRC were stale
    assert header.max_timestamp == 777
    assert header.attributes & TIMESTAMP_TYPE_MASK


# -- follower appends ------------------------------------------------------------------------


def test_follower_append_keeps_offsets_and_epochs(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path)
    chunk = batch(2, base_offset=0, epoch=3) + batch(3, base_offset=2, epoch=4)
    info = log.append_as_follower(chunk, now_ms=0)
    assert (info.first_offset, info.last_offset) == (0, 4)
    assert log.read(0, 1 << 20).records == chunk
    assert list(log.epoch_cache.entries) == [EpochEntry(3, 0), EpochEntry(4, 2)]


def test_empty_follower_append_is_a_no_op(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path)
    info = log.append_as_follower(b"", now_ms=0)
    assert not info.appended
    assert log.leo == 0


@pytest.mark.parametrize(
    "chunk",
    [
        batch(2, base_offset=5, epoch=1),  # gap: the LEO is 3
        batch(2, base_offset=2, epoch=1),  # overlap
        batch(2, base_offset=3, epoch=1) + batch(2, base_offset=6, epoch=1),  # gap inside
        batch(2, base_offset=3, epoch=1) + batch(2, base_offset=4, epoch=1),  # overlap inside
        batch(2, base_offset=-1, epoch=1),  # negative
    ],
    ids=["gap", "overlap", "gap-inside", "overlap-inside", "negative"],
)
def test_follower_gap_or_overlap_raises_and_changes_nothing(
    tmp_path: pathlib.Path, chunk: bytes
) -> None:
    log = open_log(tmp_path)
    log.append_as_follower(batch(3, base_offset=0, epoch=1), now_ms=0)
    before = snapshot(log)
    with pytest.raises(UnexpectedAppendOffsetError) as err:
        log.append_as_follower(chunk, now_ms=0)
    assert err.value.expected_offset in (3, 5)
    assert snapshot(log) == before


def test_follower_corrupt_batch_raises_and_changes_nothing(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path)
    before = snapshot(log)
    good = batch(2, base_offset=0, epoch=2)
    for bad in (_corrupt_crc(good), good + good[:30], _bad_magic(good)):
        with pytest.raises(CorruptRecordError):
            log.append_as_follower(bad, now_ms=0)
        assert snapshot(log) == before


# -- reads -----------------------------------------------------------------------------------


def _filled(tmp_path: pathlib.Path, batches: int = 6, **config: int | str) -> PartitionLog:
    log = open_log(tmp_path, **config)
    for i in range(batches):
        log.append_as_leader(batch(2, ts=1_000 + 10 * i), leader_epoch=0, now_ms=0)
    return log


def test_read_out_of_range(tmp_path: pathlib.Path) -> None:
    log = _filled(tmp_path)
    for offset in (-1, log.leo + 1):
        with pytest.raises(OffsetOutOfRangeError):
            log.read(offset, 1000)
    info = log.read(log.leo, 1000)
    assert info.records == b"" and info.next_offset == log.leo and info.first_offset == -1


def test_read_returns_whole_batches_within_max_bytes(tmp_path: pathlib.Path) -> None:
    log = _filled(tmp_path)
    size = len(log.read(0, 1).records)  # one batch (KIP-74 minimum)
    info = log.read(0, 2 * size + size // 2)
    assert len(info.records) == 2 * size
    assert (info.first_offset, info.next_offset) == (0, 4)


def test_read_at_least_one_batch_even_above_max_bytes(tmp_path: pathlib.Path) -> None:
    log = _filled(tmp_path)
    info = log.read(2, 0)
    assert [h.base_offset for _, h in iter_batches(info.records)] == [2]
    assert log.read(2, 0, min_one_batch=False).records == b""


def test_read_from_the_middle_of_a_batch_returns_that_batch_whole(tmp_path: pathlib.Path) -> None:
    log = _filled(tmp_path)
    info = log.read(3, 1)
    assert info.fetch_offset == 3
    assert info.first_offset == 2
    assert [h.base_offset for _, h in iter_batches(info.records)] == [2]


def test_read_never_returns_a_batch_at_or_above_max_offset(tmp_path: pathlib.Path) -> None:
    log = _filled(tmp_path)
    info = log.read(0, 1 << 20, max_offset=5)  # batch 4..5 straddles the HW: excluded
    assert [h.last_offset for _, h in iter_batches(info.records)] == [1, 3]
    assert info.next_offset == 4
    assert log.read(4, 1 << 20, max_offset=5).records == b""
    assert log.read(0, 1 << 20, max_offset=0).records == b""


def test_sequential_read_across_segments_returns_every_batch_once(tmp_path: pathlib.Path) -> None:
    log = _filled(tmp_path, 20, segment_bytes=400, index_interval_bytes=50)
    assert len(log.segments) > 3
    assert stored_batches(log) == [(2 * i, 2 * i + 1, 0) for i in range(20)]


def test_offset_for_timestamp(tmp_path: pathlib.Path) -> None:
    log = _filled(tmp_path, 10, segment_bytes=400, index_interval_bytes=0)
    assert log.offset_for_timestamp(0) == (0, 1_001)
    assert log.offset_for_timestamp(1_031) == (6, 1_031)  # batch 3: ts 1030, 1031
    assert log.offset_for_timestamp(1_032) == (8, 1_041)
    assert log.offset_for_timestamp(5_000) is None


# -- rolling ---------------------------------------------------------------------------------


def test_roll_before_an_append_that_would_overflow_segment_bytes(tmp_path: pathlib.Path) -> None:
    one = len(batch(2))
    log = open_log(tmp_path, segment_bytes=2 * one + 10)
    for _ in range(5):
        log.append_as_leader(batch(2), leader_epoch=0, now_ms=0)
    assert [s.base_offset for s in log.segments] == [0, 4, 8]
    assert all(s.size <= 2 * one + 10 for s in log.segments)
    names = sorted(p.name for p in log.directory.glob("*.log"))
    assert names == [f"{b:020d}.log" for b in (0, 4, 8)]


def test_roll_on_segment_ms_uses_batch_timestamps(tmp_path: pathlib.Path) -> None:
    # The broker's clock (2_000) is past every timestamp: the batches' own times count.
    log = open_log(tmp_path, segment_ms=100)
    log.append_as_leader(batch(1, ts=1_000), leader_epoch=0, now_ms=2_000)
    log.append_as_leader(batch(1, ts=1_100), leader_epoch=0, now_ms=2_000)  # waited 100
    assert len(log.segments) == 1
    log.append_as_leader(batch(1, ts=1_101), leader_epoch=0, now_ms=2_000)  # waited 101: roll
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_follower_chunk_bigger_than_a_segment_is_split(tmp_path: pathlib.Path) -> None:
    one = len(batch(2, base_offset=0, epoch=0))
    log = open_log(tmp_path, segment_bytes=2 * one)
    chunk = b"".join(batch(2, base_offset=2 * i, epoch=0) for i in range(5))
    log.append_as_follower(chunk, now_ms=0)
    assert [s.base_offset for s in log.segments] == [0, 4, 8]
    assert b"".join(log.read(b, 1 << 20).records for b in (0, 4, 8)) == chunk


# -- truncation ------------------------------------------------------------------------------


def test_truncate_to_removes_batches_and_their_epochs(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path, segment_bytes=300)
    for epoch in (1, 1, 2, 2, 3, 3):
        log.append_as_leader(batch(2), leader_epoch=epoch, now_ms=0)
    assert log.truncate_to(6)
    assert log.leo == 6
    assert list(log.epoch_cache.entries) == [EpochEntry(1, 0), EpochEntry(2, 4)]
    assert stored_batches(log) == [(0, 1, 1), (2, 3, 1), (4, 5, 2)]
    on_disk = LeaderEpochCheckpointFile(log.directory / "leader-epoch-checkpoint").read()
    assert on_disk == [EpochEntry(1, 0), EpochEntry(2, 4)]
    info = log.append_as_leader(batch(1), leader_epoch=4, now_ms=0)
    assert info.first_offset == 6


def test_truncate_at_leo_still_drops_a_stray_epoch_entry(tmp_path: pathlib.Path) -> None:
    # KAFKA-10706: a leader that assigned (epoch, LEO) and wrote nothing must forget it.
    log = open_log(tmp_path)
    log.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
    log.maybe_assign_epoch_start_offset(2, log.leo)
    assert not log.truncate_to(log.leo)
    assert list(log.epoch_cache.entries) == [EpochEntry(1, 0)]


def test_truncate_below_the_first_segment_restarts_the_log(tmp_path: pathlib.Path) -> None:
    log = _filled(tmp_path, 8, segment_bytes=300)
    log.delete_retention(now_ms=10**12, high_watermark=log.leo - 1)  # all but the active segment
    first = log.segments[0].base_offset
    assert first > 0
    assert log.truncate_to(first - 1)
    assert (log.log_start_offset, log.leo) == (first - 1,) * 2
    assert len(log.segments) == 1 and log.epoch_cache.entries == ()


def test_truncate_fully_and_start_at(tmp_path: pathlib.Path) -> None:
    log = _filled(tmp_path)
    log.truncate_fully_and_start_at(100)
    assert (log.log_start_offset, log.leo, log.recovery_point) == (100,) * 3
    assert [s.base_offset for s in log.segments] == [100]
    info = log.append_as_follower(batch(2, base_offset=100, epoch=7), now_ms=0)
    assert info.first_offset == 100
    assert list(log.epoch_cache.entries) == [EpochEntry(7, 100)]


def test_negative_offsets_are_rejected(tmp_path: pathlib.Path) -> None:
    log = _filled(tmp_path)
    before = snapshot(log)
    with pytest.raises(OffsetOutOfRangeError):
        log.truncate_to(-1)
    with pytest.raises(OffsetOutOfRangeError):
        log.truncate_fully_and_start_at(-3)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)
    assert snapshot(log) == before


# -- HW, log start, retention ----------------------------------------------------------------


def test_the_log_holds_no_high_watermark(tmp_path: pathlib.Path) -> None:
    # The replication core alone holds it (it clamps its own, see test_replication_*); the log
    # is told it where it needs it (retention) and never keeps a copy that could drift.
    log = _filled(tmp_path)
    assert not hasattr(log, "high_watermark") and not hasattr(log, "update_high_watermark")
    assert not hasattr(log.read(0, 100), "high_watermark")


def test_log_start_offset_cannot_pass_the_log_end(tmp_path: pathlib.Path) -> None:
    # Keeping it at or below the HW is the core's rule (it asks only for offsets up to its HW).
    log = _filled(tmp_path)
    before = snapshot(log)
    with pytest.raises(OffsetOutOfRangeError):
        log.maybe_increment_log_start_offset(log.leo + 1)
    assert snapshot(log) == before
    assert log.maybe_increment_log_start_offset(4)
    assert not log.maybe_increment_log_start_offset(3)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(3, 100)
    assert log.read(4, 100).first_offset == 4


def test_retention_by_time_deletes_only_below_the_high_watermark(tmp_path: pathlib.Path) -> None:
    log = _filled(tmp_path, 10, segment_bytes=300, retention_ms=1_000)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 4
    deleted = log.delete_retention(now_ms=10_000, high_watermark=bases[2])
    # Only segments whose successor starts at or below the HW may go.
    assert [d.base_offset for d in deleted] == bases[:2]
    assert {d.reason for d in deleted} == {"retention.ms"}
    assert log.log_start_offset == bases[2]
    assert [s.base_offset for s in log.segments] == bases[2:]
    assert not any(log.directory.glob(f"{bases[0]:020d}.*"))
    with pytest.raises(OffsetOutOfRangeError):
        log.read(0, 100)


def test_retention_takes_an_expired_active_segment_after_a_roll(tmp_path: pathlib.Path) -> None:
    # Kafka: every segment expired and below the HW, the active one too, goes; the log rolls an
    # empty active segment at the LEO first (more in test_storage_idle_retention.py).
    log = _filled(tmp_path, 10, segment_bytes=300, retention_ms=0)
    log.delete_retention(now_ms=10**12, high_watermark=log.leo)
    assert [(s.base_offset, s.size) for s in log.segments] == [(20, 0)]
    assert log.log_start_offset == log.leo == 20


def test_retention_by_bytes(tmp_path: pathlib.Path) -> None:
    log = _filled(tmp_path, 10, segment_bytes=300)
    sizes = [s.size for s in log.segments]
    log.update_config(LogConfig(segment_bytes=300, retention_bytes=sum(sizes[2:])))
    deleted = log.delete_retention(now_ms=0, high_watermark=log.leo)
    assert [d.reason for d in deleted] == ["retention.bytes"] * 2
    assert log.size_bytes == sum(sizes[2:])


def test_retention_after_log_start_moves_up_trims_the_epoch_cache(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path, segment_bytes=300)
    for epoch in (1, 1, 2, 2, 3, 3, 3):
        log.append_as_leader(batch(2), leader_epoch=epoch, now_ms=0)
    log.maybe_increment_log_start_offset(9)
    deleted = log.delete_retention(now_ms=0, high_watermark=log.leo)
    assert deleted and {d.reason for d in deleted} == {"log_start_offset"}
    assert log.log_start_offset == 9
    assert list(log.epoch_cache.entries) == [EpochEntry(3, 9)]


# -- flush and reopen ------------------------------------------------------------------------


def test_flush_messages_advances_the_recovery_point(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path, flush_messages=5)
    log.append_as_leader(batch(3), leader_epoch=0, now_ms=0)
    assert log.recovery_point == 0
    log.append_as_leader(batch(3), leader_epoch=0, now_ms=0)
    assert log.recovery_point == 6


def test_maybe_flush_by_time(tmp_path: pathlib.Path) -> None:
    log = PartitionLog.open(tmp_path / "orders-0", TP, LogConfig(flush_ms=1_000), now_ms=0)
    log.append_as_leader(batch(3), leader_epoch=0, now_ms=0)
    assert not log.maybe_flush(now_ms=999)
    assert log.maybe_flush(now_ms=1_000)
    assert log.recovery_point == 3
    assert not log.maybe_flush(now_ms=5_000)  # nothing new to flush


def test_clean_reopen_keeps_everything(tmp_path: pathlib.Path) -> None:
    log = _filled(tmp_path, 12, segment_bytes=400, index_interval_bytes=0)
    log.maybe_assign_epoch_start_offset(4, log.leo)
    data = [log.read(s.base_offset, 1 << 20).records for s in log.segments]
    bases = [s.base_offset for s in log.segments]
    index_entries = [s.index.entries() for s in log.segments]
    log.flush()
    log.close()
    again = PartitionLog.open(
        tmp_path / "orders-0",
        TP,
        LogConfig(segment_bytes=400, index_interval_bytes=0),
        now_ms=0,
        recovery_point=log.leo,
        had_clean_shutdown=True,
    )
    assert again.leo == 24
    assert [s.base_offset for s in again.segments] == bases
    assert [again.read(b, 1 << 20).records for b in bases] == data
    assert [s.index.entries() for s in again.segments] == index_entries
    # Loading trims the cache to the LEO, as Kafka's LogLoader does: an epoch with no record
    # yet is dropped and its leader assigns it again at election.
    assert list(again.epoch_cache.entries) == [EpochEntry(0, 0)]
    assert again.append_as_leader(batch(), leader_epoch=4, now_ms=0).first_offset == 24
