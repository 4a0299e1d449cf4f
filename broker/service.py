"""The grpc.aio BrokerService servicer: decode, call the replica manager, encode. No logic here.

I/O shell, event-loop thread only. Expected domain errors are already turned into per-partition
error codes by the replica manager; anything else escaping a handler is a bug, logged with its
traceback and answered as a gRPC INTERNAL error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from minibroker.broker import wire
from minibroker.client.common.log import get_logger
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from minibroker.broker.replica_manager import ReplicaManager

log = get_logger(__name__)


class BrokerServicer(pb_grpc.BrokerServiceServicer):
    def __init__(self, replica_manager: ReplicaManager) -> None:
        self._rm = replica_manager

    async def Produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProduceResponse:
        results = await self._rm.produce(
            request.acks, request.timeout_ms, wire.decode_produce(request)
        )
        return wire.encode_produce(results)

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> pb.FetchResponse:
        results = await self._rm.fetch(wire.decode_fetch(request))
        return wire.encode_fetch(results)

    async def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListOffsetsResponse:
        results = self._rm.list_offsets(wire.decode_list_offsets(request))
        return wire.encode_list_offsets(results)

    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetadataResponse:
        return self._rm.metadata_response(list(request.topics), request.all_topics)

    async def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> pb.InitProducerIdResponse:
        return await self._rm.init_producer_id()

    async def DescribeReplicas(
        self, request: pb.DescribeReplicasRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeReplicasResponse:
        states = self._rm.describe_replicas(set(request.topics))
        return wire.encode_replicas(self._rm.broker_id, states)
