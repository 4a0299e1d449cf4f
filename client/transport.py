"""Client transport: one grpc.aio channel per broker address, metadata refresh, RPC errors.

Does network I/O (grpc.aio). `ClusterClient` is shared by one producer, consumer or admin: it owns
a channel per address (many requests in flight on each, docs/design.md §9), a `MetadataCache`,
and the one metadata refresh in flight at a time (concurrent callers wait for the same answer).
Requests and answers are built and read by wire.py, which also maps a failed call to the Kafka
error a client acts on.
Event-loop thread only; `close()` must run on the loop that created the channels.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any

import grpc

from minibroker.client.common.tls import TlsSettings, aio_channel
from minibroker.client.errors import (
    ClientClosedError,
    ErrorCode,
    InvalidTopicError,
    MiniBrokerError,
    NetworkExceptionError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    error_for,
)
from minibroker.client.metadata_cache import ClusterSnapshot, MetadataCache, TopicInfo
from minibroker.client.stream import RequestStream
from minibroker.client.topic_name import invalid_topic_name
from minibroker.client.wire import CallFailed, call, metadata_from_pb, metadata_request
from minibroker.client.wire import error_from_rpc as error_from_rpc  # admin's, and tests'
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
# Fetch responses carry up to fetch_max_bytes (50 MiB) and produce requests max_request_size
# (8 MiB); gRPC's 4 MiB default receive limit would reject both.
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Reconnect fast after a broker restarts; the defaults back off up to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
)


# Partition errors after which the client's metadata may be stale, so the leader may have moved
# (Kafka's InvalidMetadataException family): look for the leader again before retrying.
INVALID_METADATA_ERRORS = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.BROKER_NOT_AVAILABLE,
        ErrorCode.KAFKA_STORAGE_ERROR,
    }
)


def now_ms() -> int:
    """Monotonic milliseconds: the clock every pure core of the client is fed with."""
    return time.monotonic_ns() // 1_000_000


def parse_bootstrap(servers: str | Sequence[str]) -> list[str]:
    """`"h1:9092,h2:9093"` or a list of them -> ["h1:9092", "h2:9093"], checked."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    out: list[str] = []
    for item in items:
        addr = item.strip()
        if not addr:
            continue
        host, sep, port = addr.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"bootstrap server {addr!r} is not HOST:PORT (e.g. 127.0.0.1:9092)")
        out.append(addr)
    if not out:
        raise ValueError("bootstrap_servers is empty: give at least one HOST:PORT")
    return out


def unknown_topic_error(topic: str) -> UnknownTopicOrPartitionError:
    return UnknownTopicOrPartitionError(
        f"topic {topic!r} does not exist; create it first, e.g. "
        f"`minibroker topics create {topic} --partitions 3 --replication-factor 3`"
    )


def check_topic_name(topic: object) -> None:
    """Refuse a name no topic can have (Kafka's rules), before anything waits for it.

    Raises TypeError for a non-str and InvalidTopicError (INVALID_TOPIC_EXCEPTION, not
    retriable: no amount of waiting creates such a topic) naming what is wrong.
    """
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str, got {type(topic).__name__}: {topic!r}")
    problem = invalid_topic_name(topic)
    if problem is not None:
        raise InvalidTopicError(problem)


def topic_metadata_error(topic: str, code: int) -> MiniBrokerError:
    """The error of a Metadata answer for `topic` that named no partitions."""
    if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
        return unknown_topic_error(topic)
    if code == ErrorCode.INVALID_TOPIC_EXCEPTION:
        reason = invalid_topic_name(topic) or "the broker calls it invalid"
        return InvalidTopicError(f"topic name {topic!r} is refused by the cluster: {reason}")
    if code == ErrorCode.TOPIC_AUTHORIZATION_FAILED:
        return TopicAuthorizationFailedError(
            f"not authorized to DESCRIBE topic {topic} (the cluster's ACLs give this client's "
            "principal no access to it)"
        )
    return error_for(code, f"metadata for topic {topic!r} failed")


# The deadline of a Metadata attempt while other brokers remain to be asked.
METADATA_ATTEMPT_TIMEOUT_S = 2.0


