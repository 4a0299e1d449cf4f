"""The controller's durable metadata log: journal segments, snapshots and the data dir identity.

Does disk I/O (blocking; the app calls it from a worker thread, one call at a time). Layout of
the data dir:

    meta.properties                 cluster.id, node.id, version (written once, atomically,
                                    into a dir without a metadata log; never rewritten)
    .lock                           fcntl lock: two processes never share a data dir
    snapshot-<offset:020d>.snap     the whole image as records, as of <offset> (its next offset)
    metadata-<base:020d>.log        journal segment: frames of entries from <base> on

A frame is `length:u32 | crc32c(payload):u32 | payload`, the payload one serialized
`MetadataBatch` holding the records ONE command produced, each with its offset. One frame per
command (not per record) makes a command atomic on disk: a topic is never half created by a
crash. Every append is fsynced before it returns (the caller replies only after). At start a torn
or corrupt tail of the last segment is truncated (it was never acknowledged); corruption earlier
than that is an error. A snapshot is written to a temp file, fsynced, renamed and the directory
fsynced; then a new segment starts at the snapshot offset and older segments and snapshots go.
"""

from __future__ import annotations

import base64
import fcntl
import os
import pathlib
import re
import struct
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import crc32c

from minibroker.metadata.records import LogEntry, MetadataRecord
from minibroker.metadata.wire import (
    batch_to_pb,
    entry_from_pb,
    record_from_pb,
    snapshot_to_pb,
)
from minibroker.proto import minibroker_pb2 as pb

_FRAME = struct.Struct(">II")
# The journal's own files (and their `.tmp` forms): a dir holding one is a metadata log.
_JOURNAL_FILE = re.compile(r"(metadata-\d+\.log|snapshot-\d+\.snap)(\.tmp)?")
# What a cluster id may be: Kafka's are 22 characters of URL-safe base64.
_CLUSTER_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
MAX_FRAME_BYTES = 256 * 1024 * 1024


class JournalError(Exception):
    """The metadata log on disk is unusable (corruption before the tail, wrong identity)."""


@dataclass(frozen=True, slots=True)
class LoadedLog:
    snapshot_records: tuple[MetadataRecord, ...] | None
    snapshot_offset: int  # 0 when there is no snapshot
    entries: tuple[LogEntry, ...]  # every entry at or after snapshot_offset, in order
    truncated_bytes: int  # torn tail dropped at start


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: pathlib.Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _frame(payload: bytes) -> bytes:
    return _FRAME.pack(len(payload), crc32c.crc32c(payload)) + payload


def _read_frame_spans(data: bytes) -> tuple[list[tuple[int, int]], int]:
    """(start, end) byte spans of the frames of the valid frame prefix (a frame's payload is
    data[start + 8 : end]) and the byte length of that prefix."""
    spans: list[tuple[int, int]] = []
    pos = 0
    view = memoryview(data)
    while pos + _FRAME.size <= len(data):
        length, crc = _FRAME.unpack_from(data, pos)
        end = pos + _FRAME.size + length
        if length > MAX_FRAME_BYTES or end > len(data):
            break
        if crc32c.crc32c(view[pos + _FRAME.size : end]) != crc:
            break
        spans.append((pos, end))
        pos = end
    return spans, pos


def _read_frames(data: bytes) -> tuple[list[bytes], int]:
    """Payloads of the valid frame prefix and the byte length of that prefix."""
    spans, valid = _read_frame_spans(data)
    return [data[start + _FRAME.size : end] for start, end in spans], valid


class DataDir:
    """The controller's data dir: its lock and its identity (cluster id)."""

    def __init__(self, path: str | pathlib.Path) -> None:
        self.path = pathlib.Path(path)
        self._lock_fd: int | None = None

    def lock(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalError(f"data dir {self.path} is in use by another process") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def load_or_create_cluster_id(self, node_id: int) -> tuple[str, bool]:
        """(cluster id, created now). The id is made once, on first start, and kept.

        A meta.properties that does not parse, or a metadata log without one, is a JournalError
        that says what to do; the files are left as they are.
        """
        meta = self.path / "meta.properties"
        if os.path.lexists(meta):
            return _read_cluster_id(meta, self.path, node_id), False
        journal = sorted(
            p.name for p in self.path.glob("*") if _JOURNAL_FILE.fullmatch(p.name) is not None
        )
        if journal:
            raise JournalError(
                f"metadata log dir {self.path} has no meta.properties but holds a metadata log "
                f"({', '.join(journal[:3])}{', ...' if len(journal) > 3 else ''}); its cluster "
                "id is unknown, so it is not adopted: remove the directory or restore its "
                f"meta.properties (cluster.id=<its cluster>, node.id={node_id}, version=1)"
            )
        # Kafka's format: a random UUID as 22 characters of URL-safe base64.
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        text = f"#minibroker controller\ncluster.id={cluster_id}\nnode.id={node_id}\nversion=1\n"
        write_atomically(meta, text.encode())
        return cluster_id, True


def _read_cluster_id(meta: pathlib.Path, root: pathlib.Path, node_id: int) -> str:
    def unusable(why: str) -> JournalError:
        return JournalError(
            f"{meta} {why}; restore it (cluster.id=<the cluster's id>, node.id={node_id}, "
            f"version=1) or remove the metadata log dir {root} to start a new, empty cluster"
        )

    try:
        text = meta.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise unusable("is not a properties file (not UTF-8 text)") from None
    except OSError as err:
        raise unusable(f"cannot be read ({err.strerror})") from None
    props = dict(
        line.split("=", 1)
        for line in text.splitlines()
        if "=" in line and not line.lstrip().startswith(("#", "!"))
    )
    cluster_id = props.get("cluster.id", "").strip()
    if not cluster_id:
        raise unusable("has no cluster.id")
    if _CLUSTER_ID.fullmatch(cluster_id) is None:
        raise unusable(
            f"has an invalid cluster.id {cluster_id[:40]!r} (1-64 letters, digits, '-', '_', '.')"
        )
    return cluster_id


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


__all__ = ["DataDir", "JournalError", "LoadedLog", "MetadataJournal", "write_atomically"]
