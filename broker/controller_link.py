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

A quorum of controllers (issue 13): every call goes to the controller believed active
(`client.controller_finder.ControllerFinder`; one configured controller is simply called). A
controller that is not the active one answers NOT_CONTROLLER (FAILED_PRECONDITION with the
leader's address and epoch in the trailing metadata) and ends the streams the same way: the link
moves to the named leader at once, no backoff. With no leader named, or the leader unreachable,
it asks every configured controller's DescribeQuorum (500 ms each, in parallel) and takes the
newest epoch's leader, searching again after 50, 100, 200, then every 250 ms while an election
runs. Whenever the believed leader changes, the heartbeat stream and the metadata watch open on
another controller are cancelled and reopened on the new one at once; the watch resumes from the
next unapplied offset (offsets are the same on every voter), and a batch that would leave a gap
is refused (the watch restarts from the image's offset). AlterPartition and AllocateProducerIds
are re-sent to the new leader within their timeout. A heartbeat stream that goes unanswered for
max(1.5 s, 3 heartbeat intervals) while several controllers are configured makes the link ask
the quorum (a hung leader holds the stream open until keepalive gives up, some 4 s, past the
session timeout).

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
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from minibroker.client.common.log import get_logger
from minibroker.client.common.netfaults import NetFaults, aio_interceptors, intercept_sync
from minibroker.client.common.tls import TlsSettings, aio_channel, sync_channel
from minibroker.client.controller_finder import (
    SEARCH_BACKOFF_S,
    ControllerFinder,
    ask_quorum,
    hint_from_error,
    is_unreachable,
    quorum_describer,
)
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
        controller: tuple[str, int] | None = None,
        controllers: Sequence[str] = (),
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
        faults: NetFaults | None = None,
        tls: TlsSettings | None = None,
        kafka_host: str = "",
        kafka_port: int = 0,
    ) -> None:
        """`kafka_host`/`kafka_port`: the Kafka-protocol listener registered (0: none).
        `metadata_offset()`: where the watch resumes (the next offset not in the image).
        `applied_offset()`: the next offset whose batch is not fully acted on yet, which the
        heartbeats report (the controller's "caught up"); called on the heartbeat thread, so
        it must only read a number. None: `metadata_offset`.
        `controllers`: every configured controller ("host:port"); `controller`: the one
        controller (before the quorum), used when `controllers` is empty."""
        self.broker_id = broker_id
        self._faults = faults
        self._tls = tls  # the broker's own certificate when its listener is SSL (mutual TLS)
        self.incarnation_id = uuid.uuid4().hex
        if not controllers:
            if controller is None:
                raise ValueError("no controller address given")
            controllers = (f"{controller[0]}:{controller[1]}",)
        self._finder = ControllerFinder(controllers)
        self._several = len(self._finder.addresses) > 1
        self._reconnect_backoff_s = SEARCH_BACKOFF_S if self._several else RECONNECT_BACKOFF_S
        self._host, self._port, self._rack = host, port, rack
        self._metrics_port = metrics_port
        self._kafka_host, self._kafka_port = kafka_host, kafka_port
        self.cluster_id = cluster_id
        self._previous_broker_epoch = previous_broker_epoch
        self._heartbeat_interval_s = heartbeat_interval_ms / 1000.0
        self._on_metadata = on_metadata
        self._metadata_offset = metadata_offset
        self._applied_offset = applied_offset or metadata_offset
        # One grpc.aio channel per controller, made on first use (on the loop only).
        self._channels: dict[str, grpc.aio.Channel] = {}
        # The heartbeat thread's own blocking channels: it never waits for the event loop.
        self._heartbeat_channels: dict[str, grpc.Channel] = {}
        self._heartbeat_stub: pb_grpc.ControllerServiceStub | None = None
        self._heartbeat_call: grpc.Future | None = None
        self._heartbeat_target: str | None = None
        # time.monotonic() of the heartbeat stream's start or its last answer (heartbeat thread).
        self._heartbeat_heard = 0.0
        self._heartbeat_stall_s = max(1.5, 3 * heartbeat_interval_ms / 1000.0)
        self._watch_call: grpc.aio.UnaryStreamCall | None = None
        self._watch_target: str | None = None
        self._search: asyncio.Future[str | None] | None = None
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

    # -- finding the active controller ---------------------------------------------------------

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = aio_channel(
                address,
                self._tls,
                options=_CHANNEL_OPTIONS,
                interceptors=aio_interceptors(self._faults, address),
            )
            self._channels[address] = channel
        return channel

    def _stub(self, address: str) -> pb_grpc.ControllerServiceStub:
        return pb_grpc.ControllerServiceStub(self._channel(address))

    def _quorum_stub(self, address: str) -> pb_grpc.QuorumServiceStub:
        return pb_grpc.QuorumServiceStub(self._channel(address))

    def controller_address(self) -> tuple[str, int]:
        """Where admin clients should send controller calls (the broker's Metadata answer):
        the believed active controller, else the first configured one (a controller that is
        not active names the leader in its NOT_CONTROLLER answer)."""
        host, _, port = (self._finder.target() or self._finder.addresses[0]).rpartition(":")
        return host, int(port)

    @property
    def controller_id(self) -> int:
        """The active controller's node id when a quorum named it, else -1."""
        return self._finder.leader_id if self._finder.leader_address is not None else -1

    async def _target(self, stop: asyncio.Event) -> str | None:
        """The controller to call: the believed leader, or the one found by asking the quorum
        (again after a short backoff while none is known); None once `stop` is set."""
        attempt = 0
        while not stop.is_set():
            target = self._finder.target()
            if target is not None:
                return target
            target = await self._ask_quorum()
            if target is not None:
                return target
            if attempt % 20 == 0:
                log.warning("controller_leader_unknown", controllers=list(self._finder.addresses))
            await _sleep(SEARCH_BACKOFF_S[min(attempt, len(SEARCH_BACKOFF_S) - 1)], stop)
            attempt += 1
        return None

    async def _ask_quorum(self) -> str | None:
        """One DescribeQuorum round (shared by every loop that needs it at the same time)."""
        if self._search is None or self._search.done():
            before = self._finder.leader_address
            describer = quorum_describer(self._quorum_stub)

            async def search() -> str | None:
                found = await ask_quorum(self._finder, describer)
                if self._finder.leader_address != before:
                    self._leader_changed()
                return found

            self._search = asyncio.ensure_future(search())
        return await asyncio.shield(self._search)

    def _call_failed(self, address: str, err: BaseException) -> bool:
        """Learn from a failed call or stream to `address`; True when a NOT_CONTROLLER answer
        named another leader, to be called at once (no backoff)."""
        hint = hint_from_error(err)
        if hint is not None:
            before = self._finder.leader_address
            self._finder.not_controller(address, hint)
            log.info(
                "controller_not_active",
                controller=address,
                leader=hint.address or None,
                leader_id=hint.leader_id,
                epoch=hint.epoch,
            )
            if self._finder.leader_address != before:
                self._leader_changed()
            target = self._finder.target()
            return target is not None and target != address
        if isinstance(err, grpc.RpcError) and is_unreachable(err):
            self._finder.unreachable(address)
        return False

    def _moved_from(self, address: str | None) -> bool:
        """Whether the believed leader is now known and is not `address`."""
        target = self._finder.target()
        return target is not None and target != address

    def _leader_changed(self) -> None:
        """The believed leader changed (on the loop): streams open on another controller are
        cancelled, their loops reopen them on the new one at once."""
        target = self._finder.target()
        log.info(
            "controller_leader_changed",
            leader=target,
            leader_id=self._finder.leader_id,
            epoch=self._finder.epoch,
        )
        if target is None:
            return
        call = self._heartbeat_call
        if call is not None and self._heartbeat_target not in (None, target):
            call.cancel()
        watch = self._watch_call
        if watch is not None and self._watch_target not in (None, target):
            watch.cancel()

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
                kafka_host=self._kafka_host,
                kafka_port=self._kafka_port,
            )
            target = await self._target(stop)
            if target is None:
                break
            try:
                response = await self._stub(target).RegisterBroker(request, timeout=5.0)
            except grpc.aio.AioRpcError as err:
                self.controller_reachable = False
                if self._call_failed(target, err):
                    continue  # the active controller is named: register there now
                if attempt % 20 == 0:
                    log.warning("controller_unreachable", target=target, status=err.code().name)
                await self._backoff(attempt, stop)
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
            if code in (
                ErrorCode.INCONSISTENT_CLUSTER_ID,
                ErrorCode.INVALID_REQUEST,
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            ):
                # Another cluster's data dir, a registration the controller cannot accept
                # (a bad host, port or rack), or a certificate that is not this broker's (or
                # not allowed CLUSTER_ACTION): the same request would be refused forever.
                raise FatalRegistrationError(response.error_message, code=code)
            # DUPLICATE_BROKER_REGISTRATION: our previous incarnation's session has not expired
            # yet; it will, so keep trying.
            if attempt % 20 == 0:
                log.warning("registration_refused", error=code.name, message=response.error_message)
            await self._backoff(attempt, stop)
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
            target = await self._target(stop)
            if target is None:
                return
            try:
                await self._run_heartbeat_stream(target)
                attempt = 0
            except grpc.RpcError as err:
                self.controller_reachable = False
                code = err.code() if isinstance(err, grpc.Call) else None
                if self._call_failed(target, err) or (
                    code == grpc.StatusCode.CANCELLED and self._moved_from(target)
                ):
                    log.info("heartbeat_stream_moved", source=target, to=self._finder.target())
                    attempt = 0
                    continue  # the active controller is known: heartbeat there now
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
            if self._moved_from(target):
                attempt = 0
                continue
            if self._several:
                # The stream ended without naming a leader: the controller may have lost the
                # leadership (or died): ask the quorum before reopening.
                self._finder.unreachable(target)
            await self._backoff(attempt, stop)
            attempt += 1

    async def _run_heartbeat_stream(self, target: str) -> None:
        """Run one heartbeat stream to `target` on its own thread; return or raise as it ends.
        While several controllers are configured, a stream left unanswered for
        `_heartbeat_stall_s` makes the link ask the quorum whether the leader moved (which
        cancels this stream if it did)."""
        loop = asyncio.get_running_loop()
        channel = self._heartbeat_channels.get(target)
        if channel is None:
            channel = intercept_sync(
                sync_channel(target, self._tls, options=_CHANNEL_OPTIONS), self._faults, target
            )
            self._heartbeat_channels[target] = channel
        self._heartbeat_stub = pb_grpc.ControllerServiceStub(channel)
        self._heartbeat_target = target
        self._heartbeat_heard = time.monotonic()
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
            if not self._several:
                await ended
                return
            while True:
                done, _ = await asyncio.wait({ended}, timeout=self._heartbeat_stall_s / 3)
                if done:
                    ended.result()
                    return
                if time.monotonic() - self._heartbeat_heard >= self._heartbeat_stall_s:
                    log.info("heartbeat_stream_stalled", controller=target)
                    await self._ask_quorum()  # cancels this stream if the leader moved
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
        stub = self._heartbeat_stub
        assert stub is not None
        call = stub.Heartbeat(self._heartbeat_requests(sent_offline, over))
        self._heartbeat_call = call
        try:
            if self._stop_heartbeats.is_set():
                return  # closed while this stream was starting
            for response in call:
                self.controller_reachable = True
                self._heartbeat_heard = time.monotonic()
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
        """Follow the active controller's metadata log from the next unapplied offset until
        `close()` (through a controlled shutdown too: the leadership moves arrive this way).

        Offsets are the same on every voter, so a watch moved to a new leader resumes where the
        old one stopped: a resent prefix is skipped when applied (`metadata.wire.apply_batch`),
        and a batch that starts past the image's next offset (a gap) ends the watch, which
        starts again from the image's offset."""
        attempt = 0
        stop = self._closing
        while not stop.is_set():
            target = await self._target(stop)
            if target is None:
                return
            call = self._stub(target).WatchMetadata(
                pb.WatchMetadataRequest(
                    from_offset=self._metadata_offset(), broker_id=self.broker_id
                )
            )
            self._watch_call, self._watch_target = call, target
            moved = False
            try:
                async for batch in call:
                    self.controller_reachable = True
                    attempt = 0
                    if _goes_back(batch, self._metadata_offset()):
                        # Never legitimate: an active controller has every committed record.
                        # A quorum that lost committed metadata (voters' disks lost) would
                        # otherwise make this broker delete every partition it hosts.
                        log.error(
                            "metadata_went_backwards",
                            controller=target,
                            snapshot_offset=batch.snapshot_offset,
                            applied_offset=self._metadata_offset(),
                        )
                        break
                    if _starts_past(batch, self._metadata_offset()):
                        log.error(
                            "metadata_watch_gap",
                            controller=target,
                            expected_offset=self._metadata_offset(),
                            first_offset=batch.records[0].offset,
                        )
                        break
                    await self._on_metadata(batch)
            except grpc.aio.AioRpcError as err:
                moved = self._call_failed(target, err)
                if err.code() == grpc.StatusCode.CANCELLED:
                    moved = moved or self._moved_from(target)
                elif not moved:
                    log.debug("metadata_watch_broken", status=err.code().name)
            except asyncio.CancelledError:
                # `_leader_changed` cancelled this call (a stream on a paused or partitioned
                # controller hangs, it never ends by itself): grpc raises CancelledError in the
                # iteration. Only a cancellation of this task itself goes on up.
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                moved = self._moved_from(target)
            except Exception:
                # Applying a batch failed beyond the per-partition guards (a malformed record):
                # never stop following metadata silently; watch again from the applied offset.
                log.exception("metadata_apply_failed")
            finally:
                call.cancel()
                self._watch_call = None
            if moved or self._moved_from(target):
                log.info("metadata_watch_moved", source=target, to=self._finder.target())
                attempt = 0
                continue  # follow the new leader now, from the next unapplied offset
            if self._several:
                self._finder.unreachable(target)
            await self._backoff(attempt, stop)
            attempt += 1

    # -- requests -----------------------------------------------------------------------------

    async def _request(self, method: str, request: Any, timeout_s: float) -> Any:
        """Call `method` on the active controller; re-sent to a new leader (named by a
        NOT_CONTROLLER answer, or found by asking the quorum) until `timeout_s` passes. With one
        controller configured, anything but a NOT_CONTROLLER naming another leader raises, as
        before (the callers retry)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        attempt = 0
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"no active controller answered {method} in {timeout_s} s")
            target = await asyncio.wait_for(self._target(self._closing), remaining)
            if target is None:
                raise asyncio.CancelledError
            try:
                return await getattr(self._stub(target), method)(
                    request, timeout=max(deadline - loop.time(), 0.001)
                )
            except grpc.aio.AioRpcError as err:
                if self._call_failed(target, err):
                    continue  # re-send to the named leader now
                retry = hint_from_error(err) is not None or is_unreachable(err)
                if not (self._several and retry) or loop.time() >= deadline:
                    raise
                log.info("controller_request_retry", method=method, status=err.code().name)
            await _sleep(SEARCH_BACKOFF_S[min(attempt, len(SEARCH_BACKOFF_S) - 1)], self._closing)
            attempt += 1

    async def forward(self, method: str, request: Any, timeout_s: float) -> Any:
        """A client's admin request handed on to the active controller (the Kafka listener's
        CreateTopics and DeleteTopics, as our Admin client calls them over gRPC)."""
        return await self._request(method, request, timeout_s)

    async def alter_partition(
        self, request: pb.AlterPartitionRequest, timeout_s: float = 5.0
    ) -> pb.AlterPartitionResponse:
        request.broker_id = self.broker_id
        request.broker_epoch = self.broker_epoch
        response: pb.AlterPartitionResponse = await self._request(
            "AlterPartition", request, timeout_s
        )
        return response

    async def allocate_producer_ids(self) -> tuple[int, int]:
        response = await self._request(
            "AllocateProducerIds",
            pb.AllocateProducerIdsRequest(broker_id=self.broker_id, broker_epoch=self.broker_epoch),
            5.0,
        )
        if response.error_code != ErrorCode.NONE:
            raise error_for(response.error_code, response.error_message)
        return int(response.producer_id_start), int(response.producer_id_len)

    async def _backoff(self, attempt: int, stop: asyncio.Event) -> None:
        """Wait before reconnecting: 50 ms up to 1 s with one controller (as before), up to
        250 ms with several (an election ends within about a second)."""
        delays = self._reconnect_backoff_s
        await _sleep(delays[min(attempt, len(delays) - 1)], stop)

    async def close(self) -> None:
        self._closing.set()
        self._stop_heartbeat_thread()
        if self._search is not None:
            self._search.cancel()
        channels = list(self._channels.values())
        self._channels.clear()
        for channel in channels:
            await channel.close(grace=None)
        for blocking in self._heartbeat_channels.values():
            blocking.close()
        self._heartbeat_channels.clear()


def _goes_back(batch: pb.MetadataBatch, next_offset: int) -> bool:
    """A snapshot older than what this broker has applied: the controller's log has lost
    committed records, and applying it would roll the broker's metadata back (and delete the
    replicas of every topic it no longer names)."""
    return batch.is_snapshot and batch.snapshot_offset < next_offset


def _starts_past(batch: pb.MetadataBatch, next_offset: int) -> bool:
    """A log batch whose first record lies beyond `next_offset`: applying it would skip
    records (a snapshot replaces the image and is never a gap)."""
    return (
        not batch.is_snapshot and len(batch.records) > 0 and batch.records[0].offset > next_offset
    )


class _ReRegister(Exception):
    """The controller no longer knows our epoch: register again."""


def _call_on_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: object) -> None:
    """Run `fn(*args)` on `loop` (from another thread); nothing when the loop is closed: the
    process is stopping and nobody waits any more."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


async def _sleep(delay: float, stop: asyncio.Event) -> None:
    """Wait `delay` seconds, or less if `stop` is set."""
    try:
        await asyncio.wait_for(stop.wait(), delay)
    except TimeoutError:
        pass
