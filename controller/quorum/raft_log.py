"""The controller quorum's durable Raft log over the journal's data dir (controller/journal.py).

Does blocking disk I/O; one caller at a time (the app runs mutating methods in a worker thread
and reads between them on the event loop). Every batch since the latest snapshot is kept in
memory, with an epoch cache (epoch, start offset) for `end_offset_for_epoch`.

On disk (same files as `MetadataJournal`, so a log written before the quorum loads unchanged):

    snapshot-<offset:020d>.snap   one frame: MetadataBatch(is_snapshot, snapshot_offset,
                                  records, leader_epoch = epoch of the record at offset - 1)
    metadata-<base:020d>.log      frames `length|crc32c|payload`, payload = MetadataBatch of ONE
                                  raft batch (one epoch, consecutive offsets); no record of a
                                  segment is below its base

Rules the loader applies (and the writers rely on for crash atomicity):
- the latest snapshot wins; records below its offset are ignored (and segments wholly below it
  deleted: a crash between writing a snapshot and cleaning up leaves them);
- segments are read in base order and a segment based at B SUPERSEDES every record at or above B
  read from earlier segments: `truncate_to` inside a frame writes the frame's kept prefix as a
  new segment at the frame's base (temp file, fsync, rename, dir fsync), which drops the rest of
  the old segment in one atomic step; the old segment is cut back afterwards, as cleanup;
- a torn or corrupt tail of the LAST segment is cut (it was never acknowledged: appends return
  only after the fsync); corruption anywhere else is a JournalError.
"""

from __future__ import annotations

import bisect
import os
import pathlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from minibroker.controller.journal import (
    JournalError,
    _frame,
    _fsync_dir,
    _read_frame_spans,
    write_atomically,
)
from minibroker.controller.quorum.messages import OffsetAndEpoch
from minibroker.metadata.records import LogEntry, MetadataRecord
from minibroker.metadata.wire import batch_to_pb, entry_from_pb, record_from_pb, snapshot_to_pb
from minibroker.proto import minibroker_pb2 as pb

_SEGMENT = re.compile(r"metadata-(\d{20})\.log")
_SNAPSHOT = re.compile(r"snapshot-(\d{20})\.snap")
DEFAULT_MAX_READ_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class RaftBatch:
    """One raft batch: the records of one command (or one LeaderChangeRecord), one epoch,
    consecutive offsets from `base_offset`. One journal frame on disk."""

    epoch: int
    entries: tuple[LogEntry, ...]

    def __post_init__(self) -> None:
        if not self.entries:
            raise ValueError("a raft batch holds at least one record")
        if self.epoch < 0:
            raise ValueError(f"negative epoch {self.epoch}")
        base = self.entries[0].offset
        if base < 0:
            raise ValueError(f"negative offset {base}")
        for i, entry in enumerate(self.entries):
            if entry.offset != base + i:
                raise ValueError(
                    f"batch offsets are not consecutive: {entry.offset} at position {i} "
                    f"of a batch based at {base}"
                )

    @property
    def base_offset(self) -> int:
        return self.entries[0].offset

    @property
    def end_offset(self) -> int:
        """One past the last record's offset."""
        return self.entries[-1].offset + 1

    def sliced(self, start: int, end: int) -> RaftBatch:
        """The records at offsets in [start, end) (must be non-empty)."""
        base = self.base_offset
        return RaftBatch(self.epoch, self.entries[max(0, start - base) : max(0, end - base)])


@dataclass(frozen=True, slots=True)
class LoadedRaftLog:
    snapshot_records: tuple[MetadataRecord, ...] | None  # None: no snapshot
    snapshot_id: OffsetAndEpoch  # (end offset, epoch) of the snapshot; (0, 0) with none
    batches: tuple[RaftBatch, ...]  # every batch from the snapshot offset on, in order
    truncated_bytes: int  # torn tail cut at load


@dataclass(frozen=True, slots=True)
class _Loc:
    """Where a batch's frame is (the frame may hold records outside the in-memory batch)."""

    segment: pathlib.Path
    pos: int
    end: int


def _segment_path(root: pathlib.Path, base: int) -> pathlib.Path:
    return root / f"metadata-{base:020d}.log"


def _snapshot_path(root: pathlib.Path, offset: int) -> pathlib.Path:
    return root / f"snapshot-{offset:020d}.snap"


