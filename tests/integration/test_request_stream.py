"""`RequestStream` (client/stream.py) against an in-process grpc.aio server on 127.0.0.1.

What a Kafka connection promises its callers (Kafka's NetworkClient; docs/design.md §10): pipelined
requests on one stream each get their own answer whatever order the broker answers in; a request
that outlives its timeout fails with DEADLINE_EXCEEDED and takes the stream down with it (every
other request in flight on it fails, the next one opens a new stream); a broken or ended stream
fails its pending requests with an AioRpcError instead of leaving them hanging; `reset()` and
`close()` do what they say and leave no task behind. Also: the real BrokerServicer logs a handler
that raises and breaks the stream, and the client sees that as an error, not a hang.

No process is started (the server runs in the test's event loop), but these are real sockets and
an event loop, so the file lives with the integration tests. Synchronisation is by events and
polls with deadlines; the short request timeouts used are only ever meant to expire.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from minibroker.broker import service
from minibroker.client.stream import RequestStream
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

# Request "kinds", carried in max_wait_ms: how the scripted broker treats a request.
ANSWER = 0  # answer when the request's gate opens (at once if it has none)
END_STREAM = -1  # the handler returns: the stream ends with status OK
ABORT_STREAM = -2  # the handler aborts the stream with INTERNAL

LONG_S = 30.0  # a timeout no request in these tests is supposed to reach


async def until(predicate: Callable[[], Any], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.005)


def fetch(tag: int, kind: int = ANSWER) -> pb.FetchRequest:
    """A request the scripted broker recognises by `tag` (carried in replica_id)."""
    return pb.FetchRequest(replica_id=tag, max_wait_ms=kind)


class ScriptedBroker(pb_grpc.BrokerServiceServicer):
    """FetchStream served like broker/service.py's `_serve_stream` (one task per request, answers
    written under a lock, correlation_id echoed), with answers the test controls: an answer
    carries its request's tag in throttle_time_ms, so a caller can tell whether it got its own,
    and waits for `gates[tag]` when the test set one."""

    def __init__(self) -> None:
        self.gates: dict[int, asyncio.Event] = {}
        self.received: list[int] = []  # tags, in arrival order
        self.waiting: set[int] = set()  # tags whose handler is blocked on its gate
        self.answered: list[int] = []  # tags, in the order their answers were written
        self.opened = 0  # FetchStream calls started
        self.finished = 0  # FetchStream calls whose handler has returned

    async def FetchStream(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        self.opened += 1
        write_lock = asyncio.Lock()
        tasks: set[asyncio.Task[None]] = set()

        async def answer(request: pb.FetchRequest) -> None:
            gate = self.gates.get(request.replica_id)
            if gate is not None:
                self.waiting.add(request.replica_id)
                await gate.wait()
                self.waiting.discard(request.replica_id)
            response = pb.FetchResponse(
                throttle_time_ms=request.replica_id, correlation_id=request.correlation_id
            )
            async with write_lock:
                # Recorded under the lock and before the write: the order is the write order,
                # and the caller cannot have its answer before it is recorded here.
                self.answered.append(request.replica_id)
                await context.write(response)

        try:
            while True:
                request = await context.read()
                if request is grpc.aio.EOF:
                    break
                self.received.append(request.replica_id)
                if request.max_wait_ms == END_STREAM:
                    return
                if request.max_wait_ms == ABORT_STREAM:
                    await context.abort(grpc.StatusCode.INTERNAL, "scripted abort")
                task = asyncio.create_task(answer(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            self.finished += 1


class Server:
    """A grpc.aio server in this event loop, restartable on the same port."""

    def __init__(self, servicer: pb_grpc.BrokerServiceServicer) -> None:
        self.servicer = servicer
        self.port = 0
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        server = grpc.aio.server()
        pb_grpc.add_BrokerServiceServicer_to_server(self.servicer, server)
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace=None)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
async def broker() -> AsyncIterator[ScriptedBroker]:
    servicer = ScriptedBroker()
    yield servicer
    for gate in servicer.gates.values():
        gate.set()  # let no handler wait past the test


@pytest.fixture
async def server(broker: ScriptedBroker) -> AsyncIterator[Server]:
    srv = Server(broker)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.stop()


@pytest.fixture
async def channel(server: Server) -> AsyncIterator[grpc.aio.Channel]:
    chan = grpc.aio.insecure_channel(server.address)
    try:
        yield chan
    finally:
        await chan.close(grace=None)


@pytest.fixture
async def stream(channel: grpc.aio.Channel, server: Server) -> AsyncIterator[RequestStream]:
    rs = RequestStream(pb_grpc.BrokerServiceStub(channel).FetchStream, server.address)
    try:
        yield rs
    finally:
        await rs.close()


def status(err: BaseException) -> grpc.StatusCode:
    assert isinstance(err, grpc.aio.AioRpcError), f"expected an AioRpcError, got {err!r}"
    return err.code()


async def failure_of(awaitable: Awaitable[Any], timeout_s: float = 10.0) -> BaseException:
    """The exception `awaitable` ends with (a CancelledError too: a caller that was not cancelled
    must not see one, and the assertions on the result say so); a hang past `timeout_s` or an
    answer fails the test."""
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        task.cancel()
        raise AssertionError(f"still pending after {timeout_s}s: the request hangs")
    if task.cancelled():
        return asyncio.CancelledError()
    err = task.exception()
    if err is None:
        raise AssertionError(f"expected a failure, got an answer: {task.result()!r}")
    return err


# -- answers reach their callers ------------------------------------------------------------


async def test_answers_out_of_order_reach_their_own_callers(
    broker: ScriptedBroker, stream: RequestStream
) -> None:
    broker.gates[1] = asyncio.Event()
    first = asyncio.create_task(stream.request(fetch(1), LONG_S))
    await until(lambda: broker.received == [1], "request 1 at the broker")

    second = await stream.request(fetch(2), LONG_S)

    assert second.throttle_time_ms == 2
    assert not first.done(), "request 1 must still wait: its answer has not been written"
    broker.gates[1].set()
    assert (await asyncio.wait_for(first, 10)).throttle_time_ms == 1
    assert broker.answered == [2, 1]
    assert broker.opened == 1, "both requests went out on one stream"


async def test_many_concurrent_requests_on_one_stream_get_their_own_answers(
    broker: ScriptedBroker, stream: RequestStream
) -> None:
    count = 200
    for tag in range(count):
        broker.gates[tag] = asyncio.Event()
    callers = [asyncio.create_task(stream.request(fetch(tag), LONG_S)) for tag in range(count)]
    await until(lambda: len(broker.waiting) == count, "all requests waiting at the broker")

    release_order = list(range(count))
    random.Random(7).shuffle(release_order)
    for tag in release_order:
        broker.gates[tag].set()
    answers = await asyncio.wait_for(asyncio.gather(*callers), 20)

    assert [a.throttle_time_ms for a in answers] == list(range(count))
    assert broker.answered == release_order, "the broker answered in its own (shuffled) order"
    assert len({a.correlation_id for a in answers}) == count
    assert broker.opened == 1


async def test_a_cancelled_caller_leaves_the_stream_and_the_other_callers_alone(
    broker: ScriptedBroker, stream: RequestStream
) -> None:
    broker.gates[1] = asyncio.Event()
    broker.gates[2] = asyncio.Event()
    one = asyncio.create_task(stream.request(fetch(1), LONG_S))
    two = asyncio.create_task(stream.request(fetch(2), LONG_S))
    await until(lambda: sorted(broker.received) == [1, 2], "both requests at the broker")

    one.cancel()
    assert isinstance(await failure_of(one), asyncio.CancelledError)
    broker.gates[1].set()  # its answer arrives for nobody and is dropped
    broker.gates[2].set()

    assert (await asyncio.wait_for(two, 10)).throttle_time_ms == 2
    assert (await stream.request(fetch(3), LONG_S)).throttle_time_ms == 3
    assert broker.opened == 1


# -- timeouts ---------------------------------------------------------------------------------


async def test_a_timed_out_request_fails_its_stream_and_the_next_request_opens_a_new_one(
    broker: ScriptedBroker, stream: RequestStream
) -> None:
    broker.gates[1] = asyncio.Event()  # never opened: both requests stay unanswered
    broker.gates[2] = asyncio.Event()
    bystander = asyncio.create_task(stream.request(fetch(1), LONG_S))
    await until(lambda: broker.received == [1], "the bystander at the broker")

    timed_out = await failure_of(stream.request(fetch(2), 0.2))

    assert status(timed_out) == grpc.StatusCode.DEADLINE_EXCEEDED
    assert status(await failure_of(bystander)) == grpc.StatusCode.UNAVAILABLE
    await until(lambda: broker.finished == 1, "the broker to see the old stream end")
    assert (await stream.request(fetch(3), LONG_S)).throttle_time_ms == 3
    assert broker.opened == 2, "the request after the timeout went out on a new stream"


async def test_writes_blocked_by_flow_control_still_time_out_as_rpc_errors(
    server: Server,
) -> None:
    """A broker that stops reading (stuck, SIGSTOPped) stops granting HTTP/2 window, so produce
    requests pipelined to it block in the write itself: their timeout must still end every one
    of them with an AioRpcError (what callers handle), never a CancelledError that would end a
    sender or fetcher task that was not cancelled, and never a hang."""

    class Stuck(pb_grpc.BrokerServiceServicer):
        async def ProduceStream(self, request_iterator: Any, context: Any) -> None:
            await asyncio.Event().wait()  # never reads a request

    def produce() -> pb.ProduceRequest:
        request = pb.ProduceRequest(acks=1, timeout_ms=1000)
        records = b"\0" * (1 << 20)  # a full batch: a few fill the flow-control window
        request.topics.add(topic="t").partitions.add(partition=0, records=records)
        return request

    stuck = Server(Stuck())
    await stuck.start()
    chan = grpc.aio.insecure_channel(stuck.address)
    rs = RequestStream(pb_grpc.BrokerServiceStub(chan).ProduceStream, stuck.address)
    try:
        for _ in range(2):  # the second round on a fresh stream, blocked the same way
            requests = [asyncio.create_task(rs.request(produce(), 0.3)) for _ in range(12)]
            codes = [status(await failure_of(r)) for r in requests]
            assert set(codes) <= {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE}
            assert grpc.StatusCode.DEADLINE_EXCEEDED in codes
    finally:
        await rs.close()
        await chan.close(grace=None)
        await stuck.stop()


async def test_a_peer_that_accepts_but_never_speaks_http2_times_out_instead_of_hanging() -> None:
    """A listening socket nobody serves (a SIGSTOPped broker's port: the kernel still completes
    TCP handshakes) never lets the stream's headers go out; the request timeout must still
    apply to a request stuck behind them."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        chan = grpc.aio.insecure_channel(address)
        rs = RequestStream(pb_grpc.BrokerServiceStub(chan).FetchStream, address)
        try:
            first = asyncio.create_task(rs.request(fetch(1), 0.3))
            second = asyncio.create_task(rs.request(fetch(2), LONG_S))  # queued behind it
            assert status(await failure_of(first)) == grpc.StatusCode.DEADLINE_EXCEEDED
            assert status(await failure_of(second)) == grpc.StatusCode.UNAVAILABLE
            err = await failure_of(rs.request(fetch(3), 0.3))  # a new stream, same fate
            assert status(err) == grpc.StatusCode.DEADLINE_EXCEEDED
        finally:
            await rs.close()
            await chan.close(grace=None)


