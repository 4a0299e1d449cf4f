"""The leader-epoch cache of one replica: the ordered map `leader_epoch -> start_offset`.

Pure: no I/O, no clock. These are the in-memory rules of Kafka's LeaderEpochFileCache
(docs/protocol.md §13); the storage layer
(`minibroker.broker.storage.log.PartitionLog`) persists the entries to `leader-epoch-checkpoint`
whenever a mutating call reports a change, and keeps the cache in step with the log.

Invariant (kept by `assign`): epochs and start offsets both strictly increase along `entries`.

Concurrency contract: single-threaded; owned by one PartitionLog.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from minibroker.client.types import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET


class EpochEntry(NamedTuple):
    """One epoch and the offset of the first record written in it (or the LEO at election)."""

    epoch: int
    start_offset: int


class EpochCache:
    """Kafka's LeaderEpochFileCache without the file (docs/protocol.md §13)."""

    __slots__ = ("_entries",)

    def __init__(self, entries: Iterable[EpochEntry | tuple[int, int]] = ()) -> None:
        self._entries: list[EpochEntry] = []
        for epoch, start_offset in entries:
            self.assign(epoch, start_offset)

    # -- reads ------------------------------------------------------------------------------

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return tuple(self._entries)

    @property
    def latest_epoch(self) -> int | None:
        """The newest epoch, or None when the cache is empty."""
        return self._entries[-1].epoch if self._entries else None

    @property
    def latest_entry(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    @property
    def earliest_entry(self) -> EpochEntry | None:
        return self._entries[0] if self._entries else None

    def __len__(self) -> int:
        return len(self._entries)

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __iter__(self) -> Iterator[EpochEntry]:
        return iter(tuple(self._entries))

    def __repr__(self) -> str:
        inner = ", ".join(f"{e.epoch}@{e.start_offset}" for e in self._entries)
        return f"EpochCache([{inner}])"

    def end_offset_for(self, requested_epoch: int, leo: int) -> tuple[int, int]:
        """(epoch, end offset) for `requested_epoch` (Kafka's `endOffsetFor`, docs/protocol.md §13).

        * undefined requested epoch -> (-1, -1);
        * the latest cached epoch -> (requested, leo);
        * no cached epoch above the requested one -> (-1, -1);
        * below every cached epoch -> (requested, start of the first cached epoch);
        * otherwise -> (largest cached epoch <= requested, start of the next higher epoch).
        """
        if requested_epoch == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if self._entries and self._entries[-1].epoch == requested_epoch:
            return requested_epoch, leo
        epochs = [e.epoch for e in self._entries]
        higher = bisect.bisect_right(epochs, requested_epoch)
        if higher == len(epochs):
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            # The requested epoch's data is gone (retention) or was never here: the follower
            # may replicate from the first epoch we know.
            return requested_epoch, self._entries[0].start_offset
        return self._entries[higher - 1].epoch, self._entries[higher].start_offset

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch the record at `offset` was written in, or None before the first entry."""
        starts = [e.start_offset for e in self._entries]
        index = bisect.bisect_right(starts, offset)
        return self._entries[index - 1].epoch if index else None

    # -- mutations (each reports whether the persisted form must be rewritten) ------------------

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset`; True if the entries changed.

        A no-op when `epoch` is already the latest epoch at a start <= `start_offset`.
        Otherwise every entry with an epoch >= `epoch` or a start >= `start_offset` is removed
        first, which keeps both columns strictly increasing (Kafka's
        maybeTruncateNonMonotonicEntries).
        """
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry: epoch {epoch} at {start_offset}")
        latest = self._entries[-1] if self._entries else None
        if latest is not None and latest.epoch == epoch and start_offset >= latest.start_offset:
            return False
        while self._entries and (
            self._entries[-1].epoch >= epoch or self._entries[-1].start_offset >= start_offset
        ):
            self._entries.pop()
        self._entries.append(EpochEntry(epoch, start_offset))
        return True

    def truncate_from_end(self, end_offset: int) -> list[EpochEntry]:
        """Drop entries whose start offset is >= `end_offset` (log truncation; KAFKA-10706)."""
        removed: list[EpochEntry] = []
        if end_offset < 0:
            return removed
        while self._entries and self._entries[-1].start_offset >= end_offset:
            removed.append(self._entries.pop())
        removed.reverse()
        return removed

    def truncate_from_start(self, start_offset: int) -> list[EpochEntry]:
        """Forget epochs that ended before `start_offset` (the log start moved up).

        Entries with a start <= `start_offset` are removed and the last of them comes back with
        its start raised to `start_offset`, so the epoch of the first remaining record is kept.
        Returns the removed entries (empty: nothing changed).
        """
        count = 0
        while count < len(self._entries) and self._entries[count].start_offset <= start_offset:
            count += 1
        if count == 0:
            return []
        removed = self._entries[:count]
        if removed[-1].start_offset == start_offset and count == 1:
            return []
        self._entries[:count] = [EpochEntry(removed[-1].epoch, start_offset)]
        return removed

    def clear(self) -> bool:
        """Drop every entry (the log was truncated fully); True if there were any."""
        had = bool(self._entries)
        self._entries.clear()
        return had
