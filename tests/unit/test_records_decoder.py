"""The compiled records decoder (`_decoder.c`) against the pure one it replaces (decode.py).

Differential: on valid batches (hypothesis records with nulls, headers, negative timestamp
deltas, every codec, LogAppendTime, extreme base offsets and timestamps) both build the same
records, and `parse_columns` the same columns; on damaged records sections (bytes flipped,
inserted, deleted, a wrong recordsCount) both raise CorruptRecordError with the same reason, or
both return the same records. Batches kafka-python writes decode to what kafka-python reads.
MINIBROKER_PURE_CODEC=1 really selects the pure decoder.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from minibroker.client.batch import (
    HEADER_SIZE,
    BatchHeader,
    Compression,
    CorruptRecordError,
    read_header,
)
from minibroker.client.compression import decompress
from minibroker.client.records import LOG_APPEND_TIME, DecodedRecord, encode_batch
from minibroker.client.records import decode as decode_module
from minibroker.client.records.decode import (
    RecordColumns,
    parse_columns,
    parse_records,
    parse_records_pure,
)
from minibroker.client.records.varint import encode_varint, encode_varlong
from minibroker.client.types import Record

pytestmark = pytest.mark.skipif(
    not decode_module.COMPILED, reason="the C decoder is not built (or MINIBROKER_PURE_CODEC=1)"
)

DIFF = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Headers = list[tuple[str, bytes | None]]
RecordIn = tuple[int, bytes | None, bytes | None, Headers]

record_st = st.tuples(
    st.integers(0, 2**45),
    st.one_of(st.none(), st.binary(max_size=40)),
    st.one_of(st.none(), st.binary(max_size=300)),
    st.lists(
        st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=10))), max_size=3
    ),
)


def _section(batch: bytes) -> tuple[bytes, BatchHeader]:
    """The decompressed records section of `batch` and its header."""
    header = read_header(batch)
    data = bytes(batch[HEADER_SIZE : header.size])
    if header.compression is not Compression.NONE:
        data = decompress(header.compression, data)
    return data, header


def _outcome(parse, data: bytes, header: BatchHeader, *args):  # type: ignore[no-untyped-def]
    """What a parser makes of `data`: ("ok", records) or ("error", type, reason, position)."""
    try:
        return ("ok", parse(data, header, 11, *args))
    except CorruptRecordError as err:
        return ("error", type(err), err.reason, err.position)


def _same(data: bytes, header: BatchHeader) -> None:
    pure = _outcome(parse_records_pure, data, header, DecodedRecord)
    assert _outcome(parse_records, data, header, DecodedRecord) == pure
    columns = _outcome(parse_columns, data, header, True)
    if pure[0] == "ok":
        records = pure[1]
        assert columns == (
            "ok",
            RecordColumns(
                [r.offset for r in records],
                [r.timestamp for r in records],
                [r.key for r in records],
                [r.value for r in records],
                [r.headers for r in records],
            ),
        )
    else:
        assert columns == pure


@DIFF
@given(
    records=st.lists(record_st, min_size=1, max_size=20),
    compression=st.sampled_from(list(Compression)),
    base_offset=st.sampled_from([0, 12345, 2**62, 2**63 - 5]),
    log_append_time=st.booleans(),
)
def test_valid_batches_decode_alike(
    records: list[RecordIn], compression: Compression, base_offset: int, log_append_time: bool
) -> None:
    batch = encode_batch(
        records,
        compression=compression,
        base_offset=base_offset,
        timestamp_type=LOG_APPEND_TIME if log_append_time else 0,
    )
    data, header = _section(batch)
    _same(data, header)
    decoded = parse_records(data, header, 0, DecodedRecord)
    assert [(r.key, r.value, r.headers) for r in decoded] == [
        (k, v, tuple(h)) for _, k, v, h in records
    ]
    assert [r.offset for r in decoded] == [base_offset + i for i in range(len(records))]


@DIFF
@given(
    records=st.lists(record_st, min_size=1, max_size=8),
    edits=st.lists(
        st.tuples(
            st.sampled_from(["flip", "set", "insert", "delete"]),
            st.integers(0, 10**6),
            st.integers(0, 255),
        ),
        min_size=1,
        max_size=4,
    ),
    count_delta=st.sampled_from([0, 0, 0, -1, 1, 2, -(2**31)]),
)
def test_damaged_sections_fail_alike(
    records: list[RecordIn], edits: list[tuple[str, int, int]], count_delta: int
) -> None:
    data, header = _section(encode_batch(records))
    buf = bytearray(data)
    for kind, where, value in edits:
        at = where % (len(buf) + 1)
        if kind == "insert":
            buf[at:at] = bytes([value])
        elif at == len(buf):
            continue
        elif kind == "delete":
            del buf[at]
        elif kind == "flip":
            buf[at] ^= 1 << (value % 8)
        else:
            buf[at] = value
    count = max(-(2**31), header.records_count + count_delta)
    _same(bytes(buf), header._replace(records_count=count))


def _record(body: bytes) -> bytes:
    return encode_varint(len(body)) + body


def _header(count: int, base_offset: int = 0, base_timestamp: int = 0) -> BatchHeader:
    return BatchHeader(base_offset, 0, 0, 2, 0, 0, 0, base_timestamp, 0, -1, -1, -1, count)


# Records hand-built to reach each rule of the parser (attributes byte 0 first in each body).
NULL_KEY_VALUE = b"\x00\x00\x00\x01\x01\x00"
EDGE_CASES = {
    "valid": _record(NULL_KEY_VALUE),
    "header count in two bytes": _record(b"\x00\x00\x00\x01\x01\x80\x00"),
    "header count in two bytes past the record": _record(b"\x00\x00\x00\x01\x01")[:-1]
    + b"\x80\x00",
    "varint too long": _record(b"\x00\x00\x00" + b"\xff" * 6 + b"\x01\x00"),
    "varlong too long": _record(b"\x00" + b"\xff" * 11 + b"\x00\x01\x01\x00"),
    "length varint too long": b"\xff" * 6 + NULL_KEY_VALUE,
    # One byte over the limit, ending there: refused, not read as a longer varint.
    "key length in six bytes": _record(b"\x00\x00\x00" + b"\x80" * 5 + b"\x00\x01\x00"),
    "timestamp delta in eleven bytes": _record(b"\x00" + b"\x80" * 10 + b"\x00\x00\x01\x01\x00"),
    "length 5": _record(b"\x00\x00\x00\x01\x01"),
    "one byte": b"\x0c",
    "key -3": _record(b"\x00\x00\x00\x05\x01\x00"),
    "value -2": _record(b"\x00\x00\x00\x01\x03\x00"),
    "key overruns": _record(b"\x00\x00\x00\x0aab\x01\x00"),
    "value overruns": _record(b"\x00\x00\x00\x01\x06ab\x00"),
    "negative header count": _record(b"\x00\x00\x00\x01\x01\x01"),
    "null header key": _record(b"\x00\x00\x00\x01\x01\x02\x01\x01"),
    "header key not utf-8": _record(b"\x00\x00\x00\x01\x01\x02\x02\xff\x01"),
    "header key surrogate": _record(b"\x00\x00\x00\x01\x01\x02\x06\xed\xa0\x80\x01"),
    "header value -5": _record(b"\x00\x00\x00\x01\x01\x02\x02a\x09"),
    "header value overruns": _record(b"\x00\x00\x00\x01\x01\x02\x02a\x08ab"),
    "header key overruns": _record(b"\x00\x00\x00\x01\x01\x02\x08a\x01"),
    "fields short of the length": _record(NULL_KEY_VALUE + b"\x00"),
    "trailing bytes": _record(NULL_KEY_VALUE) + b"\x00",
    "length past the end": b"\x0c\x00\x00\x00\x01",
    "value length is the last byte": _record(b"\x00\x00\x00\x02a\x01"),
    "headers count missing": _record(b"\x00\x00\x00\x01\x04a")[:-1] + b"\x01",
    "big timestamp delta": _record(b"\x00" + encode_varlong(-(2**63)) + b"\x00\x01\x01\x00"),
    "big offset delta": _record(b"\x00\x00" + encode_varint(2**31 - 1) + b"\x01\x01\x00"),
    "non-canonical null key": _record(b"\x00\x00\x00\x81\x00\x01\x00"),
}


@pytest.mark.parametrize("data", EDGE_CASES.values(), ids=EDGE_CASES.keys())
@pytest.mark.parametrize("count", [0, 1, 2])
@pytest.mark.parametrize(
    "bases", [(0, 0), (2**63 - 1, 2**63 - 1), (-(2**63), -(2**63))], ids=["zero", "max", "min"]
)
# Padding after the record: a field that overruns its record is then not also past the end.
@pytest.mark.parametrize("padding", [b"", b"\x00" * 9, NULL_KEY_VALUE * 2])
def test_edge_cases_decode_alike(
    data: bytes, count: int, bases: tuple[int, int], padding: bytes
) -> None:
    data += padding
    _same(data, _header(count, *bases)._replace(attributes=0x08, max_timestamp=77))


def test_a_record_length_as_the_last_byte_is_truncation() -> None:
    """The pure loop reads the byte after a record's first length byte before decoding it, so a
    lone length byte at the end is "truncated", not a length that overruns the section."""
    twenty_byte_value = _record(b"\x00\x00\x00\x01\x28" + b"v" * 20 + b"\x00")
    data = twenty_byte_value * 2 + b"\x0c"  # long enough for recordsCount 3
    _same(data, _header(3))
    with pytest.raises(CorruptRecordError) as info:
        parse_records(data, _header(3), 0, DecodedRecord)
    assert info.value.reason == "record 2 is truncated"


def test_a_callable_make_and_a_record_prefix_and_suffix() -> None:
    records = [(5, b"k", b"v", [("h", b"x")]), (3, None, None, [])]
    data, header = _section(encode_batch(records, base_offset=9))
    calls: list[tuple[object, ...]] = []

    def make(*fields: object) -> int:
        calls.append(fields)
        return len(calls)

    assert parse_records(data, header, 0, make) == [1, 2]
    assert calls == [(9, 5, b"k", b"v", (("h", b"x"),)), (10, 3, None, None, ())]
    built = parse_records(data, header, 0, Record, ("t", 3), (0, 7))
    assert built == [
        Record("t", 3, 9, 5, b"k", b"v", (("h", b"x"),), 0, 7),
        Record("t", 3, 10, 3, None, None, (), 0, 7),
    ]
    assert all(type(r) is Record for r in built)
    with pytest.raises(TypeError):
        parse_records(data, header, 0, make, ("t",), ())


KAFKA = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@KAFKA
@given(records=st.lists(record_st, min_size=1, max_size=12))
def test_kafka_python_batches_decode_as_kafka_python_reads_them(records: list[RecordIn]) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for offset, (timestamp, key, value, headers) in enumerate(records):
        assert builder.append(offset, timestamp, key, value, headers) is not None
    theirs = bytes(builder.build())
    expected = [
        DecodedRecord(r.offset, r.timestamp, r.key, r.value, tuple(r.headers))
        for r in DefaultRecordBatch(theirs)
    ]
    data, header = _section(theirs)
    assert parse_records(data, header, 0, DecodedRecord) == expected


def test_pure_codec_variable_selects_the_pure_decoder() -> None:
    code = "from minibroker.client.records import decode; print(decode.COMPILED)"
    for env, expected in (({"MINIBROKER_PURE_CODEC": "1"}, "False"), ({}, "True")):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={"PATH": "/usr/bin:/bin", **env},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == expected
