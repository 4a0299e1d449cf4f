"""`minibroker acls`: Kafka's kafka-acls.sh (ACLs stored in the metadata log).

Does network I/O through AsyncAdmin (CreateAcls, DeleteAcls, DescribeAcls on the controller);
writes to stdout.

    minibroker acls --add --allow-principal User:alice --operation Read --operation Write \\
        --topic orders [--resource-pattern-type prefixed]
    minibroker acls --add --deny-principal User:mallory --deny-host 10.0.0.9 --operation All \\
        --cluster
    minibroker acls --add --allow-principal User:bob --producer --topic orders
    minibroker acls --add --allow-principal User:carol --consumer --topic orders --group g1
    minibroker acls --remove --force --allow-principal User:alice --operation Read --topic orders
    minibroker acls --remove --force --topic orders        # every ACL of the resource
    minibroker acls --list [--topic orders] [--resource-pattern-type match] [--principal User:a]

As kafka-acls: principals x hosts x operations for each resource; hosts default to `*`; the
operation defaults to All; `--producer` is WRITE, DESCRIBE, CREATE on each topic, `--consumer`
READ, DESCRIBE on each topic and READ on each group; an operation a resource type does not have
is refused before anything is sent. `--remove` needs `--force` (there is no prompt). After
`--add`/`--remove` the resources' ACLs are listed, in Kafka's words:
"Current ACLs for resource `ResourcePattern(resourceType=TOPIC, name=t, patternType=LITERAL)`:"
then one `(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)` per ACL.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from minibroker.client.cli.common import add_bootstrap_argument, admin_of, guarded, run_async
from minibroker.metadata.acl import (
    CLUSTER_RESOURCE_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    Principal,
    ResourceType,
)

# What each resource type accepts (kafka-acls' AclCommand.ResourceTypeToValidOperations), plus
# ALL everywhere.
VALID_OPERATIONS: dict[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset(
        {
            AclOperation.READ,
            AclOperation.WRITE,
            AclOperation.CREATE,
            AclOperation.DESCRIBE,
            AclOperation.DELETE,
            AclOperation.ALTER,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
        }
    ),
    ResourceType.GROUP: frozenset({AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE}),
    ResourceType.CLUSTER: frozenset(
        {
            AclOperation.CREATE,
            AclOperation.CLUSTER_ACTION,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
            AclOperation.IDEMPOTENT_WRITE,
            AclOperation.ALTER,
            AclOperation.DESCRIBE,
        }
    ),
}
OPERATION_NAMES = (
    "Read",
    "Write",
    "Create",
    "Delete",
    "Alter",
    "Describe",
    "ClusterAction",
    "DescribeConfigs",
    "AlterConfigs",
    "IdempotentWrite",
    "All",
)
PATTERN_TYPES = {
    "literal": PatternType.LITERAL,
    "prefixed": PatternType.PREFIXED,
    "any": PatternType.ANY,
    "match": PatternType.MATCH,
}


class AclsInputError(ValueError):
    """A bad command line: nothing was sent."""


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "acls",
        help="add, remove or list ACLs",
        description="Add, remove or list ACLs (kafka-acls.sh). They take effect when the "
        "brokers and controllers run authorizer.class.name=StandardAuthorizer.",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--add", action="store_true", help="add ACLs")
    action.add_argument("--remove", action="store_true", help="remove ACLs (needs --force)")
    action.add_argument("--list", action="store_true", help="list ACLs")
    parser.add_argument("--allow-principal", action="append", default=[], metavar="TYPE:NAME")
    parser.add_argument("--deny-principal", action="append", default=[], metavar="TYPE:NAME")
    parser.add_argument(
        "--allow-host", action="append", default=[], metavar="HOST", help="default: *"
    )
    parser.add_argument(
        "--deny-host", action="append", default=[], metavar="HOST", help="default: *"
    )
    parser.add_argument(
        "--operation",
        action="append",
        default=[],
        metavar="OP",
        help=f"one of {', '.join(OPERATION_NAMES)} (repeatable; default All)",
    )
    parser.add_argument("--topic", action="append", default=[], metavar="NAME")
    parser.add_argument("--group", action="append", default=[], metavar="NAME")
    parser.add_argument("--cluster", action="store_true", help="the cluster resource")
    parser.add_argument(
        "--resource-pattern-type",
        default="literal",
        choices=sorted(PATTERN_TYPES),
        help="literal (default) or prefixed; --list and --remove also any or match",
    )
    parser.add_argument(
        "--principal", action="append", default=[], metavar="TYPE:NAME", help="--list: filter"
    )
    parser.add_argument(
        "--producer", action="store_true", help="WRITE, DESCRIBE, CREATE on the topics"
    )
    parser.add_argument(
        "--consumer",
        action="store_true",
        help="READ, DESCRIBE on the topics and READ on the groups",
    )
    parser.add_argument("--force", action="store_true", help="--remove without a prompt")
    add_bootstrap_argument(parser)
    parser.set_defaults(func=guarded(_run))


def parse_operation(text: str) -> AclOperation:
    """Kafka's names, case and underscores ignored: Read, ClusterAction, cluster_action."""
    key = text.strip().replace("_", "").replace("-", "").lower()
    for op in AclOperation:
        if op in (AclOperation.UNKNOWN, AclOperation.ANY):
            continue
        if op.name.replace("_", "").lower() == key:
            return op
    raise AclsInputError(f"unknown operation {text!r} (one of {', '.join(OPERATION_NAMES)})")


