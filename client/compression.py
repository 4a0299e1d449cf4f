"""The four record-batch codecs, framed the way Kafka's Java client frames them.

Pure: no I/O. The codecs themselves are cramjam's (C/Rust); this module only owns the framing
and the choices that make our bytes readable by Kafka and Kafka's bytes readable by us:

- gzip: one standard gzip member (RFC 1952), as Java's GZIPOutputStream writes. Reading accepts
  several concatenated members, as GZIPInputStream does.
- snappy: Kafka's Java client wraps snappy in xerial's SnappyOutputStream, whose stream is a
  16-byte header (0x82 "SNAPPY" 0x00, int32 version 1, int32 compatible-version 1) followed by
  blocks of (int32 big-endian compressed length, raw snappy block) of at most 32 KiB input each.
  We write that; we read it and also a bare raw snappy block (what xerial's SnappyInputStream
  falls back to when the header is absent, and what some non-Java clients send).
- lz4: the LZ4 *frame* format (KIP-57 fixed Kafka's broken header checksum for magic >= 1).
  Kafka's reader (Lz4BlockInputStream) refuses dependent blocks ("Dependent block stream is
  unsupported"), so frames are written with independent blocks; cramjam's one-shot
  `lz4.compress` links blocks, so the streaming Compressor with `block_linked=False` is used.
- zstd: one standard zstd frame.

`decompress_bounded` is `decompress` with a ceiling on the output, for bytes from the network
that are decompressed before anything else checks them (a leader validating a produced batch).

Levels default to Kafka's (KIP-390: `compression.gzip.level` 6 via Deflater's default,
`compression.zstd.level` 3) except lz4, where Kafka's default level 9 is LZ4-HC; we default to
the fast compressor (level 1), which Kafka's reader decodes all the same, because the producer
runs in Python and HC costs about 4x the time for about 1% smaller batches.
"""

from __future__ import annotations

import struct

import cramjam

from minibroker.client.batch import Compression, CorruptRecordError

GZIP_DEFAULT_LEVEL = 6
ZSTD_DEFAULT_LEVEL = 3
# liblz4's frame API switches to LZ4-HC from level 3 up; 1 is the fast compressor (about 4x the
# speed of HC on a 16 KiB batch here, for about 1% larger output).
LZ4_DEFAULT_LEVEL = 1

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_VERSION = 1
XERIAL_COMPATIBLE_VERSION = 1
XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", XERIAL_VERSION, XERIAL_COMPATIBLE_VERSION)
# SnappyOutputStream's default block size: the uncompressed input of one xerial block.
XERIAL_BLOCK_SIZE = 32 * 1024

_INT32 = struct.Struct(">i")


def compress(
    compression: Compression, data: bytes | bytearray | memoryview, level: int | None = None
) -> bytes:
    """Compress a batch's records section with `compression` (not NONE)."""
    if compression is Compression.GZIP:
        return bytes(
            cramjam.gzip.compress(data, level=GZIP_DEFAULT_LEVEL if level is None else level)
        )
    if compression is Compression.SNAPPY:
        return xerial_snappy_encode(data)
    if compression is Compression.LZ4:
        compressor = cramjam.lz4.Compressor(
            level=LZ4_DEFAULT_LEVEL if level is None else level,
            content_checksum=False,
            block_linked=False,
        )
        compressor.compress(data)
        return bytes(compressor.finish())
    if compression is Compression.ZSTD:
        return bytes(
            cramjam.zstd.compress(data, level=ZSTD_DEFAULT_LEVEL if level is None else level)
        )
    raise ValueError(f"compress() needs a codec, got {compression!r}")


def decompress(
    compression: Compression, data: bytes | bytearray | memoryview, position: int = 0
) -> bytes:
    """Decompress a records section; malformed input raises CorruptRecordError at `position`."""
    try:
        if compression is Compression.GZIP:
            return bytes(cramjam.gzip.decompress(data))
        if compression is Compression.SNAPPY:
            return xerial_snappy_decode(data, position)
        if compression is Compression.LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if compression is Compression.ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except cramjam.DecompressionError as err:
        raise CorruptRecordError(
            f"{compression.label} decompression failed: {err}", position
        ) from None
    raise CorruptRecordError(f"unknown compression codec id {int(compression)}", position)


# decompress_bounded's first output buffer: this many times the compressed size, at least
# _FIRST_OUTPUT_MIN; each retry makes it _OUTPUT_GROWTH times larger, up to the limit.
_FIRST_OUTPUT_RATIO = 16
_FIRST_OUTPUT_MIN = 64 * 1024
_OUTPUT_GROWTH = 16
# What cramjam's *_into functions say when the output buffer is too small (and only then).
_OUTPUT_FULL = "failed to write whole buffer"


