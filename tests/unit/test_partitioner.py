"""Kafka's default partitioner: murmur2 placement and sticky null-key partitioning (KIP-480).

Keys must land where a Java Kafka producer puts them; the reference values come from Kafka's
UtilsTest.testMurmur2 and, for many more keys, from kafka-python's independent implementation.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2 as kafka_python_murmur2

from minibroker.client.partitioner import (
    StickyPartitioner,
    default_partition,
    murmur2,
    murmur2_pure,
    partition_for_key,
    to_positive,
)
from minibroker.client.records._encoder import murmur2 as murmur2_compiled

# clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java: testMurmur2
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_murmur2_matches_kafka_java_vectors() -> None:
    assert murmur2 is murmur2_compiled, "the producer places keys with the compiled hash"
    for key, expected in KAFKA_VECTORS.items():
        assert murmur2(key) == expected, key
        assert murmur2_pure(key) == expected, key


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=100))
def test_the_compiled_murmur2_equals_the_pure_one(key: bytes) -> None:
    assert murmur2_compiled(key) == murmur2_pure(key)


def test_murmur2_matches_kafka_python_for_every_length_up_to_64() -> None:
    rng = random.Random(7)
    for length in range(65):
        for _ in range(20):
            key = bytes(rng.randrange(256) for _ in range(length))
            assert to_positive(murmur2(key)) == kafka_python_murmur2(key) & 0x7FFFFFFF, key


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(min_value=1, max_value=1000))
def test_partition_for_key_matches_kafka_python(key: bytes, partitions: int) -> None:
    expected = (kafka_python_murmur2(key) & 0x7FFFFFFF) % partitions
    assert partition_for_key(key, partitions) == expected


def test_to_positive_clears_the_sign_bit_like_kafka() -> None:
    # Not abs(): Kafka maps Integer.MIN_VALUE to 0 and -1 to Integer.MAX_VALUE.
    assert to_positive(-(2**31)) == 0
    assert to_positive(-1) == 2**31 - 1
    assert to_positive(5) == 5


def test_sticky_partition_holds_until_a_new_batch_then_moves() -> None:
    sticky = StickyPartitioner(random.Random(1))
    first = sticky.partition("t", 6)
    assert all(sticky.partition("t", 6) == first for _ in range(50))
    seen = {first}
    current = first
    for _ in range(200):
        nxt = sticky.on_new_batch("t", 6, current)
        assert nxt != current, "a new batch must move to another partition"
        assert 0 <= nxt < 6
        assert sticky.partition("t", 6) == nxt
        seen.add(nxt)
        current = nxt
    assert seen == set(range(6)), "every partition gets batches over time"


def test_sticky_on_new_batch_for_a_stale_partition_keeps_the_current_choice() -> None:
    sticky = StickyPartitioner(random.Random(3))
    current = sticky.partition("t", 4)
    other = (current + 1) % 4
    assert sticky.on_new_batch("t", 4, other) == current


def test_sticky_single_partition_and_shrunk_topic() -> None:
    sticky = StickyPartitioner(random.Random(0))
    assert sticky.on_new_batch("one", 1, 0) == 0
    sticky._sticky["t"] = 9
    assert 0 <= sticky.partition("t", 3) < 3


def test_default_partition_uses_murmur2_for_keys_and_sticky_for_none() -> None:
    sticky = StickyPartitioner(random.Random(2))
    assert default_partition(b"21", "t", 10, sticky) == to_positive(-973932308) % 10
    assert default_partition(None, "t", 10, sticky) == sticky.partition("t", 10)
