"""Which log the cleaner cleans, over what range, and what a rewrite keeps (Kafka's rules).

Pure: no I/O, no clock (callers pass `now_ms`). Over small frozen dataclasses that the cleaner's
I/O side fills in from a `PartitionLog` (segment base offsets, sizes, timestamps, the cleaner
checkpoint) and from the batches it reads.

From Kafka's LogCleanerManager (core/src/main/scala/kafka/log/LogCleanerManager.scala):
  * `cleanable_offsets`: the first dirty offset is the cleaner checkpoint, reset to the log start
    when the checkpoint lies below the log start or above the log end (then the checkpoint must
    be rewritten: `force_update_checkpoint`); the first uncleanable offset is the least of the
    upper bound (Kafka: the last stable offset, here the HW), the active segment's base offset
    and, with `min.compaction.lag.ms` > 0, the base of the first dirty non-active segment whose
    largest timestamp is newer than now - lag; never below the first dirty offset.
  * `max_compaction_delay`: how far past `max.compaction.lag.ms` the earliest dirty non-active
    segment's first batch timestamp is (0 when not past, or when no timestamp is known).
  * `LogToClean`: clean bytes (the segments below the first dirty offset), cleanable bytes (from
    the first dirty offset up to the segment holding the uncleanable offset), the dirty ratio
    cleanable / (clean + cleanable).
  * `grab_filthiest_compacted_log`: among compacted logs not in progress and not uncleanable,
    with any bytes, those whose ratio exceeds `min.cleanable.dirty.ratio` or that
    `max.compaction.lag.ms` forces (with cleanable bytes); the one with the largest ratio wins.

From Kafka's Cleaner (core/src/main/scala/kafka/log/LogCleaner.scala):
  * `add_batch_to_offset_map`: the per-batch step of buildOffsetMap (stop at the load factor).
  * `group_segments_by_size`: consecutive segments merge into one rewritten segment while the
    group's log bytes stay within `segment.bytes`, its offset and time index bytes within
    `segment.index.bytes`, and its offsets within an int32 of the group's first base offset.
  * `should_retain_record`: a record above the map's latest offset is past this round and kept;
    otherwise a record without a key is dropped, and a keyed record is kept only when its offset
    is the latest for its key and it has a value or it is a tombstone whose batch's delete
    horizon has not passed. The horizon (`delete_horizon_for`) is set when a batch holding a
    tombstone is first cleaned: that clean's time + `delete.retention.ms` (Kafka's v2 rule in
    MemoryRecords.filterTo), so a tombstone outlives its first cleaning by delete.retention.ms.
  * `batch_retention` / `filter_batch`: a batch that loses all its records is dropped, except
    that it is kept as an empty batch (header only, its producer id, epoch, sequences and offset
    range intact) when it holds the last data offset of a producer whose state is still needed,
    or when it ends the cleaning round (its next offset is the round's upper bound), so that the
    last offset is not lost. minibroker has no transactions: no control or aborted batches.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from minibroker.broker.cleaner.offset_map import OffsetMap
from minibroker.client.types import TopicPartition

# Kafka's topic-level names and defaults (LogConfig / TopicConfig), not wired into the broker yet.
CLEANUP_POLICY_COMPACT = "compact"
CLEANUP_POLICY_DELETE = "delete"
MIN_CLEANABLE_DIRTY_RATIO_CONFIG = "min.cleanable.dirty.ratio"
DEFAULT_MIN_CLEANABLE_DIRTY_RATIO = 0.5
MIN_COMPACTION_LAG_MS_CONFIG = "min.compaction.lag.ms"
DEFAULT_MIN_COMPACTION_LAG_MS = 0
MAX_COMPACTION_LAG_MS_CONFIG = "max.compaction.lag.ms"
DEFAULT_MAX_COMPACTION_LAG_MS = 2**63 - 1  # Long.MAX_VALUE
DELETE_RETENTION_MS_CONFIG = "delete.retention.ms"
DEFAULT_DELETE_RETENTION_MS = 86_400_000  # one day
SEGMENT_INDEX_BYTES_CONFIG = "segment.index.bytes"
DEFAULT_SEGMENT_INDEX_BYTES = 10 * 1024 * 1024
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024  # minibroker's segment.bytes (Kafka: 1 GiB)
# Offsets in a segment's indexes are int32s relative to its base offset (client/log_format.py).
RELATIVE_OFFSET_MAX = 2**31 - 1
NO_TIMESTAMP = -1


def policies(cleanup_policy: str) -> frozenset[str]:
    """`cleanup.policy` ("delete", "compact", "compact,delete") as a set of its words."""
    return frozenset(p.strip() for p in cleanup_policy.split(",") if p.strip())


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """The topic settings the cleaner reads, with Kafka's defaults."""

    cleanup_policy: str = CLEANUP_POLICY_DELETE
    min_cleanable_dirty_ratio: float = DEFAULT_MIN_CLEANABLE_DIRTY_RATIO
    min_compaction_lag_ms: int = DEFAULT_MIN_COMPACTION_LAG_MS
    max_compaction_lag_ms: int = DEFAULT_MAX_COMPACTION_LAG_MS
    delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    segment_index_bytes: int = DEFAULT_SEGMENT_INDEX_BYTES

    @property
    def compact(self) -> bool:
        return CLEANUP_POLICY_COMPACT in policies(self.cleanup_policy)

    @property
    def delete(self) -> bool:
        return CLEANUP_POLICY_DELETE in policies(self.cleanup_policy)


