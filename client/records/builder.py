"""Encoding v2 record batches: the producer's `BatchBuilder` (Kafka's MemoryRecordsBuilder) and
`encode_batch` for whole batches at once.

Pure: no I/O. Layout in the package docstring (`minibroker.client.records`). Each record is
varint-encoded when it is appended, so closing a batch is one join, at most one compression and
one CRC. A BatchBuilder belongs to one producer task; it is not thread-safe.

The per-record encoding has two implementations with byte-identical output: the compiled
`_encoder.RecordsBuilder` (client/records/_encoder.c), used when it imports, and the pure Python
path below, which stays the reference and the fallback (`MINIBROKER_PURE_CODEC=1` forces it;
`encoder_choice` decides). `COMPILED` says which one this process uses. The batch header,
compression and CRC are Python in both (once per batch, `build`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from operator import index
from typing import Any, Protocol

from minibroker.client.batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    DELETE_HORIZON_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    Compression,
    crc_of,
)
from minibroker.client.compression import compress
from minibroker.client.producer_record import checked_timestamp
from minibroker.client.records import encoder_choice
from minibroker.client.records.encoder_choice import COMPILED
from minibroker.client.records.varint import (
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    NULL_LENGTH,
    SMALL_LIMIT,
    SMALL_VARINTS,
    encode_varint,
    encode_varlong,
)

CREATE_TIME = 0
LOG_APPEND_TIME = 1

# Writing side of the header layout that minibroker.client.batch documents and parses.
_HEADER_WRITER = struct.Struct(">qiibIhiqqqhii")
_UINT32 = struct.Struct(">I")
# Values up to this size are copied into one bytes object with their record's framing; larger
# ones stay separate list entries so only the final join copies them.
_COALESCE_BYTES = 512

Data = bytes | bytearray | memoryview | str
HeaderList = Sequence[tuple[str, Data | None]]
RecordInput = tuple[int, Data | None, Data | None, HeaderList]

__all__ = [
    "COMPILED",
    "CREATE_TIME",
    "LOG_APPEND_TIME",
    "BatchBuilder",
    "Data",
    "HeaderList",
    "PlacedRecord",
    "RecordInput",
    "encode_batch",
    "encode_placed_batch",
]


def record_bytes(data: object, what: str) -> bytes:
    """The bytes of a key, value or header value (the caller handles None): bytes, bytearray, a
    C-contiguous memoryview, or str as UTF-8. The messages are producer_record.as_bytes's."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, bytearray):
        return bytes(data)
    if isinstance(data, memoryview):
        # The compiled encoder reads a buffer in place, which needs C order; bytes(view) copies
        # any view, so the two paths refuse the same ones.
        if not data.c_contiguous:
            raise TypeError(
                f"record {what} must be a C-contiguous memoryview; copy it with bytes() first"
            )
        return bytes(data)
    raise TypeError(
        f"record {what} must be bytes, str or None, not {type(data).__name__}; serialize it first"
    )


