"""MemLog: one replica's log in memory, for the simulation and the scenario tests.

Real v2 batch bytes (stamped by the client library's `assign_offsets`, parsed by
`iter_batches`), the real EpochCache, and a model of the page cache: `flushed` counts the
leading batches that are durable, and `crash` keeps them and a random part of the rest, the way
a power loss keeps what was fsynced and maybe some of what was not.
"""

from __future__ import annotations

import bisect
import random

from minibroker.broker.replication.events import AppendPlan
from minibroker.broker.storage.epoch_cache import EpochCache
from minibroker.client.batch import BatchHeader, assign_offsets, iter_batches
from minibroker.client.common.invariant import invariant


class MemLog:
    """One replica's log: stamped batch bytes in offset order, an epoch cache, a flush mark.

    `flushed` counts the leading batches that are durable; a crash keeps them and a random
    part of the rest (`crash`). The epoch cache entries are durable on assign (Kafka writes the
    checkpoint synchronously) and trimmed to the log end at recovery (docs/design.md §4.5).
    """

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        self.headers: list[BatchHeader] = []
        self.bases: list[int] = []  # base offsets, for bisect
        self.epoch_cache = EpochCache()
        self.log_start_offset = 0
        self.flushed = 0
        self.hw_checkpoint = 0

    @property
    def leo(self) -> int:
        return self.headers[-1].next_offset if self.headers else self.log_start_offset

    def append(self, data: bytes) -> list[BatchHeader]:
        appended = []
        for pos, header in iter_batches(data):
            invariant(header.base_offset == self.leo, f"append at {header.base_offset} != LEO")
            self.epoch_cache.assign(header.partition_leader_epoch, header.base_offset)
            self.batches.append(bytes(data[pos : pos + header.size]))
            self.headers.append(header)
            self.bases.append(header.base_offset)
            appended.append(header)
        return appended

    def leader_append(self, raw: bytes, plan: AppendPlan) -> list[BatchHeader]:
        buf = bytearray(raw)
        batches = list(iter_batches(buf))
        next_offset = assign_offsets(buf, batches, plan.base_offset, plan.leader_epoch)
        invariant(next_offset == plan.next_offset, "plan and stamped offsets disagree")
        return self.append(bytes(buf))

    def index_of(self, offset: int) -> int:
        """Index of the batch holding `offset`, or len(batches) when none does."""
        i = bisect.bisect_right(self.bases, offset) - 1
        if i < 0:
            return 0 if self.headers else len(self.headers)
        return i if self.headers[i].last_offset >= offset else i + 1

    def batch_at(self, base_offset: int) -> bytes | None:
        """The batch whose base offset is `base_offset`, if there is one."""
        i = bisect.bisect_left(self.bases, base_offset)
        if i < len(self.bases) and self.bases[i] == base_offset:
            return self.batches[i]
        return None

    def read(self, start: int, until: int, max_bytes: int = 1 << 20) -> bytes:
        """Whole batches from the one holding `start`, ending at or below `until`."""
        out: list[bytes] = []
        size = 0
        for i in range(self.index_of(start), len(self.headers)):
            header = self.headers[i]
            if header.next_offset > until:
                break
            if out and size + header.size > max_bytes:
                break
            out.append(self.batches[i])
            size += header.size
        return b"".join(out)

    def truncate_to(self, offset: int) -> None:
        keep = self.index_of(offset)
        del self.batches[keep:]
        del self.headers[keep:]
        del self.bases[keep:]
        self.flushed = min(self.flushed, len(self.batches))
        self.epoch_cache.truncate_from_end(min(offset, self.leo))

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.batches.clear()
        self.headers.clear()
        self.bases.clear()
        self.flushed = 0
        self.epoch_cache.clear()
        self.log_start_offset = offset

    def flush(self, high_watermark: int) -> None:
        self.flushed = len(self.batches)
        self.hw_checkpoint = high_watermark

    def crash(self, rng: random.Random) -> None:
        """Power loss: keep the flushed batches and a random prefix of the unflushed ones."""
        keep = rng.randint(self.flushed, len(self.batches))
        del self.batches[keep:]
        del self.headers[keep:]
        del self.bases[keep:]
        self.flushed = keep
        self.epoch_cache.truncate_from_end(self.leo)

    def triples(self) -> list[tuple[int, int, int]]:
        return [(h.base_offset, h.last_offset, h.partition_leader_epoch) for h in self.headers]
