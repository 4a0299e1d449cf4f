"""Protobuf <-> controller-core conversion for ControllerService requests and replies.

Pure functions over generated messages: no I/O. The servicer (`service.py`) decodes with these,
calls the core through the app, and encodes the reply; core code never sees `_pb2` types.
"""

from __future__ import annotations

from collections.abc import Sequence

from minibroker.client.common.pbwire import check_count, pb_error_code
from minibroker.client.errors import ErrorCode, InvalidRequestError, MiniBrokerError
from minibroker.controller.core.election import Election
from minibroker.controller.core.isr import AlterPartitionProposal, IsrMember
from minibroker.controller.core.messages import (
    CONFIG_OP_APPEND,
    CONFIG_OP_DELETE,
    CONFIG_OP_SET,
    CONFIG_OP_SUBTRACT,
    AlterConfigOp,
    AlterConfigsResource,
    AlterConfigsResult,
    AlterPartitionReply,
    AlterPartitionRequest,
    ClusterDescription,
    CreatableTopic,
    CreatePartitionsResult,
    CreatePartitionsTopic,
    CreateTopicResult,
    DecommissionReply,
    DeleteTopicResult,
    DescribeConfigsResource,
    DescribeConfigsResult,
    ElectionResult,
    HeartbeatReply,
    HeartbeatRequest,
    OngoingReassignment,
    ProducerIdBlock,
    ReassignmentResult,
    ReassignmentTarget,
    RegisterReply,
    RegisterRequest,
    UnregisterBrokerReply,
)
from minibroker.metadata.records import CONFIG_RESOURCE_BROKER, CONFIG_RESOURCE_TOPIC
from minibroker.proto import minibroker_pb2 as pb


def register_request(msg: pb.BrokerRegistrationRequest) -> RegisterRequest:
    return RegisterRequest(
        broker_id=msg.broker_id,
        cluster_id=msg.cluster_id,
        incarnation_id=msg.incarnation_id,
        host=msg.host,
        port=msg.port,
        rack=msg.rack,
        metrics_port=msg.metrics_port,
        previous_broker_epoch=msg.previous_broker_epoch,
        kafka_host=msg.kafka_host,
        kafka_port=msg.kafka_port,
    )


def register_reply(reply: RegisterReply) -> pb.BrokerRegistrationResponse:
    return pb.BrokerRegistrationResponse(
        error_code=pb_error_code(reply.error),
        error_message=reply.message,
        broker_epoch=reply.broker_epoch,
        cluster_id=reply.cluster_id,
    )


def heartbeat_request(msg: pb.BrokerHeartbeatRequest) -> HeartbeatRequest:
    return HeartbeatRequest(
        broker_id=msg.broker_id,
        broker_epoch=msg.broker_epoch,
        current_metadata_offset=msg.current_metadata_offset,
        want_fence=msg.want_fence,
        want_shut_down=msg.want_shut_down,
        offline_log_dirs=tuple(msg.offline_log_dirs),
    )


def heartbeat_reply(reply: HeartbeatReply) -> pb.BrokerHeartbeatResponse:
    return pb.BrokerHeartbeatResponse(
        error_code=pb_error_code(reply.error),
        error_message=reply.message,
        is_caught_up=reply.is_caught_up,
        is_fenced=reply.is_fenced,
        should_shut_down=reply.should_shut_down,
    )


def alter_partition_request(msg: pb.AlterPartitionRequest) -> AlterPartitionRequest:
    proposals = tuple(
        AlterPartitionProposal(
            topic_id=topic.topic_id,
            partition=p.partition,
            leader_epoch=p.leader_epoch,
            partition_epoch=p.partition_epoch,
            new_isr=tuple(IsrMember(m.broker_id, m.broker_epoch) for m in p.new_isr_with_epochs),
            leader_recovery_state=p.leader_recovery_state,
        )
        for topic in msg.topics
        for p in topic.partitions
    )
    return AlterPartitionRequest(msg.broker_id, msg.broker_epoch, proposals)


