"""`minibroker brokers list|unregister`: the registered brokers, and Kafka's
`kafka-cluster.sh unregister --id N`.

Does network I/O through AsyncAdmin (DescribeCluster and UnregisterBroker on the controller);
writes to stdout. `list` prints one line per registered broker, fields separated by tabs as in
`topics describe`:

    Broker: 1  Address: 127.0.0.1:9092  Rack: rack-a  State: alive  BrokerEpoch: 12  ...

then LastHeartbeatMsAgo (-1 when the controller has not heard from the broker since it started).
State is alive, fenced or shutting-down. `--json` prints a JSON list of the same fields.
`unregister N` removes the registration of a broker that is gone for good and prints Kafka's
"Broker N is no longer registered."; the controller refuses a broker that is alive.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from minibroker.client.cli.common import (
    add_bootstrap_argument,
    admin_of,
    guarded,
    help_when_no_action,
    run_async,
)


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

    help_when_no_action(parser)


def broker_state(broker: Any) -> str:
    if broker.in_controlled_shutdown:
        return "shutting-down"
    return "fenced" if broker.fenced else "alive"


def describe_json(brokers: Any) -> list[dict[str, Any]]:
    return [
        {
            "broker_id": b.broker_id,
            "host": b.host,
            "port": b.port,
            "rack": b.rack,
            "state": broker_state(b),
            "broker_epoch": b.broker_epoch,
            "last_heartbeat_ms_ago": b.last_heartbeat_ms_ago,
        }
        for b in brokers
    ]


def format_brokers(brokers: Any) -> list[str]:
    return [
        f"Broker: {b.broker_id}\tAddress: {b.host}:{b.port}\tRack: {b.rack}\t"
        f"State: {broker_state(b)}\tBrokerEpoch: {b.broker_epoch}\t"
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
