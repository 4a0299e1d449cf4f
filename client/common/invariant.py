"""`invariant(cond, msg)` and `InvariantViolation`: the one always-on check of every pure core.

Pure: no I/O. Python's `assert` vanishes under `-O`; this does not. The broker's replication
rules (`minibroker.broker.replication.invariants`) and the controller's partition-change check
(`minibroker.controller.core.election.check_partition_change`) both raise it, so one exception
type means "a rule of docs/design.md §8 broke": a bug, never a recoverable condition. It is an
AssertionError so that the simulation and pytest report it as a failed check.
"""

from __future__ import annotations


class InvariantViolation(AssertionError):
    """An invariant does not hold: a bug, never a recoverable condition."""


def invariant(cond: bool, msg: str) -> None:
    """Raise InvariantViolation(msg) unless `cond`; never compiled away."""
    if not cond:
        raise InvariantViolation(msg)
