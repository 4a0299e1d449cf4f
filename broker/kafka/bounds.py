"""Every length in a Kafka request checked against the bytes left, before kio reads it.

kio's native reader sizes a list from the count on the wire before reading any element
(`Vec::with_capacity(n)`), so a 20-byte request whose array count is 2^32 asks for tens of GiB
and the allocation failure aborts the whole broker process (Rust aborts; Python cannot catch
it). This walk reads only lengths and counts, driven by the same kio dataclasses (their
`kafka_type` metadata), so it needs no code per message: an array count, a string, bytes or
records length, or a tagged field size larger than the bytes left in the frame makes the request
malformed (`BoundsError`), and kio never sees it. Every array element takes at least one byte
in every schema served, so a count above the bytes left cannot be honest.

Encodings (Kafka's protocol guide): non-flexible versions use int16 string lengths, int32
bytes/records lengths and int32 array counts (-1: null); flexible versions use unsigned varint
lengths and counts holding N + 1 (0: null), and end every struct with a tagged-field section
(count, then tag, size and that many bytes per field).
"""

from __future__ import annotations

import dataclasses
import struct
from functools import cache
from typing import Any

from kio.serial._introspect import classify_field

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_FIXED = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "timedelta_i64": 8,  # OffsetCommit v2-v4 retention_time
    "int64": 8,
    "float64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
UVARINT_MAX_BYTES = 5  # a 32-bit unsigned varint


class BoundsError(Exception):
    """A length or count in the request runs past its end (or a varint is too long)."""


def _uvarint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(UVARINT_MAX_BYTES):
        if pos + i >= len(buf):
            raise BoundsError(f"varint at {pos} runs past the end")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos + i + 1
        shift += 7
    raise BoundsError(f"varint at {pos} is longer than {UVARINT_MAX_BYTES} bytes")


def _fixed(buf: bytes | memoryview, pos: int, size: int) -> int:
    if pos + size > len(buf):
        raise BoundsError(f"{size}-byte field at {pos} runs past the end")
    return pos + size


def _length(
    buf: bytes | memoryview, pos: int, flexible: bool, legacy: struct.Struct
) -> tuple[int, int]:
    """(length or -1 for null, position after it), for a string, bytes, records or array."""
    if flexible:
        raw, pos = _uvarint(buf, pos)
        return raw - 1, pos
    pos_after = _fixed(buf, pos, legacy.size)
    (value,) = legacy.unpack_from(buf, pos)
    if value < -1:
        raise BoundsError(f"negative length {value} at {pos}")
    return value, pos_after


def _check_left(buf: bytes | memoryview, pos: int, length: int, what: str) -> None:
    if length > len(buf) - pos:
        raise BoundsError(
            f"{what} of {length} at {pos} is larger than the {len(buf) - pos} bytes left"
        )


@cache
def _plan(cls: type) -> tuple[tuple[tuple[str, Any, bool], ...], dict[int, tuple[str, Any, bool]]]:
    """(untagged fields in order, tagged fields by tag), each as (kafka_type, entity class or
    None, is_array)."""
    ordered: list[tuple[str, Any, bool]] = []
    tagged: dict[int, tuple[str, Any, bool]] = {}
    for field in dataclasses.fields(cls):
        kind = classify_field(field)
        entity = kind.type_ if type(kind).__name__.startswith("Entity") else None
        entry = (field.metadata.get("kafka_type") or "", entity, kind.is_array)
        tag = field.metadata.get("tag")
        if tag is None:
            ordered.append(entry)
        else:
            tagged[int(tag)] = entry
    return tuple(ordered), tagged


def _value(buf: bytes | memoryview, pos: int, entry: tuple[str, Any, bool], flexible: bool) -> int:
    kafka_type, entity, is_array = entry
    if is_array:
        count, pos = _length(buf, pos, flexible, _INT32)
        if count <= 0:
            return pos
        _check_left(buf, pos, count, "array count")
        element = (kafka_type, entity, False)
        for _ in range(count):
            pos = _value(buf, pos, element, flexible)
        return pos
    if entity is not None:
        return check_struct(buf, pos, entity, flexible)
    size = _FIXED.get(kafka_type)
    if size is not None:
        return _fixed(buf, pos, size)
    if kafka_type == "string":
        length, pos = _length(buf, pos, flexible, _INT16)
    elif kafka_type in ("bytes", "records"):
        length, pos = _length(buf, pos, flexible, _INT32)
    else:
        raise BoundsError(f"field type {kafka_type!r} is not known to the bounds check")
    if length <= 0:
        return pos
    _check_left(buf, pos, length, f"{kafka_type} length")
    return pos + length


def tagged_section(
    buf: bytes | memoryview, pos: int, known: dict[int, tuple[str, Any, bool]]
) -> int:
    count, pos = _uvarint(buf, pos)
    _check_left(buf, pos, count, "tagged field count")
    for _ in range(count):
        tag, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        _check_left(buf, pos, size, "tagged field size")
        entry = known.get(tag)
        if entry is not None:
            # Read within the field's own bytes: its lengths may not run past them.
            _value(memoryview(buf)[pos : pos + size], 0, entry, True)
        pos += size
    return pos


def check_struct(buf: bytes | memoryview, pos: int, cls: type, flexible: bool) -> int:
    """Walk one struct of `cls` at `pos`; the position after it. BoundsError on a length that
    runs past the end."""
    ordered, tagged = _plan(cls)
    for entry in ordered:
        pos = _value(buf, pos, entry, flexible)
    if flexible:
        pos = tagged_section(buf, pos, tagged)
    return pos


def check_request(frame: bytes | memoryview, body_cls: type, flexible: bool) -> None:
    """Walk the request header (v1, or v2 when `flexible`) and the body."""
    pos = _fixed(frame, 0, 8)  # api key, version, correlation id
    client_id, pos = _length(frame, pos, False, _INT16)  # a legacy string in v1 and v2
    if client_id > 0:
        _check_left(frame, pos, client_id, "client id length")
        pos += client_id
    if flexible:
        pos = tagged_section(frame, pos, {})
    check_struct(frame, pos, body_cls, flexible)
