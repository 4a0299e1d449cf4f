"""The bounds walk that runs before kio reads a request (broker/kafka/bounds.py).

kio's native reader sizes a list from the count on the wire before reading it, so a 20-byte
request with an array count of 2^32 aborted the whole broker process ("memory allocation of
34359738352 bytes failed"). Each case below is a request whose length or count runs past its
end: parse_request must refuse it with KafkaProtocolError (the listener then closes that
connection), in this process, without kio ever reading it (without the walk the first case
kills the interpreter with SIGABRT wherever the allocation cannot be made).
"""

from __future__ import annotations

import struct

import pytest

from minibroker.broker.kafka import codec
from minibroker.broker.kafka.bounds import BoundsError, check_request
from minibroker.broker.kafka.handlers import SUPPORTED

METADATA, PRODUCE, FETCH = 3, 0, 1


def header(api_key: int, version: int, flexible: bool) -> bytes:
    head = struct.pack(">hhih", api_key, version, 7, 0)  # empty client id
    return head + (b"\x00" if flexible else b"")  # v2: no tagged fields


BOMBS = {
    # Metadata v12 (flexible): topics = compact array of 2^32 - 2 entries, 4 bytes follow.
    "compact array count": header(METADATA, 12, True) + b"\xff\xff\xff\xff\x0f" + b"\x00" * 4,
    # Metadata v1 (legacy): topics = int32 array of 2^31 - 1 entries.
    "legacy array count": header(METADATA, 1, False) + struct.pack(">i", 2**31 - 1) + b"\x00" * 8,
    # Metadata v12: one topic whose name claims 1,000 bytes.
    "string length": header(METADATA, 12, True)
    + b"\x02"  # 1 topic
    + b"\x00" * 16  # topic id
    + b"\xe9\x07"  # compact string length 1000 + 1
    + b"abc",
    # Metadata v12: a struct tagged field claiming 1 MiB.
    "tagged field size": header(METADATA, 12, True)
    + b"\x01"  # 0 topics
    + b"\x00\x00"  # allow_auto_topic_creation, include_topic_authorized_operations
    + b"\x01"  # one tagged field
    + b"\x05"  # tag 5
    + b"\x80\x80\x40",  # size 2^20
    # A varint of six bytes.
    "long varint": header(METADATA, 12, True) + b"\xff" * 6,
    # Produce v3 (legacy): the records of one partition claim 2^31 - 1 bytes.
    "records length": header(PRODUCE, 3, False)
    + struct.pack(">h", -1)  # transactional id: null
    + struct.pack(">hi", -1, 1000)  # acks, timeout
    + struct.pack(">i", 1)  # 1 topic
    + struct.pack(">h", 1)
    + b"t"
    + struct.pack(">i", 1)  # 1 partition
    + struct.pack(">i", 0)  # index
    + struct.pack(">i", 2**31 - 1)
    + b"\x00" * 10,
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_a_length_past_the_end_is_refused_before_kio_reads_it(name: str) -> None:
    frame = BOMBS[name]
    with pytest.raises(codec.KafkaProtocolError, match="malformed"):
        codec.parse_request(frame, SUPPORTED)


def test_a_request_that_fits_passes_the_walk_and_parses() -> None:
    # Metadata v12 with one topic named "abc" (compact string), no tagged fields.
    frame = (
        header(METADATA, 12, True)
        + b"\x02"
        + b"\x00" * 16
        + b"\x04abc"
        + b"\x00"  # the topic's tagged fields
        + b"\x01\x00"  # allow_auto_topic_creation, include_topic_authorized_operations
        + b"\x00"
    )
    request = codec.parse_request(frame, SUPPORTED)
    assert [t.name for t in request.body.topics] == ["abc"]
    cls = codec.request_class(METADATA, 12)
    check_request(frame, cls, True)
    with pytest.raises(BoundsError):
        check_request(frame[:-3], cls, True)