class ClusterClient:
    """Channels plus metadata for one client object."""

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        metadata_max_age_ms: int = 300_000,
        tls: TlsSettings | None = None,
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap_servers)
        self.tls = tls
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.metadata = MetadataCache(metadata_max_age_ms)
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._broker_stubs: dict[str, pb_grpc.BrokerServiceStub] = {}
        self._controller_stubs: dict[str, pb_grpc.ControllerServiceStub] = {}
        self._streams: dict[tuple[str, str], RequestStream] = {}
        self._refresh: asyncio.Task[None] | None = None
        self._closed = False
        self._bootstrap_turn = 0

    # -- channels ------------------------------------------------------------------------------

    def channel(self, address: str) -> grpc.aio.Channel:
        if self._closed:
            raise ClientClosedError("the client is closed")
        chan = self._channels.get(address)
        if chan is None:
            chan = aio_channel(address, self.tls, options=CHANNEL_OPTIONS)
            self._channels[address] = chan
        return chan

    def broker_stub(self, address: str) -> pb_grpc.BrokerServiceStub:
        stub = self._broker_stubs.get(address)
        if stub is None:
            stub = self._broker_stubs[address] = pb_grpc.BrokerServiceStub(self.channel(address))
        return stub

    def _stream(self, address: str, method: str) -> RequestStream:
        stream = self._streams.get((address, method))
        if stream is None:
            multi = getattr(self.broker_stub(address), method)
            stream = self._streams[(address, method)] = RequestStream(multi, address)
        return stream

    async def produce(
        self, address: str, request: pb.ProduceRequest, timeout_s: float
    ) -> pb.ProduceResponse:
        """Produce on the broker's pipelined ProduceStream (see client/stream.py); raises
        grpc.aio.AioRpcError like the unary call."""
        return await self._stream(address, "ProduceStream").request(request, timeout_s)

    async def fetch(
        self, address: str, request: pb.FetchRequest, timeout_s: float
    ) -> pb.FetchResponse:
        """Fetch on the broker's pipelined FetchStream; raises grpc.aio.AioRpcError."""
        return await self._stream(address, "FetchStream").request(request, timeout_s)

    def controller_stub(self, address: str) -> pb_grpc.ControllerServiceStub:
        stub = self._controller_stubs.get(address)
        if stub is None:
            stub = pb_grpc.ControllerServiceStub(self.channel(address))
            self._controller_stubs[address] = stub
        return stub

    async def close(self) -> None:
        self._closed = True
        if self._refresh is not None and not self._refresh.done():
            self._refresh.cancel()
        streams = list(self._streams.values())
        self._streams.clear()
        await asyncio.gather(*(s.close() for s in streams), return_exceptions=True)
        channels = list(self._channels.values())
        self._channels.clear()
        self._broker_stubs.clear()
        self._controller_stubs.clear()
        await asyncio.gather(*(c.close(grace=None) for c in channels), return_exceptions=True)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- metadata ------------------------------------------------------------------------------

    def _metadata_addresses(self) -> list[str]:
        """Where to ask for metadata, in order: unfenced known brokers and the bootstrap list,
        rotated so that one dead broker does not take the first attempt of every refresh; then
        brokers the controller has fenced (a SIGSTOPped broker is fenced but still accepts
        connections, and a call to it waits out its whole deadline)."""
        fenced = {b.address for b in self.metadata.brokers.values() if b.fenced}
        live = [b.address for b in self.metadata.brokers.values() if not b.fenced]
        pool = list(dict.fromkeys(live + [a for a in self.bootstrap if a not in fenced]))
        self._bootstrap_turn += 1
        if pool:
            start = self._bootstrap_turn % len(pool)
            pool = pool[start:] + pool[:start]
        return pool + sorted(fenced)

    async def fetch_metadata(
        self, topics: Iterable[str] = (), *, all_topics: bool = False
    ) -> ClusterSnapshot:
        """One Metadata call, trying each known broker in turn; raises the last error.

        Every attempt but the last has a short deadline: a healthy broker answers in
        milliseconds, and a hung one (SIGSTOP, a black-holed host) must not hold a refresh for
        the whole request timeout while others could answer.
        """
        request = metadata_request(topics, all_topics)
        timeout_s = min(self.request_timeout_ms, 10_000) / 1000
        addresses = self._metadata_addresses()
        last: MiniBrokerError | None = None
        for i, addr in enumerate(addresses):
            last_try = i == len(addresses) - 1
            deadline_s = timeout_s if last_try else min(timeout_s, METADATA_ATTEMPT_TIMEOUT_S)
            try:
                resp = await call(
                    self.broker_stub(addr).Metadata(request, timeout=deadline_s), addr
                )
            except CallFailed as failed:
                last = failed.error
                continue
            return metadata_from_pb(resp, all_topics=all_topics)
        raise last or NetworkExceptionError("no broker to ask for metadata")

    async def refresh_metadata(self) -> None:
        """Refresh the topics of interest; concurrent callers share one request."""
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.ensure_future(self._do_refresh())
        await asyncio.shield(self._refresh)

    async def _do_refresh(self) -> None:
        snapshot = await self.fetch_metadata(sorted(self.metadata.interest))
        self.metadata.update(snapshot, now_ms())

    async def maybe_refresh_metadata(self) -> None:
        """Refresh if flagged stale or older than metadata.max.age.ms; errors are swallowed
        (the next attempt retries) because callers run this from their I/O loops."""
        if self.metadata.needs_update(now_ms()):
            try:
                await self.refresh_metadata()
            except MiniBrokerError:
                pass

    async def wait_for_topic(self, topic: str, max_block_ms: int) -> TopicInfo:
        """The topic's metadata, refreshing until it is known or `max_block_ms` passes.

        A topic the cluster reports as unknown for the whole wait raises
        UnknownTopicOrPartitionError naming it; an answer no wait can change (an illegal name:
        INVALID_TOPIC_EXCEPTION) raises at once, as Kafka's clients do; other failures raise the
        last transport error.
        """
        info = self.metadata.topics.get(topic)
        if info is not None:
            return info
        self.metadata.add_interest([topic])
        deadline = now_ms() + max_block_ms
        last: MiniBrokerError | None = None
        while True:
            try:
                await self.refresh_metadata()
                last = None
            except MiniBrokerError as err:
                last = err
            info = self.metadata.topics.get(topic)
            if info is not None:
                return info
            code = self.metadata.topic_errors.get(topic, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            if last is None:
                refusal = topic_metadata_error(topic, code)
                if not refusal.retriable:
                    # Asked again on every refresh otherwise, for an answer that cannot change.
                    self.metadata.remove_interest([topic])
                    raise refusal
            if now_ms() >= deadline:
                raise last or topic_metadata_error(topic, code)
            await asyncio.sleep(self.retry_backoff_ms / 1000)
