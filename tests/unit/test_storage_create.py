"""Creating partition logs in bulk, durably and off the owner thread (LogManager.make_new_logs).

A broker given a thousand new partitions in one metadata batch used to create each log on its
event loop with five fsyncs (`partition.metadata` and its dir, the data dir, the leader epoch
checkpoint and its dir): seconds of stall, and the controller fenced it. Now the files of every
new log are written first, then made durable in one pass: one fsync per file that has content,
one per new dir, one for the data dir. Crash safety rests on two facts checked here: a new dir's
`partition.metadata` is only ever taken whole (a file cut short by a crash is no topic id, never
a part of one), and a log is handed over only once the pass is done. A failure leaves nothing
half-made behind.
"""

from __future__ import annotations

import errno
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from minibroker.broker.storage import checkpoint as checkpoint_module
from minibroker.broker.storage import log_manager as log_manager_module
from minibroker.broker.storage.checkpoint import LEADER_EPOCH_CHECKPOINT, LeaderEpochCheckpointFile
from minibroker.broker.storage.data_dir import DataDir
from minibroker.broker.storage.epoch_cache import EpochEntry
from minibroker.broker.storage.log import PartitionLog
from minibroker.broker.storage.log_manager import (
    PARTITION_METADATA,
    LogManager,
    NewLog,
    partition_metadata_text,
    read_partition_metadata,
)
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition

TOPIC_ID = "8b0c5a43-2f52-4c4e-9d1f-58b2a1f3c0de"


@pytest.fixture
def logs(tmp_path: pathlib.Path) -> Iterator[LogManager]:
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        manager = LogManager.open(data_dir)
        try:
            yield manager
        finally:
            manager.close()


def new_logs(count: int, led: set[int] = frozenset()) -> list[NewLog]:  # type: ignore[assignment]
    return [
        NewLog(TopicPartition("many", p), TOPIC_ID, leader_epoch=5 if p in led else -1)
        for p in range(count)
    ]


class FsyncRecorder:
    """Stands in for `os` in checkpoint.py: records the path of every fsync."""

    def __init__(self) -> None:
        self.paths: list[pathlib.Path] = []

    def fsync(self, fd: int) -> None:
        self.paths.append(pathlib.Path(os.readlink(f"/proc/self/fd/{fd}")))
        os.fsync(fd)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


# -- partition.metadata is taken whole or not at all -------------------------------------------


def test_partition_metadata_cut_short_anywhere_is_no_topic_id(tmp_path: pathlib.Path) -> None:
    whole = partition_metadata_text(TOPIC_ID)
    path = tmp_path / PARTITION_METADATA
    for cut in range(len(whole)):
        path.write_bytes(whole[:cut])
        assert read_partition_metadata(tmp_path) is None, whole[:cut]
    for junk in (b"\0" * len(whole), whole + b"topic_id: other\n", whole.replace(b"0\n", b"1\n")):
        path.write_bytes(junk)
        assert read_partition_metadata(tmp_path) is None, junk
    path.write_bytes(whole)
    assert read_partition_metadata(tmp_path) == TOPIC_ID
    path.unlink()
    assert read_partition_metadata(tmp_path) is None


# -- the bulk path --------------------------------------------------------------------------


