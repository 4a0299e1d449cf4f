"""Follower-side decisions for one partition: what to fetch next and what a fetch answer means.

Pure: no I/O. Kafka's AbstractFetcherThread / ReplicaFetcherThread rules with truncate-on-fetch
(docs/protocol.md §11): the follower always fetches from its own LEO with `last_fetched_epoch` = the
latest epoch in its epoch cache, and the leader's `diverging_epoch` answer drives truncation.
Truncation never uses the local HW (KIP-101), and a follower only acts on answers to the fetch
it sent in its current leader epoch (KIP-320: a stale answer is dropped, never truncated on).

`FollowerState` is owned by `PartitionReplica` while the role is FOLLOWER; the shell talks to
the replica, not to this class. The functions below are the rules as plain functions so the
unit tests can table-drive them.

Concurrency contract: single-threaded (owned by one PartitionReplica).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from minibroker.client.types import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET


class EpochCacheView(Protocol):
    """The read side of broker/storage/epoch_cache.EpochCache the cores use."""

    def end_offset_for(self, requested_epoch: int, leo: int) -> tuple[int, int]: ...

    @property
    def latest_epoch(self) -> int | None: ...


def latest_epoch_of(cache: EpochCacheView) -> int:
    """The newest epoch in `cache`, or -1 (UNDEFINED_EPOCH) when it is empty."""
    value = cache.latest_epoch
    return UNDEFINED_EPOCH if value is None else value


@dataclass(frozen=True, slots=True)
class TruncationDecision:
    """Where to truncate after a diverging-epoch answer.

    `completed` is False when the follower never saw the leader's epoch: it truncates to the end
    of its own earlier epoch and, with truncate-on-fetch, asks again on the next fetch.
    """

    offset: int
    completed: bool


def truncation_for_diverging_epoch(
    leader_epoch: int, leader_end_offset: int, cache: EpochCacheView, leo: int
) -> TruncationDecision:
    """Kafka's `AbstractFetcherThread.getOffsetTruncationState` (docs/protocol.md §11 step 4)."""
    if leader_end_offset == UNDEFINED_EPOCH_OFFSET:
        # Nothing to compare against: keep the log (the fetch offset is the LEO).
        return TruncationDecision(leo, completed=True)
    if leader_epoch == UNDEFINED_EPOCH:
        return TruncationDecision(min(leader_end_offset, leo), completed=True)
    own_epoch, own_end_offset = cache.end_offset_for(leader_epoch, leo)
    if own_end_offset == UNDEFINED_EPOCH_OFFSET:
        # The follower tracks no epoch at or below the leader's: trust the leader's end.
        return TruncationDecision(min(leader_end_offset, leo), completed=True)
    if own_epoch != leader_epoch:
        return TruncationDecision(min(own_end_offset, leo), completed=False)
    return TruncationDecision(min(leader_end_offset, own_end_offset, leo), completed=True)


@dataclass(frozen=True, slots=True)
class OutOfRangeDecision:
    """What to do after OFFSET_OUT_OF_RANGE, never fatal (KAFKA-7414; docs/protocol.md §11)."""

    truncate_to: int | None = None  # leader LEO below ours: possible after an unclean election
    truncate_fully_and_start_at: int | None = None  # our LEO is below the leader's log start
    backoff: bool = False  # our position is valid on the leader: retry after a pause


def decision_for_out_of_range(
    leo: int, leader_log_end_offset: int, leader_log_start_offset: int
) -> OutOfRangeDecision:
    if leader_log_end_offset < 0 or leader_log_start_offset < 0:
        return OutOfRangeDecision(backoff=True)
    if leader_log_end_offset < leo:
        return OutOfRangeDecision(truncate_to=leader_log_end_offset)
    if leader_log_start_offset > leo:
        return OutOfRangeDecision(truncate_fully_and_start_at=leader_log_start_offset)
    # LEO is within the leader's log; the answer must have come from a race (retention or a
    # leader change under the fetch). Fetching again at once could spin, so pause first.
    return OutOfRangeDecision(backoff=True)


def follower_high_watermark(leader_high_watermark: int, log_start_offset: int, leo: int) -> int:
    """The leader's HW clamped to [log start, LEO]; it may move down (docs/protocol.md §6)."""
    return max(log_start_offset, min(leader_high_watermark, leo))


@dataclass(slots=True)
class FollowerState:
    """Fetch bookkeeping while following `leader_id` in `leader_epoch`.

    failed: stop fetching until new metadata arrives (FENCED_LEADER_EPOCH, storage error).
    backoff_until_ms: do not fetch before this time (UNKNOWN_LEADER_EPOCH, NOT_LEADER, ...).
    leader_high_watermark: the HW of the last answer, applied once the append is done.
    """

    leader_id: int
    leader_epoch: int
    failed: bool = False
    backoff_until_ms: int = 0
    leader_high_watermark: int = -1
    leader_log_start_offset: int = -1
