"""AsyncProducer's decisions without a network: validation, retry vs fail, completion.

No event loop runs here: records are appended with `_append` (the record path shared by `send`,
`send_batch` and the blocking facade), their futures are waited on with `result()`, and the
accumulator and response handling are driven directly.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from minibroker.client.batch import read_header
from minibroker.client.common.config import ConfigError
from minibroker.client.errors import (
    MessageTooLargeError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from minibroker.client.metadata_cache import BrokerInfo, ClusterSnapshot, PartitionInfo, TopicInfo
from minibroker.client.partitioner import partition_for_key
from minibroker.client.producer import AsyncProducer, FutureRecordMetadata, parse_acks
from minibroker.client.records import iter_records
from minibroker.client.types import RecordMetadata, TopicPartition

TOPIC = TopicInfo(
    "t",
    "id",
    {p: PartitionInfo(p, 1, 3, (1, 2), (1, 2)) for p in range(3)},
    {"max.message.bytes": "2000"},
)


class _Running:
    """Stands in for the sender task: retries only happen while the sender runs."""

    def done(self) -> bool:
        return False


def producer(**config: object) -> AsyncProducer:
    p = AsyncProducer("127.0.0.1:1", **config)  # type: ignore[arg-type]
    p.cluster.metadata.update(
        ClusterSnapshot("c", 0, {1: BrokerInfo(1, "h", 1), 2: BrokerInfo(2, "h", 2)}, {"t": TOPIC}),
        now_ms=0,
    )
    p._sender.loop.task = _Running()  # type: ignore[assignment]
    p.accumulator.set_producer_id(7, 0)
    return p


def send(p: AsyncProducer, value: bytes, partition: int = 0) -> FutureRecordMetadata:
    return p._append("t", value, None, partition, None, 1234, TOPIC)


def drain_one(p: AsyncProducer, now: int = 0):  # type: ignore[no-untyped-def]
    p.accumulator.flushing += 1
    (batch,) = p.accumulator.drain({1: [TopicPartition("t", 0)]}, 1 << 20, now)[1]
    p.accumulator.flushing -= 1
    return batch


def test_acks_values() -> None:
    assert [parse_acks(v) for v in ("all", -1, "-1", 1, "1", 0, "0")] == [-1, -1, -1, 1, 1, 0, 0]
    with pytest.raises(ConfigError, match="use all, 1 or 0"):
        parse_acks("2")


def test_configuration_checks() -> None:
    assert AsyncProducer("h:1").idempotent, "idempotence is on by default with acks=all"
    assert not AsyncProducer("h:1", acks=1).idempotent, "and quietly off with acks=1 (Kafka 3+)"
    with pytest.raises(ConfigError, match="needs acks='all'"):
        AsyncProducer("h:1", acks=1, enable_idempotence=True)
    with pytest.raises(ConfigError, match="compression"):
        AsyncProducer("h:1", compression_type="brotli")
    with pytest.raises(ConfigError, match="delivery_timeout_ms"):
        AsyncProducer("h:1", delivery_timeout_ms=1000, request_timeout_ms=30_000)
    with pytest.raises(ValueError, match="HOST:PORT"):
        AsyncProducer("nohostport")


def append(p: AsyncProducer, *args: object) -> FutureRecordMetadata:
    value, key, partition, headers, timestamp_ms = args
    return p._append("t", value, key, partition, headers, timestamp_ms, TOPIC)  # type: ignore[arg-type]


def test_bad_input_raises_typed_errors_that_say_what_to_fix() -> None:
    p = producer()
    with pytest.raises(UnknownTopicOrPartitionError, match=r"has 3 partitions \(0..2\)"):
        append(p, b"v", None, 3, None, None)
    with pytest.raises(MessageTooLargeError, match=r"max.message.bytes of topic 't' \(2000\)"):
        append(p, b"v" * 5000, None, None, None, None)
    with pytest.raises(MessageTooLargeError, match=r"max.message.bytes of topic 't' \(2000\)"):
        append(p, b"v" * 1000, b"k" * 1000, None, None, None)
    with pytest.raises(TypeError, match="serialize it first"):
        append(p, 42, None, None, None, None)
    with pytest.raises(TypeError, match="serialize it first"):
        append(p, b"v", 4.2, None, None, None)
    with pytest.raises(TypeError, match="header names must be str"):
        append(p, b"v", None, None, [(1, b"x")], None)
    assert not p.accumulator.has_incomplete() and p.accumulator.buffered_bytes == 0


def test_append_encodes_text_and_places_keys_like_kafka() -> None:
    p = producer()
    future = append(p, "värde", "key-9", None, {"h": "x"}, 55)
    tp = TopicPartition("t", partition_for_key(b"key-9", 3))
    p.accumulator.flushing += 1
    (batch,) = p.accumulator.drain({1: [tp]}, 1 << 20, 0)[1]
    (record,) = iter_records(batch.buffer)
    assert record.value == "värde".encode() and record.key == b"key-9"
    assert record.headers == (("h", b"x"),)
    assert record.timestamp == 55
    p._sender.finish_ok(batch, 7, -1)
    assert future.result(timeout=0) == RecordMetadata("t", tp.partition, 7, 55)


def test_null_keys_stick_to_one_partition_until_its_batch_is_full() -> None:
    """KIP-480: records without key or partition fill one partition's batch, then move on."""
    p = producer(batch_size=300)
    futures = [append(p, bytes([i]) * 100, None, None, None, 1) for i in range(6)]
    partitions = [f[0].tp.partition for f in futures]
    assert partitions[0] == partitions[1], "the second record joins the first one's batch"
    assert partitions[1] != partitions[2], "a full batch moves the stickiness on"
    assert [f[1] for f in futures] == [0, 1, 0, 1, 0, 1], "each record's index in its batch"


