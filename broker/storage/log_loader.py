"""Loading a partition's log from its dir (Kafka's LogLoader): what `PartitionLog.open` runs.

Does file I/O in the partition dir: lists it (removing `.tmp` leftovers and index files whose
`.log` is gone), opens every segment, checks or recovers them (segment.py, with the batch rules
of segment_scan.py plus the epoch rules of `RecoveryCheck`), and rewrites the
`leader-epoch-checkpoint` when loading changed the cache.

A log whose dir holds the `.may-have-gaps` marker (GAPS_MARKER: a compacted log, or a follower's
copy of one) is checked with gaps allowed: a batch or segment may start above where the previous
one ended and a non-active segment may be empty; without the marker a gap is damage, as before.

After an unclean shutdown, segments from the one holding the recovery point on are recovered:
scanned batch by batch, their indexes rebuilt, and the first torn or corrupt batch and everything
after it (later segments too) removed. Any segment whose indexes are missing or inconsistent is
recovered the same way, whatever the shutdown. The other segments (all of them after a clean
shutdown) are read and checked without rebuilding anything, and a corrupt batch found there is
handled as after a crash: the log is recovered from that segment, so it is cut at the batch. The
replicas re-fetch what was cut; nothing that loads a log meets a corrupt batch.

That check or recovery is the load's only pass over the batches: it also rebuilds a missing
epoch checkpoint, learns the epochs at and above the recovery point when the OS restarted since
the log was written (the checkpoint is fsynced only when the recovery point moves, so a power
loss may have lost those entries), and gathers the batches the idempotent-producer state is
rebuilt from, so a log that needs no recovery is read once (besides each segment's index tail and
first header, read when the segment is opened).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import pathlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from minibroker.broker.storage.checkpoint import (
    LEADER_EPOCH_CHECKPOINT,
    LeaderEpochCheckpointFile,
    fsync_dir,
)
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.epoch_cache import EpochCache, EpochEntry
from minibroker.broker.storage.errors import CorruptCheckpointError
from minibroker.broker.storage.segment import LogSegment
from minibroker.broker.storage.segment_swap import complete_interrupted_swaps
from minibroker.client.batch import NO_PARTITION_LEADER_EPOCH, BatchHeader
from minibroker.client.common.log import get_logger
from minibroker.client.log_format import LOG_SUFFIX, parse_segment_file_name
from minibroker.client.types import TopicPartition

_log = get_logger("minibroker.broker.storage")
# The empty file whose presence says the log may have offset gaps (a cleaned segment, or a
# follower that appended past a gap of its leader's compacted log). Sticky: written (and made
# durable) before the first gap can reach the log, never removed; the dir goes with the topic.
GAPS_MARKER = ".may-have-gaps"
# How many of each producer's newest batches loading hands over for the idempotent-producer
# state: at least as many as that state remembers per producer (BATCHES_PER_PRODUCER in the
# replication layer; a unit test holds the two together). A producer's older batches cannot
# change its state, so they need not be kept.
PRODUCER_BATCHES_KEPT = 5


@dataclass
class LoadedLog:
    """What loading found: the segments kept (contiguous, or in increasing order when the log
    may have gaps; at least one), the offsets and the epoch cache (trimmed to them, and on
    disk), the newest batches of each producer, and whether the gaps marker is there."""

    segments: list[LogSegment]
    epoch_cache: EpochCache
    log_start_offset: int
    recovery_point: int
    producer_batches: list[BatchHeader]
    may_have_gaps: bool = False


def has_gaps_marker(path: pathlib.Path) -> bool:
    """Whether the partition dir `path` holds the `.may-have-gaps` marker."""
    return os.path.exists(path / GAPS_MARKER)


def write_gaps_marker(path: pathlib.Path) -> None:
    """Create the `.may-have-gaps` marker in `path` (idempotent) and make it durable: the file
    and the dir are fsynced before this returns. Raises OSError on failure."""
    marker = path / GAPS_MARKER
    existed = os.path.exists(marker)
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(path)
    except OSError:
        if not existed:
            # A marker that may not be durable is no promise: take it back (best effort; one
            # left behind only makes the load accept gaps, which a gapless log has none of).
            with contextlib.suppress(OSError):
                os.unlink(marker)
        raise


def segment_bases(path: pathlib.Path) -> list[int]:
    """The base offsets of the `.log` files in `path`, sorted; first completes (or undoes) what
    a crash left of a cleaner's segment swap (segment_swap.py: `.cleaned` files deleted, a
    `.swap` segment replaces the segments it covers), then removes `.tmp` leftovers and the
    files of a base offset whose `.log` is gone (they would shadow a future segment)."""
    complete_interrupted_swaps(path)
    bases: list[int] = []
    for name in os.listdir(path):
        parsed = parse_segment_file_name(name)
        if parsed is not None and parsed[1] == LOG_SUFFIX:
            bases.append(parsed[0])
        if name.endswith(".tmp"):
            os.unlink(path / name)
    bases.sort()
    for name in os.listdir(path):
        parsed = parse_segment_file_name(name)
        if parsed is not None and parsed[0] not in bases:
            os.unlink(path / name)
    return bases


def load_log(
    path: pathlib.Path,
    topic_partition: TopicPartition,
    config: LogConfig,
    now_ms: int,
    *,
    recovery_point: int,
    log_start_offset: int,
    had_clean_shutdown: bool,
    system_restarted: bool = False,
) -> LoadedLog:
    """Open, check or recover every segment in `path` (module docstring). On failure no file
    descriptor of the log stays open."""
    bases = segment_bases(path)
    may_have_gaps = has_gaps_marker(path)
    epoch_file = LeaderEpochCheckpointFile(path / LEADER_EPOCH_CHECKPOINT)
    try:
        stored = epoch_file.read()
    except CorruptCheckpointError as err:
        _log.warning("epoch_checkpoint_unreadable", path=str(epoch_file.path), error=str(err))
        stored = None
    segments: list[LogSegment] = []
    try:
        for base in bases:
            segments.append(
                LogSegment.open(
                    path, base, config.index_interval_bytes, now_ms, allow_gaps=may_have_gaps
                )
            )
        recover_from = len(segments)
        if not had_clean_shutdown:
            recover_from = max(bisect.bisect_right(bases, recovery_point) - 1, 0)
        return _recover(
            path,
            topic_partition,
            config,
            now_ms,
            segments,
            recover_from,
            epoch_file,
            stored,
            recovery_point=recovery_point,
            log_start_offset=log_start_offset,
            had_clean_shutdown=had_clean_shutdown,
            system_restarted=system_restarted,
            may_have_gaps=may_have_gaps,
        )
    except BaseException:
        # Do not leak the file descriptors of a log that failed to load.
        for segment in segments:
            segment.release()
        raise


def _recover(
    path: pathlib.Path,
    topic_partition: TopicPartition,
    config: LogConfig,
    now_ms: int,
    segments: list[LogSegment],
    recover_from: int,
    epoch_file: LeaderEpochCheckpointFile,
    stored: list[EpochEntry] | None,
    *,
    recovery_point: int,
    log_start_offset: int,
    had_clean_shutdown: bool,
    system_restarted: bool,
    may_have_gaps: bool = False,
) -> LoadedLog:
    """`load_log`'s second half: recover what needs it, then trim the cache to the log."""
    cache = EpochCache(stored or ())
    trusted_cache = stored is not None
    # The file is written without fsync and fsynced before the recovery point moves
    # (epoch_checkpoint.py). A process crash loses nothing of it, so it names every batch's
    # epoch and a batch that disagrees is corrupt. After the OS restarted (a power loss) it is
    # trusted below the recovery point only: the epochs at and above it are learned from the
    # batches instead, which cannot tell a lost entry from a damaged epoch field there.
    learn_from = (
        recovery_point if system_restarted and trusted_cache and not had_clean_shutdown else None
    )
    if learn_from is not None:
        cache.truncate_from_end(learn_from)
    check = RecoveryCheck(cache if trusted_cache else None, learn_from)
    kept: list[LogSegment] = []
    truncated_bytes = 0
    recovered = 0
    for i, segment in enumerate(segments):
        # Segments follow each other: the next starts where the previous ended, or later in a
        # log that may have gaps (a cleaned segment, or one emptied by cleaning, ends below the
        # next one's base offset). A segment starting below the previous one's end overlaps it.
        if kept and segment.base_offset != kept[-1].next_offset:
            overlap = segment.base_offset < kept[-1].next_offset
            if overlap or not may_have_gaps:
                _log.warning(
                    "log_segment_overlap" if overlap else "log_segment_gap",
                    topic=topic_partition.topic,
                    partition=topic_partition.partition,
                    base_offset=segment.base_offset,
                    expected=kept[-1].next_offset,
                )
                for later in segments[i:]:
                    later.delete()
                break
        if i < recover_from and not segment.needs_recovery:
            problem = segment.find_damage(check, allow_gaps=may_have_gaps)
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
        truncated = segment.recover(check, allow_gaps=may_have_gaps)
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
    if not trusted_cache:
        _rebuild_epoch_cache(cache, check.epoch_starts)
    elif learn_from is not None:
        for epoch, start_offset in check.epoch_starts:
            if start_offset >= learn_from:
                cache.assign(epoch, start_offset)
    cache.truncate_from_end(leo)
    cache.truncate_from_start(start)
    if tuple(stored or ()) != cache.entries:
        epoch_file.write(cache.entries)
    if recovered or truncated_bytes:
        _log.info(
            "log_recovered",
            topic=topic_partition.topic,
            partition=topic_partition.partition,
            segments_recovered=recovered,
            truncated_bytes=truncated_bytes,
            leo=leo,
        )
    return LoadedLog(
        kept,
        cache,
        start,
        leo if had_clean_shutdown else min(recovery_point, leo),
        check.producer_batches(),
        may_have_gaps,
    )


