"""AsyncConsumer's decisions without a network: decoding fetched batches, error handling,
positions and seeks (docs/protocol.md §10 step 5, §12, §14).

No network: fetch responses are built as protobuf messages and handed to the handler (one test
runs a reset on an event loop with ListOffsets answered in-process).
"""

from __future__ import annotations

import asyncio

import pytest

from minibroker.client.batch import Compression, CorruptRecordError, set_base_offset
from minibroker.client.common.config import ConfigError
from minibroker.client.consumer import AsyncConsumer
from minibroker.client.errors import (
    CorruptMessageError,
    ErrorCode,
    LogTruncationError,
    OffsetOutOfRangeError,
)
from minibroker.client.metadata_cache import BrokerInfo, ClusterSnapshot, PartitionInfo, TopicInfo
from minibroker.client.records import encode_batch
from minibroker.client.subscription import PartitionState, truncation_point
from minibroker.client.types import TopicPartition
from minibroker.client.wire import fetched_partition
from minibroker.proto import minibroker_pb2 as pb

TP = TopicPartition("t", 0)


def consumer(**config: object) -> AsyncConsumer:
    c = AsyncConsumer("127.0.0.1:1", **config)  # type: ignore[arg-type]
    topic = TopicInfo("t", "id", {0: PartitionInfo(0, 1, 4, (1, 2), (1, 2))})
    brokers = {1: BrokerInfo(1, "h", 1), 2: BrokerInfo(2, "h", 2)}
    c.cluster.metadata.update(ClusterSnapshot("c", 0, brokers, {"t": topic}), now_ms=0)
    c.assign([TP])
    return c


def batch(base: int, values: list[bytes], epoch: int = 4) -> bytes:
    raw = bytearray(
        encode_batch([(1000 + i, b"k", v, [("h", b"1")]) for i, v in enumerate(values)])
    )
    set_base_offset(raw, 0, base)
    raw[12:16] = epoch.to_bytes(4, "big")
    return bytes(raw)


def ok(records: bytes, hw: int = 100) -> pb.FetchPartitionResponse:
    return pb.FetchPartitionResponse(
        partition=0, high_watermark=hw, preferred_read_replica=-1, records=records
    )


def handle(
    c: AsyncConsumer, state: PartitionState, p: pb.FetchPartitionResponse, node: int, leader: int
) -> None:
    """Hand a FetchResponse's partition to the fetcher as the wire module reads it."""
    c._fetcher.handle_partition(state, fetched_partition(TP.topic, p), node, leader)


def at(c: AsyncConsumer, offset: int) -> PartitionState:
    c.seek(TP, offset)
    return c._subscriptions.states[TP]


def test_records_below_the_fetch_offset_inside_a_batch_are_skipped() -> None:
    c = consumer()
    state = at(c, 3)
    handle(c, state, ok(batch(0, [b"a", b"b", b"c", b"d", b"e"])), 1, 1)
    records = c._drain_buffers(100)
    assert [(r.offset, r.value) for r in records] == [(3, b"d"), (4, b"e")]
    first = records[0]
    assert (first.topic, first.partition, first.key, first.headers) == (
        "t",
        0,
        b"k",
        (("h", b"1"),),
    )
    assert first.timestamp == 1003 and first.leader_epoch == 4
    assert state.fetch_offset == 5 and state.position == 5
    assert c.highwater(TP) == 100


def test_a_partial_batch_at_the_end_of_a_response_is_left_for_the_next_fetch() -> None:
    c = consumer()
    state = at(c, 0)
    whole = batch(0, [b"a", b"b"])
    cut = batch(2, [b"c" * 50])[:40]
    handle(c, state, ok(whole + cut), 1, 1)
    assert [r.offset for r in c._drain_buffers(100)] == [0, 1]
    assert state.fetch_offset == 2


def test_a_corrupt_batch_surfaces_from_poll() -> None:
    c = consumer()
    state = at(c, 0)
    raw = bytearray(batch(0, [b"a"]))
    raw[-1] ^= 0xFF
    handle(c, state, ok(bytes(raw)), 1, 1)
    with pytest.raises(CorruptMessageError):
        c._drain_buffers(100)


def test_not_leader_forgets_the_leader_and_backs_off() -> None:
    c = consumer()
    state = at(c, 0)
    resp = pb.FetchPartitionResponse(partition=0, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER)
    handle(c, state, resp, 1, 1)
    assert c.cluster.metadata.leader_for(TP) is None
    assert state.backoff_until_ms > 0 and state.error is None
    assert state.position == 0, "the position survives a leader change"


