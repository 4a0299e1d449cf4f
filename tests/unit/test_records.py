"""The v2 record-batch codec: varints, byte layout, round trips, builder limits, corruption.

Proves that `minibroker.client.records` writes the layout of docs/protocol.md §23 (Kafka's
DefaultRecordBatch) byte for byte (a hand-assembled golden batch), that every codec round-trips
arbitrary records, and that damaged input of any shape raises CorruptRecordError and nothing else.
"""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.client.batch import (
    HEADER_SIZE,
    Compression,
    CorruptRecordError,
    read_header,
    set_base_offset,
    set_partition_leader_epoch,
)
from minibroker.client.compression import XERIAL_HEADER, compress, decompress
from minibroker.client.records import (
    BatchBuilder,
    DecodedRecord,
    decode_batch,
    decode_varint,
    decode_varlong,
    encode_batch,
    encode_varint,
    encode_varlong,
    iter_decoded_batches,
    iter_records,
    parse_control_key,
)

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------------
# Varints: vectors from Kafka's ByteUtilsTest (zig-zag, 7 bits a byte, low bits first).

VARINT_VECTORS = [
    (0, "00"),
    (-1, "01"),
    (1, "02"),
    (63, "7e"),
    (-64, "7f"),
    (64, "8001"),
    (-65, "8101"),
    (8191, "fe7f"),
    (-8192, "ff7f"),
    (8192, "808001"),
    (2**31 - 1, "feffffff0f"),
    (-(2**31), "ffffffff0f"),
]


@pytest.mark.parametrize(("value", "hex_bytes"), VARINT_VECTORS)
def test_varint_vectors(value: int, hex_bytes: str) -> None:
    assert encode_varint(value).hex() == hex_bytes
    assert decode_varint(bytes.fromhex(hex_bytes)) == (value, len(hex_bytes) // 2)


def test_varlong_extremes() -> None:
    assert encode_varlong(2**63 - 1).hex() == "feffffffffffffffff01"
    assert encode_varlong(-(2**63)).hex() == "ffffffffffffffffff01"
    assert decode_varlong(bytes.fromhex("feffffffffffffffff01")) == (2**63 - 1, 10)


@given(st.integers(-(2**31), 2**31 - 1))
@settings(max_examples=200, deadline=None)
def test_varint_round_trip(value: int) -> None:
    encoded = encode_varint(value)
    assert len(encoded) <= 5
    assert decode_varint(encoded + b"\xff") == (value, len(encoded))


@given(st.integers(-(2**63), 2**63 - 1))
@settings(max_examples=200, deadline=None)
def test_varlong_round_trip(value: int) -> None:
    encoded = encode_varlong(value)
    assert len(encoded) <= 10
    assert decode_varlong(encoded) == (value, len(encoded))


def test_varint_range_and_malformed_input() -> None:
    with pytest.raises(ValueError):
        encode_varint(2**31)
    with pytest.raises(ValueError):
        encode_varlong(2**63)
    with pytest.raises(CorruptRecordError, match="longer than 5 bytes"):
        decode_varint(b"\xff\xff\xff\xff\xff\x01")
    with pytest.raises(CorruptRecordError, match="longer than 10 bytes"):
        decode_varlong(b"\xff" * 10 + b"\x01")
    with pytest.raises(CorruptRecordError, match="past the end"):
        decode_varint(b"\x80\x80")
    with pytest.raises(CorruptRecordError, match="past the end"):
        decode_varlong(b"")


# ---------------------------------------------------------------------------------------------
# The exact byte layout


def test_golden_uncompressed_batch_layout() -> None:
    """A batch assembled by hand from docs/protocol.md §23's table equals encode_batch's output."""
    records_section = (
        # record 0: ts 1000 (delta 0), offset delta 0, key b"k", value b"hello", one header
        bytes.fromhex("1e")  # length 15, zig-zag
        + b"\x00"  # attributes
        + bytes.fromhex("00")  # timestampDelta 0
        + bytes.fromhex("00")  # offsetDelta 0
        + bytes.fromhex("02")
        + b"k"  # keyLength 1
        + bytes.fromhex("0a")
        + b"hello"  # valueLength 5
        + bytes.fromhex("02")  # headersCount 1
        + bytes.fromhex("02")
        + b"h"  # header key length 1
        + bytes.fromhex("01")  # header value null
        # record 1: ts 990 (delta -10), offset delta 1, null key, null value, no headers
        + bytes.fromhex("0c")  # length 6
        + b"\x00"
        + bytes.fromhex("13")  # timestampDelta -10
        + bytes.fromhex("02")  # offsetDelta 1
        + bytes.fromhex("01")  # key null
        + bytes.fromhex("01")  # value null
        + bytes.fromhex("00")  # no headers
    )
    after_crc = struct.pack(">hiqqqhii", 0x10, 1, 1000, 1000, 77, 3, 5, 2) + records_section
    crc = crc32c.crc32c(after_crc)
    expected = (
        struct.pack(">qiib", 42, len(after_crc) + 9, 7, 2) + struct.pack(">I", crc) + after_crc
    )
    actual = encode_batch(
        [(1000, b"k", b"hello", [("h", None)]), (990, None, None, [])],
        base_offset=42,
        partition_leader_epoch=7,
        producer_id=77,
        producer_epoch=3,
        base_sequence=5,
        is_transactional=True,
    )
    assert actual == expected
    header = read_header(actual)
    assert (header.base_offset, header.last_offset, header.records_count) == (42, 43, 2)
    assert header.is_transactional and not header.log_append_time
    assert header.max_timestamp == 1000 and header.base_timestamp == 1000


# ---------------------------------------------------------------------------------------------
# Round trips

headers_st = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=16))), max_size=3
)
record_st = st.tuples(
    st.integers(0, 2**41),
    st.one_of(st.none(), st.binary(max_size=64)),
    st.one_of(st.none(), st.binary(max_size=300)),
    headers_st,
)


