"""The ISR rules (broker/replication/isr.py) and the produce purgatory (acks.py), as tables.

Reference: docs/protocol.md §2 (acks=all), §8 (expand/shrink), §9 (AlterPartition answers).
Pure: no I/O; time is an explicit `now_ms`.
"""

from __future__ import annotations

import pytest

from minibroker.broker.replication.acks import (
    TIMED_OUT_MESSAGE,
    WAIT_TIMED_OUT_MESSAGE,
    PendingProduce,
    ProducePurgatory,
    acks_all_result,
)
from minibroker.broker.replication.events import (
    CompleteProduce,
    IsrChangeKind,
    LeaderRecoveryState,
    ProposeIsr,
)
from minibroker.broker.replication.isr import (
    AnswerAction,
    CommittedIsr,
    PendingExpandIsr,
    PendingShrinkIsr,
    answer_action,
    isr_with_epochs,
    out_of_sync_replicas,
    retry_of,
    should_expand,
)
from minibroker.broker.replication.remote import RemoteReplica
from minibroker.client.errors import ErrorCode

PROPOSAL = ProposeIsr(1, IsrChangeKind.EXPAND, 5, 7, ((1, 101),), LeaderRecoveryState.RECOVERED)
COMMITTED = CommittedIsr(frozenset({1, 2}))


@pytest.mark.parametrize(
    ("state", "replica", "leo", "hw", "epoch_start", "eligible", "expected"),
    [
        (COMMITTED, 3, 10, 10, 10, True, True),  # at the HW and the epoch start
        (COMMITTED, 3, 12, 10, 8, True, True),  # beyond both
        (COMMITTED, 3, 9, 10, 8, True, False),  # below the HW
        (COMMITTED, 3, 10, 4, 11, True, False),  # below this epoch's start (KIP-320)
        (COMMITTED, 3, 10, 10, 10, False, False),  # fenced / shutting down / stale epoch
        (COMMITTED, 2, 10, 10, 10, True, False),  # already a member
        (PendingExpandIsr(frozenset({1, 2}), 4, PROPOSAL), 3, 10, 10, 10, True, False),
        (PendingShrinkIsr(frozenset({1, 2}), frozenset({2}), PROPOSAL), 3, 10, 10, 10, True, False),
    ],
)
def test_expansion_rule(
    state: CommittedIsr | PendingExpandIsr | PendingShrinkIsr,
    replica: int,
    leo: int,
    hw: int,
    epoch_start: int,
    eligible: bool,
    expected: bool,
) -> None:
    assert should_expand(state, replica, leo, hw, epoch_start, eligible) is expected


def _remote(replica_id: int, leo: int, caught_up_ms: int, broker_epoch: int = -1) -> RemoteReplica:
    return RemoteReplica(
        replica_id, leo=leo, last_caught_up_time_ms=caught_up_ms, broker_epoch=broker_epoch
    )


def test_shrink_rule_drops_members_behind_for_the_lag_time() -> None:
    remotes = {2: _remote(2, 10, 0), 3: _remote(3, 4, 900), 4: _remote(4, 4, 899)}
    # Leader LEO 10 at 1_900 with lag 1_000: 2 is at the LEO, 3 caught up 1_000 ms ago (kept),
    # 4 caught up 1_001 ms ago (out), 5 never fetched (out); the leader itself never is.
    out = out_of_sync_replicas({1, 2, 3, 4, 5}, 1, remotes, 10, 1_900, 1_000)
    assert out == {4, 5}


def test_an_implied_fetch_keeps_an_idle_partitions_follower_in_sync() -> None:
    # Follower 2 read offset 10, the leader's LEO, at 0. The partition stays idle; its fetch
    # session carries it unchanged in requests up to 1_850 (KIP-227: no read). A record
    # arrives at 1_900 (LEO 11): with lag 1_000 the follower is in sync as of 1_850.
    remote = RemoteReplica(2)
    remote.update_fetch_state(10, 0, 0, 10, 7)
    stale = RemoteReplica(2)
    stale.update_fetch_state(10, 0, 0, 10, 7)
    remote.implied_fetch(1_850)
    assert out_of_sync_replicas({1, 2}, 1, {2: remote}, 11, 1_900, 1_000) == set()
    assert out_of_sync_replicas({1, 2}, 1, {2: stale}, 11, 1_900, 1_000) == {2}
    # Its next real read, from 10 against LEO 11, counts from the implied one (Kafka's rule).
    remote.update_fetch_state(10, 0, 2_000, 11, 7)
    assert remote.last_caught_up_time_ms == 1_850


