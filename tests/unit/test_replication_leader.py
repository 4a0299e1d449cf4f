"""Leader-side rules of PartitionReplica (broker/replication/partition.py), one scenario each.

Reference: docs/design.md §5, docs/protocol.md §2-§10 and §12 (KIP-320 fencing, stale broker
epoch, strict min ISR, pending shrink gating the HW). Pure: no sockets,
no event loop; time is an explicit `now_ms`.
"""

from __future__ import annotations

import pytest

from minibroker.broker.replication.eligibility import BrokerEligibilityView
from minibroker.broker.replication.events import (
    AlterPartitionResult,
    AppendPlan,
    AssignEpoch,
    CompleteProduce,
    DuplicateAppend,
    Effect,
    FollowerFetch,
    FollowerFetchAnswer,
    HighWatermarkChanged,
    IsrChangeKind,
    IsrUpdated,
    PartitionState,
    ProduceRejected,
    ProposeIsr,
    ReplicaConfig,
    Role,
    StartFetching,
)
from minibroker.broker.replication.partition import PartitionReplica
from minibroker.broker.storage.epoch_cache import EpochCache
from minibroker.client.batch import iter_batches
from minibroker.client.errors import ErrorCode
from minibroker.client.records import encode_batch

LEADER = 1
EPOCH = 5
BROKER_EPOCHS = {1: 101, 2: 102, 3: 103}


def brokers() -> BrokerEligibilityView:
    view = BrokerEligibilityView()
    for broker_id, epoch in BROKER_EPOCHS.items():
        view.update(broker_id, epoch)
    return view


def make_leader(
    *,
    isr: tuple[int, ...] = (1, 2, 3),
    replicas: tuple[int, ...] = (1, 2, 3),
    min_isr: int = 2,
    leo: int = 0,
    hw: int = 0,
    lag_ms: int = 1_000,
    view: BrokerEligibilityView | None = None,
) -> tuple[PartitionReplica, EpochCache, list[Effect]]:
    cache = EpochCache([(EPOCH - 1, 0)] if leo else [])
    replica = PartitionReplica(
        LEADER,
        cache,
        view or brokers(),
        ReplicaConfig(min_insync_replicas=min_isr, replica_lag_time_max_ms=lag_ms),
        leo=leo,
        high_watermark=hw,
    )
    _, effects = replica.apply_partition_state(
        PartitionState(replicas, frozenset(isr), LEADER, EPOCH, 10), now_ms=0
    )
    apply_to_cache(cache, effects)
    return replica, cache, effects


def apply_to_cache(cache: EpochCache, effects: list[Effect] | tuple[Effect, ...]) -> None:
    for effect in effects:
        if isinstance(effect, AssignEpoch):
            cache.assign(effect.leader_epoch, effect.start_offset)


def produce(
    replica: PartitionReplica,
    *,
    acks: int = -1,
    records: int = 1,
    producer: tuple[int, int, int] | None = None,
    now_ms: int = 0,
    token: object = "t",
) -> tuple[AppendPlan | DuplicateAppend | ProduceRejected, list[Effect]]:
    pid, pepoch, seq = producer or (-1, -1, -1)
    raw = encode_batch(
        [(0, None, b"v", ())] * records, producer_id=pid, producer_epoch=pepoch, base_sequence=seq
    )
    headers = [h for _, h in iter_batches(raw)]
    plan, effects = replica.plan_append(acks, headers)
    assert effects == []
    if not isinstance(plan, AppendPlan):
        return plan, []
    _, effects = replica.on_leader_appended(plan, now_ms, token=token, deadline_ms=now_ms + 500)
    return plan, effects


def fetch(
    replica: PartitionReplica,
    replica_id: int,
    offset: int,
    now_ms: int = 0,
    *,
    epoch: int = EPOCH,
    last_fetched_epoch: int = -1,
    broker_epoch: int | None = None,
) -> tuple[FollowerFetchAnswer, list[Effect]]:
    return replica.handle_follower_fetch(
        FollowerFetch(
            replica_id=replica_id,
            broker_epoch=BROKER_EPOCHS[replica_id] if broker_epoch is None else broker_epoch,
            current_leader_epoch=epoch,
            fetch_offset=offset,
            last_fetched_epoch=last_fetched_epoch,
            log_start_offset=0,
        ),
        now_ms,
    )