@given(
    records=st.lists(record_st, min_size=1, max_size=20),
    compression=st.sampled_from(list(Compression)),
    base_offset=st.integers(0, 2**62),
    producer_id=st.integers(-1, 2**40),
    base_sequence=st.integers(-1, 2**31 - 1),
)
@settings(max_examples=120, deadline=None)
def test_round_trip_every_codec(
    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    compression: Compression,
    base_offset: int,
    producer_id: int,
    base_sequence: int,
) -> None:
    encoded = encode_batch(
        records,
        compression=compression,
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=base_sequence,
    )
    batch = decode_batch(encoded)
    header = batch.header
    assert header.size == len(encoded)
    assert header.compression is compression
    assert header.records_count == len(records)
    assert header.last_offset_delta == len(records) - 1
    assert header.base_timestamp == records[0][0]
    assert header.max_timestamp == max(r[0] for r in records)
    assert (header.producer_id, header.base_sequence) == (producer_id, base_sequence)
    expected = [
        DecodedRecord(base_offset + i, ts, key, value, tuple(headers))
        for i, (ts, key, value, headers) in enumerate(records)
    ]
    assert batch.records == expected


def test_log_append_time_reports_max_timestamp_for_every_record() -> None:
    encoded = encode_batch([(5, None, b"a", []), (9, None, b"b", [])], timestamp_type=1)
    batch = decode_batch(encoded)
    assert batch.header.log_append_time
    assert [r.timestamp for r in batch.records] == [9, 9]


def test_restamping_outside_the_crc_keeps_the_batch_valid() -> None:
    buf = bytearray(encode_batch([(1, b"k", b"v", [])] * 3))
    set_base_offset(buf, 0, 1000)
    set_partition_leader_epoch(buf, 0, 12)
    batch = decode_batch(buf)
    assert [r.offset for r in batch.records] == [1000, 1001, 1002]
    assert batch.header.partition_leader_epoch == 12


def test_sequences_wrap_like_kafka() -> None:
    batch = decode_batch(encode_batch([(1, None, b"v", [])] * 3, base_sequence=2**31 - 2))
    assert [batch.sequence_of(r) for r in batch.records] == [2**31 - 2, 2**31 - 1, 0]


def test_large_batch_spans_many_codec_blocks() -> None:
    """Bigger than one xerial block (32 KiB) and one lz4 block (64 KiB)."""
    records = [(i, None, bytes([i % 251]) * 4000, []) for i in range(60)]
    for compression in Compression:
        batch = decode_batch(encode_batch(records, compression=compression))
        assert [r.value for r in batch.records] == [r[2] for r in records]


# ---------------------------------------------------------------------------------------------
# Compression framing


