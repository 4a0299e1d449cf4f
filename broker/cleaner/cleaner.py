"""`Cleaner`: one cleaning round of one compacted log (Kafka's Cleaner in LogCleaner.scala).

Does file I/O, on a cleaner thread: it reads the log's non-active segments through descriptors
of its own (never a segment's cached one, which the event loop's LRU may close at any time) and
writes `.cleaned` segment files; the few steps that change the log itself run on the event loop
through `on_loop` (PartitionLog is not thread-safe).

A round (`Cleaner.clean`):
  1. snapshot, on the loop: the segments (objects, sizes, index sizes), the log start, config;
  2. map: the offset map (`OffsetMap`, cleared first) is built over the dirty range
     [first dirty offset, first uncleanable offset) batch by batch with
     `selection.add_batch_to_offset_map`; when the map reaches its load factor it stops there
     and the round cleans only what it covered: end_offset = map.latest_offset + 1 (Kafka's
     rule), otherwise end_offset = the first uncleanable offset;
  3. producers: the last batch of each producer id in the whole log (a walk over the batch
     headers of every segment, the active one up to its size at the snapshot, through the
     cleaner's own descriptors; skipped when the caller passes `last_data_offsets`), so that the
     batch holding a producer's last sequence stays, emptied if need be (every producer with a
     batch in the log counts as active: minibroker's producer state never expires one);
  4. rewrite: the segments below end_offset (those wholly below the log start excepted) are cut
     into groups by `selection.group_segments_by_size`; each group is written into one
     `<first base>.log.cleaned` (+ `.index.cleaned`, `.timeindex.cleaned`) keeping what
     `selection.filter_batch` keeps: a batch kept whole is copied byte for byte, a rewritten one
     keeps its base offset, last offset, producer id, epoch, base sequence, partition leader
     epoch, timestamp type and codec (recompressed with it) and carries the delete horizon when
     it first keeps a tombstone (KIP-534), an emptied batch a producer still needs is written as
     a header-only batch (Kafka's writeEmptyHeader); the files are fsynced and the log file gets
     the last replaced segment's mtime (Kafka keeps lastModified for time retention);
  5. swap, on the loop (`_swap`): see below; then the next group.

The swap of one group, with the step hook called after each step under the name in `STEPS`:
  * check that the group's segments are still exactly the log's (identity and size, consecutive,
    not active, log open, cleanup.policy still compact, not wholly below the log start);
    otherwise delete the `.cleaned` files and raise CleanAborted ("swap_checked" once it passed);
  * write the `.may-have-gaps` marker, file and dir fsynced ("marker_written");
  * rename `.cleaned` -> `.swap`, the log first ("swap_log_renamed"), then the indexes, fsync the
    dir ("swap_renamed"): from here a crash is completed by loading (segment_swap.py);
  * delete the replaced segments' files, one segment at a time ("old_segment_deleted" after
    each, "old_deleted" after the last);
  * rename `.swap` -> final names, the log first ("swap_log_completed"), then the indexes, fsync
    the dir ("swap_completed");
  * open the new segment and put it in the log's list in place of the old ones.
On the cleaner thread the hook is called "map_built" after step 2, "cleaned_log_written" once a
group's `.log.cleaned` is written (not yet synced) and "cleaned_written" once its three files are
fsynced. A file-system failure before the replaced segments' files start to go is undone (the
`.swap` / `.cleaned` files removed, the log keeps its segments) and raises KafkaStorageError;
one after leaves the log object naming files that may be gone: KafkaStorageError, and the log
must be reloaded (loading completes the swap), as after any disk failure (docs/design.md §4.6).

Concurrency contract: a Cleaner (and its OffsetMap) belongs to one cleaner thread; `clean`
touches the PartitionLog only inside the callables it hands to `on_loop`.
"""

from __future__ import annotations

