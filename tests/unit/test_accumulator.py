"""The producer's record accumulator (pure): batching, readiness, draining, retries, sequences.

Built on the real BatchBuilder so the bytes that come out are checked as a broker would check
them (batch.read_header: length, magic, CRC32C).
"""

from __future__ import annotations

import pytest

from minibroker.client.accumulator import RecordAccumulator
from minibroker.client.batch import read_header
from minibroker.client.errors import ClientClosedError, MessageTooLargeError
from minibroker.client.produce_result import FutureRecordMetadata
from minibroker.client.records import BatchBuilder, iter_records
from minibroker.client.types import TopicPartition

A0 = TopicPartition("a", 0)
A1 = TopicPartition("a", 1)
B0 = TopicPartition("b", 0)


def make(batch_size: int = 1024, linger_ms: int = 5, idempotent: bool = True) -> RecordAccumulator:
    acc = RecordAccumulator(
        batch_size=batch_size,
        linger_ms=linger_ms,
        new_builder=lambda tp: BatchBuilder(batch_size),
        idempotent=idempotent,
        clock_ms=lambda: 0,
    )
    if idempotent:
        acc.set_producer_id(42, 0)
    return acc


def add(
    acc: RecordAccumulator, tp: TopicPartition, value: bytes, now: int = 0
) -> FutureRecordMetadata:
    future = acc.append(tp, now, None, value, (), now)
    assert future is not None
    return future


def test_a_batch_is_ready_after_linger_ms_not_before() -> None:
    acc = make(linger_ms=5)
    add(acc, A0, b"x", now=100)
    ready, wait = acc.ready(102)
    assert ready == [] and wait == 3
    ready, _ = acc.ready(105)
    assert ready == [A0]


def test_a_full_batch_is_ready_at_once_and_records_keep_their_order() -> None:
    acc = make(batch_size=200, linger_ms=10_000)
    handles = [add(acc, A0, bytes([i]) * 40) for i in range(6)]
    ready, _ = acc.ready(0)
    assert ready == [A0], "a second batch exists, so the first is full"
    drained = acc.drain({1: [A0]}, 1 << 20, 0)[1]
    assert len(drained) == 1
    first = drained[0]
    assert [(f[0], f[1]) for f in handles[: first.record_count]] == [
        (first.result, i) for i in range(first.record_count)
    ], "each record's future is its batch's result and its index there"
    assert handles[first.record_count][0] is not first.result
    values = [r.value for r in iter_records(first.buffer)]
    assert values == [bytes([i]) * 40 for i in range(first.record_count)]


def test_flush_and_close_make_everything_ready() -> None:
    acc = make(linger_ms=10_000)
    add(acc, A0, b"x")
    assert acc.ready(0)[0] == []
    acc.flushing += 1
    assert acc.ready(0)[0] == [A0]
    acc.flushing -= 1
    acc.closing = True
    assert acc.ready(0)[0] == [A0]


def test_drain_groups_partitions_per_node_and_respects_max_request_size() -> None:
    acc = make(linger_ms=0)
    for tp in (A0, A1, B0):
        add(acc, tp, b"v" * 300)
    out = acc.drain({1: [A0, A1], 2: [B0]}, 1 << 20, 0)
    assert sorted(b.tp for b in out[1]) == [A0, A1]
    assert [b.tp for b in out[2]] == [B0]

    acc = make(linger_ms=0)
    for tp in (A0, A1):
        add(acc, tp, b"v" * 300)
    out = acc.drain({1: [A0, A1]}, 400, 0)
    assert len(out[1]) == 1, "the second batch would pass max_request_size"
    out2 = acc.drain({1: [A0, A1]}, 400, 0)
    assert len(out2[1]) == 1 and out2[1][0].tp != out[1][0].tp


def test_one_batch_in_flight_per_partition() -> None:
    acc = make(batch_size=100, linger_ms=0)
    for i in range(5):
        add(acc, A0, bytes([i]) * 60)
    first = acc.drain({1: [A0]}, 1 << 20, 0)[1]
    assert len(first) == 1
    assert acc.ready(0)[0] == [], "the partition is muted while its batch is in flight"
    assert acc.drain({1: [A0]}, 1 << 20, 0) == {}
    acc.complete(first[0])
    assert acc.ready(0)[0] == [A0]


