"""The reassignment planner (metadata/assignment_plan.py): replacements for leaving brokers,
rebalancing onto new brokers, and kafka-reassign-partitions --generate."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.metadata.assignment_plan import (
    PlacementError,
    plan_generate,
    plan_rebalance,
    plan_replacements,
)
from minibroker.metadata.placement import BrokerSlot, place_replicas
from minibroker.metadata.records import PartitionRecord


def parts(assignment, topic="T") -> list[PartitionRecord]:
    return [
        PartitionRecord(topic, i, tuple(r), tuple(r), r[0], 0, 0) for i, r in enumerate(assignment)
    ]


def slots(ids, racks=None) -> list[BrokerSlot]:
    return [BrokerSlot(b, (racks or {}).get(b, "")) for b in ids]


def after(partitions, plan) -> dict:
    return {
        (p.topic_id, p.partition): plan.get((p.topic_id, p.partition), p.replicas)
        for p in partitions
    }


def test_replacements_move_every_replica_off_the_leaving_broker_to_the_least_loaded():
    ps = parts(place_replicas(slots([1, 2, 3, 4]), 8, 2))
    plan = plan_replacements(ps, slots([1, 2, 3, 4, 5]), {2})
    final = after(ps, plan)
    assert all(2 not in r for r in final.values())
    assert all(len(set(r)) == 2 for r in final.values())
    moved = {
        k
        for k, r in final.items()
        if r != dict(((p.topic_id, p.partition), p.replicas) for p in ps)[k]
    }
    assert moved == set(plan)  # only partitions that named 2
    assert Counter(b for r in plan.values() for b in r)[5] >= 2  # the empty broker took a share
    # Leaders balanced: no broker leads more than one above another.
    leads = Counter(r[0] for r in final.values())
    assert max(leads.values()) - min(leads.get(b, 0) for b in (1, 3, 4, 5)) <= 1


def test_replacements_use_an_unused_rack_first():
    racks = {1: "a", 2: "b", 3: "a", 4: "b", 5: "c"}
    ps = parts([(1, 2)])
    plan = plan_replacements(ps, slots([1, 2, 3, 4, 5], racks), {2})
    assert plan[("T", 0)] in ((1, 4), (1, 5), (4, 1), (5, 1))
    # 4 shares rack b with nothing left; 5 (rack c) too: both fine; never 3 (rack a, like 1).
    assert 3 not in plan[("T", 0)]


def test_replacements_leave_out_partitions_that_cannot_keep_their_rf_or_are_moving():
    ps = parts([(1, 2, 3)])
    assert plan_replacements(ps, slots([1, 2, 3]), {2}) == {}
    moving = [
        PartitionRecord(
            "T", 0, (4, 1, 2), (1, 2), 1, 0, 0, adding_replicas=(4,), removing_replicas=(2,)
        )
    ]
    assert plan_replacements(moving, slots([1, 2, 3, 4, 5]), {2}) == {}


def test_rebalance_onto_a_new_broker_with_minimal_moves():
    ps = parts(place_replicas(slots([1, 2, 3]), 6, 2))  # 4 replicas each
    plan = plan_rebalance(ps, slots([1, 2, 3, 4]))
    final = after(ps, plan)
    counts = Counter(b for r in final.values() for b in r)
    assert max(counts.values()) - min(counts[b] for b in (1, 2, 3, 4)) <= 1
    moved = sum(len(set(r) - set(p.replicas)) for p, r in zip(ps, final.values(), strict=True))
    assert moved == 3  # 12 replicas over 4 brokers: the new one takes exactly 3
    leads = Counter(r[0] for r in final.values())
    assert max(leads.values()) - min(leads.get(b, 0) for b in (1, 2, 3, 4)) <= 1


def test_rebalance_of_a_balanced_cluster_moves_nothing():
    ps = parts(place_replicas(slots([1, 2, 3]), 6, 3))
    assert plan_rebalance(ps, slots([1, 2, 3])) == {}


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 6),
    st.integers(1, 3),
    st.integers(1, 12),
    st.integers(1, 3),
    st.lists(st.sampled_from("abc"), min_size=9, max_size=9),
)
def test_rebalance_property_balance_within_one_and_racks_never_fewer(
    n, rf, count, extra, rack_list
):
    rf = min(rf, n)
    old = list(range(1, n + 1))
    racks = {b: rack_list[b - 1] for b in range(1, n + extra + 1)}
    ps = parts(place_replicas(slots(old, racks), count, rf))
    brokers = slots(range(1, n + extra + 1), racks)
    plan = plan_rebalance(ps, brokers)
    final = after(ps, plan)
    for p in ps:
        r = final[(p.topic_id, p.partition)]
        assert len(r) == len(set(r)) == rf
        assert len({racks[b] for b in r}) >= len({racks[b] for b in p.replicas})
    counts = Counter({b.broker_id: 0 for b in brokers})
    counts.update(b for r in final.values() for b in r)
    # Within one, unless a rack rule or "not twice in a partition" blocks every move.
    if len(set(racks.values())) == 1:
        assert max(counts.values()) - min(counts.values()) <= 1


def test_generate_places_every_partition_on_the_list_rack_aware():
    racks = {1: "a", 2: "a", 4: "b", 5: "b"}
    ps = parts([(1, 2), (2, 3), (3, 1)])
    plan = plan_generate(ps, slots([1, 2, 4, 5], racks))
    assert set(plan) == {("T", 0), ("T", 1), ("T", 2)}
    for r in plan.values():
        assert len(r) == 2 and {racks[b] for b in r} == {"a", "b"}
    with pytest.raises(PlacementError):
        plan_generate(ps, slots([1]))