@dataclass(frozen=True, slots=True)
class SegmentFacts:
    """One segment as the cleaner sees it. Timestamps in ms; NO_TIMESTAMP (-1) when unknown."""

    base_offset: int
    size_bytes: int
    largest_timestamp: int = NO_TIMESTAMP
    first_batch_timestamp: int = NO_TIMESTAMP
    offset_index_bytes: int = 0
    time_index_bytes: int = 0


@dataclass(frozen=True, slots=True)
class LogFacts:
    """One partition's log: its segments by base offset, the last one active (never cleaned).

    `checkpoint` is the cleaner checkpoint (the first offset not yet cleaned), None when the log
    was never cleaned; `upper_bound` is the offset the cleaner must stay below (the HW; Kafka:
    the last stable offset)."""

    topic_partition: TopicPartition
    config: CompactionConfig
    log_start_offset: int
    log_end_offset: int
    segments: tuple[SegmentFacts, ...]
    upper_bound: int
    checkpoint: int | None = None

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError(f"{self.topic_partition}: a log has at least its active segment")
        bases = [s.base_offset for s in self.segments]
        if bases != sorted(set(bases)):
            raise ValueError(f"{self.topic_partition}: segment base offsets not increasing")

    @property
    def active_segment(self) -> SegmentFacts:
        return self.segments[-1]


def log_segments(
    segments: Sequence[SegmentFacts], from_offset: int, to_offset: int
) -> list[SegmentFacts]:
    """The segments holding offsets in [from_offset, to_offset): from the one whose base is the
    greatest <= from_offset (or the first) to the last with base < to_offset (Kafka's
    LogSegments.values(from, to))."""
    if from_offset == to_offset:
        return []
    if to_offset < from_offset:
        raise ValueError(f"invalid segment range [{from_offset}, {to_offset})")
    floor = None
    for i, s in enumerate(segments):
        if s.base_offset <= from_offset:
            floor = i
    start = 0 if floor is None else floor
    return [s for s in segments[start:] if s.base_offset < to_offset]


def non_active_segments_from(
    segments: Sequence[SegmentFacts], from_offset: int
) -> list[SegmentFacts]:
    """Kafka's nonActiveLogSegmentsFrom: `log_segments(from, active base)`, empty past it."""
    active = segments[-1].base_offset
    if from_offset > active:
        return []
    return log_segments(segments, from_offset, active)


@dataclass(frozen=True, slots=True)
class OffsetsToClean:
    """[first_dirty_offset, first_uncleanable_dirty_offset) may be cleaned; when
    `force_update_checkpoint`, the checkpoint was invalid and should be reset to
    first_dirty_offset."""

    first_dirty_offset: int
    first_uncleanable_dirty_offset: int
    force_update_checkpoint: bool = False


def cleanable_offsets(log: LogFacts, now_ms: int) -> OffsetsToClean:
    """The range of dirty offsets that may be cleaned now (Kafka's cleanableOffsets)."""
    checkpoint = log.log_start_offset if log.checkpoint is None else log.checkpoint
    if checkpoint < log.log_start_offset or checkpoint > log.log_end_offset:
        first_dirty, force = log.log_start_offset, True
    else:
        first_dirty, force = checkpoint, False

    bounds = [log.upper_bound, log.active_segment.base_offset]
    lag = max(log.config.min_compaction_lag_ms, 0)
    if lag > 0:
        for s in non_active_segments_from(log.segments, first_dirty):
            if s.largest_timestamp > now_ms - lag:
                bounds.append(s.base_offset)
                break
    return OffsetsToClean(first_dirty, max(first_dirty, min(bounds)), force)


