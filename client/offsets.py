"""The consumer's offset requests (Kafka's OffsetFetcher): ListOffsets, resets, validation.

Does network I/O through `ClusterClient` (requests and answers go through wire.py).
`list_offsets` asks each partition's leader, retrying retriable errors (a new leader's
OFFSET_NOT_AVAILABLE included, KIP-207) until default_api_timeout_ms; `first_at_or_after` turns
the broker's batch-granular offsets_for_times answer into the exact record; `reset_positions`
moves partitions in AWAIT_RESET to the earliest or latest offset; `validate_positions` sends
OffsetForLeaderEpoch after a leader change (KIP-320). An answer for a partition whose state moved
on meanwhile (seek, another leader epoch: a new generation) is ignored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from minibroker.client.batch import CorruptRecordError
from minibroker.client.errors import (
    ErrorCode,
    MiniBrokerError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
    error_for,
)
from minibroker.client.records import iter_decoded_batches
from minibroker.client.subscription import PartitionState, SubscriptionState, Validation
from minibroker.client.transport import ClusterClient, now_ms
from minibroker.client.types import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, TopicPartition
from minibroker.client.wire import (
    CallFailed,
    FetchTarget,
    OffsetAnswer,
    call,
    epoch_end_answers,
    fetch_request,
    fetched_partitions,
    list_offsets_request,
    list_offsets_results,
    offset_for_leader_epoch_request,
)

log = logging.getLogger("minibroker.client.consumer")


class ConsumerSettings(Protocol):
    """The consumer settings the fetcher and the offset requests read (AsyncConsumer's)."""

    client_rack: str
    fetch_max_wait_ms: int
    fetch_min_bytes: int
    fetch_max_bytes: int
    max_partition_fetch_bytes: int
    max_poll_records: int
    request_timeout_ms: int
    retry_backoff_ms: int
    default_api_timeout_ms: int
    max_block_ms: int


def refresh_and_back_off(
    cluster: ClusterClient, state: PartitionState, code: int, retry_at_ms: int
) -> None:
    """A retriable partition error: look for the leader again (forgetting it when it said it no
    longer leads, or leads in a newer epoch) and retry at `retry_at_ms`."""
    if code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH):
        cluster.metadata.mark_leader_unknown(state.tp)
    else:
        cluster.metadata.request_update()
    state.backoff_until_ms = retry_at_ms


