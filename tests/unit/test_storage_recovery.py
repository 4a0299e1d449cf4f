"""Crash recovery of a partition log (docs/design.md §4.5 and §8.6).

After a stop the log must come back as a prefix of what was written: no torn or corrupt batch
kept, and no whole good batch before the damage dropped. Damage is made by cutting a segment at
a random byte and by flipping random bytes, including the header fields the CRC does not cover
(baseOffset, partitionLeaderEpoch). A clean shutdown skips recovery, but damage found while
loading is handled the same way as after a crash (issue 11 item 6): the log is cut at it. That
check (or the recovery) is the load's only read of the log: the idempotent-producer state and a
lost epoch checkpoint are rebuilt from the same pass, from exactly the batches that remain.
"""

from __future__ import annotations

import os
import pathlib
import random
import shutil
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.replication.producer_state import ProducerStateManager
from minibroker.broker.storage.checkpoint import LeaderEpochCheckpointFile
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.data_dir import CLEAN_SHUTDOWN_FILE, DataDir
from minibroker.broker.storage.epoch_cache import EpochEntry
from minibroker.broker.storage.log import PartitionLog
from minibroker.broker.storage.log_manager import LogManager
from minibroker.broker.storage.segment import LogSegment
from minibroker.client.batch import HEADER_SIZE, iter_batches, read_header
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition

TP = TopicPartition("events", 3)
# Random damage needs many logs; tmpfs makes their checkpoint fsyncs free (the damage, not
# durability, is under test here).
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
CONFIG = LogConfig(segment_bytes=700, index_interval_bytes=120)


def build_log(root: pathlib.Path, seed: int, batches: int = 18) -> tuple[PartitionLog, list[bytes]]:
    """A log of follower-appended batches with growing epochs; returns it and the batch bytes."""
    rng = random.Random(seed)
    log = PartitionLog.open(root / "events-3", TP, CONFIG, now_ms=0)
    written: list[bytes] = []
    epoch = 0
    for _ in range(batches):
        if rng.random() < 0.2:
            epoch += rng.randint(1, 3)
        count = rng.randint(1, 4)
        value = bytes(rng.getrandbits(8) for _ in range(rng.randint(5, 60)))
        data = encode_batch(
            [(1_000 + len(written) + i, None, value, ()) for i in range(count)],
            base_offset=log.leo,
            partition_leader_epoch=epoch,
        )
        log.append_as_follower(data, now_ms=0)
        written.append(data)
    log.close()  # no flush, no checkpoint: an unclean stop as far as recovery is concerned
    return log, written


def reopen(root: pathlib.Path, *, clean: bool = False) -> PartitionLog:
    return PartitionLog.open(
        root / "events-3", TP, CONFIG, now_ms=0, recovery_point=0, had_clean_shutdown=clean
    )


def batches_of(log: PartitionLog) -> list[bytes]:
    """Every batch in the log, each validated (length, magic, CRC) as it is split out."""
    out = []
    for segment in log.segments:
        info = log.read(segment.base_offset, 1 << 30) if segment.size else None
        if info is None:
            continue
        data = info.records
        for position, header in iter_batches(data):
            read_header(data, position)
            out.append(data[position : position + header.size])
    return out


def segment_layout(root: pathlib.Path) -> list[tuple[pathlib.Path, int]]:
    files = sorted((root / "events-3").glob("*.log"))
    return [(f, f.stat().st_size) for f in files]


