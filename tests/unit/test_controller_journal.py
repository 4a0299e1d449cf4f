"""The controller's metadata journal on disk (controller/journal.py): fsynced frames, one per
command; a torn or corrupt tail truncated at start (never acknowledged); snapshots that replace
older segments; the data dir's cluster id and lock. Files in a tmp dir; no sockets, no loop."""

from __future__ import annotations

import pathlib

import pytest

from minibroker.controller.journal import DataDir, JournalError
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import (
    LogEntry,
    NoOpRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from tests.unit.legacy_journal import MetadataJournal


def command(offset: int, n: int = 2) -> list[LogEntry]:
    """A command's entries: a topic and its partitions, at consecutive offsets."""
    topic_id = f"id-{offset}"
    out = [LogEntry(offset, 1000 + offset, TopicRecord(f"t{offset}", topic_id, {"a": "b"}))]
    for i in range(n - 1):
        out.append(
            LogEntry(offset + 1 + i, 1000, PartitionRecord(topic_id, i, (1, 2), (1, 2), 1, 0, 0))
        )
    return out


def fill(journal: MetadataJournal, commands: int) -> list[LogEntry]:
    written: list[LogEntry] = []
    offset = 0
    for _ in range(commands):
        entries = command(offset)
        journal.append(entries)
        written += entries
        offset += len(entries)
    return written


def test_round_trip(tmp_path: pathlib.Path) -> None:
    j = MetadataJournal(tmp_path)
    j.load()
    written = fill(j, 5)
    j.close()
    loaded = MetadataJournal(tmp_path).load()
    assert loaded.entries == tuple(written)
    assert loaded.snapshot_records is None and loaded.truncated_bytes == 0


@pytest.mark.parametrize("damage", ["torn", "crc", "garbage_length"])
def test_damaged_tail_is_truncated_and_appends_continue(tmp_path: pathlib.Path, damage) -> None:
    j = MetadataJournal(tmp_path)
    j.load()
    written = fill(j, 3)
    j.append(command(6))
    j.close()
    (segment,) = tmp_path.glob("metadata-*.log")
    data = segment.read_bytes()
    last_frame_start = len(data) - (len(data) - _prefix_len(data, 3))
    if damage == "torn":
        data = data[: len(data) - 5]  # the process died mid-write of the 4th command
    elif damage == "crc":
        data = data[:-1] + bytes([data[-1] ^ 0xFF])
    else:
        data = data[:last_frame_start] + b"\xff\xff\xff\xff\x00\x00\x00\x00junk"
    segment.write_bytes(data)
    j2 = MetadataJournal(tmp_path)
    loaded = j2.load()
    assert loaded.entries == tuple(written)  # the whole 4th command is gone, nothing else
    assert loaded.truncated_bytes > 0
    assert segment.stat().st_size == last_frame_start
    j2.append(command(6))
    j2.close()
    assert MetadataJournal(tmp_path).load().entries == (*written, *command(6))


def _prefix_len(data: bytes, frames: int) -> int:
    pos = 0
    for _ in range(frames):
        pos += 8 + int.from_bytes(data[pos : pos + 4], "big")
    return pos


def test_snapshot_replaces_older_segments(tmp_path: pathlib.Path) -> None:
    j = MetadataJournal(tmp_path)
    j.load()
    written = fill(j, 4)
    image = MetadataImage()
    for e in written:
        image.apply(e)
    j.write_snapshot(image.to_records(), image.next_offset)
    later = command(image.next_offset)
    j.append(later)
    j.close()
    assert [p.name for p in sorted(tmp_path.glob("metadata-*.log"))] == [
        f"metadata-{image.next_offset:020d}.log"
    ]
    loaded = MetadataJournal(tmp_path).load()
    assert loaded.snapshot_offset == image.next_offset
    assert loaded.entries == tuple(later)
    rebuilt = MetadataImage()
    rebuilt.replace_with_snapshot(loaded.snapshot_records or (), loaded.snapshot_offset)
    for e in loaded.entries:
        rebuilt.apply(e)
        image.apply(e)
    assert rebuilt == image


def test_crash_after_snapshot_before_cleanup_skips_covered_entries(tmp_path: pathlib.Path) -> None:
    j = MetadataJournal(tmp_path)
    j.load()
    written = fill(j, 3)
    j.close()
    # Write a snapshot file as write_snapshot would, but leave the old segment in place.
    other = MetadataJournal(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    other.load()
    other.write_snapshot([NoOpRecord()], 4)
    other.close()
    (tmp_path / "elsewhere" / f"snapshot-{4:020d}.snap").rename(
        tmp_path / f"snapshot-{4:020d}.snap"
    )
    loaded = MetadataJournal(tmp_path).load()
    assert loaded.snapshot_offset == 4
    assert loaded.entries == tuple(e for e in written if e.offset >= 4)


def test_corruption_before_the_last_segment_is_an_error(tmp_path: pathlib.Path) -> None:
    j = MetadataJournal(tmp_path)
    j.load()
    fill(j, 2)
    j.close()
    (first,) = tmp_path.glob("metadata-*.log")
    first.write_bytes(first.read_bytes()[:-3])
    (tmp_path / f"metadata-{99:020d}.log").write_bytes(b"")
    with pytest.raises(JournalError, match="not the last segment"):
        MetadataJournal(tmp_path).load()


def test_gap_in_offsets_is_an_error(tmp_path: pathlib.Path) -> None:
    j = MetadataJournal(tmp_path)
    j.load()
    j.append(command(0))
    j.append(command(5))
    j.close()
    with pytest.raises(JournalError, match="gap"):
        MetadataJournal(tmp_path).load()


def test_cluster_id_is_created_once_and_kept(tmp_path: pathlib.Path) -> None:
    first, created = DataDir(tmp_path).load_or_create_cluster_id(1000)
    again, created_again = DataDir(tmp_path).load_or_create_cluster_id(1000)
    assert created and not created_again and first == again and len(first) == 22


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(bytes(range(256)) * 4, id="random-bytes"),
        pytest.param(b"\xff\xfecluster.id=abc\n", id="not-utf8"),
        pytest.param(b"node.id=1000\nversion=1\n", id="no-cluster-id"),
        pytest.param(b"cluster.id=a b\x01c\nnode.id=1000\nversion=1\n", id="junk-cluster-id"),
        pytest.param(b"", id="empty"),
    ],
)
def test_garbage_meta_properties_is_a_clear_error_and_left_untouched(
    tmp_path: pathlib.Path, content: bytes
) -> None:
    meta = tmp_path / "meta.properties"
    meta.write_bytes(content)
    with pytest.raises(JournalError) as caught:
        DataDir(tmp_path).load_or_create_cluster_id(1000)
    message = str(caught.value)
    assert str(meta) in message and "restore" in message and "\n" not in message
    assert meta.read_bytes() == content


@pytest.mark.parametrize(
    "name", ["metadata-00000000000000000000.log", "snapshot-00000000000000000042.snap"]
)
def test_metadata_log_without_meta_properties_is_refused(tmp_path: pathlib.Path, name) -> None:
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(JournalError) as caught:
        DataDir(tmp_path).load_or_create_cluster_id(1000)
    message = str(caught.value)
    assert "no meta.properties" in message and name in message
    assert "remove the directory or restore its meta.properties" in message
    assert not (tmp_path / "meta.properties").exists()


def test_data_dir_lock_excludes_a_second_owner(tmp_path: pathlib.Path) -> None:
    owner = DataDir(tmp_path)
    owner.lock()
    try:
        with pytest.raises(JournalError, match="in use"):
            DataDir(tmp_path).lock()
    finally:
        owner.unlock()
    DataDir(tmp_path).lock()


def test_register_broker_records_survive(tmp_path: pathlib.Path) -> None:
    j = MetadataJournal(tmp_path)
    j.load()
    entry = LogEntry(0, 5, RegisterBrokerRecord(1, "inc", 0, "h", 9, "r", True, -1))
    j.append([entry])
    j.close()
    assert MetadataJournal(tmp_path).load().entries == (entry,)
