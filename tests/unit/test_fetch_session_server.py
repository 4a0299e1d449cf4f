"""Incremental fetch sessions, server side (broker/fetch_session.py), pure, with a fake clock.

Table tests for each KIP-227 rule (Kafka's FetchSession.scala: what a request is, what an
incremental response carries, when the cache evicts), the epoch wrap, the owner check, the duplicate
request found at response time, and two properties: the reverse index partition -> sessions
always equals the one recomputed from the sessions, and evaluating only the sent + dirty
partitions selects exactly what Kafka's full scan of the session selects, as long as every
change to a partition's answer comes with `mark_dirty`.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.fetch_session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    MAX_EPOCH,
    FetchContext,
    FetchMetadata,
    FetchSession,
    FetchSessionCache,
    next_epoch,
)
from minibroker.broker.wire import FetchPartitionRequest, FetchPartitionResult
from minibroker.client.errors import ErrorCode
from minibroker.client.types import TopicPartition

EVICT = 120_000
FOLLOWER = "follower-1"
CONSUMER = "consumer-1"


def tp(n: int, topic: str = "t") -> TopicPartition:
    return TopicPartition(topic, n)


def req(p: TopicPartition, fetch_offset: int = 10, **kw: Any) -> FetchPartitionRequest:
    fields: dict[str, Any] = {
        "current_leader_epoch": 0,
        "last_fetched_epoch": -1,
        "log_start_offset": 0,
        "max_bytes": 1 << 20,
    }
    fields.update(kw)
    return FetchPartitionRequest(p.topic, p.partition, fetch_offset=fetch_offset, **fields)


def res(
    p: TopicPartition, hw: int = 10, leo: int = 10, ls: int = 0, **kw: Any
) -> FetchPartitionResult:
    return FetchPartitionResult(
        p.topic, p.partition, high_watermark=hw, log_end_offset=leo, log_start_offset=ls, **kw
    )


def new_cache(slots: int = 10, eviction_ms: int = EVICT, seed: int = 0) -> FetchSessionCache:
    return FetchSessionCache(slots, eviction_ms, random.Random(seed))


def context(
    cache: FetchSessionCache,
    session_id: int,
    epoch: int,
    to_send: Sequence[FetchPartitionRequest] = (),
    to_forget: Sequence[TopicPartition] = (),
    *,
    owner: str = FOLLOWER,
    privileged: bool = True,
    now: int = 0,
) -> FetchContext:
    return cache.new_context(
        FetchMetadata(session_id, epoch),
        privileged=privileged,
        owner=owner,
        to_send=to_send,
        to_forget=to_forget,
        now_ms=now,
    )


def open_session(
    cache: FetchSessionCache,
    tps: Iterable[TopicPartition],
    *,
    owner: str = FOLLOWER,
    privileged: bool = True,
    now: int = 0,
) -> int:
    """A full request for `tps` (fetching at 10, answered caught up at HW = LEO = 10)."""
    tps = list(tps)
    ctx = context(
        cache, 0, INITIAL_EPOCH, [req(p) for p in tps], owner=owner, privileged=privileged, now=now
    )
    assert ctx.kind == "full"
    session_id, error, sent = ctx.respond([res(p) for p in ctx_parts(ctx.to_evaluate())], now)
    assert error == ErrorCode.NONE and len(sent) == len(tps)
    return session_id


def ctx_parts(requests: Iterable[FetchPartitionRequest]) -> list[TopicPartition]:
    return [TopicPartition(r.topic, r.partition) for r in requests]


def session_of(cache: FetchSessionCache, session_id: int) -> FetchSession:
    session = cache.get(session_id)
    assert session is not None
    return session


# --- §1a: epochs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("epoch", "after"),
    [(-1, -1), (-7, -1), (0, 1), (1, 2), (41, 42), (MAX_EPOCH - 1, MAX_EPOCH), (MAX_EPOCH, 1)],
)
def test_next_epoch(epoch: int, after: int) -> None:
    assert next_epoch(epoch) == after


@pytest.mark.parametrize(
    ("meta", "full"),
    [((0, -1), True), ((0, 0), True), ((5, 0), True), ((5, -1), True), ((5, 1), False)],
)
def test_full_requests_are_epoch_0_or_final(meta: tuple[int, int], full: bool) -> None:
    assert FetchMetadata(*meta).is_full is full


def test_the_epoch_wraps_to_1_never_0() -> None:
    cache = new_cache()
    sid = open_session(cache, [tp(0)])
    session_of(cache, sid).epoch = MAX_EPOCH
    ctx = context(cache, sid, MAX_EPOCH)
    assert ctx.kind == "incremental" and session_of(cache, sid).epoch == 1
    assert ctx.respond([], 1)[:2] == (sid, ErrorCode.NONE)
    assert context(cache, sid, 1).kind == "incremental"
    assert session_of(cache, sid).epoch == 2


# --- §1b: what a request is ------------------------------------------------------------------


def test_a_final_epoch_request_is_sessionless() -> None:
    cache = new_cache()
    ctx = context(cache, 0, FINAL_EPOCH, [req(tp(0)), req(tp(1))])
    assert ctx.kind == "sessionless" and ctx.error == ErrorCode.NONE and ctx.session is None
    assert ctx_parts(ctx.to_evaluate()) == [tp(0), tp(1)]
    results = [res(tp(0)), res(tp(1))]
    assert ctx.respond(results, 0) == (INVALID_SESSION_ID, ErrorCode.NONE, results)
    assert len(cache) == 0 and cache.partitions_cached == 0


def test_a_full_request_creates_a_session_caching_what_it_answered() -> None:
    cache = new_cache()
    ctx = context(cache, 0, INITIAL_EPOCH, [req(tp(0), 5), req(tp(1), 7)], now=100)
    assert ctx.kind == "full" and ctx.session is None
    assert ctx_parts(ctx.to_evaluate()) == [tp(0), tp(1)]
    results = [res(tp(0), hw=8, leo=9, ls=1), res(tp(1), hw=7, leo=7, ls=2)]
    sid, error, sent = ctx.respond(results, 100)
    assert sid != INVALID_SESSION_ID and error == ErrorCode.NONE and sent == results
    session = session_of(cache, sid)
    assert (session.epoch, session.privileged, session.owner) == (1, True, FOLLOWER)
    assert (session.created_ms, session.last_used_ms) == (100, 100)
    cached = {
        p: (c.request.fetch_offset, c.high_watermark, c.log_end_offset, c.log_start_offset)
        for p, c in session.partitions.items()
    }
    assert cached == {tp(0): (5, 8, 9, 1), tp(1): (7, 7, 7, 2)}
    assert len(cache) == 1 and cache.partitions_cached == 2
    assert session.topics() == frozenset({"t"})


@pytest.mark.parametrize("epoch", [INITIAL_EPOCH, FINAL_EPOCH])
def test_a_full_request_naming_a_session_closes_it_first(epoch: int) -> None:
    cache = new_cache()
    sid = open_session(cache, [tp(0), tp(1)])
    ctx = context(cache, sid, epoch, [req(tp(2))])
    assert cache.get(sid) is None and cache.partitions_cached == 0
    assert cache.sessions_holding(tp(0)) == []
    assert ctx.kind == ("full" if epoch == INITIAL_EPOCH else "sessionless")


def test_a_full_request_does_not_close_someone_elses_session() -> None:
    cache = new_cache()
    sid = open_session(cache, [tp(0)], owner=CONSUMER, privileged=False)
    context(cache, sid, INITIAL_EPOCH, [req(tp(0))], owner="intruder")
    assert cache.get(sid) is not None


@pytest.mark.parametrize(
    ("case", "code"),
    [
        ("unknown id", ErrorCode.FETCH_SESSION_ID_NOT_FOUND),
        ("other owner", ErrorCode.FETCH_SESSION_ID_NOT_FOUND),
        ("epoch behind", ErrorCode.INVALID_FETCH_SESSION_EPOCH),
        ("epoch ahead", ErrorCode.INVALID_FETCH_SESSION_EPOCH),
    ],
)
def test_incremental_request_errors(case: str, code: ErrorCode) -> None:
    cache = new_cache()
    sid = open_session(cache, [tp(0)])
    context(cache, sid, 1).respond([], 0)  # the session now expects epoch 2
    meta = {
        "unknown id": (sid + 1, 2, FOLLOWER),
        "other owner": (sid, 2, "follower-2"),
        "epoch behind": (sid, 1, FOLLOWER),
        "epoch ahead": (sid, 3, FOLLOWER),
    }[case]
    cache.mark_dirty(tp(0))
    ctx = context(cache, meta[0], meta[1], [req(tp(1))], [tp(0)], owner=meta[2])
    assert (ctx.kind, ctx.error, ctx.session) == ("error", code, None)
    assert ctx.to_evaluate() == [] and ctx.take_dirty() == []
    assert ctx.respond([res(tp(0))], 0) == (INVALID_SESSION_ID, code, [])
    session = session_of(cache, sid)  # untouched
    assert (session.epoch, list(session.partitions), session.dirty) == (2, [tp(0)], {tp(0)})


def test_a_valid_incremental_request_adds_alters_and_forgets() -> None:
    cache = new_cache()
    sid = open_session(cache, [tp(0), tp(1), tp(2)], now=0)
    ctx = context(cache, sid, 1, [req(tp(1), 11), req(tp(3), 0)], [tp(2)], now=50)
    assert ctx.kind == "incremental" and ctx.session is session_of(cache, sid)
    session = session_of(cache, sid)
    assert session.epoch == 2 and session.last_used_ms == 50  # bumped on arrival
    assert list(session.partitions) == [tp(0), tp(1), tp(3)]  # altered stays in place
    assert session.partitions[tp(1)].request.fetch_offset == 11
    assert session.partitions[tp(3)].high_watermark == -1  # never sent
    assert [(r.partition, r.fetch_offset) for r in ctx.to_evaluate()] == [(1, 11), (3, 0)]
    assert cache.partitions_cached == 3
    assert [s.id for s in cache.sessions_holding(tp(2))] == []
    assert [s.id for s in cache.sessions_holding(tp(3))] == [sid]


def test_an_incremental_request_sending_twice_keeps_the_last() -> None:
    cache = new_cache()
    sid = open_session(cache, [tp(0)])
    ctx = context(cache, sid, 1, [req(tp(0), 3), req(tp(0), 4)])
    assert [r.fetch_offset for r in ctx.to_evaluate()] == [4]


def test_an_incremental_request_that_empties_the_session_is_answered_sessionless() -> None:
    cache = new_cache()
    sid = open_session(cache, [tp(0), tp(1)])
    ctx = context(cache, sid, 1, [req(tp(2))], [tp(0), tp(1), tp(2)])
    assert ctx.kind == "sessionless" and cache.get(sid) is None and len(cache) == 0
    assert cache.partitions_cached == 0 and cache.sessions_holding(tp(0)) == []
    assert ctx_parts(ctx.to_evaluate()) == [tp(2)]  # Kafka: SessionlessFetchContext(fetchData)
    assert ctx.respond([res(tp(2))], 0) == (INVALID_SESSION_ID, ErrorCode.NONE, [res(tp(2))])


def test_a_duplicate_request_is_refused_at_response_time() -> None:
    cache = new_cache()
    sid = open_session(cache, [tp(0), tp(1)])
    cache.mark_dirty(tp(0))
    first = context(cache, sid, 1)
    assert ctx_parts(first.to_evaluate()) == [tp(0)]
    second = context(cache, sid, 2, [req(tp(1), 12)])  # arrives while the first is parked
    cache.mark_dirty(tp(1))
    # The dirty set belongs to the newer request now.
    assert first.to_evaluate() == [] and first.take_dirty() == []
    assert session_of(cache, sid).dirty == {tp(1)}
    assert first.respond([res(tp(0), hw=11, leo=11)], 5) == (
        sid,
        ErrorCode.INVALID_FETCH_SESSION_EPOCH,
        [],
    )
    # What the refused request evaluated goes back to the dirty set, for the next one.
    assert ctx_parts(second.to_evaluate()) == [tp(1), tp(0)]
    sid2, error, sent = second.respond([res(tp(1), hw=12, leo=12), res(tp(0), hw=11, leo=11)], 6)
    assert (sid2, error, ctx_parts(sent)) == (sid, ErrorCode.NONE, [tp(1), tp(0)])


# --- §1c: what an incremental response carries ----------------------------------------------

# The session partition was last answered (fetch 10, HW 10, LEO 10, log start 0): caught up.
INCLUSION = [
    ("nothing new", {}, False, (10, 10, 0)),
    ("records", {"hw": 12, "leo": 12, "records": b"xy"}, True, (12, 12, 0)),
    ("records only", {"records": b"x"}, True, (10, 10, 0)),
    ("hw moved", {"hw": 9}, True, (9, 10, 0)),
    ("log start moved", {"ls": 3}, True, (10, 10, 3)),
    ("log end moved", {"leo": 11}, True, (10, 11, 0)),
    ("error", {"error": ErrorCode.NOT_LEADER_OR_FOLLOWER}, True, (-1, 10, 0)),
    ("preferred replica", {"preferred_read_replica": 2}, True, (10, 10, 0)),
    ("diverging epoch", {"diverging_epoch": (3, 8)}, True, (10, 10, 0)),
    ("current leader only", {"current_leader": (2, 5)}, False, (10, 10, 0)),
]


@pytest.mark.parametrize(("case", "change", "included", "cached"), INCLUSION)
def test_what_an_incremental_response_carries(
    case: str, change: dict[str, Any], included: bool, cached: tuple[int, int, int]
) -> None:
    cache = new_cache()
    sid = open_session(cache, [tp(0), tp(1), tp(2)])
    cache.mark_dirty(tp(1))
    ctx = context(cache, sid, 1)
    assert ctx_parts(ctx.to_evaluate()) == [tp(1)]
    result = res(tp(1), **change)
    _, error, sent = ctx.respond([res(tp(1), hw=0), result], 1)  # the last result counts
    assert error == ErrorCode.NONE and sent == ([result] if included else [])
    cp = session_of(cache, sid).partitions[tp(1)]
    assert (cp.high_watermark, cp.log_end_offset, cp.log_start_offset) == cached
    order = [tp(0), tp(2), tp(1)] if change.get("records") else [tp(0), tp(1), tp(2)]
    assert list(session_of(cache, sid).partitions) == order  # data rotates to the end


@pytest.mark.parametrize(
    ("case", "first", "then_included"),
    [
        # An error is sent once and again when it clears (cached HW was reset to -1).
        ("error then recovery", {"error": ErrorCode.NOT_LEADER_OR_FOLLOWER, "hw": 10}, True),
        # A preferred replica is repeated on every response while it is set.
        ("preferred replica", {"preferred_read_replica": 2}, True),
        ("diverging epoch", {"diverging_epoch": (3, 8)}, True),
        ("hw moved", {"hw": 9}, False),
    ],
)
def test_which_answers_repeat_on_the_next_request(
    case: str, first: dict[str, Any], then_included: bool
) -> None:
    cache = new_cache()
    sid = open_session(cache, [tp(0)])
    cache.mark_dirty(tp(0))
    ctx = context(cache, sid, 1)
    ctx.to_evaluate()
    assert ctx_parts(ctx.respond([res(tp(0), **first)], 1)[2]) == [tp(0)]
    # Nothing marked it dirty since, yet a full scan would answer it again: it is evaluated.
    ctx = context(cache, sid, 2)
    assert ctx_parts(ctx.to_evaluate()) == ([tp(0)] if then_included else [])
    repeat = res(tp(0), **first) if case != "error then recovery" else res(tp(0))
    sent = ctx.respond([repeat] if then_included else [], 2)[2]
    assert ctx_parts(sent) == ([tp(0)] if then_included else [])


@pytest.mark.parametrize(
    ("case", "privileged", "fetch_offset", "result", "dirty"),
    [
        ("caught up", True, 10, {}, False),
        ("follower behind the log end, nothing sent", True, 9, {}, True),
        ("follower at the log end, past the HW", True, 10, {"hw": 8}, False),
        ("consumer behind the HW, nothing sent", False, 7, {"hw": 8}, True),
        ("consumer at the HW, below the log end", False, 8, {"hw": 8}, False),
        ("records sent", True, 5, {"records": b"x"}, True),
        ("records sent, whatever the offsets say", False, 10, {"records": b"x"}, True),
        ("error", True, 10, {"error": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}, True),
    ],
)
def test_respond_re_marks_what_must_be_looked_at_again(
    case: str, privileged: bool, fetch_offset: int, result: dict[str, Any], dirty: bool
) -> None:
    cache = new_cache()
    owner = FOLLOWER if privileged else CONSUMER
    sid = open_session(cache, [tp(0)], owner=owner, privileged=privileged)
    ctx = context(cache, sid, 1, [req(tp(0), fetch_offset)], owner=owner, privileged=privileged)
    assert ctx_parts(ctx.to_evaluate()) == [tp(0)]
    ctx.respond([res(tp(0), **result)], 1)
    assert session_of(cache, sid).dirty == ({tp(0)} if dirty else set())
    # Re-marking wakes nobody: the next mark_dirty still reports the session only if clean.
    assert [s.id for s in cache.mark_dirty(tp(0))] == ([] if dirty else [sid])


def test_a_full_response_marks_what_needs_another_look() -> None:
    cache = new_cache()
    ctx = context(cache, 0, INITIAL_EPOCH, [req(tp(0), 10), req(tp(1), 5), req(tp(2), 10)])
    results = [res(tp(0)), res(tp(1)), res(tp(2), error=ErrorCode.NOT_LEADER_OR_FOLLOWER)]
    sid = ctx.respond(results, 0)[0]
    session = session_of(cache, sid)
    assert session.dirty == {tp(1), tp(2)} and session.partitions[tp(2)].high_watermark == -1


# --- dirty sets, wakes, the reverse index ---------------------------------------------------


def test_mark_dirty_reports_each_session_once_until_evaluated() -> None:
    cache = new_cache()
    a = open_session(cache, [tp(0), tp(1)], owner="a")
    b = open_session(cache, [tp(1), tp(2)], owner="b")
    assert [s.id for s in cache.mark_dirty(tp(1))] == [a, b]
    assert cache.mark_dirty(tp(1)) == []  # already dirty: nobody new to wake
    assert [s.id for s in cache.mark_dirty(tp(2))] == [b]
    assert cache.mark_dirty(tp(9)) == []
    ctx = context(cache, a, 1, owner="a")
    assert ctx_parts(ctx.to_evaluate()) == [tp(1)] and session_of(cache, a).dirty == set()
    assert [s.id for s in cache.mark_dirty(tp(1))] == [a]  # parked request: woken
    assert ctx_parts(ctx.take_dirty()) == [tp(1)] and ctx.take_dirty() == []
    assert session_of(cache, b).dirty == {tp(1), tp(2)}


def test_to_evaluate_gives_cached_params_for_dirty_and_sent_first() -> None:
    cache = new_cache()
    sid = open_session(cache, [tp(0), tp(1), tp(2)])
    cache.mark_dirty(tp(2))
    cache.mark_dirty(tp(0))
    ctx = context(cache, sid, 1, [req(tp(0), 12)])
    evaluated = ctx.to_evaluate()
    assert [(r.partition, r.fetch_offset) for r in evaluated] == [(0, 12), (2, 10)]


def test_forgetting_a_dirty_partition_drops_it_from_the_dirty_set() -> None:
    cache = new_cache()
    sid = open_session(cache, [tp(0), tp(1)])
    cache.mark_dirty(tp(0))
    ctx = context(cache, sid, 1, (), [tp(0)])
    assert ctx.to_evaluate() == [] and session_of(cache, sid).dirty == set()


def test_topics_are_counted() -> None:
    cache = new_cache()
    sid = open_session(cache, [tp(0, "a"), tp(1, "a"), tp(0, "b")])
    session = session_of(cache, sid)
    assert session.topics() == {"a", "b"}
    context(cache, sid, 1, [req(tp(0, "c"))], [tp(0, "a"), tp(0, "b")]).respond([], 0)
    assert session.topics() == {"a", "c"}


def test_a_session_removed_while_parked_still_answers_but_is_gone() -> None:
    cache = new_cache()
    sid = open_session(cache, [tp(0)])
    cache.mark_dirty(tp(0))
    ctx = context(cache, sid, 1)
    ctx.to_evaluate()
    cache.remove(sid)
    cache.remove(sid)  # twice: no-op
    assert ctx.respond([res(tp(0), hw=11)], 1)[:2] == (sid, ErrorCode.NONE)
    assert len(cache) == 0 and cache.partitions_cached == 0 and cache.mark_dirty(tp(0)) == []
    assert context(cache, sid, 2).error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


# --- §1d: the cache and eviction -------------------------------------------------------------


def test_no_slots_never_creates_a_session() -> None:
    cache = new_cache(slots=0)
    ctx = context(cache, 0, INITIAL_EPOCH, [req(tp(0))])
    assert ctx.respond([res(tp(0))], 0) == (INVALID_SESSION_ID, ErrorCode.NONE, [res(tp(0))])
    assert len(cache) == 0 and cache.evictions == 0


def _fill(cache: FetchSessionCache, specs: Sequence[tuple[str, bool, int, int, int]]) -> list[int]:
    """Sessions (owner, privileged, size, created at, last touched at)."""
    ids = []
    for owner, privileged, size, created, touched in specs:
        parts = [tp(i, owner) for i in range(size)]
        sid = open_session(cache, parts, owner=owner, privileged=privileged, now=created)
        if touched != created:
            ctx = context(cache, sid, 1, owner=owner, privileged=privileged, now=touched)
            ctx.respond([], touched)
        ids.append(sid)
    return ids


# (existing sessions, newcomer (privileged, size, at), which existing one is evicted or None)
EVICTION = [
    (
        "stale: unused for longer than eviction_ms",
        [("c", False, 5, 0, 0)],
        (False, 1, EVICT + 1),
        0,
    ),
    ("not stale at exactly eviction_ms", [("c", False, 5, 0, 0)], (False, 9, EVICT), None),
    ("stale even when privileged and bigger", [("f", True, 9, 0, 0)], (False, 1, EVICT + 1), 0),
    ("privileged evicts a young consumer", [("c", False, 5, 0, 0)], (True, 1, 1), 0),
    ("consumer does not evict a young consumer", [("c", False, 1, 0, 0)], (False, 5, 1), None),
    ("privileged does not evict a young follower", [("f", True, 1, 0, 0)], (True, 5, 1), None),
    ("bigger evicts smaller when old", [("c", False, 2, 0, EVICT + 1)], (False, 3, EVICT + 2), 0),
    ("equal size does not", [("c", False, 2, 0, EVICT + 1)], (False, 2, EVICT + 2), None),
    ("smaller does not", [("c", False, 2, 0, EVICT + 1)], (False, 1, EVICT + 2), None),
    (
        "bigger follower evicts old follower",
        [("f", True, 2, 0, EVICT + 1)],
        (True, 3, EVICT + 2),
        0,
    ),
    (
        "consumer never evicts an old follower",
        [("f", True, 1, 0, EVICT + 1)],
        (False, 9, EVICT + 2),
        None,
    ),
    # Age is judged at the last touch (Kafka's evictable maps are updated by touch only).
    ("old but not touched since", [("c", False, 2, 0, 1000)], (False, 3, EVICT + 500), None),
    ("smallest consumer first", [("c", False, 3, 0, 0), ("d", False, 1, 0, 0)], (True, 1, 1), 1),
    (
        "consumers before followers",
        [("f", True, 1, 0, EVICT + 1), ("c", False, 9, 0, EVICT + 1)],
        (True, 5, EVICT + 2),
        1,
    ),
    (
        "least recently used is stale first",
        [("c", False, 1, 0, 10), ("d", False, 9, 0, 5)],
        (False, 1, EVICT + 6),
        1,
    ),
]


@pytest.mark.parametrize(("case", "existing", "newcomer", "evicted"), EVICTION)
def test_eviction_rules(
    case: str,
    existing: list[tuple[str, bool, int, int, int]],
    newcomer: tuple[bool, int, int],
    evicted: int | None,
) -> None:
    cache = new_cache(slots=len(existing))
    ids = _fill(cache, existing)
    privileged, size, now = newcomer
    parts = [req(tp(i, "new")) for i in range(size)]
    ctx = context(cache, 0, INITIAL_EPOCH, parts, owner="new", privileged=privileged, now=now)
    sid, _, _ = ctx.respond([res(tp(i, "new")) for i in range(size)], now)
    if evicted is None:
        assert sid == INVALID_SESSION_ID and cache.evictions == 0
        assert all(cache.get(i) is not None for i in ids)
    else:
        assert sid != INVALID_SESSION_ID and cache.evictions == 1
        assert [i for i in ids if cache.get(i) is None] == [ids[evicted]]
        assert cache.sessions_holding(tp(0, existing[evicted][0])) == []
    assert cache.partitions_cached == sum(
        len(session_of(cache, i).partitions) for i in [*ids, sid] if cache.get(i) is not None
    )


def test_session_ids_are_positive_and_unique() -> None:
    class Repeating:
        def __init__(self) -> None:
            self.values = iter([0, 7, 7, 7, 9])

        def getrandbits(self, k: int, /) -> int:
            return next(self.values)

    cache = FetchSessionCache(10, EVICT, Repeating())
    assert [open_session(cache, [tp(0)], owner=o) for o in "ab"] == [7, 9]
    default = FetchSessionCache(10)
    ids = {open_session(default, [tp(0)], owner=str(o)) for o in range(10)}
    assert len(ids) == 10 and all(0 < i < 2**31 for i in ids)


def test_the_heaps_stay_bounded_under_many_touches() -> None:
    cache = new_cache(slots=3)
    ids = _fill(cache, [("a", False, 1, 0, 0), ("b", True, 2, 0, 0)])
    epochs = dict.fromkeys(ids, 1)
    for now in range(1, 2000):
        for sid in ids:
            owner = "a" if sid == ids[0] else "b"
            extra = [req(tp(now % 3, owner))] if now % 7 == 0 else []
            ctx = context(cache, sid, epochs[sid], extra, owner=owner, now=now * 1000)
            ctx.respond([], now * 1000)
            epochs[sid] = next_epoch(epochs[sid])
    assert len(cache._lru) <= 2 * len(cache) + 16
    assert len(cache._by_privileged) <= 2 * len(cache) + 16
    assert len(cache._by_all) <= 2 * len(cache) + 16


# --- properties ------------------------------------------------------------------------------

TPS = [tp(i, topic) for topic in ("a", "b") for i in range(3)]
OWNERS = ["o1", "o2", "o3"]

op_strategy = st.one_of(
    st.tuples(
        st.just("full"), st.sampled_from(OWNERS), st.booleans(), st.sets(st.sampled_from(TPS))
    ),
    st.tuples(
        st.just("incremental"),
        st.sampled_from(OWNERS),
        st.lists(st.sampled_from(TPS), max_size=4),
        st.lists(st.sampled_from(TPS), max_size=4),
    ),
    st.tuples(st.just("remove"), st.sampled_from(OWNERS)),
    st.tuples(st.just("dirty"), st.sampled_from(TPS)),
    st.tuples(st.just("tick"), st.integers(0, 3 * EVICT)),
)


@settings(max_examples=300, deadline=None)
@given(slots=st.integers(0, 3), ops=st.lists(op_strategy, max_size=40))
def test_the_reverse_index_matches_the_sessions(slots: int, ops: list[tuple[Any, ...]]) -> None:
    cache = new_cache(slots=slots)
    now = 0
    mine: dict[str, tuple[int, int]] = {}  # owner -> (session id, next epoch)
    seen: set[int] = set()
    for op in ops:
        kind = op[0]
        if kind == "full":
            _, owner, privileged, parts = op
            old = mine.pop(owner, (0, 0))[0]
            ctx = context(
                cache, old, 0, [req(p) for p in parts], owner=owner, privileged=privileged, now=now
            )
            sid = ctx.respond([res(p) for p in ctx_parts(ctx.to_evaluate())], now)[0]
            if sid:
                mine[owner] = (sid, 1)
                seen.add(sid)
        elif kind == "incremental" and op[1] in mine:
            _, owner, send, forget = op
            sid, epoch = mine[owner]
            ctx = context(cache, sid, epoch, [req(p) for p in send], forget, owner=owner, now=now)
            if ctx.kind == "incremental":
                mine[owner] = (sid, next_epoch(epoch))
                results = [res(p, hw=now % 13) for p in ctx_parts(ctx.to_evaluate())]
                ctx.respond(results, now)
            else:
                del mine[owner]
        elif kind == "remove" and op[1] in mine:
            cache.remove(mine.pop(op[1])[0])
        elif kind == "dirty":
            cache.mark_dirty(op[1])
        elif kind == "tick":
            now += op[1]
        live = [s for s in (cache.get(i) for i in seen) if s is not None]
        for p in TPS:
            holders = {s.id for s in cache.sessions_holding(p)}
            assert holders == {s.id for s in live if p in s.partitions}
        assert len(cache) == len(live) <= slots
        assert cache.partitions_cached == sum(len(s.partitions) for s in live)
        for s in live:
            assert s.dirty <= s.partitions.keys()
            assert s.topics() == {p.topic for p in s.partitions}


@dataclasses.dataclass
class PartitionState:
    """What the fake log answers with."""

    log_start: int = 0
    hw: int = 10
    leo: int = 12
    error: ErrorCode = ErrorCode.NONE
    preferred: int = -1
    diverging: tuple[int, int] | None = None


def answer(
    world: dict[TopicPartition, PartitionState],
    r: FetchPartitionRequest,
    privileged: bool,
    held_back: frozenset[TopicPartition],
) -> FetchPartitionResult:
    """A deterministic fetch answer; `held_back` partitions get no records (byte limit,
    throttle)."""
    p = TopicPartition(r.topic, r.partition)
    s = world[p]
    if s.error != ErrorCode.NONE:
        return FetchPartitionResult(p.topic, p.partition, error=s.error)
    limit = s.leo if privileged else s.hw
    records = b""
    if p not in held_back and r.fetch_offset < limit:
        records = f"{r.fetch_offset}:{min(limit, r.fetch_offset + 2)}".encode()
    return FetchPartitionResult(
        p.topic,
        p.partition,
        high_watermark=s.hw,
        log_start_offset=s.log_start,
        log_end_offset=s.leo,
        diverging_epoch=s.diverging,
        preferred_read_replica=s.preferred,
        records=records,
    )


change_strategy = st.tuples(
    st.sampled_from(TPS),
    st.sampled_from(["append", "hw", "log_start", "error", "preferred", "diverging"]),
    st.integers(0, 3),
)
request_strategy = st.tuples(
    st.lists(st.tuples(st.sampled_from(TPS), st.integers(0, 20)), max_size=4),  # sent
    st.lists(st.sampled_from(TPS), max_size=2),  # forgotten
    st.frozensets(st.sampled_from(TPS)),  # held back
    st.lists(change_strategy, max_size=3),  # changes before the request
    st.lists(change_strategy, max_size=2),  # changes while parked
)


def apply_change(world: dict[TopicPartition, PartitionState], change: tuple[Any, str, int]) -> None:
    p, what, n = change
    s = world[p]
    if what == "append":
        s.leo += n
    elif what == "hw":
        s.hw = min(s.leo, s.hw + n) if n else max(s.log_start, s.hw - 1)
    elif what == "log_start":
        s.log_start = min(s.hw, s.log_start + n)
    elif what == "error":
        s.error = ErrorCode.NONE if s.error != ErrorCode.NONE or n == 0 else ErrorCode(6)
    elif what == "preferred":
        s.preferred = -1 if s.preferred >= 0 or n == 0 else n
    else:
        s.diverging = None if s.diverging is not None or n == 0 else (n, s.leo)


def view(results: Iterable[FetchPartitionResult]) -> dict[TopicPartition, FetchPartitionResult]:
    return {TopicPartition(r.topic, r.partition): r for r in results}


@settings(max_examples=400, deadline=None)
@given(
    privileged=st.booleans(),
    initial=st.sets(st.sampled_from(TPS), min_size=1),
    requests=st.lists(request_strategy, max_size=12),
)
def test_dirty_set_evaluation_selects_what_a_full_scan_selects(
    privileged: bool,
    initial: set[TopicPartition],
    requests: list[tuple[Any, ...]],
) -> None:
    """Two caches see the same requests: `fast` evaluates what `to_evaluate`/`take_dirty` give
    (marked by `mark_dirty` on every change), `scan` evaluates every session partition with its
    cached params, as Kafka does. Each response must carry the same partitions, same answers."""
    world = {p: PartitionState() for p in TPS}
    fast, scan = new_cache(seed=1), new_cache(seed=1)
    full = [req(p, 5) for p in sorted(initial)]
    results = {}
    for cache in (fast, scan):
        ctx = context(cache, 0, INITIAL_EPOCH, full, privileged=privileged)
        got = [answer(world, r, privileged, frozenset()) for r in ctx.to_evaluate()]
        results[id(cache)] = ctx.respond(got, 0)
    assert results[id(fast)] == results[id(scan)]
    sid, epoch = results[id(fast)][0], 1
    for now, (sent, forget, held_back, before, parked) in enumerate(requests, start=1):
        for change in before:
            apply_change(world, change)
            fast.mark_dirty(change[0])
        to_send = [req(p, offset) for p, offset in sent]
        f_ctx = context(fast, sid, epoch, to_send, forget, privileged=privileged, now=now)
        s_ctx = context(scan, sid, epoch, to_send, forget, privileged=privileged, now=now)
        assert f_ctx.kind == s_ctx.kind
        if f_ctx.kind != "incremental":
            assert f_ctx.kind == "sessionless"
            return
        epoch = next_epoch(epoch)
        f_results = [answer(world, r, privileged, held_back) for r in f_ctx.to_evaluate()]
        woken = False
        for change in parked:
            apply_change(world, change)
            woken |= bool(fast.mark_dirty(change[0]))
        if woken:
            f_results += [answer(world, r, privileged, held_back) for r in f_ctx.take_dirty()]
        assert s_ctx.session is not None
        s_results = [
            answer(world, cp.request, privileged, held_back)
            for cp in s_ctx.session.partitions.values()
        ]
        f_sid, f_error, f_sent = f_ctx.respond(f_results, now)
        s_sid, s_error, s_sent = s_ctx.respond(s_results, now)
        assert (f_sid, f_error) == (s_sid, s_error) == (sid, ErrorCode.NONE)
        assert view(f_sent) == view(s_sent)
        f_session, s_session = session_of(fast, sid), session_of(scan, sid)
        assert f_session.partitions.keys() == s_session.partitions.keys()
        for p, cp in f_session.partitions.items():
            other = s_session.partitions[p]
            assert (cp.request, cp.high_watermark, cp.log_start_offset, cp.log_end_offset) == (
                other.request,
                other.high_watermark,
                other.log_start_offset,
                other.log_end_offset,
            )