def test_a_retriable_error_requeues_the_same_bytes_and_forgets_the_leader() -> None:
    p = producer()
    futures = [send(p, b"a"), send(p, b"b")]
    batch = drain_one(p)
    sent_bytes = batch.buffer
    p._sender.on_batch_error(batch, NotLeaderOrFollowerError("moved"))
    assert not any(f.done() for f in futures)
    assert p.cluster.metadata.leader_for(TopicPartition("t", 0)) is None
    assert p.accumulator.ready(batch.retry_at_ms - 1)[0] == [], "retry_backoff_ms first"
    again = drain_one(p, now=batch.retry_at_ms)
    assert again is batch and again.buffer == sent_bytes, "same sequence, broker dedups"
    p._sender.finish_ok(again, 100, -1)
    assert [f.result() for f in futures] == [
        RecordMetadata("t", 0, 100, 1234),
        RecordMetadata("t", 0, 101, 1234),
    ]
    assert p.accumulator.buffered_bytes == 0


def test_log_append_time_replaces_create_time() -> None:
    p = producer()
    future = send(p, b"a")
    p._sender.finish_ok(drain_one(p), 5, 999)
    assert future.result() == RecordMetadata("t", 0, 5, 999)


def test_a_sequence_error_fails_the_batch_and_asks_for_a_new_producer_id() -> None:
    p = producer()
    future = send(p, b"a")
    batch = drain_one(p)
    assert read_header(batch.buffer).base_sequence == 0
    p._sender.need_producer_id = False
    p._sender.on_batch_error(batch, OutOfOrderSequenceError("gap"))
    with pytest.raises(OutOfOrderSequenceError):
        future.result()
    assert p._sender.need_producer_id, "a failed sequenced batch leaves a gap: take a new id"


def test_retriable_errors_stop_at_the_delivery_timeout() -> None:
    p = producer(delivery_timeout_ms=30_005)
    future = send(p, b"a")
    batch = drain_one(p)
    batch.created_ms -= 31_000
    p._sender.on_batch_error(batch, NotEnoughReplicasError("isr too small"))
    with pytest.raises(NotEnoughReplicasError, match="gave up"):
        future.result()


def test_a_broker_size_refusal_says_which_setting_to_change() -> None:
    from minibroker.client.errors import error_for

    p = producer()
    future = send(p, b"a")
    p._sender.on_batch_error(drain_one(p), error_for(10, "too big"))
    with pytest.raises(MessageTooLargeError, match="lower batch_size"):
        future.result()


