"""Disk failures in the middle of a storage write (docs/design.md §4.4, §4.6; storage/log.py).

The replica manager reads "append_as_leader / append_as_follower raised" as "the log is as it
was": the replication core only moves its LEO on success. These tests make the storage modules'
`os` fail on the Nth call (optionally after writing some bytes of the failing write; optionally
for good, until healed, so that the undo fails too) and check, for every failure point of an
append:
  * KafkaStorageError (a MiniBrokerError) is raised;
  * the LEO, the segments (size, offsets, timestamps), the in-memory indexes, the epoch cache
    and the bytes a read returns are exactly as before; no file descriptor leaks;
  * with a one-off failure, the `.log` files and the epoch checkpoint are byte-identical to
    before and each index file holds a prefix of its in-memory entries;
  * once the disk works again the same append succeeds, and after close and reopen (clean or
    with recovery) the directory is byte-identical to that of a log that never saw a failure.
Truncation and retention cannot be undone (files are gone): a failure must leave a consistent
log part of the way there, and a retry must finish the job.
"""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.broker.storage import checkpoint as checkpoint_module
from minibroker.broker.storage import epoch_checkpoint as epoch_checkpoint_module
from minibroker.broker.storage import index as index_module
from minibroker.broker.storage import log as log_module
from minibroker.broker.storage import log_loader as log_loader_module
from minibroker.broker.storage import log_manager as log_manager_module
from minibroker.broker.storage import segment as segment_module
from minibroker.broker.storage import segment_files as segment_files_module
from minibroker.broker.storage.checkpoint import LeaderEpochCheckpointFile
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.data_dir import DataDir
from minibroker.broker.storage.epoch_cache import EpochEntry
from minibroker.broker.storage.log import PartitionLog
from minibroker.broker.storage.log_manager import LogManager
from minibroker.client.batch import iter_batches
from minibroker.client.errors import KafkaStorageError, MiniBrokerError
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition

TP = TopicPartition("orders", 0)
_MODULES = (
    checkpoint_module,
    epoch_checkpoint_module,
    index_module,
    log_module,
    log_loader_module,
    log_manager_module,
    segment_module,
)
# The calls that touch the disk. Reads (pread) are counted too: a truncation reads headers.
_COUNTED = frozenset(
    {"open", "write", "ftruncate", "truncate", "fsync", "replace", "unlink", "pread"}
)
_MAX_FAILURE_POINTS = 80  # more disk calls than any single operation here makes