def alter_partition_reply(reply: AlterPartitionReply) -> pb.AlterPartitionResponse:
    out = pb.AlterPartitionResponse(
        error_code=pb_error_code(reply.error), error_message=reply.message
    )
    by_topic: dict[str, pb.AlterPartitionTopicResponse] = {}
    for r in reply.results:
        topic = by_topic.get(r.topic_id)
        if topic is None:
            topic = out.topics.add(topic_id=r.topic_id)
            by_topic[r.topic_id] = topic
        part = topic.partitions.add(
            partition=r.partition, error_code=pb_error_code(r.error), error_message=r.message
        )
        if r.record is not None:
            part.leader_id = r.record.leader
            part.leader_epoch = r.record.leader_epoch
            part.isr.extend(r.record.isr)
            part.leader_recovery_state = r.record.leader_recovery_state
            part.partition_epoch = r.record.partition_epoch
        else:
            part.leader_id = -1
            part.leader_epoch = -1
            part.partition_epoch = -1
    return out


def producer_ids_reply(block: ProducerIdBlock) -> pb.AllocateProducerIdsResponse:
    return pb.AllocateProducerIdsResponse(
        error_code=pb_error_code(block.error),
        error_message=block.message,
        producer_id_start=block.producer_id_start,
        producer_id_len=block.producer_id_len,
    )


def creatable_topics(msg: pb.CreateTopicsRequest) -> list[CreatableTopic]:
    return [
        CreatableTopic(t.name, t.num_partitions, t.replication_factor, dict(t.configs))
        for t in msg.topics
    ]


def create_topics_reply(results: tuple[CreateTopicResult, ...]) -> pb.CreateTopicsResponse:
    return pb.CreateTopicsResponse(
        topics=[
            pb.CreatableTopicResult(
                name=r.name,
                topic_id=r.topic_id,
                error_code=pb_error_code(r.error),
                error_message=r.message,
                num_partitions=r.num_partitions,
                replication_factor=r.replication_factor,
                configs=dict(r.configs),
            )
            for r in results
        ]
    )


def delete_topics_reply(results: tuple[DeleteTopicResult, ...]) -> pb.DeleteTopicsResponse:
    return pb.DeleteTopicsResponse(
        results=[
            pb.DeletableTopicResult(
                name=r.name,
                topic_id=r.topic_id,
                error_code=pb_error_code(r.error),
                error_message=r.message,
            )
            for r in results
        ]
    )


_ELECTIONS = {pb.PREFERRED: Election.PREFERRED, pb.UNCLEAN: Election.UNCLEAN}


def election(msg: pb.ElectLeadersRequest) -> tuple[Election, list[tuple[str, int]] | None]:
    """The election kind and the partitions (None: all). An election type this controller does
    not know raises InvalidRequestError, as Kafka's controller does (proto3 enums are open, so
    any int32 arrives here)."""
    kind = _ELECTIONS.get(msg.election_type)
    if kind is None:
        raise InvalidRequestError(f"Unknown election type {msg.election_type}")
    if msg.all_partitions:
        return kind, None
    return kind, [(tp.topic, p) for tp in msg.topic_partitions for p in tp.partitions]


def elect_leaders_reply(results: tuple[ElectionResult, ...]) -> pb.ElectLeadersResponse:
    return pb.ElectLeadersResponse(
        error_code=pb_error_code(ErrorCode.NONE),
        results=[
            pb.ElectionResult(
                topic=r.topic,
                partition=r.partition,
                error_code=pb_error_code(r.error),
                error_message=r.message,
            )
            for r in results
        ],
    )


def elect_leaders_error(
    msg: pb.ElectLeadersRequest, err: MiniBrokerError
) -> pb.ElectLeadersResponse:
    """The whole request refused: the top-level error, repeated for every partition it named
    (Kafka's ElectLeadersRequest.getErrorResponse)."""
    return pb.ElectLeadersResponse(
        error_code=pb_error_code(err.code),
        error_message=str(err),
        results=[
            pb.ElectionResult(
                topic=tp.topic,
                partition=p,
                error_code=pb_error_code(err.code),
                error_message=str(err),
            )
            for tp in msg.topic_partitions
            for p in tp.partitions
        ],
    )


def unregister_broker_reply(reply: UnregisterBrokerReply) -> pb.UnregisterBrokerResponse:
    return pb.UnregisterBrokerResponse(
        error_code=pb_error_code(reply.error), error_message=reply.message
    )


