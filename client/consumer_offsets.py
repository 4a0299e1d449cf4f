"""Kafka's `__consumer_offsets` record formats: keys and values, byte for byte.

Pure, no I/O. The facts are Kafka's message schemas (group-coordinator/src/main/resources/
common/message/{OffsetCommitKey,OffsetCommitValue,GroupMetadataKey,GroupMetadataValue}.json):
every key and value starts with an int16 version, then the struct of that version.

- Keys: version 0 or 1 is an OffsetCommitKey (group, topic, partition; both versions are the
  same struct, Kafka writes 1), version 2 a GroupMetadataKey (group). Kafka's newer coordinator
  uses versions 3+ for KIP-848's records: not read here (RecordFormatError names the version).
- OffsetCommitValue: v0 offset, metadata, commit timestamp; v1 adds expire timestamp; v2 drops
  it; v3 adds leader epoch; v4 is v3 flexible (compact strings, tagged fields). Written: v3.
- GroupMetadataValue: v0 protocol type, generation, protocol, leader, members (member id,
  client id, client host, session timeout, subscription, assignment); v1 adds each member's
  rebalance timeout (v0's is its session timeout, as Kafka reads it); v2 the current state
  timestamp; v3 each member's group instance id; v4 is v3 flexible. Written: v3.
- Values above version 4 are read as version 4 (KIP-915: later versions only add tagged fields).
- A null value is a tombstone (the caller sees None, never bytes).

Any malformed input raises RecordFormatError (a ValueError) naming what was wrong and where;
nothing else escapes the decoders.

It lives in the client package because `minibroker dump-log --offsets-decoder` reads it (the
client never imports the broker); the broker's group coordinator imports it as
`minibroker.broker.groups.records`.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass

OFFSET_KEY_VERSIONS = (0, 1)
GROUP_KEY_VERSION = 2
OFFSET_KEY_WRITTEN = 1
OFFSET_VALUE_WRITTEN = 3
GROUP_VALUE_WRITTEN = 3
HIGHEST_VALUE_VERSION = 4  # the first (and only) flexible version of both values

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class RecordFormatError(ValueError):
    """Bytes that are not a key or value of `__consumer_offsets` in any known version."""


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetCommitValue:
    offset: int
    metadata: str = ""
    commit_timestamp: int = -1
    leader_epoch: int = -1  # v3+
    expire_timestamp: int = -1  # v1 only


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int  # ms
    session_timeout: int  # ms
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int = -1  # ms, -1: none (v2+)
    members: tuple[MemberMetadata, ...] = ()


Key = OffsetCommitKey | GroupMetadataKey


# -- writing ----------------------------------------------------------------------------------


class _Writer:
    def __init__(self, flexible: bool) -> None:
        self.flexible = flexible
        self.parts: list[bytes] = []

    def i16(self, value: int) -> None:
        self.parts.append(_I16.pack(value))

    def i32(self, value: int) -> None:
        self.parts.append(_I32.pack(value))

    def i64(self, value: int) -> None:
        self.parts.append(_I64.pack(value))

    def uvarint(self, value: int) -> None:
        out = bytearray()
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
        self.parts.append(bytes(out))

    def _length(self, n: int | None, wide: bool) -> None:
        if self.flexible:
            self.uvarint(0 if n is None else n + 1)
        elif wide:
            self.i32(-1 if n is None else n)
        else:
            self.i16(-1 if n is None else n)

    def string(self, value: str | None) -> None:
        if value is None:
            self._length(None, False)
            return
        data = value.encode("utf-8")
        if not self.flexible and len(data) > 0x7FFF:
            raise ValueError(f"a string of {len(data)} bytes does not fit an int16 length")
        self._length(len(data), False)
        self.parts.append(data)

    def bytes_(self, value: bytes) -> None:
        self._length(len(value), True)
        self.parts.append(bytes(value))

    def array_length(self, n: int) -> None:
        self._length(n, True)

    def tags(self) -> None:
        if self.flexible:
            self.uvarint(0)  # no tagged fields

    def done(self) -> bytes:
        return b"".join(self.parts)


def encode_key(key: Key) -> bytes:
    """The record key: OffsetCommitKey as version 1, GroupMetadataKey as version 2."""
    w = _Writer(False)
    if isinstance(key, OffsetCommitKey):
        w.i16(OFFSET_KEY_WRITTEN)
        w.string(key.group)
        w.string(key.topic)
        w.i32(key.partition)
    else:
        w.i16(GROUP_KEY_VERSION)
        w.string(key.group)
    return w.done()


def encode_offset_value(value: OffsetCommitValue, version: int = OFFSET_VALUE_WRITTEN) -> bytes:
    if not 0 <= version <= HIGHEST_VALUE_VERSION:
        raise ValueError(f"OffsetCommitValue has no version {version}")
    w = _Writer(version >= 4)
    w.i16(version)
    w.i64(value.offset)
    if version >= 3:
        w.i32(value.leader_epoch)
    w.string(value.metadata)
    w.i64(value.commit_timestamp)
    if version == 1:
        w.i64(value.expire_timestamp)
    w.tags()
    return w.done()


def encode_group_value(value: GroupMetadataValue, version: int = GROUP_VALUE_WRITTEN) -> bytes:
    if not 0 <= version <= HIGHEST_VALUE_VERSION:
        raise ValueError(f"GroupMetadataValue has no version {version}")
    w = _Writer(version >= 4)
    w.i16(version)
    w.string(value.protocol_type)
    w.i32(value.generation)
    w.string(value.protocol)
    w.string(value.leader)
    if version >= 2:
        w.i64(value.current_state_timestamp)
    w.array_length(len(value.members))
    for m in value.members:
        w.string(m.member_id)
        if version >= 3:
            w.string(m.group_instance_id)
        w.string(m.client_id)
        w.string(m.client_host)
        if version >= 1:
            w.i32(m.rebalance_timeout)
        w.i32(m.session_timeout)
        w.bytes_(m.subscription)
        w.bytes_(m.assignment)
        w.tags()
    w.tags()
    return w.done()


# -- reading ----------------------------------------------------------------------------------


class _Reader:
    def __init__(self, data: bytes | bytearray | memoryview, what: str) -> None:
        self.data = bytes(data)
        self.pos = 0
        self.what = what
        self.flexible = False

    def fail(self, reason: str) -> RecordFormatError:
        return RecordFormatError(f"{self.what}: {reason} at byte {self.pos}")

    def take(self, n: int, field: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise self.fail(f"{field} needs {n} bytes, {len(self.data) - self.pos} are left")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def i16(self, field: str) -> int:
        return int(_I16.unpack(self.take(2, field))[0])

    def i32(self, field: str) -> int:
        return int(_I32.unpack(self.take(4, field))[0])

    def i64(self, field: str) -> int:
        return int(_I64.unpack(self.take(8, field))[0])

    def uvarint(self, field: str) -> int:
        value = 0
        for shift in range(0, 35, 7):
            (byte,) = self.take(1, field)
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
        raise self.fail(f"{field}: a varint longer than 5 bytes")

    def _length(self, field: str, wide: bool, nullable: bool) -> int | None:
        if self.flexible:
            n = self.uvarint(field) - 1
        elif wide:
            n = self.i32(field)
        else:
            n = self.i16(field)
        if n == -1 and nullable:
            return None
        if n < 0:
            raise self.fail(f"{field}: length {n}")
        return n

    def string(self, field: str) -> str:
        value = self.nullable_string(field, nullable=False)
        assert value is not None
        return value

    def nullable_string(self, field: str, nullable: bool = True) -> str | None:
        n = self._length(field, False, nullable)
        if n is None:
            return None
        raw = self.take(n, field)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise self.fail(f"{field} is not UTF-8 ({err.reason})") from None

    def bytes_(self, field: str) -> bytes:
        n = self._length(field, True, False)
        assert n is not None
        return self.take(n, field)

    def array_length(self, field: str) -> int:
        n = self._length(field, True, False)
        assert n is not None
        if n > len(self.data) - self.pos:  # each element is at least one byte
            raise self.fail(f"{field}: {n} elements cannot fit in what is left")
        return n

    def tags(self) -> None:
        if not self.flexible:
            return
        count = self.uvarint("tagged fields")
        last = -1
        for _ in range(count):
            tag = self.uvarint("tag")
            if tag <= last:
                raise self.fail(f"tag {tag} after tag {last}")
            last = tag
            self.take(self.uvarint("tagged field size"), f"tagged field {tag}")

    def end(self) -> None:
        if self.pos != len(self.data):
            raise self.fail(f"{len(self.data) - self.pos} bytes past the end of the record")


def key_version(data: bytes | bytearray | memoryview) -> int:
    """The version prefix of a key (RecordFormatError when it has none)."""
    return _Reader(data, "key").i16("version")


def decode_key(data: bytes | bytearray | memoryview | None) -> Key:
    """An OffsetCommitKey (versions 0, 1) or GroupMetadataKey (version 2)."""
    if data is None:
        raise RecordFormatError("key: a __consumer_offsets record needs a key")
    r = _Reader(data, "key")
    version = r.i16("version")
    key: Key
    if version in OFFSET_KEY_VERSIONS:
        r.what = f"OffsetCommitKey v{version}"
        key = OffsetCommitKey(r.string("group"), r.string("topic"), r.i32("partition"))
    elif version == GROUP_KEY_VERSION:
        r.what = f"GroupMetadataKey v{version}"
        key = GroupMetadataKey(r.string("group"))
    else:
        raise RecordFormatError(
            f"key: version {version} is neither an offset commit (0, 1) nor group metadata (2)"
        )
    r.end()
    return key


def _value_reader(data: bytes | bytearray | memoryview, name: str) -> tuple[_Reader, int]:
    r = _Reader(data, name)
    version = r.i16("version")
    if version < 0:
        raise r.fail(f"version {version}")
    version = min(version, HIGHEST_VALUE_VERSION)
    r.what = f"{name} v{version}"
    r.flexible = version >= 4
    return r, version


def decode_offset_value(data: bytes | bytearray | memoryview) -> OffsetCommitValue:
    r, version = _value_reader(data, "OffsetCommitValue")
    offset = r.i64("offset")
    leader_epoch = r.i32("leader_epoch") if version >= 3 else -1
    metadata = r.string("metadata")
    commit_timestamp = r.i64("commit_timestamp")
    expire_timestamp = r.i64("expire_timestamp") if version == 1 else -1
    r.tags()
    r.end()
    return OffsetCommitValue(offset, metadata, commit_timestamp, leader_epoch, expire_timestamp)


def decode_group_value(data: bytes | bytearray | memoryview) -> GroupMetadataValue:
    r, version = _value_reader(data, "GroupMetadataValue")
    protocol_type = r.string("protocol_type")
    generation = r.i32("generation")
    protocol = r.nullable_string("protocol")
    leader = r.nullable_string("leader")
    current_state_timestamp = r.i64("current_state_timestamp") if version >= 2 else -1
    members = []
    for _ in range(r.array_length("members")):
        member_id = r.string("member_id")
        instance_id = r.nullable_string("group_instance_id") if version >= 3 else None
        client_id = r.string("client_id")
        client_host = r.string("client_host")
        rebalance_timeout = r.i32("rebalance_timeout") if version >= 1 else None
        session_timeout = r.i32("session_timeout")
        subscription = r.bytes_("subscription")
        assignment = r.bytes_("assignment")
        r.tags()
        members.append(
            MemberMetadata(
                member_id,
                instance_id,
                client_id,
                client_host,
                # v0 has none: Kafka takes the session timeout.
                session_timeout if rebalance_timeout is None else rebalance_timeout,
                session_timeout,
                subscription,
                assignment,
            )
        )
    r.tags()
    r.end()
    return GroupMetadataValue(
        protocol_type, generation, protocol, leader, current_state_timestamp, tuple(members)
    )


def decode_value(key: Key, data: bytes | bytearray | memoryview | None) -> object:
    """The value that goes with `key` (None: a tombstone)."""
    if data is None:
        return None
    if isinstance(key, OffsetCommitKey):
        return decode_offset_value(data)
    return decode_group_value(data)


def describe(key_bytes: bytes | None, value_bytes: bytes | None) -> tuple[str, str]:
    """A record's key and value as JSON text, the way kafka-dump-log's --offsets-decoder prints
    them (`{"type":"1","data":{...}}` for a key, `{"version":"3","data":{...}}` for a value,
    Kafka's field names; a tombstone's value is `null`); a part that cannot be read says why."""
    try:
        key = decode_key(key_bytes)
        version = key_version(key_bytes or b"")
    except RecordFormatError as err:
        return f"<unreadable key: {err}>", "<not decoded>"
    key_data: dict[str, object]
    if isinstance(key, OffsetCommitKey):
        key_data = {"group": key.group, "topic": key.topic, "partition": key.partition}
    else:
        key_data = {"group": key.group}
    key_text = json.dumps({"type": str(version), "data": key_data}, separators=(",", ":"))
    try:
        value = decode_value(key, value_bytes)
    except RecordFormatError as err:
        return key_text, f"<unreadable value: {err}>"
    if value is None:
        return key_text, "null"
    value_version = _I16.unpack_from(bytes(value_bytes or b""), 0)[0]
    data: dict[str, object]
    if isinstance(value, OffsetCommitValue):
        data = {"offset": value.offset}
        if value_version >= 3:
            data["leaderEpoch"] = value.leader_epoch
        data["metadata"] = value.metadata
        data["commitTimestamp"] = value.commit_timestamp
        if value_version == 1:
            data["expireTimestamp"] = value.expire_timestamp
    else:
        assert isinstance(value, GroupMetadataValue)
        data = {
            "protocolType": value.protocol_type,
            "generation": value.generation,
            "protocol": value.protocol,
            "leader": value.leader,
            "currentStateTimestamp": value.current_state_timestamp,
            "members": [
                {
                    "memberId": m.member_id,
                    "groupInstanceId": m.group_instance_id,
                    "clientId": m.client_id,
                    "clientHost": m.client_host,
                    "rebalanceTimeout": m.rebalance_timeout,
                    "sessionTimeout": m.session_timeout,
                    "subscription": base64.b64encode(m.subscription).decode(),
                    "assignment": base64.b64encode(m.assignment).decode(),
                }
                for m in value.members
            ],
        }
    value_text = json.dumps({"version": str(value_version), "data": data}, separators=(",", ":"))
    return key_text, value_text
