"""The Kafka group APIs on this broker: kio requests in, kio responses out, through the group
coordinator (broker/groups/coordinator.py) and its membership (broker/groups/membership.py).

I/O shell, event-loop thread only. One handler per API serves all its versions (`codec.make`
keeps the fields a version has). Every handler first asks the coordinator whether this broker
coordinates the group (`check`: NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, ...), then the
ACL (GROUP READ, DESCRIBE for DescribeGroups) when a caller is known and an authorizer is on.
"""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

from minibroker.broker.groups.membership import Code, JoinRequest, JoinResult
from minibroker.broker.kafka import codec
from minibroker.broker.kafka.codec import make, nested
from minibroker.client.common.security import ALLOW_ALL, Access, CallIdentity
from minibroker.metadata.acl import AclOperation, ResourceType

if TYPE_CHECKING:
    from minibroker.broker.groups.coordinator import GroupCoordinator

JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS = 11, 12, 13, 14, 15
NO_AUTHORIZED_OPERATIONS = -2147483648


def _ms(value: Any) -> int:
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(milliseconds=1)
    return int(value)


class GroupHandlers:
    """The group APIs' handlers, methods `(request, principal)`; `principal` is the caller when
    known (KafkaGroupCall), None on the Kafka port."""

    def __init__(self, coordinator: GroupCoordinator, access: Access = ALLOW_ALL) -> None:
        self.coordinator = coordinator
        self.access = access

    def _refused(self, principal: Any, operation: AclOperation, group_id: str) -> bool:
        if principal is None or not isinstance(principal, CallIdentity):
            return False
        if not self.access.enabled:
            return False
        return not self.access.allows(principal, operation, ResourceType.GROUP, group_id)

    def _gate(self, principal: Any, operation: AclOperation, group_id: str) -> int:
        """The code that answers the request before membership sees it (NONE: go on)."""
        if self._refused(principal, operation, group_id):
            return Code.GROUP_AUTHORIZATION_FAILED
        return int(self.coordinator.check(group_id))

    # == G2: membership (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups) ========

    async def join_group(self, request: codec.Request, principal: Any = None) -> Any:
        body, version = request.body, request.api_version
        error = self._gate(principal, AclOperation.READ, body.group_id)
        if error != Code.NONE:
            result = JoinResult(error, body.member_id)
        else:
            session = _ms(body.session_timeout)
            rebalance = _ms(getattr(body, "rebalance_timeout", None) or session)
            if version == 0:
                rebalance = session
            host = principal.host if isinstance(principal, CallIdentity) else ""
            result = await self.coordinator.membership.join(
                JoinRequest(
                    group_id=body.group_id,
                    member_id=body.member_id,
                    instance_id=getattr(body, "group_instance_id", None),
                    protocol_type=body.protocol_type,
                    protocols=tuple((p.name, bytes(p.metadata)) for p in body.protocols),
                    session_timeout=session,
                    rebalance_timeout=rebalance,
                    client_id=request.client_id or "",
                    client_host=host,
                    requires_known_member_id=version >= 4,
                    supports_skip_assignment=version >= 9,
                )
            )
        module = codec.response_module(JOIN_GROUP, version)
        member_cls = nested(module, "JoinGroupResponseMember")
        assert member_cls is not None
        protocol_name = result.protocol_name
        if protocol_name is None and version < 7:
            protocol_name = ""  # nullable from v7 only (Kafka's JoinGroupResponse does this)
        return make(
            codec.response_class(JOIN_GROUP, version),
            throttle_time=0,
            error_code=result.error,
            generation_id=result.generation,
            protocol_type=result.protocol_type,
            protocol_name=protocol_name,
            leader=result.leader,
            skip_assignment=result.skip_assignment,
            member_id=result.member_id,
            members=tuple(
                make(
                    member_cls,
                    member_id=m.member_id,
                    group_instance_id=m.instance_id,
                    metadata=m.metadata,
                )
                for m in result.members
            ),
        )

    async def sync_group(self, request: codec.Request, principal: Any = None) -> Any:
        body, version = request.body, request.api_version
        cls = codec.response_class(SYNC_GROUP, version)
        error = self._gate(principal, AclOperation.READ, body.group_id)
        if error != Code.NONE:
            return make(cls, throttle_time=0, error_code=error, assignment=b"")
        result = await self.coordinator.membership.sync(
            body.group_id,
            body.member_id,
            int(body.generation_id),
            getattr(body, "group_instance_id", None),
            getattr(body, "protocol_type", None),
            getattr(body, "protocol_name", None),
            {a.member_id: bytes(a.assignment) for a in body.assignments},
        )
        return make(
            cls,
            throttle_time=0,
            error_code=result.error,
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name,
            assignment=result.assignment,
        )

    async def heartbeat(self, request: codec.Request, principal: Any = None) -> Any:
        body = request.body
        cls = codec.response_class(HEARTBEAT, request.api_version)
        error = self._gate(principal, AclOperation.READ, body.group_id)
        if error == Code.NONE:
            error = await self.coordinator.membership.heartbeat(
                body.group_id,
                body.member_id,
                int(body.generation_id),
                getattr(body, "group_instance_id", None),
            )
        return make(cls, throttle_time=0, error_code=error)

    async def leave_group(self, request: codec.Request, principal: Any = None) -> Any:
        body, version = request.body, request.api_version
        cls = codec.response_class(LEAVE_GROUP, version)
        batch = version >= 3
        leaving: list[tuple[str, str | None]] = (
            [(m.member_id, m.group_instance_id) for m in body.members]
            if batch
            else [(body.member_id, None)]
        )
        error = self._gate(principal, AclOperation.READ, body.group_id)
        codes: list[int] = []
        if error == Code.NONE:
            error, codes = await self.coordinator.membership.leave(body.group_id, leaving)
        if not batch:
            if error == Code.NONE and codes:
                error = codes[0]
            return make(cls, throttle_time=0, error_code=error)
        member_cls = nested(codec.response_module(LEAVE_GROUP, version), "MemberResponse")
        assert member_cls is not None
        return make(
            cls,
            throttle_time=0,
            error_code=error,
            members=tuple(
                make(member_cls, member_id=mid, group_instance_id=iid, error_code=code)
                for (mid, iid), code in zip(leaving, codes, strict=False)
            ),
        )

    async def describe_groups(self, request: codec.Request, principal: Any = None) -> Any:
        body, version = request.body, request.api_version
        module = codec.response_module(DESCRIBE_GROUPS, version)
        group_cls = nested(module, "DescribedGroup")
        member_cls = nested(module, "DescribedGroupMember")
        assert group_cls is not None and member_cls is not None
        described = []
        for group_id in body.groups:
            error = self._gate(principal, AclOperation.DESCRIBE, group_id)
            if error != Code.NONE:
                described.append(
                    make(
                        group_cls,
                        error_code=error,
                        group_id=group_id,
                        group_state="",
                        protocol_type="",
                        protocol_data="",
                        members=(),
                        authorized_operations=NO_AUTHORIZED_OPERATIONS,
                    )
                )
                continue
            d = await self.coordinator.membership.describe(group_id)
            code = d.error
            message = None
            if d.state == "Dead" and version >= 6:
                code = Code.GROUP_ID_NOT_FOUND  # Kafka's answer from v6 on
                message = f"Group {group_id} not found."
            described.append(
                make(
                    group_cls,
                    error_code=code,
                    error_message=message,
                    group_id=group_id,
                    group_state=d.state,
                    protocol_type=d.protocol_type,
                    protocol_data=d.protocol,
                    members=tuple(
                        make(
                            member_cls,
                            member_id=m.member_id,
                            group_instance_id=m.instance_id,
                            client_id=m.client_id,
                            client_host=m.client_host,
                            member_metadata=m.metadata,
                            member_assignment=m.assignment,
                        )
                        for m in d.members
                    ),
                    authorized_operations=NO_AUTHORIZED_OPERATIONS,
                )
            )
        return make(
            codec.response_class(DESCRIBE_GROUPS, version),
            throttle_time=0,
            groups=tuple(described),
        )
