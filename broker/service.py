"""The grpc.aio BrokerService servicer: decode, call the replica manager, encode. No logic here.

I/O shell, event-loop thread only. Expected domain errors are already turned into per-partition
error codes by the replica manager; anything else escaping a handler is a bug, logged with its
traceback and answered as a gRPC INTERNAL error. The request streams apply two of the server's
limits themselves (client/common/limits.py): `connections.max.idle.ms` (a stream with no request
for that long is ended) and, on ProduceStream, `queued.max.request.bytes`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from minibroker.broker import authz, wire
from minibroker.client.common.grpc_limits import RequestBudget
from minibroker.client.common.log import get_logger
from minibroker.client.common.security import ServerSecurity, authenticated, caller
from minibroker.metadata.acl import AclOperation
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from minibroker.broker.kafka.handlers import KafkaHandlers
    from minibroker.broker.replicas.manager import ReplicaManager

log = get_logger(__name__)


@authenticated
class BrokerServicer(pb_grpc.BrokerServiceServicer):
    """Every call is authenticated first (client/common/security.py) and authorized per
    SPEC-16b's table (broker/authz.py): refused topics get their error code and never reach
    the replica manager."""

    def __init__(
        self,
        replica_manager: ReplicaManager,
        *,
        stream_idle_ms: int | None = None,
        produce_budget: RequestBudget | None = None,
        security: ServerSecurity | None = None,
        kafka_handlers: KafkaHandlers | None = None,
    ) -> None:
        """`kafka_handlers`: what serves KafkaGroupCall (the Kafka port's own handlers)."""
        self._rm = replica_manager
        self._kafka = kafka_handlers
        self.security = security or ServerSecurity()
        self._access = self.security.access
        self._idle_s = None if stream_idle_ms is None else stream_idle_ms / 1000
        self._budget = produce_budget

    async def Produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProduceResponse:
        return await self._produce_one(request)

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> pb.FetchResponse:
        return await self._fetch_one(request)

    async def ProduceStream(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await _serve_stream(
            context, self._produce_one, "produce", idle_s=self._idle_s, budget=self._budget
        )

    async def FetchStream(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        # Fetch requests carry no records, and the follower fetches that complete an acks=all
        # produce must never wait behind produce requests: they are not held to the budget.
        await _serve_stream(context, self._fetch_one, "fetch", idle_s=self._idle_s)

    async def _produce_one(self, request: pb.ProduceRequest) -> pb.ProduceResponse:
        request, refused = authz.produce(self._access, caller(), request)
        if refused and not request.topics:
            return pb.ProduceResponse(topics=refused)
        results = await self._rm.produce(
            request.acks, request.timeout_ms, wire.decode_produce(request)
        )
        response = wire.encode_produce(results)
        response.topics.extend(refused)
        return response

    async def _fetch_one(self, request: pb.FetchRequest) -> pb.FetchResponse:
        who = caller()
        allowed, refusals = authz.fetch(self._access, who, request)
        if allowed is None:
            return refusals
        params = wire.decode_fetch(allowed)
        # A fetch session (KIP-227) answers only the one who opened it; the partitions it
        # remembers are authorized again each time one is read.
        topic_allowed = None
        if self._access.enabled and not params.is_follower:
            topic_allowed = functools.partial(self._access.on_topic, who, AclOperation.READ)
        answer = await self._rm.fetch(
            params, owner=(params.replica_id, str(who.principal)), topic_allowed=topic_allowed
        )
        response = wire.encode_fetch(
            answer.partitions, session_id=answer.session_id, error=answer.error
        )
        response.topics.extend(refusals.topics)
        return response

    async def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListOffsetsResponse:
        request, refused = authz.list_offsets(self._access, caller(), request)
        results = self._rm.list_offsets(wire.decode_list_offsets(request))
        response = wire.encode_list_offsets(results)
        response.topics.extend(refused)
        return response

    async def OffsetForLeaderEpoch(
        self, request: pb.OffsetForLeaderEpochRequest, context: grpc.aio.ServicerContext
    ) -> pb.OffsetForLeaderEpochResponse:
        request, refused = authz.offset_for_leader_epoch(self._access, caller(), request)
        results = self._rm.offset_for_leader_epoch(wire.decode_offset_for_leader_epoch(request))
        response = wire.encode_offset_for_leader_epoch(results)
        response.topics.extend(refused)
        return response

    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetadataResponse:
        response = self._rm.metadata_response(list(request.topics), request.all_topics)
        authz.filter_metadata(self._access, caller(), request, response)
        return response

    async def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: grpc.aio.ServicerContext
    ) -> pb.InitProducerIdResponse:
        refused = authz.init_producer_id_refusal(
            self._access, caller(), self._rm.image.topic_ids_by_name
        )
        return refused or await self._rm.init_producer_id()

    async def DescribeReplicas(
        self, request: pb.DescribeReplicasRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeReplicasResponse:
        states = self._rm.describe_replicas(set(request.topics))
        response = wire.encode_replicas(self._rm.broker_id, states)
        authz.filter_replicas(self._access, caller(), response)
        return response

    async def KafkaGroupCall(
        self, request: pb.KafkaFrame, context: grpc.aio.ServicerContext
    ) -> pb.KafkaFrame:
        """One Kafka group request, served by the Kafka port's handlers (broker/kafka/)."""
        from minibroker.broker.kafka import codec
        from minibroker.broker.kafka.handlers import GROUP_APIS, SUPPORTED

        if self._kafka is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "this broker serves no group APIs")
        served = {key: SUPPORTED[key] for key in GROUP_APIS if key in SUPPORTED}
        try:
            host = caller().host
            parsed = codec.parse_request(request.frame, served, f"/{host}" if host else "")
        except codec.KafkaProtocolError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        assert self._kafka is not None
        body = await self._kafka.handle(parsed, principal=caller())
        frame = codec.encode_response(
            parsed.api_key, parsed.api_version, parsed.correlation_id, body
        )
        return pb.KafkaFrame(frame=frame[4:])


def _give_back(budget: RequestBudget, size: int, _task: object) -> None:
    """A done callback: return a request's bytes to the budget however its task ended."""
    budget.give_back(size)


async def _serve_stream(
    context: grpc.aio.ServicerContext,
    handle: Callable[[Any], Awaitable[Any]],
    what: str,
    *,
    idle_s: float | None = None,
    budget: RequestBudget | None = None,
) -> None:
    """Answer every request read from a Produce/FetchStream call, each in its own task (an
    acks=all produce or a long-poll fetch must not hold up the requests behind it), echoing its
    correlation_id. The stream ends when the client half-closes it (after the answers still
    owed) or cancels it (the handlers are cancelled with it). A handler that raises is a bug: it
    is logged and the stream ends with that error (gRPC UNKNOWN), which fails every request
    pending on it at once, as a broken connection would.

    `idle_s`: a stream with no request read and none unanswered for this long ends with status
    OK (Kafka closes a connection idle for connections.max.idle.ms; the client opens a new
    stream with its next request). `budget`: the next request is read only while the budget has
    room, and its bytes count against it until it is answered."""
    write_lock = asyncio.Lock()
    tasks: set[asyncio.Task[None]] = set()
    failure: list[BaseException] = []
    reader = asyncio.current_task()
    assert reader is not None
    loop = asyncio.get_running_loop()
    # The idle check runs on a timer and looks at these, so no timer is made per request.
    last_active = loop.time()
    waiting_for_budget = False
    idled_out = False
    idle_timer: asyncio.TimerHandle | None = None

    def check_idle() -> None:
        nonlocal idle_timer, idled_out
        assert idle_s is not None
        idle_for = loop.time() - last_active
        if tasks or waiting_for_budget or idle_for < idle_s:
            idle_timer = loop.call_later(max(idle_s - idle_for, idle_s / 10), check_idle)
            return
        idle_timer = None
        idled_out = True
        reader.cancel()

    async def answer(request: Any) -> None:
        nonlocal last_active
        try:
            response = await handle(request)
            response.correlation_id = request.correlation_id
            async with write_lock:
                await context.write(response)
            last_active = loop.time()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.exception("stream_request_failed", rpc=what)
            failure.append(err)
            reader.cancel()

    if idle_s is not None:
        idle_timer = loop.call_later(idle_s, check_idle)
    try:
        while True:
            if budget is not None and budget.full:
                waiting_for_budget = True
                await budget.wait_for_room()
                waiting_for_budget = False
                last_active = loop.time()
            request = await context.read()
            if request is grpc.aio.EOF:
                break
            last_active = loop.time()
            task = asyncio.create_task(answer(request))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if budget is not None:
                # Given back however the task ends, even cancelled before it ever ran.
                size = request.ByteSize()
                budget.take(size)
                task.add_done_callback(functools.partial(_give_back, budget, size))
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    except asyncio.CancelledError:
        # Ended cancelled, gRPC would send no status and the client would wait out every
        # request's timeout: raise the handler's error instead, so the call ends UNKNOWN.
        if failure:
            raise failure[0] from None
        if idled_out:
            reader.uncancel()
            log.info("stream_idle_closed", rpc=what, peer=context.peer(), idle_s=idle_s)
            return
        raise
    finally:
        if idle_timer is not None:
            idle_timer.cancel()
        for task in tasks:
            task.cancel()
