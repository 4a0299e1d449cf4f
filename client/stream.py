"""Pipelined requests on one long-lived gRPC stream, answers matched by correlation id.

Does network I/O (grpc.aio). A `RequestStream` is what a Kafka client's connection is: requests
go out on one bidirectional call (ProduceStream or FetchStream) as they come, each tagged with a
correlation id, and a reader task hands every answer to the request that carries the same id, in
whatever order the broker finishes them. On this box a message on an open stream costs about half
the CPU and half the round-trip time of a unary call (measured: 330 against 650 us per round
trip, 390 against 700 us of CPU for both ends), and an acks=all record crosses four such hops.

Failures look exactly like the unary calls they replace, so callers keep one error path: every
request raises `grpc.aio.AioRpcError`: the stream's own status when it breaks (all requests
pending on it fail with it), DEADLINE_EXCEEDED when a request outlives its timeout, and
UNAVAILABLE when the broker ends the stream. A timed-out request closes the stream, as Kafka's
NetworkClient closes a connection on a request timeout (the broker is presumed stuck and every
request in flight on it is failed); the next request opens a new one. Event-loop thread only.

Requests are written by one writer task per stream, in the order they were made, as Kafka's
NetworkClient sends from its own thread; a caller only ever waits for its answer. So the timeout
covers the whole request, including a write that cannot finish (a broker that stopped reading
grants no more HTTP/2 window; one that accepts TCP but never speaks HTTP/2 never lets the stream's
headers out, and grpc.aio does not wake such a write when the call is cancelled), and a caller
that is cancelled leaves the stream and everyone else's requests on it alone.

Brokers end a stream that carried no request for `connections.max.idle.ms` (600 s by default);
like Kafka's clients, whose own connections.max.idle.ms (540 s) is shorter than the broker's, a
request after `idle_ms` of quiet goes on a new stream instead of racing the broker's close. A
request larger than the broker's `socket.request.max.bytes` ends the stream with
RESOURCE_EXHAUSTED naming its size: only the requests of that size get that status, the others
pending with it fail as UNAVAILABLE (retriable), since they were not the problem.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    from minibroker.client.common.netfaults import NetFaults

_ID_MASK = 0x7FFFFFFF  # correlation ids are int32 on the wire
# Kafka's client default for connections.max.idle.ms, below the broker's 600000.
CLIENT_IDLE_MS = 540_000
# grpc core's words when a message is over the receiver's limit: "... (<size> vs. <limit>)".
_TOO_LARGE = re.compile(r"larger than max \((\d+) vs\. (\d+)\)")


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class _OpenStream:
    """One bidirectional call, the requests waiting to be written on it (in order) and the
    requests waiting for an answer on it (every queued request is also pending)."""

    __slots__ = (
        "call",
        "last_used",
        "messages",
        "outbox",
        "pending",
        "reader",
        "wakeup",
        "writer",
    )

    def __init__(self, call: Any, now: float) -> None:
        self.call = call
        self.last_used = now
        self.pending: dict[int, asyncio.Future[Any]] = {}
        # The request of each pending id (the caller holds it anyway until answered).
        self.messages: dict[int, Any] = {}
        self.outbox: deque[Any] = deque()
        # Set while the writer waits for an empty outbox to fill.
        self.wakeup: asyncio.Future[None] | None = None
        self.reader: asyncio.Task[None] | None = None
        self.writer: asyncio.Task[None] | None = None

    def fail_all(self, err: BaseException) -> None:
        self.outbox.clear()
        pending, self.pending = self.pending, {}
        messages, self.messages = self.messages, {}
        too_large = _too_large_size(err)
        for cid, future in pending.items():
            if future.done():
                continue
            message = messages.get(cid)
            if too_large is not None and message is not None and message.ByteSize() != too_large:
                future.set_exception(
                    rpc_error(
                        grpc.StatusCode.UNAVAILABLE,
                        f"stream closed by the peer because another request on it was too "
                        f"large: {err.details() if isinstance(err, grpc.aio.AioRpcError) else err}",
                    )
                )
            else:
                future.set_exception(err)


def _too_large_size(err: BaseException) -> int | None:
    """The size of the message a RESOURCE_EXHAUSTED status names as over the limit, or None."""
    if not isinstance(err, grpc.aio.AioRpcError):
        return None
    if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    found = _TOO_LARGE.search(err.details() or "")
    return int(found.group(1)) if found else None


class RequestStream:
    """Requests to one broker on one stream method (e.g. `stub.FetchStream`)."""

    def __init__(
        self,
        method: Any,
        address: str,
        *,
        idle_ms: int = CLIENT_IDLE_MS,
        faults: NetFaults | None = None,
    ) -> None:
        self._method = method
        self.address = address
        # The network fault layer (None: not installed): each message written and each answer
        # read waits while the link to `address` is cut, and for its delay while it is slow.
        self._faults = faults
        self._idle_s = idle_ms / 1000
        self._open: _OpenStream | None = None
        self._next_id = 0
        self._closed = False

    async def request(self, message: Any, timeout_s: float) -> Any:
        """Send `message` (its correlation_id is set here) and return the broker's answer."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        stream = self._open
        if stream is not None and not stream.pending and now - stream.last_used >= self._idle_s:
            self.reset()  # idle: the broker may be closing it right now
            stream = None
        if stream is None:
            stream = self._start()
        stream.last_used = now
        self._next_id = cid = (self._next_id + 1) & _ID_MASK
        message.correlation_id = cid
        future: asyncio.Future[Any] = loop.create_future()
        stream.pending[cid] = future
        stream.messages[cid] = message
        stream.outbox.append(message)
        wakeup = stream.wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)
        timer = loop.call_later(timeout_s, self._expire, stream, cid)
        try:
            return await future
        finally:
            timer.cancel()
            stream.pending.pop(cid, None)
            stream.messages.pop(cid, None)
            stream.last_used = loop.time()

    def reset(self) -> None:
        """Close the current stream now (its pending requests fail with CANCELLED); the next
        request opens a new one."""
        stream = self._open
        if stream is not None:
            self._discard(stream)
            stream.fail_all(rpc_error(grpc.StatusCode.CANCELLED, "stream reset by the client"))

    async def close(self) -> None:
        """Fail what is pending with CANCELLED, refuse new requests, and return once the
        stream's tasks have ended."""
        self._closed = True
        stream = self._open
        self.reset()
        if stream is not None:
            tasks = [t for t in (stream.reader, stream.writer) if t is not None]
            if tasks:
                await asyncio.wait(tasks)

    # -- internals -------------------------------------------------------------------------

    def _start(self) -> _OpenStream:
        if self._closed:
            raise rpc_error(grpc.StatusCode.CANCELLED, "the client is closed")
        loop = asyncio.get_running_loop()
        stream = _OpenStream(self._method(), loop.time())
        stream.reader = loop.create_task(self._read(stream))
        stream.writer = loop.create_task(self._write(stream))
        self._open = stream
        return stream

    def _discard(self, stream: _OpenStream) -> None:
        """Stop using `stream` and end its call; the caller then fails what is pending on it."""
        if self._open is stream:
            self._open = None
        stream.call.cancel()
        # Cancelling the call does not wake a write still waiting for the call's headers to go
        # out (a peer that never speaks HTTP/2), nor a read whose answer is held on a cut link
        # (client/common/netfaults.py); cancelling their tasks does. Either then fails what is
        # still pending with CANCELLED: nothing, as our caller fails it all first.
        current = asyncio.current_task()
        for task in (stream.writer, stream.reader):
            if task is not None and task is not current:
                task.cancel()

    def _expire(self, stream: _OpenStream, cid: int) -> None:
        future = stream.pending.pop(cid, None)
        if future is None or future.done():
            return
        future.set_exception(
            rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, f"request to {self.address} timed out")
        )
        self._discard(stream)
        stream.fail_all(
            rpc_error(
                grpc.StatusCode.UNAVAILABLE,
                f"stream to {self.address} closed after a request timed out",
            )
        )

    async def _write(self, stream: _OpenStream) -> None:
        err: BaseException
        outbox = stream.outbox
        faults = self._faults
        try:
            while True:
                if not outbox:
                    stream.wakeup = asyncio.get_running_loop().create_future()
                    await stream.wakeup
                    stream.wakeup = None
                    continue
                if faults is not None and faults.active is not None:
                    # Held here, the request stays first in the outbox (order kept); its own
                    # timeout still runs, and cancels this writer when it fires.
                    await faults.hold(self.address)
                await stream.call.write(outbox.popleft())
        except grpc.aio.AioRpcError as rpc_err:
            err = rpc_err
        except asyncio.InvalidStateError:
            # The call has ended: the reader has its status and fails what is pending with it.
            return
        except asyncio.CancelledError:
            # Only _discard cancels the writer or its call, and its caller fails what is pending.
            err = rpc_error(grpc.StatusCode.CANCELLED, f"stream to {self.address} cancelled")
        except Exception as other:
            err = rpc_error(grpc.StatusCode.INTERNAL, f"stream to {self.address} failed: {other}")
        self._discard(stream)
        stream.fail_all(err)

    async def _read(self, stream: _OpenStream) -> None:
        err: BaseException
        faults = self._faults
        try:
            while True:
                answer = await stream.call.read()
                if faults is not None and faults.active is not None:
                    await faults.hold(self.address)
                if answer is grpc.aio.EOF:
                    err = rpc_error(grpc.StatusCode.UNAVAILABLE, f"{self.address} ended the stream")
                    break
                future = stream.pending.pop(answer.correlation_id, None)
                if future is not None and not future.done():
                    future.set_result(answer)
        except grpc.aio.AioRpcError as rpc_err:
            err = rpc_err
            if faults is not None and faults.active is not None and self._open is stream:
                # A broken stream is news from the peer too: none gets through a cut link.
                try:
                    await faults.hold(self.address)
                except asyncio.CancelledError:
                    err = rpc_error(
                        grpc.StatusCode.CANCELLED, f"stream to {self.address} cancelled"
                    )
        except asyncio.CancelledError:
            err = rpc_error(grpc.StatusCode.CANCELLED, f"stream to {self.address} cancelled")
        except Exception as other:
            err = rpc_error(grpc.StatusCode.INTERNAL, f"stream to {self.address} failed: {other}")
        self._discard(stream)
        stream.fail_all(err)
