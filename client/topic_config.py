"""Topic-level configurations: Kafka's names, minibroker's defaults, one validation for all.

Pure (no I/O). The controller validates CreateTopics configs with `validate_topic_configs`; the
broker resolves a topic's effective log and replication settings with `resolve_topic_config`
(topic values override broker defaults, which override these defaults).

Defaults differ from Kafka's where a local cluster wants it, and say so in the doc text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from minibroker.client.common.config import (
    ConfigError,
    ConfigKey,
    at_least,
    between,
    one_of,
    resolve,
)
from minibroker.client.replication_throttle import THROTTLED_REPLICAS_KEYS

CLEANUP_POLICY_DELETE = "delete"
CLEANUP_POLICY_COMPACT = "compact"
CLEANUP_POLICIES = (CLEANUP_POLICY_DELETE, CLEANUP_POLICY_COMPACT)


def cleanup_policies(value: str) -> frozenset[str]:
    """The policies of a `cleanup.policy` value: Kafka's list type, comma-separated items with
    the blanks around them dropped ("compact, delete" is compact and delete)."""
    return frozenset(item.strip() for item in value.split(","))


def _check_cleanup_policy(value: str) -> str | None:
    # Kafka's ValidList.in("compact", "delete"): every item one of the two, case-sensitive.
    # Kafka 3 also takes an empty list (neither: keep everything, never compact); refused here.
    items = [item.strip() for item in value.split(",")]
    bad = [item for item in items if item not in CLEANUP_POLICIES]
    if not bad:
        return None
    if bad == [""] and len(items) == 1:
        return "must name delete, compact, or both (compact,delete)"
    return (
        f"{', '.join(repr(b) for b in bad)} is not a cleanup policy: a comma-separated list of "
        "delete and compact (delete, compact or compact,delete)"
    )


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
    ConfigKey(
        "cleanup.policy",
        str,
        "delete",
        "delete, compact, or both (compact,delete): delete applies retention.ms and "
        "retention.bytes; compact is accepted and validated, but no log cleaner runs yet "
        "(issue 21): a compact topic keeps every record and, without delete, grows forever",
        _check_cleanup_policy,
    ),
    ConfigKey(
        "min.cleanable.dirty.ratio",
        float,
        0.5,
        "compact topics: clean a log once this share of it is dirty (not cleaned yet)",
        between(0, 1),
    ),
    ConfigKey(
        "min.compaction.lag.ms",
        int,
        0,
        "compact topics: a record stays uncompacted for at least this long",
        at_least(0),
    ),
    ConfigKey(
        "max.compaction.lag.ms",
        int,
        2**63 - 1,
        "compact topics: a record becomes cleanable after at most this long, whatever the "
        "dirty ratio (must be >= min.compaction.lag.ms)",
        at_least(1),
    ),
    ConfigKey(
        "delete.retention.ms",
        int,
        24 * 3600 * 1000,
        "compact topics: how long a tombstone (null value) is kept after the cleaner first "
        "reached it",
        at_least(0),
    ),
    *THROTTLED_REPLICAS_KEYS,
)

TOPIC_CONFIG_NAMES: frozenset[str] = frozenset(k.name for k in TOPIC_CONFIG_KEYS)


def validate_topic_configs(
    configs: Mapping[str, str], defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Typed values for the given topic configs; raises ConfigError naming the bad key.

    Then the rules across keys, on the effective values (built-in < `defaults`, the
    broker's or controller's, < `configs`), as Kafka's LogConfig.validate does with the broker's
    log configs: min.compaction.lag.ms <= max.compaction.lag.ms."""
    typed = resolve(TOPIC_CONFIG_KEYS, defaults or {}, configs)
    check_topic_config_rules(typed)
    return {name: typed[name] for name in configs}


def check_topic_config_rules(typed: Mapping[str, Any]) -> None:
    """The rules across keys of a full, typed set of topic configs (Kafka's
    LogConfig.validateValues); raises ConfigError."""
    min_lag, max_lag = typed["min.compaction.lag.ms"], typed["max.compaction.lag.ms"]
    if min_lag > max_lag:
        raise ConfigError(
            f"conflict topic config setting min.compaction.lag.ms ({min_lag}) > "
            f"max.compaction.lag.ms ({max_lag})"
        )


def is_compacted(typed: Mapping[str, Any]) -> bool:
    """The resolved configs' cleanup.policy includes compact."""
    return CLEANUP_POLICY_COMPACT in cleanup_policies(typed["cleanup.policy"])


def resolve_topic_config(
    topic_configs: Mapping[str, str], defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Every topic config's effective value: built-in < `defaults` (broker) < the topic's own."""
    return resolve(TOPIC_CONFIG_KEYS, defaults or {}, topic_configs)


__all__ = [
    "CLEANUP_POLICIES",
    "CLEANUP_POLICY_COMPACT",
    "CLEANUP_POLICY_DELETE",
    "TOPIC_CONFIG_KEYS",
    "TOPIC_CONFIG_NAMES",
    "ConfigError",
    "check_topic_config_rules",
    "cleanup_policies",
    "is_compacted",
    "resolve_topic_config",
    "validate_topic_configs",
]