import functools
import os
import pathlib
import struct
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from minibroker.broker.cleaner.offset_map import OffsetMap
from minibroker.broker.cleaner.selection import (
    BatchAction,
    BatchFacts,
    LogToClean,
    RecordFacts,
    SegmentFacts,
    add_batch_to_offset_map,
    filter_batch,
    group_segments_by_size,
)
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.index import OffsetIndex, TimeIndex
from minibroker.broker.storage.log import PartitionLog
from minibroker.broker.storage.segment import LogSegment
from minibroker.broker.storage.segment_swap import (
    CLEANED_SUFFIX,
    SWAP_SUFFIX,
    remove_files,
    rename_files,
    segment_file,
    sync_dir,
)
from minibroker.client.batch import (
    BATCH_LENGTH_MIN,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchHeader,
    Compression,
    CorruptRecordError,
    parse_header,
    read_header,
)
from minibroker.client.common.log import get_logger
from minibroker.client.errors import KafkaStorageError
from minibroker.client.log_format import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    OFFSET_INDEX_ENTRY,
    TIME_INDEX_ENTRY,
    TIME_INDEX_SUFFIX,
    fits_relative_offset,
)
from minibroker.client.records import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    DecodedRecord,
    decode_records,
    encode_placed_batch,
    uncompressed_limit,
)
from minibroker.client.types import TopicPartition

_log = get_logger("minibroker.broker.cleaner")
T = TypeVar("T")
_INT32 = struct.Struct(">i")

DEFAULT_IO_BUFFER_SIZE = 512 * 1024

# The step hook's names, in the order a round reaches them (each is called once the step it
# names is done). "map_built" and "cleaned_log_written" / "cleaned_written" run on the cleaner
# thread, the others inside the swap on the event loop.
STEP_MAP_BUILT = "map_built"
STEP_CLEANED_LOG_WRITTEN = "cleaned_log_written"  # the .log.cleaned written, not yet synced
STEP_CLEANED_WRITTEN = "cleaned_written"  # the three .cleaned files written and fsynced
STEP_SWAP_CHECKED = "swap_checked"
STEP_MARKER_WRITTEN = "marker_written"
STEP_SWAP_LOG_RENAMED = "swap_log_renamed"  # .log.cleaned -> .log.swap, indexes not yet
STEP_SWAP_RENAMED = "swap_renamed"  # all three .swap, dir fsynced
STEP_OLD_SEGMENT_DELETED = "old_segment_deleted"  # after each replaced segment's files
STEP_OLD_DELETED = "old_deleted"
STEP_SWAP_LOG_COMPLETED = "swap_log_completed"  # .log.swap -> .log, indexes not yet
STEP_SWAP_COMPLETED = "swap_completed"  # final names, dir fsynced
STEPS = (
    STEP_MAP_BUILT,
    STEP_CLEANED_LOG_WRITTEN,
    STEP_CLEANED_WRITTEN,
    STEP_SWAP_CHECKED,
    STEP_MARKER_WRITTEN,
    STEP_SWAP_LOG_RENAMED,
    STEP_SWAP_RENAMED,
    STEP_OLD_SEGMENT_DELETED,
    STEP_OLD_DELETED,
    STEP_SWAP_LOG_COMPLETED,
    STEP_SWAP_COMPLETED,
)


@dataclass(frozen=True, slots=True)
class CleanerStats:
    """One round of one log, for metrics and the timeline.

    `bytes_read` / `records_read` count both passes (the map and the rewrite); `bytes_written`
    / `records_written` what went into `.cleaned` files (records kept; an emptied batch kept as a
    header counts its bytes, no record)."""

    topic_partition: TopicPartition
    first_dirty_offset: int  # where this round's dirty range began
    end_offset: int  # new cleaner checkpoint: offsets below it are clean
    bytes_read: int  # log bytes read (map build + rewrite)
    bytes_written: int  # log bytes written to .cleaned files
    records_read: int
    records_written: int
    map_utilization: float  # 0..1, how full the offset map got
    elapsed_s: float  # wall time of the round
    segments_before: int  # segments replaced
    segments_after: int  # segments swapped in


class OnLoop(Protocol):
    """Runs a callable on the thread that owns the log and returns its result (the spec's
    `Callable[[Callable[[], T]], T]`, generic per call: the round hands it several types)."""

    def __call__(self, fn: Callable[[], T], /) -> T: ...


