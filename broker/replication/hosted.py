"""One partition replica hosted by the replica engine: its log, its core, what is in flight.

Pure: no I/O but through the replica's `Storage` (storage.py). `HostedReplica` is what
`BrokerReplicas` (engine.py) keeps per partition, with the per-partition half of the requests
that touch the log (serving.py asks for them): a leader's append (`append_produce`: validation,
plan, append; the core's effects go back to the engine, whose `_interpret` is the one place
effects are carried out), reads and timestamp lookups. A storage failure is reported through
`storage_failed`, the engine's, which takes the whole dir offline on a log-dir failure.

Concurrency contract: single-threaded, driven by its engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from minibroker.broker.replication.events import (
    AppendPlan,
    DuplicateAppend,
    Effect,
    FetchPosition,
    ListOffsetsAnswer,
)
from minibroker.broker.replication.outputs import (
    Appended,
    CorruptProduce,
    FetchReply,
    ListOffsetsReply,
    Output,
    ProduceReply,
)
from minibroker.broker.replication.partition import PartitionReplica
from minibroker.broker.replication.storage import Storage
from minibroker.client import batch as batchlib
from minibroker.client.common.invariant import invariant
from minibroker.client.errors import ErrorCode, MiniBrokerError
from minibroker.client.records import RecordValidation, validate_producer_records
from minibroker.client.replication_throttle import ThrottledReplicas
from minibroker.client.types import TopicPartition

S = TypeVar("S", bound=Storage)

# The engine's handler of a failed storage call: (error, operation, outputs) -> the
# KAFKA_STORAGE_ERROR message when it was a log-dir failure (the dir is offline now), else None.
StorageFailed = Callable[[BaseException, str, list[Output]], str | None]


def _no_replicas() -> ThrottledReplicas:
    return ThrottledReplicas(False, frozenset())


class FollowerAppendError(Exception):
    """A follower append or truncation failed; the fetch it answered counts as failed."""


@dataclass(slots=True)
class HostedReplica(Generic[S]):
    """One partition replica hosted here: its log, its core, and what is in flight for it."""

    tp: TopicPartition
    topic_id: str
    log: S
    core: PartitionReplica
    generation: int  # tells a re-hosted replica from the one an answer was meant for
    storage_failed: StorageFailed
    # The topic configs the core and log were last configured with (None: broker defaults
    # only, for a log opened from disk before metadata arrived).
    topic_configs: dict[str, str] | None = None
    record_validation: RecordValidation = field(default_factory=RecordValidation)
    max_message_bytes: int = 1_048_588
    # The topic's KIP-73 lists (leader/follower.replication.throttled.replicas), parsed.
    leader_throttled: ThrottledReplicas = field(default_factory=_no_replicas)
    follower_throttled: ThrottledReplicas = field(default_factory=_no_replicas)
    # The replication factor the partition is meant to have: its target replicas while a
    # reassignment runs (Kafka: replicas - removing), else every replica (0: no record yet).
    replication_factor: int = 0
    # The follower fetch planned by `next_fetch`: only the answer to this very position is
    # applied, so a late answer to an older one (a stopping fetcher's) is dropped.
    pending_fetch: FetchPosition | None = None

    # -- the leader's side ----------------------------------------------------------------

    def append_produce(
        self,
        reply: ProduceReply,
        acks: int,
        records: bytes,
        now_ms: int,
        deadline_ms: int,
        new_token: Callable[[], int],
        out: list[Output],
    ) -> tuple[bool, list[Effect]]:
        """A produce on this leader: check the batches and records, plan, append, and for
        acks=all park the produce until the HW passes it (`reply.token`). Returns whether
        records were appended, and the core's effects for the engine to carry out."""
        core, tp = self.core, self.tp
        try:
            # Headers for the core's idempotence and acks checks; the log reuses this
            # validation when it appends (one CRC32C pass per batch).
            batches = batchlib.validate_producer_batches(records, self.max_message_bytes)
            # Then the records themselves (Kafka's LogValidator), on this leader path only.
            validate_producer_records(records, batches, now_ms, self.record_validation)
        except batchlib.CorruptRecordError as err:
            out.append(CorruptProduce(tp))
            reply.error, reply.message = ErrorCode.CORRUPT_MESSAGE, str(err)
            return False, []
        except MiniBrokerError as err:
            reply.error, reply.message = err.code, str(err)
            return False, []
        plan, _ = core.plan_append(acks, [h for _, h in batches])
        if isinstance(plan, DuplicateAppend):
            # A retry of a batch already in the log: its original offsets; acks=all waits for
            # the HW to pass it like the first attempt did.
            reply.log_start_offset = core.log_start_offset
            reply.base_offset = plan.base_offset
            if acks == -1:
                reply.token = new_token()
                _, effects = core.park_produce(
                    reply.token, plan.base_offset, plan.last_offset, deadline_ms
                )
                return False, effects
            return False, []
        if not isinstance(plan, AppendPlan):
            reply.error, reply.message = plan.error, plan.message
            reply.log_start_offset = core.log_start_offset
            return False, []
        try:
            info = self.log.append_as_leader(records, plan.leader_epoch, now_ms, validated=batches)
        except MiniBrokerError as err:
            self.storage_failed(err, f"produce to {tp}", out)
            reply.error, reply.message = err.code, str(err)
            return False, []
        invariant(
            info.first_offset == plan.base_offset,
            f"{tp}: the log appended at {info.first_offset}, the core planned {plan.base_offset}",
        )
        reply.log_append_time_ms = info.log_append_time_ms
        reply.base_offset = plan.base_offset
        reply.log_start_offset = self.log.log_start_offset
        count = sum(h.records_count for _, h in batches)
        out.append(
            Appended(
                tp,
                True,
                plan.base_offset,
                plan.next_offset,
                plan.leader_epoch,
                count,
                info.valid_bytes,
            )
        )
        if acks == -1:
            reply.token = new_token()
        _, effects = core.on_leader_appended(
            plan, now_ms, token=reply.token, deadline_ms=deadline_ms
        )
        return True, effects

    def read(
        self, reply: FetchReply, offset: int, max_bytes: int, max_offset: int, out: list[Output]
    ) -> None:
        """Fill `reply.records`; a read the disk fails takes the dir offline and answers
        KAFKA_STORAGE_ERROR (any other error is a bug, and raises)."""
        try:
            reply.records = self.log.read(offset, max_bytes, max_offset=max_offset).records
        except Exception as err:
            message = self.storage_failed(err, f"read from {self.tp}", out)
            if message is None:
                raise
            reply.error, reply.message = ErrorCode.KAFKA_STORAGE_ERROR, message

    def look_up_timestamp(
        self, reply: ListOffsetsReply, answer: ListOffsetsAnswer, timestamp: int, out: list[Output]
    ) -> None:
        """ListOffsets by timestamp: the storage's time index, then the core's rule for what
        the hit may answer (KIP-207)."""
        try:
            found = self.log.offset_for_timestamp(timestamp)
        except Exception as err:
            message = self.storage_failed(err, f"timestamp lookup in {self.tp}", out)
            if message is None:
                raise
            reply.error, reply.message = ErrorCode.KAFKA_STORAGE_ERROR, message
            return
        found_offset = found[0] if found is not None else None
        reply.error, reply.offset = answer.resolve(found_offset)
        reply.timestamp = found[1] if found is not None and reply.offset >= 0 else -1