def expected_prefix(written: list[bytes], segment_sizes: list[int], seg: int, pos: int) -> int:
    """How many batches lie wholly before byte `pos` of segment `seg`."""
    before = 0
    index = 0
    for i, size in enumerate(segment_sizes):
        used = 0
        while index < len(written) and used + len(written[index]) <= size:
            if i == seg and used + len(written[index]) > pos:
                return before
            used += len(written[index])
            before += 1
            index += 1
        if i == seg:
            return before
    return before


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    where=st.floats(0, 1, exclude_max=True),
    which=st.data(),
    clean=st.booleans(),
)
def test_cut_segment_recovers_the_exact_prefix(
    seed: int, where: float, which: st.DataObject, clean: bool
) -> None:
    root = pathlib.Path(tempfile.mkdtemp(prefix="mb-cut-", dir=SCRATCH))
    try:
        _check_cut(root, seed, where, which, clean)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _check_cut(
    root: pathlib.Path, seed: int, where: float, which: st.DataObject, clean: bool
) -> None:
    _, written = build_log(root, seed)
    layout = segment_layout(root)
    seg = which.draw(st.integers(0, len(layout) - 1))
    path, size = layout[seg]
    cut = int(where * size)
    os.truncate(path, cut)
    log = reopen(root, clean=clean)
    kept = batches_of(log)
    n = expected_prefix(written, [s for _, s in layout], seg, cut)
    assert kept == written[:n]
    assert log.leo == (read_header(written[n - 1]).next_offset if n else 0)
    # Later segments are gone with the tear.
    assert len(log.segments) <= seg + 1
    assert all(entry.start_offset < log.leo for entry in log.epoch_cache.entries)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), flip=st.data(), clean=st.booleans())
def test_flipped_byte_recovers_the_prefix_before_the_damaged_batch(
    seed: int, flip: st.DataObject, clean: bool
) -> None:
    root = pathlib.Path(tempfile.mkdtemp(prefix="mb-flip-", dir=SCRATCH))
    try:
        _check_flip(root, seed, flip, clean)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _check_flip(root: pathlib.Path, seed: int, flip: st.DataObject, clean: bool) -> None:
    _, written = build_log(root, seed)
    layout = segment_layout(root)
    seg = flip.draw(st.integers(0, len(layout) - 1))
    path, size = layout[seg]
    position = flip.draw(st.integers(0, size - 1))
    mask = flip.draw(st.integers(1, 255))
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))
    # After a clean shutdown recovery is skipped, yet the damage is found and cut the same way.
    log = reopen(root, clean=clean)
    kept = batches_of(log)
    # Everything before the damaged batch survives; the damaged batch and all after it go.
    n = expected_prefix(written, [s for _, s in layout], seg, position)
    damaged_start = sum(len(b) for b in written[:n])
    assert kept == written[:n], (
        f"flip at {position} of segment {seg} (batch starts {damaged_start})"
    )


def test_torn_tail_after_a_clean_shutdown_is_still_cut(tmp_path: pathlib.Path) -> None:
    _, written = build_log(tmp_path, seed=7)
    path, size = segment_layout(tmp_path)[-1]
    os.truncate(path, size - 3)
    log = reopen(tmp_path, clean=True)
    assert batches_of(log) == written[:-1]


def test_deleted_index_files_are_rebuilt(tmp_path: pathlib.Path) -> None:
    _, written = build_log(tmp_path, seed=11)
    original = reopen(tmp_path, clean=True)
    offsets = [s.index.entries() for s in original.segments]
    times = [s.time_index.entries() for s in original.segments]
    original.close()
    directory = tmp_path / "events-3"
    for path in list(directory.glob("*.index"))[::2] + list(directory.glob("*.timeindex"))[1::2]:
        path.unlink()
    again = reopen(tmp_path, clean=True)
    assert [s.index.entries() for s in again.segments] == offsets
    assert [s.time_index.entries() for s in again.segments] == times
    assert batches_of(again) == written
    again.close()
    assert len(list(directory.glob("*.index"))) == len(list(directory.glob("*.log")))
    assert len(list(directory.glob("*.timeindex"))) == len(list(directory.glob("*.log")))


def test_inconsistent_index_is_rebuilt(tmp_path: pathlib.Path) -> None:
    _, written = build_log(tmp_path, seed=12)
    directory = tmp_path / "events-3"
    index_files = sorted(directory.glob("*.index"))
    index_files[0].write_bytes(b"\x00\x00\x00\x05\x7f\x00\x00\x00")  # position past the end
    index_files[-1].write_bytes(b"\x01\x02\x03")  # not a whole entry
    log = reopen(tmp_path, clean=True)
    assert batches_of(log) == written
    for segment in log.segments:
        for offset, position in segment.index.entries():
            assert segment.translate_offset(offset) is not None
            assert position < segment.size
    # Lookups through the rebuilt index land on the right batches.
    for data in written:
        header = read_header(data)
        info = log.read(header.last_offset, 1)
        assert info.first_offset == header.base_offset


