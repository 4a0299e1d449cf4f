"""Controller configuration: Kafka's property names, minibroker's local-cluster defaults.

Pure apart from reading the config file (through `client.common.config.load_file`, called by the
CLI). Layers: built-in defaults < `--config FILE` < command-line flags < `--set key=value`.
Broker-level defaults for topic configs (`min.insync.replicas`, `unclean.leader.election.enable`,
`retention.ms`, ...) are accepted under the topic config names; a topic's own config wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minibroker.client.common.config import (
    ConfigError,
    ConfigKey,
    at_least,
    parse_problem,
    resolve,
)
from minibroker.client.common.limits import LIMIT_KEYS, ServerLimits
from minibroker.client.common.listeners import (
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
from minibroker.client.topic_config import (
    TOPIC_CONFIG_KEYS,
    TOPIC_CONFIG_NAMES,
    check_topic_config_rules,
)
from minibroker.controller.core.controller import ControllerSettings
from minibroker.controller.core.partition_limits import (
    DEFAULT_MAX_BROKER_PARTITIONS,
    DEFAULT_MAX_PARTITIONS,
)
from minibroker.controller.quorum.messages import QuorumSettings, VoterAddress
from minibroker.metadata.authorizer import AUTHORIZER_KEYS

CONTROLLER_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "node.id", int, 1000, "the controller's id (DescribeCluster's controller id)", at_least(0)
    ),
    ConfigKey("metadata.log.dir", str, "", "data dir of the metadata log (--data-dir)"),
    ConfigKey(
        "controller.quorum.voters",
        str,
        "",
        "the controller quorum, ID@HOST:PORT,... (every voter lists the same; unset: a quorum "
        "of one, this controller)",
    ),
    ConfigKey(
        "controller.quorum.election.timeout.ms",
        int,
        1000,
        "how long a candidate waits for votes before it backs off (randomised up to twice)",
        at_least(10),
    ),
    ConfigKey(
        "controller.quorum.fetch.timeout.ms",
        int,
        2000,
        "a follower that has not heard from the leader for this long starts an election; a "
        "leader that a majority has not fetched from for this long resigns",
        at_least(10),
    ),
    ConfigKey(
        "controller.quorum.election.backoff.max.ms",
        int,
        1000,
        "the longest random back-off after an election that elected nobody",
        at_least(0),
    ),
    ConfigKey(
        "cluster.id",
        str,
        "",
        "the cluster id to format a fresh data dir with (required, the same on every voter, for "
        "a quorum of more than one; a quorum of one makes one when unset)",
    ),
    ConfigKey(
        "listeners",
        str,
        "127.0.0.1:9093",
        "NAME://HOST:PORT to serve ControllerService on (HOST:PORT means PLAINTEXT; port 0: "
        "any; one listener; --listen)",
        lambda v: parse_problem(parse_single_listener, v),
    ),
    PROTOCOL_MAP_KEY,
    ConfigKey(
        "metrics.port",
        int,
        -1,
        "Prometheus /metrics port (0: any free port, -1: off)",
        at_least(-1),
    ),
    ConfigKey(
        "broker.heartbeat.interval.ms",
        int,
        500,
        "how often brokers heartbeat (Kafka: 2000; shorter for fast local failover)",
        at_least(10),
    ),
    ConfigKey(
        "broker.session.timeout.ms",
        int,
        3000,
        "fence a broker not heard from for this long (Kafka: 9000; a broken heartbeat "
        "stream fences at once)",
        at_least(10),
    ),
    ConfigKey("num.partitions", int, 1, "partitions of a topic created with -1", at_least(1)),
    ConfigKey(
        "default.replication.factor",
        int,
        1,
        "replication factor of a topic created with -1",
        at_least(1),
    ),
    ConfigKey(
        "auto.leader.rebalance.enable",
        bool,
        True,
        "move leadership back to preferred replicas periodically",
    ),
    ConfigKey(
        "leader.imbalance.check.interval.seconds",
        int,
        30,
        "period of the automatic rebalance (Kafka: 300)",
        at_least(1),
    ),
    ConfigKey(
        "leader.imbalance.per.broker.percentage",
        int,
        10,
        "rebalance a broker's preferred partitions when more than this percent of them "
        "are led elsewhere (the ZooKeeper-era controller's rule)",
        at_least(0),
    ),
    ConfigKey(
        "metadata.snapshot.interval.records",
        int,
        1000,
        "write a snapshot and drop older log entries after this many records",
        at_least(1),
    ),
    ConfigKey(
        "metadata.max.idle.interval.ms",
        int,
        1000,
        "keep-alive period of WatchMetadata streams (an empty batch with the high offset)",
        at_least(10),
    ),
    ConfigKey(
        "max.partitions",
        int,
        DEFAULT_MAX_PARTITIONS,
        "partitions in the cluster (each counted once); topic creation past it is refused "
        "with POLICY_VIOLATION (KIP-578)",
        at_least(1),
    ),
    ConfigKey(
        "max.broker.partitions",
        int,
        DEFAULT_MAX_BROKER_PARTITIONS,
        "partition replicas one broker may host; topic creation past it is refused with "
        "POLICY_VIOLATION (KIP-578)",
        at_least(1),
    ),
    ConfigKey(
        "replica.rebuild.delay.ms",
        int,
        -1,
        "failure decommissioning: a broker fenced (or unregistered) for this long has every "
        "replica it hosts rebuilt on live brokers, racks honoured, restoring the replication "
        "factor (-1: never, the default: like Kafka, which moves nothing by itself; a broker "
        "that comes back before the delay keeps its replicas)",
        at_least(-1),
    ),
    *LIMIT_KEYS,
    *NETWORK_FAULT_KEYS,
    *SERVER_SSL_KEYS,
    *AUTHORIZER_KEYS,
)

ALL_KEYS: tuple[ConfigKey, ...] = CONTROLLER_KEYS + TOPIC_CONFIG_KEYS


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    values: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def limits(self) -> ServerLimits:
        return ServerLimits.from_config(self.values)

    @property
    def topic_defaults(self) -> dict[str, Any]:
        return {k: v for k, v in self.values.items() if k in TOPIC_CONFIG_NAMES}

    @property
    def listener(self) -> Listener:
        """The listener ControllerService is served on (build_config checked it)."""
        return parse_single_listener(str(self["listeners"]))

    @property
    def security_protocol(self) -> str:
        """PLAINTEXT or SSL: the listener name looked up in listener.security.protocol.map."""
        return security_protocol(
            self.listener, parse_protocol_map(str(self["listener.security.protocol.map"]))
        )

    @property
    def tls(self) -> TlsSettings | None:
        """The SSL listener's certificate, key and CA, also presented on this node's own
        channels to other nodes (mutual TLS); None for a PLAINTEXT listener. Reads the files."""
        return node_tls(self.values, self.security_protocol)

    def quorum_voters(self) -> tuple[VoterAddress, ...]:
        """The voters, sorted by id; a quorum of one (this controller) when unset."""
        text = str(self["controller.quorum.voters"]).strip()
        if not text:
            listener = self.listener
            return (VoterAddress(self["node.id"], listener.host, listener.port),)
        return parse_voters(text)

    def quorum_settings(self) -> QuorumSettings:
        return QuorumSettings(
            node_id=self["node.id"],
            voters=tuple(v.voter_id for v in self.quorum_voters()),
            election_timeout_ms=self["controller.quorum.election.timeout.ms"],
            fetch_timeout_ms=self["controller.quorum.fetch.timeout.ms"],
            election_backoff_max_ms=self["controller.quorum.election.backoff.max.ms"],
        )

    def settings(self) -> ControllerSettings:
        return ControllerSettings(
            node_id=self["node.id"],
            session_timeout_ms=self["broker.session.timeout.ms"],
            num_partitions=self["num.partitions"],
            default_replication_factor=self["default.replication.factor"],
            auto_leader_rebalance_enable=self["auto.leader.rebalance.enable"],
            leader_imbalance_check_interval_ms=self["leader.imbalance.check.interval.seconds"]
            * 1000,
            leader_imbalance_per_broker_percentage=self["leader.imbalance.per.broker.percentage"],
            max_partitions=self["max.partitions"],
            max_broker_partitions=self["max.broker.partitions"],
            topic_defaults=self.topic_defaults,
            replica_rebuild_delay_ms=self["replica.rebuild.delay.ms"],
        )


def parse_voters(text: str) -> tuple[VoterAddress, ...]:
    """`controller.quorum.voters`: ID@HOST:PORT,... -> voters sorted by id. ConfigError names
    the entry that does not parse, a repeated id, or a repeated address."""
    voters: dict[int, VoterAddress] = {}
    for raw in text.split(","):
        item = raw.strip()
        node, at, address = item.partition("@")
        host, colon, port = address.rpartition(":")
        if not at or not colon or not node.strip().isdigit() or not port.isdigit() or not host:
            raise ConfigError(
                f"controller.quorum.voters: {item!r} is not ID@HOST:PORT (e.g. 1000@127.0.0.1:9093)"
            )
        voter = VoterAddress(int(node), host, int(port))
        if voter.voter_id in voters:
            raise ConfigError(f"controller.quorum.voters names voter {voter.voter_id} twice")
        if not 0 < voter.port < 65536:
            raise ConfigError(f"controller.quorum.voters: port of {item!r} is out of range")
        voters[voter.voter_id] = voter
    addresses = [(v.host, v.port) for v in voters.values()]
    if len(set(addresses)) != len(addresses):
        raise ConfigError("controller.quorum.voters names one HOST:PORT for two voters")
    return tuple(voters[i] for i in sorted(voters))


def normalised_voters(voters: tuple[VoterAddress, ...]) -> str:
    """The voters as every voter compares them (QuorumHeader.voters)."""
    return ",".join(str(v) for v in sorted(voters, key=lambda v: v.voter_id))


def build_config(*layers: Mapping[str, Any]) -> ControllerConfig:
    """Resolve the layers (lowest first) and check cross-key rules."""
    values = resolve(ALL_KEYS, *layers)
    if values["broker.session.timeout.ms"] <= values["broker.heartbeat.interval.ms"]:
        raise ConfigError(
            "broker.session.timeout.ms must be larger than broker.heartbeat.interval.ms "
            f"({values['broker.session.timeout.ms']} <= {values['broker.heartbeat.interval.ms']})"
        )
    ServerLimits.from_config(values)  # cross-key rules
    check_topic_config_rules(values)  # the topic defaults' (min <= max compaction lag)
    config = ControllerConfig(values)
    try:
        protocol = config.security_protocol
    except ValueError as err:
        raise ConfigError(f"listeners: {err}") from None
    # An SSL listener's PEM files are read now, so that a missing one fails the start clearly.
    node_tls(config.values, protocol)
    if str(values["controller.quorum.voters"]).strip():
        voters = config.quorum_voters()
        me = [v for v in voters if v.voter_id == values["node.id"]]
        if not me:
            raise ConfigError(
                f"controller.quorum.voters ({values['controller.quorum.voters']}) does not name "
                f"this controller's node.id {values['node.id']}"
            )
        port = config.listener.port
        if port not in (0, me[0].port):
            raise ConfigError(
                f"listeners port {port} is not this voter's port {me[0].port} in "
                "controller.quorum.voters"
            )
    return config


__all__ = [
    "ALL_KEYS",
    "CONTROLLER_KEYS",
    "ControllerConfig",
    "build_config",
    "normalised_voters",
    "parse_voters",
]
