"""A segment's sparse indexes: `.index` (offset -> file position) and `.timeindex` (time -> offset).

Does file I/O on the index files, whose layout (Kafka's OffsetIndex and TimeIndex) is defined
once, in client/log_format.py (`minibroker dump-log` reads it from there too).

The segment adds an entry once more than `index.interval.bytes` have been written since the
previous one. A lookup takes the largest entry <= the target and the caller scans batch headers
from there: every batch before the entry's position ends below the entry's offset, so the scan
never misses the batch it is looking for.

Entries live in memory (two sorted lists, searched with bisect) and are appended to the file in
small groups (`PENDING_ENTRIES_MAX`), on flush, roll and close. An index file that is missing or
fails `load`'s checks is rebuilt from the `.log` by the segment's recovery; one that is merely
short (a crash lost the last group) is still correct, only sparser.

Failed writes: the file always holds a prefix of the in-memory entries (`_written` of them) or
is marked stale. A group write that fails is cut back off the file; `rollback_to` and the
truncations drop entries from memory and from the file and never raise (an index is derived
data: when the file cannot be cut, it is removed, and failing that marked stale, so the next
write rewrites it whole). So an append that fails half way can be undone exactly.

Concurrency contract: single-threaded; owned by one LogSegment.
"""

from __future__ import annotations

import array
import bisect
import os
import pathlib
import struct

from minibroker.client.common.log import get_logger
from minibroker.client.log_format import (
    OFFSET_INDEX_ENTRY,
    RELATIVE_OFFSET_MAX,
    TIME_INDEX_ENTRY,
    fits_relative_offset,
    index_rows,
)

PENDING_ENTRIES_MAX = 128
_OFFSET_ENTRY = OFFSET_INDEX_ENTRY
_log = get_logger("minibroker.broker.storage")


