"""AsyncProducer: Kafka's producer on grpc.aio (accumulator + one sender task).

Does network I/O through `ClusterClient`. `send` appends to the pure `RecordAccumulator`; one
sender task drains ready batches grouped by leader broker into ONE ProduceRequest per broker
(up to `max_request_size`), with up to `max_in_flight` requests in flight per broker and at most
one batch in flight per partition (see accumulator.py for why that keeps order on retry).

Idempotence (on by default with acks=all, as in Kafka 3+): InitProducerId once, per-partition
sequence numbers assigned when a batch is first drained, unchanged on retry so the broker
deduplicates; DUPLICATE_SEQUENCE_NUMBER counts as success. A batch of several records refused
with MESSAGE_TOO_LARGE is split in halves and sent again (Kafka's splitAndReenqueue). Retriable
errors (errors.RETRIABLE, gRPC UNAVAILABLE / DEADLINE_EXCEEDED) refresh metadata, back off
`retry_backoff_ms` and retry until `delivery_timeout_ms`. A batch that fails for good after it
got a sequence number leaves a gap, so the producer then takes a new producer id (Kafka bumps
the epoch for the same reason).

Concurrency: every method runs on the event loop that called `start()` (or the first `send`),
except `_prepare`, which only reads and is also called from the sync facade's threads.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping, Sequence
from operator import index
from typing import Any, NamedTuple

import grpc

from minibroker.client.accumulator import ProducerBatch, RecordAccumulator, record_size_estimate
from minibroker.client.batch import NO_SEQUENCE, Compression
from minibroker.client.common.config import ConfigError
from minibroker.client.errors import (
    ErrorCode,
    MessageTooLargeError,
    MiniBrokerError,
    NetworkExceptionError,
    RequestTimedOutError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
    error_for,
)
from minibroker.client.metadata_cache import TopicInfo
from minibroker.client.partitioner import StickyPartitioner, partition_for_key
from minibroker.client.records import BatchBuilder, decode_batch
from minibroker.client.transport import (
    DEFAULT_BOOTSTRAP,
    ClientClosedError,
    ClusterClient,
    check_topic_name,
    error_from_rpc,
    now_ms,
)
from minibroker.client.types import RecordMetadata, TopicPartition
from minibroker.proto import minibroker_pb2 as pb

# A library logs through the standard library and stays silent unless the application configures
# logging. Everything is DEBUG: a failed record's error reaches the caller through its future.
log = logging.getLogger("minibroker.client.producer")

# 1 MiB (the default max.message.bytes caps a batch just above it): with 1 KiB records, RF=3 and
# acks=all the brokers spent 21-23 us of CPU per record against 31-34 us with 256 KiB batches,
# since every hop's cost is mostly per call. A batch this full only forms under load.
DEFAULT_BATCH_SIZE = 1024 * 1024
DEFAULT_MAX_REQUEST_SIZE = 8 * 1024 * 1024
DEFAULT_MAX_MESSAGE_BYTES = 1048588  # the broker's and topics' max.message.bytes default
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

# Errors after which the partition's leader may have moved: refresh metadata before retrying.
_LEADERSHIP_ERRORS = frozenset(
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
# The broker no longer knows this producer's sequence state: a new producer id is needed.
_PRODUCER_STATE_ERRORS = frozenset(
    {
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
        ErrorCode.UNKNOWN_PRODUCER_ID,
        ErrorCode.INVALID_PRODUCER_EPOCH,
        ErrorCode.INVALID_PRODUCER_ID_MAPPING,
    }
)

Headers = Sequence[tuple[str, bytes | None]]
HeadersIn = Sequence[tuple[str, bytes | str | None]] | Mapping[str, bytes | str | None] | None


def _max_message_bytes(topic: TopicInfo) -> int:
    text = topic.configs.get("max.message.bytes")
    return int(text) if text else DEFAULT_MAX_MESSAGE_BYTES


def parse_acks(acks: int | str) -> int:
    """Kafka's `acks`: "all" / -1, 1, 0."""
    text = str(acks).strip().lower()
    if text in ("all", "-1"):
        return -1
    if text in ("0", "1"):
        return int(text)
    raise ConfigError(f"invalid value {acks!r} for acks: use all, 1 or 0")