class DiskFaults:
    """Stands in for `os` in the storage modules: the `fail_at`-th counted call fails.

    `short_bytes`: a failing `write` first writes that many bytes for real (a short write
    followed by ENOSPC). `sticky`: every later counted call fails too, until `heal`.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.failed = 0
        self.fail_at: int | None = None
        self.sticky = False
        self.short_bytes = 0
        self._broken = False

    def arm(self, fail_at: int, *, sticky: bool = False, short_bytes: int = 0) -> None:
        self.calls, self.failed = 0, 0
        self.fail_at, self.sticky, self.short_bytes = fail_at, sticky, short_bytes
        self._broken = False

    def heal(self) -> None:
        self.fail_at = None
        self._broken = False

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """Look at the log without the faults (and without counting)."""
        saved = self.fail_at, self._broken, self.calls
        self.heal()
        try:
            yield
        finally:
            self.fail_at, self._broken, self.calls = saved

    def __getattr__(self, name: str) -> Any:
        real = getattr(os, name)
        if name not in _COUNTED:
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            n = self.calls
            self.calls += 1
            if self._broken or n == self.fail_at:
                self._broken = self.sticky
                self.failed += 1
                if name == "write" and self.short_bytes:
                    data = memoryview(args[1])
                    real(args[0], data[: min(self.short_bytes, len(data) - 1)])
                raise OSError(errno.ENOSPC, f"injected failure of os.{name}")
            return real(*args, **kwargs)

        return call


@pytest.fixture
def faults(monkeypatch: pytest.MonkeyPatch) -> DiskFaults:
    injector = DiskFaults()
    for module in _MODULES:
        monkeypatch.setattr(module, "os", injector)
    return injector


# -- helpers ---------------------------------------------------------------------------------


def batch(count: int = 2, *, ts: int = 1_000, base_offset: int = 0, epoch: int = -1) -> bytes:
    return encode_batch(
        [(ts + i, None, b"value-%d" % i, ()) for i in range(count)],
        base_offset=base_offset,
        partition_leader_epoch=epoch,
    )


def follower_chunk(start: int, batches: int, epoch: int, *, records: int = 2) -> bytes:
    return b"".join(
        batch(records, base_offset=start + i * records, epoch=epoch) for i in range(batches)
    )


def open_log(directory: pathlib.Path, config: LogConfig, **kwargs: Any) -> PartitionLog:
    return PartitionLog.open(directory, TP, config, now_ms=0, **kwargs)


def read_all(log: PartitionLog) -> list[tuple[int, bytes]]:
    """(base offset, bytes) of every batch, through `read`."""
    out = []
    offset = log.log_start_offset
    while offset < log.leo:
        info = log.read(offset, 1 << 20)
        for position, header in iter_batches(info.records):
            out.append((header.base_offset, bytes(info.records[position : position + header.size])))
        offset = info.next_offset
    return out


def memory_state(log: PartitionLog) -> tuple[object, ...]:
    """Everything an append may change, as the log holds it (not the files)."""
    segments = [
        (s.base_offset, s.mark(), s.index.entries(), s.time_index.entries(), s._active)
        for s in log.segments
    ]
    return (
        log.leo,
        log.log_start_offset,
        log.recovery_point,
        log.epoch_cache.entries,
        segments,
        read_all(log),
    )


def files(directory: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def data_files(directory: pathlib.Path) -> dict[str, bytes]:
    """The `.log` files and the epoch checkpoint: what must be byte-identical after an undo."""
    return {
        name: data
        for name, data in files(directory).items()
        if name.endswith(".log") or name == "leader-epoch-checkpoint"
    }


def open_fds(*holders: PartitionLog) -> int:
    """Open descriptors that no segment holds: less those the inactive-segment cache holds (an
    operation on one log may close the cached file of another: both logs share the cache), and
    less those the active segments of `holders` hold (an undone roll makes the old active
    segment active again, and the cache may have closed its file meanwhile: it is opened again
    when next used). Neither is a leak; a descriptor nobody holds is."""
    held = sum(1 for log in holders if log.active_segment._fd >= 0)
    return len(os.listdir("/proc/self/fd")) - len(segment_module.INACTIVE_SEGMENT_FILES) - held


def check_index_files(log: PartitionLog) -> None:
    """Each index file holds a prefix of its in-memory entries (the rest is pending), unless
    the index knows its file is stale (a cut failed too: it rewrites the file whole next)."""
    for segment in log.segments:
        for index, size in ((segment.index, 8), (segment.time_index, 12)):
            if index._stale:
                continue
            on_disk = index.path.read_bytes() if index.path.exists() else b""
            assert len(on_disk) % size == 0, index.path
            count = len(on_disk) // size
            entries = index.entries()
            assert count <= len(entries), index.path
            if index is segment.index:
                packed = b"".join(
                    index.entry.pack(o - segment.base_offset, p) for o, p in entries[:count]
                )
            else:
                packed = b"".join(
                    index.entry.pack(t, o - segment.base_offset) for t, o in entries[:count]
                )
            assert on_disk == packed, index.path


def reopened_files(log: PartitionLog, config: LogConfig, *, clean: bool) -> dict[str, bytes]:
    """Close, reopen (with or without recovery), close again: the directory's bytes."""
    start, leo = log.log_start_offset, log.leo
    expected = read_all(log)
    log.close()
    again = open_log(
        log.directory,
        config,
        recovery_point=leo if clean else 0,
        log_start_offset=start,
        had_clean_shutdown=clean,
    )
    assert again.leo == leo
    assert read_all(again) == expected
    again.close()
    return files(log.directory)