class _IndexFile:
    """Shared file handling: entries in memory, unwritten ones in a pending buffer.

    Invariant (unless `_stale`): the file holds exactly the first `_written` in-memory entries
    and `_pending` packs the rest, `_pending_count` of them.
    """

    entry: struct.Struct

    def __init__(self, path: pathlib.Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._pending = bytearray()
        self._pending_count = 0
        self._written = 0
        # The file's content is unknown (a cut failed): the next write replaces it whole.
        self._stale = False

    def __len__(self) -> int:
        raise TypeError("subclass duty")

    def _add_pending(self, *fields: int) -> None:
        self._pending += self.entry.pack(*fields)
        self._pending_count += 1
        if self._pending_count >= PENDING_ENTRIES_MAX:
            self.write_pending()

    def write_pending(self) -> None:
        """Append the entries not yet in the file; on failure the file is as it was."""
        if self._stale:
            self._write_whole()
            return
        if not self._pending:
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            try:
                _write_all(fd, bytes(self._pending))
            except OSError:
                # A partial group (or a partial entry) must not stay: later groups would land
                # after it. The entries stay pending for the next try.
                try:
                    os.ftruncate(fd, self._written * self.entry.size)
                except OSError:
                    self._stale = True
                raise
        finally:
            os.close(fd)
        self._written += self._pending_count
        self._pending.clear()
        self._pending_count = 0

    def _write_whole(self) -> None:
        """Replace the file with every in-memory entry (it was stale)."""
        count = len(self)
        data = b"".join(self.entry.pack(*self._entry_fields(i)) for i in range(count))
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        self._written = count
        self._stale = False
        self._pending.clear()
        self._pending_count = 0

    def _repack_pending(self) -> None:
        count = len(self)
        self._pending = bytearray(
            b"".join(self.entry.pack(*self._entry_fields(i)) for i in range(self._written, count))
        )
        self._pending_count = count - self._written

    def _cut(self, count: int) -> None:
        """Memory now holds `count` entries: drop any later ones from the file. Never raises."""
        if self._stale:
            return
        if self._written > count:
            try:
                os.truncate(self.path, count * self.entry.size)
                self._written = count
            except FileNotFoundError:
                self._written = 0
            except OSError as err:
                self._written = 0
                # A missing index is rebuilt from the `.log` on open; a stale one might not
                # be noticed there.
                try:
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
                except OSError:
                    self._stale = True
                _log.warning(
                    "index_cut_failed", path=str(self.path), error=str(err), stale=self._stale
                )
        self._repack_pending()

    def _create(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.close(fd)
        self._written = 0
        self._stale = False

    def _entry_fields(self, i: int) -> tuple[int, int]:
        raise TypeError("subclass duty")

    def flush(self) -> None:
        """Write pending entries and fsync the file."""
        if not self.path.exists():
            # Removed by a failed cut (or never written): write it whole.
            self._stale = True
        self.write_pending()
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def delete(self) -> None:
        self._pending.clear()
        self._pending_count = 0
        self._written = 0
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    @classmethod
    def _read_raw(cls, path: pathlib.Path) -> list[tuple[int, int]] | None:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        rows, leftover = index_rows(raw, cls.entry)
        return None if leftover else rows


class OffsetIndex(_IndexFile):
    """`.index`: the file position of a batch, keyed by its last offset."""

    entry = OFFSET_INDEX_ENTRY

    def __init__(self, path: pathlib.Path, base_offset: int) -> None:
        super().__init__(path, base_offset)
        # array('q'): 8 bytes an entry instead of a list of int objects (a 64 MiB segment of
        # 16 KiB batches holds ~4000 entries); bisect works on it directly.
        self._offsets = array.array("q")
        self._positions = array.array("q")

    @classmethod
    def create(cls, path: pathlib.Path, base_offset: int) -> OffsetIndex:
        index = cls(path, base_offset)
        index._create()
        return index

    @classmethod
    def load(cls, path: pathlib.Path, base_offset: int, log_size: int) -> OffsetIndex | None:
        """The index in `path`, or None when it is missing or inconsistent with the log."""
        rows = cls._read_raw(path)
        if rows is None:
            return None
        index = cls(path, base_offset)
        last_relative = -1
        last_position = -1
        for relative, position in rows:
            if relative <= last_relative or position <= last_position or position >= log_size:
                return None
            last_relative, last_position = relative, position
            index._offsets.append(base_offset + relative)
            index._positions.append(position)
        index._written = len(rows)
        return index

    def __len__(self) -> int:
        return len(self._offsets)

    def entries(self) -> list[tuple[int, int]]:
        """(absolute offset, position) pairs, oldest first."""
        return list(zip(self._offsets, self._positions))

    @property
    def last_entry(self) -> tuple[int, int]:
        """The newest (offset, position), or (base offset, 0) when empty."""
        if not self._offsets:
            return self.base_offset, 0
        return self._offsets[-1], self._positions[-1]

    def can_append_offset(self, offset: int) -> bool:
        return fits_relative_offset(self.base_offset, offset)

    def append(self, offset: int, position: int) -> None:
        # Once per indexed batch on the produce path: the checks and the pending write are
        # inlined (a method call costs as much as the check here).
        offsets = self._offsets
        if offsets and (offset <= offsets[-1] or position <= self._positions[-1]):
            raise ValueError(
                f"offset index entry ({offset}, {position}) is not after "
                f"({offsets[-1]}, {self._positions[-1]}) in {self.path}"
            )
        relative = offset - self.base_offset
        if not 0 <= relative <= RELATIVE_OFFSET_MAX:
            raise ValueError(f"offset {offset} does not fit segment {self.base_offset}")
        offsets.append(offset)
        self._positions.append(position)
        self._pending += _OFFSET_ENTRY.pack(relative, position)
        self._pending_count += 1
        if self._pending_count >= PENDING_ENTRIES_MAX:
            self.write_pending()

    def lookup(self, offset: int) -> tuple[int, int]:
        """The largest entry whose offset is <= `offset`, or (base offset, 0)."""
        i = bisect.bisect_right(self._offsets, offset)
        if i == 0:
            return self.base_offset, 0
        return self._offsets[i - 1], self._positions[i - 1]

    def floor_position(self, position: int) -> int:
        """The largest indexed batch position <= `position` (0 when none): a batch boundary."""
        i = bisect.bisect_right(self._positions, position)
        return self._positions[i - 1] if i else 0

    def truncate_to(self, offset: int) -> None:
        """Remove entries whose offset is >= `offset` (never raises)."""
        self.rollback_to(bisect.bisect_left(self._offsets, offset))

    def rollback_to(self, count: int) -> None:
        """Keep only the first `count` entries, in memory and in the file (never raises)."""
        if count >= len(self._offsets):
            return
        del self._offsets[count:]
        del self._positions[count:]
        self._cut(count)

    def reset(self) -> None:
        del self._offsets[:]
        del self._positions[:]
        self._pending.clear()
        self._pending_count = 0
        self._create()

    def _entry_fields(self, i: int) -> tuple[int, int]:
        return self._offsets[i] - self.base_offset, self._positions[i]


class TimeIndex(_IndexFile):
    """`.timeindex`: the largest timestamp so far and the offset where it was reached."""

    entry = TIME_INDEX_ENTRY

    def __init__(self, path: pathlib.Path, base_offset: int) -> None:
        super().__init__(path, base_offset)
        self._timestamps = array.array("q")
        self._offsets = array.array("q")

    @classmethod
    def create(cls, path: pathlib.Path, base_offset: int) -> TimeIndex:
        index = cls(path, base_offset)
        index._create()
        return index

    @classmethod
    def load(cls, path: pathlib.Path, base_offset: int, next_offset: int) -> TimeIndex | None:
        """The index in `path`, or None when missing or inconsistent with the segment's offsets."""
        rows = cls._read_raw(path)
        if rows is None:
            return None
        index = cls(path, base_offset)
        last_timestamp = -(2**63)
        last_offset = base_offset - 1
        for timestamp, relative in rows:
            offset = base_offset + relative
            if timestamp <= last_timestamp or offset < last_offset or offset >= next_offset:
                return None
            if relative < 0:
                return None
            last_timestamp, last_offset = timestamp, offset
            index._timestamps.append(timestamp)
            index._offsets.append(offset)
        index._written = len(rows)
        return index

    def __len__(self) -> int:
        return len(self._timestamps)

    def entries(self) -> list[tuple[int, int]]:
        """(timestamp, absolute offset) pairs, oldest first."""
        return list(zip(self._timestamps, self._offsets))

    @property
    def last_entry(self) -> tuple[int, int]:
        """The newest (timestamp, offset), or (-1, base offset) when empty."""
        if not self._timestamps:
            return -1, self.base_offset
        return self._timestamps[-1], self._offsets[-1]

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Add (timestamp, offset) if the timestamp is larger than the last entry's."""
        if self._timestamps and timestamp <= self._timestamps[-1]:
            return
        if self._offsets and offset < self._offsets[-1]:
            raise ValueError(f"time index offset {offset} goes back in {self.path}")
        self._timestamps.append(timestamp)
        self._offsets.append(offset)
        self._add_pending(timestamp, offset - self.base_offset)

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """The largest entry whose timestamp is <= `timestamp`, or (-1, base offset)."""
        i = bisect.bisect_right(self._timestamps, timestamp)
        if i == 0:
            return -1, self.base_offset
        return self._timestamps[i - 1], self._offsets[i - 1]

    def truncate_to(self, offset: int) -> None:
        """Remove entries whose offset is >= `offset` (never raises)."""
        self.rollback_to(bisect.bisect_left(self._offsets, offset))

    def rollback_to(self, count: int) -> None:
        """Keep only the first `count` entries, in memory and in the file (never raises)."""
        if count >= len(self._timestamps):
            return
        del self._timestamps[count:]
        del self._offsets[count:]
        self._cut(count)

    def reset(self) -> None:
        del self._timestamps[:]
        del self._offsets[:]
        self._pending.clear()
        self._pending_count = 0
        self._create()

    def _entry_fields(self, i: int) -> tuple[int, int]:
        return self._timestamps[i], self._offsets[i] - self.base_offset


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
