"""MemLog behaves as PartitionLog does, through the engine's Storage protocol.

The simulation checks the product's engine over MemLog, so a MemLog that differs from the
product's log (the way the simulation's old interpreter differed from the broker's) would
check a system that does not run. Here one random sequence of Storage calls goes to both, a
PartitionLog on disk and a MemLog, and after every call their answers and their state agree:
LEO, log start, epoch cache, and the bytes a read from the log start returns.
"""

from __future__ import annotations

import pathlib
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st
from memlog import MemLog

from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.log import PartitionLog
from minibroker.client.batch import assign_offsets, iter_batches
from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.errors import MiniBrokerError
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition

TP = TopicPartition("memlog", 0)
# One time for every call: PartitionLog rolls a segment by segment.ms, reads stay in one
# segment, and MemLog has no segments.
NOW_MS = wall_clock_ms()

# (kind, a, b): an operation with two small random arguments, scaled to the log's offsets.
operations = st.lists(
    st.tuples(
        st.sampled_from(
            ["leader", "follower", "truncate", "truncate_fully", "log_start", "assign", "read"]
        ),
        st.integers(0, 3),
        st.floats(0.0, 1.2),
    ),
    max_size=40,
)


def _batches(count: int, base_offset: int, epoch: int) -> bytes:
    """`count` + 1 one-record batches stamped from `base_offset` in `epoch` (a leader's; a
    follower append of count 3 starts one past the LEO, which both must refuse)."""
    raw = bytearray(
        b"".join(
            encode_batch([(0, None, f"v{base_offset + i}".encode(), ())]) for i in range(count + 1)
        )
    )
    assign_offsets(raw, list(iter_batches(raw)), base_offset, epoch)
    return bytes(raw)


def _step(log: MemLog | PartitionLog, kind: str, small: int, at: int, epoch: int) -> object:
    """One Storage call on `log`; its answer, or the error it raised."""
    leo = log.leo
    try:
        if kind == "leader":
            raw = encode_batch([(0, None, b"x", ())] * (small + 1))
            return log.append_as_leader(raw, epoch, NOW_MS).first_offset
        if kind == "follower":
            return [
                h.base_offset
                for h in log.append_as_follower(_batches(small, leo + (small == 3), epoch)).batches
            ]
        if kind == "truncate":
            return log.truncate_to(at)
        if kind == "truncate_fully":
            return log.truncate_fully_and_start_at(at + small)
        if kind == "log_start":
            return log.maybe_increment_log_start_offset(at)
        if kind == "assign":
            return log.maybe_assign_epoch_start_offset(epoch, leo)
        return bytes(log.read(at, 40 * small, max_offset=leo).records)
    except MiniBrokerError as err:
        return type(err).__name__


def _state(log: MemLog | PartitionLog) -> tuple[object, ...]:
    start = log.log_start_offset
    read = log.read(start, 1 << 20, max_offset=log.leo).records if start < log.leo else b""
    return (log.leo, start, log.epoch_cache.entries, bytes(read))


@settings(max_examples=80, deadline=None)
@given(operations)
def test_memlog_answers_and_ends_as_partition_log_does(ops: list[tuple[str, int, float]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        disk = PartitionLog.open(pathlib.Path(tmp) / "memlog-0", TP, LogConfig(), now_ms=NOW_MS)
        mem = MemLog()
        epoch = 0
        try:
            for kind, small, fraction in ops:
                if kind in ("leader", "follower", "assign"):
                    epoch += small % 2
                at = int(fraction * mem.leo)
                on_disk = _step(disk, kind, small, at, epoch)
                in_memory = _step(mem, kind, small, at, epoch)
                assert in_memory == on_disk, (kind, small, at)
                assert _state(mem) == _state(disk), (kind, small, at)
        finally:
            disk.close()
