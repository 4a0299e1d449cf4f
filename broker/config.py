"""Broker configuration: Kafka's property names, minibroker's local-cluster defaults.

Pure apart from reading the config file through `client.common.config.load_file`. Broker-level
defaults for topic configs are accepted under the topic name (`min.insync.replicas`) and under
Kafka's broker name (`log.segment.bytes`, `message.max.bytes`, ...); a topic's own config wins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minibroker.broker.cleaner.offset_map import DEFAULT_DEDUPE_BUFFER_SIZE
from minibroker.client.common.config import (
    ConfigError,
    ConfigKey,
    at_least,
    between,
    parse_problem,
    resolve,
)
from minibroker.client.common.limits import LIMIT_KEYS, ServerLimits
from minibroker.client.common.listeners import (
    PLAINTEXT,
    Listener,
    parse_protocol_map,
    parse_single_listener,
    security_protocol,
)
from minibroker.client.common.netfaults import NETWORK_FAULT_KEYS
from minibroker.client.common.tls import (
    PROTOCOL_MAP_KEY,
    SERVER_SSL_KEYS,
    TlsSettings,
    node_tls,
)
from minibroker.client.controller_finder import parse_controllers
from minibroker.client.topic_config import TOPIC_CONFIG_KEYS, check_topic_config_rules
from minibroker.metadata.authorizer import AUTHORIZER_KEYS

# Kafka's broker-level names for topic-level defaults.
BROKER_ALIASES: dict[str, str] = {
    "log.segment.bytes": "segment.bytes",
    "log.roll.ms": "segment.ms",
    "log.retention.ms": "retention.ms",
    "log.retention.bytes": "retention.bytes",
    "message.max.bytes": "max.message.bytes",
    "log.index.interval.bytes": "index.interval.bytes",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "log.message.timestamp.type": "message.timestamp.type",
    "log.message.timestamp.before.max.ms": "message.timestamp.before.max.ms",
    "log.message.timestamp.after.max.ms": "message.timestamp.after.max.ms",
    "log.cleanup.policy": "cleanup.policy",
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.cleaner.min.compaction.lag.ms": "min.compaction.lag.ms",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
    "log.cleaner.delete.retention.ms": "delete.retention.ms",
}

# The group coordinator's settings (broker/groups/): Kafka's names and defaults.
GROUP_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "offsets.topic.num.partitions",
        int,
        50,
        "partitions of __consumer_offsets when it is created (a group's coordinator is the "
        "leader of partition abs(hash(group)) % this)",
        at_least(1),
    ),
    ConfigKey(
        "offsets.topic.replication.factor",
        int,
        3,
        "replication factor of __consumer_offsets; until this many brokers are alive it is "
        "not created and FindCoordinator answers COORDINATOR_NOT_AVAILABLE",
        at_least(1),
    ),
    ConfigKey(
        "offsets.topic.segment.bytes",
        int,
        104857600,
        "segment.bytes of __consumer_offsets (small, for fast compaction and loading)",
        at_least(14),
    ),
    ConfigKey(
        "offsets.retention.minutes",
        int,
        10080,
        "committed offsets of a group that has been Empty this long (or of a simple commit "
        "this old) are deleted",
        at_least(1),
    ),
    ConfigKey(
        "offsets.retention.check.interval.ms",
        int,
        600000,
        "how often expired offsets are looked for",
        at_least(1),
    ),
    ConfigKey(
        "offsets.commit.timeout.ms",
        int,
        5000,
        "how long an offset commit (or group metadata write) waits for all in-sync replicas",
        at_least(1),
    ),
    ConfigKey(
        "group.min.session.timeout.ms",
        int,
        6000,
        "the smallest session timeout a group member may ask for",
        at_least(0),
    ),
    ConfigKey(
        "group.max.session.timeout.ms",
        int,
        1800000,
        "the largest session timeout a group member may ask for",
        at_least(0),
    ),
    ConfigKey(
        "group.initial.rebalance.delay.ms",
        int,
        3000,
        "how long a new (Empty) group waits for more members before its first rebalance",
        at_least(0),
    ),
    ConfigKey(
        "group.max.size", int, 2147483647, "the most members a consumer group may have", at_least(1)
    ),
    ConfigKey(
        "offset.metadata.max.bytes",
        int,
        4096,
        "the longest metadata string an offset commit may carry (at most 32767: the record's "
        "string field holds no more)",
        between(0, 32767),
    ),
)

# Kafka's SkimpyOffsetMap entry: an MD5 hash (16 bytes) and an offset (8 bytes).
CLEANER_MAP_ENTRY_BYTES = 24

# The log cleaner's settings (Kafka's CleanerConfig), with Kafka's names and defaults except
# log.cleaner.dedupe.buffer.size (broker/cleaner/manager.py runs the cleaner threads).
#
# log.cleaner.dedupe.buffer.size is 16 MiB here, Kafka's is 128 MiB. The map is a bytearray
# zeroed at the first cleaning round and cleared (rewritten) at each one, so every byte of it is
# resident: 128 MiB each would be 384 MiB for the local 3-broker cluster on one laptop, for maps
# a Python cleaner fills at about 2 to 4 us a key (5.6 million keys of a 128 MiB map take 15 to
# 25 s to cover; clearing it costs about 0.25 s a round). 16 MiB covers 629,145 distinct keys a
# round at the 0.9 load factor (26.7 MB per million keys): a log with more distinct dirty keys is
# cleaned over several rounds (each covers what its map holds), never wrongly. A broker with
# many keys per round to dedupe sets it higher, as in Kafka.
CLEANER_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "log.cleaner.enable",
        bool,
        True,
        "run the log cleaner, which compacts cleanup.policy=compact topics (false: they grow, "
        "as in Kafka)",
    ),
    ConfigKey("log.cleaner.threads", int, 1, "log cleaner threads (0: no cleaner)", at_least(0)),
    ConfigKey(
        "log.cleaner.dedupe.buffer.size",
        int,
        DEFAULT_DEDUPE_BUFFER_SIZE,
        "memory of the cleaners' key -> offset maps, split evenly between the cleaner threads "
        "and allocated at a thread's first round; 16 MiB (Kafka: 128 MiB) covers 629,145 keys "
        "a round at the 0.9 load factor, 24 bytes a key (each map must hold more than one "
        "entry at the load factor); more keys take more rounds",
        at_least(0),
    ),
    ConfigKey(
        "log.cleaner.io.buffer.size",
        int,
        512 * 1024,
        "memory of the cleaners' read and write buffers, shared by all cleaner threads",
        at_least(0),
    ),
    ConfigKey(
        "log.cleaner.io.buffer.load.factor",
        float,
        0.9,
        "how full a cleaner's key -> offset map may get (Kafka's name for the dedupe buffer's "
        "load factor; Kafka does not check it, here it must be in (0, 1])",
        lambda v: None if 0 < v <= 1 else "must be in (0, 1]",
    ),
    ConfigKey(
        "log.cleaner.backoff.ms",
        int,
        15000,
        "how long a cleaner sleeps when no log needs cleaning",
        at_least(0),
    ),
    ConfigKey(
        "log.cleaner.io.max.bytes.per.second",
        float,
        1.7976931348623157e308,
        "throttle of the cleaners' read plus write I/O (default: Double.MAX_VALUE, no limit; "
        "accepted and checked, not applied yet: the cleaner is never throttled)",
        lambda v: None if v > 0 else "must be > 0",
    ),
)

BROKER_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("node.id", int, -1, "this broker's id (required, >= 0)"),
    ConfigKey("log.dirs", str, "", "the data dir (one dir per broker)"),
    ConfigKey(
        "listeners",
        str,
        "127.0.0.1:9092",
        "NAME://HOST:PORT the broker serves on (HOST:PORT means PLAINTEXT; port 0: any; "
        "one listener)",
        lambda v: parse_problem(parse_single_listener, v),
    ),
    ConfigKey(
        "advertised.listeners",
        str,
        "",
        "NAME://HOST:PORT the broker registers with the controller and Metadata answers give "
        "clients and other brokers (unset: the listener; port 0: the port bound); required "
        "when the listener's host is 0.0.0.0 or ::",
        lambda v: parse_problem(parse_single_listener, v) if v.strip() else None,
    ),
    PROTOCOL_MAP_KEY,
    ConfigKey(
        "kafka.listeners",
        str,
        "",
        "PLAINTEXT://HOST:PORT of the Kafka-protocol listener (Kafka clients: kcat, "
        "confluent-kafka, kafka-python; port 0: any); empty: none. PLAINTEXT only, so not with "
        "an SSL/SASL_SSL listener or an authorizer (it has no authentication yet)",
        lambda v: parse_problem(parse_single_listener, v) if v.strip() else None,
    ),
    ConfigKey(
        "kafka.advertised.listeners",
        str,
        "",
        "PLAINTEXT://HOST:PORT Kafka clients are given for this broker in Metadata answers "
        "(unset: kafka.listeners; port 0: the port bound); required when its host is a wildcard",
        lambda v: parse_problem(parse_single_listener, v) if v.strip() else None,
    ),
    ConfigKey(
        "controller.quorum.bootstrap.servers",
        str,
        "127.0.0.1:9093",
        "HOST:PORT of the controller, or a comma-separated list of the quorum's controllers",
    ),
    ConfigKey(
        "controller.quorum.voters",
        str,
        "",
        "Kafka's older name: ID@HOST:PORT,... of the quorum's controllers (ids ignored here); "
        "used when controller.quorum.bootstrap.servers is not set",
    ),
    ConfigKey("broker.rack", str, "", "rack id for replica placement and fetch-from-follower"),
    ConfigKey(
        "metrics.port", int, 0, "Prometheus /metrics port (0: any free port, -1: off)", at_least(-1)
    ),
    ConfigKey(
        "broker.heartbeat.interval.ms",
        int,
        500,
        "heartbeat period (Kafka: 2000; shorter for fast local failover)",
        at_least(10),
    ),
    ConfigKey(
        "replica.lag.time.max.ms",
        int,
        10000,
        "drop a follower from the ISR when not caught up for this long (Kafka: 30000)",
        at_least(10),
    ),
    ConfigKey("replica.fetch.wait.max.ms", int, 500, "follower long-poll wait", at_least(0)),
    ConfigKey(
        "max.incremental.fetch.session.cache.slots",
        int,
        1000,
        "fetch sessions (KIP-227) a broker keeps; 0 = every fetch is a full one",
        at_least(0),
    ),
    ConfigKey("replica.fetch.min.bytes", int, 1, "follower long-poll minimum", at_least(0)),
    ConfigKey(
        "replica.fetch.max.bytes", int, 1048576, "per-partition follower fetch size", at_least(1)
    ),
    ConfigKey(
        "replica.fetch.response.max.bytes",
        int,
        10485760,
        "follower fetch response size",
        at_least(1),
    ),
    ConfigKey(
        "replica.fetch.backoff.ms",
        int,
        200,
        "wait after a follower fetch error (Kafka: 1000)",
        at_least(0),
    ),
    ConfigKey(
        "replica.high.watermark.checkpoint.interval.ms",
        int,
        5000,
        "how often HWs are checkpointed",
        at_least(1),
    ),
    ConfigKey(
        "log.flush.offset.checkpoint.interval.ms",
        int,
        60000,
        "how often the recovery point is checkpointed",
        at_least(1),
    ),
    ConfigKey(
        "log.retention.check.interval.ms",
        int,
        60000,
        "how often retention runs (Kafka: 300000)",
        at_least(1),
    ),
    ConfigKey(
        "replica.selector.class",
        str,
        "RackAwareReplicaSelector",
        "fetch-from-follower: RackAwareReplicaSelector or '' (leader only)",
    ),
    ConfigKey(
        "queued.max.requests", int, 1000, "bound on parked produce and fetch requests", at_least(1)
    ),
    ConfigKey(
        "log.dir.failure.timeout.ms",
        int,
        30000,
        "when the data dir fails, how long to try telling the controller before exiting anyway",
        at_least(1),
    ),
    *CLEANER_KEYS,
    *GROUP_KEYS,
    *LIMIT_KEYS,
    *NETWORK_FAULT_KEYS,
    *SERVER_SSL_KEYS,
    *AUTHORIZER_KEYS,
)


_BROKER_KEY_NAMES = frozenset(k.name for k in BROKER_KEYS)
_TOPIC_KEY_NAMES = frozenset(k.name for k in TOPIC_CONFIG_KEYS)


def is_known_key(name: str) -> bool:
    return name in _BROKER_KEY_NAMES or name in _TOPIC_KEY_NAMES or name in BROKER_ALIASES


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Typed broker settings plus the broker's defaults for topic configs."""

    values: Mapping[str, Any]
    topic_defaults: Mapping[str, Any]

    @property
    def node_id(self) -> int:
        return int(self.values["node.id"])

    @property
    def data_dir(self) -> str:
        return str(self.values["log.dirs"])

    @property
    def listener(self) -> Listener:
        """The listener the broker serves on (build_config checked it)."""
        return parse_single_listener(str(self.values["listeners"]))

    @property
    def listen(self) -> tuple[str, int]:
        listener = self.listener
        return listener.host, listener.port

    @property
    def kafka_listener(self) -> Listener | None:
        """The Kafka-protocol listener (kafka.listeners), None when off."""
        text = str(self.values["kafka.listeners"]).strip()
        return parse_single_listener(text) if text else None

    def kafka_advertised(self, bound_port: int) -> Listener | None:
        """What Kafka clients are given for this broker: kafka.advertised.listeners (port 0:
        the bound port) or the Kafka listener on its bound port; None when there is none."""
        listener = self.kafka_listener
        if listener is None:
            return None
        text = str(self.values["kafka.advertised.listeners"]).strip()
        chosen = parse_single_listener(text) if text else listener
        if chosen.port == 0:
            chosen = dataclasses.replace(chosen, port=bound_port)
        return chosen

    def advertised(self, bound_port: int) -> Listener:
        """The address to register and hand out: advertised.listeners (its port 0: the bound
        port), or the listener itself (on the bound port). build_config refused a wildcard."""
        text = str(self.values["advertised.listeners"]).strip()
        chosen = parse_single_listener(text) if text else self.listener
        if chosen.port == 0:
            chosen = dataclasses.replace(chosen, port=bound_port)
        return chosen

    @property
    def security_protocol(self) -> str:
        """PLAINTEXT or SSL: the listener name looked up in listener.security.protocol.map."""
        return security_protocol(
            self.listener, parse_protocol_map(str(self.values["listener.security.protocol.map"]))
        )

    @property
    def tls(self) -> TlsSettings | None:
        """The SSL listener's certificate, key and CA, also presented on this node's own
        channels to other nodes (mutual TLS); None for a PLAINTEXT listener. Reads the files."""
        return node_tls(self.values, self.security_protocol)

    @property
    def controllers(self) -> tuple[str, ...]:
        """Every configured controller, "host:port" each, in order (build_config checked them)."""
        return parse_controllers(str(self.values["controller.quorum.bootstrap.servers"]))

    @property
    def controller(self) -> tuple[str, int]:
        """The first configured controller (the only one before the quorum)."""
        return split_host_port(self.controllers[0])

    @property
    def rack(self) -> str:
        return str(self.values["broker.rack"])

    @property
    def limits(self) -> ServerLimits:
        return ServerLimits.from_config(self.values)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]


