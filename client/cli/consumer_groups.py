"""`minibroker consumer-groups`: Kafka's kafka-consumer-groups.sh over KafkaGroupCall.

    --list [--state]                          every group (with its state)
    --describe --group G [--offsets|--members|--state]
    --reset-offsets --group G (--topic T[:P,...] ... | --all-topics)
        (--to-earliest | --to-latest | --to-offset N | --shift-by N | --to-datetime ISO)
        [--dry-run | --execute]
    --delete --group G [--group G2 ...]

Does I/O: network through AsyncAdmin (group calls) and AsyncConsumer (log start and end offsets,
offsets for a time); tables to stdout, one error line to stderr with exit status 1 for bad input
or a refused call. The argument checks are pure (`check_args`) and unit tested.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from minibroker.client.cli.common import (
    add_bootstrap_argument,
    admin_of,
    bootstrap_of,
    fail,
    guarded,
    run_async,
    security_of,
)
from minibroker.client.types import TopicPartition

ACTIONS = ("list", "describe", "reset_offsets", "delete")
RESETS = ("to_earliest", "to_latest", "to_offset", "shift_by", "to_datetime")
DESCRIBE_VIEWS = ("offsets", "members", "state")


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "consumer-groups",
        help="list, describe, reset offsets of and delete consumer groups",
        description="List, describe, reset the offsets of and delete consumer groups "
        "(kafka-consumer-groups.sh). Exactly one of --list, --describe, --reset-offsets, "
        "--delete.",
    )
    parser.add_argument("--list", action="store_true", help="list every group")
    parser.add_argument(
        "--describe",
        action="store_true",
        help="each partition's committed offset, log end offset, lag and owner (with "
        "--members: the members; with --state: the group's state)",
    )
    parser.add_argument(
        "--reset-offsets",
        dest="reset_offsets",
        action="store_true",
        help="set a group's committed offsets (the group must have no active members)",
    )
    parser.add_argument("--delete", action="store_true", help="delete groups with no members")
    parser.add_argument(
        "--group", action="append", default=None, metavar="GROUP", help="the group (repeatable)"
    )
    parser.add_argument(
        "--offsets", action="store_true", help="with --describe: partitions (the default)"
    )
    parser.add_argument("--members", action="store_true", help="with --describe: the members")
    parser.add_argument(
        "--state",
        action="store_true",
        help="with --describe: coordinator, strategy, state, members; with --list: states",
    )
    parser.add_argument(
        "--topic",
        action="append",
        default=None,
        metavar="TOPIC[:P,P...]",
        help="with --reset-offsets: a topic, or some of its partitions (repeatable)",
    )
    parser.add_argument(
        "--all-topics",
        dest="all_topics",
        action="store_true",
        help="with --reset-offsets: every topic the group has committed offsets for",
    )
    parser.add_argument("--to-earliest", action="store_true", help="reset to the log start")
    parser.add_argument("--to-latest", action="store_true", help="reset to the log end")
    parser.add_argument("--to-offset", type=int, default=None, metavar="N", help="reset to N")
    parser.add_argument(
        "--shift-by", type=int, default=None, metavar="N", help="move the committed offset by N"
    )
    parser.add_argument(
        "--to-datetime",
        default=None,
        metavar="ISO",
        help="the first offset at or after this time (e.g. 2026-01-31T12:00:00.000, UTC "
        "unless the time says otherwise)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the new offsets only (the default)"
    )
    parser.add_argument("--execute", action="store_true", help="commit the new offsets")
    add_bootstrap_argument(parser)
    parser.set_defaults(func=guarded(_main))


# -- argument checks (pure) --------------------------------------------------------------------


def _given(args: argparse.Namespace, name: str) -> bool:
    value = getattr(args, name, None)
    return value not in (None, False)


def check_args(args: argparse.Namespace) -> str | None:
    """The error message for a bad combination of options (None: good)."""
    actions = [a for a in ACTIONS if _given(args, a)]
    if len(actions) != 1:
        return "give exactly one of --list, --describe, --reset-offsets, --delete" + (
            f" (got {', '.join('--' + a.replace('_', '-') for a in actions)})" if actions else ""
        )
    action = actions[0]
    groups = args.group or []
    if action in ("describe", "reset_offsets", "delete") and not groups:
        return f"--{action.replace('_', '-')} needs --group"
    if action == "reset_offsets" and len(groups) != 1:
        return "--reset-offsets takes one --group"
    views = [v for v in DESCRIBE_VIEWS if _given(args, v)]
    if action == "describe" and len(views) > 1:
        return "give at most one of --offsets, --members, --state"
    if action not in ("describe", "list") and views:
        return "--offsets, --members and --state go with --describe (--state also with --list)"
    if action == "list" and (args.members or args.offsets):
        return "--members and --offsets go with --describe"
    reset_options = [r for r in RESETS if _given(args, r)]
    scope = [s for s in ("topic", "all_topics") if _given(args, s)]
    if action != "reset_offsets":
        if reset_options or scope or args.dry_run or args.execute:
            return (
                "--topic, --all-topics, --to-*, --shift-by, --dry-run and --execute go with "
                "--reset-offsets"
            )
        return None
    if len(scope) != 1:
        return "--reset-offsets needs exactly one of --topic or --all-topics"
    if len(reset_options) != 1:
        return (
            "--reset-offsets needs exactly one of --to-earliest, --to-latest, --to-offset, "
            "--shift-by, --to-datetime"
        )
    if args.dry_run and args.execute:
        return "give --dry-run or --execute, not both"
    if args.to_offset is not None and args.to_offset < 0:
        return f"--to-offset must be >= 0, got {args.to_offset}"
    try:
        for spec in args.topic or []:
            parse_topic_spec(spec)
        if args.to_datetime is not None:
            parse_datetime(args.to_datetime)
    except ValueError as err:
        return str(err)
    return None


def parse_topic_spec(spec: str) -> tuple[str, list[int] | None]:
    """`orders` -> ("orders", None); `orders:0,2` -> ("orders", [0, 2])."""
    topic, sep, parts = spec.partition(":")
    if not topic:
        raise ValueError(f"--topic {spec!r} names no topic")
    if not sep:
        return topic, None
    try:
        partitions = sorted({int(p) for p in parts.split(",") if p.strip()})
    except ValueError:
        raise ValueError(
            f"--topic {spec!r}: partitions must be numbers, as in {topic}:0,1"
        ) from None
    if not partitions or min(partitions) < 0:
        raise ValueError(f"--topic {spec!r}: give partitions >= 0, as in {topic}:0,1")
    return topic, partitions


def parse_datetime(text: str) -> int:
    """An ISO-8601 time -> ms since the epoch (UTC when it carries no zone)."""
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--to-datetime {text!r} is not an ISO-8601 time (e.g. 2026-01-31T12:00:00.000)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


def new_offset(
    method: str,
    value: Any,
    committed: int | None,
    earliest: int,
    latest: int,
    at_time: int | None,
) -> int:
    """Kafka's reset rules: a target outside [earliest, latest] is clamped to it; --shift-by
    moves the committed offset (the log start when none); --to-datetime without a record at or
    after the time goes to the end."""
    if method == "to_earliest":
        target = earliest
    elif method == "to_latest":
        target = latest
    elif method == "to_offset":
        target = int(value)
    elif method == "shift_by":
        target = (committed if committed is not None else earliest) + int(value)
    else:
        target = at_time if at_time is not None else latest
    return max(earliest, min(latest, target))


# -- tables --------------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


@dataclass(frozen=True)
class OffsetRow:
    group: str
    tp: TopicPartition
    current: int | None
    log_end: int | None
    consumer_id: str
    host: str
    client_id: str

    @property
    def lag(self) -> int | None:
        if self.current is None or self.log_end is None:
            return None
        return max(0, self.log_end - self.current)

    def cells(self) -> list[Any]:
        def dash(v: Any) -> Any:
            return "-" if v is None or v == "" else v

        return [
            self.group,
            self.tp.topic,
            self.tp.partition,
            dash(self.current),
            dash(self.log_end),
            dash(self.lag),
            dash(self.consumer_id),
            dash(self.host),
            dash(self.client_id),
        ]


OFFSET_HEADER = (
    "GROUP",
    "TOPIC",
    "PARTITION",
    "CURRENT-OFFSET",
    "LOG-END-OFFSET",
    "LAG",
    "CONSUMER-ID",
    "HOST",
    "CLIENT-ID",
)


def offset_rows(
    group: str,
    description: Any,
    committed: Mapping[TopicPartition, Any],
    log_ends: Mapping[TopicPartition, int],
) -> list[OffsetRow]:
    """One row per partition that is assigned or has a committed offset (Kafka's order)."""
    owner: dict[TopicPartition, Any] = {}
    for m in description.members if description is not None else ():
        for tp in m.assignment:
            owner[tp] = m
    rows = []
    for tp in sorted(set(owner) | set(committed)):
        m = owner.get(tp)
        c = committed.get(tp)
        rows.append(
            OffsetRow(
                group,
                tp,
                c.offset if c is not None else None,
                log_ends.get(tp),
                m.member_id if m else "",
                m.client_host if m else "",
                m.client_id if m else "",
            )
        )
    return rows


# -- the command -------------------------------------------------------------------------------


def _main(args: argparse.Namespace) -> int:
    error = check_args(args)
    if error is not None:
        return fail(error)
    if args.list:
        return run_async(_list(args))
    if args.describe:
        return run_async(_describe(args))
    if args.reset_offsets:
        return run_async(_reset(args))
    return run_async(_delete(args))


def _consumer(args: argparse.Namespace) -> Any:
    from minibroker.client.consumer import AsyncConsumer

    return AsyncConsumer(bootstrap_of(args), default_api_timeout_ms=15_000, **security_of(args))


async def _list(args: argparse.Namespace) -> int:
    async with admin_of(args) as admin:
        groups = await admin.list_groups()
    if args.state:
        for line in table(("GROUP", "STATE"), [(g.group_id, g.state or "-") for g in groups]):
            print(line)
    else:
        for g in groups:
            print(g.group_id)
    return 0


async def _describe(args: argparse.Namespace) -> int:
    async with admin_of(args) as admin:
        described = await admin.describe_groups(args.group)
        committed = {g: await admin.list_group_offsets(g) for g in args.group}
        coordinators = {}
        if args.state:
            for g in args.group:
                coordinators[g] = await admin.groups.coordinator_of(g)
    status = 0
    for n, group in enumerate(args.group):
        if n:
            print()
        d = described.get(group)
        if d is None or d.state == "Dead":
            status = fail(f"consumer group '{group}' does not exist")
            continue
        if args.state:
            node, address = coordinators[group]
            lines = table(
                ("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"),
                [(group, f"{address} ({node})", d.protocol or "-", d.state, len(d.members))],
            )
        elif args.members:
            lines = table(
                ("GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS"),
                [
                    (group, m.member_id, m.client_host or "-", m.client_id, len(m.assignment))
                    for m in d.members
                ],
            )
        else:
            tps = sorted({tp for m in d.members for tp in m.assignment} | set(committed[group]))
            log_ends: dict[TopicPartition, int] = {}
            if tps:
                consumer = _consumer(args)
                try:
                    log_ends = await consumer.end_offsets(tps)
                finally:
                    await consumer.close()
            lines = table(
                OFFSET_HEADER,
                [r.cells() for r in offset_rows(group, d, committed[group], log_ends)],
            )
        if not d.members:
            print(f"Consumer group '{group}' has no active members.")
        for line in lines:
            print(line)
    return status


async def _reset_targets(args: argparse.Namespace, admin: Any, group: str) -> list[TopicPartition]:
    if args.all_topics:
        return sorted(await admin.list_group_offsets(group))
    out: set[TopicPartition] = set()
    for spec in args.topic:
        topic, partitions = parse_topic_spec(spec)
        info = await admin.cluster.wait_for_topic(topic, 10_000)
        if partitions is None:
            partitions = sorted(info.partitions)
        missing = [p for p in partitions if p not in info.partitions]
        if missing:
            raise ValueError(
                f"topic {topic!r} has partitions 0..{info.num_partitions - 1}; "
                f"{missing} do not exist"
            )
        out.update(TopicPartition(topic, p) for p in partitions)
    return sorted(out)


async def _reset(args: argparse.Namespace) -> int:
    [group] = args.group
    method = next(r for r in RESETS if _given(args, r))
    value = getattr(args, method)
    async with admin_of(args) as admin:
        described = (await admin.describe_groups([group])).get(group)
        state = described.state if described is not None else "Dead"
        if state not in ("Empty", "Dead"):
            return fail(
                f"assignments can only be reset if the group '{group}' is inactive, but the "
                f"current state is {state}"
            )
        tps = await _reset_targets(args, admin, group)
        if not tps:
            return fail(f"no partitions to reset for group '{group}'")
        committed = await admin.list_group_offsets(group, tps)
        consumer = _consumer(args)
        try:
            earliest = await consumer.beginning_offsets(tps)
            latest = await consumer.end_offsets(tps)
            at_time: dict[TopicPartition, Any] = {}
            if method == "to_datetime":
                ms = parse_datetime(value)
                found = await consumer.offsets_for_times({tp: ms for tp in tps})
                at_time = {tp: (v[0] if v is not None else None) for tp, v in found.items()}
        finally:
            await consumer.close()
        plan = {
            tp: new_offset(
                method,
                value,
                committed[tp].offset if tp in committed else None,
                earliest[tp],
                latest[tp],
                at_time.get(tp),
            )
            for tp in tps
        }
        if args.execute:
            await admin.alter_group_offsets(group, plan)
    if not args.execute and not args.dry_run:
        print(
            "WARN: No action will be performed as the --execute option is missing. "
            "In a future major release, the default behavior of this command will be to "
            "prompt the user before executing the reset rather than doing a dry run. You "
            "should add the --dry-run option explicitly if you are scripting this command and "
            "want to keep the current default behavior without prompting."
        )
    for line in table(
        ("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"),
        [(group, tp.topic, tp.partition, off) for tp, off in plan.items()],
    ):
        print(line)
    return 0


async def _delete(args: argparse.Namespace) -> int:
    async with admin_of(args) as admin:
        results = await admin.delete_groups(args.group)
    failed = {g: e for g, e in results.items() if e is not None}
    ok = [g for g, e in results.items() if e is None]
    if ok:
        names = ", ".join(f"'{g}'" for g in ok)
        print(f"Deletion of requested consumer groups ({names}) was successful.")
    for g, err in failed.items():
        fail(f"deletion of group '{g}' failed: {type(err).__name__}: {err}")
    return 1 if failed else 0
