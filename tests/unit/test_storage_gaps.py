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

import pytest

from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.log import PartitionLog
from minibroker.broker.storage.log_loader import GAPS_MARKER
from minibroker.client.errors import KafkaStorageError
from minibroker.client.types import TopicPartition

TP = TopicPartition("changes", 0)
CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=100)


def open_log(directory: pathlib.Path, *, clean: bool = False) -> PartitionLog:
    return PartitionLog.open(directory, TP, CONFIG, now_ms=0, had_clean_shutdown=clean)


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
