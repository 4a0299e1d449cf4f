"""KIP-455 reassignment: the pure record transitions (controller/core/reassignment.py) and the
controller commands built on them (AlterPartitionReassignments, AlterPartition completing a
reassignment, cancel). Rules: docs/protocol.md "Reassignment (KIP-455)"."""

from __future__ import annotations

from dataclasses import replace

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
)
from minibroker.controller.core.isr import Rejection
from minibroker.controller.core.messages import ReassignmentTarget
from minibroker.controller.core.reassignment import (
    cancel_reassignment,
    complete_reassignment,
    start_reassignment,
    validate_target,
)
from minibroker.metadata.records import LEADER_RECOVERING, PartitionRecord
from tests.unit.test_controller_core import Harness, replay


def rec(replicas, isr, leader, adding=(), removing=(), le=3, pe=7) -> PartitionRecord:
    return PartitionRecord(
        "T", 0, tuple(replicas), tuple(isr), leader, le, pe, 0, "", tuple(adding), tuple(removing)
    )


def everyone(_b: int) -> bool:
    return True


def validate(current, target, registered=(1, 2, 3, 4, 5, 6), decom=(), min_isr=1):
    return validate_target(
        current, target, registered=set(registered), decommissioning=set(decom), min_isr=min_isr
    )


# -- start ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "kwargs", "code", "needle"),
    [
        ((), {}, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "empty"),
        ((4, 4, 5), {}, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "twice"),
        ((4, 9), {}, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "[9]"),
        ((4, 5), {"min_isr": 3}, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "min.insync.replicas=3"),
        ((4, 5, 6), {"decom": (5,)}, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "decommissioning"),
    ],
)
def test_bad_targets_are_refused_with_kafkas_codes(target, kwargs, code, needle):
    problem = validate(rec((1, 2, 3), (1, 2, 3), 1), target, **kwargs)
    assert problem is not None and problem.code == code and needle in problem.message


def test_a_partition_already_reassigning_is_refused_with_reassignment_in_progress():
    moving = rec((4, 1), (1,), 1, adding=(4,), removing=(1,))
    problem = validate(moving, (5,))
    assert problem is not None and problem.code == ErrorCode.REASSIGNMENT_IN_PROGRESS


def test_a_valid_target_passes():
    assert validate(rec((1, 2, 3), (1, 2, 3), 1), (4, 5, 6), min_isr=3) is None


def test_start_writes_target_then_original_with_adding_and_removing():
    current = rec((1, 2, 3), (1, 2, 3), 2)
    new = start_reassignment(current, (3, 4, 5), everyone)
    assert new is not None
    assert new.replicas == (3, 4, 5, 1, 2)
    assert new.adding_replicas == (4, 5) and new.removing_replicas == (1, 2)
    assert new.isr == current.isr and new.leader == 2 and new.leader_epoch == 3
    assert new.partition_epoch == 8
    # Kafka's order: replicas - adding, as listed now (PartitionReassignmentRevert); the
    # original order is not in the record, so a cancel may change the preferred leader.
    assert new.target_replicas == (3, 4, 5) and new.original_replicas == (3, 1, 2)
    check_partition_change(current, new)


def test_start_with_the_current_list_is_nothing_to_do():
    assert start_reassignment(rec((1, 2), (1, 2), 1), (1, 2), everyone) is None


def test_start_to_an_in_sync_subset_completes_in_the_same_record():
    current = rec((1, 2, 3), (1, 2, 3), 1)
    new = start_reassignment(current, (2, 3), everyone)
    assert new is not None and not new.is_reassigning
    assert new.replicas == (2, 3) and new.isr == (2, 3)
    assert new.leader == 2 and new.leader_epoch == 4 and new.partition_epoch == 8
    check_partition_change(current, new)


def test_start_reorder_changes_the_preferred_leader_only():
    current = rec((1, 2, 3), (1, 2, 3), 1)
    new = start_reassignment(current, (3, 1, 2), everyone)
    assert new is not None and new.replicas == (3, 1, 2) and not new.is_reassigning
    assert new.leader == 1  # still in the target: no election


# -- completion -----------------------------------------------------------------------------


def moving() -> PartitionRecord:
    # 1,2,3 -> 3,4,5; leader 1 (being removed); 4 caught up, 5 not yet.
    return rec((3, 4, 5, 1, 2), (1, 2, 3, 4), 1, adding=(4, 5), removing=(1, 2))


def test_completion_waits_for_every_target_replica():
    assert complete_reassignment(moving(), everyone) is None


