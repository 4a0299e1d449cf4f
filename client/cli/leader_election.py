"""`minibroker leader-election`: Kafka's kafka-leader-election.sh.

Does network I/O through AsyncAdmin (ElectLeaders on the controller); writes Kafka's output lines
to stdout, failures to stderr:

    Successfully completed leader election (PREFERRED) for partitions foo-0, foo-1
    Valid replica already elected for partitions foo-2
    Error completing leader election (PREFERRED) for partition: foo-3: <error>

and exits 1 with "N replica(s) could not be elected" when any partition failed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from minibroker.client.cli.common import (
    add_bootstrap_argument,
    admin_of,
    guarded,
    run_async,
)
from minibroker.client.errors import ElectionNotNeededError, MiniBrokerError
from minibroker.client.types import TopicPartition


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "leader-election",
        help="run a preferred or unclean leader election",
        description="Elect leaders (kafka-leader-election.sh).",
    )
    parser.add_argument(
        "--election-type", required=True, type=str.lower, choices=["preferred", "unclean"]
    )
    parser.add_argument("--topic", default=None)
    parser.add_argument("--partition", type=int, default=None)
    parser.add_argument(
        "--all-topic-partitions", action="store_true", help="every partition of every topic"
    )
    add_bootstrap_argument(parser)
    parser.set_defaults(func=guarded(_elect))


def format_results(
    election_type: str, results: Mapping[TopicPartition, MiniBrokerError | None]
) -> tuple[list[str], list[str]]:
    """(stdout lines, stderr lines) in Kafka's wording."""
    kind = election_type.upper()
    ordered = sorted(results.items())
    done = [str(tp) for tp, err in ordered if err is None]
    not_needed = [str(tp) for tp, err in ordered if isinstance(err, ElectionNotNeededError)]
    failed = [
        (tp, err)
        for tp, err in ordered
        if err is not None and not isinstance(err, ElectionNotNeededError)
    ]
    out: list[str] = []
    if done:
        out.append(
            f"Successfully completed leader election ({kind}) for partitions {', '.join(done)}"
        )
    if not_needed:
        out.append(f"Valid replica already elected for partitions {', '.join(not_needed)}")
    errors = [
        f"Error completing leader election ({kind}) for partition: {tp}: "
        f"{type(err).__name__}: {err}"
        for tp, err in failed
    ]
    if failed:
        errors.append(f"{len(failed)} replica(s) could not be elected")
    return out, errors


def _elect(args: argparse.Namespace) -> int:

    if args.all_topic_partitions:
        if args.topic is not None or args.partition is not None:
            raise ValueError("use either --all-topic-partitions or --topic with --partition")
        partitions = None
    else:
        if args.topic is None or args.partition is None:
            raise ValueError("give --topic and --partition, or --all-topic-partitions")
        partitions = [TopicPartition(args.topic, args.partition)]

    async def main() -> dict[TopicPartition, MiniBrokerError | None]:
        async with admin_of(args) as admin:
            return await admin.elect_leaders(args.election_type, partitions)

    out, errors = format_results(args.election_type, run_async(main()))
    for line in out:
        print(line)
    for line in errors:
        print(line, file=sys.stderr)
    return 1 if errors else 0
