"""The quorum's durable Raft log (controller/quorum/raft_log.py): batches with epochs on the
journal's files, the RaftLogView answers, every mutation and refusal, restarts, crashes between
the steps of a mutation, old (epoch 0) logs, and a hypothesis fuzz of random operations followed
by random damage to the files. Files in a tmp dir; no sockets, no loop."""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.controller.journal import JournalError, _read_frame_spans
from minibroker.controller.quorum import raft_log as raft_log_module
from minibroker.controller.quorum.messages import OffsetAndEpoch
from minibroker.controller.quorum.raft_log import RaftBatch, RaftLog
from minibroker.metadata.records import LeaderChangeRecord, LogEntry, NoOpRecord, TopicRecord
from tests.unit.legacy_journal import MetadataJournal


def batch(epoch: int, base: int, n: int = 2, tag: int = 0) -> RaftBatch:
    return RaftBatch(
        epoch, tuple(LogEntry(base + i, 1000 * tag + base + i, NoOpRecord()) for i in range(n))
    )


def opened(path: pathlib.Path) -> RaftLog:
    log = RaftLog(path)
    log.load()
    return log


def reloaded(log: RaftLog) -> RaftLog:
    log.close()
    return opened(log.path)


def state(log: RaftLog) -> tuple[object, ...]:
    """Everything the view and reads expose."""
    return (
        log.start_offset,
        log.end_offset,
        log.snapshot_id,
        log.last_fetched_epoch(),
        log.entries(log.start_offset, log.end_offset),
        [log.epoch_of(o) for o in range(log.start_offset - 1, log.end_offset + 1)],
        log.read(log.start_offset, max_bytes=1 << 30),
    )


def segments(path: pathlib.Path) -> list[str]:
    return sorted(p.name for p in path.glob("metadata-*.log"))


def seg(base: int) -> str:
    return f"metadata-{base:020d}.log"


# -- RaftBatch --------------------------------------------------------------------------------


def test_raft_batch_validation() -> None:
    b = batch(3, 10, 3)
    assert (b.base_offset, b.end_offset) == (10, 13)
    assert b.sliced(11, 12).entries == (b.entries[1],)
    with pytest.raises(ValueError, match="at least one"):
        RaftBatch(1, ())
    with pytest.raises(ValueError, match="consecutive"):
        RaftBatch(1, (LogEntry(0, 0, NoOpRecord()), LogEntry(2, 0, NoOpRecord())))
    with pytest.raises(ValueError, match="negative epoch"):
        RaftBatch(-1, (LogEntry(0, 0, NoOpRecord()),))


# -- empty log, appends, view -----------------------------------------------------------------


def test_empty_log(tmp_path: pathlib.Path) -> None:
    log = RaftLog(tmp_path)
    loaded = log.load()
    assert loaded.snapshot_records is None and loaded.batches == ()
    assert loaded.snapshot_id == OffsetAndEpoch(0, 0) and loaded.truncated_bytes == 0
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (0, 0, 0)
    assert log.end_offset_for_epoch(0) == OffsetAndEpoch(0, 0)
    assert log.end_offset_for_epoch(5) == OffsetAndEpoch(0, 0)
    assert log.epoch_of(-1) == 0 and log.epoch_of(0) == -1
    assert log.read(0) == [] and log.entries(0, 0) == []
    assert log.latest_snapshot() is None and log.snapshot_id is None
    assert segments(tmp_path) == [seg(0)]


def test_append_and_view(tmp_path: pathlib.Path) -> None:
    log = opened(tmp_path)
    b0, b1, b2, b3 = batch(1, 0, 3), batch(1, 3, 2), batch(3, 5, 2), batch(5, 7, 1)
    log.append([b0, b1])
    log.append([b2, b3])
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (0, 8, 5)
    assert [log.epoch_of(o) for o in range(-1, 9)] == [0, 1, 1, 1, 1, 1, 3, 3, 5, -1]
    assert log.epoch_of(-2) == -1
    assert log.end_offset_for_epoch(1) == OffsetAndEpoch(5, 1)
    assert log.end_offset_for_epoch(2) == OffsetAndEpoch(5, 1)  # largest epoch <= 2 is 1
    assert log.end_offset_for_epoch(3) == OffsetAndEpoch(7, 3)
    assert log.end_offset_for_epoch(4) == OffsetAndEpoch(7, 3)
    assert log.end_offset_for_epoch(5) == OffsetAndEpoch(8, 5)
    assert log.end_offset_for_epoch(9) == OffsetAndEpoch(8, 5)
    assert log.end_offset_for_epoch(0) == OffsetAndEpoch(-1, -1)  # below the first, no snapshot
    assert log.entries(0, 8) == [*b0.entries, *b1.entries, *b2.entries, *b3.entries]
    before = state(log)
    assert state(reloaded(log)) == before