def _encode(batch: RaftBatch) -> bytes:
    msg = batch_to_pb(batch.entries, batch.end_offset)
    msg.leader_epoch = batch.epoch
    return _frame(msg.SerializeToString())


def _read_snapshot(path: pathlib.Path) -> tuple[tuple[MetadataRecord, ...], OffsetAndEpoch]:
    m = _SNAPSHOT.fullmatch(path.name)
    if m is None:  # pragma: no cover - callers only pass matching names
        raise JournalError(f"{path} is not a snapshot file name")
    data = path.read_bytes()
    spans, valid = _read_frame_spans(data)
    if len(spans) != 1 or valid != len(data):
        raise JournalError(f"snapshot {path} is corrupt")
    try:
        msg = pb.MetadataBatch.FromString(data[spans[0][0] + 8 : spans[0][1]])
        records = tuple(record_from_pb(r) for r in msg.records)
    except (DecodeError, ValueError) as err:
        raise JournalError(f"snapshot {path} is corrupt ({err})") from None
    if not msg.is_snapshot or msg.snapshot_offset != int(m.group(1)):
        raise JournalError(
            f"snapshot {path} is corrupt (holds offset {msg.snapshot_offset}, "
            f"snapshot flag {msg.is_snapshot})"
        )
    return records, OffsetAndEpoch(msg.snapshot_offset, msg.leader_epoch)


