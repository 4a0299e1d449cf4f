"""Helpers of the cleaner's tests (test_cleaner*.py): a compacted log on disk written with keyed
batches, the facts the selection rules take from it, and a reader of the whole log.

Run as a module (`python -m tests.unit.cleaner_support DIR STEP N`) it is the crash tests' child:
it opens the log in DIR, cleans it with a step hook that SIGKILLs the process the N-th time the
hook is called with STEP, and exits 0 if that never happened.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from minibroker.broker.cleaner.cleaner import Cleaner, CleanerStats
from minibroker.broker.cleaner.offset_map import OffsetMap
from minibroker.broker.cleaner.selection import (
    CompactionConfig,
    LogFacts,
    LogToClean,
    SegmentFacts,
    log_to_clean,
)
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.log import PartitionLog
from minibroker.client.batch import Compression
from minibroker.client.records import encode_batch, iter_decoded_batches
from minibroker.client.types import TopicPartition

TP = TopicPartition("changes", 0)
RETENTION_MS = 10_000
CONFIG = LogConfig(
    segment_bytes=4096,
    index_interval_bytes=200,
    compact=True,
    delete=False,
    delete_retention_ms=RETENTION_MS,
)
MAP_BYTES = 64 * 1024
# The crash tests' log: segments of about 300 bytes, so each cleaned group merges three.
CRASH_CONFIG = dataclasses.replace(CONFIG, segment_bytes=1000)


def open_log(directory: pathlib.Path, config: LogConfig = CONFIG) -> PartitionLog:
    return PartitionLog.open(directory, TP, config, now_ms=0)


def write(
    log: PartitionLog,
    records: Sequence[tuple[bytes | None, bytes | None]],
    *,
    ts: int = 1_000,
    producer: tuple[int, int, int] | None = None,
    compression: Compression = Compression.NONE,
    epoch: int = 0,
) -> int:
    """Append one batch of (key, value) records as the leader; returns its base offset.
    `producer` is (producer id, epoch, base sequence)."""
    pid, pepoch, seq = producer if producer is not None else (-1, -1, -1)
    data = encode_batch(
        [(ts + i, key, value, ()) for i, (key, value) in enumerate(records)],
        compression=compression,
        producer_id=pid,
        producer_epoch=pepoch,
        base_sequence=seq,
    )
    return log.append_as_leader(data, epoch, now_ms=ts).first_offset


def facts(log: PartitionLog, checkpoint: int | None = None) -> LogFacts:
    """What the manager gives the selection rules: every segment, the HW at the LEO."""
    config = log.config
    return LogFacts(
        topic_partition=log.topic_partition,
        config=CompactionConfig(
            cleanup_policy="compact",
            min_cleanable_dirty_ratio=config.min_cleanable_dirty_ratio,
            min_compaction_lag_ms=config.min_compaction_lag_ms,
            max_compaction_lag_ms=config.max_compaction_lag_ms,
            delete_retention_ms=config.delete_retention_ms,
            segment_bytes=config.segment_bytes,
        ),
        log_start_offset=log.log_start_offset,
        log_end_offset=log.leo,
        segments=tuple(
            SegmentFacts(s.base_offset, s.size, largest_timestamp=s.max_timestamp_so_far)
            for s in log.segments
        ),
        upper_bound=log.leo,
        checkpoint=checkpoint,
    )


def to_clean(log: PartitionLog, now_ms: int, checkpoint: int | None = None) -> LogToClean:
    return log_to_clean(facts(log, checkpoint), now_ms)[0]


def clean(
    log: PartitionLog,
    now_ms: int,
    checkpoint: int | None = None,
    cleaner: Cleaner | None = None,
) -> CleanerStats:
    cleaner = cleaner or Cleaner(OffsetMap(MAP_BYTES))
    return cleaner.clean(log, to_clean(log, now_ms, checkpoint), now_ms)


@dataclass(frozen=True)
class ReadRecord:
    offset: int
    key: bytes | None
    value: bytes | None
    batch_base: int
    batch_last: int


def read_all(log: PartitionLog) -> list[ReadRecord]:
    """Every record from the log start, batch by batch as a consumer reads (position = the
    next offset after the last batch read, gaps included). Asserts batch order on the way."""
    out: list[ReadRecord] = []
    offset = log.log_start_offset
    previous_last = -1
    while offset < log.leo:
        info = log.read(offset, 1 << 20)
        if not info.records:
            break
        for batch in iter_decoded_batches(info.records):
            assert batch.base_offset > previous_last, "batches out of order"
            previous_last = batch.last_offset
            for r in batch.records:
                assert batch.base_offset <= r.offset <= batch.last_offset
                out.append(
                    ReadRecord(r.offset, r.key, r.value, batch.base_offset, batch.last_offset)
                )
        offset = info.next_offset
    return out


def latest(records: Sequence[ReadRecord]) -> dict[bytes, bytes | None]:
    """Each key's last value in `records` (None: its last record is a tombstone)."""
    values: dict[bytes, bytes | None] = {}
    for r in records:
        assert r.key is not None
        values[r.key] = r.value
    return values


def build_crash_log(directory: pathlib.Path) -> PartitionLog:
    """A log of small segments (rolled every few batches, so that groups merge several) with
    overwritten keys, tombstones and an idempotent producer; closed cleanly by the caller."""
    log = open_log(directory, CRASH_CONFIG)
    for round_ in range(12):
        for j in range(3):
            key = b"k%d" % ((round_ * 3 + j) % 7)
            value = None if (round_ + j) % 5 == 4 else b"v%d-%d" % (round_, j)
            producer = (9, 0, round_ * 3 + j) if j == 1 else None
            records = [(key, value), (b"k%d" % (j % 7), b"w%d" % round_)]
            if j == 2:  # a key written once: every cleaned group keeps some of its segments
                records.append((b"once-%d" % round_, b"v"))
            write(log, records, producer=producer)
        log.roll(now_ms=1_000)
    write(log, [(b"k0", b"active")])
    return log


def _child(directory: pathlib.Path, step: str, occurrence: int) -> int:
    seen = 0

    def hook(name: str) -> None:
        nonlocal seen
        if name == step:
            seen += 1
            if seen == occurrence:
                os.kill(os.getpid(), signal.SIGKILL)

    log = open_log(directory, CRASH_CONFIG)
    cleaner = Cleaner(OffsetMap(MAP_BYTES), step_hook=hook)
    checkpoint = int(sys.argv[4]) if len(sys.argv) > 4 else None
    clean(log, 5_000, checkpoint, cleaner=cleaner)
    log.flush()
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(_child(pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
