"""The producer's sender (Kafka's Sender): one loop task that turns ready batches into requests.

Does network I/O through `ClusterClient` (requests and answers go through wire.py). The loop (a
WakeableLoop) expires batches past `delivery_timeout_ms`, takes a producer id when idempotent
(InitProducerId), and drains ready batches grouped by leader broker into ONE ProduceRequest per
broker (up to `max_request_size`), with up to `max_in_flight` requests in flight per broker and
at most one batch in flight per partition (see accumulator.py for why that keeps order on retry).
Ready partitions whose leader has all its requests out are set aside in the accumulator until
one of those requests ends, so a pass does not look at each of them again.

Answers: DUPLICATE_SEQUENCE_NUMBER counts as success (the broker already has the batch); a batch
of several records refused with MESSAGE_TOO_LARGE is split in halves and sent again (Kafka's
splitAndReenqueue); retriable errors (errors.RETRIABLE, gRPC UNAVAILABLE / DEADLINE_EXCEEDED)
refresh metadata, back off `retry_backoff_ms` and retry until `delivery_timeout_ms`. A batch that
fails for good after it got a sequence number leaves a gap, so the producer then takes a new
producer id (Kafka bumps the epoch for the same reason).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from minibroker.client.accumulator import ProducerBatch, RecordAccumulator
from minibroker.client.batch import NO_SEQUENCE, Compression
from minibroker.client.errors import (
    REFUSALS,
    ErrorCode,
    MessageTooLargeError,
    MiniBrokerError,
    NetworkExceptionError,
    RequestTimedOutError,
    UnknownServerError,
    error_for,
)
from minibroker.client.producer_record import INT32_MAX
from minibroker.client.records import BatchBuilder, decode_batch
from minibroker.client.transport import (
    INVALID_METADATA_ERRORS,
    ClientClosedError,
    ClusterClient,
    now_ms,
)
from minibroker.client.types import TopicPartition
from minibroker.client.wakeable import STOP, Stop, WakeableLoop
from minibroker.client.wire import (
    CallFailed,
    call,
    init_producer_id_request,
    produce_request,
    produce_results,
    producer_id_answer,
)

# A library logs through the standard library and stays silent unless the application configures
# logging. Everything is DEBUG: a failed record's error reaches the caller through its future.
log = logging.getLogger("minibroker.client.producer")

# How often the sender asks for metadata while a partition's leader is unreachable.
_NEW_LEADER_POLL_MS = 20


class ProducerSettings(Protocol):
    """The producer settings the sender reads (AsyncProducer's)."""

    acks: int
    idempotent: bool
    compression: Compression
    max_in_flight: int
    retries: int
    request_timeout_ms: int
    delivery_timeout_ms: int
    retry_backoff_ms: int
    max_request_size: int


class Sender:
    """The send loop of one producer."""

    def __init__(
        self,
        settings: ProducerSettings,
        cluster: ClusterClient,
        accumulator: RecordAccumulator,
        on_space: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.cluster = cluster
        self.accumulator = accumulator
        self._on_space = on_space  # a batch left the buffer: send() may be waiting for room
        self.loop = WakeableLoop(
            "minibroker-producer", self._step, self._crashed, cluster, settings.retry_backoff_ms
        )
        self.need_producer_id = settings.idempotent
        # An error every later send() fails with: the sender crashed, or the cluster refused
        # this producer an id for good.
        self.fatal: MiniBrokerError | None = None
        self._in_flight: dict[int, int] = {}
        # Per broker with max_in_flight requests out, the ready partitions it leads that the
        # accumulator set aside: looked at again when one of those requests ends.
        self._waiting: dict[int, list[TopicPartition]] = {}
        # The metadata they were set aside under: a refresh may name other leaders for them.
        self._waiting_version = -1
        # Brokers a request just failed to reach, until when: their partitions wait for the
        # metadata to name another leader (or for the time to pass) instead of sending again to
        # a broker that is likely dead.
        self._unreachable: dict[int, int] = {}

    def _crashed(self, err: Exception) -> None:
        # A bug must not leave callers waiting forever: fail everything, refuse new sends.
        self.fatal = UnknownServerError(f"the producer's sender task failed: {err!r}")
        self.fail_everything(self.fatal)

    def fail_everything(self, err: BaseException, *, close: bool = False) -> None:
        """Fail every batch not yet acknowledged, queued or in flight; with `close`, refuse
        every later append too (atomically, so no record is left behind unsent)."""
        acc = self.accumulator
        queued = acc.close_and_abort() if close else acc.abort_all()
        for batch in queued + acc.in_flight():
            acc.fail(batch)
            batch.result.fail(err)

    # -- the loop ------------------------------------------------------------------------------

    async def _step(self) -> int | Stop | None:
        """One pass: expire, take a producer id, send what is ready; returns how long to sleep
        unless woken (STOP once closing with nothing left)."""
        acc = self.accumulator
        md = self.cluster.metadata
        settings = self.settings
        now = now_ms()
        for batch in acc.expire(now, settings.delivery_timeout_ms):
            self.finish_failed(
                batch,
                RequestTimedOutError(
                    f"{batch.record_count} record(s) for {batch.tp} expired after "
                    f"delivery_timeout_ms ({settings.delivery_timeout_ms}) without being "
                    "acknowledged"
                ),
            )
        if acc.closing and not acc.has_incomplete():
            return STOP
        self.loop.refresh_metadata_if_due(now)
        if self.need_producer_id and settings.idempotent and not await self._init_producer_id():
            return settings.retry_backoff_ms
        if self._waiting and md.version != self._waiting_version:
            # New metadata: a partition set aside under a broker that may be dead (its requests
            # end only at their deadline) may have another leader now.
            for tps in self._waiting.values():
                acc.look_again(tps)
            self._waiting.clear()
        self._waiting_version = md.version
        ready, next_ms = acc.ready(now)
        by_node: dict[int, list[TopicPartition]] = {}
        set_aside: list[TopicPartition] = []
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
            if self._in_flight.get(leader, 0) >= settings.max_in_flight:
                full = self._waiting.get(leader)
                if full is None:
                    full = self._waiting[leader] = []
                full.append(tp)
                set_aside.append(tp)
                continue
            by_node.setdefault(leader, []).append(tp)
        if set_aside:
            acc.set_aside(set_aside)
        if unknown_leader:
            md.request_update()
        if awaiting_new_leader and now - md.last_refresh_ms >= _NEW_LEADER_POLL_MS:
            # The controller fences a dead broker within milliseconds and elects another
            # leader; ask again soon rather than a retry backoff later.
            md.request_update()
        if by_node:
            for node, batches in acc.drain(by_node, settings.max_request_size, now).items():
                self._in_flight[node] = self._in_flight.get(node, 0) + 1
                self.loop.spawn(self._send_request(node, batches))
        wait_ms = next_ms
        if awaiting_new_leader:
            wait_ms = _NEW_LEADER_POLL_MS if wait_ms is None else min(wait_ms, _NEW_LEADER_POLL_MS)
        if unknown_leader:
            retry = settings.retry_backoff_ms
            wait_ms = retry if wait_ms is None else min(wait_ms, retry)
        return wait_ms

    def _give_up(self, err: MiniBrokerError) -> None:
        """No producer id can come (a non-retriable refusal): fail everything pending."""
        self.fatal = err
        for batch in self.accumulator.abort_all():
            self.finish_failed(batch, err)
        self.need_producer_id = False

    async def _init_producer_id(self) -> bool:
        """InitProducerId on any broker; True once the accumulator has an id."""
        request = init_producer_id_request()
        addresses = [b.address for b in self.cluster.metadata.brokers.values() if not b.fenced]
        addresses += self.cluster.bootstrap
        for addr in dict.fromkeys(addresses):
            try:
                # A short deadline: this runs inside the sender loop, which must get back to
                # expiring batches even when a broker is black-holed.
                timeout_s = min(self.settings.request_timeout_ms, 5_000) / 1000
                answer = producer_id_answer(
                    await call(
                        self.cluster.broker_stub(addr).InitProducerId(request, timeout=timeout_s),
                        addr,
                    )
                )
            except CallFailed as failed:
                if isinstance(failed.error, REFUSALS):
                    # Not authenticated / not authorized: asking again changes nothing.
                    self._give_up(failed.error)
                    return False
                continue
            if answer.error_code != ErrorCode.NONE:
                err = error_for(answer.error_code, answer.error_message)
                if not err.retriable:
                    self._give_up(err)
                    return False
                continue
            log.debug(
                "producer_id_assigned producer_id=%d epoch=%d by=%s",
                answer.producer_id,
                answer.producer_epoch,
                addr,
            )
            self.accumulator.set_producer_id(answer.producer_id, answer.producer_epoch)
            self.need_producer_id = False
            return True
        return False

    # -- Produce -------------------------------------------------------------------------------

    async def _send_request(self, node: int, batches: list[ProducerBatch]) -> None:
        settings = self.settings
        request = produce_request(
            settings.acks,
            settings.request_timeout_ms,
            [(b.tp, b.buffer) for b in batches],
        )
        address = self.cluster.metadata.address(node) or f"node {node}"
        try:
            try:
                # The broker answers acks=all by request_timeout_ms at the latest; the extra
                # second covers the network so its answer wins over our deadline.
                timeout_s = settings.request_timeout_ms / 1000 + 1
                resp = await call(self.cluster.produce(address, request, timeout_s), address)
            except CallFailed as failed:
                if failed.unreachable:
                    self._unreachable[node] = now_ms() + 2 * settings.retry_backoff_ms
                self.cluster.metadata.request_update()
                for b in batches:
                    self.on_batch_error(b, failed.error)
                return
            except ClientClosedError as closed:
                for b in batches:
                    self.finish_failed(b, closed)
                return
            results = produce_results(resp)
            for b in batches:
                result = results.get(b.tp)
                if result is None:
                    self.on_batch_error(
                        b, NetworkExceptionError(f"{address} sent no result for {b.tp}")
                    )
                elif result.error_code in (ErrorCode.NONE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER):
                    self.finish_ok(b, result.base_offset, result.log_append_time_ms)
                else:
                    self.on_batch_error(b, error_for(result.error_code, result.error_message))
        finally:
            self._in_flight[node] -= 1
            waiting = self._waiting.pop(node, None)
            if waiting:
                self.accumulator.look_again(waiting)
            self.loop.wake()

    def on_batch_error(self, batch: ProducerBatch, err: MiniBrokerError) -> None:
        now = now_ms()
        settings = self.settings
        if (
            err.code == ErrorCode.MESSAGE_TOO_LARGE
            and batch.record_count > 1
            and batch.buffer is not None
            and self.loop.running
        ):
            self._split(batch, err)
            return
        if (
            err.retriable
            and batch.attempts <= settings.retries
            and now - batch.created_ms < settings.delivery_timeout_ms
            and self.loop.running
        ):
            if err.code in INVALID_METADATA_ERRORS:
                self.cluster.metadata.mark_leader_unknown(batch.tp)
            log.debug(
                "produce_retry tp=%s attempt=%d base_sequence=%d error=%s: %s",
                batch.tp,
                batch.attempts,
                batch.base_sequence,
                type(err).__name__,
                err,
            )
            self.accumulator.retry(batch, now, settings.retry_backoff_ms)
            return
        if err.code == ErrorCode.MESSAGE_TOO_LARGE:
            err = MessageTooLargeError(
                f"the broker refused a {batch.size_bytes}-byte batch for {batch.tp} "
                f"({err}); lower batch_size or raise the topic's max.message.bytes"
            )
        elif err.retriable:
            err = type(err)(
                f"{err} (gave up on {batch.tp} after {batch.attempts} attempt(s) and "
                f"{now - batch.created_ms} ms; delivery_timeout_ms={settings.delivery_timeout_ms})"
            )
        else:
            # A final answer (INVALID_TIMESTAMP, INVALID_RECORD, ...): Kafka fails the batch at
            # once. The broker's text locates the batch in its request; say which partition.
            err = type(err)(
                f"a batch of {batch.record_count} record(s) for {batch.tp} failed: {err}"
            )
        self.finish_failed(batch, err)

    def _split(self, batch: ProducerBatch, err: MiniBrokerError) -> None:
        """MESSAGE_TOO_LARGE for a batch of several records: the topic's limit is lower than
        this producer knew (a broker-wide message.max.bytes, a config changed since the last
        metadata). As Kafka's Sender does, send it again in smaller batches, in order."""
        if batch.buffer is None:  # only a built batch is ever sent, so never; typed as such
            self.finish_failed(batch, err)
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
        return BatchBuilder(INT32_MAX, compression=self.settings.compression)

    # -- completion ----------------------------------------------------------------------------

    def finish_ok(self, batch: ProducerBatch, base_offset: int, log_append_time_ms: int) -> None:
        self.accumulator.complete(batch)
        self._on_space()
        # One completion per batch: each record's future reads its offset (base + index) and
        # timestamp from this result when asked (Kafka's ProduceRequestResult).
        batch.result.complete(base_offset if base_offset >= 0 else -1, log_append_time_ms)

    def finish_failed(self, batch: ProducerBatch, err: MiniBrokerError) -> None:
        log.debug(
            "produce_failed tp=%s records=%d attempts=%d error=%s: %s",
            batch.tp,
            batch.record_count,
            batch.attempts,
            type(err).__name__,
            err,
        )
        self.accumulator.fail(batch)
        self._on_space()
        if batch.base_sequence != NO_SEQUENCE and self.settings.idempotent:
            # This sequence range may or may not be on the broker: continuing the old id would
            # either leave a gap or collide, so start a fresh producer id (KIP-360's reason).
            self.need_producer_id = True
        batch.result.fail(err)


__all__ = ["ProducerSettings", "Sender"]
