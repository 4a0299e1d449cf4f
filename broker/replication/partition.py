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
same leader epoch with a higher partition epoch is an ISR/assignment update only.

This module holds the rules that change a replica's state (state.py): the record transitions
above, offsets and the epoch stamp for appends (`plan_append`, §2), the leader's side of follower
fetches (§7, §12), ISR proposals and AlterPartition answers (§8, §9). The other parts, each
with its own rules and tests:

    state.py           the state and its read-only views   high_watermark.py  the HW rule (§6)
    isr.py             ISR states, expand/shrink rules     acks.py   the acks=all purgatory (§2)
    remote.py          a follower as the leader sees it    follower.py  follower fetch rules (§11)
    reads.py           answers to reads (§10-§13)          eligibility.py  who may join an ISR

Shell contract (the replica manager):
  * Every public entry point returns `(reply, effects)` (`Step`): the reply is the answer (None
    for a command), the effects the one channel for decisions. The shell reads nothing else but
    the read-only properties (role, offsets, ISR, `follower_state`, `replica_leo`, ...).
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

from collections.abc import Iterable, Sequence

from minibroker.broker.replication import reads
from minibroker.broker.replication.acks import PendingProduce
from minibroker.broker.replication.eligibility import BrokerEligibilityView
from minibroker.broker.replication.events import (
    AdvanceLogStartOffset,
    AlterPartitionResult,
    AppendPlan,
    AssignEpoch,
    DuplicateAppend,
    Effect,
    FetchPosition,
    FetchResponse,
    FollowerFetch,
    FollowerFetchAnswer,
    HighWatermarkChanged,
    IsrChangeKind,
    IsrUpdated,
    LeaderRecoveryState,
    PartitionState,
    ProduceRejected,
    ProposeIsr,
    ReplicaConfig,
    Role,
    StartFetching,
    StopFetching,
)
from minibroker.broker.replication.follower import (
    FollowerState,
    follower_high_watermark,
)
from minibroker.broker.replication.high_watermark import leader_high_watermark
from minibroker.broker.replication.isr import (
    AnswerAction,
    CommittedIsr,
    PendingExpandIsr,
    PendingShrinkIsr,
    answer_action,
    isr_with_epochs,
    out_of_sync_replicas,
    retry_of,
    should_expand,
)
from minibroker.broker.replication.producer_state import (
    AppendBatchHeader,
    ProducerBatchHeader,
    assign_offsets,
)
from minibroker.broker.replication.remote import RemoteReplica
from minibroker.broker.replication.state import ReplicaState, Step
from minibroker.client.common.invariant import invariant
from minibroker.client.errors import ErrorCode
from minibroker.client.types import (
    NO_LEADER,
    UNKNOWN_OFFSET,
)

# BrokerEligibilityView is imported from here by the shells; it lives in eligibility.py.
__all__ = ["BrokerEligibilityView", "PartitionReplica", "Step"]


