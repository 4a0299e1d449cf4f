"""The leader's check of produced records before it appends them (Kafka's LogValidator).

Pure: no I/O, no clock (`now_ms` comes in). `client.batch.validate_producer_batches` checks headers,
CRCs and counts; `validate_producer_records` does the rest, per batch, so that every batch a
leader stores decodes with `minibroker.client.records.decode`. Leader produce path only: a
follower stores the leader's bytes as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from minibroker.client.batch import (
    COMPRESSION_MASK,
    HEADER_SIZE,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    Compression,
    CorruptRecordError,
)
from minibroker.client.compression import decompress_bounded
from minibroker.client.errors import CorruptMessageError, InvalidRecordError, InvalidTimestampError
from minibroker.client.records.bounds import (
    DEFAULT_MAX_MESSAGE_BYTES,
    UNCOMPRESSED_LIMIT_FACTOR,
    uncompressed_limit,
)
from minibroker.client.records.decode import (
    MIN_RECORD_BODY_BYTES,
    MIN_RECORD_BYTES,
    parse_columns,
    parse_headers,
    parse_records,
)
from minibroker.client.records.varint import (
    INT64_MAX,
    INT64_MIN,
    VarintTooLong,
    read_varint_unchecked,
    read_varlong_unchecked,
    zigzag,
)
from minibroker.client.topic_config import is_compacted

# Kafka 4's `message.timestamp.after.max.ms` default (KIP-1030): one hour ahead of the broker.
DEFAULT_TIMESTAMP_AFTER_MAX_MS = 3_600_000
NO_TIMESTAMP = -1  # RecordBatch.NO_TIMESTAMP: a record without a timestamp


class RecordValidation(NamedTuple):
    """The topic settings a leader checks produced records against.

    `log_append_time` is `message.timestamp.type=LogAppendTime`: the broker stamps its own clock,
    so the producer's timestamps are not checked. The two bounds are
    `message.timestamp.before.max.ms` / `after.max.ms` (KIP-937), in ms either side of now.
    """

    log_append_time: bool = False
    timestamp_before_max_ms: int = INT64_MAX
    timestamp_after_max_ms: int = DEFAULT_TIMESTAMP_AFTER_MAX_MS
    max_uncompressed_bytes: int = UNCOMPRESSED_LIMIT_FACTOR * DEFAULT_MAX_MESSAGE_BYTES
    # cleanup.policy includes compact: every record needs a key (Kafka's LogValidator).
    require_keys: bool = False

    @classmethod
    def from_topic_config(cls, typed: Mapping[str, Any]) -> RecordValidation:
        """From a topic's resolved configs (`client.topic_config.resolve_topic_config`)."""
        return cls(
            typed["message.timestamp.type"] == "LogAppendTime",
            typed["message.timestamp.before.max.ms"],
            typed["message.timestamp.after.max.ms"],
            uncompressed_limit(typed["max.message.bytes"]),
            is_compacted(typed),
        )


def validate_producer_records(
    buf: bytes | bytearray | memoryview,
    batches: Iterable[tuple[int, BatchHeader]],
    now_ms: int,
    rules: RecordValidation,
) -> None:
    """Check the records of a produce request's batches before the leader appends them.

    `batches` is what `client.batch.validate_producer_batches` returned for `buf` (headers,
    CRCs and counts are already checked). This is the rest of Kafka's LogValidator, per batch:
    baseOffset 0; a base sequence with a producer id; no LogAppendTime from a producer; a known
    codec that decompresses (to at most `rules.max_uncompressed_bytes`); records that parse
    exactly to the end of the batch, as many as `recordsCount`, with offset deltas 0..n-1;
    maxTimestamp the records' largest; for compacted topics (`rules.require_keys`), a key in
    every record; and, for CreateTime topics, every timestamp within the topic's before/after
    bounds of `now_ms` (-1, no timestamp, is not checked, as in Kafka; other negative timestamps
    are refused).

    Raises InvalidRecordError (INVALID_RECORD: records that do not parse or do not match their
    header), CorruptMessageError (CORRUPT_MESSAGE: unknown codec, decompression failure) or
    InvalidTimestampError (INVALID_TIMESTAMP). Leader produce path only: a follower stores the
    leader's bytes as they are, and a consumer's decoder accepts every batch this accepts.
    """
    for pos, header in batches:
        _validate_batch(buf, pos, header, now_ms, rules)


