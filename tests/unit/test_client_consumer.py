"""AsyncConsumer's decisions without a network: decoding fetched batches, error handling,
positions and seeks (research/kafka-replication.md §1 items 24-26, §2.9 step 6).

No event loop runs: fetch responses are built as protobuf messages and handed to the handler.
"""

from __future__ import annotations

import pytest

from minibroker.client.batch import set_base_offset
from minibroker.client.common.config import ConfigError
from minibroker.client.consumer import AsyncConsumer, _PartitionState
from minibroker.client.errors import CorruptMessageError, ErrorCode, OffsetOutOfRangeError
from minibroker.client.metadata_cache import BrokerInfo, ClusterSnapshot, PartitionInfo, TopicInfo
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition
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


def at(c: AsyncConsumer, offset: int) -> _PartitionState:
    c.seek(TP, offset)
    return c._states[TP]


def test_records_below_the_fetch_offset_inside_a_batch_are_skipped() -> None:
    c = consumer()
    state = at(c, 3)
    c._handle_partition(TP, state, ok(batch(0, [b"a", b"b", b"c", b"d", b"e"])), 1, 1)
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
    c._handle_partition(TP, state, ok(whole + cut), 1, 1)
    assert [r.offset for r in c._drain_buffers(100)] == [0, 1]
    assert state.fetch_offset == 2


def test_a_corrupt_batch_surfaces_from_poll() -> None:
    c = consumer()
    state = at(c, 0)
    raw = bytearray(batch(0, [b"a"]))
    raw[-1] ^= 0xFF
    c._handle_partition(TP, state, ok(bytes(raw)), 1, 1)
    with pytest.raises(CorruptMessageError):
        c._drain_buffers(100)


def test_not_leader_forgets_the_leader_and_backs_off() -> None:
    c = consumer()
    state = at(c, 0)
    resp = pb.FetchPartitionResponse(partition=0, error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER)
    c._handle_partition(TP, state, resp, 1, 1)
    assert c.cluster.metadata.leader_for(TP) is None
    assert state.backoff_until_ms > 0 and state.error is None
    assert state.position == 0, "the position survives a leader change"


def test_offset_not_available_after_an_election_is_retried_not_raised() -> None:
    """KIP-207: a new leader whose HW lags answers OFFSET_NOT_AVAILABLE; the consumer waits."""
    c = consumer()
    state = at(c, 7)
    resp = pb.FetchPartitionResponse(partition=0, error_code=ErrorCode.OFFSET_NOT_AVAILABLE)
    c._handle_partition(TP, state, resp, 1, 1)
    assert state.error is None and state.backoff_until_ms > 0
    assert c.cluster.metadata.update_requested
    assert c._drain_buffers(10) == []


def test_out_of_range_from_a_follower_goes_back_to_the_leader() -> None:
    c = consumer()
    state = at(c, 50)
    state.read_replica = 2
    resp = pb.FetchPartitionResponse(partition=0, error_code=ErrorCode.OFFSET_OUT_OF_RANGE)
    c._handle_partition(TP, state, resp, node=2, leader=1)
    assert state.read_replica is None and state.position == 50 and state.error is None
    assert c._fetch_target(TP, state) == 1


def test_out_of_range_from_the_leader_applies_auto_offset_reset() -> None:
    c = consumer(auto_offset_reset="earliest")
    state = at(c, 50)
    resp = pb.FetchPartitionResponse(partition=0, error_code=ErrorCode.OFFSET_OUT_OF_RANGE)
    c._handle_partition(TP, state, resp, node=1, leader=1)
    assert state.position is None and state.reset == "earliest"

    c = consumer(auto_offset_reset="none")
    state = at(c, 50)
    c._handle_partition(TP, state, resp, node=1, leader=1)
    with pytest.raises(OffsetOutOfRangeError, match="seek"):
        c._drain_buffers(10)


def test_seek_drops_buffered_records_and_stale_responses() -> None:
    c = consumer()
    state = at(c, 0)
    c._handle_partition(TP, state, ok(batch(0, [b"a", b"b"])), 1, 1)
    generation = state.generation
    c.seek(TP, 1)
    assert state.generation == generation + 1
    assert not state.buffer and state.position == 1 and state.fetch_offset == 1
    c.seek_to_beginning(TP)
    assert state.position is None and state.reset == "earliest"


def test_poll_hands_out_at_most_max_records_in_offset_order() -> None:
    c = consumer()
    state = at(c, 0)
    c._handle_partition(TP, state, ok(batch(0, [bytes([i]) for i in range(10)])), 1, 1)
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