def max_compaction_delay(log: LogFacts, first_dirty_offset: int, now_ms: int) -> int:
    """How many ms the earliest dirty non-active segment is past `max.compaction.lag.ms`, by its
    first batch's timestamp (segments without one are left out); 0 when none is past it."""
    stamps = [
        s.first_batch_timestamp
        for s in non_active_segments_from(log.segments, first_dirty_offset)
        if s.first_batch_timestamp > 0
    ]
    if not stamps:
        return 0
    clean_until = now_ms - max(log.config.max_compaction_lag_ms, 0)
    earliest = min(stamps)
    return clean_until - earliest if earliest < clean_until else 0


def calculate_cleanable_bytes(
    log: LogFacts, first_dirty_offset: int, uncleanable_offset: int
) -> tuple[int, int]:
    """(first uncleanable offset, cleanable bytes): the uncleanable offset rounded to the base of
    the first non-active segment at or below it (or the active segment's base), and the bytes of
    the segments from the first dirty offset up to that base (Kafka's calculateCleanableBytes)."""
    following = non_active_segments_from(log.segments, uncleanable_offset)
    first_uncleanable = (following[0] if following else log.active_segment).base_offset
    cleanable = log_segments(
        log.segments, min(first_dirty_offset, first_uncleanable), first_uncleanable
    )
    return first_uncleanable, sum(s.size_bytes for s in cleanable)


@dataclass(frozen=True, slots=True)
class LogToClean:
    """A log with its cleanable range and dirty ratio (Kafka's LogToClean)."""

    log: LogFacts
    first_dirty_offset: int
    uncleanable_offset: int
    need_compaction_now: bool = False
    force_update_checkpoint: bool = False
    clean_bytes: int = field(init=False)
    first_uncleanable_offset: int = field(init=False)
    cleanable_bytes: int = field(init=False)

    def __post_init__(self) -> None:
        clean = log_segments(self.log.segments, -1, self.first_dirty_offset)
        object.__setattr__(self, "clean_bytes", sum(s.size_bytes for s in clean))
        first_uncleanable, cleanable = calculate_cleanable_bytes(
            self.log, self.first_dirty_offset, self.uncleanable_offset
        )
        object.__setattr__(self, "first_uncleanable_offset", first_uncleanable)
        object.__setattr__(self, "cleanable_bytes", cleanable)

    @property
    def topic_partition(self) -> TopicPartition:
        return self.log.topic_partition

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        """Dirty bytes over all bytes up to the first uncleanable segment (0.0 for none)."""
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def due(self) -> bool:
        """Worth a cleaning round: above its `min.cleanable.dirty.ratio`, or forced by
        `max.compaction.lag.ms` and with something to clean."""
        return (
            self.need_compaction_now and self.cleanable_bytes > 0
        ) or self.cleanable_ratio > self.log.config.min_cleanable_dirty_ratio


def log_to_clean(log: LogFacts, now_ms: int) -> tuple[LogToClean, int]:
    """The log's `LogToClean` now, and its compaction delay (ms past max.compaction.lag.ms)."""
    offsets = cleanable_offsets(log, now_ms)
    delay = max_compaction_delay(log, offsets.first_dirty_offset, now_ms)
    ltc = LogToClean(
        log,
        offsets.first_dirty_offset,
        offsets.first_uncleanable_dirty_offset,
        need_compaction_now=delay > 0,
        force_update_checkpoint=offsets.force_update_checkpoint,
    )
    return ltc, delay


@dataclass(frozen=True, slots=True)
class CleanerChoice:
    """What `grab_filthiest_compacted_log` found: the log to clean (None: nothing due), the
    largest dirty ratio among candidates (Kafka's max-dirty-percent gauge), the largest
    compaction delay, how many logs were due, and checkpoints to reset (invalid ones)."""

    filthiest: LogToClean | None
    max_dirty_ratio: float
    max_compaction_delay_ms: int
    delayed_logs: int
    cleanable_logs: int
    checkpoint_resets: tuple[tuple[TopicPartition, int], ...]


