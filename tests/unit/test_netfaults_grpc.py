"""The network fault layer on real gRPC calls (client/common/netfaults.py): an in-process
grpc.aio server on 127.0.0.1 (any port) with a small servicer of our ControllerService and
BrokerService methods, and clients through aio and synchronous channels with the layer.

A cut link holds a call (nothing reaches the server) until heal, then it is answered; with a
deadline it fails with DEADLINE_EXCEEDED; streams hold messages in both directions and deliver
them in order after heal; cancelling a held call ends it (even one whose end came back and is
held); a slow link adds its delay each way; `no_clients` holds calls at the server, their errors
and ends included, before they reach the server's limits. No fixed sleeps: "held" is seen
through the layer's count of held messages, waited on with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
import pytest

from minibroker.client.common.grpc_limits import LimitsInterceptor
from minibroker.client.common.limits import ServerLimits
from minibroker.client.common.netfaults import (
    NetFaults,
    aio_interceptors,
    intercept_sync,
    parse_faults,
    server_interceptors,
)
from minibroker.client.stream import RequestStream
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

WAIT_S = 10.0


END_STREAM = 0  # WatchMetadata's batches: this one ends the stream (OK),
ABORT_STREAM = -1  # this one with FAILED_PRECONDITION (context.abort)
RAISE_STREAM = -2  # and this one with UNKNOWN (the handler raises)


class Servicer(pb_grpc.ControllerServiceServicer, pb_grpc.BrokerServiceServicer):
    """Records what reached it; `gate` (when set) holds answers until released; `fail` makes
    DescribeCluster end with an error instead of answering: "abort" FAILED_PRECONDITION by
    context.abort(), "raise" an exception (UNKNOWN)."""

    def __init__(self) -> None:
        self.calls = 0
        self.heartbeats: list[int] = []
        self.fetches: list[int] = []
        self.batches: asyncio.Queue[int] = asyncio.Queue()
        self.gate: asyncio.Event | None = None
        self.fail: str | None = None

    async def DescribeCluster(self, request: Any, context: Any) -> pb.DescribeClusterResponse:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.fail == "abort":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not the controller")
        if self.fail == "raise":
            raise RuntimeError("a bug in the handler")
        return pb.DescribeClusterResponse(cluster_id="c1", metadata_offset=self.calls)

    async def Heartbeat(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        async for request in request_iterator:
            self.heartbeats.append(request.broker_epoch)
            if self.gate is not None:
                await self.gate.wait()
            yield pb.BrokerHeartbeatResponse(error_message=str(request.broker_epoch))

    async def WatchMetadata(self, request: Any, context: Any) -> AsyncIterator[Any]:
        while True:
            offset = await self.batches.get()
            if offset == END_STREAM:
                return
            if offset == ABORT_STREAM:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not the controller")
            if offset == RAISE_STREAM:
                raise RuntimeError("a bug in the handler")
            yield pb.MetadataBatch(high_offset=offset)

    async def FetchStream(self, request_iterator: Any, context: Any) -> None:
        # As broker/service.py serves it: context.read() and context.write().
        while True:
            request = await context.read()
            if request is grpc.aio.EOF:
                return
            self.fetches.append(request.correlation_id)
            if self.gate is not None:
                await self.gate.wait()
            await context.write(pb.FetchResponse(correlation_id=request.correlation_id))


def table(port: int, **fields: Any) -> Any:
    return parse_faults(
        json.dumps(
            {
                "version": 1,
                "generation": 1,
                "nodes": {"broker-1": "127.0.0.1:1", "controller-1": f"127.0.0.1:{port}"},
                **fields,
            }
        )
    )


CUT = {"cut": [["broker-1", "controller-1"]]}


async def eventually(predicate: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


class Env:
    def __init__(self, port: int, servicer: Servicer, server_faults: NetFaults) -> None:
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.servicer = servicer
        self.server_faults = server_faults
        self.faults = NetFaults("unused", "broker-1")  # the client's layer, set by hand
        self.channels: list[Any] = []

    def cut(self) -> None:
        self.faults.set_table(table(self.port, **CUT))

    def heal(self) -> None:
        self.faults.set_table(table(self.port))

    def aio_stub(self, layered: bool = True) -> Any:
        faults = self.faults if layered else None
        channel = grpc.aio.insecure_channel(
            self.address, interceptors=aio_interceptors(faults, self.address)
        )
        self.channels.append(channel)
        return pb_grpc.ControllerServiceStub(channel)

    def sync_stub(self) -> Any:
        channel = intercept_sync(grpc.insecure_channel(self.address), self.faults, self.address)
        self.channels.append(channel)
        return pb_grpc.ControllerServiceStub(channel)

    def fetch_stream(self, layered: bool = True) -> RequestStream:
        channel = grpc.aio.insecure_channel(self.address)
        self.channels.append(channel)
        return RequestStream(
            pb_grpc.BrokerServiceStub(channel).FetchStream,
            self.address,
            faults=self.faults if layered else None,
        )


@contextlib.asynccontextmanager
async def serving(servicer: Servicer, interceptors: list[Any]) -> AsyncIterator[int]:
    """An in-process server of `servicer` on 127.0.0.1; yields its port."""
    server = grpc.aio.server(interceptors=interceptors)
    pb_grpc.add_ControllerServiceServicer_to_server(servicer, server)
    pb_grpc.add_BrokerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(grace=None)


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    servicer = Servicer()
    server_faults = NetFaults("unused", "controller-1")
    async with serving(servicer, server_interceptors(server_faults)) as port:
        e = Env(port, servicer, server_faults)
        try:
            yield e
        finally:
            for channel in e.channels:
                closed = channel.close()
                if asyncio.iscoroutine(closed):
                    await closed


# -- aio channels -------------------------------------------------------------------------


async def test_a_cut_link_holds_a_unary_request_until_heal(env: Env) -> None:
    stub = env.aio_stub()
    assert (await stub.DescribeCluster(pb.DescribeClusterRequest())).cluster_id == "c1"
    env.cut()
    call = asyncio.ensure_future(stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=30))
    await eventually(lambda: env.faults.held == 1, "the request held")
    assert env.servicer.calls == 1 and not call.done()  # never sent
    env.heal()
    answer = await asyncio.wait_for(call, WAIT_S)
    assert answer.metadata_offset == 2


async def test_a_cut_link_holds_an_answer_that_came_back(env: Env) -> None:
    stub = env.aio_stub()
    env.servicer.gate = asyncio.Event()
    call = asyncio.ensure_future(stub.DescribeCluster(pb.DescribeClusterRequest()))
    await eventually(lambda: env.servicer.calls == 1, "the request served")
    env.cut()
    env.servicer.gate.set()  # the server answers now; the answer is not handed over
    await eventually(lambda: env.faults.held == 1, "the answer held")
    assert not call.done()
    env.heal()
    assert (await asyncio.wait_for(call, WAIT_S)).metadata_offset == 1


async def test_a_cut_link_ends_a_call_at_its_deadline(env: Env) -> None:
    stub = env.aio_stub()
    env.cut()
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=0.3)
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started >= 0.29
    assert env.servicer.calls == 0 and env.faults.held == 0


async def test_a_held_call_can_be_cancelled(env: Env) -> None:
    stub = env.aio_stub()
    env.cut()
    call = stub.DescribeCluster(pb.DescribeClusterRequest())
    waiter = asyncio.ensure_future(call)
    await eventually(lambda: env.faults.held == 1, "the request held")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiter, WAIT_S)
    await eventually(lambda: env.faults.held == 0, "the hold released")
    assert env.servicer.calls == 0


async def test_a_stream_holds_answers_and_delivers_them_in_order_after_heal(env: Env) -> None:
    stub = env.aio_stub()
    call = stub.WatchMetadata(pb.WatchMetadataRequest())
    got: list[int] = []

    async def consume() -> None:
        async for batch in call:
            got.append(batch.high_offset)

    consumer = asyncio.ensure_future(consume())
    env.servicer.batches.put_nowait(1)
    await eventually(lambda: got == [1], "the first batch")
    env.cut()
    for offset in (2, 3, 4):
        env.servicer.batches.put_nowait(offset)
    await eventually(lambda: env.faults.held == 1, "the second batch held")
    assert got == [1]
    env.heal()
    await eventually(lambda: got == [1, 2, 3, 4], "every batch, in order")
    # Cancelling the call while an answer is held ends the iteration as grpc.aio does.
    env.cut()
    env.servicer.batches.put_nowait(5)
    await eventually(lambda: env.faults.held == 1, "the fifth batch held")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(consumer, WAIT_S)
    assert got == [1, 2, 3, 4]


async def test_cancel_ends_a_read_whose_held_answer_is_the_streams_end(env: Env) -> None:
    # The server ends the stream while the link is cut: its status came back and is held, so
    # the call underneath is done and its own cancel() does nothing. The caller's cancel() must
    # still end the held read at once, and say it cancelled (found with a controller that
    # resigned while cut off: the broker moved its metadata watch to the new leader by
    # cancelling it, and the watch hung until the heal).
    stub = env.aio_stub()
    call = stub.WatchMetadata(pb.WatchMetadataRequest())
    got: list[int] = []

    async def consume() -> None:
        async for batch in call:
            got.append(batch.high_offset)

    consumer = asyncio.ensure_future(consume())
    env.servicer.batches.put_nowait(1)
    await eventually(lambda: got == [1], "the first batch")
    env.cut()
    env.servicer.batches.put_nowait(ABORT_STREAM)  # the stream's end is held on the cut link
    await eventually(lambda: env.faults.held == 1, "the stream's end held")
    assert call.cancel() is True
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(consumer, WAIT_S)
    assert env.faults.held == 0
    assert call.cancel() is False  # nothing left to cancel


async def test_a_request_stream_on_a_cut_link_ends_at_its_deadline(env: Env) -> None:
    # grpc.aio cancels a call whose request iterator raises: the hold must not raise there.
    stub = env.aio_stub()
    env.cut()

    async def requests() -> AsyncIterator[pb.BrokerHeartbeatRequest]:
        yield pb.BrokerHeartbeatRequest(broker_epoch=1)
        await asyncio.Event().wait()  # the stream stays open

    call = stub.Heartbeat(requests(), timeout=0.3)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        async for _ in call:
            pass
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert env.servicer.heartbeats == []
    await eventually(lambda: env.faults.held == 0, "the hold released")


async def test_a_request_stream_holds_requests_in_order_until_heal(env: Env) -> None:
    stream = env.fetch_stream()
    first = await stream.request(pb.FetchRequest(), 5)
    assert env.servicer.fetches == [first.correlation_id]
    env.cut()
    pending = [asyncio.ensure_future(stream.request(pb.FetchRequest(), 30)) for _ in range(3)]
    await eventually(lambda: env.faults.held == 1, "the writer held")
    assert len(env.servicer.fetches) == 1 and not any(p.done() for p in pending)
    env.heal()
    answers = await asyncio.wait_for(asyncio.gather(*pending), WAIT_S)
    ids = [a.correlation_id for a in answers]
    assert env.servicer.fetches[1:] == ids == sorted(ids)
    # A request held past its timeout fails as any timed-out request does.
    env.cut()
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await stream.request(pb.FetchRequest(), 0.2)
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await eventually(lambda: env.faults.held == 0, "the writer released")
    env.heal()
    assert (await stream.request(pb.FetchRequest(), 5)).correlation_id > 0
    await stream.close()


async def test_a_request_stream_holds_answers_on_a_cut_link(env: Env) -> None:
    stream = env.fetch_stream()
    await stream.request(pb.FetchRequest(), 5)
    env.servicer.gate = asyncio.Event()
    request = asyncio.ensure_future(stream.request(pb.FetchRequest(), 30))
    await eventually(lambda: len(env.servicer.fetches) == 2, "the request served")
    env.cut()
    env.servicer.gate.set()  # answered now, while the link is cut
    await eventually(lambda: env.faults.held == 1, "the answer held")
    assert not request.done()
    env.heal()
    assert (await asyncio.wait_for(request, WAIT_S)).correlation_id == 2
    # A request whose answer is held past its timeout fails, and the held read is let go.
    env.servicer.gate = asyncio.Event()
    request = asyncio.ensure_future(stream.request(pb.FetchRequest(), 0.5))
    await eventually(lambda: len(env.servicer.fetches) == 3, "the third request served")
    env.cut()
    env.servicer.gate.set()
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await asyncio.wait_for(request, WAIT_S)
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await eventually(lambda: env.faults.held == 0, "the held answer let go")
    await asyncio.wait_for(stream.close(), WAIT_S)


async def test_a_slow_link_delays_each_message_both_ways(env: Env) -> None:
    stub = env.aio_stub()
    await stub.DescribeCluster(pb.DescribeClusterRequest())  # connected
    env.faults.set_table(table(env.port, slow={"controller-1": {"delay_ms": 150}}))
    started = time.monotonic()
    await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=30)
    assert time.monotonic() - started >= 0.29  # 150 ms out, 150 ms back
    stream = env.fetch_stream()
    started = time.monotonic()
    await stream.request(pb.FetchRequest(), 30)
    assert time.monotonic() - started >= 0.29
    await stream.close()


async def test_without_a_fault_nothing_is_held_or_delayed(env: Env) -> None:
    env.faults.set_table(table(env.port, cut=[["broker-1", "controller-1"]]))
    env.faults.set_table(table(env.port))  # healed: the fast path again
    assert env.faults.active is None
    stub = env.aio_stub()
    assert (await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=5)).cluster_id


# -- the server side ----------------------------------------------------------------------


async def test_no_clients_holds_every_incoming_call_at_the_server(env: Env) -> None:
    stub = env.aio_stub(layered=False)  # a client outside the launcher's nodes
    stream = env.fetch_stream(layered=False)
    await stream.request(pb.FetchRequest(), 5)
    env.server_faults.set_table(table(env.port, no_clients=["controller-1"]))
    call = asyncio.ensure_future(stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=30))
    await eventually(lambda: env.server_faults.held == 1, "the unary call held")
    assert env.servicer.calls == 0
    # An open stream's next request is held too (read by the handler with context.read()).
    fetch = asyncio.ensure_future(stream.request(pb.FetchRequest(), 30))
    await eventually(lambda: env.server_faults.held == 2, "the stream's request held")
    assert len(env.servicer.fetches) == 1
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=0.2)
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    env.server_faults.set_table(table(env.port))
    assert (await asyncio.wait_for(call, WAIT_S)).cluster_id == "c1"
    assert (await asyncio.wait_for(fetch, WAIT_S)).correlation_id == 2
    await stream.close()


@pytest.mark.parametrize(
    "fail, code",
    [("abort", grpc.StatusCode.FAILED_PRECONDITION), ("raise", grpc.StatusCode.UNKNOWN)],
)
async def test_no_clients_holds_a_handlers_error_like_an_answer(
    env: Env, fail: str, code: grpc.StatusCode
) -> None:
    stub = env.aio_stub(layered=False)
    env.servicer.gate = asyncio.Event()
    env.servicer.fail = fail
    call = asyncio.ensure_future(stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=30))
    await eventually(lambda: env.servicer.calls == 1, "the handler running")
    env.server_faults.set_table(table(env.port, no_clients=["controller-1"]))
    env.servicer.gate.set()  # the handler fails now; its status is held
    await eventually(lambda: env.server_faults.held == 1, "the handler's error held")
    assert not call.done()
    env.server_faults.set_table(table(env.port))
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await asyncio.wait_for(call, WAIT_S)
    assert failed.value.code() == code


@pytest.mark.parametrize(
    "end, code",
    [
        (END_STREAM, grpc.StatusCode.OK),
        (ABORT_STREAM, grpc.StatusCode.FAILED_PRECONDITION),
        (RAISE_STREAM, grpc.StatusCode.UNKNOWN),
    ],
)
async def test_no_clients_holds_the_end_of_a_stream(
    env: Env, end: int, code: grpc.StatusCode
) -> None:
    stub = env.aio_stub(layered=False)
    call = stub.WatchMetadata(pb.WatchMetadataRequest(), timeout=30)
    got: list[int] = []

    async def consume() -> None:
        async for batch in call:
            got.append(batch.high_offset)

    consumer = asyncio.ensure_future(consume())
    env.servicer.batches.put_nowait(1)
    await eventually(lambda: got == [1], "the first batch")
    env.server_faults.set_table(table(env.port, no_clients=["controller-1"]))
    env.servicer.batches.put_nowait(end)
    await eventually(lambda: env.server_faults.held == 1, "the stream's end held")
    assert not consumer.done()
    env.server_faults.set_table(table(env.port))
    if code == grpc.StatusCode.OK:
        await asyncio.wait_for(consumer, WAIT_S)
    else:
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await asyncio.wait_for(consumer, WAIT_S)
        assert failed.value.code() == code
    assert got == [1]


async def test_calls_held_by_no_clients_count_against_no_server_limit() -> None:
    # The fault layer's interceptor goes first (outermost): a held call has not reached the
    # limits, so a second client is held too, not refused as over max.connections.per.ip.
    servicer = Servicer()
    server_faults = NetFaults("unused", "controller-1")
    limits = LimitsInterceptor(ServerLimits(max_connections_per_ip=1), None)
    async with serving(servicer, server_interceptors(server_faults, limits)) as port:
        address = f"127.0.0.1:{port}"
        # Two connections (channels to one target share one unless told not to).
        channels = [
            grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(2)
        ]
        try:
            first, second = (pb_grpc.ControllerServiceStub(c) for c in channels)
            server_faults.set_table(table(port, no_clients=["controller-1"]))
            one = asyncio.ensure_future(first.DescribeCluster(pb.DescribeClusterRequest()))
            await eventually(lambda: server_faults.held == 1, "the first client's call held")
            two = asyncio.ensure_future(second.DescribeCluster(pb.DescribeClusterRequest()))
            await eventually(lambda: server_faults.held == 2, "the second client's call held")
            assert not one.done() and not two.done() and servicer.calls == 0
            server_faults.set_table(table(port))
            # After the heal the limit applies again (the second may be refused if the two
            # overlap: the limit's call, not the fault layer's).
            answers = await asyncio.wait_for(
                asyncio.gather(one, two, return_exceptions=True), WAIT_S
            )
            assert answers[0].cluster_id == "c1"
        finally:
            for channel in channels:
                await channel.close()


# -- synchronous channels (the broker's heartbeat thread) ---------------------------------


def heartbeats(requests: queue.Queue[int | None]) -> Iterator[pb.BrokerHeartbeatRequest]:
    while (epoch := requests.get()) is not None:
        yield pb.BrokerHeartbeatRequest(broker_epoch=epoch)


async def test_sync_unary_call_held_until_heal(env: Env) -> None:
    stub = env.sync_stub()
    env.cut()
    call = asyncio.ensure_future(
        asyncio.to_thread(stub.DescribeCluster, pb.DescribeClusterRequest(), timeout=30)
    )
    await eventually(lambda: env.faults.held == 1, "the request held")
    assert env.servicer.calls == 0
    env.heal()
    assert (await asyncio.wait_for(call, WAIT_S)).cluster_id == "c1"
    env.cut()
    with pytest.raises(grpc.RpcError) as failed:
        await asyncio.to_thread(stub.DescribeCluster, pb.DescribeClusterRequest(), timeout=0.2)
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]


async def test_sync_stream_holds_both_ways_in_order_and_cancels(env: Env) -> None:
    stub = env.sync_stub()
    requests: queue.Queue[int | None] = queue.Queue()
    call = stub.Heartbeat(heartbeats(requests))
    got: list[str] = []
    ended: list[BaseException] = []

    def consume() -> None:
        try:
            for response in call:
                got.append(response.error_message)
        except grpc.RpcError as err:
            ended.append(err)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    requests.put(1)
    await eventually(lambda: got == ["1"], "the first answer")
    env.cut()
    requests.put(2)
    requests.put(3)
    await eventually(lambda: env.faults.held == 1, "the second heartbeat held")
    assert env.servicer.heartbeats == [1]
    env.heal()
    await eventually(lambda: got == ["1", "2", "3"], "every answer, in order")
    assert env.servicer.heartbeats == [1, 2, 3]
    # An answer that came back while the link is cut is held, then delivered after heal.
    env.servicer.gate = asyncio.Event()
    requests.put(4)
    await eventually(lambda: env.servicer.heartbeats == [1, 2, 3, 4], "the fourth served")
    env.cut()
    env.servicer.gate.set()
    await eventually(lambda: env.faults.held == 1, "the fourth answer held")
    assert got == ["1", "2", "3"]
    env.heal()
    await eventually(lambda: got == ["1", "2", "3", "4"], "the fourth answer")
    # A held call is cancelled (as the heartbeat thread's close() does).
    env.cut()
    requests.put(5)
    await eventually(lambda: env.faults.held == 1, "the fifth heartbeat held")
    call.cancel()
    await asyncio.to_thread(thread.join, WAIT_S)
    assert not thread.is_alive()
    assert ended and ended[0].code() == grpc.StatusCode.CANCELLED  # type: ignore[attr-defined]
    assert env.servicer.heartbeats == [1, 2, 3, 4]
    requests.put(None)
