"""The controller logs at most N committed events of each name per command, then a summary."""

from __future__ import annotations

from minibroker.controller.app import events_to_log
from minibroker.controller.core.messages import Event


def _events(name: str, n: int) -> list[Event]:
    return [Event(name, {"partition": i}) for i in range(n)]


def test_few_events_are_all_logged_in_order() -> None:
    events = _events("leader_elected", 3) + _events("isr_shrink", 2)
    assert events_to_log(events, 3) == events


def test_past_the_limit_one_summary_per_name_follows_the_logged_ones() -> None:
    elected = _events("leader_elected", 5)
    shrunk = _events("isr_shrink", 4)
    fenced = [Event("broker_fenced", {"broker_id": 1})]
    out = events_to_log(fenced + elected + shrunk, 3)
    assert out == [
        *fenced,
        *elected[:3],
        *shrunk[:3],
        Event("events_summarized", {"name": "leader_elected", "total": 5, "not_logged": 2}),
        Event("events_summarized", {"name": "isr_shrink", "total": 4, "not_logged": 1}),
    ]


def test_exactly_the_limit_needs_no_summary() -> None:
    events = _events("leader_elected", 3)
    assert events_to_log(events, 3) == events
