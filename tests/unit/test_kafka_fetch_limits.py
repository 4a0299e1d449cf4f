"""The Kafka port's Fetch answer: a request's overall max_bytes (Kafka's readFromLog rule), and
the response frame written in pieces with the record bytes not copied."""

from __future__ import annotations

import struct
from typing import Any

from kio.serial import entity_reader

from minibroker.broker import wire
from minibroker.broker.kafka import codec
from minibroker.broker.kafka.handlers import (
    FETCH,
    KafkaHandlers,
    whole_batches_within,
    within_max_bytes,
)
from minibroker.broker.replicas.fetch import FetchAnswer
from minibroker.client.errors import ErrorCode


def batch(payload: int, base_offset: int = 0) -> bytes:
    """A stand-in v2 batch: baseOffset, batchLength, then `payload` bytes (12 + payload)."""
    return struct.pack(">qi", base_offset, payload) + bytes([base_offset % 256]) * payload


def result(partition: int, records: bytes = b"", **kw: Any) -> wire.FetchPartitionResult:
    return wire.FetchPartitionResult("t", partition, high_watermark=50, records=records, **kw)


def kept(results: list[wire.FetchPartitionResult], max_bytes: int) -> list[bytes]:
    return [bytes(r.records) for r in within_max_bytes(results, max_bytes)]


def test_whole_batches_only() -> None:
    records = batch(88) + batch(88, 1) + batch(88, 2)  # 100 bytes each
    assert whole_batches_within(records, 99) == 0
    assert whole_batches_within(records, 100) == 100
    assert whole_batches_within(records, 299) == 200
    assert whole_batches_within(records, 10_000) == 300
    assert whole_batches_within(records[:250], 10_000) == 200  # a cut batch is not whole


def test_max_bytes_cuts_the_answer_to_whole_batches_in_partition_order() -> None:
    a = batch(88) + batch(88, 1) + batch(88, 2)
    b = batch(38, 3) + batch(38, 4)  # 50 bytes each
    c = batch(8, 5)  # 20 bytes
    results = [result(0, a), result(1, b), result(2, c)]
    # 250: two of a's batches (200), one of b's (50), nothing of c's.
    assert kept(results, 250) == [a[:200], b[:50], b""]
    # Room for everything: nothing changes, the same objects come back.
    assert [r.records for r in within_max_bytes(results, 420)] == [a, b, c]
    # A partition past the limit still answers its high watermark and error.
    cut = list(within_max_bytes([result(0, a), result(1, b, error=ErrorCode.NONE)], 100))
    assert [(r.partition, r.high_watermark, len(r.records)) for r in cut] == [
        (0, 50, 100),
        (1, 50, 0),
    ]


def test_only_the_first_batch_of_the_first_partition_with_records_may_exceed_it() -> None:
    big = batch(988) + batch(88, 1)  # 1000 + 100
    other = batch(88, 2)
    moved = result(0, error=ErrorCode.NOT_LEADER_OR_FOLLOWER)
    empty = result(1)
    # max_bytes 10: the first partition with records gives its first batch whole (KIP-74), the
    # partitions before it (none) and after it give nothing.
    assert kept([moved, empty, result(2, big), result(3, other)], 10) == [
        b"",
        b"",
        big[:1000],
        b"",
    ]
    # A later partition's first batch larger than what is left is not given.
    assert kept([result(0, other), result(1, big)], 500) == [other, b""]
    # max_bytes 0 (or less) still returns one batch.
    assert kept([result(0, other + other)], 0) == [other]


def test_cut_records_are_views_not_copies() -> None:
    a = batch(88) + batch(88, 1)
    (r,) = within_max_bytes([result(0, a)], 100)
    assert isinstance(r.records, memoryview) and r.records.obj is a


class FetchingReplicaManager:
    def __init__(self, partitions: list[wire.FetchPartitionResult]) -> None:
        self.partitions = partitions
        self.fetched: list[wire.FetchParams] = []

    async def fetch(self, params: wire.FetchParams, **_: Any) -> FetchAnswer:
        self.fetched.append(params)
        return FetchAnswer(0, ErrorCode.NONE, self.partitions)


def fetch_request(version: int, max_bytes: int) -> Any:
    cls = codec.request_class(FETCH, version)
    module = __import__(cls.__module__, fromlist=["_"])
    partition_cls = codec.nested(module, "FetchPartition")
    topic_cls = codec.nested(module, "FetchTopic")
    assert partition_cls and topic_cls
    partitions = tuple(
        codec.make(
            partition_cls,
            partition=p,
            current_leader_epoch=-1,
            fetch_offset=0,
            last_fetched_epoch=-1,
            log_start_offset=-1,
            partition_max_bytes=1 << 20,
        )
        for p in range(3)
    )
    return codec.make(
        cls,
        replica_id=-1,
        max_wait=500,
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(codec.make(topic_cls, topic="t", partitions=partitions),),
        forgotten_topics_data=(),
        rack_id="",
    )


async def test_a_fetch_answer_keeps_to_max_bytes_and_writes_records_uncopied() -> None:
    records = [batch(4084, 2 * p) + batch(4084, 2 * p + 1) for p in range(3)]  # 2 x 4 KiB each
    for version in (4, 11, 12):
        rm = FetchingReplicaManager([result(p, records[p]) for p in range(3)])
        handlers = KafkaHandlers(rm)  # type: ignore[arg-type]
        request = codec.Request(
            FETCH, version, 9, "c", fetch_request(version, 14_000), version >= 12
        )
        answer = await handlers.handle(request)
        assert rm.fetched[-1].max_bytes == 14_000
        pieces = codec.encode_response_pieces(FETCH, version, 9, answer)
        # Record bytes are pieces of their own, the very bytes read from the log.
        assert any(piece is records[0] for piece in pieces)
        assert any(isinstance(p, memoryview) and p.obj is records[1] for p in pieces)
        frame = b"".join(pieces)
        assert frame == codec.encode_response(FETCH, version, 9, answer)
        (size,) = struct.unpack_from(">i", frame)
        assert size == len(frame) - 4
        header_cls = codec.ResponseHeaderV1 if version >= 12 else codec.ResponseHeaderV0
        header, used = entity_reader(header_cls)(frame, 4)
        assert header.correlation_id == 9
        body, _ = entity_reader(codec.response_class(FETCH, version))(frame, 4 + used)
        (topic,) = body.responses
        # 14,000 bytes: the first partition's two batches, one of the second's, none of the
        # third's.
        assert [bytes(p.records or b"") for p in topic.partitions] == [
            records[0],
            records[1][:4096],
            b"",
        ]
        assert [p.high_watermark for p in topic.partitions] == [50, 50, 50]