def _encode_headers(headers: HeaderList) -> bytes:
    """headersCount and the headers of one record (the record's tail after its value)."""
    out = [encode_varint(len(headers))]
    for name, header_value in headers:
        if not isinstance(name, str):
            raise TypeError(f"header names must be str, got {type(name).__name__}")
        encoded_name = name.encode("utf-8")
        out.append(encode_varint(len(encoded_name)))
        out.append(encoded_name)
        if header_value is None:
            out.append(NULL_LENGTH)
        else:
            if type(header_value) is not bytes:
                header_value = record_bytes(header_value, f"header {name!r} value")
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

    Keys, values and header values are bytes, bytearray, C-contiguous memoryviews, str (UTF-8) or
    None; header names str; timestamps ints in [0, int64 max] (producer_record's checks and
    messages). A record refused by a check leaves the builder unchanged.
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
        self._batch_size = batch_size
        self.compression = Compression(compression)
        self.compression_level = compression_level
        self.base_offset = base_offset
        self.partition_leader_epoch = partition_leader_epoch
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.timestamp_type = timestamp_type
        self.is_transactional = is_transactional
        # The compiled encoder when there is one (it then holds the records, count and
        # timestamps); otherwise the pure path's state below.
        native = encoder_choice.RecordsBuilder
        self._native = None if native is None else native(batch_size)
        self._parts: list[bytes] = []
        self._records_bytes = 0
        self._count = 0
        self._base_timestamp = 0
        self._max_timestamp = 0
        self._built: bytes | None = None

    @property
    def batch_size(self) -> int:
        """The size `append` keeps to (read-only: the compiled encoder holds it too)."""
        return self._batch_size

    @property
    def encoder(self) -> RecordEncoder:
        """What the producer's accumulator appends to, record by record, until `build`: the
        compiled `RecordsBuilder` itself when there is one (its `append` answers the record's
        index, or -1 when full, with no Python frame in between), else this builder's pure path
        behind the same interface."""
        if self._built is not None:
            raise RuntimeError("the batch is already built")
        return self._native if self._native is not None else _PureEncoder(self)

    @property
    def record_count(self) -> int:
        return self._count if self._native is None else self._native.count

    @property
    def is_empty(self) -> bool:
        return self.record_count == 0

    @property
    def is_closed(self) -> bool:
        return self._built is not None

    @property
    def estimated_size(self) -> int:
        """Header plus uncompressed records: the batch's size without compression."""
        if self._native is not None:
            return self._native.size
        return HEADER_SIZE + self._records_bytes

    @property
    def base_timestamp(self) -> int:
        return self._base_timestamp if self._native is None else self._native.base_timestamp

    @property
    def max_timestamp(self) -> int:
        return self._max_timestamp if self._native is None else self._native.max_timestamp

    @staticmethod
    def _checked_timestamp(timestamp_ms: object) -> int:
        """A producer's record timestamp: an int in [0, int64 max] (producer_record's rule)."""
        return checked_timestamp(timestamp_ms)

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
        key: Data | None,
        value: Data | None,
        headers: HeaderList | None = (),
    ) -> bool:
        """Encode one record into the batch. False (nothing added) when it would overflow."""
        if self._built is not None:
            raise RuntimeError("the batch is already built")
        native = self._native
        if native is not None:
            return native.append(timestamp_ms, key, value, headers) >= 0
        if type(timestamp_ms) is not int or not 0 <= timestamp_ms <= INT64_MAX:
            timestamp_ms = self._checked_timestamp(timestamp_ms)
        count = self._count
        delta = timestamp_ms - self._base_timestamp if count else 0
        small = SMALL_VARINTS
        # attributes (always 0 for a v2 record) + timestampDelta + offsetDelta, from the table
        # when they are small (the usual case), which avoids any varint arithmetic per record.
        head = b"\x00" + (
            small[delta + SMALL_LIMIT]
            if -SMALL_LIMIT <= delta < SMALL_LIMIT
            else encode_varlong(delta)
        )
        head += small[count + SMALL_LIMIT] if count < SMALL_LIMIT else encode_varint(count)
        if key is None:
            head += NULL_LENGTH
        else:
            if type(key) is not bytes:
                key = record_bytes(key, "key")
            head += encode_varint(len(key)) + key
        if value is None:
            head += NULL_LENGTH
            value = b""
        else:
            if type(value) is not bytes:
                value = record_bytes(value, "value")
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
        if self.record_count == 0:
            raise ValueError("a record batch holds at least one record")
        native = self._native
        if native is not None:
            records = native.records()
            self._records_bytes = len(records)
            self._count = native.count
            self._base_timestamp = native.base_timestamp
            self._max_timestamp = native.max_timestamp
            self._native = None  # the builder is closed: the pure fields answer from here on
        else:
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

    def append_values(
        self,
        timestamp_ms: int,
        values: list[Data | None] | tuple[Data | None, ...],
        keys: list[Data | None] | tuple[Data | None, ...] | None = None,
    ) -> int:
        """Append `values` (with `keys[i]`, or null keys) stamped `timestamp_ms`, no headers,
        from the front until one does not fit; returns how many were appended.

        The same as appending them one by one: a record refused by a check raises, and the ones
        before it stay appended. The compiled encoder does it without a Python call per record.
        """
        if self._built is not None:
            raise RuntimeError("the batch is already built")
        native = self._native
        if native is not None:
            return native.append_values(timestamp_ms, values, keys)
        timestamp_ms = self._checked_timestamp(timestamp_ms)
        if not isinstance(values, list | tuple):
            raise TypeError(f"values must be a list or tuple, not {type(values).__name__}")
        if keys is not None:
            if not isinstance(keys, list | tuple):
                raise TypeError(f"keys must be a list, a tuple or None, not {type(keys).__name__}")
            if len(keys) != len(values):
                raise ValueError(f"{len(keys)} keys for {len(values)} values")
        for i, value in enumerate(values):
            if not self.append(timestamp_ms, None if keys is None else keys[i], value, None):
                return i
        return len(values)