def test_sequences_are_assigned_at_drain_and_kept_on_retry() -> None:
    acc = make(batch_size=220, linger_ms=0)
    for i in range(4):
        add(acc, A0, bytes([i]) * 60)  # two records (~69 bytes each) per batch
    b1 = acc.drain({1: [A0]}, 1 << 20, 0)[1][0]
    h1 = read_header(b1.buffer)
    assert (h1.producer_id, h1.producer_epoch, h1.base_sequence) == (42, 0, 0)
    assert b1.base_sequence == 0 and b1.record_count == 2
    # A retriable failure: the same bytes go again, before the later batch of the partition.
    acc.retry(b1, now_ms=10, backoff_ms=100)
    assert acc.ready(50)[0] == [], "still backing off"
    again = acc.drain({1: [A0]}, 1 << 20, 110)[1][0]
    assert again is b1 and again.attempts == 2
    assert again.buffer == b1.buffer
    acc.complete(again)
    b2 = acc.drain({1: [A0]}, 1 << 20, 110)[1][0]
    assert read_header(b2.buffer).base_sequence == 2


def test_sequences_are_per_partition_and_restart_with_a_new_producer_id() -> None:
    acc = make(linger_ms=0)
    add(acc, A0, b"a")
    add(acc, B0, b"b")
    out = acc.drain({1: [A0, B0]}, 1 << 20, 0)[1]
    assert {b.tp: b.base_sequence for b in out} == {A0: 0, B0: 0}
    for b in out:
        acc.complete(b)
    add(acc, A0, b"c")
    acc.set_producer_id(43, 0)
    nxt = acc.drain({1: [A0]}, 1 << 20, 0)[1][0]
    header = read_header(nxt.buffer)
    assert (header.producer_id, header.base_sequence) == (43, 0)


def test_without_idempotence_batches_carry_no_producer_id() -> None:
    acc = make(idempotent=False, linger_ms=0)
    add(acc, A0, b"x")
    batch = acc.drain({1: [A0]}, 1 << 20, 0)[1][0]
    header = read_header(batch.buffer)
    assert header.producer_id == -1 and header.base_sequence == -1


def test_expire_removes_old_queued_batches_only() -> None:
    acc = make(linger_ms=0)
    add(acc, A0, b"old", now=0)
    add(acc, A1, b"in flight", now=0)
    inflight = acc.drain({1: [A1]}, 1 << 20, 0)[1][0]
    expired = acc.expire(now_ms=1000, delivery_timeout_ms=1000)
    assert [b.tp for b in expired] == [A0]
    assert list(acc.in_flight()) == [inflight]
    for b in expired:
        acc.fail(b)
    acc.complete(inflight)
    assert acc.buffered_bytes == 0
    assert not acc.has_incomplete()


def test_a_sticky_record_joins_the_open_batch_and_moves_on_only_when_it_is_full() -> None:
    """KIP-480 in the accumulator: a null-key record goes to the sticky partition's open batch;
    the stickiness moves (to another partition) only when a new batch is needed there, as
    Kafka's onNewBatch does (the first record of a topic needs one too)."""
    from minibroker.client.partitioner import StickyPartitioner

    class Fixed:
        def __init__(self) -> None:
            self.calls = 0

        def randrange(self, stop: int) -> int:
            self.calls += 1
            return 0

    rng = Fixed()
    sticky = StickyPartitioner(rng)
    acc = make(batch_size=200, linger_ms=10_000)
    tps = [A0, A1]
    futures = [acc.append_sticky("a", tps, sticky, 0, None, bytes(60), None) for _ in range(4)]
    assert [f[0].tp for f in futures] == [A1, A1, A0, A0]
    assert [f[1] for f in futures] == [0, 1, 0, 1]
    assert acc.batches_created == 2


