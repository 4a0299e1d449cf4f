"""A simulated broker's replica shell: the I/O around its `BrokerReplicas` engine.

The engine (broker/replication/engine.py) is the product's: it hosts the node's partitions over
MemLogs, carries out every effect of their cores, and decides produce, fetch and metadata; this
is only what the broker's asyncio shell does around it, over the simulated network: follower
fetch sessions to leaders (one request in flight per partition), AlterPartition requests to the
controller (a lost request or answer surfaces as REQUEST_TIMED_OUT after the request timeout),
produce answers handed to the workload, logs deleted when the engine removes a replica (a
reassignment moved it away), and the checker told of HW moves, truncations, leader appends and
removals. An output that means the engine hit a storage or apply failure is a finding:
the simulation injects no disk faults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from memlog import MemLog
from scheduler import CONTROLLER

from minibroker.broker.replication.engine import BrokerReplicas
from minibroker.broker.replication.events import (
    AlterPartitionResult,
    CompleteProduce,
    FetchPosition,
    FetchResponse,
    FollowerFetch,
    LeaderRecoveryState,
    Role,
)
from minibroker.broker.replication.hosted import HostedReplica
from minibroker.broker.replication.outputs import (
    Appended,
    CorruptProduce,
    FollowerAppendFailed,
    HighWatermarkMoved,
    LogDirFailed,
    Output,
    PartitionApplyFailed,
    ReplicaRemoved,
    RoleChanged,
    SendAlterPartition,
    StartFollowing,
    StopFollowing,
    Truncated,
)
from minibroker.client.common.invariant import invariant
from minibroker.client.errors import ErrorCode
from minibroker.client.types import TopicPartition
from minibroker.controller.core.isr import AlterPartitionProposal, IsrMember
from minibroker.controller.core.messages import AlterPartitionReply, AlterPartitionRequest

if TYPE_CHECKING:
    from node import SimBroker
    from replsim import Simulation

FETCH_MAX_BYTES = 4_096  # small, so a follower catches up over several fetches


@dataclass
class Fetcher:
    """A follower's fetch session for one partition: whom it fetches from, what is in flight."""

    leader_id: int
    in_flight: int = 0  # id of the fetch in flight, 0 for none


