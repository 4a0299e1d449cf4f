"""The leader's HW rule (broker/replication/high_watermark.py), table-tested like etcd's
`quorum.CommittedIndex`: a table of cases, then a hypothesis property against a second, sort-based
formulation of the same rule (docs/protocol.md §6)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minibroker.broker.replication.high_watermark import FollowerProgress, leader_high_watermark

F = FollowerProgress
IN_ISR = True
OUT = False


@pytest.mark.parametrize(
    ("hw", "leo", "isr_size", "min_isr", "followers", "expected", "why"),
    [
        (0, 10, 1, 1, [], 10, "a leader alone commits its LEO"),
        (0, 10, 3, 2, [F(10, IN_ISR, True), F(10, IN_ISR, True)], 10, "everyone caught up"),
        (0, 10, 3, 2, [F(10, IN_ISR, True), F(4, IN_ISR, True)], 4, "the slowest ISR member"),
        (0, 10, 3, 2, [F(7, IN_ISR, False), F(9, IN_ISR, False)], 7, "lagging members still gate"),
        (0, 10, 2, 2, [F(10, IN_ISR, True), F(3, OUT, False)], 10, "a lagging outsider does not"),
        (0, 10, 2, 2, [F(10, IN_ISR, True), F(6, OUT, True)], 6, "a caught-up outsider does"),
        (5, 10, 3, 2, [F(10, IN_ISR, True), F(-1, IN_ISR, True)], 5, "unknown LEO holds the HW"),
        (0, 10, 3, 2, [F(-1, OUT, False), F(10, IN_ISR, True)], 10, "unknown outsider: no"),
        (8, 10, 3, 2, [F(10, IN_ISR, True), F(6, IN_ISR, True)], 8, "never moves back"),
        (8, 10, 1, 2, [F(10, IN_ISR, True)], 8, "strict min ISR: ISR 1 < 2, no advance"),
        (0, 10, 1, 1, [F(2, OUT, False)], 10, "ISR of one meets min ISR 1"),
        (0, 10, 2, 2, [F(10, IN_ISR, True), F(10, IN_ISR, True)], 10, "min ISR met exactly"),
        (4, 4, 3, 2, [F(4, IN_ISR, True), F(4, IN_ISR, True)], 4, "nothing new: stays"),
        (0, 0, 3, 1, [F(0, IN_ISR, True), F(-1, IN_ISR, True)], 0, "empty log"),
        (0, 10, 3, 2, [F(12, IN_ISR, True), F(11, IN_ISR, True)], 10, "capped at the leader LEO"),
    ],
)
def test_high_watermark_table(
    hw: int,
    leo: int,
    isr_size: int,
    min_isr: int,
    followers: list[FollowerProgress],
    expected: int,
    why: str,
) -> None:
    assert leader_high_watermark(hw, leo, isr_size, min_isr, followers) == expected, why


def _sorted_rule(
    hw: int, leo: int, isr_size: int, min_isr: int, followers: list[FollowerProgress]
) -> int:
    """The rule stated the other way round: the largest offset <= the leader's LEO that every
    gating follower has reached, if the ISR is large enough and it is above the current HW."""
    if isr_size < min_isr:
        return hw
    gating = sorted(f.leo for f in followers if f.in_maximal_isr or f.caught_up)
    candidates = [leo, *(o for o in gating if o <= leo)]
    reached = [c for c in candidates if all(o >= c for o in gating)]
    return max([hw, *reached])


followers_st = st.lists(
    st.builds(
        FollowerProgress,
        leo=st.integers(min_value=-1, max_value=40),
        in_maximal_isr=st.booleans(),
        caught_up=st.booleans(),
    ),
    max_size=5,
)


@given(
    hw=st.integers(min_value=0, max_value=40),
    extra=st.integers(min_value=0, max_value=40),
    isr_size=st.integers(min_value=0, max_value=6),
    min_isr=st.integers(min_value=1, max_value=4),
    followers=followers_st,
)
def test_high_watermark_property(
    hw: int, extra: int, isr_size: int, min_isr: int, followers: list[FollowerProgress]
) -> None:
    leo = hw + extra  # the HW is never above the leader's LEO
    new_hw = leader_high_watermark(hw, leo, isr_size, min_isr, followers)
    assert new_hw == _sorted_rule(hw, leo, isr_size, min_isr, followers)
    assert hw <= new_hw <= leo
    if new_hw > hw:
        assert isr_size >= min_isr
        assert all(f.leo >= new_hw for f in followers if f.in_maximal_isr or f.caught_up)