def test_an_implied_fetch_of_a_lagging_follower_or_an_older_one_changes_nothing() -> None:
    lagging = RemoteReplica(2)
    lagging.update_fetch_state(4, 0, 0, 10, 7)  # behind the leader's LEO 10 at its last read
    lagging.implied_fetch(1_850)
    assert lagging.last_caught_up_time_ms < 0  # never caught up
    assert lagging.last_fetch_time_ms == 0
    later = RemoteReplica(2)
    later.update_fetch_state(10, 0, 2_000, 10, 7)
    later.implied_fetch(1_850)  # a request older than its last read
    assert (later.last_caught_up_time_ms, later.last_fetch_time_ms) == (2_000, 2_000)
    unknown = RemoteReplica(2)  # nothing heard in this leadership
    unknown.implied_fetch(1_850)
    assert unknown.last_fetch_time_ms < 0


def test_isr_with_epochs_uses_the_leaders_registration_and_the_followers_fetches() -> None:
    remotes = {2: _remote(2, 0, 0, broker_epoch=202), 3: _remote(3, 0, 0)}
    assert isr_with_epochs({3, 1, 2, 4}, 1, 101, remotes) == ((1, 101), (2, 202), (3, -1), (4, -1))


@pytest.mark.parametrize(
    ("error", "action"),
    [
        (ErrorCode.NONE, AnswerAction.COMMIT),
        (ErrorCode.INELIGIBLE_REPLICA, AnswerAction.REVERT),
        (ErrorCode.OPERATION_NOT_ATTEMPTED, AnswerAction.REVERT),
        (ErrorCode.FENCED_LEADER_EPOCH, AnswerAction.WAIT_FOR_METADATA),
        (ErrorCode.INVALID_UPDATE_VERSION, AnswerAction.WAIT_FOR_METADATA),
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, AnswerAction.WAIT_FOR_METADATA),
        (ErrorCode.NEW_LEADER_ELECTED, AnswerAction.WAIT_FOR_METADATA),
        (ErrorCode.NOT_CONTROLLER, AnswerAction.RETRY),
        (ErrorCode.REQUEST_TIMED_OUT, AnswerAction.RETRY),
    ],
)
def test_alter_partition_answer_actions(error: ErrorCode, action: AnswerAction) -> None:
    assert answer_action(error) is action


def test_a_retry_is_the_same_proposal_later() -> None:
    again = retry_of(PROPOSAL, 100)
    assert again.delay_ms == 100
    assert (again.proposal_id, again.partition_epoch, again.new_isr_with_epochs) == (
        1,
        7,
        ((1, 101),),
    )


# -- acks=all purgatory ------------------------------------------------------------------------


ISR3 = frozenset({1, 2, 3})


def test_a_produce_the_hw_passed_is_answered_at_once() -> None:
    purgatory = ProducePurgatory()
    done = purgatory.park(PendingProduce("a", 0, 5, 100), 5, 0, ISR3, 2)
    assert done == [CompleteProduce("a", ErrorCode.NONE, 0, 0)] and len(purgatory) == 0
    assert purgatory.park(PendingProduce("b", 5, 8, 100), 7, 0, ISR3, 2) == []
    assert len(purgatory) == 1


def test_completion_in_order_as_the_hw_moves() -> None:
    purgatory = ProducePurgatory()
    for token, base, required in (("a", 0, 3), ("b", 3, 6), ("c", 6, 9)):
        purgatory.park(PendingProduce(token, base, required, 100), 0, 0, ISR3, 2)
    assert [c.token for c in purgatory.complete(6, 0, ISR3, 2)] == ["a", "b"]
    assert [c.token for c in purgatory.complete(8, 0, ISR3, 2)] == []
    assert [c.token for c in purgatory.complete(9, 0, ISR3, 2)] == ["c"]


def test_committed_below_min_isr_is_not_enough_replicas_after_append() -> None:
    result = acks_all_result(PendingProduce("a", 4, 5, 100), 2, frozenset({1}), 2)
    assert (result.error, result.base_offset, result.log_start_offset) == (
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        4,
        2,
    )


def test_expiry_fail_all_and_expire_token() -> None:
    purgatory = ProducePurgatory()
    for token, deadline in (("a", 100), ("b", 200), ("c", 300)):
        purgatory.park(PendingProduce(token, 0, 9, deadline), 0, 0, ISR3, 2)
    expired = purgatory.expire(200, 0)
    assert [(c.token, c.error, c.message) for c in expired] == [
        ("a", ErrorCode.REQUEST_TIMED_OUT, TIMED_OUT_MESSAGE),
        ("b", ErrorCode.REQUEST_TIMED_OUT, TIMED_OUT_MESSAGE),
    ]
    assert purgatory.expire_token("a", 0) == []  # answered already
    purgatory.park(PendingProduce("d", 0, 9, 400), 0, 0, ISR3, 2)
    assert [(c.token, c.message) for c in purgatory.expire_token("d", 0)] == [
        ("d", WAIT_TIMED_OUT_MESSAGE)
    ]
    failed = purgatory.fail_all(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved", 3)
    assert failed == [CompleteProduce("c", ErrorCode.NOT_LEADER_OR_FOLLOWER, 0, 3, "moved")]
    assert len(purgatory) == 0
