"""Follower-side rules (broker/replication/follower.py through PartitionReplica).

Reference: docs/protocol.md §11 (truncate-on-fetch, the follower's truncation offset,
OFFSET_OUT_OF_RANGE handling, fetch errors), §6 (follower HW), KAFKA-7164, KIP-320.
Pure: no sockets, no event loop.
"""

from __future__ import annotations

import pytest

from minibroker.broker.replication.eligibility import BrokerEligibilityView
from minibroker.broker.replication.events import (
    AdvanceLogStartOffset,
    AppendAsFollower,
    Backoff,
    FetchPosition,
    FetchResponse,
    HighWatermarkChanged,
    PartitionState,
    ReplicaConfig,
    Role,
    StartFetching,
    StopFetching,
    TruncateFullyAndStartAt,
    TruncateTo,
)
from minibroker.broker.replication.follower import (
    decision_for_out_of_range,
    follower_high_watermark,
    truncation_for_diverging_epoch,
)
from minibroker.broker.replication.partition import PartitionReplica
from minibroker.broker.storage.epoch_cache import EpochCache
from minibroker.client.batch import iter_batches
from minibroker.client.errors import ErrorCode
from minibroker.client.records import encode_batch

ME = 2
LEADER = 1
EPOCH = 5


def make_follower(
    entries: list[tuple[int, int]] | None = None,
    leo: int = 0,
    hw: int = 0,
    *,
    gaps: bool = False,
) -> tuple[PartitionReplica, EpochCache, list]:  # type: ignore[type-arg]
    cache = EpochCache(entries or [])
    replica = PartitionReplica(
        ME,
        cache,
        BrokerEligibilityView(),
        ReplicaConfig(replica_fetch_backoff_ms=100, offset_gaps_allowed=gaps),
        leo=leo,
        high_watermark=hw,
    )
    _, effects = replica.apply_partition_state(
        PartitionState((1, 2, 3), frozenset({1, 2, 3}), LEADER, EPOCH, 7), now_ms=0
    )
    return replica, cache, effects


def batch(base_offset: int, epoch: int, records: int = 1) -> bytes:
    return encode_batch(
        [(0, None, b"x", ())] * records, base_offset=base_offset, partition_leader_epoch=epoch
    )


# -- truncation rule (docs/protocol.md §11 step 4), as a table ---------------------------


CACHE = [(1, 0), (3, 10), (5, 20)]  # epochs 1, 3, 5; LEO 30


@pytest.mark.parametrize(
    ("leader_epoch", "leader_end", "expected", "completed"),
    [
        (3, 15, 15, True),  # same epoch known here: min(leader end 15, own end 20, LEO)
        (3, 25, 20, True),  # the leader's epoch 3 ran longer: our own end bounds it
        (4, 22, 20, False),  # we never saw epoch 4: end of our epoch 3 (20), ask again
        (5, 40, 30, True),  # our latest epoch: own end is the LEO
        (0, 5, 0, True),  # below our first epoch: endOffsetFor gives (0, 0)
        (-1, 12, 12, True),  # old protocol, no epoch: min(end, LEO)
        (3, -1, 30, True),  # no end offset: keep the log
    ],
)
def test_truncation_offset_for_a_diverging_epoch(
    leader_epoch: int, leader_end: int, expected: int, completed: bool
) -> None:
    decision = truncation_for_diverging_epoch(leader_epoch, leader_end, EpochCache(CACHE), 30)
    assert (decision.offset, decision.completed) == (expected, completed)


def test_truncation_when_the_follower_tracks_no_epoch_at_or_below() -> None:
    decision = truncation_for_diverging_epoch(2, 8, EpochCache([(5, 20)]), 30)
    # Own endOffsetFor(2) = (2, 20): below every epoch, so "same epoch" with end 20.
    assert decision.offset == 8
    empty = truncation_for_diverging_epoch(2, 8, EpochCache(), 30)
    assert (empty.offset, empty.completed) == (8, True)


def test_out_of_range_decisions_are_never_fatal() -> None:
    """docs/protocol.md §11 step 7, KAFKA-7414."""
    assert decision_for_out_of_range(50, 40, 0).truncate_to == 40  # unclean: leader is shorter
    behind = decision_for_out_of_range(5, 100, 30)
    assert behind.truncate_fully_and_start_at == 30 and behind.truncate_to is None
    assert decision_for_out_of_range(50, 100, 30).backoff
    assert decision_for_out_of_range(50, -1, -1).backoff