def of_type(effects, kind):  # type: ignore[no-untyped-def]
    return [e for e in effects if isinstance(e, kind)]


# -- becoming leader ------------------------------------------------------------------------


def test_new_leader_records_its_epoch_start_at_once_kip_279() -> None:
    replica, cache, effects = make_leader(leo=10, hw=7)
    assert effects[0] == AssignEpoch(EPOCH, 10)
    assert cache.latest_epoch == EPOCH
    assert replica.leader_epoch_start_offset == 10
    assert replica.role is Role.LEADER


def test_new_leader_hw_is_frozen_until_every_isr_member_fetched_in_the_epoch() -> None:
    """docs/protocol.md §10: a new leader keeps its lagging HW; its followers' LEOs are unknown."""
    replica, _, effects = make_leader(leo=10, hw=7)
    assert not of_type(effects, HighWatermarkChanged)
    assert fetch(replica, 2, 10)[0].error == ErrorCode.NONE
    assert replica.high_watermark == 7  # broker 3 has not fetched yet
    _, effects = fetch(replica, 3, 10)
    assert replica.high_watermark == 10
    assert HighWatermarkChanged(10) in effects


def test_re_elected_leader_forgets_follower_leos_from_the_earlier_epoch() -> None:
    """A leader re-elected in a later epoch may have missed an epoch in between whose leader
    truncated its followers (the metadata of both elections applied at once): a LEO a follower
    reported in the old epoch no longer says what it holds, so the HW waits for fetches in the
    new epoch. Found by the simulation (tests/sim, seed 423 with partitions): the re-elected
    leader moved its HW over the follower's stale LEO and acknowledged an acks=all batch held
    by itself alone with min.insync.replicas=2."""
    replica, cache, _ = make_leader(leo=10, hw=7)
    produce(replica, records=5)  # LEO 15
    fetch(replica, 2, 15)
    fetch(replica, 3, 10)
    assert replica.high_watermark == 10  # broker 3 holds it back
    # Re-elected two epochs later with broker 3 out of the ISR; meanwhile the leader of the
    # epoch between truncated broker 2 to 12.
    _, effects = replica.apply_partition_state(
        PartitionState((1, 2, 3), frozenset({1, 2}), LEADER, EPOCH + 2, 12), now_ms=0
    )
    apply_to_cache(cache, effects)
    assert replica.leader_epoch == EPOCH + 2
    assert replica.high_watermark == 10  # not 15, which broker 2 no longer holds
    fetch(replica, 2, 12, epoch=EPOCH + 2)
    assert replica.high_watermark == 12


def test_stale_or_repeated_partition_records_are_ignored() -> None:
    replica, _, _ = make_leader()
    older = PartitionState((1, 2, 3), frozenset({1, 2}), 2, EPOCH - 1, 9)
    assert replica.apply_partition_state(older, 0) == (None, [])
    assert replica.role is Role.LEADER and replica.leader_epoch == EPOCH
    same = PartitionState((1, 2, 3), frozenset({1, 2, 3}), LEADER, EPOCH, 10)
    assert replica.apply_partition_state(same, 0) == (None, [])


def test_isr_only_update_keeps_the_epoch_and_follower_state() -> None:
    replica, _, _ = make_leader()
    fetch(replica, 2, 0)
    _, effects = replica.apply_partition_state(
        PartitionState((1, 2, 3), frozenset({1, 2}), LEADER, EPOCH, 11), 0
    )
    assert not of_type(effects, AssignEpoch)
    assert replica.isr == {1, 2} and replica.partition_epoch == 11
    assert replica.replica_leo(2) == 0


# -- high watermark --------------------------------------------------------------------------


def test_hw_is_the_smallest_leo_in_the_isr_and_never_moves_back() -> None:
    replica, _, _ = make_leader()
    produce(replica, acks=1, records=3)
    fetch(replica, 2, 3)
    fetch(replica, 3, 1)
    assert replica.high_watermark == 1
    fetch(replica, 3, 3)
    assert replica.high_watermark == 3
    fetch(replica, 3, 2)  # the follower truncated: the HW stays
    assert replica.high_watermark == 3


