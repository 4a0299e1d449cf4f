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
from typing import TYPE_CHECKING

from minibroker.broker import wire
from minibroker.broker.purgatory import PurgatoryFullError
from minibroker.broker.replication.events import FetchPosition, FetchResponse, FollowerFetch
from minibroker.broker.replication.quota import select_fetch_partitions
from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.errors import ErrorCode
from minibroker.client.types import TopicPartition

if TYPE_CHECKING:
    from minibroker.broker.replicas.manager import ReplicaManager

FULL_PURGATORY_RECHECK_S = 0.05


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

    # -- fetch requests -------------------------------------------------------------------

    async def fetch(self, params: wire.FetchParams) -> list[wire.FetchPartitionResult]:
        rm = self._rm
        rm.metrics.fetch_requests.inc()
        deadline = time.monotonic() + max(params.max_wait_ms, 0) / 1000.0
        keys = [TopicPartition(p.topic, p.partition) for p in params.partitions]
        while True:
            results = [self._fetch_one(params, p) for p in params.partitions]
            total = sum(len(r.records) for r in results)
            enough = total >= max(params.min_bytes, 1) or any(
                r.error != ErrorCode.NONE
                or r.diverging_epoch is not None
                or r.preferred_read_replica >= 0
                for r in results
            )
            remaining = deadline - time.monotonic()
            if enough or remaining <= 0:
                break
            signals = rm.fetch_signals if params.is_follower else rm.hw_signals
            try:
                await signals.wait_any(keys, remaining)
            except PurgatoryFullError:
                # No room to park: look again shortly instead of answering at once, which
                # would have the fetcher ask again at once (a busy loop on both ends).
                await asyncio.sleep(min(remaining, FULL_PURGATORY_RECHECK_S))
        out_bytes = sum(len(r.records) for r in results)
        if params.is_follower:
            rm.metrics.replication_bytes_out.inc(out_bytes)
        else:
            rm.metrics.bytes_out.inc(out_bytes)
        return results

    def _fetch_one(
        self, params: wire.FetchParams, req: wire.FetchPartitionRequest
    ) -> wire.FetchPartitionResult:
        engine = self._rm.engine
        tp = TopicPartition(req.topic, req.partition)
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
