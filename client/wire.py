"""The client's wire: every request the producer, consumer and admin build, every answer they
parse, and the translation of a failed gRPC call into the Kafka error a client acts on.

Builds and reads protobuf messages and maps gRPC statuses; does no I/O of its own (`call`
awaits a call its caller made). Everything above this module sees Kafka's terms only: topic
partitions, offsets, epochs, error codes and MiniBrokerError subclasses, never a protobuf or a
gRPC status. Answers are untrusted input: a partition the request did not name is the caller's
to ignore (every parser yields it with its TopicPartition).

Requests are built in place with add(): handing finished sub-messages to a constructor makes
upb copy each again, record batches included (about 2 ms per MiB against 0.1 ms).
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

import grpc

from minibroker.client.common.tls import MISMATCH_HINT, looks_like_tls_mismatch
from minibroker.client.controller_finder import LeaderHint, hint_from_error
from minibroker.client.errors import (
    ClusterAuthorizationFailedError,
    ErrorCode,
    MiniBrokerError,
    NetworkExceptionError,
    NotControllerError,
    RecordListTooLargeError,
    RequestTimedOutError,
    SaslAuthenticationFailedError,
    TopicAuthorizationFailedError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
    error_for,
)
from minibroker.client.metadata_cache import (
    BrokerInfo,
    ClusterSnapshot,
    PartitionInfo,
    TopicInfo,
)
from minibroker.client.types import CONSUMER_REPLICA_ID, TopicPartition
from minibroker.proto import minibroker_pb2 as pb

T = TypeVar("T")

# Fetch fields a consumer leaves unset (a follower's): no last fetched epoch, no log start.
_UNSET = -1
# read_uncommitted: there are no transactions.
_ISOLATION_LEVEL = 0

# -- failed calls ---------------------------------------------------------------------------------


class CallFailed(Exception):
    """A call got no answer. `error` is the Kafka error a client acts on (retriable or not);
    `unreachable` says the broker could not be reached at all (gRPC UNAVAILABLE), so its
    partitions are better off waiting for metadata that names another leader. `leader_hint`:
    a controller that is not the active one said who is (NOT_CONTROLLER; its address "" when
    it knows no leader)."""

    def __init__(
        self, error: MiniBrokerError, unreachable: bool, leader_hint: LeaderHint | None = None
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.unreachable = unreachable
        self.leader_hint = leader_hint


def error_from_rpc(err: grpc.aio.AioRpcError | grpc.RpcError, address: str) -> MiniBrokerError:
    """Map a transport failure to the Kafka error a client acts on (retriable or not)."""
    code = err.code() if hasattr(err, "code") else None
    details = err.details() if hasattr(err, "details") else str(err)
    if code == grpc.StatusCode.FAILED_PRECONDITION and hint_from_error(err) is not None:
        # A controller of a quorum that is not the active one (retriable: ask the leader).
        return NotControllerError(f"{address} is not the active controller: {details}")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED):
        if looks_like_tls_mismatch(details or ""):
            return NetworkExceptionError(
                f"broker {address} unavailable: {details} ({MISMATCH_HINT})"
            )
        return NetworkExceptionError(f"broker {address} unavailable: {details}")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        # The call could not be attributed to anyone (wrong password, SASL on a listener that
        # takes none, no credentials on a SASL_SSL one): not retriable.
        return SaslAuthenticationFailedError(f"{address} refused the call: {details}")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        # A call refused whole by the authorizer (a stream whose answers carry no error code).
        if " topic " in (details or ""):
            return TopicAuthorizationFailedError(details or "")
        return ClusterAuthorizationFailedError(details or "")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return RequestTimedOutError(f"request to {address} timed out")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if "larger than max" in (details or ""):
            # grpc's message size check: ours on send, or the peer's (socket.request.max.bytes).
            return RecordListTooLargeError(
                f"{address} refused a message over its size limit (a broker's "
                f"socket.request.max.bytes; a producer's requests are up to max_request_size): "
                f"{details}"
            )
        # A connection limit (max.connections.per.ip): like a closed connection, retriable.
        return NetworkExceptionError(f"{address} refused the call: {details}")
    return UnknownServerError(f"{address} failed the call ({code}): {details}")


async def call(pending: Awaitable[T], address: str) -> T:
    """The answer of a call to `address`, or CallFailed when gRPC reports a failure."""
    try:
        return await pending
    except grpc.aio.AioRpcError as err:
        unreachable = err.code() == grpc.StatusCode.UNAVAILABLE
        hint = hint_from_error(err) if err.code() == grpc.StatusCode.FAILED_PRECONDITION else None
        raise CallFailed(error_from_rpc(err, address), unreachable, hint) from err


def _partitions(request: Any, by_topic: dict[str, Any], topic: str) -> Any:
    """The partitions of `topic`'s entry in `request`, the entry added on first use."""
    partitions = by_topic.get(topic)
    if partitions is None:
        partitions = by_topic[topic] = request.topics.add(topic=topic).partitions
    return partitions


