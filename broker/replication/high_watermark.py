"""The leader's high watermark rule, one pure function (Kafka's `maybeIncrementLeaderHW`).

Pure: no state, no I/O. Like etcd's `quorum.CommittedIndex`, the rule takes what the leader
knows about each replica and answers the offset below which every record is committed
(docs/protocol.md §6):

  * The HW is the smallest LEO among the leader and the followers that gate it: every member of
    the maximal ISR (the ISR plus a replica whose expansion is in flight; with a shrink in flight
    the old ISR), and any follower outside it that is caught up and ISR-eligible (otherwise a
    rejoining follower could chase a moving HW forever and never get back in).
  * A follower whose LEO is unknown (-1: it has not fetched since this broker became leader)
    holds the HW where it is, so a new leader never commits on LEOs from an earlier epoch.
  * Strict min ISR (KIP-966 part 1): while the committed ISR is smaller than
    min(min.insync.replicas, replication factor), the HW does not move at any acks level.
  * The HW never moves back: the answer is at least `high_watermark`.

Concurrency contract: a pure function; safe anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class FollowerProgress(NamedTuple):
    """What the HW rule needs of one follower (a plain (leo, in_maximal_isr, caught_up) tuple
    will do: the leader builds one per follower on every append and fetch)."""

    leo: int  # -1: unknown in this leadership
    in_maximal_isr: bool
    # Caught up within replica.lag.time.max.ms and its broker ISR-eligible; only consulted for
    # a follower outside the maximal ISR.
    caught_up: bool


def leader_high_watermark(
    high_watermark: int,
    leader_leo: int,
    isr_size: int,
    effective_min_isr: int,
    followers: Iterable[tuple[int, bool, bool]],
) -> int:
    """The HW the leader may move to now: `high_watermark` itself when it may not advance.
    `followers` are FollowerProgress values (leo, in_maximal_isr, caught_up)."""
    if isr_size < effective_min_isr:
        return high_watermark
    new_hw = leader_leo
    for leo, in_maximal_isr, caught_up in followers:
        if leo < new_hw and (in_maximal_isr or caught_up):
            new_hw = leo
    return max(new_hw, high_watermark)