def test_strict_min_isr_blocks_the_hw_at_every_acks_level() -> None:
    """KIP-966 part 1: no HW advance while |ISR| < min(min.insync.replicas, RF)."""
    replica, _, _ = make_leader(isr=(1,), min_isr=2)
    plan, effects = produce(replica, acks=1)
    assert isinstance(plan, AppendPlan)
    assert replica.leo == 1 and replica.high_watermark == 0
    assert not of_type(effects, HighWatermarkChanged)
    rejected, _ = produce(replica, acks=-1)
    assert rejected == ProduceRejected(
        ErrorCode.NOT_ENOUGH_REPLICAS,
        message=rejected.message,  # type: ignore[union-attr]
    )


def test_effective_min_isr_is_capped_by_the_replication_factor() -> None:
    replica, _, _ = make_leader(isr=(1,), replicas=(1,), min_isr=3)
    plan, effects = produce(replica, acks=-1)
    assert isinstance(plan, AppendPlan)
    assert replica.high_watermark == 1
    assert CompleteProduce("t", ErrorCode.NONE, 0, 0) in effects


def test_caught_up_follower_outside_the_isr_holds_the_hw() -> None:
    """docs/protocol.md §6: otherwise a rejoining follower could chase a moving HW forever."""
    replica, _, _ = make_leader(isr=(1, 2), lag_ms=1_000)
    produce(replica, acks=1, records=2)
    fetch(replica, 3, 2, now_ms=10)  # caught up, expansion proposed
    replica.on_alter_partition_result(
        AlterPartitionResult(1, ErrorCode.INELIGIBLE_REPLICA), now_ms=10
    )
    assert replica.isr == {1, 2}
    produce(replica, acks=1, records=2, now_ms=20)  # LEO 4
    fetch(replica, 2, 4, now_ms=20)
    assert replica.high_watermark == 2  # broker 3 (LEO 2) is caught up within the lag time
    replica.maybe_shrink_isr(now_ms=2_000)  # long past its last caught-up time
    fetch(replica, 2, 4, now_ms=2_000)
    assert replica.high_watermark == 4


def test_a_pending_expansion_gates_the_hw_even_when_it_lags() -> None:
    """docs/protocol.md §6: the maximal ISR (ISR + the replica being added) gates the HW, so a
    write is never committed without a replica the controller may be adding right now."""
    replica, _, _ = make_leader(isr=(1, 2), lag_ms=100)
    produce(replica, acks=1, records=2)
    fetch(replica, 2, 2, now_ms=0)
    _, effects = fetch(replica, 3, 2, now_ms=0)  # broker 3 reached the HW: expansion proposed
    assert of_type(effects, ProposeIsr) and replica.maximal_isr == {1, 2, 3}
    produce(replica, acks=1, records=2, now_ms=1_000)  # LEO 4; broker 3 is now far behind
    fetch(replica, 2, 4, now_ms=1_000)
    assert replica.high_watermark == 2  # held by broker 3, although it lags and is not in ISR


def test_a_caught_up_outsider_holds_the_hw_only_while_isr_eligible() -> None:
    """docs/protocol.md §6: the caught-up clause counts a follower that could rejoin; a fenced
    broker's replica cannot, so it does not hold the HW back."""
    for fenced, expected_hw in ((False, 2), (True, 4)):
        view = brokers()
        view.update(3, 103, fenced=fenced)
        replica, _, _ = make_leader(isr=(1, 2), lag_ms=1_000, view=view)
        produce(replica, acks=1, records=2)
        fetch(replica, 2, 2, now_ms=10)
        _, effects = fetch(replica, 3, 2, now_ms=10)  # caught up at 10
        if not fenced:  # an eligible one is proposed; let the controller refuse it
            proposal = of_type(effects, ProposeIsr)[0]
            replica.on_alter_partition_result(
                AlterPartitionResult(proposal.proposal_id, ErrorCode.INELIGIBLE_REPLICA), 10
            )
        assert replica.maximal_isr == {1, 2}
        produce(replica, acks=1, records=2, now_ms=20)  # LEO 4
        fetch(replica, 2, 4, now_ms=20)
        assert replica.high_watermark == expected_hw, fenced


