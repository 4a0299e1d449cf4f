"""Kafka's zig-zag varints (ByteUtils.writeVarint / writeVarlong / readVarint / readVarlong).

Pure: no I/O. The `*_unchecked` readers are the hot-path forms the record decoder and the leader's
record check inline around: running off the end of the buffer raises IndexError and an overlong
varint `VarintTooLong`, which those callers turn into `CorruptRecordError` with their own position.
`decode_varint` / `decode_varlong` are the checked forms for everyone else.
"""

from __future__ import annotations

from minibroker.client.batch import CorruptRecordError

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def _encode_unsigned(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Every value whose zig-zag form fits two bytes, precomputed: lengths of keys and values up to
# 8 KiB, offset deltas and small timestamp deltas all hit this table, which keeps append cheap.
SMALL_LIMIT = 8192
SMALL_VARINTS: tuple[bytes, ...] = tuple(
    _encode_unsigned((n << 1) ^ (n >> 63)) for n in range(-SMALL_LIMIT, SMALL_LIMIT)
)
NULL_LENGTH = SMALL_VARINTS[SMALL_LIMIT - 1]  # varint(-1): a null key, value or header value


def encode_varint(value: int) -> bytes:
    """Zig-zag varint of a signed int32 (at most 5 bytes)."""
    if -SMALL_LIMIT <= value < SMALL_LIMIT:
        return SMALL_VARINTS[value + SMALL_LIMIT]
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"varint {value} is outside int32")
    return _encode_unsigned(((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)


def encode_varlong(value: int) -> bytes:
    """Zig-zag varint of a signed int64 (at most 10 bytes)."""
    if -SMALL_LIMIT <= value < SMALL_LIMIT:
        return SMALL_VARINTS[value + SMALL_LIMIT]
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"varlong {value} is outside int64")
    return _encode_unsigned(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


class VarintTooLong(ValueError):
    """A varint with a continuation bit past its maximum length; callers add the position."""


def read_varint_unchecked(buf: bytes | bytearray, pos: int) -> tuple[int, int]:
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
            raise VarintTooLong("varint is longer than 5 bytes")
    # Java keeps only the low 32 bits of the five 7-bit groups; so do we.
    result &= 0xFFFFFFFF
    return (result >> 1) ^ -(result & 1), pos


def read_varlong_unchecked(buf: bytes | bytearray, pos: int) -> tuple[int, int]:
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
            raise VarintTooLong("varlong is longer than 10 bytes")
    result &= 0xFFFFFFFFFFFFFFFF
    return (result >> 1) ^ -(result & 1), pos


def decode_varint(buf: bytes | bytearray, pos: int = 0) -> tuple[int, int]:
    """Read a zig-zag int32 varint at `pos`; returns (value, next position)."""
    try:
        return read_varint_unchecked(buf, pos)
    except IndexError:
        raise CorruptRecordError(f"varint at {pos} runs past the end of the buffer") from None
    except VarintTooLong as err:
        raise CorruptRecordError(f"{err} at {pos}") from None


def decode_varlong(buf: bytes | bytearray, pos: int = 0) -> tuple[int, int]:
    """Read a zig-zag int64 varint at `pos`; returns (value, next position)."""
    try:
        return read_varlong_unchecked(buf, pos)
    except IndexError:
        raise CorruptRecordError(f"varlong at {pos} runs past the end of the buffer") from None
    except VarintTooLong as err:
        raise CorruptRecordError(f"{err} at {pos}") from None


def zigzag(n: int) -> int:
    """The signed value of a zig-zag encoded unsigned one."""
    return (n >> 1) ^ -(n & 1)
