"""The client's incremental fetch session handler (client/fetch_session.py, Kafka's
FetchSessionHandler): what each built request carries (full, added, altered, removed, implied, and
the added-before-altered order) and what each answer, error and close does to the next request's
session id and epoch (KIP-227; Kafka's FetchSessionHandler.java), as table rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import pytest

from minibroker.client.errors import ErrorCode
from minibroker.client.fetch_session import (
    FINAL_EPOCH,
    MAX_EPOCH,
    FetchRequestData,
    FetchSessionHandler,
    next_epoch,
)
from minibroker.client.types import TopicPartition

A, B, C, D, E = (TopicPartition("t", p) for p in range(5))
SID = 7
NONE = ErrorCode.NONE


class Target(NamedTuple):
    """Stands in for the per-partition request data (compared with ==)."""

    offset: int
    max_bytes: int = 1024


def t(offset: int) -> Target:
    return Target(offset)


def in_session(
    partitions: dict[TopicPartition, Target], epoch: int = 1
) -> FetchSessionHandler[Target]:
    """A handler whose session SID holds `partitions` and whose next request has `epoch`."""
    handler: FetchSessionHandler[Target] = FetchSessionHandler(node_id=1)
    data = handler.build(partitions)
    assert handler.handle_response(data, NONE, SID, list(partitions))
    assert (handler.session_id, handler.epoch) == (SID, 1)
    while handler.epoch < epoch:
        assert handler.handle_response(handler.build(partitions), NONE, SID, [])
    return handler


def meta(handler: FetchSessionHandler[Target]) -> tuple[int, int]:
    return handler.session_id, handler.epoch


# --- next_epoch (FetchMetadata.nextEpoch) ----------------------------------------------------


@pytest.mark.parametrize(
    ("epoch", "expected"),
    [(-1, -1), (-5, -1), (0, 1), (1, 2), (41, 42), (MAX_EPOCH - 1, MAX_EPOCH), (MAX_EPOCH, 1)],
)
def test_next_epoch(epoch: int, expected: int) -> None:
    assert next_epoch(epoch) == expected


# --- build -----------------------------------------------------------------------------------

SESSION = {A: t(1), B: t(2), C: t(3)}

# (name, wanted, expected: to_send in order, to_forget)
BUILD_ROWS = [
    ("implied: all equal, nothing sent", {A: t(1), B: t(2), C: t(3)}, [], []),
    ("implied: equal, not the same object", {A: Target(1), B: Target(2), C: t(3)}, [], []),
    ("altered: new offset", {A: t(1), B: t(5), C: t(3)}, [(B, t(5))], []),
    ("altered: other field", {A: t(1), B: Target(2, 9), C: t(3)}, [(B, Target(2, 9))], []),
    ("added", {A: t(1), B: t(2), C: t(3), D: t(0)}, [(D, t(0))], []),
    ("removed: forgotten", {A: t(1), C: t(3)}, [], [B]),
    ("removed all", {}, [], [A, B, C]),
    ("removed and added, same size", {A: t(1), B: t(2), D: t(0)}, [(D, t(0))], [C]),
    (
        "added before altered",
        {C: t(8), D: t(0), A: t(1), E: t(4)},
        [(D, t(0)), (E, t(4)), (C, t(8))],
        [B],
    ),
    (
        "altered in the caller's order",
        {C: t(8), B: t(7), A: t(6)},
        [(C, t(8)), (B, t(7)), (A, t(6))],
        [],
    ),
]


@pytest.mark.parametrize(
    ("wanted", "to_send", "to_forget"),
    [row[1:] for row in BUILD_ROWS],
    ids=[row[0] for row in BUILD_ROWS],
)
def test_build_incremental(
    wanted: dict[TopicPartition, Target],
    to_send: list[tuple[TopicPartition, Target]],
    to_forget: list[TopicPartition],
) -> None:
    handler = in_session(SESSION, epoch=3)
    data = handler.build(wanted)
    assert (data.session_id, data.epoch, data.is_full) == (SID, 3, False)
    assert list(data.to_send.items()) == to_send
    assert data.to_forget == to_forget
    assert data.session == wanted
    assert handler.session_partitions == wanted
    # The next round diffs against this one's wanted set.
    assert handler.handle_response(data, NONE, SID, [])
    again = handler.build(wanted)
    assert (again.to_send, again.to_forget, again.epoch) == ({}, [], 4)


def full_after(event: str) -> FetchSessionHandler[Target]:
    if event == "new":
        return FetchSessionHandler(node_id=1)
    handler = in_session(SESSION, epoch=3)
    if event == "handle_error":
        handler.handle_error()
    elif event == "notify_close":
        handler.notify_close()
    else:
        assert not handler.handle_response(handler.build(SESSION), ErrorCode[event], 0, [])
    return handler


@pytest.mark.parametrize(
    ("event", "metadata"),
    [
        ("new", (0, 0)),
        ("handle_error", (SID, 0)),
        ("INVALID_FETCH_SESSION_EPOCH", (SID, 0)),
        ("FETCH_SESSION_ID_NOT_FOUND", (0, 0)),
        ("notify_close", (SID, FINAL_EPOCH)),
    ],
)
def test_build_full_sends_everything(event: str, metadata: tuple[int, int]) -> None:
    handler = full_after(event)
    assert handler.next_is_full
    wanted = {D: t(0), A: t(9), B: t(2)}
    data = handler.build(wanted)
    assert (data.session_id, data.epoch, data.is_full) == (*metadata, True)
    assert list(data.to_send.items()) == list(wanted.items())
    assert data.session == wanted and data.to_forget == []


def test_build_copies_the_wanted_map() -> None:
    handler = in_session(SESSION)
    wanted = dict(SESSION)
    data = handler.build(wanted)
    wanted[D] = t(0)
    del wanted[A]
    assert data.session == SESSION and handler.session_partitions == SESSION


def test_full_requests_are_counted() -> None:
    handler = in_session(SESSION, epoch=3)  # one full request, then incremental ones
    assert handler.full_requests == 1
    handler.handle_error()
    handler.build(SESSION)
    handler.build(SESSION)  # no answer yet: still full
    assert handler.full_requests == 3


# --- handle_response / handle_error / notify_close ------------------------------------------

FULL = {A: t(1), B: t(2)}

# (name, request metadata before, error, response session id, partitions named,
#  expected: processed, next metadata)
FULL_ROWS = [
    ("session created", (0, 0), NONE, SID, [A, B], True, (SID, 1)),
    ("session created, order free", (0, 0), NONE, SID, [B, A], True, (SID, 1)),
    ("no session (cache full): sessionless", (0, 0), NONE, 0, [A, B], True, (0, 0)),
    ("missing partition", (0, 0), NONE, SID, [A], False, (0, 0)),
    ("extra partition", (0, 0), NONE, SID, [A, B, C], False, (0, 0)),
    ("empty (throttled)", (0, 0), NONE, SID, [], False, (0, 0)),
    ("missing, no session", (0, 0), NONE, 0, [B], False, (0, 0)),
    ("70", (0, 0), ErrorCode.FETCH_SESSION_ID_NOT_FOUND, 0, [], False, (0, 0)),
    ("71", (0, 0), ErrorCode.INVALID_FETCH_SESSION_EPOCH, 0, [], False, (0, 0)),
    ("other error", (0, 0), ErrorCode.UNKNOWN_SERVER_ERROR, 0, [], False, (0, 0)),
    ("close existing: new session", (SID, 0), NONE, 9, [A, B], True, (9, 1)),
    ("close existing: none made", (SID, 0), NONE, 0, [A, B], True, (0, 0)),
    ("close existing, 70", (SID, 0), ErrorCode.FETCH_SESSION_ID_NOT_FOUND, 0, [], False, (0, 0)),
    ("close existing, 71", (SID, 0), ErrorCode.INVALID_FETCH_SESSION_EPOCH, 0, [], False, (SID, 0)),
    ("close existing, other", (SID, 0), ErrorCode.NOT_CONTROLLER, 0, [], False, (SID, 0)),
    ("close existing, missing", (SID, 0), NONE, 9, [A], False, (0, 0)),
    ("final epoch: closed", (SID, -1), NONE, 0, [A, B], True, (0, 0)),
    ("final epoch, error", (SID, -1), ErrorCode.REQUEST_TIMED_OUT, 0, [], False, (SID, 0)),
]


def handler_before(
    metadata: tuple[int, int], partitions: dict[TopicPartition, Target]
) -> FetchSessionHandler[Target]:
    if metadata == (0, 0):
        return FetchSessionHandler(node_id=1)
    session_id, epoch = metadata
    assert session_id == SID
    handler = in_session(partitions, epoch=max(epoch, 1))
    if epoch == 0:
        handler.handle_error()
    elif epoch == FINAL_EPOCH:
        handler.notify_close()
    assert meta(handler) == metadata
    return handler


@pytest.mark.parametrize(
    ("before", "error", "session_id", "named", "processed", "after"),
    [row[1:] for row in FULL_ROWS],
    ids=[row[0] for row in FULL_ROWS],
)
def test_full_response(
    before: tuple[int, int],
    error: ErrorCode,
    session_id: int,
    named: list[TopicPartition],
    processed: bool,
    after: tuple[int, int],
) -> None:
    handler = handler_before(before, FULL)
    data = handler.build(FULL)
    assert data.is_full and (data.session_id, data.epoch) == before
    assert handler.handle_response(data, error, session_id, iter(named)) is processed
    assert meta(handler) == after
    assert handler.next_is_full == (after[1] in (0, -1))


INC_ROWS = [
    ("nothing new", 3, NONE, SID, [], True, (SID, 4)),
    ("some partitions", 3, NONE, SID, [B], True, (SID, 4)),
    ("every partition", 3, NONE, SID, [A, B], True, (SID, 4)),
    ("partition outside the session", 3, NONE, SID, [A, C], False, (SID, 0)),
    ("forgotten partition named", 3, NONE, SID, [D], False, (SID, 0)),
    ("session closed by the broker", 3, NONE, 0, [A], True, (0, 0)),
    ("closed, outside the session", 3, NONE, 0, [C], False, (SID, 0)),
    ("70: new session", 3, ErrorCode.FETCH_SESSION_ID_NOT_FOUND, 0, [], False, (0, 0)),
    ("71: close and new", 3, ErrorCode.INVALID_FETCH_SESSION_EPOCH, 0, [], False, (SID, 0)),
    ("71 at response time", 3, ErrorCode.INVALID_FETCH_SESSION_EPOCH, SID, [], False, (SID, 0)),
    ("other error", 3, ErrorCode.NOT_LEADER_OR_FOLLOWER, 0, [], False, (SID, 0)),
    ("unknown server error", 3, ErrorCode.UNKNOWN_SERVER_ERROR, 0, [], False, (SID, 0)),
    ("epoch 1", 1, NONE, SID, [A], True, (SID, 2)),
    ("epoch wraps to 1, not 0", MAX_EPOCH, NONE, SID, [A], True, (SID, 1)),
]


@pytest.mark.parametrize(
    ("epoch", "error", "session_id", "named", "processed", "after"),
    [row[1:] for row in INC_ROWS],
    ids=[row[0] for row in INC_ROWS],
)
def test_incremental_response(
    epoch: int,
    error: ErrorCode,
    session_id: int,
    named: list[TopicPartition],
    processed: bool,
    after: tuple[int, int],
) -> None:
    handler = in_session({A: t(1), B: t(2), D: t(0)}, epoch=min(epoch, 3))
    if epoch == MAX_EPOCH:
        handler._epoch = MAX_EPOCH  # 2**31 round trips are too many for a unit test
    data = handler.build(FULL)  # D removed: forgotten
    assert (data.session_id, data.epoch, data.to_forget) == (SID, epoch, [D])
    assert handler.handle_response(data, error, session_id, iter(named)) is processed
    assert meta(handler) == after


def test_handle_error_then_full_closes_the_session() -> None:
    handler = in_session(SESSION, epoch=5)
    handler.build({A: t(4)})
    handler.handle_error()
    assert meta(handler) == (SID, 0) and handler.next_is_full
    data = handler.build(SESSION)
    assert (data.session_id, data.epoch, data.to_send) == (SID, 0, SESSION)


def test_notify_close_returns_the_closing_metadata() -> None:
    handler = in_session(SESSION, epoch=5)
    assert handler.notify_close() == (SID, FINAL_EPOCH)
    assert FetchSessionHandler(node_id=2).notify_close() == (0, FINAL_EPOCH)


# (name, what happens between building `data` and its answer arriving)
STALE = [
    ("answered twice", lambda h, d: h.handle_response(d, NONE, SID, [])),
    ("after handle_error", lambda h, d: h.handle_error()),
    ("after notify_close", lambda h, d: h.notify_close()),
    ("after a newer build", lambda h, d: h.build(SESSION)),
]


@pytest.mark.parametrize("between", [row[1] for row in STALE], ids=[row[0] for row in STALE])
def test_stale_answers_are_ignored(
    between: Callable[[FetchSessionHandler[Target], FetchRequestData[Target]], object],
) -> None:
    handler = in_session(SESSION, epoch=3)
    data = handler.build(SESSION)
    between(handler, data)
    before = meta(handler)
    assert not handler.handle_response(data, NONE, SID, [A])
    assert not handler.handle_response(data, ErrorCode.FETCH_SESSION_ID_NOT_FOUND, 0, [])
    assert meta(handler) == before


def test_request_data_is_full() -> None:
    for epoch, full in [(0, True), (-1, True), (1, False), (MAX_EPOCH, False)]:
        data: FetchRequestData[Target] = FetchRequestData(SID, epoch, {}, [], {})
        assert data.is_full is full