def _controller_list(values: Mapping[str, Any], layers: list[dict[str, Any]]) -> str:
    """The controllers to contact, normalised ("h1:p1,h2:p2"): the bootstrap servers when set,
    else the voters' addresses (Kafka's controller.quorum.voters, ids dropped), else the
    default bootstrap server."""
    bootstrap_set = any("controller.quorum.bootstrap.servers" in layer for layer in layers)
    voters = str(values["controller.quorum.voters"]).strip()
    name = "controller.quorum.bootstrap.servers"
    text = str(values[name])
    if voters and not bootstrap_set:
        name, text = "controller.quorum.voters", voters
    try:
        return ",".join(parse_controllers(text))
    except ValueError as err:
        raise ConfigError(f"{name}: {err}") from None


def _check_listener(config: BrokerConfig) -> None:
    try:
        protocol = config.security_protocol
    except ValueError as err:
        raise ConfigError(f"listeners: {err}") from None
    # An SSL listener's PEM files are read now, so that a missing one fails the start clearly.
    node_tls(config.values, protocol)
    listener = config.listener
    text = str(config.values["advertised.listeners"]).strip()
    if not text:
        if listener.is_wildcard:
            raise ConfigError(
                f"listeners: {listener} binds every interface, which is no address to give "
                "clients: set advertised.listeners to the address they should use "
                f"(e.g. {listener.name}://HOSTNAME:{listener.port or 9092})"
            )
        return
    advertised = parse_single_listener(text)
    if advertised.is_wildcard:
        raise ConfigError(
            f"advertised.listeners: {advertised} is the non-routable meta-address; name the "
            "host clients should connect to"
        )
    if advertised.name != listener.name:
        raise ConfigError(
            f"advertised.listeners: listener name {advertised.name} is not the name in "
            f"listeners ({listener})"
        )