def _principal(text: str) -> str:
    try:
        return str(Principal.parse(text))
    except ValueError as err:
        raise AclsInputError(str(err)) from None


@dataclass(frozen=True, slots=True)
class Resource:
    """A resource (pattern) the command names."""

    type: ResourceType
    name: str

    def filter(self, pattern: PatternType) -> AclBindingFilter:
        return AclBindingFilter(self.type, self.name, pattern)


@dataclass(slots=True)
class AclsPlan:
    """What the command line asks, before anything is sent."""

    action: str  # add | remove | list
    pattern: PatternType
    # add: the ACLs to create; remove: per resource, the ACLs to remove (empty: all of them)
    bindings: dict[Resource, list[AclBinding]] = field(default_factory=dict)
    principals: list[str] = field(default_factory=list)  # --list --principal


def _resources(args: argparse.Namespace) -> list[Resource]:
    out = [Resource(ResourceType.TOPIC, t) for t in args.topic]
    out += [Resource(ResourceType.GROUP, g) for g in args.group]
    if args.cluster:
        out.append(Resource(ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME))
    for r in out:
        if not r.name:
            raise AclsInputError(f"empty {r.type.name.lower()} name")
    return list(dict.fromkeys(out))


def _entries(args: argparse.Namespace) -> list[tuple[str, str, AclPermissionType]]:
    """(principal, host, permission) for every principal x host given (Kafka's getAcl)."""
    out = []
    for principals, hosts, perm, kind in (
        (args.allow_principal, args.allow_host, AclPermissionType.ALLOW, "allow"),
        (args.deny_principal, args.deny_host, AclPermissionType.DENY, "deny"),
    ):
        if hosts and not principals:
            raise AclsInputError(f"--{kind}-host needs --{kind}-principal")
        for p in principals:
            for h in hosts or ["*"]:
                if not h.strip():
                    raise AclsInputError(f"empty --{kind}-host")
                out.append((_principal(p), h.strip(), perm))
    return out


def _check_operations(resource: Resource, ops: Iterable[AclOperation]) -> None:
    valid = VALID_OPERATIONS.get(resource.type, frozenset())
    bad = [op for op in ops if op != AclOperation.ALL and op not in valid]
    if bad:
        names = ", ".join(sorted(o.name for o in valid | {AclOperation.ALL}))
        raise AclsInputError(
            f"ResourceType {resource.type.name} only supports operations {names}, not "
            f"{', '.join(o.name for o in bad)}"
        )


