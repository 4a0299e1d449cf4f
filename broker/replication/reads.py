"""Answers to reads from replica state: follower and consumer fetches, ListOffsets, epochs.

Pure: these change nothing. Each takes the replica's read-only view (`ReadView`, which
`PartitionReplica` satisfies) and answers by docs/protocol.md §6, §7, §10-§13:

  * A follower's fetch is refused (fenced, unknown replica, stale broker epoch, out of range),
    answered with a diverging epoch, or accepted: only then does the leader record the
    follower's progress (partition.py).
  * KIP-320 fencing: a request's current leader epoch below this replica's is
    FENCED_LEADER_EPOCH, above it UNKNOWN_LEADER_EPOCH; -1 is not checked.
  * Consumers read up to the HW, from the leader or (KIP-392) an in-sync follower.
  * KIP-207: while a new leader's HW is below its epoch start, reads beyond the HW and LATEST
    answer OFFSET_NOT_AVAILABLE (the client retries) instead of an offset that went back.

Concurrency contract: pure functions; call with the owner's thread (the view is live state).
"""

from __future__ import annotations

from typing import Protocol

from minibroker.broker.replication.events import (
    ConsumerFetchAnswer,
    EpochEndOffsetAnswer,
    FollowerFetch,
    FollowerFetchAnswer,
    ListOffsetsAnswer,
    Role,
)
from minibroker.broker.replication.follower import EpochCacheView
from minibroker.client.errors import ErrorCode
from minibroker.client.types import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
)


class ReadView(Protocol):
    """The replica state a read is answered from."""

    @property
    def role(self) -> Role: ...
    @property
    def leader_epoch(self) -> int: ...
    @property
    def leo(self) -> int: ...
    @property
    def log_start_offset(self) -> int: ...
    @property
    def high_watermark(self) -> int: ...
    @property
    def leader_epoch_start_offset(self) -> int: ...


def leader_epoch_error(current_leader_epoch: int, leader_epoch: int) -> ErrorCode | None:
    """KIP-320 fencing (docs/protocol.md §12): -1 is not checked."""
    if current_leader_epoch < 0:
        return None
    if current_leader_epoch < leader_epoch:
        return ErrorCode.FENCED_LEADER_EPOCH
    if current_leader_epoch > leader_epoch:
        return ErrorCode.UNKNOWN_LEADER_EPOCH
    return None


def high_watermark_lags_epoch_start(view: ReadView) -> bool:
    return view.role is Role.LEADER and view.leader_epoch_start_offset > view.high_watermark


def broker_epoch_problem(
    fetch: FollowerFetch, assigned_broker_epoch: int, registered_broker_epoch: int
) -> str | None:
    """Why a follower fetch's broker epoch is refused (STALE_BROKER_EPOCH), or None.

    A replica fetch must carry the follower's current registration: the epoch this leader's
    metadata has for it (KIP-903, without Kafka's -1 "unknown" exemption, which let any client
    pose as a follower and move the HW). Older than that, or than a fetch already accepted from
    it, is an earlier incarnation; -1 is no epoch at all. Newer than the registration this
    leader knows is a follower that registered again before this leader's metadata caught up:
    refused too (its LEO must not count while the leader may still hold it in the ISR under its
    previous incarnation), and the follower's fetcher retries after replica.fetch.backoff.ms
    until the metadata has the registration: a delay, not a wedge."""
    epoch, replica = fetch.broker_epoch, fetch.replica_id
    if epoch < 0:
        return f"replica {replica}'s fetch carries no broker epoch ({epoch})"
    if epoch < registered_broker_epoch or epoch < assigned_broker_epoch:
        return (
            f"stale broker epoch {epoch} for replica {replica} "
            f"(registered: {registered_broker_epoch})"
        )
    if epoch != registered_broker_epoch:
        return (
            f"broker epoch {epoch} for replica {replica} is not the registration this leader "
            f"knows ({registered_broker_epoch}): retry when the metadata has it"
        )
    return None


def follower_fetch(
    view: ReadView,
    cache: EpochCacheView,
    fetch: FollowerFetch,
    assigned_broker_epoch: int | None,
    registered_broker_epoch: int,
) -> FollowerFetchAnswer:
    """The leader's answer to a follower's fetch (docs/protocol.md §7, §11 step 3, §12).

    `assigned_broker_epoch` is the follower's broker epoch as the leader last saw it in a fetch
    (None: not an assigned replica), `registered_broker_epoch` its epoch in the metadata. An
    accepted fetch has error NONE, no diverging epoch, and reads [fetch_offset, LEO). HW, log
    start and LEO are taken before the read (docs/protocol.md §6).
    """
    hw, log_start, leo = view.high_watermark, view.log_start_offset, view.leo

    def refuse(error: ErrorCode, message: str = "") -> FollowerFetchAnswer:
        return FollowerFetchAnswer(error, hw, log_start, leo, message=message)

    epoch_error = leader_epoch_error(fetch.current_leader_epoch, view.leader_epoch)
    if epoch_error is not None:
        return refuse(
            epoch_error,
            f"fetch in leader epoch {fetch.current_leader_epoch}, this replica is in "
            f"{view.leader_epoch}",
        )
    if view.role is not Role.LEADER:
        return refuse(ErrorCode.NOT_LEADER_OR_FOLLOWER)
    if assigned_broker_epoch is None:
        # The (replica, epoch) pair is not known yet, e.g. a replica being added.
        error = (
            ErrorCode.UNKNOWN_LEADER_EPOCH
            if fetch.current_leader_epoch >= 0
            else ErrorCode.NOT_LEADER_OR_FOLLOWER
        )
        return refuse(error, f"replica {fetch.replica_id} is not assigned")
    problem = broker_epoch_problem(fetch, assigned_broker_epoch, registered_broker_epoch)
    if problem is not None:
        return refuse(ErrorCode.STALE_BROKER_EPOCH, problem)
    if fetch.last_fetched_epoch != UNDEFINED_EPOCH:
        epoch, end_offset = cache.end_offset_for(fetch.last_fetched_epoch, leo)
        if end_offset == UNDEFINED_EPOCH_OFFSET or epoch == UNDEFINED_EPOCH:
            return refuse(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"no end offset for last fetched epoch {fetch.last_fetched_epoch}",
            )
        if fetch.fetch_offset < log_start:
            return refuse(ErrorCode.OFFSET_OUT_OF_RANGE, "below the log start")
        if epoch < fetch.last_fetched_epoch or end_offset < fetch.fetch_offset:
            # Divergence: answer with where the follower's epoch ends here; the follower's
            # state is not updated by such a fetch (docs/protocol.md §7).
            offset = fetch.fetch_offset
            return FollowerFetchAnswer(
                ErrorCode.NONE, hw, log_start, leo, (epoch, end_offset), offset, offset
            )
    if fetch.fetch_offset < log_start or fetch.fetch_offset > leo:
        return refuse(
            ErrorCode.OFFSET_OUT_OF_RANGE,
            f"fetch offset {fetch.fetch_offset} outside [{log_start}, {leo}]",
        )
    return FollowerFetchAnswer(
        ErrorCode.NONE, hw, log_start, leo, fetch_offset=fetch.fetch_offset, read_until_offset=leo
    )


