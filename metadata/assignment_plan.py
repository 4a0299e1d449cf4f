"""Reassignment planning: where replicas should go. Pure, shared by the controller
(decommissioning, rebuilding lost replicas) and the tools (`brokers rebalance`,
`reassign-partitions --generate`).

Every plan is a dict `(topic_id, partition) -> target replica list` holding only the partitions
whose list changes (`plan_generate` excepted: it answers for every partition given, like
kafka-reassign-partitions --generate). Loads are counted on each partition's target
(`PartitionRecord.target_replicas`: where a running reassignment is going); a partition that is
being reassigned is never planned again.

Rules, in order of weight:
- racks: a move never lowers the number of distinct racks a partition spans; a replacement goes
  to a rack the partition does not use yet when one can take it;
- load: a replacement goes to the candidate hosting the fewest replicas (then the lowest id);
- leaders: when the preferred leader (replicas[0]) is replaced, the replica with the fewest
  preferred leaderships leads the new list;
- minimal moves (`plan_rebalance`): one replica at a time from the most loaded broker to the
  least loaded one, only while they differ by more than one, then preferred leaders balanced by
  reordering replica lists alone (no data moves).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence

from minibroker.metadata.placement import BrokerSlot, PlacementError, place_replicas
from minibroker.metadata.records import PartitionRecord

Key = tuple[str, int]
Plan = dict[Key, tuple[int, ...]]


def _key(p: PartitionRecord) -> Key:
    return (p.topic_id, p.partition)


def _sorted(partitions: Iterable[PartitionRecord]) -> list[PartitionRecord]:
    return sorted(partitions, key=_key)


def _loads(
    partitions: Iterable[PartitionRecord], brokers: Iterable[int]
) -> tuple[Counter[int], Counter[int]]:
    """(replicas per broker, preferred leaderships per broker) over the targets."""
    replicas: Counter[int] = Counter({b: 0 for b in brokers})
    preferred: Counter[int] = Counter({b: 0 for b in replicas})
    for p in partitions:
        target = p.target_replicas
        replicas.update(target)
        if target:
            preferred[target[0]] += 1
    return replicas, preferred


def plan_replacements(
    partitions: Sequence[PartitionRecord],
    brokers: Sequence[BrokerSlot],
    leaving: Collection[int],
) -> Plan:
    """Replace every replica on a `leaving` broker (decommissioning, or gone) by a broker of
    `brokers` that is not leaving: a rack the partition does not use yet when possible, then
    the fewest replicas. A partition that cannot keep its replication factor (no candidate left)
    is left out of the plan; so is one being reassigned already."""
    rack_of = {b.broker_id: b.rack for b in brokers}
    candidates = [b.broker_id for b in brokers if b.broker_id not in leaving]
    counts, preferred = _loads(partitions, candidates)
    plan: Plan = {}
    for p in _sorted(partitions):
        if p.is_reassigning or not any(b in leaving for b in p.replicas):
            continue
        new = list(p.replicas)
        ok = True
        for i, b in enumerate(p.replicas):
            if b not in leaving:
                continue
            staying = [r for r in new if r not in leaving]
            used_racks = {rack_of.get(r, "") for r in staying}
            options = [c for c in candidates if c not in new]
            if not options:
                ok = False
                break
            choice = min(options, key=lambda c: (rack_of[c] in used_racks, counts[c], c))
            new[i] = choice
        if not ok:
            continue
        if p.replicas[0] in leaving:
            # Leaders balanced: the member with the fewest preferred leaderships leads.
            leader = min(new, key=lambda c: (preferred[c], new.index(c)))
            new.remove(leader)
            new.insert(0, leader)
            preferred[leader] += 1
        for c in new:
            if c not in p.replicas:
                counts[c] += 1
        plan[_key(p)] = tuple(new)
    return plan


def plan_rebalance(partitions: Sequence[PartitionRecord], brokers: Sequence[BrokerSlot]) -> Plan:
    """The fewest moves that leave replica counts, and then preferred-leader counts, within one
    of each other across `brokers` (replicas on brokers not listed are moved onto listed ones
    first, as `plan_replacements` does). Racks never get fewer per partition."""
    listed = {b.broker_id for b in brokers}
    rack_of = {b.broker_id: b.rack for b in brokers}
    movable = [p for p in _sorted(partitions) if not p.is_reassigning]
    outside = {b for p in movable for b in p.replicas if b not in listed}
    plan = plan_replacements(partitions, brokers, outside) if outside else {}
    current: dict[Key, list[int]] = {_key(p): list(plan.get(_key(p), p.replicas)) for p in movable}
    fixed = [p.target_replicas for p in partitions if p.is_reassigning]
    counts: Counter[int] = Counter({b: 0 for b in listed})
    for replicas in [*current.values(), *fixed]:
        counts.update(b for b in replicas if b in listed)

    def racks(replicas: Sequence[int]) -> int:
        return len({rack_of.get(b, "") for b in replicas})

    # Replicas: most loaded -> least loaded, one at a time; followers before preferred leaders.
    while True:
        order = sorted(listed, key=lambda b: (counts[b], b))
        moved = False
        for hi in reversed(order):
            for lo in order:
                if counts[hi] - counts[lo] <= 1:
                    break
                spot = _movable_replica(current, hi, lo, racks)
                if spot is not None:
                    key, i = spot
                    current[key][i] = lo
                    counts[hi] -= 1
                    counts[lo] += 1
                    moved = True
                    break
            if moved:
                break
        if not moved:
            break
    # Preferred leaders: swap a replica list's order only (no data moves).
    preferred: Counter[int] = Counter({b: 0 for b in listed})
    for replicas in [*current.values(), *fixed]:
        if replicas and replicas[0] in listed:
            preferred[replicas[0]] += 1
    while True:  # each swap lowers the sum of squared counts: it ends
        order = sorted(listed, key=lambda b: (preferred[b], b))
        swapped = False
        for hi in reversed(order):
            for lo in order:
                if preferred[hi] - preferred[lo] <= 1:
                    break
                found = next(
                    (k for k, r in sorted(current.items()) if r[0] == hi and lo in r), None
                )
                if found is not None:
                    r = current[found]
                    i = r.index(lo)
                    r[0], r[i] = lo, hi
                    preferred[hi] -= 1
                    preferred[lo] += 1
                    swapped = True
                    break
            if swapped:
                break
        if not swapped:
            break
    originals = {_key(p): p.replicas for p in movable}
    return {k: tuple(r) for k, r in sorted(current.items()) if tuple(r) != originals[k]}


def _movable_replica(
    current: dict[Key, list[int]], hi: int, lo: int, racks: Callable[[Sequence[int]], int]
) -> tuple[Key, int] | None:
    """A replica on `hi` that may move to `lo` (the partition does not have `lo`, its rack count
    does not drop): a follower when there is one, else a preferred leader."""
    best: tuple[Key, int] | None = None
    for key in sorted(current):
        replicas = current[key]
        if hi not in replicas or lo in replicas:
            continue
        i = replicas.index(hi)
        after = [lo if b == hi else b for b in replicas]
        if racks(after) < racks(replicas):
            continue
        if i > 0:
            return key, i
        if best is None:
            best = (key, i)
    return best


def plan_generate(partitions: Sequence[PartitionRecord], broker_list: Sequence[BrokerSlot]) -> Plan:
    """A fresh rack-aware placement of the partitions' topics on `broker_list`, each topic
    keeping its replication factor (kafka-reassign-partitions --generate). Every partition is
    in the answer. Raises PlacementError when a topic's replication factor exceeds the list."""
    by_topic: dict[str, list[PartitionRecord]] = {}
    for p in _sorted(partitions):
        by_topic.setdefault(p.topic_id, []).append(p)
    plan: Plan = {}
    start = 0
    for _topic_id, parts in sorted(by_topic.items()):
        rf = max(len(p.target_replicas) for p in parts)
        count = max(p.partition for p in parts) + 1
        placement = place_replicas(broker_list, count, rf, start)
        for p in parts:
            plan[_key(p)] = placement[p.partition]
        start += count
    return plan


__all__ = ["PlacementError", "Plan", "plan_generate", "plan_rebalance", "plan_replacements"]
