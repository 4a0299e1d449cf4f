"""Decoding a fetched partition's record batches into its buffer (Kafka's CompletedFetch).

Pure: no I/O. `decode_into` reads the batches of one fetch answer from the partition's fetch
offset on: records below that offset inside a returned batch are skipped and control batches
passed over, as Kafka's consumer does; a batch cut off at the end of the answer is left for the
next fetch. A corrupt batch raises CorruptRecordError naming the partition and offset, after the
records before it are buffered (the fetch offset stops at it, so they are not delivered twice).

Decoding is bounded: one batch may decompress to at most `limit` bytes (the leader's own limit,
64 x max.message.bytes), and decoding stops once one answer decoded `limit` bytes; the rest
waits for the next fetch (see PartitionState.fetchable), so a few KiB of compressed bytes cannot
become gigabytes of records.
"""

from __future__ import annotations

from collections import deque

from minibroker.client.batch import BatchHeader, CorruptRecordError, read_header
from minibroker.client.records import LOG_APPEND_TIME, decode_records_sized, is_partial_tail
from minibroker.client.subscription import PartitionState
from minibroker.client.types import Record, TopicPartition


def decode_into(state: PartitionState, raw: bytes, limit: int) -> bool:
    """Decode the answer `raw` into `state.buffer`; True when the fetch offset moved on.

    The fetch offset moves to the next offset of each batch passed (its last offset + 1),
    whatever records it still holds: a compacted log keeps a batch's offsets with records
    removed and skips offsets between batches. When nothing is left to hand out, the position
    follows it (`move_past_fetched`)."""
    tp = state.tp
    next_offset = state.fetch_offset
    epoch = state.fetch_epoch
    buffer = state.buffer
    state.decode_limit = limit
    decoded = 0
    pos = 0
    end = len(raw)
    try:
        while pos < end:
            if is_partial_tail(raw, pos):
                break  # the response ends inside a batch; the next fetch starts at it
            try:
                header = read_header(raw, pos)
            except CorruptRecordError as err:
                raise CorruptRecordError(
                    err.reason, err.position, where=f"of {tp} at offset {next_offset}"
                ) from None
            if header.last_offset >= next_offset and not header.is_control:
                if decoded >= limit:
                    break  # enough for one response: memory stays bounded
                decoded += _decode_batch(buffer, tp, header, raw, pos, next_offset, limit)
            if header.last_offset + 1 > next_offset:
                next_offset = header.last_offset + 1
                if header.partition_leader_epoch >= 0:
                    epoch = header.partition_leader_epoch
            pos += header.size
    finally:
        state.decoded_bytes += decoded
        moved = next_offset > state.fetch_offset
        if moved:
            state.fetch_offset = next_offset
            state.fetch_epoch = epoch
            if not state.buffer:
                state.move_past_fetched()
    return moved


def _decode_batch(
    buffer: deque[Record],
    tp: TopicPartition,
    header: BatchHeader,
    raw: bytes,
    pos: int,
    next_offset: int,
    limit: int,
) -> int:
    """Buffer the records at or after `next_offset` of the batch at `pos`; returns the size
    of its records decompressed."""
    topic, partition = tp
    ts_type = LOG_APPEND_TIME if header.log_append_time else 0
    epoch = header.partition_leader_epoch

    # Records are built straight from the decoder's fields as Record tuples (tuple.__new__,
    # not Record(...), whose generated __new__ is a Python frame of its own): the compiled
    # decoder fills topic and partition (prefix) and timestamp type and epoch (suffix) itself,
    # with no Python call per record.
    prefix = (topic, partition)
    suffix = (ts_type, epoch)
    try:
        records, size = decode_records_sized(raw, pos, header, Record, limit, prefix, suffix)
    except CorruptRecordError as err:
        # Kafka's consumer names the partition and offset and leaves skipping it to a seek.
        raise CorruptRecordError(
            f"{err.reason}; seek to offset {header.last_offset + 1} to skip the batch",
            err.position,
            where=f"of {tp} at offset {header.base_offset}",
        ) from None
    if header.base_offset < next_offset:
        # Kafka skips records below the fetch offset inside a batch.
        records = [r for r in records if r.offset >= next_offset]
    buffer.extend(records)
    return size


__all__ = ["decode_into"]
