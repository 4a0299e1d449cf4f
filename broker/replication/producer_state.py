"""Idempotent-producer state of one partition: dedupe retried batches, reject gaps and zombies.

Pure: no I/O. Kafka's ProducerStateManager / ProducerAppendInfo, minus transactions (KIP-98;
docs/protocol.md §5). Per producer id it keeps the producer epoch and the last
`BATCHES_PER_PRODUCER` (5) batches' (first seq, last seq, first offset, last offset), which is
exactly what a client with `max.in.flight.requests.per.connection` <= 5 can retry.

Rules for a client batch (producer id >= 0), in Kafka's order:
  * epoch older than the producer's            -> INVALID_PRODUCER_EPOCH
  * same epoch and (first seq, last seq) equal to one of the last 5 batches
                                               -> duplicate: answer with its original offsets
  * epoch newer than the producer's            -> must start at sequence 0, else
                                                  OUT_OF_ORDER_SEQUENCE_NUMBER
  * same epoch                                 -> first seq must be last seq + 1 (wrapping at
                                                  2**31), else OUT_OF_ORDER_SEQUENCE_NUMBER
  * unknown producer id                        -> accepted at ANY sequence.
The last rule is Kafka 2.5+ (KIP-360) behaviour and a deliberate choice here: producer state
is rebuilt from the log, so a producer whose batches were all removed by retention or by a
follower truncation is unknown again, and refusing it (UNKNOWN_PRODUCER_ID) would strand a
healthy client. The cost is that a lost duplicate older than the kept window cannot be caught,
which is Kafka's guarantee too.

The state is a pure function of the batch headers in the log: `rebuild(headers)` replays them
(on open, or after a truncation) and `record(...)` applies one appended batch (leader or
follower). `truncate_to(offset)` drops what lies at or above `offset`; a producer whose kept
batches all go is forgotten (see the unknown-producer rule above); callers that want exact
state replay the log with `rebuild` instead.

Concurrency contract: single-threaded (owned by one PartitionReplica).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from minibroker.client.batch import SEQUENCE_MODULUS
from minibroker.client.errors import ErrorCode

BATCHES_PER_PRODUCER = 5


class ProducerBatchHeader(Protocol):
    """The fields of client/batch.BatchHeader the producer state reads."""

    @property
    def producer_id(self) -> int: ...

    @property
    def producer_epoch(self) -> int: ...

    @property
    def base_sequence(self) -> int: ...

    @property
    def last_sequence(self) -> int: ...

    @property
    def base_offset(self) -> int: ...

    @property
    def last_offset(self) -> int: ...


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    """One producer: its epoch and its newest batches (oldest first, at most 5)."""

    producer_epoch: int
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=BATCHES_PER_PRODUCER)
    )

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    def copy(self) -> ProducerEntry:
        return ProducerEntry(self.producer_epoch, deque(self.batches, maxlen=BATCHES_PER_PRODUCER))


@dataclass(frozen=True, slots=True)
class SequenceVerdict:
    """The outcome of checking one client batch.

    error == NONE and duplicate is None: append. duplicate set: answer with its offsets.
    """

    error: ErrorCode
    duplicate: BatchMetadata | None = None
    message: str = ""


def next_sequence(last_seq: int) -> int:
    return (last_seq + 1) % SEQUENCE_MODULUS


class ProducerStateManager:
    """Producer id -> ProducerEntry for one partition."""

    def __init__(self) -> None:
        self._producers: dict[int, ProducerEntry] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def entry(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    @property
    def producers(self) -> dict[int, ProducerEntry]:
        """A read-only view for tests and `dump-log`; do not mutate."""
        return self._producers

    # -- client path (leader) --------------------------------------------------------------

    def check_batches(
        self, headers: Sequence[tuple[int, int, int, int]]
    ) -> tuple[SequenceVerdict, int]:
        """Check a produce request's batches in order, as if each earlier one were appended.

        `headers` holds (producer id, producer epoch, base sequence, last sequence) per batch.
        Returns (verdict, index of the batch the verdict is about). Kafka answers a request
        holding a duplicate with that duplicate's offsets and appends nothing, and rejects the
        whole request on the first error; so does this. Nothing is changed here.
        """
        overlay: dict[int, ProducerEntry] = {}
        for index, (producer_id, producer_epoch, first_seq, last_seq) in enumerate(headers):
            if producer_id < 0:
                continue
            current = overlay.get(producer_id)
            if current is None:
                stored = self._producers.get(producer_id)
                current = stored.copy() if stored is not None else None
            verdict = _check_one(current, producer_id, producer_epoch, first_seq, last_seq)
            if verdict.error != ErrorCode.NONE or verdict.duplicate is not None:
                return verdict, index
            # Stage the batch (offsets are unknown yet, they only matter for duplicates of
            # batches in the same request, which Kafka does not look for either).
            staged = current if current is not None else ProducerEntry(producer_epoch)
            _apply(staged, producer_epoch, BatchMetadata(first_seq, last_seq, -1, -1))
            overlay[producer_id] = staged
        return SequenceVerdict(ErrorCode.NONE), -1

    # -- log path (leader after append, follower append, rebuild) -------------------------

    def record(
        self,
        producer_id: int,
        producer_epoch: int,
        first_seq: int,
        last_seq: int,
        first_offset: int,
        last_offset: int,
    ) -> None:
        """Apply one batch that is now in the log. The log is the truth: no checks here."""
        if producer_id < 0:
            return
        entry = self._producers.get(producer_id)
        if entry is None:
            entry = ProducerEntry(producer_epoch)
            self._producers[producer_id] = entry
        _apply(entry, producer_epoch, BatchMetadata(first_seq, last_seq, first_offset, last_offset))

    def record_header(self, header: ProducerBatchHeader) -> None:
        self.record(
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            header.last_sequence,
            header.base_offset,
            header.last_offset,
        )

    def rebuild(self, headers: Iterable[ProducerBatchHeader]) -> None:
        """Forget everything and replay the log's batch headers in offset order."""
        self._producers.clear()
        for header in headers:
            self.record_header(header)

    def truncate_to(self, offset: int) -> None:
        """Drop batches at or above `offset` (the log was truncated there)."""
        for producer_id in list(self._producers):
            entry = self._producers[producer_id]
            kept = [b for b in entry.batches if b.last_offset < offset]
            if not kept:
                del self._producers[producer_id]
            elif len(kept) != len(entry.batches):
                entry.batches = deque(kept, maxlen=BATCHES_PER_PRODUCER)

    def truncate_from_start(self, log_start_offset: int) -> None:
        """Forget producers whose every kept batch lies below the new log start (retention)."""
        for producer_id in list(self._producers):
            entry = self._producers[producer_id]
            if entry.batches and entry.batches[-1].last_offset < log_start_offset:
                del self._producers[producer_id]


