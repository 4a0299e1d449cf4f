"""AsyncProducer: Kafka's producer on grpc.aio (accumulator + one sender task).

Does network I/O through `ClusterClient`. `send` checks a record (producer_record.py), places it
(partitioner.py) and appends it to the `RecordAccumulator`, whose builder encodes it at once
(compiled where available); the `Sender` (sender.py) drains ready batches into Produce requests,
retries, splits and completes them, and takes producer ids. Idempotence is on by default with
acks=all, as in Kafka 3+.

Per record, `send` makes one small `FutureRecordMetadata` over its batch's shared
`ProduceRequestResult` (produce_result.py): no asyncio future, task or callback per record, and
the sender's work is per batch (Kafka's design).

Concurrency: `_append` (the record path of `send`, `send_batch` and the blocking `Producer`)
may run on any thread: the accumulator appends under one lock, and a thread other than the
loop's wakes the sender only when it opens a batch. Everything else runs on the event loop that
called `start()` (or the first `send`).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

from minibroker.client.accumulator import RecordAccumulator, record_size_estimate
from minibroker.client.batch import Compression
from minibroker.client.common.config import ConfigError
from minibroker.client.common.tls import client_tls
from minibroker.client.errors import (
    ClientClosedError,
    MessageTooLargeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from minibroker.client.metadata_cache import TopicInfo
from minibroker.client.partitioner import StickyPartitioner, partition_for_key
from minibroker.client.produce_result import (
    FutureRecordMetadata,
    ProduceRequestResult,
    SentRecords,
    register_sender_loop,
)
from minibroker.client.producer_record import (
    DEFAULT_MAX_MESSAGE_BYTES,
    INT32_MAX,
    INT64_MAX,
    HeadersIn,
    as_bytes,
    checked_timestamp,
    max_message_bytes,
    normalize_headers,
    parse_acks,
)
from minibroker.client.records import BatchBuilder
from minibroker.client.records.builder import record_bytes
from minibroker.client.sender import Sender
from minibroker.client.transport import (
    DEFAULT_BOOTSTRAP,
    ClusterClient,
    check_topic_name,
    now_ms,
)
from minibroker.client.types import RecordMetadata, TopicPartition

# 1 MiB (the default max.message.bytes caps a batch just above it): with 1 KiB records, RF=3 and
# acks=all the brokers spent 21-23 us of CPU per record against 31-34 us with 256 KiB batches,
# since every hop's cost is mostly per call. A batch this full only forms under load.
DEFAULT_BATCH_SIZE = 1024 * 1024
DEFAULT_MAX_REQUEST_SIZE = 8 * 1024 * 1024

_BYTES_OR_NONE = frozenset((bytes, type(None)))
_time_ns = time.time_ns
_get_ident = threading.get_ident


class AsyncProducer:
    """Kafka-shaped producer for asyncio code. Use `async with AsyncProducer(...) as p:`.

    `await p.send(...)` returns a `FutureRecordMetadata` once the record is buffered (await it,
    or use it as a concurrent.futures.Future); `await p.send_and_wait(...)` returns the
    RecordMetadata; `await p.send_batch(topic, values)` buffers many records in one call.
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
        security_protocol: str = "PLAINTEXT",
        ssl_ca_location: str | None = None,
        ssl_certificate_location: str | None = None,
        ssl_key_location: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_username: str | None = None,
        sasl_password: str | None = None,
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
        # A key and value of up to this many bytes together need no per-topic size check: with
        # the record's framing and a batch header they stay under the smallest sane limit.
        self._small_record_bytes = max(0, min(1024, max_request_size) - 61 - 21)
        self._limits: dict[str, tuple[TopicInfo, int]] = {}
        self.client_id = client_id
        self.cluster = ClusterClient(
            bootstrap_servers,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            metadata_max_age_ms=metadata_max_age_ms,
            tls=client_tls(
                security_protocol,
                ssl_ca_location,
                ssl_certificate_location,
                ssl_key_location,
                sasl_mechanism,
                sasl_username,
                sasl_password,
            ),
        )
        self.accumulator = RecordAccumulator(
            batch_size=batch_size,
            linger_ms=linger_ms,
            new_builder=self._new_builder,
            idempotent=enable_idempotence,
            wake_sender=self._wake_sender,
            clock_ms=now_ms,
            lock=threading.Lock(),
        )
        # The accumulator's byte count (buffer_memory's), read per record without a Python call.
        self._buffered = self.accumulator.bytes
        self._sticky = StickyPartitioner(rng or random.Random())
        self._tps: dict[str, list[TopicPartition]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._space: asyncio.Event | None = None
        # Threads blocked in the blocking Producer's send while the buffer is full.
        self._space_cond = threading.Condition()
        self._blocked = 0
        self._sender = Sender(self, self.cluster, self.accumulator, self._signal_space)
        self._wake = self._sender.loop.wake
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the sender task; called by `async with` and by the first `send`."""
        if self._closed:
            raise ClientClosedError("the producer is closed; create a new one")
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        register_sender_loop(self._loop)
        self._space = asyncio.Event()
        self._sender.loop.start()

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
        sender = self._sender.loop.task
        if sender is not None:
            self._wake()
            wait_s = (self.delivery_timeout_ms if timeout_ms is None else timeout_ms) / 1000
            try:
                await asyncio.wait_for(asyncio.shield(sender), wait_s)
            except (TimeoutError, asyncio.CancelledError):
                sender.cancel()
                try:
                    await sender
                except (asyncio.CancelledError, Exception):  # shutting down either way
                    pass
            except Exception:  # the sender crashed: its batches already carry the error
                pass
        await self._sender.loop.cancel_requests()
        self._sender.fail_everything(
            ClientClosedError("the producer was closed before the record was sent"), close=True
        )
        self._signal_space()
        await self.cluster.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # -- sending -------------------------------------------------------------------------------

    def _append(
        self,
        topic: str,
        value: Any,
        key: Any,
        partition: int | None,
        headers: HeadersIn,
        timestamp_ms: int | None,
        info: TopicInfo,
    ) -> FutureRecordMetadata:
        """Check one record and append it to its batch; any thread. Raises typed errors that
        say what to fix, with nothing queued."""
        if self._closed:
            raise ClientClosedError("send() after close(): the producer is closed")
        if self._sender.fatal is not None:
            return self._failed(topic, self._sender.fatal)
        if timestamp_ms is None:
            timestamp_ms = _time_ns() // 1_000_000
        elif type(timestamp_ms) is not int or not 0 <= timestamp_ms <= INT64_MAX:
            timestamp_ms = checked_timestamp(timestamp_ms)
        if value is not None and type(value) is not bytes:
            value = as_bytes(value, "value")
        if key is not None and type(key) is not bytes:
            key = as_bytes(key, "key")
        if headers is not None:
            headers = normalize_headers(headers) or None
        if (
            headers is not None
            or (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
            > self._small_record_bytes
        ):
            self._check_size(topic, key, value, headers, info)
        count = len(info.partitions)
        tps = self._tps.get(topic)
        if tps is None or len(tps) != count:
            tps = self._partitions(topic, count)
        if partition is None:
            if key is None:
                return self.accumulator.append_sticky(
                    topic, tps, self._sticky, timestamp_ms, None, value, headers
                )
            partition = partition_for_key(key, count)
        elif type(partition) is not int or not 0 <= partition < count:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has {count} partitions (0..{count - 1}); "
                f"partition {partition!r} does not exist"
            )
        return self.accumulator.append(tps[partition], timestamp_ms, key, value, headers)

    def _check_size(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: tuple[tuple[str, bytes | None], ...] | None,
        info: TopicInfo,
    ) -> None:
        size = record_size_estimate(key, value, headers or ())
        known = self._limits.get(topic)
        if known is None or known[0] is not info:
            known = self._limits[topic] = (info, max_message_bytes(info))
        topic_limit = known[1]
        limit = min(topic_limit, self.max_request_size)
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

    def _failed(self, topic: str, error: BaseException) -> FutureRecordMetadata:
        result = ProduceRequestResult(TopicPartition(topic, -1))
        result.fail(error)
        return FutureRecordMetadata.of(result, 0, -1)

    def _append_batch(
        self,
        topic: str,
        values: Sequence[Any],
        keys: Sequence[Any] | None,
        partition: int | None,
        timestamp_ms: int | None,
        info: TopicInfo,
        out: SentRecords,
        start: int,
    ) -> int:
        """Append `values[start:]` until one batch is full; returns how many were appended.
        Any thread. The caller loops (and waits for buffer space between calls)."""
        if self._closed:
            raise ClientClosedError("send() after close(): the producer is closed")
        count = info.num_partitions
        tps = self._tps.get(topic)
        if tps is None or len(tps) != count:
            tps = self._partitions(topic, count)
        assert isinstance(out._timestamps, int)
        if partition is None and keys is not None:
            # Keyed records go to their own partitions: one at a time.
            fut = self._append(topic, values[start], keys[start], None, None, out._timestamps, info)
            out._add_run(fut[0], fut[1], 1)
            return 1
        if partition is not None and (type(partition) is not int or not 0 <= partition < count):
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has {count} partitions (0..{count - 1}); "
                f"partition {partition!r} does not exist"
            )
        return self.accumulator.append_values(
            tps,
            partition,
            self._sticky,
            out._timestamps,
            values,
            keys,
            start,
            out,
        )

    def _check_batch(
        self,
        topic: str,
        values: Sequence[Any],
        keys: Sequence[Any] | None,
        info: TopicInfo,
    ) -> None:
        """Every record of a `send_batch` is one the encoder takes and fits the limits, checked
        before any is queued, so a refused call queues nothing."""
        if keys is not None and len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys for {len(values)} values: give one key per value")
        small = self._small_record_bytes
        # C-speed scans: the common case (bytes values, none large) costs no Python per record.
        simple = set(map(type, values)) <= _BYTES_OR_NONE and (
            keys is None or set(map(type, keys)) <= _BYTES_OR_NONE
        )
        if simple:
            longest = max(map(len, filter(None, values)), default=0)
            if keys is not None:
                longest += max(map(len, filter(None, keys)), default=0)
            if longest <= small:
                return
        for i, value in enumerate(values):
            # The encoder's own rules (bytes, bytearray, C-contiguous memoryview, str or None).
            v = record_bytes(value, "value") if value is not None else None
            key = keys[i] if keys is not None else None
            k = record_bytes(key, "key") if key is not None else None
            if (len(k) if k else 0) + (len(v) if v else 0) > small:
                self._check_size(topic, k, v, None, info)

    def _partitions(self, topic: str, num_partitions: int) -> list[TopicPartition]:
        """The shared TopicPartitions of `topic`: one lookup per record instead of a new
        NamedTuple (whose construction costs several times more)."""
        tps = self._tps[topic] = [TopicPartition(topic, p) for p in range(num_partitions)]
        self.accumulator.forget_sticky(topic)
        return tps

    def _wake_sender(self) -> None:
        """The accumulator has a batch the sender must see sooner than it planned (under the
        accumulator's lock, on any thread): a full one, or a linger that ends before the
        sender's timer."""
        loop = self._loop
        if loop is None:
            return
        if _get_ident() == self._loop_thread:
            self._wake()
        else:
            try:
                loop.call_soon_threadsafe(self._wake)
            except RuntimeError:  # the loop is closed: close() fails what is left
                pass

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
                raise self._buffer_full()
            try:
                await asyncio.wait_for(self._space.wait(), remaining / 1000)
            except TimeoutError:
                continue

    def _block_for_space(self) -> None:
        """The blocking Producer's wait for buffer space (any thread but the loop's)."""
        deadline = time.monotonic() + self.max_block_ms / 1000
        with self._space_cond:
            self._blocked += 1
            try:
                while self.accumulator.buffered_bytes >= self.buffer_memory:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise self._buffer_full()
                    self._space_cond.wait(remaining)
            finally:
                self._blocked -= 1

    def _buffer_full(self) -> RequestTimedOutError:
        return RequestTimedOutError(
            f"buffer_memory ({self.buffer_memory} bytes) stayed full for max_block_ms "
            f"({self.max_block_ms}); the cluster is not keeping up"
        )

    async def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        headers: HeadersIn = None,
        timestamp_ms: int | None = None,
    ) -> FutureRecordMetadata:
        """Buffer one record; returns the future of its RecordMetadata (topic, partition,
        offset, timestamp): await it, or use it as a concurrent.futures.Future. Raises at once
        for bad input, a closed producer, or an unknown topic."""
        if self._loop is None:
            if self._closed:
                raise ClientClosedError("send() after close(): the producer is closed")
            await self.start()
        info = self.cluster.metadata.topics.get(topic) if type(topic) is str else None
        if info is None:
            info = await self._topic(topic)
        acc = self.accumulator
        if self._buffered.value >= self.buffer_memory:
            await self._wait_for_space()
        opened = acc.batches_created
        future = self._append(topic, value, key, partition, headers, timestamp_ms, info)
        if acc.batches_created != opened and acc.sender_overdue(now_ms()):
            # A batch was opened and the sender is due (woken, or its timer has come): let it
            # run now, or a tight send loop (which never suspends otherwise) would queue
            # everything before the first request goes out. Not per batch: records spread
            # over many partitions open one per record.
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

    async def send_batch(
        self,
        topic: str,
        values: Sequence[Any],
        keys: Sequence[Any] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> SentRecords:
        """Buffer many records at once (values, and optionally one key each), all with one
        timestamp (default: now); the per-record work runs in the compiled encoder.

        Same placement as `send` (a partition, a key's partition, or the sticky partition for
        null keys) and the same checks, all made before any record is queued. Returns a
        `SentRecords`: a sequence of each record's future; `await` it (or `.result()`) for
        every RecordMetadata, in order.
        """
        if self._loop is None:
            if self._closed:
                raise ClientClosedError("send() after close(): the producer is closed")
            await self.start()
        info = self.cluster.metadata.topics.get(topic) if type(topic) is str else None
        if info is None:
            info = await self._topic(topic)
        out = self._new_sent(values, keys, partition, timestamp_ms, topic, info)
        start, total = 0, len(values)
        acc = self.accumulator
        while start < total:
            if acc.buffered_bytes >= self.buffer_memory:
                await self._wait_for_space()
            opened = acc.batches_created
            start += self._append_batch(topic, values, keys, partition, None, info, out, start)
            if acc.batches_created != opened and acc.sender_overdue(now_ms()):
                await asyncio.sleep(0)
        return out

    def _new_sent(
        self,
        values: Sequence[Any],
        keys: Sequence[Any] | None,
        partition: int | None,
        timestamp_ms: int | None,
        topic: str,
        info: TopicInfo,
    ) -> SentRecords:
        if self._closed:
            raise ClientClosedError("send() after close(): the producer is closed")
        if self._sender.fatal is not None:
            raise self._sender.fatal
        if timestamp_ms is None:
            timestamp_ms = _time_ns() // 1_000_000
        else:
            timestamp_ms = checked_timestamp(timestamp_ms)
        self._check_batch(topic, values, keys, info)
        out = SentRecords()
        out._timestamps = timestamp_ms
        return out

    async def flush(self, timeout_ms: int | None = None) -> None:
        """Send every buffered record now and wait until each is acknowledged or failed."""
        if self._loop is None:
            return
        acc = self.accumulator
        acc.flushing += 1
        try:
            self._wake()
            waits = [b.result.asyncio_future() for b in acc.incomplete()]
            if waits:
                timeout = None if timeout_ms is None else timeout_ms / 1000
                _, pending = await asyncio.wait(waits, timeout=timeout)
                if pending:
                    raise RequestTimedOutError(f"flush did not finish within {timeout_ms} ms")
        finally:
            acc.flushing -= 1

    async def partitions_for(self, topic: str) -> list[int]:
        info = await self._topic(topic)
        return sorted(info.partitions)

    # -- helpers of the accumulator and the sender ---------------------------------------------

    def _new_builder(self, tp: TopicPartition) -> BatchBuilder:
        info = self.cluster.metadata.topics.get(tp.topic)
        topic_limit = max_message_bytes(info) if info is not None else DEFAULT_MAX_MESSAGE_BYTES
        # A batch must fit the topic's max.message.bytes and one produce request.
        size = min(self.batch_size, topic_limit, self.max_request_size)
        return BatchBuilder(size, compression=self.compression)

    def _signal_space(self) -> None:
        """A batch left the buffer (sender's loop): wake senders waiting for room."""
        if self.accumulator.buffered_bytes >= self.buffer_memory:
            return
        if self._space is not None:
            self._space.set()
        if self._blocked:
            with self._space_cond:
                self._space_cond.notify_all()


__all__ = ["AsyncProducer", "FutureRecordMetadata", "HeadersIn", "SentRecords", "parse_acks"]
