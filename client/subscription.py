"""Kafka's SubscriptionState for a consumer with manual assignment: where each partition is.

Pure: no I/O, no clock (times come in as arguments). Each assigned partition has one
`FetchState` (Kafka's FetchStates) and its position:

- INITIALIZING: no position and no reset strategy (auto_offset_reset="none"): seek() first.
- AWAIT_RESET: no position; a reset to the earliest or latest offset is due (ListOffsets).
- AWAIT_VALIDATION: a position that a new leader must confirm before the next fetch (KIP-320,
  OffsetForLeaderEpoch for the epoch of the last consumed record).
- FETCHING: a valid position; records are fetched from `fetch_offset` on.

Transitions (every one that moves the position drops what was buffered and bumps `generation`,
so an answer to a request sent before it is recognised as stale and ignored):

    seek(offset)                  any state -> FETCHING at offset (no epoch: not validated)
    reset_to(strategy)            any state -> AWAIT_RESET (INITIALIZING when strategy is None)
    reset_done(offset, epoch)     AWAIT_RESET -> FETCHING
    new_leader_epoch()            FETCHING -> AWAIT_VALIDATION when a consumed record's epoch is
                                  known (a position that came from seek() has none)
    complete_validation(...)      AWAIT_VALIDATION -> FETCHING (valid), or after a truncation to
                                  FETCHING at the divergence point / AWAIT_RESET, or it stays
                                  with a LogTruncationError when there is no reset strategy

Invariant (checked by `check`): a position exists exactly in AWAIT_VALIDATION and FETCHING;
position <= fetch_offset; the buffer holds records of offsets [position, fetch_offset) in order.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from minibroker.client.errors import LogTruncationError, MiniBrokerError
from minibroker.client.types import Record, TopicPartition

RESET_STRATEGIES = ("earliest", "latest")
NO_EPOCH = -1


class FetchState(enum.Enum):
    INITIALIZING = "initializing"
    AWAIT_RESET = "await_reset"
    AWAIT_VALIDATION = "await_validation"
    FETCHING = "fetching"

    @property
    def has_position(self) -> bool:
        return self in (FetchState.AWAIT_VALIDATION, FetchState.FETCHING)


class Validation(enum.Enum):
    """What an OffsetForLeaderEpoch answer did to a position (KIP-320)."""

    VALID = "valid"
    TRUNCATED_RESET = "truncated, divergence unknown: reset by the strategy"
    TRUNCATED_SEEK = "truncated: moved to the first offset known to diverge"
    TRUNCATED_RAISE = "truncated, no reset strategy: LogTruncationError"


def truncation_point(position: int, leader_epoch: int, end_offset: int) -> tuple[bool, int | None]:
    """Kafka's rule for an OffsetForLeaderEpoch answer to a consumer at `position` (KIP-320,
    SubscriptionState.maybeCompleteValidation): (truncated, first offset known to diverge).

    The new leader knows no epoch at or below the one asked for -> truncated, divergence unknown;
    the epoch ends below the position -> truncated at that end offset; otherwise the position is
    valid.
    """
    if end_offset < 0 or leader_epoch < 0:
        return True, None
    if end_offset < position:
        return True, end_offset
    return False, None


@dataclass(eq=False)
class PartitionState:
    """One assigned partition (Kafka's TopicPartitionState)."""

    tp: TopicPartition
    fetch_state: FetchState = FetchState.INITIALIZING
    reset: str | None = None  # the strategy of AWAIT_RESET ("earliest" / "latest")
    position: int | None = None  # next offset handed to the application
    position_epoch: int = NO_EPOCH  # leader epoch of the record before `position`
    fetch_offset: int = 0  # next offset to fetch
    # Leader epoch of the last batch fetched (the one before `fetch_offset`), NO_EPOCH when
    # unknown: the position takes it when it moves to `fetch_offset` past batches that gave
    # no record (KIP-320 validates the position with it).
    fetch_epoch: int = NO_EPOCH
    leader_epoch_seen: int = NO_EPOCH  # the partition's leader epoch when last looked at
    generation: int = 0  # bumped by every move: an answer for an older generation is dropped
    # The ListOffsets (AWAIT_RESET) or OffsetForLeaderEpoch (AWAIT_VALIDATION) that this state
    # waits for is out; every transition clears it.
    awaiting_answer: bool = False
    # A Fetch carrying the partition is out; it may outlive a transition (its answer is then
    # stale), and no second one is sent meanwhile.
    in_flight: bool = False
    backoff_until_ms: int = 0
    read_replica: int | None = None  # preferred read replica named by the broker (KIP-392)
    high_watermark: int = -1
    error: MiniBrokerError | None = None  # raised from the next poll()
    buffer: deque[Record] = field(default_factory=deque)
    # Bytes decoded into the buffer since it was last empty, and the most that may be before
    # the partition is fetched again (see completed_fetch.py).
    decoded_bytes: int = 0
    decode_limit: int = 0

    @property
    def awaiting_validation(self) -> bool:
        return self.fetch_state is FetchState.AWAIT_VALIDATION

    # -- transitions -------------------------------------------------------------------------

    def seek(self, offset: int) -> None:
        self._move(offset)
        self.fetch_state = FetchState.FETCHING

    def reset_to(self, strategy: str | None) -> None:
        if strategy is not None and strategy not in RESET_STRATEGIES:
            raise ValueError(f"reset strategy must be earliest or latest, got {strategy!r}")
        self._move(None)
        self.reset = strategy
        self.fetch_state = FetchState.INITIALIZING if strategy is None else FetchState.AWAIT_RESET

    def _move(self, offset: int | None) -> None:
        self.generation += 1
        self.buffer.clear()
        self.decoded_bytes = 0
        self.error = None
        self.reset = None
        self.awaiting_answer = False
        self.position = offset
        self.position_epoch = NO_EPOCH
        self.leader_epoch_seen = NO_EPOCH
        self.fetch_offset = offset if offset is not None else 0
        self.fetch_epoch = NO_EPOCH
        self.backoff_until_ms = 0

    def reset_done(self, offset: int, leader_epoch: int) -> None:
        """ListOffsets answered: fetch from `offset`. As Kafka's consumer does, the position
        carries the epoch the leader answered with, so a truncation under it is caught before
        the first record too."""
        if self.fetch_state is not FetchState.AWAIT_RESET:
            raise ValueError(f"{self.tp} is {self.fetch_state.value}, not awaiting a reset")
        self.position = self.fetch_offset = offset
        self.position_epoch = self.fetch_epoch = leader_epoch
        self.reset = None
        self.awaiting_answer = False
        self.fetch_state = FetchState.FETCHING

    def answer_failed(self, error: MiniBrokerError, retry_at_ms: int) -> None:
        """The ListOffsets or OffsetForLeaderEpoch of this state failed: retry at `retry_at_ms`
        when `error` is retriable, else raise it from the next poll()."""
        self.awaiting_answer = False
        if error.retriable:
            self.backoff_until_ms = retry_at_ms
        else:
            self.error = error

    def observe_leader_epoch(self, epoch: int) -> None:
        """The metadata names `epoch` as the partition's leader epoch."""
        if epoch > self.leader_epoch_seen:
            if self.leader_epoch_seen >= 0:
                self.new_leader_epoch()
            self.leader_epoch_seen = epoch

    def new_leader_epoch(self) -> None:
        """A new leader: what was fetched from the old one and not yet returned is dropped (its
        fetch answers too), as Kafka's consumer stops returning records of a partition that is
        no longer fetchable, and a position that follows a consumed record is validated before
        the next fetch."""
        self.generation += 1
        self.buffer.clear()
        self.decoded_bytes = 0
        if self.position is not None:
            self.fetch_offset = self.position
            self.fetch_epoch = self.position_epoch
        self.read_replica = None
        self.awaiting_answer = False
        if self.position_epoch >= 0 and self.fetch_state is FetchState.FETCHING:
            self.fetch_state = FetchState.AWAIT_VALIDATION

    def complete_validation(
        self, leader_epoch: int, end_offset: int, strategy: str | None
    ) -> tuple[Validation, int | None]:
        """The leader says the epoch of the position ends at `end_offset` (its `leader_epoch`
        is the largest it knows at or below the one asked for): (what was done, the divergent
        offset if known)."""
        if self.fetch_state is not FetchState.AWAIT_VALIDATION or self.position is None:
            raise ValueError(f"{self.tp} is {self.fetch_state.value}, not awaiting validation")
        self.awaiting_answer = False
        truncated, divergent = truncation_point(self.position, leader_epoch, end_offset)
        if not truncated:
            self.fetch_state = FetchState.FETCHING
            return Validation.VALID, None
        if strategy is None:
            # Kafka's LogTruncationException: the partition stays unvalidated, so every poll
            # raises it again until the application seeks.
            where = f"offset {divergent}" if divergent is not None else "an unknown offset"
            self.error = LogTruncationError(
                f"the log of {self.tp} was truncated below the consumer's position "
                f"{self.position} (epoch {self.position_epoch} ends at {where} on the new "
                "leader, as after an unclean election); seek() to go on, or use "
                "auto_offset_reset='earliest'/'latest'",
                {self.tp: divergent},
            )
            return Validation.TRUNCATED_RAISE, divergent
        if divergent is None:
            self.reset_to(strategy)
            return Validation.TRUNCATED_RESET, None
        self.seek(divergent)
        self.position_epoch = leader_epoch
        return Validation.TRUNCATED_SEEK, divergent

    # -- records -----------------------------------------------------------------------------

    def move_past_fetched(self) -> None:
        """Nothing fetched is left to hand out: the position goes to the fetch offset, the
        next offset of the last batch fetched (Kafka's nextFetchOffset), past its trailing
        offsets that hold no record: those a compacted log removed (a batch keeps its last
        offset; a gap), an emptied batch, control records. The next poll does not fetch them
        again, and a commit of the position does not point into them."""
        if self.position is not None and self.fetch_offset > self.position:
            self.position = self.fetch_offset
            if self.fetch_epoch >= 0:
                self.position_epoch = self.fetch_epoch

    def fetchable(self, max_poll_records: int) -> bool:
        """Whether a fetch may go out now as far as the buffer goes: nothing in flight, fewer
        than max_poll_records buffered, and the buffer within its decode limit."""
        return (
            not self.in_flight
            and len(self.buffer) < max_poll_records
            and (not self.buffer or self.decoded_bytes < self.decode_limit)
        )

    def check(self) -> None:
        """Raise AssertionError when the invariant of the module docstring does not hold."""
        has = self.position is not None
        assert has == self.fetch_state.has_position, (self.fetch_state, self.position)
        assert (self.reset is not None) == (self.fetch_state is FetchState.AWAIT_RESET)
        if self.position is not None:
            assert self.position <= self.fetch_offset, (self.position, self.fetch_offset)
            offsets = [r.offset for r in self.buffer]
            assert offsets == sorted(offsets)
            assert all(self.position <= o < self.fetch_offset for o in offsets)
        else:
            assert not self.buffer


class SubscriptionState:
    """Every assigned partition's state, and the hand-out of their buffered records."""

    def __init__(self, default_reset: str | None) -> None:
        self.default_reset = default_reset  # None: auto_offset_reset="none"
        self.states: dict[TopicPartition, PartitionState] = {}
        self._rotation = 0

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Replace the assignment; new partitions start from the default reset strategy."""
        keep = set(partitions)
        for tp in list(self.states):
            if tp not in keep:
                del self.states[tp]
        for tp in partitions:
            if tp not in self.states:
                state = self.states[tp] = PartitionState(tp)
                state.reset_to(self.default_reset)

    def state(self, tp: TopicPartition) -> PartitionState:
        state = self.states.get(TopicPartition(*tp))
        if state is None:
            raise ValueError(f"{tp} is not assigned to this consumer; call assign() first")
        return state

    def drain(self, limit: int) -> list[Record]:
        """Up to `limit` buffered records, in offset order per partition and across partitions
        in turn (the first partition moves on each call); each position follows what it hands
        out. Raises the error of a partition with nothing buffered before it (after handing
        over what was taken, that error waits for the next call)."""
        out: list[Record] = []
        tps = list(self.states)
        if not tps:
            return out
        self._rotation = (self._rotation + 1) % len(tps)
        for i in range(len(tps)):
            state = self.states[tps[(self._rotation + i) % len(tps)]]
            if state.error is not None and not state.buffer:
                if out:
                    return out  # hand over what we have; the error surfaces on the next call
                err, state.error = state.error, None
                # The partition is fetched (or validated) again, which raises the error again
                # unless the application seeks, as Kafka's consumer does.
                raise err
            buffer = state.buffer
            if buffer:
                take = min(limit - len(out), len(buffer))
                if take == len(buffer):
                    out.extend(buffer)
                    buffer.clear()
                    state.decoded_bytes = 0
                else:
                    popleft = buffer.popleft
                    out.extend([popleft() for _ in range(take)])
                last = out[-1]
                if buffer:
                    state.position = last.offset + 1
                    state.position_epoch = last.leader_epoch
                else:
                    state.move_past_fetched()
            if len(out) >= limit:
                break
        return out


__all__ = [
    "FetchState",
    "PartitionState",
    "SubscriptionState",
    "Validation",
    "truncation_point",
]
