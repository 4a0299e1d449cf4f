"""The leader's record validation (`client/records/validator.py`), pure.

Kafka's LogValidator rules on a batch whose header and CRC are already good: baseOffset 0, a
sequence with a producer id, no LogAppendTime from a producer, a known codec that decompresses,
records that parse exactly to the end with `recordsCount` of them and offset deltas 0..n-1,
maxTimestamp the records' largest, and CreateTime timestamps within
message.timestamp.before.max.ms / after.max.ms of the broker's clock (-1 unchecked).

What the tests prove:
- every bad batch of `bad_batches.CASES` raises the exception of its error code, and nothing else;
- batches the producer builds pass, whatever the codec, keys, values, headers and sizes (one-,
  two- and three-byte varints), and so do -1 timestamps; the bounds are inclusive, as in Kafka;
- LogAppendTime topics skip the timestamp checks;
- fuzzed: bytes flipped anywhere in the CRC'd part of a batch, or inside its records before
  compression, with the CRC fixed up, either raise one of the three clear errors or pass, and a
  batch that passes decodes with the consumer's decoder into `recordsCount` records at offsets
  0..n-1 with timestamps in range. No other exception ever escapes.
"""

from __future__ import annotations

import re
import struct

import pytest
from bad_batches import CASES, DAY_MS, HOUR_MS, fix_crc, good_batch, raw_record, with_header
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.broker.config import build_config
from minibroker.client.batch import (
    HEADER_SIZE,
    Compression,
    CorruptRecordError,
    validate_producer_batches,
)
from minibroker.client.common.config import ConfigError
from minibroker.client.compression import compress, decompress, decompress_bounded
from minibroker.client.errors import (
    CorruptMessageError,
    ErrorCode,
    InvalidRecordError,
    InvalidTimestampError,
    MiniBrokerError,
)
from minibroker.client.records import (
    RecordValidation,
    decode_batch,
    encode_batch,
    encode_varint,
    validate_producer_records,
)
from minibroker.client.topic_config import resolve_topic_config, validate_topic_configs

NOW = 1_763_900_000_000  # a fixed "broker clock" for pure tests
DEFAULT = RecordValidation()
MAX_BYTES = 1 << 24
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EXPECTED_ERRORS = (CorruptMessageError, InvalidRecordError, InvalidTimestampError)


def validate(batch: bytes, rules: RecordValidation = DEFAULT, now_ms: int = NOW) -> None:
    """The leader's produce-path checks in order: headers and CRC, then the records."""
    validate_producer_records(batch, validate_producer_batches(batch, MAX_BYTES), now_ms, rules)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_bad_batch_raises_its_error(case: str) -> None:
    build, code = CASES[case]
    with pytest.raises(MiniBrokerError) as caught:
        validate(build(NOW))
    assert caught.value.code == code, caught.value
    assert type(caught.value) in EXPECTED_ERRORS
    assert "batch at position 0" in str(caught.value)


def test_records_are_checked_in_every_batch_of_a_request() -> None:
    good = good_batch(NOW)
    bad = CASES["offset deltas 0, 2, 1"][0](NOW)
    validate(good + good)
    with pytest.raises(InvalidRecordError, match=f"batch at position {len(good)}"):
        validate(good + bad)


@pytest.mark.parametrize("compression", list(Compression))
def test_producer_batches_pass_and_decode(compression: Compression) -> None:
    records = [
        (NOW, None, None, []),
        (NOW + 3, b"", b"", [("h", None), ("", b"")]),
        (NOW - 2, b"k" * 70, b"v" * 9000, [("trace", b"x" * 200)]),  # multi-byte varints
        (NOW + 1, "ключ".encode(), b"\x00" * 64, [("héader", b"\xff")]),
    ] + [(NOW + i % 50, None, b"x" * (i % 130), []) for i in range(9000)]  # 3-byte offsets
    batch = encode_batch(records, compression=compression, producer_id=4, base_sequence=0)
    validate(batch)
    assert len(decode_batch(batch).records) == len(records)


