"""Reads of one segment, on batch boundaries found from the sparse offset index and a walk
over batch headers (never over records): the segment never decodes a record. A mixin of
LogSegment, kept apart by job; it reads through the segment's `_pread`.

The CRC is checked on the way in (by the log, before an append) and by recovery, not on reads
(Kafka serves fetches the same way; consumers check CRCs).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from minibroker.broker.storage.index import OffsetIndex, TimeIndex
from minibroker.broker.storage.segment_files import INACTIVE_SEGMENT_FILES
from minibroker.client.batch import BATCH_LENGTH_MIN, LOG_OVERHEAD, CorruptRecordError

# The first 43 header bytes: baseOffset, batchLength, partitionLeaderEpoch, magic, crc,
# attributes, lastOffsetDelta, baseTimestamp, maxTimestamp (client/batch.py has the layout).
_WALK_HEADER = struct.Struct(">qiibIhiqq")
_WALK_READ_AHEAD = 8192


@dataclass(frozen=True, slots=True)
class BatchPosition:
    """Where one batch sits in the `.log`, from its header only."""

    position: int
    size: int
    base_offset: int
    last_offset: int
    partition_leader_epoch: int
    max_timestamp: int


class SegmentReads:
    """Header walks and whole-batch reads of a LogSegment (which provides this state)."""

    index: OffsetIndex
    time_index: TimeIndex
    _fd: int
    _active: bool
    _size: int
    _next_offset: int
    # LogSegment's: its file I/O.
    _pread: Callable[[int, int], bytes]
    _close_file: Callable[[], None]

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