def run_here(fn: Callable[[], T]) -> T:
    """`on_loop` when the caller owns the log itself (tests, tools): run `fn` now."""
    return fn()


class CleanAborted(Exception):
    """The log changed under the round (truncated, deleted, retention moved past it, closed):
    the group being swapped was not (groups swapped before it stay, already clean)."""


@dataclass(frozen=True, slots=True)
class _SegmentView:
    """A segment as the snapshot on the loop saw it."""

    segment: LogSegment
    base_offset: int
    size: int
    next_offset: int
    offset_index_bytes: int
    time_index_bytes: int
    path: pathlib.Path

    def facts(self) -> SegmentFacts:
        return SegmentFacts(
            self.base_offset,
            self.size,
            offset_index_bytes=self.offset_index_bytes,
            time_index_bytes=self.time_index_bytes,
        )


@dataclass(frozen=True, slots=True)
class _Snapshot:
    directory: pathlib.Path
    config: LogConfig
    log_start_offset: int
    segments: tuple[_SegmentView, ...]  # the active one last
    first_dirty_position: int  # where the first dirty offset's segment may be read from


class _Counters:
    __slots__ = ("bytes_read", "bytes_written", "records_read", "records_written")

    def __init__(self) -> None:
        self.bytes_read = 0
        self.bytes_written = 0
        self.records_read = 0
        self.records_written = 0


def _record_facts(
    offset: int, _timestamp: int, key: bytes | None, value: bytes | None, _headers: object
) -> RecordFacts:
    return RecordFacts(offset, key, value is not None)


