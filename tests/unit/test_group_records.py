"""`__consumer_offsets` keys and values (client/consumer_offsets.py): Kafka's layouts byte for
byte (hand-assembled from the message schemas), round trips of every version, and corrupted
bytes of any shape raise RecordFormatError and nothing else."""

from __future__ import annotations

import io
import json
import pathlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.groups.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordFormatError,
    decode_group_value,
    decode_key,
    decode_offset_value,
    describe,
    encode_group_value,
    encode_key,
    encode_offset_value,
)
from minibroker.client.records import encode_batch


def s16(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def test_offset_key_layout_is_kafkas_version_1() -> None:
    key = OffsetCommitKey("grp", "events", 7)
    expected = struct.pack(">h", 1) + s16("grp") + s16("events") + struct.pack(">i", 7)
    assert encode_key(key) == expected
    assert decode_key(expected) == key
    # Version 0 is the same struct.
    assert decode_key(struct.pack(">h", 0) + expected[2:]) == key


def test_group_key_layout_is_version_2() -> None:
    expected = struct.pack(">h", 2) + s16("grp")
    assert encode_key(GroupMetadataKey("grp")) == expected
    assert decode_key(expected) == GroupMetadataKey("grp")


def test_offset_value_v3_layout() -> None:
    value = OffsetCommitValue(offset=42, metadata="m", commit_timestamp=1000, leader_epoch=5)
    expected = struct.pack(">hqi", 3, 42, 5) + s16("m") + struct.pack(">q", 1000)
    assert encode_offset_value(value) == expected
    assert decode_offset_value(expected) == value


def test_offset_value_v1_has_expire_timestamp_v0_has_neither() -> None:
    v1 = struct.pack(">hq", 1, 9) + s16("") + struct.pack(">qq", 10, 20)
    assert decode_offset_value(v1) == OffsetCommitValue(9, "", 10, -1, 20)
    v0 = struct.pack(">hq", 0, 9) + s16("x") + struct.pack(">q", 10)
    assert decode_offset_value(v0) == OffsetCommitValue(9, "x", 10, -1, -1)


def test_offset_value_v4_is_flexible_and_later_versions_read_as_v4() -> None:
    # compact string: uvarint(len + 1); one empty tagged-field section at the end
    v4 = struct.pack(">hqi", 4, 9, 2) + bytes([2]) + b"m" + struct.pack(">q", 10) + b"\x00"
    assert decode_offset_value(v4) == OffsetCommitValue(9, "m", 10, 2)
    # An unknown tagged field (tag 3, 2 bytes) is skipped.
    tagged = v4[:-1] + bytes([1, 3, 2]) + b"ab"
    assert decode_offset_value(tagged) == OffsetCommitValue(9, "m", 10, 2)
    assert decode_offset_value(struct.pack(">h", 9) + v4[2:]) == OffsetCommitValue(9, "m", 10, 2)


def test_group_value_v3_layout() -> None:
    member = MemberMetadata("m-1", "inst", "cli", "/1.2.3.4", 30000, 6000, b"\x01", b"\x02\x03")
    value = GroupMetadataValue("consumer", 4, "range", "m-1", 777, (member,))
    expected = (
        struct.pack(">h", 3)
        + s16("consumer")
        + struct.pack(">i", 4)
        + s16("range")
        + s16("m-1")
        + struct.pack(">q", 777)
        + struct.pack(">i", 1)
        + s16("m-1")
        + s16("inst")
        + s16("cli")
        + s16("/1.2.3.4")
        + struct.pack(">ii", 30000, 6000)
        + struct.pack(">i", 1)
        + b"\x01"
        + struct.pack(">i", 2)
        + b"\x02\x03"
    )
    assert encode_group_value(value) == expected
    assert decode_group_value(expected) == value


def test_group_value_v0_member_rebalance_timeout_is_its_session_timeout() -> None:
    data = (
        struct.pack(">h", 0)
        + s16("consumer")
        + struct.pack(">i", 1)
        + struct.pack(">h", -1)  # protocol null
        + struct.pack(">h", -1)  # leader null
        + struct.pack(">i", 1)
        + s16("m")
        + s16("c")
        + s16("h")
        + struct.pack(">i", 6000)
        + struct.pack(">i", 0)
        + struct.pack(">i", 0)
    )
    value = decode_group_value(data)
    assert value.protocol is None and value.leader is None
    assert value.current_state_timestamp == -1
    assert value.members == (MemberMetadata("m", None, "c", "h", 6000, 6000, b"", b""),)


texts = st.text(max_size=20)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
members = st.builds(
    MemberMetadata,
    texts,
    st.none() | texts,
    texts,
    texts,
    i32,
    i32,
    st.binary(max_size=30),
    st.binary(max_size=30),
)
group_values = st.builds(
    GroupMetadataValue,
    texts,
    i32,
    st.none() | texts,
    st.none() | texts,
    i64,
    st.lists(members, max_size=3).map(tuple),
)
offset_values = st.builds(OffsetCommitValue, i64, texts, i64, i32, st.just(-1))


@given(group_values, st.sampled_from([3, 4]))
def test_group_value_round_trip(value: GroupMetadataValue, version: int) -> None:
    assert decode_group_value(encode_group_value(value, version)) == value


@given(offset_values, st.sampled_from([3, 4]))
def test_offset_value_round_trip(value: OffsetCommitValue, version: int) -> None:
    assert decode_offset_value(encode_offset_value(value, version)) == value


@given(texts, texts, i32)
def test_key_round_trip(group: str, topic: str, partition: int) -> None:
    for key in (OffsetCommitKey(group, topic, partition), GroupMetadataKey(group)):
        assert decode_key(encode_key(key)) == key


def _decoders() -> list[object]:
    return [decode_key, decode_offset_value, decode_group_value]


@settings(max_examples=300)
@given(
    st.sampled_from(["key", "offset", "group"]),
    group_values,
    offset_values,
    st.data(),
)
def test_corrupted_bytes_raise_record_format_error_only(
    kind: str, group: GroupMetadataValue, offset: OffsetCommitValue, data: st.DataObject
) -> None:
    version = data.draw(st.sampled_from([3, 4]))
    if kind == "key":
        raw, decode = encode_key(OffsetCommitKey("g", "t", 1)), decode_key
    elif kind == "offset":
        raw, decode = encode_offset_value(offset, version), decode_offset_value
    else:
        raw, decode = encode_group_value(group, version), decode_group_value
    mutation = data.draw(st.sampled_from(["truncate", "flip", "append", "random"]))
    buf = bytearray(raw)
    if mutation == "truncate":
        buf = buf[: data.draw(st.integers(0, len(buf) - 1))]
    elif mutation == "flip":
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] ^= data.draw(st.integers(1, 255))
    elif mutation == "append":
        buf += data.draw(st.binary(min_size=1, max_size=8))
    else:
        buf = bytearray(data.draw(st.binary(max_size=64)))
    try:
        decode(bytes(buf))  # type: ignore[operator]
    except RecordFormatError as err:
        assert str(err)
    # (a flip may leave valid bytes: then any value is fine, but never another exception)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "version"),
        (struct.pack(">h", 5) + s16("g"), "version 5"),
        (struct.pack(">h", 2) + struct.pack(">h", 10) + b"ab", "group needs 10 bytes"),
        (struct.pack(">h", 2) + s16("g") + b"x", "past the end"),
        (struct.pack(">h", 2) + struct.pack(">h", 2) + b"\xff\xfe", "not UTF-8"),
        (struct.pack(">h", 2) + struct.pack(">h", -1), "length -1"),
    ],
)
def test_bad_keys_name_the_problem(data: bytes, words: str) -> None:
    with pytest.raises(RecordFormatError, match=words):
        decode_key(data)