# -- the broker ends the stream, or goes away ------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "expected"),
    [(END_STREAM, grpc.StatusCode.UNAVAILABLE), (ABORT_STREAM, grpc.StatusCode.INTERNAL)],
    ids=["handler-returns", "handler-aborts"],
)
async def test_the_broker_ending_the_stream_fails_pending_requests(
    broker: ScriptedBroker, stream: RequestStream, kind: int, expected: grpc.StatusCode
) -> None:
    broker.gates[1] = asyncio.Event()
    pending = asyncio.create_task(stream.request(fetch(1), LONG_S))
    await until(lambda: broker.received == [1], "request 1 at the broker")

    ender = await failure_of(stream.request(fetch(2, kind), LONG_S))

    assert status(ender) == expected
    assert status(await failure_of(pending)) == expected
    assert (await stream.request(fetch(3), LONG_S)).throttle_time_ms == 3
    assert broker.opened == 2


async def test_the_server_stopping_fails_pending_requests_and_its_return_is_used(
    broker: ScriptedBroker, server: Server, stream: RequestStream
) -> None:
    assert (await stream.request(fetch(1), LONG_S)).throttle_time_ms == 1
    broker.gates[2] = asyncio.Event()
    pending = asyncio.create_task(stream.request(fetch(2), LONG_S))
    await until(lambda: broker.received == [1, 2], "request 2 at the broker")

    await server.stop()

    assert status(await failure_of(pending)) in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
    )
    # While the server is down every request fails fast with an error, none hangs.
    assert status(await failure_of(stream.request(fetch(3), LONG_S))) == (
        grpc.StatusCode.UNAVAILABLE
    )

    await server.start()  # same port
    deadline = time.monotonic() + 15
    while True:
        # The channel may still be backing off from its failed reconnect: callers retry
        # UNAVAILABLE, and so does this loop, until the deadline.
        try:
            answer = await stream.request(fetch(4), LONG_S)
            break
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            assert time.monotonic() < deadline, "the restarted server was never reached"
            await asyncio.sleep(0.05)
    assert answer.throttle_time_ms == 4


