"""`OffsetMap`: key -> last offset in a fixed block of memory (Kafka's SkimpyOffsetMap).

Pure: no I/O. The cleaner builds one over the dirty part of a log (offsets ascending, so a later
`put` of a key overwrites the earlier one) and then keeps, in the segments it rewrites, only the
record of each key whose offset the map holds (selection.py's `should_retain_record`).

Memory, as in Kafka: one `bytearray` of `memory` bytes cut into `slots` entries of
`hash_size + 8` bytes, the digest of the key (MD5 by default, 16 bytes) and the offset; it never
grows: 24 bytes per slot with MD5, so 1,000,000 keys at the 0.9 load factor need 26.7 MB. The
digest stands in for the key: two distinct keys with the same digest are the same key to the map
(it trusts the hash, as Kafka's does; with MD5 that takes about 2**64 keys to be likely).

Probing is Kafka's: attempt i reads a 4-byte big-endian integer at byte min(i, hash_size - 4) of
the digest and adds max(0, i - hash_size + 4), modulo `slots`; once the digest's windows are used
up it degrades to linear probing. A digest shorter than 4 bytes (tests) uses its whole length as
the window. There are no deletes; `clear` empties the map for the next round.

Two differences in the bytes, none in behaviour:
  * the block holds the slots' offsets first and their digests after (Kafka interleaves them),
    so offsets are read as 64-bit integers through a memoryview without a bytes object each;
  * the offset is stored plus one, so a slot is free exactly when its offset field is zero
    (Kafka reads an all-zero entry as free, so a zero digest with offset 0 would be lost).

Full: `put` raises `OffsetMapFullError` once every slot is used. The cleaner does not get there:
it stops covering the log once `size` reaches `max_entries` (slots times
`log.cleaner.io.buffer.load.factor`, 0.9), which `full` reports, cleans up to what it covered
(`latest_offset`) and continues from there in the next round, as Kafka's buildOffsetMap does.

Cost, measured on the shared 2-core box (CPython 3.11, MD5, 15-byte keys, 300,000 keys in the
16 MiB default map, load average about 3.8 while measuring): about 2.1 us a `put` of a new key,
1.9 us an overwrite, 1.7 us a `get`, of which 0.4 us is MD5 itself; `clear` of 16 MiB takes
about 30 ms. Filled to the load factor (1,000,000 keys in 26.7 MB) a lookup makes 1.6 extra
probes on average and costs 2 to 3 times as much; the same runs at load average 6.5 gave 2.9 us
a new `put` and 2.2 us a `get` at 43% fill, 4.4 us and 6.3 us at 90%. No C accelerator.

Concurrency contract: single-threaded (owned by one cleaner).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

# Kafka's names and defaults (CleanerConfig.java), not yet wired into the broker's config.
DEDUPE_BUFFER_SIZE_PROP = "log.cleaner.dedupe.buffer.size"
# Kafka: 128 MiB shared by the cleaner threads. minibroker runs several brokers on one small box
# (a local cluster of 3 on 2 cores, each broker with one cleaner) and a Python cleaner covers
# fewer keys per second than Kafka's, so 16 MiB: 699,050 slots, 629,145 keys per cleaning round
# at the 0.9 load factor, 48 MiB for a 3-broker cluster. A round over more distinct keys than
# that cleans what it covered and the next round continues (never wrong, only slower).
DEFAULT_DEDUPE_BUFFER_SIZE = 16 * 1024 * 1024
KAFKA_DEDUPE_BUFFER_SIZE = 128 * 1024 * 1024
DEDUPE_BUFFER_LOAD_FACTOR_PROP = "log.cleaner.io.buffer.load.factor"
DEFAULT_DEDUPE_BUFFER_LOAD_FACTOR = 0.9
DEFAULT_HASH_ALGORITHM = "MD5"

OFFSET_BYTES = 8
_PROBE_WINDOW = 4
_OFFSET_LIMIT = 2**64 - 1  # stored as offset + 1 in an unsigned 8-byte field
_FREE = bytes(OFFSET_BYTES)

HashFunction = Callable[[bytes], bytes]


class OffsetMapFullError(Exception):
    """A `put` into a map whose every slot is used (Kafka: IllegalArgumentException)."""


def digest_function(algorithm: str) -> tuple[HashFunction, int]:
    """The digest of `algorithm` (a hashlib name: "MD5", "SHA-1", "SHA-256", ...) and its size.

    Raises ValueError for a name hashlib does not know.
    """
    name = algorithm.lower().replace("-", "")
    try:
        size = hashlib.new(name).digest_size
    except ValueError as err:
        raise ValueError(f"unknown hash algorithm {algorithm!r}") from err
    constructor = getattr(hashlib, name, None) or functools.partial(hashlib.new, name)

    def digest(key: bytes) -> bytes:
        return constructor(key).digest()

    return digest, size


class OffsetMap:
    """Key -> last offset in `memory` bytes; see the module docstring.

    `hash_function` replaces the digest (tests force collisions with it); its results must all
    have `hash_size` bytes, which is then required too.
    """

    __slots__ = (
        "_buf",
        "_digests",
        "_entries",
        "_hash",
        "_last_window",
        "_latest_offset",
        "_max_attempts",
        "_offsets",
        "_window",
        "bytes_per_entry",
        "hash_size",
        "load_factor",
        "lookups",
        "max_entries",
        "memory",
        "probes",
        "slots",
    )

    def __init__(
        self,
        memory: int = DEFAULT_DEDUPE_BUFFER_SIZE,
        *,
        load_factor: float = DEFAULT_DEDUPE_BUFFER_LOAD_FACTOR,
        hash_algorithm: str = DEFAULT_HASH_ALGORITHM,
        hash_function: HashFunction | None = None,
        hash_size: int | None = None,
    ) -> None:
        if hash_function is None:
            if hash_size is not None:
                raise ValueError("hash_size goes with hash_function")
            hash_function, hash_size = digest_function(hash_algorithm)
        elif hash_size is None or hash_size < 1:
            raise ValueError("a hash_function needs its hash_size (>= 1)")
        if not 0.0 < load_factor <= 1.0:
            raise ValueError(f"load factor {load_factor} not in (0, 1]")
        self.memory = memory
        self.hash_size = hash_size
        self.bytes_per_entry = hash_size + OFFSET_BYTES
        self.slots = memory // self.bytes_per_entry
        self.load_factor = load_factor
        self.max_entries = int(self.slots * load_factor)
        # Kafka's Cleaner requires slots * load factor > 1: a smaller map never makes progress.
        if self.slots * load_factor <= 1:
            raise ValueError(
                f"offset map of {memory} bytes holds {self.slots} entries of "
                f"{self.bytes_per_entry} bytes: too small at load factor {load_factor}"
            )
        self._hash = hash_function
        self._window = min(_PROBE_WINDOW, hash_size)
        self._last_window = hash_size - self._window
        # After the digest's windows, linear probing visits every slot once more at most.
        self._max_attempts = self.slots + self._last_window
        # One block: the slots' offsets (8 bytes each, first so that they are aligned), then
        # their digests. `_offsets` reads and writes the first part as unsigned 64-bit integers
        # (native order: the block never leaves the process), without a bytes object per access.
        self._buf = bytearray(self.slots * self.bytes_per_entry)
        self._offsets = memoryview(self._buf)[: self.slots * OFFSET_BYTES].cast("Q")
        self._digests = self.slots * OFFSET_BYTES
        self._entries = 0
        self._latest_offset = -1
        self.lookups = 0
        self.probes = 0

    @property
    def size(self) -> int:
        """Distinct keys (digests) put since the last `clear`."""
        return self._entries

    @property
    def utilization(self) -> float:
        return self._entries / self.slots

    @property
    def full(self) -> bool:
        """At the load factor: the cleaner stops covering the log here (Kafka's
        `map.size < maxDesiredMapSize` check in buildOffsetMapForSegment)."""
        return self._entries >= self.max_entries

    @property
    def latest_offset(self) -> int:
        """The last offset the map covers: the latest `put` or `update_latest_offset`; -1 when
        empty. Records above it are past this round (should_retain_record keeps them)."""
        return self._latest_offset

    @property
    def collision_rate(self) -> float:
        """Extra probes per lookup since the last `clear` (0.0 with no lookups)."""
        return (self.probes - self.lookups) / self.lookups if self.lookups else 0.0

    def update_latest_offset(self, offset: int) -> None:
        """Cover up to `offset` without a key (the end of a batch or segment past its last key)."""
        self._latest_offset = offset

    def clear(self) -> None:
        """Empty the map (same memory) for the next cleaning round."""
        self._buf[:] = bytes(len(self._buf))
        self._entries = 0
        self._latest_offset = -1
        self.lookups = 0
        self.probes = 0

    def _slot(self, digest: bytes, attempt: int) -> int:
        """Kafka's positionOf: the digest's 4-byte windows, then linear probing."""
        last = self._last_window
        if attempt <= last:
            probe = int.from_bytes(digest[attempt : attempt + self._window], "big")
        else:
            probe = int.from_bytes(digest[last:], "big") + attempt - last
        return probe % self.slots

    def put(self, key: bytes, offset: int) -> None:
        """Map `key` to `offset` (a later put of the same key overwrites it).

        Raises OffsetMapFullError when every slot is used (even for a key already in the map,
        as Kafka's does), ValueError for an offset outside [0, 2**64 - 2].
        """
        if self._entries >= self.slots:
            raise OffsetMapFullError(
                f"offset map full: {self._entries} entries in {self.slots} slots"
            )
        if not 0 <= offset < _OFFSET_LIMIT:
            raise ValueError(f"offset {offset} out of range")
        digest = self._hash(key)
        offsets = self._offsets
        hash_size = self.hash_size
        self.lookups += 1
        # A free slot is always found: at least one is left (checked above).
        slot = int.from_bytes(digest[: self._window], "big") % self.slots  # _slot(digest, 0)
        attempt = 0
        while True:
            self.probes += 1
            at = self._digests + slot * hash_size
            if offsets[slot] == 0:
                self._buf[at : at + hash_size] = digest
                self._entries += 1
                break
            if self._buf.startswith(digest, at, at + hash_size):
                break
            attempt += 1
            slot = self._slot(digest, attempt)
        offsets[slot] = offset + 1
        self._latest_offset = offset

    def get(self, key: bytes) -> int:
        """The offset last put for `key` (or for a key with its digest), -1 when absent."""
        digest = self._hash(key)
        offsets = self._offsets
        hash_size = self.hash_size
        self.lookups += 1
        slot = int.from_bytes(digest[: self._window], "big") % self.slots  # _slot(digest, 0)
        attempt = 0
        while attempt < self._max_attempts:
            self.probes += 1
            stored = offsets[slot]
            if stored == 0:
                return -1
            at = self._digests + slot * hash_size
            if self._buf.startswith(digest, at, at + hash_size):
                return stored - 1
            attempt += 1
            slot = self._slot(digest, attempt)
        return -1
