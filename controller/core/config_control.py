"""Dynamic configs (Kafka's ConfigurationControlManager): IncrementalAlterConfigs and
DescribeConfigs for TOPIC and BROKER resources.

Pure. A TOPIC resource is named by the topic's name (its ConfigRecord by the topic id); its keys
are `TOPIC_CONFIG_KEYS`, validated together after the change. A BROKER resource is a broker id
("1") or "" (the default of every broker); its keys are the dynamic ones,
`BROKER_DYNAMIC_CONFIG_KEYS` (the KIP-73 throttle rates). One ConfigRecord per key whose value
changes; a resource with any bad op changes nothing. APPEND and SUBTRACT apply to list-valued
keys only (the throttled-replicas lists and cleanup.policy), as in Kafka.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from minibroker.client.common.config import ConfigError, ConfigKey, config_str, resolve
from minibroker.client.errors import ErrorCode
from minibroker.client.replication_throttle import (
    BROKER_DYNAMIC_CONFIG_KEYS,
    THROTTLED_REPLICAS_KEYS,
)
from minibroker.client.topic_config import (
    TOPIC_CONFIG_KEYS,
    resolve_topic_config,
    validate_topic_configs,
)
from minibroker.controller.core.control_base import ControlBase
from minibroker.controller.core.messages import (
    CONFIG_OP_APPEND,
    CONFIG_OP_DELETE,
    CONFIG_OP_SET,
    CONFIG_OP_SUBTRACT,
    CONFIG_SOURCE_DEFAULT,
    CONFIG_SOURCE_DYNAMIC_BROKER,
    CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER,
    CONFIG_SOURCE_DYNAMIC_TOPIC,
    CONFIG_SOURCE_STATIC_BROKER,
    AlterConfigOp,
    AlterConfigsResource,
    AlterConfigsResult,
    ConfigEntry,
    DescribeConfigsResource,
    DescribeConfigsResult,
    Outcome,
)
from minibroker.metadata.records import (
    CONFIG_RESOURCE_BROKER,
    CONFIG_RESOURCE_TOPIC,
    ConfigRecord,
)

THROTTLE_LIST_KEYS = frozenset(k.name for k in THROTTLED_REPLICAS_KEYS)
# Kafka's LIST-typed configs among ours: APPEND and SUBTRACT apply to these only.
LIST_KEYS = THROTTLE_LIST_KEYS | {"cleanup.policy"}
_TOPIC_KEYS = {k.name: k for k in TOPIC_CONFIG_KEYS}
_BROKER_KEYS = {k.name: k for k in BROKER_DYNAMIC_CONFIG_KEYS}


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def apply_ops(
    current: Mapping[str, str],
    ops: Sequence[AlterConfigOp],
    keys: Mapping[str, ConfigKey],
    effective: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The configs after `ops` (Kafka's IncrementalAlterConfigs semantics); raises _Refused.

    APPEND and SUBTRACT on a list key that is not set start from its `effective` value (the
    default), as Kafka's ConfigAdminManager does: APPEND compact to a topic without its own
    cleanup.policy gives delete,compact."""
    new = dict(current)
    seen: set[str] = set()
    for op in ops:
        if op.name in seen:
            raise _Refused(ErrorCode.INVALID_REQUEST, f"config {op.name!r} is altered twice")
        seen.add(op.name)
        if op.name not in keys:
            raise _Refused(
                ErrorCode.INVALID_CONFIG,
                f"unknown config {op.name!r} (known: {', '.join(sorted(keys))})",
            )
        if op.op == CONFIG_OP_SET:
            if op.value is None:
                raise _Refused(ErrorCode.INVALID_CONFIG, f"SET {op.name!r} needs a value")
            new[op.name] = op.value
        elif op.op == CONFIG_OP_DELETE:
            new.pop(op.name, None)
        elif op.op in (CONFIG_OP_APPEND, CONFIG_OP_SUBTRACT):
            if op.name not in LIST_KEYS:
                raise _Refused(
                    ErrorCode.INVALID_CONFIG,
                    f"{'APPEND' if op.op == CONFIG_OP_APPEND else 'SUBTRACT'} is only allowed "
                    f"for list configs ({', '.join(sorted(LIST_KEYS))}), not {op.name!r}",
                )
            items = _items(new.get(op.name, (effective or {}).get(op.name, "")))
            change = _items(op.value or "")
            if op.op == CONFIG_OP_APPEND:
                items += [i for i in change if i not in items]
                if "*" in items:  # every replica already: the pairs add nothing
                    items = ["*"]
            else:
                items = [i for i in items if i not in change]
            if items or op.name not in THROTTLE_LIST_KEYS:
                # An emptied cleanup.policy is kept empty, for validation to refuse.
                new[op.name] = ",".join(items)
            else:
                new.pop(op.name, None)
        else:
            raise _Refused(ErrorCode.INVALID_REQUEST, f"unknown config operation {op.op}")
    return new


def _items(value: str) -> list[str]:
    return [i.strip() for i in value.split(",") if i.strip()]