# -- Metadata -------------------------------------------------------------------------------------


def metadata_request(topics: Iterable[str], all_topics: bool) -> pb.MetadataRequest:
    return pb.MetadataRequest(topics=list(topics), all_topics=all_topics)


def metadata_from_pb(resp: pb.MetadataResponse, *, all_topics: bool) -> ClusterSnapshot:
    """The only place a Metadata answer becomes the cache's dataclasses."""
    brokers = {
        b.node_id: BrokerInfo(b.node_id, b.host, b.port, b.rack, b.fenced) for b in resp.brokers
    }
    topics: dict[str, TopicInfo] = {}
    for t in resp.topics:
        parts = {
            p.partition: PartitionInfo(
                partition=p.partition,
                leader=p.leader_id,
                leader_epoch=p.leader_epoch,
                replicas=tuple(p.replicas),
                isr=tuple(p.isr),
                offline_replicas=tuple(p.offline_replicas),
                partition_epoch=p.partition_epoch,
                error_code=p.error_code,
                adding_replicas=tuple(p.adding_replicas),
                removing_replicas=tuple(p.removing_replicas),
            )
            for p in t.partitions
        }
        topics[t.name] = TopicInfo(t.name, t.topic_id, parts, dict(t.configs), t.error_code)
    return ClusterSnapshot(
        cluster_id=resp.cluster_id,
        controller_id=resp.controller_id,
        brokers=brokers,
        topics=topics,
        controller_host=resp.controller_host,
        controller_port=resp.controller_port,
        all_topics=all_topics,
    )


# -- Produce and InitProducerId -------------------------------------------------------------------


class ProduceResult(NamedTuple):
    """One partition's answer to a ProduceRequest."""

    error_code: int
    error_message: str
    base_offset: int
    log_append_time_ms: int


def produce_request(
    acks: int, timeout_ms: int, batches: Iterable[tuple[TopicPartition, bytes | None]]
) -> pb.ProduceRequest:
    """One ProduceRequest carrying each (partition, record batch); one batch per partition (a
    drained batch is always built, so its bytes are never None)."""
    request = pb.ProduceRequest(acks=acks, timeout_ms=timeout_ms)
    by_topic: dict[str, Any] = {}
    for (topic, partition), records in batches:
        _partitions(request, by_topic, topic).add(partition=partition, records=records)
    return request


def produce_results(resp: pb.ProduceResponse) -> dict[TopicPartition, ProduceResult]:
    results: dict[TopicPartition, ProduceResult] = {}
    for t in resp.topics:
        for p in t.partitions:
            results[TopicPartition(t.topic, p.partition)] = ProduceResult(
                p.error_code, p.error_message, p.base_offset, p.log_append_time_ms
            )
    return results


class ProducerIdAnswer(NamedTuple):
    error_code: int
    error_message: str
    producer_id: int
    producer_epoch: int


def init_producer_id_request() -> pb.InitProducerIdRequest:
    """A new producer id for an idempotent producer (no transactions)."""
    return pb.InitProducerIdRequest(
        transactional_id="", transaction_timeout_ms=0, producer_id=-1, producer_epoch=-1
    )


