"""Authorization of ControllerService and QuorumService calls (SPEC-16b's table).

No I/O, on the protobuf messages: each function returns what may proceed and the answers for what
may not (with the response's own error codes, so a refusal changes nothing), or the reason a
whole call is refused.
"""

from __future__ import annotations

from typing import Any

from minibroker.client.common.pbwire import CLUSTER_DENIED, TOPIC_DENIED
from minibroker.client.common.security import (
    Access,
    CallIdentity,
    cluster_refusal,
    node_refusal,
    split_topics,
    topic_refusal,
)
from minibroker.metadata.acl import AclOperation
from minibroker.proto import minibroker_pb2 as pb

_TOPIC_RESOURCE = 2  # ConfigResource types (Kafka's): 2 TOPIC, 4 BROKER
_BROKER_RESOURCE = 4


def broker_call(access: Access, who: CallIdentity, broker_id: int) -> str | None:
    """RegisterBroker, Heartbeat, AlterPartition, AllocateProducerIds: CLUSTER_ACTION, and a
    node may only speak for itself. None when allowed, else why not."""
    return node_refusal(access, who, "broker", broker_id)


def cluster_call(access: Access, who: CallIdentity, operation: AclOperation) -> str | None:
    """An operation on the cluster resource (ElectLeaders ... ALTER; DescribeQuorum ...
    DESCRIBE; WatchMetadata CLUSTER_ACTION). None when allowed, else why not."""
    if access.on_cluster(who, operation):
        return None
    return cluster_refusal(who, operation)


def create_topics(
    access: Access, who: CallIdentity, request: pb.CreateTopicsRequest
) -> tuple[pb.CreateTopicsRequest, list[pb.CreatableTopicResult]]:
    """CREATE on the cluster, or on each topic."""
    if access.on_cluster(who, AclOperation.CREATE):
        return request, []
    ok, refused = split_topics(
        request.topics, lambda t: t.name, lambda n: access.on_topic(who, AclOperation.CREATE, n)
    )
    if not refused:
        return request, []
    allowed = pb.CreateTopicsRequest(
        topics=ok, timeout_ms=request.timeout_ms, validate_only=request.validate_only
    )
    return allowed, [
        pb.CreatableTopicResult(
            name=t.name,
            error_code=TOPIC_DENIED,
            error_message=topic_refusal(who, AclOperation.CREATE, t.name),
            num_partitions=-1,
            replication_factor=-1,
        )
        for t in refused
    ]


def delete_topics(
    access: Access, who: CallIdentity, request: pb.DeleteTopicsRequest
) -> tuple[list[str], list[pb.DeletableTopicResult]]:
    """DELETE on each topic."""
    ok, refused = split_topics(
        request.topic_names, lambda n: n, lambda n: access.on_topic(who, AclOperation.DELETE, n)
    )
    return ok, [
        pb.DeletableTopicResult(
            name=n,
            error_code=TOPIC_DENIED,
            error_message=topic_refusal(who, AclOperation.DELETE, n),
        )
        for n in refused
    ]


def create_partitions(
    access: Access, who: CallIdentity, request: pb.CreatePartitionsRequest
) -> tuple[pb.CreatePartitionsRequest, list[pb.CreatePartitionsTopicResult]]:
    """ALTER on each topic."""
    ok, refused = split_topics(
        request.topics, lambda t: t.name, lambda n: access.on_topic(who, AclOperation.ALTER, n)
    )
    if not refused:
        return request, []
    allowed = pb.CreatePartitionsRequest(
        topics=ok, timeout_ms=request.timeout_ms, validate_only=request.validate_only
    )
    return allowed, [
        pb.CreatePartitionsTopicResult(
            name=t.name,
            error_code=TOPIC_DENIED,
            error_message=topic_refusal(who, AclOperation.ALTER, t.name),
        )
        for t in refused
    ]


