"""Kafka's wire types through `kio`: request and response classes generated from Kafka's own
message schemas (clients/src/main/resources/common/message/*.json), with flexible versions,
tagged fields and the request/response header versions. No message is coded by hand here: this
module only finds a version's classes, reads a request, and builds and writes an answer.

Pure, no I/O. Frames (the 4-byte size prefix) are the listener's (broker/kafka/server.py).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

from kio.index import load_entity_module
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.index import api_key_map
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i32

from minibroker.broker.kafka.bounds import BoundsError, check_request

API_VERSIONS_KEY = 18
_KEY_AND_VERSION = struct.Struct(">hh")


class KafkaProtocolError(Exception):
    """A request that cannot be read (unknown API, unsupported version, malformed bytes): Kafka
    closes the connection (ApiVersions aside, which the listener answers)."""


class UnsupportedVersion(KafkaProtocolError):
    def __init__(self, api_key: int, version: int, correlation_id: int) -> None:
        super().__init__(f"{api_name(api_key)} v{version} is not supported")
        self.api_key = api_key
        self.version = version
        self.correlation_id = correlation_id


def api_name(api_key: int) -> str:
    return api_key_map.get(api_key, f"api key {api_key}")


@cache
def request_class(api_key: int, version: int) -> Any:
    module = load_entity_module(api_key_map[api_key], version, EntityType.request)
    return _payload_class(module, "Request")


@cache
def response_module(api_key: int, version: int) -> ModuleType:
    return load_entity_module(api_key_map[api_key], version, EntityType.response)


@cache
def response_class(api_key: int, version: int) -> Any:
    return _payload_class(response_module(api_key, version), "Response")


def _payload_class(module: ModuleType, suffix: str) -> Any:
    """The module's top-level request or response class (the one `__type__` names)."""
    kind = EntityType.request if suffix == "Request" else EntityType.response
    for value in vars(module).values():
        if isinstance(value, type) and getattr(value, "__type__", None) is kind:
            return value
    raise LookupError(f"no {suffix.lower()} class in {module.__name__}")


@cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


@cache
def _writer(cls: type) -> Any:
    return entity_writer(cls)


@dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # the version's kio request class
    flexible: bool
    client_host: str = ""  # the peer, as Kafka reports a member's host: "/<ip>" ("" unknown)


def peek_header(frame: bytes | memoryview) -> tuple[int, int, int]:
    """(api key, api version, correlation id) from a frame's first 8 bytes: what an answer to
    an unreadable request still needs. KafkaProtocolError when there are not 8 bytes."""
    if len(frame) < 8:
        raise KafkaProtocolError(f"a request of {len(frame)} bytes has no header")
    api_key, version = _KEY_AND_VERSION.unpack_from(frame, 0)
    (correlation_id,) = struct.unpack_from(">i", frame, 4)
    return api_key, version, correlation_id


def parse_request(
    frame: bytes, supported: Mapping[int, tuple[int, int]], client_host: str = ""
) -> Request:
    """Read one request (a frame without its size prefix). `supported`: api key -> (min, max)
    version served. Raises UnsupportedVersion for a known API at a version outside its range
    (and for an API not served), KafkaProtocolError for anything unreadable."""
    api_key, version, correlation_id = peek_header(frame)
    if api_key not in api_key_map:
        raise KafkaProtocolError(f"unknown api key {api_key}")
    served = supported.get(api_key)
    if served is None or not served[0] <= version <= served[1]:
        raise UnsupportedVersion(api_key, version, correlation_id)
    cls = request_class(api_key, version)
    flexible = bool(cls.__flexible__)
    header_cls = RequestHeaderV2 if flexible else RequestHeaderV1
    try:
        check_request(frame, cls, flexible)
    except BoundsError as err:
        raise KafkaProtocolError(
            f"malformed {api_name(api_key)} v{version} request: {err}"
        ) from None
    try:
        header, used = _reader(header_cls)(frame, 0)
        body, _size = _reader(cls)(frame, used)
    except Exception as err:  # kio raises its own errors, struct's and IndexError on short data
        raise KafkaProtocolError(
            f"malformed {api_name(api_key)} v{version} request: {err!r}"
        ) from None
    # Bytes past the request's end are ignored, as Kafka's parser does (librdkafka 2.16's
    # all-topics Metadata v12 request carries 3 of them).
    return Request(api_key, version, correlation_id, header.client_id, body, flexible, client_host)


