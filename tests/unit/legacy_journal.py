"""The metadata journal as the controller wrote it before the quorum existed (one frame per
command, no epochs): kept here only to write old-format data dirs for the upgrade-in-place
tests. The controller reads such dirs with `RaftLog` (controller/quorum/raft_log.py)."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from minibroker.controller.journal import (
    JournalError,
    _frame,
    _fsync_dir,
    _read_frames,
    write_atomically,
)
from minibroker.metadata.records import LogEntry, MetadataRecord
from minibroker.metadata.wire import (
    batch_to_pb,
    entry_from_pb,
    record_from_pb,
    snapshot_to_pb,
)
from minibroker.proto import minibroker_pb2 as pb


@dataclass(frozen=True, slots=True)
class LoadedLog:
    snapshot_records: tuple[MetadataRecord, ...] | None
    snapshot_offset: int  # 0 when there is no snapshot
    entries: tuple[LogEntry, ...]  # every entry at or after snapshot_offset, in order
    truncated_bytes: int  # torn tail dropped at start


class MetadataJournal:
    """Append-only, fsynced metadata log with snapshots. Not thread-safe: one caller."""

    def __init__(self, path: str | pathlib.Path) -> None:
        self.path = pathlib.Path(path)
        self._fd: int | None = None
        self._segment: pathlib.Path | None = None
        self.snapshot_offset = 0

    # -- start --------------------------------------------------------------------------------

    def _segments(self) -> list[pathlib.Path]:
        return sorted(self.path.glob("metadata-*.log"))

    def _snapshots(self) -> list[pathlib.Path]:
        return sorted(self.path.glob("snapshot-*.snap"))

    def load(self) -> LoadedLog:
        """Read the newest snapshot and every later entry; truncate a torn tail; open the last
        segment for appends."""
        for tmp in self.path.glob("*.tmp"):
            tmp.unlink()
        snapshot_records: tuple[MetadataRecord, ...] | None = None
        snapshots = self._snapshots()
        if snapshots:
            latest = snapshots[-1]
            payloads, _ = _read_frames(latest.read_bytes())
            if len(payloads) != 1:
                raise JournalError(f"snapshot {latest} is corrupt")
            batch = pb.MetadataBatch.FromString(payloads[0])
            snapshot_records = tuple(record_from_pb(r) for r in batch.records)
            self.snapshot_offset = batch.snapshot_offset
        entries: list[LogEntry] = []
        truncated = 0
        segments = self._segments()
        for i, segment in enumerate(segments):
            data = segment.read_bytes()
            payloads, valid = _read_frames(data)
            if valid < len(data):
                if i != len(segments) - 1:
                    raise JournalError(
                        f"{segment} is corrupt at byte {valid} and is not the last segment"
                    )
                # A torn tail: the write was never acknowledged, because acknowledging waits
                # for the fsync of the whole frame.
                truncated = len(data) - valid
                with open(segment, "r+b") as f:
                    f.truncate(valid)
                    f.flush()
                    os.fsync(f.fileno())
            for payload in payloads:
                for msg in pb.MetadataBatch.FromString(payload).records:
                    if msg.offset >= self.snapshot_offset:
                        entries.append(entry_from_pb(msg))
        expected = self.snapshot_offset
        for entry in entries:
            if entry.offset != expected:
                raise JournalError(
                    f"metadata log gap: expected offset {expected}, found {entry.offset}"
                )
            expected += 1
        if segments:
            self._open_segment(segments[-1])
        else:
            self._open_segment(self.path / f"metadata-{expected:020d}.log", create=True)
        return LoadedLog(snapshot_records, self.snapshot_offset, tuple(entries), truncated)

    def _open_segment(self, path: pathlib.Path, create: bool = False) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._segment = path
        if create:
            _fsync_dir(self.path)

    # -- appends ------------------------------------------------------------------------------

    def append(self, entries: Sequence[LogEntry]) -> None:
        """Write one command's entries as one frame and fsync it."""
        self.append_frames([entries])

    def append_frames(self, frames: Sequence[Sequence[LogEntry]]) -> None:
        """Write several commands' entries, one frame each, with one write and one fsync
        (group commit). Returns only once everything is on disk."""
        if self._fd is None:
            raise JournalError("journal is not open")
        data = b"".join(
            _frame(batch_to_pb(entries, entries[-1].offset + 1).SerializeToString())
            for entries in frames
            if entries
        )
        view = memoryview(data)
        written = 0
        while written < len(data):
            written += os.write(self._fd, view[written:])
        os.fsync(self._fd)

    # -- snapshots ----------------------------------------------------------------------------

    def write_snapshot(self, records: Iterable[MetadataRecord], snapshot_offset: int) -> None:
        """Persist the image as of `snapshot_offset`, start a new segment there and drop the
        segments and snapshots it replaces."""
        payload = snapshot_to_pb(records, snapshot_offset).SerializeToString()
        path = self.path / f"snapshot-{snapshot_offset:020d}.snap"
        write_atomically(path, _frame(payload))
        self.snapshot_offset = snapshot_offset
        new_segment = self.path / f"metadata-{snapshot_offset:020d}.log"
        if new_segment != self._segment:
            self._open_segment(new_segment, create=True)
        for old in self._segments():
            if old != new_segment and old.name < new_segment.name:
                old.unlink()
        for old in self._snapshots():
            if old != path:
                old.unlink()
        _fsync_dir(self.path)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
