"""Follower-side decisions for one partition: what to fetch next and what a fetch answer means.

Pure: no I/O. Kafka's AbstractFetcherThread / ReplicaFetcherThread rules with truncate-on-fetch
(docs/protocol.md §11): the follower always fetches from its own LEO with `last_fetched_epoch` = the
latest epoch in its epoch cache, and the leader's `diverging_epoch` answer drives truncation.
Truncation never uses the local HW (KIP-101), and a follower only acts on answers to the fetch
it sent in its current leader epoch (KIP-320: a stale answer is dropped, never truncated on).

`FollowerState` is owned by `PartitionReplica` while the role is FOLLOWER and holds the fetch
rules (`next_fetch`, `on_fetch_response`); the shell talks to the replica, not to this class. The
functions below are the rules as plain functions so the unit tests can table-drive them.

Concurrency contract: single-threaded (owned by one PartitionReplica).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from minibroker.broker.replication.events import (
    AppendAsFollower,
    Backoff,
    Effect,
    FetchPosition,
    FetchResponse,
    FollowerView,
    StopFetching,
    TruncateFullyAndStartAt,
    TruncateTo,
)
from minibroker.client.batch import CorruptRecordError, parse_header
from minibroker.client.errors import ErrorCode
from minibroker.client.types import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET

# Fetch errors that stop fetching until new metadata arrives (docs/protocol.md §11).
_FOLLOWER_FATAL = frozenset({ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.KAFKA_STORAGE_ERROR})


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
    # (fetch offset, last fetched epoch, diverging epoch, its end offset) of the last divergence
    # answer acted on: the same answer again without progress backs off instead of spinning.
    last_divergence: tuple[int, int, int, int] | None = None

    def view(self) -> FollowerView:
        """A frozen copy for the shell (`PartitionReplica.follower_state`)."""
        return FollowerView(
            self.leader_id,
            self.leader_epoch,
            self.leader_high_watermark,
            self.leader_log_start_offset,
            self.backoff_until_ms,
            self.failed,
        )

    def next_fetch(
        self, now_ms: int, leader_epoch: int, leo: int, log_start_offset: int, cache: EpochCacheView
    ) -> FetchPosition | None:
        """Fetch from our LEO with the latest epoch we hold; None while failed or backing off."""
        if self.failed or now_ms < self.backoff_until_ms:
            return None
        return FetchPosition(
            leader_id=self.leader_id,
            current_leader_epoch=leader_epoch,
            fetch_offset=leo,
            last_fetched_epoch=latest_epoch_of(cache),
            log_start_offset=log_start_offset,
        )

    def on_fetch_response(
        self,
        request: FetchPosition,
        response: FetchResponse,
        now_ms: int,
        leader_epoch: int,
        leo: int,
        cache: EpochCacheView,
        backoff_ms: int,
        offset_gaps_allowed: bool = False,
    ) -> list[Effect] | None:
        """The leader answered `request` (docs/protocol.md §11 steps 4-8): the effects to carry
        out, or None for an accepted answer without records, after which the caller applies
        the leader's HW and log start (kept here) to its own log.

        The records must start at our LEO; with `offset_gaps_allowed` (a compacted topic, or a
        log with gaps) at or above it, as a cleaned leader log skips offsets (Kafka's rule).
        Below the LEO is always refused (a backoff)."""
        if (
            self.failed
            or request.leader_id != self.leader_id
            or request.current_leader_epoch != leader_epoch
            or request.fetch_offset != leo
        ):
            # KIP-320: only the answer to the fetch sent from this position in this epoch may
            # truncate or append; anything else is stale.
            return []
        error = response.error
        if error == ErrorCode.NONE:
            if response.diverging_epoch is not None:
                return self._on_diverging_epoch(request, response, now_ms, leo, cache, backoff_ms)
            self.last_divergence = None
            self.leader_high_watermark = response.high_watermark
            self.leader_log_start_offset = response.log_start_offset
            if not response.records:
                return None
            try:
                base_offset = parse_header(response.records).base_offset
            except CorruptRecordError as err:
                return self.back_off(now_ms, backoff_ms, f"corrupt fetch response: {err.reason}")
            if base_offset != leo and (base_offset < leo or not offset_gaps_allowed):
                rule = "at or above" if offset_gaps_allowed else "at"
                return self.back_off(
                    now_ms, backoff_ms, f"leader sent offset {base_offset}, expected {rule} {leo}"
                )
            return [AppendAsFollower(response.records, leo)]
        if error == ErrorCode.OFFSET_OUT_OF_RANGE:
            decision = decision_for_out_of_range(
                leo, response.log_end_offset, response.log_start_offset
            )
            if decision.truncate_to is not None:
                return [TruncateTo(decision.truncate_to, "leader log ends below ours")]
            if decision.truncate_fully_and_start_at is not None:
                return [
                    TruncateFullyAndStartAt(
                        decision.truncate_fully_and_start_at, "below the leader's log start"
                    )
                ]
            return self.back_off(now_ms, backoff_ms, "offset out of range")
        if error in _FOLLOWER_FATAL:
            # Our epoch is behind (or the disk failed): stop until new metadata arrives.
            self.failed = True
            return [StopFetching(f"{error.name}: waiting for new metadata")]
        return self.back_off(now_ms, backoff_ms, error.name)

    def back_off(self, now_ms: int, delay_ms: int, reason: str) -> list[Effect]:
        self.backoff_until_ms = now_ms + delay_ms
        return [Backoff(delay_ms, reason)]

    def _on_diverging_epoch(
        self,
        request: FetchPosition,
        response: FetchResponse,
        now_ms: int,
        leo: int,
        cache: EpochCacheView,
        backoff_ms: int,
    ) -> list[Effect]:
        assert response.diverging_epoch is not None
        epoch, end_offset = response.diverging_epoch
        key = (request.fetch_offset, request.last_fetched_epoch, epoch, end_offset)
        decision = truncation_for_diverging_epoch(epoch, end_offset, cache, leo)
        if key == self.last_divergence and decision.offset >= leo:
            # The same answer to the same question after a truncation that changed nothing:
            # do not spin; the leader's state has to move first.
            return self.back_off(now_ms, backoff_ms, "repeated divergence without progress")
        self.last_divergence = key
        # Truncate even at the LEO: it removes a stray epoch-cache entry (KAFKA-10706).
        return [
            TruncateTo(
                decision.offset,
                f"diverging epoch ({epoch}, {end_offset}) after last fetched epoch "
                f"{request.last_fetched_epoch}",
            )
        ]
