"""The producer's record accumulator: per-partition batches, readiness, draining, retries.

Pure: no I/O; the clock and the lock are given (`clock_ms`, `lock`), so tests drive it with
their own time and no threads. The producer (`minibroker.client.producer`) appends records from
any thread (`append`, `append_sticky`, `append_values`: each returns or records the records'
futures, Kafka's tryAppend); its sender task asks which partitions are ready, drains their head
batches grouped by leader broker into one produce request per broker, and reports back with
`complete`, `retry` or `fail`. With a lock every method takes it, so appends on caller threads and
the sender on its loop never see a half-made change (Kafka's accumulator locks each partition's
deque; one lock is enough here, since a Python process runs one thread at a time anyway).

Rules (Kafka's RecordAccumulator and Sender, aiokafka's shape):
- A partition's head batch is sendable once it is full, older than `linger_ms`, or a flush or
  close is under way; a retried batch is sendable once its backoff has passed.
- `ready` costs what changed, not the number of partitions with a batch: it looks at the
  partitions something made sendable (a full batch, an answer that unmutes, a split, an expiry)
  and those whose timer has come (the head batch's linger end, a retry's backoff end); the sender
  sets aside those whose leader has all its requests out until one of them ends. A new
  batch wakes the sender (`wake_sender`) only if it is due before the sender's planned pass
  (`sender_due_ms`): sendable now, or the sender had no timer. `expire` scans the queues only
  once the oldest queued batch could be past the delivery timeout. Records sent round-robin
  over thousands of partitions open a batch per record, and each of these was a scan of every
  queue before (issue 17).
- At most one batch per partition is in flight (the partition is "muted" while it is). With
  idempotence this keeps per-partition order on retry without the broker-side reordering Kafka
  needs for five in-flight batches: a failed batch goes back to the head of its queue and is sent
  again, with the same sequence number, before any later batch of that partition. Other
  partitions of the same broker still travel in the same and in concurrent requests.
- Sequence numbers are assigned when a batch is first drained (so a batch that expires before it
  was ever sent leaves no gap), set on the builder together with the producer id and epoch before
  it is built, and kept unchanged on every retry so the broker can deduplicate.
- A batch of several records the broker refuses as too large is split in halves, which go back
  to the head of the partition with the batch's producer id and sequence range
  (`split_and_reenqueue`, Kafka's splitAndReenqueue).
- The builder (made by `new_builder`, which knows the batch size limit) decides when a batch is
  full; `batch_size` is recorded for the shell. The producer's default is 1 MiB rather than
  Kafka's 16 KiB because each gRPC call costs ~0.4 ms of CPU whatever it carries
  (docs/design.md §9); batches only grow that large when records arrive faster than
  the partition's previous batch is acknowledged.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from minibroker.client.batch import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    SEQUENCE_MODULUS,
)
from minibroker.client.errors import ClientClosedError, MessageTooLargeError
from minibroker.client.partitioner import StickyPartitioner
from minibroker.client.produce_result import FutureRecordMetadata, ProduceRequestResult
from minibroker.client.records.builder import RecordEncoder
from minibroker.client.records.encoder_choice import ByteCount
from minibroker.client.types import TopicPartition

# Per-record framing in a v2 batch is at most ~21 bytes of varints and attributes; used only for
# the early "too large" check, the builder knows the exact size.
RECORD_OVERHEAD_BYTES = 21

Headers = Sequence[tuple[str, bytes | None]]
# One record as split_and_reenqueue takes it back: (timestamp_ms, key, value, headers).
RecordInput = tuple[int, bytes | None, bytes | None, Headers]


class BatchBuilderLike(Protocol):
    """What the accumulator needs from `minibroker.client.records.BatchBuilder`."""

    @property
    def encoder(self) -> RecordEncoder: ...

    def append(self, timestamp_ms: int, key: Any, value: Any, headers: Any = (), /) -> bool: ...

    def set_producer_state(
        self, producer_id: int, producer_epoch: int, base_sequence: int
    ) -> None: ...

    def build(self) -> bytes: ...


def record_size_estimate(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    size = RECORD_OVERHEAD_BYTES + (len(key) if key else 0) + (len(value) if value else 0)
    for name, hvalue in headers:
        size += len(name) + (len(hvalue) if hvalue else 0) + 4
    return size


class _NoLock:
    """The default lock: none, for single-threaded use (the producer passes a real one)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@dataclass(eq=False, slots=True)