def test_offset_not_available_after_an_election_is_retried_not_raised() -> None:
    """KIP-207: a new leader whose HW lags answers OFFSET_NOT_AVAILABLE; the consumer waits."""
    c = consumer()
    state = at(c, 7)
    resp = pb.FetchPartitionResponse(partition=0, error_code=ErrorCode.OFFSET_NOT_AVAILABLE)
    handle(c, state, resp, 1, 1)
    assert state.error is None and state.backoff_until_ms > 0
    assert c.cluster.metadata.update_requested
    assert c._drain_buffers(10) == []


def test_out_of_range_from_a_follower_goes_back_to_the_leader() -> None:
    c = consumer()
    state = at(c, 50)
    state.read_replica = 2
    resp = pb.FetchPartitionResponse(partition=0, error_code=ErrorCode.OFFSET_OUT_OF_RANGE)
    handle(c, state, resp, node=2, leader=1)
    assert state.read_replica is None and state.position == 50 and state.error is None
    assert c._fetcher.fetch_target(state) == 1


def test_out_of_range_from_the_leader_applies_auto_offset_reset() -> None:
    c = consumer(auto_offset_reset="earliest")
    state = at(c, 50)
    resp = pb.FetchPartitionResponse(partition=0, error_code=ErrorCode.OFFSET_OUT_OF_RANGE)
    handle(c, state, resp, node=1, leader=1)
    assert state.position is None and state.reset == "earliest"

    c = consumer(auto_offset_reset="none")
    state = at(c, 50)
    handle(c, state, resp, node=1, leader=1)
    with pytest.raises(OffsetOutOfRangeError, match="seek"):
        c._drain_buffers(10)


def test_seek_drops_buffered_records_and_stale_responses() -> None:
    c = consumer()
    state = at(c, 0)
    handle(c, state, ok(batch(0, [b"a", b"b"])), 1, 1)
    generation = state.generation
    c.seek(TP, 1)
    assert state.generation == generation + 1
    assert not state.buffer and state.position == 1 and state.fetch_offset == 1
    c.seek_to_beginning(TP)
    assert state.position is None and state.reset == "earliest"


def test_poll_hands_out_at_most_max_records_in_offset_order() -> None:
    c = consumer()
    state = at(c, 0)
    handle(c, state, ok(batch(0, [bytes([i]) for i in range(10)])), 1, 1)
    assert [r.offset for r in c._drain_buffers(4)] == [0, 1, 2, 3]
    assert [r.offset for r in c._drain_buffers(100)] == list(range(4, 10))
    assert state.position == 10


def test_configuration_and_assignment_checks() -> None:
    with pytest.raises(ConfigError, match="earliest, latest or none"):
        AsyncConsumer("h:1", auto_offset_reset="smallest")
    c = consumer()
    with pytest.raises(ValueError, match="not assigned"):
        c.seek(TopicPartition("t", 5), 0)
    with pytest.raises(ValueError, match=">= 0"):
        c.seek(TP, -1)
    c.assign([("t", 0), TopicPartition("u", 1)])
    assert c.assignment() == {TP, TopicPartition("u", 1)}
    assert "u" in c.cluster.metadata.interest


# -- position validation after a leader change (KIP-320) --------------------------------------


@pytest.mark.parametrize(
    ("position", "leader_epoch", "end_offset", "expected"),
    [
        (10, 4, 10, (False, None)),  # the epoch ends exactly at the position: nothing lost
        (10, 4, 25, (False, None)),  # the epoch goes on past the position
        (10, 4, 7, (True, 7)),  # it ends below: offsets 7..9 were truncated away
        (10, 3, 7, (True, 7)),  # an older epoch ends there (the asked one never reached it)
        (10, -1, -1, (True, None)),  # the leader knows no such epoch: divergence unknown
        (0, 4, -1, (True, None)),
    ],
)
def test_truncation_point_follows_kafkas_validation_rule(
    position: int, leader_epoch: int, end_offset: int, expected: tuple[bool, int | None]
) -> None:
    assert truncation_point(position, leader_epoch, end_offset) == expected


def consumed(c: AsyncConsumer, upto: int) -> PartitionState:
    """A state that returned offsets [0, upto) written in epoch 4, with more buffered."""
    state = at(c, 0)
    handle(c, state, ok(batch(0, [b"v"] * (upto + 3))), 1, 1)
    assert len(c._drain_buffers(upto)) == upto
    assert (state.position, state.position_epoch, len(state.buffer)) == (upto, 4, 3)
    return state