def plan_of(args: argparse.Namespace) -> AclsPlan:
    """The command line, checked (AclsInputError); nothing is sent."""
    pattern = PATTERN_TYPES[args.resource_pattern_type]
    resources = _resources(args)
    action = "add" if args.add else "remove" if args.remove else "list"
    plan = AclsPlan(action, pattern)
    if args.principal and action != "list":
        raise AclsInputError("--principal only goes with --list")
    if action == "list":
        if args.allow_principal or args.deny_principal or args.operation:
            raise AclsInputError(
                "--list takes --principal, not --allow/--deny-principal/--operation"
            )
        if args.producer or args.consumer:
            raise AclsInputError("--producer/--consumer go with --add or --remove")
        plan.principals = [_principal(p) for p in args.principal]
        plan.bindings = {r: [] for r in resources}
        return plan
    if action == "add" and pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise AclsInputError(
            f"A '--resource-pattern-type' value of '{args.resource_pattern_type}' is not valid "
            "when adding acls (literal or prefixed)."
        )
    if action == "remove" and not args.force:
        raise AclsInputError("--remove needs --force (there is no confirmation prompt)")
    if not resources:
        raise AclsInputError("name a resource: --topic, --group or --cluster")
    entries = _entries(args)
    if action == "add" and not entries:
        raise AclsInputError(
            "You must specify one of: --allow-principal, --deny-principal when trying to add ACLs."
        )
    wanted: dict[Resource, list[AclOperation]] = {}
    if args.producer or args.consumer:
        if args.operation:
            raise AclsInputError("--operation does not go with --producer/--consumer")
        topics = [r for r in resources if r.type == ResourceType.TOPIC]
        groups = [r for r in resources if r.type == ResourceType.GROUP]
        if args.cluster:
            raise AclsInputError("--producer/--consumer take --topic (and --group), not --cluster")
        if not topics:
            raise AclsInputError("--producer/--consumer need --topic")
        if args.consumer and not groups:
            raise AclsInputError("--consumer needs --group")
        if groups and not args.consumer:
            raise AclsInputError("--group goes with --consumer here")
        for t in topics:
            ops = wanted.setdefault(t, [])
            if args.producer:
                ops += [AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.CREATE]
            if args.consumer:
                ops += [AclOperation.READ, AclOperation.DESCRIBE]
        for g in groups:
            wanted[g] = [AclOperation.READ]
    else:
        ops = [parse_operation(o) for o in args.operation] or [AclOperation.ALL]
        for r in resources:
            _check_operations(r, ops)
            wanted[r] = list(ops)
    for r, ops in wanted.items():
        plan.bindings[r] = [
            AclBinding(r.type, r.name, pattern, principal, host, op, perm)
            for principal, host, perm in entries
            for op in dict.fromkeys(ops)
        ]
    return plan


def _pattern_key(b: AclBinding) -> tuple[int, str, int]:
    return (int(b.resource_type), b.resource_name, int(b.pattern_type))


def listing_lines(bindings: Sequence[AclBinding]) -> list[str]:
    """kafka-acls' listing: per resource pattern a header, then one line per ACL."""
    groups: dict[tuple[int, str, int], list[AclBinding]] = {}
    for b in sorted(bindings, key=lambda b: (_pattern_key(b), b.entry_str())):
        groups.setdefault(_pattern_key(b), []).append(b)
    lines: list[str] = []
    for members in groups.values():
        lines.append(f"Current ACLs for resource `{members[0].pattern_str()}`: ")
        lines += [f" \t{b.entry_str()} " for b in members]
        lines.append("")
    return lines


def _run(args: argparse.Namespace) -> int:
    plan = plan_of(args)
    if plan.action == "list":
        return _list(args, plan)
    return _change(args, plan)


def _list(args: argparse.Namespace, plan: AclsPlan) -> int:
    # No resource named: every ACL (of the pattern type, when one other than the default
    # literal is given).
    every = PatternType.ANY if plan.pattern == PatternType.LITERAL else plan.pattern
    filters = [r.filter(plan.pattern) for r in plan.bindings] or [
        AclBindingFilter(pattern_type=every)
    ]

    async def main() -> list[AclBinding]:
        async with admin_of(args) as admin:
            found: dict[AclBinding, None] = {}
            for flt in filters:
                for b in await admin.describe_acls(flt):
                    found[b] = None
            return list(found)

    bindings = run_async(main())
    if plan.principals:
        for principal in plan.principals:
            print(f"ACLs for principal `{principal}`")
            for line in listing_lines([b for b in bindings if b.principal == principal]):
                print(line)
        return 0
    for line in listing_lines(bindings):
        print(line)
    return 0


def _change(args: argparse.Namespace, plan: AclsPlan) -> int:
    async def main() -> list[AclBinding]:
        async with admin_of(args) as admin:
            if plan.action == "add":
                for bindings in plan.bindings.values():
                    print(f"Adding ACLs for resource `{bindings[0].pattern_str()}`: ")
                    for b in bindings:
                        print(f" \t{b.entry_str()} ")
                    print()
                await admin.create_acls([b for bs in plan.bindings.values() for b in bs])
            else:
                filters = []
                for r, bindings in plan.bindings.items():
                    if bindings:
                        filters += [
                            AclBindingFilter(
                                b.resource_type,
                                b.resource_name,
                                plan.pattern,
                                b.principal,
                                b.host,
                                b.operation,
                                b.permission_type,
                            )
                            for b in bindings
                        ]
                    else:
                        filters.append(r.filter(plan.pattern))
                await admin.delete_acls(filters)
            found: dict[AclBinding, None] = {}
            for r in plan.bindings:
                for b in await admin.describe_acls(r.filter(plan.pattern)):
                    found[b] = None
            return list(found)

    for line in listing_lines(run_async(main())):
        print(line)
    return 0


__all__ = [
    "AclsInputError",
    "AclsPlan",
    "listing_lines",
    "parse_operation",
    "plan_of",
    "register",
]