def producer_id_answer(resp: pb.InitProducerIdResponse) -> ProducerIdAnswer:
    return ProducerIdAnswer(
        resp.error_code, resp.error_message, resp.producer_id, resp.producer_epoch
    )


# -- Fetch ----------------------------------------------------------------------------------------


class FetchTarget(NamedTuple):
    """One partition of a consumer's FetchRequest."""

    tp: TopicPartition
    current_leader_epoch: int  # KIP-320: the epoch the consumer's metadata names
    fetch_offset: int


class FetchedPartition(NamedTuple):
    """One partition of a FetchResponse."""

    tp: TopicPartition
    error_code: int
    error_message: str
    high_watermark: int
    log_start_offset: int
    preferred_read_replica: int  # KIP-392; -1: none named
    records: bytes


def fetch_request(
    targets: Iterable[FetchTarget],
    *,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    partition_max_bytes: int,
    rack_id: str,
    session_id: int = 0,
    session_epoch: int = -1,
    forgotten: Iterable[TopicPartition] = (),
) -> pb.FetchRequest:
    """A consumer's Fetch; `session_id`/`session_epoch`/`forgotten` are its fetch session's
    (KIP-227; the defaults, 0 and -1, ask for no session)."""
    request = pb.FetchRequest(
        replica_id=CONSUMER_REPLICA_ID,
        replica_epoch=_UNSET,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=_ISOLATION_LEVEL,
        rack_id=rack_id,
        session_id=session_id,
        session_epoch=session_epoch,
    )
    add_forgotten(request, forgotten)
    by_topic: dict[str, Any] = {}
    for (topic, partition), current_leader_epoch, fetch_offset in targets:
        _partitions(request, by_topic, topic).add(
            partition=partition,
            current_leader_epoch=current_leader_epoch,
            fetch_offset=fetch_offset,
            last_fetched_epoch=_UNSET,
            log_start_offset=_UNSET,
            partition_max_bytes=partition_max_bytes,
        )
    return request


def add_forgotten(request: pb.FetchRequest, forgotten: Iterable[TopicPartition]) -> None:
    """An incremental fetch's partitions to drop from its session (KIP-227), by topic."""
    by_topic: dict[str, Any] = {}
    for tp in forgotten:
        numbers = by_topic.get(tp.topic)
        if numbers is None:
            numbers = by_topic[tp.topic] = request.forgotten_topics_data.add(
                topic=tp.topic
            ).partitions
        numbers.append(tp.partition)


def fetched_partitions(resp: pb.FetchResponse) -> Iterator[FetchedPartition]:
    for t in resp.topics:
        for p in t.partitions:
            yield fetched_partition(t.topic, p)


def fetched_partition(topic: str, p: pb.FetchPartitionResponse) -> FetchedPartition:
    return FetchedPartition(
        TopicPartition(topic, p.partition),
        p.error_code,
        p.error_message,
        p.high_watermark,
        p.log_start_offset,
        p.preferred_read_replica,
        p.records,
    )


# -- ListOffsets ----------------------------------------------------------------------------------

# (offset, timestamp, leader epoch) of a ListOffsets answer.
OffsetAnswer = tuple[int, int, int]


def list_offsets_request(
    targets: Mapping[TopicPartition, int], leader_epochs: Mapping[TopicPartition, int]
) -> pb.ListOffsetsRequest:
    """ListOffsets for each partition's target timestamp (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
    or a time), fenced by the leader epoch the consumer's metadata names (KIP-320)."""
    request = pb.ListOffsetsRequest(
        replica_id=CONSUMER_REPLICA_ID, isolation_level=_ISOLATION_LEVEL
    )
    by_topic: dict[str, Any] = {}
    for tp, timestamp in targets.items():
        _partitions(request, by_topic, tp.topic).add(
            partition=tp.partition, current_leader_epoch=leader_epochs[tp], timestamp=timestamp
        )
    return request


def list_offsets_results(
    resp: pb.ListOffsetsResponse,
) -> dict[TopicPartition, OffsetAnswer | MiniBrokerError]:
    out: dict[TopicPartition, OffsetAnswer | MiniBrokerError] = {}
    for t in resp.topics:
        for p in t.partitions:
            tp = TopicPartition(t.topic, p.partition)
            if p.error_code != ErrorCode.NONE:
                out[tp] = error_for(p.error_code, p.error_message or f"ListOffsets {tp}")
            else:
                out[tp] = (p.offset, p.timestamp, p.leader_epoch)
    return out


