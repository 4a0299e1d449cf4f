"""`minibroker topics create|list|delete|describe|alter`: Kafka's kafka-topics.sh.

Does network I/O through AsyncAdmin; writes to stdout. `describe` prints Kafka's layout (a topic
line, then one tab-separated line per partition) plus what minibroker can show live: the leader
epoch, offline replicas, the leader's high watermark and each replica's log end offset
(`?` when its broker did not answer). A compacted topic's partition also shows each replica's
log cleaner point (`CleanerPoints: 1=120,2=118`: offsets below it are clean; the log start
before a first cleaning) and dirty ratio (`DirtyRatios: 1=0.42,2=0.40`: dirty bytes over all
bytes below the active segment, what the cleaner weighs against min.cleanable.dirty.ratio).
A partition being reassigned also shows Kafka's
`Adding Replicas: 4,5` and `Removing Replicas: 1,2`, and `CatchingUp: 4=120,5=?`: how many
offsets each adding replica is behind the leader's LEO (`?`: unknown). `--json` prints one
JSON list of partitions: `{topic, partition, leader, leader_epoch, partition_epoch, replicas,
isr, offline_replicas, adding_replicas, removing_replicas, high_watermark,
log_end_offsets: {"<broker id>": leo or null}, cleaner_points and dirty_ratios (the same shape,
empty for a topic that is not compacted)}`.

`alter --topic T --partitions N [--replica-assignment 1:2,2:3,...]` grows a topic to N
partitions (CreatePartitions; Kafka's assignment lists every partition, the existing ones first,
and only the new ones are used).

With a controller quorum of more than one voter, the text output starts with one line naming
the quorum (`Controller quorum: leader 1001 (epoch 3), voters 1000,1001,1002, high watermark
N`), from QuorumService.DescribeQuorum on the controller the brokers' Metadata answer names (its
leader when that voter only follows); skipped silently when no controller answers.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import grpc

from minibroker.client.cli.common import (
    add_bootstrap_argument,
    admin_of,
    guarded,
    help_when_no_action,
    parse_config_pairs,
    run_async,
)
from minibroker.client.errors import MiniBrokerError, TopicAlreadyExistsError
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

QUORUM_TIMEOUT_S = 2.0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "topics",
        help="create, list, delete and describe topics",
        description="Create, list, delete and describe topics (kafka-topics.sh).",
    )
    add_bootstrap_argument(parser)
    topics_sub = parser.add_subparsers(dest="topics_command", metavar="ACTION")

    create = topics_sub.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=int, default=-1, help="number of partitions")
    create.add_argument("--replication-factor", type=int, default=-1, help="replicas per partition")
    create.add_argument(
        "--config", action="append", metavar="KEY=VALUE", help="a topic config (repeatable)"
    )
    create.add_argument(
        "--if-not-exists", action="store_true", help="succeed if the topic already exists"
    )
    add_bootstrap_argument(create)
    create.set_defaults(func=guarded(_create))

    listing = topics_sub.add_parser("list", help="list topic names")
    add_bootstrap_argument(listing)
    listing.set_defaults(func=guarded(_list))

    delete = topics_sub.add_parser("delete", help="delete a topic")
    delete.add_argument("name")
    add_bootstrap_argument(delete)
    delete.set_defaults(func=guarded(_delete))

    describe = topics_sub.add_parser(
        "describe",
        help="leader, epochs, replicas, ISR, HW and LEOs per partition (compacted topics: "
        "cleaner points and dirty ratios too)",
    )
    describe.add_argument("name", nargs="?", help="one topic (default: every topic)")
    describe.add_argument("--json", action="store_true", help="print a JSON list of partitions")
    add_bootstrap_argument(describe)
    describe.set_defaults(func=guarded(_describe))

    alter = topics_sub.add_parser("alter", help="add partitions to a topic")
    alter.add_argument("--topic", required=True)
    alter.add_argument("--partitions", type=int, required=True, help="the new partition count")
    alter.add_argument(
        "--replica-assignment",
        default=None,
        metavar="1:2,2:3,...",
        help="replicas of every partition (existing first), colon-separated brokers",
    )
    add_bootstrap_argument(alter)
    alter.set_defaults(func=guarded(_alter))

    help_when_no_action(parser)


def parse_replica_assignment(text: str) -> list[list[int]]:
    """Kafka's `--replica-assignment`: `"1:2,2:3"` -> [[1, 2], [2, 3]] (one entry a partition)."""
    out: list[list[int]] = []
    for i, item in enumerate(text.split(",")):
        try:
            brokers = [int(b) for b in item.strip().split(":")]
        except ValueError:
            raise ValueError(
                f"--replica-assignment: partition {i} ({item.strip()!r}) is not broker:broker:..."
            ) from None
        if len(set(brokers)) != len(brokers):
            raise ValueError(f"--replica-assignment: partition {i} names a broker twice")
        out.append(brokers)
    return out