def test_missing_epoch_checkpoint_is_rebuilt_from_the_batches(tmp_path: pathlib.Path) -> None:
    log, _ = build_log(tmp_path, seed=5)
    expected = log.epoch_cache.entries
    (tmp_path / "events-3" / "leader-epoch-checkpoint").unlink()
    again = reopen(tmp_path, clean=True)
    assert again.epoch_cache.entries == expected
    on_disk = LeaderEpochCheckpointFile(tmp_path / "events-3" / "leader-epoch-checkpoint").read()
    assert on_disk == list(expected)


def test_epoch_entries_past_the_leo_are_dropped_on_open(tmp_path: pathlib.Path) -> None:
    # A crash between writing the checkpoint for a new epoch and writing its first batch.
    log, _ = build_log(tmp_path, seed=5)
    entries = [*log.epoch_cache.entries, EpochEntry(99, log.leo)]
    LeaderEpochCheckpointFile(tmp_path / "events-3" / "leader-epoch-checkpoint").write(entries)
    again = reopen(tmp_path)
    assert again.epoch_cache.entries == log.epoch_cache.entries


def _epoch_log(root: pathlib.Path, epochs: list[int]) -> PartitionLog:
    """A log with one 2-record batch per item of `epochs` (follower appends)."""
    log = PartitionLog.open(root / "events-3", TP, CONFIG, now_ms=0)
    for epoch in epochs:
        data = encode_batch(
            [(1_000 + log.leo + i, None, b"v", ()) for i in range(2)],
            base_offset=log.leo,
            partition_leader_epoch=epoch,
        )
        log.append_as_follower(data, now_ms=0)
    return log


def test_epochs_above_the_recovery_point_are_learned_after_a_power_loss(
    tmp_path: pathlib.Path,
) -> None:
    # New epochs' entries are written without fsync; the flush fsyncs them. A power loss takes
    # the file back to what the last flush made durable, while the batches after it survived.
    log = _epoch_log(tmp_path, [1, 1, 1])
    log.flush(0)
    durable = (tmp_path / "events-3" / "leader-epoch-checkpoint").read_bytes()
    recovery_point = log.recovery_point
    assert log.maybe_assign_epoch_start_offset(2, log.leo)
    for epoch in (2, 2, 4):
        log.append_as_follower(
            encode_batch(
                [(1_000 + log.leo, None, b"w", ())],
                base_offset=log.leo,
                partition_leader_epoch=epoch,
            ),
            now_ms=0,
        )
    expected, leo = log.epoch_cache.entries, log.leo
    assert expected == (EpochEntry(1, 0), EpochEntry(2, 6), EpochEntry(4, 8))
    log.close()
    (tmp_path / "events-3" / "leader-epoch-checkpoint").write_bytes(durable)
    again = PartitionLog.open(
        tmp_path / "events-3",
        TP,
        CONFIG,
        now_ms=0,
        recovery_point=recovery_point,
        system_restarted=True,
    )
    assert again.leo == leo  # nothing cut
    assert again.epoch_cache.entries == expected
    on_disk = LeaderEpochCheckpointFile(tmp_path / "events-3" / "leader-epoch-checkpoint").read()
    assert on_disk == list(expected)


def test_the_epoch_checkpoint_is_still_checked_below_the_recovery_point(
    tmp_path: pathlib.Path,
) -> None:
    # Below the recovery point the file is durable even after a power loss: a batch whose
    # epoch disagrees with it is corrupt (the epoch field is outside the CRC) and the log is
    # cut there.
    log = _epoch_log(tmp_path, [1, 1, 2, 2])
    log.flush(0)
    recovery_point = log.recovery_point
    log.close()
    first = min(tmp_path.joinpath("events-3").glob("*.log"))
    raw = bytearray(first.read_bytes())
    second = [position for position, _ in iter_batches(bytes(raw))][1]  # offsets 2-3
    raw[second + 12 : second + 16] = (2).to_bytes(4, "big")  # its partitionLeaderEpoch: 1 -> 2
    first.write_bytes(bytes(raw))
    again = PartitionLog.open(
        tmp_path / "events-3",
        TP,
        CONFIG,
        now_ms=0,
        recovery_point=recovery_point,
        system_restarted=True,
    )
    assert again.leo == 2
    assert again.epoch_cache.entries == (EpochEntry(1, 0),)


