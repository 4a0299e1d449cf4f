"""The process-wide budget of open `.log` descriptors of inactive segments.

Only the active segment of a log keeps its `.log` open. An inactive segment's `.log` is opened
when it is read (or cut or fsynced) and its descriptor is kept in `INACTIVE_SEGMENT_FILES`, an
LRU of at most `INACTIVE_SEGMENT_FILES_MAX` descriptors: so a broker holds one descriptor per
partition plus a fixed number, however many segments it has (Kafka keeps every segment's file
open and maps its indexes lazily).

Does no I/O itself: it tells a segment to close its file (`_close_file`) when evicting it.
Concurrency contract: single-threaded (every segment of the process runs on one thread).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

# Descriptors of inactive segments' `.log` files kept open per process (README: the file
# budget). A consumer or follower reading old data reads a segment many times in a row; 64
# covers that for dozens of partitions at once, and a miss costs one open().
INACTIVE_SEGMENT_FILES_MAX = 64


class _HasFile(Protocol):
    def _close_file(self) -> None: ...


class InactiveSegmentFiles:
    """The open `.log` descriptors of inactive segments: at most `capacity`, the least recently
    used closed first (the segment opens its file again when it next needs it).

    The active segment's descriptor is never here: it stays open. Single-threaded.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._lru: OrderedDict[_HasFile, None] = OrderedDict()

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

    def touch(self, segment: _HasFile) -> None:
        self._lru.move_to_end(segment)

    def add(self, segment: _HasFile) -> None:
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

    def forget(self, segment: _HasFile) -> None:
        self._lru.pop(segment, None)


INACTIVE_SEGMENT_FILES = InactiveSegmentFiles(INACTIVE_SEGMENT_FILES_MAX)
