"""Options of the minibroker Spark source and sink, and the offset planning they drive.

Pure: no I/O, no pyspark. Option names and meanings are those of Spark's Kafka connector
(Spark's Structured Streaming + Kafka Integration Guide), so a job ports in both directions:
`bootstrap.servers` (also
`kafka.bootstrap.servers`), exactly one of `assign` / `subscribe` / `subscribePattern`,
`startingOffsets` / `endingOffsets` (`earliest`, `latest`, or JSON with -2 = earliest and -1 =
latest), `startingTimestamp` / `startingOffsetsByTimestamp` (and the `ending` ones),
`maxOffsetsPerTrigger`, `minPartitions`, `failOnDataLoss`, `includeHeaders`. Client settings go
through under their Kafka names, with or without the `kafka.` prefix (`client.rack`, `acks`,
`compression.type`, `linger.ms`, ..., and TLS: `security.protocol`, `ssl.ca.location`,
`ssl.certificate.location`, `ssl.key.location`; SASL_SSL: `sasl.mechanism`, `sasl.username`,
`sasl.password`).

Offsets travel as Kafka's JSON shape `{"topic": {"0": 23}}`: Spark round-trips streaming offsets
through JSON, so partition keys are strings everywhere a plan leaves this module.

Spark hands options over as a case-insensitive mapping (a plain dict would lower-case the keys);
every lookup here goes through `get_option`, which accepts either.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from minibroker.client.types import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, TopicPartition

# Kafka's consumer settings the Kafka source refuses, with the option to use instead.
REFUSED_SOURCE = {
    "group.id": "the source keeps no consumer group; offsets live in the query's checkpoint",
    "auto.offset.reset": "use startingOffsets",
    "key.deserializer": "keys are always read as binary; cast them in a DataFrame operation",
    "value.deserializer": "values are always read as binary; cast them in a DataFrame operation",
    "enable.auto.commit": "the source never commits offsets to the broker",
    "interceptor.classes": "interceptors are not supported",
}
REFUSED_SINK = {
    "key.serializer": "keys are written as binary; cast the key column to string or binary",
    "value.serializer": "values are written as binary; cast the value column to string or binary",
    "interceptor.classes": "interceptors are not supported",
}

# Kafka consumer property -> AsyncConsumer keyword.
# Kafka's TLS and SASL client properties (librdkafka's PEM names) -> the clients' keywords; the
# source's admin client gets them too (`security_kwargs`).
_SECURITY_KEYS: dict[str, tuple[str, type]] = {
    "security.protocol": ("security_protocol", str),
    "ssl.ca.location": ("ssl_ca_location", str),
    "ssl.certificate.location": ("ssl_certificate_location", str),
    "ssl.key.location": ("ssl_key_location", str),
    # SASL_SSL: a SASL PLAIN login over TLS (librdkafka's names).
    "sasl.mechanism": ("sasl_mechanism", str),
    "sasl.username": ("sasl_username", str),
    "sasl.password": ("sasl_password", str),
}
_CONSUMER_KEYS: dict[str, tuple[str, type]] = {
    **_SECURITY_KEYS,
    "client.rack": ("client_rack", str),
    "fetch.max.wait.ms": ("fetch_max_wait_ms", int),
    "fetch.min.bytes": ("fetch_min_bytes", int),
    "fetch.max.bytes": ("fetch_max_bytes", int),
    "max.partition.fetch.bytes": ("max_partition_fetch_bytes", int),
    "max.poll.records": ("max_poll_records", int),
    "request.timeout.ms": ("request_timeout_ms", int),
    "retry.backoff.ms": ("retry_backoff_ms", int),
    "default.api.timeout.ms": ("default_api_timeout_ms", int),
    "metadata.max.age.ms": ("metadata_max_age_ms", int),
}
# Kafka producer property -> AsyncProducer keyword.
_PRODUCER_KEYS: dict[str, tuple[str, type]] = {
    **_SECURITY_KEYS,
    "acks": ("acks", str),
    "enable.idempotence": ("enable_idempotence", bool),
    "linger.ms": ("linger_ms", int),
    "batch.size": ("batch_size", int),
    "compression.type": ("compression_type", str),
    "max.in.flight.requests.per.connection": ("max_in_flight", int),
    "retries": ("retries", int),
    "request.timeout.ms": ("request_timeout_ms", int),
    "delivery.timeout.ms": ("delivery_timeout_ms", int),
    "retry.backoff.ms": ("retry_backoff_ms", int),
    "max.request.size": ("max_request_size", int),
    "buffer.memory": ("buffer_memory", int),
    "max.block.ms": ("max_block_ms", int),
    "metadata.max.age.ms": ("metadata_max_age_ms", int),
    "client.id": ("client_id", str),
}

SOURCE_ONLY_STREAMING = ("maxOffsetsPerTrigger",)
DEFAULT_POLL_TIMEOUT_MS = 120_000  # Kafka's kafkaConsumer.pollTimeoutMs
DEFAULT_ARROW_BATCH_ROWS = 10_000
# Larger polls than Kafka's 500 cut the source's reads by a third (measured with 100-byte
# records); `max.poll.records` lowers it again for very large records.
DEFAULT_MAX_POLL_RECORDS = 5_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default


class OptionError(ValueError):
    """An option is missing, unknown to the connector's rules, or has a bad value."""