def test_epochs_above_the_recovery_point_still_never_go_back(
    tmp_path: pathlib.Path,
) -> None:
    log = _epoch_log(tmp_path, [1, 3])
    log.flush(0)
    recovery_point = log.recovery_point
    log.append_as_follower(
        encode_batch([(1_000, None, b"w", ())], base_offset=log.leo, partition_leader_epoch=3),
        now_ms=0,
    )
    log.close()
    # The last batch's epoch field flipped to 2, after a batch of epoch 3.
    last = max(tmp_path.joinpath("events-3").glob("*.log"))
    raw = bytearray(last.read_bytes())
    at = [position for position, _ in iter_batches(bytes(raw))][-1]
    raw[at + 12 : at + 16] = (2).to_bytes(4, "big")
    last.write_bytes(bytes(raw))
    again = PartitionLog.open(
        tmp_path / "events-3",
        TP,
        CONFIG,
        now_ms=0,
        recovery_point=recovery_point,
        system_restarted=True,
    )
    assert again.leo == recovery_point
    assert again.epoch_cache.entries == (EpochEntry(1, 0), EpochEntry(3, 2))


def test_log_start_beyond_the_end_restarts_the_log_there(tmp_path: pathlib.Path) -> None:
    log, _ = build_log(tmp_path, seed=3)
    again = PartitionLog.open(
        tmp_path / "events-3", TP, CONFIG, now_ms=0, log_start_offset=log.leo + 10
    )
    assert (again.log_start_offset, again.leo) == (log.leo + 10, log.leo + 10)
    assert [s.base_offset for s in again.segments] == [log.leo + 10]


def test_log_start_beyond_the_end_without_an_epoch_checkpoint_starts_with_no_epochs(
    tmp_path: pathlib.Path,
) -> None:
    # The epochs the load saw belong to batches that are all gone (Kafka clears the cache).
    log, _ = build_log(tmp_path, seed=3)
    assert log.epoch_cache.entries
    (tmp_path / "events-3" / "leader-epoch-checkpoint").unlink()
    again = PartitionLog.open(
        tmp_path / "events-3", TP, CONFIG, now_ms=0, log_start_offset=log.leo + 10
    )
    assert again.epoch_cache.entries == ()
    assert again.producer_batch_headers() == []


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), chunk=st.integers(13, 400), cut=st.floats(0, 1))
def test_recovery_reads_batches_that_straddle_its_read_chunks(
    seed: int, chunk: int, cut: float
) -> None:
    # Recovery reads the .log in chunks (8 MiB in production); a batch cut in two by a chunk
    # boundary must be re-read whole, not taken for a torn batch.
    from minibroker.broker.storage import segment_scan

    root = pathlib.Path(tempfile.mkdtemp(prefix="mb-chunk-", dir=SCRATCH))
    saved = segment_scan.SCAN_CHUNK
    segment_scan.SCAN_CHUNK = chunk
    try:
        _, written = build_log(root, seed, batches=10)
        layout = segment_layout(root)
        path, size = layout[-1]
        position = int(cut * size)
        os.truncate(path, position)
        log = reopen(root)
        n = expected_prefix(written, [s for _, s in layout], len(layout) - 1, position)
        assert batches_of(log) == written[:n]
        log.close()
    finally:
        segment_scan.SCAN_CHUNK = saved
        shutil.rmtree(root, ignore_errors=True)


# -- corruption after a clean shutdown (issue 11 item 6) ---------------------------------------

PID = 4242


