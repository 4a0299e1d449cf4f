"""A deterministic, seeded simulation of the broker replication cores (DESIGN.md §2, §8).

All broker partition cores (`PartitionReplica`) run in one process against an in-memory log
model (real v2 batch bytes, the real EpochCache, an "unflushed tail lost on crash" model), a
small controller model that follows research §2.6-2.8 (fencing, clean ONLINE elections,
AlterPartition validation with the partition epoch as CAS, broker epochs per incarnation), and a
network that delays, drops and reorders fetches, answers and metadata. Producers write with
acks=all; consumers read from leaders. The DESIGN §8 invariants are checked after every event
(`Checker`), first in a safety phase with faults, then in a liveness phase with every fault
healed, which must converge.

Everything random comes from one `random.Random(seed)`; virtual time is an integer `now_ms`.
Used by tests/sim/test_replication_sim.py and by the multi-replica unit scenarios.
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from minibroker.broker.replication.epoch_cache import EpochCache
from minibroker.broker.replication.events import (
    NO_LEADER,
    AdvanceLogStartOffset,
    AlterPartitionResult,
    AppendAsFollower,
    AppendPlan,
    AssignEpoch,
    Backoff,
    CompleteProduce,
    Effect,
    FetchPosition,
    FetchResponse,
    FollowerFetch,
    HighWatermarkChanged,
    IsrUpdated,
    PartitionState,
    ProduceRejected,
    ProposeIsr,
    ReplicaConfig,
    Role,
    StartFetching,
    StopFetching,
    TruncateFullyAndStartAt,
    TruncateTo,
)
from minibroker.broker.replication.invariants import (
    check_batches_contiguous,
    check_epoch_cache_matches_batches,
    check_epoch_entries,
    invariant,
)
from minibroker.broker.replication.partition import BrokerRegistrations, PartitionReplica
from minibroker.client.batch import BatchHeader, assign_offsets, iter_batches
from minibroker.client.errors import ErrorCode
from minibroker.client.records import encode_batch

# ------------------------------------------------------------------------------------------
# In-memory log


class MemLog:
    """One replica's log: stamped batch bytes in offset order, an epoch cache, a flush mark.

    `flushed` counts the leading batches that are durable; a crash keeps them and a random
    part of the rest (`crash`). The epoch cache entries are durable on assign (Kafka writes the
    checkpoint synchronously) and trimmed to the log end at recovery (research §2.13 step 4).
    """

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        self.headers: list[BatchHeader] = []
        self.bases: list[int] = []  # base offsets, for bisect
        self.epoch_cache = EpochCache()
        self.log_start_offset = 0
        self.flushed = 0
        self.hw_checkpoint = 0

    @property
    def leo(self) -> int:
        return self.headers[-1].next_offset if self.headers else self.log_start_offset

    def append(self, data: bytes) -> list[BatchHeader]:
        appended = []
        for pos, header in iter_batches(data):
            invariant(header.base_offset == self.leo, f"append at {header.base_offset} != LEO")
            self.epoch_cache.assign(header.partition_leader_epoch, header.base_offset)
            self.batches.append(bytes(data[pos : pos + header.size]))
            self.headers.append(header)
            self.bases.append(header.base_offset)
            appended.append(header)
        return appended

    def leader_append(self, raw: bytes, plan: AppendPlan) -> list[BatchHeader]:
        buf = bytearray(raw)
        batches = list(iter_batches(buf))
        next_offset = assign_offsets(buf, batches, plan.base_offset, plan.leader_epoch)
        invariant(next_offset == plan.next_offset, "plan and stamped offsets disagree")
        return self.append(bytes(buf))

    def index_of(self, offset: int) -> int:
        """Index of the batch holding `offset`, or len(batches) when none does."""
        i = bisect.bisect_right(self.bases, offset) - 1
        if i < 0:
            return 0 if self.headers else len(self.headers)
        return i if self.headers[i].last_offset >= offset else i + 1

    def batch_at(self, base_offset: int) -> bytes | None:
        """The batch whose base offset is `base_offset`, if there is one."""
        i = bisect.bisect_left(self.bases, base_offset)
        if i < len(self.bases) and self.bases[i] == base_offset:
            return self.batches[i]
        return None

    def read(self, start: int, until: int, max_bytes: int = 1 << 20) -> bytes:
        """Whole batches from the one holding `start`, ending at or below `until`."""
        out: list[bytes] = []
        size = 0
        for i in range(self.index_of(start), len(self.headers)):
            header = self.headers[i]
            if header.next_offset > until:
                break
            if out and size + header.size > max_bytes:
                break
            out.append(self.batches[i])
            size += header.size
        return b"".join(out)

    def truncate_to(self, offset: int) -> None:
        keep = self.index_of(offset)
        del self.batches[keep:]
        del self.headers[keep:]
        del self.bases[keep:]
        self.flushed = min(self.flushed, len(self.batches))
        self.epoch_cache.truncate_from_end(min(offset, self.leo))

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.batches.clear()
        self.headers.clear()
        self.bases.clear()
        self.flushed = 0
        self.epoch_cache.clear()
        self.log_start_offset = offset

    def flush(self, high_watermark: int) -> None:
        self.flushed = len(self.batches)
        self.hw_checkpoint = high_watermark

    def crash(self, rng: random.Random) -> None:
        """Power loss: keep the flushed batches and a random prefix of the unflushed ones."""
        keep = rng.randint(self.flushed, len(self.batches))
        del self.batches[keep:]
        del self.headers[keep:]
        del self.bases[keep:]
        self.flushed = keep
        self.epoch_cache.truncate_from_end(self.leo)

    def triples(self) -> list[tuple[int, int, int]]:
        return [(h.base_offset, h.last_offset, h.partition_leader_epoch) for h in self.headers]


# ------------------------------------------------------------------------------------------
# Controller model (research §2.6-2.8, no ELR, unclean election off)


@dataclass
class ControllerPartition:
    state: PartitionState
    history: list[tuple[int, int]] = field(default_factory=list)  # (leader_epoch, PE)


class SimController:
    """Partition records, broker registrations, fencing, ONLINE elections, AlterPartition."""

    def __init__(self, broker_ids: list[int]) -> None:
        self.broker_epochs: dict[int, int] = {}
        self.fenced: set[int] = set()
        self.partitions: dict[int, ControllerPartition] = {}
        self._next_broker_epoch = 100
        self.changes: list[int] = []  # partition ids changed since the last drain
        self.registrations_changed = False
        for broker_id in broker_ids:
            self.register(broker_id)
            self.fenced.discard(broker_id)

    def registrations(self) -> BrokerRegistrations:
        view = BrokerRegistrations()
        for broker_id, epoch in self.broker_epochs.items():
            view.update(broker_id, epoch, fenced=broker_id in self.fenced)
        return view

    def create_partition(self, pid: int, replicas: tuple[int, ...]) -> None:
        state = PartitionState(replicas, frozenset(replicas), replicas[0], 0, 0)
        self.partitions[pid] = ControllerPartition(state, [(0, 0)])
        self.changes.append(pid)

    def _write(self, pid: int, isr: frozenset[int], leader: int) -> None:
        part = self.partitions[pid]
        old = part.state
        if isr == old.isr and leader == old.leader:
            return
        leader_epoch = old.leader_epoch + 1 if leader != old.leader else old.leader_epoch
        new = PartitionState(old.replicas, isr, leader, leader_epoch, old.partition_epoch + 1)
        # research §4.1 I7/I11: epochs grow, LE bumps come with PE bumps, ISR never empty.
        invariant(new.partition_epoch > old.partition_epoch, "partition epoch must grow")
        invariant(new.leader_epoch >= old.leader_epoch, "leader epoch must not shrink")
        invariant(bool(isr) and isr <= frozenset(old.replicas), f"bad ISR {sorted(isr)}")
        invariant(leader == NO_LEADER or leader in isr, "leader outside the ISR")
        part.state = new
        part.history.append((new.leader_epoch, new.partition_epoch))
        self.changes.append(pid)

    def _acceptable(self, broker_id: int) -> bool:
        return broker_id in self.broker_epochs and broker_id not in self.fenced

    def _elect(self, state: PartitionState, isr: frozenset[int]) -> int:
        if state.leader != NO_LEADER and state.leader in isr and self._acceptable(state.leader):
            return state.leader
        for broker_id in state.replicas:
            if broker_id in isr and self._acceptable(broker_id):
                return broker_id
        return NO_LEADER

    def fence(self, broker_id: int) -> None:
        """Fence a broker: it leaves every ISR (never the last member) and its leaderships."""
        self.fenced.add(broker_id)
        self.registrations_changed = True
        for pid, part in self.partitions.items():
            state = part.state
            isr = state.isr - {broker_id} if state.isr != {broker_id} else state.isr
            self._write(pid, isr, self._elect(state, isr))

    def register(self, broker_id: int) -> int:
        """A new incarnation: a fresh broker epoch; it stays fenced until `unfence`."""
        self._next_broker_epoch += 1
        self.broker_epochs[broker_id] = self._next_broker_epoch
        self.fenced.add(broker_id)
        self.registrations_changed = True
        return self._next_broker_epoch

    def unfence(self, broker_id: int) -> None:
        self.fenced.discard(broker_id)
        self.registrations_changed = True
        for pid, part in self.partitions.items():
            if part.state.leader == NO_LEADER:
                self._write(pid, part.state.isr, self._elect(part.state, part.state.isr))

    def move_leader(self, pid: int, rng: random.Random) -> None:
        """An administrative leader move (ElectLeaders-like) to another live ISR member."""
        state = self.partitions[pid].state
        others = [b for b in sorted(state.isr) if b != state.leader and self._acceptable(b)]
        if others:
            self._write(pid, state.isr, rng.choice(others))

    def alter_partition(
        self, pid: int, broker_id: int, broker_epoch: int, proposal: ProposeIsr
    ) -> AlterPartitionResult:
        """research §2.6 validation, in order, then apply."""
        part = self.partitions[pid]
        state = part.state

        def fail(error: ErrorCode) -> AlterPartitionResult:
            return AlterPartitionResult(proposal.proposal_id, error)

        if self.broker_epochs.get(broker_id) != broker_epoch:
            return fail(ErrorCode.STALE_BROKER_EPOCH)
        if (
            proposal.leader_epoch > state.leader_epoch
            or proposal.partition_epoch > state.partition_epoch
        ):
            return fail(ErrorCode.NOT_CONTROLLER)
        if proposal.leader_epoch < state.leader_epoch:
            return fail(ErrorCode.FENCED_LEADER_EPOCH)
        if broker_id != state.leader:
            return fail(ErrorCode.INVALID_REQUEST)
        if proposal.partition_epoch < state.partition_epoch:
            return fail(ErrorCode.INVALID_UPDATE_VERSION)
        new_isr = proposal.new_isr
        if not new_isr <= frozenset(state.replicas) or state.leader not in new_isr:
            return fail(ErrorCode.INVALID_REQUEST)
        for member, member_epoch in proposal.new_isr_with_epochs:
            if not self._acceptable(member) or member_epoch not in (
                -1,
                self.broker_epochs[member],
            ):
                return fail(ErrorCode.INELIGIBLE_REPLICA)
        self._write(pid, new_isr, state.leader)
        new = part.state
        return AlterPartitionResult(
            proposal.proposal_id,
            ErrorCode.NONE,
            new.leader_epoch,
            new.partition_epoch,
            new.isr,
        )


# ------------------------------------------------------------------------------------------
# Brokers


@dataclass
class SimReplica:
    core: PartitionReplica
    log: MemLog
    fetch_in_flight: bool = False
    fetching: bool = False
    alter_in_flight: ProposeIsr | None = None


def sync_view(view: BrokerRegistrations, source: SimController) -> None:
    """Make `view` match the controller's registrations (what the metadata log says)."""
    for broker_id, epoch in source.broker_epochs.items():
        view.update(broker_id, epoch, fenced=broker_id in source.fenced)