def _check_kafka_listener(config: BrokerConfig) -> None:
    """kafka.listeners: PLAINTEXT only (no TLS or SASL on it yet), so it is refused beside a
    secured gRPC listener or an authorizer, whose protections it would go around."""
    listener = config.kafka_listener
    advertised_text = str(config.values["kafka.advertised.listeners"]).strip()
    if listener is None:
        if advertised_text:
            raise ConfigError("kafka.advertised.listeners is set but kafka.listeners is empty")
        return
    if listener.name != PLAINTEXT:
        raise ConfigError(
            f"kafka.listeners: {listener}: only PLAINTEXT is supported on the Kafka-protocol "
            "listener (no TLS or SASL on it yet)"
        )
    if config.security_protocol != PLAINTEXT or str(config.values["authorizer.class.name"]).strip():
        raise ConfigError(
            f"kafka.listeners: {listener} has no authentication yet, so it cannot serve beside "
            f"a {config.security_protocol} listener or an authorizer (it would bypass them); "
            "leave kafka.listeners empty"
        )
    if (
        config.listener.port
        and listener.port == config.listener.port
        and (listener.host == config.listener.host)
    ):
        raise ConfigError(f"kafka.listeners: {listener} is the gRPC listener's address")
    advertised = parse_single_listener(advertised_text) if advertised_text else listener
    if advertised.is_wildcard:
        what = "kafka.advertised.listeners" if advertised_text else "kafka.listeners"
        raise ConfigError(
            f"{what}: {advertised} binds every interface, which is no address to give Kafka "
            "clients: set kafka.advertised.listeners to the address they should use"
        )
    if advertised.name != PLAINTEXT:
        raise ConfigError(f"kafka.advertised.listeners: {advertised}: only PLAINTEXT is supported")