def test_completion_shrinks_to_the_target_and_elects_its_first_in_sync_member():
    current = replace(moving(), isr=(1, 2, 3, 4, 5))
    new = complete_reassignment(current, everyone)
    assert new is not None
    assert new.replicas == (3, 4, 5) and new.isr == (3, 4, 5)
    assert new.adding_replicas == () and new.removing_replicas == ()
    assert new.leader == 3 and new.leader_epoch == 4 and new.partition_epoch == 8
    check_partition_change(current, new)


def test_completion_skips_an_unacceptable_preferred_replica():
    current = replace(moving(), isr=(1, 3, 4, 5))
    new = complete_reassignment(current, lambda b: b != 3)
    assert new is not None and new.leader == 4


def test_the_invariant_checks_tie_leader_epochs_to_leaders_and_dropped_replicas():
    current = replace(moving(), isr=(1, 2, 3, 4, 5), leader=4)
    same_leader_no_drop = replace(current, partition_epoch=8, leader_epoch=4)
    with pytest.raises(InvariantViolation, match="without a new leader or a dropped replica"):
        check_partition_change(current, same_leader_no_drop)
    dropped_same_epoch = replace(
        current,
        replicas=(3, 4, 5),
        isr=(3, 4, 5),
        adding_replicas=(),
        removing_replicas=(),
        partition_epoch=8,
    )
    with pytest.raises(InvariantViolation, match="dropped in the same leader epoch"):
        check_partition_change(current, dropped_same_epoch)
    new_leader_same_epoch = replace(current, leader=3, partition_epoch=8)
    with pytest.raises(InvariantViolation, match="leader changed in the same leader epoch"):
        check_partition_change(current, new_leader_same_epoch)


def test_completion_waits_rather_than_take_a_led_partition_offline():
    current = replace(moving(), isr=(1, 3, 4, 5))
    # Every target replica is in the ISR but none can lead (fenced or shutting down): the
    # partition keeps its leader and its reassignment until one can.
    assert complete_reassignment(current, lambda b: b not in (3, 4, 5)) is None


def test_completion_keeps_a_leader_that_stays():
    current = replace(moving(), isr=(1, 2, 3, 4, 5), leader=4)
    new = complete_reassignment(current, everyone)
    # The leader stays, but the dropped replicas' fetches are fenced by a new leader epoch
    # (Kafka's triggerLeaderEpochBumpForReplicaReassignmentIfNeeded).
    assert new is not None and new.leader == 4 and new.leader_epoch == 4
    check_partition_change(current, new)


def test_isr_change_alone_keeps_adding_and_removing():
    change = build_partition_change(
        moving(), acceptable=everyone, target_isr=(1, 2, 3, 4, 5), reason="expand"
    )
    assert change is not None
    assert change.record.adding_replicas == (4, 5) and change.record.removing_replicas == (1, 2)


def test_online_election_during_a_reassignment_prefers_the_target():
    current = rec((3, 4, 1), (1, 3, 4), 1, adding=(4,), removing=(1,))
    change = build_partition_change(
        current, acceptable=lambda b: b != 1, election=Election.ONLINE, reason="1 fenced"
    )
    assert change is not None and change.record.leader == 3
    # An offline partition whose removing replica is listed first (and in sync): the target
    # replica wins all the same.
    odd = rec((2, 3, 4), (2, 3), NO_LEADER, adding=(4,), removing=(2,))
    change = build_partition_change(odd, acceptable=everyone, reason="2 and 3 back")
    assert change is not None and change.record.leader == 3


# -- cancel ---------------------------------------------------------------------------------


def test_cancel_without_a_reassignment_is_no_reassignment_in_progress():
    result = cancel_reassignment(rec((1, 2), (1, 2), 1), everyone, False)
    assert isinstance(result, Rejection) and result.code == ErrorCode.NO_REASSIGNMENT_IN_PROGRESS


def test_cancel_reverts_to_the_original_replicas_and_drops_adding_from_the_isr():
    current = moving()
    new = cancel_reassignment(current, everyone, False)
    assert isinstance(new, PartitionRecord)
    # replicas - adding in the listed order (Kafka's PartitionReassignmentRevert).
    assert new.replicas == (3, 1, 2) and new.isr == (1, 2, 3) and new.leader == 1
    # The leader stays; the dropped adding replicas are fenced by a new leader epoch.
    assert not new.is_reassigning and new.partition_epoch == 8 and new.leader_epoch == 4
    check_partition_change(current, new)


def test_cancel_re_elects_when_the_leader_was_an_adding_replica():
    current = replace(moving(), leader=4)
    new = cancel_reassignment(current, everyone, False)
    assert isinstance(new, PartitionRecord) and new.leader == 3 and new.leader_epoch == 4