# -- OffsetForLeaderEpoch -------------------------------------------------------------------------


class EpochEndAnswer(NamedTuple):
    """One partition's OffsetForLeaderEpoch answer: where `leader_epoch` ends on the leader."""

    tp: TopicPartition
    error_code: int
    error_message: str
    leader_epoch: int
    end_offset: int


def offset_for_leader_epoch_request(
    items: Sequence[tuple[TopicPartition, int, int]],
) -> pb.OffsetForLeaderEpochRequest:
    """(partition, current leader epoch, epoch asked for) each: a consumer's validation
    (KIP-320)."""
    request = pb.OffsetForLeaderEpochRequest(replica_id=CONSUMER_REPLICA_ID)
    by_topic: dict[str, Any] = {}
    for tp, current_leader_epoch, leader_epoch in items:
        _partitions(request, by_topic, tp.topic).add(
            partition=tp.partition,
            current_leader_epoch=current_leader_epoch,
            leader_epoch=leader_epoch,
        )
    return request


def epoch_end_answers(resp: pb.OffsetForLeaderEpochResponse) -> Iterator[EpochEndAnswer]:
    for t in resp.topics:
        for p in t.partitions:
            yield EpochEndAnswer(
                TopicPartition(t.topic, p.partition),
                p.error_code,
                p.error_message,
                p.leader_epoch,
                p.end_offset,
            )


# -- Admin: the controller's topic, cluster and election calls, and DescribeReplicas -------------


class _Answer(Protocol):
    """An answer with a top-level error (DescribeCluster, ElectLeaders, UnregisterBroker)."""

    @property
    def error_code(self) -> int: ...
    @property
    def error_message(self) -> str: ...


def answer_error(resp: _Answer) -> MiniBrokerError | None:
    """The typed error of an answer's top-level error code; None when it has none."""
    if resp.error_code == ErrorCode.NONE:
        return None
    return error_for(resp.error_code, resp.error_message)


class CreatedTopicAnswer(NamedTuple):
    """One topic's CreateTopics answer: `error` None when it was created."""

    name: str
    error: MiniBrokerError | None
    topic_id: str
    num_partitions: int
    replication_factor: int


def create_topics_request(
    topics: Iterable[tuple[str, int, int, Mapping[str, str]]], timeout_ms: int, validate_only: bool
) -> pb.CreateTopicsRequest:
    """CreateTopics for each (name, partitions, replication factor, configs); -1: the
    controller's default."""
    request = pb.CreateTopicsRequest(timeout_ms=timeout_ms, validate_only=validate_only)
    for name, num_partitions, replication_factor, configs in topics:
        request.topics.add(
            name=name,
            num_partitions=num_partitions,
            replication_factor=replication_factor,
            configs=dict(configs),
        )
    return request


def created_topics(resp: pb.CreateTopicsResponse) -> Iterator[CreatedTopicAnswer]:
    for r in resp.topics:
        error = None if r.error_code == ErrorCode.NONE else error_for(r.error_code, r.error_message)
        yield CreatedTopicAnswer(r.name, error, r.topic_id, r.num_partitions, r.replication_factor)


def delete_topics_request(names: Iterable[str], timeout_ms: int) -> pb.DeleteTopicsRequest:
    return pb.DeleteTopicsRequest(topic_names=list(names), timeout_ms=timeout_ms)


def delete_topics_failures(resp: pb.DeleteTopicsResponse) -> list[tuple[str, MiniBrokerError]]:
    """Each topic the controller did not delete, with its typed error, in answer order."""
    failures: list[tuple[str, MiniBrokerError]] = []
    for r in resp.results:
        if r.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            failures.append(
                (r.name, UnknownTopicOrPartitionError(f"topic {r.name!r} does not exist"))
            )
        elif r.error_code != ErrorCode.NONE:
            failures.append((r.name, error_for(r.error_code, r.error_message)))
    return failures


