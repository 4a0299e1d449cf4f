"""The Kafka-protocol listener (kafka.listeners): asyncio streams, size-prefixed frames.

I/O shell, event-loop thread only. Per connection, one reader reads a frame at a time: its
4-byte size first, refused (the connection closed) when negative or above
`socket.request.max.bytes` before a byte of the body is read, as Kafka's NetworkReceive does.
Each request is handled in its own task (an acks=all produce or a long-poll fetch must not hold
up the reading of the next one), and one writer sends the answers strictly in the order the
requests came (Kafka's rule: a client matches answers to requests by order as well as by
correlation id). At most `max_in_flight` requests per connection are being handled; the reader
waits for room.

What is not a readable request closes only its connection, as Kafka does: a truncated frame, a
malformed header or body, an unknown API key, an API or version not served (except ApiVersions,
answered at v0 with UNSUPPORTED_VERSION and the supported list, so that a client can pick one).
A handler that raises is a bug: logged, and the connection closed. The broker keeps serving.
A failed produce with acks=0 (no answer to carry the error) closes the connection too, after the
answers owed before it, as Kafka does, so that the producer notices.

Limits, Kafka's names, as on the gRPC port (client/common/limits.py): `max.connections` (a
connection past it on this listener is closed at once), `connections.max.idle.ms` (a connection
with no request read or answer written for that long, and none owed, is closed),
`queued.max.request.bytes` (the bytes of requests read and not yet answered, one budget shared
with the gRPC port: while it is full no connection reads a new request).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from minibroker.broker.kafka import codec
from minibroker.broker.kafka.handlers import (
    API_VERSIONS,
    CLOSE_CONNECTION,
    NO_RESPONSE,
    SUPPORTED,
    api_versions_response,
)
from minibroker.client.common.log import get_logger
from minibroker.client.errors import ErrorCode

log = get_logger("minibroker.broker.kafka")

_SIZE = struct.Struct(">i")
DEFAULT_MAX_IN_FLIGHT = 100

Handler = Callable[[codec.Request], Awaitable[Any]]
Frame = list[bytes | bytearray | memoryview]  # a response frame's pieces, written in order


class KafkaListener:
    """Serves `handler` on host:port. `start()` binds (port 0: any; `port` then says which)."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: Handler,
        *,
        max_request_bytes: int,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        metrics: Any = None,
        max_connections: int = 0,
        idle_ms: int = 0,
        budget: Any = None,
    ) -> None:
        """`metrics`: BrokerMetrics (its kafka_* counters), None in tests. `max_connections`,
        `idle_ms`: 0 for no bound. `budget`: a RequestBudget (client/common/grpc_limits.py)
        or None."""
        self._metrics = metrics
        self._max_connections = max_connections
        self._idle_s = idle_ms / 1000 if idle_ms > 0 else 0.0
        self._budget = budget
        self.host = host
        self.port = port
        self._handler = handler
        self._max_request_bytes = max_request_bytes
        self._max_in_flight = max_in_flight
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        # What tests and metrics read: connections closed for a bad request, by reason.
        self.closed_for: dict[str, int] = {}

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if 0 < self._max_connections <= len(self._connections):
            self._closed("too many connections")  # max.connections: refused at once
            writer.transport.abort()
            return
        self._connections.add(task)
        try:
            await Connection(self, reader, writer).serve()
        finally:
            self._connections.discard(task)

    def _closed(self, reason: str) -> None:
        self.closed_for[reason] = self.closed_for.get(reason, 0) + 1
        if self._metrics is not None:
            self._metrics.kafka_connections_closed.labels(reason).inc()

    def _counted(self, api_key: int, version: int) -> None:
        if self._metrics is not None:
            self._metrics.kafka_requests.labels(codec.api_name(api_key), str(version)).inc()