def test_pending_shrink_keeps_the_old_isr_gating_the_hw() -> None:
    """docs/protocol.md §6, §8: the HW stays safe until the controller confirms the shrink."""
    replica, _, _ = make_leader(lag_ms=100)
    produce(replica, acks=1, records=2)
    fetch(replica, 2, 2, now_ms=50)
    _, effects = replica.maybe_shrink_isr(now_ms=500)
    proposal = of_type(effects, ProposeIsr)[0]
    assert proposal.kind is IsrChangeKind.SHRINK and proposal.new_isr == {1, 2}
    assert proposal.new_isr_with_epochs == ((1, 101), (2, 102))
    fetch(replica, 2, 2, now_ms=500)
    assert replica.high_watermark == 0  # broker 3 still gates it
    assert replica.maybe_shrink_isr(now_ms=600) == (None, [])  # never with one in flight
    _, effects = replica.on_alter_partition_result(
        AlterPartitionResult(proposal.proposal_id, ErrorCode.NONE, EPOCH, 11, frozenset({1, 2})),
        now_ms=600,
    )
    assert IsrUpdated(IsrChangeKind.SHRINK, frozenset({1, 2, 3}), frozenset({1, 2}), 11) in effects
    assert replica.high_watermark == 2 and replica.partition_epoch == 11


# -- acks -------------------------------------------------------------------------------------


def test_acks_all_completes_once_the_hw_passes_the_batch() -> None:
    replica, _, _ = make_leader()
    plan, effects = produce(replica, acks=-1, records=3, token="p1")
    assert isinstance(plan, AppendPlan) and plan.base_offset == 0 and plan.next_offset == 3
    assert not of_type(effects, CompleteProduce)
    fetch(replica, 2, 3)
    _, effects = fetch(replica, 3, 3)
    assert CompleteProduce("p1", ErrorCode.NONE, 0, 0) in effects


def test_parked_produce_times_out_or_fails_on_leadership_loss() -> None:
    replica, _, _ = make_leader()
    produce(replica, acks=-1, token="a", now_ms=0)
    produce(replica, acks=-1, token="b", now_ms=400)
    _, expired = replica.expire_produces(now_ms=600)
    assert [(e.token, e.error) for e in expired] == [("a", ErrorCode.REQUEST_TIMED_OUT)]
    _, effects = replica.apply_partition_state(
        PartitionState((1, 2, 3), frozenset({2, 3}), 2, EPOCH + 1, 11), now_ms=700
    )
    done = of_type(effects, CompleteProduce)
    assert [(e.token, e.error) for e in done] == [("b", ErrorCode.NOT_LEADER_OR_FOLLOWER)]
    assert StartFetching(2, EPOCH + 1) in effects


def test_produce_is_refused_by_a_follower_and_for_bad_acks() -> None:
    replica, _, _ = make_leader()
    assert produce(replica, acks=2)[0].error == ErrorCode.INVALID_REQUIRED_ACKS  # type: ignore[union-attr]
    replica.apply_partition_state(
        PartitionState((1, 2, 3), frozenset({2, 3}), 2, EPOCH + 1, 11), now_ms=0
    )
    rejected, _ = produce(replica, acks=1)
    assert isinstance(rejected, ProduceRejected)
    assert rejected.error == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_idempotent_retry_gets_the_original_offsets_and_is_not_appended() -> None:
    replica, _, _ = make_leader(isr=(1,), replicas=(1,), min_isr=1)
    produce(replica, acks=1, records=2, producer=(7, 0, 0))
    produce(replica, acks=1, records=1, producer=(8, 0, 0))
    retry, _ = produce(replica, acks=1, records=2, producer=(7, 0, 0))
    assert retry == DuplicateAppend(0, 1)  # a success with the original offsets, not an error
    assert replica.leo == 3
    gap, _ = produce(replica, acks=1, records=1, producer=(7, 0, 5))
    assert gap.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER  # type: ignore[union-attr]


# -- follower fetches ------------------------------------------------------------------------


