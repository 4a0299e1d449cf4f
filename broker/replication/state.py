"""What one replica of one partition knows, and the read-only face it shows its shell.

Pure: no I/O. `ReplicaState` holds the state `PartitionReplica` (partition.py) changes by its
rules: the controller's record (replicas, leader, epochs, ISR state), the local offsets
(log start <= HW <= LEO), the leader's records of its followers, the follower's fetch state,
the produce purgatory and the producer state. Everything a shell, the simulation or a test may
read is a read-only property here; nothing else of the state is public (a test enforces it).

Concurrency contract: single-threaded; read from the thread that drives the replica.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from minibroker.broker.replication import reads
from minibroker.broker.replication.acks import ProducePurgatory
from minibroker.broker.replication.eligibility import BrokerView
from minibroker.broker.replication.events import (
    ConsumerFetchAnswer,
    Effect,
    EpochEndOffsetAnswer,
    FollowerView,
    LeaderRecoveryState,
    ListOffsetsAnswer,
    RemoteReplicaView,
    ReplicaConfig,
    Role,
)
from minibroker.broker.replication.follower import EpochCacheView, FollowerState
from minibroker.broker.replication.invariants import check_isr, check_offsets
from minibroker.broker.replication.isr import CommittedIsr, IsrState
from minibroker.broker.replication.producer_state import (
    ProducerBatchHeader,
    ProducerStateManager,
)
from minibroker.broker.replication.remote import RemoteReplica
from minibroker.client.common.invariant import invariant
from minibroker.client.types import NO_LEADER, UNDEFINED_EPOCH, UNKNOWN_OFFSET

T = TypeVar("T")

# What every public entry point of PartitionReplica returns: (reply, effects). The reply is the
# answer (None for a command that has none); the effects are carried out in list order.
Step = tuple[T, list[Effect]]


class ReplicaState:
    """The state of one broker's replica of one partition; PartitionReplica adds the rules."""

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
        self._leader_epoch_start_offset = UNKNOWN_OFFSET

        # Invariant: log_start_offset <= high_watermark <= leo.
        self._leo = leo
        self._log_start_offset = log_start_offset
        self._high_watermark = max(log_start_offset, min(high_watermark, leo))

        self._remotes: dict[int, RemoteReplica] = {}
        self._follower: FollowerState | None = None
        self._purgatory = ProducePurgatory()
        self._next_proposal_id = 1

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
    def isr(self) -> frozenset[int]:
        """The committed ISR (the controller's, as last applied or confirmed)."""
        return self._isr_state.isr

    @property
    def maximal_isr(self) -> frozenset[int]:
        """The ISR plus a replica whose expansion is in flight (the members gating the HW)."""
        return self._isr_state.maximal_isr

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
    def is_leader(self) -> bool:
        return self._role is Role.LEADER

    @property
    def effective_min_isr(self) -> int:
        return min(self._config.min_insync_replicas, max(len(self._replicas), 1))

    @property
    def pending_produce_count(self) -> int:
        return len(self._purgatory)

    @property
    def alter_partition_in_flight(self) -> bool:
        return not isinstance(self._isr_state, CommittedIsr)

    @property
    def follower_state(self) -> FollowerView | None:
        """A follower's fetch state (None unless this replica is a follower with a leader)."""
        follower = self._follower
        return follower.view() if self._role is Role.FOLLOWER and follower is not None else None

    @property
    def remote_replicas(self) -> tuple[RemoteReplicaView, ...]:
        """A leader's view of its followers in assignment order (empty unless leader)."""
        return tuple(r.view() for r in self._remotes.values())

    def replica_leo(self, broker_id: int) -> int:
        """A leader's last known LEO of follower `broker_id` (KIP-392's preferred read replica
        must hold the fetch offset); -1 when unknown or not a follower of this leader."""
        remote = self._remotes.get(broker_id)
        return remote.leo if remote is not None else UNKNOWN_OFFSET

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

    # -- reads (answers that change nothing; reads.py) ----------------------------------------

    def check_consumer_fetch(
        self, current_leader_epoch: int, fetch_offset: int, *, allow_follower: bool = False
    ) -> Step[ConsumerFetchAnswer]:
        """A consumer read, capped at this replica's HW (reads.consumer_fetch)."""
        return reads.consumer_fetch(self, current_leader_epoch, fetch_offset, allow_follower), []

    def list_offsets(self, current_leader_epoch: int, timestamp: int) -> Step[ListOffsetsAnswer]:
        """ListOffsets for a client (reads.list_offsets)."""
        return reads.list_offsets(self, current_leader_epoch, timestamp), []

    def offset_for_leader_epoch(
        self, current_leader_epoch: int, leader_epoch: int
    ) -> Step[EpochEndOffsetAnswer]:
        """OffsetForLeaderEpoch for a consumer (reads.offset_for_leader_epoch, KIP-320)."""
        answer = reads.offset_for_leader_epoch(
            self, self._epoch_cache, current_leader_epoch, leader_epoch
        )
        return answer, []