def test_append_is_one_write_and_one_fsync(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = opened(tmp_path)
    calls: list[str] = []
    real_write, real_fsync = os.write, os.fsync

    def write(fd: int, data: bytes) -> int:
        calls.append("write")
        return real_write(fd, data)

    def fsync(fd: int) -> None:
        calls.append("fsync")
        real_fsync(fd)

    monkeypatch.setattr(raft_log_module.os, "write", write)
    monkeypatch.setattr(raft_log_module.os, "fsync", fsync)
    log.append([batch(1, 0), batch(1, 2), batch(2, 4)])
    assert calls == ["write", "fsync"]
    calls.clear()
    log.append([])
    assert calls == []


@pytest.mark.parametrize(
    ("batches", "match"),
    [
        pytest.param([batch(2, 5)], "not at the log end", id="gap"),
        pytest.param([batch(2, 3)], "not at the log end", id="overlap"),
        pytest.param([batch(1, 4)], "below the log's epoch", id="lower-epoch"),
        pytest.param([batch(2, 4), batch(2, 7)], "not at the log end", id="second-not-contiguous"),
        pytest.param([batch(3, 4), batch(2, 6)], "below the log's epoch", id="second-lower-epoch"),
    ],
)
def test_append_refusals_write_nothing(
    tmp_path: pathlib.Path, batches: list[RaftBatch], match: str
) -> None:
    log = opened(tmp_path)
    log.append([batch(2, 0), batch(2, 2)])
    size = (tmp_path / seg(0)).stat().st_size
    before = state(log)
    with pytest.raises(ValueError, match=match):
        log.append(batches)
    assert (tmp_path / seg(0)).stat().st_size == size
    assert state(log) == before
    assert state(reloaded(log)) == before


def test_epochs_and_records_survive_a_restart(tmp_path: pathlib.Path) -> None:
    log = opened(tmp_path)
    lc = RaftBatch(4, (LogEntry(0, 7, LeaderChangeRecord(1001, 4, (1000, 1001), (1001,))),))
    topic = RaftBatch(4, (LogEntry(1, 8, TopicRecord("t", "id", {"k": "v"})),))
    log.append([lc, topic])
    log.close()
    loaded = RaftLog(tmp_path).load()
    assert loaded.batches == (lc, topic)


# -- reads ------------------------------------------------------------------------------------


def test_read_slices_and_limits(tmp_path: pathlib.Path) -> None:
    log = opened(tmp_path)
    batches = [batch(1, 3 * i, 3) for i in range(5)]
    log.append(batches)
    assert log.read(0, max_bytes=1 << 20) == batches
    assert log.read(4, max_bytes=1 << 20) == [batches[1].sliced(4, 6), *batches[2:]]
    assert log.read(4, max_bytes=1) == [batches[1].sliced(4, 6)]  # at least one
    f0, f1 = (len(raft_log_module._encode(b)) for b in batches[:2])
    assert log.read(0, max_bytes=1) == [batches[0]]
    assert log.read(0, max_bytes=f0) == batches[:1]  # stops once max_bytes is reached
    assert log.read(0, max_bytes=f0 + 1) == batches[:2]
    assert log.read(0, max_bytes=f0 + f1) == batches[:2]
    assert log.read(0, max_bytes=f0 + f1 + 1) == batches[:3]
    assert log.read(15) == []
    with pytest.raises(ValueError, match="holds"):
        log.read(16)
    assert log.entries(4, 8) == [e for b in batches for e in b.entries if 4 <= e.offset < 8]
    assert log.entries(5, 5) == []
    with pytest.raises(ValueError, match="outside"):
        log.entries(3, 16)
    with pytest.raises(ValueError, match="outside"):
        log.entries(5, 4)


# -- truncation -------------------------------------------------------------------------------


def test_truncate_at_a_frame_boundary(tmp_path: pathlib.Path) -> None:
    log = opened(tmp_path)
    log.append([batch(1, 0), batch(1, 2), batch(2, 4)])
    log.truncate_to(2)
    assert (log.end_offset, log.last_fetched_epoch()) == (2, 1)
    assert log.end_offset_for_epoch(2) == OffsetAndEpoch(2, 1)
    log.append([batch(3, 2, tag=9)])
    before = state(log)
    assert state(reloaded(log)) == before
    assert log.entries(2, 4) == list(batch(3, 2, tag=9).entries)


def test_truncate_inside_a_frame_keeps_its_prefix(tmp_path: pathlib.Path) -> None:
    log = opened(tmp_path)
    log.append([batch(1, 0, 2), batch(2, 2, 5)])
    log.truncate_to(4)
    assert log.entries(0, 4) == [*batch(1, 0, 2).entries, *batch(2, 2, 5).entries[:2]]
    assert log.epoch_of(3) == 2 and log.end_offset == 4
    assert segments(tmp_path) == [seg(0), seg(2)]  # the kept prefix supersedes from offset 2
    log.append([batch(2, 4, 1, tag=5)])
    before = state(log)
    assert state(reloaded(log)) == before


def test_truncate_inside_the_first_frame_of_a_segment_replaces_it(tmp_path: pathlib.Path) -> None:
    log = opened(tmp_path)
    log.append([batch(1, 0, 4)])
    log.truncate_to(1)
    assert segments(tmp_path) == [seg(0)]
    assert log.entries(0, 1) == [batch(1, 0, 4).entries[0]]
    before = state(log)
    assert state(reloaded(log)) == before


def test_truncate_across_segments(tmp_path: pathlib.Path) -> None:
    log = opened(tmp_path)
    log.append([batch(1, 0), batch(1, 2)])
    log.write_snapshot([NoOpRecord()], OffsetAndEpoch(1, 1))  # rolls a segment at 4
    log.append([batch(2, 4), batch(2, 6)])
    log.write_snapshot([NoOpRecord()], OffsetAndEpoch(3, 1))  # and at 8
    log.append([batch(3, 8)])
    assert segments(tmp_path) == [seg(0), seg(4), seg(8)]
    log.truncate_to(5)  # inside the first frame of segment 4: rewritten, segment 8 gone
    assert segments(tmp_path) == [seg(0), seg(4)]
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (3, 5, 2)
    assert state(reloaded(log)) == state(log)
    log = reloaded(log)
    log.truncate_to(3)  # the start: the frame holding 2..3 goes from segment 0
    assert segments(tmp_path) == [seg(0)]
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (3, 3, 1)
    log.append([batch(4, 3, 3, tag=1)])
    before = state(log)
    assert state(reloaded(log)) == before


def test_truncate_to_the_start_inside_a_frame_below_the_snapshot_then_append(
    tmp_path: pathlib.Path,
) -> None:
    """Found by the fuzz: the frame holding 0..1 straddles the snapshot at 1; truncating to 1
    cuts segment 0 back to empty, and the next record (1) lands above that segment's base."""
    log = opened(tmp_path)
    log.append([batch(0, 0, 2)])
    log.write_snapshot([], OffsetAndEpoch(1, 0))
    log.truncate_to(1)
    assert segments(tmp_path) == [seg(0)] and (tmp_path / seg(0)).stat().st_size == 0
    log.append([batch(0, 1, 1, tag=3)])
    before = state(log)
    assert state(reloaded(log)) == before


def test_truncate_refusals_and_no_ops(tmp_path: pathlib.Path) -> None:
    log = opened(tmp_path)
    log.append([batch(1, 0), batch(1, 2)])
    log.write_snapshot([], OffsetAndEpoch(2, 1))
    with pytest.raises(ValueError, match="below the log start"):
        log.truncate_to(1)
    before = state(log)
    log.truncate_to(4)
    log.truncate_to(9)
    assert state(log) == before
    log.truncate_to(2)
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (2, 2, 1)


# -- snapshots --------------------------------------------------------------------------------


def test_write_snapshot_below_the_end_keeps_later_batches(tmp_path: pathlib.Path) -> None:
    log = opened(tmp_path)
    log.append([batch(1, 0), batch(2, 2, 3), batch(3, 5)])
    log.write_snapshot([NoOpRecord()], OffsetAndEpoch(3, 2))
    assert (log.start_offset, log.end_offset) == (3, 7)
    assert log.read(3) == [batch(2, 2, 3).sliced(3, 5), batch(3, 5)]
    assert log.epoch_of(2) == 2 and log.epoch_of(1) == -1
    assert log.end_offset_for_epoch(1) == OffsetAndEpoch(3, 2)  # below the first: the snapshot
    assert log.end_offset_for_epoch(2) == OffsetAndEpoch(5, 2)
    assert log.latest_snapshot() == ([NoOpRecord()], OffsetAndEpoch(3, 2))
    assert segments(tmp_path) == [seg(0), seg(7)]
    log.append([batch(3, 7)])
    log.write_snapshot([NoOpRecord(), NoOpRecord()], OffsetAndEpoch(7, 3))
    assert segments(tmp_path) == [seg(7), seg(9)]
    assert sorted(p.name for p in tmp_path.glob("*.snap")) == [f"snapshot-{7:020d}.snap"]
    before = state(log)
    log.close()
    loaded = RaftLog(tmp_path).load()
    assert loaded.snapshot_records == (NoOpRecord(), NoOpRecord())
    assert loaded.snapshot_id == OffsetAndEpoch(7, 3)
    assert loaded.batches == (batch(3, 7),)
    assert state(opened(tmp_path)) == before


def test_write_snapshot_at_the_end_empties_the_log(tmp_path: pathlib.Path) -> None:
    log = opened(tmp_path)
    log.append([batch(1, 0), batch(4, 2)])
    log.write_snapshot([NoOpRecord()], OffsetAndEpoch(4, 4))
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (4, 4, 4)
    assert log.end_offset_for_epoch(2) == OffsetAndEpoch(4, 4)
    assert log.epoch_of(3) == 4 and log.read(4) == []
    assert segments(tmp_path) == [seg(4)]
    before = state(log)
    assert state(reloaded(log)) == before


@pytest.mark.parametrize(
    ("snapshot_id", "match"),
    [
        pytest.param(OffsetAndEpoch(5, 2), "outside the log", id="beyond-end"),
        pytest.param(OffsetAndEpoch(1, 1), "outside the log", id="below-start"),
        pytest.param(OffsetAndEpoch(3, 1), "has epoch 1", id="wrong-epoch"),
    ],
)
def test_write_snapshot_refusals(
    tmp_path: pathlib.Path, snapshot_id: OffsetAndEpoch, match: str
) -> None:
    log = opened(tmp_path)
    log.append([batch(1, 0), batch(2, 2)])
    log.write_snapshot([], OffsetAndEpoch(2, 1))
    before = state(log)
    with pytest.raises(ValueError, match=match):
        log.write_snapshot([NoOpRecord()], snapshot_id)
    assert state(log) == before and log.latest_snapshot() == ([], OffsetAndEpoch(2, 1))


@pytest.mark.parametrize("offset", [2, 5, 6, 20])
def test_install_snapshot_replaces_the_log(tmp_path: pathlib.Path, offset: int) -> None:
    log = opened(tmp_path)
    log.append([batch(1, 0), batch(1, 2, 4)])  # a divergent or lagging follower's log
    log.write_snapshot([], OffsetAndEpoch(1, 1))
    log.install_snapshot([NoOpRecord()], OffsetAndEpoch(offset, 7))
    assert (log.start_offset, log.end_offset, log.last_fetched_epoch()) == (offset, offset, 7)
    assert log.read(offset) == [] and log.epoch_of(offset - 1) == 7
    assert log.end_offset_for_epoch(3) == OffsetAndEpoch(offset, 7)
    assert segments(tmp_path) == [seg(offset)]
    assert sorted(p.name for p in tmp_path.glob("*.snap")) == [f"snapshot-{offset:020d}.snap"]
    log.append([batch(8, offset)])
    before = state(log)
    log = reloaded(log)
    assert state(log) == before
    with pytest.raises(ValueError, match="below the log start"):
        log.install_snapshot([], OffsetAndEpoch(offset - 1, 7))


# -- crashes between the steps of a mutation --------------------------------------------------


def test_crash_after_snapshot_before_cleanup(tmp_path: pathlib.Path) -> None:
    log = opened(tmp_path)
    log.append([batch(1, 0), batch(1, 2)])
    log.write_snapshot([], OffsetAndEpoch(2, 1))
    log.append([batch(2, 4)])
    saved = {p.name: p.read_bytes() for p in tmp_path.glob("*.log")}
    saved_snap = {p.name: p.read_bytes() for p in tmp_path.glob("*.snap")}
    log.write_snapshot([NoOpRecord()], OffsetAndEpoch(6, 2))
    expected = state(log)
    log.close()
    for name, data in {**saved, **saved_snap}.items():  # the deleted files come back
        (tmp_path / name).write_bytes(data)
    (tmp_path / "junk.tmp").write_bytes(b"x")
    after = opened(tmp_path)
    assert state(after) == expected
    assert segments(tmp_path) == [seg(6)] and not list(tmp_path.glob("*.tmp"))
    assert len(list(tmp_path.glob("*.snap"))) == 1


def test_crash_after_a_mid_frame_truncation_before_the_old_segment_is_cut(
    tmp_path: pathlib.Path,
) -> None:
    log = opened(tmp_path)
    log.append([batch(1, 0), batch(1, 2, 4), batch(2, 6)])
    old = (tmp_path / seg(0)).read_bytes()
    log.truncate_to(3)
    expected = state(log)
    log.close()
    (tmp_path / seg(0)).write_bytes(old)  # the cleanup cut never reached the disk
    assert state(opened(tmp_path)) == expected


def test_crash_in_install_after_the_truncation(tmp_path: pathlib.Path) -> None:
    """install_snapshot drops the records at or above the snapshot first: a crash right after
    leaves the old snapshot and the prefix below it, a valid log."""
    log = opened(tmp_path)
    log.append([batch(1, 0), batch(1, 2, 4)])
    log.truncate_to(4)
    expected = state(log)
    log.close()
    assert state(opened(tmp_path)) == expected


# -- damage -----------------------------------------------------------------------------------


def test_torn_tail_of_the_last_segment_is_cut(tmp_path: pathlib.Path) -> None:
    log = opened(tmp_path)
    log.append([batch(1, 0), batch(1, 2)])
    kept = state(log)
    log.append([batch(2, 4, 3)])
    log.close()
    path = tmp_path / seg(0)
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:-3])
    log = RaftLog(tmp_path)
    loaded = log.load()
    assert loaded.truncated_bytes > 0 and path.stat().st_size < size - 3
    assert state(log) == kept
    log.append([batch(2, 4, 3)])
    assert reloaded(log).end_offset == 7


