"""One log segment: `<baseOffset:020d>.log` with its `.index` and `.timeindex`.

Does file I/O: appends with one `os.write`, reads with `os.pread`, `ftruncate`, `fsync`. The
`.log` holds whole v2 record batches back to back, nothing else (docs/protocol.md §23). Offsets
inside a segment increase: in a log without gaps the first batch starts at `base_offset` and each
batch right after the previous one; in a log that may have gaps (a compacted log, whose dir holds
the `.may-have-gaps` marker: `allow_gaps` below) a batch may start above that, and a segment may
be empty. Either way `base_offset` <= every offset here < the next segment's base offset.
Reads (segment_reads.py) never decode a record; which batches are sound is
segment_scan.py's rule, shared by `recover` and the load's `find_damage`.

Failures: `append` and `truncate_to` either complete or raise with the segment as it was (the
`.log` cut back to its old size, the indexes to their old entries). `mark` / `rollback` let the
log undo several appends and a roll the same way. When even the cut of the `.log` fails, the
segment remembers that its file may be longer than `size` and cuts it before the next append,
flush or close (reads never look past `size`).

Open files: only the active segment keeps its `.log` open (its indexes live in memory and their
files are opened per write); an inactive one's descriptor is opened when needed and kept in the
process-wide LRU of segment_files.py.

Concurrency contract: not thread-safe; one owner (the PartitionLog) calls it from one thread, and
every segment of the process runs on that thread (the descriptor cache is shared).
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
from collections.abc import Sequence

from minibroker.broker.storage.index import OffsetIndex, TimeIndex
from minibroker.broker.storage.segment_files import (
    INACTIVE_SEGMENT_FILES,
)
from minibroker.broker.storage.segment_reads import SegmentReads
from minibroker.broker.storage.segment_scan import BatchCheck, SegmentScan
from minibroker.client.batch import (
    CorruptRecordError,
    scan_valid_prefix,
)
from minibroker.client.common.log import get_logger
from minibroker.client.errors import KafkaStorageError
from minibroker.client.log_format import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SEGMENT_SUFFIXES,
    TIME_INDEX_SUFFIX,
    segment_file_name,
)

_log = get_logger("minibroker.broker.storage")

# One batch as `append` needs it: (position in the appended bytes, size, last offset, max ts).
AppendEntry = tuple[int, int, int, int]
# What `rollback` restores: (size, next offset, max timestamp, its offset, bytes since the last
# index entry, rolling-based timestamp, offset index entries, time index entries). A plain
# tuple: one is taken per append.
SegmentMark = tuple[int, int, int, int, int, "int | None", int, int]


def segment_path(directory: pathlib.Path, base_offset: int, suffix: str) -> pathlib.Path:
    return directory / segment_file_name(base_offset, suffix)


class LogSegment(SegmentReads):
    """A `.log` file of contiguous batches plus its two sparse indexes (Kafka's LogSegment)."""

    def __init__(
        self,
        directory: pathlib.Path,
        base_offset: int,
        fd: int,
        size: int,
        index: OffsetIndex,
        time_index: TimeIndex,
        index_interval_bytes: int,
        created_ms: int,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index = index
        self.time_index = time_index
        self.index_interval_bytes = index_interval_bytes
        self.created_ms = created_ms
        # True after `open` when the indexes or the tail failed their checks: the owner must
        # call `recover` before using the segment.
        self.needs_recovery = False
        self._fd = fd  # -1 while closed (inactive and not cached, or released)
        # The active segment keeps its descriptor; an inactive one shares the cache.
        self._active = True
        self._released = False
        self._size = size
        self._next_offset = base_offset
        self._max_timestamp = -1
        self._offset_of_max_timestamp = base_offset
        self._bytes_since_last_index_entry = 0
        self._rolling_based_timestamp: int | None = None
        # The `.log` may be longer than `_size` (a failed write could not be cut back).
        self._tail_dirty = False

    # -- creation ---------------------------------------------------------------------------

    @classmethod
    def create(
        cls, directory: pathlib.Path, base_offset: int, index_interval_bytes: int, now_ms: int
    ) -> LogSegment:
        """A new empty segment (replacing any stale files with the same base offset).

        On failure no file descriptor is left open and no file of this base offset is left.
        """
        fd = os.open(
            segment_path(directory, base_offset, LOG_SUFFIX),
            os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC,
            0o644,
        )
        try:
            index = OffsetIndex.create(
                segment_path(directory, base_offset, INDEX_SUFFIX), base_offset
            )
            time_index = TimeIndex.create(
                segment_path(directory, base_offset, TIME_INDEX_SUFFIX), base_offset
            )
        except BaseException:
            os.close(fd)
            for suffix in SEGMENT_SUFFIXES:
                _unlink_quietly(segment_path(directory, base_offset, suffix))
            raise
        return cls(directory, base_offset, fd, 0, index, time_index, index_interval_bytes, now_ms)

    @classmethod
    def open(
        cls,
        directory: pathlib.Path,
        base_offset: int,
        index_interval_bytes: int,
        now_ms: int,
        *,
        allow_gaps: bool = False,
    ) -> LogSegment:
        """An existing segment. Sets `needs_recovery` when its indexes or tail look wrong
        (`allow_gaps`: a batch starting above the previous one's next offset is fine)."""
        fd = os.open(segment_path(directory, base_offset, LOG_SUFFIX), os.O_RDWR | os.O_APPEND)
        try:
            size = os.fstat(fd).st_size
            index_path = segment_path(directory, base_offset, INDEX_SUFFIX)
            time_path = segment_path(directory, base_offset, TIME_INDEX_SUFFIX)
            index = OffsetIndex.load(index_path, base_offset, size)
        except BaseException:
            os.close(fd)
            raise
        segment = cls(
            directory,
            base_offset,
            fd,
            size,
            index or OffsetIndex(index_path, base_offset),
            TimeIndex(time_path, base_offset),
            index_interval_bytes,
            now_ms,
        )
        try:
            if index is None or not segment._load_tail(allow_gaps):
                segment.needs_recovery = True
        except BaseException:
            segment.release()
            raise
        # Inactive until the log makes it its active segment: the descriptor goes to the cache.
        segment.set_active(False)
        return segment

    def _load_tail(self, allow_gaps: bool = False) -> bool:
        """Validate the batches after the last index entry; set the end offset and timestamps."""
        last_indexed_offset, start = self.index.last_entry
        tail = self._pread(start, self._size - start)
        valid, found, error = scan_valid_prefix(tail)
        if error is not None or valid != len(tail):
            return False
        expected = self.base_offset if len(self.index) == 0 else None
        max_timestamp, offset_of_max = -1, self.base_offset
        for i, (_pos, header) in enumerate(found):
            if expected is None:
                # The indexed batch must be the one the index says it is.
                if i != 0 or header.last_offset != last_indexed_offset:
                    return False
            elif header.base_offset != expected and (
                header.base_offset < expected or not allow_gaps
            ):
                return False
            expected = header.next_offset
            if header.max_timestamp > max_timestamp:
                max_timestamp, offset_of_max = header.max_timestamp, header.last_offset
        self._next_offset = expected if expected is not None else self.base_offset
        if self._next_offset - 1 - self.base_offset > 2**31 - 1:
            return False
        time_index = TimeIndex.load(self.time_index.path, self.base_offset, self._next_offset)
        if time_index is None:
            return False
        self.time_index = time_index
        indexed_timestamp, indexed_offset = time_index.last_entry
        if indexed_timestamp >= max_timestamp:
            max_timestamp, offset_of_max = indexed_timestamp, indexed_offset
        self._max_timestamp, self._offset_of_max_timestamp = max_timestamp, offset_of_max
        self._bytes_since_last_index_entry = self._size - start
        if self._size:
            try:
                first = self._walk_one(0)
            except CorruptRecordError:
                return False
            # At most the time of opening: a first batch stamped ahead must not hold it open.
            self._rolling_based_timestamp = (
                min(first.max_timestamp, self.created_ms) if first else None
            )
        return True

    # -- facts --------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        return self._size

    @property
    def next_offset(self) -> int:
        """The offset the next batch appended here would get (base offset when empty)."""
        return self._next_offset

    @property
    def max_timestamp_so_far(self) -> int:
        """The largest batch maxTimestamp here, -1 when none."""
        return self._max_timestamp

    def largest_timestamp(self) -> int:
        """Retention's clock: the largest timestamp, or the file's mtime when there is none."""
        if self._max_timestamp >= 0:
            return self._max_timestamp
        try:
            return int(os.stat(self._log_path()).st_mtime * 1000)
        except OSError:
            # Retention is no place to report a disk error (the next write will): keep it.
            return self.created_ms

    def time_waited_for_roll(self, now_ms: int, clock: int) -> int:
        """Kafka's rule on `roll_clock` times: the new batches' clock - the segment's clock
        start (its first append's), or wall time since creation when it has none."""
        if self._rolling_based_timestamp is not None and self._rolling_based_timestamp >= 0:
            return clock - self._rolling_based_timestamp
        return now_ms - self.created_ms

    def can_hold_offset(self, offset: int) -> bool:
        return self.index.can_append_offset(offset)

    # -- append -------------------------------------------------------------------------------

    def append(
        self,
        data: bytes | bytearray | memoryview,
        batches: Sequence[AppendEntry],
        roll_timestamp: int | None = None,
    ) -> None:
        """Append whole batches (already validated and stamped) that start at `next_offset`.

        `roll_timestamp` starts the segment's segment.ms clock when this is its first append
        (default: the first batch's maxTimestamp, Kafka's rule). All or nothing: on failure (of
        the `.log` write or of an index group write) the segment is rolled back to its state
        before the call and KafkaStorageError is raised.
        """
        if not batches:
            return
        if self._tail_dirty:
            self._repair_tail()
        mark = self.mark()
        position0 = self._size
        try:
            fd = self._file()
            written = os.write(fd, data)
            if written < len(data):
                view = memoryview(data)[written:]
                while view:
                    view = view[os.write(fd, view) :]
            if position0 == 0 and self._rolling_based_timestamp is None:
                self._rolling_based_timestamp = (
                    batches[0][3] if roll_timestamp is None else roll_timestamp
                )
            for relative, size, last_offset, max_timestamp in batches:
                self._index_batch(position0 + relative, size, last_offset, max_timestamp)
        except BaseException as err:
            # Leave no partial batch behind: the log must stay a sequence of whole batches.
            self.rollback(mark)
            if isinstance(err, OSError):
                raise KafkaStorageError(
                    f"append to {self._log_path()} failed and was undone: {err}"
                ) from err
            raise
        self._size = position0 + len(data)
        self._next_offset = batches[-1][2] + 1

    def mark(self) -> SegmentMark:
        """The state `rollback` returns to."""
        return (
            self._size,
            self._next_offset,
            self._max_timestamp,
            self._offset_of_max_timestamp,
            self._bytes_since_last_index_entry,
            self._rolling_based_timestamp,
            len(self.index),
            len(self.time_index),
        )

    def rollback(self, mark: SegmentMark) -> None:
        """Undo every append (and index entry) since `mark` was taken. Never raises.

        The `.log` is cut back to the marked size; if that cut fails the segment stays usable
        (reads stop at `size`) and the cut is retried before the next write.
        """
        (
            size,
            self._next_offset,
            self._max_timestamp,
            self._offset_of_max_timestamp,
            self._bytes_since_last_index_entry,
            self._rolling_based_timestamp,
            index_entries,
            time_index_entries,
        ) = mark
        self._size = size
        self.index.rollback_to(index_entries)
        self.time_index.rollback_to(time_index_entries)
        try:
            os.ftruncate(self._file(), size)
            self._tail_dirty = False
        except OSError as err:
            self._tail_dirty = True
            _log.error("segment_rollback_cut_failed", path=str(self._log_path()), error=str(err))

    def _repair_tail(self) -> None:
        """Cut what a failed write left past `size`; KafkaStorageError if that fails again."""
        try:
            os.ftruncate(self._file(), self._size)
        except OSError as err:
            raise KafkaStorageError(
                f"{self._log_path()} still holds the bytes of a failed write: {err}"
            ) from err
        self._tail_dirty = False

    def _log_path(self) -> pathlib.Path:
        return segment_path(self.directory, self.base_offset, LOG_SUFFIX)

    def _index_batch(self, position: int, size: int, last_offset: int, max_timestamp: int) -> None:
        if max_timestamp > self._max_timestamp:
            self._max_timestamp = max_timestamp
            self._offset_of_max_timestamp = last_offset
        if self._bytes_since_last_index_entry > self.index_interval_bytes:
            self.index.append(last_offset, position)
            self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += size

    # -- reads --------------------------------------------------------------------------------

    def _pread(self, position: int, length: int) -> bytes:
        if length <= 0:
            return b""
        fd = self._fd
        if fd < 0:
            fd = self._reopen()
        data = os.pread(fd, length, position)
        if len(data) == length:
            return data
        parts = [data]
        got = len(data)
        while got < length:
            more = os.pread(fd, length - got, position + got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    # -- recovery and truncation -------------------------------------------------------------

    def recover(self, check: BatchCheck | None = None, *, allow_gaps: bool = False) -> int:
        """Rebuild the indexes from the `.log` and cut it at the first bad batch (SegmentScan's
        rules, gaps allowed or not, then `check`). Returns the number of bytes truncated."""
        self.index.reset()
        self.time_index.reset()
        self._max_timestamp, self._offset_of_max_timestamp = -1, self.base_offset
        self._bytes_since_last_index_entry = 0
        self._rolling_based_timestamp = None
        scan = SegmentScan(self._pread, self._size, self.base_offset, check, allow_gaps=allow_gaps)
        for position, header in scan:
            if self._rolling_based_timestamp is None:
                self._rolling_based_timestamp = min(header.max_timestamp, self.created_ms)
            self._index_batch(position, header.size, header.last_offset, header.max_timestamp)
        truncated = self._size - scan.end
        if truncated:
            _log.warning(
                "segment_truncated_on_recovery",
                path=str(self._log_path()),
                position=scan.end,
                truncated_bytes=truncated,
                reason=scan.problem or "torn batch",
            )
            os.ftruncate(self._file(), scan.end)
            self._size = scan.end
        self._next_offset = scan.next_offset
        self.index.write_pending()
        if self._max_timestamp >= 0:
            # Kafka's rule: an entry only for a timestamp above -1. An empty segment's entry
            # (-1, base offset) would fail the next load's check (offset < next offset), so
            # every load would recover it again (a cleaned log has empty segments).
            self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
        self.time_index.write_pending()
        self.needs_recovery = False
        return truncated

    def find_damage(
        self, check: BatchCheck | None = None, *, allow_gaps: bool = False
    ) -> str | None:
        """The first problem `recover` would cut the segment at, or None. Read-only: the load's
        check of a segment that needs no recovery (it rebuilds nothing)."""
        scan = SegmentScan(self._pread, self._size, self.base_offset, check, allow_gaps=allow_gaps)
        for _ in scan:
            pass
        if scan.problem is not None:
            return scan.problem
        if scan.next_offset != self._next_offset:
            return f"batches end at offset {scan.next_offset}, the segment at {self._next_offset}"
        return None

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= `offset`; returns the bytes removed.

        Batch-granular: a batch that holds `offset` goes whole, so `next_offset` afterwards is
        that batch's base offset (<= `offset`). An `offset` in a gap (a compacted log) keeps the
        batches below it and `next_offset` becomes `offset` (Kafka's LocalLog.truncateTo sets
        the LEO to the target), also when it lies past the last batch here. All or nothing:
        everything that can fail (the reads, the cut of the `.log`) happens before anything
        changes; the index files are cut after, and that never raises.
        """
        batch = self.translate_offset(offset)
        if batch is None:
            if offset > self._next_offset:
                self._next_offset = offset
            return 0
        # The batches between the last index entry that stays and the cut, read first.
        _, start = self.index.lookup(batch.base_offset - 1)
        kept_tail = list(self.walk(start, batch.position))
        os.ftruncate(self._file(), batch.position)
        self._tail_dirty = False
        removed = self._size - batch.position
        self._size = batch.position
        self._next_offset = min(batch.base_offset, offset)
        self.index.truncate_to(batch.base_offset)
        self.time_index.truncate_to(batch.base_offset)
        self._bytes_since_last_index_entry = self._size - start
        timestamp, at = self.time_index.last_entry
        self._max_timestamp, self._offset_of_max_timestamp = timestamp, at
        for later in kept_tail:
            if later.max_timestamp > self._max_timestamp:
                self._max_timestamp = later.max_timestamp
                self._offset_of_max_timestamp = later.last_offset
        if self._size == 0:
            self._rolling_based_timestamp = None
        return removed

    # -- lifecycle ----------------------------------------------------------------------------

    def on_become_inactive(self) -> None:
        """Record the segment's largest timestamp for retention and write pending entries."""
        if self._max_timestamp >= 0:
            self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
        self.index.write_pending()
        self.time_index.write_pending()

    def flush(self) -> None:
        """fsync the `.log` and both indexes."""
        if self._tail_dirty:
            self._repair_tail()
        os.fsync(self._file())
        self.index.flush()
        self.time_index.flush()

    def set_active(self, active: bool) -> None:
        """The log's active segment keeps its `.log` open; an inactive one hands its
        descriptor to the cache, which may close it (it is opened again when needed)."""
        if active == self._active:
            return
        self._active = active
        if self._fd >= 0:
            if active:
                INACTIVE_SEGMENT_FILES.forget(self)
            else:
                INACTIVE_SEGMENT_FILES.add(self)

    def _file(self) -> int:
        """The `.log` descriptor, opened again if the cache closed it. Never keep the number
        across a call into another segment: the cache may close it meanwhile."""
        fd = self._fd
        return fd if fd >= 0 else self._reopen()

    def _reopen(self) -> int:
        if self._released:
            raise OSError(errno.EBADF, f"{self._log_path()} is closed")
        fd = os.open(self._log_path(), os.O_RDWR | os.O_APPEND)
        self._fd = fd
        if not self._active:
            INACTIVE_SEGMENT_FILES.add(self)
        return fd

    def _close_file(self) -> None:
        """Close the descriptor; the next use opens the file again (the cache's eviction)."""
        if self._fd >= 0:
            if not self._active:
                INACTIVE_SEGMENT_FILES.forget(self)
            # Forget the number first: close releases it even when it reports an error.
            fd, self._fd = self._fd, -1
            try:
                os.close(fd)
            except OSError as err:
                _log.warning("segment_close_failed", path=str(self._log_path()), error=str(err))

    def close(self) -> None:
        """Write pending index entries and close; the descriptor is closed even on failure."""
        if self._released:
            return
        try:
            if self._tail_dirty:
                self._repair_tail()
            self.on_become_inactive()
        finally:
            self.release()

    def release(self) -> None:
        """Close the file descriptor for good without writing anything (a load that failed)."""
        self._released = True
        if self._fd >= 0:
            if not self._active:
                INACTIVE_SEGMENT_FILES.forget(self)
            # Forget the number first: close releases it even when it reports an error.
            fd, self._fd = self._fd, -1
            os.close(fd)

    def delete(self) -> None:
        """Remove the three files and close.

        The `.log` goes first: if removing it fails, the segment is unchanged (still open) and
        the OSError propagates. Once it is gone the segment is gone (opening the dir removes
        index files without a `.log`), so failures to remove the indexes are only logged.
        """
        try:
            os.unlink(self._log_path())
        except FileNotFoundError:
            pass
        # close() releases the descriptor whatever it reports.
        with contextlib.suppress(OSError):
            self.release()
        for index in (self.index, self.time_index):
            try:
                index.delete()
            except OSError as err:
                _log.warning("index_delete_failed", path=str(index.path), error=str(err))

    def discard(self) -> None:
        """`delete` for undoing a roll: never raises; a `.log` that stays is at least empty."""
        try:
            os.ftruncate(self._file(), 0)
        except OSError:
            pass
        try:
            self.delete()
        except OSError as err:
            self.release()
            _log.error("segment_discard_failed", path=str(self._log_path()), error=str(err))

    def __repr__(self) -> str:
        return (
            f"LogSegment(base_offset={self.base_offset}, size={self._size}, "
            f"next_offset={self._next_offset})"
        )


def _unlink_quietly(path: pathlib.Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
