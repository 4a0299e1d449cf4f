"""Follower fetchers: one long-lived task per (this broker, leader broker) pair that fetches every
partition this broker follows from that leader in one long-poll Fetch request (docs/design.md §5).

I/O shell (grpc.aio), event-loop thread only. It owns no replication decisions: the replica
manager says what to fetch for each partition (`follower_fetch_state`) and applies each
partition's answer (`apply_follower_fetch`), which is where truncation, appends and HW updates
happen. A transport failure backs off for `replica.fetch.backoff.ms` and retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, TypeAlias

import grpc

from minibroker.broker import wire
from minibroker.client.common.log import get_logger
from minibroker.client.common.netfaults import NetFaults
from minibroker.client.common.tls import TlsSettings, aio_channel
from minibroker.client.errors import ErrorCode
from minibroker.client.fetch_session import (
    SESSION_ERRORS,
    FetchRequestData,
    FetchSessionHandler,
)
from minibroker.client.stream import RequestStream
from minibroker.client.types import TopicPartition
from minibroker.client.wire import add_forgotten
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

log = get_logger(__name__)

Asked: TypeAlias = wire.FetchPartitionRequest

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 5000),
    ("grpc.keepalive_timeout_ms", 2000),
    ("grpc.initial_reconnect_backoff_ms", 50),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class FollowerHost(Protocol):
    """What a fetcher needs from the replica manager."""

    broker_id: int

    def broker_epoch(self) -> int: ...

    def follower_fetch_state(
        self, tp: TopicPartition, leader_id: int
    ) -> wire.FetchPartitionRequest | None: ...

    def throttling(self) -> bool: ...

    def throttle_fetch(
        self, partitions: list[TopicPartition], cursor: int
    ) -> tuple[list[TopicPartition], int]: ...

    async def apply_follower_fetch(
        self,
        leader_id: int,
        sent: wire.FetchPartitionRequest,
        result: wire.FetchPartitionResult,
    ) -> None: ...


class Fetcher:
    """Fetches a set of partitions from one leader broker until stopped."""

    def __init__(
        self,
        host: FollowerHost,
        leader_id: int,
        address: str,
        *,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        response_max_bytes: int,
        backoff_ms: int,
        faults: NetFaults | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        self.leader_id = leader_id
        self.address = address
        self._host = host
        self._partitions: set[TopicPartition] = set()
        self._max_wait_ms = max_wait_ms
        self._min_bytes = min_bytes
        self._max_bytes = max_bytes
        self._response_max_bytes = response_max_bytes
        self._backoff_s = backoff_ms / 1000.0
        self._channel = aio_channel(address, tls, options=CHANNEL_OPTIONS)
        # Long polls go out on one FetchStream (half the CPU and latency of unary calls).
        self._stream = RequestStream(
            pb_grpc.BrokerServiceStub(self._channel).FetchStream, address, faults=faults
        )
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._polling = False
        self._throttle_cursor = 0  # round-robin over throttled partitions (KIP-73)
        # KIP-227: one fetch session with this leader. `_wanted` holds each partition's current
        # request (the very object follower_fetch_state returned, which its answer is matched
        # by); `_stale` the partitions whose state must be asked for again before the next poll.
        self._session: FetchSessionHandler[Asked] = FetchSessionHandler(leader_id)
        self._wanted: dict[TopicPartition, Asked] = {}
        self._stale: set[TopicPartition] = set()

    @property
    def partitions(self) -> frozenset[TopicPartition]:
        return frozenset(self._partitions)

    def add(self, tp: TopicPartition) -> None:
        self._partitions.add(tp)
        self._stale.add(tp)
        self._interrupt()

    def remove(self, tp: TopicPartition) -> None:
        self._partitions.discard(tp)
        self._stale.discard(tp)
        self._wanted.pop(tp, None)
        self._interrupt()

    def wake(self, tp: TopicPartition) -> None:
        """Ask for `tp`'s fetch state again now (it changed outside an answer)."""
        if tp in self._partitions:
            self._stale.add(tp)
        self._interrupt()

    def _interrupt(self) -> None:
        """Re-plan at once: the in-flight long poll no longer matches the partition set."""
        self._wake.set()
        if self._polling:
            self._stream.reset()  # the long poll fails with CANCELLED and _run re-plans

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"fetcher-{self.leader_id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        await self._stream.close()
        await self._channel.close(grace=None)

    def _build_request(self) -> tuple[pb.FetchRequest, FetchRequestData[Asked]] | None:
        """The next long poll, and the session data that says what it covers (every partition
        the session holds: the ones it names and the implied ones an answer may carry)."""
        host = self._host
        # Only the partitions whose fetch state may have moved are asked again (answered last
        # round, added, woken, or not fetchable last time): an idle one keeps its request
        # object, so the session finds it unchanged and leaves it out (KIP-227).
        for tp in list(self._stale):
            state = host.follower_fetch_state(tp, self.leader_id)
            if state is None:
                self._wanted.pop(tp, None)  # backing off: asked again next round
            else:
                self._wanted[tp] = state
                self._stale.discard(tp)
        wanted: dict[TopicPartition, Asked] = self._wanted
        if host.throttling():
            # KIP-73: throttled partitions are left out while the follower quota is exceeded.
            asked, self._throttle_cursor = host.throttle_fetch(
                sorted(self._wanted), self._throttle_cursor
            )
            if len(asked) != len(self._wanted):
                wanted = {tp: self._wanted[tp] for tp in asked}
        data = self._session.build(wanted)
        if not data.to_send and not data.to_forget and not data.session:
            return None
        request = pb.FetchRequest(
            replica_id=host.broker_id,
            replica_epoch=host.broker_epoch(),
            max_wait_ms=self._max_wait_ms,
            min_bytes=self._min_bytes,
            max_bytes=self._response_max_bytes,
            session_id=data.session_id,
            session_epoch=data.epoch,
        )
        # Built in place with add(): finished sub-messages handed to a constructor are copied.
        topics: dict[str, Any] = {}
        for tp, state in data.to_send.items():
            partitions = topics.get(tp.topic)
            if partitions is None:
                partitions = topics[tp.topic] = request.topics.add(topic=tp.topic).partitions
            partitions.add(
                partition=tp.partition,
                current_leader_epoch=state.current_leader_epoch,
                fetch_offset=state.fetch_offset,
                last_fetched_epoch=state.last_fetched_epoch,
                log_start_offset=state.log_start_offset,
                partition_max_bytes=self._max_bytes,
            )
        add_forgotten(request, data.to_forget)
        return request, data

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            planned = self._build_request()
            if planned is None:
                # Nothing fetchable now (all partitions backing off or removed): wait for a change.
                try:
                    await asyncio.wait_for(self._wake.wait(), self._backoff_s)
                except TimeoutError:
                    pass
                continue
            request, data = planned
            timeout_s = self._max_wait_ms / 1000.0 + 10.0
            self._polling = True
            try:
                response = await self._stream.request(request, timeout_s)
            except grpc.aio.AioRpcError as err:
                # The leader may or may not have taken the request: the session starts over.
                self._session.handle_error()
                if err.code() == grpc.StatusCode.CANCELLED and self._wake.is_set():
                    continue
                log.debug("follower_fetch_failed", leader=self.leader_id, status=err.code().name)
                await asyncio.sleep(self._backoff_s)
                continue
            finally:
                self._polling = False
            results = wire.decode_fetch_response(response)
            error = ErrorCode(response.error_code)
            if not self._session.handle_response(
                data,
                error,
                response.session_id,
                [TopicPartition(r.topic, r.partition) for r in results],
            ):
                # A session error (the next request is a full one, at once) or an answer that
                # does not match the session: nothing of it is applied.
                if error not in SESSION_ERRORS:
                    log.debug("follower_fetch_refused", leader=self.leader_id, error=error.name)
                    for result in results:
                        if result.error != ErrorCode.NONE:
                            await self._apply(data, result)
                    await asyncio.sleep(self._backoff_s)
                continue
            for result in results:
                await self._apply(data, result)

    async def _apply(
        self, data: FetchRequestData[Asked], result: wire.FetchPartitionResult
    ) -> None:
        tp = TopicPartition(result.topic, result.partition)
        asked = data.session.get(tp)
        if asked is None:
            return  # the leader answered for a partition we did not ask about
        self._stale.add(tp)  # its fetch state moves with the answer: asked again next round
        try:
            await self._host.apply_follower_fetch(self.leader_id, asked, result)
        except Exception:
            # A storage error on one partition must not end fetching for the others;
            # its core did not advance, so the next round asks for the same offset.
            log.exception(
                "follower_fetch_apply_failed",
                leader=self.leader_id,
                topic=result.topic,
                partition=result.partition,
            )
            await asyncio.sleep(self._backoff_s)