def exhaust_append(
    faults: DiskFaults,
    log: PartitionLog,
    append: Callable[[], object],
    *,
    sticky: bool = False,
    short_bytes: int = 0,
) -> int:
    """Make the append fail at each of its disk calls in turn, checking each undo; then let it
    succeed. Returns how many failure points were exercised."""
    for fail_at in range(_MAX_FAILURE_POINTS):
        before = memory_state(log)
        before_files = data_files(log.directory)
        if log._epochs.dirty:
            # A truncation could not rewrite the checkpoint (it only logs that); the append
            # rewrites it first, legitimately changing the file.
            before_files.pop("leader-epoch-checkpoint", None)
        fds = open_fds(log)
        faults.arm(fail_at, sticky=sticky, short_bytes=short_bytes)
        try:
            append()
        except MiniBrokerError as err:
            faults.heal()
            assert isinstance(err, KafkaStorageError), err
            assert faults.failed >= 1
            assert memory_state(log) == before, f"failure at disk call {fail_at}"
            assert open_fds(log) == fds, f"failure at disk call {fail_at} leaked a descriptor"
            if not sticky:
                after_files = data_files(log.directory)
                if "leader-epoch-checkpoint" not in before_files:
                    after_files.pop("leader-epoch-checkpoint", None)
                assert after_files == before_files, f"disk call {fail_at}"
                check_index_files(log)
            continue
        finally:
            faults.heal()
        assert faults.failed == 0, "a failure was swallowed"
        return fail_at
    raise AssertionError("the append never succeeded")


# -- appends: one failure point at a time -----------------------------------------------------


@pytest.mark.parametrize("short_bytes", [0, 1, 40])
def test_leader_append_failing_in_its_write_changes_nothing(
    tmp_path: pathlib.Path, faults: DiskFaults, short_bytes: int
) -> None:
    config = LogConfig()
    log = open_log(tmp_path / "orders-0", config)
    log.append_as_leader(batch(3), leader_epoch=1, now_ms=0)
    before = memory_state(log)
    size = log.active_segment.size
    faults.arm(0, short_bytes=short_bytes)  # the `.log` write
    with pytest.raises(KafkaStorageError, match="undone"):
        log.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
    faults.heal()
    assert memory_state(log) == before
    assert os.path.getsize(tmp_path / "orders-0" / f"{0:020d}.log") == size
    assert log.append_as_leader(batch(2), leader_epoch=1, now_ms=0).first_offset == 3
    assert [b for b, _ in read_all(log)] == [0, 3]


def test_index_group_write_failing_half_way_undoes_the_append(
    tmp_path: pathlib.Path, faults: DiskFaults
) -> None:
    # index.interval.bytes 0: every batch gets an index entry, and the 128th entry of the
    # call writes the pending group to the `.index` file after the `.log` write succeeded.
    config = LogConfig(index_interval_bytes=0)
    log = open_log(tmp_path / "orders-0", config)
    log.append_as_leader(batch(1), leader_epoch=0, now_ms=0)
    many = follower_chunk(1, 130, epoch=0, records=1)
    before = memory_state(log)
    log_size = log.active_segment.size
    faults.arm(2, short_bytes=13)  # 0: `.log` write, 1: open `.index`, 2: its write
    with pytest.raises(KafkaStorageError):
        log.append_as_follower(many, now_ms=0)
    faults.heal()
    assert memory_state(log) == before
    assert log.active_segment.size == log_size
    assert (tmp_path / "orders-0" / f"{0:020d}.log").stat().st_size == log_size
    assert (tmp_path / "orders-0" / f"{0:020d}.index").stat().st_size == 0
    log.append_as_follower(many, now_ms=0)
    assert log.leo == 131
    check_index_files(log)


def _rolled_log(directory: pathlib.Path, config: LogConfig) -> PartitionLog:
    log = open_log(directory, config)
    for _ in range(3):
        log.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
    return log


SCENARIOS: dict[str, tuple[LogConfig, Callable[[PartitionLog], object]]] = {
    # The active segment is full: the append rolls (index writes of the old segment, three new
    # files) before it writes.
    "leader append that rolls": (
        LogConfig(segment_bytes=3 * len(batch(2)), index_interval_bytes=0),
        lambda log: log.append_as_leader(batch(2), leader_epoch=1, now_ms=0),
    ),
    # The first batch of a new epoch: the epoch checkpoint is rewritten before the batch.
    "leader append of a new epoch": (
        LogConfig(),
        lambda log: log.append_as_leader(batch(2), leader_epoch=2, now_ms=0),
    ),
    # A follower chunk bigger than a segment: several writes with rolls in between.
    "follower chunk split over segments": (
        LogConfig(segment_bytes=4 * len(batch(2)), index_interval_bytes=0),
        lambda log: log.append_as_follower(follower_chunk(log.leo, 7, epoch=3), now_ms=0),
    ),
    # flush.messages 1: the append fsyncs every segment above the recovery point.
    "append that flushes": (
        LogConfig(flush_messages=1),
        lambda log: log.append_as_leader(batch(2), leader_epoch=1, now_ms=0),
    ),
}


