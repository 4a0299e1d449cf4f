"""The consumer's fetch manager (Kafka's Fetcher): one loop task, Fetch requests, their answers.

Does network I/O through `ClusterClient` (requests and answers go through wire.py). The loop
(a WakeableLoop) looks at every assigned partition whenever woken: partitions in AWAIT_RESET
get a ListOffsets, those in AWAIT_VALIDATION an OffsetForLeaderEpoch on the leader (both through
offsets.py), and fetchable ones in FETCHING join the one Fetch in flight per broker, carrying
every partition that broker serves (the leader, or with `client_rack` an in-sync follower in the
same rack, KIP-392), long-polling `fetch_max_wait_ms`. Fetching is pipelined: a partition is
fetched again as soon as less than `max_poll_records` of its records wait in the buffer.

Partition errors: NOT_LEADER_OR_FOLLOWER, FENCED/UNKNOWN_LEADER_EPOCH, OFFSET_NOT_AVAILABLE
(KIP-207) and the like refresh metadata and retry after `retry_backoff_ms`; OFFSET_OUT_OF_RANGE
from a follower goes back to the leader, and from the leader applies `auto_offset_reset`
("earliest", "latest", or "none" = raise from poll); anything else is raised from poll().
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from minibroker.client.batch import CorruptRecordError
from minibroker.client.completed_fetch import decode_into
from minibroker.client.errors import (
    ErrorCode,
    OffsetOutOfRangeError,
    UnknownServerError,
    error_for,
)
from minibroker.client.fetch_session import INVALID_SESSION_ID, SESSION_ERRORS, FetchSessionHandler
from minibroker.client.offsets import ConsumerSettings, OffsetFetcher, refresh_and_back_off
from minibroker.client.records import uncompressed_limit
from minibroker.client.subscription import FetchState, PartitionState, SubscriptionState
from minibroker.client.transport import INVALID_METADATA_ERRORS, ClusterClient, now_ms
from minibroker.client.types import TopicPartition
from minibroker.client.wakeable import WakeableLoop
from minibroker.client.wire import (
    CallFailed,
    FetchedPartition,
    FetchTarget,
    call,
    fetch_request,
    fetched_partitions,
)

log = logging.getLogger("minibroker.client.consumer")


# Partition errors after which the client should look for the leader again and retry: a
# follower that is not ready to serve (REPLICA_NOT_AVAILABLE) and a new leader whose HW lags
# (OFFSET_NOT_AVAILABLE, KIP-207) besides those that make the metadata stale.
_REFRESH_AND_RETRY = INVALID_METADATA_ERRORS | {
    ErrorCode.REPLICA_NOT_AVAILABLE,
    ErrorCode.OFFSET_NOT_AVAILABLE,
}


class Fetcher:
    """The fetch loop of one consumer."""

    def __init__(
        self,
        settings: ConsumerSettings,
        cluster: ClusterClient,
        subscriptions: SubscriptionState,
        on_data: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.cluster = cluster
        self.subscriptions = subscriptions
        self._on_data = on_data
        self.loop = WakeableLoop(
            "minibroker-fetcher", self._step, self._crashed, cluster, settings.retry_backoff_ms
        )
        self.offsets = OffsetFetcher(
            settings, cluster, subscriptions, self.decode_limit, self._answered
        )
        self._node_busy: set[int] = set()
        self._sessions: dict[int, FetchSessionHandler[FetchTarget]] = {}  # by node (KIP-227)

    def wake(self) -> None:
        self.loop.wake()

    async def close_sessions(self, timeout_s: float) -> None:
        """Tell every broker holding one of this consumer's fetch sessions to drop it, as
        Kafka's consumer does on close (KIP-227): a request (id, -1) naming no partition, which
        the broker answers at once. Best effort: a broker that does not answer within
        `timeout_s` evicts the session when it goes stale. Call it with the loop stopped."""
        md = self.cluster.metadata
        settings = self.settings
        calls = []
        for node, session in self._sessions.items():
            address = md.address(node)
            if session.session_id == INVALID_SESSION_ID or address is None:
                continue
            session_id, epoch = session.notify_close()
            request = fetch_request(
                (),
                max_wait_ms=0,
                min_bytes=0,
                max_bytes=settings.fetch_max_bytes,
                partition_max_bytes=settings.max_partition_fetch_bytes,
                rack_id=settings.client_rack,
                session_id=session_id,
                session_epoch=epoch,
            )
            calls.append(call(self.cluster.fetch(address, request, timeout_s), address))
        self._sessions.clear()
        if calls:
            await asyncio.gather(*calls, return_exceptions=True)

    def _answered(self) -> None:
        self._on_data()
        self.loop.wake()

    def _crashed(self, err: Exception) -> None:
        # A bug must not leave poll() waiting forever: every partition reports it.
        for state in self.subscriptions.states.values():
            state.error = UnknownServerError(f"the consumer's fetch task failed: {err!r}")
        self._on_data()

    # -- the loop ------------------------------------------------------------------------------

    async def _step(self) -> int | None:
        """One pass over the assignment; returns how long to sleep unless woken."""
        md = self.cluster.metadata
        settings = self.settings
        states = self.subscriptions.states
        now = now_ms()
        self.loop.refresh_metadata_if_due(now)
        to_reset = [
            tp
            for tp, s in states.items()
            if s.fetch_state is FetchState.AWAIT_RESET
            and not s.awaiting_answer
            and s.backoff_until_ms <= now
        ]
        if to_reset:
            for tp in to_reset:
                states[tp].awaiting_answer = True
            self.loop.spawn(self.offsets.reset_positions(to_reset))
        by_node: dict[int, list[TopicPartition]] = {}
        to_validate: dict[int, list[TopicPartition]] = {}
        next_ms: int | None = None
        max_poll_records = settings.max_poll_records
        for tp, s in states.items():
            if s.position is None or s.error is not None:
                continue
            s.observe_leader_epoch(md.leader_epoch(tp))
            validate = s.fetch_state is FetchState.AWAIT_VALIDATION
            if validate:
                if s.awaiting_answer:
                    continue
            elif not s.fetchable(max_poll_records):
                continue
            if s.backoff_until_ms > now:
                wait = s.backoff_until_ms - now
                next_ms = wait if next_ms is None else min(next_ms, wait)
                continue
            # A position is validated on the leader; records may come from a follower.
            node = md.leader_for(tp) if validate else self.fetch_target(s)
            if node is None:
                md.request_update()
                retry = settings.retry_backoff_ms
                next_ms = retry if next_ms is None else min(next_ms, retry)
                continue
            if validate:
                to_validate.setdefault(node, []).append(tp)
            elif node not in self._node_busy:
                by_node.setdefault(node, []).append(tp)
        for node, tps in to_validate.items():
            for tp in tps:
                states[tp].awaiting_answer = True
            self.loop.spawn(self.offsets.validate_positions(node, tps))
        for node, tps in by_node.items():
            self._node_busy.add(node)
            for tp in tps:
                states[tp].in_flight = True
            generations = {tp: states[tp].generation for tp in tps}
            self.loop.spawn(self._fetch(node, tps, generations))
        if md.update_requested:
            retry = settings.retry_backoff_ms
            next_ms = retry if next_ms is None else min(next_ms, retry)
        return next_ms

    def fetch_target(self, state: PartitionState) -> int | None:
        md = self.cluster.metadata
        if state.read_replica is not None and state.read_replica in md.brokers:
            return state.read_replica
        return md.read_replica_for(state.tp, self.settings.client_rack)

    def fetchable(self, state: PartitionState) -> bool:
        return state.fetchable(self.settings.max_poll_records)

    # -- Fetch ---------------------------------------------------------------------------------

    async def _fetch(
        self,
        node: int,
        tps: list[TopicPartition],
        generations: dict[TopicPartition, int] | None = None,
    ) -> None:
        """Fetch `tps` from `node`. `generations`: each partition's generation when the fetch
        was scheduled; a partition moved since (seek, seek_to_beginning, a reset) before this
        task started is left out, as one unassigned meanwhile is."""
        md = self.cluster.metadata
        settings = self.settings
        states = self.subscriptions.states
        try:
            # Everything from here on is inside the try whose `finally` clears the node's busy
            # mark: a partition unassigned between scheduling this fetch and its start used to
            # raise KeyError here, leaving the node busy and never fetched from again. A
            # partition sought in that gap used to be fetched from its new fetch offset while
            # it awaited its reset, and the answer was buffered: the reset's answer then kept
            # those records, and the fetch from the reset position delivered them a second
            # time (found by `minibroker verify` on a TLS cluster: the final read saw every
            # record of a partition twice).
            sent = {
                tp: (states[tp].generation, states[tp].fetch_offset)
                for tp in tps
                if tp in states
                and states[tp].fetch_state is FetchState.FETCHING
                and (generations is None or states[tp].generation == generations.get(tp))
            }
            if not sent:
                return
            # KIP-227: the node's fetch session names only what changed since the last
            # request; the partitions left out this round are forgotten until fetchable again.
            session = self._sessions.get(node)
            if session is None:
                session = self._sessions[node] = FetchSessionHandler(node)
            data = session.build(
                {
                    tp: FetchTarget(tp, md.leader_epoch(tp), offset)
                    for tp, (_, offset) in sent.items()
                }
            )
            request = fetch_request(
                data.to_send.values(),
                max_wait_ms=settings.fetch_max_wait_ms,
                min_bytes=settings.fetch_min_bytes,
                max_bytes=settings.fetch_max_bytes,
                partition_max_bytes=settings.max_partition_fetch_bytes,
                rack_id=settings.client_rack,
                session_id=data.session_id,
                session_epoch=data.epoch,
                forgotten=data.to_forget,
            )
            address = md.address(node) or f"node {node}"
            leader_of = {tp: md.leader_for(tp) for tp in sent}
            try:
                timeout_s = (settings.fetch_max_wait_ms + settings.request_timeout_ms) / 1000
                resp = await call(self.cluster.fetch(address, request, timeout_s), address)
            except CallFailed:
                # The broker is down or slow: find the leader again and back off these
                # partitions (the next metadata may name another broker). The broker may or
                # may not have taken the request: its session starts over.
                session.handle_error()
                md.request_update()
                for tp in tps:
                    state = states.get(tp)
                    if state is not None:
                        state.read_replica = None
                        state.backoff_until_ms = now_ms() + settings.retry_backoff_ms
                return
            answered = list(fetched_partitions(resp))
            if not session.handle_response(
                data, ErrorCode(resp.error_code), resp.session_id, [p.tp for p in answered]
            ):
                # A session error or an answer that does not match the session: nothing of it
                # is used, and the next request to the node is a full one.
                if resp.error_code not in SESSION_ERRORS:
                    for tp in tps:
                        state = states.get(tp)
                        if state is not None:
                            state.backoff_until_ms = now_ms() + settings.retry_backoff_ms
                return
            for p in answered:
                state = states.get(p.tp)
                if state is None or p.tp not in sent or state.generation != sent[p.tp][0]:
                    continue  # unassigned or sought while the fetch was out
                self.handle_partition(state, p, node, leader_of.get(p.tp))
        finally:
            self._node_busy.discard(node)
            for tp in tps:
                state = states.get(tp)
                if state is not None:
                    state.in_flight = False
            self.loop.wake()

    def handle_partition(
        self, state: PartitionState, p: FetchedPartition, node: int, leader: int | None
    ) -> None:
        code = p.error_code
        tp = state.tp
        if code == ErrorCode.NONE:
            if p.high_watermark >= 0:
                state.high_watermark = p.high_watermark
            if p.preferred_read_replica >= 0:
                state.read_replica = p.preferred_read_replica
            if p.records:
                try:
                    if decode_into(state, p.records, self.decode_limit(tp.topic)):
                        self._on_data()
                except CorruptRecordError as err:
                    state.error = err
                    self._on_data()
            return
        from_follower = leader is not None and node != leader
        state.read_replica = None
        if code == ErrorCode.OFFSET_OUT_OF_RANGE and from_follower:
            # KIP-392: a follower may lag; ask the leader before resetting anything.
            return
        if code == ErrorCode.OFFSET_OUT_OF_RANGE:
            strategy = self.subscriptions.default_reset
            if strategy is None:
                state.error = OffsetOutOfRangeError(
                    f"fetch offset {state.fetch_offset} of {tp} is out of range "
                    f"(high watermark {p.high_watermark}, log start {p.log_start_offset}); "
                    "seek() to a valid offset or use auto_offset_reset='earliest'/'latest'"
                )
                self._on_data()
            else:
                state.reset_to(strategy)
                self.loop.wake()
            return
        log.debug(
            "fetch_error tp=%s node=%d fetch_offset=%d error_code=%d",
            tp,
            node,
            state.fetch_offset,
            code,
        )
        if code in _REFRESH_AND_RETRY:
            refresh_and_back_off(
                self.cluster, state, code, now_ms() + self.settings.retry_backoff_ms
            )
            return
        state.error = error_for(code, p.error_message or f"fetch {tp} failed")
        self._on_data()

    def decode_limit(self, topic: str) -> int:
        """The most one batch of `topic` may decompress to, and about the most one response's
        batches of a partition are decoded to before the rest waits for the next fetch.

        The leader's own limit, 64 x the topic's max.message.bytes (at least its 1 MiB
        default), so every batch a leader accepts decodes here; fetch sizes bound compressed
        bytes only, and a few KiB of them may be gigabytes of records. A broker-wide
        message.max.bytes is not in the metadata: `max_partition_fetch_bytes` counts as a
        max.message.bytes too, for consumers of such topics to raise.
        """
        info = self.cluster.metadata.topics.get(topic)
        text = info.configs.get("max.message.bytes") if info is not None else None
        try:
            topic_limit = int(text) if text else 0
        except ValueError:  # metadata is untrusted input: a garbage config counts as unset
            topic_limit = 0
        return uncompressed_limit(max(topic_limit, self.settings.max_partition_fetch_bytes))


__all__ = ["Fetcher"]