def _check_cleaner(values: Mapping[str, Any]) -> None:
    """Kafka's Cleaner requirement: each thread's share of log.cleaner.dedupe.buffer.size holds
    more than one entry at the load factor, or cleaning could never make progress."""
    threads = values["log.cleaner.threads"]
    if threads < 1:
        return  # no cleaner thread, no map
    size, load = (
        values["log.cleaner.dedupe.buffer.size"],
        values["log.cleaner.io.buffer.load.factor"],
    )
    if (size // threads // CLEANER_MAP_ENTRY_BYTES) * load <= 1:
        raise ConfigError(
            f"log.cleaner.dedupe.buffer.size {size} over log.cleaner.threads {threads} leaves each "
            "cleaner's offset map too small to fit in even a single message "
            f"({CLEANER_MAP_ENTRY_BYTES} bytes a key at load factor {load}): increase "
            "log.cleaner.dedupe.buffer.size or decrease log.cleaner.threads"
        )


def split_host_port(text: str) -> tuple[str, int]:
    text = text.strip()
    for prefix in ("PLAINTEXT://", "plaintext://"):
        text = text.removeprefix(prefix)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def build_config(*layers: Mapping[str, Any]) -> BrokerConfig:
    """Merge layers (file, then flags) into a BrokerConfig; unknown keys raise ConfigError."""
    broker_layers: list[dict[str, Any]] = []
    topic_layers: list[dict[str, Any]] = []
    for layer in layers:
        b: dict[str, Any] = {}
        t: dict[str, Any] = {}
        for name, value in layer.items():
            if name in _BROKER_KEY_NAMES:
                b[name] = value
            elif name in _TOPIC_KEY_NAMES:
                t[name] = value
            elif name in BROKER_ALIASES:
                t[BROKER_ALIASES[name]] = value
            else:
                raise ConfigError(f"unknown broker configuration {name!r}")
        broker_layers.append(b)
        topic_layers.append(t)
    values = resolve(BROKER_KEYS, *broker_layers)
    values["controller.quorum.bootstrap.servers"] = _controller_list(values, broker_layers)
    if values["node.id"] < 0:
        raise ConfigError("node.id is required (--node-id N, N >= 0)")
    if not values["log.dirs"]:
        raise ConfigError("a data dir is required (--data-dir DIR)")
    ServerLimits.from_config(values)  # cross-key rules
    config = BrokerConfig(values=values, topic_defaults={})
    _check_listener(config)
    _check_kafka_listener(config)
    _check_cleaner(values)
    topic_defaults = resolve(TOPIC_CONFIG_KEYS, *topic_layers)
    check_topic_config_rules(topic_defaults)
    return BrokerConfig(values=values, topic_defaults=topic_defaults)
