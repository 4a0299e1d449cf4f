"""Checkpoint files, sparse indexes, LogConfig and `minibroker bench log` (docs/design.md §4).

Checkpoints use Kafka's text format and are replaced atomically (docs/design.md §4.3); indexes
follow Kafka's OffsetIndex and TimeIndex (docs/design.md §4.2: lookups return the largest entry
<= the target).
"""

from __future__ import annotations

import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minibroker.broker.config import build_config
from minibroker.broker.storage.checkpoint import (
    LeaderEpochCheckpointFile,
    OffsetCheckpointFile,
    escape_topic,
    unescape_topic,
    write_atomic,
)
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.epoch_cache import EpochEntry
from minibroker.broker.storage.errors import CorruptCheckpointError
from minibroker.broker.storage.index import PENDING_ENTRIES_MAX, OffsetIndex, TimeIndex
from minibroker.client.common.config import ConfigError
from minibroker.client.types import TopicPartition

# -- checkpoints ---------------------------------------------------------------------------


def test_offset_checkpoint_format_and_round_trip(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "replication-offset-checkpoint"
    file = OffsetCheckpointFile(path)
    assert file.read() == {}
    file.write({TopicPartition("b", 1): 7, TopicPartition("a", 0): 42})
    assert path.read_text() == "0\n2\na 0 42\nb 1 7\n"
    assert file.read() == {TopicPartition("a", 0): 42, TopicPartition("b", 1): 7}
    assert not (tmp_path / "replication-offset-checkpoint.tmp").exists()


def test_epoch_checkpoint_format_and_round_trip(tmp_path: pathlib.Path) -> None:
    file = LeaderEpochCheckpointFile(tmp_path / "leader-epoch-checkpoint")
    assert file.read() is None
    file.write([EpochEntry(0, 0), EpochEntry(3, 120)])
    assert file.path.read_text() == "0\n2\n0 0\n3 120\n"
    assert file.read() == [EpochEntry(0, 0), EpochEntry(3, 120)]
    file.write([])
    assert file.read() == []


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1\n0\n",  # unknown version
        "0\nx\n",  # bad count
        "0\n2\n1 5\n",  # fewer entries than the count
        "0\n1\n1 5 9\n",  # wrong field count
        "0\n1\none 5\n",  # not a number
    ],
)
def test_corrupt_epoch_checkpoint_is_reported(tmp_path: pathlib.Path, text: str) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text(text)
    with pytest.raises(CorruptCheckpointError, match="leader-epoch-checkpoint"):
        LeaderEpochCheckpointFile(path).read()


@pytest.mark.parametrize("text", ["", "1\n0\n", "0\nx\n", "\xff\n"])
def test_offset_checkpoint_of_another_format_is_reported(tmp_path: pathlib.Path, text: str) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    path.write_bytes(text.encode("latin-1"))
    with pytest.raises(CorruptCheckpointError):
        OffsetCheckpointFile(path).read()


@pytest.mark.parametrize(
    "bad_line",
    [
        "topic zero 5",  # not a number
        "topic 0",  # a field missing
        "topic 0 5 9",  # a field too many
        "topic -1 5",  # no such partition
        "a/b 0 5",  # not a topic name
    ],
)
def test_one_bad_offset_checkpoint_entry_costs_only_itself(
    tmp_path: pathlib.Path, bad_line: str
) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    path.write_text(f"0\n3\na 0 42\n{bad_line}\nb 1 7\n")
    assert OffsetCheckpointFile(path).read() == {
        TopicPartition("a", 0): 42,
        TopicPartition("b", 1): 7,
    }


def test_a_topic_name_ending_in_a_newline_leaves_the_other_entries_readable(
    tmp_path: pathlib.Path,
) -> None:
    # What the writer produced for a topic created under the old name rule (`^...$` let
    # "orders\n" through): the entry spans two lines and the count no longer matches them.
    path = tmp_path / "replication-offset-checkpoint"
    path.write_text("0\n3\na 0 42\norders\n 0 5\nb 1 7\n")
    assert OffsetCheckpointFile(path).read() == {
        TopicPartition("a", 0): 42,
        TopicPartition("b", 1): 7,
    }


@pytest.mark.parametrize("topic", ["orders\n", "a b", "tab\tbed", "x\u2028y", "ä", "%41", "a\r"])
def test_offset_checkpoint_round_trips_any_topic_name(tmp_path: pathlib.Path, topic: str) -> None:
    path = tmp_path / "log-start-offset-checkpoint"
    file = OffsetCheckpointFile(path)
    offsets = {TopicPartition(topic, 3): 11, TopicPartition("plain", 0): 4}
    file.write(offsets)
    text = path.read_text()
    assert len(text.splitlines()) == 2 + len(offsets)  # one line per entry, whatever the name
    assert "plain 0 4\n" in text  # legal names are written as they are (Kafka's format)
    assert file.read() == offsets


