"""Incremental fetch sessions end to end, both pure halves together: the client's handler
(client/fetch_session.py) against the broker's session cache (broker/fetch_session.py) over fake
partition logs, for random sequences of rounds and faults.

Each round the client wants a random subset of the partitions (at its own fetch offsets), builds a
request and the "broker" serves it through the cache (only the partitions the context asks to
evaluate are read). A sessionless oracle client does the same round with epoch -1, reading every
wanted partition. Faults: lost answers (handle_error), requests delivered twice (one after the
other, or both parked at once; the client gets one of the answers), rival sessions filling the
cache (evictions), idle time, a broker restart (an empty cache) and the client closing its session.
Server changes (appends, HW and log start moves, partition errors) call `mark_dirty` as the shell
does.

Properties: after every round the session client's view of every partition (HW, log start, log
end, error, next offset, records concatenated) equals the oracle's; records arrive contiguous, no
offset skipped or repeated, and equal the log; after any failed exchange the next request is
full; after every processed exchange on a live session the broker's session holds exactly the
client's partitions with the client's request data, at the client's next epoch.
"""

from __future__ import annotations

import importlib.util
import random
import struct
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.wire import FetchPartitionRequest, FetchPartitionResult
from minibroker.client.errors import ErrorCode
from minibroker.client.fetch_session import FetchRequestData, FetchSessionHandler
from minibroker.client.types import TopicPartition

# The broker half (SPEC-17 §1) is written on its own branch; skip only while the module is
# absent (an import error inside it still fails).
HAVE_SERVER = importlib.util.find_spec("minibroker.broker.fetch_session") is not None
if HAVE_SERVER:
    from minibroker.broker import fetch_session as server

pytestmark = pytest.mark.skipif(
    not HAVE_SERVER,
    reason="broker/fetch_session.py (SPEC-17 §1, branch fs-server) is not merged yet",
)

TPS = [
    TopicPartition("a", 0),
    TopicPartition("a", 1),
    TopicPartition("b", 0),
    TopicPartition("b", 1),
]
RECORD = struct.Struct(">II")  # (offset, value)
MAX_RECORDS = 2  # per partition per fetch: data left behind stays for the next rounds
OWNER = "client"
EVICTION_MS = 1_000


@dataclass
class View:
    """What a client knows of one partition."""

    offset: int = 0
    high_watermark: int = -1
    log_start: int = -1
    log_end: int = -1
    error: ErrorCode = ErrorCode.NONE
    values: list[int] = field(default_factory=list)

    def apply(self, result: FetchPartitionResult) -> None:
        if result.error != ErrorCode.NONE:
            self.error = result.error
            assert not result.records
            return
        self.error = ErrorCode.NONE
        self.high_watermark = result.high_watermark
        self.log_start = result.log_start_offset
        self.log_end = result.log_end_offset
        for offset, value in RECORD.iter_unpack(result.records):
            assert offset == self.offset, f"expected offset {self.offset}, got {offset}"
            self.values.append(value)
            self.offset += 1


@dataclass
class Log:
    values: list[int] = field(default_factory=list)
    high_watermark: int = 0
    log_start: int = 0
    error: bool = False