def test_snappy_is_xerial_framed_and_raw_snappy_is_read() -> None:
    data = b"abc" * 20000
    framed = compress(Compression.SNAPPY, data)
    assert framed.startswith(XERIAL_HEADER)
    assert decompress(Compression.SNAPPY, framed) == data
    import cramjam

    assert decompress(Compression.SNAPPY, bytes(cramjam.snappy.compress_raw(data))) == data


def test_lz4_frames_use_independent_blocks() -> None:
    """Kafka's Lz4BlockInputStream rejects dependent blocks: FLG bit 5 must be set."""
    framed = compress(Compression.LZ4, b"xyz" * 50000)
    assert framed[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic, little-endian 0x184D2204
    flg, bd = framed[4], framed[5]
    assert flg >> 6 == 1, "frame version 01"
    assert flg & 0x20, "block independence"
    assert flg & 0x03 == 0, "reserved bits"
    assert 4 <= (bd >> 4) & 7 <= 7 and bd & 0x8F == 0


def test_gzip_and_zstd_frames_are_standard() -> None:
    import gzip

    assert gzip.decompress(compress(Compression.GZIP, b"q" * 1000)) == b"q" * 1000
    assert compress(Compression.ZSTD, b"q" * 1000)[:4] == b"\x28\xb5\x2f\xfd"


@pytest.mark.parametrize("compression", [c for c in Compression if c is not Compression.NONE])
def test_decompression_failure_is_corrupt_record(compression: Compression) -> None:
    garbage = b"\x82SNAPPY\x00" + b"\x00\x00\x00\x01\x00\x00\x00\x01\x7f\xff\xff\xff"
    for blob in (b"", b"\x00\x01\x02", garbage):
        with pytest.raises(CorruptRecordError, match=compression.label):
            decompress(compression, blob, position=99)


# ---------------------------------------------------------------------------------------------
# BatchBuilder


def test_builder_fills_to_batch_size_then_refuses() -> None:
    builder = BatchBuilder(1024)
    appended = 0
    while builder.append(appended, b"key", b"v" * 100):
        appended += 1
    assert 5 <= appended < 10
    assert builder.estimated_size <= 1024
    built = builder.build()
    assert len(built) == builder.estimated_size
    assert builder.build() is built
    assert [r.timestamp for r in decode_batch(built).records] == list(range(appended))
    with pytest.raises(RuntimeError):
        builder.append(0, None, b"late")


def test_builder_takes_one_oversized_record_when_empty() -> None:
    builder = BatchBuilder(100)
    assert builder.append(1, None, b"x" * 500)
    assert not builder.append(2, None, b"y")
    assert decode_batch(builder.build()).records[0].value == b"x" * 500


def test_builder_producer_state_and_types() -> None:
    builder = BatchBuilder(compression=Compression.ZSTD)
    with pytest.raises(ValueError):
        builder.build()
    with pytest.raises(TypeError):
        builder.append(1, 1234, b"v")  # type: ignore[arg-type]
    assert builder.append(1, bytearray(b"k"), memoryview(b"v"), [("h", bytearray(b"x"))])
    builder.set_producer_state(9, 1, 100, is_transactional=True)
    header = read_header(builder.build())
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (9, 1, 100)
    assert header.is_transactional and header.compression is Compression.ZSTD
    with pytest.raises(RuntimeError):
        builder.set_producer_state(1, 1, 1)


# ---------------------------------------------------------------------------------------------
# Concatenated batches, partial tails, control batches


def _three_batches() -> bytes:
    return b"".join(encode_batch([(t, None, b"v%d" % t, [])], base_offset=t) for t in range(3))


def test_iter_records_over_concatenated_batches_and_partial_tail() -> None:
    whole = _three_batches()
    assert [r.offset for r in iter_records(whole)] == [0, 1, 2]
    size = len(whole) // 3
    for cut in (1, 11, 12, 30, HEADER_SIZE, size - 1):
        buf = whole[: 2 * size + cut]
        assert [r.offset for r in iter_records(buf, allow_partial_tail=True)] == [0, 1]
        with pytest.raises(CorruptRecordError) as info:
            list(iter_records(buf))
        assert info.value.position == 2 * size


def test_partial_tail_does_not_hide_corruption() -> None:
    buf = bytearray(_three_batches())
    buf[-1] ^= 0xFF  # last batch is whole but its CRC is wrong
    with pytest.raises(CorruptRecordError, match="CRC"):
        list(iter_records(buf, allow_partial_tail=True))


def test_a_batch_length_below_the_minimum_is_corruption_not_a_cut() -> None:
    # The tail's batchLength (10) is below any batch's: more bytes would not make it whole.
    tail = struct.pack(">qi", 3, 10)
    buf = _three_batches() + tail
    with pytest.raises(CorruptRecordError) as info:
        list(iter_records(buf, allow_partial_tail=True))
    assert info.value.position == len(buf) - len(tail)


def test_control_batches_are_skipped_by_default() -> None:
    control = bytearray(encode_batch([(1, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x05", [])]))
    control[22] |= 0x20  # attributes low byte: control bit
    struct.pack_into(">I", control, 17, crc32c.crc32c(bytes(control[21:])))
    buf = encode_batch([(1, None, b"data", [])]) + bytes(control)
    assert [r.value for r in iter_records(buf)] == [b"data"]
    records = list(iter_records(buf, include_control=True))
    assert parse_control_key(records[1].key) == (0, 1)
    assert [b.header.is_control for b in iter_decoded_batches(buf)] == [False, True]


# ---------------------------------------------------------------------------------------------
# Corruption: nothing but CorruptRecordError, ever

_BASE_RECORDS = [
    (1_700_000_000_000 + i, b"key-%d" % i, b"value-%d" % i * (i + 1), [("h", b"x"), ("n", None)])
    for i in range(6)
]
_ENCODED = {c: encode_batch(_BASE_RECORDS, compression=c) for c in Compression}
# Bytes outside the CRC whose change still leaves a valid batch: baseOffset and the epoch.
_UNCHECKED = set(range(0, 8)) | set(range(12, 16))


def _fix_crc(buf: bytearray) -> None:
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))


@FUZZ
@given(
    compression=st.sampled_from(list(Compression)),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 7)), min_size=1, max_size=3),
)
def test_bit_flips_raise_corrupt_record_or_decode(
    compression: Compression, flips: list[tuple[int, int]]
) -> None:
    original = _ENCODED[compression]
    buf = bytearray(original)
    for where, bit in flips:
        buf[where % len(buf)] ^= 1 << bit
    touched = {i for i, (a, b) in enumerate(zip(buf, original)) if a != b}
    try:
        batch = decode_batch(buf)
    except CorruptRecordError:
        return
    assert touched <= _UNCHECKED, "a flip inside the CRC'd region went unnoticed"
    assert [r.value for r in batch.records] == [r[2] for r in _BASE_RECORDS]