def alter_partition_result(proposal_id: int, reply: AlterPartitionReply) -> AlterPartitionResult:
    """The controller's AlterPartition reply as the engine takes it (what the broker's
    `wire.decode_alter_partitions` makes of the protobuf form)."""
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
    logs: dict[int, MemLog]
    engine: BrokerReplicas[MemLog] | None
    fetchers: dict[TopicPartition, Fetcher]

    def tp(self, pid: int) -> TopicPartition:
        return TopicPartition(self.sim.topic, pid)

    def hosted(self, pid: int) -> HostedReplica[MemLog] | None:
        """This process's replica of partition `pid`, if it hosts one (for the checks)."""
        engine = self.engine
        return None if engine is None else engine.get(self.tp(pid))

    # -- the engine's outputs ------------------------------------------------------------------

    def handle(self: SimBroker, outputs: list[Output]) -> None:
        """Do what the engine asked of the shell, in order."""
        sim = self.sim
        sim.checker.touched.add(self)
        for output in outputs:
            if isinstance(output, CompleteProduce):
                sim.workload.on_produce_complete(self, output)
            elif isinstance(output, SendAlterPartition):
                self._send_alter_partition(output)
            elif isinstance(output, StartFollowing):
                # A new leader or epoch gets a new session; the old one's request is abandoned.
                self.fetchers[output.tp] = Fetcher(output.leader_id)
            elif isinstance(output, StopFollowing):
                self.fetchers.pop(output.tp, None)
            elif isinstance(output, ReplicaRemoved):
                # ReplicaManager: the engine no longer hosts it; the log goes when it says so.
                sim.checker.on_replica_removed(self, output.tp.partition, output.delete)
                if output.delete:
                    del self.logs[output.tp.partition]
                sim.stats["replicas_deleted" if output.delete else "replicas_dropped"] += 1
                sim.note(f"b{self.broker_id} p{output.tp.partition} removed: {output.reason}")
            elif isinstance(output, HighWatermarkMoved):
                sim.checker.on_high_watermark(self, output.tp.partition)
            elif isinstance(output, Truncated):
                sim.checker.on_truncated(self, output.tp.partition)
                sim.stats["truncations_full" if output.fully else "truncations"] += 1
                sim.note(
                    f"b{self.broker_id} p{output.tp.partition} truncate {output.from_offset} -> "
                    f"{output.to_offset}: {output.reason}"
                )
            elif isinstance(output, Appended):
                if output.as_leader:
                    sim.checker.on_leader_append(self, output.tp.partition, output.leader_epoch)
                    if sim.net.is_cut(self.broker_id, CONTROLLER):
                        sim.stats["appends_by_leader_cut_from_controller"] += 1
            elif isinstance(output, RoleChanged):
                if output.role is Role.LEADER:
                    sim.note(
                        f"b{self.broker_id} p{output.tp.partition} leads {output.leader_epoch}"
                    )
            elif isinstance(
                output, FollowerAppendFailed | PartitionApplyFailed | LogDirFailed | CorruptProduce
            ):
                invariant(False, f"b{self.broker_id}: the engine failed: {output}")

    # -- AlterPartition ------------------------------------------------------------------------

    def _send_alter_partition(self: SimBroker, send: SendAlterPartition) -> None:
        sim = self.sim
        incarnation = self.incarnation
        proposal = send.proposal
        answered = [False]

        def answer(result: AlterPartitionResult) -> None:
            if answered[0]:
                return
            answered[0] = True

            def on_leader() -> None:
                if self.engine is not None:
                    self.handle(
                        self.engine.on_alter_partition_result(
                            send.tp, send.generation, result, sim.now_ms
                        )
                    )

            self.run_on(incarnation, on_leader)

        def lost() -> None:
            # A lost request or answer, or a controller that died before its fsync, surfaces
            # as a transport error at the request timeout; the core retries.
            answer(AlterPartitionResult(proposal.proposal_id, ErrorCode.REQUEST_TIMED_OUT))

        def send_now() -> None:
            if not self.alive or self.incarnation != incarnation:
                return
            request = AlterPartitionRequest(
                self.broker_id,
                self.broker_epoch,
                (
                    AlterPartitionProposal(
                        topic_id=send.topic_id,
                        partition=send.tp.partition,
                        leader_epoch=proposal.leader_epoch,
                        partition_epoch=proposal.partition_epoch,
                        new_isr=tuple(IsrMember(b, e) for b, e in proposal.new_isr_with_epochs),
                        leader_recovery_state=int(proposal.leader_recovery_state),
                    ),
                ),
            )

            deadline_ms = sim.now_ms + sim.opt.request_timeout_ms

            def arrive() -> None:
                sim.call_controller(
                    lambda core, now: core.alter_partition(request, now),
                    lambda reply: sim.net.send(
                        lambda: answer(alter_partition_result(proposal.proposal_id, reply)),
                        (CONTROLLER, self.broker_id),
                        deadline_ms,
                    ),
                )
                if sim.net.faults and sim.rng.random() < 0.02:
                    # A crash right after the change, before or after its fsync (scenario 9).
                    sim.crash_controller()

            sim.at(sim.opt.request_timeout_ms, lost)
            sim.net.send(arrive, (self.broker_id, CONTROLLER), deadline_ms, self.runs(incarnation))

        sim.at(max(proposal.delay_ms, 0), lambda: self.run_on(incarnation, send_now))

    # -- fetching ------------------------------------------------------------------------------

    def fetch_tick(self: SimBroker) -> None:
        """Each follower session with no fetch in flight sends its next fetch."""
        engine = self.engine
        if engine is None:
            return
        self.sim.checker.touched.add(self)  # next_fetch may move a follower's fetch state
        for tp, fetcher in list(self.fetchers.items()):
            if fetcher.in_flight:
                continue
            position = engine.next_fetch(tp, fetcher.leader_id, self.sim.now_ms)
            if position is not None:
                self._send_fetch(tp, fetcher, position)

    def _send_fetch(
        self: SimBroker, tp: TopicPartition, fetcher: Fetcher, position: FetchPosition
    ) -> None:
        sim = self.sim
        follower = self
        incarnation = follower.incarnation
        fetch_id = fetcher.in_flight = next(sim.fetch_ids)
        deadline_ms = sim.now_ms + 2 * sim.opt.request_timeout_ms
        leader = sim.brokers[fetcher.leader_id]
        request = FollowerFetch(
            replica_id=follower.broker_id,
            broker_epoch=follower.broker_epoch,
            current_leader_epoch=position.current_leader_epoch,
            fetch_offset=position.fetch_offset,
            last_fetched_epoch=position.last_fetched_epoch,
            log_start_offset=position.log_start_offset,
        )

        def done() -> None:
            if fetcher.in_flight == fetch_id:
                fetcher.in_flight = 0

        def arrive() -> None:
            engine = leader.engine
            if engine is None:
                sim.at(100, done)  # connection refused / timeout
                return
            reply, outputs = engine.follower_fetch(tp, request, FETCH_MAX_BYTES, sim.now_ms)
            leader.handle(outputs)
            response = FetchResponse(
                error=reply.error,
                high_watermark=reply.high_watermark,
                log_start_offset=reply.log_start_offset,
                log_end_offset=reply.log_end_offset,
                diverging_epoch=reply.diverging_epoch,
                records=reply.records,
            )
            if sim.net.dropped():
                sim.at(100, done)
            else:
                sim.net.transmit(
                    lambda: follower.run_on(incarnation, lambda: respond(response)),
                    (leader.broker_id, follower.broker_id),
                    deadline_ms,
                )

        def respond(response: FetchResponse) -> None:
            done()
            engine = follower.engine
            if engine is not None:
                follower.handle(
                    engine.on_fetch_response(tp, fetcher.leader_id, position, response, sim.now_ms)
                )

        def reach_leader() -> None:
            if not leader.alive:
                sim.at(100, done)  # connection refused
            else:
                leader.run_on(None, arrive)

        # The request timeout: a fetch to a stopped (or cut off) leader is given up.
        sim.at(2 * sim.opt.request_timeout_ms, done)
        if sim.net.dropped():
            sim.at(100, done)
        else:
            sim.net.transmit(
                reach_leader,
                (follower.broker_id, leader.broker_id),
                deadline_ms,
                follower.runs(incarnation),
            )