def test_fetch_epoch_fencing_kip_320() -> None:
    replica, _, _ = make_leader()
    assert fetch(replica, 2, 0, epoch=EPOCH - 1)[0].error == ErrorCode.FENCED_LEADER_EPOCH
    assert fetch(replica, 2, 0, epoch=EPOCH + 1)[0].error == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert fetch(replica, 2, 0, epoch=-1)[0].error == ErrorCode.NONE  # -1: not checked


def test_fetch_from_a_replica_outside_the_assignment() -> None:
    replica, _, _ = make_leader(replicas=(1, 2), isr=(1, 2))
    BROKER_EPOCHS.setdefault(3, 103)
    assert fetch(replica, 3, 0)[0].error == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert fetch(replica, 3, 0, epoch=-1)[0].error == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_fetch_to_a_follower_is_refused() -> None:
    replica, _, _ = make_leader()
    replica.apply_partition_state(
        PartitionState((1, 2, 3), frozenset({2, 3}), 2, EPOCH + 1, 11), now_ms=0
    )
    assert fetch(replica, 3, 0, epoch=EPOCH + 1)[0].error == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_diverging_epoch_answer_leaves_follower_state_alone() -> None:
    """docs/protocol.md §11 step 3: (e', end') = endOffsetFor(lastFetchedEpoch)."""
    replica, _, _ = make_leader(leo=10, hw=10)
    # Leader cache: 4@0, 5@10. A follower that last fetched epoch 3 up to offset 12:
    answer, _ = fetch(replica, 2, 12, last_fetched_epoch=3)
    assert answer.error == ErrorCode.NONE
    assert answer.diverging_epoch == (3, 0)
    assert replica.replica_leo(2) == -1
    # Epoch 4 ended at 10 here; the follower is past that.
    assert fetch(replica, 2, 12, last_fetched_epoch=4)[0].diverging_epoch == (4, 10)
    # Within epoch 4's range: no divergence, records from offset 8.
    ok, _ = fetch(replica, 2, 8, last_fetched_epoch=4)
    assert ok.diverging_epoch is None and ok.read_until_offset == 10
    assert replica.replica_leo(2) == 8


def test_fetch_offset_out_of_range() -> None:
    replica, _, _ = make_leader(leo=10, hw=10)
    assert fetch(replica, 2, 11)[0].error == ErrorCode.OFFSET_OUT_OF_RANGE
    answer, _ = fetch(replica, 2, 11, last_fetched_epoch=EPOCH + 3)
    assert answer.error == ErrorCode.OFFSET_OUT_OF_RANGE
    assert (answer.log_start_offset, answer.log_end_offset) == (0, 10)


def test_stale_broker_epoch_fetch_changes_nothing_kip_903() -> None:
    """KIP-903 (docs/protocol.md §7): an old incarnation's queued fetch must not count."""
    view = brokers()
    replica, _, _ = make_leader(isr=(1, 2), view=view)
    produce(replica, acks=1, records=2)
    fetch(replica, 2, 2)
    assert replica.high_watermark == 2
    fetch(replica, 3, 0)  # the old incarnation of broker 3 fetched once, below the HW
    view.update(3, 203)  # broker 3 restarted with a new broker epoch
    answer, effects = fetch(replica, 3, 2, broker_epoch=103)
    assert answer.error == ErrorCode.STALE_BROKER_EPOCH
    assert replica.replica_leo(3) == 0
    assert not of_type(effects, ProposeIsr)
    _, expand = fetch(replica, 3, 2, broker_epoch=203)
    proposal = of_type(expand, ProposeIsr)[0]
    assert (3, 203) in proposal.new_isr_with_epochs


@pytest.mark.parametrize("forged_epoch", [-1, -2, 102, 104, 2**31 - 1])
def test_follower_fetch_without_the_current_broker_epoch_changes_nothing(
    forged_epoch: int,
) -> None:
    """Issue 16: a replica fetch must carry the follower's current registration. A client posing
    as paused follower 3 (with -1, an old epoch, or a made-up newer one) is refused: no LEO,
    no HW, no ISR change, and the acks=all write waits for the real follower."""
    replica, _, _ = make_leader(isr=(1, 2, 3))
    produce(replica, acks=-1, records=2)
    _, effects = fetch(replica, 2, 2)
    assert replica.high_watermark == 0 and not of_type(effects, CompleteProduce)
    answer, effects = fetch(replica, 3, 2, broker_epoch=forged_epoch)
    assert answer.error == ErrorCode.STALE_BROKER_EPOCH
    assert answer.read_until_offset == -1  # nothing read
    assert effects == []
    assert replica.replica_leo(3) == -1
    assert replica.high_watermark == 0
    _, effects = fetch(replica, 3, 2)  # the real follower, with its registration's epoch
    assert replica.high_watermark == 2
    assert of_type(effects, CompleteProduce)