def grab_filthiest_compacted_log(
    logs: Iterable[LogFacts],
    now_ms: int,
    in_progress: Collection[TopicPartition] = (),
    uncleanable: Collection[TopicPartition] = (),
) -> CleanerChoice:
    """The compacted log to clean next (Kafka's grabFilthiestCompactedLog, without the locking:
    the caller marks the chosen log in progress)."""
    candidates: list[LogToClean] = []
    resets: list[tuple[TopicPartition, int]] = []
    max_delay = 0
    delayed = 0
    for log in logs:
        tp = log.topic_partition
        if not log.config.compact or tp in in_progress or tp in uncleanable:
            continue
        ltc, delay = log_to_clean(log, now_ms)
        if ltc.force_update_checkpoint:
            resets.append((tp, ltc.first_dirty_offset))
        max_delay = max(max_delay, delay)
        delayed += delay > 0
        if ltc.total_bytes > 0:  # Kafka skips empty logs (here their ratio is 0.0 anyway)
            candidates.append(ltc)
    max_ratio = max((c.cleanable_ratio for c in candidates), default=0.0)
    due = [c for c in candidates if c.due]
    filthiest = None
    for c in due:  # the first of equal ratios wins, as Scala's max does
        if filthiest is None or c.cleanable_ratio > filthiest.cleanable_ratio:
            filthiest = c
    return CleanerChoice(filthiest, max_ratio, max_delay, delayed, len(due), tuple(resets))


# --- Rewriting -----------------------------------------------------------------------------------


def group_segments_by_size(
    segments: Sequence[SegmentFacts],
    max_size: int,
    max_index_size: int,
    first_uncleanable_offset: int,
) -> list[list[SegmentFacts]]:
    """Cut `segments` into runs that each become one cleaned segment (Kafka's
    groupSegmentsBySize): a run grows while its log bytes stay <= max_size, its offset index
    bytes and its time index bytes each <= max_index_size, and (for a non-empty next segment)
    the next segment's last offset stays within an int32 of the run's last base offset. The
    next segment's last offset is estimated as the following segment's base - 1, or
    first_uncleanable_offset - 1 for the last one."""
    groups: list[list[SegmentFacts]] = []
    i, n = 0, len(segments)
    while i < n:
        group = [segments[i]]
        log_size = segments[i].size_bytes
        index_size = segments[i].offset_index_bytes
        time_index_size = segments[i].time_index_bytes
        i += 1
        while i < n:
            nxt = segments[i]
            last_offset = (
                segments[i + 1].base_offset - 1 if i + 1 < n else first_uncleanable_offset - 1
            )
            if not (
                log_size + nxt.size_bytes <= max_size
                and index_size + nxt.offset_index_bytes <= max_index_size
                and time_index_size + nxt.time_index_bytes <= max_index_size
                and (
                    nxt.size_bytes == 0
                    or last_offset - group[-1].base_offset <= RELATIVE_OFFSET_MAX
                )
            ):
                break
            group.append(nxt)
            log_size += nxt.size_bytes
            index_size += nxt.offset_index_bytes
            time_index_size += nxt.time_index_bytes
            i += 1
        groups.append(group)
    return groups


def add_batch_to_offset_map(
    offset_map: OffsetMap,
    batch: BatchFacts,
    records: Iterable[RecordFacts],
    start_offset: int,
) -> bool:
    """Put one batch's keyed records at or above `start_offset` (the first dirty offset) into
    the map; True when the map reached its load factor first (Kafka's buildOffsetMapForSegment:
    the round then covers up to the last record put, `offset_map.latest_offset`, and the caller
    stops reading). A batch read to its end moves `latest_offset` to its last offset (records
    without keys, and offsets compacted away, are covered too). At the end of each segment
    read whole the caller calls `offset_map.update_latest_offset(next segment's base - 1)`,
    as Kafka does, to cover a gap at the segment's end."""
    for r in records:
        if r.key is not None and r.offset >= start_offset:
            if offset_map.full:
                return True
            offset_map.put(r.key, r.offset)
    if batch.last_offset >= start_offset:
        offset_map.update_latest_offset(batch.last_offset)
    return False


class OffsetLookup(Protocol):
    """What the retention rules read from the offset map (offset_map.OffsetMap)."""

    @property
    def latest_offset(self) -> int: ...

    def get(self, key: bytes) -> int: ...


