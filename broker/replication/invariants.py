"""Always-on invariant checks for the replication cores and the simulation (docs/design.md §8).

Pure: no I/O. The checks raise through `minibroker.client.common.invariant.invariant` (one
InvariantViolation for the broker and the controller); the core calls it where a broken rule
would corrupt data. The `check_*` functions
state the invariants of docs/design.md §8 over plain values so both the cores and the simulation
checkers (tests/sim) share one definition.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from minibroker.client.common.invariant import invariant


def check_offsets(log_start_offset: int, high_watermark: int, leo: int, where: str = "") -> None:
    """I6/I15: log_start_offset <= high_watermark <= leo."""
    invariant(
        0 <= log_start_offset <= high_watermark <= leo,
        f"{where}offsets out of order: log_start_offset={log_start_offset} "
        f"high_watermark={high_watermark} leo={leo}",
    )


def check_isr(replicas: Sequence[int], isr: Iterable[int], leader: int, where: str = "") -> None:
    """I11: ISR ⊆ replicas, non-empty, and the leader (when there is one) is in it."""
    isr_set = frozenset(isr)
    invariant(bool(isr_set), f"{where}empty ISR")
    invariant(
        isr_set <= frozenset(replicas), f"{where}ISR {sorted(isr_set)} not within {list(replicas)}"
    )
    invariant(
        leader < 0 or leader in isr_set, f"{where}leader {leader} not in ISR {sorted(isr_set)}"
    )


def check_epoch_entries(entries: Sequence[tuple[int, int]], where: str = "") -> None:
    """I8: epoch-cache entries strictly increase in epoch and in start offset."""
    for (e1, s1), (e2, s2) in itertools.pairwise(entries):
        invariant(
            e2 > e1 and s2 > s1,
            f"{where}epoch cache not strictly increasing: ({e1}, {s1}) then ({e2}, {s2})",
        )


def check_batches_contiguous(
    batches: Sequence[tuple[int, int, int]], log_start_offset: int, where: str = ""
) -> None:
    """I8/I9 over (base_offset, last_offset, epoch): contiguous offsets, epochs never decrease."""
    expected = None
    last_epoch = -1
    for base, last, epoch in batches:
        invariant(last >= base, f"{where}batch {base}..{last} has a negative length")
        if expected is not None:
            invariant(base == expected, f"{where}gap or overlap at {base}, expected {expected}")
        invariant(epoch >= last_epoch, f"{where}epoch {epoch} after {last_epoch} at offset {base}")
        expected = last + 1
        last_epoch = epoch
    if batches:
        invariant(
            batches[0][0] <= log_start_offset <= batches[-1][1] + 1,
            f"{where}log start {log_start_offset} outside the first batch {batches[0][0]}..",
        )


def check_epoch_cache_matches_batches(
    entries: Sequence[tuple[int, int]], batches: Sequence[tuple[int, int, int]], where: str = ""
) -> None:
    """I8: the cache holds an entry for every epoch change along the log, at its first offset.

    The cache may hold more (a new leader's entry before its first write, entries for epochs
    whose batches retention removed) but never a start offset that disagrees with the batches.
    """
    starts = dict(entries)
    previous = None
    for i, (base, _last, epoch) in enumerate(batches):
        if epoch != previous:
            start = starts.get(epoch)
            # Retention may have removed the first batches of the oldest epoch in the log.
            ok = start == base or (i == 0 and start is not None and start <= base)
            invariant(ok, f"{where}epoch {epoch} starts at {base} in the log, cache says {start}")
            previous = epoch