@pytest.mark.parametrize("sticky", [False, True], ids=["one-off", "until-healed"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_failure_point_of_an_append_is_undone(
    tmp_path: pathlib.Path, faults: DiskFaults, scenario: str, sticky: bool
) -> None:
    config, append = SCENARIOS[scenario]
    log = _rolled_log(tmp_path / "a" / "orders-0", config)
    reference = _rolled_log(tmp_path / "b" / "orders-0", config)
    points = exhaust_append(faults, log, lambda: append(log), sticky=sticky, short_bytes=7)
    assert points >= 2, f"only {points} disk calls: the scenario does not reach the disk"
    append(reference)
    assert memory_state(log) == memory_state(reference)
    # One more append on the healed log, then the directories must match byte for byte.
    for each in (log, reference):
        each.append_as_leader(batch(1), leader_epoch=4, now_ms=0)
    assert reopened_files(log, config, clean=not sticky) == reopened_files(
        reference, config, clean=not sticky
    )


def test_a_failed_undo_is_finished_before_the_next_write(
    tmp_path: pathlib.Path, faults: DiskFaults
) -> None:
    # The write fails after 30 bytes and so does the cut that should remove them: the segment
    # must not append after the leftover bytes.
    config = LogConfig()
    log = open_log(tmp_path / "orders-0", config)
    log.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
    before = memory_state(log)
    path = tmp_path / "orders-0" / f"{0:020d}.log"
    size = path.stat().st_size
    faults.arm(0, sticky=True, short_bytes=30)
    with pytest.raises(KafkaStorageError):
        log.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
    with faults.suspended():
        assert memory_state(log) == before  # reads stop at the old size
    assert path.stat().st_size == size + 30
    with pytest.raises(KafkaStorageError, match="failed write"):
        log.append_as_leader(batch(2), leader_epoch=1, now_ms=0)  # still broken: no write
    faults.heal()
    assert log.append_as_leader(batch(2), leader_epoch=1, now_ms=0).first_offset == 2
    assert path.stat().st_size == size + len(batch(2))
    assert [b for b, _ in read_all(log)] == [0, 2]


def test_a_new_epoch_is_written_with_its_first_batch_and_a_failed_write_fails_the_append(
    tmp_path: pathlib.Path, faults: DiskFaults
) -> None:
    log = open_log(tmp_path / "orders-0", LogConfig())
    log.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
    checkpoint = tmp_path / "orders-0" / "leader-epoch-checkpoint"
    on_disk = checkpoint.read_bytes()
    faults.arm(10_000)  # count the calls only
    assert log.maybe_assign_epoch_start_offset(2, log.leo)
    assert faults.calls == 0  # a new leader's epoch touches no file
    assert log.epoch_cache.entries == (EpochEntry(1, 0), EpochEntry(2, 2))
    # 0-2: open the temp file, write, rename: the epoch's first batch is not written.
    for fail_at in range(3):
        faults.arm(fail_at)
        with pytest.raises(KafkaStorageError):
            log.append_as_leader(batch(2), leader_epoch=2, now_ms=0)
        faults.heal()
        assert log.leo == 2
        assert log.epoch_cache.entries == (EpochEntry(1, 0), EpochEntry(2, 2))
        assert not (tmp_path / "orders-0" / "leader-epoch-checkpoint.tmp").exists()
        assert checkpoint.read_bytes() == on_disk
    log.append_as_leader(batch(2), leader_epoch=2, now_ms=0)
    assert LeaderEpochCheckpointFile(checkpoint).read() == [EpochEntry(1, 0), EpochEntry(2, 2)]


def test_a_new_epoch_with_no_batch_is_written_at_close(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path / "orders-0", LogConfig())
    log.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
    assert log.maybe_assign_epoch_start_offset(2, log.leo)
    log.close()
    checkpoint = tmp_path / "orders-0" / "leader-epoch-checkpoint"
    assert LeaderEpochCheckpointFile(checkpoint).read() == [EpochEntry(1, 0), EpochEntry(2, 2)]


def test_flush_fsyncs_the_epoch_checkpoint_before_the_recovery_point_moves(
    tmp_path: pathlib.Path, faults: DiskFaults
) -> None:
    """A new epoch's entry is written without fsync; the flush that moves the recovery point
    past it fsyncs it first, and a failure there leaves the recovery point where it was."""
    log = open_log(tmp_path / "orders-0", LogConfig())
    log.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
    log.flush(0)
    log.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
    faults.arm(10_000)  # count the calls only
    log.flush(0)
    plain = faults.calls  # the segment's fsyncs: the checkpoint did not change
    assert log.recovery_point == 4
    assert log.maybe_assign_epoch_start_offset(2, log.leo)
    faults.arm(10_000)
    log.append_as_leader(batch(2), leader_epoch=2, now_ms=0)
    assert faults.calls == 4  # the checkpoint's open, write, rename (no fsync); the batch's write
    # After the segment's calls: open + fsync of the checkpoint, open + fsync of its dir.
    for k in range(4):
        faults.arm(plain + k)
        with pytest.raises(KafkaStorageError):
            log.flush(0)
        faults.heal()
        assert log.recovery_point == 4
    faults.arm(10_000)
    log.flush(0)
    assert faults.calls == plain + 4
    assert log.recovery_point == 6


def test_failed_roll_keeps_the_active_segment(tmp_path: pathlib.Path, faults: DiskFaults) -> None:
    log = open_log(tmp_path / "orders-0", LogConfig(index_interval_bytes=0))
    log.append_as_leader(batch(2), leader_epoch=1, now_ms=0)
    names = sorted(files(log.directory))
    before = memory_state(log)[:4]
    for fail_at in range(_MAX_FAILURE_POINTS):
        fds = open_fds()
        faults.arm(fail_at)
        try:
            rolled = log.roll(now_ms=0)
        except KafkaStorageError:
            faults.heal()
            assert [s.base_offset for s in log.segments] == [0]
            assert sorted(files(log.directory)) == names
            assert memory_state(log)[:4] == before
            assert open_fds() == fds
            check_index_files(log)
            continue
        finally:
            faults.heal()
        break
    assert fail_at >= 3  # the index writes of the old segment, the three new files
    assert rolled.base_offset == 2
    assert [s.base_offset for s in log.segments] == [0, 2]


# -- truncation and retention: consistent part of the way, finished by a retry ---------------


def _three_segments(directory: pathlib.Path) -> tuple[PartitionLog, LogConfig]:
    config = LogConfig(segment_bytes=2 * len(batch(2)), index_interval_bytes=0)
    log = open_log(directory, config)
    for epoch in (1, 1, 2, 2, 3, 3):
        log.append_as_leader(batch(2), leader_epoch=epoch, now_ms=0)
    return log, config


def _check_consistent_prefix(log: PartitionLog, full: list[tuple[int, bytes]]) -> None:
    """The log is a whole-batch prefix of `full` (plus, maybe, a raised log start)."""
    batches = read_all(log)
    assert batches == [b for b in full if log.log_start_offset <= b[0] < log.leo]
    # No epoch starts past the end (one may start at a log start raised up to the LEO).
    assert all(
        e.start_offset < log.leo or e.start_offset == log.log_start_offset
        for e in log.epoch_cache.entries
    )
    assert log.log_start_offset <= log.leo and log.recovery_point <= log.leo
    check_index_files(log)


TRUNCATIONS: dict[str, Callable[[PartitionLog], object]] = {
    "truncate_to inside the first segment": lambda log: log.truncate_to(1),
    "truncate_to a segment boundary": lambda log: log.truncate_to(4),
    "truncate_fully_and_start_at a new offset": lambda log: log.truncate_fully_and_start_at(50),
    "truncate_fully_and_start_at the first base": lambda log: log.truncate_fully_and_start_at(0),
}


@pytest.mark.parametrize("sticky", [False, True], ids=["one-off", "until-healed"])
@pytest.mark.parametrize("name", sorted(TRUNCATIONS))
def test_truncation_failing_anywhere_leaves_a_consistent_log_and_a_retry_finishes(
    tmp_path: pathlib.Path, faults: DiskFaults, name: str, sticky: bool
) -> None:
    truncate = TRUNCATIONS[name]
    log, config = _three_segments(tmp_path / "a" / "orders-0")
    reference, _ = _three_segments(tmp_path / "b" / "orders-0")
    full = read_all(log)
    truncate(reference)
    failures = 0
    for fail_at in range(_MAX_FAILURE_POINTS):
        faults.arm(fail_at, sticky=sticky)
        try:
            truncate(log)
        except MiniBrokerError as err:
            faults.heal()
            failures += 1
            assert isinstance(err, KafkaStorageError)
            assert log.leo <= 12  # part of the way: a prefix of the old log
            _check_consistent_prefix(log, full)
            continue
        finally:
            faults.heal()
        break
    assert failures >= 1
    assert memory_state(log)[:4] == memory_state(reference)[:4]
    assert read_all(log) == read_all(reference)
    for each in (log, reference):
        each.append_as_leader(batch(1), leader_epoch=4, now_ms=0)
    assert reopened_files(log, config, clean=False) == reopened_files(
        reference, config, clean=False
    )


def test_retention_failing_anywhere_deletes_oldest_first(
    tmp_path: pathlib.Path, faults: DiskFaults
) -> None:
    log, _ = _three_segments(tmp_path / "orders-0")
    full = read_all(log)
    failures = 0
    for fail_at in range(_MAX_FAILURE_POINTS):
        faults.arm(fail_at)
        try:
            # retention.ms: every segment, the active one after a roll at the LEO (12)
            log.delete_retention(now_ms=10**12, high_watermark=log.leo)
        except KafkaStorageError:
            faults.heal()
            failures += 1
            assert log.log_start_offset == log.segments[0].base_offset
            _check_consistent_prefix(log, full)
            continue
        finally:
            faults.heal()
        break
    assert failures >= 1
    assert [(s.base_offset, s.size) for s in log.segments] == [(12, 0)]
    assert log.log_start_offset == log.leo == 12
    assert sorted(p.name for p in log.directory.glob("*.log")) == [f"{12:020d}.log"]
    assert log.epoch_cache.entries == (EpochEntry(3, 12),)


def test_log_manager_close_closes_every_log_when_the_flush_fails(
    tmp_path: pathlib.Path, faults: DiskFaults
) -> None:
    # The broker marks a shutdown clean only after LogManager.close returned: a failed flush
    # must raise (recovery runs at the next start), yet no file may stay open.
    data_dir = DataDir.open(tmp_path, node_id=1, cluster_id="c")
    try:
        logs = LogManager.open(data_dir, LogConfig())
        tps = [TopicPartition("orders", p) for p in range(3)]
        for tp in tps:
            logs.get_or_create_log(tp, topic_id="t").append_as_leader(
                batch(2), leader_epoch=1, now_ms=0
            )
        fds = open_fds()
        faults.arm(0)  # the first fsync of the flush (a KafkaStorageError)
        with pytest.raises(KafkaStorageError):
            logs.close()
        faults.heal()
        assert open_fds() == fds - 3  # each log's one `.log` descriptor
        again = LogManager.open(data_dir, LogConfig())
        assert [again.logs[tp].leo for tp in tps] == [2, 2, 2]
        again.close()
    finally:
        data_dir.close()


# -- any sequence, any failure point ----------------------------------------------------------

_OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("leader"), st.integers(1, 3), st.integers(0, 2)),
        st.tuples(st.just("follower"), st.integers(1, 6), st.integers(0, 2)),
        st.tuples(st.just("truncate"), st.integers(0, 6), st.just(0)),
        st.tuples(st.just("roll"), st.just(0), st.just(0)),
        st.tuples(st.just("restart"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("retain"), st.integers(0, 4), st.just(0)),
    ),
    min_size=1,
    max_size=6,
)