class SimBroker:
    def __init__(self, broker_id: int, sim: Simulation) -> None:
        self.broker_id = broker_id
        self.sim = sim
        self.alive = True
        self.broker_epoch = sim.controller.broker_epochs[broker_id]
        self.view = BrokerRegistrations()
        sync_view(self.view, sim.controller)
        self.logs: dict[int, MemLog] = {}
        self.replicas: dict[int, SimReplica] = {}
        self.paused_until_ms = 0  # a slow follower: no fetches before this time

    def replica(self, pid: int) -> SimReplica:
        rep = self.replicas.get(pid)
        if rep is None:
            log = self.logs.setdefault(pid, MemLog())
            core = PartitionReplica(
                self.broker_id,
                log.epoch_cache,
                self.view,
                self.sim.replica_config,
                leo=log.leo,
                log_start_offset=log.log_start_offset,
                high_watermark=log.hw_checkpoint,
                name=f"p{pid}",
            )
            rep = SimReplica(core, log)
            self.replicas[pid] = rep
            core.producer_state.rebuild(log.headers)
        return rep


# ------------------------------------------------------------------------------------------
# Simulation


@dataclass
class SimOptions:
    brokers: int = 3
    partitions: int = 2
    replication_factor: int = 3
    min_insync_replicas: int = 2
    safety_ms: int = 5_000
    liveness_ms: int = 20_000
    drop_rate: float = 0.05
    delay_ms_max: int = 30
    crash_rate: float = 0.0015  # per scheduler tick
    move_leader_rate: float = 0.003
    pause_rate: float = 0.001
    produce_interval_ms: int = 7
    tick_ms: int = 5