class Cleaner:
    """Cleans one log at a time with its offset map (module docstring)."""

    def __init__(
        self,
        offset_map: OffsetMap,
        *,
        io_buffer_size: int = DEFAULT_IO_BUFFER_SIZE,
        step_hook: Callable[[str], None] | None = None,
    ) -> None:
        if io_buffer_size < HEADER_SIZE:
            raise ValueError(f"io_buffer_size {io_buffer_size} is below a batch header")
        self.offset_map = offset_map
        self.io_buffer_size = io_buffer_size
        self._hook = step_hook

    def _step(self, name: str) -> None:
        if self._hook is not None:
            self._hook(name)

    # -- the round ----------------------------------------------------------------------------

    def clean(
        self,
        log: PartitionLog,
        to_clean: LogToClean,
        now_ms: int,
        on_loop: OnLoop = run_here,
        *,
        last_data_offsets: Mapping[int, int] | None = None,
        should_abort: Callable[[], bool] | None = None,
    ) -> CleanerStats:
        """Clean `log` over `to_clean`'s range (module docstring) and return the round's stats.

        `on_loop(fn)` runs `fn` on the thread that owns `log` and returns its result (default:
        here). `last_data_offsets` (producer id -> last offset of its last batch, the producers
        whose state must stay) replaces the header walk when the caller knows it.
        `should_abort` is asked between batches; True raises CleanAborted. Raises CleanAborted
        when the log changed under the round, CorruptRecordError for a damaged batch,
        KafkaStorageError or OSError for disk failures.
        """
        started = time.monotonic()
        if to_clean.topic_partition != log.topic_partition:
            raise ValueError(
                f"log to clean is {to_clean.topic_partition}, the log {log.topic_partition}"
            )
        first_dirty = to_clean.first_dirty_offset
        snapshot = on_loop(lambda: _take_snapshot(log, first_dirty))
        counters = _Counters()
        abort = should_abort or _never
        offset_map = self.offset_map
        offset_map.clear()
        non_active = snapshot.segments[:-1]
        upper_bound = min(to_clean.first_uncleanable_offset, snapshot.segments[-1].base_offset)
        dirty = _covering(non_active, first_dirty, upper_bound)
        if not dirty:
            return self._stats(log, first_dirty, first_dirty, counters, started, 0, 0)
        self._build_map(snapshot, dirty, first_dirty, upper_bound, counters, abort)
        end_offset = offset_map.latest_offset + 1
        self._step(STEP_MAP_BUILT)

        if last_data_offsets is None:
            last_data_offsets = self._last_data_offsets(snapshot, abort)
        # Not the segments wholly below the log start: retention is about to delete them.
        start = snapshot.log_start_offset
        to_rewrite = [
            view
            for view, following in zip(non_active, snapshot.segments[1:], strict=True)
            if view.base_offset < end_offset and following.base_offset > start
        ]
        by_base = {view.base_offset: view for view in to_rewrite}
        groups = group_segments_by_size(
            [view.facts() for view in to_rewrite],
            snapshot.config.segment_bytes,
            to_clean.log.config.segment_index_bytes,
            upper_bound,
        )
        before = after = 0
        for group in groups:
            views = [by_base[facts.base_offset] for facts in group]
            cleaned = self._write_group(
                snapshot, views, now_ms, last_data_offsets, upper_bound, counters, abort
            )
            self._step(STEP_CLEANED_WRITTEN)
            try:
                on_loop(functools.partial(self._swap, log, views, cleaned, now_ms))
            except BaseException:
                # Whatever the swap did not take over (a no-op once the files are renamed).
                cleaned.remove()
                raise
            before += len(views)
            after += 1
        stats = self._stats(log, first_dirty, end_offset, counters, started, before, after)
        _log.info(
            "log_cleaned",
            topic=log.topic_partition.topic,
            partition=log.topic_partition.partition,
            first_dirty_offset=first_dirty,
            end_offset=end_offset,
            bytes_read=stats.bytes_read,
            bytes_written=stats.bytes_written,
            segments_before=before,
            segments_after=after,
            map_utilization=round(stats.map_utilization, 4),
            elapsed_s=round(stats.elapsed_s, 4),
        )
        return stats

    def _stats(
        self,
        log: PartitionLog,
        first_dirty: int,
        end_offset: int,
        counters: _Counters,
        started: float,
        before: int,
        after: int,
    ) -> CleanerStats:
        return CleanerStats(
            topic_partition=log.topic_partition,
            first_dirty_offset=first_dirty,
            end_offset=end_offset,
            bytes_read=counters.bytes_read,
            bytes_written=counters.bytes_written,
            records_read=counters.records_read,
            records_written=counters.records_written,
            map_utilization=self.offset_map.utilization,
            elapsed_s=time.monotonic() - started,
            segments_before=before,
            segments_after=after,
        )

    # -- pass 1: the offset map ---------------------------------------------------------------

    def _build_map(
        self,
        snapshot: _Snapshot,
        dirty: Sequence[_SegmentView],
        first_dirty: int,
        upper_bound: int,
        counters: _Counters,
        abort: Callable[[], bool],
    ) -> None:
        """Kafka's buildOffsetMap: each dirty segment's keyed records at or above the first
        dirty offset, until the map is full; a segment read whole moves the map's latest offset
        to the next segment's base - 1 (the upper bound for the last one)."""
        offset_map = self.offset_map
        limit = uncompressed_limit(snapshot.config.max_message_bytes)
        for i, view in enumerate(dirty):
            start = snapshot.first_dirty_position if i == 0 else 0
            next_start = dirty[i + 1].base_offset if i + 1 < len(dirty) else upper_bound
            with _SegmentFile(view) as source:
                for header, data in source.batches(start, self.io_buffer_size):
                    if abort():
                        raise CleanAborted(f"{view.path.name}: the round was aborted")
                    counters.bytes_read += header.size
                    if header.last_offset < first_dirty:
                        continue
                    records = decode_records(data, 0, header, _record_facts, limit)
                    counters.records_read += len(records)
                    facts = BatchFacts(
                        header.base_offset,
                        header.last_offset,
                        header.producer_id,
                        header.delete_horizon_ms,
                    )
                    if add_batch_to_offset_map(offset_map, facts, records, first_dirty):
                        return
            offset_map.update_latest_offset(next_start - 1)

    # -- pass 2: the producers' last batches --------------------------------------------------

    def _last_data_offsets(self, snapshot: _Snapshot, abort: Callable[[], bool]) -> dict[int, int]:
        """Producer id -> last offset of its last batch in the log, from a walk over the batch
        headers of every segment (the active one up to its size in the snapshot)."""
        last: dict[int, int] = {}
        for view in snapshot.segments:
            with _SegmentFile(view) as source:
                for header in source.headers(self.io_buffer_size):
                    if header.producer_id >= 0:
                        last[header.producer_id] = header.last_offset
            if abort():
                raise CleanAborted(f"{view.path.name}: the round was aborted")
        return last

    # -- pass 3: the rewrite ------------------------------------------------------------------

    def _write_group(
        self,
        snapshot: _Snapshot,
        views: Sequence[_SegmentView],
        now_ms: int,
        last_data_offsets: Mapping[int, int],
        upper_bound: int,
        counters: _Counters,
        abort: Callable[[], bool],
    ) -> _CleanedSegment:
        """Write one group's kept batches into `.cleaned` files, fsynced (module docstring)."""
        config = snapshot.config
        limit = uncompressed_limit(config.max_message_bytes)
        offset_map = self.offset_map
        cleaned = _CleanedSegment(
            snapshot.directory,
            views[0].base_offset,
            config.index_interval_bytes,
            self.io_buffer_size,
        )
        try:
            for view in views:
                with _SegmentFile(view) as source:
                    for header, data in source.batches(0, self.io_buffer_size):
                        if abort():
                            raise CleanAborted(f"{view.path.name}: the round was aborted")
                        counters.bytes_read += header.size
                        records = decode_records(data, 0, header, DecodedRecord, limit)
                        counters.records_read += len(records)
                        decision = filter_batch(
                            BatchFacts(
                                header.base_offset,
                                header.last_offset,
                                header.producer_id,
                                header.delete_horizon_ms,
                            ),
                            [RecordFacts(r.offset, r.key, r.value is not None) for r in records],
                            offset_map,
                            now_ms,
                            config.delete_retention_ms,
                            last_data_offsets,
                            upper_bound,
                        )
                        action = decision.action
                        if action is BatchAction.DROP:
                            continue
                        if action is BatchAction.KEEP or (
                            action is BatchAction.EMPTY and header.records_count == 0
                        ):
                            out, max_timestamp = bytes(data), header.max_timestamp
                        elif action is BatchAction.EMPTY:
                            out, max_timestamp = _empty_batch(header), header.max_timestamp
                        else:
                            kept = {r.offset for r in decision.retained}
                            out, max_timestamp = _rewritten_batch(
                                header,
                                [r for r in records if r.offset in kept],
                                decision.delete_horizon_ms,
                            )
                        counters.records_written += len(decision.retained)
                        counters.bytes_written += len(out)
                        cleaned.append(out, header.last_offset, max_timestamp)
                    cleaned.last_modified = source.mtime
            cleaned.write_out()
            self._step(STEP_CLEANED_LOG_WRITTEN)
            cleaned.finish()
        except BaseException:
            cleaned.remove()
            raise
        return cleaned

    # -- the swap, on the loop ----------------------------------------------------------------

    def _swap(
        self,
        log: PartitionLog,
        views: Sequence[_SegmentView],
        cleaned: _CleanedSegment,
        now_ms: int,
    ) -> None:
        directory = log.directory
        base = cleaned.base_offset
        problem = log.segments_changed([(v.segment, v.size) for v in views])
        if problem is None and not log.config.compact:
            problem = "its cleanup.policy no longer compacts"
        if problem is None:
            segments = log.segments
            following = segments[segments.index(views[-1].segment) + 1]
            if following.base_offset <= log.log_start_offset:
                problem = f"the log start {log.log_start_offset} moved past the segments"
        if problem is not None:
            remove_files(directory, base, CLEANED_SUFFIX)
            raise CleanAborted(f"{log.topic_partition}: {problem}")
        self._step(STEP_SWAP_CHECKED)
        try:
            log.mark_may_have_gaps()
        except BaseException:
            remove_files(directory, base, CLEANED_SUFFIX)
            raise
        self._step(STEP_MARKER_WRITTEN)
        try:
            os.replace(
                segment_file(directory, base, LOG_SUFFIX + CLEANED_SUFFIX),
                segment_file(directory, base, LOG_SUFFIX + SWAP_SUFFIX),
            )
        except OSError as err:
            remove_files(directory, base, CLEANED_SUFFIX)
            raise KafkaStorageError(f"{log.topic_partition}: swapping in {base}: {err}") from err
        self._step(STEP_SWAP_LOG_RENAMED)
        try:
            rename_files(directory, base, CLEANED_SUFFIX, SWAP_SUFFIX, log=False)
            sync_dir(directory)
        except OSError as err:
            # The log goes on with its old segments: a `.swap` left behind would replace them at
            # the next load, after they may have changed (truncated), so it is taken back.
            try:
                remove_files(directory, base, SWAP_SUFFIX)
                remove_files(directory, base, CLEANED_SUFFIX)
                sync_dir(directory)
            except OSError as undo_err:
                raise KafkaStorageError(
                    f"{log.topic_partition}: swapping in cleaned segment {base} failed and "
                    f"could not be undone ({undo_err}); the log must be reloaded: {err}"
                ) from err
            raise KafkaStorageError(
                f"{log.topic_partition}: swapping in cleaned segment {base} failed (undone, "
                f"the log keeps its segments): {err}"
            ) from err
        self._step(STEP_SWAP_RENAMED)
        try:
            for view in views:
                view.segment.delete()
                self._step(STEP_OLD_SEGMENT_DELETED)
            self._step(STEP_OLD_DELETED)
            os.replace(
                segment_file(directory, base, LOG_SUFFIX + SWAP_SUFFIX),
                segment_file(directory, base, LOG_SUFFIX),
            )
            self._step(STEP_SWAP_LOG_COMPLETED)
            rename_files(directory, base, SWAP_SUFFIX, "", log=False)
            sync_dir(directory)
            self._step(STEP_SWAP_COMPLETED)
            new = _open_cleaned(directory, base, log.config.index_interval_bytes, now_ms)
        except OSError as err:
            raise KafkaStorageError(
                f"{log.topic_partition}: swapping in cleaned segment {base} failed after the "
                f"replaced segments' files began to go; reload the log to complete it: {err}"
            ) from err
        log.replace_segments([v.segment for v in views], new)