def test_buffered_bytes_track_incomplete_batches() -> None:
    acc = make(linger_ms=0)
    add(acc, A0, b"x" * 100)
    assert acc.buffered_bytes > 100
    batch = acc.drain({1: [A0]}, 1 << 20, 0)[1][0]
    assert acc.buffered_bytes == len(batch.buffer)
    acc.complete(batch)
    assert acc.buffered_bytes == 0


def test_a_record_larger_than_batch_size_gets_its_own_batch() -> None:
    acc = make(batch_size=100, linger_ms=10_000)
    add(acc, A0, b"x" * 500)
    assert acc.ready(0)[0] == [], "alone, it still waits for linger"
    add(acc, A0, b"y")
    batch = acc.drain({1: [A0]}, 1 << 20, 0)[1][0]
    assert batch.record_count == 1


def test_a_builder_that_refuses_the_first_record_is_an_error() -> None:
    class RefusingEncoder:
        size = 10
        count = 0

        def bind(self, *args: object) -> None:
            return None

        def append_future(self, *args: object) -> None:
            return None

    class Refusing:
        encoder = RefusingEncoder()

    acc = RecordAccumulator(
        batch_size=10, linger_ms=0, new_builder=lambda tp: Refusing(), idempotent=False
    )  # type: ignore[arg-type]
    with pytest.raises(MessageTooLargeError):
        acc.append(A0, 0, None, b"x", (), 0)
    assert not acc.has_unsent(), "a refused record leaves no empty batch behind"


def records_of(batch_bytes: bytes) -> list[tuple[int, bytes | None, bytes | None, tuple]]:
    return [(r.timestamp, r.key, r.value, r.headers) for r in iter_records(batch_bytes)]


def test_a_batch_split_in_halves_keeps_order_and_the_sequence_range() -> None:
    """Kafka's splitAndReenqueue after MESSAGE_TOO_LARGE: the parts go back to the head of
    the partition in record order, carrying the big batch's producer id and its sequence range
    (the broker stored none of it), and the next batch continues after that range."""
    acc = make(batch_size=10_000, linger_ms=0)
    handles = [add(acc, A0, bytes([i]) * 10, now=i) for i in range(5)]
    big = acc.drain({1: [A0]}, 1 << 20, 5)[1][0]
    later = add(acc, A0, b"later")
    parts = acc.split_and_reenqueue(big, records_of(big.buffer), lambda: BatchBuilder(1 << 30))
    assert [p.record_count for p in parts] == [3, 2]
    assert [big.result.locate(f[1]) for f in handles] == [
        (parts[0].result, 0),
        (parts[0].result, 1),
        (parts[0].result, 2),
        (parts[1].result, 0),
        (parts[1].result, 1),
    ], "each record's future follows the part that holds it"
    assert [[r[0] for r in records_of(p.buffer)] for p in parts] == [[0, 1, 2], [3, 4]]
    headers = [read_header(p.buffer) for p in parts]
    assert [(h.producer_id, h.base_sequence) for h in headers] == [(42, 0), (42, 3)]
    assert [r[2] for p in parts for r in records_of(p.buffer)] == [
        bytes([i]) * 10 for i in range(5)
    ]
    assert all(p.created_ms == big.created_ms and p.attempts == 0 for p in parts)
    assert acc.buffered_bytes == sum(p.size_bytes for p in acc.incomplete())
    sent = []
    while acc.has_unsent():
        (batch,) = acc.drain({1: [A0]}, 1 << 20, 5)[1]
        sent.append(batch)
        acc.complete(batch)
    assert sent[:2] == parts, "the halves go first, one at a time"
    assert later[0] is sent[2].result and sent[2].base_sequence == 5
    assert acc.buffered_bytes == 0


