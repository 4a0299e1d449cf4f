"""The group APIs of Kafka's protocol: a kio request in, a kio response out, through the
broker's GroupCoordinator (broker/groups/coordinator.py).

I/O shell, event-loop thread only. One handler serves every version of its API (`codec.make`
keeps the fields a version has). Authorization, when the caller is known (`principal`: minibroker's
own client over KafkaGroupCall) and the broker has an authorizer (`access`), follows Kafka's
KafkaApis: GROUP READ for OffsetCommit and OffsetFetch, GROUP DESCRIBE for FindCoordinator and
ListGroups (which leaves out the groups not describable), GROUP DELETE for DeleteGroups, and
TOPIC READ on each committed or fetched topic; GROUP READ for JoinGroup, SyncGroup, Heartbeat and
LeaveGroup, GROUP DESCRIBE for DescribeGroups (G2's section, at the end, over the coordinator's
membership: broker/groups/membership.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from kio.schema.errors import ErrorCode

from minibroker.broker.groups.coordinator import MAX_STRING_BYTES, GroupCoordinator, utf16_length
from minibroker.broker.groups.membership import Code, Described, JoinRequest, JoinResult
from minibroker.broker.groups.records import OffsetCommitValue
from minibroker.broker.kafka import codec
from minibroker.broker.kafka.codec import make, nested
from minibroker.client.common.security import CallIdentity
from minibroker.metadata.acl import AclOperation, ResourceType

if TYPE_CHECKING:
    from minibroker.broker.groups.membership import Membership
    from minibroker.client.common.security import Access

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR = 8, 9, 10
LIST_GROUPS, DELETE_GROUPS = 16, 42
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS = 11, 12, 13, 14, 15
NO_AUTHORIZED_OPERATIONS = -2147483648
GROUP_KEY_TYPE = 0


def _ms(value: Any) -> int:
    """A kio duration (or int) in ms."""
    if hasattr(value, "total_seconds"):
        return round(value.total_seconds() * 1000)
    return int(value)


class GroupHandlers:
    """The group APIs; `access`: the broker's authorizer (set by broker/app.py once built)."""

    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator
        self.access: Access | None = None

    # -- authorization -------------------------------------------------------------------

    def _allowed(self, who: Any, operation: AclOperation, kind: ResourceType, name: str) -> bool:
        if who is None or self.access is None or not self.access.enabled:
            return True
        return self.access.allows(who, operation, kind, name)

    def _group_ok(self, who: Any, operation: AclOperation, group: str) -> bool:
        return self._allowed(who, operation, ResourceType.GROUP, group)

    def _topic_ok(self, who: Any, topic: str) -> bool:
        return self._allowed(who, AclOperation.READ, ResourceType.TOPIC, topic)

    # -- FindCoordinator (v0-v4; v4 batches keys) ------------------------------------------

    async def find_coordinator(self, request: codec.Request, principal: Any = None) -> Any:
        version = request.api_version
        body = request.body
        cls = codec.response_class(FIND_COORDINATOR, version)
        key_type = int(getattr(body, "key_type", GROUP_KEY_TYPE))
        keys = list(body.coordinator_keys) if version >= 4 else [body.key]
        answers = [self._coordinator_answer(key, key_type, principal) for key in keys]
        if version >= 4:
            coordinator_cls = nested(
                codec.response_module(FIND_COORDINATOR, version), "Coordinator"
            )
            assert coordinator_cls is not None
            return make(
                cls,
                throttle_time=0,
                coordinators=tuple(
                    make(coordinator_cls, key=k, **a) for k, a in zip(keys, answers, strict=True)
                ),
            )
        return make(cls, throttle_time=0, **answers[0])

    def _coordinator_answer(self, key: str, key_type: int, who: Any) -> dict[str, Any]:
        def refused(code: ErrorCode, message: str) -> dict[str, Any]:
            return {
                "error_code": code,
                "error_message": message,
                "node_id": -1,
                "host": "",
                "port": -1,
            }

        if key_type != GROUP_KEY_TYPE:
            return refused(ErrorCode.invalid_request, "transactions are not supported")
        if not self._group_ok(who, AclOperation.DESCRIBE, key):
            return refused(ErrorCode.group_authorization_failed, f"not authorized on group {key}")
        code, node = self.coordinator.coordinator_of(key)
        broker = self.coordinator.rm.image.brokers.get(node) if code == ErrorCode.none else None
        if code == ErrorCode.none and (broker is None or broker.fenced or broker.kafka_port <= 0):
            code = ErrorCode.coordinator_not_available
        if code != ErrorCode.none or broker is None:
            return refused(code, code.name)
        return {
            "error_code": ErrorCode.none,
            "error_message": None,
            "node_id": node,
            "host": broker.kafka_host,
            "port": broker.kafka_port,
        }

    # -- OffsetCommit (v2-v8) ---------------------------------------------------------------

    async def offset_commit(self, request: codec.Request, principal: Any = None) -> Any:
        version = request.api_version
        body = request.body
        module = codec.response_module(OFFSET_COMMIT, version)
        partition_cls = nested(module, "OffsetCommitResponsePartition")
        topic_cls = nested(module, "OffsetCommitResponseTopic")
        assert partition_cls and topic_cls
        coordinator = self.coordinator
        group = body.group_id
        asked = [(t.name, p) for t in body.topics for p in t.partitions]
        errors: dict[tuple[str, int], ErrorCode] = {}

        def answer() -> Any:
            by_topic: dict[str, list[Any]] = {}
            for name, p in asked:
                by_topic.setdefault(name, []).append(
                    make(
                        partition_cls,
                        partition_index=p.partition_index,
                        error_code=errors.get((name, p.partition_index), ErrorCode.none),
                    )
                )
            return make(
                codec.response_class(OFFSET_COMMIT, version),
                throttle_time=0,
                topics=tuple(
                    make(topic_cls, name=n, partitions=tuple(ps)) for n, ps in by_topic.items()
                ),
            )

        def fail_all(code: ErrorCode) -> Any:
            for name, p in asked:
                errors[(name, p.partition_index)] = code
            return answer()

        if not self._group_ok(principal, AclOperation.READ, group):
            return fail_all(ErrorCode.group_authorization_failed)
        code = coordinator.check(group)
        if code != ErrorCode.none:
            return fail_all(code)
        code = coordinator.membership.validate_commit(
            group,
            body.member_id or "",
            int(body.generation_id_or_member_epoch),
            getattr(body, "group_instance_id", None),
        )
        if code != ErrorCode.none:
            return fail_all(code)
        now = coordinator.clock()
        retention = _ms(getattr(body, "retention_time", -1))
        image = coordinator.rm.image
        max_metadata = coordinator.config.offset_metadata_max_bytes
        offsets: dict[tuple[str, int], OffsetCommitValue] = {}
        for name, p in asked:
            tp = (name, int(p.partition_index))
            metadata = p.committed_metadata or ""
            topic = image.topic(name)
            if not self._topic_ok(principal, name):
                errors[tp] = ErrorCode.topic_authorization_failed
            elif topic is None or tp[1] not in topic.partitions:
                errors[tp] = ErrorCode.unknown_topic_or_partition
            elif (
                utf16_length(metadata) > max_metadata  # Kafka counts String.length()
                or len(metadata.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES
            ):
                errors[tp] = ErrorCode.offset_metadata_too_large
            else:
                offsets[tp] = OffsetCommitValue(
                    offset=int(p.committed_offset),
                    metadata=metadata,
                    commit_timestamp=now,
                    leader_epoch=int(getattr(p, "committed_leader_epoch", -1)),
                    expire_timestamp=now + retention if retention >= 0 else -1,
                )
        code = await coordinator.commit_offsets(group, offsets)
        for tp in offsets:
            errors[tp] = code
        return answer()

    # -- OffsetFetch (v1-v8; v8 batches groups) ----------------------------------------------

    async def offset_fetch(self, request: codec.Request, principal: Any = None) -> Any:
        version = request.api_version
        body = request.body
        module = codec.response_module(OFFSET_FETCH, version)
        cls = codec.response_class(OFFSET_FETCH, version)
        if version >= 8:
            group_cls = nested(module, "OffsetFetchResponseGroup")
            topic_cls = nested(module, "OffsetFetchResponseTopics")
            partition_cls = nested(module, "OffsetFetchResponsePartitions")
            assert group_cls and topic_cls and partition_cls
            groups = []
            for g in body.groups:
                code, topics = self._fetch_group(
                    g.group_id, g.topics, principal, topic_cls, partition_cls
                )
                groups.append(make(group_cls, group_id=g.group_id, topics=topics, error_code=code))
            return make(cls, throttle_time=0, groups=tuple(groups))
        topic_cls = nested(module, "OffsetFetchResponseTopic")
        partition_cls = nested(module, "OffsetFetchResponsePartition")
        assert topic_cls and partition_cls
        code, topics = self._fetch_group(
            body.group_id, body.topics, principal, topic_cls, partition_cls
        )
        if version < 2 and code != ErrorCode.none:
            # v1 has no top-level error: each asked partition carries it.
            topics = tuple(
                make(
                    topic_cls,
                    name=t.name,
                    partitions=tuple(
                        make(
                            partition_cls,
                            partition_index=i,
                            committed_offset=-1,
                            metadata="",
                            error_code=code,
                        )
                        for i in t.partition_indexes
                    ),
                )
                for t in body.topics or ()
            )
        return make(cls, throttle_time=0, topics=topics, error_code=code)

    def _fetch_group(
        self, group: str, asked: Any, who: Any, topic_cls: type, partition_cls: type
    ) -> tuple[ErrorCode, tuple[Any, ...]]:
        coordinator = self.coordinator
        if not self._group_ok(who, AclOperation.READ, group):
            return ErrorCode.group_authorization_failed, ()
        code = coordinator.check(group)
        if code != ErrorCode.none:
            return code, ()
        committed = coordinator.committed(group)
        wanted: list[tuple[str, list[int]]]
        if asked is None:  # every committed partition (the topics the caller may read)
            by_topic: dict[str, list[int]] = {}
            for topic, partition in sorted(committed):
                by_topic.setdefault(topic, []).append(partition)
            wanted = [(t, ps) for t, ps in by_topic.items() if self._topic_ok(who, t)]
        else:
            wanted = [(t.name, list(t.partition_indexes)) for t in asked]
        topics = []
        for name, partitions in wanted:
            allowed = self._topic_ok(who, name)
            rows = []
            for index in partitions:
                value = committed.get((name, int(index))) if allowed else None
                rows.append(
                    make(
                        partition_cls,
                        partition_index=index,
                        committed_offset=value.offset if value else -1,
                        committed_leader_epoch=value.leader_epoch if value else -1,
                        metadata=value.metadata if value else "",
                        error_code=(
                            ErrorCode.none if allowed else ErrorCode.topic_authorization_failed
                        ),
                    )
                )
            topics.append(make(topic_cls, name=name, partitions=tuple(rows)))
        return ErrorCode.none, tuple(topics)

    # -- ListGroups (v0-v4) ----------------------------------------------------------------

    async def list_groups(self, request: codec.Request, principal: Any = None) -> Any:
        version = request.api_version
        module = codec.response_module(LIST_GROUPS, version)
        listed_cls = nested(module, "ListedGroup")
        assert listed_cls is not None
        coordinator = self.coordinator
        states = {s.lower() for s in getattr(request.body, "states_filter", ()) or ()}
        code = (
            ErrorCode.coordinator_load_in_progress
            if "loading" in coordinator.partitions.values()
            else ErrorCode.none
        )
        groups = []
        for group in coordinator.known_groups():
            if not self._group_ok(principal, AclOperation.DESCRIBE, group):
                continue
            described = coordinator.membership.state(group)
            state, protocol_type = described if described is not None else ("Empty", "")
            if states and state.lower() not in states:
                continue
            groups.append(
                make(listed_cls, group_id=group, protocol_type=protocol_type, group_state=state)
            )
        return make(
            codec.response_class(LIST_GROUPS, version),
            throttle_time=0,
            error_code=code,
            groups=tuple(groups),
        )

    # -- DeleteGroups (v0-v2) --------------------------------------------------------------

    async def delete_groups(self, request: codec.Request, principal: Any = None) -> Any:
        version = request.api_version
        result_cls = nested(codec.response_module(DELETE_GROUPS, version), "DeletableGroupResult")
        assert result_cls is not None
        results = []
        for group in request.body.groups_names:
            if not self._group_ok(principal, AclOperation.DELETE, group):
                code = ErrorCode.group_authorization_failed
            else:
                code = self.coordinator.check(group)
                if code == ErrorCode.none:
                    code = await self.coordinator.delete_group(group)
            results.append(make(result_cls, group_id=group, error_code=code))
        return make(
            codec.response_class(DELETE_GROUPS, version), throttle_time=0, results=tuple(results)
        )

    # == G2: membership (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups) ========
    # Each asks coordinator.check(group_id) and answers its code, after the ACL when a caller
    # is known and an authorizer is on: GROUP READ (DESCRIBE for DescribeGroups).

    def _membership(self) -> Membership:
        """The coordinator's membership, G2's (its Protocol names only what G1 uses)."""
        return cast("Membership", self.coordinator.membership)

    def _gate(self, principal: Any, operation: AclOperation, group_id: str) -> int:
        """The code that answers the request before membership sees it (NONE: go on)."""
        if not self._group_ok(principal, operation, group_id):
            return Code.GROUP_AUTHORIZATION_FAILED
        return int(self.coordinator.check(group_id))

    async def join_group(self, request: codec.Request, principal: Any = None) -> Any:
        body, version = request.body, request.api_version
        error = self._gate(principal, AclOperation.READ, body.group_id)
        if error != Code.NONE:
            result = JoinResult(error, body.member_id)
        else:
            session = _ms(body.session_timeout)
            # v0 has no rebalance timeout: the session's; from v1 on it is taken as sent (0 too)
            rebalance = session if version == 0 else _ms(body.rebalance_timeout)
            host = request.client_host
            if not host and isinstance(principal, CallIdentity) and principal.host:
                host = f"/{principal.host}"
            result = await self._membership().join(
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
        result = await self._membership().sync(
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
            error = await self._membership().heartbeat(
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
            error, codes = await self._membership().leave(body.group_id, leaving)
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
            d = await self._membership().describe(group_id)
            if d.state == "Dead" and d.error == Code.NONE and self.coordinator.committed(group_id):
                # Offsets only (simple commits): Kafka has an Empty classic group for them.
                d = Described(Code.NONE, "Empty", "", "", ())
            code = d.error
            message = None
            if d.state == "Dead" and code == Code.NONE and version >= 6:
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
