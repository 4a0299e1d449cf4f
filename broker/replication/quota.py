"""Replication throttles (KIP-73): the byte-rate quota and who is throttled.

Pure: no I/O, no clock (every call takes `now_ms`). Kafka's `ReplicationQuotaManager`: a byte
rate over `samples` windows of `window_ms` (Kafka's `replication.quota.window.num` = 11,
`replication.quota.window.size.seconds` = 1) against a limit. A quota is exceeded when the
measured rate is above the limit; the caller checks before it sends or asks (leaving throttled
partitions out of that fetch) and records what it moved after. As long as each record is at
most F bytes and is made only while the quota was not exceeded, the measured rate never goes
above `limit + F / span` (`RateQuota`).

Who is throttled (`client/replication_throttle.py` parses the topic lists):
  * leader side (Kafka's `shouldLeaderThrottle`): the follower is not in the ISR and the topic's
    `leader.replication.throttled.replicas` names the partition with that follower (this
    project's spec) or with this leader (Kafka's own reading: the reassign tool lists the
    current replicas, any of which may lead);
  * follower side (`shouldFollowerThrottle`): this broker is not in the ISR and the topic's
    `follower.replication.throttled.replicas` names the partition with it.
Nothing is throttled while the rate is unset (UNTHROTTLED).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from minibroker.client.replication_throttle import UNTHROTTLED, ThrottledReplicas

QUOTA_SAMPLES = 11  # Kafka: replication.quota.window.num
QUOTA_WINDOW_MS = 1000  # Kafka: replication.quota.window.size.seconds = 1

T = TypeVar("T")


class RateQuota:
    """A sliding-window byte rate (Kafka's replication quota) against a limit in bytes/s.

    Time is cut into aligned windows of `window_ms`; the last `samples` of them (the current
    one included) count. The rate is their bytes over a span that grows from one window, at
    the first record after an idle spell, to `samples` windows, and then stays there: it never
    shrinks, so an old window expiring can only lower the rate (Kafka's `Rate` divides by the
    time since the oldest live sample, at least `samples - 1` windows, and jumps up by a tenth
    when that sample expires). Hence, recording at most F bytes at a time and only while the
    quota is not exceeded, the measured rate never exceeds `limit + F / span`, and after the
    first `samples` windows `limit + F / (samples * window)`."""

    def __init__(
        self,
        limit: int = UNTHROTTLED,
        *,
        samples: int = QUOTA_SAMPLES,
        window_ms: int = QUOTA_WINDOW_MS,
    ) -> None:
        if samples < 1 or window_ms < 1:
            raise ValueError("a rate quota needs at least 1 window of at least 1 ms")
        self.limit = limit
        self.samples = samples
        self.window_ms = window_ms
        self._windows: dict[int, int] = {}  # window index (now // window_ms) -> bytes
        self._start_ms = 0  # the first record after an idle spell (no live window)
        # Lifetime totals, for the metrics: bytes recorded, and partitions left out of a fetch.
        self.recorded_bytes = 0
        self.throttled_count = 0

    @property
    def unlimited(self) -> bool:
        return self.limit >= UNTHROTTLED

    def set_limit(self, limit: int) -> None:
        """A new rate from the broker's dynamic configs; what was recorded still counts."""
        self.limit = limit

    def record(self, value: int, now_ms: int) -> None:
        """`value` bytes moved at `now_ms` (Kafka's `sensor.record(value, now, false)`)."""
        if value <= 0:
            return
        if self._live_total(now_ms) == 0:
            self._start_ms = now_ms
        index = now_ms // self.window_ms
        self._windows[index] = self._windows.get(index, 0) + value
        self.recorded_bytes += value

    def span_ms(self, now_ms: int) -> int:
        """The time the rate is measured over now: one window to `samples` windows."""
        full = self.samples * self.window_ms
        return min(max(now_ms - self._start_ms, self.window_ms), full)

    def rate(self, now_ms: int) -> float:
        """The measured rate in bytes/s."""
        total = self._live_total(now_ms)
        if total == 0:
            return 0.0
        return total * 1000.0 / self.span_ms(now_ms)

    def is_exceeded(self, now_ms: int) -> bool:
        """The measured rate is above the limit (never with no limit set)."""
        return not self.unlimited and self.rate(now_ms) > self.limit

    def note_throttled(self, partitions: int = 1) -> None:
        """`partitions` were left out of a fetch because the quota was exceeded."""
        self.throttled_count += partitions

    def _live_total(self, now_ms: int) -> int:
        current = now_ms // self.window_ms
        oldest = current - self.samples + 1
        for index in [i for i in self._windows if i < oldest or i > current]:
            del self._windows[index]  # expired (or from before the clock went back)
        return sum(self._windows.values())


def leader_throttles(
    throttled: ThrottledReplicas,
    partition: int,
    leader_id: int,
    follower_id: int,
    isr: frozenset[int] | set[int],
) -> bool:
    """Does the leader throttle what it sends `follower_id` for `partition`?"""
    if follower_id in isr:
        return False
    return (partition, follower_id) in throttled or (partition, leader_id) in throttled


def follower_throttles(
    throttled: ThrottledReplicas, partition: int, self_id: int, isr: frozenset[int] | set[int]
) -> bool:
    """Does this follower throttle its fetch of `partition`?"""
    return self_id not in isr and (partition, self_id) in throttled


def select_fetch_partitions(
    partitions: Sequence[T], throttled: set[T] | frozenset[T], exceeded: bool, cursor: int
) -> tuple[list[T], list[T], int]:
    """Which partitions a follower fetch asks for: (asked, left out, next cursor).

    Every partition that is not throttled; of the throttled ones none while the quota is
    exceeded, else one, taken round-robin (the cursor), so a fetch moves at most one
    partition's `replica.fetch.max.bytes` of throttled data per quota check."""
    plain = [p for p in partitions if p not in throttled]
    slow = [p for p in partitions if p in throttled]
    if not slow:
        return plain, [], cursor
    if exceeded:
        return plain, slow, cursor
    pick = cursor % len(slow)
    return [*plain, slow[pick]], slow[:pick] + slow[pick + 1 :], cursor + 1


__all__ = [
    "QUOTA_SAMPLES",
    "QUOTA_WINDOW_MS",
    "RateQuota",
    "follower_throttles",
    "leader_throttles",
    "select_fetch_partitions",
]
