"""The leader-epoch cache rules (docs/protocol.md §13).

Each test names the LeaderEpochFileCache behaviour it pins down; the end-offset table is the
five cases of `endOffsetFor` exactly as docs/protocol.md §13 lists them.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.storage.epoch_cache import EpochCache, EpochEntry
from minibroker.client.types import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET


def test_assign_appends_new_epochs_in_order() -> None:
    cache = EpochCache()
    assert cache.assign(1, 0)
    assert cache.assign(3, 10)
    assert cache.entries == (EpochEntry(1, 0), EpochEntry(3, 10))
    assert cache.latest_epoch == 3
    assert cache.latest_entry == EpochEntry(3, 10)
    assert cache.earliest_entry == EpochEntry(1, 0)


def test_assign_same_epoch_at_later_offset_is_a_no_op() -> None:
    cache = EpochCache([(2, 5)])
    assert not cache.assign(2, 9)
    assert cache.entries == (EpochEntry(2, 5),)


def test_assign_same_epoch_at_smaller_offset_replaces_it() -> None:
    cache = EpochCache([(1, 0), (2, 5)])
    assert cache.assign(2, 3)
    assert cache.entries == (EpochEntry(1, 0), EpochEntry(2, 3))


def test_assign_removes_entries_that_would_break_monotonicity() -> None:
    # A lower epoch at a later offset drops the newer epochs; an entry at or after the new
    # start offset is dropped too (maybeTruncateNonMonotonicEntries).
    cache = EpochCache([(1, 0), (3, 10), (5, 20)])
    assert cache.assign(4, 15)
    assert cache.entries == (EpochEntry(1, 0), EpochEntry(3, 10), EpochEntry(4, 15))
    assert cache.assign(6, 10)
    assert cache.entries == (EpochEntry(1, 0), EpochEntry(6, 10))


def test_assign_rejects_negative_values() -> None:
    cache = EpochCache()
    with pytest.raises(ValueError):
        cache.assign(-1, 0)
    with pytest.raises(ValueError):
        cache.assign(0, -5)
    assert not cache


@pytest.mark.parametrize(
    ("requested", "leo", "expected"),
    [
        (UNDEFINED_EPOCH, 100, (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)),  # undefined epoch
        (6, 100, (6, 100)),  # the latest epoch: its end is the LEO
        (7, 100, (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)),  # newer than anything cached
        (1, 100, (1, 10)),  # below every cached epoch: start of the first one
        (2, 100, (2, 20)),  # an exact older epoch: start of the next epoch
        (3, 100, (2, 20)),  # between epochs: largest <= requested, start of the next
        (4, 100, (4, 30)),
        (5, 100, (4, 30)),
    ],
)
def test_end_offset_for_table(requested: int, leo: int, expected: tuple[int, int]) -> None:
    cache = EpochCache([(2, 10), (4, 20), (6, 30)])
    assert cache.end_offset_for(requested, leo) == expected


def test_end_offset_for_on_empty_cache_is_undefined() -> None:
    assert EpochCache().end_offset_for(3, 50) == (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


def test_truncate_from_end_drops_entries_at_or_after_offset() -> None:
    cache = EpochCache([(1, 0), (2, 10), (3, 20)])
    assert cache.truncate_from_end(20) == [EpochEntry(3, 20)]
    assert cache.entries == (EpochEntry(1, 0), EpochEntry(2, 10))
    # KAFKA-10706: an entry at exactly the LEO is removed even though no record is removed.
    assert cache.truncate_from_end(10) == [EpochEntry(2, 10)]
    assert cache.truncate_from_end(50) == []
    assert cache.entries == (EpochEntry(1, 0),)


def test_truncate_from_start_keeps_the_epoch_of_the_first_remaining_offset() -> None:
    cache = EpochCache([(1, 0), (2, 10), (3, 20)])
    removed = cache.truncate_from_start(15)
    assert removed == [EpochEntry(1, 0), EpochEntry(2, 10)]
    assert cache.entries == (EpochEntry(2, 15), EpochEntry(3, 20))
    # Exclusive: truncating at an entry's own start keeps it unchanged.
    assert cache.truncate_from_start(15) == []
    assert cache.truncate_from_start(5) == []
    assert cache.entries == (EpochEntry(2, 15), EpochEntry(3, 20))


def test_epoch_for_offset() -> None:
    cache = EpochCache([(1, 5), (4, 10)])
    assert cache.epoch_for_offset(4) is None
    assert cache.epoch_for_offset(5) == 1
    assert cache.epoch_for_offset(9) == 1
    assert cache.epoch_for_offset(10) == 4
    assert cache.epoch_for_offset(1000) == 4


def test_clear_reports_whether_anything_was_there() -> None:
    cache = EpochCache([(1, 0)])
    assert cache.clear()
    assert not cache.clear()
    assert cache.latest_epoch is None


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 200)), max_size=30))
def test_entries_stay_strictly_increasing(assignments: list[tuple[int, int]]) -> None:
    cache = EpochCache()
    for epoch, start in assignments:
        cache.assign(epoch, start)
        epochs = [e.epoch for e in cache.entries]
        starts = [e.start_offset for e in cache.entries]
        assert epochs == sorted(set(epochs))
        assert starts == sorted(set(starts))
        # The last assignment is always reflected (or already covered by the latest epoch).
        latest = cache.latest_entry
        assert latest is not None and latest.epoch == epoch and latest.start_offset <= start