def new_partition_assignments(
    assignment: list[list[int]], current_count: int, new_count: int
) -> list[list[int]]:
    """The entries for the partitions being added (Kafka lists every partition)."""
    if len(assignment) != new_count:
        raise ValueError(
            f"--replica-assignment lists {len(assignment)} partition(s), --partitions is "
            f"{new_count}"
        )
    return assignment[current_count:]


def _alter(args: argparse.Namespace) -> int:
    if args.partitions < 1:
        raise ValueError("--partitions must be at least 1")
    assignment = (
        None
        if args.replica_assignment is None
        else parse_replica_assignment(args.replica_assignment)
    )

    async def main() -> None:
        async with admin_of(args) as admin:
            extra = None
            if assignment is not None:
                (topic,) = await admin.describe_topics([args.topic])
                added = new_partition_assignments(
                    assignment, len(topic.partitions), args.partitions
                )
                extra = {args.topic: added}
            await admin.create_partitions({args.topic: args.partitions}, extra)

    run_async(main())
    print(f"Topic {args.topic} now has {args.partitions} partitions.")
    return 0


def _create(args: argparse.Namespace) -> int:
    configs = parse_config_pairs(args.config)

    async def main() -> int:
        async with admin_of(args) as admin:
            try:
                await admin.create_topic(
                    args.name, args.partitions, args.replication_factor, configs
                )
            except TopicAlreadyExistsError:
                if args.if_not_exists:
                    return 0
                raise
        print(f"Created topic {args.name}.")
        return 0

    return run_async(main())


def _list(args: argparse.Namespace) -> int:
    async def main() -> list[str]:
        async with admin_of(args) as admin:
            return await admin.list_topics()

    for name in run_async(main()):
        print(name)
    return 0


def _delete(args: argparse.Namespace) -> int:
    async def main() -> None:
        async with admin_of(args) as admin:
            await admin.delete_topics([args.name])

    run_async(main())
    print(f"Deleted topic {args.name}.")
    return 0


def _ids(nodes: Any) -> str:
    return ",".join(str(n) for n in nodes)


def format_describe(topics: list[Any]) -> list[str]:
    """Kafka's describe layout, tab-separated, with minibroker's live columns added."""
    lines: list[str] = []
    for t in topics:
        configs = ",".join(f"{k}={v}" for k, v in sorted(t.configs.items()))
        lines.append(
            f"Topic: {t.name}\tTopicId: {t.topic_id}\tPartitionCount: {len(t.partitions)}\t"
            f"ReplicationFactor: {t.replication_factor}\tConfigs: {configs}"
        )
        for p in t.partitions:
            leader = "none" if p.leader < 0 else str(p.leader)
            hw = "?" if p.high_watermark < 0 else str(p.high_watermark)
            leos = ",".join(
                f"{node}={'?' if leo is None else leo}" for node, leo in p.log_end_offsets.items()
            )
            line = (
                f"\tTopic: {p.topic}\tPartition: {p.partition}\tLeader: {leader}\t"
                f"LeaderEpoch: {p.leader_epoch}\tReplicas: {_ids(p.replicas)}\t"
                f"Isr: {_ids(p.isr)}"
            )
            adding = tuple(p.adding_replicas)
            removing = tuple(p.removing_replicas)
            if adding:
                line += f"\tAdding Replicas: {_ids(adding)}"
            if removing:
                line += f"\tRemoving Replicas: {_ids(removing)}"
            line += (
                f"\tOfflineReplicas: {_ids(p.offline_replicas)}\t"
                f"HighWatermark: {hw}\tLogEndOffsets: {leos}"
            )
            if adding:
                line += f"\tCatchingUp: {catching_up(p, adding)}"
            if p.cleaner_points:
                line += f"\tCleanerPoints: {_per_replica(p.cleaner_points, str)}"
                line += f"\tDirtyRatios: {_per_replica(p.dirty_ratios, lambda r: f'{r:.2f}')}"
            lines.append(line)
    return lines