class Connection:
    """One client connection: the reader loop here, the writer in `_write_answers`."""

    def __init__(
        self, listener: KafkaListener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._listener = listener
        self._reader = reader
        self._writer = writer
        peer = writer.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._client_host = f"/{peer[0]}" if isinstance(peer, tuple) else ""  # Kafka's form
        # The answers owed, in request order: each a task giving the frame to send, as pieces
        # (NO_RESPONSE: none; CLOSE_CONNECTION: close after the ones before it).
        self._answers: asyncio.Queue[asyncio.Task[Any] | None] = asyncio.Queue(
            listener._max_in_flight
        )
        # connections.max.idle.ms: when a request was last read or an answer written, and how
        # many answers are owed (a connection waiting for a long-poll answer is not idle).
        self._last_active = asyncio.get_running_loop().time()
        self._owed = 0

    async def serve(self) -> None:
        writer_task = asyncio.create_task(self._write_answers(), name=f"kafka-write-{self._peer}")
        self._writer_task = writer_task
        watchdog = (
            asyncio.create_task(self._close_when_idle(listener_idle_s))
            if (listener_idle_s := self._listener._idle_s) > 0
            else None
        )
        reason = "client closed"
        try:
            reason = await self._read_requests()
        except (ConnectionError, OSError):
            reason = "connection lost"
        except asyncio.CancelledError:
            reason = "listener stopped"
            raise
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if writer_task.done():
                pass
            elif reason == "client closed":
                # A clean end: the answers owed are still sent, then the connection closes.
                await self._answers.put(None)
                with contextlib.suppress(Exception):
                    await writer_task
            else:
                writer_task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await writer_task
            self._cancel_pending()
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()

    async def _read_requests(self) -> str:
        """Read frames until the client closes or one is bad; returns why reading stopped."""
        listener = self._listener
        budget = listener._budget
        while True:
            if budget is not None and budget.full:
                await budget.wait_for_room()  # queued.max.request.bytes: read nothing more
            try:
                head = await self._reader.readexactly(4)
            except asyncio.IncompleteReadError as err:
                if err.partial:
                    return self._refuse("truncated size", f"{len(err.partial)} of 4 size bytes")
                return "client closed"
            (size,) = _SIZE.unpack(head)
            if size < 0 or size > listener._max_request_bytes:
                # Refused before reading the body (Kafka's InvalidReceiveException).
                return self._refuse(
                    "request too large",
                    f"size {size}: socket.request.max.bytes is {listener._max_request_bytes}",
                )
            try:
                frame = await self._reader.readexactly(size)
            except asyncio.IncompleteReadError as err:
                return self._refuse("truncated frame", f"{len(err.partial)} of {size} bytes")
            self._last_active = asyncio.get_running_loop().time()
            try:
                request = codec.parse_request(frame, SUPPORTED, self._client_host)
            except codec.UnsupportedVersion as err:
                if err.api_key != API_VERSIONS:
                    return self._refuse("unsupported version", str(err))
                # Kafka answers an ApiVersions it cannot read at v0, with its versions.
                body = api_versions_response(0, ErrorCode.UNSUPPORTED_VERSION)
                frame_out = codec.encode_response_pieces(API_VERSIONS, 0, err.correlation_id, body)
                self._owed += 1
                await self._answers.put(_done(frame_out))
                continue
            except codec.KafkaProtocolError as err:
                return self._refuse("malformed request", f"{err} (starts {frame[:48].hex()})")
            listener._counted(request.api_key, request.api_version)
            task = asyncio.create_task(self._answer(request))
            self._owed += 1
            if budget is not None and budget.limit > 0:
                budget.take(size)
                task.add_done_callback(_give_back(budget, size))
            await self._answers.put(task)
            if self._writer_task.done():
                # The writer gave up (the peer reset, a handler failed): nothing more is sent.
                return "connection lost"

    async def _answer(self, request: codec.Request) -> Any:
        body = await self._listener._handler(request)
        if body is NO_RESPONSE or body is CLOSE_CONNECTION:
            return body
        return codec.encode_response_pieces(
            request.api_key, request.api_version, request.correlation_id, body
        )

    async def _write_answers(self) -> None:
        clean = False
        try:
            while True:
                task = await self._answers.get()
                if task is None:
                    clean = True
                    return
                try:
                    frame = await task
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("kafka_handler_failed", peer=self._peer)
                    self._listener._closed("handler failed")
                    return
                self._owed -= 1
                if frame is CLOSE_CONNECTION:
                    log.info("kafka_connection_closed", peer=self._peer, reason="acks=0 failed")
                    self._listener._closed("acks=0 produce failed")
                    return
                if frame is not NO_RESPONSE:
                    # Piece by piece: a Fetch answer's record bytes go to the socket as read
                    # from the log, not copied into one frame first.
                    write = self._writer.write
                    for piece in frame:
                        write(piece)
                    await self._writer.drain()
                self._last_active = asyncio.get_running_loop().time()
        finally:
            if not clean:
                # Nothing after a lost answer may be sent (the client would match it wrongly):
                # close at once, and free the queue so a reader blocked on a full one goes on
                # (it then sees this task done and stops).
                self._writer.transport.abort()
                while not self._answers.empty():
                    pending = self._answers.get_nowait()
                    if pending is not None:
                        pending.cancel()

    async def _close_when_idle(self, idle_s: float) -> None:
        """connections.max.idle.ms: close the connection once nothing was read or written for
        `idle_s` and no answer is owed (Kafka's idle check counts bytes either way)."""
        loop = asyncio.get_running_loop()
        while True:
            wait = self._last_active + idle_s - loop.time()
            if wait <= 0:
                if self._owed == 0:
                    self._refuse("idle", f"nothing for {idle_s:g} s")
                    self._writer.transport.abort()
                    return
                wait = idle_s  # an answer is owed: look again later
            await asyncio.sleep(wait)

    def _refuse(self, reason: str, detail: str) -> str:
        log.info("kafka_connection_closed", peer=self._peer, reason=reason, detail=detail)
        self._listener._closed(reason)
        return reason

    def _cancel_pending(self) -> None:
        while not self._answers.empty():
            task = self._answers.get_nowait()
            if task is not None and not task.done():
                task.cancel()


def _give_back(budget: Any, size: int) -> Callable[[asyncio.Task[Any]], None]:
    """A done callback: the request's bytes go back to the budget once it is answered."""

    def give_back(_task: asyncio.Task[Any]) -> None:
        budget.give_back(size)

    return give_back


def _done(frame: Frame) -> asyncio.Task[Any]:
    async def ready() -> Any:
        return frame

    return asyncio.ensure_future(ready())


async def start_listener(
    config: Any, replica_manager: Any, handlers: Any, budget: Any = None
) -> tuple[KafkaListener | None, str, int]:
    """The broker's Kafka listener from its config (kafka.listeners), started, serving
    `handlers` (KafkaHandlers): (listener, host and port to register for Kafka clients).
    (None, "", 0) when kafka.listeners is empty. OSError when it cannot bind. `budget`: the
    gRPC server's RequestBudget (queued.max.request.bytes is one bound per broker)."""
    chosen = config.kafka_listener
    if chosen is None:
        return None, "", 0
    listener = KafkaListener(
        chosen.host,
        chosen.port,
        handlers.handle,
        max_request_bytes=config.limits.socket_request_max_bytes,
        metrics=replica_manager.metrics,
        max_connections=config.limits.max_connections,
        idle_ms=config.limits.connections_max_idle_ms,
        budget=budget,
    )
    bound = await listener.start()
    advertised = config.kafka_advertised(bound)
    host = f"[{advertised.host}]" if ":" in advertised.host else advertised.host
    return listener, host, advertised.port
