"""Record batches with a correct CRC and wrong contents, as a hostile or buggy producer sends them.

Shared by the unit tests of the leader's record validation (tests/unit) and the integration test
that sends them to a real leader (tests/integration). Every batch here passes the header checks
(`client/batch.py: validate_producer_batches`: length, magic, CRC, lastOffsetDelta ==
recordsCount - 1), so only a look at the records finds what is wrong. `CASES` pairs each with
the error code Kafka's leader answers (LogValidator): INVALID_RECORD for records that do not parse
or do not match their header, CORRUPT_MESSAGE for a codec that is unknown or does not decompress,
INVALID_TIMESTAMP for a timestamp out of range.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Callable

import crc32c

from minibroker.client.batch import (
    ATTRIBUTES_OFFSET,
    CRC_OFFSET,
    HEADER_SIZE,
    LOG_OVERHEAD,
    Compression,
)
from minibroker.client.compression import compress
from minibroker.client.errors import ErrorCode
from minibroker.client.records import encode_batch, encode_varint, encode_varlong

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS

# Header fields by byte offset (client/batch.py's layout).
_ATTRIBUTES = struct.Struct(">h")  # at 21
_LAST_OFFSET_DELTA = struct.Struct(">i")  # at 23
_TIMESTAMP = struct.Struct(">q")  # baseTimestamp at 27, maxTimestamp at 35
_SEQUENCE = struct.Struct(">i")  # baseSequence at 53
_COUNT = struct.Struct(">i")  # recordsCount at 57


def fix_crc(buf: bytearray) -> bytes:
    """Recompute the CRC-32C over [21, end), so only content checks can find the damage."""
    struct.pack_into(">I", buf, CRC_OFFSET, crc32c.crc32c(bytes(buf[ATTRIBUTES_OFFSET:])))
    return bytes(buf)


def good_batch(
    now_ms: int, count: int = 3, *, compression: Compression = Compression.NONE, **kw: object
) -> bytes:
    """`count` records stamped `now_ms`, as the producer builds them."""
    return encode_batch(
        [(now_ms, f"k{i}".encode(), f"value-{i}".encode(), []) for i in range(count)],
        compression=compression,
        **kw,  # type: ignore[arg-type]
    )


def raw_record(
    offset_delta: int,
    timestamp_delta: int = 0,
    value: bytes = b"v",
    *,
    key: bytes | None = None,
    headers: bytes = b"\x00",
    extra_length: int = 0,
) -> bytes:
    """One record's bytes with every field chosen; `extra_length` lies about its length."""
    body = (
        b"\x00"
        + encode_varlong(timestamp_delta)
        + encode_varint(offset_delta)
        + (encode_varint(-1) if key is None else encode_varint(len(key)) + key)
        + encode_varint(len(value))
        + value
        + headers
    )
    return encode_varint(len(body) + extra_length) + body


def batch_of(
    records_section: bytes,
    count: int,
    *,
    base_timestamp: int,
    max_timestamp: int,
    attributes: int = 0,
    base_offset: int = 0,
) -> bytes:
    """A batch around a records section (already compressed, or not) with a valid CRC."""
    buf = bytearray(HEADER_SIZE) + records_section
    struct.pack_into(
        ">qiibIhiqqqhii",
        buf,
        0,
        base_offset,
        len(buf) - LOG_OVERHEAD,
        -1,
        2,
        0,
        attributes,
        count - 1,
        base_timestamp,
        max_timestamp,
        -1,
        -1,
        -1,
        count,
    )
    return fix_crc(buf)


def with_header(batch: bytes, **fields: int) -> bytes:
    """`batch` with header fields rewritten (attributes, count, timestamps, ...) and a good CRC."""
    buf = bytearray(batch)
    for name, value in fields.items():
        if name == "attributes":
            _ATTRIBUTES.pack_into(buf, 21, value)
        elif name == "count":  # recordsCount and lastOffsetDelta together, as a producer would
            _COUNT.pack_into(buf, 57, value)
            _LAST_OFFSET_DELTA.pack_into(buf, 23, value - 1)
        elif name == "base_timestamp":
            _TIMESTAMP.pack_into(buf, 27, value)
        elif name == "max_timestamp":
            _TIMESTAMP.pack_into(buf, 35, value)
        elif name == "producer":  # producer id, epoch 0, base sequence left as it is
            struct.pack_into(">qh", buf, 43, value, 0)
        elif name == "base_sequence":
            _SEQUENCE.pack_into(buf, 53, value)
        elif name == "base_offset":
            struct.pack_into(">q", buf, 0, value)
        else:
            raise ValueError(f"unknown header field {name}")
    return fix_crc(buf)


def _records(offset_deltas: list[int]) -> bytes:
    return b"".join(raw_record(d) for d in offset_deltas)