def test_new_logs_are_made_durable_in_one_pass(
    logs: LogManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = FsyncRecorder()
    monkeypatch.setattr(checkpoint_module, "os", recorder)
    wanted = new_logs(6, led={0, 3})
    planned = logs.plan_new_logs(wanted + wanted[:2])  # each once
    assert planned == wanted
    made = logs.make_new_logs(planned, now_ms=0)
    assert all(isinstance(log, PartitionLog) for log in made)
    assert logs.logs == {}  # nobody's until handed over

    root = logs.data_dir.path
    expected = []
    for entry in wanted:
        directory = root / f"many-{entry.tp.partition}"
        expected.append(directory / PARTITION_METADATA)
        if entry.leader_epoch >= 0:
            expected.append(directory / LEADER_EPOCH_CHECKPOINT)
        expected.append(directory)
    expected.append(root)
    # Every new file with content and every new dir once, the data dir last: 6 + 2 + 6 + 1.
    assert recorder.paths == expected

    assert logs.add_new_logs(planned, made) == [entry.tp for entry in wanted]
    for entry in wanted:
        log = logs.get_log(entry.tp)
        assert log is not None and log.leo == 0 and logs.topic_id(entry.tp) == TOPIC_ID
        assert read_partition_metadata(log.directory) == TOPIC_ID
        led = entry.leader_epoch >= 0
        # A led log starts at its leader epoch: becoming its leader writes nothing more.
        assert log.epoch_cache.entries == ((EpochEntry(5, 0),) if led else ())
        if led:
            assert not log.maybe_assign_epoch_start_offset(5, 0)
        stored = LeaderEpochCheckpointFile(log.directory / LEADER_EPOCH_CHECKPOINT).read()
        assert stored == ([EpochEntry(5, 0)] if led else None)
    # get_or_create_log finds them; the planner leaves them out from now on.
    assert logs.get_or_create_log(wanted[1].tp, TOPIC_ID) is logs.get_log(wanted[1].tp)
    assert logs.plan_new_logs(wanted) == []


def test_made_logs_take_appends_and_load_again(tmp_path: pathlib.Path) -> None:
    wanted = new_logs(3, led={1})
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        logs.create_logs(wanted, now_ms=0)
        led = logs.get_log(wanted[1].tp)
        assert led is not None
        led.append_as_leader(encode_batch([(1, None, b"v", ())]), leader_epoch=5, now_ms=1)
        logs.close()
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        again = LogManager.open(data_dir)
        assert {tp: log.leo for tp, log in again.logs.items()} == {
            wanted[0].tp: 0,
            wanted[1].tp: 1,
            wanted[2].tp: 0,
        }
        assert all(again.topic_id(entry.tp) == TOPIC_ID for entry in wanted)
        assert again.logs[wanted[1].tp].epoch_cache.entries == (EpochEntry(5, 0),)
        again.close()


def test_the_planner_leaves_dirs_on_disk_to_get_or_create_log(logs: LogManager) -> None:
    wanted = new_logs(3)
    (logs.data_dir.path / "many-1").mkdir()  # e.g. left by a crash, not loaded
    assert [entry.tp.partition for entry in logs.plan_new_logs(wanted)] == [0, 2]


def test_a_log_that_cannot_be_made_leaves_no_dir_and_the_others_are_made(
    logs: LogManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = checkpoint_module.write_new_file
    calls = []

    def second_fails(path: os.PathLike[str], data: bytes) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        real(path, data)

    monkeypatch.setattr(log_manager_module, "write_new_file", second_fails)
    wanted = new_logs(3)
    made = logs.make_new_logs(logs.plan_new_logs(wanted), now_ms=0)
    assert [type(result).__name__ for result in made] == ["PartitionLog", "OSError", "PartitionLog"]
    assert sorted(p.name for p in logs.data_dir.path.iterdir() if p.is_dir()) == [
        "many-0",
        "many-2",
    ]
    logs.add_new_logs(wanted, made)
    assert set(logs.logs) == {wanted[0].tp, wanted[2].tp}
    monkeypatch.setattr(log_manager_module, "write_new_file", real)
    assert logs.get_or_create_log(wanted[1].tp, TOPIC_ID).leo == 0  # the next try works


def test_a_failed_durability_pass_hands_over_nothing(
    logs: LogManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fsync_dir_fails(path: os.PathLike[str]) -> None:
        raise OSError(errno.EIO, "Input/output error (injected)")

    monkeypatch.setattr(log_manager_module, "fsync_dir", fsync_dir_fails)
    wanted = new_logs(2)
    before = len(os.listdir("/proc/self/fd"))
    made = logs.make_new_logs(logs.plan_new_logs(wanted), now_ms=0)
    assert all(isinstance(result, OSError) and result.errno == errno.EIO for result in made)
    assert len(os.listdir("/proc/self/fd")) == before  # the logs' files are closed
    assert logs.add_new_logs(wanted, made) == []
    assert logs.logs == {}
    # Nothing that was never made durable is left for a later create to adopt.
    dirs = [logs.data_dir.path / f"{new.tp.topic}-{new.tp.partition}" for new in wanted]
    assert [d.name for d in dirs if d.exists()] == []


def test_a_crash_before_the_pass_leaves_dirs_that_load_without_a_topic_id(
    tmp_path: pathlib.Path,
) -> None:
    # What a power loss before the durability pass may leave: a partition.metadata missing,
    # empty or cut short. Loading takes each dir as a log without a topic id (the replica
    # manager then deletes it and creates the log again), never under a part of the id.
    whole = partition_metadata_text(TOPIC_ID)
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        logs.create_logs(new_logs(4), now_ms=0)
        logs.close()
    (tmp_path / "many-0" / PARTITION_METADATA).unlink()
    (tmp_path / "many-1" / PARTITION_METADATA).write_bytes(b"")
    (tmp_path / "many-2" / PARTITION_METADATA).write_bytes(whole[:-5])
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        again = LogManager.open(data_dir)
        ids = {tp.partition: again.topic_id(tp) for tp in again.logs}
        again.close()
    assert ids == {0: None, 1: None, 2: None, 3: TOPIC_ID}
