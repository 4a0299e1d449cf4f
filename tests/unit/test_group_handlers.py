"""G1's group APIs through KafkaHandlers: every advertised version of FindCoordinator,
OffsetCommit, OffsetFetch, ListGroups and DeleteGroups is read, answered and written back as
Kafka's bytes; commits are fetched back; Kafka's GROUP and TOPIC ACL checks when the caller is
known and an authorizer is configured."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from kio.schema.errors import ErrorCode as KafkaError

from minibroker.broker.groups.coordinator import partition_for
from minibroker.broker.groups.records import GroupMetadataValue
from minibroker.broker.kafka import codec
from minibroker.broker.kafka.group_handlers import (
    DELETE_GROUPS,
    FIND_COORDINATOR,
    LIST_GROUPS,
    OFFSET_COMMIT,
    OFFSET_FETCH,
)
from minibroker.broker.kafka.handlers import SUPPORTED, KafkaHandlers
from minibroker.client.common.security import Access, CallIdentity
from minibroker.metadata.acl import AclOperation, Principal, ResourceType
from tests.unit.group_support import PARTITIONS, FakeReplicaManager, coordinator, lead_all
from tests.unit.test_kafka_protocol import read_response, request_bytes

G1_APIS = (FIND_COORDINATOR, OFFSET_COMMIT, OFFSET_FETCH, LIST_GROUPS, DELETE_GROUPS)
VERSIONS = [(k, v) for k in G1_APIS for v in range(SUPPORTED[k][0], SUPPORTED[k][1] + 1)]
GROUP = "my-group"


def req(api_key: int, version: int, **values: Any) -> Any:
    return codec.make(codec.request_class(api_key, version), **values)


def nested_req(api_key: int, version: int, cls_name: str, **values: Any) -> Any:
    module = __import__(codec.request_class(api_key, version).__module__, fromlist=["_"])
    return codec.make(getattr(module, cls_name), **values)


def commit_request(version: int, group: str, offset: int, generation: int = -1) -> Any:
    partition = nested_req(
        OFFSET_COMMIT,
        version,
        "OffsetCommitRequestPartition",
        partition_index=1,
        committed_offset=offset,
        committed_leader_epoch=4,
        committed_metadata="meta",
        commit_timestamp=-1,
    )
    topic = nested_req(
        OFFSET_COMMIT, version, "OffsetCommitRequestTopic", name="events", partitions=(partition,)
    )
    return req(
        OFFSET_COMMIT,
        version,
        group_id=group,
        generation_id_or_member_epoch=generation,
        member_id="",
        group_instance_id=None,
        retention_time=-1,
        topics=(topic,),
    )


def fetch_request(version: int, group: str, all_topics: bool = False) -> Any:
    if version >= 8:
        topics = None
        if not all_topics:
            topics = (
                nested_req(
                    OFFSET_FETCH,
                    version,
                    "OffsetFetchRequestTopics",
                    name="events",
                    partition_indexes=(0, 1),
                ),
            )
        g = nested_req(
            OFFSET_FETCH, version, "OffsetFetchRequestGroup", group_id=group, topics=topics
        )
        return req(OFFSET_FETCH, version, groups=(g,), require_stable=False)
    topic = nested_req(
        OFFSET_FETCH, version, "OffsetFetchRequestTopic", name="events", partition_indexes=(0, 1)
    )
    return req(
        OFFSET_FETCH,
        version,
        group_id=group,
        topics=None if all_topics and version >= 2 else (topic,),
        require_stable=False,
    )


def sample(api_key: int, version: int) -> Any:
    if api_key == FIND_COORDINATOR:
        return req(api_key, version, key=GROUP, key_type=0, coordinator_keys=(GROUP, "other"))
    if api_key == OFFSET_COMMIT:
        return commit_request(version, GROUP, 77)
    if api_key == OFFSET_FETCH:
        return fetch_request(version, GROUP)
    if api_key == LIST_GROUPS:
        return req(api_key, version, states_filter=())
    return req(api_key, version, groups_names=(GROUP, "nobody"))


async def round_trip(
    handlers: KafkaHandlers, api_key: int, version: int, body: Any, who: Any = None
) -> Any:
    payload = request_bytes(api_key, version, 7, body)
    request = codec.parse_request(payload, SUPPORTED)
    answer = await handlers.handle(request, principal=who)
    frame = codec.encode_response(api_key, version, 7, answer)
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    correlation_id, read = read_response(api_key, version, frame[4:])
    assert correlation_id == 7
    return read


async def setup() -> tuple[FakeReplicaManager, Any, KafkaHandlers]:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, _membership = coordinator(rm)
    await lead_all(rm, c)
    return rm, c, KafkaHandlers(rm, c)  # type: ignore[arg-type]


def fetched(body: Any, version: int) -> dict[int, tuple[int, int]]:
    if version >= 8:
        [group] = body.groups
        assert group.error_code == KafkaError.none
        topics = group.topics
    else:
        topics = body.topics
    return {
        p.partition_index: (p.committed_offset, p.error_code) for t in topics for p in t.partitions
    }


@pytest.mark.parametrize(("api_key", "version"), VERSIONS)
async def test_every_advertised_version_is_answered(api_key: int, version: int) -> None:
    _rm, c, handlers = await setup()
    if api_key in (OFFSET_FETCH, DELETE_GROUPS, LIST_GROUPS):
        await round_trip(handlers, OFFSET_COMMIT, 8, commit_request(8, GROUP, 77))
    body = await round_trip(handlers, api_key, version, sample(api_key, version))
    if api_key == FIND_COORDINATOR:
        answers = body.coordinators if version >= 4 else [body]
        assert next((a.error_code, a.node_id, a.port) for a in answers) == (
            KafkaError.none,
            1,
            19091,
        )
        if version >= 4:
            assert [a.key for a in answers] == [GROUP, "other"]
    elif api_key == OFFSET_COMMIT:
        [topic] = body.topics
        assert [(p.partition_index, p.error_code) for p in topic.partitions] == [
            (1, KafkaError.none)
        ]
        assert c.committed(GROUP)[("events", 1)].offset == 77
    elif api_key == OFFSET_FETCH:
        assert fetched(body, version) == {0: (-1, KafkaError.none), 1: (77, KafkaError.none)}
    elif api_key == LIST_GROUPS:
        assert body.error_code == KafkaError.none
        assert [(g.group_id, g.protocol_type) for g in body.groups] == [(GROUP, "")]
    else:
        assert [(r.group_id, r.error_code) for r in body.results] == [
            (GROUP, KafkaError.none),
            ("nobody", KafkaError.group_id_not_found),
        ]
        assert c.committed(GROUP) == {}


async def test_find_coordinator_before_the_topic_exists_asks_for_it() -> None:
    rm = FakeReplicaManager()
    c, _ = coordinator(rm)
    handlers = KafkaHandlers(rm, c)  # type: ignore[arg-type]
    asked: list[Any] = []

    class Link:
        async def forward(self, method: str, request: Any, timeout_s: float) -> Any:
            asked.append((method, request))
            return type("R", (), {"topics": []})()

    rm.link = Link()
    body = await round_trip(handlers, FIND_COORDINATOR, 3, sample(FIND_COORDINATOR, 3))
    assert body.error_code == KafkaError.coordinator_not_available
    for task in list(rm.tasks):
        await task
    [(method, request)] = asked
    assert method == "CreateTopics"
    [topic] = request.topics
    assert (topic.name, topic.num_partitions, topic.replication_factor) == (
        "__consumer_offsets",
        PARTITIONS,
        3,
    )
    assert dict(topic.configs) == {
        "cleanup.policy": "compact",
        "min.insync.replicas": "2",
        "segment.bytes": "104857600",
    }


async def test_commit_refusals() -> None:
    _rm, c, handlers = await setup()
    # a generation on a group without members
    body = await round_trip(handlers, OFFSET_COMMIT, 8, commit_request(8, GROUP, 1, generation=3))
    assert body.topics[0].partitions[0].error_code == KafkaError.illegal_generation
    # an unknown topic, and metadata too long
    partition = nested_req(
        OFFSET_COMMIT,
        8,
        "OffsetCommitRequestPartition",
        partition_index=0,
        committed_offset=1,
        committed_leader_epoch=-1,
        committed_metadata="x" * 4097,
    )
    topics = tuple(
        nested_req(OFFSET_COMMIT, 8, "OffsetCommitRequestTopic", name=n, partitions=(partition,))
        for n in ("nope", "events")
    )
    request = req(
        OFFSET_COMMIT,
        8,
        group_id=GROUP,
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=topics,
    )
    body = await round_trip(handlers, OFFSET_COMMIT, 8, request)
    assert [(t.name, t.partitions[0].error_code) for t in body.topics] == [
        ("nope", KafkaError.unknown_topic_or_partition),
        ("events", KafkaError.offset_metadata_too_large),
    ]
    assert c.committed(GROUP) == {}


async def test_not_the_coordinator_and_loading() -> None:
    _rm, c, handlers = await setup()
    p = partition_for(GROUP, PARTITIONS)
    c.partitions[p] = "loading"
    body = await round_trip(handlers, OFFSET_FETCH, 7, fetch_request(7, GROUP))
    assert body.error_code == KafkaError.coordinator_load_in_progress
    body = await round_trip(handlers, OFFSET_FETCH, 1, fetch_request(1, GROUP))
    assert {p.error_code for t in body.topics for p in t.partitions} == {
        KafkaError.coordinator_load_in_progress
    }
    body = await round_trip(handlers, LIST_GROUPS, 4, sample(LIST_GROUPS, 4))
    assert body.error_code == KafkaError.coordinator_load_in_progress
    del c.partitions[p]
    body = await round_trip(handlers, OFFSET_COMMIT, 8, commit_request(8, GROUP, 1))
    assert body.topics[0].partitions[0].error_code == KafkaError.not_coordinator


async def test_offset_fetch_all_topics_and_list_groups_states() -> None:
    _rm, c, handlers = await setup()
    await round_trip(handlers, OFFSET_COMMIT, 8, commit_request(8, GROUP, 5))
    body = await round_trip(handlers, OFFSET_FETCH, 8, fetch_request(8, GROUP, all_topics=True))
    assert fetched(body, 8) == {1: (5, KafkaError.none)}
    body = await round_trip(handlers, OFFSET_FETCH, 6, fetch_request(6, GROUP, all_topics=True))
    assert fetched(body, 6) == {1: (5, KafkaError.none)}
    membership = c.membership
    membership.loaded("live", GroupMetadataValue("consumer", 1, "range", "m", 1, ()))
    membership.states["live"] = ("Stable", "consumer")
    assert c.check("live") == KafkaError.none  # its partition is one this broker leads
    body = await round_trip(
        handlers, LIST_GROUPS, 4, req(LIST_GROUPS, 4, states_filter=("stable",))
    )
    assert [(g.group_id, g.group_state, g.protocol_type) for g in body.groups] == [
        ("live", "Stable", "consumer")
    ]
    body = await round_trip(handlers, LIST_GROUPS, 0, req(LIST_GROUPS, 0))
    assert sorted(g.group_id for g in body.groups) == sorted([GROUP, "live"])


class Acls:
    """An authorizer that allows what `allowed` lists: (operation, resource type, name)."""

    def __init__(self, allowed: set[tuple[AclOperation, ResourceType, str]]) -> None:
        self.allowed = allowed

    def authorize(
        self, principal: Any, host: str, operation: AclOperation, kind: ResourceType, name: str
    ) -> bool:
        return (operation, kind, name) in self.allowed


WHO = CallIdentity(Principal("User", "alice"), "127.0.0.1", "sasl")


async def test_acls() -> None:
    _rm, _c, handlers = await setup()
    assert handlers.groups is not None
    acls = Acls(set())
    handlers.groups.access = Access(acls)  # type: ignore[arg-type]
    body = await round_trip(handlers, OFFSET_COMMIT, 8, commit_request(8, GROUP, 1), WHO)
    assert body.topics[0].partitions[0].error_code == KafkaError.group_authorization_failed
    acls.allowed.add((AclOperation.READ, ResourceType.GROUP, GROUP))
    body = await round_trip(handlers, OFFSET_COMMIT, 8, commit_request(8, GROUP, 1), WHO)
    assert body.topics[0].partitions[0].error_code == KafkaError.topic_authorization_failed
    acls.allowed.add((AclOperation.READ, ResourceType.TOPIC, "events"))
    body = await round_trip(handlers, OFFSET_COMMIT, 8, commit_request(8, GROUP, 1), WHO)
    assert body.topics[0].partitions[0].error_code == KafkaError.none
    # ListGroups leaves out what the caller may not describe; FindCoordinator refuses it.
    body = await round_trip(handlers, LIST_GROUPS, 4, sample(LIST_GROUPS, 4), WHO)
    assert body.groups == ()
    body = await round_trip(handlers, FIND_COORDINATOR, 3, sample(FIND_COORDINATOR, 3), WHO)
    assert body.error_code == KafkaError.group_authorization_failed
    acls.allowed.add((AclOperation.DESCRIBE, ResourceType.GROUP, GROUP))
    body = await round_trip(handlers, LIST_GROUPS, 4, sample(LIST_GROUPS, 4), WHO)
    assert [g.group_id for g in body.groups] == [GROUP]
    body = await round_trip(handlers, DELETE_GROUPS, 2, sample(DELETE_GROUPS, 2), WHO)
    assert body.results[0].error_code == KafkaError.group_authorization_failed
    # The Kafka port (no principal) is not checked, as the other Kafka APIs.
    body = await round_trip(handlers, DELETE_GROUPS, 2, sample(DELETE_GROUPS, 2))
    assert body.results[0].error_code == KafkaError.none


async def test_metadata_calls_the_offsets_topic_internal() -> None:
    _rm, _c, handlers = await setup()
    topic_cls = __import__(
        codec.request_class(3, 12).__module__, fromlist=["_"]
    ).MetadataRequestTopic
    body = req(
        3,
        12,
        topics=tuple(
            codec.make(topic_cls, name=n, topic_id=None) for n in ("__consumer_offsets", "events")
        ),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    answer = await round_trip(handlers, 3, 12, body)
    assert [(t.name, t.is_internal) for t in answer.topics] == [
        ("__consumer_offsets", True),
        ("events", False),
    ]


async def commit_with_metadata(handlers: Any, group: str, metadata: str) -> int:
    partition = nested_req(
        OFFSET_COMMIT,
        8,
        "OffsetCommitRequestPartition",
        partition_index=0,
        committed_offset=1,
        committed_leader_epoch=-1,
        committed_metadata=metadata,
    )
    topic = nested_req(
        OFFSET_COMMIT, 8, "OffsetCommitRequestTopic", name="events", partitions=(partition,)
    )
    request = req(
        OFFSET_COMMIT,
        8,
        group_id=group,
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=(topic,),
    )
    body = await round_trip(handlers, OFFSET_COMMIT, 8, request)
    return int(body.topics[0].partitions[0].error_code)


async def test_metadata_size_counts_utf16_units_and_what_a_record_holds() -> None:
    rm = FakeReplicaManager()
    rm.create_offsets_topic()
    c, _membership = coordinator(rm, offset_metadata_max_bytes=4)
    await lead_all(rm, c)
    handlers = KafkaHandlers(rm, c)  # type: ignore[arg-type]
    # Four characters, eight UTF-8 bytes: within Kafka's String.length() limit.
    assert await commit_with_metadata(handlers, GROUP, "\u00e9\u00e9\u00e9\u00e9") == 0
    # A character beyond the BMP is two UTF-16 units.
    assert await commit_with_metadata(handlers, GROUP, "ab\U0001f600x") == (
        KafkaError.offset_metadata_too_large
    )
    c2, _ = coordinator(rm, offset_metadata_max_bytes=32767)
    await lead_all(rm, c2)
    handlers = KafkaHandlers(rm, c2)  # type: ignore[arg-type]
    # 20000 characters but 40000 UTF-8 bytes: more than a record's string holds.
    assert await commit_with_metadata(handlers, GROUP, "\u00e9" * 20000) == (
        KafkaError.offset_metadata_too_large
    )
    # A group id a record cannot hold is refused, not thrown on.
    assert await commit_with_metadata(handlers, "\u00e9" * 16384, "") == (
        KafkaError.invalid_group_id
    )
