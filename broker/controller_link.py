"""The broker's link to the controller: registration, the heartbeat stream, the metadata watch,
AlterPartition and producer-id allocation.

I/O shell (grpc.aio), event-loop thread only. One channel to the controller. Every loop survives
the controller going away: it backs off and reconnects, and the broker keeps serving with its last
metadata meanwhile (docs/design.md §3.2). Nothing here decides anything about replication;
metadata batches are handed to `on_metadata` and heartbeat answers are kept as plain state.

A failed data dir is reported in the next heartbeat, sent at once (Kafka's OfflineLogDirs), and
in every one after; `offline_log_dirs_reported` is set when the controller has answered one
that carried it (it fenced this broker), or no longer knows this incarnation.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc

from minibroker.client.common.log import get_logger
from minibroker.client.errors import ErrorCode, MiniBrokerError, error_for
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

log = get_logger(__name__)

RECONNECT_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)


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
    ) -> None:
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
        self._channel = grpc.aio.insecure_channel(
            self._target,
            options=[
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ("grpc.keepalive_time_ms", 2000),
                ("grpc.keepalive_timeout_ms", 2000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.initial_reconnect_backoff_ms", 50),
                ("grpc.max_reconnect_backoff_ms", 1000),
            ],
        )
        self._stub = pb_grpc.ControllerServiceStub(self._channel)
        self.broker_epoch = -1
        self.is_fenced = True
        self.is_caught_up = False
        self.want_shut_down = False
        self.should_shut_down = asyncio.Event()
        self.registered = asyncio.Event()
        self.controller_reachable = False
        self._wake_heartbeat = asyncio.Event()
        self._closing = asyncio.Event()
        self.offline_log_dirs: tuple[str, ...] = ()
        self.offline_log_dirs_reported = asyncio.Event()
        # Per heartbeat sent on the current stream, oldest first: whether it carried the
        # offline dirs. The controller answers a stream's heartbeats one by one, in order.
        self._sent_offline: collections.deque[bool] = collections.deque()

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

        Runs until `close()` (not until SIGTERM): a controlled shutdown needs the stream to carry
        want_shut_down until the controller grants the exit.
        """
        attempt = 0
        stop = self._closing
        while not stop.is_set():
            try:
                await self._run_heartbeat_stream(stop)
                attempt = 0
            except grpc.aio.AioRpcError as err:
                self.controller_reachable = False
                log.warning("heartbeat_stream_broken", status=err.code().name)
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
            if self.should_shut_down.is_set():
                return
            await _backoff(attempt, stop)
            attempt += 1

    async def _heartbeat_requests(
        self, stop: asyncio.Event
    ) -> AsyncIterator[pb.BrokerHeartbeatRequest]:
        while not stop.is_set():
            offline = self.offline_log_dirs
            request = pb.BrokerHeartbeatRequest(
                broker_id=self.broker_id,
                broker_epoch=self.broker_epoch,
                # The last applied offset (Kafka: >= the registration offset means caught up).
                current_metadata_offset=self._metadata_offset() - 1,
                want_fence=False,
                want_shut_down=self.want_shut_down,
                offline_log_dirs=list(offline),
            )
            # Cleared before the request goes, not after: a wake-up while it is being sent
            # (a log dir failing then) must send the next heartbeat at once, not a period later.
            self._wake_heartbeat.clear()
            self._sent_offline.append(bool(offline))
            yield request
            if self.should_shut_down.is_set():
                return
            try:
                await asyncio.wait_for(self._wake_heartbeat.wait(), self._heartbeat_interval_s)
            except TimeoutError:
                pass

    async def _run_heartbeat_stream(self, stop: asyncio.Event) -> None:
        self._sent_offline.clear()  # a new stream: the old one's answers never come
        call = self._stub.Heartbeat(self._heartbeat_requests(stop))
        try:
            async for response in call:
                self.controller_reachable = True
                code = ErrorCode(response.error_code)
                carried_offline = self._sent_offline.popleft() if self._sent_offline else False
                if code in (ErrorCode.BROKER_ID_NOT_REGISTERED, ErrorCode.STALE_BROKER_EPOCH):
                    log.warning(
                        "heartbeat_rejected", error=code.name, message=response.error_message
                    )
                    raise _ReRegister
                if code != ErrorCode.NONE:
                    log.warning("heartbeat_error", error=code.name, message=response.error_message)
                    continue
                if carried_offline and response.is_fenced:
                    if not self.offline_log_dirs_reported.is_set():
                        log.info("offline_log_dirs_reported", log_dirs=list(self.offline_log_dirs))
                    self.offline_log_dirs_reported.set()
                if self.is_fenced != response.is_fenced:
                    log.info("broker_fence_state", fenced=response.is_fenced)
                self.is_fenced = response.is_fenced
                self.is_caught_up = response.is_caught_up
                if response.should_shut_down:
                    self.should_shut_down.set()
                    return
        finally:
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
        await self._channel.close(grace=None)


class _ReRegister(Exception):
    """The controller no longer knows our epoch: register again."""


async def _backoff(attempt: int, stop: asyncio.Event) -> None:
    delay = RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S) - 1)]
    try:
        await asyncio.wait_for(stop.wait(), delay)
    except TimeoutError:
        pass