def test_huge_member_count_is_refused_without_allocating() -> None:
    data = (
        struct.pack(">h", 3)
        + s16("c")
        + struct.pack(">i", 1)
        + s16("r")
        + s16("l")
        + struct.pack(">q", 0)
        + struct.pack(">i", 2**31 - 1)
    )
    with pytest.raises(RecordFormatError, match="members"):
        decode_group_value(data)


def test_describe_prints_kafkas_json() -> None:
    key = encode_key(OffsetCommitKey("g", "t", 0))
    value = encode_offset_value(OffsetCommitValue(5, "", 9, 1))
    assert describe(key, value) == (
        '{"type":"1","data":{"group":"g","topic":"t","partition":0}}',
        '{"version":"3","data":{"offset":5,"leaderEpoch":1,"metadata":"","commitTimestamp":9}}',
    )
    assert describe(key, None)[1] == "null"
    assert describe(b"\x00", None)[0].startswith("<unreadable key")


def test_dump_log_offsets_decoder(tmp_path: pathlib.Path) -> None:
    from minibroker.client.cli.dump_log import dump_segment

    records = [
        (
            5,
            encode_key(OffsetCommitKey("g", "t", 0)),
            encode_offset_value(OffsetCommitValue(9, "", 5)),
        ),
        (5, encode_key(GroupMetadataKey("g")), None),
    ]
    segment = tmp_path / "00000000000000000000.log"
    segment.write_bytes(encode_batch([(ts, k, v, ()) for ts, k, v in records]))
    out = io.StringIO()
    dump_segment(segment, out, print_data_log=True, offsets_decoder=True)
    lines = out.getvalue().splitlines()
    assert lines[2].endswith(
        ' key: {"type":"1","data":{"group":"g","topic":"t","partition":0}} payload: '
        '{"version":"3","data":{"offset":9,"leaderEpoch":-1,"metadata":"","commitTimestamp":5}}'
    )
    assert lines[3].endswith(' key: {"type":"2","data":{"group":"g"}} payload: null')
    out = io.StringIO()
    dump_segment(segment, out, print_data_log=True, as_json=True, offsets_decoder=True)
    row = json.loads(out.getvalue())["records"][0]
    assert json.loads(row["decoded_value"])["data"]["offset"] == 9


@given(offset_values, i64, st.integers(0, 4))
def test_offset_value_every_version_keeps_its_fields(
    value: OffsetCommitValue, expire: int, version: int
) -> None:
    value = OffsetCommitValue(
        value.offset, value.metadata, value.commit_timestamp, value.leader_epoch, expire
    )
    expected = OffsetCommitValue(
        value.offset,
        value.metadata,
        value.commit_timestamp,
        value.leader_epoch if version >= 3 else -1,
        expire if version == 1 else -1,
    )
    assert decode_offset_value(encode_offset_value(value, version)) == expected


@given(group_values, st.integers(0, 4))
def test_group_value_every_version_keeps_its_fields(
    value: GroupMetadataValue, version: int
) -> None:
    members = tuple(
        MemberMetadata(
            m.member_id,
            m.group_instance_id if version >= 3 else None,
            m.client_id,
            m.client_host,
            m.rebalance_timeout if version >= 1 else m.session_timeout,
            m.session_timeout,
            m.subscription,
            m.assignment,
        )
        for m in value.members
    )
    expected = GroupMetadataValue(
        value.protocol_type,
        value.generation,
        value.protocol,
        value.leader,
        value.current_state_timestamp if version >= 2 else -1,
        members,
    )
    assert decode_group_value(encode_group_value(value, version)) == expected