def test_corruption_before_the_last_segment_is_an_error(tmp_path: pathlib.Path) -> None:
    log = opened(tmp_path)
    log.append([batch(1, 0), batch(1, 2)])
    log.write_snapshot([], OffsetAndEpoch(1, 1))
    log.append([batch(1, 4)])
    log.close()
    first = tmp_path / seg(0)
    data = bytearray(first.read_bytes())
    data[-1] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(JournalError, match="not the last segment"):
        RaftLog(tmp_path).load()


def test_corrupt_snapshot_is_an_error(tmp_path: pathlib.Path) -> None:
    log = opened(tmp_path)
    log.append([batch(1, 0)])
    log.write_snapshot([NoOpRecord()], OffsetAndEpoch(2, 1))
    log.close()
    (snap,) = tmp_path.glob("*.snap")
    snap.write_bytes(snap.read_bytes()[:-1])
    with pytest.raises(JournalError, match=r"snapshot .* is corrupt"):
        RaftLog(tmp_path).load()


def test_epoch_going_down_on_disk_is_an_error(tmp_path: pathlib.Path) -> None:
    j = MetadataJournal(tmp_path)
    j.load()
    j.close()
    log = opened(tmp_path)
    log.append([batch(3, 0)])
    log.close()
    path = tmp_path / seg(0)
    path.write_bytes(
        path.read_bytes() + raft_log_module._encode(batch(2, 2))  # written by no one
    )
    with pytest.raises(JournalError, match="epoch 2 at offset 2 follows epoch 3"):
        RaftLog(tmp_path).load()


