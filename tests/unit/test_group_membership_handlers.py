"""The membership APIs on the Kafka handlers (broker/kafka/group_handlers.py) with the shell
(broker/groups/membership.py: Membership) on a real event loop, against a stand-in coordinator
(an in-memory store_group): every advertised version written and read back by kio, the
coordinator's check, the group ACLs, a failed store, and a session that expires on its timer."""

from __future__ import annotations

import asyncio
import struct
import sys
import time
from typing import Any

import pytest

from minibroker.broker.groups.membership import (
    Code,
    GroupConfig,
    JoinRequest,
    Membership,
    Reply,
    SyncResult,
)
from minibroker.broker.groups.records import GroupMetadataValue, MemberMetadata
from minibroker.broker.kafka import codec
from minibroker.broker.kafka.group_handlers import GroupHandlers
from minibroker.broker.kafka.handlers import (
    DESCRIBE_GROUPS,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    SUPPORTED,
    SYNC_GROUP,
    KafkaHandlers,
)
from minibroker.client.common.security import Access, CallIdentity
from minibroker.metadata.acl import AclOperation, Principal, ResourceType
from tests.unit.test_kafka_protocol import read_response, request_bytes

G = "grp"


class StandInCoordinator:
    """GROUPS-SPEC.md's GroupCoordinator, only what membership needs (unit tests only)."""

    def __init__(self, config: GroupConfig | None = None) -> None:
        self.stored: list[tuple[str, GroupMetadataValue | None]] = []
        self.store_error = Code.NONE
        self.checks: dict[str, int] = {}
        self.offsets: dict[str, dict[tuple[str, int], Any]] = {}
        self.clock = lambda: int(time.monotonic() * 1000)
        self.membership = Membership(
            self,  # type: ignore[arg-type]
            config or GroupConfig(initial_rebalance_delay_ms=0, min_session_timeout_ms=100),
        )

    def check(self, group_id: str) -> int:
        return self.checks.get(group_id, Code.NONE)

    def committed(self, group_id: str) -> dict[tuple[str, int], Any]:
        return self.offsets.get(group_id, {})

    async def store_group(self, group_id: str, value: GroupMetadataValue | None) -> int:
        await asyncio.sleep(0)
        if self.store_error == Code.NONE:
            self.stored.append((group_id, value))
        return self.store_error


class DenyGroups:
    def __init__(self, allowed: set[tuple[AclOperation, str]]) -> None:
        self.allowed = allowed
        self.asked: list[tuple[AclOperation, ResourceType, str]] = []

    def authorize(self, principal: Any, host: str, op: AclOperation, rt: ResourceType, name: str):
        self.asked.append((op, rt, name))
        return (op, name) in self.allowed


def kafka(coordinator: StandInCoordinator, access: Access | None = None) -> KafkaHandlers:
    handlers = KafkaHandlers(None, coordinator)  # type: ignore[arg-type]
    assert isinstance(handlers.groups, GroupHandlers)
    handlers.groups.access = access
    return handlers


async def call(
    handlers: KafkaHandlers, api: int, version: int, principal: Any = None, **fields: Any
) -> Any:
    """Write the request as a client would, parse it, handle it, write the answer, read it."""
    cls = codec.request_class(api, version)
    module = __import__(cls.__module__, fromlist=["_"])
    if api == JOIN_GROUP:
        fields["protocols"] = tuple(
            codec.make(module.JoinGroupRequestProtocol, name=n, metadata=m)
            for n, m in fields["protocols"]
        )
    if api == SYNC_GROUP:
        fields["assignments"] = tuple(
            codec.make(module.SyncGroupRequestAssignment, member_id=k, assignment=v)
            for k, v in fields["assignments"].items()
        )
    if api == LEAVE_GROUP and version >= 3:
        fields["members"] = tuple(
            codec.make(module.MemberIdentity, member_id=m, group_instance_id=i)
            for m, i in fields["members"]
        )
    body = codec.make(cls, **fields)
    request = codec.parse_request(request_bytes(api, version, 7, body), SUPPORTED)
    answer = await handlers.handle(request, principal)
    frame = codec.encode_response(api, version, 7, answer)
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    correlation_id, out = read_response(api, version, frame[4:])
    assert correlation_id == 7
    return out


