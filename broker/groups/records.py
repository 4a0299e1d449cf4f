"""PLACEHOLDER on branch g2 for G1's broker/groups/records.py: only the two dataclasses the
shared spec (GROUPS-SPEC.md) names, so membership.py imports and tests run before g1 lands.
On merging g1, take g1's file whole."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[MemberMetadata, ...]