def _per_replica(values: Any, show: Any) -> str:
    """`1=120,2=118,3=?`: one value per replica, `?` where its broker did not answer."""
    return ",".join(f"{node}={'?' if v is None else show(v)}" for node, v in values.items())


def catching_up(p: Any, adding: tuple[int, ...]) -> str:
    """`4=120,5=?`: offsets each adding replica is behind the leader's LEO (never negative)."""
    leader_leo = p.log_end_offsets.get(p.leader)
    parts = []
    for node in adding:
        leo = p.log_end_offsets.get(node)
        behind = "?" if leo is None or leader_leo is None else str(max(0, leader_leo - leo))
        parts.append(f"{node}={behind}")
    return ",".join(parts)


def describe_json(topics: list[Any]) -> list[dict[str, Any]]:
    return [
        {
            "topic": p.topic,
            "partition": p.partition,
            "leader": p.leader,
            "leader_epoch": p.leader_epoch,
            "partition_epoch": p.partition_epoch,
            "replicas": list(p.replicas),
            "isr": list(p.isr),
            "offline_replicas": list(p.offline_replicas),
            "adding_replicas": list(p.adding_replicas),
            "removing_replicas": list(p.removing_replicas),
            "high_watermark": p.high_watermark,
            "log_end_offsets": {str(node): leo for node, leo in p.log_end_offsets.items()},
            "cleaner_points": {str(node): v for node, v in p.cleaner_points.items()},
            "dirty_ratios": {str(node): v for node, v in p.dirty_ratios.items()},
        }
        for t in topics
        for p in t.partitions
    ]


def format_quorum_header(quorum: pb.DescribeQuorumResponse | None) -> str | None:
    """The quorum line above `describe`'s topics; None for no answer or a quorum of one."""
    if quorum is None or len(quorum.voters) <= 1:
        return None
    leader = str(quorum.leader_id) if quorum.leader_id >= 0 else "none"
    voters = _ids(sorted(v.voter_id for v in quorum.voters))
    return (
        f"Controller quorum: leader {leader} (epoch {quorum.leader_epoch}), voters {voters}, "
        f"high watermark {quorum.high_watermark}"
    )


async def _describe_quorum(admin: Any) -> pb.DescribeQuorumResponse | None:
    """DescribeQuorum of the controller the brokers named, or of the leader that one names
    (a follower's high watermark may lag); None when nobody answers."""
    address = admin.cluster.metadata.controller_address()
    answer: pb.DescribeQuorumResponse | None = None
    for _ in range(2):
        if not address:
            break
        try:
            stub = pb_grpc.QuorumServiceStub(admin.cluster.channel(address))
            answer = await stub.DescribeQuorum(pb.DescribeQuorumRequest(), timeout=QUORUM_TIMEOUT_S)
        except (grpc.RpcError, MiniBrokerError):
            break
        if answer.role == "leader" or answer.leader_address in ("", address):
            break
        address = answer.leader_address
    return answer


def _describe(args: argparse.Namespace) -> int:
    async def main() -> tuple[list[Any], pb.DescribeQuorumResponse | None]:
        async with admin_of(args) as admin:
            described = await admin.describe_topics(None if args.name is None else [args.name])
            quorum = None if args.json else await _describe_quorum(admin)
            return described, quorum

    topics, quorum = run_async(main())
    if args.json:
        json.dump(describe_json(topics), sys.stdout)
        sys.stdout.write("\n")
    else:
        header = format_quorum_header(quorum)
        if header is not None:
            print(header)
        for line in format_describe(topics):
            print(line)
    return 0
