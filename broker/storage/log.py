"""`PartitionLog`: one replica's log on disk (Kafka's UnifiedLog, storage part only).

Does file I/O in the partition dir `<topic>-<partition>/`: the segments (segment.py), the
`leader-epoch-checkpoint` (checkpoint.py) and nothing else; the three offset checkpoints of the
data dir are the LogManager's. No replication decision is made here: the high watermark is the
replication core's alone (retention is told it, and a consumer read is bounded by it through
`max_offset`), and the leader epoch to stamp comes in with each leader append.

Invariants:
  * segments are sorted, contiguous (each base offset is the previous segment's end) and
    non-empty except possibly the last (the active segment);
  * log_start_offset <= leo, and recovery_point <= leo;
  * the epoch cache covers every epoch of the batches in the log at the batch's start offset;
    it is rewritten (atomically) before the first batch of a new epoch is written and after the
    log is truncated, so a crash leaves it a superset of the log's epochs, which loading trims.

Appends validate everything before changing anything: a bad batch raises a typed error
(CorruptRecordError, InvalidRecordError, MessageTooLargeError, RecordListTooLargeError,
UnexpectedAppendOffsetError) and leaves the log, the cache and the files untouched.

Disk failures are all or nothing too. An append whose epoch-cache write, segment roll, `.log`
write, index write or `flush.messages` fsync fails is undone (segments rolled in the call are
removed, the active segment and its indexes are cut back, the epoch cache is restored) and
KafkaStorageError is raised, so a caller may take "raised" to mean "the log is as it was".
Truncation and retention cannot be undone (files are gone), so they work from the newest
segment back (truncation) or the oldest forward (retention), each step whole: when one raises
KafkaStorageError the log is consistent at an LEO (or log start) between the old and the
requested one, and calling again finishes the job. A failure to rewrite the epoch checkpoint
after the log shrank is only logged: a checkpoint that still names removed epochs is what a
crash would leave too, and it is rewritten before the next batch is written.

Concurrency contract: not thread-safe. One owner calls it from one thread (the broker's event
loop; every call is page-cache I/O except `flush`, which fsyncs). `create` may run on a worker
thread: the new log is nobody else's yet.
"""

from __future__ import annotations

import bisect
import os
import pathlib
import struct
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from minibroker.broker.storage.checkpoint import (
    LEADER_EPOCH_CHECKPOINT,
    LeaderEpochCheckpointFile,
    format_checkpoint,
    write_new_file,
)
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.epoch_cache import EpochCache, EpochEntry
from minibroker.broker.storage.errors import CorruptCheckpointError, UnexpectedAppendOffsetError
from minibroker.broker.storage.segment import (
    LOG_SUFFIX,
    AppendEntry,
    LogSegment,
    SegmentMark,
    roll_clock,
    segment_path,
)
from minibroker.client.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_LENGTH_MIN,
    CRC_OFFSET,
    LOG_OVERHEAD,
    NO_PARTITION_LEADER_EPOCH,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    CorruptRecordError,
    assign_offsets,
    crc_of,
    iter_batches,
    read_header,
    validate_producer_batches,
)
from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.common.log import get_logger
from minibroker.client.errors import (
    KafkaStorageError,
    OffsetOutOfRangeError,
    RecordListTooLargeError,
)
from minibroker.client.types import TopicPartition

_log = get_logger("minibroker.broker.storage")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_UINT32 = struct.Struct(">I")
_SCAN_CHUNK = 8 * 1024 * 1024
# How many of each producer's newest batches loading hands over for the idempotent-producer
# state: at least as many as that state remembers per producer (BATCHES_PER_PRODUCER in the
# replication layer; a unit test holds the two together). A producer's older batches cannot
# change its state, so they need not be kept.
PRODUCER_BATCHES_KEPT = 5


