"""The grpc.aio BrokerService servicer: decode, call the replica manager, encode. No logic here.

I/O shell, event-loop thread only. Expected domain errors are already turned into per-partition
error codes by the replica manager; anything else escaping a handler is a bug, logged with its
traceback and answered as a gRPC INTERNAL error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

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
        return await self._produce_one(request)

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> pb.FetchResponse:
        return await self._fetch_one(request)

    async def ProduceStream(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await _serve_stream(context, self._produce_one, "produce")

    async def FetchStream(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await _serve_stream(context, self._fetch_one, "fetch")

    async def _produce_one(self, request: pb.ProduceRequest) -> pb.ProduceResponse:
        results = await self._rm.produce(
            request.acks, request.timeout_ms, wire.decode_produce(request)
        )
        return wire.encode_produce(results)

    async def _fetch_one(self, request: pb.FetchRequest) -> pb.FetchResponse:
        return wire.encode_fetch(await self._rm.fetch(wire.decode_fetch(request)))

    async def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListOffsetsResponse:
        results = self._rm.list_offsets(wire.decode_list_offsets(request))
        return wire.encode_list_offsets(results)

    async def OffsetForLeaderEpoch(
        self, request: pb.OffsetForLeaderEpochRequest, context: grpc.aio.ServicerContext
    ) -> pb.OffsetForLeaderEpochResponse:
        results = self._rm.offset_for_leader_epoch(wire.decode_offset_for_leader_epoch(request))
        return wire.encode_offset_for_leader_epoch(results)

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


async def _serve_stream(
    context: grpc.aio.ServicerContext, handle: Callable[[Any], Awaitable[Any]], what: str
) -> None:
    """Answer every request read from a Produce/FetchStream call, each in its own task (an
    acks=all produce or a long-poll fetch must not hold up the requests behind it), echoing its
    correlation_id. The stream ends when the client half-closes it (after the answers still
    owed) or cancels it (the handlers are cancelled with it). A handler that raises is a bug: it
    is logged and the stream ends with that error (gRPC UNKNOWN), which fails every request
    pending on it at once, as a broken connection would."""
    write_lock = asyncio.Lock()
    tasks: set[asyncio.Task[None]] = set()
    failure: list[BaseException] = []
    reader = asyncio.current_task()
    assert reader is not None

    async def answer(request: Any) -> None:
        try:
            response = await handle(request)
            response.correlation_id = request.correlation_id
            async with write_lock:
                await context.write(response)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.exception("stream_request_failed", rpc=what)
            failure.append(err)
            reader.cancel()

    try:
        while True:
            request = await context.read()
            if request is grpc.aio.EOF:
                break
            task = asyncio.create_task(answer(request))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    except asyncio.CancelledError:
        # Ended cancelled, gRPC would send no status and the client would wait out every
        # request's timeout: raise the handler's error instead, so the call ends UNKNOWN.
        if failure:
            raise failure[0] from None
        raise
    finally:
        for task in tasks:
            task.cancel()