def _apply(entry: ProducerEntry, producer_epoch: int, batch: BatchMetadata) -> None:
    if producer_epoch != entry.producer_epoch:
        # A new epoch starts a new sequence space; the old batches cannot be retried any more.
        entry.producer_epoch = producer_epoch
        entry.batches.clear()
    entry.batches.append(batch)


def _check_one(
    entry: ProducerEntry | None,
    producer_id: int,
    producer_epoch: int,
    first_seq: int,
    last_seq: int,
) -> SequenceVerdict:
    if entry is None:
        # Unknown producer (new, or its state expired with the log): accept any sequence.
        return SequenceVerdict(ErrorCode.NONE)
    if producer_epoch < entry.producer_epoch:
        return SequenceVerdict(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            message=f"producer {producer_id}: epoch {producer_epoch} is older than "
            f"{entry.producer_epoch}",
        )
    if producer_epoch == entry.producer_epoch:
        for batch in entry.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return SequenceVerdict(ErrorCode.NONE, duplicate=batch)
    if producer_epoch > entry.producer_epoch:
        if first_seq != 0:
            return SequenceVerdict(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                message=f"producer {producer_id}: new epoch {producer_epoch} must start at "
                f"sequence 0, got {first_seq}",
            )
        return SequenceVerdict(ErrorCode.NONE)
    if not entry.batches:
        return SequenceVerdict(ErrorCode.NONE)
    expected = next_sequence(entry.last_seq)
    if first_seq != expected:
        return SequenceVerdict(
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
            message=f"producer {producer_id} epoch {producer_epoch}: sequence {first_seq}, "
            f"expected {expected}",
        )
    return SequenceVerdict(ErrorCode.NONE)


class AppendBatchHeader(ProducerBatchHeader, Protocol):
    """The header fields a leader append reads (client/batch.BatchHeader has them all)."""

    @property
    def last_offset_delta(self) -> int: ...


def assign_offsets(
    base_offset: int, batches: Sequence[AppendBatchHeader]
) -> tuple[int, tuple[tuple[int, int, int, int, int, int], ...]]:
    """The offsets a leader append gives `batches` from `base_offset`: (the next offset, and the
    client batches as `record` takes them: producer id, epoch, first and last seq, first and
    last offset)."""
    offset = base_offset
    stamped = []
    for header in batches:
        first = offset
        offset += header.last_offset_delta + 1
        if header.producer_id >= 0:
            stamped.append(
                (
                    header.producer_id,
                    header.producer_epoch,
                    header.base_sequence,
                    header.last_sequence,
                    first,
                    offset - 1,
                )
            )
    return offset, tuple(stamped)
