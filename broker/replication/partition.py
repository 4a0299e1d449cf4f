"""The replication state machine of one replica of one partition on one broker.

Pure: no I/O, no clock, no randomness: time arrives as `now_ms`, storage facts arrive as calls
(`on_leader_appended`, `on_follower_appended`, `on_log_truncated`), decisions leave as effects
(events.py). This is Kafka's `Partition.scala` leader/follower logic without its locks, remote
writes and metrics (docs/design.md §2), following docs/protocol.md §2-§13.

Roles and transitions (`apply_partition_state`, driven by the controller's PartitionRecord):

    NONE/FOLLOWER --(record names this broker leader, higher leader epoch)--> LEADER
    NONE/LEADER   --(record names another broker or no leader)-------------> FOLLOWER
    any           --(record's replicas exclude this broker)-----------------> NONE
A record with a lower partition epoch than the one applied is ignored (docs/protocol.md §10); the
same
leader epoch with a higher partition epoch is an ISR/assignment update only.

Leader rules (sections of docs/protocol.md): offsets and the epoch stamp for appends
(`plan_append`), the acks=all rule (§2), follower fetches (§7, §11 step 3, §12), the HW rule
(§6: strict min ISR, monotonic, maximal ISR with a pending expansion, committed ISR with a
pending shrink), ISR shrink on a timer and expansion on fetch (§8), AlterPartition answers (§9),
OFFSET_NOT_AVAILABLE while a new leader's HW lags its epoch start (§10).
Follower rules: follower.py, reached through `next_fetch`/`on_fetch_response`.

Shell contract (the replica manager):
  * Every public entry point returns `(reply, effects)` (`Step`): the reply is the answer (None
    for a command), the effects the one channel for decisions. The shell reads nothing else but
    the read-only properties below (role, offsets, ISR, `follower_state`, `replica_leo`, ...).
  * Apply returned effects in order before giving this replica its next input. The core updates
    its own view as if every effect succeeds, except for the log end, which the shell reports:
    `on_leader_appended` / `on_follower_appended` after an append, `on_log_truncated` after a
    truncation. A failed effect (storage error) means the replica must be rebuilt from disk.
  * Serialize appends per partition: nothing may run between `plan_append` and
    `on_leader_appended` for the same replica.
  * The epoch cache object passed in is owned and mutated by the shell (storage); the core only
    reads it (`end_offset_for`, `latest_epoch`) and asks for changes through AssignEpoch and
    TruncateTo effects.

Concurrency contract: single-threaded; call from the event-loop thread only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from minibroker.broker.replication.events import (
    UNKNOWN_BROKER_EPOCH,
    AdvanceLogStartOffset,
    AlterPartitionResult,
    AppendAsFollower,
    AppendPlan,
    AssignEpoch,
    Backoff,
    CompleteProduce,
    ConsumerFetchAnswer,
    DuplicateAppend,
    Effect,
    EpochEndOffsetAnswer,
    FetchPosition,
    FetchResponse,
    FollowerFetch,
    FollowerFetchAnswer,
    FollowerView,
    HighWatermarkChanged,
    IsrChangeKind,
    IsrUpdated,
    LeaderRecoveryState,
    ListOffsetsAnswer,
    PartitionState,
    ProduceRejected,
    ProposeIsr,
    RemoteReplicaView,
    ReplicaConfig,
    Role,
    StartFetching,
    StopFetching,
    TruncateFullyAndStartAt,
    TruncateTo,
)
from minibroker.broker.replication.follower import (
    EpochCacheView,
    FollowerState,
    decision_for_out_of_range,
    follower_high_watermark,
    latest_epoch_of,
    truncation_for_diverging_epoch,
)
from minibroker.broker.replication.invariants import check_isr, check_offsets
from minibroker.broker.replication.producer_state import (
    ProducerBatchHeader,
    ProducerStateManager,
)
from minibroker.client.batch import CorruptRecordError, parse_header
from minibroker.client.common.invariant import invariant
from minibroker.client.errors import ErrorCode
from minibroker.client.types import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    NO_LEADER,
    UNDEFINED_EPOCH,
    UNDEFINED_EPOCH_OFFSET,
    UNKNOWN_OFFSET,
)

T = TypeVar("T")
NEVER_MS = -(1 << 62)

# What every public entry point of PartitionReplica returns: (reply, effects). The reply is the
# answer (None for a command that has none); the effects are carried out in list order.
Step = tuple[T, list[Effect]]

# AlterPartition errors after which the leader keeps its pending state and waits for metadata
# (docs/protocol.md §9): retrying cannot help, and the next PartitionRecord settles the ISR.
_WAIT_FOR_METADATA = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.INVALID_UPDATE_VERSION,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.NEW_LEADER_ELECTED,
    }
)
# AlterPartition errors after which the leader drops the proposal (no retry).
_REVERT = frozenset({ErrorCode.OPERATION_NOT_ATTEMPTED, ErrorCode.INELIGIBLE_REPLICA})
# Follower fetch errors that stop fetching until new metadata arrives (docs/protocol.md §11).
_FOLLOWER_FATAL = frozenset({ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.KAFKA_STORAGE_ERROR})


class BrokerView(Protocol):
    """The cluster's broker registrations as this broker last saw them in metadata."""

    def broker_epoch(self, broker_id: int) -> int:
        """The registered broker epoch, or -1 when the broker is unknown."""
        ...

    def is_isr_eligible(self, broker_id: int, broker_epoch: int) -> bool:
        """KIP-841/903: registered, unfenced, not in controlled shutdown, and `broker_epoch`
        equal to the registered one (or -1, unknown)."""
        ...


class AppendBatchHeader(ProducerBatchHeader, Protocol):
    """The header fields a leader append reads (client/batch.BatchHeader has them all)."""

    @property
    def last_offset_delta(self) -> int: ...


@dataclass(slots=True)
class BrokerEligibility:
    """The part of a broker's registration that decides its ISR eligibility (KIP-841/903).

    A projection, not the registration: the metadata image's full record is
    `minibroker.client.metadata.image.BrokerRegistration` (host, port, rack, incarnation, ...).
    """

    broker_epoch: int
    fenced: bool = False
    in_controlled_shutdown: bool = False


