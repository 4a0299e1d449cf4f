"""The data dir and LogManager (docs/design.md §4.1, §4.5).

The lock test runs the second open in a subprocess, so the fcntl lock is contended by a real
second process, which must fail at once with a message naming the dir and the holder's pid.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import subprocess
import sys

import pytest

from minibroker.broker.storage import checkpoint as checkpoint_module
from minibroker.broker.storage import data_dir as data_dir_module
from minibroker.broker.storage.checkpoint import OffsetCheckpointFile
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.data_dir import BOOT_ID_FILE, DataDir, parse_partition_dir
from minibroker.broker.storage.errors import (
    DataDirError,
    DataDirInUseError,
    InconsistentTopicIdError,
    MetaPropertiesError,
)
from minibroker.broker.storage.log_manager import LogManager, read_partition_metadata
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition

A0 = TopicPartition("alpha", 0)
A1 = TopicPartition("alpha", 1)
B0 = TopicPartition("beta-topic", 0)


def batch(count: int = 2) -> bytes:
    return encode_batch([(1_000 + i, None, b"v", ()) for i in range(count)])


_SECOND_OPEN = """
import sys
from minibroker.broker.storage.data_dir import DataDir
from minibroker.broker.storage.errors import DataDirInUseError
try:
    DataDir.open(sys.argv[1], node_id=1)
except DataDirInUseError as err:
    print(err)
    sys.exit(3)
print("opened")
"""


def test_second_process_on_the_same_dir_fails_with_a_clear_message(
    tmp_path: pathlib.Path,
) -> None:
    with DataDir.open(tmp_path / "data", node_id=1):
        proc = subprocess.Popen(
            [sys.executable, "-c", _SECOND_OPEN, str(tmp_path / "data")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 3, err
        expected = f"data dir {tmp_path / 'data'} is in use by another process (pid {os.getpid()})"
        assert expected in out
    # Released on close: the next open works.
    DataDir.open(tmp_path / "data", node_id=1).close()


def test_second_open_in_the_same_process_fails_too(tmp_path: pathlib.Path) -> None:
    with DataDir.open(tmp_path, node_id=1), pytest.raises(DataDirInUseError):
        DataDir.open(tmp_path, node_id=1)


def test_meta_properties_identity_checks(tmp_path: pathlib.Path) -> None:
    with DataDir.open(tmp_path, node_id=4, cluster_id="c-1") as data_dir:
        assert data_dir.cluster_id == "c-1"
    text = (tmp_path / "meta.properties").read_text()
    assert "node.id=4" in text and "cluster.id=c-1" in text and "version=1" in text
    with pytest.raises(MetaPropertiesError, match="belongs to node 4"):
        DataDir.open(tmp_path, node_id=5)
    with pytest.raises(MetaPropertiesError, match="belongs to cluster c-1"):
        DataDir.open(tmp_path, node_id=4, cluster_id="c-2")
    with DataDir.open(tmp_path, node_id=4) as data_dir:
        assert data_dir.cluster_id == "c-1"
        with pytest.raises(MetaPropertiesError):
            data_dir.adopt_cluster_id("c-9")


def test_fresh_dir_adopts_the_cluster_id_later(tmp_path: pathlib.Path) -> None:
    with DataDir.open(tmp_path, node_id=2) as data_dir:
        assert data_dir.cluster_id is None
        data_dir.adopt_cluster_id("abc")
    with DataDir.open(tmp_path, node_id=2) as data_dir:
        assert data_dir.cluster_id == "abc"


def test_clean_shutdown_marker_is_read_once(tmp_path: pathlib.Path) -> None:
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        assert not data_dir.had_clean_shutdown
        data_dir.mark_clean_shutdown(broker_epoch=42)
    assert json.loads((tmp_path / ".kafka_cleanshutdown").read_text()) == {
        "version": 0,
        "brokerEpoch": 42,
    }
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        assert data_dir.had_clean_shutdown and data_dir.previous_broker_epoch == 42
    assert not (tmp_path / ".kafka_cleanshutdown").exists()
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        assert not data_dir.had_clean_shutdown and data_dir.previous_broker_epoch == -1


@pytest.mark.parametrize(
    ("call", "code", "failing_file", "advice"),
    [
        ("pwrite", errno.ENOSPC, ".lock", "free space"),
        ("write", errno.EFBIG, "meta.properties", "ulimit -f"),
        ("open", errno.EROFS, ".lock", "make it writable"),
        ("fsync", errno.EIO, "meta.properties", "check the disk"),
    ],
)
def test_a_data_dir_that_cannot_be_written_is_a_clear_error_naming_the_file(
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    call: str,
    code: int,
    failing_file: str,
    advice: str,
) -> None:
    """A full disk, a read-only or failing one at start-up: DataDirError (the broker prints it
    as one line) naming the dir, the file, the error and what to do; no bare OSError, and the
    lock is not left held."""

    class FailingOs:
        """`os` for the data dir's modules, with `call` failing."""

        def __getattr__(self, name: str) -> object:
            if name != call:
                return getattr(os, name)

            def failing(*args: object, **kwargs: object) -> object:
                raise OSError(code, os.strerror(code))

            return failing

    for module in (data_dir_module, checkpoint_module):
        monkeypatch.setattr(module, "os", FailingOs())
    with pytest.raises(DataDirError) as info:
        DataDir.open(tmp_path / "d", 1)
    message = str(info.value)
    assert f"cannot use data dir {tmp_path / 'd'}" in message
    assert str(tmp_path / "d" / failing_file) in message
    assert os.strerror(code) in message and errno.errorcode[code] in message
    assert advice in message
    monkeypatch.undo()
    DataDir.open(tmp_path / "d", 1).close()  # healed: it opens (the lock was released)


