"""Kafka's default partitioning: murmur2 for keyed records, sticky partitions for null keys.

Pure: no I/O, no clock; randomness comes in as a `random.Random` (any `RandomSource`). Keyed
records land where a Java Kafka producer would put them: `toPositive(Utils.murmur2(key)) %
numPartitions` with Kafka's seed 0x9747b28c (clients/.../common/utils/Utils.java), so a topic
written by both agrees on placement.

Null keys use sticky partitioning (KIP-480): the producer keeps sending to one partition until the
batch there is closed, then picks another one at random. Batches fill up faster than round robin
would fill them, which matters here because each RPC costs far more than the bytes it carries
(docs/design.md §9). Not thread-safe: one producer's event loop owns it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Protocol

from minibroker.client.records import encoder_choice

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2_pure(data: bytes) -> int:
    """Kafka's `Utils.murmur2`: a signed 32-bit hash of `data` (the reference; `murmur2` is the
    compiled one where the encoder module is built)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    length4 = length // 4
    # One struct call for all whole words keeps the per-key Python loop short.
    for k in struct.unpack_from(f"<{length4}I", data):
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    tail = length & 3
    base = length & ~3
    if tail == 3:
        h ^= data[base + 2] << 16
    if tail >= 2:
        h ^= data[base + 1] << 8
    if tail >= 1:
        h ^= data[base]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


murmur2: Callable[[bytes], int] = encoder_choice.murmur2 or murmur2_pure


def to_positive(number: int) -> int:
    """Kafka's `Utils.toPositive`: clear the sign bit (not abs(), which differs for MIN_VALUE)."""
    return number & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's default partitioner picks for a non-null key."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    return to_positive(murmur2(key)) % num_partitions


class RandomSource(Protocol):
    """What the partitioner needs from a `random.Random` (passed in; pure code never seeds)."""

    def randrange(self, stop: int, /) -> int: ...


class StickyPartitioner:
    """Per-topic sticky choice for null-key records (KIP-480).

    `partition(topic, n)` returns the current sticky partition; `on_new_batch(topic, n, prev)` is
    called by the producer when the sticky partition's batch was closed and a new one is needed,
    and moves the stickiness to a different partition (uniformly among the others).
    """

    def __init__(self, rng: RandomSource) -> None:
        self._rng = rng
        self._sticky: dict[str, int] = {}

    def partition(self, topic: str, num_partitions: int) -> int:
        current = self._sticky.get(topic)
        if current is None or current >= num_partitions:
            current = self._rng.randrange(num_partitions)
            self._sticky[topic] = current
        return current

    def on_new_batch(self, topic: str, num_partitions: int, previous: int) -> int:
        """Pick the next sticky partition after `previous`'s batch filled; returns it."""
        if self._sticky.get(topic) != previous:
            # Another record already moved the stickiness on; keep that choice.
            return self.partition(topic, num_partitions)
        if num_partitions == 1:
            chosen = 0
        else:
            chosen = self._rng.randrange(num_partitions - 1)
            if chosen >= previous:
                chosen += 1
        self._sticky[topic] = chosen
        return chosen


def default_partition(
    key: bytes | None, topic: str, num_partitions: int, sticky: StickyPartitioner
) -> int:
    """Kafka's default: murmur2 for keys, the sticky partition for null keys."""
    if key is not None:
        return partition_for_key(key, num_partitions)
    return sticky.partition(topic, num_partitions)