class RecordEncoder(Protocol):
    """The per-record interface of `_encoder.RecordsBuilder`, which `_PureEncoder` copies."""

    @property
    def size(self) -> int: ...

    @property
    def count(self) -> int: ...

    def bind(self, future_type: type, result: Any, counter: Any, /) -> None: ...

    def append_future(
        self, timestamp_ms: int, key: Data | None, value: Data | None, headers: Any = None, /
    ) -> Any: ...

    def append_values(self, timestamp_ms: int, values: Any, keys: Any = None, /) -> int: ...


class _PureEncoder:
    """`RecordEncoder` over a BatchBuilder's pure path (no compiled encoder)."""

    __slots__ = ("_builder", "_counter", "_future_type", "_result")

    def __init__(self, builder: BatchBuilder) -> None:
        self._builder = builder
        self._future_type: Any = None
        self._result: Any = None
        self._counter: Any = None

    @property
    def size(self) -> int:
        return self._builder.estimated_size

    @property
    def count(self) -> int:
        return self._builder.record_count

    def bind(self, future_type: type, result: Any, counter: Any, /) -> None:
        if self._builder.record_count or self._future_type is not None:
            raise RuntimeError("bind() is for a new, unbound builder")
        self._future_type, self._result, self._counter = future_type, result, counter

    def append_future(
        self, timestamp_ms: int, key: Data | None, value: Data | None, headers: Any = None, /
    ) -> Any:
        builder = self._builder
        if self._future_type is None:
            raise RuntimeError("append_future() needs bind() first")
        count, records = builder.record_count, builder.estimated_size - HEADER_SIZE
        if not builder.append(timestamp_ms, key, value, headers or ()):
            return None
        self._count_since(count, records)
        return tuple.__new__(self._future_type, (self._result, count, timestamp_ms))

    def append_values(self, timestamp_ms: int, values: Any, keys: Any = None, /) -> int:
        count, records = self._builder.record_count, self._builder.estimated_size - HEADER_SIZE
        added = self._builder.append_values(timestamp_ms, values, keys)
        if added:
            self._count_since(count, records)
        return added

    def _count_since(self, count: int, records: int) -> None:
        """Add what was appended since (count, records bytes) to the counter, as the compiled
        encoder does: the records' bytes, and the header with a batch's first record."""
        if self._counter is not None:
            grown = self._builder.estimated_size - HEADER_SIZE - records
            self._counter.add(grown + (HEADER_SIZE if count == 0 else 0))