def test_send_after_close_raises_and_queues_nothing() -> None:
    from minibroker.client.transport import ClientClosedError

    p = producer()
    p._closed = True
    with pytest.raises(ClientClosedError, match="closed"):
        send(p, b"a")
    assert not p.accumulator.has_incomplete()


def test_a_record_appended_after_the_last_abort_is_refused_not_left_unsent() -> None:
    """close() ends with one atomic step (refuse later appends, fail what is queued): a record
    from another thread either fails with the queued ones or is refused at once."""
    from minibroker.client.transport import ClientClosedError

    p = producer()
    queued = send(p, b"a")
    p._sender.fail_everything(ClientClosedError("closed"), close=True)
    with pytest.raises(ClientClosedError):
        queued.result(timeout=0)
    with pytest.raises(ClientClosedError):
        send(p, b"b")
    assert not p.accumulator.has_incomplete()


@pytest.mark.parametrize("bad", [-5, -1, 2**63])
def test_a_timestamp_out_of_range_is_refused_at_send_and_nothing_is_queued(bad: int) -> None:
    """Kafka's ProducerRecord refuses a negative timestamp ("Timestamp should always be
    non-negative or null"); the broker would refuse the whole batch with INVALID_TIMESTAMP, so
    the record must not get into a batch with others."""
    p = producer()
    with pytest.raises(ValueError, match=rf"Invalid timestamp: {bad}\. Timestamp should"):
        append(p, b"v", None, 0, None, bad)
    with pytest.raises(ValueError, match="Invalid timestamp"):
        asyncio.run(p.send("t", b"v", partition=0, timestamp_ms=bad))
    assert not p.accumulator.has_incomplete() and p.accumulator.buffered_bytes == 0
    assert not p.accumulator.has_incomplete() and p.accumulator.buffered_bytes == 0
    assert append(p, b"v", None, 0, None, 0)[2] == 0, "0 is valid"


@pytest.mark.parametrize("bad", [1.5e12, "1700000000000", True])
def test_a_timestamp_that_is_not_an_int_is_refused_at_send(bad: object) -> None:
    p = producer()
    with pytest.raises(TypeError, match="timestamp_ms must be an int"):
        append(p, b"v", None, 0, None, bad)
    assert not p.accumulator.has_incomplete()


def test_the_blocking_producer_refuses_a_negative_timestamp_and_queues_nothing() -> None:
    from minibroker.client.sync import Producer

    sync_producer = Producer("127.0.0.1:1", max_block_ms=60_000)
    try:
        inner = sync_producer._async
        inner.cluster.metadata.update(
            ClusterSnapshot("c", 0, {1: BrokerInfo(1, "h", 1)}, {"t": TOPIC}), now_ms=0
        )
        with pytest.raises(ValueError, match="Invalid timestamp: -5"):
            sync_producer.send("t", b"v", timestamp_ms=-5)
        acc = inner.accumulator
        assert not acc.has_incomplete() and acc.buffered_bytes == 0
    finally:
        sync_producer.close(timeout_ms=0)  # no broker: do not wait for a delivery


def test_a_timestamp_refusal_fails_the_batch_at_once_naming_the_partition() -> None:
    from minibroker.client.errors import InvalidTimestampError, error_for

    p = producer()
    futures = [send(p, b"a"), send(p, b"b")]
    batch = drain_one(p)
    p._sender.need_producer_id = False
    p._sender.on_batch_error(
        batch, error_for(32, "batch at position 0: timestamp 9 is out of range")
    )
    for future in futures:
        with pytest.raises(InvalidTimestampError, match=r"2 record\(s\) for t-0 failed: batch"):
            future.result(timeout=0)
    assert not p.accumulator.has_incomplete(), "not retried: Kafka's INVALID_TIMESTAMP is final"
    assert p._sender.need_producer_id, "its sequence range may be a gap: the next batch starts anew"