class PartitionReplica(ReplicaState):
    """One broker's replica of one partition: leader or follower state plus the rules."""

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
            and state.replicas == self._replicas
            and self._role is not Role.NONE
        ):
            return None, []  # already applied
        if self._broker_id not in state.replicas:
            return None, self._become_none(state)
        if state.leader == self._broker_id:
            return None, self._become_leader(state, now_ms)
        return None, self._become_follower(state)

    def _become_none(self, state: PartitionState) -> list[Effect]:
        effects = self._fail_pending_produces("no longer a replica of the partition")
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
        if acks == -1 and len(self._purgatory) >= self._config.max_pending_produces:
            return ProduceRejected(
                ErrorCode.REQUEST_TIMED_OUT,
                message=f"{len(self._purgatory)} acks=all produce requests already wait",
            )
        verdict, index = self._producer_state.check_batches(
            [(b.producer_id, b.producer_epoch, b.base_sequence, b.last_sequence) for b in batches]
        )
        if verdict.duplicate is not None:
            return DuplicateAppend(verdict.duplicate.first_offset, verdict.duplicate.last_offset)
        if verdict.error != ErrorCode.NONE:
            return ProduceRejected(verdict.error, message=f"batch {index}: {verdict.message}")
        next_offset, stamped = assign_offsets(self._leo, batches)
        return AppendPlan(self._leo, next_offset, self._leader_epoch, acks, stamped)

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
        return list(
            self._purgatory.park(
                pending,
                self._high_watermark,
                self._log_start_offset,
                self.maximal_isr,
                self.effective_min_isr,
            )
        )

    def expire_produces(self, now_ms: int) -> Step[None]:
        """Answer parked produces past their deadline: REQUEST_TIMED_OUT (docs/protocol.md §2)."""
        return None, list(self._purgatory.expire(now_ms, self._log_start_offset))

    def expire_produce(self, token: object) -> Step[None]:
        """The shell's wait for the produce parked under `token` ran out (the request's
        timeout_ms): REQUEST_TIMED_OUT now, or nothing when it was answered already."""
        return None, list(self._purgatory.expire_token(token, self._log_start_offset))

    def abort_produces(self, error: ErrorCode, reason: str) -> Step[None]:
        """Answer every parked produce with `error` (the log dir failed, the replica is being
        removed, the broker stops): the shell completes its futures from these effects."""
        return None, list(self._purgatory.fail_all(error, reason, self._log_start_offset))

    def _fail_pending_produces(self, reason: str) -> list[Effect]:
        return list(
            self._purgatory.fail_all(
                ErrorCode.NOT_LEADER_OR_FOLLOWER, reason, self._log_start_offset
            )
        )

    # -- leader: follower fetches ----------------------------------------------------------

    def handle_follower_fetch(self, fetch: FollowerFetch, now_ms: int) -> Step[FollowerFetchAnswer]:
        """A follower's fetch for this partition (docs/protocol.md §7, §11 step 3, §12): answered
        by reads.follower_fetch; an accepted one records the follower's progress, which may
        expand the ISR and move the HW."""
        remote = self._remotes.get(fetch.replica_id)
        answer = reads.follower_fetch(
            self,
            self._epoch_cache,
            fetch,
            remote.broker_epoch if remote is not None else None,
            self._brokers.broker_epoch(fetch.replica_id),
        )
        if remote is None or answer.error != ErrorCode.NONE or answer.diverging_epoch is not None:
            return answer, []
        remote.update_fetch_state(
            fetch.fetch_offset,
            fetch.log_start_offset,
            now_ms,
            answer.log_end_offset,
            fetch.broker_epoch,
        )
        effects = self._maybe_expand_isr(remote)
        effects += self._maybe_advance_high_watermark(now_ms)
        return answer, effects

    def note_implied_fetch(self, replica_id: int, at_ms: int) -> Step[None]:
        """`replica_id`'s fetch session carried this partition, unchanged since the follower
        last read it, in a request at `at_ms` (`RemoteReplica.implied_fetch`). Leader only. No
        effects: only the lag clock moves, which can keep the follower in the ISR but cannot
        move the HW or add it to the ISR."""
        remote = self._remotes.get(replica_id)
        if self.is_leader and remote is not None:
            remote.implied_fetch(at_ms)
        return None, []

    # -- leader: high watermark and ISR ---------------------------------------------------

    def _maybe_advance_high_watermark(self, now_ms: int) -> list[Effect]:
        """Move the HW by the rule of high_watermark.py; answer the produces it passed."""
        if self._role is not Role.LEADER:
            return []
        maximal_isr = self.maximal_isr
        min_isr = self.effective_min_isr
        leo, lag_max, brokers = self._leo, self._config.replica_lag_time_max_ms, self._brokers
        # FollowerProgress as plain tuples; "caught up" is only asked of followers outside
        # the maximal ISR, the only ones for which the rule reads it.
        followers = [
            (r.leo, True, True)
            if r.replica_id in maximal_isr
            else (
                r.leo,
                False,
                r.is_caught_up(leo, now_ms, lag_max)
                and brokers.is_isr_eligible(r.replica_id, r.broker_epoch),
            )
            for r in self._remotes.values()
        ]
        new_hw = leader_high_watermark(self._high_watermark, leo, len(self.isr), min_isr, followers)
        if new_hw == self._high_watermark:
            return []
        self._high_watermark = new_hw
        effects: list[Effect] = [HighWatermarkChanged(new_hw)]
        effects += self._purgatory.complete(new_hw, self._log_start_offset, maximal_isr, min_isr)
        return effects

    def _proposal(self, kind: IsrChangeKind, new_isr: frozenset[int]) -> ProposeIsr:
        proposal = ProposeIsr(
            proposal_id=self._next_proposal_id,
            kind=kind,
            leader_epoch=self._leader_epoch,
            partition_epoch=self._partition_epoch,
            new_isr_with_epochs=isr_with_epochs(
                new_isr, self._broker_id, self._brokers.broker_epoch(self._broker_id), self._remotes
            ),
            leader_recovery_state=self._leader_recovery_state,
        )
        self._next_proposal_id += 1
        return proposal

    def _maybe_expand_isr(self, remote: RemoteReplica) -> list[Effect]:
        state = self._isr_state
        eligible = self._brokers.is_isr_eligible(remote.replica_id, remote.broker_epoch)
        if not should_expand(
            state,
            remote.replica_id,
            remote.leo,
            self._high_watermark,
            self._leader_epoch_start_offset,
            eligible,
        ):
            return []
        proposal = self._proposal(IsrChangeKind.EXPAND, state.isr | {remote.replica_id})
        self._isr_state = PendingExpandIsr(state.isr, remote.replica_id, proposal)
        return [proposal]

    def maybe_shrink_isr(self, now_ms: int) -> Step[None]:
        """Kafka's `Partition.maybeShrinkIsr` (docs/protocol.md §8): run every
        replica.lag.time.max.ms / 2; never with an AlterPartition in flight."""
        if self._role is not Role.LEADER:
            return None, []
        effects = self._maybe_advance_high_watermark(now_ms)
        state = self._isr_state
        if not isinstance(state, CommittedIsr):
            return None, effects
        out_of_sync = out_of_sync_replicas(
            state.isr,
            self._broker_id,
            self._remotes,
            self._leo,
            now_ms,
            self._config.replica_lag_time_max_ms,
        )
        if out_of_sync:
            proposal = self._proposal(IsrChangeKind.SHRINK, state.isr - out_of_sync)
            self._isr_state = PendingShrinkIsr(state.isr, out_of_sync, proposal)
            effects.append(proposal)
        return None, effects

    def on_alter_partition_result(self, result: AlterPartitionResult, now_ms: int) -> Step[None]:
        """The controller answered a ProposeIsr (docs/protocol.md §9, the leader's side)."""
        state = self._isr_state
        if (
            self._role is not Role.LEADER
            or isinstance(state, CommittedIsr)
            or state.proposal.proposal_id != result.proposal_id
        ):
            return None, []  # the local state moved on (new metadata) since the proposal
        action = answer_action(result.error)
        if action is AnswerAction.COMMIT:
            if (
                result.leader_epoch != self._leader_epoch
                or result.partition_epoch < self._partition_epoch
            ):
                return None, []  # an answer for another epoch: wait for metadata
            invariant(
                self._broker_id in result.isr,
                f"{self._name}: committed ISR {sorted(result.isr)} lacks the leader",
            )
            self._isr_state = CommittedIsr(frozenset(result.isr))
            self._partition_epoch = result.partition_epoch
            self._leader_recovery_state = result.leader_recovery_state
            effects: list[Effect] = [
                IsrUpdated(state.proposal.kind, state.isr, self.isr, self._partition_epoch)
            ]
            return None, effects + self._maybe_advance_high_watermark(now_ms)
        if action is AnswerAction.REVERT:
            self._isr_state = CommittedIsr(state.isr)
            return None, self._maybe_advance_high_watermark(now_ms)
        if action is AnswerAction.WAIT_FOR_METADATA:
            return None, []
        return None, [retry_of(state.proposal, self._config.alter_partition_retry_ms)]

    # -- follower (the rules are FollowerState's, follower.py) -------------------------------

    def next_fetch(self, now_ms: int) -> Step[FetchPosition | None]:
        """What to ask the leader for now; None while there is nothing to fetch (no leader,
        failed until new metadata, or backing off)."""
        follower = self._follower
        if self._role is not Role.FOLLOWER or follower is None:
            return None, []
        position = follower.next_fetch(
            now_ms, self._leader_epoch, self._leo, self._log_start_offset, self._epoch_cache
        )
        return position, []

    def on_fetch_response(
        self, request: FetchPosition, response: FetchResponse, now_ms: int
    ) -> Step[None]:
        """The leader answered `request` (docs/protocol.md §11 steps 4-8)."""
        follower = self._follower
        if self._role is not Role.FOLLOWER or follower is None:
            return None, []
        effects = follower.on_fetch_response(
            request,
            response,
            now_ms,
            self._leader_epoch,
            self._leo,
            self._epoch_cache,
            self._config.replica_fetch_backoff_ms,
            self._config.offset_gaps_allowed,
        )
        if effects is None:  # accepted, no records: the leader's HW and log start may apply
            effects = self._update_follower_high_watermark()
        return None, effects

    def on_follower_appended(
        self, leo: int, headers: Iterable[ProducerBatchHeader] = ()
    ) -> Step[None]:
        """AppendAsFollower is done; `headers` are the appended batches (producer state)."""
        invariant(leo >= self._leo, f"{self._name}: follower append moved the LEO back")
        self._leo = leo
        for header in headers:
            self._producer_state.record_header(header)
        return None, self._update_follower_high_watermark()

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
        invariant(self._role is not Role.LEADER, f"{self._name}: a leader never truncates its log")
        self._leo = leo
        self._log_start_offset = log_start_offset
        self._producer_state.truncate_to(leo)
        if log_start_offset == leo:
            self._producer_state.truncate_from_start(log_start_offset)
        new_hw = max(log_start_offset, min(self._high_watermark, leo))
        if new_hw != self._high_watermark:
            self._high_watermark = new_hw
            return None, [HighWatermarkChanged(new_hw)]
        return None, []

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