def decompress_bounded(
    compression: Compression,
    data: bytes | bytearray | memoryview,
    limit: int,
    position: int = 0,
) -> bytes:
    """`decompress`, refusing output larger than `limit` bytes without ever holding more.

    A few hundred compressed bytes can expand to gigabytes (a "decompression bomb"), so a
    broker that looks inside batches from the network decompresses into buffers it sizes itself:
    first 16x the input (at least 64 KiB), then 16x larger each time the codec runs out of room,
    up to `limit`. Snappy states its sizes up front, so they are checked before decompressing.
    Malformed input, or input that would pass `limit`, raises CorruptRecordError at `position`.
    """
    if compression is Compression.SNAPPY:
        return _xerial_snappy_decode_bounded(data, limit, position)
    codec = _INTO_CODECS.get(compression)
    if codec is None:
        raise CorruptRecordError(f"unknown compression codec id {int(compression)}", position)
    size = min(limit, max(_FIRST_OUTPUT_MIN, _FIRST_OUTPUT_RATIO * len(data)))
    while True:
        out = bytearray(size)
        try:
            written = codec.decompress_into(data, out)
        except cramjam.DecompressionError as err:
            if _OUTPUT_FULL not in str(err):
                raise CorruptRecordError(
                    f"{compression.label} decompression failed: {err}", position
                ) from None
            if size >= limit:
                raise CorruptRecordError(
                    f"{compression.label} records decompress to more than {limit} bytes", position
                ) from None
            size = min(limit, size * _OUTPUT_GROWTH)
            continue
        return bytes(memoryview(out)[:written])


_INTO_CODECS = {
    Compression.GZIP: cramjam.gzip,
    Compression.LZ4: cramjam.lz4,
    Compression.ZSTD: cramjam.zstd,
}


def _xerial_snappy_decode_bounded(
    data: bytes | bytearray | memoryview, limit: int, position: int
) -> bytes:
    """`xerial_snappy_decode` after checking the sizes its blocks declare add up to <= limit."""
    view = memoryview(data)
    try:
        if len(view) < len(XERIAL_HEADER) or view[: len(XERIAL_MAGIC)] != XERIAL_MAGIC:
            total = cramjam.snappy.decompress_raw_len(view)
        else:
            total = 0
            pos = len(XERIAL_HEADER)
            end = len(view)
            while pos + 4 <= end:
                (length,) = _INT32.unpack_from(view, pos)
                pos += 4
                if length < 0 or length > end - pos:
                    break  # xerial_snappy_decode names the problem
                total += cramjam.snappy.decompress_raw_len(view[pos : pos + length])
                pos += length
    except cramjam.DecompressionError as err:
        raise CorruptRecordError(f"snappy decompression failed: {err}", position) from None
    if total > limit:
        raise CorruptRecordError(
            f"snappy records decompress to {total} bytes, more than {limit}", position
        )
    try:
        return xerial_snappy_decode(view, position)
    except cramjam.DecompressionError as err:
        raise CorruptRecordError(f"snappy decompression failed: {err}", position) from None


def xerial_snappy_encode(data: bytes | bytearray | memoryview) -> bytes:
    """Snappy in xerial's block framing, byte-compatible with SnappyOutputStream."""
    view = memoryview(data)
    parts = [XERIAL_HEADER]
    for start in range(0, len(view), XERIAL_BLOCK_SIZE):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + XERIAL_BLOCK_SIZE]))
        parts.append(_INT32.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def xerial_snappy_decode(data: bytes | bytearray | memoryview, position: int = 0) -> bytes:
    """Read xerial-framed snappy, or a raw snappy block when the xerial header is absent."""
    view = memoryview(data)
    if len(view) < len(XERIAL_HEADER) or view[: len(XERIAL_MAGIC)] != XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(view))
    # Version and compatible-version are not checked: some producers write them little-endian
    # (kafka-python issue 2414) and there is only one xerial block format.
    parts: list[bytes] = []
    pos = len(XERIAL_HEADER)
    end = len(view)
    while pos < end:
        if end - pos < 4:
            raise CorruptRecordError(f"snappy: truncated xerial block length at {pos}", position)
        (length,) = _INT32.unpack_from(view, pos)
        pos += 4
        if length < 0 or length > end - pos:
            raise CorruptRecordError(
                f"snappy: xerial block of {length} bytes at {pos} overruns the {end} byte stream",
                position,
            )
        parts.append(bytes(cramjam.snappy.decompress_raw(view[pos : pos + length])))
        pos += length
    return b"".join(parts)
