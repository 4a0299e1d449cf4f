"""What send() checks before a record is buffered (Kafka's ProducerRecord and config checks).

Pure: no I/O, no clock. Keys, values and header values are bytes, str (UTF-8) or None; header
names str; a timestamp an int of milliseconds in [0, int64 max] (Kafka's ProducerRecord words).
The producer's `_append` applies them to each record before it is appended to its batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import index

from minibroker.client.common.config import ConfigError
from minibroker.client.metadata_cache import TopicInfo

DEFAULT_MAX_MESSAGE_BYTES = 1048588  # the broker's and topics' max.message.bytes default
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

Headers = Sequence[tuple[str, bytes | None]]
HeadersIn = Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None


def max_message_bytes(topic: TopicInfo) -> int:
    text = topic.configs.get("max.message.bytes")
    return int(text) if text else DEFAULT_MAX_MESSAGE_BYTES


def parse_acks(acks: int | str) -> int:
    """Kafka's `acks`: "all" / -1, 1, 0."""
    text = str(acks).strip().lower()
    if text in ("all", "-1"):
        return -1
    if text in ("0", "1"):
        return int(text)
    raise ConfigError(f"invalid value {acks!r} for acks: use all, 1 or 0")


def as_bytes(data: bytes | bytearray | memoryview | str | None, what: str) -> bytes | None:
    if data is None or type(data) is bytes:
        return data  # type: ignore[return-value]
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(
        f"record {what} must be bytes, str or None, not {type(data).__name__}; serialize it first"
    )


def normalize_headers(headers: HeadersIn) -> tuple[tuple[str, bytes | None], ...]:
    if not headers:
        return ()
    items = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for name, value in items:
        if not isinstance(name, str):
            raise TypeError(f"header names must be str, got {type(name).__name__}")
        out.append((name, as_bytes(value, f"header {name!r} value")))
    return tuple(out)


def checked_timestamp(timestamp_ms: object) -> int:
    """A record timestamp given to send(), or a TypeError / ValueError saying what is wrong.

    Kafka's ProducerRecord refuses a negative timestamp with these words; a broker would refuse
    the record's whole batch (INVALID_TIMESTAMP), and one past int64 cannot be encoded at all.
    """
    if isinstance(timestamp_ms, bool):
        raise TypeError("timestamp_ms must be an int (ms since the epoch) or None, not a bool")
    try:
        value = index(timestamp_ms)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"timestamp_ms must be an int (ms since the epoch) or None, not "
            f"{type(timestamp_ms).__name__}"
        ) from None
    if not 0 <= value <= INT64_MAX:
        raise ValueError(
            f"Invalid timestamp: {value}. Timestamp should always be non-negative or None "
            f"(and at most {INT64_MAX})."
        )
    return value


__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "Headers",
    "HeadersIn",
    "as_bytes",
    "checked_timestamp",
    "max_message_bytes",
    "normalize_headers",
    "parse_acks",
]