def test_follower_hw_is_clamped_to_its_log() -> None:
    assert follower_high_watermark(100, 0, 40) == 40
    assert follower_high_watermark(20, 0, 40) == 20
    assert follower_high_watermark(2, 5, 40) == 5


# -- fetch state ---------------------------------------------------------------------------


def test_becoming_follower_starts_fetching_from_the_leo_with_the_latest_epoch() -> None:
    replica, _, effects = make_follower([(2, 0), (4, 6)], leo=9, hw=3)
    assert effects == [StartFetching(LEADER, EPOCH)]
    assert replica.role is Role.FOLLOWER
    assert replica.next_fetch(0)[0] == FetchPosition(LEADER, EPOCH, 9, 4, 0)


def test_a_new_epoch_restarts_fetching_even_from_the_same_leader_kafka_7164() -> None:
    replica, _, _ = make_follower()
    isr_only = PartitionState((1, 2, 3), frozenset({1, 2}), LEADER, EPOCH, 8)
    assert replica.apply_partition_state(isr_only, 0)[1] == []
    new_epoch = PartitionState((1, 2, 3), frozenset({1, 2}), LEADER, EPOCH + 1, 9)
    assert replica.apply_partition_state(new_epoch, 0)[1] == [StartFetching(LEADER, EPOCH + 1)]
    offline = PartitionState((1, 2, 3), frozenset({1}), -1, EPOCH + 2, 10)
    assert replica.apply_partition_state(offline, 0)[1] == [
        StopFetching("the partition has no leader")
    ]
    assert replica.next_fetch(0)[0] is None


def test_records_are_appended_then_the_hw_follows_the_leader() -> None:
    replica, _, _ = make_follower()
    position = replica.next_fetch(0)[0]
    assert position is not None
    records = batch(0, EPOCH, 3)
    _, effects = replica.on_fetch_response(
        position, FetchResponse(high_watermark=2, log_start_offset=0, records=records), 0
    )
    assert effects == [AppendAsFollower(records, 0)]
    headers = [h for _, h in iter_batches(records)]
    _, effects = replica.on_follower_appended(3, headers)
    assert effects == [HighWatermarkChanged(2)]
    assert replica.leo == 3 and replica.high_watermark == 2


def test_empty_answer_moves_the_hw_and_the_log_start() -> None:
    replica, _, _ = make_follower(leo=10, hw=2)
    position = replica.next_fetch(0)[0]
    assert position is not None
    _, effects = replica.on_fetch_response(
        position, FetchResponse(high_watermark=12, log_start_offset=4), 0
    )
    assert effects == [HighWatermarkChanged(10), AdvanceLogStartOffset(4)]


def test_diverging_epoch_truncates_even_at_the_leo_kafka_10706() -> None:
    replica, _, _ = make_follower([(3, 0), (4, 8)], leo=8)
    position = replica.next_fetch(0)[0]
    assert position is not None and position.last_fetched_epoch == 4
    _, effects = replica.on_fetch_response(position, FetchResponse(diverging_epoch=(3, 8)), 0)
    assert len(effects) == 1 and isinstance(effects[0], TruncateTo) and effects[0].offset == 8


def test_answers_to_another_epoch_or_position_are_ignored_kip_320() -> None:
    replica, _, _ = make_follower([(3, 0)], leo=10)
    position = replica.next_fetch(0)[0]
    assert position is not None
    old = FetchPosition(LEADER, EPOCH - 1, 10, 3, 0)
    assert replica.on_fetch_response(old, FetchResponse(diverging_epoch=(1, 0)), 0) == (None, [])
    moved = FetchPosition(LEADER, EPOCH, 7, 3, 0)
    assert replica.on_fetch_response(moved, FetchResponse(diverging_epoch=(1, 0)), 0) == (None, [])
    replica.apply_partition_state(PartitionState((1, 2, 3), frozenset({3}), 3, EPOCH + 1, 8), 0)
    assert replica.on_fetch_response(position, FetchResponse(diverging_epoch=(1, 0)), 0) == (
        None,
        [],
    )


