"""The pure half of appends: checking and stamping batches, and the segment roll rules.

No I/O and no log state: `PartitionLog` passes in what it knows (LEO, epoch cache head, config)
and writes what these return. A leader append is validated (client/batch.py), gets its offsets
and leader epoch stamped in place (and LogAppendTime when the topic says so); a follower append
must start at the LEO and be contiguous, or, when its log may take gaps (a compacted topic, or a
log with the `.may-have-gaps` marker), start at or above the LEO with each batch at or above the
previous one's next offset (Kafka's rule: a cleaned leader log has gaps). Either is described
as `AppendEntry` rows (what `LogSegment.append` indexes) plus the new epochs the epoch cache
must learn first (KIP-279).

Rolls: `should_roll` is Kafka's LogSegment.shouldRoll on `roll_clock` times; `time_waited`
is the segment.ms clock both the one-write path and the split path of `PartitionLog` use.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.epoch_cache import EpochEntry
from minibroker.broker.storage.errors import UnexpectedAppendOffsetError
from minibroker.broker.storage.segment import AppendEntry, LogSegment
from minibroker.client.batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    assign_offsets,
    crc_of,
    iter_batches,
    validate_producer_batches,
)
from minibroker.client.errors import RecordListTooLargeError
from minibroker.client.types import TopicPartition

_INT16 = struct.Struct(">h")
_INT64 = struct.Struct(">q")
_UINT32 = struct.Struct(">I")


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


class PlannedAppend(NamedTuple):
    """What to write: the bytes, one AppendEntry per batch, their largest timestamp, the
    (epoch, start offset) pairs to record first, and what to answer once it is written."""

    data: bytes | bytearray | memoryview
    entries: list[AppendEntry]
    max_timestamp: int
    new_epochs: tuple[tuple[int, int], ...]
    info: AppendInfo
    # A batch starts above the previous one's next offset (or the first above the LEO): the
    # log must carry the gaps marker before these bytes are written.
    has_gap: bool = False


def plan_leader_append(
    records: bytes | bytearray | memoryview,
    leader_epoch: int,
    now_ms: int,
    config: LogConfig,
    first_offset: int,
    latest_epoch: EpochEntry | None,
    log_start_offset: int,
    max_message_bytes: int | None = None,
    validated: list[tuple[int, BatchHeader]] | None = None,
) -> PlannedAppend:
    """Validate a produce request's batches and stamp offsets from `first_offset` (the LEO),
    the leader epoch and, for LogAppendTime, the time; raises (changing nothing) when invalid.
    `validated`: what `validate_producer_batches` returned for these bytes and limit."""
    if leader_epoch < 0:
        raise ValueError(f"a leader append needs a leader epoch, got {leader_epoch}")
    limit = config.max_message_bytes if max_message_bytes is None else max_message_bytes
    batches = validate_producer_batches(records, limit) if validated is None else validated
    segment_bytes = config.segment_bytes
    for position, header in batches:
        if header.batch_length + 12 > segment_bytes:
            raise RecordListTooLargeError(
                f"batch at position {position} is {header.size} bytes, larger than "
                f"segment.bytes ({segment_bytes})"
            )
    buf = bytearray(records)
    assign_offsets(buf, batches, first_offset, leader_epoch)
    append_time = now_ms if config.log_append_time else -1
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
    new_epochs: tuple[tuple[int, int], ...] = ()
    if latest_epoch is None or latest_epoch.epoch != leader_epoch:
        new_epochs = ((leader_epoch, first_offset),)
    info = AppendInfo(
        first_offset,
        base - 1,
        max_timestamp,
        append_time,
        log_start_offset,
        len(buf),
        records_count,
        tuple(received),
        leader_epoch,
    )
    return PlannedAppend(buf, entries, max_timestamp, new_epochs, info)


def plan_follower_append(
    records: bytes | bytearray | memoryview,
    topic_partition: TopicPartition,
    expected: int,
    last_epoch: int | None,
    log_start_offset: int,
    *,
    allow_gaps: bool = False,
) -> PlannedAppend:
    """Check the leader's batches (CRCs; the first at `expected`, the LEO, each right after the
    previous one: UnexpectedAppendOffsetError otherwise); each new batch epoch is to be recorded
    at the batch's base offset. `records` must not be empty.

    `allow_gaps` (the log's topic is compacted or its log may have gaps already): a batch may
    start above `expected` (the LEO for the first, the previous batch's next offset for the
    others), never below it; `has_gap` in the plan says whether one did."""
    entries: list[AppendEntry] = []
    headers: list[BatchHeader] = []
    new_epochs: list[tuple[int, int]] = []
    max_timestamp = -1
    records_count = 0
    has_gap = False
    for position, header in iter_batches(records):
        if header.base_offset != expected:
            if allow_gaps and header.base_offset > expected:
                has_gap = True
            else:
                where = "first batch" if not headers else f"batch at position {position}"
                rule = "at or above" if allow_gaps else "at"
                raise UnexpectedAppendOffsetError(
                    f"{topic_partition}: {where} starts at offset {header.base_offset}, "
                    f"expected {rule} {expected}",
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
    info = AppendInfo(
        headers[0].base_offset,
        expected - 1,
        max_timestamp,
        -1,
        log_start_offset,
        len(records),
        records_count,
        tuple(headers),
        -1,
    )
    return PlannedAppend(records, entries, max_timestamp, tuple(new_epochs), info, has_gap)


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


# -- rolls ------------------------------------------------------------------------------------


def roll_clock(timestamp: int, now_ms: int, retention_ms: int) -> int:
    """When a batch counts as written for segment.ms: its timestamp, taken into
    [now - retention.ms, now] (no lower bound when retention.ms is -1); now when it has none.

    Kafka measures a segment's age from its first batch's timestamp to the new batch's, so a
    producer stamping each batch segment.ms after the last rolled a segment per batch, and one
    stamped far ahead held its segment open for good. Bounded this way, each time roll moves
    the segment's clock start forward by more than segment.ms inside [log's first clock -
    retention.ms, now]: at most (retention.ms + elapsed broker time) / segment.ms time rolls
    after each segment that was started otherwise (by size, truncation, an explicit roll).
    A batch older than retention.ms is due for deletion anyway, so telling such batches apart
    by segment gains nothing.
    """
    if timestamp < 0 or timestamp > now_ms:
        return now_ms
    if retention_ms >= 0 and timestamp < now_ms - retention_ms:
        return now_ms - retention_ms
    return timestamp


def time_waited(segment: LogSegment, now_ms: int, clock: int, first_clock: int) -> int:
    """How long `segment` has waited for a time roll when a batch of `clock` joins it: for an
    empty one, since `first_clock` (the clock of the first batch the write puts in it)."""
    if segment.size == 0:
        return clock - first_clock
    return segment.time_waited_for_roll(now_ms, clock)


def should_roll(
    segment: LogSegment,
    config: LogConfig,
    now_ms: int,
    run_bytes: int,
    clock: int,
    last_offset: int,
) -> bool:
    """Kafka's LogSegment.shouldRoll before writing `run_bytes` whose clock is `clock` and last
    offset `last_offset`: a segment that holds data rolls when they would take it past
    segment.bytes or when it has waited more than segment.ms; any segment, an empty one too,
    rolls when its index cannot hold the last offset (a follower appending past a gap of more
    than 2^31 offsets of a compacted leader log: the empty segment stays behind, which a log
    with gaps allows)."""
    return (
        segment.size > 0
        and (
            segment.size > config.segment_bytes - run_bytes
            or segment.time_waited_for_roll(now_ms, clock) > config.segment_ms
        )
    ) or not segment.can_hold_offset(last_offset)
