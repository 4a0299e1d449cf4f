"""AsyncConsumer: Kafka's consumer (manual assignment) on grpc.aio.

Does network I/O through `ClusterClient`. The jobs are split as in Kafka's consumer:
subscription.py holds each partition's state (Kafka's SubscriptionState, pure), fetcher.py the
fetch loop and its Fetch requests (Kafka's Fetcher), offsets.py ListOffsets, resets and position
validation (Kafka's OffsetFetcher), completed_fetch.py the decoding of fetched batches, and
wire.py every protobuf. This module is the application's side: assignment, seeks, poll() and
offset lookups.

Kafka's rules kept: fetches carry `current_leader_epoch` from metadata (KIP-320); when the
metadata names a new leader epoch, buffered records are dropped and, once the application has
consumed a record, the position is validated before the next fetch (OffsetForLeaderEpoch for the
epoch of the last consumed record): if that epoch ends below the position on the new leader, the
log was truncated under the consumer (an unclean election) and it moves to the first offset known
to diverge, or raises LogTruncationError from poll() with auto_offset_reset="none". There are no
consumer groups or committed offsets: positions start from `auto_offset_reset` or an explicit
`seek`.

Concurrency: every method runs on the event loop that started the consumer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence

from minibroker.client.common.config import ConfigError
from minibroker.client.common.tls import client_tls
from minibroker.client.errors import (
    MiniBrokerError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from minibroker.client.fetcher import Fetcher
from minibroker.client.subscription import RESET_STRATEGIES, PartitionState, SubscriptionState
from minibroker.client.transport import (
    DEFAULT_BOOTSTRAP,
    ClientClosedError,
    ClusterClient,
    check_topic_name,
    now_ms,
)
from minibroker.client.types import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    Record,
    TopicPartition,
)
from minibroker.client.wire import OffsetAnswer

_RESETS = (*RESET_STRATEGIES, "none")
# How long close() waits for the brokers to drop its fetch sessions (best effort, KIP-227).
CLOSE_SESSIONS_TIMEOUT_S = 1.0


class AsyncConsumer:
    """Kafka-shaped consumer for asyncio code with manual `assign`."""

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        client_rack: str | None = None,
        auto_offset_reset: str = "latest",
        fetch_max_wait_ms: int = 500,
        fetch_min_bytes: int = 1,
        fetch_max_bytes: int = 50 * 1024 * 1024,
        max_partition_fetch_bytes: int = 1024 * 1024,
        max_poll_records: int = 500,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        default_api_timeout_ms: int = 60_000,
        metadata_max_age_ms: int = 300_000,
        max_block_ms: int = 5_000,
        security_protocol: str = "PLAINTEXT",
        ssl_ca_location: str | None = None,
        ssl_certificate_location: str | None = None,
        ssl_key_location: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_username: str | None = None,
        sasl_password: str | None = None,
    ) -> None:
        if auto_offset_reset not in _RESETS:
            raise ConfigError(
                f"invalid value {auto_offset_reset!r} for auto_offset_reset: use "
                "earliest, latest or none"
            )
        if max_poll_records < 1:
            raise ConfigError(f"max_poll_records must be >= 1, got {max_poll_records}")
        self.client_rack = client_rack or ""
        self.auto_offset_reset = auto_offset_reset
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.fetch_max_bytes = fetch_max_bytes
        self.max_partition_fetch_bytes = max_partition_fetch_bytes
        self.max_poll_records = max_poll_records
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.default_api_timeout_ms = default_api_timeout_ms
        self.max_block_ms = max_block_ms
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
        default_reset = None if auto_offset_reset == "none" else auto_offset_reset
        self._subscriptions = SubscriptionState(default_reset)
        self._fetcher = Fetcher(self, self.cluster, self._subscriptions, self._signal_data)
        self._offsets = self._fetcher.offsets
        self._data: asyncio.Event | None = None
        self._validated: set[TopicPartition] = set()
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        if self._closed:
            raise ClientClosedError("the consumer is closed; create a new one")
        if self._data is not None:
            return
        self._data = asyncio.Event()
        self._fetcher.loop.start()

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = self._fetcher.loop
        if loop.task is not None:
            loop.task.cancel()
        await asyncio.gather(
            *(t for t in (loop.task,) if t is not None),
            loop.cancel_requests(),
            return_exceptions=True,
        )
        try:
            await self._fetcher.close_sessions(CLOSE_SESSIONS_TIMEOUT_S)
        finally:
            await self.cluster.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the consumer is closed; create a new one")

    def _signal_data(self) -> None:
        if self._data is not None:
            self._data.set()

    # -- assignment and positions --------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Replace the assignment. New partitions start at `auto_offset_reset` unless sought."""
        self._check_open()
        wanted = [TopicPartition(*tp) for tp in partitions]
        for tp in wanted:
            if not isinstance(tp.topic, str) or not isinstance(tp.partition, int):
                raise TypeError(f"assign() takes TopicPartition(topic, partition), got {tp!r}")
            # A name no topic can have fails here, not as a metadata wait in every poll().
            check_topic_name(tp.topic)
        self._subscriptions.assign(wanted)
        self.cluster.metadata.add_interest({tp.topic for tp in wanted})
        self._fetcher.wake()

    def assignment(self) -> set[TopicPartition]:
        return set(self._subscriptions.states)

    def _state(self, tp: TopicPartition) -> PartitionState:
        return self._subscriptions.state(tp)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch `tp` from `offset` on the next poll."""
        self._check_open()
        if offset < 0:
            raise ValueError(f"seek offset must be >= 0, got {offset}")
        self._state(tp).seek(offset)
        self._fetcher.wake()

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(self._subscriptions.states):
            self._state(tp).reset_to("earliest")
        self._fetcher.wake()

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(self._subscriptions.states):
            self._state(tp).reset_to("latest")
        self._fetcher.wake()

    async def position(self, tp: TopicPartition) -> int:
        """The offset of the next record poll() returns for `tp` (resolving a pending reset)."""
        self._check_open()
        await self.start()
        await self._validate_assignment()
        state = self._state(tp)
        deadline = now_ms() + self.default_api_timeout_ms
        while state.position is None:
            if state.error is not None:
                raise state.error
            if state.reset is None:
                raise OffsetOutOfRangeError(
                    f"{tp} has no position and auto_offset_reset is 'none'; call seek()"
                )
            if now_ms() >= deadline:
                raise RequestTimedOutError(f"no position for {tp} within default_api_timeout_ms")
            await self._wait_data(min(100, max(1, deadline - now_ms())))
            state = self._state(tp)
        return state.position

    async def _validate_assignment(self) -> None:
        """Check once per partition that its topic and partition exist (typed errors)."""
        for tp in list(self._subscriptions.states):
            if tp in self._validated:
                continue
            info = await self.cluster.wait_for_topic(tp.topic, self.max_block_ms)
            if tp.partition not in info.partitions:
                count = info.num_partitions
                raise UnknownTopicOrPartitionError(
                    f"topic {tp.topic!r} has {count} partitions (0..{count - 1}); "
                    f"partition {tp.partition} does not exist"
                )
            self._validated.add(tp)

    # -- polling -------------------------------------------------------------------------------

    async def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[Record]:
        """Records fetched since the last poll, waiting up to `timeout_ms` for the first one.

        Returns records in offset order per partition, across partitions in turn. Raises the
        error of a partition that cannot continue (OffsetOutOfRangeError with
        auto_offset_reset='none', a corrupt batch, ...).
        """
        self._check_open()
        await self.start()
        await self._validate_assignment()
        limit = max_records or self.max_poll_records
        deadline = now_ms() + max(0, timeout_ms)
        while True:
            records = self._drain_buffers(limit)
            if records:
                self._fetcher.wake()
                return records
            remaining = deadline - now_ms()
            if remaining <= 0:
                return []
            await self._wait_data(remaining)
            self._check_open()

    async def _wait_data(self, timeout_ms: int) -> None:
        assert self._data is not None
        self._data.clear()
        try:
            await asyncio.wait_for(self._data.wait(), timeout_ms / 1000)
        except TimeoutError:
            return

    def _drain_buffers(self, limit: int) -> list[Record]:
        try:
            return self._subscriptions.drain(limit)
        except MiniBrokerError:
            # The partition is fetched (or validated) again, which raises the error again
            # unless the application seeks, as Kafka's consumer does.
            self._fetcher.wake()
            raise

    # -- offsets lookups -----------------------------------------------------------------------

    async def beginning_offsets(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int]:
        result = await self._list_offsets(
            {TopicPartition(*tp): EARLIEST_TIMESTAMP for tp in partitions}
        )
        return {tp: off for tp, (off, _ts, _epoch) in result.items()}

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The high watermark of each partition (the offset the next committed record gets)."""
        result = await self._list_offsets(
            {TopicPartition(*tp): LATEST_TIMESTAMP for tp in partitions}
        )
        return {tp: off for tp, (off, _ts, _epoch) in result.items()}

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int] | None]:
        """For each partition, (offset, timestamp) of the first record with timestamp >= the
        given one, or None when there is none (Kafka's OffsetAndTimestamp).

        The broker answers with batch granularity (it never decodes records: the first batch
        whose maxTimestamp is >= the target); the client then reads that batch and picks the
        record, as Kafka's broker does. If that read fails, the batch's first offset is returned,
        which is never past the exact answer.
        """
        for tp, ts in timestamps.items():
            if ts < 0:
                raise ValueError(f"timestamp for {tp} must be >= 0, got {ts}")
        result = await self._list_offsets(dict(timestamps))
        found = {tp: (off, ts) for tp, (off, ts, _epoch) in result.items() if off >= 0}
        refined = await asyncio.gather(
            *(
                self._offsets.first_at_or_after(tp, timestamps[tp], answer)
                for tp, answer in found.items()
            )
        )
        exact = dict(zip(found, refined))
        return {tp: exact.get(tp) for tp in result}

    async def _list_offsets(
        self, targets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAnswer]:
        self._check_open()
        return await self._offsets.list_offsets(targets)

    # -- introspection -------------------------------------------------------------------------

    def highwater(self, tp: TopicPartition) -> int | None:
        """The HW from the last fetch response of `tp` (None before the first)."""
        state = self._state(tp)
        return state.high_watermark if state.high_watermark >= 0 else None

    def topics(self) -> set[str]:
        return set(self.cluster.metadata.topics)

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        info = self.cluster.metadata.topics.get(topic)
        return set(info.partitions) if info is not None else None


__all__ = ["AsyncConsumer"]
