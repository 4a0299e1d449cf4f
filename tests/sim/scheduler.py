"""The simulation's virtual time and network (the deterministic core of tests/sim).

`Scheduler` is a virtual clock and an event queue: an event is a callable due at an integer
`now_ms`; events due at the same time run in the order they were scheduled. Nothing here
sleeps, so a run of simulated seconds takes a fraction of a real one.

`Network` carries messages between simulated processes: each is delayed by a random number of
virtual ms (so messages overtake each other, which is how the simulation reorders), and while
faults are on, some are dropped. Links between processes (broker ids, `CONTROLLER` for the
controller) can be cut: a partition is silence, as TCP makes it (docs/design.md, network faults).
A message that arrives on a cut link is held, not refused and not dropped; when the link heals,
what it held is delivered in order, except a message whose call's deadline passed meanwhile
(the caller got DEADLINE_EXCEEDED and gave up) or whose sending process has died (the held data
died with its connection). Clients (producers, consumers) are never cut from brokers. Every
random draw comes from the simulation's one seeded generator, so a seed replays the same run.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from collections.abc import Callable
from functools import partial

CONTROLLER = 0  # the controller's node id on the network (brokers are 1..N)

# A message held on a cut link: (deadline_ms or None, still sent? or None, the delivery).
_Held = tuple[int | None, Callable[[], bool] | None, Callable[[], None]]

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
    """Messages between processes: delayed, maybe dropped (reordering comes from the delays),
    held while their link is cut.

    `faults` is on during the safety phase; the liveness phase turns it off, and then nothing is
    dropped and every delay is short (and the nemesis heals every cut).
    """

    def __init__(
        self, scheduler: Scheduler, rng: random.Random, drop_rate: float, delay_ms_max: int
    ) -> None:
        self.scheduler = scheduler
        self.rng = rng
        self.drop_rate = drop_rate
        self.delay_ms_max = delay_ms_max
        self.faults = True
        # Cut links (unordered node pairs), counted: overlapping faults may cut one link twice.
        self.cuts: Counter[frozenset[int]] = Counter()
        self.held: dict[frozenset[int], list[_Held]] = {}
        self.cut_at_ms: dict[frozenset[int], int] = {}  # when each cut link was cut
        self.healed_at_ms: dict[frozenset[int], int] = {}  # when each link was last healed

    def delay(self) -> int:
        """A message's transit time, in virtual ms."""
        return self.rng.randint(1, self.delay_ms_max if self.faults else 3)

    def dropped(self) -> bool:
        """Whether a message is lost (only while faults are on)."""
        return self.faults and self.rng.random() < self.drop_rate

    def send(
        self,
        action: Callable[[], None],
        link: tuple[int, int] | None = None,
        deadline_ms: int | None = None,
        still_sent: Callable[[], bool] | None = None,
    ) -> None:
        """Deliver `action` after a transit delay, unless the message is lost. `link` (sender,
        receiver) is None for a client's message; see `transmit`."""
        if not self.dropped():
            self.transmit(action, link, deadline_ms, still_sent)

    def transmit(
        self,
        action: Callable[[], None],
        link: tuple[int, int] | None,
        deadline_ms: int | None = None,
        still_sent: Callable[[], bool] | None = None,
        delay_ms: int | None = None,
    ) -> None:
        """Deliver `action` on `link` after `delay_ms` (default: a transit delay), never lost (a
        stream's message: a loss breaks the stream, which the callers model). If it arrives while
        the link is cut it is held until the link heals; then it is delivered unless its call's
        `deadline_ms` has passed or `still_sent()` (the sending process still runs) says no."""
        delay = self.delay() if delay_ms is None else delay_ms
        if link is None:
            self.scheduler.at(delay, action)
        else:
            self.scheduler.at(
                delay, partial(self._arrive, frozenset(link), deadline_ms, still_sent, action)
            )

    def _arrive(
        self,
        link: frozenset[int],
        deadline_ms: int | None,
        still_sent: Callable[[], bool] | None,
        action: Callable[[], None],
    ) -> None:
        if self.cuts and link in self.cuts:
            self.held.setdefault(link, []).append((deadline_ms, still_sent, action))
            return
        action()

    # -- partitions ------------------------------------------------------------------------------

    def is_cut(self, a: int, b: int) -> bool:
        return bool(self.cuts) and frozenset((a, b)) in self.cuts

    def cut_since(self, a: int, b: int, since_ms: int) -> bool:
        """Whether the link a-b was cut at any time from `since_ms` until now."""
        link = frozenset((a, b))
        return link in self.cuts or self.healed_at_ms.get(link, -1) >= since_ms

    def any_cut_since(self, since_ms: int) -> bool:
        return bool(self.cuts) or any(t >= since_ms for t in self.healed_at_ms.values())

    def cut(self, a: int, b: int) -> None:
        link = frozenset((a, b))
        if link not in self.cuts:
            self.cut_at_ms[link] = self.scheduler.now_ms
        self.cuts[link] += 1

    def heal(self, a: int, b: int) -> None:
        """Heal one cut of the link a-b; once no fault cuts it, what it held is delivered in
        order (TCP's retransmission after the partition: one delay for the lot)."""
        link = frozenset((a, b))
        self.cuts[link] -= 1
        if self.cuts[link] > 0:
            return
        del self.cuts[link]
        del self.cut_at_ms[link]
        self.healed_at_ms[link] = self.scheduler.now_ms
        held = self.held.pop(link, [])
        if held:
            delay = self.delay()
            for deadline_ms, still_sent, action in held:
                self.scheduler.at(delay, partial(self._release, deadline_ms, still_sent, action))

    def _release(
        self,
        deadline_ms: int | None,
        still_sent: Callable[[], bool] | None,
        action: Callable[[], None],
    ) -> None:
        if deadline_ms is not None and self.scheduler.now_ms >= deadline_ms:
            return  # the caller's deadline passed while it was held
        if still_sent is not None and not still_sent():
            return  # the sender died: what it held died with the connection
        action()

    def heal_all(self) -> None:
        for link in list(self.cuts):
            self.cuts[link] = 1
            a, b = sorted(link)
            self.heal(a, b)