class AppendInfo(NamedTuple):
    """What an append wrote. `first_offset` is -1 when nothing was appended.

    A NamedTuple, not a dataclass: it is built once per produce on the hot path, where a
    frozen dataclass costs several microseconds more.
    """

    first_offset: int
    last_offset: int
    max_timestamp: int
    log_append_time_ms: int  # -1 unless message.timestamp.type is LogAppendTime
    log_start_offset: int
    valid_bytes: int
    records_count: int
    # The batch headers as they arrived. A leader append restamped baseOffset and
    # partitionLeaderEpoch on disk (`stamped_epoch` >= 0); `batches` gives the stored view.
    received: tuple[BatchHeader, ...]
    stamped_epoch: int

    @property
    def appended(self) -> bool:
        return self.first_offset >= 0

    @property
    def batches(self) -> tuple[BatchHeader, ...]:
        """The headers as stored (assigned offsets, leader epoch), built on demand."""
        if self.stamped_epoch < 0:
            return self.received
        stored = []
        base = self.first_offset
        for h in self.received:
            stored.append(
                BatchHeader(
                    base,
                    h.batch_length,
                    self.stamped_epoch,
                    h.magic,
                    h.crc,
                    h.attributes,
                    h.last_offset_delta,
                    h.base_timestamp,
                    h.max_timestamp,
                    h.producer_id,
                    h.producer_epoch,
                    h.base_sequence,
                    h.records_count,
                )
            )
            base += h.last_offset_delta + 1
        return tuple(stored)


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


@dataclass(frozen=True, slots=True)
class DeletedSegment:
    """A segment removed by retention: offsets [base_offset, next_offset)."""

    base_offset: int
    next_offset: int
    size_bytes: int
    reason: str  # "retention.ms", "retention.bytes" or "log_start_offset"


class _EpochSnapshot(NamedTuple):
    """The epoch cache before a change that may be undone, and whether its file existed."""

    entries: tuple[EpochEntry, ...]
    file_existed: bool