async def until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def join_fields(member_id: str = "", **kw: Any) -> dict[str, Any]:
    return dict(
        group_id=G,
        session_timeout=kw.pop("session_timeout", 10_000),
        rebalance_timeout=kw.pop("rebalance_timeout", 10_000),
        member_id=member_id,
        group_instance_id=kw.pop("group_instance_id", None),
        protocol_type="consumer",
        protocols=kw.pop("protocols", (("range", b"sub"),)),
        reason=None,
    )


async def join(h: KafkaHandlers, version: int, **kw: Any) -> Any:
    first = await call(h, JOIN_GROUP, version, **join_fields(**kw))
    if version >= 4 and not kw.get("group_instance_id") and not kw.get("member_id"):
        assert int(first.error_code) == Code.MEMBER_ID_REQUIRED and first.member_id
        return await call(h, JOIN_GROUP, version, **join_fields(member_id=first.member_id, **kw))
    return first


@pytest.mark.parametrize("version", range(SUPPORTED[JOIN_GROUP][0], SUPPORTED[JOIN_GROUP][1] + 1))
async def test_every_version_join_sync_heartbeat_describe_leave(version: int) -> None:
    sync_v = min(version, SUPPORTED[SYNC_GROUP][1])
    hb_v = min(version, SUPPORTED[HEARTBEAT][1])
    leave_v = min(version, SUPPORTED[LEAVE_GROUP][1])
    describe_v = min(version, SUPPORTED[DESCRIBE_GROUPS][1])
    c = StandInCoordinator()
    h = kafka(c)
    joined = await join(h, version)
    assert int(joined.error_code) == Code.NONE
    me = joined.member_id
    assert joined.generation_id == 1 and joined.leader == me
    assert [(m.member_id, m.metadata) for m in joined.members] == [(me, b"sub")]
    assert joined.protocol_name == "range"
    if version >= 7:
        assert joined.protocol_type == "consumer"
    if sync_v >= 5:  # KIP-559: the protocol type and name must be the group's
        for ptype, pname in (("consumer", "roundrobin"), ("connect", "range")):
            bad = await call(
                h,
                SYNC_GROUP,
                sync_v,
                group_id=G,
                generation_id=1,
                member_id=me,
                group_instance_id=None,
                protocol_type=ptype,
                protocol_name=pname,
                assignments={},
            )
            assert int(bad.error_code) == Code.INCONSISTENT_GROUP_PROTOCOL
    synced = await call(
        h,
        SYNC_GROUP,
        sync_v,
        group_id=G,
        generation_id=1,
        member_id=me,
        group_instance_id=None,
        protocol_type="consumer",
        protocol_name="range",
        assignments={me: b"mine"},
    )
    assert int(synced.error_code) == Code.NONE and synced.assignment == b"mine"
    if sync_v >= 5:
        assert (synced.protocol_type, synced.protocol_name) == ("consumer", "range")
    assert c.stored[-1][1] is not None and c.stored[-1][1].members[0].assignment == b"mine"
    hb = await call(h, HEARTBEAT, hb_v, group_id=G, generation_id=1, member_id=me)
    assert int(hb.error_code) == Code.NONE
    hb = await call(h, HEARTBEAT, hb_v, group_id=G, generation_id=2, member_id=me)
    assert int(hb.error_code) == Code.ILLEGAL_GENERATION
    desc = await call(
        h, DESCRIBE_GROUPS, describe_v, groups=(G, "nope"), include_authorized_operations=False
    )
    mine, nope = desc.groups
    assert (mine.group_state, mine.protocol_type, mine.protocol_data) == (
        "Stable",
        "consumer",
        "range",
    )
    assert [(m.member_id, m.member_assignment) for m in mine.members] == [(me, b"mine")]
    assert nope.group_state == "Dead"
    assert int(nope.error_code) == (Code.GROUP_ID_NOT_FOUND if describe_v >= 6 else Code.NONE)
    if leave_v >= 3:
        left = await call(h, LEAVE_GROUP, leave_v, group_id=G, members=[(me, None), ("x", None)])
        assert int(left.error_code) == Code.NONE
        assert [(m.member_id, int(m.error_code)) for m in left.members] == [
            (me, Code.NONE),
            ("x", Code.UNKNOWN_MEMBER_ID),
        ]
    else:
        left = await call(h, LEAVE_GROUP, leave_v, group_id=G, member_id=me)
        assert int(left.error_code) == Code.NONE
        again = await call(h, LEAVE_GROUP, leave_v, group_id=G, member_id=me)
        assert int(again.error_code) == Code.UNKNOWN_MEMBER_ID
    assert c.membership.state(G) == ("Empty", "consumer")
    await until(lambda: c.stored[-1][1] is not None and c.stored[-1][1].members == ())