class BrokerEligibilityView:
    """A plain BrokerView the shell keeps current from RegisterBroker/BrokerChange records."""

    def __init__(self, brokers: dict[int, BrokerEligibility] | None = None) -> None:
        self._brokers: dict[int, BrokerEligibility] = dict(brokers or {})

    def update(
        self,
        broker_id: int,
        broker_epoch: int,
        *,
        fenced: bool = False,
        in_controlled_shutdown: bool = False,
    ) -> None:
        self._brokers[broker_id] = BrokerEligibility(broker_epoch, fenced, in_controlled_shutdown)

    def remove(self, broker_id: int) -> None:
        self._brokers.pop(broker_id, None)

    def broker_epoch(self, broker_id: int) -> int:
        registration = self._brokers.get(broker_id)
        return registration.broker_epoch if registration is not None else UNKNOWN_BROKER_EPOCH

    def is_isr_eligible(self, broker_id: int, broker_epoch: int) -> bool:
        registration = self._brokers.get(broker_id)
        if registration is None or registration.fenced or registration.in_controlled_shutdown:
            return False
        return broker_epoch in (UNKNOWN_BROKER_EPOCH, registration.broker_epoch)


@dataclass(slots=True)
class RemoteReplica:
    """The leader's view of one follower (Kafka's Replica.scala state).

    leo == -1 means unknown: nothing heard in this leadership yet, which holds the HW back.
    NEVER_MS as a time means "never" (Kafka uses 0 against a wall clock; virtual clocks in the
    tests and the simulation start at 0, so "never" needs its own value).
    """

    replica_id: int
    leo: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET
    last_caught_up_time_ms: int = NEVER_MS
    last_fetch_leader_leo: int = UNKNOWN_OFFSET
    last_fetch_time_ms: int = NEVER_MS
    broker_epoch: int = UNKNOWN_BROKER_EPOCH

    def reset(self, now_ms: int, leader_leo: int, is_new_leader: bool, in_isr: bool) -> None:
        """Kafka's `Replica.resetReplicaState` on becoming leader (docs/protocol.md §7)."""
        # An ISR member gets a fresh lag allowance; a non-member gets none, so it cannot hold
        # the HW back through the "caught up" clause before it has fetched.
        self.last_caught_up_time_ms = now_ms if in_isr else NEVER_MS
        if is_new_leader:
            self.leo = UNKNOWN_OFFSET
            self.log_start_offset = UNKNOWN_OFFSET
            self.last_fetch_leader_leo = UNKNOWN_OFFSET
            self.last_fetch_time_ms = NEVER_MS
            self.broker_epoch = UNKNOWN_BROKER_EPOCH
        else:
            self.last_fetch_leader_leo = leader_leo
            self.last_fetch_time_ms = now_ms if in_isr else NEVER_MS

    def update_fetch_state(
        self,
        fetch_offset: int,
        log_start_offset: int,
        now_ms: int,
        leader_leo: int,
        broker_epoch: int,
    ) -> None:
        """Kafka's `Replica.updateFetchStateOrThrow` (docs/protocol.md §7); leader_leo taken before
        the read."""
        if fetch_offset >= leader_leo:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_leo:
            # It reached what the leader had at its previous fetch: caught up as of then.
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        self.last_fetch_leader_leo = max(leader_leo, self.last_fetch_leader_leo)
        self.last_fetch_time_ms = now_ms
        self.leo = fetch_offset
        self.log_start_offset = log_start_offset
        if broker_epoch != UNKNOWN_BROKER_EPOCH:
            self.broker_epoch = broker_epoch

    def is_caught_up(self, leader_leo: int, now_ms: int, lag_time_max_ms: int) -> bool:
        return self.leo == leader_leo or now_ms - self.last_caught_up_time_ms <= lag_time_max_ms


@dataclass(frozen=True, slots=True)
class CommittedIsr:
    """No AlterPartition in flight: `isr` is the controller's."""

    isr: frozenset[int]

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.isr


@dataclass(frozen=True, slots=True)
class PendingExpandIsr:
    """AlterPartition(isr + new_replica) in flight; the new replica already gates the HW."""

    isr: frozenset[int]
    new_replica: int
    proposal: ProposeIsr

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.isr | {self.new_replica}


@dataclass(frozen=True, slots=True)
class PendingShrinkIsr:
    """AlterPartition(isr - out_of_sync) in flight; the old ISR keeps gating the HW."""

    isr: frozenset[int]
    out_of_sync: frozenset[int]
    proposal: ProposeIsr

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.isr


IsrState = CommittedIsr | PendingExpandIsr | PendingShrinkIsr


@dataclass(frozen=True, slots=True)
class PendingProduce:
    token: object
    base_offset: int
    required_offset: int  # last offset + 1: done once high_watermark >= this
    deadline_ms: int