class _AnyTimestampBuilder(BatchBuilder):
    """encode_batch's builder: any int64 timestamp, Kafka's NO_TIMESTAMP (-1) included, for the
    tests and tools that write batches a producer never would. Always the pure path (the compiled
    encoder keeps to the producer's rule)."""

    def __init__(self, batch_size: int, **kwargs: Any) -> None:
        super().__init__(batch_size, **kwargs)
        self._native = None

    @staticmethod
    def _checked_timestamp(timestamp_ms: object) -> int:
        value = index(timestamp_ms)  # type: ignore[arg-type]
        if not INT64_MIN <= value <= INT64_MAX:
            raise ValueError(f"timestamp {value} is outside int64")
        return value


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
    """One v2 batch of `records` = (timestamp_ms, key, value, headers); offset deltas 0..n-1.

    Timestamps may be any int64 here (-1 is Kafka's NO_TIMESTAMP), unlike `BatchBuilder.append`.
    """
    builder = _AnyTimestampBuilder(
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


# A record at its own offset: (offset, timestamp_ms, key, value, headers).
PlacedRecord = tuple[int, int, Data | None, Data | None, HeaderList]


def _encode_placed_record(
    offset_delta: int,
    timestamp_delta: int,
    key: Data | None,
    value: Data | None,
    headers: HeaderList,
) -> bytes:
    """One record's bytes (length prefix included), the layout `BatchBuilder.append` writes."""
    body = [b"\x00", encode_varlong(timestamp_delta), encode_varint(offset_delta)]
    if key is None:
        body.append(NULL_LENGTH)
    else:
        key = record_bytes(key, "key")
        body += (encode_varint(len(key)), key)
    if value is None:
        body.append(NULL_LENGTH)
    else:
        value = record_bytes(value, "value")
        body += (encode_varint(len(value)), value)
    body.append(_encode_headers(headers) if headers else b"\x00")
    encoded = b"".join(body)
    return encode_varint(len(encoded)) + encoded


def encode_placed_batch(
    records: Sequence[PlacedRecord],
    *,
    base_offset: int,
    last_offset: int,
    base_timestamp: int,
    max_timestamp: int,
    compression: Compression = Compression.NONE,
    compression_level: int | None = None,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    timestamp_type: int = CREATE_TIME,
    is_transactional: bool = False,
    delete_horizon: bool = False,
) -> bytes:
    """One v2 batch whose records keep their own offsets, which may skip values: the batch the
    log cleaner writes back (Kafka's MemoryRecords.filterTo through MemoryRecordsBuilder with
    `overrideLastOffset`).

    The header says [base_offset, last_offset] whatever records are left, so the batch keeps the
    producer's last sequence; each record's offset delta and timestamp delta are taken from
    `base_offset` and `base_timestamp`. With `delete_horizon` the DELETE_HORIZON_MASK bit is set
    and `base_timestamp` is the horizon (KIP-534; deltas may then be negative). No records gives
    a header-only batch (Kafka's writeEmptyHeader: pass base_timestamp -1 and no compression).
    The same record layout and compression as `BatchBuilder` (a test holds the two together).
    Raises ValueError for offsets outside [base_offset, last_offset] or not increasing.
    """
    if not base_offset <= last_offset <= base_offset + INT32_MAX:
        raise ValueError(f"last offset {last_offset} does not fit a batch at {base_offset}")
    if timestamp_type not in (CREATE_TIME, LOG_APPEND_TIME):
        raise ValueError(f"timestamp_type must be 0 (CreateTime) or 1, got {timestamp_type}")
    parts: list[bytes] = []
    previous = base_offset - 1
    for offset, timestamp_ms, key, value, headers in records:
        if not previous < offset <= last_offset:
            raise ValueError(
                f"record offset {offset} not in ({previous}, {last_offset}] of the batch at "
                f"{base_offset}"
            )
        previous = offset
        parts.append(
            _encode_placed_record(
                offset - base_offset, timestamp_ms - base_timestamp, key, value, headers
            )
        )
    section = b"".join(parts)
    codec = Compression(compression)
    if parts and codec is not Compression.NONE:
        section = compress(codec, section, compression_level)
    attributes = int(codec)
    if timestamp_type == LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    if is_transactional:
        attributes |= TRANSACTIONAL_MASK
    if delete_horizon:
        attributes |= DELETE_HORIZON_MASK
    out = bytearray(HEADER_SIZE)
    out += section
    _HEADER_WRITER.pack_into(
        out,
        0,
        base_offset,
        len(out) - LOG_OVERHEAD,
        partition_leader_epoch,
        MAGIC,
        0,
        attributes,
        last_offset - base_offset,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(parts),
    )
    _UINT32.pack_into(out, CRC_OFFSET, crc_of(out, ATTRIBUTES_OFFSET, len(out)))
    return bytes(out)