class ConfigControl(ControlBase):
    """IncrementalAlterConfigs and DescribeConfigs."""

    def incremental_alter_configs(
        self, resources: Sequence[AlterConfigsResource], validate_only: bool, now_ms: int
    ) -> Outcome[tuple[AlterConfigsResult, ...]]:
        results = []
        for r in resources:
            try:
                self._alter_one(r, validate_only, now_ms)
            except _Refused as refused:
                results.append(
                    AlterConfigsResult(
                        r.resource_type, r.resource_name, refused.code, refused.message
                    )
                )
            else:
                results.append(AlterConfigsResult(r.resource_type, r.resource_name, ErrorCode.NONE))
        return self._done(tuple(results))

    def _alter_one(self, r: AlterConfigsResource, validate_only: bool, now_ms: int) -> None:
        if r.resource_type == CONFIG_RESOURCE_TOPIC:
            topic = self.image.topic(r.resource_name)
            if topic is None:
                raise _Refused(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {r.resource_name!r}"
                )
            current = dict(topic.configs)
            effective = {
                k: config_str(v)
                for k, v in resolve_topic_config({}, self.settings.topic_defaults).items()
            }
            new = apply_ops(current, r.ops, _TOPIC_KEYS, effective)
            try:
                validate_topic_configs(new, self.settings.topic_defaults)
            except ConfigError as err:
                raise _Refused(ErrorCode.INVALID_CONFIG, f"topic {topic.name!r}: {err}") from None
            record_name, label = topic.topic_id, f"topic {topic.name}"
        elif r.resource_type == CONFIG_RESOURCE_BROKER:
            name = _broker_resource(r.resource_name)
            current = dict(self.image.broker_configs.get(name, {}))
            new = apply_ops(current, r.ops, _BROKER_KEYS)
            try:
                resolve(BROKER_DYNAMIC_CONFIG_KEYS, new)
            except ConfigError as err:
                raise _Refused(
                    ErrorCode.INVALID_CONFIG, f"broker {name or '(default)'}: {err}"
                ) from None
            record_name, label = name, f"broker {name or '(default)'}"
        else:
            raise _Refused(
                ErrorCode.INVALID_REQUEST,
                f"unsupported config resource type {r.resource_type} (topic "
                f"{CONFIG_RESOURCE_TOPIC} or broker {CONFIG_RESOURCE_BROKER})",
            )
        changes = {
            k: new.get(k) for k in sorted(set(current) | set(new)) if current.get(k) != new.get(k)
        }
        if validate_only or not changes:
            return
        for key, value in changes.items():
            self._append(ConfigRecord(record_name, key, value, r.resource_type), now_ms)
        self._event(
            "config_changed",
            resource=label,
            resource_type="topic" if r.resource_type == CONFIG_RESOURCE_TOPIC else "broker",
            resource_name=r.resource_name,
            changes=changes,
        )

    def describe_configs(
        self, resources: Sequence[DescribeConfigsResource]
    ) -> tuple[DescribeConfigsResult, ...]:
        """Every config (or the keys asked for) of each resource, its effective value and
        where the value comes from; read-only. Unknown keys are left out, as in Kafka."""
        out = []
        for r in resources:
            try:
                entries = self._describe_one(r)
            except _Refused as refused:
                out.append(
                    DescribeConfigsResult(
                        r.resource_type, r.resource_name, refused.code, refused.message
                    )
                )
            else:
                wanted = set(r.keys)
                out.append(
                    DescribeConfigsResult(
                        r.resource_type,
                        r.resource_name,
                        ErrorCode.NONE,
                        "",
                        tuple(e for e in entries if not wanted or e.name in wanted),
                    )
                )
        return tuple(out)

    def _describe_one(self, r: DescribeConfigsResource) -> list[ConfigEntry]:
        entries = []
        if r.resource_type == CONFIG_RESOURCE_TOPIC:
            topic = self.image.topic(r.resource_name)
            if topic is None:
                raise _Refused(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {r.resource_name!r}"
                )
            defaults = self.settings.topic_defaults
            for key in TOPIC_CONFIG_KEYS:
                if key.name in topic.configs:
                    value, source = topic.configs[key.name], CONFIG_SOURCE_DYNAMIC_TOPIC
                elif key.name in defaults:
                    value, source = config_str(defaults[key.name]), CONFIG_SOURCE_STATIC_BROKER
                else:
                    value, source = config_str(key.default), CONFIG_SOURCE_DEFAULT
                entries.append(ConfigEntry(key.name, value, source, False, key.doc))
            return entries
        if r.resource_type == CONFIG_RESOURCE_BROKER:
            name = _broker_resource(r.resource_name)
            own = self.image.broker_configs.get(name, {}) if name else {}
            cluster = self.image.broker_configs.get("", {})
            for key in BROKER_DYNAMIC_CONFIG_KEYS:
                if key.name in own:
                    value, source = own[key.name], CONFIG_SOURCE_DYNAMIC_BROKER
                elif key.name in cluster:
                    value, source = cluster[key.name], CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER
                else:
                    value, source = config_str(key.default), CONFIG_SOURCE_DEFAULT
                entries.append(ConfigEntry(key.name, value, source, False, key.doc))
            return entries
        raise _Refused(
            ErrorCode.INVALID_REQUEST,
            f"unsupported config resource type {r.resource_type} (topic "
            f"{CONFIG_RESOURCE_TOPIC} or broker {CONFIG_RESOURCE_BROKER})",
        )


def _broker_resource(name: str) -> str:
    """The canonical name of a BROKER resource: "" or a broker id in decimal."""
    if name == "":
        return ""
    if not name.isdigit() or not name.isascii():
        raise _Refused(
            ErrorCode.INVALID_REQUEST,
            f"broker config resource {name!r} is not a broker id (or empty for the default)",
        )
    return str(int(name))


__all__ = ["LIST_KEYS", "ConfigControl", "apply_ops"]