def test_partition_dir_names() -> None:
    assert parse_partition_dir("orders-3") == TopicPartition("orders", 3)
    assert parse_partition_dir("my-topic-12") == TopicPartition("my-topic", 12)
    assert parse_partition_dir("orders-3.abc-delete") is None
    assert parse_partition_dir("meta.properties") is None
    assert parse_partition_dir("orders") is None
    assert parse_partition_dir("orders-3\n") is None
    assert parse_partition_dir("orders\n-3") is None


def test_log_manager_creates_reopens_and_checkpoints(tmp_path: pathlib.Path) -> None:
    data_dir = DataDir.open(tmp_path, node_id=1, cluster_id="c")
    logs = LogManager.open(data_dir, LogConfig(segment_bytes=1 << 20))
    a0 = logs.get_or_create_log(A0, topic_id="tid-a")
    b0 = logs.get_or_create_log(B0, topic_id="tid-b", config=LogConfig(segment_bytes=300))
    for _ in range(5):
        a0.append_as_leader(batch(), leader_epoch=1, now_ms=0)
        b0.append_as_leader(batch(), leader_epoch=2, now_ms=0)
    logs.checkpoint_high_watermarks({A0: 6, B0: 10, A1: 3})  # A1 has no log here: left out
    assert read_partition_metadata(tmp_path / "alpha-0") == "tid-a"
    assert (tmp_path / "beta-topic-0" / "partition.metadata").read_text() == (
        "version: 0\ntopic_id: tid-b\n"
    )
    logs.close()
    assert OffsetCheckpointFile(tmp_path / "replication-offset-checkpoint").read() == {
        A0: 6,
        B0: 10,
    }
    assert OffsetCheckpointFile(tmp_path / "recovery-point-offset-checkpoint").read() == {
        A0: 10,
        B0: 10,
    }
    assert (tmp_path / "log-start-offset-checkpoint").read_text().splitlines()[:2] == ["0", "2"]
    data_dir.mark_clean_shutdown(7)
    data_dir.close()

    data_dir = DataDir.open(tmp_path, node_id=1, cluster_id="c")
    logs = LogManager.open(data_dir, topic_configs={"beta-topic": LogConfig(segment_bytes=300)})
    assert sorted(logs.logs) == [A0, B0]
    assert logs.topic_id(A0) == "tid-a"
    assert (logs.logs[A0].leo, logs.checkpointed_high_watermark(A0)) == (10, 6)
    assert logs.checkpointed_high_watermark(B0) == 10
    assert logs.logs[B0].config.segment_bytes == 300
    assert logs.logs[A0].recovery_point == 10
    with pytest.raises(InconsistentTopicIdError):
        logs.get_or_create_log(A0, topic_id="tid-other")
    assert logs.get_or_create_log(A0, topic_id="tid-a") is logs.logs[A0]
    logs.close()
    data_dir.close()


