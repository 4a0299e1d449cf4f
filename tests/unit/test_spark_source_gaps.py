"""The Spark source's range read over a compacted log (issue 21): a range whose end falls in
a gap, or past records removed from a batch, is done once the consumer's position reaches the
end; it never waits pollTimeoutMs for a record at end - 1 that no longer exists.

The consumer here is the client's own position bookkeeping (SubscriptionState and
completed_fetch.decode_into) over a log of cleaned batches held in memory, answering fetches as
the broker does (whole batches from the one holding the fetch offset, below the HW)."""

from __future__ import annotations

import time

import pytest
from gapped_batches import cleaned_batch

from minibroker.client.batch import read_header
from minibroker.client.completed_fetch import decode_into
from minibroker.client.spark.cluster import _read_range
from minibroker.client.spark.options import OffsetRange, parse_source_options
from minibroker.client.subscription import SubscriptionState
from minibroker.client.types import Record, TopicPartition

TP = TopicPartition("changes", 0)
OPTIONS = parse_source_options(
    {
        "kafka.bootstrap.servers": "h:1",
        "subscribe": "changes",
        "kafkaConsumer.pollTimeoutMs": "3000",
    },
    streaming=False,
)
# A compacted log: records at 0, 2 (batch 0..4), none in batch 5..7, 11 (batch 10..14);
# offsets 8..9 are a gap between batches.
LOG = [
    cleaned_batch(0, [(0, b"a", b"1"), (2, b"b", b"2")], 4),
    cleaned_batch(5, [], 7),
    cleaned_batch(10, [(11, b"c", b"3")], 14),
]
HW = 15


class GappedConsumer:
    """What `_read_range` uses of the sync Consumer, over `LOG`."""

    def __init__(self, max_records: int = 1) -> None:
        self.subs = SubscriptionState(None)
        self.max_records = max_records
        self.polls = 0

    def assign(self, tps: list[TopicPartition]) -> None:
        self.subs.assign(tps)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.subs.states[tp].seek(offset)

    def position(self, tp: TopicPartition) -> int:
        position = self.subs.states[tp].position
        assert position is not None
        return position

    def poll(self, timeout_ms: int = 0) -> list[Record]:
        self.polls += 1
        state = self.subs.states[TP]
        if not state.buffer:
            served = [b for b in LOG if read_header(b).last_offset >= state.fetch_offset]
            served = [b for b in served if read_header(b).last_offset < HW]
            if served:
                decode_into(state, b"".join(served[:1]), 1 << 20)
        return self.subs.drain(self.max_records)

    def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {TP: HW}

    def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {TP: 0}


def read(start: int, end: int, max_records: int = 1) -> list[int]:
    consumer = GappedConsumer(max_records)
    began = time.monotonic()
    offsets = [
        r.offset
        for chunk in _read_range(consumer, OPTIONS, TP, OffsetRange(TP.topic, 0, start, end))  # type: ignore[arg-type]
        for r in chunk
    ]
    # Done on the position, well before pollTimeoutMs could pass.
    assert (time.monotonic() - began) * 1000 < OPTIONS.poll_timeout_ms
    return offsets


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (0, 15, [0, 2, 11]),
        (0, 4, [0, 2]),  # ends past the batch's last record (3 was removed)
        (0, 9, [0, 2]),  # ends in the gap between batches
        (3, 8, []),  # nothing but removed offsets and an empty batch
        (6, 13, [11]),
        (12, 15, []),  # past the last record of the last batch
    ],
)
def test_a_range_ending_where_no_record_is_finishes(
    start: int, end: int, expected: list[int]
) -> None:
    assert read(start, end) == expected
    assert read(start, end, max_records=10) == expected
