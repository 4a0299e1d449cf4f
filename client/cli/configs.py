"""`minibroker configs`: Kafka's kafka-configs.sh for topic configs and dynamic broker configs.

Does network I/O through AsyncAdmin (IncrementalAlterConfigs, DescribeConfigs on the
controller); writes to stdout.

    minibroker configs --alter --entity-type topics --entity-name t \\
        --add-config min.insync.replicas=2,leader.replication.throttled.replicas=[0:1,0:2] \\
        --delete-config retention.ms
    minibroker configs --alter --entity-type brokers --entity-name 1 \\
        --add-config leader.replication.throttled.rate=1048576
    minibroker configs --alter --entity-type brokers --entity-default --add-config ...
    minibroker configs --describe --entity-type topics --entity-name t [--all]

`--add-config` is Kafka's: `k=v` pairs separated by commas, a value that holds commas in
[brackets]. `--alter` prints "Completed updating config for topic t." (broker 1, or "default
config for brokers in the cluster"). `--describe` prints Kafka's "Dynamic configs for topic t
are:" then `  name=value sensitive=false synonyms={SOURCE:name=value}` per config set
for the entity itself (Kafka's rule: DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, or
DYNAMIC_DEFAULT_BROKER_CONFIG for --entity-default; `--all`: every config, defaults too).
Changes take effect on every broker at once; bad input (unknown key, invalid value, a throttle
of 0 or less) is refused by the controller and nothing changes.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from minibroker.client.cli.common import add_bootstrap_argument, admin_of, guarded, run_async

# A comma outside [brackets] (Kafka's ConfigCommand.parseConfigsToBeAdded).
_TOP_LEVEL_COMMA = re.compile(r",(?=[^\]]*(?:\[|$))")
ENTITY_TYPES = {"topics": "topic", "brokers": "broker"}


class ConfigsInputError(ValueError):
    """A bad command line: nothing was sent."""


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "configs",
        help="alter or describe topic and dynamic broker configs",
        description="Alter or describe topic configs and dynamic broker configs "
        "(kafka-configs.sh).",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--alter", action="store_true", help="change configs")
    action.add_argument("--describe", action="store_true", help="show configs")
    parser.add_argument("--entity-type", required=True, choices=sorted(ENTITY_TYPES))
    parser.add_argument("--entity-name", default=None, help="topic name or broker id")
    parser.add_argument(
        "--entity-default", action="store_true", help="brokers: the cluster-wide default"
    )
    parser.add_argument("--add-config", default=None, metavar="k=v,k2=[a,b]", help="configs to set")
    parser.add_argument("--delete-config", default=None, metavar="k,k2", help="configs to remove")
    parser.add_argument("--all", action="store_true", help="--describe: defaults too")
    add_bootstrap_argument(parser)
    parser.set_defaults(func=guarded(_run))


def parse_add_config(text: str) -> dict[str, str]:
    """`"a=1,b=[x,y]"` -> {"a": "1", "b": "x,y"} (Kafka's shape)."""
    out: dict[str, str] = {}
    for item in _TOP_LEVEL_COMMA.split(text.strip()):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigsInputError(f"--add-config expects k=v pairs, got {item.strip()!r}")
        value = value.strip()
        if value.startswith("[") and value.endswith("]"):
            value = value[1:-1]
        if key in out:
            raise ConfigsInputError(f"--add-config: {key} is given twice")
        out[key] = value
    if not out:
        raise ConfigsInputError("--add-config is empty")
    return out


def parse_delete_config(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigsInputError("--delete-config is empty")
    return names


@dataclass(frozen=True, slots=True)
class ConfigTarget:
    """The resource a command names: ("topic"|"broker", name; "" = every broker's default)."""

    kind: str
    name: str

    def describe(self) -> str:
        if self.kind == "broker" and self.name == "":
            return "default config for brokers in the cluster"
        return f"config for {self.kind} {self.name}"


def target_of(args: argparse.Namespace) -> ConfigTarget:
    kind = ENTITY_TYPES[args.entity_type]
    if args.entity_default:
        if kind != "broker":
            raise ConfigsInputError("--entity-default only goes with --entity-type brokers")
        if args.entity_name is not None:
            raise ConfigsInputError("give --entity-name or --entity-default, not both")
        return ConfigTarget(kind, "")
    if args.entity_name is None or not args.entity_name.strip():
        raise ConfigsInputError("--entity-name is required (or --entity-default for brokers)")
    name = args.entity_name.strip()
    if kind == "broker":
        try:
            if int(name) < 0:
                raise ValueError
        except ValueError:
            raise ConfigsInputError(
                f"the entity name for brokers must be a broker id, got {name!r}"
            ) from None
    return ConfigTarget(kind, name)


def alter_ops(add: str | None, delete: str | None) -> list[tuple[str, str, str | None]]:
    """(name, "set"|"delete", value) for `--add-config` and `--delete-config`."""
    if add is None and delete is None:
        raise ConfigsInputError("--alter needs --add-config and/or --delete-config")
    sets = parse_add_config(add) if add is not None else {}
    deletes = parse_delete_config(delete) if delete is not None else []
    both = sorted(set(sets) & set(deletes))
    if both:
        raise ConfigsInputError(f"{', '.join(both)} is both added and deleted")
    ops: list[tuple[str, str, str | None]] = [(k, "set", v) for k, v in sets.items()]
    ops += [(k, "delete", None) for k in deletes]
    return ops


def dynamic_source(target: ConfigTarget) -> str:
    """The one source kafka-configs --describe shows without --all: the entity's own."""
    if target.kind == "topic":
        return "DYNAMIC_TOPIC_CONFIG"
    return "DYNAMIC_DEFAULT_BROKER_CONFIG" if target.name == "" else "DYNAMIC_BROKER_CONFIG"


def describe_header(target: ConfigTarget, all_configs: bool) -> str:
    which = "All" if all_configs else "Dynamic"
    if target.kind == "broker" and target.name == "":
        return f"{'All' if all_configs else 'Default'} configs for brokers in the cluster are:"
    return f"{which} configs for {target.kind} {target.name} are:"


def _shown(value: str | None) -> str:
    return "null" if value is None else value


def describe_lines(
    target: ConfigTarget, entries: Iterable[Any], all_configs: bool = False
) -> list[str]:
    """kafka-configs --describe: a header, then one line per (dynamic) config."""
    lines = [describe_header(target, all_configs)]
    shown_source = dynamic_source(target)
    for e in sorted(entries, key=lambda e: e.name):
        if not all_configs and e.source != shown_source:
            continue
        value = _shown(e.value)
        lines.append(f"  {e.name}={value} sensitive=false synonyms={{{e.source}:{e.name}={value}}}")
    return lines


def _run(args: argparse.Namespace) -> int:
    target = target_of(args)
    if args.alter:
        if args.all:
            raise ConfigsInputError("--all only goes with --describe")
        ops = alter_ops(args.add_config, args.delete_config)
        return _alter(args, target, ops)
    if args.add_config is not None or args.delete_config is not None:
        raise ConfigsInputError("--add-config/--delete-config only go with --alter")
    return _describe(args, target)


def _alter(
    args: argparse.Namespace, target: ConfigTarget, ops: list[tuple[str, str, str | None]]
) -> int:
    from minibroker.client.admin import AlterConfigOp, ConfigResource

    async def main() -> None:
        async with admin_of(args) as admin:
            await admin.incremental_alter_configs(
                {ConfigResource(target.kind, target.name): [AlterConfigOp(*op) for op in ops]}
            )

    run_async(main())
    print(f"Completed updating {target.describe()}.")
    return 0


def _describe(args: argparse.Namespace, target: ConfigTarget) -> int:
    from minibroker.client.admin import ConfigResource

    resource = ConfigResource(target.kind, target.name)

    async def main() -> Mapping[Any, list[Any]]:
        async with admin_of(args) as admin:
            return await admin.describe_configs([resource])

    answer = run_async(main())
    for line in describe_lines(target, answer.get(resource, []), args.all):
        print(line)
    return 0


__all__ = [
    "ConfigTarget",
    "ConfigsInputError",
    "alter_ops",
    "describe_lines",
    "parse_add_config",
    "parse_delete_config",
    "register",
    "target_of",
]