def test_log_manager_delete_log_removes_the_dir(tmp_path: pathlib.Path) -> None:
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        log = logs.get_or_create_log(A1, topic_id="t")
        log.append_as_leader(batch(), leader_epoch=0, now_ms=0)
        assert logs.delete_log(A1)
        assert not logs.delete_log(A1)
        assert logs.get_log(A1) is None
        assert not any(p.name.startswith("alpha-1") for p in tmp_path.iterdir())
        # A re-created partition starts empty.
        assert logs.get_or_create_log(A1, topic_id="t2").leo == 0
        logs.close()


def test_log_manager_retention_and_flush_policies(tmp_path: pathlib.Path) -> None:
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir, LogConfig(segment_bytes=200, retention_ms=10))
        log = logs.get_or_create_log(
            A0, config=LogConfig(segment_bytes=200, flush_ms=100), now_ms=0
        )
        for _ in range(6):
            log.append_as_leader(batch(), leader_epoch=0, now_ms=0)
        assert logs.maybe_flush(now_ms=50) == []
        assert logs.maybe_flush(now_ms=10_000) == [A0]
        deleted = logs.delete_retention(now_ms=10_000, high_watermarks={A0: log.leo})
        assert A0 not in deleted  # this topic's retention.ms is the 7-day default
        logs.update_topic_config("alpha", LogConfig(segment_bytes=200, retention_ms=10))
        assert logs.delete_retention(now_ms=10_000, high_watermarks={}) == {}  # no HW: kept
        deleted = logs.delete_retention(now_ms=10_000, high_watermarks={A0: log.leo})
        assert deleted[A0] and log.log_start_offset == log.segments[0].base_offset > 0
        checkpoint = OffsetCheckpointFile(tmp_path / "log-start-offset-checkpoint").read()
        assert checkpoint[A0] == log.log_start_offset
        logs.close()


def test_unclean_restart_recovers_from_the_checkpointed_recovery_point(
    tmp_path: pathlib.Path,
) -> None:
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir, LogConfig(segment_bytes=200))
        log = logs.get_or_create_log(A0)
        for _ in range(8):
            log.append_as_leader(batch(), leader_epoch=0, now_ms=0)
        leo = log.leo
        logs.flush_all()  # recovery point = LEO in the checkpoint
        log.append_as_leader(batch(), leader_epoch=0, now_ms=0)
        active = log.active_segment
        # Crash: no close, no marker. Tear the last batch of the active segment.
        os.truncate(log.directory / f"{active.base_offset:020d}.log", active.size - 1)
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        assert not data_dir.had_clean_shutdown
        logs = LogManager.open(data_dir, LogConfig(segment_bytes=200))
        again = logs.get_log(A0)
        assert again is not None and again.leo == leo
        assert again.recovery_point == leo
        logs.close()


# -- a damaged or missing identity (issue 11 item 9) -------------------------------------------

GARBAGE_META = [
    pytest.param(bytes(range(256)) * 4, id="random-bytes"),
    pytest.param(b"\xff\xfe\x00\x01version=1\n", id="not-utf8"),
    pytest.param(b"version=1\nnode.id=1\x00\n", id="nul-byte"),
    pytest.param(b"this is not a properties file\n", id="no-equals"),
    pytest.param(b"version=1\nnode.id=one\n", id="bad-node-id"),
    pytest.param(b"version=7\nnode.id=1\n", id="unknown-version"),
    pytest.param(b"", id="empty"),
]