def _never() -> bool:
    return False


def _open_cleaned(
    directory: pathlib.Path, base_offset: int, index_interval_bytes: int, now_ms: int
) -> LogSegment:
    """The swapped-in segment, opened as loading opens one of a log that may have gaps."""
    segment = LogSegment.open(directory, base_offset, index_interval_bytes, now_ms, allow_gaps=True)
    if segment.needs_recovery:
        try:
            segment.recover(allow_gaps=True)
        except BaseException:
            segment.release()
            raise
    return segment


def _take_snapshot(log: PartitionLog, first_dirty: int) -> _Snapshot:
    """On the loop: what the round reads, so that the cleaner thread never touches `log`."""
    if log.closed:
        raise CleanAborted(f"{log.topic_partition}: the log is closed")
    if not log.config.compact:
        raise CleanAborted(f"{log.topic_partition}: its cleanup.policy does not compact")
    views = []
    first_dirty_position = 0
    segments = log.segments
    for i, segment in enumerate(segments):
        views.append(
            _SegmentView(
                segment,
                segment.base_offset,
                segment.size,
                segment.next_offset,
                len(segment.index) * OFFSET_INDEX_ENTRY.size,
                len(segment.time_index) * TIME_INDEX_ENTRY.size,
                segment_file(log.directory, segment.base_offset, LOG_SUFFIX),
            )
        )
        following = segments[i + 1].base_offset if i + 1 < len(segments) else None
        if segment.base_offset <= first_dirty and (following is None or first_dirty < following):
            first_dirty_position = segment.index.lookup(first_dirty)[1]
    return _Snapshot(
        log.directory, log.config, log.log_start_offset, tuple(views), first_dirty_position
    )