@FUZZ
@given(compression=st.sampled_from(list(Compression)), keep=st.integers(0, 10**6))
def test_truncations_raise_corrupt_record(compression: Compression, keep: int) -> None:
    encoded = _ENCODED[compression]
    keep %= len(encoded)
    with pytest.raises(CorruptRecordError):
        decode_batch(encoded[:keep])


@FUZZ
@given(
    compression=st.sampled_from(list(Compression)),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.one_of(st.none(), st.integers(0, 10**6)),
)
def test_crc_valid_garbage_raises_only_corrupt_record(
    compression: Compression, edits: list[tuple[int, int]], cut: int | None
) -> None:
    """Damage behind a recomputed CRC reaches the record parser and the codecs themselves."""
    buf = bytearray(_ENCODED[compression])
    for where, value in edits:
        buf[21 + where % (len(buf) - 21)] = value
    if cut is not None:
        del buf[HEADER_SIZE + cut % (len(buf) - HEADER_SIZE) :]
        struct.pack_into(">i", buf, 8, len(buf) - 12)
    _fix_crc(buf)
    try:
        batch = decode_batch(buf)
    except CorruptRecordError:
        return
    assert len(batch.records) == batch.header.records_count


def test_record_level_errors_name_the_problem() -> None:
    good = bytearray(encode_batch([(1, b"k", b"v" * 10, [])], base_offset=5))
    cases = {
        "recordsCount": (57, b"\x00\x00\x00\x02"),  # says two records, holds one
        "codec id": (22, b"\x07"),  # compression bits 7
        "key length": (65, b"\x05"),  # key length -3
        "longer than 5 bytes": (65, b"\xff" * 6),  # key length varint never ends
    }
    for reason, (offset, patch) in cases.items():
        buf = bytearray(good)
        buf[offset : offset + len(patch)] = patch
        _fix_crc(buf)
        with pytest.raises(CorruptRecordError, match=reason) as info:
            decode_batch(b"\x00" * 7 + bytes(buf), 7)
        assert info.value.position == 7
