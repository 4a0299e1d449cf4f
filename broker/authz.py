"""Authorization of BrokerService calls (SPEC-16b's table), on the protobuf messages.

No I/O. Each function takes the server's `Access`, the caller and the request, and returns the part
of the request that may proceed plus the answers for the part that may not (Kafka's per-topic
rule: an unauthorized topic's partitions get TOPIC_AUTHORIZATION_FAILED, the others proceed).
A refused part is never handed to the replica manager, so it changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

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


def produce(
    access: Access, who: CallIdentity, request: pb.ProduceRequest
) -> tuple[pb.ProduceRequest, list[pb.TopicProduceResponse]]:
    """WRITE on each topic."""
    if not access.enabled:
        return request, []
    ok, refused = split_topics(
        request.topics, lambda t: t.topic, lambda n: access.on_topic(who, AclOperation.WRITE, n)
    )
    if not refused:
        return request, []
    allowed = pb.ProduceRequest(
        acks=request.acks,
        timeout_ms=request.timeout_ms,
        topics=ok,
        correlation_id=request.correlation_id,
    )
    return allowed, [
        pb.TopicProduceResponse(
            topic=t.topic,
            partitions=[
                pb.PartitionProduceResponse(
                    partition=p.partition,
                    error_code=TOPIC_DENIED,
                    error_message=topic_refusal(who, AclOperation.WRITE, t.topic),
                    base_offset=-1,
                    log_append_time_ms=-1,
                    log_start_offset=-1,
                )
                for p in t.partitions
            ],
        )
        for t in refused
    ]


def _fetch_errors(
    topics: Iterable[pb.FetchTopic], code: int, message: str
) -> list[pb.FetchTopicResponse]:
    return [
        pb.FetchTopicResponse(
            topic=t.topic,
            partitions=[
                pb.FetchPartitionResponse(
                    partition=p.partition,
                    error_code=code,  # type: ignore[arg-type]
                    error_message=message,
                    high_watermark=-1,
                    last_stable_offset=-1,
                    log_start_offset=-1,
                    preferred_read_replica=-1,
                    log_end_offset=-1,
                )
                for p in t.partitions
            ],
        )
        for t in topics
    ]


def fetch(
    access: Access, who: CallIdentity, request: pb.FetchRequest
) -> tuple[pb.FetchRequest | None, pb.FetchResponse]:
    """A follower's fetch (replica_id >= 0): CLUSTER_ACTION, and a node may only fetch as
    itself; refused whole (the answer, None to proceed with). A consumer's: READ on each topic.
    Returns (what may proceed or None, the refusals to add to its answer)."""
    if request.replica_id >= 0:
        why = node_refusal(access, who, "broker", request.replica_id)
        if why is not None:
            return None, pb.FetchResponse(
                error_code=CLUSTER_DENIED,
                topics=_fetch_errors(request.topics, CLUSTER_DENIED, why),
            )
        return request, pb.FetchResponse()
    if not access.enabled:
        return request, pb.FetchResponse()
    ok, refused = split_topics(
        request.topics, lambda t: t.topic, lambda n: access.on_topic(who, AclOperation.READ, n)
    )
    if not refused:
        return request, pb.FetchResponse()
    allowed = pb.FetchRequest()
    allowed.CopyFrom(request)
    del allowed.topics[:]
    allowed.topics.extend(ok)
    refusals = pb.FetchResponse()
    for t in refused:
        refusals.topics.extend(
            _fetch_errors([t], TOPIC_DENIED, topic_refusal(who, AclOperation.READ, t.topic))
        )
    return (allowed if ok else None), refusals


def list_offsets(
    access: Access, who: CallIdentity, request: pb.ListOffsetsRequest
) -> tuple[pb.ListOffsetsRequest, list[pb.ListOffsetsTopicResponse]]:
    """DESCRIBE on each topic."""
    ok, refused = split_topics(
        request.topics, lambda t: t.topic, lambda n: access.on_topic(who, AclOperation.DESCRIBE, n)
    )
    if not refused:
        return request, []
    allowed = pb.ListOffsetsRequest(
        replica_id=request.replica_id, isolation_level=request.isolation_level, topics=ok
    )
    return allowed, [
        pb.ListOffsetsTopicResponse(
            topic=t.topic,
            partitions=[
                pb.ListOffsetsPartitionResponse(
                    partition=p.partition,
                    error_code=TOPIC_DENIED,
                    error_message=topic_refusal(who, AclOperation.DESCRIBE, t.topic),
                    timestamp=-1,
                    offset=-1,
                    leader_epoch=-1,
                )
                for p in t.partitions
            ],
        )
        for t in refused
    ]


def offset_for_leader_epoch(
    access: Access, who: CallIdentity, request: pb.OffsetForLeaderEpochRequest
) -> tuple[pb.OffsetForLeaderEpochRequest, list[pb.OffsetForLeaderTopicResult]]:
    """From a replica (replica_id >= 0): as a follower's Fetch, all or nothing. From a
    consumer: DESCRIBE on each topic."""
    if request.replica_id >= 0:
        why = node_refusal(access, who, "broker", request.replica_id)
        ok, refused = (list(request.topics), []) if why is None else ([], list(request.topics))
        code = CLUSTER_DENIED
    else:
        ok, refused = split_topics(
            request.topics,
            lambda t: t.topic,
            lambda n: access.on_topic(who, AclOperation.DESCRIBE, n),
        )
        why, code = None, TOPIC_DENIED
    if not refused:
        return request, []
    allowed = pb.OffsetForLeaderEpochRequest(replica_id=request.replica_id, topics=ok)
    return allowed, [
        pb.OffsetForLeaderTopicResult(
            topic=t.topic,
            partitions=[
                pb.OffsetForLeaderPartitionResult(
                    partition=p.partition,
                    error_code=code,
                    error_message=why or topic_refusal(who, AclOperation.DESCRIBE, t.topic),
                    leader_epoch=-1,
                    end_offset=-1,
                )
                for p in t.partitions
            ],
        )
        for t in refused
    ]


def filter_metadata(
    access: Access, who: CallIdentity, request: pb.MetadataRequest, response: pb.MetadataResponse
) -> None:
    """DESCRIBE on each topic: all topics -> only the describable ones; a named topic the
    caller may not describe -> TOPIC_AUTHORIZATION_FAILED and nothing else, whether or not it
    exists (Kafka hides that)."""
    if not access.enabled:
        return
    listed = request.all_topics or not request.topics
    kept: list[pb.TopicMetadata] = []
    for topic in response.topics:
        if access.on_topic(who, AclOperation.DESCRIBE, topic.name):
            kept.append(topic)
        elif not listed:
            kept.append(pb.TopicMetadata(error_code=TOPIC_DENIED, name=topic.name))
    del response.topics[:]
    response.topics.extend(kept)


def init_producer_id_refusal(
    access: Access, who: CallIdentity, topics: Iterable[str]
) -> pb.InitProducerIdResponse | None:
    """IDEMPOTENT_WRITE on the cluster, or WRITE on any topic (KIP-679); `topics`: the topics
    that exist. None when allowed, else the answer."""
    if access.on_cluster(who, AclOperation.IDEMPOTENT_WRITE):
        return None
    if any(access.on_topic(who, AclOperation.WRITE, t) for t in topics):
        return None
    return pb.InitProducerIdResponse(
        error_code=CLUSTER_DENIED,
        error_message=cluster_refusal(who, AclOperation.IDEMPOTENT_WRITE)
        + " (nor to WRITE any topic)",
        producer_id=-1,
        producer_epoch=-1,
    )


def filter_replicas(
    access: Access, who: CallIdentity, response: pb.DescribeReplicasResponse
) -> None:
    """DESCRIBE on each topic: replicas of other topics are left out."""
    if not access.enabled:
        return
    kept = [r for r in response.replicas if access.on_topic(who, AclOperation.DESCRIBE, r.topic)]
    del response.replicas[:]
    response.replicas.extend(kept)
