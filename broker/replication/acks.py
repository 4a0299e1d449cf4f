"""The produce purgatory: acks=all produces waiting for the high watermark, and their answers.

Pure: no I/O, no clock (time arrives as `now_ms`). The leader parks an acks=all produce after its
append (or a DuplicateAppend retry) with the offset the HW must reach; the purgatory is the one
place that decides how each ends (docs/protocol.md §2), always as a CompleteProduce effect the
shell hands to the future it keyed by the same token:

    HW reaches it   NONE, or NOT_ENOUGH_REPLICAS_AFTER_APPEND when the maximal ISR is smaller
                    than min(min.insync.replicas, replication factor) at that moment
    deadline        REQUEST_TIMED_OUT (`expire`, or `expire_token` when the shell's own wait
                    ran out first)
    leadership lost NOT_LEADER_OR_FOLLOWER for all (`fail_all`; also on a storage failure or
                    shutdown, with the shell's error)

Concurrency contract: single-threaded (owned by one PartitionReplica).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from minibroker.broker.replication.events import CompleteProduce
from minibroker.client.errors import ErrorCode

TIMED_OUT_MESSAGE = "the high watermark did not reach the batch in time"
WAIT_TIMED_OUT_MESSAGE = "the ISR did not acknowledge the write within timeout_ms"


@dataclass(frozen=True, slots=True)
class PendingProduce:
    token: object
    base_offset: int
    required_offset: int  # last offset + 1: done once high_watermark >= this
    deadline_ms: int


def acks_all_result(
    pending: PendingProduce, log_start_offset: int, maximal_isr: frozenset[int], min_isr: int
) -> CompleteProduce:
    """The answer once the HW passed the batch: it is committed, but Kafka still reports
    NOT_ENOUGH_REPLICAS_AFTER_APPEND when fewer than min ISR replicas hold it now."""
    if len(maximal_isr) >= min_isr:
        return CompleteProduce(pending.token, ErrorCode.NONE, pending.base_offset, log_start_offset)
    return CompleteProduce(
        pending.token,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        pending.base_offset,
        log_start_offset,
        f"the ISR {sorted(maximal_isr)} fell below min.insync.replicas {min_isr}",
    )


class ProducePurgatory:
    """Parked acks=all produces in arrival order."""

    def __init__(self) -> None:
        self._pending: deque[PendingProduce] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def park(
        self,
        pending: PendingProduce,
        high_watermark: int,
        log_start_offset: int,
        maximal_isr: frozenset[int],
        min_isr: int,
    ) -> list[CompleteProduce]:
        """Park `pending`, or answer it at once when the HW has passed it already."""
        if high_watermark >= pending.required_offset:
            return [acks_all_result(pending, log_start_offset, maximal_isr, min_isr)]
        self._pending.append(pending)
        return []

    def complete(
        self,
        high_watermark: int,
        log_start_offset: int,
        maximal_isr: frozenset[int],
        min_isr: int,
    ) -> list[CompleteProduce]:
        """Answer every produce the HW has passed (after the HW moved)."""
        done: list[CompleteProduce] = []
        remaining: deque[PendingProduce] = deque()
        for pending in self._pending:
            if high_watermark >= pending.required_offset:
                done.append(acks_all_result(pending, log_start_offset, maximal_isr, min_isr))
            else:
                remaining.append(pending)
        self._pending = remaining
        return done

    def expire(self, now_ms: int, log_start_offset: int) -> list[CompleteProduce]:
        """REQUEST_TIMED_OUT for the produces whose deadline has come."""
        expired = [p for p in self._pending if p.deadline_ms <= now_ms]
        if not expired:
            return []
        self._pending = deque(p for p in self._pending if p.deadline_ms > now_ms)
        return [_timed_out(p, log_start_offset) for p in expired]

    def expire_token(self, token: object, log_start_offset: int) -> list[CompleteProduce]:
        """REQUEST_TIMED_OUT for the produce parked under `token`, whatever its deadline (the
        shell's wait for it ran out); nothing when it was answered already."""
        for pending in self._pending:
            if pending.token == token:
                self._pending.remove(pending)
                return [_timed_out(pending, log_start_offset, WAIT_TIMED_OUT_MESSAGE)]
        return []

    def fail_all(
        self, error: ErrorCode, reason: str, log_start_offset: int
    ) -> list[CompleteProduce]:
        """Answer every parked produce with `error` and forget them."""
        failed = [
            CompleteProduce(p.token, error, p.base_offset, log_start_offset, reason)
            for p in self._pending
        ]
        self._pending.clear()
        return failed


def _timed_out(
    pending: PendingProduce, log_start_offset: int, message: str = TIMED_OUT_MESSAGE
) -> CompleteProduce:
    return CompleteProduce(
        pending.token, ErrorCode.REQUEST_TIMED_OUT, pending.base_offset, log_start_offset, message
    )
