"""Pure rule functions of the controller: elections (docs/protocol.md §17), placement
(docs/design.md §6), AlterPartition validation order (docs/protocol.md §9), rebalance
(docs/protocol.md §19), topic names."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.client.common.invariant import InvariantViolation
from minibroker.client.errors import ErrorCode
from minibroker.client.types import NO_LEADER
from minibroker.controller.core.election import (
    Election,
    build_partition_change,
    check_partition_change,
    elect_leader,
)
from minibroker.controller.core.isr import (
    AlterPartitionProposal,
    IsrMember,
    validate_alter_partition,
)
from minibroker.controller.core.placement import BrokerSlot, place_replicas, rack_alternated
from minibroker.controller.core.rebalance import partitions_to_rebalance
from minibroker.controller.core.topics import invalid_topic_name
from minibroker.metadata.image import BrokerRegistration
from minibroker.metadata.records import LEADER_RECOVERING, PartitionRecord


def part(replicas, isr, leader, le=5, pe=9, lrs=0) -> PartitionRecord:
    return PartitionRecord("t1", 0, tuple(replicas), tuple(isr), leader, le, pe, lrs)


def only(*ids):
    return lambda b: b in ids


# -- elections -------------------------------------------------------------------------------


def test_online_keeps_a_valid_leader():
    assert elect_leader(
        part([1, 2, 3], [1, 2, 3], 2), [1, 2, 3], Election.ONLINE, only(1, 2, 3)
    ) == (
        2,
        False,
    )


def test_online_picks_first_in_assignment_order_in_isr_and_acceptable():
    p = part([3, 1, 2], [1, 2], 3)
    assert elect_leader(p, [1, 2], Election.ONLINE, only(1, 2)) == (1, False)
    assert elect_leader(p, [1, 2], Election.ONLINE, only(2)) == (2, False)


def test_no_valid_replica_means_offline_not_unclean():
    p = part([1, 2], [1], 1)
    assert elect_leader(p, [1], Election.ONLINE, only(2)) == (NO_LEADER, False)


def test_unclean_picks_out_of_sync_replica():
    p = part([1, 2], [1], 1)
    assert elect_leader(p, [1], Election.UNCLEAN, only(2)) == (2, True)


def test_preferred_election_order():
    p = part([1, 2, 3], [1, 2, 3], 2)
    assert elect_leader(p, [1, 2, 3], Election.PREFERRED, only(1, 2, 3)) == (1, False)
    # preferred not in ISR: keep the current leader
    assert elect_leader(p, [2, 3], Election.PREFERRED, only(1, 2, 3)) == (2, False)
    # neither: first valid in replicas[1:]
    assert elect_leader(p, [3], Election.PREFERRED, only(1, 3)) == (3, False)


def test_leader_change_bumps_both_epochs_isr_change_only_partition_epoch():
    p = part([1, 2, 3], [1, 2, 3], 1, le=4, pe=7)
    shrink = build_partition_change(p, acceptable=only(1, 2, 3), target_isr=[1, 2], reason="x")
    assert shrink is not None and not shrink.leader_changed
    assert (shrink.record.leader_epoch, shrink.record.partition_epoch) == (4, 8)
    moved = build_partition_change(p, acceptable=only(2, 3), target_isr=[2, 3], reason="y")
    assert moved is not None and moved.leader_changed
    assert (moved.record.leader, moved.record.leader_epoch, moved.record.partition_epoch) == (
        2,
        5,
        8,
    )
    assert moved.record.reason == "y"


def test_no_change_returns_none():
    p = part([1, 2], [1, 2], 1)
    assert build_partition_change(p, acceptable=only(1, 2), reason="noop") is None


def test_last_isr_member_is_kept_and_partition_goes_offline():
    """docs/design.md §6: none -> offline (leader -1), keeping the last ISR member."""
    p = part([1, 2], [1], 1, le=3, pe=3)
    change = build_partition_change(p, acceptable=only(2), target_isr=[], reason="fence 1")
    assert change is not None
    assert change.record.isr == (1,)
    assert change.record.leader == NO_LEADER
    assert change.record.leader_epoch == 4  # "no leader" is a leader change too
    # when 1 returns, it can lead again
    back = build_partition_change(change.record, acceptable=only(1, 2), reason="unfence 1")
    assert back is not None and back.record.leader == 1 and back.record.leader_epoch == 5


def test_unclean_change_sets_isr_to_leader_and_recovering():
    p = part([1, 2, 3], [1], 1)
    change = build_partition_change(
        p, acceptable=only(3), election=Election.UNCLEAN, target_isr=[], reason="u"
    )
    assert change is not None and change.unclean
    assert change.record.leader == 3 and change.record.isr == (3,)
    assert change.record.leader_recovery_state == LEADER_RECOVERING


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 5),
    data=st.data(),
)
def test_election_properties(n, data):
    """I7/I11: the new leader is NO_LEADER or an acceptable ISR member; the ISR is a non-empty
    subset of replicas; epochs grow, LE changes only with PE changes."""
    replicas = data.draw(st.permutations(list(range(1, n + 1))))
    isr = data.draw(st.lists(st.sampled_from(replicas), min_size=1, unique=True))
    leader = data.draw(st.sampled_from([NO_LEADER, *isr]))
    alive = set(data.draw(st.lists(st.sampled_from(replicas), unique=True)))
    target = data.draw(st.lists(st.sampled_from(replicas), unique=True))
    kind = data.draw(st.sampled_from(list(Election)))
    p = part(replicas, isr, leader)
    change = build_partition_change(
        p, acceptable=lambda b: b in alive, election=kind, target_isr=target, reason="prop"
    )
    if change is None:
        return
    r = change.record
    assert r.isr and set(r.isr) <= set(replicas)
    assert r.partition_epoch == p.partition_epoch + 1
    assert r.leader_epoch in (p.leader_epoch, p.leader_epoch + 1)
    assert (r.leader_epoch == p.leader_epoch + 1) == (r.leader != p.leader)
    if r.leader != NO_LEADER:
        assert r.leader in alive and r.leader in r.isr
        if not change.unclean:
            assert r.leader in (target or isr)


# -- placement -------------------------------------------------------------------------------


def test_three_brokers_six_partitions_each_preferred_leader_of_two():
    brokers = [BrokerSlot(i, "") for i in (1, 2, 3)]
    assignment = place_replicas(brokers, 6, 3)
    assert Counter(r[0] for r in assignment) == {1: 2, 2: 2, 3: 2}
    assert all(len(set(r)) == 3 for r in assignment)


def test_racks_alternate():
    brokers = [BrokerSlot(1, "a"), BrokerSlot(2, "a"), BrokerSlot(3, "b"), BrokerSlot(4, "b")]
    assert rack_alternated(brokers) == [1, 3, 2, 4]
    for replicas in place_replicas(brokers, 8, 2):
        racks = {"a" if b in (1, 2) else "b" for b in replicas}
        assert racks == {"a", "b"}, replicas


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 7),
    racks=st.integers(1, 3),
    partitions=st.integers(1, 20),
    data=st.data(),
    start=st.integers(0, 50),
)
def test_placement_properties(n, racks, partitions, data, start):
    rf = data.draw(st.integers(1, n))
    brokers = [BrokerSlot(i, f"r{i % racks}") for i in range(n)]
    assignment = place_replicas(brokers, partitions, rf, start)
    assert len(assignment) == partitions
    used_racks = min(racks, n)
    for replicas in assignment:
        assert len(replicas) == rf == len(set(replicas))
        assert len({b % racks for b in replicas}) == min(rf, used_racks)
    leaders = Counter(r[0] for r in assignment)
    assert max(leaders.values()) - min(leaders.get(b.broker_id, 0) for b in brokers) <= 1


# -- AlterPartition validation order ---------------------------------------------------------


def reg(b, epoch=10, fenced=False, shutdown=False):
    return BrokerRegistration(b, "inc", epoch, "h", 1, "", fenced, shutdown, -1)


BROKERS = {1: reg(1), 2: reg(2), 3: reg(3), 4: reg(4, fenced=True), 5: reg(5, shutdown=True)}


def proposal(le=5, pe=9, isr=(1, 2), lrs=0, epochs=None):
    members = tuple(IsrMember(b, (epochs or {}).get(b, -1)) for b in isr)
    return AlterPartitionProposal("t1", 0, le, pe, members, lrs)


@pytest.mark.parametrize(
    ("sender", "prop", "code"),
    [
        (1, proposal(), None),
        (1, proposal(le=6), ErrorCode.NOT_CONTROLLER),
        (1, proposal(pe=10), ErrorCode.NOT_CONTROLLER),
        (1, proposal(le=4), ErrorCode.FENCED_LEADER_EPOCH),
        (2, proposal(le=4), ErrorCode.FENCED_LEADER_EPOCH),  # epoch checked before sender
        (2, proposal(), ErrorCode.NOT_LEADER_OR_FOLLOWER),
        (2, proposal(pe=8), ErrorCode.NOT_LEADER_OR_FOLLOWER),  # sender before partition epoch
        (1, proposal(pe=8), ErrorCode.INVALID_UPDATE_VERSION),
        (1, proposal(isr=(1, 9)), ErrorCode.INVALID_REQUEST),
        (1, proposal(isr=(2, 3)), ErrorCode.INVALID_REQUEST),
        (1, proposal(isr=(1, 1)), ErrorCode.INVALID_REQUEST),
        (1, proposal(isr=(1, 2), lrs=1), ErrorCode.INVALID_REQUEST),
        (1, proposal(isr=(1, 4)), ErrorCode.INELIGIBLE_REPLICA),
        (1, proposal(isr=(1, 5)), ErrorCode.INELIGIBLE_REPLICA),
        (1, proposal(isr=(1, 2), epochs={2: 3}), ErrorCode.INELIGIBLE_REPLICA),
        (1, proposal(isr=(1, 2), epochs={2: 10}), None),
    ],
)
def test_alter_partition_validation(sender, prop, code):
    current = part([1, 2, 3, 4, 5], [1, 2], 1)
    rejection = validate_alter_partition(sender, prop, current, True, BROKERS)
    assert (rejection.code if rejection else None) == code


def test_alter_partition_unknown_topic_and_partition():
    assert validate_alter_partition(1, proposal(), None, False, BROKERS).code == (
        ErrorCode.UNKNOWN_TOPIC_ID
    )
    assert validate_alter_partition(1, proposal(), None, True, BROKERS).code == (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    )


def test_recovering_partition_may_only_report_recovered_with_leader_alone_or_grow_after():
    current = part([1, 2], [1], 1, lrs=LEADER_RECOVERING)
    assert validate_alter_partition(1, proposal(isr=(1,), lrs=0), current, True, BROKERS) is None
    bad = validate_alter_partition(1, proposal(isr=(1, 2), lrs=1), current, True, BROKERS)
    assert bad is not None and bad.code == ErrorCode.INVALID_REQUEST


# -- rebalance -------------------------------------------------------------------------------


def test_rebalance_uses_per_broker_percentage():
    # Broker 1 prefers 10 partitions and leads 9: ratio 10% is not above 10%.
    parts = [PartitionRecord("t", i, (1, 2), (1, 2), 1 if i else 2, 0, 0) for i in range(10)]
    assert partitions_to_rebalance(parts, only(1, 2), 10) == []
    # Two of ten not led: 20% > 10% -> both move back.
    parts[1] = PartitionRecord("t", 1, (1, 2), (1, 2), 2, 0, 0)
    chosen = partitions_to_rebalance(parts, only(1, 2), 10)
    assert [p.partition for p in chosen] == [0, 1]
    # Not in the ISR or not acceptable: stays.
    parts[0] = PartitionRecord("t", 0, (1, 2), (2,), 2, 0, 0)
    assert [p.partition for p in partitions_to_rebalance(parts, only(1, 2), 10)] == [1]
    assert partitions_to_rebalance(parts, only(2), 10) == []


# -- topic names -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("orders", True),
        ("a.b_c-D9", True),
        ("x" * 249, True),
        ("x" * 250, False),
        ("", False),
        (".", False),
        ("..", False),
        ("a b", False),
        ("ä", False),
        ("a/b", False),
        ("orders\n", False),  # `$` would let a trailing newline through
        ("orders\r", False),
        ("\n", False),
        ("x" * 248 + "\n", False),
    ],
)
def test_topic_names(name, ok):
    assert (invalid_topic_name(name) is None) == ok


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (None, part([1, 2], [], NO_LEADER)),
        (None, part([1, 2], [3], NO_LEADER)),
        (None, part([1, 2], [1], 2)),
        (part([1, 2], [1, 2], 1, 5, 9), part([1, 2], [1], 1, 5, 9)),  # PE not bumped
        (part([1, 2], [1, 2], 1, 5, 9), part([1, 2], [2], 2, 5, 10)),  # leader without LE
        (part([1, 2], [1, 2], 1, 5, 9), part([1, 2], [1], 1, 6, 10)),  # LE without leader
        (part([1, 2], [1, 2], 1, 5, 9), part([1, 2], [2], 2, 4, 10)),  # LE goes back
    ],
)
def test_partition_invariants_are_enforced_always(old, new):
    with pytest.raises(InvariantViolation):
        check_partition_change(old, new)