def test_cancel_needing_an_unclean_election_is_refused_unless_the_topic_allows_it():
    current = rec((4, 5, 1), (4, 5), 4, adding=(4, 5), removing=(1,))
    refused = cancel_reassignment(current, everyone, False)
    assert isinstance(refused, Rejection)
    assert refused.code == ErrorCode.INVALID_REPLICA_ASSIGNMENT and "unclean" in refused.message
    allowed = cancel_reassignment(current, everyone, True)
    assert isinstance(allowed, PartitionRecord)
    assert allowed.replicas == (1,) and allowed.isr == (1,) and allowed.leader == 1
    assert allowed.leader_recovery_state == LEADER_RECOVERING
    check_partition_change(current, allowed)
    # No original replica alive to lead: refused, rather than an ISR of an out-of-sync
    # replica that would later lead as if clean.
    nobody = cancel_reassignment(current, lambda b: b != 1, True)
    assert isinstance(nobody, Rejection) and nobody.code == ErrorCode.INVALID_REPLICA_ASSIGNMENT


# -- invariants -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("adding", "removing", "replicas"),
    [((9,), (), (1, 2)), ((), (9,), (1, 2)), ((2,), (2,), (1, 2)), ((), (1, 2), (1, 2))],
)
def test_partition_change_invariants_cover_adding_and_removing(adding, removing, replicas):
    bad = rec(replicas, (1,), 1, adding=adding, removing=removing, pe=0)
    with pytest.raises(InvariantViolation):
        check_partition_change(None, bad)


# -- a property: random partitions, random steps --------------------------------------------

BROKERS = list(range(1, 8))


@st.composite
def partitions(draw):
    replicas = draw(st.lists(st.sampled_from(BROKERS), min_size=1, max_size=4, unique=True))
    isr = draw(st.lists(st.sampled_from(replicas), min_size=1, unique=True))
    leader = draw(st.sampled_from([*isr, NO_LEADER]))
    return rec(replicas, isr, leader, le=0, pe=0)


steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("start"),
            st.lists(st.sampled_from(BROKERS), min_size=1, max_size=4, unique=True),
        ),
        st.tuples(st.just("isr"), st.lists(st.sampled_from(BROKERS), max_size=7, unique=True)),
        st.tuples(st.just("complete"), st.none()),
        st.tuples(st.just("cancel"), st.none()),
        st.tuples(st.just("fence"), st.sampled_from(BROKERS)),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(partitions(), steps, st.integers(1, 3), st.booleans())
def test_random_reassignment_sequences_keep_the_invariants(p, ops, min_isr, unclean):
    fenced: set[int] = set()

    def acceptable(b: int) -> bool:
        return b not in fenced

    origin: tuple[int, ...] | None = None  # the replicas before the running reassignment
    for op, arg in ops:
        before = p
        new: PartitionRecord | None = None
        if op == "start":
            if validate(p, arg, registered=BROKERS, min_isr=min_isr) is None:
                new = start_reassignment(p, arg, acceptable)
                if new is not None and new.is_reassigning:
                    assert new.target_replicas == tuple(arg)
                    assert set(new.original_replicas) == set(before.replicas)
                if new is not None and not new.is_reassigning:
                    assert new.replicas == tuple(arg)
                assert len(arg) >= min_isr
        elif op == "isr":
            # A leader's proposal: a subset of the replicas that keeps the leader.
            isr = [b for b in arg if b in p.replicas and b not in fenced]
            if p.leader != NO_LEADER and p.leader not in isr:
                isr.append(p.leader)
            change = build_partition_change(p, acceptable=acceptable, target_isr=isr, reason="isr")
            new = change.record if change else None
        elif op == "complete":
            new = complete_reassignment(p, acceptable)
            if new is not None:
                assert new.replicas == before.target_replicas
                assert set(new.isr) <= set(before.target_replicas)
                assert set(before.target_replicas) <= set(before.isr)
        elif op == "cancel":
            result = cancel_reassignment(p, acceptable, unclean)
            if isinstance(result, Rejection):
                assert not p.is_reassigning or not set(p.isr) & set(p.original_replicas)
            else:
                new = result
                assert new.replicas == before.original_replicas
                if origin is not None:
                    assert set(new.replicas) == set(origin)
        elif op == "fence":
            fenced.add(arg)
            isr = [b for b in p.isr if b != arg]
            change = build_partition_change(
                p, acceptable=acceptable, target_isr=isr, reason="fence"
            )
            new = change.record if change else None
        if new is not None:
            check_partition_change(before, new)
            if new.is_reassigning and not before.is_reassigning:
                origin = before.replicas
            p = new
        assert p.isr and set(p.isr) <= set(p.replicas)
        assert p.leader == NO_LEADER or p.leader in p.isr