# One broker of a DescribeCluster answer: (broker_id, host, port, rack, fenced,
# in_controlled_shutdown, broker_epoch, last_heartbeat_ms_ago, decommissioning, replica_count,
# leader_count), admin's BrokerDescription's fields in its order.
BrokerFields = tuple[int, str, int, str, bool, bool, int, int, bool, int, int]


class ClusterAnswer(NamedTuple):
    cluster_id: str
    controller_id: int
    metadata_offset: int
    brokers: tuple[BrokerFields, ...]  # by broker id


def describe_cluster_request() -> pb.DescribeClusterRequest:
    return pb.DescribeClusterRequest()


def cluster_answer(resp: pb.DescribeClusterResponse) -> ClusterAnswer:
    """The cluster a DescribeCluster answer describes (its error is `answer_error`'s)."""
    return ClusterAnswer(
        resp.cluster_id,
        resp.controller_id,
        resp.metadata_offset,
        tuple(
            (
                b.broker_id,
                b.host,
                b.port,
                b.rack,
                b.fenced,
                b.in_controlled_shutdown,
                b.broker_epoch,
                b.last_heartbeat_ms_ago,
                b.decommissioning,
                b.replica_count,
                b.leader_count,
            )
            for b in sorted(resp.brokers, key=lambda b: b.broker_id)
        ),
    )


_ELECTION_TYPES = {"preferred": pb.PREFERRED, "unclean": pb.UNCLEAN}
ELECTION_TYPES = frozenset(_ELECTION_TYPES)


def elect_leaders_request(
    election_type: str, partitions: Iterable[TopicPartition] | None, timeout_ms: int
) -> pb.ElectLeadersRequest:
    """An election of `election_type` (one of ELECTION_TYPES) for `partitions` (None: every
    partition)."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions or ():
        by_topic.setdefault(tp[0], []).append(tp[1])
    return pb.ElectLeadersRequest(
        election_type=_ELECTION_TYPES[election_type],
        topic_partitions=[pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()],
        all_partitions=partitions is None,
        timeout_ms=timeout_ms,
    )


def election_results(
    resp: pb.ElectLeadersResponse,
) -> dict[TopicPartition, MiniBrokerError | None]:
    """Each partition's election outcome: None for success, else its typed error."""
    return {
        TopicPartition(r.topic, r.partition): (
            None if r.error_code == ErrorCode.NONE else error_for(r.error_code, r.error_message)
        )
        for r in resp.results
    }


def unregister_broker_request(broker_id: int) -> pb.UnregisterBrokerRequest:
    return pb.UnregisterBrokerRequest(broker_id=broker_id)


# -- reassignments, CreatePartitions, dynamic configs, decommissioning ---------------------------


def _result_error(code: int, message: str) -> MiniBrokerError | None:
    return None if code == ErrorCode.NONE else error_for(code, message)


def alter_reassignments_request(
    reassignments: Iterable[tuple[TopicPartition, Sequence[int] | None]], timeout_ms: int
) -> pb.AlterPartitionReassignmentsRequest:
    """Move each partition to its target replicas (None: cancel its running reassignment)."""
    request = pb.AlterPartitionReassignmentsRequest(timeout_ms=timeout_ms)
    for tp, replicas in reassignments:
        if replicas is None:
            request.partitions.add(topic=tp[0], partition=tp[1], cancel=True)
        else:
            request.partitions.add(topic=tp[0], partition=tp[1], replicas=list(replicas))
    return request


def reassignment_results(
    resp: pb.AlterPartitionReassignmentsResponse,
) -> dict[TopicPartition, MiniBrokerError | None]:
    """Each partition's outcome: None when it started, completed, was cancelled or had nothing
    to do; else its typed error. A refused request repeats its error for every partition."""
    return {
        TopicPartition(r.topic, r.partition): _result_error(r.error_code, r.error_message)
        for r in resp.results
    }


