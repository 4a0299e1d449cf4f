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

from minibroker.client.common.config import ConfigError, ConfigKey, at_least, resolve
from minibroker.client.common.limits import LIMIT_KEYS, ServerLimits
from minibroker.client.topic_config import TOPIC_CONFIG_KEYS, TOPIC_CONFIG_NAMES
from minibroker.controller.core.controller import ControllerSettings
from minibroker.controller.core.partition_limits import (
    DEFAULT_MAX_BROKER_PARTITIONS,
    DEFAULT_MAX_PARTITIONS,
)

CONTROLLER_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "node.id", int, 1000, "the controller's id (DescribeCluster's controller id)", at_least(0)
    ),
    ConfigKey("metadata.log.dir", str, "", "data dir of the metadata log (--data-dir)"),
    ConfigKey(
        "listeners",
        str,
        "127.0.0.1:9093",
        "HOST:PORT to serve ControllerService on (port 0: any; --listen)",
    ),
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
    *LIMIT_KEYS,
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
        )


def build_config(*layers: Mapping[str, Any]) -> ControllerConfig:
    """Resolve the layers (lowest first) and check cross-key rules."""
    values = resolve(ALL_KEYS, *layers)
    if values["broker.session.timeout.ms"] <= values["broker.heartbeat.interval.ms"]:
        raise ConfigError(
            "broker.session.timeout.ms must be larger than broker.heartbeat.interval.ms "
            f"({values['broker.session.timeout.ms']} <= {values['broker.heartbeat.interval.ms']})"
        )
    ServerLimits.from_config(values)  # cross-key rules
    return ControllerConfig(values)


__all__ = ["ALL_KEYS", "CONTROLLER_KEYS", "ControllerConfig", "build_config"]