def test_a_new_leader_epoch_drops_buffered_records_and_awaits_validation() -> None:
    c = consumer()
    state = consumed(c, 5)
    generation = state.generation
    state.new_leader_epoch()
    assert not state.buffer and state.fetch_offset == 5 and state.position == 5
    assert state.awaiting_validation and state.generation == generation + 1
    # A fetch answer sent before the change is dropped (its generation is gone).
    assert c._drain_buffers(100) == []


def test_a_position_with_no_consumed_record_is_not_validated() -> None:
    c = consumer()
    state = at(c, 5)  # a seek carries no epoch, as in Kafka
    state.new_leader_epoch()
    assert not state.awaiting_validation


def test_a_valid_position_resumes_fetching_where_it_was() -> None:
    c = consumer()
    state = consumed(c, 5)
    state.new_leader_epoch()
    c._offsets.complete_validation(state, 4, 5)
    assert not state.awaiting_validation and state.error is None
    assert (state.position, state.fetch_offset) == (5, 5)


def test_truncation_with_no_reset_policy_raises_log_truncation_from_poll() -> None:
    c = consumer(auto_offset_reset="none")
    state = consumed(c, 5)
    state.new_leader_epoch()
    c._offsets.complete_validation(state, 4, 2)
    with pytest.raises(LogTruncationError) as info:
        c._drain_buffers(100)
    assert info.value.divergent_offsets == {TP: 2}
    assert isinstance(info.value, OffsetOutOfRangeError)
    # Still unvalidated: nothing is fetched, the next validation raises again until a seek.
    assert state.awaiting_validation and state.position == 5
    c.seek(TP, 2)
    assert not state.awaiting_validation and state.position == 2


def test_truncation_with_a_reset_policy_moves_to_the_divergence_point() -> None:
    c = consumer(auto_offset_reset="earliest")
    state = consumed(c, 5)
    state.new_leader_epoch()
    c._offsets.complete_validation(state, 4, 2)
    assert state.error is None and not state.awaiting_validation
    # Not to the log start: to the first offset known to diverge, with that epoch.
    assert (state.position, state.fetch_offset, state.position_epoch) == (2, 2, 4)


def test_truncation_at_an_unknown_offset_applies_the_reset_policy() -> None:
    c = consumer(auto_offset_reset="latest")
    state = consumed(c, 5)
    state.new_leader_epoch()
    c._offsets.complete_validation(state, -1, -1)
    assert state.position is None and state.reset == "latest" and state.error is None


def test_a_reset_position_carries_the_leaders_epoch_and_is_validated_after_a_change() -> None:
    """Kafka takes the epoch of a reset position from ListOffsets: a consumer that reset to
    the end and has read nothing yet still notices a truncation under it (KIP-320)."""
    c = consumer(auto_offset_reset="latest")
    state = c._subscriptions.states[TP]

    async def list_offsets(targets: dict[TopicPartition, int]) -> dict:  # type: ignore[type-arg]
        assert targets == {TP: -1}  # LATEST
        return {TP: (15, -1, 4)}

    c._offsets.list_offsets = list_offsets  # type: ignore[method-assign]
    asyncio.run(c._offsets.reset_positions([TP]))
    assert (state.position, state.fetch_offset, state.position_epoch) == (15, 15, 4)
    state.new_leader_epoch()
    assert state.awaiting_validation
    c._offsets.complete_validation(state, 4, 10)
    assert (state.position, state.position_epoch) == (10, 4)


# -- bounded decoding ---------------------------------------------------------------------------

MIB = 1 << 20


def zstd_batch(base: int, value_sizes: list[int]) -> bytes:
    """A batch of zero-filled values: a few KiB of zstd that decode to sum(value_sizes) bytes."""
    raw = bytearray(
        encode_batch(
            [(1000, None, bytes(size), []) for size in value_sizes], compression=Compression.ZSTD
        )
    )
    set_base_offset(raw, 0, base)
    return bytes(raw)


def test_a_batch_that_decompresses_past_the_limit_fails_its_partition_naming_the_offset() -> None:
    """64 x max.message.bytes (64 MiB by default), the leader's own limit: a batch stored
    before the leader checked, or served by a broken broker, is not decompressed past it."""
    c = consumer()
    state = at(c, 0)
    bomb = zstd_batch(2, [65 * MIB])
    assert len(bomb) < 64 * 1024
    handle(c, state, ok(batch(0, [b"a", b"b"]) + bomb), 1, 1)
    assert [r.value for r in c._drain_buffers(100)] == [b"a", b"b"], "records before it"
    with pytest.raises(CorruptRecordError, match=r"t-0 at offset 2: .*more than 67109632 bytes"):
        c._drain_buffers(100)
    assert state.position == state.fetch_offset == 2, "fetched again from the bad batch only"