# -- moving replicas, CreatePartitions, dynamic configs, decommissioning --------------------------
#
# Every byte here is untrusted. A request that the core could not even be asked about (an
# unknown resource type or operation, a negative partition, a duplicate entry, a list past the
# bounds below, a broker resource name that is not a broker id) is refused whole with
# INVALID_REQUEST before the core sees it, so nothing changes. What is well formed but wrong
# (an unknown topic, a replica that is not a registered broker, a bad config value) is the
# core's to answer, item by item, with Kafka's errors.

MAX_REQUEST_PARTITIONS = 100_000  # partitions named by one request (reassign, list, create)
MAX_REPLICAS = 1_000  # broker ids in one replica list
MAX_REQUEST_REPLICA_IDS = 1_000_000  # broker ids in one request, all lists together
MAX_CONFIG_RESOURCES = 1_000  # resources of one Incremental/DescribeConfigs
MAX_CONFIG_OPS = 1_000  # config names of one resource
MAX_NAME_CHARS = 255  # topic and config names (Kafka's topic names stop at 249)
MAX_CONFIG_VALUE_CHARS = 1024 * 1024  # a throttled-replicas list of many partitions fits
MAX_INT32 = 2**31 - 1

CONFIG_RESOURCE_TYPES = {CONFIG_RESOURCE_TOPIC: "TOPIC", CONFIG_RESOURCE_BROKER: "BROKER"}
CONFIG_OPS = (CONFIG_OP_SET, CONFIG_OP_DELETE, CONFIG_OP_APPEND, CONFIG_OP_SUBTRACT)


def _check_name(what: str, name: str) -> None:
    if not name:
        raise InvalidRequestError(f"empty {what}")
    if len(name) > MAX_NAME_CHARS:
        raise InvalidRequestError(
            f"{what} of {len(name)} characters (at most {MAX_NAME_CHARS}): {name[:40]!r}..."
        )


def _check_partition(topic: str, partition: int) -> None:
    if partition < 0:
        raise InvalidRequestError(f"negative partition {partition} of topic {topic!r}")


def _replica_list(what: str, ids: Sequence[int]) -> tuple[int, ...]:
    """A replica list as sent; its length bounded. Ids that are not registered brokers
    (negative ones included) are the core's INVALID_REPLICA_ASSIGNMENT."""
    check_count(f"replicas for {what}", len(ids), MAX_REPLICAS)
    return tuple(ids)


def reassignment_targets(msg: pb.AlterPartitionReassignmentsRequest) -> list[ReassignmentTarget]:
    """The partitions to move (replicas None: cancel). Raises InvalidRequestError for a
    malformed request: too many partitions, an empty topic name, a negative partition, one
    partition twice, a cancel that names replicas."""
    check_count("partitions", len(msg.partitions), MAX_REQUEST_PARTITIONS)
    seen: set[tuple[str, int]] = set()
    total = 0
    out: list[ReassignmentTarget] = []
    for p in msg.partitions:
        _check_name("topic name", p.topic)
        _check_partition(p.topic, p.partition)
        key = (p.topic, p.partition)
        if key in seen:
            raise InvalidRequestError(f"partition {p.topic}-{p.partition} named twice")
        seen.add(key)
        if p.cancel:
            if p.replicas:
                raise InvalidRequestError(
                    f"partition {p.topic}-{p.partition}: a cancel names no replicas"
                )
            out.append(ReassignmentTarget(p.topic, p.partition, None))
            continue
        replicas = _replica_list(f"{p.topic}-{p.partition}", p.replicas)
        total += len(replicas)
        check_count("replica ids", total, MAX_REQUEST_REPLICA_IDS)
        out.append(ReassignmentTarget(p.topic, p.partition, replicas))
    return out


def _reassignment_result(r: ReassignmentResult) -> pb.ReassignmentResult:
    return pb.ReassignmentResult(
        topic=r.topic,
        partition=r.partition,
        error_code=pb_error_code(r.error),
        error_message=r.message,
    )


def alter_reassignments_reply(
    results: Sequence[ReassignmentResult],
) -> pb.AlterPartitionReassignmentsResponse:
    return pb.AlterPartitionReassignmentsResponse(
        error_code=pb_error_code(ErrorCode.NONE),
        results=[_reassignment_result(r) for r in results],
    )


