"""The always-on invariant helpers (broker/replication/invariants.py): each rule fires on the
violation it names and stays silent on a healthy state (docs/design.md §8)."""

from __future__ import annotations

import pytest

from minibroker.broker.replication.invariants import (
    check_batches_contiguous,
    check_epoch_cache_matches_batches,
    check_epoch_entries,
    check_isr,
    check_offsets,
)
from minibroker.client.common.invariant import InvariantViolation, invariant


def test_invariant_raises_even_under_optimisation() -> None:
    invariant(True, "fine")
    with pytest.raises(InvariantViolation, match="broken"):
        invariant(False, "broken")


def test_offsets_order() -> None:
    check_offsets(0, 5, 9)
    with pytest.raises(InvariantViolation):
        check_offsets(0, 10, 9)  # HW above LEO
    with pytest.raises(InvariantViolation):
        check_offsets(6, 5, 9)  # log start above HW


def test_isr_rules() -> None:
    check_isr((1, 2, 3), {1, 2}, leader=1)
    check_isr((1, 2, 3), {2}, leader=-1)
    for isr, leader in (({1, 4}, 1), ({2}, 1), (set(), -1)):
        with pytest.raises(InvariantViolation):
            check_isr((1, 2, 3), isr, leader)


def test_epoch_entries_strictly_increase() -> None:
    check_epoch_entries([(1, 0), (3, 10)])
    with pytest.raises(InvariantViolation):
        check_epoch_entries([(1, 0), (3, 0)])
    with pytest.raises(InvariantViolation):
        check_epoch_entries([(3, 0), (2, 10)])


def test_batches_contiguous_and_epochs_non_decreasing() -> None:
    check_batches_contiguous([(0, 4, 1), (5, 5, 1), (6, 9, 2)], 0)
    with pytest.raises(InvariantViolation, match="gap"):
        check_batches_contiguous([(0, 4, 1), (6, 9, 1)], 0)
    with pytest.raises(InvariantViolation, match="epoch"):
        check_batches_contiguous([(0, 4, 2), (5, 9, 1)], 0)


def test_epoch_cache_agrees_with_the_batches() -> None:
    batches = [(0, 4, 1), (5, 9, 3)]
    check_epoch_cache_matches_batches([(1, 0), (3, 5)], batches)
    check_epoch_cache_matches_batches([(1, 0), (3, 5), (4, 10)], batches)  # election entry
    with pytest.raises(InvariantViolation):
        check_epoch_cache_matches_batches([(1, 0), (3, 7)], batches)
    with pytest.raises(InvariantViolation):
        check_epoch_cache_matches_batches([(1, 0)], batches)