def _apply(log: PartitionLog, op: tuple[str, int, int], epoch_base: int) -> Callable[[], object]:
    kind, size, epoch_step = op
    epoch = epoch_base + epoch_step
    if kind == "leader":
        records = b"".join(batch(2) for _ in range(size))
        return lambda: log.append_as_leader(records, leader_epoch=epoch, now_ms=0)
    if kind == "follower":
        chunk = follower_chunk(log.leo, size, epoch=epoch)
        return lambda: log.append_as_follower(chunk, now_ms=0)
    if kind == "truncate":
        offset = max(log.leo - 2 * size, 0)
        return lambda: log.truncate_to(offset)
    if kind == "restart":
        offset = log.leo + 2 * size
        return lambda: log.truncate_fully_and_start_at(offset)
    if kind == "retain":
        start = max(log.log_start_offset, log.leo - 2 * size)

        def retain() -> None:
            log.maybe_increment_log_start_offset(start)
            # retention.ms is a week: the log start rule only
            log.delete_retention(now_ms=0, high_watermark=log.leo)

        return retain
    return lambda: log.roll(now_ms=0)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    operations=_OPERATIONS,
    sticky=st.booleans(),
    short_bytes=st.sampled_from([0, 1, 9, 100]),
    segment_batches=st.integers(2, 5),
    index_interval_bytes=st.sampled_from([0, 100]),
    pending_entries_max=st.sampled_from([1, 3, index_module.PENDING_ENTRIES_MAX]),
    flush_messages=st.sampled_from([1, 2**63 - 1]),
    cached_files=st.sampled_from([1, segment_files_module.INACTIVE_SEGMENT_FILES_MAX]),
)
def test_any_failure_point_of_any_operation(
    tmp_path: pathlib.Path,
    faults: DiskFaults,
    operations: list[tuple[str, int, int]],
    sticky: bool,
    short_bytes: int,
    segment_batches: int,
    index_interval_bytes: int,
    pending_entries_max: int,
    flush_messages: int,
    cached_files: int,
) -> None:
    """A failed append changes nothing; a failed truncation, retention or roll leaves a
    consistent log; healed, the same operations give the directory a log without failures has.
    With `cached_files` 1, inactive segments' files are closed and opened again all the time, so
    those opens fail too."""
    root = tmp_path / f"run-{os.getpid()}-{id(operations)}"
    config = LogConfig(
        segment_bytes=segment_batches * len(batch(2)),
        index_interval_bytes=index_interval_bytes,
        flush_messages=flush_messages,
    )
    with _two_logs(root, config, pending_entries_max, cached_files) as (log, reference):
        epoch_base = 1
        for op in operations:
            _apply(reference, op, epoch_base)()
            expected = memory_state(reference)
            action = _apply(log, op, epoch_base)  # its offsets come from the LEO now
            if op[0] in ("leader", "follower"):
                exhaust_append(faults, log, action, sticky=sticky, short_bytes=short_bytes)
            else:
                full = read_all(log)
                for fail_at in range(_MAX_FAILURE_POINTS):
                    faults.arm(fail_at, sticky=sticky, short_bytes=short_bytes)
                    try:
                        action()
                    except KafkaStorageError:
                        faults.heal()
                        _check_consistent_prefix(log, full)
                        continue
                    finally:
                        faults.heal()
                    break
            assert memory_state(log)[:4] == expected[:4]
            assert read_all(log) == expected[5]
            epoch_base += op[2]
        for each in (log, reference):
            each.append_as_leader(batch(1), leader_epoch=epoch_base + 1, now_ms=0)
        assert reopened_files(log, config, clean=False) == reopened_files(
            reference, config, clean=False
        )


@contextmanager
def _two_logs(
    root: pathlib.Path, config: LogConfig, pending_entries_max: int, cached_files: int
) -> Iterator[tuple[PartitionLog, PartitionLog]]:
    """Two fresh logs; index groups of `pending_entries_max` entries (small: index files are
    written during appends too); `cached_files` descriptors of inactive segments."""
    saved = index_module.PENDING_ENTRIES_MAX
    cache = segment_module.INACTIVE_SEGMENT_FILES
    saved_capacity = cache.capacity
    index_module.PENDING_ENTRIES_MAX = pending_entries_max
    cache.capacity = cached_files
    logs: list[PartitionLog] = []
    try:
        logs = [
            open_log(root / "a" / "orders-0", config),
            open_log(root / "b" / "orders-0", config),
        ]
        yield logs[0], logs[1]
    finally:
        index_module.PENDING_ENTRIES_MAX = saved
        cache.capacity = saved_capacity
        for log in logs:
            log.close()
        shutil.rmtree(root, ignore_errors=True)
