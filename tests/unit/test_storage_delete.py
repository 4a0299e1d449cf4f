"""Deleting a partition log for good (issue 11 item 2, Kafka's LocalLog.logDeleteDirName).

A deleted log is renamed to `<topic>-<p>.<uuid>-delete` before its files go, so a crash never
leaves a half-deleted log that loads. The name must fit the file system's 255-byte limit for
every legal topic name (Kafka shortens the topic part), a rename or removal that fails is
retried rather than forgotten, and a topic re-created under the same name never serves the old
directory's records: not while the broker runs, and not after a restart.
"""

from __future__ import annotations

import errno
import os
import pathlib
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.storage import log_manager as log_manager_module
from minibroker.broker.storage.data_dir import DataDir, parse_partition_dir
from minibroker.broker.storage.errors import InconsistentTopicIdError
from minibroker.broker.storage.log_manager import (
    MAX_FILE_NAME_BYTES,
    LogManager,
    log_delete_dir_name,
    parse_delete_dir_name,
    read_partition_metadata,
)
from minibroker.client.errors import KafkaStorageError
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition

LEGAL = string.ascii_letters + string.digits + "._-"
LONG = TopicPartition("t" * 249, 0)


def batch(count: int = 2) -> bytes:
    return encode_batch([(1_000 + i, None, b"old", ()) for i in range(count)])


# -- the delete dir name -----------------------------------------------------------------------


@settings(max_examples=300)
@given(
    # Every length equally likely: the long names are the ones that need cutting.
    topic=st.integers(1, 249)
    .flatmap(lambda n: st.text(LEGAL, min_size=n, max_size=n))
    .filter(lambda t: t not in (".", "..")),
    partition=st.integers(0, 2**31 - 1),
)
def test_delete_dir_name_fits_and_parses_back(topic: str, partition: int) -> None:
    name = log_delete_dir_name(TopicPartition(topic, partition))
    assert len(name.encode()) <= MAX_FILE_NAME_BYTES
    parsed = parse_delete_dir_name(name)
    assert parsed is not None
    assert parsed.partition == partition
    assert topic.startswith(parsed.topic_prefix) and parsed.topic_prefix
    # Only the topic part is shortened, and only as much as it must be.
    suffix_bytes = len(name.encode()) - len(parsed.topic_prefix.encode())
    assert parsed.topic_prefix == topic[: MAX_FILE_NAME_BYTES - suffix_bytes]
    # Never taken for a live partition dir.
    assert parse_partition_dir(name) is None


def test_delete_dir_name_keeps_short_names_whole_and_is_unique() -> None:
    tp = TopicPartition("orders", 7)
    first, second = log_delete_dir_name(tp), log_delete_dir_name(tp)
    assert first != second
    parsed = parse_delete_dir_name(first)
    assert parsed is not None
    assert (parsed.topic_prefix, parsed.partition) == ("orders", 7)
    assert first == f"orders-7.{parsed.unique_id}-delete" and len(parsed.unique_id) == 32
    # Kafka's rule for the longest names: the topic is cut so the whole name is 255 bytes.
    longest = log_delete_dir_name(TopicPartition("x" * 249, 2**31 - 1))
    assert len(longest) == MAX_FILE_NAME_BYTES


@pytest.mark.parametrize(
    "name",
    ["orders-7", "orders-7-delete", "orders-x.0123-delete", "-7.abc-delete", "orders-7.abc\n"],
)
def test_parse_delete_dir_name_refuses_other_names(name: str) -> None:
    assert parse_delete_dir_name(name) is None


# -- LogManager with a real directory ------------------------------------------------------


def _names(root: pathlib.Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_dir()}


