"""Kafka's group API requests over gRPC `BrokerService.KafkaGroupCall`, written and read by kio.

A call is one Kafka request frame (request header v1, or v2 for flexible versions, then the
body; no size prefix) and the answer is the response frame (header v0/v1, then the body). No
message is coded by hand: kio's classes for the API and version are found by name, filled from
plain values (`build`: fields a version lacks are dropped, nested lists of mappings become the
version's nested classes) and written by kio's writers.

Versions: each API has a list of versions this client can speak, newest first. The broker
refuses a version it does not serve with INVALID_ARGUMENT ("... is not supported"); the caller
then tries the next older one and remembers the one that worked (the gRPC call has no
ApiVersions step).
"""

from __future__ import annotations

import datetime
import io
import types
import typing
from collections.abc import Mapping
from functools import cache
from types import ModuleType
from typing import Any

import grpc
from kio.index import load_entity_module
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.index import api_key_map
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32

from minibroker.client.errors import MiniBrokerError, UnsupportedVersionError
from minibroker.client.wire import CallFailed, error_from_rpc
from minibroker.proto import minibroker_pb2 as pb

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT = 8, 9, 10, 11, 12
LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 13, 14, 15, 16, 42

# The versions this client writes, newest first. FindCoordinator v4 batches keys
# (coordinator_keys / coordinators); OffsetFetch stops at v7 (v8 batches groups); JoinGroup starts
# at v4 (MEMBER_ID_REQUIRED, KIP-394); LeaveGroup at v3 (a members list, KIP-345); OffsetCommit
# at v5 (v2-v4 carry retention_time, which the broker's bounds check does not read yet).
VERSIONS: dict[int, tuple[int, ...]] = {
    FIND_COORDINATOR: (4, 3, 2, 1),
    JOIN_GROUP: (9, 8, 7, 6, 5, 4),
    SYNC_GROUP: (5, 4, 3, 2, 1),
    HEARTBEAT: (4, 3, 2, 1),
    LEAVE_GROUP: (5, 4, 3),
    OFFSET_COMMIT: (8, 7, 6, 5),
    OFFSET_FETCH: (7, 6, 5, 4, 3, 2, 1),
    LIST_GROUPS: (4, 3, 2, 1, 0),
    DESCRIBE_GROUPS: (5, 4, 3, 2, 1, 0),
    DELETE_GROUPS: (2, 1, 0),
}


def api_name(api_key: int) -> str:
    return api_key_map.get(api_key, f"api key {api_key}")


def _payload_class(module: ModuleType, kind: EntityType) -> Any:
    for value in vars(module).values():
        if isinstance(value, type) and getattr(value, "__type__", None) is kind:
            return value
    raise LookupError(f"no {kind.name} class in {module.__name__}")


@cache
def request_class(api_key: int, version: int) -> Any:
    module = load_entity_module(api_key_map[api_key], version, EntityType.request)
    return _payload_class(module, EntityType.request)


@cache
def response_class(api_key: int, version: int) -> Any:
    module = load_entity_module(api_key_map[api_key], version, EntityType.response)
    return _payload_class(module, EntityType.response)


@cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


@cache
def _writer(cls: type) -> Any:
    return entity_writer(cls)


@cache
def _field_types(cls: type) -> dict[str, tuple[str | None, Any]]:
    """name -> (kafka_type, element class of a nested list or None) for a kio class."""
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[str | None, Any]] = {}
    for f in cls.__dataclass_fields__.values():  # type: ignore[attr-defined]
        element = None
        hint = hints.get(f.name)
        candidates = [hint]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            candidates = list(typing.get_args(hint))  # a nullable list: `tuple[X, ...] | None`
        for candidate in candidates:
            if typing.get_origin(candidate) is tuple:
                args = typing.get_args(candidate)
                if args and isinstance(args[0], type) and hasattr(args[0], "__dataclass_fields__"):
                    element = args[0]
        out[f.name] = (f.metadata.get("kafka_type"), element)
    return out


def _convert(kafka_type: str | None, value: Any) -> Any:
    if value is None:
        return None
    if kafka_type == "error_code":
        return KioErrorCode(int(value))
    if kafka_type in ("timedelta_i32", "timedelta_i64") and not isinstance(
        value, datetime.timedelta
    ):
        return datetime.timedelta(milliseconds=int(value))
    return value


