"""ProduceRequestResult, FutureRecordMetadata and SentRecords: one result per batch, resolved once.

Threads and event loops are real here (the sender completes results on its loop thread while
callers wait on theirs); every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from minibroker.client.errors import NotEnoughReplicasError, RequestTimedOutError
from minibroker.client.produce_result import (
    FutureRecordMetadata,
    ProduceRequestResult,
    SentRecords,
)
from minibroker.client.types import RecordMetadata, TopicPartition

TP = TopicPartition("t", 2)


def futures(result: ProduceRequestResult, *timestamps: int) -> list[FutureRecordMetadata]:
    return [FutureRecordMetadata.of(result, i, ts) for i, ts in enumerate(timestamps)]


def test_each_record_is_the_batch_base_offset_plus_its_index() -> None:
    result = ProduceRequestResult(TP)
    a, b, c = futures(result, 10, 11, 12)
    assert not a.done() and a.running()
    result.complete(100)
    assert [f.result(timeout=0) for f in (a, b, c)] == [
        RecordMetadata("t", 2, 100, 10),
        RecordMetadata("t", 2, 101, 11),
        RecordMetadata("t", 2, 102, 12),
    ]
    assert a.done() and a.exception(timeout=0) is None


def test_a_result_completes_once() -> None:
    result = ProduceRequestResult(TP)
    (f,) = futures(result, 5)
    result.complete(7)
    result.complete(9)
    result.fail(NotEnoughReplicasError("late"))
    assert f.result(timeout=0).offset == 7


def test_log_append_time_replaces_each_create_time_and_acks0_has_no_offset() -> None:
    result = ProduceRequestResult(TP)
    a, b = futures(result, 1, 2)
    result.complete(40, log_append_time=999)
    assert [(m.offset, m.timestamp) for m in (a.result(0), b.result(0))] == [(40, 999), (41, 999)]
    unknown = ProduceRequestResult(TP)
    c, d = futures(unknown, 1, 2)
    unknown.complete(-1)
    assert [c.result(0).offset, d.result(0).offset] == [-1, -1], "acks=0: offsets unknown"


def test_a_failed_batch_fails_every_record_with_its_error() -> None:
    result = ProduceRequestResult(TP)
    fs = futures(result, 1, 2, 3)
    error = NotEnoughReplicasError("isr too small")
    result.fail(error)
    for f in fs:
        assert f.exception(timeout=0) is error
        with pytest.raises(NotEnoughReplicasError, match="isr too small"):
            f.result(timeout=0)


def test_callbacks_run_once_at_completion_or_at_once_when_already_done() -> None:
    result = ProduceRequestResult(TP)
    a, b = futures(result, 1, 2)
    seen: list[tuple[FutureRecordMetadata, int]] = []
    a.add_done_callback(lambda f: seen.append((f, f.result(0).offset)))
    b.add_done_callback(lambda f: seen.append((f, f.result(0).offset)))
    assert seen == []
    result.complete(50)
    result.complete(60)
    assert seen == [(a, 50), (b, 51)]
    a.add_done_callback(lambda f: seen.append((f, -1)))
    assert seen[-1] == (a, -1), "a callback on a done future runs at once, in this thread"


def test_a_raising_callback_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    result = ProduceRequestResult(TP)
    a, b = futures(result, 1, 2)
    ran: list[int] = []

    def boom(_f: FutureRecordMetadata) -> None:
        raise RuntimeError("callback bug")

    a.add_done_callback(boom)
    b.add_done_callback(lambda f: ran.append(f.result(0).offset))
    result.complete(3)
    assert ran == [4]
    assert "callback bug" in caplog.text


def test_a_callback_runs_in_the_context_it_was_given() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="outside")
    context = contextvars.copy_context()
    context.run(var.set, "inside")
    result = ProduceRequestResult(TP)
    (f,) = futures(result, 1)
    seen: list[str] = []
    f.add_done_callback(lambda _f: seen.append(var.get()), context=context)
    result.complete(0)
    assert seen == ["inside"]


def test_result_blocks_until_another_thread_completes_and_times_out_otherwise() -> None:
    result = ProduceRequestResult(TP)
    (f,) = futures(result, 1)
    with pytest.raises(TimeoutError, match=r"within 0\.01 s") as waited:
        f.result(timeout=0.01)
    assert not isinstance(waited.value, RequestTimedOutError), "a wait, not a failed delivery"
    got: list[RecordMetadata] = []
    waiter = threading.Thread(target=lambda: got.append(f.result(timeout=30)))
    waiter.start()
    result.complete(8)
    waiter.join(30)
    assert got == [RecordMetadata("t", 2, 8, 1)]


def test_awaiting_on_a_loop_wakes_when_another_thread_completes() -> None:
    result = ProduceRequestResult(TP)
    a, b = futures(result, 1, 2)

    async def main() -> list[RecordMetadata]:
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, threading.Thread(target=result.complete, args=(30,)).start)
        return await asyncio.wait_for(asyncio.gather(a, b), 30)

    assert [m.offset for m in asyncio.run(main())] == [30, 31]


def test_awaiting_a_failed_record_raises_its_error() -> None:
    result = ProduceRequestResult(TP)
    (f,) = futures(result, 1)

    async def main() -> None:
        asyncio.get_running_loop().call_soon(result.fail, NotEnoughReplicasError("no"))
        await asyncio.wait_for(f, 30)

    with pytest.raises(NotEnoughReplicasError):
        asyncio.run(main())


def test_futures_are_equal_only_to_themselves_and_cannot_be_cancelled() -> None:
    result = ProduceRequestResult(TP)
    a = FutureRecordMetadata.of(result, 0, 1)
    twin = FutureRecordMetadata.of(result, 0, 1)
    assert a != twin and a == a and len({a, twin}) == 2
    assert not a.cancel() and not a.cancelled()


def test_a_split_batch_resolves_each_record_through_the_part_that_holds_it() -> None:
    batch = ProduceRequestResult(TP)
    fs = futures(batch, 0, 1, 2, 3, 4)
    first, second = ProduceRequestResult(TP), ProduceRequestResult(TP)
    batch.split([0, 3], [first, second])
    # The second half is refused again and split once more.
    second_a, second_b = ProduceRequestResult(TP), ProduceRequestResult(TP)
    second.split([0, 1], [second_a, second_b])
    calls: list[int] = []
    fs[0].add_done_callback(lambda f: calls.append(f.result(0).offset))
    first.complete(10)
    second_a.complete(13)
    assert not batch.done and calls == [], "the batch is done only when every part is"
    second_b.fail(NotEnoughReplicasError("last part"))
    assert batch.done and calls == [10]
    assert [f.result(0).offset for f in fs[:4]] == [10, 11, 12, 13]
    assert [f.result(0).timestamp for f in fs[:4]] == [0, 1, 2, 3]
    with pytest.raises(NotEnoughReplicasError, match="last part"):
        fs[4].result(0)


def test_a_complete_result_cannot_be_split() -> None:
    result = ProduceRequestResult(TP)
    result.complete(0)
    with pytest.raises(RuntimeError, match="already complete"):
        result.split([0, 1], [ProduceRequestResult(TP), ProduceRequestResult(TP)])


def test_sent_records_index_runs_of_several_batches() -> None:
    one, two = ProduceRequestResult(TP), ProduceRequestResult(TopicPartition("t", 0))
    sent = SentRecords()
    sent._timestamps = 77
    sent._add_run(one, 5, 3)  # records 5..7 of batch one
    sent._add_run(two, 0, 2)
    assert len(sent) == 5 and not sent.done()
    one.complete(100)
    two.complete(0)
    assert sent.done()
    assert [(m.partition, m.offset) for m in sent.result(timeout=0)] == [
        (2, 105),
        (2, 106),
        (2, 107),
        (0, 0),
        (0, 1),
    ]
    assert sent[-1].result(0) == RecordMetadata("t", 0, 1, 77)
    assert sent[3].result(0).offset == 0
    with pytest.raises(IndexError):
        sent[5]
    assert sent.exception(timeout=0) is None


def test_sent_records_raise_the_first_error_and_can_be_awaited() -> None:
    one, two = ProduceRequestResult(TP), ProduceRequestResult(TP)
    sent = SentRecords()
    sent._add_run(one, 0, 1)
    sent._add_run(two, 0, 1)
    with pytest.raises(TimeoutError):
        sent.result(timeout=0)
    one.complete(1)
    two.fail(NotEnoughReplicasError("second"))
    assert isinstance(sent.exception(0), NotEnoughReplicasError)
    assert sent[0].result(0).offset == 1, "the records of a good batch still have metadata"

    async def main() -> None:
        await sent

    with pytest.raises(NotEnoughReplicasError, match="second"):
        asyncio.run(main())


def test_blocking_for_a_record_on_the_producers_own_loop_is_refused_not_a_hang() -> None:
    from minibroker.client.produce_result import register_sender_loop

    result = ProduceRequestResult(TP)
    (f,) = futures(result, 1)

    async def on_the_sender_loop() -> None:
        register_sender_loop(asyncio.get_running_loop())
        f.result(timeout=30)

    with pytest.raises(asyncio.InvalidStateError, match="await its future"):
        asyncio.run(on_the_sender_loop())

    async def on_another_loop() -> RecordMetadata:
        threading.Timer(0.01, result.complete, args=(4,)).start()
        return f.result(timeout=30)  # a notebook's loop, say: blocking is allowed

    assert asyncio.run(on_another_loop()).offset == 4


def test_last_offsets_raise_an_error_of_any_part() -> None:
    batch = ProduceRequestResult(TP)
    parts = [ProduceRequestResult(TP) for _ in range(3)]
    batch.split([0, 1, 2], parts)
    sent = SentRecords()
    sent._add_run(batch, 0, 3)
    parts[0].complete(10)
    parts[1].fail(NotEnoughReplicasError("middle"))
    parts[2].complete(12)
    with pytest.raises(NotEnoughReplicasError, match="middle"):
        sent.last_offsets()