def test_a_newer_broker_epoch_is_accepted_once_the_leader_knows_the_registration() -> None:
    """A follower that registered again (epoch 203) before the leader's metadata had it is
    refused (it retries after replica.fetch.backoff.ms, see the follower tests), and accepted
    once the metadata has it; a fetch of the older incarnation is refused from then on."""
    view = brokers()
    replica, _, _ = make_leader(isr=(1, 2), view=view)
    answer, effects = fetch(replica, 3, 0, broker_epoch=203)
    assert answer.error == ErrorCode.STALE_BROKER_EPOCH
    assert "retry" in answer.message
    assert effects == [] and replica.replica_leo(3) == -1
    view.update(3, 203)
    answer, effects = fetch(replica, 3, 0, broker_epoch=203)
    assert answer.error == ErrorCode.NONE
    assert (3, 203) in of_type(effects, ProposeIsr)[0].new_isr_with_epochs
    assert fetch(replica, 3, 0, broker_epoch=103)[0].error == ErrorCode.STALE_BROKER_EPOCH


# -- ISR expansion and AlterPartition answers ----------------------------------------------


def test_expansion_needs_the_hw_and_the_epoch_start() -> None:
    """docs/protocol.md §8 / KIP-320 rule 4 (`HasHighWatermarkReachedCurrentEpoch`)."""
    replica, _, _ = make_leader(isr=(1, 2), leo=10, hw=4)
    fetch(replica, 2, 10)
    assert replica.high_watermark == 10
    replica2, _, _ = make_leader(isr=(1, 2), leo=10, hw=4)
    # Broker 3 reached the HW (4) but not the epoch start (10): not in sync yet.
    assert not of_type(fetch(replica2, 3, 6)[1], ProposeIsr)
    effects = fetch(replica2, 3, 10)[1]
    proposal = of_type(effects, ProposeIsr)[0]
    assert proposal.kind is IsrChangeKind.EXPAND and proposal.new_isr == {1, 2, 3}
    assert replica2.maximal_isr == {1, 2, 3} and replica2.isr == {1, 2}


def test_fenced_or_shutting_down_broker_is_not_added() -> None:
    view = brokers()
    view.update(3, 103, fenced=True)
    replica, _, _ = make_leader(isr=(1, 2), view=view)
    assert not of_type(fetch(replica, 3, 0)[1], ProposeIsr)
    view.update(3, 103, in_controlled_shutdown=True)
    assert not of_type(fetch(replica, 3, 0)[1], ProposeIsr)
    view.update(3, 103)
    assert of_type(fetch(replica, 3, 0)[1], ProposeIsr)


def test_alter_partition_answers() -> None:
    """docs/protocol.md §9: revert on INELIGIBLE_REPLICA, wait on FENCED, retry transport errors."""
    replica, _, _ = make_leader(isr=(1, 2))
    first = of_type(fetch(replica, 3, 0)[1], ProposeIsr)[0]
    _, retry = replica.on_alter_partition_result(
        AlterPartitionResult(first.proposal_id, ErrorCode.REQUEST_TIMED_OUT), 0
    )
    assert len(retry) == 1 and isinstance(retry[0], ProposeIsr)
    assert retry[0].proposal_id == first.proposal_id and retry[0].delay_ms > 0
    assert replica.on_alter_partition_result(
        AlterPartitionResult(first.proposal_id, ErrorCode.FENCED_LEADER_EPOCH), 0
    ) == (None, [])
    assert replica.alter_partition_in_flight
    assert replica.on_alter_partition_result(
        AlterPartitionResult(first.proposal_id + 7, ErrorCode.NONE, EPOCH, 11, frozenset({1})),
        0,
    ) == (None, [])  # an answer to some other proposal
    replica.on_alter_partition_result(
        AlterPartitionResult(first.proposal_id, ErrorCode.INELIGIBLE_REPLICA), 0
    )
    assert not replica.alter_partition_in_flight and replica.maximal_isr == {1, 2}


