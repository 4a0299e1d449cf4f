"""`PartitionLog`: one replica's log on disk (Kafka's UnifiedLog, storage part only).

Does file I/O in the partition dir `<topic>-<partition>/`: the segments (segment.py), the
`leader-epoch-checkpoint` (epoch_checkpoint.py) and nothing else; the three offset checkpoints
of the data dir are the LogManager's. Split by job: loading and recovery (log_loader.py), the
pure half of appends and the roll rules (log_append.py), truncation and retention
(log_deletion.py); this module keeps the state, appends, rolls, reads and flushes.

No replication decision is made here: the high watermark is the replication core's alone
(retention is told it, and a consumer read is bounded by it through `max_offset`), and the
leader epoch to stamp comes in with each leader append.

Invariants:
  * segments are sorted, contiguous (each base offset is the previous segment's end) and
    non-empty except possibly the last (the active segment). A log that may have gaps (its dir
    holds the sticky `.may-have-gaps` marker, `may_have_gaps`: a compacted log or a follower's
    copy of one) relaxes this: a batch or a segment may start above where the previous one
    ended, and a non-active segment may be empty; offsets still only increase. Reads of an
    offset inside a gap serve the next batch; truncation to one keeps the batches below it and
    makes it the LEO;
  * log_start_offset <= leo, and recovery_point <= leo;
  * the epoch cache covers every epoch of the batches in the log at the batch's start offset;
    it is rewritten (atomically) before the first batch of a new epoch is written and after the
    log is truncated, so a crash leaves it a superset of the log's epochs, which loading trims;
    it is fsynced before the recovery point moves, so a power loss can only lose entries at or
    above the recovery point, which loading then learns again from the batches.

Appends validate everything before changing anything: a bad batch raises a typed error
(CorruptRecordError, InvalidRecordError, MessageTooLargeError, RecordListTooLargeError,
UnexpectedAppendOffsetError) and leaves the log, the cache and the files untouched.

Disk failures are all or nothing too. An append whose epoch-cache write, segment roll, `.log`
write, index write or `flush.messages` fsync fails is undone (segments rolled in the call are
removed, the active segment and its indexes are cut back, the epoch cache is restored) and
KafkaStorageError is raised, so a caller may take "raised" to mean "the log is as it was".
Truncation and retention cannot be undone (files are gone): log_deletion.py says how they
fail, one whole step at a time. A failure to rewrite the epoch checkpoint after the log shrank
is only logged (epoch_checkpoint.py).

Concurrency contract: not thread-safe. One owner calls it from one thread (the broker's event
loop; every call is page-cache I/O except `flush`, which fsyncs). `create` may run on a worker
thread: the new log is nobody else's yet.
"""

from __future__ import annotations

import bisect
import os
import pathlib
from collections.abc import Sequence
from dataclasses import dataclass

from minibroker.broker.storage.checkpoint import (
    LEADER_EPOCH_CHECKPOINT,
    format_checkpoint,
    write_new_file,
)
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.epoch_cache import EpochCache, EpochEntry
from minibroker.broker.storage.epoch_checkpoint import EpochCheckpoint, EpochSnapshot
from minibroker.broker.storage.log_append import (
    AppendInfo,
    plan_follower_append,
    plan_leader_append,
    roll_clock,
    should_roll,
    time_waited,
)
from minibroker.broker.storage.log_deletion import DeletedSegment, LogDeletion, storage_error
from minibroker.broker.storage.log_loader import (
    PRODUCER_BATCHES_KEPT,
    NewestBatches,
    load_log,
    write_gaps_marker,
)
from minibroker.broker.storage.segment import AppendEntry, LogSegment, SegmentMark
from minibroker.broker.storage.segment_scan import SCAN_CHUNK
from minibroker.client.batch import BatchHeader, iter_batches
from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.common.log import get_logger
from minibroker.client.errors import KafkaStorageError, OffsetOutOfRangeError
from minibroker.client.types import TopicPartition

