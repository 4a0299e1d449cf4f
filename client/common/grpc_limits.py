"""The gRPC side of the servers' limits (see `limits.py` for what each setting means).

I/O shell (asyncio and grpc.aio), event-loop thread only. `RequestBudget` is
`queued.max.request.bytes`: bytes of requests read and not yet answered. `LimitsInterceptor`
applies `max.connections.per.ip` to every call and the budget to calls whose request is a single
message (it waits for room before grpc reads the message); a request stream applies the budget
itself, message by message (broker/service.py).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from minibroker.client.common.limits import ConnectionsPerIp, ServerLimits, peer_host

# Health checks answer from memory and must answer while the server is busiest.
_NOT_QUEUED = "/grpc.health.v1.Health/"


class RequestBudget:
    """Bytes of requests read and not yet answered, against `queued.max.request.bytes`.

    A reader calls `wait_for_room()` before it reads a request and `take(size)` once it has it;
    whoever answers it calls `give_back(size)`. While the bytes taken are at or over the limit
    no reader proceeds: nothing more is read from the network (grpc core holds a stream's unread
    data to its HTTP/2 window), as Kafka's network threads stop reading while its request queue
    is full. It is checked before a read and charged after it (a request's size is known only
    once it is read), so the readers that were already reading when the budget filled each
    finish that one request: the bytes taken can exceed the limit by one request per stream or
    unary call being read at that moment, each at most `socket.request.max.bytes`.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit  # <= 0: no bound
        self.used = 0
        self.high_water = 0
        self._room: asyncio.Event | None = None

    @property
    def full(self) -> bool:
        return 0 < self.limit <= self.used

    async def wait_for_room(self) -> None:
        while self.full:
            if self._room is None:
                self._room = asyncio.Event()
            await self._room.wait()

    def take(self, size: int) -> None:
        self.used += size
        if self.used > self.high_water:
            self.high_water = self.used

    def give_back(self, size: int) -> None:
        self.used -= size
        if self._room is not None and not self.full:
            self._room.set()
            self._room = None


def _refuse_message(host: str, limit: int) -> str:
    return (
        f"too many connections from {host} (max.connections.per.ip={limit}); "
        "close idle clients or raise the limit"
    )


class LimitsInterceptor(grpc.aio.ServerInterceptor):
    """Applies `max.connections.per.ip` and, for single-message requests, the request budget."""

    def __init__(self, limits: ServerLimits, budget: RequestBudget | None) -> None:
        self._limit = limits.max_connections_per_ip
        self._per_ip = ConnectionsPerIp(self._limit) if limits.per_ip_limited else None
        self._budget = budget if budget is not None and budget.limit > 0 else None

    @property
    def enabled(self) -> bool:
        return self._per_ip is not None or self._budget is not None

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        if handler.request_streaming:
            if self._per_ip is None:
                return handler
            if handler.response_streaming:
                return grpc.stream_stream_rpc_method_handler(
                    self._wrap(handler.stream_stream, budget=False),
                    handler.request_deserializer,
                    handler.response_serializer,
                )
            return grpc.stream_unary_rpc_method_handler(
                self._wrap(handler.stream_unary, budget=False),
                handler.request_deserializer,
                handler.response_serializer,
            )
        if self._budget is not None and not handler_call_details.method.startswith(_NOT_QUEUED):
            # grpc reads the request after this returns: wait here while the budget is full.
            await self._budget.wait_for_room()
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap(handler.unary_stream, budget=True),
                handler.request_deserializer,
                handler.response_serializer,
            )
        return grpc.unary_unary_rpc_method_handler(
            self._wrap(handler.unary_unary, budget=True),
            handler.request_deserializer,
            handler.response_serializer,
        )

    def _enter(self, request: Any, context: grpc.aio.ServicerContext, budget: bool) -> Any:
        """Admit the call: returns what `_leave` needs, or None when it must be refused."""
        peer = None
        if self._per_ip is not None:
            peer = context.peer()
            if not self._per_ip.open(peer):
                return None
        size = request.ByteSize() if budget and self._budget is not None else 0
        if size:
            self._budget.take(size)  # type: ignore[union-attr]
        return peer, size

    def _leave(self, admitted: tuple[str | None, int]) -> None:
        peer, size = admitted
        if size:
            self._budget.give_back(size)  # type: ignore[union-attr]
        if peer is not None and self._per_ip is not None:
            self._per_ip.close(peer)

    async def _refuse(self, context: grpc.aio.ServicerContext) -> None:
        host = peer_host(context.peer())
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, _refuse_message(host, self._limit))

    def _wrap(self, behavior: Any, *, budget: bool) -> Any:
        if inspect.isasyncgenfunction(behavior):

            async def wrapped_gen(request: Any, context: grpc.aio.ServicerContext) -> Any:
                admitted = self._enter(request, context, budget)
                if admitted is None:
                    await self._refuse(context)
                    return
                try:
                    async for response in behavior(request, context):
                        yield response
                finally:
                    self._leave(admitted)

            return wrapped_gen
        if inspect.iscoroutinefunction(behavior):

            async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
                admitted = self._enter(request, context, budget)
                if admitted is None:
                    await self._refuse(context)
                    return None
                try:
                    return await behavior(request, context)
                finally:
                    self._leave(admitted)

            return wrapped
        return behavior  # a synchronous handler runs in grpc's thread pool: none here


__all__ = ["LimitsInterceptor", "RequestBudget"]