def test_a_batch_refused_as_too_large_is_split_and_sent_again_in_order() -> None:
    """Kafka's Sender splits a MESSAGE_TOO_LARGE batch of several records (the topic's limit
    may be lower than the producer knows: a broker-wide message.max.bytes, a changed config)."""
    from minibroker.client.errors import error_for

    p = producer()
    futures = [send(p, bytes([i]) * 100) for i in range(4)]
    big = drain_one(p)
    p._sender.need_producer_id = False
    p._sender.on_batch_error(big, error_for(10, "batch at position 0 is 500 bytes, over 300"))
    assert not any(f.done() for f in futures)
    assert not p._sender.need_producer_id, "the broker stored none of it: the sequences are reused"
    first = drain_one(p)
    assert first.record_count == 2 and read_header(first.buffer).base_sequence == 0
    p._sender.finish_ok(first, 10, -1)
    second = drain_one(p)
    assert second.record_count == 2 and read_header(second.buffer).base_sequence == 2
    p._sender.finish_ok(second, 12, -1)
    assert [f.result(timeout=0).offset for f in futures] == [10, 11, 12, 13]


def test_a_full_buffer_blocks_the_blocking_send_for_max_block_ms_then_raises() -> None:
    """Kafka's send blocks while buffer.memory is used up, for at most max.block.ms."""
    import time

    p = producer(buffer_memory=1000, max_block_ms=50)
    send(p, b"x" * 900)
    send(p, b"y" * 200)
    assert p.accumulator.buffered_bytes >= p.buffer_memory
    started = time.monotonic()
    with pytest.raises(RequestTimedOutError, match=r"buffer_memory \(1000 bytes\) stayed full"):
        p._block_for_space()
    assert time.monotonic() - started >= 0.05, "it waited max_block_ms first"


def test_a_blocked_send_goes_on_once_an_acknowledged_batch_frees_the_buffer() -> None:
    import threading

    p = producer(buffer_memory=1000, max_block_ms=60_000)
    first = send(p, b"x" * 1100)
    outcome: list[object] = []

    def blocked_sender() -> None:
        p._block_for_space()
        outcome.append(send(p, b"after"))

    thread = threading.Thread(target=blocked_sender)
    thread.start()
    deadline = time.monotonic() + 30
    while p._blocked == 0 and time.monotonic() < deadline:
        thread.join(0.001)
    assert p._blocked == 1 and outcome == [], "the sender thread waits for room"
    p._sender.finish_ok(drain_one(p), 0, -1)  # the batch is acknowledged: room again
    thread.join(30)
    assert first.result(0).offset == 0
    assert len(outcome) == 1 and not thread.is_alive()


def test_the_async_send_waits_for_room_then_raises_after_max_block_ms() -> None:
    p = producer(buffer_memory=1000, max_block_ms=50)
    send(p, b"x" * 1100)

    async def main() -> None:
        p._loop = asyncio.get_running_loop()
        p._space = asyncio.Event()
        await p.send("t", b"more", partition=0)

    with pytest.raises(RequestTimedOutError, match="stayed full for max_block_ms"):
        asyncio.run(main())
    assert p.accumulator.incomplete()[0].count_records() == 1, "the refused record was not queued"


def test_send_batch_appends_every_value_in_order_and_checks_all_before_queueing_any() -> None:
    p = producer(batch_size=500)

    async def main(values: list[object], partition: int | None = 0) -> object:
        p._loop = asyncio.get_running_loop()
        p._space = asyncio.Event()
        return await p.send_batch("t", values, partition=partition, timestamp_ms=9)

    with pytest.raises(TypeError, match="serialize it first"):
        asyncio.run(main([b"ok", 5]))
    with pytest.raises(MessageTooLargeError, match=r"max.message.bytes of topic 't' \(2000\)"):
        asyncio.run(main([b"ok", b"x" * 5000]))
    assert not p.accumulator.has_incomplete(), "a refused batch queues none of its records"
    values = [bytes([i]) * 50 for i in range(20)]
    sent = asyncio.run(main(values))
    assert len(sent) == 20  # type: ignore[arg-type]
    p.accumulator.flushing += 1
    batches = []
    while p.accumulator.has_unsent():
        (batch,) = p.accumulator.drain({1: [TopicPartition("t", 0)]}, 1 << 20, 0)[1]
        batches.append(batch)
        p._sender.finish_ok(batch, sum(b.record_count for b in batches[:-1]), -1)
    assert p.accumulator.buffered_bytes == 0
    assert len(batches) > 1, "20 x 50 B do not fit one 500 B batch"
    assert [r.value for b in batches for r in iter_records(b.buffer)] == values
    metadata = sent.result(timeout=0)  # type: ignore[attr-defined]
    assert [m.offset for m in metadata] == list(range(20))
    assert {m.timestamp for m in metadata} == {9}


