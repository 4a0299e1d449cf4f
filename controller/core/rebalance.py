"""Automatic preferred-leader rebalancing.

Pure. minibroker follows the ZooKeeper-era controller's per-broker rule (Kafka's
KafkaController.checkAndTriggerAutoLeaderRebalance) because it offers
`leader.imbalance.per.broker.percentage`, which only that path reads (docs/protocol.md §19; KRaft
instead elects the preferred leader of every imbalanced partition): for each broker B, the ratio
of partitions whose preferred replica is B but whose leader is not B, over all partitions whose
preferred replica is B. When that ratio exceeds the percentage, every such partition whose
preferred replica is acceptable and in the ISR gets a preferred election.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from minibroker.metadata.records import PartitionRecord


def imbalance_ratios(partitions: Iterable[PartitionRecord]) -> dict[int, float]:
    """Per preferred broker: share of its preferred partitions it does not lead."""
    total: dict[int, int] = {}
    off: dict[int, int] = {}
    for p in partitions:
        preferred = p.preferred_leader
        total[preferred] = total.get(preferred, 0) + 1
        if p.leader != preferred:
            off[preferred] = off.get(preferred, 0) + 1
    return {b: off.get(b, 0) / n for b, n in total.items()}


def partitions_to_rebalance(
    partitions: Iterable[PartitionRecord],
    acceptable: Callable[[int], bool],
    imbalance_percentage: int,
) -> list[PartitionRecord]:
    """Partitions that should get a preferred election now, in the given order."""
    parts = list(partitions)
    ratios = imbalance_ratios(parts)
    over = {b for b, ratio in ratios.items() if ratio * 100 > imbalance_percentage}
    return [
        p
        for p in parts
        if p.preferred_leader in over
        and p.leader != p.preferred_leader
        and p.preferred_leader in p.isr
        and acceptable(p.preferred_leader)
    ]


__all__ = ["imbalance_ratios", "partitions_to_rebalance"]
