"""ControllerService over grpc.aio: a thin servicer (decode -> app/core -> encode).

I/O shell, event-loop thread only. Every command goes through `ControllerApp.submit`, which runs
it on the single command task and answers only after its records are fsynced. The heartbeat
stream is the liveness fast path (docs/design.md §3.4): when it ends for any reason other than a
granted controlled shutdown, the broker is fenced at once.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from functools import partial
from typing import TYPE_CHECKING

import grpc

from minibroker.client.errors import ErrorCode, MiniBrokerError
from minibroker.controller import wire
from minibroker.controller.core.messages import HeartbeatReply, HeartbeatRequest, Outcome
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from minibroker.controller.app import ControllerApp
    from minibroker.controller.core.controller import ControllerCore


def _heartbeat(
    req: HeartbeatRequest, stream_id: int, core: ControllerCore, now_ms: int
) -> Outcome[HeartbeatReply]:
    """The command for one heartbeat, with its request bound (a loop's lambda would not be)."""
    return core.heartbeat(req, stream_id, now_ms)


class ControllerServicer(pb_grpc.ControllerServiceServicer):
    def __init__(self, app: ControllerApp) -> None:
        self._app = app
        self._stream_ids = itertools.count(1)

    async def RegisterBroker(
        self, request: pb.BrokerRegistrationRequest, context: grpc.aio.ServicerContext
    ) -> pb.BrokerRegistrationResponse:
        req = wire.register_request(request)
        reply = await self._app.submit(lambda core, now: core.register_broker(req, now))
        return wire.register_reply(reply)

    async def Heartbeat(
        self,
        request_iterator: AsyncIterator[pb.BrokerHeartbeatRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.BrokerHeartbeatResponse]:
        stream_id = next(self._stream_ids)
        speaker: tuple[int, int] | None = None  # (broker id, epoch) this stream speaks for
        try:
            async for request in request_iterator:
                req = wire.heartbeat_request(request)
                reply = await self._app.submit(partial(_heartbeat, req, stream_id))
                if reply.error == ErrorCode.NONE:
                    speaker = (req.broker_id, req.broker_epoch)
                yield wire.heartbeat_reply(reply)
        finally:
            # Runs when the broker closes the stream, when its process dies (the connection
            # resets and grpc cancels this handler) and on our own shutdown (ignored there).
            if speaker is not None:
                broker_id, broker_epoch = speaker
                self._app.submit_nowait(
                    lambda core, now: core.heartbeat_stream_closed(
                        broker_id, broker_epoch, stream_id, now
                    )
                )

    async def WatchMetadata(
        self, request: pb.WatchMetadataRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.MetadataBatch]:
        async for batch in self._app.watch(request.from_offset):
            yield batch

    async def AlterPartition(
        self, request: pb.AlterPartitionRequest, context: grpc.aio.ServicerContext
    ) -> pb.AlterPartitionResponse:
        req = wire.alter_partition_request(request)
        reply = await self._app.submit(lambda core, now: core.alter_partition(req, now))
        return wire.alter_partition_reply(reply)

    async def AllocateProducerIds(
        self, request: pb.AllocateProducerIdsRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateProducerIdsResponse:
        broker_id, broker_epoch = request.broker_id, request.broker_epoch
        block = await self._app.submit(
            lambda core, now: core.allocate_producer_ids(broker_id, broker_epoch, now)
        )
        return wire.producer_ids_reply(block)

    async def CreateTopics(
        self, request: pb.CreateTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateTopicsResponse:
        topics = wire.creatable_topics(request)
        validate_only = request.validate_only
        results = await self._app.submit(
            lambda core, now: core.create_topics(topics, validate_only, now)
        )
        return wire.create_topics_reply(results)

    async def DeleteTopics(
        self, request: pb.DeleteTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteTopicsResponse:
        names = list(request.topic_names)
        results = await self._app.submit(lambda core, now: core.delete_topics(names, now))
        return wire.delete_topics_reply(results)

    async def DescribeCluster(
        self, request: pb.DescribeClusterRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeClusterResponse:
        # Through the command queue, so the answer never shows state that is not yet durable.
        desc = await self._app.submit(lambda core, now: Outcome(core.describe_cluster(now)))
        return wire.describe_cluster_reply(desc)

    async def ElectLeaders(
        self, request: pb.ElectLeadersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ElectLeadersResponse:
        try:
            kind, partitions = wire.election(request)
        except MiniBrokerError as err:
            return wire.elect_leaders_error(request, err)
        results = await self._app.submit(
            lambda core, now: core.elect_leaders(kind, partitions, now)
        )
        return wire.elect_leaders_reply(results)

    async def UnregisterBroker(
        self, request: pb.UnregisterBrokerRequest, context: grpc.aio.ServicerContext
    ) -> pb.UnregisterBrokerResponse:
        broker_id = request.broker_id
        reply = await self._app.submit(lambda core, now: core.unregister_broker(broker_id, now))
        return wire.unregister_broker_reply(reply)


__all__ = ["ControllerServicer"]