def _producer_batch(seq: int, count: int = 3) -> bytes:
    return encode_batch(
        [(1_000 + seq + i, None, b"value-%d" % (seq + i), ()) for i in range(count)],
        producer_id=PID,
        producer_epoch=0,
        base_sequence=seq,
    )


def test_a_corrupt_batch_after_a_clean_shutdown_is_cut_and_the_broker_loads(
    tmp_path: pathlib.Path,
) -> None:
    tp = TopicPartition("orders", 0)
    config = LogConfig(segment_bytes=1 << 20, index_interval_bytes=64)
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir, config)
        log = logs.get_or_create_log(tp, topic_id="tid")
        for i in range(5):
            log.append_as_leader(_producer_batch(3 * i), leader_epoch=0, now_ms=0)
        logs.checkpoint_high_watermarks({tp: log.leo})
        written = batches_of(log)
        logs.close()
        data_dir.mark_clean_shutdown(7)
    # Bit rot in the middle batch (a byte of its records, under the CRC); the length stays.
    segment = tmp_path / "orders-0" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    middle = sum(len(b) for b in written[:2])
    data[middle + HEADER_SIZE + 6] ^= 0x40
    segment.write_bytes(bytes(data))

    with DataDir.open(tmp_path, node_id=1) as data_dir:
        assert data_dir.had_clean_shutdown
        assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()  # consumed: a crash now recovers
        logs = LogManager.open(data_dir, config)
        log = logs.get_log(tp)
        assert log is not None
        assert batches_of(log) == written[:2]
        hw = logs.checkpointed_high_watermark(tp)
        assert (log.leo, hw, log.recovery_point) == (6, 6, 6)
        assert segment.stat().st_size == middle
        # The producer state is rebuilt from what remains: the next sequence is 6.
        state = ProducerStateManager()
        state.rebuild(log.producer_batch_headers())
        entry = state.entry(PID)
        assert entry is not None and entry.last_seq == 5
        logs.close()
        data_dir.mark_clean_shutdown(8)
    # The cut log is what the next start sees, whatever the shutdown.
    for clean in (True, False):
        with DataDir.open(tmp_path, node_id=1) as data_dir:
            assert data_dir.had_clean_shutdown == clean
            logs = LogManager.open(data_dir, config)
            log = logs.get_log(tp)
            assert log is not None and batches_of(log) == written[:2]
            logs.close()  # no marker the second time round: an unclean stop


def test_a_corrupt_flushed_segment_below_the_recovery_point_is_cut_too(
    tmp_path: pathlib.Path,
) -> None:
    # An unclean stop recovers from the recovery point on; damage in older, flushed segments
    # is found while loading and handled the same way.
    _, written = build_log(tmp_path, seed=21)
    layout = segment_layout(tmp_path)
    assert len(layout) >= 3
    path, _ = layout[0]
    data = bytearray(path.read_bytes())
    first = read_header(data)
    data[first.size + 40] ^= 0x01  # the second batch of the first segment
    path.write_bytes(bytes(data))
    log = PartitionLog.open(tmp_path / "events-3", TP, CONFIG, now_ms=0, recovery_point=10**6)
    assert batches_of(log) == written[:1]
    assert len(log.segments) == 1


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), chunk=st.integers(1, 400), flip=st.data())
def test_the_load_time_check_reads_batches_that_straddle_its_chunks(
    seed: int, chunk: int, flip: st.DataObject
) -> None:
    # The check of segments that recovery skips reads in chunks too (8 MiB in production):
    # an undamaged log loads whole, a damaged one is cut right before the damaged batch.
    from minibroker.broker.storage import log_loader, segment_scan

    root = pathlib.Path(tempfile.mkdtemp(prefix="mb-scan-", dir=SCRATCH))
    saved = segment_scan.SCAN_CHUNK
    segment_scan.SCAN_CHUNK = chunk
    try:
        _, written = build_log(root / "whole", seed, batches=10)
        whole = reopen(root / "whole", clean=True)
        assert batches_of(whole) == written
        # Found sound as it is (a false alarm would only cost a needless recovery).
        check = log_loader.RecoveryCheck(whole.epoch_cache)
        for segment in whole.segments:
            assert segment.find_damage(check) is None
        whole.close()
        _check_flip(root / "damaged", seed, flip, clean=True)
    finally:
        segment_scan.SCAN_CHUNK = saved
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize(
    ("field", "at"),
    [
        ("baseOffset (outside the CRC)", 7),
        ("partitionLeaderEpoch (outside the CRC)", 15),
        ("a record byte (under the CRC)", HEADER_SIZE + 2),
    ],
)
def test_each_kind_of_damage_after_a_clean_shutdown_is_cut(
    tmp_path: pathlib.Path, field: str, at: int
) -> None:
    # Long segments, so the damage lies well before the last index entry: the index is
    # consistent and only the load-time check can find it.
    config = LogConfig(segment_bytes=3000, index_interval_bytes=120)
    log = PartitionLog.open(tmp_path / "events-3", TP, config, now_ms=0)
    written = []
    for i in range(60):
        data = encode_batch(
            [(1_000 + i, None, b"v%d" % i, ())], base_offset=log.leo, partition_leader_epoch=i // 7
        )
        log.append_as_follower(data, now_ms=0)
        written.append(data)
    log.flush()
    log.close()
    first_segment = segment_layout(tmp_path)[0][0]
    data = bytearray(first_segment.read_bytes())
    damaged = 5
    position = sum(len(b) for b in written[:damaged])
    assert position < 3 * 120  # index entries follow the damaged batch
    data[position + at] ^= 0x04
    first_segment.write_bytes(bytes(data))
    again = PartitionLog.open(
        tmp_path / "events-3", TP, config, now_ms=0, recovery_point=log.leo, had_clean_shutdown=True
    )
    assert batches_of(again) == written[:damaged], field
    assert len(again.segments) == 1