class OffsetFetcher:
    """ListOffsets and OffsetForLeaderEpoch for one consumer."""

    def __init__(
        self,
        settings: ConsumerSettings,
        cluster: ClusterClient,
        subscriptions: SubscriptionState,
        decode_limit: Callable[[str], int],
        on_change: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.cluster = cluster
        self.subscriptions = subscriptions
        self._decode_limit = decode_limit
        # Called after every answer: poll() may have records or an error, the loop work to do.
        self._on_change = on_change

    # -- ListOffsets ---------------------------------------------------------------------------

    async def list_offsets(
        self, targets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAnswer]:
        """ListOffsets on each partition's leader, retrying retriable errors until
        default_api_timeout_ms: (offset, timestamp, leader epoch) per partition."""
        pending = dict(targets)
        for tp in pending:
            info = await self.cluster.wait_for_topic(tp.topic, self.settings.max_block_ms)
            if tp.partition not in info.partitions:
                raise UnknownTopicOrPartitionError(
                    f"topic {tp.topic!r} has {info.num_partitions} partitions; "
                    f"partition {tp.partition} does not exist"
                )
        md = self.cluster.metadata
        out: dict[TopicPartition, OffsetAnswer] = {}
        deadline = now_ms() + self.settings.default_api_timeout_ms
        last: MiniBrokerError | None = None
        while pending:
            if now_ms() >= deadline:
                raise last or RequestTimedOutError("ListOffsets did not finish in time")
            by_node: dict[int, list[TopicPartition]] = {}
            for tp in pending:
                leader = md.leader_for(tp)
                if leader is None:
                    md.request_update()
                else:
                    by_node.setdefault(leader, []).append(tp)
            calls = [self._list_offsets_on(node, tps, pending) for node, tps in by_node.items()]
            for result in await asyncio.gather(*calls):
                for tp, value in result.items():
                    if isinstance(value, MiniBrokerError):
                        if not value.retriable:
                            raise value
                        last = value
                        md.mark_leader_unknown(tp)
                    else:
                        out[tp] = value
                        pending.pop(tp, None)
            if pending:
                await asyncio.sleep(self.settings.retry_backoff_ms / 1000)
                await self.cluster.maybe_refresh_metadata()
        return out

    async def _list_offsets_on(
        self, node: int, tps: list[TopicPartition], targets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAnswer | MiniBrokerError]:
        md = self.cluster.metadata
        request = list_offsets_request(
            {tp: targets[tp] for tp in tps}, {tp: md.leader_epoch(tp) for tp in tps}
        )
        address = md.address(node) or f"node {node}"
        try:
            resp = await call(
                self.cluster.broker_stub(address).ListOffsets(
                    request, timeout=self.settings.request_timeout_ms / 1000
                ),
                address,
            )
        except CallFailed as failed:
            return dict.fromkeys(tps, failed.error)
        return list_offsets_results(resp)

    async def first_at_or_after(
        self, tp: TopicPartition, target_ms: int, fallback: tuple[int, int]
    ) -> tuple[int, int]:
        """The first record at or after the broker's answer `fallback` = (offset, timestamp)
        with timestamp >= `target_ms`, read from the leader; `fallback` if it cannot be read."""
        md = self.cluster.metadata
        leader = md.leader_for(tp)
        offset = fallback[0]
        if leader is None:
            return fallback
        settings = self.settings
        request = fetch_request(
            [FetchTarget(tp, md.leader_epoch(tp), offset)],
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=settings.max_partition_fetch_bytes,
            partition_max_bytes=settings.max_partition_fetch_bytes,
            rack_id=settings.client_rack,
        )
        address = md.address(leader) or ""
        try:
            resp = await call(
                self.cluster.broker_stub(address).Fetch(
                    request, timeout=settings.request_timeout_ms / 1000
                ),
                address,
            )
        except CallFailed:
            return fallback
        for p in fetched_partitions(resp):
            if p.error_code != ErrorCode.NONE or not p.records:
                return fallback
            try:
                batches = iter_decoded_batches(
                    p.records,
                    allow_partial_tail=True,
                    max_uncompressed_bytes=self._decode_limit(tp.topic),
                )
                for batch in batches:
                    log_append = batch.header.attributes & 0x08
                    for r in batch.records:
                        ts = batch.header.max_timestamp if log_append else r.timestamp
                        if r.offset >= offset and ts >= target_ms:
                            return (r.offset, ts)
            except CorruptRecordError:
                return fallback
        return fallback

    # -- resets --------------------------------------------------------------------------------

    async def reset_positions(self, tps: list[TopicPartition]) -> None:
        """Move each partition (in AWAIT_RESET, its answer marked awaited) to the offset its
        strategy names."""
        states = self.subscriptions.states
        generations = {tp: states[tp].generation for tp in tps if tp in states}
        targets = {
            tp: EARLIEST_TIMESTAMP if states[tp].reset == "earliest" else LATEST_TIMESTAMP
            for tp in generations
        }
        try:
            result = await self.list_offsets(targets)
        except MiniBrokerError as err:
            for tp, gen in generations.items():
                state = states.get(tp)
                if state is not None and state.generation == gen:
                    state.answer_failed(err, now_ms() + self.settings.retry_backoff_ms)
            self._on_change()
            return
        for tp, (offset, _ts, epoch) in result.items():
            state = states.get(tp)
            if state is None or state.generation != generations[tp]:
                continue
            state.reset_done(offset, epoch)
        self._on_change()

    # -- position validation after a leader change (KIP-320) -----------------------------------

    async def validate_positions(self, node: int, tps: list[TopicPartition]) -> None:
        """OffsetForLeaderEpoch on the leader `node` for the epoch of each partition's last
        consumed record."""
        md = self.cluster.metadata
        states = self.subscriptions.states
        # (A partition unassigned since the loop chose it is left out.)
        tps = [tp for tp in tps if tp in states]
        sent = {tp: states[tp].generation for tp in tps}
        request = offset_for_leader_epoch_request(
            [(tp, md.leader_epoch(tp), states[tp].position_epoch) for tp in tps]
        )
        address = md.address(node) or f"node {node}"
        answered: set[TopicPartition] = set()
        try:
            try:
                resp = await call(
                    self.cluster.broker_stub(address).OffsetForLeaderEpoch(
                        request, timeout=self.settings.request_timeout_ms / 1000
                    ),
                    address,
                )
            except CallFailed:
                md.request_update()
                return
            for p in epoch_end_answers(resp):
                state = states.get(p.tp)
                if state is None or p.tp not in sent or state.generation != sent[p.tp]:
                    continue
                answered.add(p.tp)
                state.awaiting_answer = False
                if p.error_code == ErrorCode.NONE:
                    self.complete_validation(state, p.leader_epoch, p.end_offset)
                    continue
                err = error_for(p.error_code, p.error_message or f"validate {p.tp}")
                if not err.retriable:
                    state.error = err
                    continue
                retry_at = now_ms() + self.settings.retry_backoff_ms
                refresh_and_back_off(self.cluster, state, p.error_code, retry_at)
        finally:
            for tp, generation in sent.items():
                state = states.get(tp)
                if state is not None and state.generation == generation and tp not in answered:
                    state.awaiting_answer = False
                    state.backoff_until_ms = now_ms() + self.settings.retry_backoff_ms
            self._on_change()

    def complete_validation(
        self, state: PartitionState, leader_epoch: int, end_offset: int
    ) -> None:
        position = state.position
        outcome, divergent = state.complete_validation(
            leader_epoch, end_offset, self.subscriptions.default_reset
        )
        if outcome is Validation.TRUNCATED_RESET:
            log.warning(
                "truncation detected for %s at offset %d; resetting to %s",
                state.tp,
                position,
                state.reset,
            )
        elif outcome is Validation.TRUNCATED_SEEK:
            log.warning(
                "truncation detected for %s at offset %d; resetting to the first offset known "
                "to diverge, %d",
                state.tp,
                position,
                divergent,
            )


__all__ = ["ConsumerSettings", "OffsetFetcher", "refresh_and_back_off"]
