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


def waking(linger_ms: int = 5, batch_size: int = 1024) -> tuple[RecordAccumulator, list[int]]:
    """An accumulator that counts the wakes it asks of the sender."""
    wakes: list[int] = []
    acc = RecordAccumulator(
        batch_size=batch_size,
        linger_ms=linger_ms,
        new_builder=lambda tp: BatchBuilder(batch_size),
        idempotent=True,
        wake_sender=lambda: wakes.append(1),
        clock_ms=lambda: 0,
    )
    acc.set_producer_id(42, 0)
    return acc, wakes


def test_a_new_batch_wakes_the_sender_only_if_it_is_due_before_the_sender_plans_to_run() -> None:
    """Records spread over many partitions open a batch per record: waking the sender (and
    its pass over the queues) for each would cost O(partitions) per record."""
    acc, wakes = waking(linger_ms=5)
    tps = [TopicPartition("a", p) for p in range(100)]
    add(acc, tps[0], b"x", now=100)
    assert len(wakes) == 1, "the sender had no timer: it must hear of the batch"
    assert acc.ready(100) == ([], 5) and acc.sender_due_ms == 105
    for tp in tps[1:]:
        add(acc, tp, b"x", now=101)
    assert len(wakes) == 1, "their linger ends after the sender's timer: no wake"
    assert not acc.sender_overdue(104) and acc.sender_overdue(105)
    assert acc.ready(105) == ([tps[0]], 1)
    assert acc.ready(106)[0] == tps
    acc.drain({1: tps}, 1 << 20, 106)
    assert acc.ready(106) == ([], None) and acc.sender_due_ms is None
    add(acc, tps[0], b"y", now=106)
    assert len(wakes) == 2, "no timer planned: a wake"


def test_a_batch_sendable_at_once_wakes_the_sender() -> None:
    acc, wakes = waking(linger_ms=10_000, batch_size=200)
    add(acc, A0, b"x", now=0)
    acc.ready(0)
    assert len(wakes) == 1 and acc.sender_due_ms == 10_000
    add(acc, A1, b"x", now=1)
    assert len(wakes) == 1
    for _ in range(4):
        add(acc, A0, bytes(60), now=2)  # the first batch fills, a second opens
    assert len(wakes) == 2 and acc.sender_overdue(2)
    assert acc.ready(2)[0] == [A0]
    acc.drain({1: [A0]}, 1 << 20, 2)
    for _ in range(4):
        add(acc, A0, bytes(60), now=2)  # a full batch again, but its partition is muted
    assert len(wakes) == 2, "nothing to send until the in-flight batch is answered"
    acc.flushing += 1
    add(acc, B0, b"x", now=3)
    assert len(wakes) == 3, "during a flush every batch is sendable"
    assert acc.ready(3)[0] == [A1, B0]

    acc, wakes = waking(linger_ms=0)
    add(acc, A0, b"x", now=0)
    acc.ready(0)
    add(acc, A1, b"x", now=0)
    assert len(wakes) == 2, "linger 0: every batch is sendable at once"


def test_ready_looks_only_at_partitions_something_may_have_made_sendable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sender's pass is O(what changed), not O(partitions with a batch)."""
    acc = make(linger_ms=5)
    tps = [TopicPartition("a", p) for p in range(1000)]
    for tp in tps:
        add(acc, tp, b"x", now=0)
    assert acc.ready(0) == ([], 5)
    looked: list[TopicPartition] = []
    sendable = acc._sendable

    def counting(batch, queue_len, now_ms):  # type: ignore[no-untyped-def]
        looked.append(batch.tp)
        return sendable(batch, queue_len, now_ms)

    monkeypatch.setattr(acc, "_sendable", counting)
    assert acc.ready(1) == ([], 4) and looked == [], "nothing lingered out, nothing filled"
    add(acc, tps[7], b"y", now=1)
    add(acc, tps[7], b"z" * 1000, now=1)  # does not fit: a second batch, the first is full
    assert acc.ready(2)[0] == [tps[7]] and looked == [tps[7]]
    looked.clear()
    assert len(acc.ready(5)[0]) == 1000 and len(looked) == 1000


def test_expire_scans_the_queues_only_once_the_oldest_batch_could_have_expired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    acc = make(linger_ms=10_000)
    for p in range(100):
        add(acc, TopicPartition("a", p), b"x", now=p)
    scans: list[int] = []
    live = acc._live

    def counting():  # type: ignore[no-untyped-def]
        scans.append(1)
        return live()

    monkeypatch.setattr(acc, "_live", counting)
    assert acc.expire(now_ms=999, delivery_timeout_ms=1000) == [] and scans == []
    assert [b.tp.partition for b in acc.expire(1001, 1000)] == [0, 1] and len(scans) == 1
    assert acc.expire(1001, 1000) == [] and len(scans) == 1, "the oldest left is from 2 ms"
    assert [b.tp.partition for b in acc.expire(1002, 1000)] == [2] and len(scans) == 2


