"""The v2 record-batch codec: records in, Kafka's RecordBatch bytes out, and back.

Pure: no I/O. Header-level work (parsing, CRC32C validation, restamping offsets and epochs) lives
in `minibroker.client.batch` and is called from here, never re-implemented; compression framing
lives in `minibroker.client.compression`. Layout (docs/protocol.md §23, Kafka's
DefaultRecordBatch and DefaultRecord): a 61-byte header, then `recordsCount` records, each

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
    keyLength varint | key | valueLength varint | value | headersCount varint |
    (headerKeyLength varint | headerKey utf8 | headerValueLength varint | headerValue)*

where varints are zig-zag encoded (Kafka's ByteUtils) and -1 lengths mean null. With compression
the whole records section (after `recordsCount`) is one compressed blob.

The producer's accumulator uses `BatchBuilder`: each record is varint-encoded when it is appended,
so closing a batch is one join, at most one compression and one CRC. Consumers use
`iter_records` / `iter_decoded_batches` over a fetch response, which may end in a partial batch.
Malformed input of any kind raises `CorruptRecordError` with the batch's position and a reason.
A partition leader runs `validate_producer_records` over what producers send (Kafka's
LogValidator), so that every batch it stores decodes here.

Objects here are not thread-safe; a BatchBuilder belongs to one producer task.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import index
from typing import Any, NamedTuple, TypeVar

from minibroker.client.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_LENGTH_MIN,
    COMPRESSION_MASK,
    CRC_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    BatchHeader,
    Compression,
    CorruptRecordError,
    crc_of,
    read_header,
)
from minibroker.client.compression import compress, decompress, decompress_bounded
from minibroker.client.errors import CorruptMessageError, InvalidRecordError, InvalidTimestampError

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

CREATE_TIME = 0
LOG_APPEND_TIME = 1

# A record body is at least attributes, timestampDelta, offsetDelta, keyLength, valueLength and
# headersCount at one byte each; with its length prefix a record takes at least 7 bytes.
MIN_RECORD_BODY_BYTES = 6
MIN_RECORD_BYTES = MIN_RECORD_BODY_BYTES + 1
# DefaultRecord.MAX_RECORD_OVERHEAD: the most a record adds around its key, value and headers.
MAX_RECORD_OVERHEAD = 21

# Writing side of the header layout that minibroker.client.batch documents and parses.
_HEADER_WRITER = struct.Struct(">qiibIhiqqqhii")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")

HeaderList = Sequence[tuple[str, bytes | None]]
R = TypeVar("R")
RecordInput = tuple[int, bytes | None, bytes | None, HeaderList]


# ---------------------------------------------------------------------------------------------
# Varints (Kafka's ByteUtils.writeVarint / writeVarlong / readVarint / readVarlong)


def _encode_unsigned(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Every value whose zig-zag form fits two bytes, precomputed: lengths of keys and values up to
# 8 KiB, offset deltas and small timestamp deltas all hit this table, which keeps append cheap.
_SMALL_LIMIT = 8192
_SMALL_VARINTS: tuple[bytes, ...] = tuple(
    _encode_unsigned((n << 1) ^ (n >> 63)) for n in range(-_SMALL_LIMIT, _SMALL_LIMIT)
)
_NULL_LENGTH = _SMALL_VARINTS[_SMALL_LIMIT - 1]  # varint(-1): a null key, value or header value
# Values up to this size are copied into one bytes object with their record's framing; larger
# ones stay separate list entries so only the final join copies them.
_COALESCE_BYTES = 512


def encode_varint(value: int) -> bytes:
    """Zig-zag varint of a signed int32 (at most 5 bytes)."""
    if -_SMALL_LIMIT <= value < _SMALL_LIMIT:
        return _SMALL_VARINTS[value + _SMALL_LIMIT]
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"varint {value} is outside int32")
    return _encode_unsigned(((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)


def encode_varlong(value: int) -> bytes:
    """Zig-zag varint of a signed int64 (at most 10 bytes)."""
    if -_SMALL_LIMIT <= value < _SMALL_LIMIT:
        return _SMALL_VARINTS[value + _SMALL_LIMIT]
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"varlong {value} is outside int64")
    return _encode_unsigned(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


class _VarintTooLong(ValueError):
    """A varint with a continuation bit past its maximum length; callers add the position."""


def _read_varint(buf: bytes | bytearray, pos: int) -> tuple[int, int]:
    """Hot-path varint read; running off the end raises IndexError, which callers translate."""
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 28:
            raise _VarintTooLong("varint is longer than 5 bytes")
    # Java keeps only the low 32 bits of the five 7-bit groups; so do we.
    result &= 0xFFFFFFFF
    return (result >> 1) ^ -(result & 1), pos


def _read_varlong(buf: bytes | bytearray, pos: int) -> tuple[int, int]:
    b = buf[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if shift > 63:
            raise _VarintTooLong("varlong is longer than 10 bytes")
    result &= 0xFFFFFFFFFFFFFFFF
    return (result >> 1) ^ -(result & 1), pos


def decode_varint(buf: bytes | bytearray, pos: int = 0) -> tuple[int, int]:
    """Read a zig-zag int32 varint at `pos`; returns (value, next position)."""
    try:
        return _read_varint(buf, pos)
    except IndexError:
        raise CorruptRecordError(f"varint at {pos} runs past the end of the buffer") from None
    except _VarintTooLong as err:
        raise CorruptRecordError(f"{err} at {pos}") from None


def decode_varlong(buf: bytes | bytearray, pos: int = 0) -> tuple[int, int]:
    """Read a zig-zag int64 varint at `pos`; returns (value, next position)."""
    try:
        return _read_varlong(buf, pos)
    except IndexError:
        raise CorruptRecordError(f"varlong at {pos} runs past the end of the buffer") from None
    except _VarintTooLong as err:
        raise CorruptRecordError(f"{err} at {pos}") from None


# ---------------------------------------------------------------------------------------------
# Encoding


def _as_bytes(data: object, what: str) -> bytes:
    """bytes of a bytes-like key, value or header value (the caller handles None)."""
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"record {what} must be bytes or None, not {type(data).__name__}")


def _encode_headers(headers: HeaderList) -> bytes:
    """headersCount and the headers of one record (the record's tail after its value)."""
    out = [encode_varint(len(headers))]
    for name, header_value in headers:
        encoded_name = name.encode("utf-8")
        out.append(encode_varint(len(encoded_name)))
        out.append(encoded_name)
        if header_value is None:
            out.append(_NULL_LENGTH)
        else:
            if type(header_value) is not bytes:
                header_value = _as_bytes(header_value, "header value")
            out.append(encode_varint(len(header_value)))
            out.append(header_value)
    return b"".join(out)


class BatchBuilder:
    """Accumulates records into one v2 batch for the producer (Kafka's MemoryRecordsBuilder).

    Offsets deltas are 0..n-1; the first record's timestamp is the batch's baseTimestamp. The
    size estimate counts uncompressed bytes, so with compression a batch holds at least
    `batch_size` bytes of uncompressed records (Kafka starts its estimate at ratio 1.0 too).
    `append` refuses a record that would pass `batch_size`, except into an empty builder: one
    record larger than `batch_size` still gets a batch of its own, as in Kafka.
    """

    def __init__(
        self,
        batch_size: int = 16384,
        *,
        compression: Compression = Compression.NONE,
        compression_level: int | None = None,
        base_offset: int = 0,
        partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
        producer_id: int = NO_PRODUCER_ID,
        producer_epoch: int = NO_PRODUCER_EPOCH,
        base_sequence: int = NO_SEQUENCE,
        timestamp_type: int = CREATE_TIME,
        is_transactional: bool = False,
    ) -> None:
        if timestamp_type not in (CREATE_TIME, LOG_APPEND_TIME):
            raise ValueError(f"timestamp_type must be 0 (CreateTime) or 1, got {timestamp_type}")
        self.batch_size = batch_size
        self.compression = Compression(compression)
        self.compression_level = compression_level
        self.base_offset = base_offset
        self.partition_leader_epoch = partition_leader_epoch
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.timestamp_type = timestamp_type
        self.is_transactional = is_transactional
        self._parts: list[bytes] = []
        self._records_bytes = 0
        self._count = 0
        self._base_timestamp = 0
        self._max_timestamp = 0
        self._built: bytes | None = None

    @property
    def record_count(self) -> int:
        return self._count

    @property
    def is_empty(self) -> bool:
        return self._count == 0

    @property
    def is_closed(self) -> bool:
        return self._built is not None

    @property
    def estimated_size(self) -> int:
        """Header plus uncompressed records: the batch's size without compression."""
        return HEADER_SIZE + self._records_bytes

    @property
    def base_timestamp(self) -> int:
        return self._base_timestamp

    @property
    def max_timestamp(self) -> int:
        return self._max_timestamp

    def set_producer_state(
        self,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        is_transactional: bool = False,
    ) -> None:
        """Stamp the idempotence fields, known only when the sender drains the batch."""
        if self._built is not None:
            raise RuntimeError("the batch is already built")
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.is_transactional = is_transactional

    def append(
        self,
        timestamp_ms: int,
        key: bytes | None,
        value: bytes | None,
        headers: HeaderList = (),
    ) -> bool:
        """Encode one record into the batch. False (nothing added) when it would overflow."""
        if self._built is not None:
            raise RuntimeError("the batch is already built")
        if type(timestamp_ms) is not int:
            timestamp_ms = index(timestamp_ms)
        count = self._count
        delta = timestamp_ms - self._base_timestamp if count else 0
        small = _SMALL_VARINTS
        # attributes (always 0 for a v2 record) + timestampDelta + offsetDelta, from the table
        # when they are small (the usual case), which avoids any varint arithmetic per record.
        head = b"\x00" + (
            small[delta + _SMALL_LIMIT]
            if -_SMALL_LIMIT <= delta < _SMALL_LIMIT
            else encode_varlong(delta)
        )
        head += small[count + _SMALL_LIMIT] if count < _SMALL_LIMIT else encode_varint(count)
        if key is None:
            head += _NULL_LENGTH
        else:
            if type(key) is not bytes:
                key = _as_bytes(key, "key")
            head += encode_varint(len(key)) + key
        if value is None:
            head += _NULL_LENGTH
            value = b""
        else:
            if type(value) is not bytes:
                value = _as_bytes(value, "value")
            head += encode_varint(len(value))
        tail = _encode_headers(headers) if headers else b"\x00"
        body_size = len(head) + len(value) + len(tail)
        prefix = encode_varint(body_size)
        record_size = len(prefix) + body_size
        if count > 0 and HEADER_SIZE + self._records_bytes + record_size > self.batch_size:
            return False
        if count == 0:
            self._base_timestamp = timestamp_ms
            self._max_timestamp = timestamp_ms
        elif timestamp_ms > self._max_timestamp:
            self._max_timestamp = timestamp_ms
        parts = self._parts
        if len(value) <= _COALESCE_BYTES:
            # One small bytes object per record: the copy is cheaper than more list entries.
            parts.append(prefix + head + value + tail)
        else:
            parts.append(prefix + head)
            parts.append(value)
            parts.append(tail)
        self._records_bytes += record_size
        self._count = count + 1
        return True

    def build(self) -> bytes:
        """Close the batch and return its bytes (cached: later calls return the same bytes)."""
        if self._built is not None:
            return self._built
        if self._count == 0:
            raise ValueError("a record batch holds at least one record")
        records = b"".join(self._parts)
        if self.compression is not Compression.NONE:
            records = compress(self.compression, records, self.compression_level)
        attributes = int(self.compression)
        if self.timestamp_type == LOG_APPEND_TIME:
            attributes |= TIMESTAMP_TYPE_MASK
        if self.is_transactional:
            attributes |= TRANSACTIONAL_MASK
        out = bytearray(HEADER_SIZE)
        out += records
        _HEADER_WRITER.pack_into(
            out,
            0,
            self.base_offset,
            len(out) - LOG_OVERHEAD,
            self.partition_leader_epoch,
            MAGIC,
            0,
            attributes,
            self._count - 1,
            self._base_timestamp,
            self._max_timestamp,
            self.producer_id,
            self.producer_epoch,
            self.base_sequence,
            self._count,
        )
        _UINT32.pack_into(out, CRC_OFFSET, crc_of(out, ATTRIBUTES_OFFSET, len(out)))
        self._built = bytes(out)
        self._parts = []
        return self._built


def encode_batch(
    records: Iterable[RecordInput],
    *,
    compression: Compression = Compression.NONE,
    compression_level: int | None = None,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    timestamp_type: int = CREATE_TIME,
    is_transactional: bool = False,
) -> bytes:
    """One v2 batch of `records` = (timestamp_ms, key, value, headers); offset deltas 0..n-1."""
    builder = BatchBuilder(
        INT32_MAX,
        compression=compression,
        compression_level=compression_level,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        timestamp_type=timestamp_type,
        is_transactional=is_transactional,
    )
    for timestamp_ms, key, value, headers in records:
        builder.append(timestamp_ms, key, value, headers)
    return builder.build()


# ---------------------------------------------------------------------------------------------
# Decoding


class DecodedRecord(NamedTuple):
    """One record with its absolute offset. key/value None for null; headers name -> value."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """A validated batch and its records; `position` is where it starts in the decoded buffer."""

    position: int
    header: BatchHeader
    records: list[DecodedRecord]

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def last_offset(self) -> int:
        return self.header.last_offset

    @property
    def size(self) -> int:
        return self.header.size

    def sequence_of(self, record: DecodedRecord) -> int:
        """The producer sequence of `record` (DefaultRecord.sequence), -1 without idempotence."""
        if self.header.base_sequence < 0:
            return NO_SEQUENCE
        delta = record.offset - self.header.base_offset
        return (self.header.base_sequence + delta) % (1 << 31)


def compression_of(header: BatchHeader, position: int = 0) -> Compression:
    """The batch's codec; ids 5-7 are not codecs and make the batch corrupt."""
    codec_id = header.attributes & COMPRESSION_MASK
    if codec_id > Compression.ZSTD:
        raise CorruptRecordError(f"unknown compression codec id {codec_id}", position)
    return Compression(codec_id)


def decode_records(
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    make: Callable[..., R] = DecodedRecord,  # type: ignore[assignment]
    max_uncompressed_bytes: int | None = None,
) -> list[R]:
    """Decode the records of the batch at `pos` whose header (already validated) is `header`.

    Each record becomes `make(offset, timestamp, key, value, headers)`: DecodedRecord by default;
    a consumer passes its own constructor so no intermediate object is built per record.
    With `max_uncompressed_bytes`, compressed records that would decompress to more raise
    CorruptRecordError without that much ever being allocated.
    """
    return decode_records_sized(buf, pos, header, make, max_uncompressed_bytes)[0]


def decode_records_sized(
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    make: Callable[..., R],
    max_uncompressed_bytes: int | None = None,
) -> tuple[list[R], int]:
    """`decode_records` and the size of the records section once decompressed."""
    section = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    compression = compression_of(header, pos)
    if compression is Compression.NONE:
        data = bytes(section)
    elif max_uncompressed_bytes is None:
        data = decompress(compression, section, pos)
    else:
        data = decompress_bounded(compression, section, max_uncompressed_bytes, pos)
    return _parse_records(data, header, pos, make), len(data)


def _parse_records(
    data: bytes, header: BatchHeader, position: int, make: Callable[..., R]
) -> list[R]:
    count = header.records_count
    end = len(data)
    if count * MIN_RECORD_BYTES > end:
        raise CorruptRecordError(
            f"recordsCount {count} cannot fit in {end} bytes of records", position
        )
    base_offset = header.base_offset
    base_timestamp = header.base_timestamp
    # LogAppendTime batches carry the broker's time as maxTimestamp; every record reports it
    # (DefaultRecordBatch passes it down instead of baseTimestamp + delta).
    append_time = header.max_timestamp if header.log_append_time else None
    read_varint = _read_varint
    records: list[R] = []
    append = records.append
    pos = 0
    i = 0
    # The per-record loop of every consumer: the usual varints (one byte for deltas below 64, a
    # null key and headersCount 0; two bytes for lengths below 8 KiB) are decoded inline, longer
    # ones by _read_varint. Reading data[pos + 1] early is safe: a record is >= 7 bytes.
    try:
        for i in range(count):
            if pos >= end:
                raise CorruptRecordError(
                    f"recordsCount {count} but the records section ends after {i} records",
                    position,
                )
            b = data[pos]
            c = data[pos + 1]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif c < 0x80:  # records of 64 B to 8 KiB: a two-byte length
                n = (b & 0x7F) | (c << 7)
                length = (n >> 1) ^ -(n & 1)
                pos += 2
            else:
                length, pos = read_varint(data, pos)
            record_end = pos + length
            if length < MIN_RECORD_BODY_BYTES or record_end > end:
                raise CorruptRecordError(
                    f"record {i} declares {length} bytes, {end - pos} left", position
                )
            pos += 1  # attributes: unused in v2 records
            b = data[pos]
            if b < 0x80:
                timestamp_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                timestamp_delta, pos = _read_varlong(data, pos)
            b = data[pos]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                offset_delta, pos = read_varint(data, pos)
            b = data[pos]
            if b == 1:  # zig-zag -1: a null key, the usual case
                key = None
                pos += 1
            else:
                key_length, pos = read_varint(data, pos)
                if key_length < 0:
                    if key_length != -1:
                        raise CorruptRecordError(f"record {i} key length {key_length}", position)
                    key = None
                else:
                    key_end = pos + key_length
                    if key_end > record_end:
                        raise CorruptRecordError(f"record {i} key overruns the record", position)
                    key = data[pos:key_end]
                    pos = key_end
            b = data[pos]
            c = data[pos + 1]
            if b < 0x80:
                value_length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif c < 0x80:
                n = (b & 0x7F) | (c << 7)
                value_length = (n >> 1) ^ -(n & 1)
                pos += 2
            else:
                value_length, pos = read_varint(data, pos)
            if value_length < 0:
                if value_length != -1:
                    raise CorruptRecordError(f"record {i} value length {value_length}", position)
                value = None
            else:
                value_end = pos + value_length
                if value_end > record_end:
                    raise CorruptRecordError(f"record {i} value overruns the record", position)
                value = data[pos:value_end]
                pos = value_end
            headers: tuple[tuple[str, bytes | None], ...] = ()
            if data[pos] == 0:
                pos += 1
            else:
                header_count, pos = read_varint(data, pos)
                headers, pos = _parse_headers(data, pos, record_end, header_count, i, position)
            if pos != record_end:
                raise CorruptRecordError(
                    f"record {i} declares {length} bytes but its fields take "
                    f"{length + pos - record_end}",
                    position,
                )
            append(
                make(
                    base_offset + offset_delta,
                    base_timestamp + timestamp_delta if append_time is None else append_time,
                    key,
                    value,
                    headers,
                )
            )
    except IndexError:
        raise CorruptRecordError(f"record {i} is truncated", position) from None
    except _VarintTooLong as err:
        raise CorruptRecordError(f"record {i}: {err}", position) from None
    if pos != end:
        raise CorruptRecordError(
            f"{end - pos} bytes left after the {count} declared records", position
        )
    return records


def _parse_headers(
    data: bytes, pos: int, record_end: int, count: int, record_index: int, position: int
) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    """Parse `count` headers from `pos`; returns them and the position after the last."""
    # Each header takes at least two bytes (two lengths), which bounds a corrupt count.
    if count < 0 or count * 2 > record_end - pos:
        raise CorruptRecordError(f"record {record_index} headersCount {count}", position)
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        name_length, pos = _read_varint(data, pos)
        if name_length < 0:
            raise CorruptRecordError(f"record {record_index} has a null header key", position)
        name_end = pos + name_length
        if name_end > record_end:
            raise CorruptRecordError(
                f"record {record_index} header key overruns the record", position
            )
        try:
            name = data[pos:name_end].decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptRecordError(
                f"record {record_index} header key is not UTF-8", position
            ) from None
        pos = name_end
        value_length, pos = _read_varint(data, pos)
        header_value: bytes | None
        if value_length < 0:
            if value_length != -1:
                raise CorruptRecordError(
                    f"record {record_index} header value length {value_length}", position
                )
            header_value = None
        else:
            value_end = pos + value_length
            if value_end > record_end:
                raise CorruptRecordError(
                    f"record {record_index} header value overruns the record", position
                )
            header_value = data[pos:value_end]
            pos = value_end
        headers.append((name, header_value))
    return tuple(headers), pos


def decode_batch(
    buf: bytes | bytearray | memoryview, pos: int = 0, max_uncompressed_bytes: int | None = None
) -> DecodedBatch:
    """Validate (length, magic, CRC32C) and decode the batch at `pos` (see decode_records for
    `max_uncompressed_bytes`)."""
    header = read_header(buf, pos)
    return DecodedBatch(
        pos, header, decode_records(buf, pos, header, DecodedRecord, max_uncompressed_bytes)
    )


def is_partial_tail(buf: bytes | bytearray | memoryview, pos: int) -> bool:
    """True when the bytes from `pos` are the start of a batch cut off by the end of `buf`.

    A fetch response may end in such a batch (the broker sends whole batches up to `max_bytes`,
    and a byte range of a segment can end mid-batch). A batchLength below the minimum is
    corruption, not a cut: this returns False and decoding reports it.
    """
    available = len(buf) - pos
    if available < LOG_OVERHEAD:
        return available > 0
    (batch_length,) = _INT32.unpack_from(buf, pos + 8)
    return batch_length >= BATCH_LENGTH_MIN and batch_length + LOG_OVERHEAD > available


def iter_decoded_batches(
    buf: bytes | bytearray | memoryview,
    *,
    allow_partial_tail: bool = False,
    max_uncompressed_bytes: int | None = None,
) -> Iterator[DecodedBatch]:
    """Decode each batch of concatenated batches (a fetch response's records, a segment).

    With `allow_partial_tail`, a final batch cut off by the end of `buf` is silently dropped;
    otherwise it raises CorruptRecordError like any other damage. `max_uncompressed_bytes`
    bounds each batch's decompressed records (see decode_records).
    """
    pos = 0
    end = len(buf)
    while pos < end:
        if allow_partial_tail and is_partial_tail(buf, pos):
            return
        batch = decode_batch(buf, pos, max_uncompressed_bytes)
        yield batch
        pos += batch.header.size


def iter_records(
    buf: bytes | bytearray | memoryview,
    *,
    allow_partial_tail: bool = False,
    include_control: bool = False,
) -> Iterator[DecodedRecord]:
    """Every record of concatenated batches, in offset order.

    Control batches (transaction markers) are skipped unless `include_control`, as Kafka's
    consumer never hands them to the application.
    """
    for batch in iter_decoded_batches(buf, allow_partial_tail=allow_partial_tail):
        if batch.header.is_control and not include_control:
            continue
        yield from batch.records


def parse_control_key(key: bytes | None) -> tuple[int, int]:
    """(version, type) of a control record's key; type 0 is ABORT and 1 is COMMIT."""
    if key is None or len(key) < 4:
        raise CorruptRecordError("control record key is shorter than 4 bytes")
    return _INT16.unpack_from(key, 0)[0], _INT16.unpack_from(key, 2)[0]


# ---------------------------------------------------------------------------------------------
# Leader-side validation of produced records (Kafka's LogValidator)

# Kafka 4's `message.timestamp.after.max.ms` default (KIP-1030): one hour ahead of the broker.
DEFAULT_TIMESTAMP_AFTER_MAX_MS = 3_600_000
NO_TIMESTAMP = -1  # RecordBatch.NO_TIMESTAMP: a record without a timestamp
# The records of a compressed batch may decompress to at most this many times the topic's
# max.message.bytes (itself counted as at least its 1 MiB default): 64 MiB by default. Kafka
# streams through a batch and needs no bound; the leader here materialises the records, so a
# few compressed bytes that expand to gigabytes must be refused, not allocated.
UNCOMPRESSED_LIMIT_FACTOR = 64
_DEFAULT_MAX_MESSAGE_BYTES = 1048588


def uncompressed_limit(max_message_bytes: int) -> int:
    """The most a batch's records may decompress to on a topic with this max.message.bytes:
    what a leader accepts, and so what a consumer must be ready to decode."""
    return UNCOMPRESSED_LIMIT_FACTOR * max(max_message_bytes, _DEFAULT_MAX_MESSAGE_BYTES)


class RecordValidation(NamedTuple):
    """The topic settings a leader checks produced records against.

    `log_append_time` is `message.timestamp.type=LogAppendTime`: the broker stamps its own clock,
    so the producer's timestamps are not checked. The two bounds are
    `message.timestamp.before.max.ms` / `after.max.ms` (KIP-937), in ms either side of now.
    """

    log_append_time: bool = False
    timestamp_before_max_ms: int = INT64_MAX
    timestamp_after_max_ms: int = DEFAULT_TIMESTAMP_AFTER_MAX_MS
    max_uncompressed_bytes: int = UNCOMPRESSED_LIMIT_FACTOR * _DEFAULT_MAX_MESSAGE_BYTES

    @classmethod
    def from_topic_config(cls, typed: Mapping[str, Any]) -> RecordValidation:
        """From a topic's resolved configs (`client.topic_config.resolve_topic_config`)."""
        return cls(
            typed["message.timestamp.type"] == "LogAppendTime",
            typed["message.timestamp.before.max.ms"],
            typed["message.timestamp.after.max.ms"],
            uncompressed_limit(typed["max.message.bytes"]),
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
    maxTimestamp the records' largest; and, for CreateTime topics, every timestamp within the
    topic's before/after bounds of `now_ms` (-1, no timestamp, is not checked, as in Kafka;
    other negative timestamps are refused).

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
    timestamps = _parse_records(data, header, pos, _timestamp_of)
    for timestamp in timestamps:
        if timestamp != NO_TIMESTAMP:
            _check_timestamp(timestamp, now_ms, rules, where)


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

    `_parse_records`'s walk without building anything: each record's fields are checked as the
    consumer's decoder reads them (so a batch that passes here decodes there), and its offset
    delta must be its index. The usual one- and two-byte varints are decoded inline. A key or
    value that overruns its record is caught by the end-of-record check (the fields then take
    more bytes than the record declares), which saves two tests per record.
    """
    end = len(data)
    if count * MIN_RECORD_BYTES > end:
        raise CorruptRecordError(f"recordsCount {count} cannot fit in {end} bytes of records")
    read_varint = _read_varint
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
                delta, pos = _read_varlong(data, pos + 1)
            if delta < min_delta:
                min_delta = delta
            if delta > max_delta:
                max_delta = delta
            # The offset delta must be i, whose zig-zag form is 2i: one byte below 64, two
            # below 8192 (compared without decoding), longer ones decoded.
            b = data[pos]
            if b < 0x80:
                if b != i << 1:
                    raise CorruptRecordError(f"record {i} has offset delta {_zigzag(b)}, not {i}")
                pos += 1
            else:
                c = data[pos + 1]
                if c < 0x80:
                    n = (b & 0x7F) | (c << 7)
                    if n != i << 1:
                        raise CorruptRecordError(
                            f"record {i} has offset delta {_zigzag(n)}, not {i}"
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
                _, pos = _parse_headers(data, pos, record_end, header_count, i, 0)
            if pos != record_end:
                raise CorruptRecordError(
                    f"record {i} declares {length} bytes but its fields take "
                    f"{length + pos - record_end}"
                )
    except IndexError:
        raise CorruptRecordError(
            f"record {i} runs past the end of the {end} bytes of records (recordsCount {count})"
        ) from None
    except _VarintTooLong as err:
        raise CorruptRecordError(f"record {i}: {err}") from None
    if pos != end:
        raise CorruptRecordError(f"{end - pos} bytes left after the {count} declared records")
    return min_delta, max_delta


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)