class RaftLog:
    """The durable Raft log (implements `RaftLogView`). Call `load()` before anything else."""

    def __init__(self, path: str | pathlib.Path) -> None:
        self.path = pathlib.Path(path)
        self._batches: list[RaftBatch] = []
        self._bases: list[int] = []  # base offset of each batch (bisect)
        self._locs: list[_Loc] = []
        self._epochs: list[tuple[int, int]] = []  # (epoch, start offset), epochs increasing
        self._snapshot_id = OffsetAndEpoch(0, 0)
        self._has_snapshot = False
        self._segments: list[tuple[int, pathlib.Path]] = []  # (base, path), by base
        self._fd: int | None = None
        self._active_size = 0
        self._failed: BaseException | None = None

    # -- RaftLogView --------------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        return self._snapshot_id.offset

    @property
    def end_offset(self) -> int:
        return self._batches[-1].end_offset if self._batches else self._snapshot_id.offset

    @property
    def snapshot_id(self) -> OffsetAndEpoch | None:
        return self._snapshot_id if self._has_snapshot else None

    def last_fetched_epoch(self) -> int:
        return self._epochs[-1][0] if self._epochs else self._snapshot_id.epoch

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        if not self._epochs or epoch >= self._epochs[-1][0]:
            return OffsetAndEpoch(self.end_offset, self.last_fetched_epoch())
        i = bisect.bisect_right(self._epochs, epoch, key=lambda e: e[0]) - 1
        if i < 0:  # below the log's first epoch
            if self._has_snapshot:
                return self._snapshot_id
            return OffsetAndEpoch(-1, -1)
        return OffsetAndEpoch(self._epochs[i + 1][1], self._epochs[i][0])

    def epoch_of(self, offset: int) -> int:
        if offset == self.start_offset - 1:
            return self._snapshot_id.epoch  # 0 for offset -1 with no snapshot: (0, 0)
        if not self.start_offset <= offset < self.end_offset:
            return -1
        i = bisect.bisect_right(self._epochs, offset, key=lambda e: e[1]) - 1
        return self._epochs[i][0]

    # -- reads --------------------------------------------------------------------------------

    def read(self, from_offset: int, max_bytes: int = DEFAULT_MAX_READ_BYTES) -> list[RaftBatch]:
        """Batches from `from_offset` on (the one holding it sliced to start there): at least
        one when any exists, then more while fewer than `max_bytes` (frame bytes) are taken."""
        self._check_range(from_offset, "read from")
        out: list[RaftBatch] = []
        taken = 0
        i = self._index_of(from_offset)
        while i < len(self._batches) and (not out or taken < max_bytes):
            batch = self._batches[i]
            if batch.base_offset < from_offset:
                batch = batch.sliced(from_offset, batch.end_offset)
            out.append(batch)
            taken += self._locs[i].end - self._locs[i].pos
            i += 1
        return out

    def entries(self, start: int, end: int) -> list[LogEntry]:
        """The records at offsets in [start, end)."""
        if not self.start_offset <= start <= end <= self.end_offset:
            raise ValueError(
                f"entries [{start}, {end}) outside the log [{self.start_offset}, {self.end_offset})"
            )
        out: list[LogEntry] = []
        i = self._index_of(start)
        while i < len(self._batches) and self._batches[i].base_offset < end:
            batch = self._batches[i]
            out.extend(e for e in batch.entries if start <= e.offset < end)
            i += 1
        return out

    def latest_snapshot(self) -> tuple[list[MetadataRecord], OffsetAndEpoch] | None:
        """The current snapshot's records (read from disk) and id; None with no snapshot."""
        if not self._has_snapshot:
            return None
        records, snapshot_id = _read_snapshot(_snapshot_path(self.path, self.start_offset))
        return list(records), snapshot_id

    def _index_of(self, offset: int) -> int:
        """Index of the batch holding `offset` (len(batches) at the end offset)."""
        if offset >= self.end_offset:
            return len(self._batches)
        return max(0, bisect.bisect_right(self._bases, offset) - 1)

    def _check_range(self, offset: int, what: str) -> None:
        if not self.start_offset <= offset <= self.end_offset:
            raise ValueError(
                f"cannot {what} offset {offset}: the log holds [{self.start_offset}, "
                f"{self.end_offset})"
            )

    # -- load ---------------------------------------------------------------------------------

    def load(self) -> LoadedRaftLog:
        """Read the latest snapshot and every later batch, cut a torn tail of the last segment,
        finish a cleanup a crash interrupted, and open the last segment for appends."""
        self.close()
        self._failed = None
        self.path.mkdir(parents=True, exist_ok=True)
        for tmp in self.path.glob("*.tmp"):
            tmp.unlink()
        snapshots = sorted(p for p in self.path.iterdir() if _SNAPSHOT.fullmatch(p.name))
        snapshot_records: tuple[MetadataRecord, ...] | None = None
        if snapshots:
            snapshot_records, self._snapshot_id = _read_snapshot(snapshots[-1])
            self._has_snapshot = True
        else:
            self._snapshot_id = OffsetAndEpoch(0, 0)
            self._has_snapshot = False
        start = self._snapshot_id.offset
        segments = sorted(
            (int(m.group(1)), p)
            for p in self.path.iterdir()
            if (m := _SEGMENT.fullmatch(p.name)) is not None
        )
        batches: list[RaftBatch] = []
        locs: list[_Loc] = []
        stale: list[pathlib.Path] = [p for p in snapshots[:-1]]
        kept_segments: list[tuple[int, pathlib.Path]] = []
        truncated = 0
        for i, (base, segment) in enumerate(segments):
            last = i == len(segments) - 1
            if not last and segments[i + 1][0] <= start:
                stale.append(segment)  # wholly below the snapshot: a cleanup a crash cut short
                continue
            kept_segments.append((base, segment))
            end = batches[-1].end_offset if batches else start
            if base < end:  # this segment supersedes what earlier ones hold from `base` on
                while batches and batches[-1].base_offset >= base:
                    batches.pop()
                    locs.pop()
                if batches and batches[-1].end_offset > base:
                    batches[-1] = batches[-1].sliced(batches[-1].base_offset, base)
                end = max(base, start)
            elif base > end:
                raise JournalError(
                    f"metadata log gap: {segment} starts at {base} but the log before it ends "
                    f"at {end}"
                )
            data = segment.read_bytes()
            spans, valid = _read_frame_spans(data)
            if valid < len(data):
                if not last:
                    raise JournalError(
                        f"{segment} is corrupt at byte {valid} and is not the last segment"
                    )
                # A torn tail: never acknowledged (an append returns after its fsync only).
                truncated = len(data) - valid
                with open(segment, "r+b") as f:
                    f.truncate(valid)
                    f.flush()
                    os.fsync(f.fileno())
            first = True
            for pos, frame_end in spans:
                batch = self._decode(segment, pos, data[pos + 8 : frame_end])
                if batch is None:
                    continue
                # A segment holds no record below its base (usually its first record is AT the
                # base; a cut back to empty below the snapshot offset can leave a lower base).
                if first and batch.base_offset < base:
                    raise JournalError(
                        f"{segment} is corrupt: its first record is at offset "
                        f"{batch.base_offset}, below its base {base}"
                    )
                first = False
                if batch.end_offset <= start:
                    continue
                if batch.base_offset < start:
                    batch = batch.sliced(start, batch.end_offset)
                if batch.base_offset != end:
                    raise JournalError(
                        f"metadata log gap: expected offset {end}, found {batch.base_offset} "
                        f"in {segment} at byte {pos}"
                    )
                floor = batches[-1].epoch if batches else self._snapshot_id.epoch
                if batch.epoch < floor:
                    raise JournalError(
                        f"{segment} is corrupt: epoch {batch.epoch} at offset "
                        f"{batch.base_offset} follows epoch {floor}"
                    )
                batches.append(batch)
                locs.append(_Loc(segment, pos, frame_end))
                end = batch.end_offset
        for old in stale:
            old.unlink()
        if stale:
            _fsync_dir(self.path)
        self._segments = kept_segments
        self._set_batches(batches, locs)
        if self._segments:
            self._open_active()
        else:
            self._new_segment(self.end_offset)
        return LoadedRaftLog(snapshot_records, self._snapshot_id, tuple(batches), truncated)

    @staticmethod
    def _decode(segment: pathlib.Path, pos: int, payload: bytes) -> RaftBatch | None:
        try:
            msg = pb.MetadataBatch.FromString(payload)
            entries = tuple(entry_from_pb(r) for r in msg.records)
            if msg.is_snapshot:
                raise ValueError("a snapshot batch in a segment")
            return RaftBatch(msg.leader_epoch, entries) if entries else None
        except (DecodeError, ValueError) as err:
            raise JournalError(f"{segment} is corrupt at byte {pos}: {err}") from None

    def _set_batches(self, batches: list[RaftBatch], locs: list[_Loc]) -> None:
        self._batches = batches
        self._locs = locs
        self._bases = [b.base_offset for b in batches]
        self._epochs = []
        for b in batches:
            if not self._epochs or self._epochs[-1][0] != b.epoch:
                self._epochs.append((b.epoch, b.base_offset))

    # -- segments -----------------------------------------------------------------------------

    def _open_active(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        path = self._segments[-1][1]
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._active_size = os.fstat(self._fd).st_size

    def _new_segment(self, base: int) -> None:
        """Start an empty segment at `base` (the log end) and make it the active one."""
        path = _segment_path(self.path, base)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.fsync(fd)
        os.close(fd)
        _fsync_dir(self.path)
        self._segments = [s for s in self._segments if s[0] != base]
        self._segments.append((base, path))
        self._open_active()

    def _mutating(self) -> None:
        if self._failed is not None:
            raise JournalError(f"the metadata log failed earlier: {self._failed!r}")
        if self._fd is None:
            raise JournalError("the metadata log is not open (call load() first)")

    # -- mutations ----------------------------------------------------------------------------

    def append(self, batches: Sequence[RaftBatch]) -> None:
        """Write the batches, one frame each, with one write and one fsync. Refuses (ValueError,
        nothing written) a batch not at the log end or with an epoch below the last one."""
        self._mutating()
        end, epoch = self.end_offset, self.last_fetched_epoch()
        frames: list[bytes] = []
        for batch in batches:
            if batch.base_offset != end:
                raise ValueError(
                    f"batch at offset {batch.base_offset} is not at the log end offset {end}"
                )
            if batch.epoch < epoch:
                raise ValueError(f"batch epoch {batch.epoch} is below the log's epoch {epoch}")
            end, epoch = batch.end_offset, batch.epoch
            frames.append(_encode(batch))
        if not frames:
            return
        assert self._fd is not None
        data = b"".join(frames)
        before = self._active_size
        try:
            view = memoryview(data)
            written = 0
            while written < len(data):
                written += os.write(self._fd, view[written:])
            os.fsync(self._fd)
        except OSError as err:
            self._failed = err  # what reached the disk is unknown: refuse everything after
            raise
        segment = self._segments[-1][1]
        pos = before
        for batch, frame in zip(batches, frames):
            self._batches.append(batch)
            self._bases.append(batch.base_offset)
            self._locs.append(_Loc(segment, pos, pos + len(frame)))
            if not self._epochs or self._epochs[-1][0] != batch.epoch:
                self._epochs.append((batch.epoch, batch.base_offset))
            pos += len(frame)
        self._active_size = pos

    def truncate_to(self, offset: int) -> None:
        """Durably drop every record at or above `offset` (refused below the start offset)."""
        self._mutating()
        if offset < self.start_offset:
            raise ValueError(
                f"cannot truncate to {offset}, below the log start offset {self.start_offset}"
            )
        if offset >= self.end_offset:
            return
        try:
            self._truncate(offset)
        except OSError as err:
            self._failed = err
            raise

    def _truncate(self, offset: int) -> None:
        k = self._index_of(offset)
        batch, loc = self._batches[k], self._locs[k]
        # Drop the later segments, newest first, each durably: a crash leaves a prefix.
        while self._segments[-1][1] != loc.segment:
            _base, path = self._segments.pop()
            path.unlink()
            _fsync_dir(self.path)
        kept_batches, kept_locs = self._batches[:k], self._locs[:k]
        if batch.base_offset < offset:
            kept = batch.sliced(batch.base_offset, offset)
            frame = _encode(kept)
            path = _segment_path(self.path, kept.base_offset)
            write_atomically(path, frame)  # the commit point: supersedes the rest
            if path != loc.segment:
                self._cut(loc.segment, loc.pos)
            else:
                self._segments.pop()
            self._segments.append((kept.base_offset, path))
            kept_batches.append(kept)
            kept_locs.append(_Loc(path, 0, len(frame)))
        else:
            self._cut(loc.segment, loc.pos)
        self._set_batches(kept_batches, kept_locs)
        self._open_active()

    @staticmethod
    def _cut(path: pathlib.Path, size: int) -> None:
        with open(path, "r+b") as f:
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())

    def write_snapshot(
        self, records: Iterable[MetadataRecord], snapshot_id: OffsetAndEpoch
    ) -> None:
        """Persist a committed image whose end offset is `snapshot_id.offset` (<= end offset;
        `snapshot_id.epoch` must be the epoch of the record before it); drop the batches and
        segments wholly below it, keep those after."""
        self._mutating()
        offset = snapshot_id.offset
        if not self.start_offset <= offset <= self.end_offset:
            raise ValueError(
                f"snapshot offset {offset} outside the log [{self.start_offset}, {self.end_offset}]"
            )
        expected = self.epoch_of(offset - 1)
        if snapshot_id.epoch != expected:
            raise ValueError(
                f"snapshot {snapshot_id} has epoch {snapshot_id.epoch}, the record before it "
                f"has epoch {expected}"
            )
        try:
            self._write_snapshot_file(records, snapshot_id)
            keep = self._index_of(offset)
            batches, locs = self._batches[keep:], self._locs[keep:]
            if batches and batches[0].base_offset < offset:
                batches[0] = batches[0].sliced(offset, batches[0].end_offset)
            self._set_batches(batches, locs)
            if self._active_size > 0:
                self._new_segment(self.end_offset)
            self._drop_files_below(offset)
        except OSError as err:
            self._failed = err
            raise

    def install_snapshot(
        self, records: Iterable[MetadataRecord], snapshot_id: OffsetAndEpoch
    ) -> None:
        """Replace the whole log with the leader's snapshot: afterwards start = end = its
        offset. Records at or above that offset are dropped first (they diverge from the
        leader's), those below only once the snapshot is durable."""
        self._mutating()
        offset = snapshot_id.offset
        if offset < self.start_offset:
            raise ValueError(
                f"snapshot offset {offset} is below the log start offset {self.start_offset}"
            )
        try:
            if offset < self.end_offset:
                self._truncate(offset)
            self._write_snapshot_file(records, snapshot_id)
            self._set_batches([], [])
            if self._segments[-1][0] != offset or self._active_size > 0:
                self._new_segment(offset)
            self._drop_files_below(offset)
        except OSError as err:
            self._failed = err
            raise

    def _write_snapshot_file(
        self, records: Iterable[MetadataRecord], snapshot_id: OffsetAndEpoch
    ) -> None:
        msg = snapshot_to_pb(records, snapshot_id.offset)
        msg.leader_epoch = snapshot_id.epoch
        write_atomically(
            _snapshot_path(self.path, snapshot_id.offset), _frame(msg.SerializeToString())
        )
        self._snapshot_id = snapshot_id
        self._has_snapshot = True

    def _drop_files_below(self, offset: int) -> None:
        """Delete the segments wholly below `offset` (never the active one) and the older
        snapshots."""
        dropped = False
        while len(self._segments) > 1 and self._segments[1][0] <= offset:
            self._segments.pop(0)[1].unlink()
            dropped = True
        current = _snapshot_path(self.path, offset)
        for p in self.path.iterdir():
            if _SNAPSHOT.fullmatch(p.name) and p != current:
                p.unlink()
                dropped = True
        if dropped:
            _fsync_dir(self.path)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


__all__ = ["DEFAULT_MAX_READ_BYTES", "LoadedRaftLog", "RaftBatch", "RaftLog"]