class ProducerBatch:
    """One batch of one partition, from first append to acknowledgement.

    `result` is the batch's one `ProduceRequestResult`: every record's future reads its outcome
    from it (the record's offset is the batch's base offset plus its index), so the batch keeps
    nothing per record. `buffer` is None while records are still being appended and holds the
    final bytes (producer fields stamped) from the first drain on; it never changes after that.
    """

    tp: TopicPartition
    builder: BatchBuilderLike | None
    created_ms: int
    result: ProduceRequestResult = field(init=False)
    # The builder's per-record encoder while records may still be appended, then None.
    encoder: RecordEncoder | None = field(init=False)
    record_count: int = 0
    approx_bytes: int = 0
    full: bool = False
    buffer: bytes | None = None
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    base_sequence: int = NO_SEQUENCE
    attempts: int = 0
    retry_at_ms: int = 0

    def __post_init__(self) -> None:
        self.result = ProduceRequestResult(self.tp)
        self.encoder = self.builder.encoder if self.builder is not None else None

    @property
    def closed(self) -> bool:
        return self.buffer is not None

    @property
    def size_bytes(self) -> int:
        if self.buffer is not None:
            return len(self.buffer)
        return self.encoder.size if self.encoder is not None else self.approx_bytes

    def count_records(self) -> int:
        """record_count, brought up to date from the encoder while the batch is open."""
        if self.encoder is not None:
            self.record_count = self.encoder.count
        return self.record_count

    def seal(self) -> None:
        """Take no more records (the batch left its queue unsent: expired or aborted): its
        count and size are fixed, so a record can never join it afterwards, uncounted."""
        if self.encoder is not None:
            self.record_count = self.encoder.count
            self.approx_bytes = self.encoder.size
            self.encoder = None
        self.full = True


