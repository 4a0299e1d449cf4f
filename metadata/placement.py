"""Replica placement for new topics: Kafka's rack-aware round robin (AdminUtils /
StripedReplicaPlacer in spirit).

Pure. Shared by the controller (topic and partition creation) and the reassignment planner
(`assignment_plan.py`), so it lives in metadata/, which knows neither. Brokers are ordered so
that racks alternate; partition p's first replica (its preferred leader) is broker
`(start + p) % n` of that order, so preferred leaders spread evenly (3 brokers, 6 partitions: 2
each). Followers are taken at a shift that changes every n partitions, skipping
brokers whose rack already holds a replica of the partition while some rack has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BrokerSlot:
    broker_id: int
    rack: str  # "" when unset


class PlacementError(ValueError):
    """The assignment is impossible (replication factor above the broker count)."""


def rack_alternated(brokers: Sequence[BrokerSlot]) -> list[int]:
    """Broker ids interleaved by rack: r1b1, r2b1, r3b1, r1b2, ... (Kafka's
    getRackAlternatedBrokerList); plain id order when no rack is set."""
    by_rack: dict[str, list[int]] = {}
    for b in sorted(brokers, key=lambda b: b.broker_id):
        by_rack.setdefault(b.rack, []).append(b.broker_id)
    racks = sorted(by_rack)
    out: list[int] = []
    depth = max((len(ids) for ids in by_rack.values()), default=0)
    for i in range(depth):
        for rack in racks:
            if i < len(by_rack[rack]):
                out.append(by_rack[rack][i])
    return out


def place_replicas(
    brokers: Sequence[BrokerSlot],
    num_partitions: int,
    replication_factor: int,
    start_index: int = 0,
) -> list[tuple[int, ...]]:
    """One replica tuple per partition; `start_index` rotates where the first partition's
    leader lands so successive topics do not all start on the same broker."""
    if replication_factor < 1:
        raise PlacementError("replication factor must be at least 1")
    if replication_factor > len(brokers):
        raise PlacementError(
            f"replication factor {replication_factor} is larger than the {len(brokers)} "
            "available broker(s)"
        )
    order = rack_alternated(brokers)
    rack_of = {b.broker_id: b.rack for b in brokers}
    num_racks = len(set(rack_of.values()))
    n = len(order)
    start = start_index % n
    shift = start_index % n
    out: list[tuple[int, ...]] = []
    for p in range(num_partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (start + p) % n
        replicas = [order[first]]
        racks_used = {rack_of[order[first]]}
        step = 1 + shift % (n - 1) if n > 1 else 0
        k = first
        while len(replicas) < replication_factor:
            k = (k + step) % n
            step = 1 if step == 0 else step
            candidate = order[k]
            if candidate in replicas:
                # Walk forward one by one once the stride has cycled.
                step = 1
                continue
            if len(racks_used) < num_racks and rack_of[candidate] in racks_used:
                step = 1
                continue
            replicas.append(candidate)
            racks_used.add(rack_of[candidate])
        out.append(tuple(replicas))
    return out


__all__ = ["BrokerSlot", "PlacementError", "place_replicas", "rack_alternated"]