def should_retain_record(
    offset_map: OffsetLookup,
    offset: int,
    key: bytes | None,
    has_value: bool,
    delete_horizon_ms: int | None,
    now_ms: int,
) -> bool:
    """Whether a cleaning round keeps this record (Kafka's Cleaner.shouldRetainRecord, v2).

    `delete_horizon_ms` is the record's batch's delete horizon, None while the batch has none
    (it was never cleaned with a tombstone in it)."""
    if offset > offset_map.latest_offset:
        return True  # past what this round covered: untouched
    if key is None:
        return False  # a compacted log's records have keys; Kafka drops (and counts) others
    if offset < offset_map.get(key):
        return False  # a later record of the key is in the map
    return has_value or delete_horizon_ms is None or now_ms < delete_horizon_ms


def delete_horizon_for(
    batch_delete_horizon_ms: int | None,
    retains_tombstone: bool,
    now_ms: int,
    delete_retention_ms: int,
) -> int | None:
    """The delete horizon a rewritten batch carries: set to now + delete.retention.ms the first
    time the batch is cleaned with a tombstone kept in it, unchanged afterwards (Kafka's
    MemoryRecords.filterTo)."""
    if batch_delete_horizon_ms is None and retains_tombstone:
        return now_ms + delete_retention_ms
    return batch_delete_horizon_ms


class BatchRetention(enum.Enum):
    """Kafka's RecordFilter.BatchRetention (without DELETE, which only aborted batches get)."""

    DELETE_EMPTY = "delete_empty"  # dropped when no record is kept
    RETAIN_EMPTY = "retain_empty"  # kept as an empty batch when no record is kept


@dataclass(frozen=True, slots=True)
class BatchFacts:
    """One record batch's header fields the rules read. producer_id -1: not idempotent."""

    base_offset: int
    last_offset: int
    producer_id: int = -1
    delete_horizon_ms: int | None = None

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


@dataclass(frozen=True, slots=True)
class RecordFacts:
    offset: int
    key: bytes | None
    has_value: bool = True


def batch_retention(
    batch: BatchFacts,
    last_data_offsets: Mapping[int, int],
    upper_bound_offset_of_round: int,
) -> BatchRetention:
    """Whether a batch that loses all its records stays as an empty batch (Kafka's
    checkBatchRetention without transactions): yes when it holds the last data offset of an
    active producer (`last_data_offsets`: producer id -> last offset of its last batch, for the
    producers whose state the log must keep), or when it ends the cleaning round."""
    if batch.producer_id >= 0 and last_data_offsets.get(batch.producer_id) == batch.last_offset:
        return BatchRetention.RETAIN_EMPTY
    if batch.next_offset == upper_bound_offset_of_round:
        return BatchRetention.RETAIN_EMPTY
    return BatchRetention.DELETE_EMPTY


class BatchAction(enum.Enum):
    KEEP = "keep"  # written back byte for byte
    REWRITE = "rewrite"  # written back with `retained` only (and `delete_horizon_ms`)
    EMPTY = "empty"  # written back as a header without records
    DROP = "drop"


@dataclass(frozen=True, slots=True)
class BatchDecision:
    action: BatchAction
    retained: tuple[RecordFacts, ...]
    delete_horizon_ms: int | None


def filter_batch(
    batch: BatchFacts,
    records: Sequence[RecordFacts],
    offset_map: OffsetLookup,
    now_ms: int,
    delete_retention_ms: int,
    last_data_offsets: Mapping[int, int],
    upper_bound_offset_of_round: int,
) -> BatchDecision:
    """What a cleaning round writes for one batch (Kafka's MemoryRecords.filterTo for one v2
    batch): its kept records, whether the bytes can be copied as they are, and the delete
    horizon the written batch carries. A rewritten batch keeps its base and last offsets,
    producer id, epoch and base sequence (the writer's job). `upper_bound_offset_of_round` is
    what Kafka passes there: the round's first uncleanable offset."""
    retained = tuple(
        r
        for r in records
        if should_retain_record(
            offset_map, r.offset, r.key, r.has_value, batch.delete_horizon_ms, now_ms
        )
    )
    if retained:
        horizon = delete_horizon_for(
            batch.delete_horizon_ms,
            any(not r.has_value for r in retained),
            now_ms,
            delete_retention_ms,
        )
        unchanged = len(retained) == len(records) and horizon == batch.delete_horizon_ms
        return BatchDecision(
            BatchAction.KEEP if unchanged else BatchAction.REWRITE, retained, horizon
        )
    if batch_retention(batch, last_data_offsets, upper_bound_offset_of_round) is (
        BatchRetention.RETAIN_EMPTY
    ):
        return BatchDecision(BatchAction.EMPTY, (), batch.delete_horizon_ms)
    return BatchDecision(BatchAction.DROP, (), batch.delete_horizon_ms)
