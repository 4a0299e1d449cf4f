"""Record batches as a compacted log holds them, for tests of every reader of a log with gaps.

A cleaned v2 batch keeps its base offset and its last offset (lastOffsetDelta) while records
inside it are removed, so its record offset deltas may skip values, its last record may end
below its last offset, and it may hold no record at all (an idempotent producer's emptied
batch). `cleaned_batch` builds such a batch byte for byte (uncompressed, CRC valid).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from minibroker.client.batch import ATTRIBUTES_OFFSET, CRC_OFFSET, MAGIC, crc_of
from minibroker.client.records.varint import encode_varint, encode_varlong

_HEADER = struct.Struct(">qiibIhiqqqhii")


def cleaned_batch(
    base_offset: int,
    records: Sequence[tuple[int, bytes | None, bytes | None]],
    last_offset: int,
    *,
    epoch: int = 0,
    timestamp: int = 1_000,
) -> bytes:
    """A batch at `base_offset` whose records are (offset, key, value) at any increasing
    offsets in [base_offset, last_offset], ending at `last_offset` (inclusive)."""
    offsets = [offset for offset, _, _ in records]
    if offsets != sorted(set(offsets)) or any(
        not base_offset <= offset <= last_offset for offset in offsets
    ):
        raise ValueError(f"record offsets {offsets} do not fit [{base_offset}, {last_offset}]")
    body = bytearray()
    for offset, key, value in records:
        record = bytearray(b"\x00")  # attributes
        record += encode_varlong(offset - base_offset)  # timestampDelta: the offset's
        record += encode_varint(offset - base_offset)
        for field in (key, value):
            if field is None:
                record += encode_varint(-1)
            else:
                record += encode_varint(len(field)) + field
        record += encode_varint(0)  # no headers
        body += encode_varint(len(record)) + record
    max_timestamp = timestamp + (max(offsets) - base_offset if offsets else 0)
    header = _HEADER.pack(
        base_offset,
        _HEADER.size - 12 + len(body),
        epoch,
        MAGIC,
        0,
        0,
        last_offset - base_offset,
        timestamp,
        max_timestamp,
        -1,
        -1,
        -1,
        len(records),
    )
    data = bytearray(header + body)
    struct.pack_into(">I", data, CRC_OFFSET, crc_of(data, ATTRIBUTES_OFFSET, len(data)))
    return bytes(data)