async def test_the_coordinators_check_answers_every_api() -> None:
    c = StandInCoordinator()
    h = kafka(c)
    c.checks[G] = Code.NOT_COORDINATOR
    r = await call(h, JOIN_GROUP, 5, **join_fields())
    assert int(r.error_code) == Code.NOT_COORDINATOR and r.protocol_name == ""
    r = await call(
        h,
        SYNC_GROUP,
        3,
        group_id=G,
        generation_id=1,
        member_id="m",
        group_instance_id=None,
        assignments={},
    )
    assert int(r.error_code) == Code.NOT_COORDINATOR
    r = await call(h, HEARTBEAT, 3, group_id=G, generation_id=1, member_id="m")
    assert int(r.error_code) == Code.NOT_COORDINATOR
    r = await call(h, LEAVE_GROUP, 1, group_id=G, member_id="m")
    assert int(r.error_code) == Code.NOT_COORDINATOR
    r = await call(h, LEAVE_GROUP, 5, group_id=G, members=[("m", None)])
    assert int(r.error_code) == Code.NOT_COORDINATOR
    c.checks[G] = Code.COORDINATOR_LOAD_IN_PROGRESS
    r = await call(h, DESCRIBE_GROUPS, 5, groups=(G,), include_authorized_operations=False)
    assert int(r.groups[0].error_code) == Code.COORDINATOR_LOAD_IN_PROGRESS
    assert c.membership.state(G) is None  # nothing reached membership


async def test_group_acls_read_and_describe() -> None:
    c = StandInCoordinator()
    auth = DenyGroups({(AclOperation.READ, "ok"), (AclOperation.DESCRIBE, "ok")})
    h = kafka(c, Access(auth))  # type: ignore[arg-type]
    who = CallIdentity(Principal("User", "alice"), "10.0.0.9", "sasl")
    r = await call(h, JOIN_GROUP, 9, who, **join_fields())
    assert int(r.error_code) == Code.GROUP_AUTHORIZATION_FAILED
    assert auth.asked[-1] == (AclOperation.READ, ResourceType.GROUP, G)
    r = await call(h, HEARTBEAT, 4, who, group_id=G, generation_id=1, member_id="m")
    assert int(r.error_code) == Code.GROUP_AUTHORIZATION_FAILED
    r = await call(h, LEAVE_GROUP, 5, who, group_id=G, members=[("m", None)])
    assert int(r.error_code) == Code.GROUP_AUTHORIZATION_FAILED
    r = await call(
        h, DESCRIBE_GROUPS, 5, who, groups=(G, "ok"), include_authorized_operations=False
    )
    assert [int(g.error_code) for g in r.groups] == [Code.GROUP_AUTHORIZATION_FAILED, 0]
    assert auth.asked[-1] == (AclOperation.DESCRIBE, ResourceType.GROUP, "ok")
    fields = join_fields()
    fields["group_id"] = "ok"
    r = await call(h, JOIN_GROUP, 9, who, **fields)
    assert int(r.error_code) == Code.MEMBER_ID_REQUIRED
    # the Kafka port (no principal) is not checked
    r = await call(h, JOIN_GROUP, 9, None, **join_fields())
    assert int(r.error_code) == Code.MEMBER_ID_REQUIRED


async def test_a_failed_store_answers_the_leaders_sync_with_its_error() -> None:
    c = StandInCoordinator()
    h = kafka(c)
    joined = await join(h, 5)
    c.store_error = Code.COORDINATOR_NOT_AVAILABLE
    r = await call(
        h,
        SYNC_GROUP,
        3,
        group_id=G,
        generation_id=1,
        member_id=joined.member_id,
        group_instance_id=None,
        assignments={joined.member_id: b"x"},
    )
    assert int(r.error_code) == Code.COORDINATOR_NOT_AVAILABLE and r.assignment == b""
    state = c.membership.state(G)
    assert state is not None and state[0] in ("PreparingRebalance", "CompletingRebalance")


