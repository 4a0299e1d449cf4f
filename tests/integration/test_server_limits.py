"""The server limits' gRPC pieces and the client's answers to them, on an in-process grpc.aio
server on 127.0.0.1 (real sockets and the real servicer loop; no broker process):

- `max.connections.per.ip`: a call that would make one connection too many from an address is
  refused with RESOURCE_EXHAUSTED, which the client treats as a retriable network error; more
  calls on a connection already counted are fine, and a closed connection frees its slot;
- `queued.max.request.bytes` on single-message calls: past the budget the next request is not
  read (its handler does not run) until earlier ones are answered; it is queued, not refused;
- `connections.max.idle.ms` on a request stream (broker/service.py `_serve_stream`): a stream
  with no request for that long is ended, one with a request in flight is not, and the client's
  next request opens a new stream without an error;
- the client's own idle rule: a request after `idle_ms` of quiet goes on a new stream;
- a request over the peer's size limit fails with RECORD_LIST_TOO_LARGE while the smaller
  requests that were pending on the same stream fail as retriable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from minibroker.broker import service
from minibroker.client.common.grpc_limits import LimitsInterceptor, RequestBudget
from minibroker.client.common.limits import ServerLimits
from minibroker.client.errors import NetworkExceptionError, RecordListTooLargeError
from minibroker.client.stream import RequestStream
from minibroker.client.transport import error_from_rpc
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

LONG_S = 30.0


async def until(predicate: Callable[[], Any], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.005)


class Gated(pb_grpc.BrokerServiceServicer):
    """Produce answers when `gate` opens; FetchStream echoes each request, holding a request
    whose replica_id is 1 until `gate` opens. Counts what its handlers saw."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.produce_started = 0
        self.streams_opened = 0

    async def Produce(self, request: pb.ProduceRequest, context: Any) -> pb.ProduceResponse:
        self.produce_started += 1
        await self.gate.wait()
        return pb.ProduceResponse()

    async def FetchStream(self, request_iterator: Any, context: Any) -> None:
        self.streams_opened += 1
        tasks: set[asyncio.Task[None]] = set()

        async def answer(request: pb.FetchRequest) -> None:
            if request.replica_id == 1:
                await self.gate.wait()
            await context.write(
                pb.FetchResponse(
                    correlation_id=request.correlation_id, throttle_time_ms=request.replica_id
                )
            )

        try:
            while True:
                request = await context.read()
                if request is grpc.aio.EOF:
                    return
                task = asyncio.create_task(answer(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            for task in tasks:
                task.cancel()


async def start_server(
    servicer: pb_grpc.BrokerServiceServicer, limits: ServerLimits
) -> tuple[grpc.aio.Server, str]:
    interceptor = LimitsInterceptor(limits, RequestBudget(limits.queued_max_request_bytes))
    server = grpc.aio.server(options=limits.grpc_options(), interceptors=[interceptor])
    pb_grpc.add_BrokerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def own_connection(address: str) -> grpc.aio.Channel:
    """A channel with a TCP connection of its own (channels of one process share by default)."""
    return grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def fetch(tag: int) -> pb.FetchRequest:
    return pb.FetchRequest(replica_id=tag)


async def test_a_connection_past_max_connections_per_ip_is_refused_as_a_network_error() -> None:
    servicer = Gated()
    server, address = await start_server(servicer, ServerLimits(max_connections_per_ip=2))
    channels = [own_connection(address) for _ in range(3)]
    streams = [RequestStream(pb_grpc.BrokerServiceStub(c).FetchStream, address) for c in channels]
    try:
        for tag in (5, 6):
            assert (await streams[tag - 5].request(fetch(tag), LONG_S)).throttle_time_ms == tag
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await streams[2].request(fetch(7), LONG_S)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max.connections.per.ip=2" in (refused.value.details() or "")
        mapped = error_from_rpc(refused.value, address)
        assert isinstance(mapped, NetworkExceptionError) and mapped.retriable

        # A second call on a connection already counted is admitted.
        servicer.gate.set()
        await pb_grpc.BrokerServiceStub(channels[0]).Produce(pb.ProduceRequest(), timeout=LONG_S)

        # Connection 0 goes away: its slot is free for the third connection.
        await streams[0].close()
        await channels[0].close()
        await until(lambda: servicer.streams_opened == 2, "the first stream to end")
        answer = None
        deadline = time.monotonic() + 10
        while answer is None:
            try:
                answer = await streams[2].request(fetch(8), LONG_S)
            except grpc.aio.AioRpcError:
                assert time.monotonic() < deadline, "the freed slot was never reused"
                await asyncio.sleep(0.05)
        assert answer.throttle_time_ms == 8
    finally:
        for s in streams:
            await s.close()
        for c in channels:
            await c.close()
        await server.stop(None)


async def test_past_the_queued_bytes_a_unary_request_waits_unread_until_room_is_made() -> None:
    servicer = Gated()
    limits = ServerLimits(socket_request_max_bytes=1 << 20, queued_max_request_bytes=1 << 20)
    server, address = await start_server(servicer, limits)
    stub = pb_grpc.BrokerServiceStub(own_connection(address))
    request = pb.ProduceRequest()
    request.topics.add(topic="t").partitions.add(partition=0, records=b"\0" * 600_000)
    try:
        calls = []
        # 600 kB read, room left: a second is read (1.2 MB, over); a third then waits unread.
        for started in (1, 2):
            calls.append(asyncio.ensure_future(stub.Produce(request, timeout=LONG_S)))
            await until(lambda: servicer.produce_started == started, f"request {started} read")  # noqa: B023
        calls.append(asyncio.ensure_future(stub.Produce(request, timeout=LONG_S)))
        done, _ = await asyncio.wait(calls, timeout=0.5)
        assert not done and servicer.produce_started == 2
        servicer.gate.set()
        await asyncio.gather(*calls)  # all three answered: queued, never refused
        assert servicer.produce_started == 3
    finally:
        servicer.gate.set()
        await server.stop(None)


class EchoBroker(service.BrokerServicer):
    """The real stream loop with a scripted fetch: the answer echoes the tag in
    throttle_time_ms; tag 1 waits for `gate`."""

    def __init__(self, idle_ms: int) -> None:
        super().__init__(None, stream_idle_ms=idle_ms)  # type: ignore[arg-type]
        self.gate = asyncio.Event()

    async def _fetch_one(self, request: pb.FetchRequest) -> pb.FetchResponse:
        if request.replica_id == 1:
            await self.gate.wait()
        return pb.FetchResponse(throttle_time_ms=request.replica_id)


async def test_the_broker_ends_an_idle_stream_and_the_client_carries_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    closed: list[dict[str, Any]] = []

    class Log:
        def info(self, event: str, **fields: Any) -> None:
            if event == "stream_idle_closed":
                closed.append(fields)

        def exception(self, event: str, **fields: Any) -> None:
            raise AssertionError(f"unexpected {event}: {fields}")

    monkeypatch.setattr(service, "log", Log())
    broker = EchoBroker(idle_ms=200)
    server, address = await start_server(broker, ServerLimits())
    channel = own_connection(address)
    stream = RequestStream(pb_grpc.BrokerServiceStub(channel).FetchStream, address)
    try:
        # A request in flight for longer than the idle time keeps its stream open.
        held = asyncio.ensure_future(stream.request(fetch(1), LONG_S))
        started = time.monotonic()
        await until(lambda: time.monotonic() - started > 0.6, "three idle periods")
        assert not held.done() and closed == []
        broker.gate.set()
        assert (await held).throttle_time_ms == 1

        # Quiet from now on: the broker ends the stream (status OK) ...
        await until(lambda: closed, "the broker to end the idle stream")
        assert closed[0]["rpc"] == "fetch"
        # ... and once the client has read the end of it (a request written before then races
        # the close and fails UNAVAILABLE, retriable, as on a Kafka connection closed idle), its
        # next request goes on a new stream, without an error.
        await until(lambda: stream._open is None, "the client to read the end of the stream")
        assert (await stream.request(fetch(2), LONG_S)).throttle_time_ms == 2
    finally:
        await stream.close()
        await channel.close()
        await server.stop(None)


async def test_the_client_opens_a_new_stream_after_its_own_idle_time() -> None:
    servicer = Gated()
    servicer.gate.set()
    server, address = await start_server(servicer, ServerLimits())
    channel = own_connection(address)
    # idle_ms=0: any quiet at all counts, so no test time has to pass.
    stream = RequestStream(pb_grpc.BrokerServiceStub(channel).FetchStream, address, idle_ms=0)
    try:
        assert (await stream.request(fetch(2), LONG_S)).throttle_time_ms == 2
        assert (await stream.request(fetch(3), LONG_S)).throttle_time_ms == 3
        assert servicer.streams_opened == 2
        # With a request pending the stream is not idle: both go on one stream.
        servicer.gate.clear()
        held = asyncio.ensure_future(stream.request(fetch(1), LONG_S))
        await until(lambda: servicer.streams_opened == 3, "the held request's stream")
        assert (await stream.request(fetch(4), LONG_S)).throttle_time_ms == 4
        servicer.gate.set()
        assert (await held).throttle_time_ms == 1
        assert servicer.streams_opened == 3
    finally:
        servicer.gate.set()
        await stream.close()
        await channel.close()
        await server.stop(None)


async def test_only_the_oversized_request_fails_as_too_large() -> None:
    servicer = Gated()
    server, address = await start_server(
        servicer, ServerLimits(socket_request_max_bytes=64 * 1024, queued_max_request_bytes=-1)
    )
    channel = own_connection(address)
    stream = RequestStream(pb_grpc.BrokerServiceStub(channel).FetchStream, address)
    big = pb.FetchRequest(replica_id=9, rack_id="x" * 100_000)
    try:
        held = asyncio.ensure_future(stream.request(fetch(1), LONG_S))
        await until(lambda: servicer.streams_opened == 1, "the stream")
        too_large = asyncio.ensure_future(stream.request(big, LONG_S))
        errors = await asyncio.gather(held, too_large, return_exceptions=True)
        assert all(isinstance(e, grpc.aio.AioRpcError) for e in errors), errors
        held_err, big_err = (error_from_rpc(e, address) for e in errors)  # type: ignore[arg-type]
        assert isinstance(big_err, RecordListTooLargeError), big_err
        assert "socket.request.max.bytes" in str(big_err)
        assert isinstance(held_err, NetworkExceptionError) and held_err.retriable, held_err
        servicer.gate.set()
        assert (await stream.request(fetch(2), LONG_S)).throttle_time_ms == 2
    finally:
        servicer.gate.set()
        await stream.close()
        await channel.close()
        await server.stop(None)
