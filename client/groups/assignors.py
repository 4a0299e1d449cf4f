"""Kafka's client-side partition assignors, run by the group's leader (pure).

- "range" (Kafka's RangeAssignor, without racks): per topic, the members subscribed to it in
  member order; with n partitions and c members, member i gets the contiguous range starting at
  (n // c) * i + min(i, n % c), of n // c partitions plus one for the first n % c members.
- "roundrobin" (Kafka's RoundRobinAssignor): every subscribed partition sorted by (topic,
  partition), dealt to the members in member order, skipping members not subscribed to the
  partition's topic.

Member order is Kafka's MemberInfo order: members with a group.instance.id first, by that id,
then the others by member id. Topics unknown to metadata (absent from `partitions_per_topic`)
are not assigned. Every member appears in the answer, with an empty list when it gets nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from minibroker.client.groups.protocol import Subscription
from minibroker.client.types import TopicPartition


class Assignor(Protocol):
    name: str

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]: ...


def member_order(subscriptions: Mapping[str, Subscription]) -> list[str]:
    """Kafka's MemberInfo order: static members (by instance id) first, then by member id."""

    def key(member_id: str) -> tuple[int, str, str]:
        instance = subscriptions[member_id].group_instance_id
        return (0, instance, member_id) if instance is not None else (1, "", member_id)

    return sorted(subscriptions, key=key)


class RangeAssignor:
    name = "range"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]:
        result: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
        ordered = member_order(subscriptions)
        topics = sorted({t for s in subscriptions.values() for t in s.topics})
        for topic in topics:
            count = partitions_per_topic.get(topic)
            if count is None:
                continue
            members = [m for m in ordered if topic in subscriptions[m].topics]
            per_member, extra = divmod(count, len(members))
            for i, member in enumerate(members):
                start = per_member * i + min(i, extra)
                length = per_member + (1 if i < extra else 0)
                result[member].extend(
                    TopicPartition(topic, p) for p in range(start, start + length)
                )
        return result


class RoundRobinAssignor:
    name = "roundrobin"

    def assign(
        self, partitions_per_topic: Mapping[str, int], subscriptions: Mapping[str, Subscription]
    ) -> dict[str, list[TopicPartition]]:
        result: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
        ordered = member_order(subscriptions)
        if not ordered:
            return result
        topics = sorted({t for s in subscriptions.values() for t in s.topics})
        turn = 0
        for topic in topics:
            count = partitions_per_topic.get(topic)
            if count is None:
                continue
            for partition in range(count):
                # Advance to the next member subscribed to this topic (one exists: the topic
                # comes from some member's subscription).
                while topic not in subscriptions[ordered[turn % len(ordered)]].topics:
                    turn += 1
                result[ordered[turn % len(ordered)]].append(TopicPartition(topic, partition))
                turn += 1
        return result


ASSIGNORS: dict[str, type[RangeAssignor] | type[RoundRobinAssignor]] = {
    RangeAssignor.name: RangeAssignor,
    RoundRobinAssignor.name: RoundRobinAssignor,
}


def assignor_for(name: str) -> RangeAssignor | RoundRobinAssignor:
    try:
        return ASSIGNORS[name]()
    except KeyError:
        raise ValueError(
            f"unknown partition assignment strategy {name!r}: use one of {sorted(ASSIGNORS)}"
        ) from None
