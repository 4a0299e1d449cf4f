"""Replication throttles (KIP-73): the dynamic broker rates and the topic replica lists.

Pure. Kafka's names and shapes:
- broker configs `leader.replication.throttled.rate` / `follower.replication.throttled.rate`:
  bytes per second, per broker, set dynamically (`configs --alter --entity-type brokers`);
- topic configs `leader.replication.throttled.replicas` / `follower.replication.throttled.replicas`:
  `"*"` (every replica of the topic), or a comma-separated list of `partition:broker` pairs.

A throttle applies only to a replica that is named in the topic list AND is not in the ISR
(Kafka's `shouldLeaderThrottle` / `shouldFollowerThrottle`): clients and in-sync followers are
never slowed down. The reassign tool sets the lists on `--execute --throttle` and removes
them, and the rates, on `--verify` once the reassignment is complete.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from minibroker.client.common.config import ConfigError, ConfigKey

LEADER_THROTTLED_RATE = "leader.replication.throttled.rate"
FOLLOWER_THROTTLED_RATE = "follower.replication.throttled.rate"
LEADER_THROTTLED_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_THROTTLED_REPLICAS = "follower.replication.throttled.replicas"

UNTHROTTLED = 2**63 - 1  # Kafka's default rate: Long.MAX_VALUE


def _positive_rate(value: Any) -> str | None:
    return None if value > 0 else "must be a positive number of bytes per second"


def _replica_list(value: Any) -> str | None:
    try:
        parse_throttled_replicas(value)
    except ConfigError as err:
        return str(err)
    return None


# Dynamic broker configs (resource type BROKER; name "1" for broker 1, "" for every broker).
BROKER_DYNAMIC_CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        LEADER_THROTTLED_RATE,
        int,
        UNTHROTTLED,
        "bytes/s a leader sends to throttled (moving, out-of-sync) replicas",
        _positive_rate,
    ),
    ConfigKey(
        FOLLOWER_THROTTLED_RATE,
        int,
        UNTHROTTLED,
        "bytes/s a follower fetches for throttled (moving, out-of-sync) replicas",
        _positive_rate,
    ),
)

BROKER_DYNAMIC_CONFIG_NAMES: frozenset[str] = frozenset(k.name for k in BROKER_DYNAMIC_CONFIG_KEYS)

# Topic configs; listed in client/topic_config.TOPIC_CONFIG_KEYS.
THROTTLED_REPLICAS_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        LEADER_THROTTLED_REPLICAS,
        str,
        "",
        "replicas (partition:broker,... or *) whose leader throttles what it sends them",
        _replica_list,
    ),
    ConfigKey(
        FOLLOWER_THROTTLED_REPLICAS,
        str,
        "",
        "replicas (partition:broker,... or *) whose follower throttles its fetches",
        _replica_list,
    ),
)


class ThrottledReplicas:
    """A parsed `*.replication.throttled.replicas` value: is (partition, broker) throttled?"""

    __slots__ = ("everything", "pairs")

    def __init__(self, everything: bool, pairs: frozenset[tuple[int, int]]) -> None:
        self.everything = everything
        self.pairs = pairs

    def __contains__(self, item: tuple[int, int]) -> bool:
        return self.everything or item in self.pairs

    def __bool__(self) -> bool:
        return self.everything or bool(self.pairs)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ThrottledReplicas):
            return NotImplemented
        return (self.everything, self.pairs) == (other.everything, other.pairs)

    def __hash__(self) -> int:
        return hash((self.everything, self.pairs))

    def __repr__(self) -> str:
        return "ThrottledReplicas(*)" if self.everything else f"ThrottledReplicas({self.pairs})"


def parse_throttled_replicas(raw: str) -> ThrottledReplicas:
    """`""` -> nothing; `"*"` -> every replica; `"0:1,0:2,1:3"` -> those pairs. Raises
    ConfigError naming the bad entry."""
    text = raw.strip()
    if not text:
        return ThrottledReplicas(False, frozenset())
    if text == "*":
        return ThrottledReplicas(True, frozenset())
    pairs = set()
    for item in text.split(","):
        partition, sep, broker = item.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            p, b = int(partition), int(broker)
        except ValueError:
            raise ConfigError(
                f"{item.strip()!r} is not partition:broker (expected e.g. 0:1,0:2 or *)"
            ) from None
        if p < 0 or b < 0:
            raise ConfigError(f"{item.strip()!r}: partition and broker must be >= 0")
        pairs.add((p, b))
    return ThrottledReplicas(False, frozenset(pairs))


def format_throttled_replicas(pairs: set[tuple[int, int]] | frozenset[tuple[int, int]]) -> str:
    """The config value for `pairs`, sorted (the inverse of `parse_throttled_replicas`)."""
    return ",".join(f"{p}:{b}" for p, b in sorted(pairs))


def throttle_rates(broker_configs: Mapping[str, str]) -> tuple[int, int]:
    """(leader rate, follower rate) in bytes/s from a broker's dynamic configs (merged
    default + own, `MetadataImage.broker_config`); UNTHROTTLED when unset or invalid."""

    def rate(name: str) -> int:
        raw = broker_configs.get(name)
        if raw is None:
            return UNTHROTTLED
        try:
            value = int(raw)
        except ValueError:
            return UNTHROTTLED
        return value if value > 0 else UNTHROTTLED

    return rate(LEADER_THROTTLED_RATE), rate(FOLLOWER_THROTTLED_RATE)


__all__ = [
    "BROKER_DYNAMIC_CONFIG_KEYS",
    "BROKER_DYNAMIC_CONFIG_NAMES",
    "FOLLOWER_THROTTLED_RATE",
    "FOLLOWER_THROTTLED_REPLICAS",
    "LEADER_THROTTLED_RATE",
    "LEADER_THROTTLED_REPLICAS",
    "THROTTLED_REPLICAS_KEYS",
    "UNTHROTTLED",
    "ThrottledReplicas",
    "format_throttled_replicas",
    "parse_throttled_replicas",
    "throttle_rates",
]