def test_success_for_another_leader_epoch_is_ignored() -> None:
    replica, _, _ = make_leader(isr=(1, 2))
    proposal = of_type(fetch(replica, 3, 0)[1], ProposeIsr)[0]
    stale = AlterPartitionResult(
        proposal.proposal_id, ErrorCode.NONE, EPOCH - 1, 11, frozenset({1, 2, 3})
    )
    assert replica.on_alter_partition_result(stale, 0) == (None, [])
    assert replica.isr == {1, 2} and replica.alter_partition_in_flight


def test_metadata_with_a_newer_partition_epoch_settles_a_pending_change() -> None:
    replica, _, _ = make_leader(isr=(1, 2))
    proposal = of_type(fetch(replica, 3, 0)[1], ProposeIsr)[0]
    replica.apply_partition_state(
        PartitionState((1, 2, 3), frozenset({1, 2, 3}), LEADER, EPOCH, 11), 0
    )
    assert not replica.alter_partition_in_flight and replica.isr == {1, 2, 3}
    late = AlterPartitionResult(
        proposal.proposal_id, ErrorCode.NONE, EPOCH, 11, frozenset({1, 2, 3})
    )
    assert replica.on_alter_partition_result(late, 0) == (None, [])


# -- consumers and ListOffsets after an election -------------------------------------------


def test_offset_not_available_while_the_new_leaders_hw_lags_kip_207() -> None:
    replica, _, _ = make_leader(leo=10, hw=7)
    assert replica.list_offsets(-1, -1)[0].error == ErrorCode.OFFSET_NOT_AVAILABLE
    assert replica.list_offsets(-1, -2)[0].offset == 0
    lookup, _ = replica.list_offsets(-1, 1_000)
    assert lookup.needs_timestamp_lookup
    assert lookup.resolve(5) == (ErrorCode.NONE, 5)
    assert lookup.resolve(8)[0] == ErrorCode.OFFSET_NOT_AVAILABLE
    assert replica.check_consumer_fetch(-1, 9)[0].error == ErrorCode.OFFSET_NOT_AVAILABLE
    below, _ = replica.check_consumer_fetch(-1, 5)
    assert below.error == ErrorCode.NONE and below.read_until_offset == 7
    fetch(replica, 2, 10)
    fetch(replica, 3, 10)
    latest, _ = replica.list_offsets(-1, -1)
    assert (latest.error, latest.offset) == (ErrorCode.NONE, 10)
    assert replica.list_offsets(-1, 1_000)[0].resolve(None) == (ErrorCode.NONE, -1)


def test_consumer_reads_stop_at_the_hw_and_respect_epochs() -> None:
    replica, _, _ = make_leader()
    produce(replica, acks=1, records=4)
    fetch(replica, 2, 2)
    fetch(replica, 3, 4)
    answer, _ = replica.check_consumer_fetch(EPOCH, 0)
    assert answer.read_until_offset == 2 == answer.high_watermark
    assert replica.check_consumer_fetch(EPOCH, 5)[0].error == ErrorCode.OFFSET_OUT_OF_RANGE
    assert replica.check_consumer_fetch(EPOCH - 1, 0)[0].error == ErrorCode.FENCED_LEADER_EPOCH
    assert replica.list_offsets(EPOCH + 1, -1)[0].error == ErrorCode.UNKNOWN_LEADER_EPOCH