# -- reset and close ----------------------------------------------------------------------------


async def test_reset_fails_the_pending_request_with_cancelled_and_the_next_one_works(
    broker: ScriptedBroker, stream: RequestStream
) -> None:
    broker.gates[1] = asyncio.Event()
    pending = asyncio.create_task(stream.request(fetch(1), LONG_S))
    await until(lambda: broker.received == [1], "request 1 at the broker")

    stream.reset()

    assert status(await failure_of(pending)) == grpc.StatusCode.CANCELLED
    await until(lambda: broker.finished == 1, "the broker to see the reset stream end")
    assert (await stream.request(fetch(2), LONG_S)).throttle_time_ms == 2
    assert broker.opened == 2


async def test_close_fails_pending_and_later_requests_and_leaves_no_task(
    broker: ScriptedBroker, channel: grpc.aio.Channel, server: Server
) -> None:
    def stream_tasks() -> list[asyncio.Task[Any]]:
        """RequestStream's own tasks (its reader and writer) still running."""
        return [
            t
            for t in asyncio.all_tasks()
            if not t.done()
            and getattr(t.get_coro(), "__qualname__", "").startswith("RequestStream.")
        ]

    rs = RequestStream(pb_grpc.BrokerServiceStub(channel).FetchStream, server.address)
    assert (await rs.request(fetch(1), LONG_S)).throttle_time_ms == 1
    broker.gates[2] = asyncio.Event()
    pending = asyncio.create_task(rs.request(fetch(2), LONG_S))
    await until(lambda: broker.received == [1, 2], "request 2 at the broker")
    assert stream_tasks(), "an open stream has its reader task"

    await asyncio.wait_for(rs.close(), 10)

    assert status(await failure_of(pending)) == grpc.StatusCode.CANCELLED
    assert status(await failure_of(rs.request(fetch(3), LONG_S))) == grpc.StatusCode.CANCELLED
    assert stream_tasks() == []
    await until(lambda: broker.finished == 1, "the broker to see the closed stream end")
    assert broker.opened == 1, "a closed RequestStream opens no new stream"


