"""The broker's link to the controller: registration, the heartbeat stream, the metadata watch,
AlterPartition and producer-id allocation.

I/O shell. Registration, the metadata watch and the requests run on the event loop (grpc.aio, one
channel). The heartbeat stream runs on a thread of its own with a blocking channel, as Kafka's
BrokerLifecycleManager does: a long synchronous stretch on the event loop (creating a thousand
partition logs, a slow disk) must not get the broker fenced. What a heartbeat reports is read
from plain attributes the loop keeps current (the broker epoch, the last metadata offset whose
batch is fully applied, want_shut_down, the offline log dirs); what an answer says comes back as
plain attributes (`is_fenced`, `is_caught_up`) and as asyncio events set on the loop. Every
loop survives the controller going away: it backs off and reconnects, and the broker keeps
serving with its last metadata meanwhile (docs/design.md §3.2). Nothing here decides anything about
replication; metadata batches are handed to `on_metadata`.

A failed data dir is reported in the next heartbeat, sent at once (Kafka's OfflineLogDirs), and
in every one after; `offline_log_dirs_reported` is set when the controller has answered one
that carried it (it fenced this broker), or no longer knows this incarnation.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import grpc

from minibroker.client.common.log import get_logger
from minibroker.client.errors import ErrorCode, MiniBrokerError, error_for
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

log = get_logger(__name__)

RECONNECT_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 2000),
    ("grpc.keepalive_timeout_ms", 2000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class FatalRegistrationError(MiniBrokerError):
    """The controller refused this broker for a reason a retry cannot fix (wrong cluster id,
    an invalid registration)."""


@dataclass(slots=True)
class Registration:
    broker_epoch: int
    cluster_id: str


class ControllerLink:
    def __init__(
        self,
        *,
        controller: tuple[str, int],
        broker_id: int,
        host: str,
        port: int,
        rack: str,
        metrics_port: int,
        cluster_id: str,
        previous_broker_epoch: int,
        heartbeat_interval_ms: int,
        on_metadata: Callable[[pb.MetadataBatch], Awaitable[None]],
        metadata_offset: Callable[[], int],
        applied_offset: Callable[[], int] | None = None,
    ) -> None:
        """`metadata_offset()`: where the watch resumes (the next offset not in the image).
        `applied_offset()`: the next offset whose batch is not fully acted on yet, which the
        heartbeats report (the controller's "caught up"); called on the heartbeat thread, so
        it must only read a number. None: `metadata_offset`."""
        self.broker_id = broker_id
        self.incarnation_id = uuid.uuid4().hex
        self._target = f"{controller[0]}:{controller[1]}"
        self._host, self._port, self._rack = host, port, rack
        self._metrics_port = metrics_port
        self.cluster_id = cluster_id
        self._previous_broker_epoch = previous_broker_epoch
        self._heartbeat_interval_s = heartbeat_interval_ms / 1000.0
        self._on_metadata = on_metadata
        self._metadata_offset = metadata_offset
        self._applied_offset = applied_offset or metadata_offset
        self._channel = grpc.aio.insecure_channel(self._target, options=_CHANNEL_OPTIONS)
        self._stub = pb_grpc.ControllerServiceStub(self._channel)
        # The heartbeat thread's own blocking channel: it never waits for the event loop.
        self._heartbeat_channel = grpc.insecure_channel(self._target, options=_CHANNEL_OPTIONS)
        self._heartbeat_stub = pb_grpc.ControllerServiceStub(self._heartbeat_channel)
        self._heartbeat_call: grpc.Future | None = None
        self.broker_epoch = -1
        self.is_fenced = True
        self.is_caught_up = False
        self.want_shut_down = False
        self.should_shut_down = asyncio.Event()
        self.registered = asyncio.Event()
        self.controller_reachable = False
        # Set from the loop, waited on by the heartbeat thread: send the next heartbeat now.
        self._wake_heartbeat = threading.Event()
        self._closing = asyncio.Event()
        self._stop_heartbeats = threading.Event()  # the thread's view of `_closing`
        self.offline_log_dirs: tuple[str, ...] = ()
        self.offline_log_dirs_reported = asyncio.Event()
        # Set on the heartbeat thread when the controller grants the controlled shutdown (the
        # loop's `should_shut_down` follows): no heartbeat is sent after it.
        self._shut_down_granted = False

    # -- registration -----------------------------------------------------------------------

    async def register(self, stop: asyncio.Event) -> Registration:
        """Register until the controller accepts; a wrong cluster id or an invalid registration
        is fatal."""
        attempt = 0
        while not stop.is_set():
            request = pb.BrokerRegistrationRequest(
                broker_id=self.broker_id,
                cluster_id=self.cluster_id,
                incarnation_id=self.incarnation_id,
                host=self._host,
                port=self._port,
                rack=self._rack,
                previous_broker_epoch=self._previous_broker_epoch,
                metrics_port=self._metrics_port,
            )
            try:
                response = await self._stub.RegisterBroker(request, timeout=5.0)
            except grpc.aio.AioRpcError as err:
                self.controller_reachable = False
                if attempt % 20 == 0:
                    log.warning(
                        "controller_unreachable", target=self._target, status=err.code().name
                    )
                await _backoff(attempt, stop)
                attempt += 1
                continue
            self.controller_reachable = True
            code = ErrorCode(response.error_code)
            if code == ErrorCode.NONE:
                self.broker_epoch = response.broker_epoch
                self.cluster_id = response.cluster_id
                self.registered.set()
                log.info(
                    "broker_registered",
                    broker_epoch=self.broker_epoch,
                    cluster_id=self.cluster_id,
                    incarnation_id=self.incarnation_id,
                )
                return Registration(response.broker_epoch, response.cluster_id)
            if code in (ErrorCode.INCONSISTENT_CLUSTER_ID, ErrorCode.INVALID_REQUEST):
                # Another cluster's data dir, or a registration the controller cannot accept
                # (a bad host, port or rack): the same request would be refused forever.
                raise FatalRegistrationError(response.error_message, code=code)
            # DUPLICATE_BROKER_REGISTRATION: our previous incarnation's session has not expired
            # yet; it will, so keep trying.
            if attempt % 20 == 0:
                log.warning("registration_refused", error=code.name, message=response.error_message)
            await _backoff(attempt, stop)
            attempt += 1
        raise asyncio.CancelledError

    # -- heartbeats ---------------------------------------------------------------------------

    def request_controlled_shutdown(self) -> None:
        self.want_shut_down = True
        self._wake_heartbeat.set()

    def report_offline_log_dir(self, path: str) -> None:
        """Tell the controller in the next heartbeat, sent now, that the data dir failed."""
        self.offline_log_dirs = (path,)
        self._wake_heartbeat.set()

    async def heartbeat_loop(self) -> None:
        """Keep one heartbeat stream open; reopen it (re-registering if told to) when it breaks.

        Each stream runs on a thread of its own; this coroutine waits for it to end and decides
        what comes next. Runs until `close()` (not until SIGTERM): a controlled shutdown needs
        the stream to carry want_shut_down until the controller grants the exit.
        """
        attempt = 0
        stop = self._closing
        while not stop.is_set():
            try:
                await self._run_heartbeat_stream()
                attempt = 0
            except grpc.RpcError as err:
                self.controller_reachable = False
                code = err.code() if isinstance(err, grpc.Call) else None
                log.warning("heartbeat_stream_broken", status=code.name if code else str(err))
            except _ReRegister:
                if self.offline_log_dirs:
                    # The controller no longer knows this incarnation, so it leads nothing and
                    # is in no ISR: nothing is left to report, and no new one may start here.
                    self.offline_log_dirs_reported.set()
                    return
                self.registered.clear()
                self.is_fenced = True
                await self.register(stop)
                continue
            except Exception:
                # Anything else ending the thread (a closed channel, an answer this broker cannot
                # read) must not end the heartbeats for good: log it, back off, start a new one.
                self.controller_reachable = False
                log.exception("heartbeat_stream_failed")
            if self.should_shut_down.is_set():
                return
            await _backoff(attempt, stop)
            attempt += 1

    async def _run_heartbeat_stream(self) -> None:
        """Run one heartbeat stream on its own thread; return or raise as it ends."""
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[None] = loop.create_future()

        def finish(error: BaseException | None) -> None:
            if ended.done():
                return
            if error is None:
                ended.set_result(None)
            else:
                ended.set_exception(error)

        def run() -> None:
            error: BaseException | None = None
            try:
                self._heartbeat_stream(loop)
            except BaseException as err:
                error = err
            _call_on_loop(loop, finish, error)

        # The thread logs with the loop's context (the component and node id on every line).
        context = contextvars.copy_context()
        threading.Thread(target=context.run, args=(run,), name="heartbeat", daemon=True).start()
        try:
            await ended
        except asyncio.CancelledError:
            self._stop_heartbeat_thread()
            raise

    def _heartbeat_stream(self, loop: asyncio.AbstractEventLoop) -> None:
        """The heartbeat thread: one stream, answers read until it ends, breaks or is stopped.

        Raises _ReRegister when the controller no longer knows this broker epoch, and the
        stream's grpc.RpcError when it breaks.
        """
        # Per heartbeat sent on this stream, oldest first: whether it carried the offline
        # dirs. The controller answers a stream's heartbeats one by one, in order.
        sent_offline: collections.deque[bool] = collections.deque()
        over = threading.Event()
        call = self._heartbeat_stub.Heartbeat(self._heartbeat_requests(sent_offline, over))
        self._heartbeat_call = call
        try:
            if self._stop_heartbeats.is_set():
                return  # closed while this stream was starting
            for response in call:
                self.controller_reachable = True
                try:
                    code = ErrorCode(response.error_code)
                except ValueError:  # a code this broker does not know: an error all the same
                    code = ErrorCode.UNKNOWN_SERVER_ERROR
                carried_offline = sent_offline.popleft() if sent_offline else False
                if code in (ErrorCode.BROKER_ID_NOT_REGISTERED, ErrorCode.STALE_BROKER_EPOCH):
                    log.warning(
                        "heartbeat_rejected", error=code.name, message=response.error_message
                    )
                    raise _ReRegister
                if code != ErrorCode.NONE:
                    log.warning("heartbeat_error", error=code.name, message=response.error_message)
                    continue
                if carried_offline and response.is_fenced:
                    _call_on_loop(loop, self._offline_log_dirs_reported)
                if self.is_fenced != response.is_fenced:
                    log.info("broker_fence_state", fenced=response.is_fenced)
                self.is_fenced = response.is_fenced
                self.is_caught_up = response.is_caught_up
                if response.should_shut_down:
                    self._shut_down_granted = True
                    _call_on_loop(loop, self.should_shut_down.set)
                    return
        except grpc.RpcError:
            if self._stop_heartbeats.is_set():
                return  # cancelled by close()
            raise
        finally:
            over.set()
            call.cancel()

    def _heartbeat_requests(
        self, sent_offline: collections.deque[bool], over: threading.Event
    ) -> Iterator[pb.BrokerHeartbeatRequest]:
        """One stream's heartbeats (grpc's sending thread runs this): one at once, then one per
        interval or as soon as something is to be reported."""
        while not (over.is_set() or self._stop_heartbeats.is_set()):
            # Cleared before the state is read, not after: a wake-up while this heartbeat is
            # built or sent (a log dir failing then) sends the next one at once, never a period
            # later.
            self._wake_heartbeat.clear()
            offline = self.offline_log_dirs
            request = pb.BrokerHeartbeatRequest(
                broker_id=self.broker_id,
                broker_epoch=self.broker_epoch,
                # The last offset acted on in full (Kafka: >= the registration offset means
                # caught up).
                current_metadata_offset=self._applied_offset() - 1,
                want_fence=False,
                want_shut_down=self.want_shut_down,
                offline_log_dirs=list(offline),
            )
            sent_offline.append(bool(offline))
            yield request
            if self._shut_down_granted:
                return
            self._wake_heartbeat.wait(self._heartbeat_interval_s)

    def _offline_log_dirs_reported(self) -> None:
        if not self.offline_log_dirs_reported.is_set():
            log.info("offline_log_dirs_reported", log_dirs=list(self.offline_log_dirs))
        self.offline_log_dirs_reported.set()

    def _stop_heartbeat_thread(self) -> None:
        self._stop_heartbeats.set()
        self._wake_heartbeat.set()
        call = self._heartbeat_call
        if call is not None:
            call.cancel()

    # -- metadata -----------------------------------------------------------------------------

    async def watch_loop(self) -> None:
        """Follow the controller's metadata log from the next unapplied offset until `close()`
        (through a controlled shutdown too: the leadership moves arrive this way)."""
        attempt = 0
        stop = self._closing
        while not stop.is_set():
            call = self._stub.WatchMetadata(
                pb.WatchMetadataRequest(
                    from_offset=self._metadata_offset(), broker_id=self.broker_id
                )
            )
            try:
                async for batch in call:
                    self.controller_reachable = True
                    attempt = 0
                    await self._on_metadata(batch)
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.CANCELLED:
                    log.debug("metadata_watch_broken", status=err.code().name)
            except Exception:
                # Applying a batch failed beyond the per-partition guards (a malformed record):
                # never stop following metadata silently; watch again from the applied offset.
                log.exception("metadata_apply_failed")
            finally:
                call.cancel()
            await _backoff(attempt, stop)
            attempt += 1

    # -- requests -----------------------------------------------------------------------------

    async def alter_partition(
        self, request: pb.AlterPartitionRequest, timeout_s: float = 5.0
    ) -> pb.AlterPartitionResponse:
        request.broker_id = self.broker_id
        request.broker_epoch = self.broker_epoch
        return await self._stub.AlterPartition(request, timeout=timeout_s)

    async def allocate_producer_ids(self) -> tuple[int, int]:
        response = await self._stub.AllocateProducerIds(
            pb.AllocateProducerIdsRequest(broker_id=self.broker_id, broker_epoch=self.broker_epoch),
            timeout=5.0,
        )
        if response.error_code != ErrorCode.NONE:
            raise error_for(response.error_code, response.error_message)
        return response.producer_id_start, response.producer_id_len

    async def close(self) -> None:
        self._closing.set()
        self._stop_heartbeat_thread()
        await self._channel.close(grace=None)
        self._heartbeat_channel.close()


class _ReRegister(Exception):
    """The controller no longer knows our epoch: register again."""


def _call_on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: object) -> None:
    """Run `fn(*args)` on `loop` (from another thread); nothing when the loop is closed: the
    process is stopping and nobody waits any more."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


async def _backoff(attempt: int, stop: asyncio.Event) -> None:
    delay = RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S) - 1)]
    try:
        await asyncio.wait_for(stop.wait(), delay)
    except TimeoutError:
        pass