def test_an_epoch_going_back_is_cut_without_an_epoch_checkpoint(tmp_path: pathlib.Path) -> None:
    # With the checkpoint lost, only "epochs never go back" can tell that a batch's
    # partitionLeaderEpoch (outside the CRC) was damaged; the cache is rebuilt from what stays.
    log = PartitionLog.open(tmp_path / "events-3", TP, CONFIG, now_ms=0)
    written = []
    for i in range(12):
        data = encode_batch(
            [(1_000 + i, None, b"v%d" % i, ())], base_offset=log.leo, partition_leader_epoch=i // 3
        )
        log.append_as_follower(data, now_ms=0)
        written.append(data)
    log.flush()
    log.close()
    (tmp_path / "events-3" / "leader-epoch-checkpoint").unlink()
    damaged = 7  # epoch 2, written as 0
    first_segment = segment_layout(tmp_path)[0][0]
    data = bytearray(first_segment.read_bytes())
    position = sum(len(b) for b in written[:damaged])
    assert position + len(written[damaged]) <= len(data)
    data[position + 15] ^= 0x02
    first_segment.write_bytes(bytes(data))
    again = reopen(tmp_path, clean=True)
    assert batches_of(again) == written[:damaged]
    assert again.epoch_cache.entries == (EpochEntry(0, 0), EpochEntry(1, 3), EpochEntry(2, 6))


# -- one pass: loading reads each byte once, the producer state comes from that pass ------------


class CountingOs:
    """Stands in for `os` in the storage modules and counts the bytes `pread` returns from
    `.log` files (the index files are read by other calls)."""

    def __init__(self) -> None:
        self.log_bytes = 0
        self._logs: set[int] = set()

    def open(self, path: str | os.PathLike[str], flags: int, *args: int) -> int:
        fd = os.open(path, flags, *args)
        if os.fspath(path).endswith(".log"):
            self._logs.add(fd)
        return fd

    def close(self, fd: int) -> None:
        self._logs.discard(fd)
        os.close(fd)

    def pread(self, fd: int, length: int, position: int) -> bytes:
        data = os.pread(fd, length, position)
        if fd in self._logs:
            self.log_bytes += len(data)
        return data

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> CountingOs:
    from minibroker.broker.storage import log_loader, segment

    counter = CountingOs()
    for module in (log_loader, segment):
        monkeypatch.setattr(module, "os", counter)
    return counter