def test_timestamp_bounds_are_inclusive_as_in_kafka() -> None:
    rules = RecordValidation(False, DAY_MS, HOUR_MS)
    validate(good_batch(NOW - DAY_MS), rules)
    validate(good_batch(NOW + HOUR_MS), rules)
    with pytest.raises(InvalidTimestampError, match="out of range"):
        validate(good_batch(NOW - DAY_MS - 1), rules)
    with pytest.raises(InvalidTimestampError, match="out of range"):
        validate(good_batch(NOW + HOUR_MS + 1), rules)
    # Zero bounds: only the broker's own millisecond.
    validate(good_batch(NOW), RecordValidation(False, 0, 0))
    # Kafka 4's defaults: nothing is too old, an hour ahead is the limit.
    validate(good_batch(0))
    validate(good_batch(NOW + HOUR_MS))
    with pytest.raises(InvalidTimestampError):
        validate(good_batch(NOW + HOUR_MS + 1))


def test_every_record_timestamp_is_checked_not_only_the_first() -> None:
    # Base timestamp fine, a later record an hour and a bit ahead: caught from the deltas.
    late = encode_batch([(NOW, None, b"a", []), (NOW + HOUR_MS + 1, None, b"b", [])])
    with pytest.raises(InvalidTimestampError):
        validate(late)
    early = encode_batch([(NOW, None, b"a", []), (NOW - 2 * DAY_MS, None, b"b", [])])
    validate(early)
    with pytest.raises(InvalidTimestampError):
        validate(early, RecordValidation(False, DAY_MS, HOUR_MS))


def test_no_timestamp_is_not_checked_but_other_negatives_are_refused() -> None:
    validate(good_batch(-1))  # a producer that sets no timestamp at all
    validate(encode_batch([(-1, None, b"a", []), (NOW, None, b"b", [])]))
    with pytest.raises(InvalidTimestampError, match="negative"):
        validate(encode_batch([(-1, None, b"a", []), (-2, None, b"b", [])]))
    with pytest.raises(InvalidTimestampError, match="out of range"):
        validate(encode_batch([(-1, None, b"a", []), (NOW + DAY_MS, None, b"b", [])]))


def test_log_append_time_topics_skip_the_timestamp_checks() -> None:
    rules = RecordValidation(True, 0, 0)
    validate(good_batch(NOW + 8 * DAY_MS), rules)
    validate(good_batch(-7), rules)
    validate(with_header(good_batch(NOW), max_timestamp=NOW + 5), rules)
    # The rest is still checked, and a producer may still not claim LogAppendTime itself.
    with pytest.raises(InvalidRecordError):
        validate(CASES["offset deltas 0, 0, 0"][0](NOW), rules)
    with pytest.raises(InvalidTimestampError, match="LogAppendTime"):
        validate(with_header(good_batch(NOW), attributes=0x08), rules)


def test_errors_name_the_problem() -> None:
    def message(case: str) -> str:
        with pytest.raises(MiniBrokerError) as caught:
            validate(CASES[case][0](NOW))
        return str(caught.value)

    assert "recordsCount 10" in message("count 10, 3 records")
    assert "unknown compression codec id 7" in message("codec 7")
    assert "gzip decompression failed" in message("gzip flag on uncompressed records")
    assert "offset delta 2, not 1" in message("offset deltas 0, 2, 1")
    assert "maxTimestamp" in message("maxTimestamp above the records'")
    assert "baseOffset is 5" in message("baseOffset 5")
    assert "sequence number -1" in message("producer id with sequence -1")
    assert "not UTF-8" in message("header key not UTF-8")
    assert "bytes left after the 2 declared records" in message("count 2, 3 records")


def test_a_record_may_claim_more_headers_than_fit_only_as_an_error() -> None:
    huge_count = raw_record(0, headers=encode_varint(2**31 - 1))
    batch = with_header(good_batch(NOW, 1), count=1)
    body = bytearray(batch[:HEADER_SIZE]) + huge_count
    struct.pack_into(">i", body, 8, len(body) - 12)
    with pytest.raises(InvalidRecordError, match="headersCount"):
        validate(fix_crc(body))


# ---------------------------------------------------------------------------------------------
# Bounded decompression: a few compressed bytes must not become gigabytes on the leader.

CODECS = [c for c in Compression if c is not Compression.NONE]


@pytest.mark.parametrize("compression", CODECS)
def test_bounded_decompression_matches_decompress(compression: Compression) -> None:
    # Incompressible and very compressible inputs: the second needs the buffer to grow twice
    # (64 KiB, then 1 MiB, then the 4 MiB limit).
    for data in [bytes(range(256)) * 40, b"", b"\x00" * (3 << 20)]:
        packed = compress(compression, data)
        assert decompress_bounded(compression, packed, 4 << 20) == data
        assert decompress_bounded(compression, packed, len(data)) == data  # exactly at the limit
        assert decompress(compression, packed) == data


