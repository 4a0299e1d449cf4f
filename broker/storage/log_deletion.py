"""What removes data from a `PartitionLog`: truncation from the end (a follower diverged),
a restart at a new offset, and retention from the start. A mixin of PartitionLog, kept apart by
job; it works on the log's segments, offsets and epoch checkpoint.

Does file I/O (segment deletion and cuts). None of it can be undone (files are gone), so each
works one whole step at a time: truncation from the newest segment back, retention from the
oldest forward. When a step raises KafkaStorageError the log is consistent at an LEO (or log
start) between the old and the requested one, and calling again finishes the job. The epoch
cache follows the log (never the other way round): a crash in between leaves cache entries past
the LEO or below the log start, which loading trims, never a batch whose epoch it lacks.
"""

from __future__ import annotations

import bisect
import pathlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.epoch_cache import EpochCache
from minibroker.broker.storage.epoch_checkpoint import EpochCheckpoint
from minibroker.broker.storage.segment import LogSegment
from minibroker.client.batch import BatchHeader
from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.common.log import get_logger
from minibroker.client.errors import KafkaStorageError, OffsetOutOfRangeError
from minibroker.client.types import TopicPartition

_log = get_logger("minibroker.broker.storage")


@dataclass(frozen=True, slots=True)
class DeletedSegment:
    """A segment removed by retention: offsets [base_offset, next_offset)."""

    base_offset: int
    next_offset: int
    size_bytes: int
    reason: str  # "retention.ms", "retention.bytes" or "log_start_offset"


def storage_error(topic_partition: TopicPartition, what: str, err: OSError) -> KafkaStorageError:
    return KafkaStorageError(f"{what} {topic_partition} failed: {err}")


