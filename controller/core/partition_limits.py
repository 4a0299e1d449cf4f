"""Partition limits: how many partitions a cluster, and how many replicas a broker, may have.

Pure. KIP-578's names: `max.partitions` counts the partitions of the cluster (each once, whatever
its replication factor: the controller and every broker hold each in memory), and
`max.broker.partitions` counts the replicas a broker hosts, leaders and followers (each costs the
broker open files, memory and a share of every fetch and checkpoint). A request that would pass
either is refused with POLICY_VIOLATION before anything is written; the counts are checked
arithmetically before a placement is built, so an absurd partition count is answered without
allocating anything in proportion to it. Brokers already at their limit take no new replicas.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from minibroker.controller.core.placement import BrokerSlot

# Each partition costs the controller ~1 KB held (~2 KB while it is being created), measured on
# a controller process with 50,000 partitions; every broker keeps the same metadata image.
DEFAULT_MAX_PARTITIONS = 10_000
# Each hosted replica costs a broker at least one open file (its active segment) and ~6 KB, and
# is named in every follower fetch and HW checkpoint; 1000 replicas and 1000 connections fit a
# 4096-file ulimit -n with room to spare.
DEFAULT_MAX_BROKER_PARTITIONS = 1000


@dataclass(frozen=True, slots=True)
class PartitionLimits:
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    max_broker_partitions: int = DEFAULT_MAX_BROKER_PARTITIONS


def hosted_replicas(replica_lists: Iterable[Sequence[int]]) -> Counter[int]:
    """Replicas per broker over the cluster's partitions (their replica lists)."""
    hosted: Counter[int] = Counter()
    for replicas in replica_lists:
        hosted.update(replicas)
    return hosted


def cluster_problem(existing: int, new: int, limits: PartitionLimits) -> str | None:
    """Why `new` more partitions do not fit in the cluster, or None."""
    if existing + new <= limits.max_partitions:
        return None
    return (
        f"{new} new partition(s) would make {existing + new} in the cluster, over "
        f"max.partitions={limits.max_partitions} ({existing} exist); delete topics or raise "
        "max.partitions on the controller"
    )


def brokers_with_room(
    brokers: Sequence[BrokerSlot], hosted: Mapping[int, int], limits: PartitionLimits
) -> list[BrokerSlot]:
    return [b for b in brokers if hosted.get(b.broker_id, 0) < limits.max_broker_partitions]


def replica_room_problem(
    num_partitions: int,
    replication_factor: int,
    brokers: Sequence[BrokerSlot],
    with_room: Sequence[BrokerSlot],
    hosted: Mapping[int, int],
    limits: PartitionLimits,
) -> str | None:
    """Why the replicas cannot fit under max.broker.partitions whatever the placement, or None.

    Arithmetic only: `num_partitions * replication_factor` against the room left on the brokers
    that have any; a placement is built (and checked with `assignment_problem`) only after this.
    """
    limit = limits.max_broker_partitions
    if replication_factor > len(with_room):
        full = sorted(b.broker_id for b in brokers if b not in with_room)
        return (
            f"replication factor {replication_factor} needs {replication_factor} brokers with "
            f"room, but only {len(with_room)} of the {len(brokers)} available have fewer than "
            f"max.broker.partitions={limit} replicas (full: {full})"
        )
    room = sum(limit - hosted.get(b.broker_id, 0) for b in with_room)
    needed = num_partitions * replication_factor
    if needed > room:
        return (
            f"{num_partitions} partition(s) x replication factor {replication_factor} = "
            f"{needed} replicas, but the available brokers have room for {room} more under "
            f"max.broker.partitions={limit}"
        )
    return None


def assignment_problem(
    assignment: Sequence[Sequence[int]], hosted: Mapping[int, int], limits: PartitionLimits
) -> str | None:
    """Why a placement would put a broker over max.broker.partitions, or None."""
    added = hosted_replicas(assignment)
    over = sorted(
        b for b, n in added.items() if hosted.get(b, 0) + n > limits.max_broker_partitions
    )
    if not over:
        return None
    worst = over[0]
    return (
        f"the placement would give broker {worst} {hosted.get(worst, 0) + added[worst]} "
        f"replicas, over max.broker.partitions={limits.max_broker_partitions} (brokers over: "
        f"{over}); use fewer partitions or add brokers"
    )


__all__ = [
    "DEFAULT_MAX_BROKER_PARTITIONS",
    "DEFAULT_MAX_PARTITIONS",
    "PartitionLimits",
    "assignment_problem",
    "brokers_with_room",
    "cluster_problem",
    "hosted_replicas",
    "replica_room_problem",
]