def test_the_limit_follows_the_topics_max_message_bytes_and_the_fetch_size() -> None:
    c = consumer()
    assert c._fetcher.decode_limit("t") == 64 * 1048588
    c = consumer(max_partition_fetch_bytes=2 * MIB)
    assert c._fetcher.decode_limit("t") == 128 * MIB
    big = TopicInfo(
        "big", "id2", {0: PartitionInfo(0, 1, 4, (1,), (1,))}, {"max.message.bytes": str(3 * MIB)}
    )
    c.cluster.metadata.update(
        ClusterSnapshot("c", 0, {1: BrokerInfo(1, "h", 1)}, {"big": big}), now_ms=0
    )
    assert c._fetcher.decode_limit("big") == 192 * MIB
    state = at(c, 0)
    handle(c, state, ok(zstd_batch(0, [80 * MIB])), 1, 1)
    assert len(c._drain_buffers(1)[0].value) == 80 * MIB, "a legal batch decodes"


def test_one_response_decodes_at_most_about_the_limit_and_the_rest_waits() -> None:
    """A few KiB of compressed bytes per batch could otherwise make one response of many such
    batches decode to gigabytes: decoding stops after the limit, and the partition is not
    fetched again until the application has taken what was decoded."""
    c = consumer()
    state = at(c, 0)
    three = zstd_batch(0, [40 * MIB]) + zstd_batch(1, [40 * MIB]) + zstd_batch(2, [40 * MIB])
    handle(c, state, ok(three), 1, 1)
    assert [r.offset for r in state.buffer] == [0, 1] and state.fetch_offset == 2
    assert not c._fetcher.fetchable(state), "over the decode budget: no fetch until it is taken"
    assert [r.offset for r in c._drain_buffers(1)] == [0]
    assert not c._fetcher.fetchable(state)
    assert [r.offset for r in c._drain_buffers(1)] == [1]
    assert c._fetcher.fetchable(state)
    handle(c, state, ok(batch(2, [b"small"])), 1, 1)
    assert state.buffer and c._fetcher.fetchable(state), "the budget starts again once taken"


def test_records_before_a_corrupt_batch_are_delivered_once() -> None:
    """The fetch offset stops at the corrupt batch: it used to stay at the response's start, so
    the fetch after the error delivered the records before it a second time."""
    c = consumer()
    state = at(c, 0)
    bad = bytearray(batch(2, [b"c"]))
    bad[-1] ^= 0xFF  # CRC mismatch: the header itself is refused
    handle(c, state, ok(batch(0, [b"a", b"b"]) + bytes(bad)), 1, 1)
    assert [r.offset for r in c._drain_buffers(100)] == [0, 1]
    with pytest.raises(CorruptRecordError, match="batch of t-0 at offset 2: CRC mismatch"):
        c._drain_buffers(100)
    assert state.fetch_offset == 2, "the next fetch starts at the corrupt batch"


def test_a_fetch_whose_partitions_were_unassigned_before_it_started_frees_its_broker() -> None:
    """A fetch is scheduled for a broker, then its partition is unassigned before the task
    runs (the Spark source reassigns between batches): it sends nothing and clears the busy
    mark, else that broker is never fetched from again (found by `make demo`: a stalled read)."""
    c = consumer()
    fetcher = c._fetcher
    fetcher._node_busy.add(1)
    c.assign([])

    async def run() -> None:
        await fetcher._fetch(1, [TP])

    asyncio.run(run())
    assert 1 not in fetcher._node_busy


def test_a_fetch_whose_partition_was_sought_before_it_started_sends_nothing() -> None:
    """A fetch is scheduled, then seek_to_beginning() runs before the task starts (final_logs in
    `minibroker verify`: assign, end_offsets, seek_to_beginning). The partition awaits its reset:
    it must not be fetched from its new fetch offset, else the answer is buffered, survives the
    reset, and the fetch from the reset position delivers the same records a second time."""
    c = consumer()
    fetcher = c._fetcher
    state = at(c, 5)
    generations = {TP: state.generation}  # as the fetch loop records them when it schedules
    fetcher._node_busy.add(1)
    state.in_flight = True
    sent: list[object] = []

    async def fake_fetch(address: str, request: object, timeout_s: float) -> object:
        sent.append(request)
        return pb.FetchResponse()

    c.cluster.fetch = fake_fetch  # type: ignore[method-assign]
    c.seek_to_beginning(TP)

    async def run() -> None:
        await fetcher._fetch(1, [TP], generations)

    asyncio.run(run())
    assert sent == [], "a partition awaiting its reset was fetched"
    assert not state.buffer and not state.in_flight and 1 not in fetcher._node_busy
    assert state.fetch_state.value == "await_reset"