def _validate_batch(
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    now_ms: int,
    rules: RecordValidation,
) -> None:
    where = f"batch at position {pos}"
    if header.base_offset != 0:
        raise InvalidRecordError(
            f"{where}: baseOffset is {header.base_offset}; a producer's batch starts at 0"
        )
    if header.producer_id >= 0 and header.base_sequence < 0:
        raise InvalidRecordError(
            f"{where}: invalid sequence number {header.base_sequence} with producer id "
            f"{header.producer_id}"
        )
    if header.attributes & TIMESTAMP_TYPE_MASK:
        raise InvalidTimestampError(
            f"{where}: the producer set the timestamp type to LogAppendTime; only the broker does"
        )
    codec_id = header.attributes & COMPRESSION_MASK
    if codec_id > Compression.ZSTD:
        raise CorruptMessageError(f"{where}: unknown compression codec id {codec_id}")
    section = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    if codec_id == Compression.NONE:
        data = bytes(section)  # one copy, whether `buf` is bytes, a bytearray or a view
    else:
        try:
            data = decompress_bounded(Compression(codec_id), section, rules.max_uncompressed_bytes)
        except CorruptRecordError as err:
            raise CorruptMessageError(f"{where}: {err.reason}") from None
    try:
        min_delta, max_delta = _check_records(data, header.records_count)
    except CorruptRecordError as err:
        raise InvalidRecordError(f"{where}: {err.reason}") from None
    if rules.require_keys:
        _check_keys(data, header, pos, where)
    if rules.log_append_time:
        return  # the broker's clock replaces every timestamp (storage stamps it)
    base = header.base_timestamp
    if base + max_delta != header.max_timestamp:
        raise InvalidRecordError(
            f"{where}: maxTimestamp {header.max_timestamp} is not the records' largest "
            f"timestamp {base + max_delta}"
        )
    lowest = base + min_delta
    if lowest >= 0:
        # Every timestamp lies in [lowest, highest]: checking the two ends checks them all.
        _check_timestamp(lowest, now_ms, rules, where)
        _check_timestamp(base + max_delta, now_ms, rules, where)
        return
    # Some record has no timestamp (-1) or a negative one: look at each (rare, so re-parsed).
    timestamps = parse_records(data, header, pos, _timestamp_of)
    for timestamp in timestamps:
        if timestamp != NO_TIMESTAMP:
            _check_timestamp(timestamp, now_ms, rules, where)


def _check_keys(data: bytes, header: BatchHeader, pos: int, where: str) -> None:
    """Kafka's LogValidator rule for compacted topics: no record without a key (the records
    parsed once more, with the compiled decoder; only compacted topics pay for it)."""
    keys = parse_columns(data, header, pos, False).keys
    if None in keys:
        raise InvalidRecordError(
            f"{where}: record {keys.index(None)} has no key: a compacted topic "
            "(cleanup.policy=compact) cannot accept a record without a key (Kafka: "
            '"Compacted topic cannot accept message without key"); the batch was not appended'
        )


def _timestamp_of(offset: int, timestamp: int, key: object, value: object, headers: object) -> int:
    return timestamp


def _check_timestamp(timestamp: int, now_ms: int, rules: RecordValidation, where: str) -> None:
    if timestamp < 0:
        raise InvalidTimestampError(
            f"{where}: timestamp {timestamp} is negative (only -1, no timestamp, may be)"
        )
    before, after = rules.timestamp_before_max_ms, rules.timestamp_after_max_ms
    if now_ms - timestamp > before or timestamp - now_ms > after:
        earliest = "any time" if before >= INT64_MAX else str(now_ms - before)
        raise InvalidTimestampError(
            f"{where}: timestamp {timestamp} is out of range: the broker accepts [{earliest}, "
            f"{now_ms + after}] at {now_ms} (message.timestamp.before.max.ms={before}, "
            f"message.timestamp.after.max.ms={after})"
        )


