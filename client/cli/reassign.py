"""`minibroker reassign-partitions`: Kafka's kafka-reassign-partitions.sh.

Does network I/O through AsyncAdmin (DescribeCluster, Metadata/DescribeReplicas,
Alter/ListPartitionReassignments, IncrementalAlterConfigs); reads the JSON file named on the
command line; writes Kafka's lines to stdout. One action per run:

- `--generate --topics-to-move-json-file F --broker-list 1,2,4 [--disable-rack-aware]`:
  "Current partition replica assignment" and "Proposed partition reassignment configuration",
  each followed by its JSON (a fresh rack-aware placement, `metadata.assignment_plan`);
  nothing changes.
- `--execute --reassignment-json-file F [--throttle BYTES]`: prints the current assignment for
  rollback, sets the throttles (rates on every broker involved, throttled replica lists on the
  topics: Kafka's rule, `reassign_plan.throttle_plan`), then starts the reassignments.
- `--verify --reassignment-json-file F [--preserve-throttles]`: "Reassignment of partition t-0
  is completed." / "... is still in progress." per partition; once all are complete, removes
  the throttle configs (rates on every broker, lists on the file's topics).
- `--cancel --reassignment-json-file F [--preserve-throttles]`: cancels those of the file's
  partitions that are moving (they go back to their original replicas), removes throttles.
- `--list`: the reassignments in progress, Kafka's "t-0: replicas: 1,2,3. adding: 3. removing: 1."

Bad input (malformed JSON, wrong version, a missing field, a partition listed twice, an empty
replica list, an unknown topic, partition or broker, a throttle of 0 or less) is refused with
one error line and exit 1 before anything is changed. The pure parts are in `reassign_plan`.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from minibroker.client.cli.common import add_bootstrap_argument, admin_of, guarded, run_async
from minibroker.client.cli.reassign_plan import (
    ConfigChange,
    PartitionState,
    ReassignInputError,
    check_against_cluster,
    clear_throttle_changes,
    generate_output,
    list_lines,
    parse_broker_list,
    parse_reassignment,
    parse_throttle,
    parse_topics_to_move,
    partitions_text,
    rollback_output,
    throttle_changes,
    throttle_plan,
)
from minibroker.client.errors import MiniBrokerError
from minibroker.client.types import TopicPartition
from minibroker.metadata.placement import BrokerSlot


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "reassign-partitions",
        help="move partition replicas between brokers (generate, execute, verify, cancel, list)",
        description="Move partition replicas between brokers (kafka-reassign-partitions.sh). "
        'JSON: {"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,2,3]}]}',
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--generate", action="store_true", help="propose a reassignment")
    action.add_argument("--execute", action="store_true", help="start a reassignment")
    action.add_argument("--verify", action="store_true", help="report (and finish) a reassignment")
    action.add_argument("--cancel", action="store_true", help="cancel a reassignment")
    action.add_argument("--list", action="store_true", help="reassignments in progress")
    parser.add_argument("--topics-to-move-json-file", metavar="FILE", default=None)
    parser.add_argument("--broker-list", metavar="1,2,4", default=None)
    parser.add_argument("--reassignment-json-file", metavar="FILE", default=None)
    parser.add_argument(
        "--throttle", metavar="BYTES", default=None, help="bytes/s for the replicas being moved"
    )
    parser.add_argument(
        "--preserve-throttles",
        action="store_true",
        help="--verify/--cancel: leave the throttle configs in place",
    )
    parser.add_argument(
        "--disable-rack-aware", action="store_true", help="--generate: ignore broker racks"
    )
    add_bootstrap_argument(parser)
    parser.set_defaults(func=guarded(_run))


def check_options(args: argparse.Namespace) -> None:
    """Which options each action needs or refuses (ValueError: exit 1, nothing done)."""
    if args.generate:
        if not args.topics_to_move_json_file or not args.broker_list:
            raise ReassignInputError(
                "--generate needs --topics-to-move-json-file and --broker-list"
            )
    elif (args.execute or args.verify or args.cancel) and not args.reassignment_json_file:
        raise ReassignInputError("this action needs --reassignment-json-file")
    if args.throttle is not None and not args.execute:
        raise ReassignInputError("--throttle only goes with --execute")


def _read(path: str) -> str:
    try:
        return pathlib.Path(path).read_text()
    except OSError as err:
        raise ReassignInputError(f"cannot read {path}: {err.strerror or err}") from None


def _run(args: argparse.Namespace) -> int:
    check_options(args)
    if args.generate:
        return _generate(args)
    if args.execute:
        return _execute(args)
    if args.verify:
        return _verify(args)
    if args.cancel:
        return _cancel(args)
    return _list(args)


# -- cluster reads ----------------------------------------------------------------------------


def original_replicas(p: Any) -> tuple[int, ...]:
    """A partition's replicas before any reassignment in progress (Kafka's rollback)."""
    adding = tuple(p.adding_replicas)
    return tuple(r for r in p.replicas if r not in adding)


def current_assignment(topics: Iterable[Any]) -> dict[TopicPartition, tuple[int, ...]]:
    return {
        TopicPartition(t.name, p.partition): original_replicas(p)
        for t in topics
        for p in t.partitions
    }


def partition_records(topics: Iterable[Any]) -> list[Any]:
    """PartitionRecords for the planner, the topic name standing in for the topic id."""
    from minibroker.metadata.records import PartitionRecord

    return [
        PartitionRecord(
            topic_id=t.name,
            partition=p.partition,
            replicas=tuple(p.replicas),
            isr=tuple(p.isr),
            leader=p.leader,
            leader_epoch=p.leader_epoch,
            partition_epoch=p.partition_epoch,
            adding_replicas=tuple(p.adding_replicas),
            removing_replicas=tuple(p.removing_replicas),
        )
        for t in topics
        for p in t.partitions
    ]


def plan_keys(
    plan: Mapping[tuple[str, int], Sequence[int]],
) -> dict[TopicPartition, tuple[int, ...]]:
    return {TopicPartition(topic, p): tuple(r) for (topic, p), r in plan.items()}


async def apply_config_changes(admin: Any, changes: Sequence[ConfigChange]) -> None:
    from minibroker.client.admin import AlterConfigOp, ConfigResource

    request = {
        ConfigResource(kind, name): [AlterConfigOp(key, op, value) for key, op, value in ops]
        for kind, name, ops in changes
        if ops
    }
    if request:
        await admin.incremental_alter_configs(request)


# -- actions ----------------------------------------------------------------------------------


def _generate(args: argparse.Namespace) -> int:
    from minibroker.metadata.assignment_plan import plan_generate

    names = parse_topics_to_move(_read(args.topics_to_move_json_file))
    broker_list = parse_broker_list(args.broker_list)

    async def main() -> tuple[Any, list[Any]]:
        async with admin_of(args) as admin:
            return await admin.describe_cluster(), await admin.describe_topics(names)

    cluster, topics = run_async(main())
    racks = {b.broker_id: b.rack for b in cluster.brokers}
    unknown = [b for b in broker_list if b not in racks]
    if unknown:
        raise ReassignInputError(
            f"--broker-list: broker(s) {','.join(map(str, unknown))} are not registered"
        )
    slots = [BrokerSlot(b, "" if args.disable_rack_aware else racks[b]) for b in broker_list]
    proposed = plan_keys(plan_generate(partition_records(topics), slots))
    for line in generate_output(current_assignment(topics), proposed):
        print(line)
    return 0


async def _describe_for(admin: Any, tps: Iterable[TopicPartition]) -> list[Any]:
    names = sorted({tp.topic for tp in tps})
    return list(await admin.describe_topics(names))


def _execute(args: argparse.Namespace) -> int:
    targets = parse_reassignment(_read(args.reassignment_json_file))
    rate = parse_throttle(args.throttle)
    return execute(args, targets, rate)


def execute(
    args: argparse.Namespace, targets: Mapping[TopicPartition, Sequence[int]], rate: int | None
) -> int:
    """Start `targets` (shared with `brokers rebalance --execute`)."""

    async def main() -> int:
        async with admin_of(args) as admin:
            cluster = await admin.describe_cluster()
            topics = await _describe_for(admin, targets)
            check_against_cluster(
                targets,
                {t.name: len(t.partitions) for t in topics},
                [b.broker_id for b in cluster.brokers],
            )
            current = current_assignment(topics)
            for line in rollback_output({tp: current[tp] for tp in targets}):
                print(line)
            if rate is not None:
                plan = throttle_plan(current, targets)
                await apply_config_changes(admin, throttle_changes(plan, rate))
                print(
                    "Warning: You must run --verify periodically, until the reassignment "
                    "completes, to ensure the throttle is removed."
                )
                print(f"The inter-broker throttle limit was set to {rate} B/s")
            results = await admin.alter_partition_reassignments(dict(targets))
            return report_started(results)

    return run_async(main())


def report_started(results: Mapping[TopicPartition, MiniBrokerError | None]) -> int:
    started = [tp for tp, err in results.items() if err is None]
    failed = sorted((tp, err) for tp, err in results.items() if err is not None)
    if started:
        plural = "" if len(started) == 1 else "s"
        print(f"Successfully started partition reassignment{plural} for {partitions_text(started)}")
    if failed:
        print("Error reassigning partition(s):", file=sys.stderr)
        for tp, err in failed:
            print(f"{tp}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


def _verify(args: argparse.Namespace) -> int:
    from minibroker.client.cli.reassign_plan import verify_lines

    targets = parse_reassignment(_read(args.reassignment_json_file))

    async def main() -> int:
        async with admin_of(args) as admin:
            topics = await _describe_for(admin, targets)
            ongoing = await admin.list_partition_reassignments(list(targets))
            states = {
                TopicPartition(t.name, p.partition): PartitionState(
                    tuple(p.replicas), TopicPartition(t.name, p.partition) in ongoing
                )
                for t in topics
                for p in t.partitions
            }
            lines, done = verify_lines(targets, states)
            for line in lines:
                print(line)
            if done and not args.preserve_throttles:
                await _clear_throttles(admin, {tp.topic for tp in targets})
            return 0

    return run_async(main())


async def _clear_throttles(admin: Any, topics: set[str]) -> None:
    cluster = await admin.describe_cluster()
    brokers = sorted(b.broker_id for b in cluster.brokers)
    await apply_config_changes(admin, clear_throttle_changes(brokers, topics))
    print(f"Clearing broker-level throttles on brokers {','.join(map(str, brokers))}")
    print(f"Clearing topic-level throttles on topic(s) {','.join(sorted(topics))}")


def _cancel(args: argparse.Namespace) -> int:
    targets = parse_reassignment(_read(args.reassignment_json_file))

    async def main() -> int:
        async with admin_of(args) as admin:
            ongoing = await admin.list_partition_reassignments(list(targets))
            active = sorted(tp for tp in targets if tp in ongoing)
            status = 0
            if not active:
                print("None of the specified partition reassignments are active.")
            else:
                results = await admin.alter_partition_reassignments({tp: None for tp in active})
                done = [tp for tp, err in results.items() if err is None]
                if done:
                    print(
                        "Successfully cancelled partition reassignment(s) for: "
                        f"{partitions_text(done)}"
                    )
                for tp, err in sorted(results.items()):
                    if err is not None:
                        print(
                            f"Error cancelling {tp}: {type(err).__name__}: {err}", file=sys.stderr
                        )
                        status = 1
            if not args.preserve_throttles:
                await _clear_throttles(admin, {tp.topic for tp in targets})
            return status

    return run_async(main())


def _list(args: argparse.Namespace) -> int:
    async def main() -> Any:
        async with admin_of(args) as admin:
            return await admin.list_partition_reassignments()

    for line in list_lines(run_async(main())):
        print(line)
    return 0


__all__ = [
    "BrokerSlot",
    "check_options",
    "current_assignment",
    "execute",
    "original_replicas",
    "partition_records",
    "plan_keys",
    "register",
    "report_started",
]