def test_a_full_sticky_batch_the_stickiness_left_is_ready_at_once() -> None:
    """Kafka sends a full batch without waiting for linger; the sticky partitioner moves to
    another partition when it fills, so only the full batch's own partition has it."""
    from minibroker.client.partitioner import StickyPartitioner

    class Seq:
        def __init__(self) -> None:
            self.n = 0

        def randrange(self, stop: int) -> int:
            self.n += 1
            return self.n % stop

    acc = make(batch_size=200, linger_ms=10_000)
    sticky = StickyPartitioner(Seq())
    placed = {
        acc.append_sticky("a", [A0, A1], sticky, 0, None, bytes(60), None)[0].tp for _ in range(3)
    }
    assert placed == {A0, A1}
    full = next(tp for tp in (A0, A1) if len(acc._batches[tp]) == 1 and acc._batches[tp][0].full)
    assert acc.ready(0)[0] == [full], "the full batch goes now, the other lingers"


def test_a_head_left_by_an_expiry_is_looked_at_again() -> None:
    acc = make(linger_ms=0)
    add(acc, A0, b"old", now=0)
    assert acc.ready(0)[0] == [A0]
    (first,) = acc.drain({1: [A0]}, 1 << 20, 0)[1]
    acc.retry(first, now_ms=10, backoff_ms=100_000)
    add(acc, A0, b"new", now=500)  # queued behind the retried batch: no timer of its own
    assert acc.ready(500) == ([], 99_510), "the head backs off"
    (expired,) = acc.expire(now_ms=1000, delivery_timeout_ms=1000)
    assert expired is first
    assert acc.ready(1000)[0] == [A0], "the new head is sendable (linger 0)"


def test_a_partition_is_looked_at_again_when_unmuted_retried_or_split() -> None:
    """Each way a queued partition can become sendable again puts it back in view: a batch
    answered (the next one lingers on from its creation), a retry's backoff ending, the
    halves of a split batch (sendable at once)."""
    acc = make(linger_ms=5)
    add(acc, A0, b"a", now=0)
    assert acc.ready(5)[0] == [A0]
    (first,) = acc.drain({1: [A0]}, 1 << 20, 5)[1]
    add(acc, A0, b"b", now=6)  # behind the in-flight batch
    acc.complete(first)
    assert acc.ready(7) == ([], 4), "answered: the next batch's linger runs from 6"
    assert acc.ready(11)[0] == [A0]
    (second,) = acc.drain({1: [A0]}, 1 << 20, 11)[1]
    assert acc.ready(11) == ([], None)
    acc.retry(second, now_ms=20, backoff_ms=100)
    assert acc.ready(119) == ([], 1), "the retry's backoff is a timer"
    assert acc.ready(120)[0] == [A0]
    (again,) = acc.drain({1: [A0]}, 1 << 20, 120)[1]
    assert again is second and acc.ready(120) == ([], None)

    acc = make(batch_size=10_000, linger_ms=0)
    for i in range(3):
        add(acc, A0, bytes([i]))
    assert acc.ready(0)[0] == [A0]
    (big,) = acc.drain({1: [A0]}, 1 << 20, 0)[1]
    assert acc.ready(0) == ([], None)
    first_half, _ = acc.split_and_reenqueue(
        big, records_of(big.buffer), lambda: BatchBuilder(1 << 30)
    )
    assert acc.ready(0)[0] == [A0]
    assert acc.drain({1: [A0]}, 1 << 20, 0)[1] == [first_half]


def test_a_batch_queued_behind_a_full_one_lingers_from_its_creation_once_it_is_the_head() -> None:
    acc = make(batch_size=200, linger_ms=5)
    add(acc, A0, bytes(60), now=0)
    for _ in range(3):
        add(acc, A0, bytes(60), now=3)  # the first batch fills, a second opens at 3
    assert acc.ready(3)[0] == [A0]
    (first,) = acc.drain({1: [A0]}, 1 << 20, 3)[1]
    acc.complete(first)
    assert acc.ready(4)[0] == [] and acc.ready(5)[0] == [] and acc.ready(7)[0] == []
    assert acc.ready(8)[0] == [A0]


def test_partitions_set_aside_are_not_looked_at_until_looked_at_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sender sets aside ready partitions whose leader has all its requests out."""
    acc = make(linger_ms=0)
    for tp in (A0, A1, B0):
        add(acc, tp, b"x")
    assert acc.ready(0)[0] == [A0, A1, B0]
    acc.set_aside([A0, B0])
    looked: list[TopicPartition] = []
    sendable = acc._sendable

    def counting(batch, queue_len, now_ms):  # type: ignore[no-untyped-def]
        looked.append(batch.tp)
        return sendable(batch, queue_len, now_ms)

    monkeypatch.setattr(acc, "_sendable", counting)
    assert acc.ready(0)[0] == [A1] and looked == [A1]
    acc.look_again([A0, B0])
    assert sorted(acc.ready(0)[0]) == [A0, A1, B0]
