"""The admin client's group calls (Kafka's Admin: listConsumerGroups, describeConsumerGroups,
listConsumerGroupOffsets, alterConsumerGroupOffsets, deleteConsumerGroups) over
KafkaGroupCall. ListGroups goes to every broker (each lists the groups it coordinates); the
others go to each group's coordinator, found and retried as a member's calls are
(coordinator.GroupMember, generation -1: the admin is no member)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from minibroker.client.errors import ErrorCode, MiniBrokerError
from minibroker.client.groups import kafka_call as api
from minibroker.client.groups.coordinator import (
    COORDINATOR_MOVED,
    RETRY_SAME,
    CommittedOffset,
    GroupMember,
    GroupSettings,
    group_error,
)
from minibroker.client.groups.protocol import PROTOCOL_TYPE, ProtocolError, decode_assignment
from minibroker.client.groups.transport import ClusterGroupTransport
from minibroker.client.transport import ClusterClient, now_ms
from minibroker.client.types import TopicPartition
from minibroker.client.wire import CallFailed


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str  # "" when the broker does not say (ListGroups v0-v3)


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    client_id: str
    client_host: str
    group_instance_id: str | None
    assignment: tuple[TopicPartition, ...]


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    state: str
    protocol_type: str
    protocol: str
    members: tuple[MemberDescription, ...] = field(default=())


class GroupAdmin:
    def __init__(
        self,
        cluster: ClusterClient,
        *,
        request_timeout_ms: int,
        retry_backoff_ms: int,
        default_api_timeout_ms: int,
        client_id: str = "minibroker-admin",
    ) -> None:
        self.cluster = cluster
        self.transport = ClusterGroupTransport(cluster, client_id)
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.default_api_timeout_ms = default_api_timeout_ms

    def _member(self, group_id: str) -> GroupMember:
        return GroupMember(
            GroupSettings(
                group_id,
                retry_backoff_ms=self.retry_backoff_ms,
                request_timeout_ms=self.request_timeout_ms,
            ),
            self.transport,
            now_ms,
        )

    def _deadline(self) -> int:
        return now_ms() + self.default_api_timeout_ms

    async def _group_call(
        self, group_id: str, api_key: int, values: Mapping[str, Any], code_of: Any
    ) -> Any:
        """A call to the group's coordinator, retried while it moves or loads."""
        member = self._member(group_id)
        deadline = self._deadline()
        while True:
            answer = await member.coordinator_call(api_key, values, deadline)
            code = code_of(answer)
            if code in COORDINATOR_MOVED:
                member.mark_coordinator_unknown()
            elif code not in RETRY_SAME:
                return answer
            await member._backoff(deadline, group_error(code, api.api_name(api_key)))

    async def coordinator_of(self, group_id: str) -> tuple[int, str]:
        """(node id, gRPC address) of the group's coordinator."""
        address = await self._member(group_id).ensure_coordinator(self._deadline())
        node = next(
            (b.node_id for b in self.cluster.metadata.brokers.values() if b.address == address),
            -1,
        )
        return node, address

    async def list_groups(self, states: Iterable[str] = ()) -> list[GroupListing]:
        await self.cluster.refresh_metadata()
        timeout_s = self.request_timeout_ms / 1000
        found: dict[str, GroupListing] = {}
        for broker in sorted(self.cluster.metadata.brokers.values(), key=lambda b: b.node_id):
            try:
                answer = await self.transport.send(
                    broker.address, api.LIST_GROUPS, {"states_filter": list(states)}, timeout_s
                )
            except CallFailed as failed:
                raise failed.error from None
            code = api.code_of(answer.error_code)
            if code != ErrorCode.NONE:
                raise group_error(code, f"ListGroups on broker {broker.node_id}")
            for g in answer.groups:
                found[g.group_id] = GroupListing(
                    g.group_id, g.protocol_type, getattr(g, "group_state", "") or ""
                )
        wanted = {s.lower() for s in states}
        return sorted(
            (g for g in found.values() if not wanted or not g.state or g.state.lower() in wanted),
            key=lambda g: g.group_id,
        )

    async def describe_groups(self, group_ids: Iterable[str]) -> dict[str, GroupDescription]:
        out: dict[str, GroupDescription] = {}
        for group_id in group_ids:
            answer = await self._group_call(
                group_id,
                api.DESCRIBE_GROUPS,
                {"groups": [group_id], "include_authorized_operations": False},
                lambda a: api.code_of(a.groups[0].error_code) if a.groups else 0,
            )
            for g in answer.groups:
                code = api.code_of(g.error_code)
                if code != ErrorCode.NONE:
                    raise group_error(code, f"DescribeGroups for group {g.group_id!r}")
                out[g.group_id] = describe_answer(g)
        return out

    async def list_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommittedOffset]:
        """The group's committed offsets (every partition it has committed, or the given
        ones; a partition without a commit is left out)."""
        member = self._member(group_id)
        if partitions is not None:
            found = await member.fetch_committed(partitions, self._deadline())
        else:
            found = await member.fetch_committed(None, self._deadline())
        return {tp: c for tp, c in sorted(found.items()) if c is not None}

    async def alter_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int | CommittedOffset]
    ) -> None:
        """Commit `offsets` for the group outside any generation (generation -1, member ""),
        as kafka-consumer-groups --reset-offsets does: the group must have no members."""
        member = self._member(group_id)
        wanted = {
            TopicPartition(*tp): (v if isinstance(v, CommittedOffset) else CommittedOffset(v))
            for tp, v in offsets.items()
        }
        await member.commit(wanted, self._deadline())

    async def delete_groups(self, group_ids: Iterable[str]) -> dict[str, MiniBrokerError | None]:
        """Each group's outcome (None: deleted)."""
        out: dict[str, MiniBrokerError | None] = {}
        for group_id in group_ids:
            answer = await self._group_call(
                group_id,
                api.DELETE_GROUPS,
                {"groups_names": [group_id]},
                lambda a: api.code_of(a.results[0].error_code) if a.results else 0,
            )
            for r in answer.results:
                code = api.code_of(r.error_code)
                out[r.group_id] = (
                    None
                    if code == ErrorCode.NONE
                    else group_error(code, f"DeleteGroups for group {r.group_id!r}")
                )
        return out


def describe_answer(g: Any) -> GroupDescription:
    members = []
    for m in g.members:
        assignment: tuple[TopicPartition, ...] = ()
        if g.protocol_type == PROTOCOL_TYPE:
            try:
                assignment = tuple(decode_assignment(m.member_assignment))
            except ProtocolError:
                assignment = ()
        members.append(
            MemberDescription(
                m.member_id,
                m.client_id,
                m.client_host,
                getattr(m, "group_instance_id", None),
                assignment,
            )
        )
    return GroupDescription(
        g.group_id, g.group_state, g.protocol_type, g.protocol_data, tuple(members)
    )