def alter_reassignments_error(
    msg: pb.AlterPartitionReassignmentsRequest, err: MiniBrokerError
) -> pb.AlterPartitionReassignmentsResponse:
    """The whole request refused: the top-level error, repeated for each partition it named
    (at most MAX_REQUEST_PARTITIONS of them)."""
    return pb.AlterPartitionReassignmentsResponse(
        error_code=pb_error_code(err.code),
        error_message=str(err),
        results=[
            pb.ReassignmentResult(
                topic=p.topic,
                partition=p.partition,
                error_code=pb_error_code(err.code),
                error_message=str(err),
            )
            for p in msg.partitions[:MAX_REQUEST_PARTITIONS]
        ],
    )


def listed_partitions(msg: pb.ListPartitionReassignmentsRequest) -> list[tuple[str, int]] | None:
    """The partitions asked about, in order without repeats; None (no topics named): every
    reassignment in progress."""
    if not msg.topics:
        return None
    check_count("partitions", sum(len(t.partitions) for t in msg.topics), MAX_REQUEST_PARTITIONS)
    out: dict[tuple[str, int], None] = {}
    for t in msg.topics:
        _check_name("topic name", t.topic)
        for p in t.partitions:
            _check_partition(t.topic, p)
            out[(t.topic, p)] = None
    return list(out)


def list_reassignments_reply(
    ongoing: Sequence[OngoingReassignment],
) -> pb.ListPartitionReassignmentsResponse:
    return pb.ListPartitionReassignmentsResponse(
        error_code=pb_error_code(ErrorCode.NONE),
        reassignments=[
            pb.OngoingReassignment(
                topic=r.topic,
                partition=r.partition,
                replicas=list(r.replicas),
                adding_replicas=list(r.adding_replicas),
                removing_replicas=list(r.removing_replicas),
            )
            for r in ongoing
        ],
    )


def list_reassignments_error(err: MiniBrokerError) -> pb.ListPartitionReassignmentsResponse:
    return pb.ListPartitionReassignmentsResponse(
        error_code=pb_error_code(err.code), error_message=str(err)
    )


def create_partitions_topics(msg: pb.CreatePartitionsRequest) -> list[CreatePartitionsTopic]:
    """The topics to grow. Raises InvalidRequestError for a malformed request: too many
    topics or new partitions, an empty topic name, a topic named twice. The count (it must grow)
    and the assignments (one per new partition, of the topic's RF, registered brokers) are the
    core's to judge."""
    check_count("topics", len(msg.topics), MAX_REQUEST_PARTITIONS)
    seen: set[str] = set()
    total_ids = 0
    total_assignments = 0
    out: list[CreatePartitionsTopic] = []
    for t in msg.topics:
        _check_name("topic name", t.name)
        if t.name in seen:
            raise InvalidRequestError(f"topic {t.name!r} named twice")
        seen.add(t.name)
        total_assignments += len(t.assignments)
        check_count("new partition assignments", total_assignments, MAX_REQUEST_PARTITIONS)
        assignments: tuple[tuple[int, ...], ...] | None = None
        if t.assignments:
            lists = []
            for i, a in enumerate(t.assignments):
                lists.append(_replica_list(f"new partition {i} of {t.name!r}", a.broker_ids))
                total_ids += len(a.broker_ids)
                check_count("replica ids", total_ids, MAX_REQUEST_REPLICA_IDS)
            assignments = tuple(lists)
        out.append(CreatePartitionsTopic(t.name, t.count, assignments))
    return out


def create_partitions_reply(
    results: Sequence[CreatePartitionsResult],
) -> pb.CreatePartitionsResponse:
    return pb.CreatePartitionsResponse(
        results=[
            pb.CreatePartitionsTopicResult(
                name=r.name, error_code=pb_error_code(r.error), error_message=r.message
            )
            for r in results
        ]
    )


def create_partitions_error(
    msg: pb.CreatePartitionsRequest, err: MiniBrokerError
) -> pb.CreatePartitionsResponse:
    """The whole request refused: its error for each topic it named (at most
    MAX_REQUEST_PARTITIONS; one nameless result when it named none)."""
    names = [t.name for t in msg.topics[:MAX_REQUEST_PARTITIONS]] or [""]
    return pb.CreatePartitionsResponse(
        results=[
            pb.CreatePartitionsTopicResult(
                name=name, error_code=pb_error_code(err.code), error_message=str(err)
            )
            for name in names
        ]
    )