def get_option(options: Mapping[str, str], name: str) -> str | None:
    """Case-insensitive lookup that also works on a plain dict with lower-cased keys."""
    value = options.get(name)
    if value is None:
        value = options.get(name.lower())
    if value is None:
        lowered = name.lower()
        for key, candidate in options.items():
            if key.lower() == lowered:
                return candidate
    return value


def parse_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = get_option(options, name)
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name} must be true or false, got {raw!r}")


def parse_int(options: Mapping[str, str], name: str, minimum: int = 1) -> int | None:
    raw = get_option(options, name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {name} must be >= {minimum}, got {value}")
    return value


def bootstrap_servers(options: Mapping[str, str]) -> str:
    value = get_option(options, "kafka.bootstrap.servers") or get_option(
        options, "bootstrap.servers"
    )
    if not value:
        raise OptionError(
            "option bootstrap.servers (or kafka.bootstrap.servers) is required, "
            "e.g. .option('bootstrap.servers', '127.0.0.1:9092')"
        )
    return value


def _client_settings(options: Mapping[str, str]) -> dict[str, str]:
    """Kafka client properties: `kafka.x` wins over a bare `x` of the same name."""
    out: dict[str, str] = {}
    prefixed: dict[str, str] = {}
    for key, value in options.items():
        lowered = key.lower()
        if lowered.startswith("kafka."):
            prefixed[lowered[len("kafka.") :]] = value
        else:
            out[lowered] = value
    out.update(prefixed)
    return out


def _typed(name: str, kind: type, raw: str) -> Any:
    if kind is int:
        try:
            return int(raw.strip())
        except ValueError:
            raise OptionError(f"option {name} must be an integer, got {raw!r}") from None
    if kind is bool:
        return parse_bool({name: raw}, name, False)
    return raw


def _refuse(settings: Mapping[str, str], refused: Mapping[str, str]) -> None:
    for key, why in refused.items():
        if key in settings:
            raise OptionError(f"option {key} (kafka.{key}) is not supported: {why}")


def consumer_config(options: Mapping[str, str]) -> dict[str, Any]:
    """AsyncConsumer keyword arguments from the Kafka-named options."""
    settings = _client_settings(options)
    _refuse(settings, REFUSED_SOURCE)
    out: dict[str, Any] = {}
    for key, (kwarg, kind) in _CONSUMER_KEYS.items():
        if key in settings:
            out[kwarg] = _typed(key, kind, settings[key])
    return out


def security_kwargs(client_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The TLS keywords among a consumer's or producer's (for an admin client beside it)."""
    names = {kwarg for kwarg, _ in _SECURITY_KEYS.values()}
    return {k: v for k, v in client_kwargs.items() if k in names}


def producer_config(options: Mapping[str, str]) -> dict[str, Any]:
    """AsyncProducer keyword arguments from the Kafka-named options; acks defaults to all."""
    settings = _client_settings(options)
    _refuse(settings, REFUSED_SINK)
    out: dict[str, Any] = {"acks": "all"}
    for key, (kwarg, kind) in _PRODUCER_KEYS.items():
        if key in settings:
            out[kwarg] = _typed(key, kind, settings[key])
    return out


# ---------------------------------------------------------------------------------------------
# Which partitions


@dataclass(frozen=True)
class TopicSelection:
    """Exactly one of: `assign` (fixed partitions), `subscribe` (topics), `subscribePattern`."""

    kind: str
    topics: tuple[str, ...] = ()
    pattern: str = ""
    assigned: tuple[TopicPartition, ...] = ()

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribePattern":
            # Java's Pattern.matcher(topic).matches(): the whole name must match.
            return re.fullmatch(self.pattern, topic) is not None
        if self.kind == "subscribe":
            return topic in self.topics
        return any(tp.topic == topic for tp in self.assigned)

    def partitions(self, partition_counts: Mapping[str, int]) -> list[TopicPartition]:
        """The selected partitions given each existing topic's partition count, sorted."""
        if self.kind == "assign":
            return sorted(self.assigned)
        return sorted(
            TopicPartition(topic, p)
            for topic, count in partition_counts.items()
            if self.matches(topic)
            for p in range(count)
        )


def parse_selection(options: Mapping[str, str]) -> TopicSelection:
    given = {
        name: get_option(options, name)
        for name in ("assign", "subscribe", "subscribePattern")
        if get_option(options, name) is not None
    }
    if len(given) != 1:
        raise OptionError(
            "set exactly one of the options assign, subscribe, subscribePattern "
            f"(got {sorted(given) or 'none'})"
        )
    kind, raw = next(iter(given.items()))
    raw = raw or ""
    if kind == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise OptionError("option subscribe names no topic")
        return TopicSelection(kind, topics=topics)
    if kind == "subscribePattern":
        if not raw.strip():
            raise OptionError("option subscribePattern is empty")
        try:
            re.compile(raw)
        except re.error as err:
            raise OptionError(f"option subscribePattern {raw!r} is not a regex: {err}") from None
        return TopicSelection(kind, pattern=raw)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not data:
        raise OptionError(f'option assign must be JSON like {{"topicA":[0,1]}}, got {raw!r}')
    assigned: list[TopicPartition] = []
    for topic, parts in data.items():
        if not isinstance(parts, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts
        ):
            raise OptionError(f"option assign: {topic!r} must map to a list of partition ids")
        assigned += [TopicPartition(topic, p) for p in parts]
    return TopicSelection("assign", assigned=tuple(sorted(set(assigned))))


# ---------------------------------------------------------------------------------------------
# Where to start and stop


@dataclass(frozen=True)
class OffsetSpec:
    """A resolved-later offset choice.

    kind "earliest" / "latest": every partition; "offsets": per-partition offsets with Kafka's
    -2 (earliest) and -1 (latest) sentinels; "timestamps": per-partition timestamps in ms, or
    `all_timestamp_ms` for every partition (startingTimestamp / endingTimestamp).
    """

    kind: str
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    all_timestamp_ms: int | None = None


def _parse_partition_json(raw: str, name: str) -> dict[TopicPartition, int]:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise OptionError(f'option {name} must be JSON like {{"topicA":{{"0":23}}}}, got {raw!r}')
    out: dict[TopicPartition, int] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise OptionError(f"option {name}: {topic!r} must map partition ids to numbers")
        for p, value in parts.items():
            try:
                partition = int(p)
            except ValueError:
                raise OptionError(f"option {name}: partition id {p!r} is not a number") from None
            if not isinstance(value, int) or isinstance(value, bool):
                raise OptionError(f"option {name}: {topic}-{p} must be an integer")
            out[TopicPartition(topic, partition)] = value
    return out


def _timestamp_option(options: Mapping[str, str], name: str) -> int | None:
    raw = get_option(options, name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"option {name} must be milliseconds since the epoch") from None
    if value < 0:
        raise OptionError(f"option {name} must be >= 0, got {value}")
    return value


def _offset_spec(
    options: Mapping[str, str], prefix: str, *, default: str, streaming: bool
) -> OffsetSpec:
    """Kafka's precedence: <prefix>Timestamp > <prefix>OffsetsByTimestamp > <prefix>Offsets."""
    starting = prefix == "starting"
    ts_all = _timestamp_option(options, f"{prefix}Timestamp")
    if ts_all is not None:
        return OffsetSpec("timestamps", all_timestamp_ms=ts_all)
    by_ts = get_option(options, f"{prefix}OffsetsByTimestamp")
    if by_ts is not None:
        parsed = _parse_partition_json(by_ts, f"{prefix}OffsetsByTimestamp")
        if any(v < 0 for v in parsed.values()):
            raise OptionError(f"option {prefix}OffsetsByTimestamp: timestamps must be >= 0")
        return OffsetSpec("timestamps", offsets=parsed)
    name = f"{prefix}Offsets"
    raw = get_option(options, name)
    if raw is None:
        return OffsetSpec(default)
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        kind = text.lower()
        if kind == "latest" and starting and not streaming:
            raise OptionError("startingOffsets=latest is not allowed for batch queries")
        if kind == "earliest" and not starting:
            raise OptionError("endingOffsets=earliest is not allowed")
        return OffsetSpec(kind)
    parsed = _parse_partition_json(text, name)
    for tp, value in parsed.items():
        if value < EARLIEST_TIMESTAMP:
            raise OptionError(f"option {name}: offset {value} for {tp} is not valid")
        if starting and not streaming and value == LATEST_TIMESTAMP:
            raise OptionError(f"option {name}: -1 (latest) for {tp} is not allowed in batch")
        if not starting and value == EARLIEST_TIMESTAMP:
            raise OptionError(f"option {name}: -2 (earliest) for {tp} is not allowed")
    return OffsetSpec("offsets", offsets=parsed)


@dataclass(frozen=True)
class SourceOptions:
    """Everything the source needs, parsed once on the driver and shipped to executors."""

    bootstrap_servers: str
    selection: TopicSelection
    starting: OffsetSpec
    ending: OffsetSpec
    starting_by_timestamp_strategy: str
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    include_headers: bool
    poll_timeout_ms: int
    use_arrow: bool
    arrow_batch_rows: int
    consumer: dict[str, Any]


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    if not streaming:
        for name in SOURCE_ONLY_STREAMING:
            if get_option(options, name) is not None:
                raise OptionError(f"option {name} applies to streaming queries only")
    elif any(
        get_option(options, n) is not None
        for n in ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp")
    ):
        raise OptionError("endingOffsets / endingTimestamp apply to batch queries only")
    strategy = get_option(options, "startingOffsetsByTimestampStrategy") or "error"
    strategy = strategy.strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError("option startingOffsetsByTimestampStrategy must be error or latest")
    return SourceOptions(
        bootstrap_servers=bootstrap_servers(options),
        selection=parse_selection(options),
        starting=_offset_spec(
            options, "starting", default="latest" if streaming else "earliest", streaming=streaming
        ),
        ending=_offset_spec(options, "ending", default="latest", streaming=streaming),
        starting_by_timestamp_strategy=strategy,
        max_offsets_per_trigger=parse_int(options, "maxOffsetsPerTrigger"),
        min_partitions=parse_int(options, "minPartitions"),
        fail_on_data_loss=parse_bool(options, "failOnDataLoss", True),
        include_headers=parse_bool(options, "includeHeaders", False),
        poll_timeout_ms=parse_int(options, "kafkaConsumer.pollTimeoutMs")
        or DEFAULT_POLL_TIMEOUT_MS,
        use_arrow=parse_bool(options, "useArrow", True),
        arrow_batch_rows=parse_int(options, "arrowBatchRows") or DEFAULT_ARROW_BATCH_ROWS,
        consumer={"max_poll_records": DEFAULT_MAX_POLL_RECORDS, **consumer_config(options)},
    )


def resolve_offsets(
    spec: OffsetSpec,
    tps: Iterable[TopicPartition],
    earliest: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    by_timestamp: Mapping[TopicPartition, int | None] | None = None,
    *,
    missing: str,
    no_match: str = "latest",
) -> dict[TopicPartition, int]:
    """Concrete offsets for `tps`.

    `earliest` / `latest` hold each partition's log start offset and high watermark;
    `by_timestamp` the offset ListOffsets found for the spec's timestamp (None: no record that
    late). `missing` ("earliest" or "latest") is used for partitions a JSON spec leaves out, and
    `no_match` ("latest" or "error") when no record is at or after a timestamp.
    """
    out: dict[TopicPartition, int] = {}
    for tp in tps:
        if spec.kind == "earliest":
            out[tp] = earliest[tp]
        elif spec.kind == "latest":
            out[tp] = latest[tp]
        elif spec.kind == "timestamps":
            if spec.all_timestamp_ms is None and tp not in spec.offsets:
                out[tp] = earliest[tp] if missing == "earliest" else latest[tp]
                continue
            found = (by_timestamp or {}).get(tp)
            if found is None:
                if no_match == "error":
                    raise OptionError(
                        f"no record of {tp} has a timestamp at or after the requested one "
                        "(startingOffsetsByTimestampStrategy=error)"
                    )
                found = latest[tp]
            out[tp] = found
        else:
            value = spec.offsets.get(tp)
            if value is None:
                value = EARLIEST_TIMESTAMP if missing == "earliest" else LATEST_TIMESTAMP
            if value == EARLIEST_TIMESTAMP:
                out[tp] = earliest[tp]
            elif value == LATEST_TIMESTAMP:
                out[tp] = latest[tp]
            else:
                out[tp] = value
    return out


def timestamp_targets(spec: OffsetSpec, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
    """The ListOffsets timestamp to look up per partition for a "timestamps" spec."""
    if spec.kind != "timestamps":
        return {}
    if spec.all_timestamp_ms is not None:
        return dict.fromkeys(tps, spec.all_timestamp_ms)
    return {tp: spec.offsets[tp] for tp in tps if tp in spec.offsets}


# ---------------------------------------------------------------------------------------------
# Plans: ranges, splits, rate limits, offset JSON


@dataclass(frozen=True)
class OffsetRange:
    """Offsets [start, end) of one partition; start <= end."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def split_ranges(ranges: Iterable[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Non-empty ranges, one per partition, split further when `minPartitions` asks for more.

    Kafka's KafkaOffsetRangeCalculator: each range gets max(round(size / total * minPartitions),
    1) parts of (almost) equal size, so big partitions are split more than small ones.
    """
    work = [r for r in ranges if r.size > 0]
    if min_partitions is None or len(work) >= min_partitions:
        return work
    total = sum(r.size for r in work)
    out: list[OffsetRange] = []
    for r in work:
        parts = max(round(r.size / total * min_partitions), 1)
        parts = min(parts, r.size)
        for i in range(parts):
            start = r.start + r.size * i // parts
            end = r.start + r.size * (i + 1) // parts
            out.append(OffsetRange(r.topic, r.partition, start, end))
    return out


def rate_limit(
    start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], max_rows: int
) -> dict[TopicPartition, int]:
    """End offsets that admit at most about `max_rows` records, split in proportion to lag.

    Kafka's KafkaMicroBatchStream.rateLimit: a partition's share is floor(limit * lag / total),
    rounded up when it is below one so that a small lagging partition still moves.
    """
    lags = {tp: max(0, end - start.get(tp, end)) for tp, end in latest.items()}
    total = sum(lags.values())
    if total <= max_rows:
        return dict(latest)
    out: dict[TopicPartition, int] = {}
    for tp, end in latest.items():
        begin = start.get(tp, end)
        lag = lags[tp]
        if lag == 0:
            out[tp] = end
            continue
        share = max_rows * lag / total
        step = int(share) if share >= 1 else 1
        out[tp] = min(end, begin + step)
    return out


def offsets_to_json(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = offsets[tp]
    return out


def offsets_from_json(data: Mapping[str, Any] | str | None) -> dict[TopicPartition, int]:
    if data is None:
        return {}
    if isinstance(data, str):
        data = json.loads(data)
    if not isinstance(data, Mapping):
        raise OptionError(f"offsets must be a JSON object, got {data!r}")
    return {
        TopicPartition(topic, int(p)): int(offset)
        for topic, parts in data.items()
        for p, offset in parts.items()
    }


__all__ = [
    "OffsetRange",
    "OffsetSpec",
    "OptionError",
    "SourceOptions",
    "TopicSelection",
    "bootstrap_servers",
    "consumer_config",
    "offsets_from_json",
    "offsets_to_json",
    "parse_selection",
    "parse_source_options",
    "producer_config",
    "rate_limit",
    "resolve_offsets",
    "security_kwargs",
    "split_ranges",
    "timestamp_targets",
]