# -- the real broker servicer: a handler that raises -----------------------------------------


class _RecordingLog:
    def __init__(self) -> None:
        self.exceptions: list[tuple[str, dict[str, Any]]] = []

    def exception(self, event: str, **facts: Any) -> None:
        self.exceptions.append((event, facts))


async def test_a_raising_broker_handler_is_logged_and_breaks_the_stream_for_the_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """broker/service.py's `_serve_stream`: a handler that raises is a bug, logged, and the
    stream is cancelled; the client must see an AioRpcError on every pending request, and a
    new stream afterwards."""
    recorded = _RecordingLog()
    monkeypatch.setattr(service, "log", recorded)
    release = asyncio.Event()

    class Broker(service.BrokerServicer):
        async def _fetch_one(self, request: pb.FetchRequest) -> pb.FetchResponse:
            if request.replica_id == 666:
                raise RuntimeError("handler bug")
            if request.replica_id == 1:
                await release.wait()
            return pb.FetchResponse(throttle_time_ms=request.replica_id)

    srv = Server(Broker(None))  # type: ignore[arg-type]  # _fetch_one never reaches it
    await srv.start()
    chan = grpc.aio.insecure_channel(srv.address)
    rs = RequestStream(pb_grpc.BrokerServiceStub(chan).FetchStream, srv.address)
    pending: asyncio.Task[pb.FetchResponse] | None = None
    try:
        assert (await rs.request(fetch(2), LONG_S)).throttle_time_ms == 2
        pending = asyncio.create_task(rs.request(fetch(1), LONG_S))
        # A broken stream fails its requests at once: seconds here mean it did not break.
        raising = await failure_of(rs.request(fetch(666), LONG_S), timeout_s=5)

        assert isinstance(raising, grpc.aio.AioRpcError)
        assert isinstance(await failure_of(pending, timeout_s=5), grpc.aio.AioRpcError)
        assert [event for event, _ in recorded.exceptions] == ["stream_request_failed"]
        assert (await rs.request(fetch(3), LONG_S)).throttle_time_ms == 3
    finally:
        release.set()
        await rs.close()
        if pending is not None:
            await asyncio.wait([pending])  # failed by close() if not before
            pending.exception()  # retrieved: no "never retrieved" noise when the test fails
        await chan.close(grace=None)
        await srv.stop()