def _check_resource(resource_type: int, resource_name: str) -> None:
    """A config resource the controller knows: TOPIC with a topic name, BROKER with a broker
    id in its canonical decimal form ("7", not "07" or " 7") or "" (every broker)."""
    kind = CONFIG_RESOURCE_TYPES.get(resource_type)
    if kind is None:
        raise InvalidRequestError(
            f"unknown config resource type {resource_type} (2 TOPIC or 4 BROKER)"
        )
    if resource_type == CONFIG_RESOURCE_TOPIC:
        _check_name("topic name", resource_name)
    elif resource_name and not (
        len(resource_name) <= 10
        and resource_name.isascii()
        and resource_name.isdigit()
        and str(int(resource_name)) == resource_name
        and int(resource_name) <= MAX_INT32
    ):
        raise InvalidRequestError(
            f"broker config resource {resource_name[:40]!r} is not a broker id (a number, "
            "or '' for the cluster-wide default)"
        )


def _check_unique_resources(resources: Sequence[tuple[int, str]]) -> None:
    seen: set[tuple[int, str]] = set()
    for key in resources:
        if key in seen:
            kind = CONFIG_RESOURCE_TYPES.get(key[0], str(key[0]))
            raise InvalidRequestError(f"config resource {kind} {key[1]!r} named twice")
        seen.add(key)


def alter_configs_resources(msg: pb.IncrementalAlterConfigsRequest) -> list[AlterConfigsResource]:
    """The config changes asked for. Raises InvalidRequestError for a malformed request: too
    many resources or configs, an unknown resource type or operation, a broker name that is not
    a broker id, a resource or a config named twice, SET/APPEND/SUBTRACT without a value.
    Whether a key exists and its value is valid is the core's INVALID_CONFIG."""
    check_count("config resources", len(msg.resources), MAX_CONFIG_RESOURCES)
    _check_unique_resources([(r.resource_type, r.resource_name) for r in msg.resources])
    out: list[AlterConfigsResource] = []
    for r in msg.resources:
        _check_resource(r.resource_type, r.resource_name)
        check_count("configs for one resource", len(r.configs), MAX_CONFIG_OPS)
        names: set[str] = set()
        ops: list[AlterConfigOp] = []
        for c in r.configs:
            _check_name("config name", c.name)
            if c.name in names:
                raise InvalidRequestError(
                    f"config {c.name!r} named twice for resource {r.resource_name!r}"
                )
            names.add(c.name)
            if c.config_operation not in CONFIG_OPS:
                raise InvalidRequestError(
                    f"unknown config operation {c.config_operation} for {c.name!r} "
                    "(0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT)"
                )
            value: str | None = None
            if c.config_operation != CONFIG_OP_DELETE:
                if not c.HasField("value"):
                    raise InvalidRequestError(f"config {c.name!r}: a null value is not supported")
                value = c.value
                if len(value) > MAX_CONFIG_VALUE_CHARS:
                    raise InvalidRequestError(
                        f"config {c.name!r}: a value of {len(value)} characters (at most "
                        f"{MAX_CONFIG_VALUE_CHARS})"
                    )
            ops.append(AlterConfigOp(c.name, c.config_operation, value))
        out.append(AlterConfigsResource(r.resource_type, r.resource_name, tuple(ops)))
    return out


def alter_configs_reply(
    results: Sequence[AlterConfigsResult],
) -> pb.IncrementalAlterConfigsResponse:
    return pb.IncrementalAlterConfigsResponse(
        results=[
            pb.AlterConfigsResourceResult(
                resource_type=r.resource_type,
                resource_name=r.resource_name,
                error_code=pb_error_code(r.error),
                error_message=r.message,
            )
            for r in results
        ]
    )


def alter_configs_error(
    msg: pb.IncrementalAlterConfigsRequest, err: MiniBrokerError
) -> pb.IncrementalAlterConfigsResponse:
    """The whole request refused: its error for each resource it named (at most
    MAX_CONFIG_RESOURCES; one nameless result when it named none)."""
    keys = [(r.resource_type, r.resource_name) for r in msg.resources[:MAX_CONFIG_RESOURCES]]
    return pb.IncrementalAlterConfigsResponse(
        results=[
            pb.AlterConfigsResourceResult(
                resource_type=kind,
                resource_name=name,
                error_code=pb_error_code(err.code),
                error_message=str(err),
            )
            for kind, name in keys or [(0, "")]
        ]
    )


