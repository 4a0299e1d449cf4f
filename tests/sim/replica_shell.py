"""A simulated broker's replica I/O: the effects of its cores, follower fetches, AlterPartition.

The part of a simulated broker (node.py) that carries out what its partition cores ask for:
storage effects on the MemLog, AlterPartition requests to the controller (lost requests or
answers surface as REQUEST_TIMED_OUT after the request timeout), fetch sessions to leaders over
the simulated network, and produce answers handed to the workload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memlog import MemLog

from minibroker.broker.replication.events import (
    AdvanceLogStartOffset,
    AlterPartitionResult,
    AppendAsFollower,
    AssignEpoch,
    Backoff,
    CompleteProduce,
    Effect,
    FetchPosition,
    FetchResponse,
    FollowerFetch,
    HighWatermarkChanged,
    IsrUpdated,
    LeaderRecoveryState,
    PartitionState,
    ProposeIsr,
    StartFetching,
    StopFetching,
    TruncateFullyAndStartAt,
    TruncateTo,
)
from minibroker.broker.replication.partition import PartitionReplica
from minibroker.client.errors import ErrorCode
from minibroker.client.metadata.records import PartitionRecord
from minibroker.controller.core.isr import AlterPartitionProposal, IsrMember
from minibroker.controller.core.messages import AlterPartitionReply, AlterPartitionRequest

if TYPE_CHECKING:
    from node import SimBroker
    from replsim import Simulation


@dataclass
class SimReplica:
    core: PartitionReplica
    log: MemLog
    fetch_in_flight: int = 0  # id of the fetch in flight, 0 for none
    fetching: bool = False


def partition_state(record: PartitionRecord) -> PartitionState:
    """A metadata PartitionRecord as the replica core takes it (replica_manager.py does this)."""
    return PartitionState(
        replicas=tuple(record.replicas),
        isr=frozenset(record.isr),
        leader=record.leader,
        leader_epoch=record.leader_epoch,
        partition_epoch=record.partition_epoch,
        leader_recovery_state=LeaderRecoveryState(record.leader_recovery_state),
    )


def replica_result(proposal_id: int, reply: AlterPartitionReply) -> AlterPartitionResult:
    """The controller's AlterPartition reply as the leader core takes it (the shell's
    `_alter_partition_result` over the wire form)."""
    if reply.error != ErrorCode.NONE or not reply.results:
        return AlterPartitionResult(proposal_id, reply.error or ErrorCode.UNKNOWN_SERVER_ERROR)
    result = reply.results[0]
    if result.record is None:
        return AlterPartitionResult(proposal_id, result.error)
    return AlterPartitionResult(
        proposal_id,
        result.error,
        leader_epoch=result.record.leader_epoch,
        partition_epoch=result.record.partition_epoch,
        isr=frozenset(result.record.isr),
        leader_recovery_state=LeaderRecoveryState(result.record.leader_recovery_state),
    )


class ReplicaShell:
    """The replica side of `SimBroker` (a mixin: it uses the broker's process state)."""

    sim: Simulation
    broker_id: int
    broker_epoch: int
    incarnation: int
    alive: bool
    replicas: dict[int, SimReplica]

    # -- effects interpreter -----------------------------------------------------------------

    def apply(self: SimBroker, pid: int, effects: list[Effect] | tuple[Effect, ...]) -> None:
        sim = self.sim
        rep = self.replicas[pid]
        core, log = rep.core, rep.log
        for effect in effects:
            if isinstance(effect, AssignEpoch):
                log.epoch_cache.assign(effect.leader_epoch, effect.start_offset)
                sim.note(f"b{self.broker_id} p{pid} leads epoch {effect.leader_epoch}")
            elif isinstance(effect, TruncateTo):
                log.truncate_to(effect.offset)
                sim.checker.on_truncated(self, pid)
                sim.note(f"b{self.broker_id} p{pid} truncate {effect.offset}: {effect.reason}")
                self.apply(pid, core.on_log_truncated(log.leo, log.log_start_offset)[1])
            elif isinstance(effect, TruncateFullyAndStartAt):
                log.truncate_fully_and_start_at(effect.offset)
                sim.checker.on_truncated(self, pid)
                self.apply(pid, core.on_log_truncated(log.leo, log.log_start_offset)[1])
            elif isinstance(effect, AppendAsFollower):
                headers = log.append(effect.records)
                self.apply(pid, core.on_follower_appended(log.leo, headers)[1])
            elif isinstance(effect, AdvanceLogStartOffset):
                log.log_start_offset = max(log.log_start_offset, effect.offset)
            elif isinstance(effect, HighWatermarkChanged):
                sim.checker.on_high_watermark(self, pid)
            elif isinstance(effect, CompleteProduce):
                sim.workload.on_produce_complete(effect)
            elif isinstance(effect, ProposeIsr):
                self._send_alter_partition(pid, effect)
            elif isinstance(effect, StartFetching):
                # A new leader or epoch gets a new fetcher; the old one's request is abandoned.
                rep.fetching = True
                rep.fetch_in_flight = 0
            elif isinstance(effect, StopFetching):
                rep.fetching = False
            elif isinstance(effect, (Backoff, IsrUpdated)):
                pass
            else:
                raise AssertionError(f"unknown effect {effect!r}")

    # -- AlterPartition ------------------------------------------------------------------------

    def _send_alter_partition(self: SimBroker, pid: int, proposal: ProposeIsr) -> None:
        sim = self.sim
        incarnation = self.incarnation
        answered = [False]

        def answer(result: AlterPartitionResult) -> None:
            if answered[0]:
                return
            answered[0] = True

            def on_leader() -> None:
                rep = self.replicas.get(pid)
                if rep is not None:
                    _, effects = rep.core.on_alter_partition_result(result, sim.now_ms)
                    self.apply(pid, effects)

            self.run_on(incarnation, on_leader)

        def lost() -> None:
            # A lost request or answer, or a controller that died before its fsync, surfaces
            # as a transport error at the request timeout; the core retries.
            answer(AlterPartitionResult(proposal.proposal_id, ErrorCode.REQUEST_TIMED_OUT))

        def send_now() -> None:
            if not self.alive or self.incarnation != incarnation or sim.topic_id is None:
                return
            request = AlterPartitionRequest(
                self.broker_id,
                self.broker_epoch,
                (
                    AlterPartitionProposal(
                        topic_id=sim.topic_id,
                        partition=pid,
                        leader_epoch=proposal.leader_epoch,
                        partition_epoch=proposal.partition_epoch,
                        new_isr=tuple(IsrMember(b, e) for b, e in proposal.new_isr_with_epochs),
                        leader_recovery_state=int(proposal.leader_recovery_state),
                    ),
                ),
            )

            def arrive() -> None:
                sim.call_controller(
                    lambda core, now: core.alter_partition(request, now),
                    lambda reply: sim.net.send(
                        lambda: answer(replica_result(proposal.proposal_id, reply))
                    ),
                )
                if sim.net.faults and sim.rng.random() < 0.02:
                    # A crash right after the change, before or after its fsync (scenario 9).
                    sim.crash_controller()

            sim.at(sim.opt.request_timeout_ms, lost)
            sim.net.send(arrive)

        sim.at(max(proposal.delay_ms, 0), lambda: self.run_on(incarnation, send_now))

    # -- fetching ------------------------------------------------------------------------------

    def fetch_tick(self: SimBroker) -> None:
        """Each follower replica with no fetch in flight sends its next fetch."""
        for pid, rep in self.replicas.items():
            if not rep.fetching or rep.fetch_in_flight:
                continue
            position, _ = rep.core.next_fetch(self.sim.now_ms)
            if position is None:
                continue
            self._send_fetch(rep, pid, position)

    def _send_fetch(
        self: SimBroker, follower_rep: SimReplica, pid: int, position: FetchPosition
    ) -> None:
        sim = self.sim
        follower = self
        incarnation = follower.incarnation
        fetch_id = follower_rep.fetch_in_flight = next(sim.fetch_ids)
        leader = sim.brokers[position.leader_id]
        request = FollowerFetch(
            replica_id=follower.broker_id,
            broker_epoch=follower.broker_epoch,
            current_leader_epoch=position.current_leader_epoch,
            fetch_offset=position.fetch_offset,
            last_fetched_epoch=position.last_fetched_epoch,
            log_start_offset=position.log_start_offset,
        )

        def done() -> None:
            if follower_rep.fetch_in_flight == fetch_id:
                follower_rep.fetch_in_flight = 0

        def arrive() -> None:
            if not leader.alive or pid not in leader.replicas:
                sim.at(100, done)  # connection refused / timeout
                return
            rep = leader.replicas[pid]
            answer, effects = rep.core.handle_follower_fetch(request, sim.now_ms)
            leader.apply(pid, effects)
            records = b""
            if answer.error == ErrorCode.NONE and answer.diverging_epoch is None:
                records = rep.log.read(answer.fetch_offset, answer.read_until_offset, 4096)
            response = FetchResponse(
                error=answer.error,
                high_watermark=answer.high_watermark,
                log_start_offset=answer.log_start_offset,
                log_end_offset=answer.log_end_offset,
                diverging_epoch=answer.diverging_epoch,
                records=records,
            )
            if sim.net.dropped():
                sim.at(100, done)
            else:
                sim.at(
                    sim.net.delay(),
                    lambda: follower.run_on(incarnation, lambda: respond(response)),
                )

        def respond(response: FetchResponse) -> None:
            done()
            rep = follower.replicas.get(pid)
            if rep is None:
                return
            follower.apply(pid, rep.core.on_fetch_response(position, response, sim.now_ms)[1])

        def reach_leader() -> None:
            if not leader.alive:
                sim.at(100, done)  # connection refused
            else:
                leader.run_on(None, arrive)

        # The request timeout: a fetch to a stopped leader is given up.
        sim.at(2 * sim.opt.request_timeout_ms, done)
        if sim.net.dropped():
            sim.at(100, done)
        else:
            sim.at(sim.net.delay(), reach_leader)