def _covering(
    segments: Sequence[_SegmentView], from_offset: int, to_offset: int
) -> list[_SegmentView]:
    """The segments holding offsets in [from_offset, to_offset) (selection.log_segments)."""
    if to_offset <= from_offset:
        return []
    start = 0
    for i, view in enumerate(segments):
        if view.base_offset <= from_offset:
            start = i
    return [v for v in segments[start:] if v.base_offset < to_offset]


# -- reading segments -----------------------------------------------------------------------


class _SegmentFile:
    """A segment's `.log` through a descriptor of the cleaner's own, read up to the size the
    snapshot saw. A file gone or shorter than that means the log changed: CleanAborted."""

    def __init__(self, view: _SegmentView) -> None:
        self._view = view
        self._fd = -1
        self.mtime = 0.0

    def __enter__(self) -> _SegmentFile:
        try:
            self._fd = os.open(self._view.path, os.O_RDONLY)
        except FileNotFoundError:
            raise CleanAborted(f"{self._view.path.name} was deleted") from None
        try:
            self.mtime = os.fstat(self._fd).st_mtime
        except BaseException:
            os.close(self._fd)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)
        self._fd = -1

    def _read(self, position: int, length: int) -> bytes:
        data = os.pread(self._fd, length, position)
        while len(data) < length:
            more = os.pread(self._fd, length - len(data), position + len(data))
            if not more:
                raise CleanAborted(
                    f"{self._view.path.name} ends at {position + len(data)}, it was "
                    f"{self._view.size} bytes: it shrank while being cleaned"
                )
            data += more
        return data

    def batches(self, start: int, buffer_size: int) -> Iterator[tuple[BatchHeader, memoryview]]:
        """Each whole batch from `start` (a batch boundary) on, CRC checked: (header, bytes)."""
        end = self._view.size
        position = start
        want = buffer_size
        while position < end:
            if end - position < LOG_OVERHEAD:
                raise CorruptRecordError(
                    f"torn batch: {end - position} bytes at the end of {self._view.path.name}",
                    position,
                )
            chunk = self._read(position, min(want, end - position))
            view = memoryview(chunk)
            at = 0
            while len(chunk) - at >= LOG_OVERHEAD:
                (length,) = _INT32.unpack_from(chunk, at + 8)
                if length < BATCH_LENGTH_MIN or position + at + length + LOG_OVERHEAD > end:
                    raise CorruptRecordError(
                        f"bad batchLength {length} in {self._view.path.name}", position + at
                    )
                total = length + LOG_OVERHEAD
                if at + total > len(chunk):
                    break
                try:
                    header = read_header(view, at)
                except CorruptRecordError as err:
                    raise CorruptRecordError(
                        f"{err.reason} in {self._view.path.name}", position + at
                    ) from None
                yield header, view[at : at + total]
                at += total
            if at == 0:
                (length,) = _INT32.unpack_from(chunk, 8)
                want = length + LOG_OVERHEAD  # one batch larger than the buffer
                continue
            position += at
            want = buffer_size

    def headers(self, buffer_size: int) -> Iterator[BatchHeader]:
        """Every batch header (no CRC check: only producer fields are read), reading whole
        chunks and jumping over batches larger than one."""
        end = self._view.size
        position = 0
        while position + HEADER_SIZE <= end:
            chunk = self._read(position, min(max(buffer_size, HEADER_SIZE), end - position))
            at = 0
            while at + HEADER_SIZE <= len(chunk):
                header = parse_header(chunk, at)
                if header.batch_length < BATCH_LENGTH_MIN:
                    raise CorruptRecordError(
                        f"bad batchLength {header.batch_length} in {self._view.path.name}",
                        position + at,
                    )
                yield header
                at += header.size
            position += at


