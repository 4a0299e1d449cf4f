"""The simulation's virtual time and network (the deterministic core of tests/sim).

`Scheduler` is a virtual clock and an event queue: an event is a callable due at an integer
`now_ms`; events due at the same time run in the order they were scheduled. Nothing here
sleeps, so a run of simulated seconds takes a fraction of a real one.

`Network` carries messages between simulated processes: each is delayed by a random number of
virtual ms (so messages overtake each other, which is how the simulation reorders), and while
faults are on, some are dropped. Every random draw comes from the simulation's one seeded
generator, so a seed replays the same run.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

# A scheduled event: (at_ms, sequence number, action). Plain tuples compare in C; the unique
# sequence number keeps events at the same time in scheduling order and the action uncompared.
_Event = tuple[int, int, Callable[[], None]]


class Scheduler:
    """Virtual time: `at` schedules an action, `run_until` runs them in time order."""

    def __init__(self) -> None:
        self.now_ms = 0
        self._queue: list[_Event] = []
        self._seq = 0

    def at(self, delay_ms: int, action: Callable[[], None]) -> None:
        """Run `action` `delay_ms` virtual ms from now."""
        self._seq += 1
        heapq.heappush(self._queue, (self.now_ms + delay_ms, self._seq, action))

    def run_until(
        self,
        end_ms: int,
        after_event: Callable[[int], None],
        stop: Callable[[int], bool] | None = None,
    ) -> None:
        """Run every event due by `end_ms`, calling `after_event(now_ms)` after each; return
        early once `stop(now_ms)` says so."""
        queue = self._queue
        while queue and queue[0][0] <= end_ms:
            self.now_ms, _, action = heapq.heappop(queue)
            action()
            after_event(self.now_ms)
            if stop is not None and stop(self.now_ms):
                return


class Network:
    """Messages between processes: delayed, maybe dropped (reordering comes from the delays).

    `faults` is on during the safety phase; the liveness phase turns it off, and then nothing is
    dropped and every delay is short.
    """

    def __init__(
        self, scheduler: Scheduler, rng: random.Random, drop_rate: float, delay_ms_max: int
    ) -> None:
        self.scheduler = scheduler
        self.rng = rng
        self.drop_rate = drop_rate
        self.delay_ms_max = delay_ms_max
        self.faults = True

    def delay(self) -> int:
        """A message's transit time, in virtual ms."""
        return self.rng.randint(1, self.delay_ms_max if self.faults else 3)

    def dropped(self) -> bool:
        """Whether a message is lost (only while faults are on)."""
        return self.faults and self.rng.random() < self.drop_rate

    def send(self, action: Callable[[], None]) -> None:
        """Deliver `action` after a transit delay, unless the message is lost."""
        if not self.dropped():
            self.scheduler.at(self.delay(), action)