class PartitionLog:
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
    ) -> None:
        self.directory = directory
        self.topic_partition = topic_partition
        self.config = config
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        segments[-1].set_active(True)
        self._epoch_cache = epoch_cache
        self._epoch_file = LeaderEpochCheckpointFile(directory / LEADER_EPOCH_CHECKPOINT)
        self._log_start_offset = log_start_offset
        self._recovery_point = recovery_point
        self._last_flush_ms = now_ms
        self._closed = False
        # The checkpoint file may differ from `_epoch_cache` (a write failed): it is rewritten
        # before the next batch goes to disk, so that it always names every batch's epoch.
        self._epoch_cache_dirty = False
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
    ) -> PartitionLog:
        """Open (or create) the log in `directory`, recovering what an unclean stop left.

        `recovery_point` and `log_start_offset` come from the data dir's checkpoints. After an
        unclean shutdown, segments from the one holding the recovery point on are recovered:
        scanned batch by batch, their indexes rebuilt, and the first torn or
        corrupt batch and everything after it (later segments too) removed. Any segment whose
        indexes are missing or inconsistent is recovered the same way, whatever the shutdown.
        The other segments (all of them after a clean shutdown) are read and checked without
        rebuilding anything, and a corrupt batch found there is handled as after a crash: the
        log is recovered from that segment, so it is cut at the batch. The replicas re-fetch
        what was cut; nothing that loads a log meets a corrupt batch.

        That check or recovery is the load's only pass over the batches: it also rebuilds a
        missing epoch checkpoint and gathers what `producer_batch_headers` hands over, so a log
        that needs no recovery is read once (besides each segment's index tail and first
        header, read when the segment is opened).
        """
        path = pathlib.Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        bases: list[int] = []
        for name in os.listdir(path):
            stem, dot, suffix = name.partition(".")
            if dot and len(stem) == 20 and stem.isdigit() and "." + suffix == LOG_SUFFIX:
                bases.append(int(stem))
            if name.endswith(".tmp"):
                os.unlink(path / name)
        bases.sort()
        for name in os.listdir(path):
            # Index files whose .log is gone would shadow a future segment with that base.
            stem, dot, suffix = name.partition(".")
            if dot and len(stem) == 20 and stem.isdigit() and int(stem) not in bases:
                os.unlink(path / name)

        epoch_file = LeaderEpochCheckpointFile(path / LEADER_EPOCH_CHECKPOINT)
        try:
            stored = epoch_file.read()
        except CorruptCheckpointError as err:
            _log.warning("epoch_checkpoint_unreadable", path=str(epoch_file.path), error=str(err))
            stored = None
        cache = EpochCache(stored or ())
        segments: list[LogSegment] = []
        try:
            for base in bases:
                segments.append(LogSegment.open(path, base, config.index_interval_bytes, now_ms))
            recover_from = len(segments)
            if not had_clean_shutdown:
                recover_from = max(bisect.bisect_right(bases, recovery_point) - 1, 0)
            return cls._recover(
                path,
                topic_partition,
                config,
                now_ms,
                segments,
                recover_from,
                cache,
                stored,
                recovery_point=recovery_point,
                log_start_offset=log_start_offset,
                had_clean_shutdown=had_clean_shutdown,
            )
        except BaseException:
            # Do not leak the file descriptors of a log that failed to load.
            for segment in segments:
                segment.release()
            raise

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

    @classmethod
    def _recover(
        cls,
        path: pathlib.Path,
        topic_partition: TopicPartition,
        config: LogConfig,
        now_ms: int,
        segments: list[LogSegment],
        recover_from: int,
        cache: EpochCache,
        stored: list[EpochEntry] | None,
        *,
        recovery_point: int,
        log_start_offset: int,
        had_clean_shutdown: bool,
    ) -> PartitionLog:
        """`open`'s second half: recover what needs it, then build the log and trim the cache."""
        trusted_cache = stored is not None
        check = _RecoveryCheck(cache if trusted_cache else None)
        kept: list[LogSegment] = []
        truncated_bytes = 0
        recovered = 0
        for i, segment in enumerate(segments):
            if kept and segment.base_offset != kept[-1].next_offset:
                _log.warning(
                    "log_segment_gap",
                    topic=topic_partition.topic,
                    partition=topic_partition.partition,
                    base_offset=segment.base_offset,
                    expected=kept[-1].next_offset,
                )
                for later in segments[i:]:
                    later.delete()
                break
            if i < recover_from and not segment.needs_recovery:
                problem = _damage_in(path, segment, check)
                if problem is None:
                    check.commit()
                    kept.append(segment)
                    continue
                check.discard()  # the segment is read again by its recovery
                _log.warning(
                    "corrupt_batch_found_on_load",
                    topic=topic_partition.topic,
                    partition=topic_partition.partition,
                    base_offset=segment.base_offset,
                    problem=problem,
                    had_clean_shutdown=had_clean_shutdown,
                )
                recover_from = i
            recovered += 1
            truncated = segment.recover(check)
            check.commit()
            truncated_bytes += truncated
            kept.append(segment)
            if truncated:
                for later in segments[i + 1 :]:
                    later.delete()
                break

        leo = kept[-1].next_offset if kept else log_start_offset
        if kept and leo < log_start_offset:
            # Kafka: the checkpointed log start is past everything left, start over there.
            for segment in kept:
                segment.delete()
            kept = []
            check.forget()
        if not kept:
            kept = [LogSegment.create(path, log_start_offset, config.index_interval_bytes, now_ms)]
        leo = kept[-1].next_offset
        start = max(log_start_offset, kept[0].base_offset)
        log = cls(
            path,
            topic_partition,
            config,
            kept,
            cache,
            start,
            leo if had_clean_shutdown else min(recovery_point, leo),
            now_ms,
        )
        log._loaded_producer_batches = check.producer_batches()
        changed = False
        if not trusted_cache:
            changed = log._rebuild_epoch_cache(check.epoch_starts)
        changed = bool(cache.truncate_from_end(leo)) or changed
        changed = bool(cache.truncate_from_start(start)) or changed
        if changed or (stored is None and len(cache)):
            log._persist_epoch_cache()
        if recovered or truncated_bytes:
            _log.info(
                "log_recovered",
                topic=topic_partition.topic,
                partition=topic_partition.partition,
                segments_recovered=recovered,
                truncated_bytes=truncated_bytes,
                leo=leo,
            )
        return log

    def _rebuild_epoch_cache(self, epoch_starts: Sequence[tuple[int, int]]) -> bool:
        """Rebuild the cache (the checkpoint was missing or corrupt) from where the load's pass
        saw each epoch start."""
        changed = self._epoch_cache.clear()
        for epoch, start_offset in epoch_starts:
            changed = self._epoch_cache.assign(epoch, start_offset) or changed
        return changed

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
        newest = _NewestBatches()
        offset = start
        while offset < self.leo:
            info = self.read(offset, _SCAN_CHUNK)
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
    def epoch_cache(self) -> EpochCache:
        """Read it freely; change it only through this class, which persists it."""
        return self._epoch_cache

    @property
    def latest_epoch(self) -> int | None:
        return self._epoch_cache.latest_epoch

    def end_offset_for_epoch(self, requested_epoch: int) -> tuple[int, int]:
        """(epoch, end offset) for a follower's `last_fetched_epoch` (docs/protocol.md §13)."""
        return self._epoch_cache.end_offset_for(requested_epoch, self.leo)

    def update_config(self, config: LogConfig) -> None:
        """New topic configs apply to the next append, roll, retention and flush decision."""
        self.config = config

    # -- epoch cache --------------------------------------------------------------------------

    def _persist_epoch_cache(self) -> None:
        self._epoch_cache_dirty = True
        self._epoch_file.write(self._epoch_cache.entries)
        self._epoch_cache_dirty = False

    def _persist_epoch_cache_after_shrink(self) -> None:
        """Persist when the file may lag the cache harmlessly until the next batch is written
        (see the module docstring); a failure is logged, not raised."""
        try:
            self._persist_epoch_cache()
        except OSError as err:
            _log.warning(
                "epoch_checkpoint_write_failed",
                topic=self.topic_partition.topic,
                partition=self.topic_partition.partition,
                error=str(err),
            )

    def _epoch_snapshot(self) -> _EpochSnapshot:
        return _EpochSnapshot(self._epoch_cache.entries, self._epoch_file.path.exists())

    def _restore_epoch_cache(self, snapshot: _EpochSnapshot) -> None:
        """Put back a snapshot of the cache (an undo); the file follows, best effort."""
        if snapshot.entries != self._epoch_cache.entries:
            self._epoch_cache.clear()
            for entry in snapshot.entries:
                self._epoch_cache.assign(entry.epoch, entry.start_offset)
            self._epoch_cache_dirty = True
        if not self._epoch_cache_dirty:
            return
        # No file and an empty cache load the same (no batch carries an epoch).
        if not snapshot.file_existed and not snapshot.entries and _remove(self._epoch_file.path):
            self._epoch_cache_dirty = False
        elif self._epoch_file_matches_cache():
            # The failed write never reached the file: leave it alone.
            self._epoch_cache_dirty = False
        else:
            self._persist_epoch_cache_after_shrink()

    def _epoch_file_matches_cache(self) -> bool:
        try:
            stored = self._epoch_file.read()
        except (OSError, CorruptCheckpointError):
            return False
        return stored is not None and tuple(stored) == self._epoch_cache.entries

    def maybe_assign_epoch_start_offset(self, leader_epoch: int, start_offset: int) -> bool:
        """Record (epoch, start offset) durably; a new leader calls it with its LEO (KIP-279).

        If the checkpoint cannot be written, the cache is left as it was and
        KafkaStorageError is raised.
        """
        before = self._epoch_snapshot()
        if not self._epoch_cache.assign(leader_epoch, start_offset):
            return False
        try:
            self._persist_epoch_cache()
        except OSError as err:
            self._restore_epoch_cache(before)
            raise self._storage_error("writing the leader epoch checkpoint of", err) from err
        return True

    def _storage_error(self, what: str, err: OSError) -> KafkaStorageError:
        return KafkaStorageError(f"{what} {self.topic_partition} failed: {err}")

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
        if leader_epoch < 0:
            raise ValueError(f"a leader append needs a leader epoch, got {leader_epoch}")
        limit = self.config.max_message_bytes if max_message_bytes is None else max_message_bytes
        batches = validate_producer_batches(records, limit) if validated is None else validated
        segment_bytes = self.config.segment_bytes
        for position, header in batches:
            if header.batch_length + 12 > segment_bytes:
                raise RecordListTooLargeError(
                    f"batch at position {position} is {header.size} bytes, larger than "
                    f"segment.bytes ({segment_bytes})"
                )
        buf = bytearray(records)
        first_offset = self.leo
        assign_offsets(buf, batches, first_offset, leader_epoch)
        append_time = now_ms if self.config.log_append_time else -1
        entries: list[AppendEntry] = []
        received: list[BatchHeader] = []
        base = first_offset
        max_timestamp = -1
        records_count = 0
        for position, header in batches:
            if append_time >= 0:
                header = _stamp_log_append_time(buf, position, header, append_time)
            received.append(header)
            last = base + header.last_offset_delta
            entries.append((position, header.batch_length + 12, last, header.max_timestamp))
            if header.max_timestamp > max_timestamp:
                max_timestamp = header.max_timestamp
            records_count += header.records_count
            base = last + 1
        latest = self._epoch_cache.latest_entry
        new_epochs: tuple[tuple[int, int], ...] = ()
        if latest is None or latest.epoch != leader_epoch:
            new_epochs = ((leader_epoch, first_offset),)
        self._append(buf, entries, max_timestamp, now_ms, new_epochs)
        return AppendInfo(
            first_offset,
            base - 1,
            max_timestamp,
            append_time,
            self._log_start_offset,
            len(buf),
            records_count,
            tuple(received),
            leader_epoch,
        )

    def append_as_follower(
        self, records: bytes | bytearray | memoryview, now_ms: int | None = None
    ) -> AppendInfo:
        """Append the leader's batches as they are: offsets and epochs kept, CRCs checked.

        The first batch must start exactly at the LEO and each batch right after the previous
        one (UnexpectedAppendOffsetError otherwise). Each new batch epoch goes into the epoch
        cache at the batch's base offset. `now_ms` (default: the wall clock) drives segment.ms.
        A disk failure raises KafkaStorageError with the log as it was (module docstring).
        """
        now = wall_clock_ms() if now_ms is None else now_ms
        if len(records) == 0:
            return AppendInfo(-1, -1, -1, -1, self._log_start_offset, 0, 0, (), -1)
        expected = self.leo
        entries: list[AppendEntry] = []
        headers: list[BatchHeader] = []
        new_epochs: list[tuple[int, int]] = []
        last_epoch = self._epoch_cache.latest_epoch
        max_timestamp = -1
        records_count = 0
        for position, header in iter_batches(records):
            if header.base_offset != expected:
                where = "first batch" if not headers else f"batch at position {position}"
                raise UnexpectedAppendOffsetError(
                    f"{self.topic_partition}: {where} starts at offset {header.base_offset}, "
                    f"expected {expected}",
                    first_offset=header.base_offset,
                    expected_offset=expected,
                )
            headers.append(header)
            expected = header.base_offset + header.last_offset_delta + 1
            entries.append((position, header.batch_length + 12, expected - 1, header.max_timestamp))
            if header.max_timestamp > max_timestamp:
                max_timestamp = header.max_timestamp
            records_count += header.records_count
            epoch = header.partition_leader_epoch
            if epoch >= 0 and epoch != last_epoch:
                new_epochs.append((epoch, header.base_offset))
                last_epoch = epoch
        self._append(records, entries, max_timestamp, now, new_epochs)
        return AppendInfo(
            headers[0].base_offset,
            expected - 1,
            max_timestamp,
            -1,
            self._log_start_offset,
            len(records),
            records_count,
            tuple(headers),
            -1,
        )

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
        if self._epoch_cache_dirty:
            try:
                self._persist_epoch_cache()
            except OSError as err:
                raise self._storage_error("rewriting the leader epoch checkpoint of", err) from err
        segment_count = len(self._segments)
        active_mark = self._segments[-1].mark()
        cache_before = self._epoch_snapshot() if new_epochs else None
        try:
            cache_changed = False
            for epoch, start_offset in new_epochs:
                cache_changed = self._epoch_cache.assign(epoch, start_offset) or cache_changed
            if cache_changed:
                self._persist_epoch_cache()
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
        cache_before: _EpochSnapshot | None,
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
            self._restore_epoch_cache(cache_before)
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
        if active.size == 0:
            first_clock = roll_clock(entries[0][3], now_ms, config.retention_ms)
            fits = total <= config.segment_bytes and clock - first_clock <= config.segment_ms
        else:
            first_clock = None
            fits = not (
                active.size > config.segment_bytes - total
                or active.time_waited_for_roll(now_ms, clock) > config.segment_ms
                or not active.can_hold_offset(entries[-1][2])
            )
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
            if active.size > 0 and (
                active.size > segment_bytes - (end - start)
                or active.time_waited_for_roll(now_ms, clocks[i]) > config.segment_ms
                or not active.can_hold_offset(entries[-1][2])
            ):
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
                if active.size == 0:
                    waited = clocks[k] - clocks[i]
                else:
                    waited = active.time_waited_for_roll(now_ms, clocks[k])
                if waited > config.segment_ms:
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
            self._persist_epoch_cache_after_shrink()
        _log.info(
            "log_start_offset_incremented",
            topic=self.topic_partition.topic,
            partition=self.topic_partition.partition,
            log_start_offset=new_log_start_offset,
        )
        return True

    # -- truncation ---------------------------------------------------------------------------

    def truncate_to(self, offset: int) -> bool:
        """Remove the batches at and after `offset`; True if any bytes went.

        The epoch cache drops entries starting at or after the new end even when nothing is
        truncated (KAFKA-10706). Batch-granular: a batch holding `offset` goes whole. Below the
        first segment this is `truncate_fully_and_start_at(offset)`.
        """
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot truncate {self.topic_partition} to {offset}")
        if offset >= self.leo:
            if self._epoch_cache.truncate_from_end(offset):
                self._persist_epoch_cache_after_shrink()
            return False
        if offset < self._segments[0].base_offset:
            self.truncate_fully_and_start_at(offset)
            return True
        self._loaded_producer_batches = None
        old_leo = self.leo
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
            raise self._storage_error(
                f"truncation to {offset} (stopped at LEO {self.leo}) of", err
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
        leo = self.leo
        if self._epoch_cache.truncate_from_end(leo):
            self._persist_epoch_cache_after_shrink()
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
        old_leo = self.leo
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
            raise self._storage_error(
                f"restarting at {offset} (stopped at LEO {self.leo}) of", err
            ) from err
        if self._epoch_cache.clear() or self._epoch_file.path.exists():
            self._persist_epoch_cache_after_shrink()
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
        """Delete whole old segments by retention.ms, retention.bytes and the log start offset.

        From the oldest segment on, stopping at the first one that may not go. A segment may go
        only if the next segment's base offset is <= `high_watermark` (the replication core's:
        nothing at or above it is ever deleted) and it is not the active segment. The log start
        offset then moves up to the first remaining segment.
        """
        deleted: list[DeletedSegment] = []
        retention_ms = self.config.retention_ms
        if retention_ms >= 0:
            deleted += self._delete_oldest(
                high_watermark,
                lambda s: now_ms - s.largest_timestamp() > retention_ms,
                "retention.ms",
            )
        retention_bytes = self.config.retention_bytes
        if retention_bytes >= 0:
            excess = self.size_bytes - retention_bytes

            def over_size(segment: LogSegment) -> bool:
                nonlocal excess
                if excess - segment.size >= 0:
                    excess -= segment.size
                    return True
                return False

            deleted += self._delete_oldest(high_watermark, over_size, "retention.bytes")
        deleted += self._delete_oldest(
            high_watermark, lambda s: s.next_offset <= self._log_start_offset, "log_start_offset"
        )
        return deleted

    def _delete_oldest(
        self, high_watermark: int, predicate: Callable[[LogSegment], bool], reason: str
    ) -> list[DeletedSegment]:
        count = 0
        while count < len(self._segments) - 1:
            segment = self._segments[count]
            upper = self._segments[count + 1].base_offset
            if high_watermark < upper or not predicate(segment):
                break
            count += 1
        if count == 0:
            return []
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
            raise self._storage_error(f"deleting segments ({reason}) of", err) from err
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
                self._persist_epoch_cache_after_shrink()
        self._recovery_point = max(self._recovery_point, first_base)

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
        if self._epoch_cache_dirty:
            self._persist_epoch_cache_after_shrink()
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


class _NewestBatches:
    """The newest PRODUCER_BATCHES_KEPT batch headers of each producer id, given in log order
    (batches without a producer id are left out: they do not touch the producer state)."""

    __slots__ = ("_by_producer",)

    def __init__(self) -> None:
        self._by_producer: dict[int, deque[BatchHeader]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_producer)

    def add(self, header: BatchHeader) -> None:
        producer_id = header.producer_id
        if producer_id < 0:
            return
        kept = self._by_producer.get(producer_id)
        if kept is None:
            kept = self._by_producer[producer_id] = deque(maxlen=PRODUCER_BATCHES_KEPT)
        kept.append(header)

    def extend(self, later: _NewestBatches) -> None:
        """Add `later`'s batches, which all follow this one's in the log."""
        for producer_id, batches in later._by_producer.items():
            kept = self._by_producer.get(producer_id)
            if kept is None:
                self._by_producer[producer_id] = batches
            else:
                kept.extend(batches)

    def headers(self) -> list[BatchHeader]:
        """Every kept header, oldest first."""
        kept = [header for batches in self._by_producer.values() for header in batches]
        kept.sort(key=_base_offset_of)
        return kept


def _base_offset_of(header: BatchHeader) -> int:
    return header.base_offset


class _RecoveryCheck:
    """The load's pass over the batches it keeps: checks beyond CRC and offsets (the epoch
    fields), and what the rest of the load needs from those batches.

    `partitionLeaderEpoch` sits outside the CRC, so a flipped byte there would pass it. Epochs
    never go back along a log, and when the checkpointed cache is present it names the epoch
    of every batch (it is written before the batch), so a batch that disagrees is corrupt.

    `_damage_in` and `LogSegment.recover` call it on each batch in log order, as the last test
    before keeping it, so a batch it passes is kept unless the segment turns out to need
    recovery after all; what it learns (where each epoch starts, each producer's newest
    batches) is therefore staged per segment: `commit` once the segment is kept (checked whole,
    or recovered), `discard` when it is to be read again.
    """

    def __init__(self, cache: EpochCache | None) -> None:
        # The cache does not change while the log loads: its columns are copied once.
        entries = cache.entries if cache is not None else ()
        self._starts = [entry.start_offset for entry in entries]
        self._epochs = [entry.epoch for entry in entries]
        self._previous_epoch = NO_PARTITION_LEADER_EPOCH
        self._committed_epoch = NO_PARTITION_LEADER_EPOCH
        self._staged_epoch_starts: list[tuple[int, int]] = []
        self._epoch_starts: list[tuple[int, int]] = []
        self._staged_producers = _NewestBatches()
        self._producers = _NewestBatches()

    def __call__(self, header: BatchHeader) -> str | None:
        epoch = header.partition_leader_epoch
        if epoch < NO_PARTITION_LEADER_EPOCH:
            return f"invalid partitionLeaderEpoch {epoch}"
        previous = self._previous_epoch
        if epoch < previous:
            return f"partitionLeaderEpoch {epoch} after {previous}"
        starts = self._starts
        if starts:
            at = bisect.bisect_right(starts, header.base_offset)
            # The last offset too: a log start raised into this batch restarts its epoch's
            # entry inside it (truncate_from_start).
            cached = self._epochs[at - 1] if at else epoch
            if epoch != cached:
                last = bisect.bisect_right(starts, header.last_offset)
                if epoch != self._epochs[last - 1]:
                    return f"partitionLeaderEpoch {epoch}, the epoch cache says {cached}"
        if epoch > previous:
            self._staged_epoch_starts.append((epoch, header.base_offset))
            self._previous_epoch = epoch
        producer_id = header.producer_id
        if producer_id >= 0:  # `_NewestBatches.add` inlined: this runs once per batch
            staged = self._staged_producers._by_producer
            kept = staged.get(producer_id)
            if kept is None:
                kept = staged[producer_id] = deque(maxlen=PRODUCER_BATCHES_KEPT)
            kept.append(header)
        return None

    def commit(self) -> None:
        """The batches passed since the last commit or discard stay in the log."""
        self._committed_epoch = self._previous_epoch
        self._epoch_starts += self._staged_epoch_starts
        self._staged_epoch_starts.clear()
        if self._staged_producers:
            self._producers.extend(self._staged_producers)
            self._staged_producers = _NewestBatches()

    def discard(self) -> None:
        """The batches passed since the last commit or discard will be checked again."""
        self._previous_epoch = self._committed_epoch
        self._staged_epoch_starts.clear()
        self._staged_producers = _NewestBatches()

    def forget(self) -> None:
        """Every batch passed is gone from the log."""
        self.discard()
        self._epoch_starts.clear()
        self._producers = _NewestBatches()

    @property
    def epoch_starts(self) -> list[tuple[int, int]]:
        """(epoch, offset of its first batch) for each epoch of the kept batches, in order."""
        return self._epoch_starts

    def producer_batches(self) -> list[BatchHeader]:
        """The newest PRODUCER_BATCHES_KEPT kept batches of each producer id, oldest first."""
        return self._producers.headers()


def _damage_in(directory: pathlib.Path, segment: LogSegment, check: _RecoveryCheck) -> str | None:
    """The first problem `LogSegment.recover` would cut the segment at, or None; read-only.

    The same checks (whole batches, length, magic, CRC, offsets following on from the base
    offset, the epoch `check`), read in large chunks, without touching the indexes. A batch
    cut by the end of a chunk is read again whole at the start of the next one.
    """
    size = segment.size
    expected = segment.base_offset
    position = 0
    want = _SCAN_CHUNK
    fd = os.open(segment_path(directory, segment.base_offset, LOG_SUFFIX), os.O_RDONLY)
    try:
        while position < size:
            requested = min(max(want, LOG_OVERHEAD), size - position)
            chunk = os.pread(fd, requested, position)
            want = _SCAN_CHUNK
            at = 0
            while len(chunk) - at >= LOG_OVERHEAD:
                (length,) = _INT32.unpack_from(chunk, at + 8)
                total = length + LOG_OVERHEAD
                if length < BATCH_LENGTH_MIN or position + at + total > size:
                    return f"bad batchLength {length} at position {position + at}"
                if at + total > len(chunk):
                    want = total
                    break
                try:
                    header = read_header(chunk, at)
                except CorruptRecordError as err:
                    return f"{err.reason} at position {position + at}"
                problem: str | None
                if header.base_offset != expected:
                    problem = f"baseOffset {header.base_offset}, expected {expected}"
                elif not segment.can_hold_offset(header.last_offset):
                    problem = f"offset {header.last_offset} overflows the segment index"
                else:
                    problem = check(header)
                if problem is not None:
                    return f"{problem} at position {position + at}"
                expected = header.next_offset
                at += total
            if at == 0 and (len(chunk) < requested or len(chunk) < LOG_OVERHEAD):
                return f"torn batch at position {position}"  # the file ends before its size
            position += at
    finally:
        os.close(fd)
    if expected != segment.next_offset:
        return f"batches end at offset {expected}, the segment at {segment.next_offset}"
    return None


def _stamp_log_append_time(
    buf: bytearray, position: int, header: BatchHeader, now_ms: int
) -> BatchHeader:
    """LogAppendTime: set the timestamp-type bit and maxTimestamp, then recompute the CRC."""
    attributes = header.attributes | TIMESTAMP_TYPE_MASK
    _INT16.pack_into(buf, position + ATTRIBUTES_OFFSET, attributes)
    _INT64.pack_into(buf, position + 35, now_ms)
    crc = crc_of(buf, position + ATTRIBUTES_OFFSET, position + header.size)
    _UINT32.pack_into(buf, position + CRC_OFFSET, crc)
    return header._replace(attributes=attributes, max_timestamp=now_ms, crc=crc)


def _remove(path: pathlib.Path) -> bool:
    """Unlink `path`; True when it is gone (or was never there)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


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
