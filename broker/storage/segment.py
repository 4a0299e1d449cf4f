"""One log segment: `<baseOffset:020d>.log` with its `.index` and `.timeindex`.

Does file I/O: appends with one `os.write`, reads with `os.pread`, `ftruncate`, `fsync`. The
`.log` holds whole v2 record batches back to back, nothing else (docs/protocol.md §23). Offsets
inside a
segment are contiguous: the first batch starts at `base_offset` and each batch starts right after
the previous one, so `base_offset` <= every offset here < the next segment's base offset.

Reads work on batch boundaries found from the sparse offset index and a walk over batch headers
(never over records); the segment never decodes a record. The CRC is checked on the way in (by
the log, before `append`) and by `recover`, not on reads (Kafka serves fetches the same way;
consumers check CRCs).

Failures: `append` and `truncate_to` either complete or raise with the segment as it was (the
`.log` cut back to its old size, the indexes to their old entries). `mark` / `rollback` let the
log undo several appends and a roll the same way. When even the cut of the `.log` fails, the
segment remembers that its file may be longer than `size` and cuts it before the next append,
flush or close (reads never look past `size`).

Open files: only the active segment keeps its `.log` open (its indexes live in memory and their
files are opened per write). An inactive segment's `.log` is opened when it is read (or cut or
fsynced) and its descriptor is kept in `INACTIVE_SEGMENT_FILES`, a process-wide LRU of at most
`INACTIVE_SEGMENT_FILES_MAX` descriptors: so a broker holds one descriptor per partition plus a
fixed number, however many segments it has (Kafka keeps every segment's file open and maps its
indexes lazily).

Concurrency contract: not thread-safe; one owner (the PartitionLog) calls it from one thread, and
every segment of the process runs on that thread (the descriptor cache is shared).
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from minibroker.broker.storage.index import OffsetIndex, TimeIndex
from minibroker.client.batch import (
    BATCH_LENGTH_MIN,
    LOG_OVERHEAD,
    BatchHeader,
    CorruptRecordError,
    scan_valid_prefix,
)
from minibroker.client.common.log import get_logger
from minibroker.client.errors import KafkaStorageError

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"

# The first 43 header bytes: baseOffset, batchLength, partitionLeaderEpoch, magic, crc,
# attributes, lastOffsetDelta, baseTimestamp, maxTimestamp (client/batch.py has the layout).
_WALK_HEADER = struct.Struct(">qiibIhiqq")
_WALK_READ_AHEAD = 8192
_RECOVERY_CHUNK = 8 * 1024 * 1024
# Descriptors of inactive segments' `.log` files kept open per process (README: the file
# budget). A consumer or follower reading old data reads a segment many times in a row; 64
# covers that for dozens of partitions at once, and a miss costs one open().
INACTIVE_SEGMENT_FILES_MAX = 64
_log = get_logger("minibroker.broker.storage")

# One batch as `append` needs it: (position in the appended bytes, size, last offset, max ts).
AppendEntry = tuple[int, int, int, int]
# What `rollback` restores: (size, next offset, max timestamp, its offset, bytes since the last
# index entry, rolling-based timestamp, offset index entries, time index entries). A plain
# tuple: one is taken per append.
SegmentMark = tuple[int, int, int, int, int, "int | None", int, int]
# A recovery check beyond CRC and offsets: returns why the batch is bad, or None.
BatchCheck = Callable[[BatchHeader], "str | None"]


def segment_path(directory: pathlib.Path, base_offset: int, suffix: str) -> pathlib.Path:
    return directory / f"{base_offset:020d}{suffix}"


class InactiveSegmentFiles:
    """The open `.log` descriptors of inactive segments: at most `capacity`, the least recently
    used closed first (the segment opens its file again when it next needs it).

    The active segment's descriptor is never here: it stays open. Single-threaded.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._lru: OrderedDict[LogSegment, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def capacity(self) -> int:
        return self._capacity

    @capacity.setter
    def capacity(self, capacity: int) -> None:
        """At least 1 (the file being used stays open); a smaller one closes files at once."""
        self._capacity = max(capacity, 1)
        self._trim()

    def touch(self, segment: LogSegment) -> None:
        self._lru.move_to_end(segment)

    def add(self, segment: LogSegment) -> None:
        """`segment` holds an open descriptor now; close others' past the capacity (never the
        one just added: its caller is about to use it)."""
        self._lru[segment] = None
        self._lru.move_to_end(segment)
        self._trim()

    def _trim(self) -> None:
        while len(self._lru) > self._capacity:
            oldest = next(iter(self._lru))
            del self._lru[oldest]
            oldest._close_file()

    def forget(self, segment: LogSegment) -> None:
        self._lru.pop(segment, None)


INACTIVE_SEGMENT_FILES = InactiveSegmentFiles(INACTIVE_SEGMENT_FILES_MAX)