class Protocol:
    """The client, the oracle, the broker's cache and the logs."""

    def __init__(self, privileged: bool, max_slots: int) -> None:
        self.privileged = privileged
        self.max_slots = max_slots
        self.restarts = 0
        self.cache = self._new_cache()
        self.now = 0
        self.logs = {tp: Log() for tp in TPS}
        self.handler: FetchSessionHandler[FetchPartitionRequest] = FetchSessionHandler(node_id=0)
        self.views = {tp: View() for tp in TPS}
        self.oracle = {tp: View() for tp in TPS}
        self.must_be_full = True
        self.rivals = 0
        self.counter = 0

    def _new_cache(self) -> Any:
        rng = random.Random(1000 + self.restarts)
        return server.FetchSessionCache(self.max_slots, EVICTION_MS, rng=rng)

    # --- the fake broker ---------------------------------------------------------------------

    def read(self, req: FetchPartitionRequest, privileged: bool) -> FetchPartitionResult:
        tp = TopicPartition(req.topic, req.partition)
        log = self.logs[tp]
        if log.error:
            return FetchPartitionResult(tp.topic, tp.partition, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        limit = len(log.values) if privileged else log.high_watermark
        start = req.fetch_offset
        assert log.log_start <= start <= len(log.values)
        end = max(start, min(limit, start + req.max_bytes // RECORD.size))
        records = b"".join(RECORD.pack(o, log.values[o]) for o in range(start, end))
        return FetchPartitionResult(
            tp.topic,
            tp.partition,
            high_watermark=log.high_watermark,
            log_start_offset=log.log_start,
            log_end_offset=len(log.values),
            records=records,
        )

    def serve(self, ctx: Any, privileged: bool) -> list[FetchPartitionResult]:
        return [self.read(req, privileged) for req in ctx.to_evaluate()]

    def new_context(self, data: FetchRequestData[FetchPartitionRequest]) -> Any:
        return self.cache.new_context(
            server.FetchMetadata(data.session_id, data.epoch),
            privileged=self.privileged,
            owner=OWNER,
            to_send=list(data.to_send.values()),
            to_forget=data.to_forget,
            now_ms=self.now,
        )

    # --- server changes ----------------------------------------------------------------------

    def append(self, tp: TopicPartition, count: int) -> None:
        for _ in range(count):
            self.counter += 1
            self.logs[tp].values.append(self.counter)
        self.cache.mark_dirty(tp)

    def move_hw(self, tp: TopicPartition, step: int) -> None:
        log = self.logs[tp]
        log.high_watermark = min(len(log.values), log.high_watermark + step)
        self.cache.mark_dirty(tp)

    def trim(self, tp: TopicPartition) -> None:
        log = self.logs[tp]
        # Never past what either client still has to read (no out-of-range handling here).
        bound = min(log.high_watermark, self.views[tp].offset, self.oracle[tp].offset)
        log.log_start = max(log.log_start, min(log.log_start + 1, bound))
        self.cache.mark_dirty(tp)

    def toggle_error(self, tp: TopicPartition) -> None:
        self.logs[tp].error = not self.logs[tp].error
        self.cache.mark_dirty(tp)

    def rival(self, privileged: bool, mask: int) -> None:
        """Another client's full fetch: a session that may evict ours."""
        self.rivals += 1
        reqs = [request(tp, self.logs[tp].log_start) for i, tp in enumerate(TPS) if mask >> i & 1]
        ctx = self.cache.new_context(
            server.FetchMetadata(0, 0),
            privileged=privileged,
            owner=("rival", self.rivals),
            to_send=reqs,
            to_forget=[],
            now_ms=self.now,
        )
        ctx.respond(self.serve(ctx, privileged), self.now)

    def restart(self) -> None:
        self.restarts += 1
        self.cache = self._new_cache()

    def close(self) -> None:
        session_id, epoch = self.handler.notify_close()
        assert (session_id, epoch) == (self.handler.session_id, -1)
        self.must_be_full = True

    # --- one round ---------------------------------------------------------------------------

    def round(self, mask: int, copies: int, interleaved: bool, received: int | None) -> None:
        wanted = {
            tp: request(tp, self.views[tp].offset) for i, tp in enumerate(TPS) if mask >> i & 1
        }
        for tp in wanted:
            assert self.oracle[tp].offset == self.views[tp].offset
        data = self.handler.build(wanted)
        assert data.is_full or not self.must_be_full, "a request after an error must be full"

        contexts = [self.new_context(data)]
        answers = []
        if interleaved and copies == 2:
            contexts.append(self.new_context(data))
            results = [self.serve(ctx, self.privileged) for ctx in contexts]
            answers = [ctx.respond(res, self.now) for ctx, res in zip(contexts, results)]
        else:
            answers.append(contexts[0].respond(self.serve(contexts[0], self.privileged), self.now))
            if copies == 2:
                contexts.append(self.new_context(data))
                answers.append(
                    contexts[1].respond(self.serve(contexts[1], self.privileged), self.now)
                )

        if received is None:
            self.handler.handle_error()
            processed = False
        else:
            session_id, error, partitions = answers[min(received, len(answers) - 1)]
            named = [TopicPartition(r.topic, r.partition) for r in partitions]
            processed = self.handler.handle_response(data, error, session_id, named)
            if processed:
                for result in partitions:
                    self.views[TopicPartition(result.topic, result.partition)].apply(result)
                # The sessionless oracle: every wanted partition, read now.
                for tp, req in wanted.items():
                    self.oracle[tp].apply(self.read(req, self.privileged))
                if self.handler.session_id != 0:
                    self.check_session(may_be_gone=copies == 2)
        self.must_be_full = not processed
        if not processed:
            assert self.handler.next_is_full
        self.check_views()

    def check_session(self, may_be_gone: bool) -> None:
        session = self.cache.get(self.handler.session_id)
        if session is None:
            assert may_be_gone, "the client's new session is not in the cache"
            return
        assert session.owner == OWNER
        assert session.epoch == self.handler.epoch
        client = self.handler.session_partitions
        assert set(session.partitions) == set(client)
        for tp, cached in session.partitions.items():
            assert cached.request == client[tp]

    def check_views(self) -> None:
        for tp in TPS:
            view = self.views[tp]
            assert view == self.oracle[tp], tp
            assert view.values == self.logs[tp].values[: view.offset]


def request(tp: TopicPartition, offset: int) -> FetchPartitionRequest:
    return FetchPartitionRequest(
        topic=tp.topic,
        partition=tp.partition,
        current_leader_epoch=0,
        fetch_offset=offset,
        last_fetched_epoch=-1,
        log_start_offset=-1,
        max_bytes=MAX_RECORDS * RECORD.size,
    )


PARTITION = st.integers(0, len(TPS) - 1)
MASK = st.integers(0, (1 << len(TPS)) - 1)
# Most rounds want most partitions, so sessions live long enough to matter.
WANT = st.one_of(st.just((1 << len(TPS)) - 1), MASK)
ROUND = st.tuples(
    st.just("round"),
    WANT,
    st.sampled_from([1, 1, 1, 2]),  # copies delivered
    st.booleans(),  # both copies parked at once
    st.sampled_from([0, 0, 0, 1, None]),  # the answer the client gets (None: lost)
)
BY_KIND: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
    "round": ROUND,
    "append": st.tuples(st.just("append"), PARTITION, st.integers(1, 5)),
    "hw": st.tuples(st.just("hw"), PARTITION, st.integers(1, 5)),
    "trim": st.tuples(st.just("trim"), PARTITION),
    "error": st.tuples(st.just("error"), PARTITION),
    "rival": st.tuples(st.just("rival"), st.booleans(), MASK),
    "tick": st.tuples(st.just("tick"), st.integers(0, 3 * EVICTION_MS)),
    "restart": st.tuples(st.just("restart")),
    "close": st.tuples(st.just("close")),
}
# Weighted: mostly rounds and log changes, faults now and then.
KINDS = (
    ["round"] * 8 + ["append", "hw"] * 3 + ["trim", "error", "rival", "tick", "restart", "close"]
)
OPS = st.sampled_from(KINDS).flatmap(BY_KIND.__getitem__)


def run(privileged: bool, max_slots: int, ops: list[tuple[Any, ...]]) -> Protocol:
    proto = Protocol(privileged, max_slots)
    for op in ops:
        kind = op[0]
        if kind == "round":
            proto.round(op[1], op[2], op[3], op[4])
        elif kind == "append":
            proto.append(TPS[op[1]], op[2])
        elif kind == "hw":
            proto.move_hw(TPS[op[1]], op[2])
        elif kind == "trim":
            proto.trim(TPS[op[1]])
        elif kind == "error":
            proto.toggle_error(TPS[op[1]])
        elif kind == "rival":
            proto.rival(op[1], op[2])
        elif kind == "tick":
            proto.now += op[1]
        elif kind == "restart":
            proto.restart()
        else:
            proto.close()
    # Drain: with no more changes, enough clean rounds bring every client to the end of what
    # it may read, and both views still agree.
    for tp in TPS:
        proto.logs[tp].error = False
        proto.cache.mark_dirty(tp)

    def behind() -> bool:
        return any(
            proto.views[tp].offset < (len(log.values) if privileged else log.high_watermark)
            for tp, log in proto.logs.items()
        )

    for _ in range(1000):
        proto.round((1 << len(TPS)) - 1, 1, False, 0)
        if not behind() and not proto.must_be_full:
            break
    assert not behind()
    return proto


@settings(max_examples=300, deadline=None)
@given(st.booleans(), st.integers(1, 3), st.lists(OPS, min_size=10, max_size=100))
def test_session_client_sees_what_a_sessionless_client_sees(
    privileged: bool, max_slots: int, ops: list[tuple[Any, ...]]
) -> None:
    run(privileged, max_slots, ops)


def test_a_quiet_session_sends_and_answers_nothing() -> None:
    """The point of it all: once caught up, incremental rounds carry no partitions either way."""
    proto = Protocol(privileged=True, max_slots=1)
    for tp in TPS:
        proto.append(tp, 3)
        proto.move_hw(tp, 3)
    for _ in range(3):
        proto.round(15, 1, False, 0)
    data = proto.handler.build({tp: request(tp, proto.views[tp].offset) for tp in TPS})
    assert not data.is_full and data.to_send == {} and data.to_forget == []
    ctx = proto.new_context(data)
    assert ctx.kind == "incremental" and ctx.to_evaluate() == []
    session_id, error, partitions = ctx.respond([], proto.now)
    assert (session_id, error, partitions) == (proto.handler.session_id, ErrorCode.NONE, [])
    assert proto.handler.handle_response(data, error, session_id, [])


@pytest.mark.parametrize(
    ("fault", "first_error"),
    [
        ("restart", ErrorCode.FETCH_SESSION_ID_NOT_FOUND),
        ("evict", ErrorCode.FETCH_SESSION_ID_NOT_FOUND),
        ("duplicate", ErrorCode.INVALID_FETCH_SESSION_EPOCH),
    ],
)
def test_faults_answer_with_an_error_then_recover_with_a_full_request(
    fault: str, first_error: ErrorCode
) -> None:
    proto = Protocol(privileged=False, max_slots=2)
    for tp in TPS:
        proto.append(tp, 4)
        proto.move_hw(tp, 4)
    proto.round(15, 1, False, 0)
    old_id = proto.handler.session_id
    assert old_id != 0 and not proto.handler.next_is_full
    if fault == "restart":
        proto.restart()
    elif fault == "evict":
        proto.cache.remove(old_id)
    data = proto.handler.build({tp: request(tp, proto.views[tp].offset) for tp in TPS})
    if fault == "duplicate":
        proto.new_context(data).respond([], proto.now)  # the first copy, answer lost
    ctx = proto.new_context(data)
    assert (ctx.kind, ctx.error) == ("error", first_error)
    session_id, error, _ = ctx.respond([], proto.now)
    assert not proto.handler.handle_response(data, error, session_id, [])
    expected = 0 if first_error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND else old_id
    assert proto.handler.next_is_full and proto.handler.session_id == expected
    proto.must_be_full = True
    proto.round(15, 1, False, 0)
    assert proto.handler.session_id not in (0, old_id)
    proto.check_views()
