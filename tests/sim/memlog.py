"""MemLog: one replica's log in memory, for the simulation and the scenario tests.

It implements the replica engine's `Storage` protocol (broker/replication/storage.py) the way
`PartitionLog` (broker/storage/log.py) does, minus the files: real v2 batch bytes (stamped on a
leader append by the client library's `assign_offsets`), the real EpochCache kept in step with
the batches, batch-granular truncation, a follower append that must start at the LEO
(UnexpectedAppendOffsetError), reads of whole batches (at least one, KIP-74) that refuse an
offset outside [log start, LEO], and a log start that only moves up (never past the LEO) and
takes the epoch cache's older entries with it, while the batches below it stay until retention
deletes them. Like PartitionLog it does not hold the high watermark; `hw_checkpoint` is the
simulation's model of the HW checkpoint file, written at `flush`. tests/sim/test_memlog.py runs
the same operations on both and compares.

On top, a model of the page cache: `flushed` counts the leading batches that are durable, and
`crash` keeps them and a random part of the rest, the way a power loss keeps what was fsynced
and maybe some of what was not. Retention (`delete_retention`) deletes batches as
PartitionLog deletes segments: a batch stands for a segment.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass

from minibroker.broker.storage.epoch_cache import EpochCache
from minibroker.broker.storage.errors import UnexpectedAppendOffsetError
from minibroker.client.batch import BatchHeader, assign_offsets, iter_batches
from minibroker.client.errors import OffsetOutOfRangeError


@dataclass(frozen=True, slots=True)
class MemAppend:
    """What an append wrote (the fields of PartitionLog's AppendInfo the engine reads)."""

    first_offset: int
    batches: tuple[BatchHeader, ...]
    log_append_time_ms: int
    valid_bytes: int


@dataclass(frozen=True, slots=True)
class MemRead:
    records: bytes


class MemLog:
    """One replica's log: stamped batch bytes in offset order, an epoch cache, a flush mark."""

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        self.headers: list[BatchHeader] = []
        self.bases: list[int] = []  # base offsets, for bisect
        self.epoch_cache = EpochCache()
        self.log_start_offset = 0
        # Where the first (PartitionLog: segment; here: batch) starts, the LEO of an empty log.
        self.base_offset = 0
        self.flushed = 0
        self.hw_checkpoint = 0

    # -- the Storage protocol ------------------------------------------------------------------

    @property
    def leo(self) -> int:
        return self.headers[-1].next_offset if self.headers else self.base_offset

    @property
    def may_have_gaps(self) -> bool:
        """The simulation's logs are never compacted: no gaps."""
        return False

    def maybe_assign_epoch_start_offset(self, leader_epoch: int, start_offset: int) -> bool:
        return self.epoch_cache.assign(leader_epoch, start_offset)

    def append_as_leader(
        self,
        records: bytes,
        leader_epoch: int,
        now_ms: int,
        *,
        validated: list[tuple[int, BatchHeader]] | None = None,
    ) -> MemAppend:
        """Assign offsets from the LEO and stamp the leader epoch, then append."""
        if leader_epoch < 0:
            raise ValueError(f"a leader append needs a leader epoch, got {leader_epoch}")
        buf = bytearray(records)
        batches = validated if validated is not None else list(iter_batches(buf))
        first_offset = self.leo
        assign_offsets(buf, batches, first_offset, leader_epoch)
        stored = self._append(bytes(buf))
        return MemAppend(first_offset, stored, -1, len(buf))

    def append_as_follower(self, records: bytes) -> MemAppend:
        """Append the leader's batches as they are; the first must start at the LEO."""
        if not records:
            return MemAppend(-1, (), -1, 0)
        stored = self._append(bytes(records))
        return MemAppend(stored[0].base_offset, stored, -1, len(records))

    def truncate_to(self, offset: int) -> bool:
        """Remove the batches at and after `offset` (the batch holding it goes whole); the
        epoch cache drops entries at or after the new end even when nothing goes
        (KAFKA-10706)."""
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot truncate to {offset}")
        if offset >= self.leo:
            self.epoch_cache.truncate_from_end(offset)
            return False
        if offset < self.base_offset:
            self.truncate_fully_and_start_at(offset)
            return True
        keep = self.index_of(offset)
        del self.batches[keep:]
        del self.headers[keep:]
        del self.bases[keep:]
        self.flushed = min(self.flushed, len(self.batches))
        self.epoch_cache.truncate_from_end(self.leo)
        self.log_start_offset = min(self.log_start_offset, self.leo)
        return True

    def truncate_fully_and_start_at(self, offset: int) -> None:
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot restart at {offset}")
        self.batches.clear()
        self.headers.clear()
        self.bases.clear()
        self.flushed = 0
        self.epoch_cache.clear()
        self.log_start_offset = offset
        self.base_offset = offset

    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        """Raise the log start (a follower copies its leader's), never past the LEO; the
        batches below it go at the next `delete_retention`. Keeping it at or below the HW is
        the core's rule (it asks only up to its HW)."""
        if offset > self.leo:
            raise OffsetOutOfRangeError(f"cannot raise the log start to {offset}: LEO {self.leo}")
        if offset <= self.log_start_offset:
            return False
        self.log_start_offset = offset
        self.epoch_cache.truncate_from_start(offset)
        return True

    def read(self, offset: int, max_bytes: int, *, max_offset: int | None = None) -> MemRead:
        """Whole batches from the one holding `offset`, those ending below `max_offset` (None:
        the LEO), up to `max_bytes` but at least one (KIP-74)."""
        leo = self.leo
        if offset < self.log_start_offset or offset > leo:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range: log start {self.log_start_offset}, log end {leo}"
            )
        until = leo if max_offset is None else min(max_offset, leo)
        out: list[bytes] = []
        size = 0
        for i in range(self.index_of(offset), len(self.headers)):
            header = self.headers[i]
            if header.next_offset > until:
                break
            if out and size + header.size > max_bytes:
                break
            out.append(self.batches[i])
            size += header.size
        return MemRead(b"".join(out))

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        for header in self.headers:
            if header.max_timestamp >= timestamp:
                return max(header.base_offset, self.log_start_offset), header.max_timestamp
        return None

    def producer_batch_headers(self) -> list[BatchHeader]:
        start = self.log_start_offset
        return [h for h in self.headers if h.last_offset >= start]

    # -- the simulation's own ------------------------------------------------------------------

    def _append(self, data: bytes) -> tuple[BatchHeader, ...]:
        expected = self.leo
        parsed = list(iter_batches(data))
        for pos, header in parsed:
            if header.base_offset != expected:
                raise UnexpectedAppendOffsetError(
                    f"batch at position {pos} starts at offset {header.base_offset}, "
                    f"expected {expected}",
                    first_offset=header.base_offset,
                    expected_offset=expected,
                )
            expected = header.next_offset
        for pos, header in parsed:
            if header.partition_leader_epoch >= 0:
                self.epoch_cache.assign(header.partition_leader_epoch, header.base_offset)
            self.batches.append(data[pos : pos + header.size])
            self.headers.append(header)
            self.bases.append(header.base_offset)
        return tuple(header for _, header in parsed)

    def index_of(self, offset: int) -> int:
        """Index of the batch holding `offset`, or len(batches) when none does."""
        i = bisect.bisect_right(self.bases, offset) - 1
        if i < 0:
            return 0 if self.headers else len(self.headers)
        return i if self.headers[i].last_offset >= offset else i + 1

    def batch_at(self, base_offset: int) -> bytes | None:
        """The batch whose base offset is `base_offset`, if there is one."""
        i = bisect.bisect_left(self.bases, base_offset)
        if i < len(self.bases) and self.bases[i] == base_offset:
            return self.batches[i]
        return None

    def delete_retention(self, high_watermark: int, batches: int) -> bool:
        """Retention (PartitionLog.delete_retention, a batch for a segment): delete up to
        `batches` of the oldest batches, and those wholly below the log start, each only while
        the next one starts at or below the HW (nothing at or above the HW goes, nor the last
        batch); the log start moves up to the first batch left. True when anything went."""
        drop = 0
        while (
            drop + 1 < len(self.headers)
            and self.headers[drop + 1].base_offset <= high_watermark
            and (drop < batches or self.headers[drop].next_offset <= self.log_start_offset)
        ):
            drop += 1
        if not drop:
            return False
        del self.batches[:drop]
        del self.headers[:drop]
        del self.bases[:drop]
        self.flushed = max(self.flushed - drop, 0)
        first = self.base_offset = self.headers[0].base_offset
        if first > self.log_start_offset:
            self.log_start_offset = first
            self.epoch_cache.truncate_from_start(first)
        return True

    def flush(self, high_watermark: int) -> None:
        """fsync the log and write the HW checkpoint."""
        self.flushed = len(self.batches)
        self.hw_checkpoint = high_watermark

    def crash(self, rng: random.Random) -> None:
        """Power loss: keep the flushed batches and a random prefix of the unflushed ones."""
        self._recover(rng.randint(self.flushed, len(self.batches)))

    def lose_unflushed(self) -> None:
        """Power loss that keeps exactly the flushed prefix."""
        self._recover(self.flushed)

    def _recover(self, keep: int) -> None:
        """What loading the log after a power loss that kept `keep` batches finds (the log
        start, like its checkpoint, survives): PartitionLog's load."""
        del self.batches[keep:]
        del self.headers[keep:]
        del self.bases[keep:]
        self.flushed = keep
        if self.leo < self.log_start_offset:
            # The log start is past everything left: start over there, empty.
            self.batches.clear()
            self.headers.clear()
            self.bases.clear()
            self.flushed = 0
            self.base_offset = self.log_start_offset
        self.epoch_cache.truncate_from_end(self.leo)
        self.epoch_cache.truncate_from_start(self.log_start_offset)
        self.hw_checkpoint = min(self.hw_checkpoint, self.leo)

    def triples(self) -> list[tuple[int, int, int]]:
        return [(h.base_offset, h.last_offset, h.partition_leader_epoch) for h in self.headers]
