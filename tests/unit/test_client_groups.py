"""Consumer groups in minibroker's own client (client/groups/): Kafka's assignors, the consumer
protocol's bytes, Kafka frames written with kio (read back by the broker's own codec), and the
member's join/heartbeat/commit state machine against a fake coordinator."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.kafka import codec
from minibroker.client.errors import (
    ErrorCode,
    GroupError,
    IllegalGenerationError,
    InconsistentGroupProtocolError,
    NotCoordinatorError,
    RebalanceInProgressError,
    RequestTimedOutError,
)
from minibroker.client.groups import kafka_call as api
from minibroker.client.groups.assignors import RangeAssignor, RoundRobinAssignor, assignor_for
from minibroker.client.groups.coordinator import (
    CommittedOffset,
    GroupMember,
    GroupSettings,
    MemberState,
    group_error,
)
from minibroker.client.groups.protocol import (
    ProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from minibroker.client.groups.transport import coordinator_answer
from minibroker.client.types import TopicPartition as TP
from minibroker.client.wire import CallFailed

# -- assignors ----------------------------------------------------------------------------------


def subs(**topics: tuple[str, ...]) -> dict[str, Subscription]:
    return {member: Subscription(tuple(ts)) for member, ts in topics.items()}


def test_range_matches_kafka_two_consumers_two_topics_six_partitions() -> None:
    # RangeAssignorTest.testTwoConsumersTwoTopicsSixPartitions
    got = RangeAssignor().assign(
        {"topic1": 3, "topic2": 3},
        subs(consumer1=("topic1", "topic2"), consumer2=("topic1", "topic2")),
    )
    assert got == {
        "consumer1": [TP("topic1", 0), TP("topic1", 1), TP("topic2", 0), TP("topic2", 1)],
        "consumer2": [TP("topic1", 2), TP("topic2", 2)],
    }


def test_range_matches_kafka_mixed_topics() -> None:
    # RangeAssignorTest.testMultipleConsumersMixedTopics
    got = RangeAssignor().assign(
        {"topic1": 3, "topic2": 2},
        subs(consumer1=("topic1",), consumer2=("topic1", "topic2"), consumer3=("topic1",)),
    )
    assert got == {
        "consumer1": [TP("topic1", 0)],
        "consumer2": [TP("topic1", 1), TP("topic2", 0), TP("topic2", 1)],
        "consumer3": [TP("topic1", 2)],
    }


def test_range_orders_static_members_by_instance_id_first() -> None:
    # RangeAssignorTest.testOneStaticConsumerAndOneDynamicConsumerTwoTopicsSixPartitions
    members = {
        "consumer-b": Subscription(("topic1", "topic2"), group_instance_id="instance1"),
        "consumer-a": Subscription(("topic1", "topic2")),
    }
    got = RangeAssignor().assign({"topic1": 3, "topic2": 3}, members)
    assert got["consumer-b"] == [TP("topic1", 0), TP("topic1", 1), TP("topic2", 0), TP("topic2", 1)]
    assert got["consumer-a"] == [TP("topic1", 2), TP("topic2", 2)]


def test_range_static_member_ranks_persist() -> None:
    # RangeAssignorTest.testStaticMemberRangeAssignmentPersistent (5 and 4 partitions, 4 members)
    got = RangeAssignor().assign(
        {"topic1": 5, "topic2": 4},
        {f"consumer{i}": Subscription(("topic1", "topic2")) for i in range(1, 5)},
    )
    assert got["consumer1"] == [TP("topic1", 0), TP("topic1", 1), TP("topic2", 0)]
    assert got["consumer4"] == [TP("topic1", 4), TP("topic2", 3)]


def test_range_unknown_topic_and_two_members_one_partition() -> None:
    got = RangeAssignor().assign(
        {"topic1": 1}, subs(consumer1=("topic1", "gone"), consumer2=("topic1",))
    )
    assert got == {"consumer1": [TP("topic1", 0)], "consumer2": []}


def test_roundrobin_matches_kafka_mixed_topics() -> None:
    # RoundRobinAssignorTest.testMultipleConsumersMixedTopics
    got = RoundRobinAssignor().assign(
        {"topic1": 3, "topic2": 2},
        subs(consumer1=("topic1",), consumer2=("topic1", "topic2"), consumer3=("topic1",)),
    )
    assert got == {
        "consumer1": [TP("topic1", 0)],
        "consumer2": [TP("topic1", 1), TP("topic2", 0), TP("topic2", 1)],
        "consumer3": [TP("topic1", 2)],
    }


def test_roundrobin_two_consumers_two_topics_six_partitions() -> None:
    got = RoundRobinAssignor().assign(
        {"topic1": 3, "topic2": 3},
        subs(consumer1=("topic1", "topic2"), consumer2=("topic1", "topic2")),
    )
    assert got == {
        "consumer1": [TP("topic1", 0), TP("topic1", 2), TP("topic2", 1)],
        "consumer2": [TP("topic1", 1), TP("topic2", 0), TP("topic2", 2)],
    }


def test_unknown_assignor_is_refused() -> None:
    with pytest.raises(ValueError, match="cooperative"):
        assignor_for("cooperative-sticky")


@st.composite
def groups(draw: Any) -> tuple[dict[str, int], dict[str, Subscription]]:
    topics = draw(st.dictionaries(st.sampled_from("abcde"), st.integers(0, 9), min_size=1))
    names = sorted(topics)
    members = draw(
        st.dictionaries(
            st.text("xyz0123", min_size=1, max_size=4),
            st.lists(st.sampled_from(names), min_size=1, unique=True),
            min_size=1,
            max_size=6,
        )
    )
    return topics, {m: Subscription(tuple(ts)) for m, ts in members.items()}


@pytest.mark.parametrize("assignor", [RangeAssignor(), RoundRobinAssignor()], ids=lambda a: a.name)
@settings(max_examples=200, deadline=None)
@given(group=groups())
def test_every_subscribed_partition_is_assigned_exactly_once(
    assignor: RangeAssignor | RoundRobinAssignor,
    group: tuple[dict[str, int], dict[str, Subscription]],
) -> None:
    counts, members = group
    got = assignor.assign(counts, members)
    assert set(got) == set(members)
    handed = [tp for tps in got.values() for tp in tps]
    wanted = {TP(t, p) for s in members.values() for t in s.topics for p in range(counts.get(t, 0))}
    assert len(handed) == len(set(handed)) and set(handed) == wanted
    for member, tps in got.items():
        assert all(tp.topic in members[member].topics for tp in tps)
    # Balance per topic for range: sizes differ by at most one among the topic's members.
    if assignor.name == "range":
        for topic, n in counts.items():
            sizes = [
                sum(1 for tp in got[m] if tp.topic == topic)
                for m in members
                if topic in members[m].topics
            ]
            if sizes:
                assert max(sizes) - min(sizes) <= 1 and sum(sizes) == n


# -- the consumer protocol's bytes --------------------------------------------------------------


def test_subscription_and_assignment_round_trip() -> None:
    data = encode_subscription(["b", "a", "b"], b"u")
    assert data[:2] == b"\x00\x00"  # version 0
    assert decode_subscription(data, "i1") == Subscription(("a", "b"), b"u", (), "i1")
    tps = [TP("t", 1), TP("s", 0), TP("t", 0)]
    assert decode_assignment(encode_assignment(tps)) == sorted(tps)
    assert decode_assignment(b"") == []


def test_newer_subscription_versions_read_with_trailing_fields() -> None:
    # A v3 subscription (Java 3.x clients) as v1 + generation + rack: the topics still read.
    v0 = encode_subscription(["t"])
    v3 = b"\x00\x03" + v0[2:] + b"\x00\x00\x00\x00" + b"\xff\xff\xff\xff" + b"\xff\xff"
    assert decode_subscription(v3).topics == ("t",)
    with pytest.raises(ProtocolError):
        decode_subscription(b"\x00")


# -- Kafka frames with kio ---------------------------------------------------------------------


@pytest.mark.parametrize("api_key", sorted(api.VERSIONS))
def test_every_request_version_reads_back_in_the_brokers_codec(api_key: int) -> None:
    values = {
        "group_id": "g",
        "key": "g",
        "coordinator_keys": ["g"],
        "session_timeout": 6000,
        "rebalance_timeout": 9000,
        "member_id": "m",
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"x"}],
        "generation_id": 3,
        "generation_id_or_member_epoch": 3,
        "assignments": [{"member_id": "m", "assignment": b"a"}],
        "members": [{"member_id": "m", "group_instance_id": None}],
        "topics": [{"name": "t", "partitions": [], "partition_indexes": [0, 1]}],
        "groups": ["g"],
        "groups_names": ["g"],
        "retention_time": -1,
        "include_authorized_operations": False,
    }
    for version in api.VERSIONS[api_key]:
        body = api.build(api.request_class(api_key, version), values)
        frame = api.encode_request(api_key, version, 41, "me", body)
        parsed = codec.parse_request(frame, {api_key: (0, 99)})
        assert (parsed.api_key, parsed.api_version, parsed.correlation_id) == (
            api_key,
            version,
            41,
        )
        assert parsed.client_id == "me" and parsed.body == body


def test_a_response_written_by_the_broker_reads_back() -> None:
    cls = api.response_class(api.JOIN_GROUP, 7)
    member = codec.nested(cls, "JoinGroupResponseMember")
    assert member is not None
    body = codec.make(
        cls,
        throttle_time=0,
        error_code=0,
        generation_id=4,
        protocol_type="consumer",
        protocol_name="range",
        leader="m1",
        member_id="m1",
        members=(codec.make(member, member_id="m1", group_instance_id=None, metadata=b"s"),),
    )
    frame = codec.encode_response(api.JOIN_GROUP, 7, 99, body)
    correlation, got = api.decode_response(api.JOIN_GROUP, 7, frame[4:])
    assert correlation == 99 and got == body and api.code_of(got.error_code) == 0


def test_find_coordinator_answers_of_both_shapes() -> None:
    old = SimpleNamespace(error_code=0, node_id=2, error_message=None)
    new = SimpleNamespace(
        coordinators=[SimpleNamespace(key="g", error_code=15, node_id=-1, error_message="x")]
    )
    assert coordinator_answer(old) == (0, 2, "")
    assert coordinator_answer(new) == (15, -1, "x")


def test_group_codes_without_a_class_name_kafkas_name() -> None:
    err = group_error(68, "DeleteGroups")
    assert isinstance(err, GroupError) and "NON_EMPTY_GROUP" in str(err)
    assert isinstance(group_error(69, "x"), GroupError) and "GROUP_ID_NOT_FOUND" in str(
        group_error(69, "x")
    )
    assert isinstance(group_error(16, "x"), NotCoordinatorError)
    assert NotCoordinatorError("x").retriable and not IllegalGenerationError("x").retriable


# -- the member's state machine against a fake coordinator --------------------------------------


class FakeCoordinator:
    """Answers by api key from scripted queues (the last answer repeats)."""

    def __init__(self) -> None:
        self.now = 0
        self.answers: dict[int, list[Any]] = {}
        self.sent: list[tuple[str, int, dict[str, Any]]] = []
        self.finds = 0
        self.coordinators = ["b1:1"]

    def clock(self) -> int:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += int(seconds * 1000)

    def script(self, api_key: int, *answers: Any) -> None:
        self.answers[api_key] = list(answers)

    async def find_coordinator(self, group_id: str, timeout_s: float) -> str:
        self.finds += 1
        address = self.coordinators[min(self.finds - 1, len(self.coordinators) - 1)]
        if isinstance(address, Exception):
            raise address
        return address

    async def send(
        self, address: str, api_key: int, values: Mapping[str, Any], timeout_s: float
    ) -> Any:
        self.sent.append((address, api_key, dict(values)))
        queue = self.answers[api_key]
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer(values) if callable(answer) else answer


def join_answer(
    code: int = 0, member: str = "m1", leader: str = "m1", gen: int = 1, **kw: Any
) -> Any:
    members = kw.get(
        "members",
        [
            SimpleNamespace(
                member_id="m1", group_instance_id=None, metadata=encode_subscription(["t"])
            )
        ],
    )
    return SimpleNamespace(
        error_code=code,
        generation_id=gen,
        protocol_name="range",
        leader=leader,
        member_id=member,
        members=members if leader == member else [],
    )


def sync_answer(code: int = 0, tps: list[TP] | None = None) -> Any:
    return SimpleNamespace(error_code=code, assignment=encode_assignment(tps or []))


def make_member(fake: FakeCoordinator, **kw: Any) -> GroupMember:
    settings = GroupSettings(
        "g", session_timeout_ms=6000, heartbeat_interval_ms=500, max_poll_interval_ms=10_000, **kw
    )
    return GroupMember(settings, fake, fake.clock, fake.sleep)


async def counts(topics: Any) -> dict[str, int]:
    return {t: 2 for t in topics}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_join_rejoins_with_the_member_id_the_coordinator_requires() -> None:
    fake = FakeCoordinator()
    fake.script(
        api.JOIN_GROUP, join_answer(ErrorCode.MEMBER_ID_REQUIRED, member="m1"), join_answer()
    )
    fake.script(api.SYNC_GROUP, lambda v: sync_answer(tps=[TP("t", 0), TP("t", 1)]))
    member = make_member(fake)
    got = run(member.join_round(["t"], counts, 60_000))
    joins = [v for _a, k, v in fake.sent if k == api.JOIN_GROUP]
    assert [j["member_id"] for j in joins] == ["", "m1"]
    assert [p["name"] for p in joins[0]["protocols"]] == ["range", "roundrobin"]
    assert got == [TP("t", 0), TP("t", 1)]
    assert (
        member.state is MemberState.STABLE and member.generation == 1 and not member.rejoin_needed
    )
    # The leader sent the range assignment of the member's subscription (2 partitions).
    sync = next(v for _a, k, v in fake.sent if k == api.SYNC_GROUP)
    assert decode_assignment(sync["assignments"][0]["assignment"]) == [TP("t", 0), TP("t", 1)]
    assert member.assigned_counts == {"t": 2}


def test_a_follower_sends_no_assignments() -> None:
    fake = FakeCoordinator()
    fake.script(api.JOIN_GROUP, join_answer(member="m2", leader="m1"))
    fake.script(api.SYNC_GROUP, sync_answer(tps=[TP("t", 1)]))
    member = make_member(fake)
    assert run(member.join_round(["t"], counts, 60_000)) == [TP("t", 1)]
    sync = next(v for _a, k, v in fake.sent if k == api.SYNC_GROUP)
    assert sync["assignments"] == [] and not member.is_leader


def test_sync_errors_start_the_round_again() -> None:
    fake = FakeCoordinator()
    fake.script(api.JOIN_GROUP, join_answer(gen=1), join_answer(gen=2), join_answer(gen=3))
    fake.script(
        api.SYNC_GROUP,
        sync_answer(ErrorCode.REBALANCE_IN_PROGRESS),
        sync_answer(ErrorCode.UNKNOWN_MEMBER_ID),
        sync_answer(tps=[TP("t", 0)]),
    )
    member = make_member(fake)
    assert run(member.join_round(["t"], counts, 60_000)) == [TP("t", 0)]
    joins = [v["member_id"] for _a, k, v in fake.sent if k == api.JOIN_GROUP]
    assert joins == ["", "m1", ""]  # UNKNOWN_MEMBER_ID forgets the member id
    assert member.generation == 3


def test_not_coordinator_finds_the_coordinator_again_with_backoff() -> None:
    fake = FakeCoordinator()
    fake.coordinators = ["b1:1", "b2:2"]
    fake.script(api.JOIN_GROUP, join_answer(ErrorCode.NOT_COORDINATOR), join_answer())
    fake.script(api.SYNC_GROUP, sync_answer(tps=[]))
    member = make_member(fake)
    run(member.join_round(["t"], counts, 60_000))
    assert [a for a, k, _v in fake.sent if k == api.JOIN_GROUP] == ["b1:1", "b2:2"]
    assert fake.now == 100  # one retry.backoff.ms


def test_a_failed_call_forgets_the_coordinator_and_the_deadline_holds() -> None:
    fake = FakeCoordinator()
    fake.script(api.JOIN_GROUP, CallFailed(NotCoordinatorError("down"), True))
    member = make_member(fake)
    with pytest.raises(RequestTimedOutError):
        run(member.join_round(["t"], counts, 1_000))
    assert fake.finds >= 5 and fake.now <= 1_000


def test_fatal_join_errors_raise() -> None:
    fake = FakeCoordinator()
    fake.script(api.JOIN_GROUP, join_answer(ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
    with pytest.raises(InconsistentGroupProtocolError):
        run(make_member(fake).join_round(["t"], counts, 60_000))


def stable_member(fake: FakeCoordinator) -> GroupMember:
    fake.script(api.JOIN_GROUP, join_answer())
    fake.script(api.SYNC_GROUP, sync_answer(tps=[TP("t", 0)]))
    member = make_member(fake)
    run(member.join_round(["t"], counts, 60_000))
    return member


@pytest.mark.parametrize(
    ("code", "rejoin", "member_id", "generation"),
    [
        (ErrorCode.NONE, False, "m1", 1),
        (ErrorCode.REBALANCE_IN_PROGRESS, True, "m1", 1),
        (ErrorCode.ILLEGAL_GENERATION, True, "m1", -1),
        (ErrorCode.UNKNOWN_MEMBER_ID, True, "", -1),
        (ErrorCode.FENCED_INSTANCE_ID, True, "", -1),
    ],
)
def test_heartbeat_answers(code: int, rejoin: bool, member_id: str, generation: int) -> None:
    fake = FakeCoordinator()
    member = stable_member(fake)
    fake.script(api.HEARTBEAT, SimpleNamespace(error_code=code))
    run(member.heartbeat_once())
    beat = [v for _a, k, v in fake.sent if k == api.HEARTBEAT][-1]
    assert beat["generation_id"] == 1 and beat["member_id"] == "m1"
    assert (member.rejoin_needed, member.member_id, member.generation) == (
        rejoin,
        member_id,
        generation,
    )


def test_heartbeat_not_coordinator_forgets_the_coordinator() -> None:
    fake = FakeCoordinator()
    member = stable_member(fake)
    fake.script(api.HEARTBEAT, SimpleNamespace(error_code=ErrorCode.NOT_COORDINATOR))
    run(member.heartbeat_once())
    assert member.coordinator is None and not member.rejoin_needed


def test_a_member_that_stops_polling_leaves_the_group() -> None:
    fake = FakeCoordinator()
    member = stable_member(fake)
    fake.script(api.LEAVE_GROUP, SimpleNamespace(error_code=0, members=[]))
    fake.script(api.HEARTBEAT, SimpleNamespace(error_code=0))
    fake.now = member.last_poll_ms + 10_001
    run(member.heartbeat_once())
    assert [k for _a, k, _v in fake.sent][-1] == api.LEAVE_GROUP
    assert member.rejoin_needed and member.member_id == "" and member.state is MemberState.UNJOINED
    # Just within max.poll.interval.ms a member heartbeats instead.
    fake2 = FakeCoordinator()
    member2 = stable_member(fake2)
    fake2.script(api.HEARTBEAT, SimpleNamespace(error_code=0))
    fake2.now = member2.last_poll_ms + 10_000
    run(member2.heartbeat_once())
    assert [k for _a, k, _v in fake2.sent][-1] == api.HEARTBEAT


def test_commit_carries_the_generation_and_a_simple_commit_does_not() -> None:
    fake = FakeCoordinator()
    ok = SimpleNamespace(topics=[SimpleNamespace(partitions=[SimpleNamespace(error_code=0)])])
    fake.script(api.OFFSET_COMMIT, ok)
    member = make_member(fake)
    run(member.commit({TP("t", 0): CommittedOffset(5)}, 60_000))
    first = [v for _a, k, v in fake.sent if k == api.OFFSET_COMMIT][-1]
    assert (first["generation_id_or_member_epoch"], first["member_id"]) == (-1, "")
    fake2 = FakeCoordinator()
    member2 = stable_member(fake2)
    fake2.script(api.OFFSET_COMMIT, ok)
    run(member2.commit({TP("t", 0): CommittedOffset(7)}, 60_000))
    sent = [v for _a, k, v in fake2.sent if k == api.OFFSET_COMMIT][-1]
    assert (sent["generation_id_or_member_epoch"], sent["member_id"]) == (1, "m1")
    assert sent["topics"] == [
        {
            "name": "t",
            "partitions": [
                {
                    "partition_index": 0,
                    "committed_offset": 7,
                    "committed_leader_epoch": -1,
                    "committed_metadata": "",
                }
            ],
        }
    ]


def test_commit_on_illegal_generation_raises_and_asks_to_rejoin() -> None:
    fake = FakeCoordinator()
    member = stable_member(fake)
    bad = SimpleNamespace(
        topics=[
            SimpleNamespace(partitions=[SimpleNamespace(error_code=ErrorCode.ILLEGAL_GENERATION)])
        ]
    )
    fake.script(api.OFFSET_COMMIT, bad)
    with pytest.raises(IllegalGenerationError):
        run(member.commit({TP("t", 0): CommittedOffset(1)}, 60_000))
    assert member.rejoin_needed and member.generation == -1


def test_fetch_committed_retries_load_in_progress_and_reads_none() -> None:
    fake = FakeCoordinator()

    def answer(code: int) -> Any:
        parts = [
            SimpleNamespace(partition_index=0, committed_offset=12, metadata="m", error_code=0),
            SimpleNamespace(partition_index=1, committed_offset=-1, metadata=None, error_code=0),
        ]
        return SimpleNamespace(
            error_code=code, topics=[SimpleNamespace(name="t", partitions=parts)]
        )

    fake.script(api.OFFSET_FETCH, answer(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS), answer(0))
    member = make_member(fake)
    got = run(member.fetch_committed([TP("t", 0), TP("t", 1)], 60_000))
    assert got == {TP("t", 0): CommittedOffset(12, "m", -1), TP("t", 1): None}
    assert len([k for _a, k, _v in fake.sent if k == api.OFFSET_FETCH]) == 2


def test_leader_sees_partition_count_changes() -> None:
    fake = FakeCoordinator()
    member = stable_member(fake)
    assert member.is_leader
    assert not member.metadata_changed({"t": 2})
    assert member.metadata_changed({"t": 3})
    assert member.metadata_changed({"t": 0})  # deleted
    assert not member.metadata_changed({})  # not fetched: no evidence


def test_a_subscribed_member_commits_only_when_stable() -> None:
    fake = FakeCoordinator()
    member = stable_member(fake)
    member.subscribed = True
    fake.script(api.HEARTBEAT, SimpleNamespace(error_code=ErrorCode.ILLEGAL_GENERATION))
    run(member.heartbeat_once())
    with pytest.raises(RebalanceInProgressError):
        run(member.commit({TP("t", 0): CommittedOffset(1)}, 60_000))
    assert not [k for _a, k, _v in fake.sent if k == api.OFFSET_COMMIT]


def test_subscription_v1_owned_partitions_read() -> None:
    import io

    from kio.schema.consumer_protocol_subscription.v1 import data as v1
    from kio.schema.types import TopicName
    from kio.serial import entity_writer
    from kio.static.primitive import i32

    buffer = io.BytesIO()
    buffer.write(b"\x00\x01")
    entity_writer(v1.ConsumerProtocolSubscription)(
        buffer,
        v1.ConsumerProtocolSubscription(
            topics=("t",),
            user_data=None,
            owned_partitions=(v1.TopicPartition(topic=TopicName("t"), partitions=(i32(2),)),),
        ),
    )
    assert decode_subscription(buffer.getvalue()).owned_partitions == (TP("t", 2),)


# -- the consumer's side of a rebalance (AsyncConsumer with a fake coordinator) -----------------


def test_consumer_commits_before_revoking_and_starts_at_committed_offsets() -> None:
    from minibroker.client.consumer import AsyncConsumer

    async def scenario() -> tuple[list[int], dict[TP, int | None], list[set[TP]]]:
        fake = FakeCoordinator()
        fake.now = 10**9
        consumer = AsyncConsumer(
            "127.0.0.1:1",
            group_id="g",
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
            auto_offset_reset="none",
        )
        group = consumer._group
        assert group is not None
        group.transport = fake
        group.sleep = fake.sleep

        async def partition_counts(topics: Any) -> dict[str, int]:
            return {t: 2 for t in topics}

        consumer._partition_counts = partition_counts  # type: ignore[method-assign]

        async def no_validation() -> None:
            return None

        consumer._validate_assignment = no_validation  # type: ignore[method-assign]
        fake.script(api.JOIN_GROUP, join_answer(gen=1), join_answer(gen=2))
        fake.script(
            api.SYNC_GROUP,
            sync_answer(tps=[TP("t", 0), TP("t", 1)]),
            sync_answer(tps=[TP("t", 1)]),
        )

        def offsets(values: Mapping[str, Any]) -> Any:
            parts = [
                SimpleNamespace(partition_index=p, committed_offset=o, metadata="", error_code=0)
                for p, o in ((0, 7), (1, -1))
            ]
            return SimpleNamespace(
                error_code=0, topics=[SimpleNamespace(name="t", partitions=parts)]
            )

        fake.script(api.OFFSET_FETCH, offsets)
        ok = SimpleNamespace(topics=[SimpleNamespace(partitions=[SimpleNamespace(error_code=0)])])
        fake.script(api.OFFSET_COMMIT, ok)
        fake.script(api.HEARTBEAT, SimpleNamespace(error_code=0))
        fake.script(api.LEAVE_GROUP, SimpleNamespace(error_code=0, members=[]))
        revoked: list[set[TP]] = []
        consumer.subscribe(["t"], on_revoke=revoked.append)
        try:
            await consumer.poll(0)
            await asyncio.wait_for(consumer._join or asyncio.sleep(0), 5)
            await consumer.poll(0)
            positions = {tp: consumer._state(tp).position for tp in consumer.assignment()}
            # A rebalance: the positions are committed before the partitions are revoked.
            consumer._state(TP("t", 0)).seek(9)
            group.request_rejoin("test")
            await consumer.poll(0)
            if consumer._join is not None:
                await asyncio.wait_for(consumer._join, 5)
            kinds = [k for _a, k, _v in fake.sent]
            commit = next(v for _a, k, v in fake.sent if k == api.OFFSET_COMMIT)
            committed_offsets = [
                p["committed_offset"] for t in commit["topics"] for p in t["partitions"]
            ]
            assert kinds.index(api.OFFSET_COMMIT) < len(kinds) - 1 - kinds[::-1].index(
                api.JOIN_GROUP
            )
            assert consumer.assignment() == {TP("t", 1)}
            return committed_offsets, positions, revoked
        finally:
            consumer.enable_auto_commit = False
            await consumer.close()

    committed_offsets, positions, revoked = run(scenario())
    # t-0 started at its committed offset 7; t-1 has none (and auto_offset_reset "none").
    assert positions == {TP("t", 0): 7, TP("t", 1): None}
    assert committed_offsets == [9]  # only t-0 had a position
    assert revoked == [{TP("t", 0), TP("t", 1)}]