def list_reassignments_request(
    partitions: Iterable[TopicPartition] | None,
) -> pb.ListPartitionReassignmentsRequest:
    """None: every reassignment in progress."""
    by_topic: dict[str, list[int]] = {}
    for tp in partitions or ():
        by_topic.setdefault(tp[0], []).append(tp[1])
    return pb.ListPartitionReassignmentsRequest(
        topics=[pb.TopicPartitions(topic=t, partitions=ps) for t, ps in by_topic.items()]
    )


class OngoingAnswer(NamedTuple):
    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]


def ongoing_reassignments(
    resp: pb.ListPartitionReassignmentsResponse,
) -> dict[TopicPartition, OngoingAnswer]:
    """The reassignments in progress, by partition (its error is `answer_error`'s)."""
    return {
        TopicPartition(r.topic, r.partition): OngoingAnswer(
            tuple(r.replicas), tuple(r.adding_replicas), tuple(r.removing_replicas)
        )
        for r in resp.reassignments
    }


def create_partitions_request(
    topics: Iterable[tuple[str, int, Sequence[Sequence[int]] | None]],
    timeout_ms: int,
    validate_only: bool,
) -> pb.CreatePartitionsRequest:
    """Grow each topic to its new total count; assignments, when given, one replica list per
    new partition (None: the controller places them)."""
    request = pb.CreatePartitionsRequest(timeout_ms=timeout_ms, validate_only=validate_only)
    for name, count, assignments in topics:
        topic = request.topics.add(name=name, count=count)
        for replicas in assignments or ():
            topic.assignments.add(broker_ids=list(replicas))
    return request


def create_partitions_results(
    resp: pb.CreatePartitionsResponse,
) -> dict[str, MiniBrokerError | None]:
    """Each topic's outcome: None when it grew (or would have, validate_only)."""
    return {r.name: _result_error(r.error_code, r.error_message) for r in resp.results}


# Config resources and operations by Kafka's names (ConfigResource.Type, AlterConfigOp.OpType).
CONFIG_RESOURCE_TYPES = {"topic": 2, "broker": 4}
_CONFIG_RESOURCE_NAMES = {v: k for k, v in CONFIG_RESOURCE_TYPES.items()}
CONFIG_OPS = {"set": 0, "delete": 1, "append": 2, "subtract": 3}
# DescribeConfigs sources (Kafka's ConfigEntry.ConfigSource names).
CONFIG_SOURCES = {
    1: "DYNAMIC_TOPIC_CONFIG",
    2: "DYNAMIC_BROKER_CONFIG",
    3: "DYNAMIC_DEFAULT_BROKER_CONFIG",
    4: "STATIC_BROKER_CONFIG",
    5: "DEFAULT_CONFIG",
}

# (resource type "topic" | "broker", resource name)
ConfigResourceKey = tuple[str, str]


def alter_configs_request(
    resources: Iterable[tuple[ConfigResourceKey, Iterable[tuple[str, str, str | None]]]],
    validate_only: bool,
) -> pb.IncrementalAlterConfigsRequest:
    """Each resource's (config name, op (a CONFIG_OPS name), value) changes."""
    request = pb.IncrementalAlterConfigsRequest(validate_only=validate_only)
    for (kind, name), ops in resources:
        resource = request.resources.add(
            resource_type=CONFIG_RESOURCE_TYPES[kind], resource_name=name
        )
        for config, op, value in ops:
            entry = resource.configs.add(name=config, config_operation=CONFIG_OPS[op])
            if value is not None and op != "delete":
                entry.value = value
    return request


def _resource_key(resource_type: int, resource_name: str) -> ConfigResourceKey:
    return (_CONFIG_RESOURCE_NAMES.get(resource_type, str(resource_type)), resource_name)


def alter_configs_results(
    resp: pb.IncrementalAlterConfigsResponse,
) -> dict[ConfigResourceKey, MiniBrokerError | None]:
    return {
        _resource_key(r.resource_type, r.resource_name): _result_error(
            r.error_code, r.error_message
        )
        for r in resp.results
    }


def describe_configs_request(
    resources: Iterable[ConfigResourceKey], keys: Sequence[str]
) -> pb.DescribeConfigsRequest:
    """Describe `keys` (empty: every config) of each resource."""
    request = pb.DescribeConfigsRequest()
    for kind, name in resources:
        request.resources.add(
            resource_type=CONFIG_RESOURCE_TYPES[kind],
            resource_name=name,
            configuration_keys=list(keys),
        )
    return request