class LogDeletion:
    """Truncation, restart and retention of a PartitionLog (which provides this state)."""

    directory: pathlib.Path
    topic_partition: TopicPartition
    config: LogConfig
    _segments: list[LogSegment]
    _bases: list[int]
    _epoch_cache: EpochCache
    _epochs: EpochCheckpoint
    _log_start_offset: int
    _recovery_point: int
    _loaded_producer_batches: list[BatchHeader] | None

    def _leo(self) -> int:
        return self._segments[-1].next_offset

    if TYPE_CHECKING:

        def roll(self, now_ms: int) -> LogSegment: ...  # PartitionLog's

    # -- truncation ---------------------------------------------------------------------------

    def truncate_to(self, offset: int) -> bool:
        """Remove the batches at and after `offset`; True if any bytes went.

        The epoch cache drops entries starting at or after the new end even when nothing is
        truncated (KAFKA-10706). Batch-granular: a batch holding `offset` goes whole. An
        `offset` inside a gap of a compacted log (between batches or segments) keeps every batch
        below it and becomes the LEO, as in Kafka. Below the first segment this is
        `truncate_fully_and_start_at(offset)`.
        """
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot truncate {self.topic_partition} to {offset}")
        if offset >= self._leo():
            if self._epoch_cache.truncate_from_end(offset):
                self._epochs.persist_after_shrink()
            return False
        if offset < self._segments[0].base_offset:
            self.truncate_fully_and_start_at(offset)
            return True
        self._loaded_producer_batches = None
        old_leo = self._leo()
        keep = bisect.bisect_right(self._bases, offset)
        try:
            # Newest first, each step whole: whatever fails, the log is contiguous.
            while len(self._segments) > keep:
                self._segments[-1].delete()
                self._segments.pop()
                self._bases.pop()
            self._segments[-1].truncate_to(offset)
        except OSError as err:
            self._after_truncation()
            raise storage_error(
                self.topic_partition,
                f"truncation to {offset} (stopped at LEO {self._leo()}) of",
                err,
            ) from err
        # The log first, then the cache: a crash in between leaves cache entries past the LEO,
        # which loading trims, never a batch whose epoch the cache lacks.
        leo = self._after_truncation()
        _log.info(
            "truncated",
            topic=self.topic_partition.topic,
            partition=self.topic_partition.partition,
            offset=offset,
            leo=leo,
            previous_leo=old_leo,
        )
        return True

    def _after_truncation(self) -> int:
        """Bring the cache and the offsets down to the LEO after (part of) a truncation."""
        self._segments[-1].set_active(True)
        leo = self._leo()
        if self._epoch_cache.truncate_from_end(leo):
            self._epochs.persist_after_shrink()
        self._log_start_offset = min(self._log_start_offset, leo)
        self._recovery_point = min(self._recovery_point, leo)
        return leo

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every segment and the epoch cache; the log restarts empty at `offset`.

        On KafkaStorageError the log is consistent but may still hold its oldest segments
        (newest go first); calling again finishes the job.
        """
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot restart {self.topic_partition} at {offset}")
        self._loaded_producer_batches = None
        old_leo = self._leo()
        now = wall_clock_ms()
        try:
            while len(self._segments) > 1:
                self._segments[-1].delete()
                self._segments.pop()
                self._bases.pop()
            only = self._segments[0]
            if only.base_offset == offset:
                # Same file name as the new segment would have: empty this one instead.
                only.truncate_to(offset)
                only.created_ms = now
            else:
                # The new segment exists before the old one goes, so the list is never empty.
                segment = LogSegment.create(
                    self.directory, offset, self.config.index_interval_bytes, now
                )
                try:
                    only.delete()
                except BaseException:
                    segment.discard()
                    raise
                self._segments = [segment]
                self._bases = [offset]
        except OSError as err:
            self._after_truncation()
            raise storage_error(
                self.topic_partition,
                f"restarting at {offset} (stopped at LEO {self._leo()}) of",
                err,
            ) from err
        if self._epoch_cache.clear() or self._epochs.exists():
            self._epochs.persist_after_shrink()
        self._log_start_offset = offset
        self._recovery_point = offset
        _log.info(
            "truncated_fully",
            topic=self.topic_partition.topic,
            partition=self.topic_partition.partition,
            offset=offset,
            previous_leo=old_leo,
        )

    # -- retention ----------------------------------------------------------------------------

    def delete_retention(self, now_ms: int, high_watermark: int) -> list[DeletedSegment]:
        """Delete whole old segments by retention.ms, retention.bytes and the log start offset
        (the first two only when cleanup.policy includes delete, as in Kafka).

        From the oldest segment on, stopping at the first one that may not go. A segment may go
        only if its end (the next segment's base offset, the LEO for the active segment) is <=
        `high_watermark` (the replication core's: nothing at or above it is ever deleted). The
        active segment goes too when it is not empty and its rule takes it (Kafka's
        deletableSegments): retention.ms once its newest record expired, retention.bytes only at
        0, the log start rule never (it needs a next segment). Then an empty active segment is
        rolled at the LEO first (`roll`), so the log keeps one, its offsets carry on and it is
        never rolled again while empty. The log start offset then moves up to the first
        remaining segment.
        """
        deleted: list[DeletedSegment] = []
        # Kafka's deleteOldSegments: retention.ms and retention.bytes only with
        # cleanup.policy delete; the log start rule always.
        delete = self.config.delete
        retention_ms = self.config.retention_ms
        if delete and retention_ms >= 0:
            deleted += self._delete_oldest(
                now_ms,
                high_watermark,
                lambda s, _upper: now_ms - s.largest_timestamp() > retention_ms,
                "retention.ms",
            )
        retention_bytes = self.config.retention_bytes
        if delete and retention_bytes >= 0:
            excess = sum(s.size for s in self._segments) - retention_bytes

            def over_size(segment: LogSegment, _upper: int) -> bool:
                nonlocal excess
                if excess - segment.size >= 0:
                    excess -= segment.size
                    return True
                return False

            deleted += self._delete_oldest(now_ms, high_watermark, over_size, "retention.bytes")
        # Kafka's deleteLogStartOffsetBreachedSegments: a segment goes once the NEXT segment
        # starts at or below the log start. Not its own next offset: a segment the cleaner
        # emptied has next offset == base offset, and its gap still lies above the log start.
        deleted += self._delete_oldest(
            now_ms,
            high_watermark,
            lambda s, upper: s is not self._segments[-1] and upper <= self._log_start_offset,
            "log_start_offset",
        )
        return deleted

    def _delete_oldest(
        self,
        now_ms: int,
        high_watermark: int,
        predicate: Callable[[LogSegment, int], bool],
        reason: str,
    ) -> list[DeletedSegment]:
        count = 0
        last = len(self._segments) - 1
        while count <= last:
            segment = self._segments[count]
            if count == last and segment.size == 0:
                break  # an empty active segment never goes (nor is rolled again)
            upper = self._segments[count + 1].base_offset if count < last else self._leo()
            if high_watermark < upper or not predicate(segment, upper):
                break
            count += 1
        if count == 0:
            return []
        if count > last:
            # Every segment goes, the active one too: roll an empty one at the LEO first, so
            # the log is never without a segment (Kafka's deleteSegments). A crash from here on
            # leaves what an ordinary roll and then part of a retention pass leave.
            self.roll(now_ms)
        result: list[DeletedSegment] = []
        try:
            # Oldest first, each whole: whatever fails, the log is contiguous.
            for _ in range(count):
                segment = self._segments[0]
                segment.delete()
                del self._segments[0]
                del self._bases[0]
                result.append(
                    DeletedSegment(segment.base_offset, segment.next_offset, segment.size, reason)
                )
        except OSError as err:
            self._after_deletion()
            raise storage_error(
                self.topic_partition, f"deleting segments ({reason}) of", err
            ) from err
        self._after_deletion()
        _log.info(
            "segments_deleted",
            topic=self.topic_partition.topic,
            partition=self.topic_partition.partition,
            reason=reason,
            base_offsets=[d.base_offset for d in result],
            log_start_offset=self._log_start_offset,
        )
        return result

    def _after_deletion(self) -> None:
        """Raise the log start to the first remaining segment (after retention)."""
        first_base = self._segments[0].base_offset
        if first_base > self._log_start_offset:
            self._log_start_offset = first_base
            if self._epoch_cache.truncate_from_start(first_base):
                self._epochs.persist_after_shrink()
        self._recovery_point = max(self._recovery_point, first_base)