@pytest.mark.parametrize("content", GARBAGE_META)
def test_garbage_meta_properties_is_a_clear_error_and_left_untouched(
    tmp_path: pathlib.Path, content: bytes
) -> None:
    meta = tmp_path / "meta.properties"
    meta.write_bytes(content)
    with pytest.raises(MetaPropertiesError) as caught:
        DataDir.open(tmp_path, node_id=1)
    message = str(caught.value)
    assert str(meta) in message
    # It says what to do, on one line.
    assert "restore" in message and "\n" not in message
    assert meta.read_bytes() == content
    # The lock was released: the error is not a side effect of a leaked lock.
    with pytest.raises(MetaPropertiesError):
        DataDir.open(tmp_path, node_id=1)


def test_meta_properties_that_is_a_directory_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    (tmp_path / "meta.properties").mkdir()
    with pytest.raises(MetaPropertiesError, match=r"cannot read .*meta\.properties"):
        DataDir.open(tmp_path, node_id=1)


FOREIGN_DATA = [
    pytest.param(lambda d: (d / "orders-0").mkdir(), id="partition-dir"),
    pytest.param(lambda d: (d / "orders-0.0123abcd-delete").mkdir(), id="delete-dir"),
    pytest.param(lambda d: (d / "replication-offset-checkpoint").write_text("0\n0\n"), id="hw"),
    pytest.param(
        lambda d: (d / "recovery-point-offset-checkpoint").write_text("0\n0\n"), id="recovery"
    ),
    pytest.param(lambda d: (d / "log-start-offset-checkpoint").write_text("0\n0\n"), id="lso"),
    pytest.param(
        lambda d: (d / "cleaner-offset-checkpoint").write_text("0\n0\n"), id="log-cleaner"
    ),
    pytest.param(
        lambda d: (d / ".kafka_cleanshutdown").write_text('{"version":0,"brokerEpoch":3}'),
        id="clean-shutdown-marker",
    ),
]


@pytest.mark.parametrize("plant", FOREIGN_DATA)
def test_dir_without_meta_properties_holding_broker_data_is_refused(
    tmp_path: pathlib.Path, plant
) -> None:
    plant(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(MetaPropertiesError) as caught:
        DataDir.open(tmp_path, node_id=1)
    message = str(caught.value)
    assert "no meta.properties" in message
    assert "remove the directory or restore its meta.properties" in message
    assert "\n" not in message
    # Nothing was formatted or deleted (the lock file is the only thing added).
    assert not (tmp_path / "meta.properties").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".lock") == before


def test_an_empty_dir_or_one_with_only_the_lock_file_is_formatted(
    tmp_path: pathlib.Path,
) -> None:
    with DataDir.open(tmp_path / "new", node_id=3):
        pass
    assert "node.id=3" in (tmp_path / "new" / "meta.properties").read_text()
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / ".lock").write_text("12345\n")
    (locked / "meta.properties.tmp").write_text("version=1\n")  # a first start that crashed
    with DataDir.open(locked, node_id=3):
        pass
    assert "node.id=3" in (locked / "meta.properties").read_text()