def test_offset_for_leader_epoch_answers_where_each_epoch_ends_kip_320() -> None:
    """A consumer validating its position after a leader change asks where the epoch of its
    last record ends in the leader's log (Kafka's endOffsetFor); fenced like a fetch."""
    replica, cache, _ = make_leader(leo=7, hw=7)  # epochs: EPOCH-1 from 0, EPOCH from 7
    produce(replica, acks=1, records=3)  # offsets 7..9 in EPOCH
    assert [(e.epoch, e.start_offset) for e in cache] == [(EPOCH - 1, 0), (EPOCH, 7)]

    def ask(current: int, epoch: int) -> tuple[ErrorCode, int, int]:
        answer, _ = replica.offset_for_leader_epoch(current, epoch)
        return answer.error, answer.leader_epoch, answer.end_offset

    assert ask(EPOCH, EPOCH - 1) == (ErrorCode.NONE, EPOCH - 1, 7)  # ends where EPOCH starts
    assert ask(EPOCH, EPOCH) == (ErrorCode.NONE, EPOCH, 10)  # the latest epoch ends at the LEO
    assert ask(-1, EPOCH - 1) == (ErrorCode.NONE, EPOCH - 1, 7)  # -1: not checked
    assert ask(EPOCH, EPOCH - 3) == (ErrorCode.NONE, EPOCH - 3, 0)  # older than the cache
    assert ask(EPOCH, EPOCH + 1) == (ErrorCode.NONE, -1, -1)  # an epoch this log never had
    assert ask(EPOCH - 1, EPOCH - 1)[0] == ErrorCode.FENCED_LEADER_EPOCH
    assert ask(EPOCH + 1, EPOCH - 1)[0] == ErrorCode.UNKNOWN_LEADER_EPOCH
    replica.apply_partition_state(
        PartitionState((1, 2, 3), frozenset({2, 3}), 2, EPOCH + 1, 11), now_ms=0
    )
    assert ask(EPOCH + 1, EPOCH)[0] == ErrorCode.NOT_LEADER_OR_FOLLOWER


# -- lag tracking (docs/protocol.md §7, §8; a paused follower) ----------------------------


def test_a_paused_follower_is_kept_within_the_lag_time_and_dropped_after() -> None:
    replica, _, _ = make_leader(lag_ms=1_000)
    produce(replica, acks=1, records=1, now_ms=0)
    fetch(replica, 2, 1, now_ms=100)
    fetch(replica, 3, 1, now_ms=100)
    produce(replica, acks=1, records=1, now_ms=200)
    fetch(replica, 2, 2, now_ms=300)
    assert replica.maybe_shrink_isr(now_ms=1_000) == (None, [])  # broker 3 caught up at 100
    _, effects = replica.maybe_shrink_isr(now_ms=1_101)
    assert of_type(effects, ProposeIsr)[0].new_isr == {1, 2}


def test_a_slow_follower_counts_as_caught_up_as_of_its_previous_fetch() -> None:
    """lastCaughtUpTime: reaching the leader LEO seen at the previous fetch counts from then."""
    replica, _, _ = make_leader(lag_ms=1_000)
    fetch(replica, 2, 0, now_ms=0)
    fetch(replica, 3, 0, now_ms=0)
    for step in range(1, 6):
        # The leader appends between every two fetches, so broker 3 is never at the LEO ...
        produce(replica, acks=1, records=1, now_ms=step * 500)
        fetch(replica, 2, step, now_ms=step * 500)
        fetch(replica, 3, step - 1, now_ms=step * 500 + 1)
    # ... but each fetch reached the LEO of the fetch before it: still in sync.
    (remote_3,) = [r for r in replica.remote_replicas if r.replica_id == 3]
    assert remote_3.last_caught_up_time_ms == 2_001
    assert replica.maybe_shrink_isr(now_ms=3_000) == (None, [])
    # A follower that falls further behind every time is dropped after the lag time.
    for step in range(6, 12):
        produce(replica, acks=1, records=3, now_ms=step * 500)
        fetch(replica, 2, replica.leo, now_ms=step * 500)
        fetch(replica, 3, replica.replica_leo(3) + 1, now_ms=step * 500 + 1)
    assert of_type(replica.maybe_shrink_isr(now_ms=6_000)[1], ProposeIsr)


def test_broker_registrations_view() -> None:
    view = BrokerEligibilityView()
    view.update(4, 40)
    assert view.broker_epoch(4) == 40 and view.broker_epoch(5) == -1
    assert view.is_isr_eligible(4, 40) and view.is_isr_eligible(4, -1)
    assert not view.is_isr_eligible(4, 39)
    view.remove(4)
    assert not view.is_isr_eligible(4, 40)
