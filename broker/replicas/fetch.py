"""Fetch: consumer and follower long polls, offset lookups, and the follower's fetch plumbing.

I/O shell (event-loop thread). What a fetch may read, and where a follower fetches from next,
are the engine's decisions (`follower_fetch`, `consumer_fetch`, `next_fetch`,
`on_fetch_response`); here are the long-poll waits (the two signals a fetch parks on) and the
`FollowerHost` side of broker/fetcher.py, which matches each leader answer to the request it
answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from minibroker.broker import wire
from minibroker.broker.fetch_session import FetchContext, FetchMetadata, FetchSessionCache
from minibroker.broker.purgatory import PurgatoryFullError
from minibroker.broker.replication.events import FetchPosition, FetchResponse, FollowerFetch
from minibroker.broker.replication.quota import select_fetch_partitions
from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.errors import ErrorCode
from minibroker.client.types import TopicPartition

if TYPE_CHECKING:
    from minibroker.broker.replicas.manager import ReplicaManager

FULL_PURGATORY_RECHECK_S = 0.05
# Kafka's MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS: a session younger than this is evicted only
# by a follower's (privileged) one, or when it has not been used for this long.
SESSION_EVICTION_MS = 120_000


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    """A Fetch answer: its session (0 = none), top-level error, and the partitions it carries."""

    session_id: int
    error: ErrorCode
    partitions: list[wire.FetchPartitionResult]


def _enough(params: wire.FetchParams, results: Iterable[wire.FetchPartitionResult]) -> bool:
    """A long poll answers now: min_bytes of records, or a partition the client must act on."""
    total = 0
    for r in results:
        if r.error != ErrorCode.NONE or r.diverging_epoch is not None:
            return True
        if r.preferred_read_replica >= 0:
            return True
        total += len(r.records)
    return total >= max(params.min_bytes, 1)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class FetchHandler:
    """Fetch requests, and the follower fetch state fetcher.py reads (`FollowerHost`)."""

    def __init__(self, rm: ReplicaManager) -> None:
        self._rm = rm
        self.broker_id = rm.broker_id
        # The request handed to the fetcher per partition, with the position it asks from: an
        # answer is applied only when the fetcher hands back this very object, so a late
        # answer to an older request (a stopping fetcher's, or one from before the position
        # was re-planned) is dropped.
        self._asked: dict[TopicPartition, tuple[wire.FetchPartitionRequest, FetchPosition]] = {}
        # KIP-227 fetch sessions, and the incremental fetches parked on them, by session id.
        self.sessions = FetchSessionCache(
            rm.config["max.incremental.fetch.session.cache.slots"], SESSION_EVICTION_MS
        )
        self._waiting: dict[int, set[asyncio.Future[None]]] = {}
        self._parked = 0
        self._park_capacity = rm.config["queued.max.requests"]

    # -- fetch requests -------------------------------------------------------------------

    async def fetch(
        self,
        params: wire.FetchParams,
        *,
        owner: Hashable = None,
        topic_allowed: Callable[[str], bool] | None = None,
    ) -> FetchAnswer:
        """One Fetch request, full or incremental (KIP-227, broker/fetch_session.py).

        `owner` is who the call is from (a session answers only its maker); `topic_allowed`,
        when an authorizer is on, is asked again for every partition read, remembered ones too.
        """
        rm = self._rm
        metrics = rm.metrics
        kind = "follower" if params.is_follower else "consumer"
        metrics.fetch_requests.inc()
        metrics.fetch_request_partitions.labels(kind).inc(
            len(params.partitions) + len(params.forgotten)
        )
        context = self.sessions.new_context(
            FetchMetadata(params.session_id, params.session_epoch),
            privileged=params.is_follower,
            owner=owner,
            to_send=params.partitions,
            to_forget=params.forgotten,
            now_ms=wall_clock_ms(),
        )
        if context.kind == "error":
            metrics.fetch_session_errors.labels(str(int(context.error))).inc()
            return FetchAnswer(0, context.error, [])
        if context.kind == "incremental":
            results = await self._incremental(params, context, kind, topic_allowed)
        else:
            if context.kind == "full":
                metrics.fetch_session_full_requests.labels(kind).inc()
            metrics.fetch_partitions_evaluated.labels(kind).inc(len(params.partitions))
            results = await self._long_poll(params, params.partitions, topic_allowed)
        session_id, error, sent = context.respond(results, wall_clock_ms())
        if params.is_follower and session_id:
            self._keep_looking_at_lagging(params.replica_id, session_id, results)
        metrics.fetch_response_partitions.labels(kind).inc(len(sent))
        out_bytes = sum(len(r.records) for r in sent)
        if params.is_follower:
            metrics.replication_bytes_out.inc(out_bytes)
        else:
            metrics.bytes_out.inc(out_bytes)
        return FetchAnswer(session_id, error, sent)

    def _keep_looking_at_lagging(
        self, replica_id: int, session_id: int, results: list[wire.FetchPartitionResult]
    ) -> None:
        """A follower outside a partition's ISR joins it on a fetch that finds it caught up
        *and* eligible (its broker unfenced, no ISR change in flight, KIP-320's epoch start
        reached): conditions that change without the partition changing. Its session reads
        such a partition on every request, as Kafka reads every session partition, until the
        follower is in the ISR; in-sync partitions stay implied."""
        session = self.sessions.get(session_id)
        if session is None:
            return
        engine = self._rm.engine
        partitions, dirty = session.partitions, session.dirty
        for r in results:
            tp = TopicPartition(r.topic, r.partition)
            if tp in partitions and engine.follower_out_of_sync(tp, replica_id):
                dirty.add(tp)

    async def _long_poll(
        self,
        params: wire.FetchParams,
        partitions: Sequence[wire.FetchPartitionRequest],
        topic_allowed: Callable[[str], bool] | None,
    ) -> list[wire.FetchPartitionResult]:
        """A sessionless or full fetch: every partition read on every wake."""
        rm = self._rm
        deadline = time.monotonic() + max(params.max_wait_ms, 0) / 1000.0
        keys = [TopicPartition(p.topic, p.partition) for p in partitions]
        while True:
            results = [self._fetch_one(params, p, topic_allowed) for p in partitions]
            remaining = deadline - time.monotonic()
            if _enough(params, results) or remaining <= 0:
                return results
            signals = rm.fetch_signals if params.is_follower else rm.hw_signals
            try:
                await signals.wait_any(keys, remaining)
            except PurgatoryFullError:
                # No room to park: look again shortly instead of answering at once, which
                # would have the fetcher ask again at once (a busy loop on both ends).
                await asyncio.sleep(min(remaining, FULL_PURGATORY_RECHECK_S))

    async def _incremental(
        self,
        params: wire.FetchParams,
        context: FetchContext,
        kind: str,
        topic_allowed: Callable[[str], bool] | None,
    ) -> list[wire.FetchPartitionResult]:
        """An incremental fetch reads only what it names and what changed since the session's
        last read (`changed`); an idle partition costs nothing per poll."""
        session = context.session
        assert session is not None
        evaluated = self._rm.metrics.fetch_partitions_evaluated.labels(kind)
        deadline = time.monotonic() + max(params.max_wait_ms, 0) / 1000.0
        latest: dict[tuple[str, int], wire.FetchPartitionResult] = {}
        asked = context.to_evaluate()
        while True:
            evaluated.inc(len(asked))
            for req in asked:
                latest[(req.topic, req.partition)] = self._fetch_one(params, req, topic_allowed)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or _enough(params, latest.values()):
                break
            if not session.dirty:
                try:
                    await self._park(session.id, remaining)
                except PurgatoryFullError:
                    await asyncio.sleep(min(remaining, FULL_PURGATORY_RECHECK_S))
            asked = context.take_dirty()
        return list(latest.values())

    async def _park(self, session_id: int, timeout_s: float) -> None:
        """Wait until a partition of the session changes (`changed`) or the timeout passes."""
        if self._parked >= self._park_capacity:
            raise PurgatoryFullError(f"{self._parked} fetch requests are already waiting")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiting = self._waiting.setdefault(session_id, set())
        waiting.add(future)
        self._parked += 1
        timer = loop.call_later(timeout_s, _settle, future)
        try:
            await future
        finally:
            timer.cancel()
            self._parked -= 1
            waiting.discard(future)
            if not waiting and self._waiting.get(session_id) is waiting:
                del self._waiting[session_id]

    @property
    def parked(self) -> int:
        """Incremental fetches parked on their sessions now."""
        return self._parked

    def changed(self, tp: TopicPartition) -> None:
        """Something a fetch of `tp` would answer differently changed (data, HW, log start,
        leadership, an error): the sessions holding it read it on their next look.

        A follower session where `tp` was clean until now carried it unchanged in its last
        request: as far as the leader's lag rule goes, the follower fetched it then, caught
        up (Kafka reads every session partition on every request). That is recorded before
        the change is, so an idle partition's first new record does not find its followers
        stale and shrink the ISR before their next request reads it."""
        engine = self._rm.engine
        for session in self.sessions.mark_dirty(tp):
            if session.privileged:
                replica_id = session.owner[0]  # type: ignore[index]
                engine.implied_fetch(tp, replica_id, session.last_used_ms)
            for future in self._waiting.get(session.id, ()):
                _settle(future)

    def _fetch_one(
        self,
        params: wire.FetchParams,
        req: wire.FetchPartitionRequest,
        topic_allowed: Callable[[str], bool] | None = None,
    ) -> wire.FetchPartitionResult:
        engine = self._rm.engine
        tp = TopicPartition(req.topic, req.partition)
        if topic_allowed is not None and not topic_allowed(req.topic):
            return wire.FetchPartitionResult(
                req.topic,
                req.partition,
                ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                f"not authorized to read topic {req.topic!r}",
            )
        max_bytes = engine.fetch_max_bytes(req.max_bytes)
        if params.is_follower:
            fetch = FollowerFetch(
                replica_id=params.replica_id,
                broker_epoch=params.replica_epoch,
                current_leader_epoch=req.current_leader_epoch,
                fetch_offset=req.fetch_offset,
                last_fetched_epoch=req.last_fetched_epoch,
                log_start_offset=req.log_start_offset,
            )
            reply, outputs = engine.follower_fetch(tp, fetch, max_bytes, wall_clock_ms())
        else:
            reply, outputs = engine.consumer_fetch(
                tp, req.current_leader_epoch, req.fetch_offset, max_bytes, params.rack_id
            )
        self._rm.run(outputs)
        return wire.FetchPartitionResult(
            req.topic,
            req.partition,
            reply.error,
            reply.message,
            reply.high_watermark,
            reply.log_start_offset,
            reply.log_end_offset,
            reply.diverging_epoch,
            reply.current_leader,
            reply.preferred_read_replica,
            reply.records,
        )

    def list_offsets(
        self, partitions: list[wire.ListOffsetsPartition]
    ) -> list[wire.ListOffsetsResult]:
        results = []
        for req in partitions:
            tp = TopicPartition(req.topic, req.partition)
            reply, outputs = self._rm.engine.list_offsets(
                tp, req.current_leader_epoch, req.timestamp
            )
            self._rm.run(outputs)
            results.append(
                wire.ListOffsetsResult(
                    req.topic,
                    req.partition,
                    reply.error,
                    reply.message,
                    reply.timestamp,
                    reply.offset,
                    reply.leader_epoch,
                )
            )
        return results

    def offset_for_leader_epoch(
        self, partitions: list[wire.OffsetForLeaderPartition]
    ) -> list[wire.EpochEndOffsetResult]:
        results = []
        for req in partitions:
            tp = TopicPartition(req.topic, req.partition)
            reply, outputs = self._rm.engine.offset_for_leader_epoch(
                tp, req.current_leader_epoch, req.leader_epoch
            )
            self._rm.run(outputs)
            results.append(
                wire.EpochEndOffsetResult(
                    req.topic,
                    req.partition,
                    reply.error,
                    reply.message,
                    reply.leader_epoch,
                    reply.end_offset,
                )
            )
        return results

    # -- the follower side (FollowerHost for fetcher.py) --------------------------------

    def broker_epoch(self) -> int:
        return self._rm.broker_epoch()

    def asked(self, tp: TopicPartition) -> wire.FetchPartitionRequest | None:
        """The request the fetcher was last handed for `tp` and whose answer is awaited."""
        entry = self._asked.get(tp)
        return None if entry is None else entry[0]

    def forget(self, tp: TopicPartition) -> None:
        self._asked.pop(tp, None)

    def throttling(self) -> bool:
        """A follower quota is set here (KIP-73): `throttle_fetch` may leave partitions out."""
        return not self._rm.engine.follower_quota.unlimited

    def throttle_fetch(
        self, partitions: list[TopicPartition], cursor: int
    ) -> tuple[list[TopicPartition], int]:
        """The partitions a follower fetch asks for (KIP-73, quota.select_fetch_partitions):
        the throttled ones are left out while this follower's quota is exceeded."""
        engine = self._rm.engine
        throttled = {tp for tp in partitions if engine.follower_throttled(tp)}
        if not throttled:
            return partitions, cursor
        exceeded = engine.follower_quota.is_exceeded(wall_clock_ms())
        asked, left_out, cursor = select_fetch_partitions(partitions, throttled, exceeded, cursor)
        if exceeded:
            engine.follower_quota.note_throttled(len(left_out))
        return asked, cursor

    def follower_fetch_state(
        self, tp: TopicPartition, leader_id: int
    ) -> wire.FetchPartitionRequest | None:
        position = self._rm.engine.next_fetch(tp, leader_id, wall_clock_ms())
        if position is None:
            self._asked.pop(tp, None)
            return None
        sent = wire.FetchPartitionRequest(
            topic=tp.topic,
            partition=tp.partition,
            current_leader_epoch=position.current_leader_epoch,
            fetch_offset=position.fetch_offset,
            last_fetched_epoch=position.last_fetched_epoch,
            log_start_offset=position.log_start_offset,
            max_bytes=self._rm.config["replica.fetch.max.bytes"],
        )
        self._asked[tp] = (sent, position)
        return sent

    async def apply_follower_fetch(
        self,
        leader_id: int,
        sent: wire.FetchPartitionRequest,
        result: wire.FetchPartitionResult,
    ) -> None:
        """Apply the leader's answer to `sent` (what `follower_fetch_state` returned for it)."""
        tp = TopicPartition(result.topic, result.partition)
        entry = self._asked.get(tp)
        if entry is None or entry[0] is not sent:
            return
        position = entry[1]
        if position.leader_id == leader_id:
            del self._asked[tp]
        response = FetchResponse(
            error=result.error,
            high_watermark=result.high_watermark,
            log_start_offset=result.log_start_offset,
            log_end_offset=result.log_end_offset,
            diverging_epoch=result.diverging_epoch,
            records=result.records,
        )
        self._rm.run(
            self._rm.engine.on_fetch_response(tp, leader_id, position, response, wall_clock_ms())
        )
