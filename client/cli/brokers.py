"""`minibroker brokers list|unregister|decommission|rebalance`: the registered brokers, Kafka's
`kafka-cluster.sh unregister --id N`, graceful decommissioning and rebalancing.

Does network I/O through AsyncAdmin (DescribeCluster, UnregisterBroker, DecommissionBroker on the
controller; Metadata and reassignments for `rebalance` and `decommission --wait`); writes to
stdout. `list` prints one line per registered broker, fields separated by tabs as in
`topics describe`:

    Broker: 1  Address: 127.0.0.1:9092  Rack: rack-a  State: active  Replicas: 4  Leaders: 2 ...

then BrokerEpoch and LastHeartbeatMsAgo (-1 when the controller has not heard from the broker
since it started). State is active, fenced, shutting-down, decommissioning (marked, still hosts
replicas) or decommissioned (marked, hosts nothing: safe to stop). `--json` prints a JSON list of
the same fields. `unregister N` removes the registration of a broker that is gone for good and
prints Kafka's "Broker N is no longer registered."; the controller refuses a broker that is alive.

`decommission N` marks N and has the controller move its leaderships, then its replicas, to the
other brokers ("Decommissioning broker N: M partition(s) moving."); `--wait` prints a progress
line whenever it changes (replicas and leaderships left on N, reassignments running) until N
holds nothing; `--cancel` unmarks N (moves already started go on). `rebalance` plans the fewest
moves that even out replicas and preferred leaders across the active brokers
(`metadata.assignment_plan.plan_rebalance`) and prints it in kafka-reassign-partitions' JSON;
`--execute [--throttle B]` starts it as `reassign-partitions --execute` would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping
from typing import Any

from minibroker.client.cli.common import (
    add_bootstrap_argument,
    admin_of,
    guarded,
    help_when_no_action,
    run_async,
)
from minibroker.client.types import TopicPartition

DECOMMISSION_POLL_S = 1.0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "brokers",
        help="list registered brokers, unregister one that is gone for good",
        description="List the brokers registered with the controller, or unregister a broker "
        "that is gone for good (kafka-cluster.sh unregister).",
    )
    add_bootstrap_argument(parser)
    brokers_sub = parser.add_subparsers(dest="brokers_command", metavar="ACTION")

    listing = brokers_sub.add_parser("list", help="every registered broker and its state")
    listing.add_argument("--json", action="store_true", help="print a JSON list of brokers")
    add_bootstrap_argument(listing)
    listing.set_defaults(func=guarded(_list))

    unregister = brokers_sub.add_parser(
        "unregister",
        help="remove a dead broker's registration",
        description="Remove the registration of a broker that is gone for good. Its partitions "
        "keep naming it as an offline replica; the controller refuses a broker that is alive "
        "(unfenced or heartbeating).",
    )
    unregister.add_argument("id", type=int, metavar="ID", help="the broker's id (node.id)")
    add_bootstrap_argument(unregister)
    unregister.set_defaults(func=guarded(_unregister))

    decommission = brokers_sub.add_parser(
        "decommission",
        help="move every replica off a broker so it can be stopped",
        description="Mark a broker for decommissioning: the controller moves its leaderships "
        "first, then every replica, to the other brokers (racks honoured, leaders balanced).",
    )
    decommission.add_argument("id", type=int, metavar="ID", help="the broker's id (node.id)")
    decommission.add_argument(
        "--cancel", action="store_true", help="unmark the broker (moves already started go on)"
    )
    decommission.add_argument(
        "--wait", action="store_true", help="show progress until the broker holds nothing"
    )
    decommission.add_argument(
        "--timeout-s", type=float, default=None, help="--wait: give up after this long (exit 1)"
    )
    add_bootstrap_argument(decommission)
    decommission.set_defaults(func=guarded(_decommission))

    rebalance = brokers_sub.add_parser(
        "rebalance",
        help="even out replicas and leaders across the brokers",
        description="Plan the fewest replica moves that even out replica and preferred-leader "
        "counts across the active brokers; print it (kafka-reassign-partitions JSON), and "
        "start it with --execute.",
    )
    rebalance.add_argument("--execute", action="store_true", help="start the moves")
    rebalance.add_argument(
        "--throttle", metavar="BYTES", default=None, help="bytes/s for the replicas being moved"
    )
    add_bootstrap_argument(rebalance)
    rebalance.set_defaults(func=guarded(_rebalance))

    help_when_no_action(parser)


def broker_state(broker: Any) -> str:
    """active, fenced, shutting-down, decommissioning or decommissioned."""
    if broker.decommissioning:
        if broker.replica_count == 0:
            return "decommissioned"
        return "fenced" if broker.fenced else "decommissioning"
    if broker.in_controlled_shutdown:
        return "shutting-down"
    return "fenced" if broker.fenced else "active"


def describe_json(brokers: Any) -> list[dict[str, Any]]:
    return [
        {
            "broker_id": b.broker_id,
            "host": b.host,
            "port": b.port,
            "rack": b.rack,
            "state": broker_state(b),
            "replicas": b.replica_count,
            "leaders": b.leader_count,
            "broker_epoch": b.broker_epoch,
            "last_heartbeat_ms_ago": b.last_heartbeat_ms_ago,
        }
        for b in brokers
    ]


def format_brokers(brokers: Any) -> list[str]:
    return [
        f"Broker: {b.broker_id}\tAddress: {b.host}:{b.port}\tRack: {b.rack}\t"
        f"State: {broker_state(b)}\tReplicas: {b.replica_count}\t"
        f"Leaders: {b.leader_count}\tBrokerEpoch: {b.broker_epoch}\t"
        f"LastHeartbeatMsAgo: {b.last_heartbeat_ms_ago}"
        for b in brokers
    ]


def _list(args: argparse.Namespace) -> int:
    async def main() -> Any:
        async with admin_of(args) as admin:
            return await admin.describe_cluster()

    cluster = run_async(main())
    if args.json:
        json.dump(describe_json(cluster.brokers), sys.stdout)
        sys.stdout.write("\n")
    else:
        for line in format_brokers(cluster.brokers):
            print(line)
    return 0


def _unregister(args: argparse.Namespace) -> int:
    async def main() -> None:
        async with admin_of(args) as admin:
            await admin.unregister_broker(args.id)

    run_async(main())
    print(f"Broker {args.id} is no longer registered.")
    return 0


def _find(cluster: Any, broker_id: int) -> Any:
    return next((b for b in cluster.brokers if b.broker_id == broker_id), None)


def decommission_progress(
    broker_id: int, broker: Any, reassignments: Mapping[TopicPartition, Any]
) -> tuple[str, bool]:
    """(the progress line, whether `broker_id` holds nothing any more)."""
    if broker is None:
        return f"Broker {broker_id} is no longer registered.", True
    replicas = broker.replica_count
    leaders = broker.leader_count
    moving = sum(
        1
        for r in reassignments.values()
        if broker_id in r.removing_replicas or broker_id in r.adding_replicas
    )
    done = replicas == 0 and leaders == 0
    if done:
        return (
            f"Broker {broker_id} holds no replicas: it can be stopped "
            f"({len(reassignments)} reassignment(s) still running elsewhere).",
            True,
        )
    return (
        f"Broker {broker_id}: {replicas} replica(s) and {leaders} leadership(s) left, "
        f"{moving} of {len(reassignments)} running reassignment(s) moving off it",
        False,
    )


def _decommission(args: argparse.Namespace) -> int:
    async def main() -> int:
        async with admin_of(args) as admin:
            moving = await admin.decommission_broker(args.id, cancel=args.cancel)
            if args.cancel:
                print(f"Broker {args.id} is no longer being decommissioned.")
                return 0
            print(f"Decommissioning broker {args.id}: {moving} partition(s) moving.")
            if not args.wait:
                return 0
            deadline = None if args.timeout_s is None else time.monotonic() + args.timeout_s
            last = ""
            while True:
                cluster = await admin.describe_cluster()
                ongoing = await admin.list_partition_reassignments()
                line, done = decommission_progress(args.id, _find(cluster, args.id), ongoing)
                if line != last:
                    print(line, flush=True)
                    last = line
                if done:
                    return 0
                if deadline is not None and time.monotonic() >= deadline:
                    print(f"error: broker {args.id} still holds replicas", file=sys.stderr)
                    return 1
                await asyncio.sleep(DECOMMISSION_POLL_S)

    return run_async(main())


def rebalance_brokers(cluster: Any) -> list[Any]:
    """The brokers a rebalance may place replicas on: active, not decommissioning."""
    from minibroker.client.cli.reassign import BrokerSlot

    return [
        BrokerSlot(b.broker_id, b.rack)
        for b in sorted(cluster.brokers, key=lambda b: b.broker_id)
        if not b.fenced and not b.decommissioning
    ]


def _rebalance(args: argparse.Namespace) -> int:
    from minibroker.client.cli import reassign
    from minibroker.client.cli.reassign_plan import generate_output, parse_throttle

    rate = parse_throttle(args.throttle)
    if rate is not None and not args.execute:
        raise ValueError("--throttle only goes with --execute")
    from minibroker.metadata.assignment_plan import plan_rebalance

    async def main() -> tuple[Any, list[Any]]:
        async with admin_of(args) as admin:
            return await admin.describe_cluster(), list(await admin.describe_topics(None))

    cluster, topics = run_async(main())
    records = reassign.partition_records(topics)
    proposed = reassign.plan_keys(plan_rebalance(records, rebalance_brokers(cluster)))
    current = reassign.current_assignment(topics)
    moves = {tp: r for tp, r in proposed.items() if tuple(current.get(tp, ())) != tuple(r)}
    if not moves:
        print("The replicas are balanced: nothing to move.")
        return 0
    for line in generate_output({tp: current[tp] for tp in moves}, moves):
        print(line)
    if not args.execute:
        print("Run with --execute to start these moves.")
        return 0
    return reassign.execute(args, moves, rate)
