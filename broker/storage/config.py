"""`LogConfig`: the storage settings of one topic, with Kafka's names and minibroker's defaults.

Pure: no I/O. The keys, defaults and checks live once in `minibroker.client.topic_config`
(shared with the controller, which validates CreateTopics with the same `ConfigKey`s); this module
turns a resolved mapping into a typed, frozen value for the storage code (Kafka's broker-level
names, `log.segment.bytes`, ..., are mapped onto the topic-level ones by broker/config.py).

Defaults that differ from Kafka's: `segment.bytes` is 64 MiB (Kafka: 1 GiB), which suits a local
cluster's disks and keeps recovery of the active segment short.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minibroker.client.topic_config import (
    CLEANUP_POLICY_COMPACT,
    CLEANUP_POLICY_DELETE,
    cleanup_policies,
    resolve_topic_config,
)


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Typed storage settings of one topic (Kafka's LogConfig, storage part only)."""

    segment_bytes: int = 64 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000  # -1: keep forever
    retention_bytes: int = -1  # -1: no size limit
    index_interval_bytes: int = 4096
    max_message_bytes: int = 1048588
    flush_messages: int = 2**63 - 1
    flush_ms: int = 2**63 - 1
    message_timestamp_type: str = "CreateTime"
    # cleanup.policy, as its two flags (Kafka's LogConfig.compact / .delete). Retention by time
    # and size applies only with delete; compact is what the log cleaner cleans (issue 21).
    compact: bool = False
    delete: bool = True
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1
    delete_retention_ms: int = 24 * 3600 * 1000  # how long tombstones stay once cleaned

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @classmethod
    def from_configs(
        cls,
        topic_configs: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> LogConfig:
        """Built-in defaults < `defaults` (broker-wide, topic names) < `topic_configs`.

        Raises ConfigError (from client/common/config.py) naming a bad or unknown key.
        """
        typed = resolve_topic_config(topic_configs or {}, defaults)
        policies = cleanup_policies(typed["cleanup.policy"])
        return cls(
            segment_bytes=typed["segment.bytes"],
            segment_ms=typed["segment.ms"],
            retention_ms=typed["retention.ms"],
            retention_bytes=typed["retention.bytes"],
            index_interval_bytes=typed["index.interval.bytes"],
            max_message_bytes=typed["max.message.bytes"],
            flush_messages=typed["flush.messages"],
            flush_ms=typed["flush.ms"],
            message_timestamp_type=typed["message.timestamp.type"],
            compact=CLEANUP_POLICY_COMPACT in policies,
            delete=CLEANUP_POLICY_DELETE in policies,
            min_cleanable_dirty_ratio=typed["min.cleanable.dirty.ratio"],
            min_compaction_lag_ms=typed["min.compaction.lag.ms"],
            max_compaction_lag_ms=typed["max.compaction.lag.ms"],
            delete_retention_ms=typed["delete.retention.ms"],
        )
