"""The "consumer" protocol's bytes: a member's Subscription (JoinGroup metadata) and its
Assignment (SyncGroup), each an int16 version then kio's ConsumerProtocolSubscription /
ConsumerProtocolAssignment of that version (Kafka's ConsumerProtocol).

Written at version 0, which every Kafka client reads (later versions add fields that readers of
older ones skip); read at any version, a version newer than kio's schemas read with the newest
schema (Kafka's rule: fields are only ever appended). Pure.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.schema.consumer_protocol_assignment import v1 as assignment_v1
from kio.schema.consumer_protocol_assignment import v2 as assignment_v2
from kio.schema.consumer_protocol_assignment import v3 as assignment_v3
from kio.schema.consumer_protocol_assignment.v0 import data as assignment_v0
from kio.schema.consumer_protocol_subscription import v0 as subscription_v0
from kio.schema.consumer_protocol_subscription import v1 as subscription_v1
from kio.schema.consumer_protocol_subscription import v2 as subscription_v2
from kio.schema.consumer_protocol_subscription import v3 as subscription_v3
from kio.serial import entity_reader, entity_writer

from minibroker.client.types import TopicPartition

PROTOCOL_TYPE = "consumer"
_VERSION = struct.Struct(">h")
_SUBSCRIPTIONS: tuple[Any, ...] = (
    subscription_v0.ConsumerProtocolSubscription,
    subscription_v1.ConsumerProtocolSubscription,
    subscription_v2.ConsumerProtocolSubscription,
    subscription_v3.ConsumerProtocolSubscription,
)
_ASSIGNMENTS: tuple[Any, ...] = (
    assignment_v0.ConsumerProtocolAssignment,
    assignment_v1.ConsumerProtocolAssignment,
    assignment_v2.ConsumerProtocolAssignment,
    assignment_v3.ConsumerProtocolAssignment,
)


class ProtocolError(ValueError):
    """Bytes that do not read as the consumer protocol."""


@dataclass(frozen=True)
class Subscription:
    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[TopicPartition, ...] = ()
    group_instance_id: str | None = None  # from JoinGroup's member list, not the bytes


@cache
def _writer(cls: type) -> Any:
    return entity_writer(cls)


@cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


def _read(classes: Sequence[Any], data: bytes, what: str) -> Any:
    if len(data) < 2:
        raise ProtocolError(f"a {what} of {len(data)} bytes has no version")
    (version,) = _VERSION.unpack_from(data, 0)
    if version < 0:
        raise ProtocolError(f"{what} version {version}")
    cls = classes[min(version, len(classes) - 1)]
    try:
        value, _size = _reader(cls)(data, 2)
    except Exception as err:  # kio's, struct's and IndexError on short data
        raise ProtocolError(f"unreadable {what} v{version}: {err!r}") from None
    return value


def encode_subscription(topics: Iterable[str], user_data: bytes | None = None) -> bytes:
    cls = _SUBSCRIPTIONS[0]
    buffer = io.BytesIO()
    buffer.write(_VERSION.pack(0))
    _writer(cls)(buffer, cls(topics=tuple(sorted(set(topics))), user_data=user_data))
    return buffer.getvalue()


def decode_subscription(data: bytes, group_instance_id: str | None = None) -> Subscription:
    value = _read(_SUBSCRIPTIONS, data, "subscription")
    owned = tuple(
        TopicPartition(t.topic, int(p))
        for t in getattr(value, "owned_partitions", ())
        for p in t.partitions
    )
    return Subscription(tuple(value.topics), value.user_data, owned, group_instance_id)


def encode_assignment(
    partitions: Iterable[TopicPartition], user_data: bytes | None = None
) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    cls = _ASSIGNMENTS[0]
    nested = assignment_v0.TopicPartition
    buffer = io.BytesIO()
    buffer.write(_VERSION.pack(0))
    body = cls(
        assigned_partitions=tuple(
            nested(topic=t, partitions=tuple(ps))  # type: ignore[arg-type]
            for t, ps in by_topic.items()
        ),
        user_data=user_data,
    )
    _writer(cls)(buffer, body)
    return buffer.getvalue()


def decode_assignment(data: bytes) -> list[TopicPartition]:
    """The partitions of an Assignment; empty bytes (a member given nothing by some clients'
    leaders) read as none."""
    if not data:
        return []
    value = _read(_ASSIGNMENTS, data, "assignment")
    return sorted(
        TopicPartition(t.topic, int(p)) for t in value.assigned_partitions for p in t.partitions
    )
