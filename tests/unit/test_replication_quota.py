"""KIP-73 replication quotas (broker/replication/quota.py), pure, with a fake clock: the rate
over its windows, the exceeded check, who is throttled, and which partitions a follower fetch
asks for. The property: recording at most F bytes at a time, and only while the quota is not
exceeded, the measured rate never exceeds the limit by more than F over the measured span."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.replication.quota import (
    RateQuota,
    follower_throttles,
    leader_throttles,
    select_fetch_partitions,
)
from minibroker.client.replication_throttle import UNTHROTTLED, parse_throttled_replicas


def test_the_rate_grows_from_one_window_to_all_of_them_then_slides() -> None:
    quota = RateQuota(1000, samples=11, window_ms=1000)
    assert quota.rate(0) == 0.0 and not quota.is_exceeded(0)
    quota.record(500, 10_000)
    assert quota.rate(10_000) == 500.0  # over one window at first
    assert quota.rate(12_000) == 250.0  # over the two seconds since
    quota.record(1500, 12_000)
    assert quota.rate(12_000) == 1000.0 and not quota.is_exceeded(12_000)
    quota.record(1, 12_000)
    assert quota.is_exceeded(12_000)
    assert quota.rate(20_000) == 2001 / 10
    # 500 was recorded in window 10 (10.0 s - 11.0 s): it counts until 21.0 s; the span stops
    # growing at 11 windows.
    assert quota.rate(20_999) == 2001 * 1000 / 10_999 and quota.rate(21_500) == 1501 / 11
    assert quota.rate(23_000) == 0.0
    assert quota.recorded_bytes == 2001


def test_after_an_idle_spell_the_span_starts_again() -> None:
    quota = RateQuota(100, samples=3, window_ms=100)
    quota.record(10, 0)
    quota.record(10, 1_000)  # the first window expired long ago
    assert quota.rate(1_000) == 100.0 and not quota.is_exceeded(1_000)


def test_no_limit_is_never_exceeded_and_a_new_limit_applies_at_once() -> None:
    quota = RateQuota()
    quota.record(10**12, 0)
    assert quota.unlimited and not quota.is_exceeded(0)
    quota.set_limit(10)
    assert quota.is_exceeded(0)
    quota.set_limit(UNTHROTTLED)
    assert not quota.is_exceeded(0)


def test_a_clock_going_back_drops_what_it_cannot_place() -> None:
    quota = RateQuota(100, samples=3, window_ms=100)
    quota.record(1000, 10_000)
    assert quota.rate(5_000) == 0.0
    quota.record(10, 5_000)
    assert quota.rate(5_000) == 100.0


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(1, 100_000),
    fetch=st.integers(1, 50_000),
    samples=st.integers(1, 12),
    window_ms=st.integers(1, 1_000),
    steps=st.lists(st.tuples(st.integers(0, 3_000), st.integers(0, 50_000)), max_size=200),
)
def test_the_measured_rate_stays_within_one_fetch_of_the_limit(
    limit: int, fetch: int, samples: int, window_ms: int, steps: list[tuple[int, int]]
) -> None:
    quota = RateQuota(limit, samples=samples, window_ms=window_ms)
    now = 0
    for gap, size in steps:
        now += gap
        if not quota.is_exceeded(now):
            quota.record(min(size, fetch), now)
        bound = limit + fetch * 1000.0 / quota.span_ms(now)
        assert quota.rate(now) <= bound + 1e-6
        assert quota.rate(now) <= limit + fetch * 1000.0 / window_ms + 1e-6


@settings(max_examples=100, deadline=None)
@given(limit=st.integers(1_000, 100_000), ratio=st.floats(0.02, 1.0))
def test_a_greedy_sender_moves_the_limit_in_the_long_run(limit: int, ratio: float) -> None:
    """Asking every 10 ms for up to twice the limit, a throttled sender gets the limit (within
    one fetch per span)."""
    fetch = max(int(limit * ratio), 1)
    quota = RateQuota(limit, samples=11, window_ms=1000)
    for now in range(0, 120_000, 10):
        if not quota.is_exceeded(now):
            quota.record(fetch, now)
    moved = quota.recorded_bytes
    assert limit * 120 * 0.9 <= moved <= limit * 120 + fetch * (120 // 11 + 1) + fetch


def test_who_is_throttled() -> None:
    listed = parse_throttled_replicas("0:3,1:1")
    # Leader side: the follower (the spec) or the leader itself (Kafka) named, follower
    # out of sync.
    assert leader_throttles(listed, 0, 1, 3, frozenset({1, 2}))
    assert leader_throttles(listed, 1, 1, 3, frozenset({1, 2}))
    assert not leader_throttles(listed, 0, 1, 3, frozenset({1, 2, 3}))
    assert not leader_throttles(listed, 0, 2, 4, frozenset({2}))
    assert leader_throttles(parse_throttled_replicas("*"), 7, 2, 4, frozenset({2}))
    assert not leader_throttles(parse_throttled_replicas(""), 0, 1, 3, frozenset({1}))
    # Follower side: itself named, out of sync.
    assert follower_throttles(listed, 0, 3, frozenset({1}))
    assert not follower_throttles(listed, 0, 3, frozenset({1, 3}))
    assert not follower_throttles(listed, 1, 3, frozenset({1}))


def test_a_fetch_asks_for_one_throttled_partition_in_turn_and_none_when_exceeded() -> None:
    parts = ["a", "b", "c", "d"]
    throttled = {"b", "d"}
    asked, left, cursor = select_fetch_partitions(parts, throttled, True, 0)
    assert (asked, sorted(left), cursor) == (["a", "c"], ["b", "d"], 0)
    asked, left, cursor = select_fetch_partitions(parts, throttled, False, 0)
    assert (asked, left, cursor) == (["a", "c", "b"], ["d"], 1)
    asked, left, cursor = select_fetch_partitions(parts, throttled, False, cursor)
    assert (asked, left, cursor) == (["a", "c", "d"], ["b"], 2)
    assert select_fetch_partitions(parts, set(), True, 5) == (parts, [], 5)
