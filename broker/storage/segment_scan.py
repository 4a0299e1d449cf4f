"""`SegmentScan`: the one definition of which batches of a `.log` are sound.

Used by the segment's recovery (`LogSegment.recover`, which rebuilds the indexes from what it
yields and cuts the file where it stopped) and by the load's read-only check of the segments
recovery skips (`LogSegment.find_damage`), so both judge a batch by the same rules: whole,
length, magic and CRC (client/batch.py), a base offset right after the previous batch's last
(it sits outside the CRC), a last offset the segment's index can hold, then the caller's
`check` (the epoch rules of the load).

In a log that may have gaps (`allow_gaps`: its dir holds the `.may-have-gaps` marker, a cleaned
log) a base offset above the expected one is a gap, not damage; one below it still is (offsets
only increase), and so is a first batch below the segment's base offset.

Reads through the `pread(position, length)` it is given, in chunks of `SCAN_CHUNK` bytes; a batch
cut by the end of a chunk is read again whole at the start of the next one. Does no I/O of its
own and keeps nothing but its position.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

from minibroker.client.batch import (
    BATCH_LENGTH_MIN,
    LOG_OVERHEAD,
    BatchHeader,
    CorruptRecordError,
    read_header,
)
from minibroker.client.log_format import fits_relative_offset

SCAN_CHUNK = 8 * 1024 * 1024
_INT32 = struct.Struct(">i")

# A check beyond CRC and offsets: returns why the batch is bad, or None.
BatchCheck = Callable[[BatchHeader], "str | None"]
Pread = Callable[[int, int], bytes]


class SegmentScan:
    """Iterate to get (position, header) of each sound batch from the start of the file, in
    order; afterwards `end` is the position after the last one, `next_offset` the offset after
    it, and `problem` why the scan stopped before `size` (None when it reached it)."""

    def __init__(
        self,
        pread: Pread,
        size: int,
        base_offset: int,
        check: BatchCheck | None = None,
        *,
        allow_gaps: bool = False,
    ) -> None:
        self._pread = pread
        self._allow_gaps = allow_gaps
        self._size = size
        self._base_offset = base_offset
        self._check = check
        self.end = 0
        self.next_offset = base_offset
        self.problem: str | None = None

    def __iter__(self) -> Iterator[tuple[int, BatchHeader]]:
        size, base_offset, check = self._size, self._base_offset, self._check
        allow_gaps = self._allow_gaps
        chunk_size = SCAN_CHUNK
        expected = base_offset
        position = 0
        want = chunk_size
        while position < size:
            requested = min(max(want, LOG_OVERHEAD), size - position)
            chunk = self._pread(position, requested)
            want = chunk_size
            at = 0
            while len(chunk) - at >= LOG_OVERHEAD:
                (length,) = _INT32.unpack_from(chunk, at + 8)
                total = length + LOG_OVERHEAD
                if length < BATCH_LENGTH_MIN or position + at + total > size:
                    self._stop(position + at, expected, f"bad batchLength {length}")
                    return
                if at + total > len(chunk):
                    want = total
                    break
                try:
                    header = read_header(chunk, at)
                except CorruptRecordError as err:
                    self._stop(position + at, expected, err.reason)
                    return
                problem: str | None
                if header.base_offset != expected and (
                    header.base_offset < expected or not allow_gaps
                ):
                    problem = f"baseOffset {header.base_offset}, expected {expected}"
                elif not fits_relative_offset(base_offset, header.last_offset):
                    problem = f"offset {header.last_offset} overflows the segment index"
                else:
                    problem = None if check is None else check(header)
                if problem is not None:
                    self._stop(position + at, expected, problem)
                    return
                yield position + at, header
                expected = header.next_offset
                at += total
            if at == 0 and (len(chunk) < requested or len(chunk) < LOG_OVERHEAD):
                # The file ends before its size says, or fewer bytes than a header are left.
                self._stop(position, expected, "torn batch")
                return
            position += at
        self.end, self.next_offset = position, expected

    def _stop(self, position: int, next_offset: int, problem: str) -> None:
        self.end, self.next_offset = position, next_offset
        self.problem = f"{problem} at position {position}"