@dataclass
class IdempotentProducer:
    """One idempotent producer per partition, one batch in flight, retried until acked."""

    producer_id: int
    sequence: int = 0
    in_flight: bytes | None = None
    attempt: int = 0
    acked_values: list[bytes] = field(default_factory=list)


@dataclass(order=True)
class _Event:
    at_ms: int
    seq: int
    action: Callable[[], None] = field(compare=False)


class Simulation:
    """The whole cluster in one process. `run()` does the safety then the liveness phase."""

    def __init__(self, seed: int, options: SimOptions | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.opt = options or SimOptions()
        self.now_ms = 0
        self.replica_config = ReplicaConfig(
            min_insync_replicas=self.opt.min_insync_replicas,
            replica_lag_time_max_ms=300,
            replica_fetch_backoff_ms=50,
            alter_partition_retry_ms=20,
        )
        self._queue: list[_Event] = []
        self._metadata_due_ms: dict[int, int] = {}  # per broker: metadata stays in order
        self._seq = 0
        broker_ids = list(range(1, self.opt.brokers + 1))
        self.controller = SimController(broker_ids)
        self.brokers = {b: SimBroker(b, self) for b in broker_ids}
        for pid in range(self.opt.partitions):
            start = pid % len(broker_ids)
            rotated = broker_ids[start:] + broker_ids[:start]
            self.controller.create_partition(pid, tuple(rotated[: self.opt.replication_factor]))
        self.faults = True
        self.checker = Checker(self)
        self.acked: dict[tuple[int, int], bytes] = {}  # (pid, offset) -> stamped batch bytes
        self.produced = 0
        self.pending_values: dict[object, tuple[int, int, int]] = {}
        self.producers = {
            pid: IdempotentProducer(1_000 + pid) for pid in range(self.opt.partitions)
        }
        self.trace: list[str] = []
        self._publish_metadata()

    # -- scheduling ----------------------------------------------------------------------

    def at(self, delay_ms: int, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._queue, _Event(self.now_ms + delay_ms, self._seq, action))

    def _delay(self) -> int:
        return self.rng.randint(1, self.opt.delay_ms_max if self.faults else 3)

    def _dropped(self) -> bool:
        return self.faults and self.rng.random() < self.opt.drop_rate

    def send(self, action: Callable[[], None]) -> None:
        """A network message: delayed, maybe dropped (reordering comes from random delays)."""
        if not self._dropped():
            self.at(self._delay(), action)

    def note(self, text: str) -> None:
        self.trace.append(f"{self.now_ms:>6} {text}")
        if len(self.trace) > 400:
            del self.trace[:100]

    # -- metadata ------------------------------------------------------------------------

    def _publish_metadata(self) -> None:
        """Deliver changed partition records to every broker (delayed, in order per broker)."""
        changed = sorted(set(self.controller.changes))
        self.controller.changes.clear()
        if not changed and not self.controller.registrations_changed:
            return
        self.controller.registrations_changed = False
        states = {pid: self.controller.partitions[pid].state for pid in changed}
        registrations = self.controller.registrations()
        snapshot = {
            b: (registrations.broker_epoch(b), b in self.controller.fenced)
            for b in self.controller.broker_epochs
        }
        for broker in self.brokers.values():
            # Metadata is a log the broker follows: never dropped, and applied in order. A
            # random delay models a lagging broker (the KIP-320 zombie windows).
            delay = self._delay() * (3 if self.faults and self.rng.random() < 0.2 else 1)
            at_ms = max(self.now_ms + delay, self._metadata_due_ms.get(broker.broker_id, 0))
            self._metadata_due_ms[broker.broker_id] = at_ms
            delay = at_ms - self.now_ms
            incarnation = broker.broker_epoch
            self.at(
                delay,
                lambda b=broker, s=states, r=snapshot, i=incarnation: self._deliver(b, s, r, i),
            )

    def _deliver(
        self,
        broker: SimBroker,
        states: dict[int, PartitionState],
        registrations: dict[int, tuple[int, bool]],
        incarnation: int,
    ) -> None:
        if not broker.alive:
            return
        if incarnation != broker.broker_epoch:
            # An older incarnation's delivery; the new one got a full image at restart.
            return
        for broker_id, (epoch, fenced) in registrations.items():
            broker.view.update(broker_id, epoch, fenced=fenced)
        for pid, state in states.items():
            rep = broker.replica(pid)
            self.apply(broker, pid, rep.core.apply_partition_state(state, self.now_ms))

    # -- effects interpreter (the shell) ----------------------------------------------------

    def apply(
        self, broker: SimBroker, pid: int, effects: list[Effect] | tuple[Effect, ...]
    ) -> None:
        rep = broker.replicas[pid]
        core, log = rep.core, rep.log
        for effect in effects:
            if isinstance(effect, AssignEpoch):
                log.epoch_cache.assign(effect.leader_epoch, effect.start_offset)
                self.note(f"b{broker.broker_id} p{pid} leads epoch {effect.leader_epoch}")
            elif isinstance(effect, TruncateTo):
                log.truncate_to(effect.offset)
                self.checker.on_truncated(broker, pid)
                self.note(f"b{broker.broker_id} p{pid} truncate {effect.offset}: {effect.reason}")
                self.apply(broker, pid, core.on_log_truncated(log.leo, log.log_start_offset))
            elif isinstance(effect, TruncateFullyAndStartAt):
                log.truncate_fully_and_start_at(effect.offset)
                self.checker.on_truncated(broker, pid)
                self.apply(broker, pid, core.on_log_truncated(log.leo, log.log_start_offset))
            elif isinstance(effect, AppendAsFollower):
                headers = log.append(effect.records)
                self.apply(broker, pid, core.on_follower_appended(log.leo, headers))
            elif isinstance(effect, AdvanceLogStartOffset):
                log.log_start_offset = max(log.log_start_offset, effect.offset)
            elif isinstance(effect, HighWatermarkChanged):
                self.checker.on_high_watermark(broker, pid)
            elif isinstance(effect, CompleteProduce):
                self._on_produce_complete(effect)
            elif isinstance(effect, ProposeIsr):
                self._send_alter_partition(broker, pid, effect)
            elif isinstance(effect, StartFetching):
                rep.fetching = True
            elif isinstance(effect, StopFetching):
                rep.fetching = False
            elif isinstance(effect, (Backoff, IsrUpdated)):
                pass
            else:
                raise AssertionError(f"unknown effect {effect!r}")

    def _send_alter_partition(self, broker: SimBroker, pid: int, proposal: ProposeIsr) -> None:
        incarnation = broker.broker_epoch

        def arrive() -> None:
            result = self.controller.alter_partition(pid, broker.broker_id, incarnation, proposal)
            self._publish_metadata()
            self.send(lambda: answer(result))

        def answer(result: AlterPartitionResult) -> None:
            if broker.alive and broker.broker_epoch == incarnation and pid in broker.replicas:
                rep = broker.replicas[pid]
                self.apply(broker, pid, rep.core.on_alter_partition_result(result, self.now_ms))

        def lost() -> None:
            # A dropped request or answer surfaces as a transport error after a timeout.
            answer(AlterPartitionResult(proposal.proposal_id, ErrorCode.REQUEST_TIMED_OUT))

        def send_now() -> None:
            if self._dropped():
                self.at(200, lost)
            else:
                self.at(self._delay(), arrive)

        self.at(max(proposal.delay_ms, 0), send_now)

    # -- fetching -------------------------------------------------------------------------

    def _fetch_tick(self, broker: SimBroker) -> None:
        if not broker.alive or self.now_ms < broker.paused_until_ms:
            return
        for pid, rep in broker.replicas.items():
            if not rep.fetching or rep.fetch_in_flight:
                continue
            position = rep.core.next_fetch(self.now_ms)
            if position is None:
                continue
            rep.fetch_in_flight = True
            self._send_fetch(broker, pid, position)

    def _send_fetch(self, follower: SimBroker, pid: int, position: FetchPosition) -> None:
        incarnation = follower.broker_epoch
        leader = self.brokers[position.leader_id]
        request = FollowerFetch(
            replica_id=follower.broker_id,
            broker_epoch=incarnation,
            current_leader_epoch=position.current_leader_epoch,
            fetch_offset=position.fetch_offset,
            last_fetched_epoch=position.last_fetched_epoch,
            log_start_offset=position.log_start_offset,
        )

        def done() -> None:
            rep = follower.replicas.get(pid)
            if follower.alive and follower.broker_epoch == incarnation and rep is not None:
                rep.fetch_in_flight = False

        def arrive() -> None:
            if not leader.alive or pid not in leader.replicas:
                self.at(100, done)  # connection refused / timeout
                return
            rep = leader.replicas[pid]
            answer = rep.core.handle_follower_fetch(request, self.now_ms)
            self.apply(leader, pid, answer.effects)
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
            if self._dropped():
                self.at(100, done)
            else:
                self.at(self._delay(), lambda: respond(response))

        def respond(response: FetchResponse) -> None:
            done()
            rep = follower.replicas.get(pid)
            if not follower.alive or follower.broker_epoch != incarnation or rep is None:
                return
            self.apply(follower, pid, rep.core.on_fetch_response(position, response, self.now_ms))

        if self._dropped():
            self.at(100, done)
        else:
            self.at(self._delay(), arrive)

    # -- producing and consuming ----------------------------------------------------------

    def _produce(self) -> None:
        pid = self.rng.randrange(self.opt.partitions)
        leader_id = self.controller.partitions[pid].state.leader
        if leader_id == NO_LEADER:
            return
        self.produced += 1
        value = f"s{self.seed}-m{self.produced}".encode()
        raw = encode_batch([(self.now_ms, None, value, ())])
        broker = self.brokers[leader_id]
        token = (pid, self.produced)

        def arrive() -> None:
            if not broker.alive or pid not in broker.replicas:
                return
            rep = broker.replicas[pid]
            headers = [h for _, h in iter_batches(raw)]
            plan = rep.core.plan_append(-1, headers)
            if isinstance(plan, ProduceRejected):
                return
            rep.log.leader_append(raw, plan)
            self.checker.on_leader_append(broker, pid, plan)
            self.pending_values[token] = (broker.broker_id, pid, plan.base_offset)
            effects = rep.core.on_leader_appended(
                plan, self.now_ms, token=token, deadline_ms=self.now_ms + 2_000
            )
            self.apply(broker, pid, effects)

        self.send(arrive)

    # An idempotent producer (DESIGN §5, §8.5): retries the same batch (same producer id,
    # epoch and sequence) after errors and lost answers, to whichever broker leads now.

    def _produce_idempotent(self, pid: int) -> None:
        producer = self.producers[pid]
        if producer.in_flight is None:
            value = f"p{pid}-seq{producer.sequence}".encode()
            producer.in_flight = encode_batch(
                [(self.now_ms, None, value, ())],
                producer_id=producer.producer_id,
                producer_epoch=0,
                base_sequence=producer.sequence,
            )
        self._send_idempotent(pid, producer.sequence)

    def _send_idempotent(self, pid: int, sequence: int) -> None:
        producer = self.producers[pid]
        if producer.in_flight is None or producer.sequence != sequence or not self.faults:
            return
        producer.attempt += 1
        attempt = producer.attempt
        raw = producer.in_flight
        token = ("idem", pid, sequence, attempt)
        leader_id = self.controller.partitions[pid].state.leader

        def retry_later(delay_ms: int) -> None:
            self.at(delay_ms, lambda: self._retry_if_current(pid, sequence, attempt))

        retry_later(2_500)  # the request timeout: a lost request or answer is retried
        if leader_id == NO_LEADER:
            return
        broker = self.brokers[leader_id]

        def arrive() -> None:
            if not broker.alive or pid not in broker.replicas:
                return
            rep = broker.replicas[pid]
            headers = [h for _, h in iter_batches(raw)]
            plan = rep.core.plan_append(-1, headers)
            deadline_ms = self.now_ms + 2_000
            if isinstance(plan, ProduceRejected):
                if plan.is_duplicate:
                    self.pending_values[token] = (broker.broker_id, pid, plan.base_offset)
                    effects = rep.core.park_produce(
                        token, plan.base_offset, plan.last_offset, deadline_ms
                    )
                    self.apply(broker, pid, effects)
                else:
                    self.checker.on_producer_error(pid, plan.error)
                    self.send(lambda: self._retry_if_current(pid, sequence, attempt))
                return
            rep.log.leader_append(raw, plan)
            self.checker.on_leader_append(broker, pid, plan)
            self.pending_values[token] = (broker.broker_id, pid, plan.base_offset)
            effects = rep.core.on_leader_appended(
                plan, self.now_ms, token=token, deadline_ms=deadline_ms
            )
            self.apply(broker, pid, effects)

        self.send(arrive)

    def _retry_if_current(self, pid: int, sequence: int, attempt: int) -> None:
        producer = self.producers[pid]
        if producer.sequence == sequence and producer.attempt == attempt:
            self.at(self.rng.randint(5, 50), lambda: self._send_idempotent(pid, sequence))

    def _on_idempotent_answer(self, token: tuple[object, ...], error: ErrorCode) -> None:
        _, pid, sequence, attempt = token
        producer = self.producers[pid]  # type: ignore[index]
        if producer.sequence != sequence or producer.in_flight is None:
            return  # an answer to an attempt of a batch already acknowledged
        if error != ErrorCode.NONE:
            self._retry_if_current(pid, sequence, attempt)  # type: ignore[arg-type]
            return
        producer.acked_values.append(producer.in_flight)
        producer.in_flight = None
        producer.sequence += 1

    def _on_produce_complete(self, effect: CompleteProduce) -> None:
        token = effect.token
        if isinstance(token, tuple) and token[0] == "idem":
            info = self.pending_values.get(token)
            if info is not None and effect.error == ErrorCode.NONE:
                broker_id, pid, base_offset = info
                data = self.brokers[broker_id].replicas[pid].log.batch_at(base_offset)
                invariant(data is not None, f"acked batch at {base_offset} is not in the log")
                self.send(lambda: self.acked.__setitem__((pid, base_offset), data))  # type: ignore[arg-type]
            self.pending_values.pop(token, None)
            self.send(lambda: self._on_idempotent_answer(token, effect.error))
            return
        info = self.pending_values.pop(effect.token, None)
        if info is None or effect.error != ErrorCode.NONE:
            return
        broker_id, pid, base_offset = info
        data = self.brokers[broker_id].replicas[pid].log.batch_at(base_offset)
        invariant(data is not None, f"acked batch at {base_offset} is not in the leader's log")
        # The response travels back; a lost response just means the client never learns.
        self.send(lambda: self.acked.__setitem__((pid, base_offset), data))  # type: ignore[arg-type]

    def _consume(self) -> None:
        self.checker.consume()

    # -- faults ---------------------------------------------------------------------------

    def _impaired_ok(self, broker_id: int) -> bool:
        """Fault budget (DESIGN §8.1): after this crash every partition keeps at least
        min.insync.replicas live members in the controller's ISR."""
        for part in self.controller.partitions.values():
            isr = part.state.isr
            if broker_id in isr:
                live = [b for b in isr if b != broker_id and self.brokers[b].alive]
                if len(live) < self.opt.min_insync_replicas:
                    return False
        return True

    def crash(self, broker: SimBroker) -> None:
        self.note(f"crash b{broker.broker_id}")
        broker.alive = False
        for pid, log in broker.logs.items():
            log.crash(self.rng)
            rep = broker.replicas.get(pid)
            if rep is not None:
                log.hw_checkpoint = min(log.hw_checkpoint, log.leo)
        broker.replicas.clear()
        # The heartbeat stream breaks: the controller fences at once (DESIGN §3 fast path).
        self.controller.fence(broker.broker_id)
        self._publish_metadata()
        self.at(self.rng.randint(100, 1_500), lambda: self.restart(broker))

    def restart(self, broker: SimBroker) -> None:
        if broker.alive:
            return
        self.note(f"restart b{broker.broker_id}")
        broker.alive = True
        broker.broker_epoch = self.controller.register(broker.broker_id)
        sync_view(broker.view, self.controller)
        # Catch up on metadata (a full image), then ask to be unfenced.
        for pid, part in self.controller.partitions.items():
            rep = broker.replica(pid)
            self.apply(broker, pid, rep.core.apply_partition_state(part.state, self.now_ms))
        self._publish_metadata()

        def unfence() -> None:
            if broker.alive:
                self.controller.unfence(broker.broker_id)
                self._publish_metadata()

        self.at(self._delay(), unfence)

    def _move_leader(self, pid: int) -> None:
        if self.faults:
            self.controller.move_leader(pid, self.rng)
            self._publish_metadata()

    def _maybe_fault(self) -> None:
        if not self.faults:
            return
        rng = self.rng
        if rng.random() < self.opt.crash_rate:
            candidates = [b for b in self.brokers.values() if b.alive]
            broker = rng.choice(candidates)
            if self._impaired_ok(broker.broker_id):
                self.crash(broker)
        if rng.random() < self.opt.move_leader_rate:
            pid = rng.randrange(self.opt.partitions)
            self._move_leader(pid)
            # Successive elections inside one fetch interval (research §4.2 scenario 3): the
            # next leader may never have seen the last one's writes.
            for _ in range(rng.randint(0, 2)):
                self.at(rng.randint(2, 20), lambda p=pid: self._move_leader(p))
        if rng.random() < self.opt.pause_rate:
            broker = rng.choice(list(self.brokers.values()))
            broker.paused_until_ms = self.now_ms + rng.randint(50, 800)

    # -- main loop ------------------------------------------------------------------------

    def _tick(self) -> None:
        self._maybe_fault()
        for broker in self.brokers.values():
            if not broker.alive:
                continue
            self._fetch_tick(broker)
            for pid, rep in list(broker.replicas.items()):
                if self.now_ms % 150 == 0:
                    self.apply(broker, pid, rep.core.maybe_shrink_isr(self.now_ms))
                if pid in broker.replicas:
                    self.apply(broker, pid, rep.core.expire_produces(self.now_ms))
                if self.rng.random() < 0.02:
                    rep.log.flush(rep.core.high_watermark)
        if self.faults and self.rng.random() < self.opt.tick_ms / self.opt.produce_interval_ms:
            self._produce()
        if self.faults and self.rng.random() < 0.3:
            pid = self.rng.randrange(self.opt.partitions)
            if self.producers[pid].in_flight is None:
                self._produce_idempotent(pid)
        if self.now_ms % 20 == 0:
            self._consume()
        self._publish_metadata()
        self.at(self.opt.tick_ms, self._tick)

    def _run_until(self, end_ms: int, stop: Callable[[], bool] | None = None) -> None:
        while self._queue and self._queue[0].at_ms <= end_ms:
            event = heapq.heappop(self._queue)
            self.now_ms = event.at_ms
            event.action()
            self.checker.check(full=self.now_ms % 25 == 0)
            if stop is not None and self.now_ms % 100 == 0 and stop():
                return

    def run(self) -> None:
        self.at(0, self._tick)
        self._run_until(self.opt.safety_ms)
        # Liveness: heal everything, restart the dead, stop producing; the cluster must settle.
        self.faults = False
        for broker in self.brokers.values():
            broker.paused_until_ms = 0
            if not broker.alive:
                self.restart(broker)
        self._run_until(self.now_ms + self.opt.liveness_ms, stop=self.checker.converged)
        self.checker.check_final()


# ------------------------------------------------------------------------------------------
# Invariant checkers (DESIGN §8)


class Checker:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        # (pid, base offset) -> batch bytes, once any replica's HW passed it (I2, I5).
        self.committed: dict[tuple[int, int], bytes] = {}
        self.writers: dict[tuple[int, int], int] = {}  # (pid, leader epoch) -> broker (I10)
        self.replica_epochs: dict[tuple[int, int], int] = {}  # (broker, pid) -> LE seen
        self.consumer_position: dict[int, int] = {}
        self.verified: dict[tuple[int, int], int] = {}  # (broker, pid) -> offset checked up to

    def on_truncated(self, broker: SimBroker, pid: int) -> None:
        key = (broker.broker_id, pid)
        leo = broker.replicas[pid].log.leo
        self.verified[key] = min(self.verified.get(key, 0), leo)

    def on_producer_error(self, pid: int, error: ErrorCode) -> None:
        """The idempotent producer must never be told its retry is out of order or fenced:
        that would mean the dedupe state lost a committed batch (DESIGN §8.5)."""
        invariant(
            error not in (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.INVALID_PRODUCER_EPOCH),
            f"p{pid}: idempotent producer got {error.name}",
        )

    def on_leader_append(self, broker: SimBroker, pid: int, plan: AppendPlan) -> None:
        key = (pid, plan.leader_epoch)
        writer = self.writers.setdefault(key, broker.broker_id)
        invariant(
            writer == broker.broker_id,
            f"p{pid}: brokers {writer} and {broker.broker_id} both wrote in epoch "
            f"{plan.leader_epoch}",
        )

    def on_high_watermark(self, broker: SimBroker, pid: int) -> None:
        rep = broker.replicas[pid]
        hw = rep.core.high_watermark
        log = rep.log
        key = (broker.broker_id, pid)
        start = log.index_of(self.verified.get(key, 0))
        for i in range(start, len(log.headers)):
            header = log.headers[i]
            if header.next_offset > hw:
                break
            self.verified[key] = header.next_offset
            seen = self.committed.get((pid, header.base_offset))
            if seen is None:
                self.committed[(pid, header.base_offset)] = log.batches[i]
            else:
                invariant(
                    seen == log.batches[i],
                    f"p{pid}: broker {broker.broker_id} holds different bytes at "
                    f"{header.base_offset} below its HW {hw}",
                )

    def consume(self) -> None:
        """A consumer per partition reads from the current leader, checking I3."""
        sim = self.sim
        for pid in range(sim.opt.partitions):
            leader_id = sim.controller.partitions[pid].state.leader
            if leader_id == NO_LEADER:
                continue
            broker = sim.brokers[leader_id]
            rep = broker.replicas.get(pid)
            if not broker.alive or rep is None:
                continue
            position = self.consumer_position.get(pid, 0)
            answer = rep.core.check_consumer_fetch(-1, position)
            if answer.error != ErrorCode.NONE:
                continue
            data = rep.log.read(position, answer.read_until_offset)
            for pos, header in iter_batches(data):
                invariant(
                    header.next_offset <= rep.core.high_watermark,
                    f"p{pid}: consumer read {header.last_offset} above HW "
                    f"{rep.core.high_watermark}",
                )
                invariant(
                    header.base_offset == position,
                    f"p{pid}: consumer expected offset {position}, got {header.base_offset}",
                )
                committed = self.committed.get((pid, header.base_offset))
                invariant(
                    committed is None or committed == data[pos : pos + header.size],
                    f"p{pid}: consumer saw bytes at {header.base_offset} that differ from the "
                    "committed ones",
                )
                position = header.next_offset
            self.consumer_position[pid] = position

    def check(self, full: bool = True) -> None:
        sim = self.sim
        for broker in sim.brokers.values():
            if not broker.alive:
                continue
            for pid, rep in broker.replicas.items():
                core, log = rep.core, rep.log
                core.check_invariants()
                invariant(core.leo == log.leo, f"b{broker.broker_id} p{pid}: core LEO != log LEO")
                check_epoch_entries(log.epoch_cache.entries, f"b{broker.broker_id} p{pid}: ")
                key = (broker.broker_id, pid)
                seen = self.replica_epochs.get(key, -1)
                invariant(
                    core.leader_epoch >= seen,
                    f"b{broker.broker_id} p{pid}: leader epoch went back {seen} -> "
                    f"{core.leader_epoch}",
                )
                self.replica_epochs[key] = core.leader_epoch
        if not full:
            return
        # I1 (continuous form): every acked batch is held by every live controller-ISR member.
        for (pid, offset), data in sim.acked.items():
            state = sim.controller.partitions[pid].state
            holders = 0
            for broker_id in state.isr:
                broker = sim.brokers[broker_id]
                if not broker.alive:
                    continue
                has = broker.logs[pid].batch_at(offset) == data
                invariant(
                    has or broker_id in sim.controller.fenced,
                    f"p{pid}: acked batch at {offset} missing on ISR member {broker_id}",
                )
                holders += has
            invariant(
                holders > 0 or not any(sim.brokers[b].alive for b in state.isr),
                f"p{pid}: acked batch at {offset} is on no live ISR member",
            )

    def converged(self) -> bool:
        sim = self.sim
        for pid, part in sim.controller.partitions.items():
            state = part.state
            if state.leader == NO_LEADER or set(state.isr) != set(state.replicas):
                return False
            leader = sim.brokers[state.leader].replicas.get(pid)
            if leader is None or leader.core.role is not Role.LEADER:
                return False
            for broker_id in state.replicas:
                rep = sim.brokers[broker_id].replicas.get(pid)
                if rep is None or rep.core.leader_epoch != state.leader_epoch:
                    return False
                if rep.core.high_watermark != leader.core.leo or rep.log.leo != leader.core.leo:
                    return False
        return True

    def check_final(self) -> None:
        sim = self.sim
        invariant(self.converged(), "the cluster did not converge after the faults healed")
        for pid, part in sim.controller.partitions.items():
            leader_log = sim.brokers[part.state.leader].replicas[pid].log
            for broker_id in part.state.replicas:
                log = sim.brokers[broker_id].replicas[pid].log
                invariant(
                    log.batches == leader_log.batches,
                    f"p{pid}: broker {broker_id}'s log differs from the leader's",
                )
                check_batches_contiguous(log.triples(), log.log_start_offset, f"p{pid}: ")
                check_epoch_cache_matches_batches(
                    log.epoch_cache.entries, log.triples(), f"b{broker_id} p{pid}: "
                )
            # DESIGN §8.5: every idempotent batch is stored once, acked or not.
            producer_id = sim.producers[pid].producer_id
            sequences = [
                h.base_sequence for h in leader_log.headers if h.producer_id == producer_id
            ]
            invariant(
                len(sequences) == len(set(sequences)),
                f"p{pid}: an idempotent batch was stored twice: {sorted(sequences)}",
            )
            invariant(
                set(range(len(sim.producers[pid].acked_values))) <= set(sequences),
                f"p{pid}: an acknowledged idempotent batch is missing",
            )
            for (apid, offset), data in sim.acked.items():
                if apid != pid:
                    continue
                invariant(
                    leader_log.batch_at(offset) == data,
                    f"p{pid}: acked batch at {offset} lost",
                )