async def test_two_members_rebalance_and_one_times_out_on_the_event_loop() -> None:
    c = StandInCoordinator()
    h = kafka(c)
    a_first = await call(h, JOIN_GROUP, 5, **join_fields(session_timeout=300))
    b_first = await call(h, JOIN_GROUP, 5, **join_fields(session_timeout=300))
    a_join = asyncio.ensure_future(
        call(h, JOIN_GROUP, 5, **join_fields(a_first.member_id, session_timeout=300))
    )
    b_join = asyncio.ensure_future(
        call(h, JOIN_GROUP, 5, **join_fields(b_first.member_id, session_timeout=300))
    )
    a, b = await asyncio.wait_for(asyncio.gather(a_join, b_join), 5)
    assert a.generation_id == b.generation_id == 1 and a.leader == b.leader
    leader, follower = (a, b) if a.leader == a.member_id else (b, a)
    sync_fields = dict(group_id=G, generation_id=1, group_instance_id=None)
    f_sync = asyncio.ensure_future(
        call(h, SYNC_GROUP, 3, member_id=follower.member_id, assignments={}, **sync_fields)
    )
    await asyncio.sleep(0.01)
    assert not f_sync.done()  # the follower waits for the leader's assignment
    l_sync = await call(
        h,
        SYNC_GROUP,
        3,
        member_id=leader.member_id,
        assignments={leader.member_id: b"L", follower.member_id: b"F"},
        **sync_fields,
    )
    f = await asyncio.wait_for(f_sync, 5)
    assert (l_sync.assignment, f.assignment) == (b"L", b"F")
    # only the leader heartbeats: the follower's session (300 ms) expires on the timer
    deadline = time.monotonic() + 5
    code = Code.NONE
    while time.monotonic() < deadline:
        hb = await call(h, HEARTBEAT, 3, group_id=G, generation_id=1, member_id=leader.member_id)
        code = int(hb.error_code)
        if code == Code.REBALANCE_IN_PROGRESS:
            break
        await asyncio.sleep(0.05)
    assert code == Code.REBALANCE_IN_PROGRESS
    rejoin = await asyncio.wait_for(
        call(h, JOIN_GROUP, 5, **join_fields(leader.member_id, session_timeout=300)), 5
    )
    assert rejoin.generation_id == 2 and [m.member_id for m in rejoin.members] == [leader.member_id]


async def test_stop_answers_every_waiter_not_coordinator_and_refuses_after() -> None:
    c = StandInCoordinator(
        GroupConfig(initial_rebalance_delay_ms=60_000, min_session_timeout_ms=100)
    )
    m = c.membership

    waiting = asyncio.ensure_future(
        m.join(
            JoinRequest(
                G,
                "",
                None,
                "consumer",
                (("range", b"m"),),
                10_000,
                10_000,
                requires_known_member_id=False,
            )
        )
    )
    await asyncio.sleep(0.01)
    assert not waiting.done() and m._timer is not None  # the initial delay is armed
    m.stop()
    result = await asyncio.wait_for(waiting, 1)
    assert result.error == Code.NOT_COORDINATOR
    assert m._timer is None and not m._tasks
    assert m.state(G) is None
    again = await m.join(
        JoinRequest(
            G,
            "",
            None,
            "consumer",
            (("range", b"m"),),
            10_000,
            10_000,
            requires_known_member_id=False,
        )
    )
    assert again.error == Code.NOT_COORDINATOR
    assert await m.heartbeat(G, "x", 1, None) == Code.NOT_COORDINATOR
    m.loaded("other", GroupMetadataValue("consumer", 1, None, None, 0, ()))
    assert m.state("other") is None and m._timer is None
    d = await call(kafka(c), DESCRIBE_GROUPS, 6, groups=(G,), include_authorized_operations=False)
    assert int(d.groups[0].error_code) == Code.NOT_COORDINATOR


async def test_state_timestamp_is_when_the_group_entered_its_state() -> None:
    c = StandInCoordinator()
    m = c.membership
    assert m.state_timestamp(G) is None
    m.loaded("old", GroupMetadataValue("consumer", 1, None, None, -1, ()))
    assert m.state_timestamp("old") is None  # a record without it
    m.loaded("new", GroupMetadataValue("consumer", 1, None, None, 1234, ()))
    assert m.state_timestamp("new") == 1234
    h = kafka(c)
    before = c.clock()
    first = await call(h, JOIN_GROUP, 5, **join_fields())  # the group is made, Empty
    assert int(first.error_code) == Code.MEMBER_ID_REQUIRED and m.state(G) == ("Empty", "")
    ts = m.state_timestamp(G)
    assert ts is not None and before <= ts <= c.clock()


class _TooMuchWork(Exception):
    pass