def test_a_failed_write_fences_the_log(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = opened(tmp_path)
    log.append([batch(1, 0)])

    def broken(fd: int, data: bytes) -> int:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(raft_log_module.os, "write", broken)
    with pytest.raises(OSError):
        log.append([batch(1, 2)])
    monkeypatch.undo()
    with pytest.raises(JournalError, match="failed earlier"):
        log.append([batch(1, 2)])
    assert reloaded(log).end_offset == 2


# -- logs written before the quorum (epoch 0) -------------------------------------------------


def test_upgrade_in_place_from_an_epoch_zero_journal(tmp_path: pathlib.Path) -> None:
    j = MetadataJournal(tmp_path)
    j.load()
    old = [LogEntry(o, o, NoOpRecord()) for o in range(6)]
    j.append_frames([old[0:2], old[2:4]])
    j.write_snapshot([NoOpRecord()], 4)
    j.append(old[4:6])
    j.close()
    log = RaftLog(tmp_path)
    loaded = log.load()
    assert loaded.snapshot_id == OffsetAndEpoch(4, 0)
    assert loaded.snapshot_records == (NoOpRecord(),)
    assert loaded.batches == (RaftBatch(0, tuple(old[4:6])),)
    assert log.last_fetched_epoch() == 0 and log.end_offset_for_epoch(0) == OffsetAndEpoch(6, 0)
    log.append([batch(1, 6)])
    assert log.end_offset_for_epoch(0) == OffsetAndEpoch(6, 0)
    before = state(log)
    assert state(reloaded(log)) == before


# -- fuzz -------------------------------------------------------------------------------------


class Model:
    """The log as a list: what a correct RaftLog holds."""

    def __init__(self) -> None:
        self.start = 0
        self.snapshot_epoch = 0
        self.has_snapshot = False
        self.records: list[tuple[int, int]] = []  # (epoch, timestamp) from `start` on

    @property
    def end(self) -> int:
        return self.start + len(self.records)

    def last_epoch(self) -> int:
        return self.records[-1][0] if self.records else self.snapshot_epoch

    def epoch_of(self, offset: int) -> int:
        if offset == self.start - 1:
            return self.snapshot_epoch
        if self.start <= offset < self.end:
            return self.records[offset - self.start][0]
        return -1

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        if not self.records or epoch >= self.last_epoch():
            return OffsetAndEpoch(self.end, self.last_epoch())
        held = [e for e, _ in self.records if e <= epoch]
        if not held:
            if self.has_snapshot:
                return OffsetAndEpoch(self.start, self.snapshot_epoch)
            return OffsetAndEpoch(-1, -1)
        best = max(held)
        last = max(i for i, (e, _) in enumerate(self.records) if e == best)
        return OffsetAndEpoch(self.start + last + 1, best)


def check(log: RaftLog, model: Model) -> None:
    assert (log.start_offset, log.end_offset) == (model.start, model.end)
    assert log.last_fetched_epoch() == model.last_epoch()
    got = [(e.offset, e.timestamp_ms) for e in log.entries(model.start, model.end)]
    assert got == [(model.start + i, ts) for i, (_, ts) in enumerate(model.records)]
    for offset in range(model.start - 2, model.end + 2):
        assert log.epoch_of(offset) == model.epoch_of(offset), offset
    epochs = {e for e, _ in model.records} | {0, model.snapshot_epoch}
    for epoch in range(max(epochs) + 2):
        assert log.end_offset_for_epoch(epoch) == model.end_offset_for_epoch(epoch), epoch
    batches = log.read(model.start, max_bytes=1 << 30)
    assert [(e.offset, e.timestamp_ms) for b in batches for e in b.entries] == got
    for b in batches:
        assert {model.epoch_of(e.offset) for e in b.entries} == {b.epoch}


OPS = st.one_of(
    st.tuples(
        st.just("append"),
        st.lists(st.tuples(st.integers(1, 4), st.booleans()), min_size=1, max_size=3),
    ),
    st.tuples(st.just("truncate"), st.floats(0, 1)),
    st.tuples(st.just("snapshot"), st.floats(0, 1)),
    st.tuples(st.just("install"), st.tuples(st.floats(0, 1), st.integers(0, 3))),
    st.tuples(st.just("reopen"), st.none()),
)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    ops=st.lists(OPS, max_size=14),
    damage=st.sampled_from(["flip", "cut"]),
    where=st.floats(0, 1),
    bit=st.integers(0, 7),
)
def test_fuzz_operations_then_damage(
    tmp_path_factory: pytest.TempPathFactory,
    ops: list[tuple[str, object]],
    damage: str,
    where: float,
    bit: int,
) -> None:
    path = tmp_path_factory.mktemp("fuzz")
    log = opened(path)
    model = Model()
    stamp = 0
    for op, arg in ops:
        if op == "append":
            assert isinstance(arg, list)
            batches = []
            epoch, end = model.last_epoch(), model.end
            for n, bump in arg:
                epoch += int(bump)
                entries = []
                for i in range(n):
                    stamp += 1
                    entries.append(LogEntry(end + i, stamp, NoOpRecord()))
                    model.records.append((epoch, stamp))
                batches.append(RaftBatch(epoch, tuple(entries)))
                end += n
            log.append(batches)
        elif op == "truncate":
            assert isinstance(arg, float)
            offset = model.start + int(arg * (model.end - model.start))
            log.truncate_to(offset)
            del model.records[offset - model.start :]
        elif op == "snapshot":
            assert isinstance(arg, float)
            offset = model.start + int(arg * (model.end - model.start))
            snapshot_id = OffsetAndEpoch(offset, model.epoch_of(offset - 1))
            log.write_snapshot([NoOpRecord()] * (offset % 3), snapshot_id)
            del model.records[: offset - model.start]
            model.start, model.snapshot_epoch = snapshot_id.offset, snapshot_id.epoch
            model.has_snapshot = True
            assert log.latest_snapshot() == ([NoOpRecord()] * (offset % 3), snapshot_id)
        elif op == "install":
            assert isinstance(arg, tuple)
            frac, extra = arg
            offset = model.start + int(frac * (model.end - model.start)) + extra
            epoch = max([model.snapshot_epoch, *(e for e, _ in model.records)]) + extra % 2
            log.install_snapshot([], OffsetAndEpoch(offset, epoch))
            model.records, model.start, model.snapshot_epoch = [], offset, epoch
            model.has_snapshot = True
        else:
            log = reloaded(log)
        check(log, model)
    log = reloaded(log)  # a restart changes nothing
    check(log, model)

    # Damage the last segment: everything from the damaged frame on goes, everything before
    # it stays.
    last = sorted(path.glob("metadata-*.log"))[-1]
    data = last.read_bytes()
    locs = list(zip(log._batches, log._locs))
    log.close()
    if not data:
        return
    pos = min(int(where * len(data)), len(data) - 1)
    if damage == "flip":
        last.write_bytes(data[:pos] + bytes([data[pos] ^ (1 << bit)]) + data[pos + 1 :])
    else:
        last.write_bytes(data[:pos])
    survivors = model.end
    for b, loc in locs:
        if loc.segment == last and loc.end > pos:
            survivors = b.base_offset
            break
    after = RaftLog(path)
    loaded = after.load()
    assert after.start_offset == model.start and after.end_offset == survivors
    damaged_size = len(data) if damage == "flip" else pos
    # Frames below the snapshot may sit in the segment too: the cut is at the damaged frame.
    spans, _ = _read_frame_spans(data)
    valid = next((start for start, end in spans if end > pos), None)
    assert loaded.truncated_bytes == (0 if valid is None else damaged_size - valid)
    assert last.stat().st_size == (damaged_size if valid is None else valid)
    del model.records[survivors - model.start :]
    check(after, model)
    after.close()
    check(opened(path), model)


@settings(max_examples=40, deadline=None)
@given(where=st.floats(0, 1), bit=st.integers(0, 7))
def test_fuzz_damage_before_the_last_segment_is_a_journal_error(where: float, bit: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp)
        log = opened(path)
        log.append([batch(1, 0), batch(1, 2, 3)])
        log.write_snapshot([], OffsetAndEpoch(1, 1))
        log.append([batch(2, 5)])
        log.close()
        first = path / seg(0)
        data = first.read_bytes()
        pos = min(int(where * len(data)), len(data) - 1)
        first.write_bytes(data[:pos] + bytes([data[pos] ^ (1 << bit)]) + data[pos + 1 :])
        with pytest.raises(JournalError):
            RaftLog(path).load()
        shutil.rmtree(path, ignore_errors=True)
