"""Topic-level configurations: Kafka's names, minibroker's defaults, one validation for all.

Pure (no I/O). The controller validates CreateTopics configs with `validate_topic_configs`; the
broker resolves a topic's effective log and replication settings with `resolve_topic_config`
(topic values override broker defaults, which override these defaults).

Defaults differ from Kafka's where a local cluster wants it, and say so in the doc text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from minibroker.client.common.config import ConfigError, ConfigKey, at_least, one_of, resolve
from minibroker.client.replication_throttle import THROTTLED_REPLICAS_KEYS

TOPIC_CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "min.insync.replicas",
        int,
        1,
        "smallest ISR for acks=all writes and HW advance",
        at_least(1),
    ),
    ConfigKey(
        "unclean.leader.election.enable",
        bool,
        False,
        "let an out-of-sync replica lead when no ISR member is alive (loses data)",
    ),
    ConfigKey(
        "segment.bytes",
        int,
        64 * 1024 * 1024,
        "roll a segment at this size (Kafka: 1 GiB; smaller suits a local cluster)",
        at_least(14),
    ),
    ConfigKey("segment.ms", int, 7 * 24 * 3600 * 1000, "roll a segment at this age", at_least(1)),
    ConfigKey(
        "retention.ms",
        int,
        7 * 24 * 3600 * 1000,
        "delete segments older than this (-1: keep forever)",
        at_least(-1),
    ),
    ConfigKey(
        "retention.bytes",
        int,
        -1,
        "delete old segments while the log is larger than this (-1: no limit)",
        at_least(-1),
    ),
    ConfigKey(
        "max.message.bytes",
        int,
        1048588,
        "largest record batch a producer may send, after compression",
        at_least(0),
    ),
    ConfigKey("index.interval.bytes", int, 4096, "bytes between offset-index entries", at_least(0)),
    ConfigKey(
        "flush.messages",
        int,
        2**63 - 1,
        "fsync after this many messages (default: rely on replication, as Kafka does)",
        at_least(1),
    ),
    ConfigKey("flush.ms", int, 2**63 - 1, "fsync at least this often", at_least(0)),
    ConfigKey(
        "message.timestamp.type",
        str,
        "CreateTime",
        "CreateTime or LogAppendTime",
        one_of("CreateTime", "LogAppendTime"),
    ),
    ConfigKey(
        "message.timestamp.before.max.ms",
        int,
        2**63 - 1,
        "refuse a CreateTime record stamped more than this before the leader's clock "
        "(INVALID_TIMESTAMP; default: no limit, as in Kafka)",
        at_least(0),
    ),
    ConfigKey(
        "message.timestamp.after.max.ms",
        int,
        3_600_000,
        "refuse a CreateTime record stamped more than this after the leader's clock "
        "(INVALID_TIMESTAMP; one hour, Kafka 4's default)",
        at_least(0),
    ),
    ConfigKey("cleanup.policy", str, "delete", "only delete is supported", one_of("delete")),
    *THROTTLED_REPLICAS_KEYS,
)

TOPIC_CONFIG_NAMES: frozenset[str] = frozenset(k.name for k in TOPIC_CONFIG_KEYS)


def validate_topic_configs(configs: Mapping[str, str]) -> dict[str, Any]:
    """Typed values for the given topic configs; raises ConfigError naming the bad key."""
    typed = resolve(TOPIC_CONFIG_KEYS, configs)
    return {name: typed[name] for name in configs}


def resolve_topic_config(
    topic_configs: Mapping[str, str], defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Every topic config's effective value: built-in < `defaults` (broker) < the topic's own."""
    return resolve(TOPIC_CONFIG_KEYS, defaults or {}, topic_configs)


__all__ = [
    "TOPIC_CONFIG_KEYS",
    "TOPIC_CONFIG_NAMES",
    "ConfigError",
    "resolve_topic_config",
    "validate_topic_configs",
]