async def test_loading_and_heartbeating_many_groups_is_linear_work() -> None:
    """20,000 loaded groups and 20,000 heartbeats: Python calls counted (never timed), with a
    budget per group; the quadratic re-arm (a scan of every group per change) blows it."""
    c = StandInCoordinator()
    m = c.membership
    n = 20_000
    values = [
        GroupMetadataValue(
            "consumer",
            5,
            "range",
            f"m{i}",
            0,
            (MemberMetadata(f"m{i}", None, "c", "h", 30_000, 10_000, b"x", b"y"),),
        )
        for i in range(n)
    ]
    budget = 25 * 2 * n  # about 11 calls per load or heartbeat now
    calls = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call":
            calls += 1
            if calls > budget:
                raise _TooMuchWork

    sys.setprofile(count)
    try:
        for i, v in enumerate(values):
            m.loaded(f"g{i}", v)
        await asyncio.sleep(0)  # the timer is armed once, after the load
        for i in range(n):
            assert await m.heartbeat(f"g{i}", f"m{i}", 5, None) == Code.NONE
    except _TooMuchWork:
        pytest.fail(f"more than {budget} calls")
    finally:
        sys.setprofile(None)
    assert m._timer is not None and len(m.groups()) == n


async def test_an_exception_in_the_timer_is_logged_and_the_timer_rearmed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = StandInCoordinator()
    m = c.membership
    m.loaded(
        G,
        GroupMetadataValue(
            "consumer",
            1,
            "range",
            "a",
            0,
            (MemberMetadata("a", None, "c", "h", 200, 200, b"", b""),),
        ),
    )
    tick = m.core.tick
    calls = 0

    def failing_once(now: int) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        tick(now)

    m.core.tick = failing_once  # type: ignore[method-assign]
    await until(lambda: calls >= 1)
    await until(lambda: m.state(G) == ("Empty", "consumer"))  # the session still expires
    assert "group timer failed" in caplog.text


async def test_join_v1_keeps_a_zero_rebalance_timeout() -> None:
    c = StandInCoordinator()
    h = kafka(c)
    asked: list[JoinRequest] = []
    real = c.membership.join

    async def spy(request: JoinRequest) -> Any:
        asked.append(request)
        return await real(request)

    c.membership.join = spy  # type: ignore[method-assign]
    await call(h, JOIN_GROUP, 1, **join_fields(rebalance_timeout=0, session_timeout=10_000))
    v0 = join_fields(session_timeout=7_000)
    v0["group_id"] = "other"
    await call(h, JOIN_GROUP, 0, **v0)
    assert [(r.session_timeout, r.rebalance_timeout) for r in asked] == [
        (10_000, 0),
        (7_000, 7_000),  # v0: the session timeout
    ]


async def test_describe_a_group_with_only_committed_offsets_is_empty() -> None:
    c = StandInCoordinator()
    h = kafka(c)
    c.offsets["simple"] = {("t", 0): object()}
    for version in (0, 6):
        r = await call(
            h,
            DESCRIBE_GROUPS,
            version,
            groups=("simple", "none"),
            include_authorized_operations=False,
        )
        simple, none = r.groups
        assert (int(simple.error_code), simple.group_state, simple.protocol_type) == (
            0,
            "Empty",
            "",
        )
        assert simple.members == ()
        assert none.group_state == "Dead"


async def test_a_members_client_host_is_the_peer_as_kafka_writes_it() -> None:
    c = StandInCoordinator()
    h = kafka(c)
    cls = codec.request_class(JOIN_GROUP, 1)
    module = __import__(cls.__module__, fromlist=["_"])
    fields = join_fields()
    fields["protocols"] = (codec.make(module.JoinGroupRequestProtocol, name="range", metadata=b""),)
    frame = request_bytes(JOIN_GROUP, 1, 7, codec.make(cls, **fields))
    request = codec.parse_request(frame, SUPPORTED, "/10.1.2.3")
    answer = await h.handle(request, None)  # the Kafka port: no principal
    assert int(answer.error_code) == Code.NONE
    d = await call(h, DESCRIBE_GROUPS, 0, groups=(G,), include_authorized_operations=False)
    assert [m.client_host for m in d.groups[0].members] == ["/10.1.2.3"]


async def test_loaded_drops_no_effect_waiting_delivery() -> None:
    c = StandInCoordinator()
    m = c.membership
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    # (the group core's own queue; test_replication_core_api's rule is about the replica core)
    group_core = m.core
    group_core._effects.append(Reply(future, SyncResult(Code.NONE)))  # one not yet delivered
    m.loaded(G, GroupMetadataValue("consumer", 1, None, None, 0, ()))
    await asyncio.sleep(0)
    assert future.done() and future.result() == SyncResult(Code.NONE)
