"""The requests a broker answers from the replicas it hosts: Produce, Fetch, ListOffsets,
OffsetForLeaderEpoch.

Pure and synchronous. `ReplicaServing` is a mixin of `BrokerReplicas` (engine.py), which owns
the hosted-partition map and THE one effect interpreter (`_interpret`); each entry point here
finds the replica, asks its core, carries the core's effects out through the engine's
interpreter and hands back `(reply, outputs)`:

  * Produce (Kafka's `appendRecordsToLeader`): on the leader only; the batch and record checks,
    the plan and the append are `HostedReplica.append_produce`'s; an acks=all produce (and an
    idempotent retry of one) is parked under a token until the HW passes it.
  * A follower's fetch (leader side): the core's checks and the follower's progress, then the
    records up to the LEO taken before the read.
  * A consumer's fetch: up to the HW, from the leader or an in-sync follower in the client's
    rack; the leader points a client in another rack at such a follower (KIP-392's
    RackAwareReplicaSelector, `preferred_read_replica`).
  * ListOffsets (a timestamp lookup goes to the storage's time index) and OffsetForLeaderEpoch.

Once the log dir is offline every one of them answers KAFKA_STORAGE_ERROR.

Concurrency contract: single-threaded, with the engine's thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Generic, TypeVar

from minibroker.broker.replication.events import Effect, FollowerFetch, Role
from minibroker.broker.replication.hosted import HostedReplica
from minibroker.broker.replication.outputs import (
    EngineConfig,
    EpochEndOffsetReply,
    FetchReply,
    ListOffsetsReply,
    Output,
    ProduceReply,
    WakeFollowerFetches,
)
from minibroker.broker.replication.partition import PartitionReplica
from minibroker.broker.replication.quota import RateQuota, leader_throttles
from minibroker.broker.replication.storage import Storage
from minibroker.client.errors import ErrorCode
from minibroker.client.types import TopicPartition
from minibroker.metadata.image import MetadataImage

S = TypeVar("S", bound=Storage)
Reply = ProduceReply | FetchReply | ListOffsetsReply | EpochEndOffsetReply


class ReplicaServing(Generic[S]):
    """Produce, fetch and offset requests on the hosted replicas (a mixin of `BrokerReplicas`,
    which sets and owns all the state below)."""

    config: EngineConfig
    broker_id: int
    image: MetadataImage
    offline: str | None
    _hosted: dict[TopicPartition, HostedReplica[S]]
    _next_token: int
    _produces_waiting: set[TopicPartition]
    leader_quota: RateQuota

    if TYPE_CHECKING:

        def _interpret(
            self, hosted: HostedReplica[S], effects: Iterable[Effect], out: list[Output]
        ) -> None: ...

    # -- produce ------------------------------------------------------------------------

    def produce(
        self, tp: TopicPartition, acks: int, records: bytes, now_ms: int, deadline_ms: int
    ) -> tuple[ProduceReply, list[Output]]:
        """Append a produce request's records for `tp` as the leader (Kafka's
        `appendRecordsToLeader`): check the batches and records, plan, append, and for acks=all
        park the produce until the HW passes it (reply.token)."""
        reply = ProduceReply()
        out: list[Output] = []
        if acks not in (-1, 0, 1):
            reply.error = ErrorCode.INVALID_REQUIRED_ACKS
            reply.message = f"acks must be 0, 1 or -1 (all), got {acks}"
            return reply, out
        if self._answered_offline(reply):
            return reply, out
        hosted = self._hosted.get(tp)
        if hosted is None:
            reply.error, reply.leader = self._not_hosted(tp)
            if reply.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                reply.message = f"{tp} does not exist"
            else:
                reply.message = f"broker {self.broker_id} does not host {tp}"
            return reply, out
        core = hosted.core
        if core.role is not Role.LEADER:
            reply.error = ErrorCode.NOT_LEADER_OR_FOLLOWER
            reply.message = f"broker {self.broker_id} is not the leader of {tp}"
            reply.leader = (core.leader_id, core.leader_epoch)
            return reply, out
        appended, effects = hosted.append_produce(
            reply, acks, records, now_ms, deadline_ms, self._new_token, out
        )
        self._interpret(hosted, effects, out)
        if hosted.core.pending_produce_count:
            self._produces_waiting.add(tp)  # expire_produces looks at these only
        if appended:
            out.append(WakeFollowerFetches(tp))  # wake followers' long polls
        return reply, out

    def _new_token(self) -> int:
        self._next_token += 1
        return self._next_token

    # -- fetch (leader side) ------------------------------------------------------------

    def _not_hosted(self, tp: TopicPartition) -> tuple[ErrorCode, tuple[int, int] | None]:
        """The error for a partition not hosted here: it does not exist at all, or lives on
        other brokers (with its leader, when the image knows it)."""
        known = self.image.topic(tp.topic)
        if known is None or tp.partition not in known.partitions:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None
        record = known.partitions[tp.partition]
        return ErrorCode.NOT_LEADER_OR_FOLLOWER, (record.leader, record.leader_epoch)

    def follower_fetch(
        self, tp: TopicPartition, fetch: FollowerFetch, max_bytes: int, now_ms: int
    ) -> tuple[FetchReply, list[Output]]:
        """A follower's fetch of `tp` (leader side): the core's checks and state update, then
        the records up to the LEO taken before the read."""
        reply, hosted = self._serving(tp)
        out: list[Output] = []
        if hosted is None:
            return reply, out
        core = hosted.core
        answer, effects = core.handle_follower_fetch(fetch, now_ms)
        self._interpret(hosted, effects, out)
        reply.error, reply.message = answer.error, answer.message
        reply.high_watermark = answer.high_watermark
        reply.log_start_offset = answer.log_start_offset
        reply.log_end_offset = answer.log_end_offset
        reply.diverging_epoch = answer.diverging_epoch
        reply.current_leader = (core.leader_id, core.leader_epoch)
        readable = answer.error == ErrorCode.NONE and answer.diverging_epoch is None
        if readable and answer.read_until_offset > answer.fetch_offset:
            quota = self.leader_quota
            throttled = not quota.unlimited and leader_throttles(
                hosted.leader_throttled, tp.partition, self.broker_id, fetch.replica_id, core.isr
            )
            if throttled and quota.is_exceeded(now_ms):
                # KIP-73: over the leader's quota, a throttled (listed, out-of-sync) follower
                # gets no records this time; it asks again and the rate decides then.
                quota.note_throttled()
                return reply, out
            hosted.read(reply, answer.fetch_offset, max_bytes, answer.read_until_offset, out)
            if throttled:
                quota.record(len(reply.records), now_ms)
        return reply, out

    def consumer_fetch(
        self,
        tp: TopicPartition,
        current_leader_epoch: int,
        fetch_offset: int,
        max_bytes: int,
        rack_id: str = "",
    ) -> tuple[FetchReply, list[Output]]:
        """A consumer's fetch of `tp`: from the leader, or an in-sync follower in the client's
        rack (KIP-392), up to the HW; the leader may point a client in another rack at a
        follower there (`preferred_read_replica`)."""
        reply, hosted = self._serving(tp)
        out: list[Output] = []
        if hosted is None:
            return reply, out
        core = hosted.core
        allow_follower = bool(rack_id) and self._serves_rack(rack_id)
        answer, _ = core.check_consumer_fetch(
            current_leader_epoch, fetch_offset, allow_follower=allow_follower
        )
        reply.error, reply.message = answer.error, answer.message
        reply.high_watermark = answer.high_watermark
        reply.log_start_offset = answer.log_start_offset
        reply.log_end_offset = answer.log_end_offset
        reply.current_leader = (core.leader_id, core.leader_epoch)
        if answer.error != ErrorCode.NONE:
            return reply, out
        if core.is_leader and rack_id:
            preferred = self._preferred_read_replica(core, rack_id, fetch_offset)
            if preferred is not None:
                reply.preferred_read_replica = preferred
                return reply, out
        if answer.read_until_offset > fetch_offset:
            hosted.read(reply, fetch_offset, max_bytes, answer.read_until_offset, out)
        return reply, out

    def fetch_max_bytes(self, requested: int) -> int:
        """A partition's fetch size: the request's, or replica.fetch.max.bytes when unset."""
        return requested if requested > 0 else self.config.replica_fetch_max_bytes

    def _serving(self, tp: TopicPartition) -> tuple[FetchReply, HostedReplica[S] | None]:
        """A fetch's reply and the replica that serves `tp` (None: the reply has the error)."""
        reply = FetchReply()
        if self._answered_offline(reply):
            return reply, None
        hosted = self._hosted.get(tp)
        if hosted is None:
            reply.error, reply.current_leader = self._not_hosted(tp)
        return reply, hosted

    def _serves_rack(self, rack: str) -> bool:
        return (
            self.config.rack_aware_selector and bool(self.config.rack) and self.config.rack == rack
        )

    def _preferred_read_replica(
        self, core: PartitionReplica, rack: str, fetch_offset: int
    ) -> int | None:
        """KIP-392: an in-sync follower in the client's rack that holds the offset."""
        if not self.config.rack_aware_selector:
            return None
        if self.config.rack == rack:
            return None  # the leader is in the client's rack already
        for replica_id in core.replicas:
            if replica_id == self.broker_id or replica_id not in core.isr:
                continue
            broker = self.image.brokers.get(replica_id)
            if broker is None or broker.rack != rack or not broker.is_active:
                continue
            if core.replica_leo(replica_id) >= fetch_offset:
                return replica_id
        return None

    # -- offsets --------------------------------------------------------------------------

    def list_offsets(
        self, tp: TopicPartition, current_leader_epoch: int, timestamp: int
    ) -> tuple[ListOffsetsReply, list[Output]]:
        reply = ListOffsetsReply()
        out: list[Output] = []
        if self._answered_offline(reply):
            return reply, out
        hosted = self._hosted.get(tp)
        if hosted is None:
            reply.error = self._not_hosted(tp)[0]
            return reply, out
        answer, _ = hosted.core.list_offsets(current_leader_epoch, timestamp)
        reply.error, reply.message = answer.error, answer.message
        reply.leader_epoch = answer.leader_epoch
        if answer.error != ErrorCode.NONE:
            return reply, out
        if not answer.needs_timestamp_lookup:
            reply.offset = answer.offset
            return reply, out
        hosted.look_up_timestamp(reply, answer, timestamp, out)
        return reply, out

    def offset_for_leader_epoch(
        self, tp: TopicPartition, current_leader_epoch: int, leader_epoch: int
    ) -> tuple[EpochEndOffsetReply, list[Output]]:
        reply = EpochEndOffsetReply()
        if self._answered_offline(reply):
            return reply, []
        hosted = self._hosted.get(tp)
        if hosted is None:
            reply.error = self._not_hosted(tp)[0]
            return reply, []
        answer, _ = hosted.core.offset_for_leader_epoch(current_leader_epoch, leader_epoch)
        reply.error, reply.message = answer.error, answer.message
        reply.leader_epoch, reply.end_offset = answer.leader_epoch, answer.end_offset
        return reply, []

    def _answered_offline(self, reply: Reply) -> bool:
        """Once the log dir is offline, answer KAFKA_STORAGE_ERROR (True) with why."""
        if self.offline is None:
            return False
        reply.error, reply.message = ErrorCode.KAFKA_STORAGE_ERROR, self.offline
        return True
