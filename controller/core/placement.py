"""Replica placement for new topics: the rules live in `minibroker.metadata.placement`, shared
with the reassignment planner (`minibroker.metadata.assignment_plan`), which tools use too."""

from __future__ import annotations

from minibroker.metadata.placement import (
    BrokerSlot,
    PlacementError,
    place_replicas,
    rack_alternated,
)

__all__ = ["BrokerSlot", "PlacementError", "place_replicas", "rack_alternated"]