def test_a_249_character_topic_is_deleted_and_comes_back_empty(tmp_path: pathlib.Path) -> None:
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        log = logs.get_or_create_log(LONG, topic_id="old-id")
        log.append_as_leader(batch(), leader_epoch=0, now_ms=0)
        assert logs.delete_log(LONG)
        assert logs.pending_deletes == ()
        assert _names(tmp_path) == set()
        again = logs.get_or_create_log(LONG, topic_id="new-id")
        assert again.leo == 0
        assert read_partition_metadata(again.directory) == "new-id"
        logs.close()


class _FailingRenames:
    """os.replace that fails with `err` for partition dirs (not for checkpoint files)."""

    def __init__(self, err: int) -> None:
        self.err = err
        self.failing = True
        self.calls = 0
        self._real = os.replace

    def __call__(self, src: object, dst: object) -> None:
        if self.failing and str(dst).endswith("-delete"):
            self.calls += 1
            raise OSError(self.err, os.strerror(self.err), str(src))
        self._real(src, dst)  # type: ignore[arg-type]


def test_a_failed_rename_is_retried_and_the_old_data_is_never_served(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tp = TopicPartition("orders", 0)
    renames = _FailingRenames(errno.EIO)
    monkeypatch.setattr(log_manager_module.os, "replace", renames)
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        logs.get_or_create_log(tp, topic_id="old-id").append_as_leader(
            batch(), leader_epoch=0, now_ms=0
        )
        # The delete is accepted (the topic is gone for this broker) and remembered.
        assert logs.delete_log(tp)
        assert logs.get_log(tp) is None
        assert logs.pending_deletes == (tp,)
        assert "orders-0" in _names(tmp_path)
        # Re-creating while the old dir cannot go refuses rather than adopting it.
        with pytest.raises(KafkaStorageError, match="orders-0"):
            logs.get_or_create_log(tp, topic_id="new-id")
        assert logs.get_log(tp) is None
        assert read_partition_metadata(tmp_path / "orders-0") == "old-id"
        assert logs.retry_deletes() == []
        assert renames.calls == 3
        # The disk recovers: the periodic retry finishes the job.
        renames.failing = False
        assert logs.retry_deletes() == [tp]
        assert logs.pending_deletes == ()
        assert _names(tmp_path) == set()
        assert logs.get_or_create_log(tp, topic_id="new-id").leo == 0
        logs.close()


def test_a_re_create_retries_a_pending_delete_itself(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    renames = _FailingRenames(errno.ENOSPC)
    monkeypatch.setattr(log_manager_module.os, "replace", renames)
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        logs.get_or_create_log(LONG, topic_id="old-id").append_as_leader(
            batch(), leader_epoch=0, now_ms=0
        )
        assert logs.delete_log(LONG)
        renames.failing = False
        again = logs.get_or_create_log(LONG, topic_id="new-id")
        assert again.leo == 0 and logs.pending_deletes == ()
        logs.close()


def test_a_failed_removal_after_the_rename_is_retried(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tp = TopicPartition("orders", 1)
    real_rmtree = log_manager_module.shutil.rmtree
    failing = {"on": True}

    def rmtree(path: object, *args: object, **kwargs: object) -> None:
        if failing["on"]:
            raise OSError(errno.EBUSY, "busy", str(path))
        real_rmtree(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(log_manager_module.shutil, "rmtree", rmtree)
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        logs.get_or_create_log(tp, topic_id="old-id").append_as_leader(
            batch(), leader_epoch=0, now_ms=0
        )
        assert logs.delete_log(tp)
        (left,) = _names(tmp_path)
        assert left.endswith("-delete")  # renamed: never loaded again, even after a crash
        assert logs.pending_deletes == (tp,)
        # The renamed dir does not stand in the way of the new incarnation.
        assert logs.get_or_create_log(tp, topic_id="new-id").leo == 0
        failing["on"] = False
        assert logs.retry_deletes() == [tp]
        assert _names(tmp_path) == {"orders-1"}
        logs.close()


def test_a_dir_of_an_earlier_incarnation_is_never_adopted(tmp_path: pathlib.Path) -> None:
    tp = TopicPartition("orders", 2)
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        logs.get_or_create_log(tp, topic_id="old-id").append_as_leader(
            batch(), leader_epoch=0, now_ms=0
        )
        logs.close()
    # The manager that opens the data dir next did not load this dir (it appeared later, as a
    # dir whose delete was lost would): asking for the new incarnation must not adopt it.
    with DataDir.open(tmp_path / "elsewhere", node_id=1) as other:
        logs = LogManager.open(other)
        (tmp_path / "orders-2").rename(other.path / "orders-2")
        with pytest.raises(InconsistentTopicIdError):
            logs.get_or_create_log(tp, topic_id="new-id")
        assert logs.get_log(tp) is None
        assert read_partition_metadata(other.path / "orders-2") == "old-id"
        assert logs.delete_log(tp)
        assert logs.get_or_create_log(tp, topic_id="new-id").leo == 0
        logs.close()


def test_a_dir_found_on_disk_with_the_same_topic_id_is_recovered_and_kept(
    tmp_path: pathlib.Path,
) -> None:
    tp = TopicPartition("orders", 3)
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        logs.get_or_create_log(tp, topic_id="tid").append_as_leader(
            batch(), leader_epoch=0, now_ms=0
        )
        logs.close()
    with DataDir.open(tmp_path / "elsewhere", node_id=1) as other:
        logs = LogManager.open(other)
        (tmp_path / "orders-3").rename(other.path / "orders-3")
        assert logs.get_or_create_log(tp, topic_id="tid").leo == 2
        logs.close()


def test_restart_removes_delete_dirs_and_loads_the_old_incarnation_with_its_id(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    renames = _FailingRenames(errno.EIO)
    monkeypatch.setattr(log_manager_module.os, "replace", renames)
    long_dir = log_delete_dir_name(LONG)
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        logs.get_or_create_log(LONG, topic_id="old-id").append_as_leader(
            batch(), leader_epoch=0, now_ms=0
        )
        assert logs.delete_log(LONG)  # the rename fails; then the broker stops
        logs.close()
    (tmp_path / long_dir).mkdir()  # a crash between the rename and the removal
    (tmp_path / long_dir / "00000000000000000000.log").write_bytes(batch())
    renames.failing = False
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        assert not (tmp_path / long_dir).exists()
        logs = LogManager.open(data_dir)
        # The dir whose delete never happened is loaded with the id it was created with, so
        # the new incarnation (another id) refuses it and deletes it rather than serve it.
        assert logs.topic_id(LONG) == "old-id"
        with pytest.raises(InconsistentTopicIdError):
            logs.get_or_create_log(LONG, topic_id="new-id")
        assert logs.delete_log(LONG)
        assert logs.get_or_create_log(LONG, topic_id="new-id").leo == 0
        logs.close()


def test_checkpoints_of_the_deleted_incarnation_never_reach_the_new_one(
    tmp_path: pathlib.Path,
) -> None:
    tp = TopicPartition("orders", 4)
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        old = logs.get_or_create_log(tp, topic_id="old-id")
        for _ in range(5):
            old.append_as_leader(batch(), leader_epoch=0, now_ms=0)
        assert old.maybe_increment_log_start_offset(8)
        logs.checkpoint_high_watermarks({tp: 10})
        logs.checkpoint_all()
        assert logs.delete_log(tp)
        new = logs.get_or_create_log(tp, topic_id="new-id")
        new.append_as_leader(batch(), leader_epoch=0, now_ms=0)
        new.flush()
        # A crash before the next periodic checkpoint: no close, no marker.
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        again = logs.get_log(tp)
        assert again is not None
        # Not the old log start (8, past the new LEO: the new records would be dropped) and
        # not the old HW (10, which would expose records no follower has).
        hw = logs.checkpointed_high_watermark(tp)
        assert (again.log_start_offset, again.leo, hw) == (0, 2, 0)
        logs.close()