def consumer_fetch(
    view: ReadView, current_leader_epoch: int, fetch_offset: int, allow_follower: bool
) -> ConsumerFetchAnswer:
    """A consumer read, capped at this replica's HW (docs/protocol.md §6, §10; KIP-392 when
    `allow_follower`)."""
    epoch_error = leader_epoch_error(current_leader_epoch, view.leader_epoch)
    if epoch_error is not None:
        return ConsumerFetchAnswer(epoch_error)
    serving = view.role is Role.LEADER or (allow_follower and view.role is Role.FOLLOWER)
    if not serving:
        return ConsumerFetchAnswer(ErrorCode.NOT_LEADER_OR_FOLLOWER)
    hw, log_start, leo = view.high_watermark, view.log_start_offset, view.leo
    if fetch_offset < log_start or fetch_offset > leo:
        return ConsumerFetchAnswer(
            ErrorCode.OFFSET_OUT_OF_RANGE,
            high_watermark=hw,
            log_start_offset=log_start,
            log_end_offset=leo,
            message=f"offset {fetch_offset} outside [{log_start}, {leo}]",
        )
    if fetch_offset > hw and high_watermark_lags_epoch_start(view):
        # KIP-207 (docs/protocol.md §10): a consumer ahead of a new leader's lagging HW retries
        # instead of waiting on an empty answer; it read that far from the previous leader.
        return ConsumerFetchAnswer(
            ErrorCode.OFFSET_NOT_AVAILABLE,
            high_watermark=hw,
            log_start_offset=log_start,
            log_end_offset=leo,
            message="the new leader's high watermark has not caught up yet",
        )
    return ConsumerFetchAnswer(
        ErrorCode.NONE,
        high_watermark=hw,
        log_start_offset=log_start,
        log_end_offset=leo,
        read_until_offset=hw,
    )


def list_offsets(view: ReadView, current_leader_epoch: int, timestamp: int) -> ListOffsetsAnswer:
    """ListOffsets for a client (KIP-207; docs/protocol.md §10)."""
    epoch_error = leader_epoch_error(current_leader_epoch, view.leader_epoch)
    if epoch_error is not None:
        return ListOffsetsAnswer(epoch_error)
    if view.role is not Role.LEADER:
        return ListOffsetsAnswer(ErrorCode.NOT_LEADER_OR_FOLLOWER)
    lagging = high_watermark_lags_epoch_start(view)
    if timestamp == EARLIEST_TIMESTAMP:
        return ListOffsetsAnswer(ErrorCode.NONE, view.log_start_offset, view.leader_epoch)
    if timestamp == LATEST_TIMESTAMP:
        if lagging:
            return ListOffsetsAnswer(
                ErrorCode.OFFSET_NOT_AVAILABLE,
                message=f"high watermark {view.high_watermark} is below the epoch start "
                f"{view.leader_epoch_start_offset}",
            )
        return ListOffsetsAnswer(ErrorCode.NONE, view.high_watermark, view.leader_epoch)
    return ListOffsetsAnswer(
        ErrorCode.NONE,
        leader_epoch=view.leader_epoch,
        needs_timestamp_lookup=True,
        last_fetchable_offset=view.high_watermark,
        lagging_high_watermark=lagging,
    )


def offset_for_leader_epoch(
    view: ReadView, cache: EpochCacheView, current_leader_epoch: int, leader_epoch: int
) -> EpochEndOffsetAnswer:
    """OffsetForLeaderEpoch for a consumer validating its position after a leader change
    (KIP-320): fenced like a fetch, answered by the leader only, from the epoch cache
    (`endOffsetFor`, docs/protocol.md §13)."""
    epoch_error = leader_epoch_error(current_leader_epoch, view.leader_epoch)
    if epoch_error is not None:
        return EpochEndOffsetAnswer(epoch_error)
    if view.role is not Role.LEADER:
        return EpochEndOffsetAnswer(ErrorCode.NOT_LEADER_OR_FOLLOWER)
    epoch, end_offset = cache.end_offset_for(leader_epoch, view.leo)
    return EpochEndOffsetAnswer(ErrorCode.NONE, epoch, end_offset)
