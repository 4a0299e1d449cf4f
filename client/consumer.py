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
to diverge, or raises LogTruncationError from poll() with auto_offset_reset="none".

Consumer groups (with `group_id`, client/groups/): `subscribe(topics)` joins the group and poll()
drives the rebalances (eager, as Kafka's range and roundrobin assignors: every partition is
revoked, after a commit of positions when auto-commit is on, before JoinGroup); a background task
heartbeats. Assigned partitions start at their committed offset (OffsetFetch) or
`auto_offset_reset`. `commit()` / `committed()` work with `assign()` too (generation -1, as
Kafka's standalone consumers). Without `group_id` positions start from `auto_offset_reset` or an
explicit `seek`.

Concurrency: every method runs on the event loop that started the consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from minibroker.client.common.config import ConfigError
from minibroker.client.common.tls import client_tls
from minibroker.client.errors import (
    MiniBrokerError,
    OffsetOutOfRangeError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
)
from minibroker.client.fetcher import Fetcher
from minibroker.client.groups.coordinator import (
    CommittedOffset,
    GroupMember,
    GroupSettings,
    MemberState,
)
from minibroker.client.groups.transport import ClusterGroupTransport
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
        group_id: str | None = None,
        group_instance_id: str | None = None,
        client_id: str = "minibroker",
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5_000,
        session_timeout_ms: int = 45_000,
        heartbeat_interval_ms: int = 3_000,
        max_poll_interval_ms: int = 300_000,
        partition_assignment_strategy: str | Sequence[str] = ("range", "roundrobin"),
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
        # -- the group (None without group_id) --
        if group_id is not None and not group_id:
            raise ConfigError("group_id must not be empty")
        if heartbeat_interval_ms >= session_timeout_ms:
            raise ConfigError(
                f"heartbeat_interval_ms ({heartbeat_interval_ms}) must be lower than "
                f"session_timeout_ms ({session_timeout_ms})"
            )
        strategies = (
            [s.strip() for s in partition_assignment_strategy.split(",")]
            if isinstance(partition_assignment_strategy, str)
            else list(partition_assignment_strategy)
        )
        self.group_id = group_id
        self.enable_auto_commit = enable_auto_commit and group_id is not None
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self._group: GroupMember | None = None
        if group_id is not None:
            try:
                self._group = GroupMember(
                    GroupSettings(
                        group_id=group_id,
                        session_timeout_ms=session_timeout_ms,
                        heartbeat_interval_ms=heartbeat_interval_ms,
                        max_poll_interval_ms=max_poll_interval_ms,
                        partition_assignment_strategy=tuple(strategies),
                        group_instance_id=group_instance_id,
                        retry_backoff_ms=retry_backoff_ms,
                        request_timeout_ms=request_timeout_ms,
                    ),
                    ClusterGroupTransport(self.cluster, client_id),
                    now_ms,
                )
            except ValueError as err:
                raise ConfigError(str(err)) from None
        self._topics: set[str] = set()  # subscribe()d topics (empty: manual assign or none)
        self._on_assign: Callable[[set[TopicPartition]], Any] | None = None
        self._on_revoke: Callable[[set[TopicPartition]], Any] | None = None
        self._join: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._auto_commit: asyncio.Task[None] | None = None
        self._next_auto_commit = now_ms() + auto_commit_interval_ms

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
        try:
            await self._close_group()
        finally:
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

    async def _close_group(self) -> None:
        """Kafka's close: commit positions (auto-commit), then LeaveGroup."""
        group = self._group
        if group is None:
            return
        tasks = [t for t in (self._heartbeat, self._join, self._auto_commit) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.enable_auto_commit and self._subscriptions.states:
            with contextlib.suppress(MiniBrokerError):
                await self._commit_positions(min(self.default_api_timeout_ms, 5_000))
        if group.member_id:
            await group.leave()

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
        deadline = now_ms() + max(0, timeout_ms)
        if self._group is not None and not await self._poll_group(deadline):
            return []
        await self._validate_assignment()
        limit = max_records or self.max_poll_records
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

    # -- consumer groups -----------------------------------------------------------------------

    def _need_group(self, what: str) -> GroupMember:
        if self._group is None:
            raise ConfigError(f"{what} needs a group_id")
        return self._group

    def subscribe(
        self,
        topics: Iterable[str],
        on_assign: Callable[[set[TopicPartition]], Any] | None = None,
        on_revoke: Callable[[set[TopicPartition]], Any] | None = None,
    ) -> None:
        """Join the group for `topics` (poll() joins and rebalances). `on_revoke` runs before
        partitions are taken away (after their positions are committed when auto-commit is on),
        `on_assign` after new ones are given, each with the set of partitions; they run on the
        consumer's event loop (a blocking Consumer's callbacks must not call the Consumer)."""
        self._check_open()
        group = self._need_group("subscribe()")
        wanted = set(topics) if not isinstance(topics, str) else {topics}
        if not wanted:
            raise ValueError("subscribe() needs at least one topic; use unsubscribe() to leave")
        for topic in wanted:
            check_topic_name(topic)
        if wanted != self._topics:
            group.request_rejoin(f"subscription changed to {sorted(wanted)}")
        self._topics = wanted
        group.subscribed = True
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self.cluster.metadata.add_interest(wanted)
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.ensure_future(self._heartbeat_loop())

    def subscription(self) -> set[str]:
        return set(self._topics)

    async def unsubscribe(self) -> None:
        """Leave the group (after committing positions when auto-commit is on)."""
        group = self._need_group("unsubscribe()")
        await self._revoke()
        self._topics = set()
        group.subscribed = False
        if group.member_id:
            await group.leave("the consumer unsubscribed")

    async def _heartbeat_loop(self) -> None:
        group = self._group
        assert group is not None
        while not self._closed:
            await asyncio.sleep(group.settings.heartbeat_interval_ms / 1000)
            try:
                await group.heartbeat_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bad answer must not end the heartbeats
                group.mark_coordinator_unknown()

    async def _poll_group(self, deadline: int) -> bool:
        """The group's part of poll(): True when records may be handed out."""
        group = self._group
        assert group is not None
        group.last_poll_ms = now_ms()
        if self.enable_auto_commit and now_ms() >= self._next_auto_commit:
            self._next_auto_commit = now_ms() + self.auto_commit_interval_ms
            if self._auto_commit is None or self._auto_commit.done():
                self._auto_commit = asyncio.ensure_future(self._auto_commit_once())
        if not self._topics:
            return True
        # The leader compares the group's topics with metadata (the fetch loop refreshes it
        # every metadata_max_age_ms).
        if group.metadata_changed(self._partition_counts_cached(group.group_topics)):
            group.request_rejoin("the partition count of a subscribed topic changed")
        rejoin = group.rejoin_needed or group.state is not MemberState.STABLE
        if rejoin and (self._join is None or self._join.done()):
            self._join = asyncio.ensure_future(self._rejoin())
        if self._join is not None:
            join = self._join
            remaining = max(0, deadline - now_ms())
            done, _ = await asyncio.wait({join}, timeout=remaining / 1000)
            if not done:
                return False
            self._join = None
            join.result()  # a fatal group error surfaces here
        return group.state is MemberState.STABLE

    def _partition_counts_cached(self, topics: Iterable[str]) -> dict[str, int]:
        """Partition counts from the metadata cache: 0 for a topic the cluster says does not
        exist (deleted), nothing for a topic not fetched yet."""
        known = self.cluster.metadata.topics
        errors = self.cluster.metadata.topic_errors
        out = {t: known[t].num_partitions for t in topics if t in known}
        out.update({t: 0 for t in topics if t not in known and t in errors})
        return out

    async def _partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        """Partition counts of `topics` for the leader's assignment (unknown ones left out)."""
        wanted = set(topics)
        self.cluster.metadata.add_interest(wanted)
        with contextlib.suppress(MiniBrokerError):
            await self.cluster.refresh_metadata()
        known = self.cluster.metadata.topics
        return {t: known[t].num_partitions for t in wanted if t in known}

    async def _revoke(self) -> None:
        owned = set(self._subscriptions.states)
        if not owned:
            return
        if self.enable_auto_commit:
            with contextlib.suppress(MiniBrokerError):
                await self._commit_positions(self.default_api_timeout_ms)
        if self._on_revoke is not None:
            await _maybe_await(self._on_revoke(owned))
        self._subscriptions.assign([])
        self._fetcher.wake()

    async def _rejoin(self) -> None:
        group = self._group
        assert group is not None
        await self._revoke()
        deadline = now_ms() + group.settings.max_poll_interval_ms + self.request_timeout_ms
        assignment = await group.join_round(sorted(self._topics), self._partition_counts, deadline)
        committed = await group.fetch_committed(assignment, deadline)
        # No await between the assignment and the seeks: the fetcher never sees a partition
        # without its committed position.
        self._subscriptions.assign(assignment)
        for tp, found in committed.items():
            if found is not None and tp in self._subscriptions.states:
                self._subscriptions.state(tp).seek(found.offset)
        self.cluster.metadata.add_interest({tp.topic for tp in assignment} | group.group_topics)
        self._fetcher.wake()
        if self._on_assign is not None:
            await _maybe_await(self._on_assign(set(assignment)))

    def _positions(self) -> dict[TopicPartition, CommittedOffset]:
        return {
            tp: CommittedOffset(state.position, "", -1)
            for tp, state in self._subscriptions.states.items()
            if state.position is not None
        }

    async def _commit_positions(self, timeout_ms: int) -> None:
        group = self._need_group("commit()")
        await group.commit(self._positions(), now_ms() + timeout_ms)

    async def _auto_commit_once(self) -> None:
        with contextlib.suppress(MiniBrokerError):
            await self._commit_positions(self.default_api_timeout_ms)

    async def commit(
        self, offsets: Mapping[TopicPartition, int | tuple[int, str]] | None = None
    ) -> None:
        """Commit the positions of every assigned partition (the offsets of the next records
        poll() returns), or the given offsets (offset, or (offset, metadata)). Raises
        CommitFailed-like errors (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID,
        REBALANCE_IN_PROGRESS) when the group moved on; the consumer then rejoins."""
        self._check_open()
        group = self._need_group("commit()")
        if offsets is None:
            await self._commit_positions(self.default_api_timeout_ms)
            return
        wanted: dict[TopicPartition, CommittedOffset] = {}
        for tp, value in offsets.items():
            offset, meta = value if isinstance(value, tuple) else (value, "")
            if offset < 0:
                raise ValueError(f"commit offset for {tp} must be >= 0, got {offset}")
            wanted[TopicPartition(*tp)] = CommittedOffset(int(offset), meta, -1)
        await group.commit(wanted, now_ms() + self.default_api_timeout_ms)

    async def committed(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None: nothing committed)."""
        self._check_open()
        group = self._need_group("committed()")
        wanted = [TopicPartition(*tp) for tp in partitions]
        found = await group.fetch_committed(wanted, now_ms() + self.default_api_timeout_ms)
        return {tp: (c.offset if (c := found.get(tp)) is not None else None) for tp in wanted}

    def member_id(self) -> str | None:
        return self._group.member_id if self._group is not None else None

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


async def _maybe_await(value: Any) -> None:
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        await value


__all__ = ["AsyncConsumer"]
