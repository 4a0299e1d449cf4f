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
from typing import Any, Protocol

import grpc

from minibroker.broker import wire
from minibroker.client.common.log import get_logger
from minibroker.client.common.netfaults import NetFaults
from minibroker.client.common.tls import TlsSettings, aio_channel
from minibroker.client.stream import RequestStream
from minibroker.client.types import TopicPartition
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

log = get_logger(__name__)

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

    @property
    def partitions(self) -> frozenset[TopicPartition]:
        return frozenset(self._partitions)

    def add(self, tp: TopicPartition) -> None:
        self._partitions.add(tp)
        self._interrupt()

    def remove(self, tp: TopicPartition) -> None:
        self._partitions.discard(tp)
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

    def _build_request(
        self,
    ) -> tuple[pb.FetchRequest, dict[tuple[str, int], wire.FetchPartitionRequest]] | None:
        """The next long poll and what was asked per partition (answers are matched to it)."""
        request = pb.FetchRequest(
            replica_id=self._host.broker_id,
            replica_epoch=self._host.broker_epoch(),
            max_wait_ms=self._max_wait_ms,
            min_bytes=self._min_bytes,
            max_bytes=self._response_max_bytes,
        )
        # Built in place with add(): finished sub-messages handed to a constructor are copied.
        topics: dict[str, Any] = {}
        sent: dict[tuple[str, int], wire.FetchPartitionRequest] = {}
        # KIP-73: throttled partitions are left out while the follower quota is exceeded.
        asked, self._throttle_cursor = self._host.throttle_fetch(
            sorted(self._partitions), self._throttle_cursor
        )
        for tp in sorted(asked):
            state = self._host.follower_fetch_state(tp, self.leader_id)
            if state is None:
                continue
            sent[tp] = state
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
        return (request, sent) if topics else None

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
            request, sent = planned
            timeout_s = self._max_wait_ms / 1000.0 + 10.0
            self._polling = True
            try:
                response = await self._stream.request(request, timeout_s)
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.CANCELLED and self._wake.is_set():
                    continue
                log.debug("follower_fetch_failed", leader=self.leader_id, status=err.code().name)
                await asyncio.sleep(self._backoff_s)
                continue
            finally:
                self._polling = False
            for result in wire.decode_fetch_response(response):
                asked = sent.get((result.topic, result.partition))
                if asked is None:
                    continue  # the leader answered for a partition we did not ask about
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
            fetcher._interrupt()

    def _stop_later(self, fetcher: Fetcher) -> None:
        task = asyncio.create_task(fetcher.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def stop(self) -> None:
        fetchers = list(self._fetchers.values())
        self._fetchers.clear()
        self._assignment.clear()
        await asyncio.gather(*(f.stop() for f in fetchers), return_exceptions=True)