class RecordAccumulator:
    """Thread-safe when given a lock: every method takes it (Kafka's per-deque locks, made
    one). Without one it is for a single thread."""

    def __init__(
        self,
        *,
        batch_size: int,
        linger_ms: int,
        new_builder: Callable[[TopicPartition], BatchBuilderLike],
        idempotent: bool,
        wake_sender: Callable[[], None] | None = None,
        clock_ms: Callable[[], int] | None = None,
        lock: AbstractContextManager[Any] | None = None,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if linger_ms < 0:
            raise ValueError(f"linger_ms must be >= 0, got {linger_ms}")
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.idempotent = idempotent
        self._new_builder = new_builder
        self._wake_sender = wake_sender
        self._clock_ms = clock_ms
        self._lock: AbstractContextManager[Any] = lock if lock is not None else _NoLock()
        self._batches: dict[TopicPartition, deque[ProducerBatch]] = {}
        # The partitions whose queue may hold a batch (a superset, emptied lazily by `_live`).
        self._queued: dict[TopicPartition, None] = {}  # an ordered set
        # Readiness without a scan. Kafka's ready() looks at every partition with a batch on
        # each sender pass; in Python that is O(partitions) per pass, so per record when records
        # go round-robin over thousands of partitions. Here `ready` looks only at candidates:
        # partitions something may have made sendable (a second batch, an unmuted partition, a
        # split, an expiry), plus those whose timer has come (a head batch's linger end or a
        # retry's backoff end). Invariant: every queued, unmuted partition is a candidate, has
        # its head batch's due time in `_timers` (stale entries are harmless: looked at, dropped)
        # or is set aside by the sender until a request to its leader ends (`set_aside`).
        self._candidates: dict[TopicPartition, None] = {}  # an ordered set
        self._timers: list[tuple[int, int, TopicPartition]] = []  # heap of (due_ms, n, tp)
        self._timer_seq = itertools.count()
        # When the sender calls `ready` next at the latest (None: it has no timer): a new batch
        # wakes it only if that batch is due sooner (`wake_sender`), not per batch.
        self.sender_due_ms: int | None = None
        # A lower bound of the creation time of every queued batch: `expire` scans the queues
        # only once the oldest could have passed the delivery timeout.
        self._oldest_ms: float = float("inf")
        self._in_flight: dict[TopicPartition, ProducerBatch] = {}
        self._next_sequence: dict[TopicPartition, int] = {}
        # Per topic, the sticky partition's open batch (append_sticky's shortcut).
        self._sticky_open: dict[str, ProducerBatch] = {}
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self.flushing = 0
        self.closing = False
        # Set under the lock by `close_and_abort`: from then on every append raises.
        self.closed = False
        # Sum of size_bytes over incomplete batches (queued or in flight): the memory bound. Open
        # batches' encoders add each record as they take it (no Python per record).
        self.bytes = ByteCount()
        # Batches opened so far (a send that opened one lets the sender run).
        self.batches_created = 0
        self._drain_rotation = 0

    # -- producer identity ---------------------------------------------------------------------

    def set_producer_id(self, producer_id: int, producer_epoch: int) -> None:
        """Adopt a (new) producer id: sequences restart at 0 for every partition.

        Batches already stamped keep their old id and sequence, so a retry of one of them stays a
        valid duplicate for the broker; batches drained from now on use the new id.
        """
        with self._lock:
            self.producer_id = producer_id
            self.producer_epoch = producer_epoch
            self._next_sequence.clear()

    # -- appending -----------------------------------------------------------------------------

    def append(
        self,
        tp: TopicPartition,
        timestamp_ms: int,
        key: Any,
        value: Any,
        headers: Headers | None,
        now_ms: int | None = None,
    ) -> FutureRecordMetadata:
        """Append one record to `tp`'s open batch, opening a new one when needed; returns the
        record's future (Kafka's tryAppend). Records without key or partition go through
        `append_sticky` instead (KIP-480). `now_ms` is the batch's creation time if one is
        opened (default: the clock).
        The builder checks and encodes the record (TypeError for a key or value that is not
        bytes, str or None), under the lock.
        """
        with self._lock:
            queue = self._batches.get(tp)
            if queue:
                last = queue[-1]
                encoder = last.encoder
                if encoder is not None and not last.full:
                    future = encoder.append_future(timestamp_ms, key, value, headers)
                    if future is not None:
                        return cast(FutureRecordMetadata, future)
                    self._filled(last)
            return self._append_new(tp, timestamp_ms, key, value, headers, now_ms)

    def append_sticky(
        self,
        topic: str,
        partitions: Sequence[TopicPartition],
        sticky: StickyPartitioner,
        timestamp_ms: int,
        key: Any,
        value: Any,
        headers: Headers | None,
    ) -> FutureRecordMetadata:
        """Append a record with no partition and no key to the topic's sticky partition,
        moving the stickiness on when that partition's batch is full (KIP-480), atomically.

        The sticky partition's open batch is remembered per topic, so the usual record costs
        one dict lookup and the encoder's call: an open batch that is not full is always its
        partition's last, and the stickiness moves only here."""
        with self._lock:
            last = self._sticky_open.get(topic)
            if last is not None:
                encoder = last.encoder
                if encoder is not None and not last.full:
                    future = encoder.append_future(timestamp_ms, key, value, headers)
                    if future is not None:
                        return future
                    self._filled(last)
            return self._append_sticky_slow(
                topic, partitions, sticky, timestamp_ms, key, value, headers
            )

    def _append_to(
        self,
        batch: ProducerBatch,
        timestamp_ms: int,
        key: Any,
        value: Any,
        headers: Headers | None,
    ) -> FutureRecordMetadata | None:
        """Append to `batch` if it is open and has room (lock held); None marks it full."""
        encoder = batch.encoder
        if encoder is None or batch.full:
            return None
        future = encoder.append_future(timestamp_ms, key, value, headers)
        if future is None:
            self._filled(batch)
        return cast(FutureRecordMetadata | None, future)

    def _filled(self, batch: ProducerBatch) -> None:
        """`batch` takes no more records (lock held): full, it is sendable now (Kafka's
        batchIsFull wakes the sender), so its partition is a candidate if it is the head."""
        batch.full = True
        tp = batch.tp
        queue = self._batches.get(tp)
        if queue and queue[0] is batch and tp not in self._in_flight:
            self._candidates[tp] = None
            self._sender_needed_by(batch.created_ms)

    def _sender_needed_by(self, due_ms: int) -> None:
        """Wake the sender unless it already plans to call `ready` by `due_ms` (lock held)."""
        planned = self.sender_due_ms
        if planned is None or due_ms < planned:
            self.sender_due_ms = due_ms
            if self._wake_sender is not None:
                self._wake_sender()

    def forget_sticky(self, topic: str) -> None:
        """The topic's partition count changed: the remembered sticky batch may name a partition
        it no longer has, so the next record asks the partitioner again."""
        with self._lock:
            self._sticky_open.pop(topic, None)

    def _append_sticky_slow(
        self,
        topic: str,
        partitions: Sequence[TopicPartition],
        sticky: StickyPartitioner,
        timestamp_ms: int,
        key: Any,
        value: Any,
        headers: Headers | None,
    ) -> FutureRecordMetadata:
        """append_sticky without a remembered open batch (lock held)."""
        count = len(partitions)
        part = sticky.partition(topic, count)
        queue = self._batches.get(partitions[part])
        if queue:
            # The same as append's fast path (written out there: it runs per record).
            last = queue[-1]
            future = self._append_to(last, timestamp_ms, key, value, headers)
            if future is not None:
                self._sticky_open[topic] = last
                return future
        part = sticky.on_new_batch(topic, count, part)
        future = self._append_new(partitions[part], timestamp_ms, key, value, headers, None)
        self._sticky_open[topic] = self._batches[partitions[part]][-1]
        return future

    def append_values(
        self,
        partitions: Sequence[TopicPartition],
        partition: int | None,
        sticky: StickyPartitioner,
        timestamp_ms: int,
        values: Sequence[Any],
        keys: Sequence[Any] | None,
        start: int,
        out: Any,
    ) -> int:
        """Append `values[start:]` (with `keys`, all stamped `timestamp_ms`) to `partition`, or
        with None to the topic's sticky partition, until its batch fills: the batch-at-once
        path of `send_batch`. Records the run with `out._add_run(result, first_index, count)`
        and returns how many records were appended (at least one)."""
        with self._lock:
            topic = partitions[0].topic
            count = len(partitions)
            part = sticky.partition(topic, count) if partition is None else partition
            tp = partitions[part]
            queue = self._batches.get(tp)
            last = queue[-1] if queue else None
            added = 0
            rest = values[start:] if start else values
            rest_keys = keys[start:] if start and keys is not None else keys
            first = 0
            if last is not None and last.encoder is not None and not last.full:
                first = last.encoder.count
                added = last.encoder.append_values(timestamp_ms, rest, rest_keys)
                if added == 0:
                    self._filled(last)
            if added == 0:
                if self.closed:
                    raise ClientClosedError("send() after close(): the producer is closed")
                if partition is None:
                    part = sticky.on_new_batch(topic, count, part)
                    tp = partitions[part]
                last = self._new_batch(tp, None)
                assert last.encoder is not None
                first = 0
                try:
                    added = last.encoder.append_values(timestamp_ms, rest, rest_keys)
                except BaseException:
                    # send_batch checks every record first, so only MemoryError gets here: the
                    # unqueued batch is dropped, and so are the bytes it counted.
                    self.bytes.add(-(last.encoder.size if last.encoder.count else 0))
                    raise
                if added == 0:
                    raise MessageTooLargeError(
                        f"record {start} does not fit in an empty batch for {tp}"
                    )
                self._queue(last)
            assert last is not None
            if start + added < len(values):
                self._filled(last)
            out._add_run(last.result, first, added)
            return added

    @property
    def buffered_bytes(self) -> int:
        return int(self.bytes.value)

    def _now(self, now_ms: int | None) -> int:
        if now_ms is not None:
            return now_ms
        if self._clock_ms is None:
            raise ValueError("now_ms is needed: this accumulator was given no clock")
        return self._clock_ms()

    def _new_batch(self, tp: TopicPartition, now_ms: int | None) -> ProducerBatch:
        """A new empty batch whose encoder makes its records' futures and counts their bytes
        (lock held); `_queue` it once it holds a record, so a refused record leaves no empty
        batch behind."""
        if self.closed:
            raise ClientClosedError("send() after close(): the producer is closed")
        batch = ProducerBatch(tp, self._new_builder(tp), self._now(now_ms))
        assert batch.encoder is not None
        batch.encoder.bind(FutureRecordMetadata, batch.result, self.bytes)
        return batch

    def _queue(self, batch: ProducerBatch) -> None:
        """Queue a new batch (lock held) and wake the sender if it must run sooner than it
        planned: the partition's head is sendable now (a second batch, linger 0, a flush or
        close), or this batch's linger ends before the sender's timer (or it has none)."""
        tp = batch.tp
        queue = self._batches.get(tp)
        if queue is None:
            queue = self._batches[tp] = deque()
        queue.append(batch)
        self._queued[tp] = None
        self.batches_created += 1
        created = batch.created_ms
        if created < self._oldest_ms:
            self._oldest_ms = created
        if len(queue) > 1:
            # The batch before it is full (`_filled` put it in view and woke the sender) or a
            # retried one (its backoff is a timer). This one is looked at again once it is the
            # head: its partition was muted or its queue cut by an expiry, both make a candidate.
            return
        due = created + self.linger_ms
        heapq.heappush(self._timers, (due, next(self._timer_seq), tp))
        self._sender_needed_by(created if self.flushing or self.closing else due)

    def sender_overdue(self, now_ms: int) -> bool:
        """The sender should have run by now (its timer or a wake is due): a caller appending
        in a tight loop yields to it then, and only then."""
        due = self.sender_due_ms
        return due is None or now_ms >= due

    def _append_new(
        self,
        tp: TopicPartition,
        timestamp_ms: int,
        key: Any,
        value: Any,
        headers: Headers | None,
        now_ms: int | None,
    ) -> FutureRecordMetadata:
        """Open a batch for one record (lock held)."""
        batch = self._new_batch(tp, now_ms)
        assert batch.encoder is not None
        future = batch.encoder.append_future(timestamp_ms, key, value, headers)
        if future is None:  # an empty builder takes any one record: never
            raise MessageTooLargeError(f"a record does not fit in an empty batch for {tp}")
        self._queue(batch)
        return cast(FutureRecordMetadata, future)

    # -- readiness and draining ----------------------------------------------------------------

    def _sendable(self, batch: ProducerBatch, queue_len: int, now_ms: int) -> bool:
        if batch.closed:
            return batch.retry_at_ms <= now_ms
        return (
            queue_len > 1
            or batch.full
            or self.flushing > 0
            or self.closing
            or now_ms - batch.created_ms >= self.linger_ms
        )

    def ready(self, now_ms: int) -> tuple[list[TopicPartition], int | None]:
        """Partitions whose head batch can be sent now, and the ms until the next one may be
        (None when nothing is waiting). Muted (in-flight) partitions are never ready.

        Looks at the candidates and the timers that have come only, not at every partition
        (see `_candidates`); the ms returned is the next timer's, which may be a stale one (a
        batch sent since): the sender then finds nothing to do, once."""
        ready: list[TopicPartition] = []
        with self._lock:
            timers, candidates = self._timers, self._candidates
            everything = self.flushing > 0 or self.closing
            while timers and (everything or timers[0][0] <= now_ms):
                candidates[heapq.heappop(timers)[2]] = None
            batches, in_flight = self._batches, self._in_flight
            for tp in list(candidates):
                queue = batches.get(tp)
                if not queue or tp in in_flight:
                    del candidates[tp]  # unmuting or a new batch makes it one again
                    continue
                head = queue[0]
                if self._sendable(head, len(queue), now_ms):
                    ready.append(tp)  # stays a candidate until drained
                    continue
                del candidates[tp]
                due = head.retry_at_ms if head.closed else head.created_ms + self.linger_ms
                heapq.heappush(timers, (due, next(self._timer_seq), tp))
            next_ms = max(0, timers[0][0] - now_ms) if timers else None
            self.sender_due_ms = None if next_ms is None else now_ms + next_ms
        return ready, next_ms

    def set_aside(self, tps: Sequence[TopicPartition]) -> None:
        """Stop looking at these sendable partitions in `ready` (the sender cannot send them
        now: their leader has `max_in_flight` requests out) until `look_again`. Without this,
        every sender pass while requests are out would look at each such partition again:
        round-robin over thousands of partitions keeps hundreds of them waiting."""
        with self._lock:
            candidates = self._candidates
            for tp in tps:
                candidates.pop(tp, None)

    def look_again(self, tps: Sequence[TopicPartition]) -> None:
        """Partitions set aside are candidates again (a request to their leader ended)."""
        with self._lock:
            candidates = self._candidates
            for tp in tps:
                candidates[tp] = None

    def drain(
        self,
        partitions_by_node: Mapping[int, Sequence[TopicPartition]],
        max_request_size: int,
        now_ms: int,
    ) -> dict[int, list[ProducerBatch]]:
        """Take the head batch of each given ready partition, grouped by node, at most
        `max_request_size` bytes per node (always at least one batch). Drained partitions are
        muted until `complete`, `retry` or `fail`."""
        out: dict[int, list[ProducerBatch]] = {}
        with self._lock:
            self._drain_rotation += 1
            for node, tps in partitions_by_node.items():
                taken: list[ProducerBatch] = []
                total = 0
                count = len(tps)
                # Rotate the starting partition so a size-capped request does not starve the
                # tail.
                start = self._drain_rotation % count if count else 0
                for i in range(count):
                    tp = tps[(start + i) % count]
                    queue = self._batches.get(tp)
                    if not queue or tp in self._in_flight:
                        continue
                    head = queue[0]
                    if not self._sendable(head, len(queue), now_ms):
                        continue
                    size = head.size_bytes
                    if taken and total + size > max_request_size:
                        break
                    queue.popleft()
                    self._close(head)
                    head.attempts += 1
                    self._in_flight[tp] = head
                    taken.append(head)
                    total += head.size_bytes
                if taken:
                    out[node] = taken
        return out

    def _close(self, batch: ProducerBatch) -> None:
        if batch.closed:
            return
        if batch.builder is None:
            raise RuntimeError(f"batch for {batch.tp} has neither bytes nor a builder")
        open_size = batch.size_bytes
        batch.count_records()
        if self.idempotent and self.producer_id != NO_PRODUCER_ID:
            seq = self._next_sequence.get(batch.tp, 0)
            self._next_sequence[batch.tp] = (seq + batch.record_count) % SEQUENCE_MODULUS
            batch.producer_id = self.producer_id
            batch.producer_epoch = self.producer_epoch
            batch.base_sequence = seq
            batch.builder.set_producer_state(self.producer_id, self.producer_epoch, seq)
        raw = batch.builder.build()
        batch.builder = None
        batch.encoder = None
        self.bytes.add(len(raw) - open_size)
        batch.approx_bytes = len(raw)
        batch.buffer = raw

    # -- outcomes ------------------------------------------------------------------------------

    def complete(self, batch: ProducerBatch) -> None:
        """The batch was acknowledged (or failed for good): unmute its partition. The caller
        completes `batch.result`."""
        with self._lock:
            tp = batch.tp
            if self._in_flight.get(tp) is batch:
                del self._in_flight[tp]
                if self._batches.get(tp):
                    self._candidates[tp] = None
            self.bytes.add(-batch.size_bytes)

    fail = complete

    def retry(self, batch: ProducerBatch, now_ms: int, backoff_ms: int) -> None:
        """Put an in-flight batch back at the head of its partition, to send after a backoff."""
        with self._lock:
            if self._in_flight.get(batch.tp) is batch:
                del self._in_flight[batch.tp]
            batch.retry_at_ms = now_ms + backoff_ms
            self._batches.setdefault(batch.tp, deque()).appendleft(batch)
            self._queued[batch.tp] = None
            heapq.heappush(self._timers, (batch.retry_at_ms, next(self._timer_seq), batch.tp))
            if batch.created_ms < self._oldest_ms:
                self._oldest_ms = batch.created_ms

    def split_and_reenqueue(
        self,
        batch: ProducerBatch,
        records: Sequence[RecordInput],
        new_builder: Callable[[], BatchBuilderLike],
    ) -> list[ProducerBatch]:
        """Replace an in-flight batch the broker refused as too large (MESSAGE_TOO_LARGE) by
        its two halves, at the head of its partition; returns them in order.

        Kafka's RecordAccumulator.splitAndReenqueue, except that Kafka splits into batches of
        `batch.size` and this halves: the producer's batches are already as large as the
        topic's limit it knows, so only smaller ones can pass, and halving again on each
        refusal reaches any lower limit in log2(records) round trips. `records` are the
        batch's records in order (decoded from its bytes); `new_builder` makes a builder with
        room for all of them. The parts keep the batch's creation time (its delivery timeout
        still runs), are sendable at once and count no attempt. With idempotence they carry
        the batch's producer id and epoch and split its sequence range (base, base + n1):
        the broker stored none of it, and later batches already follow that range. The
        batch's result is split too, so each record's future follows the part that holds it.
        """
        count = batch.record_count
        if count < 2:
            raise ValueError(f"only a batch of more than one record can be split, not {count}")
        if len(records) != count:
            raise ValueError(f"the batch holds {count} records, {len(records)} were given")
        half = (count + 1) // 2
        sequence = batch.base_sequence
        parts: list[ProducerBatch] = []
        for lo, hi in ((0, half), (half, count)):
            builder = new_builder()
            for timestamp_ms, key, value, headers in records[lo:hi]:
                if not builder.append(timestamp_ms, key, value, headers):
                    raise ValueError("the builder for a split batch must hold all its records")
            part = ProducerBatch(batch.tp, None, batch.created_ms, record_count=hi - lo)
            if sequence != NO_SEQUENCE:
                part.producer_id = batch.producer_id
                part.producer_epoch = batch.producer_epoch
                part.base_sequence = sequence
                builder.set_producer_state(batch.producer_id, batch.producer_epoch, sequence)
                sequence = (sequence + part.record_count) % SEQUENCE_MODULUS
            part.buffer = builder.build()
            part.approx_bytes = len(part.buffer)
            parts.append(part)
        batch.result.split([0, half], [p.result for p in parts])
        with self._lock:
            if self._in_flight.get(batch.tp) is batch:
                del self._in_flight[batch.tp]
            self.bytes.add(sum(p.approx_bytes for p in parts) - batch.size_bytes)
            queue = self._batches.setdefault(batch.tp, deque())
            for part in reversed(parts):
                queue.appendleft(part)
            self._queued[batch.tp] = None
            self._candidates[batch.tp] = None
            if batch.created_ms < self._oldest_ms:
                self._oldest_ms = batch.created_ms
        return parts

    def expire(self, now_ms: int, delivery_timeout_ms: int) -> list[ProducerBatch]:
        """Remove and return queued (not in-flight) batches older than the delivery timeout.
        The caller reports each one with `fail`."""
        expired: list[ProducerBatch] = []
        with self._lock:
            if now_ms - self._oldest_ms < delivery_timeout_ms:
                return expired  # no queued batch is that old: no scan (it runs every pass)
            oldest = float("inf")
            for tp, queue in self._live():
                if now_ms - queue[0].created_ms < delivery_timeout_ms:
                    oldest = min(oldest, min(b.created_ms for b in queue))
                    continue
                while queue and now_ms - queue[0].created_ms >= delivery_timeout_ms:
                    expired.append(queue.popleft())
                if queue:
                    self._candidates[tp] = None  # a new head, maybe with no timer
                    oldest = min(oldest, min(b.created_ms for b in queue))
            self._oldest_ms = oldest
            self._seal(expired)
        return expired

    def abort_all(self) -> list[ProducerBatch]:
        """Remove and return every queued batch (fatal errors). The caller reports each one
        with `fail`."""
        with self._lock:
            aborted = self._remove_queued()
        return aborted

    def _remove_queued(self) -> list[ProducerBatch]:
        """Remove every queued batch (lock held)."""
        aborted = [b for queue in self._batches.values() for b in queue]
        for queue in self._batches.values():
            queue.clear()
        self._candidates.clear()
        self._timers.clear()
        self._oldest_ms = float("inf")
        self._seal(aborted)
        return aborted

    def _seal(self, removed: list[ProducerBatch]) -> None:
        """Batches taken out of their queues unsent take no more records, and the sticky
        shortcut forgets them (lock held)."""
        for batch in removed:
            batch.seal()
        if removed:
            gone = {id(batch) for batch in removed}
            for topic, batch in list(self._sticky_open.items()):
                if id(batch) in gone:
                    del self._sticky_open[topic]

    def close_and_abort(self) -> list[ProducerBatch]:
        """Refuse every later append, then remove and return every queued batch (the last step
        of close): a record is either in a returned batch or refused at once, never left
        behind unsent."""
        with self._lock:
            self.closed = True
            aborted = self._remove_queued()
        return aborted

    # -- introspection -------------------------------------------------------------------------

    def in_flight(self) -> list[ProducerBatch]:
        with self._lock:
            return list(self._in_flight.values())

    def incomplete(self) -> list[ProducerBatch]:
        """Every batch not yet acknowledged or failed: queued and in flight."""
        with self._lock:
            queued = [b for queue in self._batches.values() for b in queue]
            return queued + list(self._in_flight.values())

    def has_unsent(self) -> bool:
        with self._lock:
            return bool(self._live())

    def has_incomplete(self) -> bool:
        with self._lock:
            return bool(self._in_flight) or bool(self._live())

    def _live(self) -> list[tuple[TopicPartition, deque[ProducerBatch]]]:
        """The non-empty queues (under the lock); forgets the partitions whose queue emptied."""
        batches, queued = self._batches, self._queued
        live = []
        for tp in list(queued):
            queue = batches.get(tp)
            if queue:
                live.append((tp, queue))
            else:
                del queued[tp]
        return live