def test_a_changed_partition_count_makes_the_sticky_choice_again() -> None:
    """A topic re-created with fewer partitions: null-key records must not keep going to the
    remembered batch of a partition the topic no longer has."""

    class Ones:
        def randrange(self, stop: int) -> int:
            return min(1, stop - 1)

    p = producer(rng=Ones())
    first = append(p, b"a", None, None, None, 1)
    assert first[0].tp.partition == 2
    smaller = TopicInfo("t", "id2", {0: PartitionInfo(0, 1, 3, (1, 2), (1, 2))}, {})
    later = p._append("t", b"b", None, None, None, 1, smaller)
    assert later[0].tp.partition == 0, "not the remembered batch of partition 2"


@pytest.mark.parametrize("keyed", [False, True])
def test_send_batch_refuses_what_the_encoder_refuses_before_queueing_any(keyed: bool) -> None:
    """A non-contiguous memoryview passes the producer's own byte check but not the encoder's:
    checked first, a refused send_batch queues none of its records (with keys and no
    partition the records go one at a time, so every one is checked before the first)."""
    p = producer()
    values = [b"a", b"b", memoryview(b"abcdef")[::2]]
    keys = [b"k1", b"k2", b"k3"] if keyed else None

    async def main() -> object:
        p._loop = asyncio.get_running_loop()
        p._space = asyncio.Event()
        return await p.send_batch("t", values, keys=keys, partition=None if keyed else 0)

    with pytest.raises(TypeError, match="C-contiguous"):
        asyncio.run(main())
    assert not p.accumulator.has_incomplete() and p.accumulator.buffered_bytes == 0


def test_send_batch_after_the_sender_failed_for_good_raises_its_error() -> None:
    from minibroker.client.errors import UnknownServerError

    p = producer()
    p._sender.fatal = UnknownServerError("the producer's sender task failed")

    async def main() -> object:
        p._loop = asyncio.get_running_loop()
        p._space = asyncio.Event()
        return await p.send_batch("t", [b"a"], partition=0)

    with pytest.raises(UnknownServerError):
        asyncio.run(main())
    assert not p.accumulator.has_incomplete()


@pytest.mark.parametrize(("linger_ms", "yields"), [(60_000, 0), (0, 3)])
def test_send_yields_to_the_sender_when_it_is_due_not_per_new_batch(
    monkeypatch: pytest.MonkeyPatch, linger_ms: int, yields: int
) -> None:
    """Records spread over many partitions open a batch per record: a send that yielded to the
    event loop for each would cost a loop pass per record. It yields when the sender has a
    batch to send now (linger 0 here) or its timer has come."""
    import threading

    p = producer(linger_ms=linger_ms)
    seen: list[float] = []
    real_sleep = asyncio.sleep

    async def counting_sleep(delay: float) -> None:
        seen.append(delay)
        await real_sleep(delay)

    async def main() -> None:
        p._loop = asyncio.get_running_loop()
        p._loop_thread = threading.get_ident()
        p._space = asyncio.Event()
        monkeypatch.setattr(asyncio, "sleep", counting_sleep)
        for partition in range(3):
            await p.send("t", b"x", partition=partition)

    asyncio.run(main())
    assert seen == [0] * yields
    assert p.accumulator.batches_created == 3