def roll_clock(timestamp: int, now_ms: int, retention_ms: int) -> int:
    """When a batch counts as written for segment.ms: its timestamp, taken into
    [now - retention.ms, now] (no lower bound when retention.ms is -1); now when it has none.

    Kafka measures a segment's age from its first batch's timestamp to the new batch's, so a
    producer stamping each batch segment.ms after the last rolled a segment per batch, and one
    stamped far ahead held its segment open for good. Bounded this way, each time roll moves
    the segment's clock start forward by more than segment.ms inside [log's first clock -
    retention.ms, now]: at most (retention.ms + elapsed broker time) / segment.ms time rolls
    after each segment that was started otherwise (by size, truncation, an explicit roll).
    A batch older than retention.ms is due for deletion anyway, so telling such batches apart
    by segment gains nothing.
    """
    if timestamp < 0 or timestamp > now_ms:
        return now_ms
    if retention_ms >= 0 and timestamp < now_ms - retention_ms:
        return now_ms - retention_ms
    return timestamp


@dataclass(frozen=True, slots=True)
class BatchPosition:
    """Where one batch sits in the `.log`, from its header only."""

    position: int
    size: int
    base_offset: int
    last_offset: int
    partition_leader_epoch: int
    max_timestamp: int


class LogSegment:
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
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                _unlink_quietly(segment_path(directory, base_offset, suffix))
            raise
        return cls(directory, base_offset, fd, 0, index, time_index, index_interval_bytes, now_ms)

    @classmethod
    def open(
        cls, directory: pathlib.Path, base_offset: int, index_interval_bytes: int, now_ms: int
    ) -> LogSegment:
        """An existing segment. Sets `needs_recovery` when its indexes or tail look wrong."""
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
            if index is None or not segment._load_tail():
                segment.needs_recovery = True
        except BaseException:
            segment.release()
            raise
        # Inactive until the log makes it its active segment: the descriptor goes to the cache.
        segment.set_active(False)
        return segment

    def _load_tail(self) -> bool:
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
            elif header.base_offset != expected:
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

    def _walk_one(self, position: int) -> BatchPosition | None:
        for batch in self.walk(position, self._size):
            return batch
        return None

    def walk(self, start: int, end: int) -> Iterator[BatchPosition]:
        """The batches from `start` (a batch boundary) to `end`, from their headers only."""
        chunk = b""
        chunk_start = start
        position = start
        while position < end:
            relative = position - chunk_start
            if relative + _WALK_HEADER.size > len(chunk):
                chunk = self._pread(position, min(_WALK_READ_AHEAD, self._size - position))
                chunk_start, relative = position, 0
                if len(chunk) < _WALK_HEADER.size:
                    raise CorruptRecordError("truncated batch header in segment", position)
            base, length, epoch, _magic, _crc, _attrs, delta, _base_ts, max_ts = (
                _WALK_HEADER.unpack_from(chunk, relative)
            )
            size = length + LOG_OVERHEAD
            if length < BATCH_LENGTH_MIN or position + size > self._size:
                raise CorruptRecordError(f"bad batchLength {length} in segment", position)
            yield BatchPosition(position, size, base, base + delta, epoch, max_ts)
            position += size

    def translate_offset(self, offset: int, start_position: int = 0) -> BatchPosition | None:
        """The first batch whose last offset is >= `offset`, or None past the end."""
        if offset >= self._next_offset:
            return None
        _, position = self.index.lookup(offset)
        for batch in self.walk(max(position, start_position), self._size):
            if batch.last_offset >= offset:
                return batch
        return None

    def position_of(self, offset: int) -> int:
        """The position of the batch holding `offset`: reads below it end before `offset`."""
        batch = self.translate_offset(offset)
        return self._size if batch is None else batch.position

    def _boundary_at_or_below(self, start: int, limit: int) -> tuple[int, int]:
        """The largest batch boundary in [start, limit] and the offset of the batch there."""
        if limit >= self._size:
            return self._size, self._next_offset
        position = max(start, self.index.floor_position(limit))
        for batch in self.walk(position, self._size):
            if batch.position + batch.size > limit:
                return batch.position, batch.base_offset
        return self._size, self._next_offset

    def read(
        self, start_offset: int, max_bytes: int, max_position: int, min_one_batch: bool = True
    ) -> tuple[bytes, BatchPosition, int] | None:
        """Whole batches from the one holding `start_offset`, ending at or before `max_position`.

        Returns (bytes, the first batch, the offset after the last batch returned). At most
        `max_bytes`, except that with `min_one_batch` the first batch comes whole even when
        larger (KIP-74). None when `start_offset` is past this segment's end; empty bytes when
        the first batch is not below `max_position`.
        """
        if self._fd >= 0 and not self._active:
            # Reads are what keep an inactive segment's file worth caching.
            INACTIVE_SEGMENT_FILES.touch(self)
        first = self.translate_offset(start_offset)
        if first is None:
            return None
        if first.position >= max_position:
            return b"", first, first.base_offset
        limit = min(max_position, first.position + max(max_bytes, 0))
        if min_one_batch and first.position + first.size > limit:
            limit = first.position + first.size
        end, next_offset = self._boundary_at_or_below(first.position, limit)
        if end <= first.position:
            return b"", first, first.base_offset
        return self._pread(first.position, end - first.position), first, next_offset

    def find_offset_by_timestamp(
        self, timestamp: int, starting_offset: int
    ) -> tuple[int, int] | None:
        """(offset, maxTimestamp) of the first batch with maxTimestamp >= `timestamp`.

        Batch granularity, as the broker never decodes records: the offset is the batch's first
        offset (at least `starting_offset`); the records before the first matching one in that
        batch are for the consumer to skip.
        """
        _, indexed_offset = self.time_index.lookup(timestamp)
        _, position = self.index.lookup(max(indexed_offset, starting_offset))
        for batch in self.walk(position, self._size):
            if batch.max_timestamp >= timestamp and batch.last_offset >= starting_offset:
                return max(batch.base_offset, starting_offset), batch.max_timestamp
        return None

    # -- recovery and truncation -------------------------------------------------------------

    def recover(self, check: BatchCheck | None = None) -> int:
        """Rebuild the indexes from the `.log` and cut it at the first bad batch.

        A batch is bad when it is torn, fails its length, magic or CRC check, does not start
        right after the previous one (baseOffset is outside the CRC), overflows the index, or
        fails `check`. Returns the number of bytes truncated.
        """
        self.index.reset()
        self.time_index.reset()
        self._max_timestamp, self._offset_of_max_timestamp = -1, self.base_offset
        self._bytes_since_last_index_entry = 0
        self._rolling_based_timestamp = None
        expected = self.base_offset
        position = 0
        chunk_size = _RECOVERY_CHUNK
        while position < self._size:
            chunk = self._pread(position, min(chunk_size, self._size - position))
            chunk_size = _RECOVERY_CHUNK
            valid, found, error = scan_valid_prefix(chunk)
            stopped = False
            problem: str | None = None
            for relative, header in found:
                if header.base_offset != expected:
                    problem = f"baseOffset {header.base_offset}, expected {expected}"
                elif not self.can_hold_offset(header.last_offset):
                    problem = f"offset {header.last_offset} overflows the segment index"
                elif check is not None:
                    problem = check(header)
                if problem is not None:
                    position += relative
                    stopped = True
                    break
                if self._rolling_based_timestamp is None:
                    self._rolling_based_timestamp = min(header.max_timestamp, self.created_ms)
                self._index_batch(
                    position + relative, header.size, header.last_offset, header.max_timestamp
                )
                expected = header.next_offset
            if stopped:
                break
            if error is None:
                position += valid
                continue
            # The chunk may have cut a good batch in two: read it whole before judging it.
            at = position + valid
            if position + len(chunk) < self._size:
                if valid + LOG_OVERHEAD > len(chunk):
                    position = at
                    continue
                (length,) = struct.unpack_from(">i", chunk, valid + 8)
                needed = length + LOG_OVERHEAD
                fits_in_file = at + needed <= self._size
                if length >= BATCH_LENGTH_MIN and valid + needed > len(chunk) and fits_in_file:
                    position = at
                    chunk_size = max(_RECOVERY_CHUNK, needed)
                    continue
            position = at
            problem = error.reason
            break
        truncated = self._size - position
        if truncated:
            _log.warning(
                "segment_truncated_on_recovery",
                path=str(segment_path(self.directory, self.base_offset, LOG_SUFFIX)),
                position=position,
                truncated_bytes=truncated,
                reason=problem or "torn batch",
            )
            os.ftruncate(self._file(), position)
            self._size = position
        self._next_offset = expected
        self.index.write_pending()
        self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
        self.time_index.write_pending()
        self.needs_recovery = False
        return truncated

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= `offset`; returns the bytes removed.

        Batch-granular: a batch that holds `offset` goes whole, so `next_offset` afterwards is
        that batch's base offset (<= `offset`). All or nothing: everything that can fail (the
        reads, the cut of the `.log`) happens before anything changes; the index files are cut
        after, and that never raises.
        """
        batch = self.translate_offset(offset)
        if batch is None:
            return 0
        # The batches between the last index entry that stays and the cut, read first.
        _, start = self.index.lookup(batch.base_offset - 1)
        kept_tail = list(self.walk(start, batch.position))
        os.ftruncate(self._file(), batch.position)
        self._tail_dirty = False
        removed = self._size - batch.position
        self._size = batch.position
        self._next_offset = batch.base_offset
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