def build_producer_log(root: pathlib.Path, seed: int, batches: int = 40) -> list[bytes]:
    """A log of idempotent batches from three producers (often more than the five kept of
    each, producer epoch bumps among them) and some plain ones, with growing leader epochs;
    flushed and closed (each test says whether the shutdown was clean)."""
    rng = random.Random(seed)
    log = PartitionLog.open(root / "events-3", TP, CONFIG, now_ms=0)
    producers = {7: [0, 0], 8: [0, 0], 9: [3, 0]}  # producer id -> [producer epoch, next seq]
    written: list[bytes] = []
    epoch = 0
    for _ in range(batches):
        if rng.random() < 0.1:
            epoch += 1
        count = rng.randint(1, 3)
        pid = rng.choice([-1, 7, 8, 9, 9])
        fields = {}
        if pid >= 0:
            state = producers[pid]
            if rng.random() < 0.1:
                state[:] = [state[0] + 1, 0]
            fields = {"producer_id": pid, "producer_epoch": state[0], "base_sequence": state[1]}
            state[1] += count
        data = encode_batch(
            [(1_000 + len(written) + i, None, b"v%d" % i, ()) for i in range(count)],
            base_offset=log.leo,
            partition_leader_epoch=epoch,
            **fields,
        )
        log.append_as_follower(data, now_ms=0)
        written.append(data)
    log.flush()
    log.close()
    return written


def producers_of(state: ProducerStateManager) -> dict[int, tuple[int, list[object]]]:
    return {pid: (e.producer_epoch, list(e.batches)) for pid, e in state.producers.items()}


def replayed_in_full(log: PartitionLog) -> ProducerStateManager:
    """The producer state rebuilt from every batch the log holds from its start, read anew
    from the files."""
    headers = []
    for segment in log.segments:
        data = (log.directory / f"{segment.base_offset:020d}.log").read_bytes()[: segment.size]
        headers += [h for _, h in iter_batches(data) if h.last_offset >= log.log_start_offset]
    state = ProducerStateManager()
    state.rebuild(headers)
    return state


def test_the_producer_state_keeps_as_many_batches_as_the_load_pass_hands_over() -> None:
    from minibroker.broker.replication.producer_state import BATCHES_PER_PRODUCER
    from minibroker.broker.storage.log import PRODUCER_BATCHES_KEPT

    assert PRODUCER_BATCHES_KEPT >= BATCHES_PER_PRODUCER


@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("epoch_checkpoint", [True, False])
def test_loading_reads_each_byte_of_the_log_once_and_rebuilds_the_producers_from_it(
    tmp_path: pathlib.Path, counting: CountingOs, clean: bool, epoch_checkpoint: bool
) -> None:
    # The load checks every batch (a clean shutdown too, issue 11 item 6), recovers from the
    # recovery point after a crash, rebuilds a lost epoch checkpoint and hands the producer
    # state its batches, all from one read of each byte. Opening the segments reads a little
    # (the tail after the last index entry, the first header): measured alone, then taken off.
    written = build_producer_log(tmp_path, seed=3)
    directory = tmp_path / "events-3"
    if not epoch_checkpoint:
        (directory / "leader-epoch-checkpoint").unlink()
    layout = segment_layout(tmp_path)
    assert len(layout) >= 4
    opening = counting.log_bytes
    for path, _ in layout:
        LogSegment.open(directory, int(path.name[:20]), CONFIG.index_interval_bytes, 0).release()
    opening = counting.log_bytes - opening
    leo = read_header(written[-1]).next_offset
    recovery_point = int(layout[2][0].name[:20]) + 1  # unclean: the last two segments recover

    before = counting.log_bytes
    log = PartitionLog.open(
        directory, TP, CONFIG, now_ms=0, recovery_point=recovery_point, had_clean_shutdown=clean
    )
    state = ProducerStateManager()
    state.rebuild(log.producer_batch_headers())
    read = counting.log_bytes - before

    assert read - opening == sum(size for _, size in layout)
    assert batches_of(log) == written and log.leo == leo
    assert producers_of(state) == producers_of(replayed_in_full(log))
    assert {pid for pid in state.producers} == {7, 8, 9}
    log.close()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), flip=st.data(), clean=st.booleans())