@functools.cache
def _zstd_bomb() -> bytes:
    """A few KiB of zstd that expand to 100 MiB of zeros: more than any leader should hold."""
    return compress(Compression.ZSTD, bytes(100 << 20))


# name -> (build(now_ms) -> batch bytes, the error code the leader must answer)
CASES: dict[str, tuple[Callable[[int], bytes], ErrorCode]] = {
    "count 10, 3 records": (
        lambda now: with_header(good_batch(now, 3), count=10),
        ErrorCode.INVALID_RECORD,
    ),
    "count 2, 3 records": (
        lambda now: with_header(good_batch(now, 3), count=2),
        ErrorCode.INVALID_RECORD,
    ),
    "garbage body": (
        lambda now: batch_of(os.urandom(200), 3, base_timestamp=now, max_timestamp=now),
        ErrorCode.INVALID_RECORD,
    ),
    "codec 7": (
        lambda now: with_header(good_batch(now), attributes=7),
        ErrorCode.CORRUPT_MESSAGE,
    ),
    "codec 5": (
        lambda now: with_header(good_batch(now), attributes=5),
        ErrorCode.CORRUPT_MESSAGE,
    ),
    "gzip flag on uncompressed records": (
        lambda now: with_header(good_batch(now), attributes=int(Compression.GZIP)),
        ErrorCode.CORRUPT_MESSAGE,
    ),
    "zstd flag on gzip records": (
        lambda now: with_header(
            good_batch(now, compression=Compression.GZIP), attributes=int(Compression.ZSTD)
        ),
        ErrorCode.CORRUPT_MESSAGE,
    ),
    "zstd bomb (100 MiB of zeros)": (
        lambda now: batch_of(
            _zstd_bomb(),
            3,
            base_timestamp=now,
            max_timestamp=now,
            attributes=int(Compression.ZSTD),
        ),
        ErrorCode.CORRUPT_MESSAGE,
    ),
    "gzip records, count 10 inside": (
        lambda now: with_header(good_batch(now, 3, compression=Compression.GZIP), count=10),
        ErrorCode.INVALID_RECORD,
    ),
    "offset deltas 0, 0, 0": (
        lambda now: batch_of(_records([0, 0, 0]), 3, base_timestamp=now, max_timestamp=now),
        ErrorCode.INVALID_RECORD,
    ),
    "offset deltas 0, 2, 1": (
        lambda now: batch_of(_records([0, 2, 1]), 3, base_timestamp=now, max_timestamp=now),
        ErrorCode.INVALID_RECORD,
    ),
    "record length says one byte more": (
        lambda now: batch_of(
            raw_record(0) + raw_record(1, extra_length=1) + raw_record(2),
            3,
            base_timestamp=now,
            max_timestamp=now,
        ),
        ErrorCode.INVALID_RECORD,
    ),
    "null header key": (
        lambda now: batch_of(
            raw_record(0, headers=encode_varint(1) + encode_varint(-1) + encode_varint(-1)),
            1,
            base_timestamp=now,
            max_timestamp=now,
        ),
        ErrorCode.INVALID_RECORD,
    ),
    "header key not UTF-8": (
        lambda now: batch_of(
            raw_record(0, headers=encode_varint(1) + encode_varint(2) + b"\xff\xfe" + b"\x00"),
            1,
            base_timestamp=now,
            max_timestamp=now,
        ),
        ErrorCode.INVALID_RECORD,
    ),
    "maxTimestamp above the records'": (
        lambda now: with_header(good_batch(now), max_timestamp=now + 5_000),
        ErrorCode.INVALID_RECORD,
    ),
    "baseOffset 5": (
        lambda now: with_header(good_batch(now), base_offset=5),
        ErrorCode.INVALID_RECORD,
    ),
    "producer id with sequence -1": (
        lambda now: with_header(good_batch(now), producer=7, base_sequence=-1),
        ErrorCode.INVALID_RECORD,
    ),
    "8 days in the future": (
        lambda now: good_batch(now + 8 * DAY_MS),
        ErrorCode.INVALID_TIMESTAMP,
    ),
    "second record 2 hours ahead": (
        lambda now: batch_of(
            raw_record(0) + raw_record(1, timestamp_delta=2 * HOUR_MS),
            2,
            base_timestamp=now,
            max_timestamp=now + 2 * HOUR_MS,
        ),
        ErrorCode.INVALID_TIMESTAMP,
    ),
    "negative timestamp": (
        lambda now: good_batch(-5),
        ErrorCode.INVALID_TIMESTAMP,
    ),
    "LogAppendTime set by the producer": (
        lambda now: with_header(good_batch(now), attributes=0x08),
        ErrorCode.INVALID_TIMESTAMP,
    ),
}