_log = get_logger("minibroker.broker.storage")


@dataclass(frozen=True, slots=True)
class ReadInfo:
    """Whole batches read from the log, with the log's offsets at the time of the read.

    `first_offset` is the base offset of the first batch (it may be below `fetch_offset`: the
    batch holding the fetch offset comes whole) or -1 when `records` is empty; `next_offset`
    is the offset after the last batch returned (`fetch_offset` when empty).
    """

    records: bytes
    fetch_offset: int
    first_offset: int
    next_offset: int
    log_start_offset: int
    leo: int


class PartitionLog(LogDeletion):
    """Ordered segments of one partition replica plus its epoch cache and offsets."""

    def __init__(
        self,
        directory: pathlib.Path,
        topic_partition: TopicPartition,
        config: LogConfig,
        segments: list[LogSegment],
        epoch_cache: EpochCache,
        log_start_offset: int,
        recovery_point: int,
        now_ms: int,
        may_have_gaps: bool = False,
    ) -> None:
        self.directory = directory
        self.topic_partition = topic_partition
        self.config = config
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        segments[-1].set_active(True)
        self._epoch_cache = epoch_cache
        self._epochs = EpochCheckpoint(
            epoch_cache, directory / LEADER_EPOCH_CHECKPOINT, topic_partition
        )
        self._log_start_offset = log_start_offset
        self._recovery_point = recovery_point
        self._last_flush_ms = now_ms
        self._closed = False
        self._may_have_gaps = may_have_gaps
        # The topic was compacted while this log was open (update_config).
        self._was_compacted = False
        # What the load's pass over the batches found for the producer state (newest batches
        # of each producer id, oldest first); dropped when handed over or the log changes.
        self._loaded_producer_batches: list[BatchHeader] | None = None

    # -- loading ------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        topic_partition: TopicPartition,
        config: LogConfig,
        now_ms: int,
        *,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        had_clean_shutdown: bool = False,
        system_restarted: bool = False,
    ) -> PartitionLog:
        """Open (or create) the log in `directory`, recovering what an unclean stop left.

        `recovery_point` and `log_start_offset` come from the data dir's checkpoints; the load
        (checks, recovery, the epoch cache rebuilt or trimmed) is log_loader.py's.
        `system_restarted`: the OS may have restarted since the log was last written (its
        unsynced epoch checkpoint may be older than its batches).
        """
        path = pathlib.Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        loaded = load_log(
            path,
            topic_partition,
            config,
            now_ms,
            recovery_point=recovery_point,
            log_start_offset=log_start_offset,
            had_clean_shutdown=had_clean_shutdown,
            system_restarted=system_restarted,
        )
        log = cls(
            path,
            topic_partition,
            config,
            loaded.segments,
            loaded.epoch_cache,
            loaded.log_start_offset,
            loaded.recovery_point,
            now_ms,
            loaded.may_have_gaps,
        )
        log._loaded_producer_batches = loaded.producer_batches
        return log

    @classmethod
    def create(
        cls,
        directory: str | os.PathLike[str],
        topic_partition: TopicPartition,
        config: LogConfig,
        now_ms: int,
        *,
        leader_epoch: int = -1,
    ) -> PartitionLog:
        """A new empty log at offset 0 in `directory`, an empty dir that nothing else uses.

        Creates the first segment's files and, when `leader_epoch` >= 0, the epoch checkpoint
        naming that epoch at offset 0 (what becoming the leader of the new log would write),
        without fsync: the caller makes the dir durable before the log is used
        (LogManager.make_new_logs). Touches nothing shared by other logs (its only segment is
        active, so the descriptor cache is not involved): a worker thread may call it.
        """
        path = pathlib.Path(directory)
        entries = [EpochEntry(leader_epoch, 0)] if leader_epoch >= 0 else []
        if entries:
            write_new_file(path / LEADER_EPOCH_CHECKPOINT, format_checkpoint(entries))
        segment = LogSegment.create(path, 0, config.index_interval_bytes, now_ms)
        return cls(path, topic_partition, config, [segment], EpochCache(entries), 0, 0, now_ms)

    def producer_batch_headers(self) -> list[BatchHeader]:
        """The batches the idempotent-producer state is rebuilt from, oldest first.

        The newest PRODUCER_BATCHES_KEPT batches of each producer id among the batches from
        the log start on; replaying them gives the same state as replaying every batch. Right
        after `open` this is what the load's own pass found, handed over once without reading
        anything; later, or once the log has changed, the log is read.
        """
        loaded, self._loaded_producer_batches = self._loaded_producer_batches, None
        start = self._log_start_offset
        if loaded is not None:
            return [header for header in loaded if header.last_offset >= start]
        newest = NewestBatches()
        offset = start
        while offset < self.leo:
            info = self.read(offset, SCAN_CHUNK)
            if not info.records:
                break
            for _position, header in iter_batches(info.records):
                newest.add(header)
            offset = info.next_offset
        return newest.headers()

    # -- facts --------------------------------------------------------------------------------

    @property
    def leo(self) -> int:
        """Log end offset: the offset the next appended record gets."""
        return self._segments[-1].next_offset

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def recovery_point(self) -> int:
        """Offsets below this are fsynced; recovery after a crash starts here."""
        return self._recovery_point

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return tuple(self._segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def may_have_gaps(self) -> bool:
        """Whether offsets may be missing between batches (the `.may-have-gaps` marker is in
        the partition dir): a cleaned log, or a follower's copy of one. Sticky."""
        return self._may_have_gaps

    def mark_may_have_gaps(self) -> None:
        """Write the `.may-have-gaps` marker (file and dir fsynced) before the first gap can
        reach the log: before a cleaned segment is swapped in, before a follower appends past
        a gap. Idempotent; raises KafkaStorageError, with the log unchanged, on I/O failure."""
        if self._may_have_gaps:
            return
        try:
            write_gaps_marker(self.directory)
        except OSError as err:
            raise self._storage_error("writing the may-have-gaps marker of", err) from err
        self._may_have_gaps = True
        _log.info(
            "log_may_have_gaps",
            topic=self.topic_partition.topic,
            partition=self.topic_partition.partition,
        )

    @property
    def epoch_cache(self) -> EpochCache:
        """Read it freely; change it only through this class, which persists it."""
        return self._epoch_cache

    @property
    def latest_epoch(self) -> int | None:
        return self._epoch_cache.latest_epoch

    @property
    def closed(self) -> bool:
        return self._closed

    # -- the cleaner's swap (broker/cleaner/cleaner.py; files: segment_swap.py) ---------------

    def segments_changed(self, expected: Sequence[tuple[LogSegment, int]]) -> str | None:
        """Why the (segment, size) pairs in `expected` are no longer consecutive non-active
        segments of this open log with those sizes, or None when they still are (what a cleaned
        segment may replace)."""
        if self._closed:
            return "the log is closed"
        if not expected:
            return "no segment to replace"
        first = expected[0][0]
        try:
            i = self._segments.index(first)
        except ValueError:
            return f"segment {first.base_offset} is no longer in the log"
        current = self._segments[i : i + len(expected)]
        if i + len(expected) >= len(self._segments):
            return "the segments to replace reach the active segment"
        for (segment, size), now in zip(expected, current, strict=True):
            if now is not segment:
                return f"segment {segment.base_offset} is no longer in the log"
            if now.size != size:
                return f"segment {segment.base_offset} is {now.size} bytes, was {size}"
        return None

    def replace_segments(self, old: Sequence[LogSegment], new: LogSegment) -> None:
        """Put `new` (a cleaned segment, its files already under their final names) in the
        place of `old` in the segment list: memory only, the cleaner's swap did the files. `old`
        must be consecutive non-active segments of this log and `new` start at the first one's
        base offset (ValueError otherwise, nothing changed)."""
        problem = self.segments_changed([(s, s.size) for s in old])
        if problem is not None:
            raise ValueError(f"cannot replace segments of {self.topic_partition}: {problem}")
        if new.base_offset != old[0].base_offset:
            raise ValueError(
                f"cleaned segment {new.base_offset} cannot replace segment {old[0].base_offset}"
            )
        i = self._segments.index(old[0])
        self._segments[i : i + len(old)] = [new]
        self._bases[i : i + len(old)] = [new.base_offset]
        new.set_active(False)
        self._loaded_producer_batches = None

    def update_config(self, config: LogConfig) -> None:
        """New topic configs apply to the next append, roll, retention and flush decision.

        A compacted topic altered to delete keeps the gaps its leader's cleaner made, which its
        followers still have to append past: the log takes the gaps marker (and accepts gaps
        from then on, after a restart too). Should writing it fail, the log still accepts gaps
        until it closes (a follower append past one writes the marker first, or fails)."""
        if self.config.compact and not config.compact:
            self._was_compacted = True
            try:
                self.mark_may_have_gaps()
            except KafkaStorageError as err:
                _log.error(
                    "gaps_marker_write_failed",
                    topic=self.topic_partition.topic,
                    partition=self.topic_partition.partition,
                    error=str(err),
                )
        self.config = config

    # -- epoch cache --------------------------------------------------------------------------

    def maybe_assign_epoch_start_offset(self, leader_epoch: int, start_offset: int) -> bool:
        """Record (epoch, start offset) in the cache; a new leader calls it with its LEO
        (KIP-279). The file follows before the first batch is written (no batch can carry the
        epoch before that), at a flush or at close, whichever comes first: a broker taking
        over thousands of leaderships writes nothing for them until they are written to
        (epoch_checkpoint.py)."""
        if not self._epoch_cache.assign(leader_epoch, start_offset):
            return False
        self._epochs.dirty = True
        return True

    def _storage_error(self, what: str, err: OSError) -> KafkaStorageError:
        return storage_error(self.topic_partition, what, err)

    # -- appends ------------------------------------------------------------------------------

    def append_as_leader(
        self,
        records: bytes | bytearray | memoryview,
        leader_epoch: int,
        now_ms: int,
        max_message_bytes: int | None = None,
        validated: list[tuple[int, BatchHeader]] | None = None,
    ) -> AppendInfo:
        """Validate a produce request's batches, assign offsets from the LEO, stamp the epoch.

        One write (two when the batches straddle a segment roll). `max_message_bytes` defaults
        to the topic's `max.message.bytes`. `validated` is what `validate_producer_batches`
        returned for these same bytes and limit, when the caller already ran it (the broker
        does, for its idempotence check): the CRC pass is then not repeated. A disk failure
        raises KafkaStorageError with the log as it was (module docstring).
        """
        plan = plan_leader_append(
            records,
            leader_epoch,
            now_ms,
            self.config,
            self.leo,
            self._epoch_cache.latest_entry,
            self._log_start_offset,
            max_message_bytes,
            validated,
        )
        self._append(plan.data, plan.entries, plan.max_timestamp, now_ms, plan.new_epochs)
        return plan.info

    def append_as_follower(
        self, records: bytes | bytearray | memoryview, now_ms: int | None = None
    ) -> AppendInfo:
        """Append the leader's batches as they are: offsets and epochs kept, CRCs checked.

        The first batch must start exactly at the LEO and each batch right after the previous
        one (UnexpectedAppendOffsetError otherwise), unless the topic is compacted or the log
        may have gaps already: then a batch may start above that, never below (Kafka's rule for
        a cleaned leader log), and the gaps marker is written (durably) before the first batch
        past a gap. Each new batch epoch goes into the epoch cache at the batch's base offset.
        `now_ms` (default: the wall clock) drives segment.ms. A disk failure raises
        KafkaStorageError with the log as it was (module docstring).
        """
        now = wall_clock_ms() if now_ms is None else now_ms
        if len(records) == 0:
            return AppendInfo(-1, -1, -1, -1, self._log_start_offset, 0, 0, (), -1)
        plan = plan_follower_append(
            records,
            self.topic_partition,
            self.leo,
            self._epoch_cache.latest_epoch,
            self._log_start_offset,
            allow_gaps=self.config.compact or self._may_have_gaps or self._was_compacted,
        )
        if plan.has_gap:
            self.mark_may_have_gaps()
        self._append(plan.data, plan.entries, plan.max_timestamp, now, plan.new_epochs)
        return plan.info

    def _append(
        self,
        data: bytes | bytearray | memoryview,
        entries: Sequence[AppendEntry],
        max_timestamp: int,
        now_ms: int,
        new_epochs: Sequence[tuple[int, int]],
    ) -> None:
        """The changing half of both appends, all or nothing (see the module docstring).

        Order: the epoch checkpoint before the first batch of a new epoch (KIP-279), then the
        batches, then the `flush.messages` fsync. Any failure undoes every step.
        """
        self._loaded_producer_batches = None
        if self._epochs.dirty:
            try:
                self._epochs.persist()
            except OSError as err:
                raise self._storage_error("rewriting the leader epoch checkpoint of", err) from err
        segment_count = len(self._segments)
        active_mark = self._segments[-1].mark()
        cache_before = self._epochs.snapshot() if new_epochs else None
        try:
            cache_changed = False
            for epoch, start_offset in new_epochs:
                cache_changed = self._epoch_cache.assign(epoch, start_offset) or cache_changed
            if cache_changed:
                self._epochs.persist()
            self._write(data, entries, max_timestamp, now_ms)
            if self.leo - self._recovery_point >= self.config.flush_messages:
                self.flush(now_ms)
        except BaseException as err:
            self._undo_append(segment_count, active_mark, cache_before)
            if isinstance(err, OSError):
                raise self._storage_error("append to", err) from err
            raise

    def _undo_append(
        self,
        segment_count: int,
        active_mark: SegmentMark,
        cache_before: EpochSnapshot | None,
    ) -> None:
        """Return to the state `_append` started from. Never raises (each step is best effort
        and logs what it could not do)."""
        for segment in self._segments[segment_count:]:
            segment.discard()
        del self._segments[segment_count:]
        del self._bases[segment_count:]
        self._segments[-1].set_active(True)
        self._segments[-1].rollback(active_mark)
        if cache_before is not None:
            self._epochs.restore(cache_before)
        _log.warning(
            "append_undone",
            topic=self.topic_partition.topic,
            partition=self.topic_partition.partition,
            leo=self.leo,
        )

    def _write(
        self,
        data: bytes | bytearray | memoryview,
        entries: Sequence[AppendEntry],
        max_timestamp: int,
        now_ms: int,
    ) -> None:
        """Write validated batches, rolling first when Kafka's roll rules say so.

        Time rolls compare `roll_clock` times (segment.py), not raw timestamps.
        """
        active = self._segments[-1]
        total = len(data)
        config = self.config
        clock = roll_clock(max_timestamp, now_ms, config.retention_ms)
        first_clock: int | None = None
        if active.size == 0:
            first_clock = roll_clock(entries[0][3], now_ms, config.retention_ms)
            waited = time_waited(active, now_ms, clock, first_clock)
            fits = (
                total <= config.segment_bytes
                and waited <= config.segment_ms
                and active.can_hold_offset(entries[-1][2])
            )
        else:
            fits = not should_roll(active, config, now_ms, total, clock, entries[-1][2])
        if fits:
            # The common case: everything goes to the active segment in one write.
            active.append(data, entries, first_clock)
        else:
            self._write_runs(memoryview(data), entries, now_ms)

    def _write_runs(self, view: memoryview, entries: Sequence[AppendEntry], now_ms: int) -> None:
        """The general case: roll first, and split an append bigger than a segment.

        Kafka's LogSegment.shouldRoll (docs/design.md §4.4), with the time rule applied per batch:
        a batch whose clock is more than segment.ms past the segment's clock start begins the
        next segment and starts its clock, so every time roll moves the clock forward.
        """
        config = self.config
        segment_bytes = config.segment_bytes
        clocks = [roll_clock(e[3], now_ms, config.retention_ms) for e in entries]
        end = entries[-1][0] + entries[-1][1]
        i = 0
        while i < len(entries):
            active = self._segments[-1]
            start = entries[i][0]
            if should_roll(active, config, now_ms, end - start, clocks[i], entries[-1][2]):
                self._roll(_base_offset(view, start), now_ms)
                active = self._segments[-1]
            j = len(entries)
            if active.size + end - start > segment_bytes:
                # More than a whole segment in one append (a follower's big fetch): fill this
                # segment, then roll for the rest. A single oversized batch goes alone.
                j = i + 1
                while j < len(entries) and entries[j][0] + entries[j][1] - start <= segment_bytes:
                    j += 1
            for k in range(i + 1, j):
                if time_waited(active, now_ms, clocks[k], clocks[i]) > config.segment_ms:
                    j = k
                    break
            run_end = entries[j - 1][0] + entries[j - 1][1]
            run = [(p - start, size, last, ts) for p, size, last, ts in entries[i:j]]
            active.append(view[start:run_end], run, clocks[i])
            i = j

    def _roll(self, new_base_offset: int, now_ms: int) -> LogSegment:
        """Start a segment at `new_base_offset`; on failure the segment list is unchanged."""
        old = self._segments[-1]
        old.on_become_inactive()
        segment = LogSegment.create(
            self.directory, new_base_offset, self.config.index_interval_bytes, now_ms
        )
        self._segments.append(segment)
        self._bases.append(new_base_offset)
        old.set_active(False)
        _log.info(
            "segment_rolled",
            topic=self.topic_partition.topic,
            partition=self.topic_partition.partition,
            base_offset=new_base_offset,
            previous_base_offset=old.base_offset,
            previous_size_bytes=old.size,
        )
        return segment

    def roll(self, now_ms: int) -> LogSegment:
        """Start a new active segment at the LEO now (no-op when the active one is empty).

        On failure (KafkaStorageError) the log keeps its active segment.
        """
        if self._segments[-1].size == 0:
            return self._segments[-1]
        try:
            return self._roll(self.leo, now_ms)
        except OSError as err:
            raise self._storage_error("rolling a segment of", err) from err

    # -- reads --------------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        max_offset: int | None = None,
        min_one_batch: bool = True,
    ) -> ReadInfo:
        """Whole batches from the one holding `offset`, up to `max_bytes` (KIP-74: at least one).

        Only batches whose last offset is below `max_offset` (the HW for consumers; None: the
        LEO). Reads stay inside one segment, as Kafka's do; the next read continues.
        Raises OffsetOutOfRangeError when `offset` is below the log start or above the LEO.
        """
        leo = self.leo
        if offset < self._log_start_offset or offset > leo:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for {self.topic_partition}: "
                f"log start {self._log_start_offset}, log end {leo}"
            )
        upper = leo if max_offset is None else min(max_offset, leo)
        empty = ReadInfo(b"", offset, -1, offset, self._log_start_offset, leo)
        if offset >= upper:
            return empty
        i = max(bisect.bisect_right(self._bases, offset) - 1, 0)
        for segment in self._segments[i:]:
            if upper >= segment.next_offset:
                max_position = segment.size
            else:
                max_position = segment.position_of(upper)
            result = segment.read(offset, max_bytes, max_position, min_one_batch)
            if result is None:
                continue
            data, first, next_offset = result
            if not data:
                return empty
            return ReadInfo(
                data,
                offset,
                first.base_offset,
                next_offset,
                self._log_start_offset,
                leo,
            )
        return empty

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first batch with maxTimestamp >= `timestamp`, or None.

        Batch granularity (the broker never decodes records): the offset is that batch's first
        offset (at least the log start) and the timestamp its maxTimestamp. ListOffsets' HW
        limit is the caller's to apply.
        """
        for segment in self._segments:
            if segment.max_timestamp_so_far >= timestamp:
                found = segment.find_offset_by_timestamp(timestamp, self._log_start_offset)
                if found is not None:
                    return found
        return None

    # -- the log start, raised by the replication layer ------------------------------------------

    def maybe_increment_log_start_offset(self, new_log_start_offset: int) -> bool:
        """Raise the log start (a follower copies its leader's); segments below it go at the
        next `delete_retention`. It may not pass the LEO (OffsetOutOfRangeError). Keeping it at
        or below the high watermark is the caller's rule: the replication core asks only for
        offsets up to its HW."""
        leo = self.leo
        if new_log_start_offset > leo:
            raise OffsetOutOfRangeError(
                f"cannot raise the log start of {self.topic_partition} to "
                f"{new_log_start_offset}: above the log end offset {leo}"
            )
        if new_log_start_offset <= self._log_start_offset:
            return False
        self._log_start_offset = new_log_start_offset
        if self._epoch_cache.truncate_from_start(new_log_start_offset):
            self._epochs.persist_after_shrink()
        _log.info(
            "log_start_offset_incremented",
            topic=self.topic_partition.topic,
            partition=self.topic_partition.partition,
            log_start_offset=new_log_start_offset,
        )
        return True

    # -- durability ---------------------------------------------------------------------------

    def flush(self, now_ms: int | None = None) -> None:
        """fsync every segment holding offsets at or above the recovery point; advance it.

        On failure (KafkaStorageError) the recovery point stays where it was.
        """
        leo = self.leo
        try:
            for segment in self._segments:
                if segment.next_offset > self._recovery_point or segment is self._segments[-1]:
                    segment.flush()
            # Loading trusts the epoch checkpoint below the recovery point only: it must be
            # durable before the recovery point moves (epoch_checkpoint.py).
            self._epochs.sync()
        except OSError as err:
            raise self._storage_error("flushing", err) from err
        self._recovery_point = leo
        self._last_flush_ms = wall_clock_ms() if now_ms is None else now_ms

    def maybe_flush(self, now_ms: int) -> bool:
        """Flush when `flush.messages` offsets or `flush.ms` have passed since the last flush."""
        unflushed = self.leo - self._recovery_point
        if unflushed <= 0:
            return False
        if (
            unflushed >= self.config.flush_messages
            or now_ms - self._last_flush_ms >= self.config.flush_ms
        ):
            self.flush(now_ms)
            return True
        return False

    def close(self) -> None:
        """Close the files (no fsync: call `flush` first for a clean shutdown).

        Every segment is closed even when one fails; the first failure is raised after.
        """
        if self._closed:
            return
        self._closed = True
        failure: BaseException | None = None
        if self._epochs.dirty:
            self._epochs.persist_after_shrink()
        for segment in self._segments:
            try:
                segment.close()
            except BaseException as err:
                failure = failure or err
        if failure is not None:
            raise failure

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.topic_partition}, log_start={self._log_start_offset}, "
            f"leo={self.leo}, segments={len(self._segments)})"
        )


def _base_offset(view: memoryview, position: int) -> int:
    return int.from_bytes(view[position : position + 8], "big", signed=True)


__all__ = [
    "PRODUCER_BATCHES_KEPT",
    "AppendInfo",
    "DeletedSegment",
    "EpochEntry",
    "PartitionLog",
    "ReadInfo",
]