class _Broker:
    """Stands in for the brokers' Produce: each request waits for its gate, then succeeds."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[int]]] = []
        self.gates: list[asyncio.Event] = []

    async def produce(self, address: str, request: object, timeout_s: float) -> object:
        from minibroker.proto import minibroker_pb2 as pb

        parts = [q.partition for t in request.topics for q in t.partitions]  # type: ignore[attr-defined]
        self.sent.append((address, parts))
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        answer = pb.ProduceResponse()
        topic = answer.topics.add(topic="t")
        for q in parts:
            topic.partitions.add(partition=q, base_offset=0)
        return answer


def _stepping(monkeypatch: pytest.MonkeyPatch) -> tuple[AsyncProducer, _Broker]:
    """A producer whose sender passes the test runs one at a time (on the running loop),
    against `_Broker`; every partition of `t` is led by broker 1 ("h:1"), one request in flight
    per broker."""
    p = producer(max_in_flight=1, linger_ms=0)
    p._sender.need_producer_id = False
    broker = _Broker()
    monkeypatch.setattr(p.cluster, "produce", broker.produce)
    monkeypatch.setattr(p._sender.loop, "refresh_metadata_if_due", lambda now: None)
    return p, broker


def _on_loop(p: AsyncProducer) -> None:
    import threading

    loop = asyncio.get_running_loop()
    p._loop = loop
    p._loop_thread = threading.get_ident()
    p._space = asyncio.Event()
    p._sender.loop._loop = loop
    p._sender.loop._event = asyncio.Event()


async def _requests_out(p: AsyncProducer, broker: _Broker, count: int) -> None:
    """Let spawned requests reach the broker (a few loop passes, no time)."""
    for _ in range(100):
        if len(broker.sent) >= count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{count} requests expected, got {broker.sent}")


def test_partitions_of_a_broker_with_every_request_out_wait_aside_until_one_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a broker has max_in_flight requests out, the ready partitions it leads are set
    aside: a sender pass does not look at them again, until one of its requests ends."""
    p, broker = _stepping(monkeypatch)
    acc = p.accumulator
    looked: list[int] = []

    async def main() -> None:
        _on_loop(p)
        send(p, b"a", 0)
        await p._sender._step()
        await _requests_out(p, broker, 1)
        send(p, b"b", 1)
        send(p, b"c", 2)
        await p._sender._step()
        sendable = acc._sendable

        def counting(batch, queue_len, now_ms):  # type: ignore[no-untyped-def]
            looked.append(batch.tp.partition)
            return sendable(batch, queue_len, now_ms)

        monkeypatch.setattr(acc, "_sendable", counting)
        await p._sender._step()
        assert looked == [], "set aside while broker 1 has its one request out"
        broker.gates[0].set()
        await asyncio.gather(*list(p._sender.loop.tasks))
        await p._sender._step()
        await _requests_out(p, broker, 2)
        broker.gates[1].set()
        await asyncio.gather(*list(p._sender.loop.tasks))

    asyncio.run(main())
    assert broker.sent == [("h:1", [0]), ("h:1", [1, 2])]
    assert sorted(looked) == [1, 1, 2, 2], "looked at again once it ended (ready, then drain)"
    assert not acc.has_incomplete()


def test_new_metadata_sends_partitions_set_aside_to_their_new_leader(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker whose requests hang (dead, black-holed) keeps them out until their deadline:
    partitions set aside under it go to the leader new metadata names, without waiting."""
    p, broker = _stepping(monkeypatch)

    async def main() -> None:
        _on_loop(p)
        send(p, b"a", 0)
        await p._sender._step()
        await _requests_out(p, broker, 1)
        send(p, b"b", 1)
        await p._sender._step()
        assert len(broker.sent) == 1
        moved = TopicInfo(
            "t",
            "id",
            {q: PartitionInfo(q, 1 if q == 0 else 2, 4, (1, 2), (1, 2)) for q in range(3)},
            {"max.message.bytes": "2000"},
        )
        p.cluster.metadata.update(
            ClusterSnapshot(
                "c", 0, {1: BrokerInfo(1, "h", 1), 2: BrokerInfo(2, "h", 2)}, {"t": moved}
            ),
            now_ms=1,
        )
        await p._sender._step()
        await _requests_out(p, broker, 2)
        for gate in broker.gates:
            gate.set()
        await asyncio.gather(*list(p._sender.loop.tasks))

    asyncio.run(main())
    assert broker.sent == [("h:1", [0]), ("h:2", [1])]