def test_a_topic_named_under_the_old_rule_costs_no_other_partition_its_checkpoints(
    tmp_path: pathlib.Path,
) -> None:
    # A topic created before names were matched in full: "weird\n" got through.
    weird = TopicPartition("weird\n", 0)
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir, LogConfig(segment_bytes=200))
        for tp, topic_id in ((A0, "tid-a"), (weird, "tid-w")):
            log = logs.get_or_create_log(tp, topic_id=topic_id)
            for _ in range(6):
                log.append_as_leader(batch(), leader_epoch=0, now_ms=0)
            assert log.maybe_increment_log_start_offset(5)
        logs.checkpoint_high_watermarks({A0: 8, weird: 8})
        logs.close()
        data_dir.mark_clean_shutdown(3)
    # Its entries are kept too, each on one line.
    assert OffsetCheckpointFile(tmp_path / "replication-offset-checkpoint").read()[weird] == 8
    assert OffsetCheckpointFile(tmp_path / "log-start-offset-checkpoint").read()[weird] == 5
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir, LogConfig(segment_bytes=200))
        again = logs.get_log(A0)
        assert again is not None
        hw = logs.checkpointed_high_watermark(A0)
        assert (hw, again.log_start_offset, again.recovery_point) == (8, 5, 12)
        logs.close()


def test_checkpointed_high_watermark_is_clamped_to_the_loaded_log(tmp_path: pathlib.Path) -> None:
    # The checkpoint may name more than a log recovered to less holds, or less than its log
    # start: the core is handed a HW within [log start, LEO].
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        for tp in (A0, A1, B0):
            log = logs.get_or_create_log(tp, topic_id="t")
            for _ in range(6):
                log.append_as_leader(batch(), leader_epoch=0, now_ms=0)
        assert logs.get_or_create_log(B0).maybe_increment_log_start_offset(6)
        logs.close()
    OffsetCheckpointFile(tmp_path / "replication-offset-checkpoint").write({A0: 999, A1: 4, B0: 2})
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        assert logs.checkpointed_high_watermark(A0) == logs.logs[A0].leo == 12
        assert logs.checkpointed_high_watermark(A1) == 4
        assert logs.checkpointed_high_watermark(B0) == 6  # the log start
        assert logs.checkpointed_high_watermark(TopicPartition("gamma", 0)) == 0  # no log
        assert logs.delete_log(A1)
        # A new log of the partition starts from nothing the old one's checkpoint said.
        new = logs.get_or_create_log(A1, topic_id="t2")
        assert new.leo == 0
        for _ in range(3):
            new.append_as_leader(batch(), leader_epoch=0, now_ms=0)
        assert logs.checkpointed_high_watermark(A1) == 0
        logs.close()


def test_a_checkpoint_keeps_the_loaded_high_watermark_of_a_log_not_hosted_yet(
    tmp_path: pathlib.Path,
) -> None:
    # Found in review: the first checkpoint after a start comes before the metadata has hosted
    # anything, and the caller's map then lacked every loaded log: the file was emptied, and
    # after the next restart those partitions' HWs started back at their log start.
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        for tp in (A0, B0):
            log = logs.get_or_create_log(tp, topic_id="t")
            for _ in range(6):
                log.append_as_leader(batch(), leader_epoch=0, now_ms=0)
        logs.checkpoint_high_watermarks({A0: 4, B0: 5})
        logs.close()
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        logs = LogManager.open(data_dir)
        logs.checkpoint_high_watermarks({B0: 6})  # only B0 hosted so far
        logs.close()
    assert OffsetCheckpointFile(tmp_path / "replication-offset-checkpoint").read() == {
        A0: 4,
        B0: 6,
    }


def test_the_boot_id_tells_whether_the_os_restarted_since_the_last_start(
    tmp_path: pathlib.Path,
) -> None:
    # The epoch checkpoints are not fsynced on every write: after an OS restart loading trusts
    # them less (docs/design.md §4.3). Unknown counts as restarted.
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        assert data_dir.system_restarted  # no record of an earlier start
    boot_id = data_dir_module.current_boot_id()
    assert boot_id is not None  # Linux: /proc/sys/kernel/random/boot_id
    assert (tmp_path / BOOT_ID_FILE).read_text().strip() == boot_id
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        assert not data_dir.system_restarted  # same boot: only the process restarted
    (tmp_path / BOOT_ID_FILE).write_text("another-boot\n")
    with DataDir.open(tmp_path, node_id=1) as data_dir:
        assert data_dir.system_restarted
    assert (tmp_path / BOOT_ID_FILE).read_text().strip() == boot_id