def test_the_producer_state_holds_exactly_the_batches_that_remain_after_a_cut(
    seed: int, flip: st.DataObject, clean: bool
) -> None:
    # Damage anywhere, the log start anywhere: what the load hands the producer state is what
    # a replay of the whole remaining log from its start gives; nothing of a cut batch.
    root = pathlib.Path(tempfile.mkdtemp(prefix="mb-pid-", dir=SCRATCH))
    try:
        written = build_producer_log(root, seed)
        layout = segment_layout(root)
        seg = flip.draw(st.integers(0, len(layout) - 1))
        path, size = layout[seg]
        data = bytearray(path.read_bytes())
        data[flip.draw(st.integers(0, size - 1))] ^= flip.draw(st.integers(1, 255))
        path.write_bytes(bytes(data))
        leo = read_header(written[-1]).next_offset
        log_start = flip.draw(st.integers(0, leo))
        log = PartitionLog.open(
            root / "events-3",
            TP,
            CONFIG,
            now_ms=0,
            recovery_point=flip.draw(st.integers(0, leo)),
            log_start_offset=log_start,
            had_clean_shutdown=clean,
        )
        state = ProducerStateManager()
        state.rebuild(log.producer_batch_headers())
        assert producers_of(state) == producers_of(replayed_in_full(log))
        log.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_log_changed_since_loading_rebuilds_its_producers_from_a_read(
    tmp_path: pathlib.Path,
) -> None:
    # What the load pass found is handed over only while the log is as it was loaded.
    written = build_producer_log(tmp_path, seed=5)
    log = PartitionLog.open(tmp_path / "events-3", TP, CONFIG, now_ms=0, had_clean_shutdown=True)
    log.append_as_follower(
        encode_batch(
            [(5_000, None, b"late", ())],
            base_offset=log.leo,
            partition_leader_epoch=log.latest_epoch or 0,
            producer_id=11,
            producer_epoch=0,
            base_sequence=0,
        ),
        now_ms=0,
    )
    state = ProducerStateManager()
    state.rebuild(log.producer_batch_headers())
    assert 11 in state.producers
    assert producers_of(state) == producers_of(replayed_in_full(log))
    log.close()

    log = PartitionLog.open(tmp_path / "events-3", TP, CONFIG, now_ms=0, had_clean_shutdown=True)
    log.truncate_to(read_header(written[len(written) // 2]).base_offset)
    state.rebuild(log.producer_batch_headers())
    assert producers_of(state) == producers_of(replayed_in_full(log))
    assert 11 not in state.producers
    log.close()


@pytest.mark.parametrize("clean", [True, False])
def test_a_batch_whose_last_offset_overflows_the_segment_index_is_cut(
    tmp_path: pathlib.Path, clean: bool
) -> None:
    # Offsets are stored relative to the segment's base in an int32: a batch claiming a
    # lastOffsetDelta past that (CRC-clean, so only this rule catches it) is cut by the load's
    # check and by recovery alike, with what follows it.
    import struct

    from minibroker.client.batch import ATTRIBUTES_OFFSET, CRC_OFFSET, crc_of

    good = encode_batch([(1_000, None, b"v", ())], base_offset=0)
    bad = bytearray(encode_batch([(1_000, None, b"w", ())], base_offset=1))
    struct.pack_into(">i", bad, ATTRIBUTES_OFFSET + 2, 2**31 - 1)  # last offset 2**31
    struct.pack_into(">I", bad, CRC_OFFSET, crc_of(bad, ATTRIBUTES_OFFSET, len(bad)))
    root = tmp_path / "events-3"
    root.mkdir()
    (root / "00000000000000000000.log").write_bytes(good + bytes(bad))
    log = reopen(tmp_path, clean=clean)
    assert log.leo == 1
    assert batches_of(log) == [good]
    assert (root / "00000000000000000000.log").stat().st_size == len(good)
    log.close()