# A written value at least this long (record batches) is kept as its own piece of a frame,
# never copied: the listener writes the pieces one after another.
_OWN_PIECE = 4096


class _Pieces:
    """A write target for kio's writers: small writes gathered into bytearrays, each long
    immutable value (a Fetch answer's records: bytes, or a read-only view of them) kept as it
    is, as its own piece."""

    __slots__ = ("_small", "pieces")

    def __init__(self) -> None:
        self._small = bytearray()
        self.pieces: list[bytes | bytearray | memoryview] = [self._small]

    def write(self, data: bytes | bytearray | memoryview) -> int:
        size = len(data)
        if size >= _OWN_PIECE and (
            isinstance(data, bytes) or (isinstance(data, memoryview) and data.readonly)
        ):
            self.pieces.append(data)
            self._small = bytearray()
            self.pieces.append(self._small)
        else:
            self._small += data
        return size


def encode_response_pieces(
    api_key: int, version: int, correlation_id: int, body: Any
) -> list[bytes | bytearray | memoryview]:
    """The size-prefixed response frame as pieces to write in order, its record bytes not
    copied (the first piece starts with the size). ApiVersions answers always carry header v0
    (so that a client can read the answer whatever version it asked); other flexible versions
    header v1."""
    out = _Pieces()
    out.write(b"\0\0\0\0")
    if body.__flexible__ and api_key != API_VERSIONS_KEY:
        _writer(ResponseHeaderV1)(out, ResponseHeaderV1(correlation_id=i32(correlation_id)))
    else:
        _writer(ResponseHeaderV0)(out, ResponseHeaderV0(correlation_id=i32(correlation_id)))
    body_type: Any = type(body)
    _writer(body_type)(out, body)
    pieces = [piece for piece in out.pieces if piece]
    first = pieces[0]
    assert isinstance(first, bytearray)
    struct.pack_into(">i", first, 0, sum(len(piece) for piece in pieces) - 4)
    return pieces


def encode_response(api_key: int, version: int, correlation_id: int, body: Any) -> bytes:
    """The size-prefixed response frame in one piece (`encode_response_pieces` joined)."""
    return b"".join(encode_response_pieces(api_key, version, correlation_id, body))


# -- building a version's answer --------------------------------------------------------------


def _convert(kafka_type: str | None, value: Any) -> Any:
    if value is None or isinstance(value, datetime.timedelta | datetime.datetime | uuid.UUID):
        return value
    if kafka_type == "error_code":
        return KioErrorCode(int(value))
    if kafka_type == "timedelta_i32" or kafka_type == "timedelta_i64":
        return datetime.timedelta(milliseconds=int(value))
    if kafka_type == "uuid":
        return value if isinstance(value, uuid.UUID) else topic_uuid(str(value))
    if kafka_type in ("datetime_i64", "nullable_datetime_i64"):
        if int(value) < 0:
            return None
        return datetime.datetime.fromtimestamp(int(value) / 1000, tz=datetime.UTC)
    return value


def topic_uuid(topic_id: str) -> uuid.UUID | None:
    """A topic id as a UUID: ours are a UUID's text or Kafka's base64url of 16 bytes; anything
    else: no id."""
    try:
        return uuid.UUID(topic_id)
    except ValueError:
        pass
    try:
        raw = base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4))
    except (ValueError, binascii.Error):
        return None
    return uuid.UUID(bytes=raw) if len(raw) == 16 else None


@cache
def _fields(cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]


def make(cls: type, **values: Any) -> Any:
    """An instance of a kio class from the values its version has: the others are dropped
    (a field that a version does not carry), each converted to the class's field type (error
    codes, durations in ms, topic ids). So one builder serves every version of an API."""
    fields = _fields(cls)
    kwargs = {}
    for name, value in values.items():
        f = fields.get(name)
        if f is None:
            continue
        kwargs[name] = _convert(f.metadata.get("kafka_type"), value)
    return cls(**kwargs)


def nested(module_or_cls: Any, name: str) -> type | None:
    """A nested class of a version's response by name (None: that version has none)."""
    module = (
        module_or_cls
        if isinstance(module_or_cls, ModuleType)
        else __import__(module_or_cls.__module__, fromlist=["_"])
    )
    value = getattr(module, name, None)
    return value if isinstance(value, type) else None


def has_field(cls: type, name: str) -> bool:
    return name in _fields(cls)
