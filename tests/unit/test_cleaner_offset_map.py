"""OffsetMap (broker/cleaner/offset_map.py): Kafka's SkimpyOffsetMap in a bytearray.

Mirrors Kafka's OffsetMapTest (basic, clear, get when full, latest offset, utilization) and adds
collisions (a digest shared by two keys, and distinct digests probing past each other), the load
factor, bounded memory and the probe sequence."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minibroker.broker.cleaner.offset_map import (
    DEFAULT_DEDUPE_BUFFER_LOAD_FACTOR,
    DEFAULT_DEDUPE_BUFFER_SIZE,
    OffsetMap,
    OffsetMapFullError,
    digest_function,
)

MEMORY = 4096


def key(i: int) -> bytes:
    return str(i).encode()


def fill(m: OffsetMap, start: int = 37) -> int:
    """Put keys start, start+1, ... (offset = the key's number) until every slot is used."""
    i = start
    while m.size < m.slots:
        m.put(key(i), i)
        i += 1
    return i


@pytest.mark.parametrize("items", [10, 100, 1000, 5000])
def test_every_key_put_is_found(items: int) -> None:
    m = OffsetMap(items * 48)
    for i in range(items):
        m.put(key(i), i)
    assert [m.get(key(i)) for i in range(items)] == list(range(items))
    assert m.size == items


def test_later_put_overwrites_and_size_counts_distinct_keys() -> None:
    m = OffsetMap(MEMORY)
    m.put(b"k", 3)
    m.put(b"k", 9)
    m.put(b"j", 10)
    assert m.get(b"k") == 9
    assert m.size == 2
    assert m.get(b"absent") == -1


def test_offset_zero_is_an_entry_not_a_free_slot() -> None:
    m = OffsetMap(MEMORY)
    m.put(b"k", 0)
    assert m.get(b"k") == 0
    assert m.size == 1
    m.put(b"k", 0)
    assert m.size == 1


def test_all_zero_digest_and_offset_zero_is_still_found() -> None:
    # Kafka's map would read this entry as a free slot; here the offset field tells them apart.
    m = OffsetMap(MEMORY, hash_function=lambda k: bytes(16), hash_size=16)
    m.put(b"k", 0)
    assert m.get(b"k") == 0
    assert m.size == 1


def test_clear_forgets_every_key() -> None:
    m = OffsetMap(MEMORY)
    for i in range(10):
        m.put(key(i), i)
    m.get(key(3))
    m.clear()
    assert [m.get(key(i)) for i in range(10)] == [-1] * 10
    assert (m.size, m.latest_offset, m.utilization) == (0, -1, 0.0)
    m.put(key(1), 5)
    assert m.get(key(1)) == 5


def test_get_when_full() -> None:
    m = OffsetMap(MEMORY)
    i = fill(m)
    assert m.get(key(i)) == -1  # probes every slot, finds none free, stops
    assert m.get(key(i - 1)) == i - 1


def test_put_into_a_full_map_raises_even_for_a_known_key() -> None:
    m = OffsetMap(MEMORY)
    i = fill(m)
    with pytest.raises(OffsetMapFullError):
        m.put(key(i), i)
    with pytest.raises(OffsetMapFullError):
        m.put(key(i - 1), i)  # Kafka's check comes before the lookup
    assert m.get(key(i - 1)) == i - 1


def test_latest_offset_and_update_latest_offset() -> None:
    m = OffsetMap(MEMORY)
    assert m.latest_offset == -1
    i = fill(m)
    assert m.latest_offset == i - 1
    m.update_latest_offset(40)
    assert m.latest_offset == 40
    assert m.get(key(40)) == 40  # entries are unchanged


def test_utilization_is_size_over_slots() -> None:
    m = OffsetMap(MEMORY)
    assert m.utilization == 0.0
    i = 37
    while m.size < m.slots:
        m.put(key(i), i)
        assert m.utilization == m.size / m.slots
        i += 1
    assert m.utilization == 1.0


def test_full_at_the_load_factor() -> None:
    m = OffsetMap(MEMORY, load_factor=0.5)
    assert m.max_entries == int(m.slots * 0.5)
    i = 0
    while not m.full:
        m.put(key(i), i)
        i += 1
    assert m.size == m.max_entries
    assert m.size < m.slots  # the map could hold more; the cleaner stops here


def test_full_is_false_just_below_the_load_factor() -> None:
    m = OffsetMap(MEMORY)
    for i in range(m.max_entries - 1):
        m.put(key(i), i)
    assert not m.full
    m.put(key(m.max_entries - 1), 0)
    assert m.full


def test_default_sizes_are_kafkas_shape() -> None:
    m = OffsetMap(MEMORY)
    assert (m.hash_size, m.bytes_per_entry) == (16, 24)  # MD5 + 8-byte offset
    assert m.slots == MEMORY // 24
    assert DEFAULT_DEDUPE_BUFFER_LOAD_FACTOR == 0.9
    assert DEFAULT_DEDUPE_BUFFER_SIZE == 16 * 1024 * 1024


def test_memory_is_bounded_by_the_buffer_whatever_the_keys() -> None:
    m = OffsetMap(MEMORY)
    buffer = m._buf
    for i in range(m.slots):
        m.put(hashlib.sha256(key(i)).digest() * 100, i)  # 3.2 kB keys: only digests are kept
    assert m._buf is buffer
    assert len(m._buf) == m.slots * m.bytes_per_entry <= MEMORY
    m.clear()
    assert m._buf is buffer


def test_other_digests() -> None:
    m = OffsetMap(MEMORY, hash_algorithm="SHA-256")
    assert (m.hash_size, m.slots) == (32, MEMORY // 40)
    m.put(b"k", 7)
    assert m.get(b"k") == 7
    assert digest_function("SHA-1")[1] == 20
    with pytest.raises(ValueError, match="unknown hash"):
        OffsetMap(MEMORY, hash_algorithm="no-such-digest")


def test_a_map_that_cannot_make_progress_is_refused() -> None:
    # Kafka's Cleaner: require(slots * load factor > 1).
    with pytest.raises(ValueError, match="too small"):
        OffsetMap(23)
    with pytest.raises(ValueError, match="too small"):
        OffsetMap(24, load_factor=1.0)  # 1 slot * 1.0 is not > 1
    with pytest.raises(ValueError, match="too small"):
        OffsetMap(48, load_factor=0.5)  # 2 slots * 0.5 is not > 1
    assert OffsetMap(48).max_entries == 1  # 2 slots * 0.9


def test_bad_offsets_and_arguments_are_refused() -> None:
    m = OffsetMap(MEMORY)
    with pytest.raises(ValueError):
        m.put(b"k", -1)
    with pytest.raises(ValueError):
        OffsetMap(MEMORY, load_factor=0.0)
    with pytest.raises(ValueError):
        OffsetMap(MEMORY, hash_function=lambda k: k)  # no hash_size
    with pytest.raises(ValueError):
        OffsetMap(MEMORY, hash_size=4)  # hash_size without a hash_function


# --- Collisions ----------------------------------------------------------------------------------


def test_keys_with_the_same_digest_are_one_key() -> None:
    # The map trusts the hash, as Kafka's does: a later key with an earlier key's digest
    # overwrites it, and get() of either answers the latest offset.
    m = OffsetMap(MEMORY, hash_function=lambda k: k[:1].ljust(4, b"\0"), hash_size=4)
    m.put(b"apple", 1)
    m.put(b"avocado", 2)
    assert m.size == 1
    assert m.get(b"apple") == 2
    assert m.get(b"anything starting with a") == 2
    assert m.get(b"banana") == -1


def test_distinct_digests_in_one_slot_probe_past_each_other() -> None:
    # Every digest starts with the same 4 bytes: all keys want slot 0 first, then the next
    # windows of their digests, then linear probing. Each keeps its own offset.
    def same_first_window(k: bytes) -> bytes:
        return b"\0\0\0\0" + hashlib.md5(k).digest()[:4]

    m = OffsetMap(24 * 12, hash_function=same_first_window, hash_size=8)
    for i in range(m.slots):
        m.put(key(i), 100 + i)
    assert m.size == m.slots
    assert [m.get(key(i)) for i in range(m.slots)] == [100 + i for i in range(m.slots)]
    assert m.collision_rate > 0
    assert m.get(key(m.slots)) == -1


def test_tiny_digest_forces_probing_through_the_whole_table() -> None:
    # A 1-byte digest: 256 distinct digests, a 10-slot table; probing degrades to linear at once.
    m = OffsetMap(9 * 10, hash_function=lambda k: bytes([k[0]]), hash_size=1)
    assert m.slots == 10
    for i in range(10):
        m.put(bytes([i * 10]), i)  # all of 0, 10, 20, ... are 0 mod 10: one home slot
    assert [m.get(bytes([i * 10])) for i in range(10)] == list(range(10))
    assert m.get(bytes([200])) == -1
    assert m.get(bytes([201])) == -1


def test_get_probes_every_slot_of_a_full_map() -> None:
    # Kafka's maxAttempts = slots + hash_size - 4: the digest's windows, then a linear pass over
    # every other slot. The last key's windows all point at slot 0 and its entry sits in the
    # last slot the linear pass reaches.
    digests = {key(i): i.to_bytes(4, "big") + b"\1\1\1\1" for i in range(9)}
    digests[b"last"] = bytes(8)
    m = OffsetMap(16 * 10, hash_function=digests.__getitem__, hash_size=8)
    assert m.slots == 10
    for i in range(9):
        m.put(key(i), i)
    m.put(b"last", 99)
    assert m.get(b"last") == 99
    assert [m.get(key(i)) for i in range(9)] == list(range(9))


def test_probe_sequence_is_kafkas() -> None:
    # Attempt i reads the 4-byte window at min(i, hash_size - 4), plus max(0, i - hash_size + 4).
    m = OffsetMap(24 * 1000)
    digest = bytes(range(1, 17))
    window = [int.from_bytes(digest[i : i + 4], "big") for i in range(13)]
    assert [m._slot(digest, i) for i in range(13)] == [w % 1000 for w in window]
    assert m._slot(digest, 14) == (window[12] + 2) % 1000


@given(
    st.lists(
        st.tuples(st.binary(min_size=0, max_size=3), st.integers(0, 2**40)),
        max_size=60,
    ),
    st.sampled_from([1, 2, 4]),
)
def test_agrees_with_a_dict_of_digests(puts: list[tuple[bytes, int]], hash_size: int) -> None:
    # With a short digest collisions are frequent: the map must answer what a dict keyed by the
    # digest answers, for every key, at any fill.
    def h(k: bytes) -> bytes:
        return hashlib.md5(k).digest()[:hash_size]

    m = OffsetMap((hash_size + 8) * 64, hash_function=h, hash_size=hash_size)
    model: dict[bytes, int] = {}
    for k, offset in puts:
        m.put(k, offset)
        model[h(k)] = offset
    assert m.size == len(model)
    for k, _ in puts:
        assert m.get(k) == model[h(k)]
    assert m.get(b"not-put-0123") == model.get(h(b"not-put-0123"), -1)