def _as_bytes(data: bytes | bytearray | memoryview | str | None, what: str) -> bytes | None:
    if data is None or type(data) is bytes:
        return data  # type: ignore[return-value]
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(
        f"record {what} must be bytes, str or None, not {type(data).__name__}; serialize it first"
    )


def _normalize_headers(headers: HeadersIn) -> tuple[tuple[str, bytes | None], ...]:
    if not headers:
        return ()
    items = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for name, value in items:
        if not isinstance(name, str):
            raise TypeError(f"header names must be str, got {type(name).__name__}")
        out.append((name, _as_bytes(value, f"header {name!r} value")))
    return tuple(out)


def _checked_timestamp(timestamp_ms: object) -> int:
    """A record timestamp given to send(), or a TypeError / ValueError saying what is wrong.

    Kafka's ProducerRecord refuses a negative timestamp with these words; a broker would refuse
    the record's whole batch (INVALID_TIMESTAMP), and one past int64 cannot be encoded at all.
    """
    if isinstance(timestamp_ms, bool):
        raise TypeError("timestamp_ms must be an int (ms since the epoch) or None, not a bool")
    try:
        value = index(timestamp_ms)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"timestamp_ms must be an int (ms since the epoch) or None, not "
            f"{type(timestamp_ms).__name__}"
        ) from None
    if not 0 <= value <= INT64_MAX:
        raise ValueError(
            f"Invalid timestamp: {value}. Timestamp should always be non-negative or None "
            f"(and at most {INT64_MAX})."
        )
    return value


class PreparedRecord(NamedTuple):
    """A validated record, ready for the accumulator (made by `_prepare`). A NamedTuple: one is
    made per record, and a frozen dataclass costs several times more to construct."""

    topic: str
    partition: int  # -1: sticky (null key, no explicit partition)
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    size: int
    num_partitions: int


_new_tuple = tuple.__new__

# How often the sender asks for metadata while a partition's leader is unreachable.
_NEW_LEADER_POLL_MS = 20


def _settle(future: Any, result: Any = None, exc: BaseException | None = None) -> None:
    if future.done():
        return
    try:
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)
    except Exception:  # a concurrent cancel from another thread: nothing left to tell
        return


