"""Decoding v2 record batches: what consumers, `dump-log` and tests read records with.

Pure: no I/O. Header-level work (parsing, CRC32C validation) is `minibroker.client.batch`'s and
compression framing `minibroker.client.compression`'s; this is the records section (layout in
the package docstring). Consumers use `iter_records` / `iter_decoded_batches` over a fetch
response, which may end in a partial batch. Malformed input of any kind raises
`CorruptRecordError` with the batch's position and a reason.

The per-record loop (`parse_records`) has a compiled twin, `minibroker.client.records._decoder`
(C, built by setup.py when a compiler is there): same records, same reasons. `parse_records` and
`parse_columns` use it when it is built; with MINIBROKER_PURE_CODEC=1 in the environment it
refuses to load (it reads the variable itself: this module stays free of `os`), and
`parse_records_pure`, the reference it is tested against, does the work.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from minibroker.client.batch import (
    BATCH_LENGTH_MIN,
    COMPRESSION_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_SEQUENCE,
    BatchHeader,
    Compression,
    CorruptRecordError,
    read_header,
)
from minibroker.client.compression import decompress, decompress_bounded
from minibroker.client.records.varint import (
    VarintTooLong,
    read_varint_unchecked,
    read_varlong_unchecked,
)

# A record body is at least attributes, timestampDelta, offsetDelta, keyLength, valueLength and
# headersCount at one byte each; with its length prefix a record takes at least 7 bytes.
MIN_RECORD_BODY_BYTES = 6
MIN_RECORD_BYTES = MIN_RECORD_BODY_BYTES + 1

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")

R = TypeVar("R")

try:
    from minibroker.client.records import _decoder  # type: ignore[attr-defined]
except ImportError:  # not built (no compiler), or refused under MINIBROKER_PURE_CODEC=1
    _decoder = None
COMPILED = _decoder is not None


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
    prefix: tuple[object, ...] = (),
    suffix: tuple[object, ...] = (),
) -> tuple[list[R], int]:
    """`decode_records` and the size of the records section once decompressed (`prefix` and
    `suffix` as in parse_records)."""
    section = memoryview(buf)[pos + HEADER_SIZE : pos + header.size]
    compression = compression_of(header, pos)
    if compression is Compression.NONE:
        data = bytes(section)
    elif max_uncompressed_bytes is None:
        data = decompress(compression, section, pos)
    else:
        data = decompress_bounded(compression, section, max_uncompressed_bytes, pos)
    return parse_records(data, header, pos, make, prefix, suffix), len(data)


def parse_records(
    data: bytes,
    header: BatchHeader,
    position: int,
    make: Callable[..., R],
    prefix: tuple[object, ...] = (),
    suffix: tuple[object, ...] = (),
) -> list[R]:
    """The `header.records_count` records of the records section `data` (decompressed).

    Each record is `make(offset, timestamp, key, value, headers)`; or, with a `prefix` or a
    `suffix` (then `make` must be a NamedTuple class), `make` holding
    prefix + (offset, timestamp, key, value, headers) + suffix, built with tuple.__new__
    (its __new__ is not called). Malformed input raises CorruptRecordError at `position`.
    """
    if _decoder is not None and type(data) is bytes:
        try:
            return _decoder.parse_records(  # type: ignore[no-any-return]
                data,
                header.records_count,
                header.base_offset,
                header.base_timestamp,
                header.max_timestamp if header.log_append_time else None,
                make,
                prefix,
                suffix,
            )
        except _decoder.RecordsError as err:
            raise CorruptRecordError(err.args[0], position) from None
    if prefix or suffix:
        new = tuple.__new__

        def make_tuple(*fields: object) -> R:
            return new(make, (*prefix, *fields, *suffix))  # type: ignore[arg-type,type-var]

        return parse_records_pure(data, header, position, make_tuple)
    return parse_records_pure(data, header, position, make)


class RecordColumns(NamedTuple):
    """A batch's records as columns (parse_columns); headers is None unless asked for."""

    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[tuple[tuple[str, bytes | None], ...]] | None


def parse_columns(
    data: bytes, header: BatchHeader, position: int, with_headers: bool
) -> RecordColumns:
    """`parse_records` as one list per field, without an object per record (Arrow's input)."""
    if _decoder is not None and type(data) is bytes:
        try:
            return RecordColumns._make(
                _decoder.parse_columns(
                    data,
                    header.records_count,
                    header.base_offset,
                    header.base_timestamp,
                    header.max_timestamp if header.log_append_time else None,
                    with_headers,
                )
            )
        except _decoder.RecordsError as err:
            raise CorruptRecordError(err.args[0], position) from None
    records = parse_records_pure(data, header, position, DecodedRecord)
    return RecordColumns(
        [r.offset for r in records],
        [r.timestamp for r in records],
        [r.key for r in records],
        [r.value for r in records],
        [r.headers for r in records] if with_headers else None,
    )


def parse_records_pure(
    data: bytes, header: BatchHeader, position: int, make: Callable[..., R]
) -> list[R]:
    """`parse_records` in Python: the reference the compiled decoder is tested against."""
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
    read_varint = read_varint_unchecked
    records: list[R] = []
    append = records.append
    pos = 0
    i = 0
    # The per-record loop of every consumer: the usual varints (one byte for deltas below 64, a
    # null key and headersCount 0; two bytes for lengths below 8 KiB) are decoded inline, longer
    # ones by read_varint_unchecked. Reading data[pos + 1] early is safe: a record is >= 7 bytes.
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
                timestamp_delta, pos = read_varlong_unchecked(data, pos)
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
                headers, pos = parse_headers(data, pos, record_end, header_count, i, position)
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
    except VarintTooLong as err:
        raise CorruptRecordError(f"record {i}: {err}", position) from None
    if pos != end:
        raise CorruptRecordError(
            f"{end - pos} bytes left after the {count} declared records", position
        )
    return records


def parse_headers(
    data: bytes, pos: int, record_end: int, count: int, record_index: int, position: int
) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    """Parse `count` headers from `pos`; returns them and the position after the last."""
    # Each header takes at least two bytes (two lengths), which bounds a corrupt count.
    if count < 0 or count * 2 > record_end - pos:
        raise CorruptRecordError(f"record {record_index} headersCount {count}", position)
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        name_length, pos = read_varint_unchecked(data, pos)
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
        value_length, pos = read_varint_unchecked(data, pos)
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