def _check_records(data: bytes, count: int) -> tuple[int, int]:
    """Walk `count` records that must fill `data` exactly; returns the smallest and largest
    timestamp delta. Raises CorruptRecordError (position 0) naming the first problem.

    `parse_records`'s walk without building anything: each record's fields are checked as the
    consumer's decoder reads them (so a batch that passes here decodes there), and its offset
    delta must be its index. The usual one- and two-byte varints are decoded inline. A key or
    value that overruns its record is caught by the end-of-record check (the fields then take
    more bytes than the record declares), which saves two tests per record.
    """
    end = len(data)
    if count * MIN_RECORD_BYTES > end:
        raise CorruptRecordError(f"recordsCount {count} cannot fit in {end} bytes of records")
    read_varint = read_varint_unchecked
    pos = 0
    i = 0
    # Timestamp deltas are varlongs: these start outside their range.
    min_delta = INT64_MAX + 1
    max_delta = INT64_MIN - 1
    try:
        for i in range(count):
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                c = data[pos + 1]
                if c < 0x80:  # records of 64 B to 8 KiB: a two-byte length
                    n = (b & 0x7F) | (c << 7)
                    length = (n >> 1) ^ -(n & 1)
                    pos += 2
                else:
                    length, pos = read_varint(data, pos)
            record_end = pos + length
            if length < MIN_RECORD_BODY_BYTES or record_end > end:
                raise CorruptRecordError(f"record {i} declares {length} bytes, {end - pos} left")
            b = data[pos + 1]  # after attributes, unused in v2 records
            if b < 0x80:
                delta = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                delta, pos = read_varlong_unchecked(data, pos + 1)
            if delta < min_delta:
                min_delta = delta
            if delta > max_delta:
                max_delta = delta
            # The offset delta must be i, whose zig-zag form is 2i: one byte below 64, two
            # below 8192 (compared without decoding), longer ones decoded.
            b = data[pos]
            if b < 0x80:
                if b != i << 1:
                    raise CorruptRecordError(f"record {i} has offset delta {zigzag(b)}, not {i}")
                pos += 1
            else:
                c = data[pos + 1]
                if c < 0x80:
                    n = (b & 0x7F) | (c << 7)
                    if n != i << 1:
                        raise CorruptRecordError(
                            f"record {i} has offset delta {zigzag(n)}, not {i}"
                        )
                    pos += 2
                else:
                    offset_delta, pos = read_varint(data, pos)
                    if offset_delta != i:
                        raise CorruptRecordError(f"record {i} has offset delta {offset_delta}")
            if data[pos] == 1:  # zig-zag -1: a null key, the usual case
                pos += 1
            else:
                key_length, pos = read_varint(data, pos)
                if key_length > 0:
                    pos += key_length
                elif key_length < -1:
                    raise CorruptRecordError(f"record {i} key length {key_length}")
            b = data[pos]
            if b < 0x80:
                value_length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                c = data[pos + 1]
                if c < 0x80:
                    n = (b & 0x7F) | (c << 7)
                    value_length = (n >> 1) ^ -(n & 1)
                    pos += 2
                else:
                    value_length, pos = read_varint(data, pos)
            if value_length > 0:
                pos += value_length
            elif value_length < -1:
                raise CorruptRecordError(f"record {i} value length {value_length}")
            if data[pos] == 0:
                pos += 1
            else:
                header_count, pos = read_varint(data, pos)
                _, pos = parse_headers(data, pos, record_end, header_count, i, 0)
            if pos != record_end:
                raise CorruptRecordError(
                    f"record {i} declares {length} bytes but its fields take "
                    f"{length + pos - record_end}"
                )
    except IndexError:
        raise CorruptRecordError(
            f"record {i} runs past the end of the {end} bytes of records (recordsCount {count})"
        ) from None
    except VarintTooLong as err:
        raise CorruptRecordError(f"record {i}: {err}") from None
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes left after the {count} declared records")
    return min_delta, max_delta