class PartitionReplica:
    """One broker's replica of one partition: leader or follower state plus the rules."""

    def __init__(
        self,
        broker_id: int,
        epoch_cache: EpochCacheView,
        brokers: BrokerView,
        config: ReplicaConfig | None = None,
        *,
        leo: int = 0,
        log_start_offset: int = 0,
        high_watermark: int = 0,
        producer_batches: Iterable[ProducerBatchHeader] = (),
        name: str = "",
    ) -> None:
        """`leo`, `log_start_offset` and `high_watermark` come from the opened log (the HW from
        replication-offset-checkpoint, docs/design.md §4.5); the HW is clamped to [log start, LEO].
        `producer_batches` are the log's batch headers the idempotence state is rebuilt from.
        """
        self._broker_id = broker_id
        self._name = name
        self._config = config or ReplicaConfig()
        self._epoch_cache = epoch_cache
        self._brokers = brokers
        self._producer_state = ProducerStateManager()
        self._producer_state.rebuild(producer_batches)

        self._role = Role.NONE
        self._leader_id = NO_LEADER
        self._leader_epoch = UNDEFINED_EPOCH
        self._partition_epoch = UNDEFINED_EPOCH
        self._replicas: tuple[int, ...] = ()
        self._isr_state: IsrState = CommittedIsr(frozenset())
        self._leader_recovery_state = LeaderRecoveryState.RECOVERED
        # The LEO when this broker became leader in the current epoch; -1 when not leader.
        self._leader_epoch_start_offset = UNKNOWN_OFFSET

        # Invariant: log_start_offset <= high_watermark <= leo.
        self._leo = leo
        self._log_start_offset = log_start_offset
        self._high_watermark = max(log_start_offset, min(high_watermark, leo))

        self._remotes: dict[int, RemoteReplica] = {}
        self._follower: FollowerState | None = None
        self._pending_produces: deque[PendingProduce] = deque()
        self._next_proposal_id = 1
        self._last_divergence: tuple[int, int, int, int] | None = None

    # -- read-only views (the only state a shell may read) -------------------------------------

    @property
    def broker_id(self) -> int:
        return self._broker_id

    @property
    def name(self) -> str:
        return self._name

    @property
    def config(self) -> ReplicaConfig:
        return self._config

    @property
    def role(self) -> Role:
        return self._role

    @property
    def leader_id(self) -> int:
        return self._leader_id

    @property
    def leader_epoch(self) -> int:
        return self._leader_epoch

    @property
    def partition_epoch(self) -> int:
        return self._partition_epoch

    @property
    def replicas(self) -> tuple[int, ...]:
        return self._replicas

    @property
    def leader_recovery_state(self) -> LeaderRecoveryState:
        return self._leader_recovery_state

    @property
    def leader_epoch_start_offset(self) -> int:
        """The LEO when this broker became leader in the current epoch; -1 when not leader."""
        return self._leader_epoch_start_offset

    @property
    def leo(self) -> int:
        return self._leo

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def follower_state(self) -> FollowerView | None:
        """A follower's fetch state (None unless this replica is a follower with a leader)."""
        follower = self._follower
        if self._role is not Role.FOLLOWER or follower is None:
            return None
        return FollowerView(
            follower.leader_id,
            follower.leader_epoch,
            follower.leader_high_watermark,
            follower.leader_log_start_offset,
            follower.backoff_until_ms,
            follower.failed,
        )

    @property
    def remote_replicas(self) -> tuple[RemoteReplicaView, ...]:
        """A leader's view of its followers in assignment order (empty unless leader)."""
        return tuple(
            RemoteReplicaView(
                r.replica_id, r.leo, r.log_start_offset, r.last_caught_up_time_ms, r.broker_epoch
            )
            for r in self._remotes.values()
        )

    def replica_leo(self, broker_id: int) -> int:
        """A leader's last known LEO of follower `broker_id` (KIP-392's preferred read replica
        must hold the fetch offset); -1 when unknown or not a follower of this leader."""
        remote = self._remotes.get(broker_id)
        return remote.leo if remote is not None else UNKNOWN_OFFSET

    @property
    def isr(self) -> frozenset[int]:
        """The committed ISR (the controller's, as last applied or confirmed)."""
        return self._isr_state.isr

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self._isr_state.maximal_isr

    @property
    def is_leader(self) -> bool:
        return self._role is Role.LEADER

    @property
    def effective_min_isr(self) -> int:
        return min(self._config.min_insync_replicas, max(len(self._replicas), 1))

    @property
    def pending_produce_count(self) -> int:
        return len(self._pending_produces)

    @property
    def alter_partition_in_flight(self) -> bool:
        return not isinstance(self._isr_state, CommittedIsr)

    def check_invariants(self) -> None:
        """Local invariants (docs/design.md §8.7, §8.8); the simulation checks them every step."""
        where = f"{self._name} broker {self._broker_id}: "
        check_offsets(self._log_start_offset, self._high_watermark, self._leo, where)
        if self._role is Role.LEADER:
            check_isr(self._replicas, self.isr, self._broker_id, where)
            invariant(self.isr <= self.maximal_isr, f"{where}ISR not within the maximal ISR")
            invariant(
                self._leader_epoch_start_offset <= self._leo,
                f"{where}epoch start {self._leader_epoch_start_offset} above LEO {self._leo}",
            )

    # -- configuration and metadata ------------------------------------------------------

    def update_config(self, config: ReplicaConfig, now_ms: int) -> Step[None]:
        """Topic config changed (e.g. min.insync.replicas): the HW may move."""
        self._config = config
        return None, self._maybe_advance_high_watermark(now_ms)

    def apply_partition_state(self, state: PartitionState, now_ms: int) -> Step[None]:
        """Apply the controller's record for this partition (docs/protocol.md §10, §11)."""
        if state.partition_epoch < self._partition_epoch or state.leader_epoch < self._leader_epoch:
            return None, []  # stale delivery: never go back (docs/design.md §8.4)
        if (
            state.partition_epoch == self._partition_epoch
            and state.leader_epoch == self._leader_epoch
            and self._role is not Role.NONE
        ):
            return None, []  # already applied
        if self._broker_id not in state.replicas:
            return None, self._become_none(state)
        if state.leader == self._broker_id:
            return None, self._become_leader(state, now_ms)
        return None, self._become_follower(state)

    def _become_none(self, state: PartitionState) -> list[Effect]:
        effects: list[Effect] = self._fail_pending_produces("no longer a replica of the partition")
        if self._role is Role.FOLLOWER and self._follower is not None:
            effects.append(StopFetching("removed from the replica set"))
        self._set_record(state)
        self._role = Role.NONE
        self._follower = None
        self._remotes.clear()
        self._leader_epoch_start_offset = UNKNOWN_OFFSET
        return effects

    def _set_record(self, state: PartitionState) -> None:
        self._replicas = state.replicas
        self._leader_id = state.leader
        self._leader_epoch = state.leader_epoch
        self._partition_epoch = state.partition_epoch
        self._isr_state = CommittedIsr(state.isr)
        self._leader_recovery_state = state.leader_recovery_state

    def _become_leader(self, state: PartitionState, now_ms: int) -> list[Effect]:
        effects: list[Effect] = []
        is_new_leader = self._role is not Role.LEADER
        # A leader that was not leading before starts an epoch even if (defensively) the record
        # repeats the epoch number; a re-elected leader starts one when the epoch grew.
        starts_epoch = state.leader_epoch > self._leader_epoch or is_new_leader
        if self._role is Role.FOLLOWER and self._follower is not None:
            effects.append(StopFetching("became leader"))
        self._follower = None
        self._last_divergence = None

        old_remotes = self._remotes
        self._remotes = {
            r: old_remotes.get(r, RemoteReplica(r)) for r in state.replicas if r != self._broker_id
        }
        self._set_record(state)
        # KIP-704: the new leader serves the partition, so it is recovered from here on; the
        # next AlterPartition reports it to the controller.
        self._leader_recovery_state = LeaderRecoveryState.RECOVERED
        self._role = Role.LEADER
        self._leader_id = self._broker_id

        if starts_epoch:
            start = self._leo
            # KIP-279: record where this epoch starts before any write in it, so a follower
            # holding a later (unseen here) epoch still gets a correct truncation point.
            effects.append(AssignEpoch(state.leader_epoch, start))
            for remote in self._remotes.values():
                remote.reset(now_ms, start, is_new_leader, remote.replica_id in state.isr)
            self._leader_epoch_start_offset = start
        effects += self._maybe_advance_high_watermark(now_ms)
        return effects

    def _become_follower(self, state: PartitionState) -> list[Effect]:
        effects: list[Effect] = []
        was_leader = self._role is Role.LEADER
        restart = (
            was_leader
            or self._follower is None
            or state.leader_epoch > self._leader_epoch
            or state.leader != self._leader_id
        )
        if was_leader:
            effects += self._fail_pending_produces("leadership moved")
            self._remotes.clear()
            self._leader_epoch_start_offset = UNKNOWN_OFFSET
        self._set_record(state)
        self._role = Role.FOLLOWER
        if restart:
            # KAFKA-7164: a new leader epoch always restarts fetching, even from the same leader.
            self._last_divergence = None
            if state.leader == NO_LEADER:
                if self._follower is not None:
                    effects.append(StopFetching("the partition has no leader"))
                self._follower = None
            else:
                self._follower = FollowerState(state.leader, state.leader_epoch)
                effects.append(StartFetching(state.leader, state.leader_epoch))
        return effects

    # -- leader: produce -------------------------------------------------------------------

    def plan_append(
        self, acks: int, batches: Sequence[AppendBatchHeader]
    ) -> Step[AppendPlan | DuplicateAppend | ProduceRejected]:
        """Decide a produce for this partition before anything is written (docs/protocol.md §2).

        `batches` are the validated headers in request order (client/batch.BatchHeader).
        Replies with an AppendPlan (stamp and append it, then call `on_leader_appended`), a
        DuplicateAppend (a retry already in the log: answer with its original offsets; for
        acks=all pass it to `park_produce`) or a ProduceRejected (an error). No effects.
        """
        return self._plan_append(acks, batches), []

    def _plan_append(
        self, acks: int, batches: Sequence[AppendBatchHeader]
    ) -> AppendPlan | DuplicateAppend | ProduceRejected:
        if self._role is not Role.LEADER:
            return ProduceRejected(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        if acks not in (-1, 0, 1):
            return ProduceRejected(ErrorCode.INVALID_REQUIRED_ACKS, message=f"acks={acks}")
        if acks == -1 and len(self.isr) < self.effective_min_isr:
            return ProduceRejected(
                ErrorCode.NOT_ENOUGH_REPLICAS,
                message=f"ISR {sorted(self.isr)} is smaller than min.insync.replicas "
                f"{self.effective_min_isr}",
            )
        if acks == -1 and len(self._pending_produces) >= self._config.max_pending_produces:
            return ProduceRejected(
                ErrorCode.REQUEST_TIMED_OUT,
                message=f"{len(self._pending_produces)} acks=all produce requests already wait",
            )
        verdict, index = self._producer_state.check_batches(
            [(b.producer_id, b.producer_epoch, b.base_sequence, b.last_sequence) for b in batches]
        )
        if verdict.duplicate is not None:
            return DuplicateAppend(verdict.duplicate.first_offset, verdict.duplicate.last_offset)
        if verdict.error != ErrorCode.NONE:
            return ProduceRejected(verdict.error, message=f"batch {index}: {verdict.message}")
        offset = self._leo
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
        return AppendPlan(self._leo, offset, self._leader_epoch, acks, tuple(stamped))

    def on_leader_appended(
        self, plan: AppendPlan, now_ms: int, *, token: object = None, deadline_ms: int = 0
    ) -> Step[None]:
        """The planned batches are in the log. For acks=all with a `token`, the produce is parked
        and completed later by a CompleteProduce effect (possibly in this list)."""
        invariant(
            self._role is Role.LEADER and plan.leader_epoch == self._leader_epoch,
            f"{self._name}: append planned in epoch {plan.leader_epoch} finished in "
            f"{self._leader_epoch} as {self._role.value}",
        )
        invariant(
            plan.base_offset == self._leo,
            f"{self._name}: append planned at {plan.base_offset} but the LEO is {self._leo}",
        )
        self._leo = plan.next_offset
        for batch in plan.producer_batches:
            self._producer_state.record(*batch)
        effects = self._maybe_advance_high_watermark(now_ms)
        if plan.acks == -1 and token is not None:
            effects += self._park(token, plan.base_offset, plan.next_offset - 1, deadline_ms)
        return None, effects

    def park_produce(
        self, token: object, base_offset: int, last_offset: int, deadline_ms: int
    ) -> Step[None]:
        """Wait for the HW to pass `last_offset` (acks=all, e.g. a DuplicateAppend), or answer at
        once (a CompleteProduce in the effects) if it has."""
        return None, self._park(token, base_offset, last_offset, deadline_ms)

    def _park(
        self, token: object, base_offset: int, last_offset: int, deadline_ms: int
    ) -> list[Effect]:
        pending = PendingProduce(token, base_offset, last_offset + 1, deadline_ms)
        if self._high_watermark >= pending.required_offset:
            return [self._completion(pending)]
        self._pending_produces.append(pending)
        return []

    def expire_produces(self, now_ms: int) -> Step[None]:
        """Answer parked produces past their deadline: REQUEST_TIMED_OUT (docs/protocol.md §2)."""
        expired = [p for p in self._pending_produces if p.deadline_ms <= now_ms]
        if not expired:
            return None, []
        self._pending_produces = deque(p for p in self._pending_produces if p.deadline_ms > now_ms)
        return None, [
            CompleteProduce(
                p.token,
                ErrorCode.REQUEST_TIMED_OUT,
                p.base_offset,
                self._log_start_offset,
                "the high watermark did not reach the batch in time",
            )
            for p in expired
        ]

    def _completion(self, pending: PendingProduce) -> CompleteProduce:
        if len(self.maximal_isr) >= self.effective_min_isr:
            return CompleteProduce(
                pending.token, ErrorCode.NONE, pending.base_offset, self._log_start_offset
            )
        return CompleteProduce(
            pending.token,
            ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            pending.base_offset,
            self._log_start_offset,
            f"the ISR {sorted(self.maximal_isr)} fell below min.insync.replicas "
            f"{self.effective_min_isr}",
        )

    def _complete_produces(self) -> list[Effect]:
        done: list[Effect] = []
        remaining: deque[PendingProduce] = deque()
        for pending in self._pending_produces:
            if self._high_watermark >= pending.required_offset:
                done.append(self._completion(pending))
            else:
                remaining.append(pending)
        self._pending_produces = remaining
        return done

    def _fail_pending_produces(self, reason: str) -> list[Effect]:
        failed: list[Effect] = [
            CompleteProduce(
                p.token,
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                p.base_offset,
                self._log_start_offset,
                reason,
            )
            for p in self._pending_produces
        ]
        self._pending_produces.clear()
        return failed

    # -- leader: fetches and offsets ----------------------------------------------------

    def _check_current_leader_epoch(self, current_leader_epoch: int) -> ErrorCode | None:
        """KIP-320 fencing (docs/protocol.md §12): -1 is not checked."""
        if current_leader_epoch < 0:
            return None
        if current_leader_epoch < self._leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        if current_leader_epoch > self._leader_epoch:
            return ErrorCode.UNKNOWN_LEADER_EPOCH
        return None

    def _fetch_error(self, error: ErrorCode, message: str = "") -> FollowerFetchAnswer:
        return FollowerFetchAnswer(
            error,
            high_watermark=self._high_watermark,
            log_start_offset=self._log_start_offset,
            log_end_offset=self._leo,
            message=message,
        )

    def handle_follower_fetch(self, fetch: FollowerFetch, now_ms: int) -> Step[FollowerFetchAnswer]:
        """A follower's fetch for this partition (docs/protocol.md §7, §11 step 3, §12)."""
        effects: list[Effect] = []
        answer = self._follower_fetch(fetch, now_ms, effects)
        return answer, effects

    def _follower_fetch(
        self, fetch: FollowerFetch, now_ms: int, effects: list[Effect]
    ) -> FollowerFetchAnswer:
        epoch_error = self._check_current_leader_epoch(fetch.current_leader_epoch)
        if epoch_error is not None:
            return self._fetch_error(
                epoch_error,
                f"fetch in leader epoch {fetch.current_leader_epoch}, this replica is in "
                f"{self._leader_epoch}",
            )
        if self._role is not Role.LEADER:
            return self._fetch_error(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        remote = self._remotes.get(fetch.replica_id)
        if remote is None:
            # The (replica, epoch) pair is not known yet, e.g. a replica being added.
            error = (
                ErrorCode.UNKNOWN_LEADER_EPOCH
                if fetch.current_leader_epoch >= 0
                else ErrorCode.NOT_LEADER_OR_FOLLOWER
            )
            return self._fetch_error(error, f"replica {fetch.replica_id} is not assigned")
        if fetch.broker_epoch != UNKNOWN_BROKER_EPOCH and (
            remote.broker_epoch > fetch.broker_epoch
            or self._brokers.broker_epoch(fetch.replica_id) > fetch.broker_epoch
        ):
            # KIP-903: a fetch from an earlier incarnation must not update state or expand ISR.
            return self._fetch_error(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"stale broker epoch {fetch.broker_epoch} for replica {fetch.replica_id}",
            )

        # HW, log start and LEO are taken before the read (docs/protocol.md §6).
        high_watermark, log_start_offset, leo = (
            self._high_watermark,
            self._log_start_offset,
            self._leo,
        )
        if fetch.last_fetched_epoch != UNDEFINED_EPOCH:
            epoch, end_offset = self._epoch_cache.end_offset_for(fetch.last_fetched_epoch, leo)
            if end_offset == UNDEFINED_EPOCH_OFFSET or epoch == UNDEFINED_EPOCH:
                return self._fetch_error(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"no end offset for last fetched epoch {fetch.last_fetched_epoch}",
                )
            if fetch.fetch_offset < log_start_offset:
                return self._fetch_error(ErrorCode.OFFSET_OUT_OF_RANGE, "below the log start")
            if epoch < fetch.last_fetched_epoch or end_offset < fetch.fetch_offset:
                # Divergence: answer with where the follower's epoch ends here; the follower's
                # state is not updated by such a fetch (docs/protocol.md §7).
                return FollowerFetchAnswer(
                    ErrorCode.NONE,
                    high_watermark=high_watermark,
                    log_start_offset=log_start_offset,
                    log_end_offset=leo,
                    diverging_epoch=(epoch, end_offset),
                    fetch_offset=fetch.fetch_offset,
                    read_until_offset=fetch.fetch_offset,
                )
        if fetch.fetch_offset < log_start_offset or fetch.fetch_offset > leo:
            return self._fetch_error(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"fetch offset {fetch.fetch_offset} outside [{log_start_offset}, {leo}]",
            )

        remote.update_fetch_state(
            fetch.fetch_offset, fetch.log_start_offset, now_ms, leo, fetch.broker_epoch
        )
        effects += self._maybe_expand_isr(remote)
        effects += self._maybe_advance_high_watermark(now_ms)
        return FollowerFetchAnswer(
            ErrorCode.NONE,
            high_watermark=high_watermark,
            log_start_offset=log_start_offset,
            log_end_offset=leo,
            fetch_offset=fetch.fetch_offset,
            read_until_offset=leo,
        )

    def check_consumer_fetch(
        self, current_leader_epoch: int, fetch_offset: int, *, allow_follower: bool = False
    ) -> Step[ConsumerFetchAnswer]:
        """A consumer read, capped at this replica's HW (docs/protocol.md §6, §10; KIP-392 when
        `allow_follower`)."""
        return self._check_consumer_fetch(
            current_leader_epoch, fetch_offset, allow_follower=allow_follower
        ), []

    def _check_consumer_fetch(
        self, current_leader_epoch: int, fetch_offset: int, *, allow_follower: bool = False
    ) -> ConsumerFetchAnswer:
        epoch_error = self._check_current_leader_epoch(current_leader_epoch)
        if epoch_error is not None:
            return ConsumerFetchAnswer(epoch_error)
        serving = self._role is Role.LEADER or (allow_follower and self._role is Role.FOLLOWER)
        if not serving:
            return ConsumerFetchAnswer(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        answer = ConsumerFetchAnswer(
            ErrorCode.NONE,
            high_watermark=self._high_watermark,
            log_start_offset=self._log_start_offset,
            log_end_offset=self._leo,
            read_until_offset=self._high_watermark,
        )
        if fetch_offset < self._log_start_offset or fetch_offset > self._leo:
            return ConsumerFetchAnswer(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                high_watermark=self._high_watermark,
                log_start_offset=self._log_start_offset,
                log_end_offset=self._leo,
                message=f"offset {fetch_offset} outside [{self._log_start_offset}, {self._leo}]",
            )
        if fetch_offset > self._high_watermark and self._high_watermark_lags_epoch_start():
            # KIP-207 (docs/protocol.md §10): a consumer ahead of a new leader's lagging HW
            # retries instead of waiting on an empty answer; it read that far from the previous
            # leader.
            return ConsumerFetchAnswer(
                ErrorCode.OFFSET_NOT_AVAILABLE,
                high_watermark=self._high_watermark,
                log_start_offset=self._log_start_offset,
                log_end_offset=self._leo,
                message="the new leader's high watermark has not caught up yet",
            )
        return answer

    def _high_watermark_lags_epoch_start(self) -> bool:
        return self._role is Role.LEADER and self._leader_epoch_start_offset > self._high_watermark

    def list_offsets(self, current_leader_epoch: int, timestamp: int) -> Step[ListOffsetsAnswer]:
        """ListOffsets for a client (KIP-207; docs/protocol.md §10)."""
        return self._list_offsets(current_leader_epoch, timestamp), []

    def _list_offsets(self, current_leader_epoch: int, timestamp: int) -> ListOffsetsAnswer:
        epoch_error = self._check_current_leader_epoch(current_leader_epoch)
        if epoch_error is not None:
            return ListOffsetsAnswer(epoch_error)
        if self._role is not Role.LEADER:
            return ListOffsetsAnswer(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        lagging = self._high_watermark_lags_epoch_start()
        if timestamp == EARLIEST_TIMESTAMP:
            return ListOffsetsAnswer(ErrorCode.NONE, self._log_start_offset, self._leader_epoch)
        if timestamp == LATEST_TIMESTAMP:
            if lagging:
                return ListOffsetsAnswer(
                    ErrorCode.OFFSET_NOT_AVAILABLE,
                    message=f"high watermark {self._high_watermark} is below the epoch start "
                    f"{self._leader_epoch_start_offset}",
                )
            return ListOffsetsAnswer(ErrorCode.NONE, self._high_watermark, self._leader_epoch)
        return ListOffsetsAnswer(
            ErrorCode.NONE,
            leader_epoch=self._leader_epoch,
            needs_timestamp_lookup=True,
            last_fetchable_offset=self._high_watermark,
            lagging_high_watermark=lagging,
        )

    def offset_for_leader_epoch(
        self, current_leader_epoch: int, leader_epoch: int
    ) -> Step[EpochEndOffsetAnswer]:
        """OffsetForLeaderEpoch for a consumer validating its position after a leader change
        (KIP-320): fenced like a fetch, answered by the leader only, from the epoch cache
        (`endOffsetFor`, docs/protocol.md §13)."""
        return self._offset_for_leader_epoch(current_leader_epoch, leader_epoch), []

    def _offset_for_leader_epoch(
        self, current_leader_epoch: int, leader_epoch: int
    ) -> EpochEndOffsetAnswer:
        epoch_error = self._check_current_leader_epoch(current_leader_epoch)
        if epoch_error is not None:
            return EpochEndOffsetAnswer(epoch_error)
        if self._role is not Role.LEADER:
            return EpochEndOffsetAnswer(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        epoch, end_offset = self._epoch_cache.end_offset_for(leader_epoch, self._leo)
        return EpochEndOffsetAnswer(ErrorCode.NONE, epoch, end_offset)

    # -- leader: high watermark and ISR ---------------------------------------------------

    def _maybe_advance_high_watermark(self, now_ms: int) -> list[Effect]:
        """Kafka's `Partition.maybeIncrementLeaderHW` (docs/protocol.md §6)."""
        if self._role is not Role.LEADER:
            return []
        if len(self.isr) < self.effective_min_isr:
            return []  # strict min ISR (KIP-966 part 1): no advance at any acks level
        maximal_isr = self.maximal_isr
        lag_max = self._config.replica_lag_time_max_ms
        new_hw = self._leo
        for remote in self._remotes.values():
            if remote.leo >= new_hw:
                continue
            if remote.replica_id in maximal_isr or (
                remote.is_caught_up(self._leo, now_ms, lag_max)
                and self._brokers.is_isr_eligible(remote.replica_id, remote.broker_epoch)
            ):
                # A caught-up replica outside the ISR holds the HW too, or it could chase a
                # moving HW forever and never rejoin.
                new_hw = remote.leo
        if new_hw <= self._high_watermark:
            return []
        self._high_watermark = new_hw
        effects: list[Effect] = [HighWatermarkChanged(new_hw)]
        effects += self._complete_produces()
        return effects

    def _isr_with_epochs(self, isr: Iterable[int]) -> tuple[tuple[int, int], ...]:
        pairs = []
        for broker_id in sorted(isr):
            if broker_id == self._broker_id:
                pairs.append((broker_id, self._brokers.broker_epoch(broker_id)))
            else:
                remote = self._remotes.get(broker_id)
                pairs.append((broker_id, remote.broker_epoch if remote else UNKNOWN_BROKER_EPOCH))
        return tuple(pairs)

    def _proposal(self, kind: IsrChangeKind, new_isr: frozenset[int]) -> ProposeIsr:
        proposal = ProposeIsr(
            proposal_id=self._next_proposal_id,
            kind=kind,
            leader_epoch=self._leader_epoch,
            partition_epoch=self._partition_epoch,
            new_isr_with_epochs=self._isr_with_epochs(new_isr),
            leader_recovery_state=self._leader_recovery_state,
        )
        self._next_proposal_id += 1
        return proposal

    def _maybe_expand_isr(self, remote: RemoteReplica) -> list[Effect]:
        """Kafka's `Partition.maybeExpandIsr`: add a follower that reached the HW and this epoch's
        start (docs/protocol.md §8)."""
        state = self._isr_state
        if not isinstance(state, CommittedIsr) or remote.replica_id in state.isr:
            return []
        if remote.leo < self._high_watermark or remote.leo < self._leader_epoch_start_offset:
            return []
        if not self._brokers.is_isr_eligible(remote.replica_id, remote.broker_epoch):
            return []
        proposal = self._proposal(IsrChangeKind.EXPAND, state.isr | {remote.replica_id})
        self._isr_state = PendingExpandIsr(state.isr, remote.replica_id, proposal)
        return [proposal]

    def _is_remote_caught_up(self, replica_id: int, now_ms: int, lag_max: int) -> bool:
        remote = self._remotes.get(replica_id)
        return remote is not None and remote.is_caught_up(self._leo, now_ms, lag_max)

    def maybe_shrink_isr(self, now_ms: int) -> Step[None]:
        """Kafka's `Partition.maybeShrinkIsr` (docs/protocol.md §8): run every
        replica.lag.time.max.ms / 2; never with an AlterPartition in flight."""
        return None, self._maybe_shrink_isr(now_ms)

    def _maybe_shrink_isr(self, now_ms: int) -> list[Effect]:
        if self._role is not Role.LEADER:
            return []
        effects = self._maybe_advance_high_watermark(now_ms)
        state = self._isr_state
        if not isinstance(state, CommittedIsr):
            return effects
        lag_max = self._config.replica_lag_time_max_ms
        out_of_sync = frozenset(
            r
            for r in state.isr
            if r != self._broker_id and not self._is_remote_caught_up(r, now_ms, lag_max)
        )
        if not out_of_sync:
            return effects
        proposal = self._proposal(IsrChangeKind.SHRINK, state.isr - out_of_sync)
        self._isr_state = PendingShrinkIsr(state.isr, out_of_sync, proposal)
        effects.append(proposal)
        return effects

    def on_alter_partition_result(self, result: AlterPartitionResult, now_ms: int) -> Step[None]:
        """The controller answered a ProposeIsr (docs/protocol.md §9, the leader's side)."""
        return None, self._on_alter_partition_result(result, now_ms)

    def _on_alter_partition_result(self, result: AlterPartitionResult, now_ms: int) -> list[Effect]:
        state = self._isr_state
        if (
            self._role is not Role.LEADER
            or isinstance(state, CommittedIsr)
            or state.proposal.proposal_id != result.proposal_id
        ):
            return []  # the local state moved on (new metadata) since the proposal
        if result.error == ErrorCode.NONE:
            if (
                result.leader_epoch != self._leader_epoch
                or result.partition_epoch < self._partition_epoch
            ):
                return []  # an answer for another epoch: wait for metadata
            invariant(
                self._broker_id in result.isr,
                f"{self._name}: committed ISR {sorted(result.isr)} lacks the leader",
            )
            old_isr = state.isr
            self._isr_state = CommittedIsr(frozenset(result.isr))
            self._partition_epoch = result.partition_epoch
            self._leader_recovery_state = result.leader_recovery_state
            effects: list[Effect] = [
                IsrUpdated(state.proposal.kind, old_isr, self.isr, self._partition_epoch)
            ]
            return effects + self._maybe_advance_high_watermark(now_ms)
        if result.error in _REVERT:
            self._isr_state = CommittedIsr(state.isr)
            return self._maybe_advance_high_watermark(now_ms)
        if result.error in _WAIT_FOR_METADATA:
            return []
        # Transport errors, NOT_CONTROLLER, timeouts: send the same proposal again.
        return [
            ProposeIsr(
                proposal_id=state.proposal.proposal_id,
                kind=state.proposal.kind,
                leader_epoch=state.proposal.leader_epoch,
                partition_epoch=state.proposal.partition_epoch,
                new_isr_with_epochs=state.proposal.new_isr_with_epochs,
                leader_recovery_state=state.proposal.leader_recovery_state,
                delay_ms=self._config.alter_partition_retry_ms,
            )
        ]

    # -- follower ----------------------------------------------------------------------------

    def next_fetch(self, now_ms: int) -> Step[FetchPosition | None]:
        """What to ask the leader for now; None while there is nothing to fetch (no leader,
        failed until new metadata, or backing off)."""
        return self._next_fetch(now_ms), []

    def _next_fetch(self, now_ms: int) -> FetchPosition | None:
        follower = self._follower
        if self._role is not Role.FOLLOWER or follower is None or follower.failed:
            return None
        if now_ms < follower.backoff_until_ms:
            return None
        return FetchPosition(
            leader_id=follower.leader_id,
            current_leader_epoch=self._leader_epoch,
            fetch_offset=self._leo,
            last_fetched_epoch=latest_epoch_of(self._epoch_cache),
            log_start_offset=self._log_start_offset,
        )

    def on_fetch_response(
        self, request: FetchPosition, response: FetchResponse, now_ms: int
    ) -> Step[None]:
        """The leader answered `request` (docs/protocol.md §11 steps 4-8)."""
        return None, self._on_fetch_response(request, response, now_ms)

    def _on_fetch_response(
        self, request: FetchPosition, response: FetchResponse, now_ms: int
    ) -> list[Effect]:
        follower = self._follower
        if (
            self._role is not Role.FOLLOWER
            or follower is None
            or follower.failed
            or request.leader_id != follower.leader_id
            or request.current_leader_epoch != self._leader_epoch
            or request.fetch_offset != self._leo
        ):
            # KIP-320: only the answer to the fetch sent from this position in this epoch may
            # truncate or append; anything else is stale.
            return []
        error = response.error
        if error == ErrorCode.NONE:
            if response.diverging_epoch is not None:
                return self._on_diverging_epoch(request, response, now_ms)
            self._last_divergence = None
            follower.leader_high_watermark = response.high_watermark
            follower.leader_log_start_offset = response.log_start_offset
            if response.records:
                try:
                    base_offset = parse_header(response.records).base_offset
                except CorruptRecordError as err:
                    return self._backoff(now_ms, f"corrupt fetch response: {err.reason}")
                if base_offset != self._leo:
                    return self._backoff(
                        now_ms, f"leader sent offset {base_offset}, expected {self._leo}"
                    )
                return [AppendAsFollower(response.records, self._leo)]
            return self._update_follower_high_watermark()
        if error == ErrorCode.OFFSET_OUT_OF_RANGE:
            decision = decision_for_out_of_range(
                self._leo, response.log_end_offset, response.log_start_offset
            )
            if decision.truncate_to is not None:
                return [TruncateTo(decision.truncate_to, "leader log ends below ours")]
            if decision.truncate_fully_and_start_at is not None:
                return [
                    TruncateFullyAndStartAt(
                        decision.truncate_fully_and_start_at, "below the leader's log start"
                    )
                ]
            return self._backoff(now_ms, "offset out of range")
        if error in _FOLLOWER_FATAL:
            # Our epoch is behind (or the disk failed): stop until new metadata arrives.
            follower.failed = True
            return [StopFetching(f"{error.name}: waiting for new metadata")]
        return self._backoff(now_ms, error.name)

    def _backoff(self, now_ms: int, reason: str) -> list[Effect]:
        follower = self._follower
        invariant(follower is not None, f"{self._name}: backoff without a follower state")
        delay = self._config.replica_fetch_backoff_ms
        follower.backoff_until_ms = now_ms + delay  # type: ignore[union-attr]
        return [Backoff(delay, reason)]

    def _on_diverging_epoch(
        self, request: FetchPosition, response: FetchResponse, now_ms: int
    ) -> list[Effect]:
        assert response.diverging_epoch is not None
        epoch, end_offset = response.diverging_epoch
        key = (request.fetch_offset, request.last_fetched_epoch, epoch, end_offset)
        decision = truncation_for_diverging_epoch(epoch, end_offset, self._epoch_cache, self._leo)
        if key == self._last_divergence and decision.offset >= self._leo:
            # The same answer to the same question after a truncation that changed nothing:
            # do not spin; the leader's state has to move first.
            return self._backoff(now_ms, "repeated divergence without progress")
        self._last_divergence = key
        # Truncate even at the LEO: it removes a stray epoch-cache entry (KAFKA-10706).
        return [
            TruncateTo(
                decision.offset,
                f"diverging epoch ({epoch}, {end_offset}) after last fetched epoch "
                f"{request.last_fetched_epoch}",
            )
        ]

    def on_follower_appended(
        self, leo: int, headers: Iterable[ProducerBatchHeader] = ()
    ) -> Step[None]:
        """AppendAsFollower is done; `headers` are the appended batches (producer state)."""
        return None, self._on_follower_appended(leo, headers)

    def _on_follower_appended(
        self, leo: int, headers: Iterable[ProducerBatchHeader] = ()
    ) -> list[Effect]:
        invariant(leo >= self._leo, f"{self._name}: follower append moved the LEO back")
        self._leo = leo
        for header in headers:
            self._producer_state.record_header(header)
        return self._update_follower_high_watermark()

    def _update_follower_high_watermark(self) -> list[Effect]:
        follower = self._follower
        if follower is None or follower.leader_high_watermark < 0:
            return []
        effects: list[Effect] = []
        new_hw = follower_high_watermark(
            follower.leader_high_watermark, self._log_start_offset, self._leo
        )
        if new_hw != self._high_watermark:
            self._high_watermark = new_hw
            effects.append(HighWatermarkChanged(new_hw))
        leader_start = min(follower.leader_log_start_offset, self._high_watermark)
        if leader_start > self._log_start_offset:
            self._log_start_offset = leader_start
            self._producer_state.truncate_from_start(leader_start)
            effects.append(AdvanceLogStartOffset(leader_start))
        return effects

    # -- both roles: storage facts --------------------------------------------------------

    def on_log_truncated(self, leo: int, log_start_offset: int) -> Step[None]:
        """TruncateTo / TruncateFullyAndStartAt is done: the log now ends at `leo`."""
        return None, self._on_log_truncated(leo, log_start_offset)

    def _on_log_truncated(self, leo: int, log_start_offset: int) -> list[Effect]:
        invariant(self._role is not Role.LEADER, f"{self._name}: a leader never truncates its log")
        self._leo = leo
        self._log_start_offset = log_start_offset
        self._producer_state.truncate_to(leo)
        if log_start_offset == leo:
            self._producer_state.truncate_from_start(log_start_offset)
        new_hw = max(log_start_offset, min(self._high_watermark, leo))
        if new_hw != self._high_watermark:
            self._high_watermark = new_hw
            return [HighWatermarkChanged(new_hw)]
        return []

    def on_log_start_offset_advanced(self, log_start_offset: int) -> Step[None]:
        """Retention raised the log start, never above the HW (docs/design.md §4.4)."""
        invariant(
            log_start_offset <= self._high_watermark,
            f"{self._name}: log start {log_start_offset} above the HW {self._high_watermark}",
        )
        if log_start_offset > self._log_start_offset:
            self._log_start_offset = log_start_offset
            self._producer_state.truncate_from_start(log_start_offset)
        return None, []
