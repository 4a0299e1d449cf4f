"""`minibroker verify`'s nemesis schedule: which fault each round causes, from a seed.

Pure: no I/O, no clock. The same seed, kinds and timing give the same faults in the same order
(`Schedule`), so a run that found a violation is replayed with `--seed`. What the schedule
decides is abstract (a kind, a variant, a `pick` number, how long the fault is held); the runner
turns `pick` into processes by looking at the cluster as it is then (the leader of the
`pick`-th partition, another broker, a side of a split), so the same seed on the same workload
aims at the same roles.

Kinds are drawn as from a bag: every `len(kinds)` rounds cause each kind once, in a seeded
order, so 20 rounds of the five kinds cause each four times (a plain random draw would miss one
in about 6% of such runs). Partition faults draw their variant the same way.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

FAULT_KINDS = ("kill", "pause", "partition", "controller", "disk")
# zombie: a partition leader isolated from every other node (clients still reach it);
# follower: a follower cut from its leader; controller_only: a broker cut from the controllers
# only; split: one broker | the rest, the active controller on one side or the other.
PARTITION_VARIANTS = ("zombie", "follower", "controller_only", "split")
# How often a kill or a pause takes two brokers at once.
TWO_BROKERS_CHANCE = 0.25


@dataclass(frozen=True, slots=True)
class Timing:
    """The cluster's timeouts the holds must outlast, in seconds."""

    lag_s: float = 1.5  # replica.lag.time.max.ms
    session_s: float = 2.5  # broker.session.timeout.ms


@dataclass(frozen=True, slots=True)
class PlannedFault:
    round: int  # 1, 2, ...
    kind: str  # one of FAULT_KINDS
    variant: str  # kill/pause: "one" or "two" brokers; disk: "one"; partition: a variant;
    # controller: "kill"
    pick: int  # chooses the target at run time (see the module docstring)
    hold_s: float  # how long the fault lasts before it is healed (disk: until the broker exits)

    def describe(self) -> str:
        if self.kind == "partition":
            return f"partition ({self.variant.replace('_', ' ')})"
        if self.kind in ("kill", "pause") and self.variant == "two":
            return f"{self.kind} (two brokers)"
        return self.kind


def parse_kinds(text: str) -> tuple[str, ...]:
    """`kill,pause` -> ("kill", "pause"); `all` or "" -> every kind. ValueError names the
    unknown ones."""
    parts = [p.strip().lower() for p in text.split(",") if p.strip()]
    if not parts or parts == ["all"]:
        return FAULT_KINDS
    unknown = [p for p in parts if p not in FAULT_KINDS]
    if unknown:
        raise ValueError(
            f"unknown fault kind(s) {', '.join(unknown)}: choose among {', '.join(FAULT_KINDS)}"
        )
    return tuple(dict.fromkeys(parts))


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """`60s`, `10m`, `1h`, `500ms` or plain seconds -> seconds (> 0)."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"a duration is a number with s, m, h or ms (e.g. 60s, 10m), got {text!r}")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"the duration must be positive, got {text!r}")
    return seconds


class Schedule:
    """An endless seeded sequence of faults of `kinds`."""

    def __init__(self, seed: int, kinds: Sequence[str], timing: Timing = Timing()) -> None:
        if not kinds:
            raise ValueError("no fault kinds to schedule")
        self._rng = random.Random(seed)
        self._kinds = tuple(kinds)
        self._timing = timing
        self._kind_bag: list[str] = []
        self._variant_bag: list[str] = []
        self._round = 0

    def _draw(self, bag: list[str], items: Sequence[str]) -> str:
        if not bag:
            bag.extend(items)
            self._rng.shuffle(bag)
        return bag.pop()

    def next(self) -> PlannedFault:
        self._round += 1
        rng = self._rng
        kind = self._draw(self._kind_bag, self._kinds)
        # Every draw below happens whatever the kind, so one kind's choices never shift the
        # next rounds' (a replay with fewer kinds is a different run anyway).
        pick = rng.randrange(1 << 30)
        two = rng.random() < TWO_BROKERS_CHANCE
        jitter = rng.uniform(0.5, 1.5)
        t = self._timing
        if kind == "partition":
            variant = self._draw(self._variant_bag, PARTITION_VARIANTS)
            # Long enough to be noticed: the ISR shrinks, the controller fences (a second more
            # for a controller quorum that first elects a new leader, in a split).
            hold = max(t.lag_s, t.session_s) + 1.0 + jitter
        elif kind == "pause":
            variant = "two" if two else "one"
            hold = t.lag_s + jitter  # past replica.lag.time.max.ms
        elif kind == "kill":
            variant = "two" if two else "one"
            hold = jitter
        elif kind == "controller":
            variant = "kill"
            hold = jitter
        else:  # disk: held until the broker notices and exits
            variant = "one"
            hold = 0.0
        return PlannedFault(self._round, kind, variant, pick, round(hold, 3))

    def __iter__(self) -> Iterator[PlannedFault]:
        while True:
            yield self.next()

    def take(self, n: int) -> list[PlannedFault]:
        return [self.next() for _ in range(n)]
