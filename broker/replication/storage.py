"""The storage a hosted partition replica runs over, as the replica engine sees it.

Pure typing: `Storage` is one partition's log as the engine (engine.py, hosted.py) uses it, with
`AppendResult` and `ReadResult` the shapes its appends and reads hand back. Nothing here imports
a log: the logs satisfy the protocols structurally (tests/unit/test_replication_storage.py
checks both).

Concurrency contract: none here; a Storage is called from its engine's one thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from minibroker.broker.storage.epoch_cache import EpochCache
from minibroker.client.batch import BatchHeader


class AppendResult(Protocol):
    """What an append wrote (PartitionLog's AppendInfo)."""

    @property
    def first_offset(self) -> int: ...
    @property
    def batches(self) -> Sequence[BatchHeader]: ...
    @property
    def log_append_time_ms(self) -> int: ...
    @property
    def valid_bytes(self) -> int: ...


class ReadResult(Protocol):
    @property
    def records(self) -> bytes: ...


class Storage(Protocol):
    """One partition's log as the engine uses it. `PartitionLog` (broker/storage/log.py) and the
    simulation's in-memory log (tests/sim/memlog.py) satisfy it structurally. A failed call
    raises; a log-dir failure (`is_log_dir_failure`) takes the dir offline. The log does not
    hold the high watermark: the core does."""

    @property
    def leo(self) -> int: ...
    @property
    def log_start_offset(self) -> int: ...
    @property
    def epoch_cache(self) -> EpochCache: ...
    @property
    def may_have_gaps(self) -> bool: ...

    def maybe_assign_epoch_start_offset(self, leader_epoch: int, start_offset: int, /) -> bool: ...

    def append_as_leader(
        self,
        records: bytes,
        leader_epoch: int,
        now_ms: int,
        /,
        *,
        validated: list[tuple[int, BatchHeader]] | None = ...,
    ) -> AppendResult: ...

    def append_as_follower(self, records: bytes, /) -> AppendResult: ...
    def truncate_to(self, offset: int, /) -> bool: ...
    def truncate_fully_and_start_at(self, offset: int, /) -> None: ...
    def maybe_increment_log_start_offset(self, offset: int, /) -> bool: ...
    def read(self, offset: int, max_bytes: int, /, *, max_offset: int) -> ReadResult: ...
    def offset_for_timestamp(self, timestamp: int, /) -> tuple[int, int] | None: ...
    def producer_batch_headers(self) -> list[BatchHeader]: ...
