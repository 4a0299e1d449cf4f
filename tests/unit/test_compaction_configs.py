"""Log compaction's configs (issue 21, part 1): Kafka's names, defaults and checks, accepted and
validated everywhere topic and broker configs are. No cleaner runs yet: these change what is
accepted, what `LogConfig` holds, and that retention by time and size applies only with `delete`.

Kafka's rules (TopicConfig, LogConfig, CleanerConfig in apache/kafka):
- `cleanup.policy`: a list of `delete` and `compact` (case-sensitive, blanks around the commas
  dropped); broker default `log.cleanup.policy` = delete. An empty list, which Kafka 3 takes to
  mean "neither", is refused here.
- `min.cleanable.dirty.ratio` 0.5 in [0, 1] (`log.cleaner.min.cleanable.ratio`);
  `min.compaction.lag.ms` 0, >= 0; `max.compaction.lag.ms` Long.MAX, >= 1; and min <= max on the
  effective values (LogConfig.validateValues: "conflict topic config setting ...");
  `delete.retention.ms` 1 day, >= 0 (`log.cleaner.delete.retention.ms`).
- the cleaner's broker settings: `log.cleaner.enable` true, `.threads` 1 (>= 0),
  `.dedupe.buffer.size` 16 MiB (Kafka: 128 MiB; broker/config.py says why), `.io.buffer.size`
  512 KiB, `.io.buffer.load.factor` 0.9,
  `.backoff.ms` 15000, `.io.max.bytes.per.second` Double.MAX_VALUE; each thread's map must hold
  more than one 24-byte entry at the load factor (Kafka's Cleaner `require`).
"""

from __future__ import annotations

import pathlib
import random
import re

import pytest

from minibroker.broker.config import build_config
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.log import PartitionLog
from minibroker.client.common.config import ConfigError
from minibroker.client.errors import ErrorCode
from minibroker.client.records import RecordValidation, encode_batch
from minibroker.client.topic_config import (
    cleanup_policies,
    is_compacted,
    resolve_topic_config,
    validate_topic_configs,
)
from minibroker.client.types import TopicPartition
from minibroker.controller.config import build_config as build_controller_config
from minibroker.controller.core.controller import ControllerCore, ControllerSettings
from minibroker.controller.core.messages import (
    CONFIG_OP_APPEND,
    CONFIG_OP_DELETE,
    CONFIG_OP_SET,
    CONFIG_OP_SUBTRACT,
    AlterConfigOp,
    AlterConfigsResource,
    CreatableTopic,
    DescribeConfigsResource,
    HeartbeatRequest,
    RegisterRequest,
)
from minibroker.metadata.records import CONFIG_RESOURCE_TOPIC

MAX_LONG = 9223372036854775807
BROKER = {"node.id": "1", "log.dirs": "/nonexistent"}


# ---------------------------------------------------------------------------------------------
# Topic configs: defaults, good values, bad values.


def test_defaults_are_kafkas() -> None:
    typed = resolve_topic_config({})
    assert typed["cleanup.policy"] == "delete"
    assert typed["min.cleanable.dirty.ratio"] == 0.5
    assert typed["min.compaction.lag.ms"] == 0
    assert typed["max.compaction.lag.ms"] == MAX_LONG
    assert typed["delete.retention.ms"] == 86_400_000
    assert not is_compacted(typed)
    config = LogConfig.from_configs({})
    assert (config.compact, config.delete) == (False, True)
    assert config == LogConfig()


@pytest.mark.parametrize(
    ("configs", "typed"),
    [
        ({"cleanup.policy": "delete"}, {"cleanup.policy": "delete"}),
        ({"cleanup.policy": "compact"}, {"cleanup.policy": "compact"}),
        ({"cleanup.policy": "compact,delete"}, {"cleanup.policy": "compact,delete"}),
        ({"cleanup.policy": "delete,compact"}, {"cleanup.policy": "delete,compact"}),
        ({"cleanup.policy": " compact , delete "}, {"cleanup.policy": " compact , delete "}),
        ({"min.cleanable.dirty.ratio": "0"}, {"min.cleanable.dirty.ratio": 0.0}),
        ({"min.cleanable.dirty.ratio": "1"}, {"min.cleanable.dirty.ratio": 1.0}),
        ({"min.cleanable.dirty.ratio": "0.01"}, {"min.cleanable.dirty.ratio": 0.01}),
        ({"min.compaction.lag.ms": "0"}, {"min.compaction.lag.ms": 0}),
        ({"min.compaction.lag.ms": "60000"}, {"min.compaction.lag.ms": 60000}),
        ({"max.compaction.lag.ms": "1"}, {"max.compaction.lag.ms": 1}),
        ({"max.compaction.lag.ms": str(MAX_LONG)}, {"max.compaction.lag.ms": MAX_LONG}),
        ({"delete.retention.ms": "0"}, {"delete.retention.ms": 0}),
        (
            {"min.compaction.lag.ms": "5000", "max.compaction.lag.ms": "5000"},
            {"min.compaction.lag.ms": 5000, "max.compaction.lag.ms": 5000},
        ),
    ],
)
def test_good_values_are_accepted_and_typed(configs: dict[str, str], typed: dict) -> None:
    assert validate_topic_configs(configs) == typed