# -- writing the cleaned segment --------------------------------------------------------------


def _rewritten_batch(
    header: BatchHeader, kept: Sequence[DecodedRecord], delete_horizon_ms: int | None
) -> tuple[bytes, int]:
    """The batch with only `kept` (Kafka's buildRetainedRecordsInto) and its max timestamp."""
    log_append = header.log_append_time
    max_timestamp = header.max_timestamp if log_append else max(r.timestamp for r in kept)
    base_timestamp = kept[0].timestamp if delete_horizon_ms is None else delete_horizon_ms
    data = encode_placed_batch(
        [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in kept],
        base_offset=header.base_offset,
        last_offset=header.last_offset,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        compression=header.compression,
        partition_leader_epoch=header.partition_leader_epoch,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        timestamp_type=LOG_APPEND_TIME if log_append else CREATE_TIME,
        is_transactional=header.is_transactional,
        delete_horizon=delete_horizon_ms is not None,
    )
    return data, max_timestamp


def _empty_batch(header: BatchHeader) -> bytes:
    """Kafka's writeEmptyHeader: no records, no codec, baseTimestamp -1, the batch's max
    timestamp, offsets, producer fields and partition leader epoch."""
    return encode_placed_batch(
        (),
        base_offset=header.base_offset,
        last_offset=header.last_offset,
        base_timestamp=-1,
        max_timestamp=header.max_timestamp,
        compression=Compression.NONE,
        partition_leader_epoch=header.partition_leader_epoch,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        timestamp_type=LOG_APPEND_TIME if header.log_append_time else CREATE_TIME,
        is_transactional=header.is_transactional,
    )