@pytest.mark.parametrize("compression", CODECS)
def test_bounded_decompression_refuses_more_than_the_limit(compression: Compression) -> None:
    packed = compress(compression, b"\x00" * (3 << 20))
    with pytest.raises(CorruptRecordError, match="more than"):
        decompress_bounded(compression, packed, (3 << 20) - 1)
    with pytest.raises(CorruptRecordError, match="decompression failed"):
        decompress_bounded(compression, b"not compressed at all" * 10, 1 << 20)


def test_a_batch_that_decompresses_past_the_limit_is_corrupt() -> None:
    big = encode_batch(
        [(NOW, None, b"\x00" * 300_000, []) for _ in range(8)], compression=Compression.ZSTD
    )
    assert len(big) < 2_000  # 2.4 MB of records in a batch of a few hundred bytes
    validate(big, RecordValidation(max_uncompressed_bytes=4 << 20))
    with pytest.raises(CorruptMessageError, match="decompress to more than 1048576 bytes"):
        validate(big, RecordValidation(max_uncompressed_bytes=1 << 20))
    # The default is 64 times max.message.bytes (counted as at least its 1 MiB default).
    assert RecordValidation().max_uncompressed_bytes == 64 * 1048588
    configs = resolve_topic_config({"max.message.bytes": str(4 << 20)})
    assert RecordValidation.from_topic_config(configs).max_uncompressed_bytes == 64 * (4 << 20)


# ---------------------------------------------------------------------------------------------
# Fuzzing: damage with a good CRC gives a clear error, or a batch the consumer decodes.

record_strategy = st.tuples(
    st.integers(-3, 3),  # timestamp offset from NOW, ms
    st.none() | st.binary(max_size=12),
    st.none() | st.binary(max_size=150),
    st.lists(st.tuples(st.text(max_size=4), st.none() | st.binary(max_size=4)), max_size=2),
)


def _check_outcome(batch: bytes) -> None:
    """Either a clear error, or a batch the consumer's decoder reads back whole."""
    try:
        validate(batch)
    except EXPECTED_ERRORS:
        return
    decoded = decode_batch(batch)
    assert [r.offset for r in decoded.records] == list(range(decoded.header.records_count))
    stamps = [r.timestamp for r in decoded.records]
    assert all(t == -1 or NOW - DEFAULT.timestamp_before_max_ms <= t for t in stamps)
    assert all(t <= NOW + DEFAULT.timestamp_after_max_ms for t in stamps)
    assert max(stamps) == decoded.header.max_timestamp


@FUZZ
@given(
    records=st.lists(record_strategy, min_size=1, max_size=12),
    compression=st.sampled_from(list(Compression)),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4),
)
def test_flipped_bytes_anywhere_after_the_crc(
    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    compression: Compression,
    flips: list[tuple[int, int]],
) -> None:
    batch = bytearray(
        encode_batch([(NOW + t, k, v, h) for t, k, v, h in records], compression=compression)
    )
    # The CRC'd region: attributes, offsets, timestamps, producer fields, count, records.
    region = len(batch) - 21
    for where, xor in flips:
        batch[21 + where % region] ^= xor
    _check_outcome(fix_crc(batch))