class FetcherManager:
    """Keeps exactly one Fetcher per leader broker this broker follows something from."""

    def __init__(
        self,
        host: FollowerHost,
        address_of: Callable[[int], str | None],
        faults: NetFaults | None = None,
        tls: TlsSettings | None = None,
        **fetcher_options: int,
    ) -> None:
        self._host = host
        self._address_of = address_of
        self._faults = faults
        self._tls = tls
        self._options = fetcher_options
        self._fetchers: dict[int, Fetcher] = {}
        self._assignment: dict[TopicPartition, int] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def leader_of(self, tp: TopicPartition) -> int | None:
        return self._assignment.get(tp)

    def needs_follow(self, tp: TopicPartition, leader_id: int) -> bool:
        """True when `tp` is not being fetched from `leader_id` at its current address."""
        address = self._address_of(leader_id)
        if address is None:
            return False  # still unknown: nothing to connect to yet
        fetcher = self._fetchers.get(leader_id)
        return (
            self._assignment.get(tp) != leader_id or fetcher is None or fetcher.address != address
        )

    def follow(self, tp: TopicPartition, leader_id: int) -> None:
        """Fetch `tp` from `leader_id` (moving it off any other fetcher); restarts fetching."""
        current = self._assignment.get(tp)
        if current is not None and current != leader_id:
            self._drop(tp, current)
        address = self._address_of(leader_id)
        if address is None:
            self._assignment.pop(tp, None)
            return
        fetcher = self._fetchers.get(leader_id)
        if fetcher is not None and fetcher.address != address:
            self._stop_later(self._fetchers.pop(leader_id))
            fetcher = None
        if fetcher is None:
            fetcher = Fetcher(
                self._host, leader_id, address, faults=self._faults, tls=self._tls, **self._options
            )
            for other, lid in self._assignment.items():
                if lid == leader_id:
                    fetcher.add(other)
            self._fetchers[leader_id] = fetcher
            fetcher.start()
        self._assignment[tp] = leader_id
        fetcher.add(tp)

    def unfollow(self, tp: TopicPartition) -> None:
        current = self._assignment.pop(tp, None)
        if current is not None:
            self._drop(tp, current)

    def _drop(self, tp: TopicPartition, leader_id: int) -> None:
        fetcher = self._fetchers.get(leader_id)
        if fetcher is None:
            return
        fetcher.remove(tp)
        if not fetcher.partitions:
            self._stop_later(self._fetchers.pop(leader_id))

    def wake(self, tp: TopicPartition) -> None:
        leader_id = self._assignment.get(tp)
        fetcher = self._fetchers.get(leader_id) if leader_id is not None else None
        if fetcher is not None:
            fetcher.wake(tp)

    def _stop_later(self, fetcher: Fetcher) -> None:
        task = asyncio.create_task(fetcher.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def stop(self) -> None:
        fetchers = list(self._fetchers.values())
        self._fetchers.clear()
        self._assignment.clear()
        await asyncio.gather(*(f.stop() for f in fetchers), return_exceptions=True)