class _CleanedSegment:
    """`<base>.log.cleaned` and its indexes being written: the index rule of LogSegment
    (an entry once more than index.interval.bytes were written since the last one)."""

    def __init__(
        self,
        directory: pathlib.Path,
        base_offset: int,
        index_interval_bytes: int,
        buffer_size: int,
    ) -> None:
        self.directory = directory
        self.buffer_size = buffer_size
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.log_path = segment_file(directory, base_offset, LOG_SUFFIX + CLEANED_SUFFIX)
        self.size = 0
        self.last_modified: float | None = None
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._bytes_since_last_index_entry = 0
        self._max_timestamp = -1
        self._offset_of_max_timestamp = base_offset
        self._fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self.index = OffsetIndex.create(
                segment_file(directory, base_offset, INDEX_SUFFIX + CLEANED_SUFFIX), base_offset
            )
            self.time_index = TimeIndex.create(
                segment_file(directory, base_offset, TIME_INDEX_SUFFIX + CLEANED_SUFFIX),
                base_offset,
            )
        except BaseException:
            self.remove()
            raise

    def append(self, data: bytes, last_offset: int, max_timestamp: int) -> None:
        if not fits_relative_offset(self.base_offset, last_offset):
            raise ValueError(f"offset {last_offset} does not fit segment {self.base_offset}")
        position = self.size + self._pending_bytes
        if max_timestamp > self._max_timestamp:
            self._max_timestamp = max_timestamp
            self._offset_of_max_timestamp = last_offset
        if self._bytes_since_last_index_entry > self.index_interval_bytes:
            self.index.append(last_offset, position)
            self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += len(data)
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= self.buffer_size:
            self.write_out()

    def write_out(self) -> None:
        if not self._pending:
            return
        view = memoryview(b"".join(self._pending))
        self._pending.clear()
        self._pending_bytes = 0
        while view:
            written = os.write(self._fd, view)
            self.size += written
            view = view[written:]

    def finish(self) -> None:
        """Write everything, fsync the three files, keep the replaced segments' mtime."""
        self.write_out()
        if self._max_timestamp >= 0:
            self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
        os.fsync(self._fd)
        self.index.flush()
        self.time_index.flush()
        os.close(self._fd)
        self._fd = -1
        if self.last_modified is not None:
            os.utime(self.log_path, (self.last_modified, self.last_modified))

    def remove(self) -> None:
        """Close and delete the `.cleaned` files (a round that failed or was aborted)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            remove_files(self.directory, self.base_offset, CLEANED_SUFFIX)
        except OSError as err:
            _log.warning("cleaned_files_not_removed", path=str(self.log_path), error=str(err))