def test_out_of_range_answer_truncates_fully_below_the_leaders_log_start() -> None:
    replica, _, _ = make_follower([(3, 0)], leo=5)
    position = replica.next_fetch(0)[0]
    assert position is not None
    response = FetchResponse(ErrorCode.OFFSET_OUT_OF_RANGE, log_start_offset=30, log_end_offset=90)
    _, effects = replica.on_fetch_response(position, response, 0)
    assert effects == [TruncateFullyAndStartAt(30, "below the leader's log start")]
    assert replica.on_log_truncated(30, 30) == (None, [HighWatermarkChanged(30)])
    assert replica.next_fetch(0)[0] == FetchPosition(LEADER, EPOCH, 30, 3, 30)


def test_a_stale_broker_epoch_refusal_backs_off_and_retries() -> None:
    """The leader refuses a fetch whose broker epoch is not the registration it knows (e.g.
    this broker registered again and the leader's metadata lags): back off, then ask again,
    never stop fetching (issue 16)."""
    replica, _, _ = make_follower()
    position = replica.next_fetch(0)[0]
    assert position is not None
    _, effects = replica.on_fetch_response(
        position, FetchResponse(ErrorCode.STALE_BROKER_EPOCH), now_ms=1_000
    )
    assert effects == [Backoff(100, "STALE_BROKER_EPOCH")]
    assert replica.next_fetch(1_050)[0] is None
    assert replica.next_fetch(1_100)[0] == position


def test_fenced_waits_for_metadata_and_unknown_epoch_backs_off() -> None:
    """docs/protocol.md §11 step 8."""
    replica, _, _ = make_follower()
    position = replica.next_fetch(0)[0]
    assert position is not None
    _, effects = replica.on_fetch_response(
        position, FetchResponse(ErrorCode.UNKNOWN_LEADER_EPOCH), now_ms=1_000
    )
    assert effects == [Backoff(100, "UNKNOWN_LEADER_EPOCH")]
    assert replica.next_fetch(1_050)[0] is None
    assert replica.next_fetch(1_100)[0] == position
    _, effects = replica.on_fetch_response(
        position, FetchResponse(ErrorCode.FENCED_LEADER_EPOCH), 0
    )
    assert isinstance(effects[0], StopFetching)
    assert replica.next_fetch(10_000)[0] is None
    newer = PartitionState((1, 2, 3), frozenset({1, 2, 3}), LEADER, EPOCH + 1, 9)
    assert replica.apply_partition_state(newer, 0)[1] == [StartFetching(LEADER, EPOCH + 1)]
    assert replica.next_fetch(10_000)[0] is not None


def test_records_not_starting_at_the_leo_are_refused() -> None:
    replica, _, _ = make_follower(leo=4)
    position = replica.next_fetch(0)[0]
    assert position is not None
    _, effects = replica.on_fetch_response(position, FetchResponse(records=batch(6, EPOCH)), 0)
    assert len(effects) == 1 and isinstance(effects[0], Backoff)


def test_a_compacted_follower_takes_records_starting_past_its_leo() -> None:
    """A cleaned leader log has gaps: the first batch may start above the LEO (Kafka's rule),
    never below it."""
    replica, _, _ = make_follower(leo=4, gaps=True)
    position = replica.next_fetch(0)[0]
    assert position is not None
    records = batch(6, EPOCH, 2) + batch(11, EPOCH)
    _, effects = replica.on_fetch_response(
        position, FetchResponse(high_watermark=12, log_start_offset=0, records=records), 0
    )
    assert effects == [AppendAsFollower(records, 4)]
    _, effects = replica.on_follower_appended(12, [h for _, h in iter_batches(records)])
    assert effects == [HighWatermarkChanged(12)]
    assert replica.leo == 12
    # Below the LEO is refused with gaps allowed too.
    position = replica.next_fetch(0)[0]
    assert position is not None
    _, effects = replica.on_fetch_response(position, FetchResponse(records=batch(10, EPOCH)), 0)
    assert len(effects) == 1 and isinstance(effects[0], Backoff)
    assert "at or above 12" in effects[0].reason


def test_repeated_divergence_without_progress_backs_off() -> None:
    replica, _, _ = make_follower([(3, 0), (5, 8)], leo=8)
    position = replica.next_fetch(0)[0]
    assert position is not None
    answer = FetchResponse(diverging_epoch=(5, 8))
    _, first = replica.on_fetch_response(position, answer, 0)
    assert isinstance(first[0], TruncateTo)
    _, again = replica.on_fetch_response(position, answer, 0)
    assert isinstance(again[0], Backoff)