# -- the controller commands ----------------------------------------------------------------


def h6(**overrides) -> Harness:
    h = Harness(**overrides)
    h.start(1, 2, 3, 4, 5, 6)
    return h


def reassign(h: Harness, target, name="t", index=0):
    (result,) = h.take(
        h.core.alter_partition_reassignments(
            [ReassignmentTarget(name, index, None if target is None else tuple(target))], h.now
        )
    )
    return result


def catch_up(h: Harness, *brokers, name="t", index=0):
    p = h.part(name, index)
    return h.alter(p.leader, p, [*p.isr, *brokers])


def test_move_to_three_new_brokers_completes_once_all_are_in_sync():
    h = h6()
    h.create(partitions=1, rf=3)
    before = h.part()
    assert before.replicas == (1, 2, 3)
    assert reassign(h, (4, 5, 6)).error == ErrorCode.NONE
    p = h.part()
    assert p.replicas == (4, 5, 6, 1, 2, 3) and p.adding_replicas == (4, 5, 6)
    assert h.core.list_partition_reassignments(None)[0].adding_replicas == (4, 5, 6)
    assert h.core.list_partition_reassignments([("t", 1)]) == ()
    desc = {b.registration.broker_id: b for b in h.core.describe_cluster(h.now).brokers}
    assert desc[4].replica_count == 1 and desc[1].replica_count == 1  # adding and removing
    assert desc[1].leader_count == 1 and desc[4].leader_count == 0
    catch_up(h, 4, 5)
    assert h.part().is_reassigning  # 6 is not in sync yet
    result = catch_up(h, 6)
    p = h.part()
    assert p.replicas == (4, 5, 6) and p.isr == (4, 5, 6) and p.leader == 4
    assert not p.is_reassigning and p.leader_epoch == before.leader_epoch + 1
    # The leader is answered with the record of its own ISR change (every replica, the new
    # ISR); the completion is the next record, which it applies from the metadata log. An
    # answer carrying the completed record would leave it with the old replicas at the new
    # partition epoch (it would skip that record as applied, and keep the removed replicas).
    assert result.record is not None
    assert result.record.replicas == (4, 5, 6, 1, 2, 3)
    assert set(result.record.isr) == {1, 2, 3, 4, 5, 6}
    assert result.record.partition_epoch == p.partition_epoch - 1
    names = h.event_names()
    assert "reassignment_started" in names and "reassignment_completed" in names
    done = next(e for e in h.events if e.name == "reassignment_completed")
    assert done.fields["leader_moved"] is True
    assert h.core.list_partition_reassignments(None) == ()
    assert replay(h.log) == h.core.image


def test_refused_reassignments_change_nothing():
    h = h6()
    h.create(partitions=1, rf=3, configs={"min.insync.replicas": "2"})
    offset = h.core.image.next_offset
    assert reassign(h, (4,)).error == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert reassign(h, (4, 4)).error == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert reassign(h, (4, 77)).error == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert reassign(h, (4, 5), name="nope").error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert reassign(h, (4, 5), index=3).error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert reassign(h, None).error == ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
    assert h.core.image.next_offset == offset
    assert reassign(h, (4, 5)).error == ErrorCode.NONE
    again = reassign(h, (5, 6))
    assert again.error == ErrorCode.REASSIGNMENT_IN_PROGRESS and "t-0" in again.message


def test_cancel_mid_way_reverts_to_the_original_replicas():
    h = h6()
    h.create(partitions=1, rf=3)
    reassign(h, (4, 5, 6))
    catch_up(h, 4)
    assert reassign(h, None).error == ErrorCode.NONE
    p = h.part()
    assert p.replicas == (1, 2, 3) and p.isr == (1, 2, 3) and not p.is_reassigning
    assert "reassignment_cancelled" in h.event_names()


def test_a_removing_leader_keeps_leading_until_completion():
    h = h6()
    h.create(partitions=1, rf=1)
    reassign(h, (2,))
    assert h.part().leader == 1 and h.part().isr == (1,)
    catch_up(h, 2)
    assert h.part().leader == 2 and h.part().replicas == (2,)


def test_a_restarted_controller_completes_a_reassignment_from_the_log():
    h = h6()
    h.create(partitions=1, rf=3)
    reassign(h, (1, 2, 4))
    image = replay(h.log)
    assert image.topic("t").partitions[0].adding_replicas == (4,)  # type: ignore[union-attr]
    catch_up(h, 4)
    assert h.part().replicas == (1, 2, 4)