@pytest.mark.parametrize(
    ("configs", "needle"),
    [
        ({"cleanup.policy": "compactt"}, "'compactt' is not a cleanup policy"),
        ({"cleanup.policy": "Compact"}, "'Compact' is not a cleanup policy"),
        ({"cleanup.policy": "compact,"}, "'' is not a cleanup policy"),
        ({"cleanup.policy": "compact;delete"}, "'compact;delete' is not"),
        ({"cleanup.policy": ""}, "must name delete, compact, or both"),
        ({"cleanup.policy": " "}, "must name delete, compact, or both"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "must be in [0, 1]"),
        ({"min.cleanable.dirty.ratio": "-0.1"}, "must be in [0, 1]"),
        ({"min.cleanable.dirty.ratio": "nan"}, "must be in [0, 1]"),
        ({"min.cleanable.dirty.ratio": "half"}, "min.cleanable.dirty.ratio"),
        ({"min.compaction.lag.ms": "-1"}, "must be >= 0"),
        ({"max.compaction.lag.ms": "0"}, "must be >= 1"),
        ({"max.compaction.lag.ms": "-5"}, "must be >= 1"),
        ({"delete.retention.ms": "-1"}, "must be >= 0"),
        ({"delete.retention.ms": "1.5"}, "delete.retention.ms"),
        (
            {"min.compaction.lag.ms": "5001", "max.compaction.lag.ms": "5000"},
            "conflict topic config setting min.compaction.lag.ms (5001) > "
            "max.compaction.lag.ms (5000)",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_key(configs: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)) as caught:
        validate_topic_configs(configs)
    assert any(name in str(caught.value) for name in configs)


def test_the_lag_rule_uses_the_effective_values() -> None:
    # A topic's max lag below the broker's (or controller's) default min lag is a conflict.
    with pytest.raises(ConfigError, match="conflict topic config setting"):
        validate_topic_configs({"max.compaction.lag.ms": "100"}, {"min.compaction.lag.ms": 1000})
    validate_topic_configs({"max.compaction.lag.ms": "1000"}, {"min.compaction.lag.ms": 1000})


@pytest.mark.parametrize(
    ("policy", "compact", "delete"),
    [
        ("delete", False, True),
        ("compact", True, False),
        ("compact,delete", True, True),
        ("delete, compact", True, True),
    ],
)
def test_log_config_holds_the_policy_and_the_compaction_settings(
    policy: str, compact: bool, delete: bool
) -> None:
    config = LogConfig.from_configs(
        {
            "cleanup.policy": policy,
            "min.cleanable.dirty.ratio": "0.25",
            "min.compaction.lag.ms": "10",
            "max.compaction.lag.ms": "20",
            "delete.retention.ms": "30",
        }
    )
    assert (config.compact, config.delete) == (compact, delete)
    assert cleanup_policies(policy) == {
        p for p, on in (("compact", compact), ("delete", delete)) if on
    }
    assert config.min_cleanable_dirty_ratio == 0.25
    assert (config.min_compaction_lag_ms, config.max_compaction_lag_ms) == (10, 20)
    assert config.delete_retention_ms == 30
    rules = RecordValidation.from_topic_config(resolve_topic_config({"cleanup.policy": policy}))
    assert rules.require_keys is compact


# ---------------------------------------------------------------------------------------------
# Broker configs: Kafka's broker names for the topic defaults, and the cleaner's settings.


def test_broker_defaults_under_kafkas_names() -> None:
    config = build_config(
        BROKER,
        {
            "log.cleanup.policy": "compact,delete",
            "log.cleaner.min.cleanable.ratio": "0.1",
            "log.cleaner.min.compaction.lag.ms": "7",
            "log.cleaner.max.compaction.lag.ms": "8",
            "log.cleaner.delete.retention.ms": "9",
        },
    )
    log_config = LogConfig.from_configs({}, config.topic_defaults)
    assert (log_config.compact, log_config.delete) == (True, True)
    assert log_config.min_cleanable_dirty_ratio == 0.1
    assert (log_config.min_compaction_lag_ms, log_config.max_compaction_lag_ms) == (7, 8)
    assert log_config.delete_retention_ms == 9
    # A topic's own setting wins.
    assert not LogConfig.from_configs({"cleanup.policy": "delete"}, config.topic_defaults).compact


def test_cleaner_settings_have_kafkas_defaults() -> None:
    config = build_config(BROKER)
    assert config["log.cleaner.enable"] is True
    assert config["log.cleaner.threads"] == 1
    # The one default that is not Kafka's (128 MiB): a local cluster of 3 on one laptop.
    assert config["log.cleaner.dedupe.buffer.size"] == 16 * 1024 * 1024
    assert config["log.cleaner.io.buffer.size"] == 512 * 1024
    assert config["log.cleaner.io.buffer.load.factor"] == 0.9
    assert config["log.cleaner.backoff.ms"] == 15000
    assert config["log.cleaner.io.max.bytes.per.second"] == 1.7976931348623157e308
    assert config.topic_defaults["cleanup.policy"] == "delete"
    changed = build_config(
        BROKER,
        {
            "log.cleaner.enable": "false",
            "log.cleaner.threads": "2",
            "log.cleaner.dedupe.buffer.size": str(1 << 20),
            "log.cleaner.io.buffer.load.factor": "0.5",
            "log.cleaner.backoff.ms": "100",
            "log.cleaner.io.max.bytes.per.second": "1048576",
        },
    )
    assert changed["log.cleaner.enable"] is False
    assert changed["log.cleaner.threads"] == 2
    assert changed["log.cleaner.io.max.bytes.per.second"] == 1048576.0


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"log.cleanup.policy": "compactt"}, "'compactt' is not a cleanup policy"),
        ({"log.cleaner.min.cleanable.ratio": "1.5"}, "min.cleanable.dirty.ratio"),
        ({"log.cleaner.min.compaction.lag.ms": "-1"}, "min.compaction.lag.ms"),
        ({"log.cleaner.max.compaction.lag.ms": "0"}, "max.compaction.lag.ms"),
        ({"log.cleaner.delete.retention.ms": "-1"}, "delete.retention.ms"),
        (
            {"log.cleaner.min.compaction.lag.ms": "10", "log.cleaner.max.compaction.lag.ms": "9"},
            "conflict topic config setting min.compaction.lag.ms (10) > max.compaction.lag.ms (9)",
        ),
        ({"log.cleaner.enable": "maybe"}, "log.cleaner.enable"),
        ({"log.cleaner.threads": "-1"}, "log.cleaner.threads"),
        ({"log.cleaner.dedupe.buffer.size": "-1"}, "log.cleaner.dedupe.buffer.size"),
        ({"log.cleaner.io.buffer.size": "-1"}, "log.cleaner.io.buffer.size"),
        ({"log.cleaner.io.buffer.load.factor": "0"}, "log.cleaner.io.buffer.load.factor"),
        ({"log.cleaner.io.buffer.load.factor": "1.1"}, "log.cleaner.io.buffer.load.factor"),
        ({"log.cleaner.backoff.ms": "-1"}, "log.cleaner.backoff.ms"),
        ({"log.cleaner.io.max.bytes.per.second": "0"}, "log.cleaner.io.max.bytes.per.second"),
        # 48 bytes over 2 threads: one 24-byte entry each, times 0.9, is not more than one.
        (
            {"log.cleaner.dedupe.buffer.size": "48", "log.cleaner.threads": "2"},
            "too small to fit in even a single message",
        ),
    ],
)
def test_bad_broker_settings_refuse_the_start(settings: dict[str, str], needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        build_config(BROKER, settings)


def test_no_cleaner_thread_needs_no_map() -> None:
    build_config(BROKER, {"log.cleaner.threads": "0", "log.cleaner.dedupe.buffer.size": "0"})
    # 72 bytes, one thread: 3 entries * 0.9 > 1.
    build_config(BROKER, {"log.cleaner.dedupe.buffer.size": "72"})


def test_controller_topic_defaults_are_checked_too() -> None:
    base = {"node.id": 1000}
    assert (
        build_controller_config(base, {"cleanup.policy": "compact"}).topic_defaults[
            "cleanup.policy"
        ]
        == "compact"
    )
    with pytest.raises(ConfigError, match="conflict topic config setting"):
        build_controller_config(base, {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "9"})
    with pytest.raises(ConfigError, match=re.escape("cleanup.policy")):
        build_controller_config(base, {"cleanup.policy": "compactt"})


# ---------------------------------------------------------------------------------------------
# The controller: CreateTopics and IncrementalAlterConfigs answer INVALID_CONFIG, change nothing.


class Controller:
    def __init__(self, **settings: object) -> None:
        self.now = 1_000_000
        self.core = ControllerCore(
            ControllerSettings(auto_leader_rebalance_enable=False, **settings),  # type: ignore[arg-type]
            "cluster",
            random.Random(1),
            self.now,
        )
        self.entries = 0
        reply = self._take(
            self.core.register_broker(RegisterRequest(1, "", "inc", "127.0.0.1", 9001), self.now)
        )
        self._take(
            self.core.heartbeat(
                HeartbeatRequest(1, reply.broker_epoch, self.core.image.next_offset, False, False),
                1,
                self.now,
            )
        )

    def _take(self, outcome):  # type: ignore[no-untyped-def]
        self.entries += len(outcome.entries)
        return outcome.reply

    def create(self, name: str, configs: dict[str, str]):  # type: ignore[no-untyped-def]
        (result,) = self._take(
            self.core.create_topics([CreatableTopic(name, 1, 1, configs)], False, self.now)
        )
        return result

    def alter(self, name: str, *ops: AlterConfigOp):  # type: ignore[no-untyped-def]
        (result,) = self._take(
            self.core.incremental_alter_configs(
                [AlterConfigsResource(CONFIG_RESOURCE_TOPIC, name, ops)], False, self.now
            )
        )
        return result

    def described(self, name: str) -> dict[str, tuple[str, int]]:
        (result,) = self.core.describe_configs(
            [DescribeConfigsResource(CONFIG_RESOURCE_TOPIC, name)]
        )
        return {e.name: (e.value, e.source) for e in result.entries}


@pytest.mark.parametrize(
    ("configs", "needle"),
    [
        ({"cleanup.policy": "compactt"}, "cleanup.policy"),
        ({"min.cleanable.dirty.ratio": "1.5"}, "min.cleanable.dirty.ratio"),
        ({"min.compaction.lag.ms": "-1"}, "min.compaction.lag.ms"),
        ({"max.compaction.lag.ms": "0"}, "max.compaction.lag.ms"),
        ({"delete.retention.ms": "-1"}, "delete.retention.ms"),
        ({"min.compaction.lag.ms": "2", "max.compaction.lag.ms": "1"}, "conflict"),
    ],
)
def test_create_topics_refuses_bad_compaction_configs(configs: dict[str, str], needle: str) -> None:
    c = Controller()
    before = c.entries
    result = c.create("t", configs)
    assert result.error == ErrorCode.INVALID_CONFIG
    assert needle in result.message and "topic 't'" in result.message
    assert c.entries == before and c.core.image.topic("t") is None


def test_create_topics_lag_rule_uses_the_controllers_defaults() -> None:
    c = Controller(topic_defaults={"min.compaction.lag.ms": 1000})
    result = c.create("t", {"max.compaction.lag.ms": "999"})
    assert result.error == ErrorCode.INVALID_CONFIG and "conflict" in result.message


def test_alter_configs_lag_rule_uses_the_controllers_defaults() -> None:
    c = Controller(topic_defaults={"min.compaction.lag.ms": 1000})
    assert c.create("t", {}).error == ErrorCode.NONE
    before = c.entries
    result = c.alter("t", AlterConfigOp("max.compaction.lag.ms", CONFIG_OP_SET, "999"))
    assert result.error == ErrorCode.INVALID_CONFIG and "conflict" in result.message
    assert c.entries == before
    ok = c.alter("t", AlterConfigOp("max.compaction.lag.ms", CONFIG_OP_SET, "1000"))
    assert ok.error == ErrorCode.NONE


def test_a_compacted_topic_is_created_described_and_altered() -> None:
    c = Controller()
    configs = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.2"}
    assert c.create("t", configs).error == ErrorCode.NONE
    topic = c.core.image.topic("t")
    assert topic is not None and dict(topic.configs) == configs
    described = c.described("t")
    assert described["cleanup.policy"][0] == "compact"
    assert described["min.cleanable.dirty.ratio"][0] == "0.2"
    assert described["max.compaction.lag.ms"][0] == str(MAX_LONG)
    assert described["delete.retention.ms"][0] == "86400000"
    # Bad alters answer INVALID_CONFIG and change nothing.
    for ops in [
        (AlterConfigOp("cleanup.policy", CONFIG_OP_SET, "compactt"),),
        (AlterConfigOp("min.cleanable.dirty.ratio", CONFIG_OP_SET, "1.5"),),
        (AlterConfigOp("min.compaction.lag.ms", CONFIG_OP_SET, "-1"),),
        (
            AlterConfigOp("min.compaction.lag.ms", CONFIG_OP_SET, "10"),
            AlterConfigOp("max.compaction.lag.ms", CONFIG_OP_SET, "9"),
        ),
    ]:
        before = c.entries
        result = c.alter("t", *ops)
        assert result.error == ErrorCode.INVALID_CONFIG, ops
        assert c.entries == before, ops
        assert dict(c.core.image.topic("t").configs) == configs  # type: ignore[union-attr]
    # A good one changes the policy.
    assert c.alter("t", AlterConfigOp("cleanup.policy", CONFIG_OP_SET, "compact,delete")).error == (
        ErrorCode.NONE
    )
    assert c.alter("t", AlterConfigOp("min.cleanable.dirty.ratio", CONFIG_OP_DELETE)).error == (
        ErrorCode.NONE
    )
    assert dict(c.core.image.topic("t").configs) == {"cleanup.policy": "compact,delete"}  # type: ignore[union-attr]


def test_cleanup_policy_is_a_list_for_append_and_subtract() -> None:
    """Kafka's LIST type: APPEND / SUBTRACT on an unset policy start from the default (delete),
    as Kafka's ConfigAdminManager does; a policy emptied by SUBTRACT is refused."""
    c = Controller()
    assert c.create("t", {}).error == ErrorCode.NONE

    def policy() -> str | None:
        return c.core.image.topic("t").configs.get("cleanup.policy")  # type: ignore[union-attr]

    assert c.alter("t", AlterConfigOp("cleanup.policy", CONFIG_OP_APPEND, "compact")).error == (
        ErrorCode.NONE
    )
    assert policy() == "delete,compact"
    assert c.alter("t", AlterConfigOp("cleanup.policy", CONFIG_OP_APPEND, "delete")).error == (
        ErrorCode.NONE
    )
    assert policy() == "delete,compact"
    assert c.alter("t", AlterConfigOp("cleanup.policy", CONFIG_OP_SUBTRACT, "delete")).error == (
        ErrorCode.NONE
    )
    assert policy() == "compact"
    before = c.entries
    emptied = c.alter("t", AlterConfigOp("cleanup.policy", CONFIG_OP_SUBTRACT, "compact"))
    assert emptied.error == ErrorCode.INVALID_CONFIG, emptied
    assert "must name delete, compact, or both" in emptied.message
    assert c.entries == before and policy() == "compact"
    bad = c.alter("t", AlterConfigOp("cleanup.policy", CONFIG_OP_APPEND, "compactt"))
    assert bad.error == ErrorCode.INVALID_CONFIG and policy() == "compact"
    # Other keys are not lists.
    ratio = c.alter("t", AlterConfigOp("min.cleanable.dirty.ratio", CONFIG_OP_APPEND, "0.1"))
    assert ratio.error == ErrorCode.INVALID_CONFIG and "only allowed for list configs" in (
        ratio.message
    )


# ---------------------------------------------------------------------------------------------
# Retention by time and size applies only with `delete` (Kafka's deleteOldSegments).

TP = TopicPartition("r", 0)
TS = 1_000_000


def _filled(path: pathlib.Path, config: LogConfig) -> PartitionLog:
    log = PartitionLog.open(path / "r-0", TP, config, now_ms=TS)
    for i in range(0, 60, 10):
        batch = encode_batch([(TS + i + j, b"k%d" % j, b"value", ()) for j in range(10)])
        log.append_as_leader(batch, leader_epoch=1, now_ms=TS + i)
    return log


@pytest.mark.parametrize(
    ("policy", "deleted"),
    [("delete", True), ("compact,delete", True), ("compact", False)],
)
def test_retention_applies_only_with_the_delete_policy(
    tmp_path: pathlib.Path, policy: str, deleted: bool
) -> None:
    for name, settings in [
        ("ms", {"retention.ms": "3000"}),
        ("bytes", {"retention.bytes": "0"}),
    ]:
        config = LogConfig.from_configs({"cleanup.policy": policy, **settings})
        log = _filled(tmp_path / name, config)
        gone = log.delete_retention(now_ms=TS + 6_000, high_watermark=60)
        assert bool(gone) is deleted, (policy, name)
        assert log.log_start_offset == (60 if deleted else 0), (policy, name)
        log.close()
