"""Protobuf <-> controller-core conversion for ControllerService requests and replies.

Pure functions over generated messages: no I/O. The servicer (`service.py`) decodes with these,
calls the core through the app, and encodes the reply; core code never sees `_pb2` types.
"""

from __future__ import annotations

from typing import cast

from minibroker.client.errors import ErrorCode, InvalidRequestError, MiniBrokerError
from minibroker.controller.core.election import Election
from minibroker.controller.core.isr import AlterPartitionProposal, IsrMember
from minibroker.controller.core.messages import (
    AlterPartitionReply,
    AlterPartitionRequest,
    ClusterDescription,
    CreatableTopic,
    CreateTopicResult,
    DeleteTopicResult,
    ElectionResult,
    HeartbeatReply,
    HeartbeatRequest,
    ProducerIdBlock,
    RegisterReply,
    RegisterRequest,
    UnregisterBrokerReply,
)
from minibroker.proto import minibroker_pb2 as pb


def pb_error_code(code: int) -> pb.ErrorCode:
    """A Kafka error code as the value of a protobuf `ErrorCode` field.

    The numbers are the same (tests/unit/test_proto.py) and protobuf takes any int for an enum
    field; only the generated stubs type the field as `pb.ErrorCode`, which no Python value is.
    """
    return cast("pb.ErrorCode", int(code))


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
            )
            for b in desc.brokers
        ],
    )