@FUZZ
@given(
    records=st.lists(record_strategy, min_size=1, max_size=12),
    compression=st.sampled_from(list(Compression)),
    edits=st.lists(
        st.tuples(
            st.sampled_from(["flip", "insert", "delete"]),
            st.integers(0, 10**6),
            st.integers(0, 255),
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_damaged_records_inside_a_well_compressed_batch(
    records: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    compression: Compression,
    edits: list[tuple[str, int, int]],
) -> None:
    """The damage is done before compression, so it reaches the record parser of every codec."""
    good = encode_batch([(NOW + t, k, v, h) for t, k, v, h in records])
    body = bytearray(good[HEADER_SIZE:])
    for kind, where, byte in edits:
        at = where % (len(body) + 1)
        if kind == "insert":
            body.insert(at, byte)
        elif body and kind == "delete":
            del body[at % len(body)]
        elif body:
            body[at % len(body)] ^= byte or 1
    section = bytes(body) if compression is Compression.NONE else compress(compression, bytes(body))
    batch = bytearray(good[:HEADER_SIZE]) + section
    struct.pack_into(">h", batch, 21, int(compression))
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    _check_outcome(fix_crc(batch))


def test_error_codes_are_kafkas() -> None:
    assert InvalidRecordError().code == ErrorCode.INVALID_RECORD == 87
    assert CorruptMessageError().code == ErrorCode.CORRUPT_MESSAGE == 2
    assert InvalidTimestampError().code == ErrorCode.INVALID_TIMESTAMP == 32


# ---------------------------------------------------------------------------------------------
# The configs: Kafka's names, defaults and checks, on topics and as broker defaults.


def test_timestamp_configs_have_kafkas_names_defaults_and_checks() -> None:
    defaults = resolve_topic_config({})
    assert defaults["message.timestamp.before.max.ms"] == 2**63 - 1
    assert defaults["message.timestamp.after.max.ms"] == HOUR_MS
    assert RecordValidation.from_topic_config(defaults) == RecordValidation()
    typed = validate_topic_configs(
        {"message.timestamp.before.max.ms": "0", "message.timestamp.after.max.ms": "1000"}
    )
    assert typed == {"message.timestamp.before.max.ms": 0, "message.timestamp.after.max.ms": 1000}
    # What the controller answers INVALID_CONFIG with, naming the key.
    for name, bad in [
        ("message.timestamp.before.max.ms", "-1"),
        ("message.timestamp.after.max.ms", "-5"),
        ("message.timestamp.after.max.ms", "soon"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(name)):
            validate_topic_configs({name: bad})


def test_broker_defaults_under_kafkas_broker_names() -> None:
    config = build_config(
        {
            "node.id": 1,
            "log.dirs": "/nonexistent",
            "log.message.timestamp.before.max.ms": "86400000",
            "log.message.timestamp.after.max.ms": "60000",
            "log.message.timestamp.type": "LogAppendTime",
        }
    )
    rules = RecordValidation.from_topic_config(resolve_topic_config({}, config.topic_defaults))
    assert rules == RecordValidation(True, DAY_MS, 60_000)
    # A topic's own setting wins over the broker's default.
    topic = resolve_topic_config({"message.timestamp.after.max.ms": "5"}, config.topic_defaults)
    assert RecordValidation.from_topic_config(topic).timestamp_after_max_ms == 5
    with pytest.raises(ConfigError, match=re.escape("message.timestamp.after.max.ms")):
        build_config({"node.id": 1, "log.dirs": "/x", "log.message.timestamp.after.max.ms": "-1"})


# ---------------------------------------------------------------------------------------------
# Compacted topics: every record needs a key (Kafka's LogValidator); other topics take keyless ones.

COMPACTED = RecordValidation(require_keys=True)


def _keyed(keys: list[bytes | None], compression: Compression = Compression.NONE) -> bytes:
    return encode_batch(
        [(NOW + i, key, b"v%d" % i, ()) for i, key in enumerate(keys)], compression=compression
    )


@pytest.mark.parametrize("compression", list(Compression))
@pytest.mark.parametrize(
    "keys",
    [[None], [None, b"k"], [b"k", None, b"j"], [b"k"] * 200 + [None], [None] * 3],
)
def test_a_compacted_topic_refuses_keyless_records(
    compression: Compression, keys: list[bytes | None]
) -> None:
    batch = _keyed(keys, compression)
    with pytest.raises(InvalidRecordError) as caught:
        validate(batch, COMPACTED)
    assert caught.value.code == ErrorCode.INVALID_RECORD
    message = str(caught.value)
    assert f"batch at position 0: record {keys.index(None)} has no key" in message
    assert "compacted topic (cleanup.policy=compact)" in message
    validate(batch)  # a delete topic takes it


@pytest.mark.parametrize("compression", list(Compression))
def test_a_compacted_topic_takes_keyed_records_and_empty_keys(compression: Compression) -> None:
    validate(_keyed([b"a", b"", b"k" * 300, "ключ".encode()] * 50, compression), COMPACTED)


def test_a_keyless_record_in_any_batch_of_the_request_is_found() -> None:
    good, bad = _keyed([b"a"]), _keyed([b"b", None])
    validate(good + good, COMPACTED)
    with pytest.raises(InvalidRecordError, match=f"batch at position {len(good)}: record 1"):
        validate(good + bad, COMPACTED)


def test_require_keys_follows_cleanup_policy() -> None:
    for policy, required in [
        ("delete", False),
        ("compact", True),
        ("compact,delete", True),
        ("delete, compact", True),
    ]:
        typed = resolve_topic_config({"cleanup.policy": policy})
        assert RecordValidation.from_topic_config(typed).require_keys is required, policy