@given(st.text(st.characters(exclude_categories=["Cs"]), min_size=1))
def test_escaped_topic_is_one_field_and_comes_back(topic: str) -> None:
    field = escape_topic(topic)
    assert field.split() == [field] and field.isascii() and field.isprintable()
    assert unescape_topic(field) == topic


def test_write_atomic_replaces_the_whole_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "f"
    write_atomic(path, b"first version, longer")
    write_atomic(path, b"second")
    assert path.read_bytes() == b"second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


# -- indexes -------------------------------------------------------------------------------


def test_offset_index_lookup_truncate_and_reload(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "00000000000000000100.index"
    index = OffsetIndex.create(path, 100)
    assert index.lookup(150) == (100, 0)
    for i in range(1, 6):
        index.append(100 + 10 * i, 1000 * i)
    assert index.lookup(99) == (100, 0)
    assert index.lookup(110) == (110, 1000)
    assert index.lookup(125) == (120, 2000)
    assert index.lookup(10**9) == (150, 5000)
    assert index.floor_position(2500) == 2000
    with pytest.raises(ValueError):
        index.append(150, 6000)  # offsets must grow
    with pytest.raises(ValueError):
        index.append(160, 5000)  # positions must grow
    index.truncate_to(130)
    assert index.entries() == [(110, 1000), (120, 2000)]
    index.flush()
    assert path.stat().st_size == 16
    again = OffsetIndex.load(path, 100, log_size=3000)
    assert again is not None and again.entries() == [(110, 1000), (120, 2000)]
    # An entry pointing past the end of the .log makes the index inconsistent.
    assert OffsetIndex.load(path, 100, log_size=2000) is None
    assert OffsetIndex.load(tmp_path / "missing.index", 100, log_size=10) is None


def test_index_entries_reach_the_file_in_groups(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    index = OffsetIndex.create(path, 0)
    for i in range(PENDING_ENTRIES_MAX - 1):
        index.append(i, i * 10)
    assert path.stat().st_size == 0
    index.append(PENDING_ENTRIES_MAX, PENDING_ENTRIES_MAX * 10)
    assert path.stat().st_size == PENDING_ENTRIES_MAX * 8
    index.truncate_to(5)  # rewrites the file from memory
    assert path.stat().st_size == 5 * 8
    loaded = OffsetIndex.load(path, 0, log_size=10**6)
    assert loaded is not None and len(loaded) == 5


def test_time_index_keeps_only_growing_timestamps(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "00000000000000000000.timeindex"
    index = TimeIndex.create(path, 0)
    assert index.lookup(5) == (-1, 0)
    index.maybe_append(100, 3)
    index.maybe_append(100, 5)  # not larger: ignored
    index.maybe_append(90, 6)  # smaller: ignored
    index.maybe_append(200, 9)
    assert index.entries() == [(100, 3), (200, 9)]
    assert index.lookup(150) == (100, 3)
    assert index.lookup(99) == (-1, 0)
    index.truncate_to(9)
    index.flush()
    loaded = TimeIndex.load(path, 0, next_offset=10)
    assert loaded is not None and loaded.entries() == [(100, 3)]
    assert TimeIndex.load(path, 0, next_offset=3) is None  # offset past the segment's end


# -- LogConfig -----------------------------------------------------------------------------


def test_log_config_uses_the_shared_topic_config_keys() -> None:
    config = LogConfig.from_configs(
        {"segment.bytes": "1000", "message.timestamp.type": "LogAppendTime"},
        defaults=build_config(
            {"log.retention.ms": 5, "node.id": 1, "log.dirs": "/unused"}
        ).topic_defaults,
    )
    assert config.segment_bytes == 1000
    assert config.retention_ms == 5
    assert config.log_append_time
    assert LogConfig.from_configs() == LogConfig()
    assert LogConfig().segment_bytes == 64 * 1024 * 1024
    with pytest.raises(ConfigError, match=r"segment\.bytes"):
        LogConfig.from_configs({"segment.bytes": "-1"})
    with pytest.raises(ConfigError):
        LogConfig.from_configs({"segment.bytez": "1"})


# -- bench ---------------------------------------------------------------------------------


def test_bench_log_runs_and_prints_the_three_ratios(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    import structlog

    from minibroker.broker.storage import bench

    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["log", "--total-mb", "1", "--runs", "1", "--dir", str(tmp_path)])
    saved = structlog.get_config()
    try:
        status = args.func(args)
    finally:
        structlog.configure(**saved)
    out = capsys.readouterr().out
    assert status == 0
    for label in ("append (leader, 1/call)", "append (follower)", "read (sequential)"):
        line = next(line for line in out.splitlines() if line.startswith(label))
        log_mb, raw_mb, ratio = (float(x) for x in line[len(label) :].split())
        # Figures, not speeds: on a loaded machine the log's figure may print as 0.0, so the
        # check is that the three columns are what they say (the ratio is log / raw, to the
        # printed precision), not that either side is fast.
        assert log_mb >= 0 and raw_mb > 0
        assert abs(ratio - log_mb / raw_mb) <= 0.006 + 0.05 / raw_mb
    assert list(tmp_path.iterdir()) == []  # scratch removed