def build(cls: type, values: Mapping[str, Any]) -> Any:
    """An instance of kio class `cls` from plain values. Fields the class lacks are dropped (so
    one set of values serves every version); a list of mappings becomes a tuple of the field's
    nested class; durations are ms; error codes ints."""
    fields = _field_types(cls)
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        spec = fields.get(name)
        if spec is None:
            continue
        kafka_type, element = spec
        if value is None:
            kwargs[name] = None
        elif element is not None:
            kwargs[name] = tuple(build(element, v) if isinstance(v, Mapping) else v for v in value)
        elif isinstance(value, list):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = _convert(kafka_type, value)
    return cls(**kwargs)


def encode_request(
    api_key: int, version: int, correlation_id: int, client_id: str | None, body: Any
) -> bytes:
    """A request frame without its size prefix: header v2 for flexible versions, else v1."""
    buffer = io.BytesIO()
    if body.__flexible__:
        header: Any = RequestHeaderV2(
            request_api_key=i16(api_key),
            request_api_version=i16(version),
            correlation_id=i32(correlation_id),
            client_id=client_id,
        )
        _writer(RequestHeaderV2)(buffer, header)
    else:
        header = RequestHeaderV1(
            request_api_key=i16(api_key),
            request_api_version=i16(version),
            correlation_id=i32(correlation_id),
            client_id=client_id,
        )
        _writer(RequestHeaderV1)(buffer, header)
    body_type: Any = type(body)
    _writer(body_type)(buffer, body)
    return buffer.getvalue()


def decode_response(api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
    """(correlation id, kio response) of a response frame without its size prefix."""
    cls = response_class(api_key, version)
    header_cls = ResponseHeaderV1 if cls.__flexible__ else ResponseHeaderV0
    header, used = _reader(header_cls)(frame, 0)
    body, _size = _reader(cls)(frame, used)
    return int(header.correlation_id), body


def code_of(value: Any) -> int:
    """An error code from a kio response field (kio's ErrorCode enum or an int)."""
    raw = getattr(value, "value", value)
    return int(raw)


def ms(value: Any) -> int:
    """A duration field as ms (kio reads timedelta fields as timedelta)."""
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


class GroupCaller:
    """Sends group requests to a broker's gRPC address and reads the answers.

    `stub_for(address)` gives a BrokerService stub (ClusterClient.broker_stub). Raises CallFailed
    (as every other client call) when gRPC fails, UnsupportedVersionError when the broker serves
    none of the versions this client speaks.
    """

    def __init__(self, stub_for: Any, client_id: str | None = "minibroker") -> None:
        self._stub_for = stub_for
        self.client_id = client_id
        self._correlation = 0
        self._chosen: dict[int, int] = {}  # api key -> index into VERSIONS[api]

    def version(self, api_key: int) -> int:
        return VERSIONS[api_key][self._chosen.get(api_key, 0)]

    async def call(
        self, address: str, api_key: int, values: Mapping[str, Any], timeout_s: float
    ) -> Any:
        versions = VERSIONS[api_key]
        while True:
            index = self._chosen.get(api_key, 0)
            version = versions[index]
            body = build(request_class(api_key, version), values)
            self._correlation = (self._correlation + 1) & 0x7FFFFFFF
            correlation = self._correlation
            frame = encode_request(api_key, version, correlation, self.client_id, body)
            stub = self._stub_for(address)
            try:
                answer = await stub.KafkaGroupCall(pb.KafkaFrame(frame=frame), timeout=timeout_s)
            except grpc.aio.AioRpcError as err:
                details = err.details() or ""
                if err.code() == grpc.StatusCode.INVALID_ARGUMENT and "not supported" in details:
                    if index + 1 >= len(versions):
                        raise UnsupportedVersionError(
                            f"{address} serves none of {api_name(api_key)} versions "
                            f"{list(versions)}: {details}"
                        ) from None
                    self._chosen[api_key] = index + 1
                    continue
                unreachable = err.code() == grpc.StatusCode.UNAVAILABLE
                raise CallFailed(error_from_rpc(err, address), unreachable) from err
            try:
                got, response = decode_response(api_key, version, answer.frame)
            except Exception as err:  # kio's own errors, struct's, IndexError on short data
                raise CallFailed(
                    MiniBrokerError(f"unreadable {api_name(api_key)} answer from {address}: {err}"),
                    False,
                ) from None
            if got != correlation:
                raise CallFailed(
                    MiniBrokerError(f"{address} answered correlation id {got}, not {correlation}"),
                    False,
                )
            return response
