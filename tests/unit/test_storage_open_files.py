"""Open file descriptors stay bounded however many segments a broker holds (README: file budget).

Only the active segment of each partition keeps its `.log` open; older segments' descriptors
live in a process-wide LRU of `INACTIVE_SEGMENT_FILES_MAX` (broker/storage/segment.py). These
tests build logs of 2,000 tiny segments and count `/proc/self/fd` while writing, reading every
segment, reopening (clean and with recovery), deleting by retention (segments whose descriptor
is cached among them) and truncating into a segment whose file is closed.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator

import pytest

from minibroker.broker.storage import segment as segment_module
from minibroker.broker.storage import segment_files as segment_files_module
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.data_dir import DataDir
from minibroker.broker.storage.log import PartitionLog
from minibroker.broker.storage.log_manager import LogManager
from minibroker.client.batch import iter_batches
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition

TP = TopicPartition("orders", 0)
SEGMENTS = 2_000
NOW = 1_700_000_000_000


def batch(i: int) -> bytes:
    return encode_batch([(NOW + i, None, b"value-%06d" % i, ())])


ONE = len(batch(0))
# One batch a segment: the second append no longer fits and rolls.
CONFIG = LogConfig(segment_bytes=ONE, index_interval_bytes=0)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def fds() -> Iterator[int]:
    """The descriptors open before the test; a cache left by other tests is emptied first."""
    cache = segment_module.INACTIVE_SEGMENT_FILES
    while len(cache):
        next(iter(cache._lru))._close_file()
    yield open_fds()


def budget(partitions: int) -> int:
    """The README's figure for storage: an active `.log` per partition plus the cache."""
    return partitions + segment_files_module.INACTIVE_SEGMENT_FILES_MAX


def fill(log: PartitionLog, count: int, start_fds: int, partitions: int = 1) -> None:
    for i in range(count):
        log.append_as_leader(batch(i), leader_epoch=0, now_ms=NOW + i)
        if i % 97 == 0:
            assert open_fds() - start_fds <= budget(partitions), i


def read_every_batch(log: PartitionLog, start_fds: int, partitions: int = 1) -> list[int]:
    """The base offset of every batch from the log start, one read per segment."""
    offsets: list[int] = []
    offset = log.log_start_offset
    while offset < log.leo:
        info = log.read(offset, 1 << 20)
        offsets += [h.base_offset for _, h in iter_batches(info.records)]
        offset = info.next_offset
        assert open_fds() - start_fds <= budget(partitions)
    return offsets


def test_2000_segments_keep_open_files_within_the_budget(tmp_path: pathlib.Path, fds: int) -> None:
    log = PartitionLog.open(tmp_path / "orders-0", TP, CONFIG, now_ms=NOW)
    fill(log, SEGMENTS, fds)
    assert len(log.segments) == SEGMENTS
    assert open_fds() - fds <= budget(1)
    assert read_every_batch(log, fds) == list(range(SEGMENTS))
    # Backwards too (each read misses the cache): still bounded, still right.
    for offset in range(SEGMENTS - 1, -1, -101):
        info = log.read(offset, 1 << 20)
        assert info.first_offset == offset
    assert open_fds() - fds <= budget(1)
    log.flush()
    log.close()
    assert open_fds() == fds

    for clean in (True, False):
        again = PartitionLog.open(
            tmp_path / "orders-0",
            TP,
            CONFIG,
            now_ms=NOW,
            recovery_point=SEGMENTS if clean else 0,
            had_clean_shutdown=clean,
        )
        assert open_fds() - fds <= budget(1)
        assert again.leo == SEGMENTS
        assert read_every_batch(again, fds) == list(range(SEGMENTS))
        again.append_as_leader(batch(SEGMENTS), leader_epoch=0, now_ms=NOW)
        assert again.leo == SEGMENTS + 1
        again.truncate_to(SEGMENTS)
        again.close()
        assert open_fds() == fds


def test_retention_deletes_segments_whose_files_are_cached(
    tmp_path: pathlib.Path, fds: int
) -> None:
    log = PartitionLog.open(tmp_path / "orders-0", TP, CONFIG, now_ms=NOW)
    fill(log, SEGMENTS, fds)
    # Read the oldest segments last: their descriptors are the cached ones.
    for offset in range(10):
        log.read(offset, 1 << 20)
    cached = [s for s in log.segments[:10] if s._fd >= 0]
    assert len(cached) == 10
    log.maybe_increment_log_start_offset(SEGMENTS // 2)
    deleted = log.delete_retention(now_ms=NOW, high_watermark=log.leo)
    assert len(deleted) == SEGMENTS // 2
    assert all(s._fd < 0 for s in cached)
    assert not any(s in segment_module.INACTIVE_SEGMENT_FILES._lru for s in cached)
    assert len(list(log.directory.glob("*.log"))) == SEGMENTS // 2
    assert open_fds() - fds <= budget(1)
    assert read_every_batch(log, fds) == list(range(SEGMENTS // 2, SEGMENTS))
    log.close()
    assert open_fds() == fds


def test_truncation_into_a_segment_whose_file_is_closed(tmp_path: pathlib.Path, fds: int) -> None:
    # Three batches a segment, 300 segments: segment 10 holds offsets 30-32.
    config = LogConfig(segment_bytes=3 * ONE, index_interval_bytes=0)
    log = PartitionLog.open(tmp_path / "orders-0", TP, config, now_ms=NOW)
    fill(log, 900, fds)
    target = log.segments[10]
    assert target.base_offset == 30
    assert target._fd < 0  # long closed by the cache
    log.truncate_to(31)  # inside segment 10, which becomes the active segment
    assert log.leo == 31 and log.segments[-1] is target
    assert target._fd >= 0 and target not in segment_module.INACTIVE_SEGMENT_FILES._lru
    assert len(list(log.directory.glob("*.log"))) == 11
    for i in range(31, 40):
        log.append_as_leader(batch(i), leader_epoch=0, now_ms=NOW)
    assert read_every_batch(log, fds) == list(range(40))
    assert [s.base_offset for s in log.segments] == [3 * i for i in range(14)]
    assert open_fds() - fds <= budget(1)
    log.close()
    assert open_fds() == fds


def test_many_partitions_share_the_cache(tmp_path: pathlib.Path, fds: int) -> None:
    data_dir = DataDir.open(tmp_path / "data", node_id=1, cluster_id="c")
    base = open_fds()  # the data dir's lock
    try:
        logs = LogManager.open(data_dir, CONFIG)
        tps = [TopicPartition("orders", p) for p in range(20)]
        for tp in tps:
            fill(logs.get_or_create_log(tp, topic_id="t", now_ms=NOW), 100, base, len(tps))
        assert open_fds() - base <= budget(len(tps))
        for tp in tps:
            assert read_every_batch(logs.logs[tp], base, len(tps)) == list(range(100))
        logs.close()
        assert open_fds() == base
        again = LogManager.open(data_dir, CONFIG)
        assert open_fds() - base <= budget(len(tps))
        assert [again.logs[tp].leo for tp in tps] == [100] * len(tps)
        again.close()
        assert open_fds() == base
    finally:
        data_dir.close()