def describe_configs_resources(msg: pb.DescribeConfigsRequest) -> list[DescribeConfigsResource]:
    """The resources to describe (keys empty: every config). Raises InvalidRequestError for a
    malformed request: too many resources or keys, an unknown resource type, a broker name that
    is not a broker id, a resource named twice, an empty or overlong key."""
    check_count("config resources", len(msg.resources), MAX_CONFIG_RESOURCES)
    _check_unique_resources([(r.resource_type, r.resource_name) for r in msg.resources])
    out: list[DescribeConfigsResource] = []
    for r in msg.resources:
        _check_resource(r.resource_type, r.resource_name)
        check_count("config keys for one resource", len(r.configuration_keys), MAX_CONFIG_OPS)
        for key in r.configuration_keys:
            _check_name("config name", key)
        keys = tuple(dict.fromkeys(r.configuration_keys))
        out.append(DescribeConfigsResource(r.resource_type, r.resource_name, keys))
    return out


def describe_configs_reply(
    results: Sequence[DescribeConfigsResult],
) -> pb.DescribeConfigsResponse:
    out = pb.DescribeConfigsResponse()
    for r in results:
        result = out.results.add(
            resource_type=r.resource_type,
            resource_name=r.resource_name,
            error_code=pb_error_code(r.error),
            error_message=r.message,
        )
        for e in r.entries:
            entry = result.configs.add(
                name=e.name,
                read_only=e.read_only,
                config_source=e.source,
                documentation=e.documentation,
            )
            if e.value is not None:
                entry.value = e.value
    return out


def describe_configs_error(
    msg: pb.DescribeConfigsRequest, err: MiniBrokerError
) -> pb.DescribeConfigsResponse:
    """The whole request refused: its error for each resource it named (at most
    MAX_CONFIG_RESOURCES; one nameless result when it named none)."""
    keys = [(r.resource_type, r.resource_name) for r in msg.resources[:MAX_CONFIG_RESOURCES]]
    return pb.DescribeConfigsResponse(
        results=[
            pb.DescribeConfigsResult(
                resource_type=kind,
                resource_name=name,
                error_code=pb_error_code(err.code),
                error_message=str(err),
            )
            for kind, name in keys or [(0, "")]
        ]
    )


def decommission_request(msg: pb.DecommissionBrokerRequest) -> tuple[int, bool]:
    """(broker id, cancel). A negative id is INVALID_REQUEST; an id never registered is the
    core's BROKER_ID_NOT_REGISTERED."""
    if msg.broker_id < 0:
        raise InvalidRequestError(f"negative broker id {msg.broker_id}")
    return msg.broker_id, msg.cancel


def decommission_reply(reply: DecommissionReply) -> pb.DecommissionBrokerResponse:
    return pb.DecommissionBrokerResponse(
        error_code=pb_error_code(reply.error),
        error_message=reply.message,
        partitions_moving=reply.partitions_moving,
    )


def decommission_error(err: MiniBrokerError) -> pb.DecommissionBrokerResponse:
    return pb.DecommissionBrokerResponse(error_code=pb_error_code(err.code), error_message=str(err))


def describe_cluster_reply(desc: ClusterDescription) -> pb.DescribeClusterResponse:
    return pb.DescribeClusterResponse(
        error_code=pb_error_code(ErrorCode.NONE),
        cluster_id=desc.cluster_id,
        controller_id=desc.controller_id,
        metadata_offset=desc.metadata_offset,
        brokers=[
            pb.ClusterBroker(
                broker_id=b.registration.broker_id,
                host=b.registration.host,
                port=b.registration.port,
                rack=b.registration.rack,
                fenced=b.registration.fenced,
                in_controlled_shutdown=b.registration.in_controlled_shutdown,
                broker_epoch=b.registration.broker_epoch,
                metrics_port=b.registration.metrics_port,
                last_heartbeat_ms_ago=b.last_heartbeat_ms_ago,
                decommissioning=b.decommissioning,
                replica_count=b.replica_count,
                leader_count=b.leader_count,
            )
            for b in desc.brokers
        ],
    )