def test_a_half_that_is_refused_again_is_split_again_down_to_one_record() -> None:
    acc = make(batch_size=10_000, linger_ms=0)
    for i in range(3):
        add(acc, A0, bytes([i]))
    big = acc.drain({1: [A0]}, 1 << 20, 0)[1][0]
    first, _ = acc.split_and_reenqueue(big, records_of(big.buffer), lambda: BatchBuilder(1 << 30))
    (again,) = acc.drain({1: [A0]}, 1 << 20, 0)[1]
    assert again is first and again.record_count == 2
    one, two = acc.split_and_reenqueue(
        again, records_of(again.buffer), lambda: BatchBuilder(1 << 30)
    )
    assert [read_header(b.buffer).base_sequence for b in (one, two)] == [0, 1]
    with pytest.raises(ValueError, match="more than one record"):
        acc.split_and_reenqueue(one, records_of(one.buffer), lambda: BatchBuilder(1 << 30))


def test_appends_from_many_threads_while_batches_drain_lose_and_reorder_nothing() -> None:
    """Kafka's accumulator is appended to by caller threads while the sender drains it. With the
    lock, every record lands in exactly one batch, at its own index, and each thread's records
    keep their order within a partition, whatever the interleaving."""
    import threading

    acc = RecordAccumulator(
        batch_size=400,
        linger_ms=0,
        new_builder=lambda tp: BatchBuilder(400),
        idempotent=True,
        lock=threading.Lock(),
        clock_ms=lambda: 0,
    )
    acc.set_producer_id(1, 0)
    per_thread = 2000
    futures: dict[int, list[FutureRecordMetadata]] = {}

    def producer(n: int) -> None:
        mine = futures.setdefault(n, [])
        for i in range(per_thread):
            mine.append(add(acc, (A0, A1)[i % 2], f"{n}:{i}".encode()))

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    offsets = {A0: 0, A1: 0}
    batches = 0
    while any(t.is_alive() for t in threads) or acc.has_unsent():
        for batch in acc.drain({1: [A0, A1]}, 1 << 20, 0).get(1, []):
            values = [r.value for r in iter_records(batch.buffer)]
            assert len(values) == batch.record_count
            batch.result.complete(offsets[batch.tp])
            offsets[batch.tp] += batch.record_count
            acc.complete(batch)
            batches += 1
    for t in threads:
        t.join()
    assert batches > 2
    where: dict[tuple[TopicPartition, int], bytes] = {}
    for n, mine in futures.items():
        last = {A0: -1, A1: -1}
        for i, future in enumerate(mine):
            meta = future.result(timeout=0)
            tp = TopicPartition(meta.topic, meta.partition)
            assert meta.offset > last[tp], f"thread {n}'s records stay in order on {tp}"
            last[tp] = meta.offset
            assert (tp, meta.offset) not in where, "two records at one offset"
            where[(tp, meta.offset)] = f"{n}:{i}".encode()
    assert len(where) == 4 * per_thread
    assert acc.buffered_bytes == 0


def test_an_expired_or_aborted_open_batch_takes_no_more_records_and_its_bytes_stay_right() -> None:
    """A batch taken out of its queue unsent (expired: no leader for delivery_timeout_ms;
    aborted) is sealed: the sticky shortcut forgets it, so the next null-key record opens a new
    batch instead of joining the dead one, and the byte count returns to zero."""
    from minibroker.client.partitioner import StickyPartitioner

    class First:
        def randrange(self, stop: int) -> int:
            return 0

    sticky = StickyPartitioner(First())
    acc = make(linger_ms=10_000)
    first = acc.append_sticky("a", [A0, A1], sticky, 0, None, b"x", None)
    (expired,) = acc.expire(now_ms=1000, delivery_timeout_ms=1000)
    assert expired.result is first[0] and expired.record_count == 1
    acc.fail(expired)
    assert acc.buffered_bytes == 0
    later = acc.append_sticky("a", [A0, A1], sticky, 0, None, b"y", None)
    assert later[0] is not first[0], "the dead batch takes no more records"
    assert acc.buffered_bytes == acc.incomplete()[0].size_bytes > 0
    for batch in acc.close_and_abort():
        acc.fail(batch)
    assert acc.buffered_bytes == 0
    with pytest.raises(ClientClosedError):
        acc.append_sticky("a", [A0, A1], sticky, 0, None, b"z", None)
    assert acc.buffered_bytes == 0
