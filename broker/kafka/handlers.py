"""What each Kafka API does on this broker: a kio request in, a kio response out, through the
same replica manager the gRPC servicer calls (broker/service.py), so produce and fetch pass the
v2 record batches straight through (no per-record work here) and every error code is the replica
manager's own (they are Kafka's).

I/O shell, event-loop thread only. One handler serves every version of its API: `codec.make`
keeps the fields a version has. `SUPPORTED` is what ApiVersions advertises: only these APIs and
versions are read; anything else is UNSUPPORTED_VERSION (ApiVersions) or a closed connection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from minibroker.broker import wire
from minibroker.broker.kafka import codec
from minibroker.broker.kafka.codec import make, nested
from minibroker.broker.kafka.group_handlers import GroupHandlers
from minibroker.client.errors import ErrorCode
from minibroker.client.topic_name import invalid_topic_name
from minibroker.client.types import NO_LEADER
from minibroker.proto import minibroker_pb2 as pb

if TYPE_CHECKING:
    from minibroker.broker.groups.coordinator import GroupCoordinator
    from minibroker.broker.replicas.manager import ReplicaManager

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
API_VERSIONS, CREATE_TOPICS, DELETE_TOPICS, INIT_PRODUCER_ID = 18, 19, 20, 22
OFFSET_FOR_LEADER_EPOCH, DESCRIBE_CLUSTER = 23, 60
# The group APIs (KafkaGroupCall also serves these to minibroker's own client over gRPC).
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT = 8, 9, 10, 11, 12
LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS, DELETE_GROUPS = 13, 14, 15, 16, 42
GROUP_APIS = frozenset(
    {
        OFFSET_COMMIT,
        OFFSET_FETCH,
        FIND_COORDINATOR,
        JOIN_GROUP,
        HEARTBEAT,
        LEAVE_GROUP,
        SYNC_GROUP,
        DESCRIBE_GROUPS,
        LIST_GROUPS,
        DELETE_GROUPS,
    }
)

# api key -> (min, max) version served. Produce starts at v3 (magic v2 batches only); Fetch at
# v4 (the v2 batches' last stable offset); Fetch stops at v12 (v13 names topics by id), Metadata
# at v12, Produce at v9, ListOffsets at v7 (v8 adds tiered-storage timestamps).
SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (3, 9),
    FETCH: (4, 12),
    LIST_OFFSETS: (1, 7),
    METADATA: (1, 12),
    API_VERSIONS: (0, 3),
    CREATE_TOPICS: (2, 7),
    DELETE_TOPICS: (1, 6),
    INIT_PRODUCER_ID: (0, 4),
    OFFSET_FOR_LEADER_EPOCH: (2, 4),
    DESCRIBE_CLUSTER: (0, 1),
    # G1's group APIs (broker/kafka/group_handlers.py): OffsetCommit from v2 (Kafka-stored
    # offsets), to v8 (v9 is KIP-848's member epoch); OffsetFetch v8 batches groups.
    FIND_COORDINATOR: (0, 4),
    OFFSET_COMMIT: (2, 8),
    OFFSET_FETCH: (1, 8),
    LIST_GROUPS: (0, 4),
    DELETE_GROUPS: (0, 2),
    # G2's group APIs, membership (librdkafka 2.x sends JoinGroup v5, SyncGroup v3, Heartbeat
    # v3, LeaveGroup v1, DescribeGroups v4; kafka-python JoinGroup v7, SyncGroup v5, Heartbeat
    # v4, LeaveGroup v5, DescribeGroups v6; aiokafka JoinGroup v5, SyncGroup v3).
    JOIN_GROUP: (0, 9),
    SYNC_GROUP: (0, 5),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    DESCRIBE_GROUPS: (0, 6),
}

OFFSETS_TOPIC = "__consumer_offsets"

# Kafka's codes that minibroker's own client never sees (so not in client/errors.py).
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
LISTENER_NOT_FOUND = 72
UNSUPPORTED_ENDPOINT_TYPE = 115
BROKERS_ENDPOINT = 1  # DescribeCluster v1's endpoint_type: 1 brokers, 2 controllers

# How long a forwarded admin request may wait for the controller at most (its own timeout_ms
# is passed on to the controller too).
ADMIN_FORWARD_MAX_S = 60.0

# The answer a produce with acks=0 gets: none at all (Kafka sends no response).
NO_RESPONSE = object()


class KafkaHandlers:
    """Dispatch by api key. `advertised`: this broker's Kafka address per broker id comes from
    the metadata image (each broker registers its own, broker/controller_link.py)."""

    def __init__(
        self, replica_manager: ReplicaManager, coordinator: GroupCoordinator | None = None
    ) -> None:
        self._rm = replica_manager
        self._by_key: dict[int, Callable[[codec.Request], Awaitable[Any]]] = {
            PRODUCE: self.produce,
            FETCH: self.fetch,
            LIST_OFFSETS: self.list_offsets,
            METADATA: self.metadata,
            API_VERSIONS: self.api_versions,
            CREATE_TOPICS: self.create_topics,
            DELETE_TOPICS: self.delete_topics,
            INIT_PRODUCER_ID: self.init_producer_id,
            OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
            DESCRIBE_CLUSTER: self.describe_cluster,
        }
        # The group APIs take the caller's principal too (None on the Kafka port).
        self._group_by_key: dict[int, Callable[[codec.Request, Any], Awaitable[Any]]] = {}
        self.groups: GroupHandlers | None = None
        if coordinator is not None:
            self.groups = GroupHandlers(coordinator)
            self._group_by_key.update(
                {
                    FIND_COORDINATOR: self.groups.find_coordinator,
                    OFFSET_COMMIT: self.groups.offset_commit,
                    OFFSET_FETCH: self.groups.offset_fetch,
                    LIST_GROUPS: self.groups.list_groups,
                    DELETE_GROUPS: self.groups.delete_groups,
                    JOIN_GROUP: self.groups.join_group,
                    SYNC_GROUP: self.groups.sync_group,
                    HEARTBEAT: self.groups.heartbeat,
                    LEAVE_GROUP: self.groups.leave_group,
                    DESCRIBE_GROUPS: self.groups.describe_groups,
                }
            )

    async def handle(self, request: codec.Request, principal: Any = None) -> Any:
        """The kio response for `request` (NO_RESPONSE: send nothing). `principal`: who sent
        it when known (KafkaGroupCall's caller); None on the Kafka port (PLAINTEXT)."""
        group_handler = self._group_by_key.get(request.api_key)
        if group_handler is not None:
            return await group_handler(request, principal)
        return await self._by_key[request.api_key](request)

    # -- ApiVersions -------------------------------------------------------------------------

    async def api_versions(self, request: codec.Request) -> Any:
        return api_versions_response(request.api_version, ErrorCode.NONE)

    # -- Metadata ----------------------------------------------------------------------------

    async def metadata(self, request: codec.Request) -> Any:
        version = request.api_version
        module = codec.response_module(METADATA, version)
        broker_cls = nested(module, "MetadataResponseBroker")
        topic_cls = nested(module, "MetadataResponseTopic")
        partition_cls = nested(module, "MetadataResponsePartition")
        assert broker_cls and topic_cls and partition_cls
        image = self._rm.image
        kafka_brokers = self._kafka_brokers()
        brokers = tuple(
            make(
                broker_cls,
                node_id=b.broker_id,
                host=b.kafka_host,
                port=b.kafka_port,
                rack=b.rack or None,
            )
            for b in sorted(kafka_brokers.values(), key=lambda b: b.broker_id)
        )
        asked = request.body.topics
        names: list[str]
        if asked is None or (version == 0 and not asked):
            names = sorted(image.topic_ids_by_name)
        else:
            names = [t.name for t in asked if t.name is not None]
        topics = []
        for name in names:
            topic = image.topic(name)
            if topic is None:
                error: int = (
                    ErrorCode.INVALID_TOPIC_EXCEPTION
                    if invalid_topic_name(name)
                    else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                )
                topics.append(
                    make(topic_cls, error_code=error, name=name, topic_id=None, partitions=())
                )
                continue
            partitions = []
            for index in sorted(topic.partitions):
                record = topic.partitions[index]
                offline = tuple(
                    r for r in record.replicas if r not in image.brokers or image.brokers[r].fenced
                )
                if record.leader == NO_LEADER:
                    error = ErrorCode.LEADER_NOT_AVAILABLE
                elif record.leader not in kafka_brokers:
                    error = LISTENER_NOT_FOUND  # Kafka's answer: the leader has no such listener
                else:
                    error = ErrorCode.NONE
                partitions.append(
                    make(
                        partition_cls,
                        error_code=error,
                        partition_index=index,
                        leader_id=record.leader,
                        leader_epoch=record.leader_epoch,
                        replica_nodes=tuple(record.replicas),
                        isr_nodes=tuple(record.isr),
                        offline_replicas=offline,
                    )
                )
            topics.append(
                make(
                    topic_cls,
                    error_code=ErrorCode.NONE,
                    name=name,
                    topic_id=topic.topic_id,
                    is_internal=name == OFFSETS_TOPIC,
                    partitions=tuple(partitions),
                    topic_authorized_operations=-2147483648,
                )
            )
        link = self._rm.link
        return make(
            codec.response_class(METADATA, version),
            throttle_time=0,
            brokers=brokers,
            cluster_id=(link.cluster_id if link is not None else "") or None,
            # No client can reach a KRaft controller: Kafka names a live broker instead.
            controller_id=self._rm.broker_id if kafka_brokers else -1,
            topics=tuple(topics),
            cluster_authorized_operations=-2147483648,
        )

    def _kafka_brokers(self) -> dict[int, Any]:
        """Only brokers with a Kafka listener, unfenced (Kafka's KRaft answers leave fenced ones
        out), by id: a Kafka client is given their Kafka address, never a gRPC port."""
        return {
            b.broker_id: b
            for b in self._rm.image.brokers.values()
            if b.kafka_port > 0 and not b.fenced
        }

    # -- DescribeCluster (KIP-700): the same brokers as Metadata ---------------------------

    async def describe_cluster(self, request: codec.Request) -> Any:
        version = request.api_version
        broker_cls = nested(
            codec.response_module(DESCRIBE_CLUSTER, version), "DescribeClusterBroker"
        )
        assert broker_cls is not None
        cls = codec.response_class(DESCRIBE_CLUSTER, version)
        endpoint_type = int(getattr(request.body, "endpoint_type", BROKERS_ENDPOINT))
        link = self._rm.link
        common = {
            "throttle_time": 0,
            "endpoint_type": endpoint_type,
            "cluster_id": (link.cluster_id if link is not None else "") or "",
            "cluster_authorized_operations": -2147483648,
        }
        if endpoint_type != BROKERS_ENDPOINT:
            # Controllers are not reachable with Kafka's protocol here (Kafka answers so too on
            # a broker listener).
            return make(
                cls,
                error_code=UNSUPPORTED_ENDPOINT_TYPE,
                error_message="only the brokers' endpoints are served (endpoint_type 1)",
                controller_id=-1,
                brokers=(),
                **common,
            )
        brokers = self._kafka_brokers()
        return make(
            cls,
            error_code=ErrorCode.NONE,
            error_message=None,
            controller_id=self._rm.broker_id if brokers else -1,
            brokers=tuple(
                make(
                    broker_cls,
                    broker_id=b.broker_id,
                    host=b.kafka_host,
                    port=b.kafka_port,
                    rack=b.rack or None,
                )
                for b in sorted(brokers.values(), key=lambda b: b.broker_id)
            ),
            **common,
        )

    # -- Produce -----------------------------------------------------------------------------

    async def produce(self, request: codec.Request) -> Any:
        body = request.body
        acks = int(body.acks)
        version = request.api_version
        module = codec.response_module(PRODUCE, version)
        partition_cls = nested(module, "PartitionProduceResponse")
        topic_cls = nested(module, "TopicProduceResponse")
        assert partition_cls and topic_cls
        timeout_ms = int(body.timeout.total_seconds() * 1000)
        # (topic, partition, error, message) for the partitions refused here.
        refused: list[tuple[str, int, int, str]] = []
        results: list[wire.ProduceResult] = []
        if body.transactional_id is not None or acks not in (0, 1, -1):
            error, message = (
                (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactions are not supported")
                if body.transactional_id is not None
                else (int(ErrorCode.INVALID_REQUIRED_ACKS), f"acks {acks}: 0, 1 or -1")
            )
            refused = [
                (t.name, p.index, error, message) for t in body.topic_data for p in t.partition_data
            ]
        else:
            partitions = [
                wire.ProducePartition(t.name, p.index, bytes(p.records or b""))
                for t in body.topic_data
                for p in t.partition_data
            ]
            results = await self._rm.produce(acks, timeout_ms, partitions)
        if acks == 0:
            return NO_RESPONSE
        by_topic: dict[str, list[Any]] = {}
        for r in results:
            by_topic.setdefault(r.topic, []).append(
                make(
                    partition_cls,
                    index=r.partition,
                    error_code=r.error,
                    base_offset=r.base_offset,
                    log_append_time=r.log_append_time_ms,
                    log_start_offset=r.log_start_offset,
                    record_errors=(),
                    error_message=r.message or None,
                )
            )
        for topic, index, code, message in refused:
            by_topic.setdefault(topic, []).append(
                make(
                    partition_cls,
                    index=index,
                    error_code=code,
                    base_offset=-1,
                    log_append_time=-1,
                    log_start_offset=-1,
                    record_errors=(),
                    error_message=message,
                )
            )
        return make(
            codec.response_class(PRODUCE, version),
            responses=tuple(
                make(topic_cls, name=name, partition_responses=tuple(parts))
                for name, parts in by_topic.items()
            ),
            throttle_time=0,
        )

    # -- Fetch -------------------------------------------------------------------------------

    async def fetch(self, request: codec.Request) -> Any:
        body = request.body
        version = request.api_version
        module = codec.response_module(FETCH, version)
        partition_cls = nested(module, "PartitionData")
        topic_cls = nested(module, "FetchableTopicResponse")
        assert partition_cls and topic_cls
        epoch_cls = nested(module, "EpochEndOffset")
        leader_cls = nested(module, "LeaderIdAndEpoch")
        # A consumer's fetch, whatever replica id it names (followers use gRPC), and without a
        # fetch session: session id 0 in the answer tells the client there is none (KIP-227),
        # so each request is a full one. isolation_level: no transactions here, so the last
        # stable offset is the high watermark and read_committed reads what read_uncommitted
        # does.
        params = wire.FetchParams(
            replica_id=-1,
            replica_epoch=-1,
            max_wait_ms=int(body.max_wait.total_seconds() * 1000),
            min_bytes=int(body.min_bytes),
            max_bytes=int(getattr(body, "max_bytes", 0x7FFFFFFF)),
            rack_id=str(getattr(body, "rack_id", "") or ""),
            partitions=tuple(
                wire.FetchPartitionRequest(
                    topic=t.topic,
                    partition=p.partition,
                    current_leader_epoch=int(getattr(p, "current_leader_epoch", -1)),
                    fetch_offset=int(p.fetch_offset),
                    last_fetched_epoch=int(getattr(p, "last_fetched_epoch", -1)),
                    log_start_offset=int(getattr(p, "log_start_offset", -1)),
                    max_bytes=int(p.partition_max_bytes),
                )
                for t in body.topics
                for p in t.partitions
            ),
        )
        answer = await self._rm.fetch(params)
        by_topic: dict[str, list[Any]] = {}
        for r in answer.partitions:
            extra: dict[str, Any] = {}
            if r.diverging_epoch is not None and epoch_cls is not None:
                extra["diverging_epoch"] = make(
                    epoch_cls, epoch=r.diverging_epoch[0], end_offset=r.diverging_epoch[1]
                )
            if r.current_leader is not None and leader_cls is not None:
                extra["current_leader"] = make(
                    leader_cls, leader_id=r.current_leader[0], leader_epoch=r.current_leader[1]
                )
            by_topic.setdefault(r.topic, []).append(
                make(
                    partition_cls,
                    partition_index=r.partition,
                    error_code=r.error,
                    high_watermark=r.high_watermark,
                    last_stable_offset=r.high_watermark,
                    log_start_offset=r.log_start_offset,
                    aborted_transactions=None,
                    preferred_read_replica=r.preferred_read_replica,
                    records=r.records,
                    **extra,
                )
            )
        return make(
            codec.response_class(FETCH, version),
            throttle_time=0,
            error_code=answer.error,
            session_id=0,
            responses=tuple(
                make(topic_cls, topic=name, partitions=tuple(parts))
                for name, parts in by_topic.items()
            ),
        )

    # -- ListOffsets -------------------------------------------------------------------------

    async def list_offsets(self, request: codec.Request) -> Any:
        version = request.api_version
        module = codec.response_module(LIST_OFFSETS, version)
        partition_cls = nested(module, "ListOffsetsPartitionResponse")
        topic_cls = nested(module, "ListOffsetsTopicResponse")
        assert partition_cls and topic_cls
        asked = [
            wire.ListOffsetsPartition(
                t.name,
                p.partition_index,
                int(getattr(p, "current_leader_epoch", -1)),
                int(p.timestamp),
            )
            for t in request.body.topics
            for p in t.partitions
        ]
        by_topic: dict[str, list[Any]] = {}
        for r in self._rm.list_offsets(asked):
            by_topic.setdefault(r.topic, []).append(
                make(
                    partition_cls,
                    partition_index=r.partition,
                    error_code=r.error,
                    timestamp=r.timestamp,
                    offset=r.offset,
                    leader_epoch=r.leader_epoch,
                )
            )
        return make(
            codec.response_class(LIST_OFFSETS, version),
            throttle_time=0,
            topics=tuple(
                make(topic_cls, name=name, partitions=tuple(parts))
                for name, parts in by_topic.items()
            ),
        )

    # -- OffsetForLeaderEpoch ----------------------------------------------------------------

    async def offset_for_leader_epoch(self, request: codec.Request) -> Any:
        version = request.api_version
        module = codec.response_module(OFFSET_FOR_LEADER_EPOCH, version)
        partition_cls = nested(module, "EpochEndOffset")
        topic_cls = nested(module, "OffsetForLeaderTopicResult")
        assert partition_cls and topic_cls
        asked = [
            wire.OffsetForLeaderPartition(
                t.topic, p.partition, int(p.current_leader_epoch), int(p.leader_epoch)
            )
            for t in request.body.topics
            for p in t.partitions
        ]
        by_topic: dict[str, list[Any]] = {}
        for r in self._rm.offset_for_leader_epoch(asked):
            by_topic.setdefault(r.topic, []).append(
                make(
                    partition_cls,
                    error_code=r.error,
                    partition=r.partition,
                    leader_epoch=r.leader_epoch,
                    end_offset=r.end_offset,
                )
            )
        return make(
            codec.response_class(OFFSET_FOR_LEADER_EPOCH, version),
            throttle_time=0,
            topics=tuple(
                make(topic_cls, topic=name, partitions=tuple(parts))
                for name, parts in by_topic.items()
            ),
        )

    # -- CreateTopics, DeleteTopics: forwarded to the controller ------------------------------

    async def create_topics(self, request: codec.Request) -> Any:
        version = request.api_version
        body = request.body
        result_cls = nested(codec.response_module(CREATE_TOPICS, version), "CreatableTopicResult")
        assert result_cls is not None
        timeout_ms = int(body.timeout.total_seconds() * 1000)
        refused: dict[str, tuple[int, str]] = {}
        forwarded = pb.CreateTopicsRequest(timeout_ms=timeout_ms, validate_only=body.validate_only)
        for topic in body.topics:
            if topic.assignments:
                refused[topic.name] = (
                    int(ErrorCode.INVALID_REQUEST),
                    "manual replica assignments are not supported: give num_partitions and "
                    "replication_factor",
                )
                continue
            configs = {c.name: c.value for c in topic.configs if c.value is not None}
            forwarded.topics.add(
                name=topic.name,
                num_partitions=int(topic.num_partitions),
                replication_factor=int(topic.replication_factor),
                configs=configs,
            )
        answers: dict[str, Any] = {}
        if forwarded.topics:
            try:
                response = await self._forward("CreateTopics", forwarded, timeout_ms)
                answers = {r.name: r for r in response.topics}
            except Exception as err:
                for topic in forwarded.topics:
                    refused[topic.name] = (
                        int(ErrorCode.REQUEST_TIMED_OUT),
                        f"the controller did not answer: {err}",
                    )
        results = []
        for topic in body.topics:
            name = topic.name
            answer = answers.get(name)
            if answer is None:
                code, message = refused.get(
                    name, (int(ErrorCode.UNKNOWN_SERVER_ERROR), "no answer for this topic")
                )
                results.append(
                    make(
                        result_cls,
                        name=name,
                        topic_id=None,
                        error_code=code,
                        error_message=message,
                        topic_config_error_code=0,
                        num_partitions=-1,
                        replication_factor=-1,
                        configs=None,
                    )
                )
                continue
            ok = answer.error_code == ErrorCode.NONE
            results.append(
                make(
                    result_cls,
                    name=name,
                    topic_id=answer.topic_id or None,
                    error_code=int(answer.error_code),
                    error_message=answer.error_message or None,
                    topic_config_error_code=0,
                    num_partitions=answer.num_partitions if ok else -1,
                    replication_factor=answer.replication_factor if ok else -1,
                    configs=None,
                )
            )
        return make(
            codec.response_class(CREATE_TOPICS, version), throttle_time=0, topics=tuple(results)
        )

    async def delete_topics(self, request: codec.Request) -> Any:
        version = request.api_version
        body = request.body
        result_cls = nested(codec.response_module(DELETE_TOPICS, version), "DeletableTopicResult")
        assert result_cls is not None
        timeout_ms = int(body.timeout.total_seconds() * 1000)
        # v6 names topics by name or by id; earlier versions by name.
        asked: list[tuple[str | None, Any]] = (
            [(t.name, t.topic_id) for t in body.topics]
            if hasattr(body, "topics")
            else [(name, None) for name in body.topic_names]
        )
        by_id = {
            codec.topic_uuid(tid): name for name, tid in self._rm.image.topic_ids_by_name.items()
        }
        names: list[str | None] = [
            name if name is not None else by_id.get(topic_id) for name, topic_id in asked
        ]
        answers: dict[str, Any] = {}
        failure = ""
        wanted = [n for n in names if n is not None]
        if wanted:
            try:
                response = await self._forward(
                    "DeleteTopics",
                    pb.DeleteTopicsRequest(topic_names=wanted, timeout_ms=timeout_ms),
                    timeout_ms,
                )
                answers = {r.name: r for r in response.results}
            except Exception as err:
                failure = f"the controller did not answer: {err}"
        results = []
        for (_, topic_id), name in zip(asked, names, strict=True):
            answer = answers.get(name) if name is not None else None
            if answer is not None:
                code, message, tid = int(answer.error_code), answer.error_message, answer.topic_id
            elif name is None:
                code, message, tid = (
                    int(ErrorCode.UNKNOWN_TOPIC_ID),
                    "no topic has this id",
                    topic_id,
                )
            else:
                code, message, tid = int(ErrorCode.REQUEST_TIMED_OUT), failure, None
            results.append(
                make(
                    result_cls,
                    name=name,
                    topic_id=tid or None,
                    error_code=code,
                    error_message=message or None,
                )
            )
        return make(
            codec.response_class(DELETE_TOPICS, version), throttle_time=0, responses=tuple(results)
        )

    async def _forward(self, method: str, request: Any, timeout_ms: int) -> Any:
        link = self._rm.link
        if link is None:
            raise RuntimeError("this broker has not registered with a controller yet")
        timeout_s = min(max(timeout_ms, 1000) / 1000 + 5.0, ADMIN_FORWARD_MAX_S)
        return await link.forward(method, request, timeout_s)

    # -- InitProducerId ----------------------------------------------------------------------

    async def init_producer_id(self, request: codec.Request) -> Any:
        cls = codec.response_class(INIT_PRODUCER_ID, request.api_version)
        if request.body.transactional_id is not None:
            return make(
                cls,
                throttle_time=0,
                error_code=TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                producer_id=-1,
                producer_epoch=-1,
            )
        # An idempotent producer without a transactional id gets a new producer id with epoch
        # 0, also when it names its current one (Kafka's TransactionCoordinator does the same).
        answer = await self._rm.init_producer_id()
        return make(
            cls,
            throttle_time=0,
            error_code=ErrorCode(answer.error_code),
            producer_id=answer.producer_id,
            producer_epoch=answer.producer_epoch,
        )


def api_versions_response(version: int, error: ErrorCode) -> Any:
    """ApiVersions at `version` (v0 for UNSUPPORTED_VERSION, as Kafka answers it), listing
    SUPPORTED."""
    module = codec.response_module(API_VERSIONS, version)
    api_cls = nested(module, "ApiVersion")
    assert api_cls is not None
    return make(
        codec.response_class(API_VERSIONS, version),
        error_code=error,
        api_keys=tuple(
            make(api_cls, api_key=key, min_version=low, max_version=high)
            for key, (low, high) in sorted(SUPPORTED.items())
        ),
        throttle_time=0,
        supported_features=(),
        finalized_features_epoch=-1,
        finalized_features=(),
        zk_migration_ready=False,
    )