def config_resources(
    access: Access, who: CallIdentity, resources: Any, operation: AclOperation
) -> tuple[list[Any], list[tuple[Any, int, str]]]:
    """IncrementalAlterConfigs (ALTER_CONFIGS) / DescribeConfigs (DESCRIBE_CONFIGS): on the
    topic for a TOPIC resource, on the cluster for a BROKER resource (others go on to the
    request's own validation). (allowed, [(resource, error code, message)])."""
    ok: list[Any] = []
    refused: list[tuple[Any, int, str]] = []
    for r in resources:
        if r.resource_type == _TOPIC_RESOURCE and not access.on_topic(
            who, operation, r.resource_name
        ):
            refused.append((r, TOPIC_DENIED, topic_refusal(who, operation, r.resource_name)))
        elif r.resource_type == _BROKER_RESOURCE and not access.on_cluster(who, operation):
            refused.append((r, CLUSTER_DENIED, cluster_refusal(who, operation)))
        else:
            ok.append(r)
    return ok, refused


def alter_configs(
    access: Access, who: CallIdentity, request: pb.IncrementalAlterConfigsRequest
) -> tuple[pb.IncrementalAlterConfigsRequest, list[pb.AlterConfigsResourceResult]]:
    """ALTER_CONFIGS on each resource (config_resources)."""
    ok, refused = config_resources(access, who, request.resources, AclOperation.ALTER_CONFIGS)
    if not refused:
        return request, []
    allowed = pb.IncrementalAlterConfigsRequest(resources=ok, validate_only=request.validate_only)
    return allowed, [
        pb.AlterConfigsResourceResult(
            resource_type=r.resource_type,
            resource_name=r.resource_name,
            error_code=code,  # type: ignore[arg-type]
            error_message=why,
        )
        for r, code, why in refused
    ]


def describe_configs(
    access: Access, who: CallIdentity, request: pb.DescribeConfigsRequest
) -> tuple[pb.DescribeConfigsRequest, list[pb.DescribeConfigsResult]]:
    """DESCRIBE_CONFIGS on each resource (config_resources)."""
    ok, refused = config_resources(access, who, request.resources, AclOperation.DESCRIBE_CONFIGS)
    if not refused:
        return request, []
    return pb.DescribeConfigsRequest(resources=ok), [
        pb.DescribeConfigsResult(
            resource_type=r.resource_type,
            resource_name=r.resource_name,
            error_code=code,  # type: ignore[arg-type]
            error_message=why,
        )
        for r, code, why in refused
    ]


def blank_cluster(access: Access, who: CallIdentity, response: pb.DescribeClusterResponse) -> None:
    """DescribeCluster: any caller, but a caller without CLUSTER_ACTION does not see the
    broker epochs (what a forged node RPC would need)."""
    if access.on_cluster(who, AclOperation.CLUSTER_ACTION):
        return
    for broker in response.brokers:
        broker.broker_epoch = -1


# The id a quorum request names besides its header's sender (they are the same node).
_QUORUM_IDS = {
    "VoteRequest": "candidate_id",
    "BeginQuorumEpochRequest": "leader_id",
    "EndQuorumEpochRequest": "leader_id",
    "QuorumFetchRequest": "replica_id",
    "FetchSnapshotRequest": "replica_id",
}


def quorum_call(access: Access, who: CallIdentity, request: Any) -> str | None:
    """Vote, BeginQuorumEpoch, EndQuorumEpoch, QuorumFetch, FetchSnapshot: CLUSTER_ACTION, and a
    node may only speak as itself: `controller-<the header's sender id>`, which must also be
    the id the request names (candidate, leader, replica). None when allowed, else why not."""
    sender = request.header.sender_id
    why = node_refusal(access, who, "controller", sender)
    if why is not None:
        return why
    named = getattr(request, _QUORUM_IDS.get(type(request).__name__, ""), sender)
    if who.node is not None and named != sender:
        return f"{who.principal} cannot send a request naming controller {named}"
    return None


def blank_quorum(access: Access, who: CallIdentity, response: pb.DescribeQuorumResponse) -> None:
    """DescribeQuorum: the leader's id, epoch and address for anyone (clients find the
    controller with it); the voters' progress only with DESCRIBE (or CLUSTER_ACTION) on the
    cluster."""
    if access.on_cluster(who, AclOperation.DESCRIBE) or access.on_cluster(
        who, AclOperation.CLUSTER_ACTION
    ):
        return
    del response.voters[:]
    response.high_watermark = -1
    response.log_end_offset = -1