class ConfigEntryAnswer(NamedTuple):
    """One config of a DescribeConfigs answer: admin's ConfigEntry's fields in its order."""

    name: str
    value: str | None
    source: str  # a CONFIG_SOURCES name, "UNKNOWN" for a number this client does not know
    read_only: bool
    documentation: str


class DescribedConfigs(NamedTuple):
    error: MiniBrokerError | None
    entries: tuple[ConfigEntryAnswer, ...]


def described_configs(
    resp: pb.DescribeConfigsResponse,
) -> dict[ConfigResourceKey, DescribedConfigs]:
    out: dict[ConfigResourceKey, DescribedConfigs] = {}
    for r in resp.results:
        entries = tuple(
            ConfigEntryAnswer(
                c.name,
                c.value if c.HasField("value") else None,
                CONFIG_SOURCES.get(c.config_source, "UNKNOWN"),
                c.read_only,
                c.documentation,
            )
            for c in r.configs
        )
        out[_resource_key(r.resource_type, r.resource_name)] = DescribedConfigs(
            _result_error(r.error_code, r.error_message), entries
        )
    return out


def decommission_request(broker_id: int, cancel: bool) -> pb.DecommissionBrokerRequest:
    return pb.DecommissionBrokerRequest(broker_id=broker_id, cancel=cancel)


class ReplicaOffsets(NamedTuple):
    """One replica's offsets as its broker reports them (DescribeReplicas)."""

    topic: str
    partition: int
    broker_id: int
    is_leader: bool
    high_watermark: int
    log_end_offset: int
    # The log cleaner's point and dirty ratio of a compacted log (None for another).
    cleaner_point: int | None = None
    dirty_ratio: float | None = None


def describe_replicas_request(topics: Iterable[str]) -> pb.DescribeReplicasRequest:
    return pb.DescribeReplicasRequest(topics=list(topics))


def replica_offsets(resp: pb.DescribeReplicasResponse) -> Iterator[ReplicaOffsets]:
    for r in resp.replicas:
        yield ReplicaOffsets(
            r.topic,
            r.partition,
            resp.broker_id,
            r.is_leader,
            r.high_watermark,
            r.log_end_offset,
            r.cleaner_point if r.compacted else None,
            r.dirty_ratio if r.compacted else None,
        )


__all__ = [
    "CONFIG_OPS",
    "CONFIG_RESOURCE_TYPES",
    "CONFIG_SOURCES",
    "ELECTION_TYPES",
    "BrokerFields",
    "CallFailed",
    "ClusterAnswer",
    "ConfigEntryAnswer",
    "ConfigResourceKey",
    "CreatedTopicAnswer",
    "DescribedConfigs",
    "EpochEndAnswer",
    "FetchTarget",
    "FetchedPartition",
    "OffsetAnswer",
    "OngoingAnswer",
    "ProduceResult",
    "ProducerIdAnswer",
    "ReplicaOffsets",
    "alter_configs_request",
    "alter_configs_results",
    "alter_reassignments_request",
    "answer_error",
    "call",
    "cluster_answer",
    "create_partitions_request",
    "create_partitions_results",
    "create_topics_request",
    "created_topics",
    "decommission_request",
    "delete_topics_failures",
    "delete_topics_request",
    "describe_cluster_request",
    "describe_configs_request",
    "describe_replicas_request",
    "described_configs",
    "elect_leaders_request",
    "election_results",
    "epoch_end_answers",
    "error_from_rpc",
    "fetch_request",
    "fetched_partition",
    "fetched_partitions",
    "init_producer_id_request",
    "list_offsets_request",
    "list_offsets_results",
    "list_reassignments_request",
    "metadata_from_pb",
    "metadata_request",
    "offset_for_leader_epoch_request",
    "ongoing_reassignments",
    "produce_request",
    "produce_results",
    "producer_id_answer",
    "reassignment_results",
    "replica_offsets",
    "unregister_broker_request",
]