class AsyncProducer:
    """Kafka-shaped producer for asyncio code. Use `async with AsyncProducer(...) as p:`.

    `await p.send(...)` returns a future of RecordMetadata once the record is buffered;
    `await p.send_and_wait(...)` returns the RecordMetadata.
    """

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        acks: int | str = "all",
        enable_idempotence: bool | None = None,
        linger_ms: int = 5,
        batch_size: int = DEFAULT_BATCH_SIZE,
        compression_type: str | None = "none",
        max_in_flight: int = 5,
        retries: int = INT32_MAX,
        request_timeout_ms: int = 30_000,
        delivery_timeout_ms: int = 120_000,
        retry_backoff_ms: int = 100,
        max_request_size: int = DEFAULT_MAX_REQUEST_SIZE,
        buffer_memory: int = 64 * 1024 * 1024,
        max_block_ms: int = 5_000,
        metadata_max_age_ms: int = 300_000,
        client_id: str = "",
        rng: random.Random | None = None,
    ) -> None:
        self.acks = parse_acks(acks)
        if enable_idempotence is None:
            # Kafka 3+: on by default, silently off when the other settings conflict with it.
            enable_idempotence = self.acks == -1
        elif enable_idempotence and self.acks != -1:
            raise ConfigError(
                f"enable_idempotence=True needs acks='all' (got acks={acks!r}); "
                "set acks='all' or enable_idempotence=False"
            )
        if max_in_flight < 1:
            raise ConfigError(f"max_in_flight must be >= 1, got {max_in_flight}")
        if batch_size < 1 or max_request_size < 1:
            raise ConfigError("batch_size and max_request_size must be positive")
        if delivery_timeout_ms < linger_ms + request_timeout_ms:
            raise ConfigError(
                f"delivery_timeout_ms ({delivery_timeout_ms}) must be >= linger_ms + "
                f"request_timeout_ms ({linger_ms + request_timeout_ms})"
            )
        try:
            self.compression = Compression.from_name(compression_type)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        self.idempotent = enable_idempotence
        self.linger_ms = linger_ms
        self.batch_size = batch_size
        self.max_in_flight = max_in_flight
        self.retries = retries
        self.request_timeout_ms = request_timeout_ms
        self.delivery_timeout_ms = delivery_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.max_request_size = max_request_size
        self.buffer_memory = buffer_memory
        self.max_block_ms = max_block_ms
        # Records up to this size need no per-topic size check (the smallest sane limit).
        self._small_record_bytes = min(1024, max_request_size)
        self.client_id = client_id
        self.cluster = ClusterClient(
            bootstrap_servers,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            metadata_max_age_ms=metadata_max_age_ms,
        )
        self.accumulator = RecordAccumulator(
            batch_size=batch_size,
            linger_ms=linger_ms,
            new_builder=self._new_builder,
            idempotent=enable_idempotence,
        )
        self._sticky = StickyPartitioner(rng or random.Random())
        self._tps: dict[str, list[TopicPartition]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sender: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self._space: asyncio.Event | None = None
        self._in_flight: dict[int, int] = {}
        # Brokers a request just failed to reach, until when: their partitions wait for the
        # metadata to name another leader (or for the time to pass) instead of sending again to
        # a broker that is likely dead.
        self._unreachable: dict[int, int] = {}
        self._requests: set[asyncio.Task[None]] = set()
        self._need_producer_id = enable_idempotence
        self._closed = False
        self._fatal: MiniBrokerError | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the sender task; called by `async with` and by the first `send`."""
        if self._closed:
            raise ClientClosedError("the producer is closed; create a new one")
        if self._sender is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._space = asyncio.Event()
        self._sender = self._loop.create_task(self._run_sender(), name="minibroker-producer")

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, timeout_ms: int | None = None) -> None:
        """Send everything buffered (waiting at most `timeout_ms`, None = delivery timeout),
        then stop. Records still unsent after the timeout fail with ClientClosedError."""
        if self._closed:
            return
        self._closed = True
        self.accumulator.closing = True
        if self._sender is not None:
            self._wake()
            wait_s = (self.delivery_timeout_ms if timeout_ms is None else timeout_ms) / 1000
            try:
                await asyncio.wait_for(asyncio.shield(self._sender), wait_s)
            except (TimeoutError, asyncio.CancelledError):
                self._sender.cancel()
                try:
                    await self._sender
                except (asyncio.CancelledError, Exception):  # shutting down either way
                    pass
            except Exception:  # the sender crashed: its batches already carry the error
                pass
        for task in list(self._requests):
            task.cancel()
        if self._requests:
            await asyncio.gather(*self._requests, return_exceptions=True)
        err = ClientClosedError("the producer was closed before the record was sent")
        for batch in self.accumulator.abort_all() + list(self.accumulator.in_flight()):
            self.accumulator.fail(batch)
            self._fail_handles(batch, err)
        await self.cluster.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # -- sending -------------------------------------------------------------------------------

    def _prepare(
        self,
        topic: str,
        value: Any,
        key: Any,
        partition: int | None,
        headers: HeadersIn,
        timestamp_ms: int | None,
        topic_info: TopicInfo,
    ) -> PreparedRecord:
        """Validate one record against the topic's metadata; raises typed errors that say what
        to fix. Reads only, so the sync facade may call it from its caller thread."""
        key_b = _as_bytes(key, "key")
        value_b = _as_bytes(value, "value")
        header_t = _normalize_headers(headers)
        count = topic_info.num_partitions
        if partition is not None:
            if not isinstance(partition, int) or not 0 <= partition < count:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} has {count} partitions (0..{count - 1}); "
                    f"partition {partition!r} does not exist"
                )
            chosen = partition
        elif key_b is not None:
            chosen = partition_for_key(key_b, count)
        else:
            chosen = -1
        size = record_size_estimate(key_b, value_b, header_t)
        if size + 61 > self._small_record_bytes:
            topic_limit = _max_message_bytes(topic_info)
            limit = min(topic_limit, self.max_request_size)
        else:
            # Every topic accepts this size (max.message.bytes >= 1 KiB here); skip the lookup.
            topic_limit = limit = self._small_record_bytes
        if size + 61 > limit:
            which = (
                f"max.message.bytes of topic {topic!r} ({topic_limit})"
                if topic_limit <= self.max_request_size
                else f"max_request_size ({self.max_request_size})"
            )
            raise MessageTooLargeError(
                f"record of about {size} bytes is larger than {which}; send smaller values or "
                "raise the limit (topic config max.message.bytes, producer max_request_size)"
            )
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        elif type(timestamp_ms) is not int or not 0 <= timestamp_ms <= INT64_MAX:
            timestamp_ms = _checked_timestamp(timestamp_ms)
        # tuple.__new__: a NamedTuple's own __new__ is a Python frame of its own per record.
        return _new_tuple(
            PreparedRecord, (topic, chosen, timestamp_ms, key_b, value_b, header_t, size, count)
        )

    def _enqueue(self, rec: PreparedRecord, future: Any) -> bool:
        """Append a prepared record (loop thread only); True when it opened a new batch."""
        if self._closed:
            _settle(future, exc=ClientClosedError("send() after close(): the producer is closed"))
            return False
        if self._fatal is not None:
            _settle(future, exc=self._fatal)
            return False
        # The accumulator's per-record handle is the future itself (asyncio or concurrent).
        handle = future
        now = now_ms()
        acc = self.accumulator
        if rec.partition >= 0:
            tp = self._topic_partition(rec.topic, rec.partition, rec.num_partitions)
            result = acc.append(
                tp, rec.timestamp_ms, rec.key, rec.value, rec.headers, handle, now, size=rec.size
            )
        else:
            count = rec.num_partitions
            part = self._sticky.partition(rec.topic, count)
            tp = self._topic_partition(rec.topic, part, count)
            result = acc.append(
                tp,
                rec.timestamp_ms,
                rec.key,
                rec.value,
                rec.headers,
                handle,
                now,
                abort_on_new_batch=True,
                size=rec.size,
            )
            if not result.appended:
                part = self._sticky.on_new_batch(rec.topic, count, part)
                tp = self._topic_partition(rec.topic, part, count)
                result = acc.append(
                    tp,
                    rec.timestamp_ms,
                    rec.key,
                    rec.value,
                    rec.headers,
                    handle,
                    now,
                    size=rec.size,
                )
        if result.new_batch:
            self._wake()
        return result.new_batch

    def _topic_partition(self, topic: str, partition: int, num_partitions: int) -> TopicPartition:
        """The shared TopicPartition of `topic`/`partition`: one lookup per record instead of a
        new NamedTuple (whose construction costs several times more)."""
        tps = self._tps.get(topic)
        if tps is None or len(tps) < num_partitions or partition >= len(tps):
            tps = self._tps[topic] = [
                TopicPartition(topic, p) for p in range(max(num_partitions, partition + 1))
            ]
        return tps[partition]

    async def _topic(self, topic: str) -> TopicInfo:
        info = self.cluster.metadata.topics.get(topic) if isinstance(topic, str) else None
        if info is None:
            # A name no topic can have fails now, not after max_block_ms of waiting for it.
            check_topic_name(topic)
            info = await self.cluster.wait_for_topic(topic, self.max_block_ms)
        return info

    async def _wait_for_space(self) -> None:
        if self.accumulator.buffered_bytes < self.buffer_memory:
            return
        assert self._space is not None
        deadline = now_ms() + self.max_block_ms
        while self.accumulator.buffered_bytes >= self.buffer_memory:
            self._space.clear()
            remaining = deadline - now_ms()
            if remaining <= 0:
                raise RequestTimedOutError(
                    f"buffer_memory ({self.buffer_memory} bytes) stayed full for max_block_ms "
                    f"({self.max_block_ms}); the cluster is not keeping up"
                )
            try:
                await asyncio.wait_for(self._space.wait(), remaining / 1000)
            except TimeoutError:
                continue

    async def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        headers: HeadersIn = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Buffer one record; returns a future of its RecordMetadata (topic, partition, offset,
        timestamp). Raises at once for bad input, a closed producer, or an unknown topic."""
        if self._closed:
            raise ClientClosedError("send() after close(): the producer is closed")
        if self._sender is None:
            await self.start()
        info = self.cluster.metadata.topics.get(topic) if type(topic) is str else None
        if info is None:
            info = await self._topic(topic)
        rec = self._prepare(topic, value, key, partition, headers, timestamp_ms, info)
        if self.accumulator.buffered_bytes >= self.buffer_memory:
            await self._wait_for_space()
        assert self._loop is not None
        future: asyncio.Future[RecordMetadata] = self._loop.create_future()
        if self._enqueue(rec, future):
            # A batch was closed: let the sender run now, or a tight send loop (which never
            # suspends otherwise) would queue everything before the first request goes out.
            await asyncio.sleep(0)
        return future

    async def send_and_wait(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        headers: HeadersIn = None,
        timestamp_ms: int | None = None,
    ) -> RecordMetadata:
        future = await self.send(topic, value, key, partition, headers, timestamp_ms)
        return await future

    async def flush(self, timeout_ms: int | None = None) -> None:
        """Send every buffered record now and wait until each is acknowledged or failed."""
        if self._sender is None:
            return
        acc = self.accumulator
        acc.flushing += 1
        try:
            self._wake()
            waits = [
                asyncio.wrap_future(f) if not isinstance(f, asyncio.Future) else f
                for f in (b.handles[-1] for b in acc.incomplete() if b.handles)
            ]
            if waits:
                timeout = None if timeout_ms is None else timeout_ms / 1000
                done, pending = await asyncio.wait(waits, timeout=timeout)
                for fut in done:
                    if not fut.cancelled():
                        fut.exception()  # consumed here; the caller sees it on its own future
                if pending:
                    raise RequestTimedOutError(f"flush did not finish within {timeout_ms} ms")
        finally:
            acc.flushing -= 1

    async def partitions_for(self, topic: str) -> list[int]:
        info = await self._topic(topic)
        return sorted(info.partitions)

    # -- sender --------------------------------------------------------------------------------

    def _new_builder(self, tp: TopicPartition) -> BatchBuilder:
        info = self.cluster.metadata.topics.get(tp.topic)
        topic_limit = _max_message_bytes(info) if info is not None else DEFAULT_MAX_MESSAGE_BYTES
        # A batch must fit the topic's max.message.bytes and one produce request.
        size = min(self.batch_size, topic_limit, self.max_request_size)
        return BatchBuilder(size, compression=self.compression)

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def _run_sender(self) -> None:
        try:
            await self._sender_loop()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            # A bug must not leave callers waiting forever: fail everything, refuse new sends.
            self._fatal = UnknownServerError(f"the producer's sender task failed: {err!r}")
            for batch in self.accumulator.abort_all() + list(self.accumulator.in_flight()):
                self.accumulator.fail(batch)
                self._fail_handles(batch, self._fatal)
            raise

    async def _sender_loop(self) -> None:
        assert self._wakeup is not None and self._loop is not None
        acc = self.accumulator
        md = self.cluster.metadata
        refresh: asyncio.Task[None] | None = None
        while True:
            self._wakeup.clear()
            now = now_ms()
            for batch in acc.expire(now, self.delivery_timeout_ms):
                self._finish_failed(
                    batch,
                    RequestTimedOutError(
                        f"{batch.record_count} record(s) for {batch.tp} expired after "
                        f"delivery_timeout_ms ({self.delivery_timeout_ms}) without being "
                        "acknowledged"
                    ),
                )
            if self._closed and not acc.has_incomplete():
                return
            if md.needs_update(now) and (refresh is None or refresh.done()):
                refresh = self._loop.create_task(self._refresh_metadata())
            need_id = self._need_producer_id and self.idempotent
            if need_id and not await self._init_producer_id():
                await self._sleep_or_wake(self.retry_backoff_ms)
                continue
            ready, next_ms = acc.ready(now)
            by_node: dict[int, list[TopicPartition]] = {}
            unknown_leader = False
            awaiting_new_leader = False
            for tp in ready:
                leader = md.leader_for(tp)
                if leader is None:
                    unknown_leader = True
                    continue
                if self._unreachable.get(leader, 0) > now:
                    awaiting_new_leader = True
                    continue
                if self._in_flight.get(leader, 0) >= self.max_in_flight:
                    continue
                by_node.setdefault(leader, []).append(tp)
            if unknown_leader:
                md.request_update()
            if awaiting_new_leader and now - md.last_refresh_ms >= _NEW_LEADER_POLL_MS:
                # The controller fences a dead broker within milliseconds and elects another
                # leader; ask again soon rather than a retry backoff later.
                md.request_update()
            if by_node:
                for node, batches in acc.drain(by_node, self.max_request_size, now).items():
                    self._in_flight[node] = self._in_flight.get(node, 0) + 1
                    task = self._loop.create_task(self._send_request(node, batches))
                    self._requests.add(task)
                    task.add_done_callback(self._requests.discard)
            wait_ms = next_ms
            if awaiting_new_leader:
                wait_ms = (
                    _NEW_LEADER_POLL_MS if wait_ms is None else min(wait_ms, _NEW_LEADER_POLL_MS)
                )
            if unknown_leader:
                wait_ms = (
                    self.retry_backoff_ms
                    if wait_ms is None
                    else min(wait_ms, self.retry_backoff_ms)
                )
            await self._sleep_or_wake(wait_ms)

    async def _sleep_or_wake(self, wait_ms: int | None) -> None:
        assert self._wakeup is not None and self._loop is not None
        if self._wakeup.is_set():
            return
        timer = None
        if wait_ms is not None:
            timer = self._loop.call_later(max(wait_ms, 1) / 1000, self._wakeup.set)
        try:
            await self._wakeup.wait()
        finally:
            if timer is not None:
                timer.cancel()

    async def _refresh_metadata(self) -> None:
        try:
            await self.cluster.refresh_metadata()
        except MiniBrokerError:
            # No broker answered: back off before the loop may ask again, or an unreachable
            # cluster would be polled in a tight loop.
            await asyncio.sleep(self.retry_backoff_ms / 1000)
        finally:
            self._wake()

    async def _init_producer_id(self) -> bool:
        """InitProducerId on any broker; True once the accumulator has an id."""
        request = pb.InitProducerIdRequest(
            transactional_id="", transaction_timeout_ms=0, producer_id=-1, producer_epoch=-1
        )
        addresses = [b.address for b in self.cluster.metadata.brokers.values() if not b.fenced]
        addresses += self.cluster.bootstrap
        for addr in dict.fromkeys(addresses):
            try:
                # A short deadline: this runs inside the sender loop, which must get back to
                # expiring batches even when a broker is black-holed.
                resp = await self.cluster.broker_stub(addr).InitProducerId(
                    request, timeout=min(self.request_timeout_ms, 5_000) / 1000
                )
            except grpc.aio.AioRpcError:
                continue
            if resp.error_code != ErrorCode.NONE:
                err = error_for(resp.error_code, resp.error_message)
                if not err.retriable:
                    self._fatal = err
                    for batch in self.accumulator.abort_all():
                        self._finish_failed(batch, err)
                    self._need_producer_id = False
                    return False
                continue
            log.debug(
                "producer_id_assigned producer_id=%d epoch=%d by=%s",
                resp.producer_id,
                resp.producer_epoch,
                addr,
            )
            self.accumulator.set_producer_id(resp.producer_id, resp.producer_epoch)
            self._need_producer_id = False
            return True
        return False

    async def _send_request(self, node: int, batches: list[ProducerBatch]) -> None:
        # Built in place with add(): handing finished sub-messages to a constructor makes upb
        # copy each again, batches included (~2 ms per MiB against ~0.1 ms).
        request = pb.ProduceRequest(acks=self.acks, timeout_ms=self.request_timeout_ms)
        by_topic: dict[str, Any] = {}
        for b in batches:
            partitions = by_topic.get(b.tp.topic)
            if partitions is None:
                partitions = by_topic[b.tp.topic] = request.topics.add(topic=b.tp.topic).partitions
            partitions.add(partition=b.tp.partition, records=b.buffer)
        address = self.cluster.metadata.address(node) or f"node {node}"
        try:
            try:
                # The broker answers acks=all by request_timeout_ms at the latest; the extra
                # second covers the network so its answer wins over our deadline.
                resp = await self.cluster.produce(
                    address, request, self.request_timeout_ms / 1000 + 1
                )
            except grpc.aio.AioRpcError as rpc_err:
                err = error_from_rpc(rpc_err, address)
                if rpc_err.code() == grpc.StatusCode.UNAVAILABLE:
                    self._unreachable[node] = now_ms() + 2 * self.retry_backoff_ms
                self.cluster.metadata.request_update()
                for b in batches:
                    self._on_batch_error(b, err)
                return
            except ClientClosedError as closed:
                for b in batches:
                    self._finish_failed(b, closed)
                return
            results: dict[TopicPartition, pb.PartitionProduceResponse] = {}
            for t in resp.topics:
                for p in t.partitions:
                    results[TopicPartition(t.topic, p.partition)] = p
            for b in batches:
                result = results.get(b.tp)
                if result is None:
                    self._on_batch_error(
                        b, NetworkExceptionError(f"{address} sent no result for {b.tp}")
                    )
                elif result.error_code in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
                    self._finish_ok(b, result.base_offset, result.log_append_time_ms)
                else:
                    self._on_batch_error(b, error_for(result.error_code, result.error_message))
        finally:
            self._in_flight[node] -= 1
            self._wake()

    def _on_batch_error(self, batch: ProducerBatch, err: MiniBrokerError) -> None:
        now = now_ms()
        if (
            err.code == ErrorCode.MESSAGE_TOO_LARGE
            and batch.record_count > 1
            and batch.buffer is not None
            and not self._closed_for_good()
        ):
            self._split(batch, err)
            return
        if (
            err.retriable
            and batch.attempts <= self.retries
            and now - batch.created_ms < self.delivery_timeout_ms
            and not self._closed_for_good()
        ):
            if err.code in _LEADERSHIP_ERRORS:
                self.cluster.metadata.mark_leader_unknown(batch.tp)
            log.debug(
                "produce_retry tp=%s attempt=%d base_sequence=%d error=%s: %s",
                batch.tp,
                batch.attempts,
                batch.base_sequence,
                type(err).__name__,
                err,
            )
            self.accumulator.retry(batch, now, self.retry_backoff_ms)
            return
        if err.code == ErrorCode.MESSAGE_TOO_LARGE:
            err = MessageTooLargeError(
                f"the broker refused a {batch.size_bytes}-byte batch for {batch.tp} "
                f"({err}); lower batch_size or raise the topic's max.message.bytes"
            )
        elif err.retriable:
            err = type(err)(
                f"{err} (gave up on {batch.tp} after {batch.attempts} attempt(s) and "
                f"{now - batch.created_ms} ms; delivery_timeout_ms={self.delivery_timeout_ms})"
            )
        else:
            # A final answer (INVALID_TIMESTAMP, INVALID_RECORD, ...): Kafka fails the batch at
            # once. The broker's text locates the batch in its request; say which partition.
            err = type(err)(
                f"a batch of {batch.record_count} record(s) for {batch.tp} failed: {err}"
            )
        self._finish_failed(batch, err)

    def _split(self, batch: ProducerBatch, err: MiniBrokerError) -> None:
        """MESSAGE_TOO_LARGE for a batch of several records: the topic's limit is lower than
        this producer knew (a broker-wide message.max.bytes, a config changed since the last
        metadata). As Kafka's Sender does, send it again in smaller batches, in order."""
        if batch.buffer is None:  # only a built batch is ever sent, so never; typed as such
            self._finish_failed(batch, err)
            return
        records = [
            (r.timestamp, r.key, r.value, r.headers) for r in decode_batch(batch.buffer).records
        ]
        parts = self.accumulator.split_and_reenqueue(batch, records, self._split_builder)
        log.debug(
            "produce_split tp=%s records=%d bytes=%d into=%s error=%s",
            batch.tp,
            batch.record_count,
            batch.size_bytes,
            [p.record_count for p in parts],
            err,
        )

    def _split_builder(self) -> BatchBuilder:
        return BatchBuilder(INT32_MAX, compression=self.compression)

    def _closed_for_good(self) -> bool:
        return self._sender is None or self._sender.done()

    def _finish_ok(self, batch: ProducerBatch, base_offset: int, log_append_time_ms: int) -> None:
        self.accumulator.complete(batch)
        self._signal_space()
        topic, partition = batch.tp
        append_time = log_append_time_ms >= 0
        offset = base_offset if base_offset >= 0 else -1
        step = 1 if base_offset >= 0 else 0
        for future, ts in zip(batch.handles, batch.timestamps):
            if not future.done():
                ts = log_append_time_ms if append_time else ts
                # The hottest loop of acknowledgement: RecordMetadata built through
                # tuple.__new__ (its NamedTuple __new__ is a Python frame of its own).
                _settle(future, _new_tuple(RecordMetadata, (topic, partition, offset, ts)))
            offset += step

    def _finish_failed(self, batch: ProducerBatch, err: MiniBrokerError) -> None:
        log.debug(
            "produce_failed tp=%s records=%d attempts=%d error=%s: %s",
            batch.tp,
            batch.record_count,
            batch.attempts,
            type(err).__name__,
            err,
        )
        self.accumulator.fail(batch)
        self._signal_space()
        if batch.base_sequence != NO_SEQUENCE and self.idempotent:
            # This sequence range may or may not be on the broker: continuing the old id would
            # either leave a gap or collide, so start a fresh producer id (KIP-360's reason).
            self._need_producer_id = True
        self._fail_handles(batch, err)

    @staticmethod
    def _fail_handles(batch: ProducerBatch, err: BaseException) -> None:
        for future in batch.handles:
            _settle(future, exc=err)

    def _signal_space(self) -> None:
        if self._space is not None and self.accumulator.buffered_bytes < self.buffer_memory:
            self._space.set()


__all__ = ["AsyncProducer", "PreparedRecord", "parse_acks"]