def _rebuild_epoch_cache(cache: EpochCache, epoch_starts: Sequence[tuple[int, int]]) -> bool:
    """Rebuild the cache (the checkpoint was missing or corrupt) from where the load's pass saw
    each epoch start."""
    changed = cache.clear()
    for epoch, start_offset in epoch_starts:
        changed = cache.assign(epoch, start_offset) or changed
    return changed


class NewestBatches:
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

    def extend(self, later: NewestBatches) -> None:
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


class RecoveryCheck:
    """The load's pass over the batches it keeps: checks beyond CRC and offsets (the epoch
    fields), and what the rest of the load needs from those batches.

    `partitionLeaderEpoch` sits outside the CRC, so a flipped byte there would pass it. Epochs
    never go back along a log, and when the checkpointed cache is present it names the epoch
    of every batch (it is written before the batch), so a batch that disagrees is corrupt.

    `LogSegment.find_damage` and `LogSegment.recover` call it (through SegmentScan) on each
    batch in log order, as the last test before keeping it, so a batch it passes is kept unless
    the segment turns out to need recovery after all; what it learns (where each epoch starts,
    each producer's newest batches) is therefore staged per segment: `commit` once the segment
    is kept (checked whole, or recovered), `discard` when it is to be read again.
    """

    def __init__(self, cache: EpochCache | None, learn_from: int | None = None) -> None:
        # The cache does not change while the log loads: its columns are copied once.
        entries = cache.entries if cache is not None else ()
        self._starts = [entry.start_offset for entry in entries]
        self._epochs = [entry.epoch for entry in entries]
        # From this offset on the cache may lack epochs (they were not fsynced yet): the
        # batches' epochs are learned there, and only checked never to go back.
        self._learn_from = learn_from
        self._previous_epoch = NO_PARTITION_LEADER_EPOCH
        self._committed_epoch = NO_PARTITION_LEADER_EPOCH
        self._staged_epoch_starts: list[tuple[int, int]] = []
        self._epoch_starts: list[tuple[int, int]] = []
        self._staged_producers = NewestBatches()
        self._producers = NewestBatches()

    def __call__(self, header: BatchHeader) -> str | None:
        epoch = header.partition_leader_epoch
        if epoch < NO_PARTITION_LEADER_EPOCH:
            return f"invalid partitionLeaderEpoch {epoch}"
        previous = self._previous_epoch
        if epoch < previous:
            return f"partitionLeaderEpoch {epoch} after {previous}"
        starts = self._starts
        learn_from = self._learn_from
        if starts and (learn_from is None or header.base_offset < learn_from):
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
        if producer_id >= 0:  # `NewestBatches.add` inlined: this runs once per batch
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
            self._staged_producers = NewestBatches()

    def discard(self) -> None:
        """The batches passed since the last commit or discard will be checked again."""
        self._previous_epoch = self._committed_epoch
        self._staged_epoch_starts.clear()
        self._staged_producers = NewestBatches()

    def forget(self) -> None:
        """Every batch passed is gone from the log."""
        self.discard()
        self._epoch_starts.clear()
        self._producers = NewestBatches()

    @property
    def epoch_starts(self) -> list[tuple[int, int]]:
        """(epoch, offset of its first batch) for each epoch of the kept batches, in order."""
        return self._epoch_starts

    def producer_batches(self) -> list[BatchHeader]:
        """The newest PRODUCER_BATCHES_KEPT kept batches of each producer id, oldest first."""
        return self._producers.headers()
