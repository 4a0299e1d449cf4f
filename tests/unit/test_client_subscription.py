"""The consumer's pure subscription state: each FetchState transition as a table row, the hand-out
of buffered records, and a property over random sequences of events (seeks, resets, fetched
batches, leader changes, validation answers, polls) that the invariant always holds and a poll
never skips or repeats an offset.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.client.batch import set_base_offset
from minibroker.client.completed_fetch import decode_into
from minibroker.client.errors import (
    LogTruncationError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
)
from minibroker.client.records import encode_batch
from minibroker.client.subscription import (
    FetchState,
    PartitionState,
    SubscriptionState,
    Validation,
)
from minibroker.client.types import TopicPartition

TP = TopicPartition("t", 0)
LIMIT = 1 << 26
INIT, R, V, F = (
    FetchState.INITIALIZING,
    FetchState.AWAIT_RESET,
    FetchState.AWAIT_VALIDATION,
    FetchState.FETCHING,
)


def batch(base: int, count: int, epoch: int) -> bytes:
    raw = bytearray(encode_batch([(1000, None, b"v", []) for _ in range(count)]))
    set_base_offset(raw, 0, base)
    raw[12:16] = epoch.to_bytes(4, "big")
    return bytes(raw)


def fetched(state: PartitionState, count: int, epoch: int = 4) -> None:
    decode_into(state, batch(state.fetch_offset, count, epoch), LIMIT)


def initializing() -> PartitionState:
    state = PartitionState(TP)
    state.reset_to(None)
    return state


def await_reset() -> PartitionState:
    state = PartitionState(TP)
    state.reset_to("earliest")
    return state


def sought() -> PartitionState:
    """FETCHING at 5 after a seek: no epoch is known for the position."""
    state = PartitionState(TP)
    state.seek(5)
    return state


def consumed() -> PartitionState:
    """FETCHING at 5 after polling offsets 0..4 written in epoch 4; 5..7 are buffered."""
    subs = SubscriptionState("earliest")
    subs.assign([TP])
    state = subs.states[TP]
    state.seek(0)
    fetched(state, 8)
    assert len(subs.drain(5)) == 5
    return state


def await_validation() -> PartitionState:
    state = consumed()
    state.new_leader_epoch()
    return state


START: dict[str, Callable[[], PartitionState]] = {
    "initializing": initializing,
    "await_reset": await_reset,
    "sought": sought,
    "consumed": consumed,
    "await_validation": await_validation,
}

# (start, event, expected: fetch state, position, fetch offset, position epoch, reset strategy,
# buffered records kept, generation bumped)
ROWS = [
    ("initializing", lambda s: s.seek(9), (F, 9, 9, -1, None, False, True)),
    ("initializing", lambda s: s.reset_to("latest"), (R, None, 0, -1, "latest", False, True)),
    ("await_reset", lambda s: s.reset_done(15, 4), (F, 15, 15, 4, None, False, False)),
    ("await_reset", lambda s: s.seek(3), (F, 3, 3, -1, None, False, True)),
    ("await_reset", lambda s: s.reset_to(None), (INIT, None, 0, -1, None, False, True)),
    ("sought", lambda s: s.new_leader_epoch(), (F, 5, 5, -1, None, False, True)),
    ("sought", lambda s: s.observe_leader_epoch(7), (F, 5, 5, -1, None, False, False)),
    ("consumed", lambda s: s.new_leader_epoch(), (V, 5, 5, 4, None, False, True)),
    ("consumed", lambda s: s.seek(2), (F, 2, 2, -1, None, False, True)),
    ("consumed", lambda s: s.reset_to("earliest"), (R, None, 0, -1, "earliest", False, True)),
    ("consumed", lambda s: s.observe_leader_epoch(5), (F, 5, 8, 4, None, True, False)),
    ("await_validation", lambda s: s.new_leader_epoch(), (V, 5, 5, 4, None, False, True)),
    (
        "await_validation",
        lambda s: s.complete_validation(4, 5, None),
        (F, 5, 5, 4, None, False, False),
    ),
    (
        "await_validation",
        lambda s: s.complete_validation(4, 2, "earliest"),
        (F, 2, 2, 4, None, False, True),
    ),
    (
        "await_validation",
        lambda s: s.complete_validation(4, 4, "earliest"),  # one offset short: truncated
        (F, 4, 4, 4, None, False, True),
    ),
    (
        "await_validation",
        lambda s: s.complete_validation(-1, -1, "latest"),
        (R, None, 0, -1, "latest", False, True),
    ),
    (
        "await_validation",
        lambda s: s.complete_validation(4, 2, None),
        (V, 5, 5, 4, None, False, False),
    ),
    ("await_validation", lambda s: s.seek(1), (F, 1, 1, -1, None, False, True)),
]


@pytest.mark.parametrize(("start", "event", "expected"), ROWS)
def test_transitions(
    start: str,
    event: Callable[[PartitionState], object],
    expected: tuple[FetchState, int | None, int, int, str | None, bool, bool],
) -> None:
    state = START[start]()
    generation, buffered = state.generation, len(state.buffer)
    event(state)
    fetch_state, position, fetch_offset, epoch, reset, kept, bumped = expected
    assert (state.fetch_state, state.position, state.fetch_offset) == (
        fetch_state,
        position,
        fetch_offset,
    )
    assert (state.position_epoch, state.reset) == (epoch, reset)
    assert len(state.buffer) == (buffered if kept else 0)
    assert (state.generation > generation) == bumped
    assert not state.awaiting_answer
    state.check()


@pytest.mark.parametrize(
    ("start", "event"),
    [
        ("initializing", lambda s: s.reset_done(0, 1)),
        ("consumed", lambda s: s.reset_done(0, 1)),
        ("await_validation", lambda s: s.reset_done(0, 1)),
        ("consumed", lambda s: s.complete_validation(4, 5, None)),
        ("await_reset", lambda s: s.complete_validation(4, 5, None)),
        ("initializing", lambda s: s.reset_to("smallest")),
    ],
)
def test_an_event_the_state_cannot_take_is_refused_and_changes_nothing(
    start: str, event: Callable[[PartitionState], object]
) -> None:
    state = START[start]()
    before = (state.fetch_state, state.position, state.fetch_offset, state.generation)
    with pytest.raises(ValueError):
        event(state)
    assert (state.fetch_state, state.position, state.fetch_offset, state.generation) == before


def test_validation_outcomes_say_what_was_done() -> None:
    assert await_validation().complete_validation(4, 9, None) == (Validation.VALID, None)
    assert await_validation().complete_validation(3, 2, "latest") == (
        Validation.TRUNCATED_SEEK,
        2,
    )
    assert await_validation().complete_validation(-1, -1, "latest") == (
        Validation.TRUNCATED_RESET,
        None,
    )
    state = await_validation()
    assert state.complete_validation(4, 2, None) == (Validation.TRUNCATED_RAISE, 2)
    assert isinstance(state.error, LogTruncationError)
    assert state.error.divergent_offsets == {TP: 2}


def test_a_failed_answer_backs_off_when_retriable_and_fails_the_partition_otherwise() -> None:
    state = await_reset()
    state.awaiting_answer = True
    state.answer_failed(NotLeaderOrFollowerError("moved"), 500)
    assert (state.backoff_until_ms, state.error, state.awaiting_answer) == (500, None, False)
    final = OffsetOutOfRangeError("gone")
    state.answer_failed(final, 900)
    assert state.error is final and state.backoff_until_ms == 500
    assert state.fetch_state is R, "the reset is tried again once the error was raised"


def test_a_fetch_in_flight_outlives_a_move_but_blocks_a_second_fetch() -> None:
    state = consumed()
    state.in_flight = True
    state.seek(0)
    assert state.in_flight and not state.fetchable(500)


def test_drain_takes_partitions_in_turn_and_raises_an_error_after_what_was_taken() -> None:
    subs = SubscriptionState(None)
    a, b = TopicPartition("t", 0), TopicPartition("t", 1)
    subs.assign([a, b])
    assert all(s.fetch_state is INIT for s in subs.states.values())
    subs.states[a].seek(0)
    subs.states[b].seek(0)
    fetched(subs.states[b], 3)
    subs.states[a].error = OffsetOutOfRangeError("out of range")
    first = subs.drain(10)  # starts at b this time, then meets a's error
    assert [r.offset for r in first] == [0, 1, 2]
    with pytest.raises(OffsetOutOfRangeError):
        subs.drain(10)
    assert subs.states[a].error is None, "raised once; fetching raises it again"
    subs.assign([a])
    assert set(subs.states) == {a}
    with pytest.raises(ValueError, match="not assigned"):
        subs.state(b)


# -- a property over random event sequences -------------------------------------------------------

EVENTS = st.lists(
    st.one_of(
        st.tuples(st.just("seek"), st.integers(0, 40)),
        st.tuples(st.just("reset_to"), st.sampled_from(["earliest", "latest", None])),
        st.tuples(st.just("reset_done"), st.integers(0, 40), st.integers(-1, 6)),
        st.tuples(st.just("leader"), st.integers(0, 8)),
        st.tuples(
            st.just("validated"),
            st.integers(-1, 6),
            st.integers(-1, 45),
            st.sampled_from(["earliest", None]),
        ),
        st.tuples(st.just("fetched"), st.integers(1, 5), st.integers(0, 6)),
        st.tuples(st.just("poll"), st.integers(1, 6)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(EVENTS)
def test_the_invariant_holds_and_polls_neither_skip_nor_repeat_offsets(
    events: list[tuple[object, ...]],
) -> None:
    subs = SubscriptionState("earliest")
    subs.assign([TP])
    state = subs.states[TP]
    for event in events:
        kind = event[0]
        generation = state.generation
        if kind == "seek":
            state.seek(int(event[1]))  # type: ignore[call-overload]
        elif kind == "reset_to":
            state.reset_to(event[1])  # type: ignore[arg-type]
        elif kind == "reset_done" and state.fetch_state is R:
            state.reset_done(int(event[1]), int(event[2]))  # type: ignore[call-overload]
        elif kind == "leader" and state.position is not None:
            state.observe_leader_epoch(int(event[1]))  # type: ignore[call-overload]
        elif kind == "validated" and state.fetch_state is V:
            state.complete_validation(event[1], event[2], event[3])  # type: ignore[arg-type]
        elif kind == "fetched" and state.fetch_state is F:
            fetched(state, int(event[1]), int(event[2]))  # type: ignore[call-overload]
        elif kind == "poll":
            position = state.position
            try:
                records = subs.drain(int(event[1]))  # type: ignore[call-overload]
            except LogTruncationError:
                # A validation that found the log truncated below the position, with no reset
                # strategy, surfaces here (KIP-320): nothing is handed out, nothing moves.
                assert state.position == position
                records = []
            if records:
                assert position is not None
                offsets = [r.offset for r in records]
                assert offsets == list(range(position, position + len(records)))
                assert state.position == offsets[-1] + 1
                assert state.position_epoch == records[-1].leader_epoch
        if state.fetch_state is V:
            assert state.position_epoch >= 0, "only a position with an epoch is validated"
        if kind in ("seek", "reset_to"):
            assert state.generation > generation, "every move bumps the generation"
        state.check()
