"""A deterministic, seeded simulation of the replication cores and the controller core
(docs/design.md §2, §3, §6, §8; the second test layer of §8).

In one process: every broker's partition cores (`PartitionReplica`) over an in-memory log model
(real v2 batch bytes, the real EpochCache, an "unflushed tail lost on crash" model), and the real
`ControllerCore` behind a simulated journal (tests/sim/sim_controller.py: group commit, crash
that loses unflushed entries, restart by snapshot + replay). The shell around them is modelled
on broker/replica_manager.py and broker/controller_link.py:

- brokers register (a fresh incarnation per process start; DUPLICATE_BROKER_REGISTRATION is
  retried), heartbeat on a virtual timer over a heartbeat stream, and are unfenced by the core
  once caught up; a crash is a broken heartbeat stream (the controller fences at once) or, when
  no reset reaches it, a session timeout (`tick`);
- the metadata log reaches each broker through a watch stream: batches are delayed and arrive
  out of order, the broker buffers them and applies them in offset order (a snapshot after a
  controller restart, for watchers behind its retained log), then acts on the image exactly as
  `ReplicaManager.apply_metadata_batch` does;
- AlterPartition proposals go to the core (with the partition epoch as CAS), and lost requests
  or answers surface as REQUEST_TIMED_OUT after a timeout;
- faults: a network that delays, drops and reorders; broker crashes within the fault budget;
  SIGSTOP-like pauses (nothing runs on a paused broker; its heartbeats stop, so a long pause is
  a session timeout and a zombie leader); heartbeat streams that break under a live broker;
  brokers asking to be fenced and preferred elections (bursts of leader moves, KIP-279's
  scenario); controlled shutdowns (SIGTERM) and restarts; controller crashes and restarts;
  automatic rebalance ticks; offline periods (every ISR member of a partition paused past the
  session timeout, so the partition must stay offline: unclean election is disabled and an
  out-of-sync replica must never lead).

Producers write with acks=all (plain and idempotent); consumers read from leaders. The invariants of
docs/design.md §8 are checked after every event (`Checker`), plus the controller's: every record the
controller makes durable moves epochs forward, a new leader comes from the previous ISR and holds
every acknowledged batch, no unclean election happens, a session timeout fences only a broker that
went silent, a running controller grants a controlled shutdown, a restarted controller rebuilds the
same image. First a safety phase with faults, then a liveness phase with every fault healed that
must converge (full ISRs, preferred leaders back, identical logs holding every acknowledged batch,
every broker's metadata image equal to the controller's).

Everything random comes from one `random.Random(seed)`; virtual time is an integer `now_ms`.
Used by tests/sim/test_replication_sim.py; tests/unit/test_replication_scenarios.py uses MemLog.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from sim_controller import SimControllerNode

from minibroker.broker.replication.events import (
    AdvanceLogStartOffset,
    AlterPartitionResult,
    AppendAsFollower,
    AppendPlan,
    AssignEpoch,
    Backoff,
    CompleteProduce,
    DuplicateAppend,
    Effect,
    FetchPosition,
    FetchResponse,
    FollowerFetch,
    HighWatermarkChanged,
    IsrUpdated,
    LeaderRecoveryState,
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
)
from minibroker.broker.replication.partition import BrokerEligibilityView, PartitionReplica
from minibroker.broker.storage.epoch_cache import EpochCache
from minibroker.client.batch import BatchHeader, assign_offsets, iter_batches
from minibroker.client.common.invariant import invariant
from minibroker.client.errors import ErrorCode
from minibroker.client.metadata.image import MetadataImage
from minibroker.client.metadata.records import LogEntry, PartitionRecord
from minibroker.client.records import encode_batch
from minibroker.client.types import NO_LEADER
from minibroker.controller.core.controller import ControllerCore, ControllerSettings
from minibroker.controller.core.election import Election
from minibroker.controller.core.isr import AlterPartitionProposal, IsrMember
from minibroker.controller.core.messages import (
    AlterPartitionReply,
    AlterPartitionRequest,
    CreatableTopic,
    CreateTopicResult,
    Event,
    HeartbeatReply,
    HeartbeatRequest,
    Outcome,
    RegisterReply,
    RegisterRequest,
)

TOPIC = "sim"
SHUTDOWN_TIMEOUT_MS = 2_000  # a broker stops after this long without the controller's grant
CLUSTER_ID = "sim-cluster"

# ------------------------------------------------------------------------------------------
# In-memory log


class MemLog:
    """One replica's log: stamped batch bytes in offset order, an epoch cache, a flush mark.

    `flushed` counts the leading batches that are durable; a crash keeps them and a random
    part of the rest (`crash`). The epoch cache entries are durable on assign (Kafka writes the
    checkpoint synchronously) and trimmed to the log end at recovery (docs/design.md §4.5).
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
# Brokers


@dataclass
class SimReplica:
    core: PartitionReplica
    log: MemLog
    fetch_in_flight: int = 0  # id of the fetch in flight, 0 for none
    fetching: bool = False


class SimBroker:
    """One broker across process restarts: its logs survive (minus the unflushed tail), the
    rest (registration, metadata image, streams, replica cores) belongs to one incarnation."""

    def __init__(self, broker_id: int, sim: Simulation) -> None:
        self.broker_id = broker_id
        self.sim = sim
        self.alive = False
        self.incarnation = 0  # process starts; answers addressed to an older process are lost
        self.incarnation_id = ""
        self.registered = False
        self.broker_epoch = -1  # from the controller's RegisterReply; -1 until then
        self.image = MetadataImage()  # the metadata log as this broker has applied it
        self.metadata_buffer: dict[int, LogEntry] = {}  # arrived out of order, not yet applied
        self.watch: int | None = None  # token of the open WatchMetadata stream
        self.hb_stream: tuple[int, int] | None = None  # (stream id, controller generation)
        self.view = BrokerEligibilityView()
        self.logs: dict[int, MemLog] = {}
        self.replicas: dict[int, SimReplica] = {}
        self.paused_until_ms = 0  # SIGSTOP: nothing runs on this broker before this time
        self.shutting_down = False  # SIGTERM: controlled shutdown in progress
        # Crashed, so its log may lack what it acknowledged, until a new incarnation registers.
        self.lossy = False

    def start_process(self) -> None:
        self.alive = True
        self.incarnation += 1
        self.incarnation_id = f"b{self.broker_id}-i{self.incarnation}"
        self.registered = False
        self.broker_epoch = -1
        self.image = MetadataImage()
        self.metadata_buffer = {}
        self.watch = None
        self.hb_stream = None
        self.view = BrokerEligibilityView()
        self.replicas = {}
        self.shutting_down = False

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
                producer_batches=log.headers,
                name=f"p{pid}",
            )
            rep = SimReplica(core, log)
            self.replicas[pid] = rep
        return rep


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


# ------------------------------------------------------------------------------------------
# Simulation


@dataclass
class SimOptions:
    brokers: int = 3
    partitions: int = 3
    replication_factor: int = 3
    min_insync_replicas: int = 2
    safety_ms: int = 5_000
    liveness_ms: int = 20_000
    drop_rate: float = 0.05
    delay_ms_max: int = 30
    # Fault rates per scheduler tick (tick_ms).
    crash_rate: float = 0.0015
    move_leader_rate: float = 0.003
    pause_rate: float = 0.001
    controller_crash_rate: float = 0.0003
    offline_rate: float = 0.0002
    shutdown_rate: float = 0.0004
    # One controller restart and one offline period at a random time of every safety phase.
    scheduled_faults: bool = True
    stream_break_rate: float = 0.003  # per heartbeat
    produce_interval_ms: int = 7
    tick_ms: int = 5
    # Control plane timers (virtual ms; shorter than Kafka's so a run sees many of them).
    heartbeat_interval_ms: int = 100
    session_timeout_ms: int = 500
    controller_tick_ms: int = 50
    rebalance_interval_ms: int = 1_000
    request_timeout_ms: int = 300


@dataclass
class IdempotentProducer:
    """One idempotent producer per partition, one batch in flight, retried until acked."""

    producer_id: int
    sequence: int = 0
    in_flight: bytes | None = None
    attempt: int = 0
    acked_values: list[bytes] = field(default_factory=list)


# A scheduled event: (at_ms, sequence number, action). Plain tuples compare in C; the unique
# sequence number keeps events at the same time in scheduling order and the action uncompared.
_Event = tuple[int, int, Callable[[], None]]


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
        self._seq = 0
        settings = ControllerSettings(
            session_timeout_ms=self.opt.session_timeout_ms,
            auto_leader_rebalance_enable=True,
            leader_imbalance_check_interval_ms=self.opt.rebalance_interval_ms,
            leader_imbalance_per_broker_percentage=10,
        )
        self.controller = SimControllerNode(
            settings, CLUSTER_ID, random.Random(self.rng.getrandbits(64)), 0
        )
        self.controller_up_since_ms = 0
        self._flush_scheduled = False
        self._after_flush: list[tuple[int, Callable[[], None]]] = []
        self._next_stream_id = 0
        self._next_watch = 0
        self._next_fetch_id = 0
        self.topic_id: str | None = None
        broker_ids = list(range(1, self.opt.brokers + 1))
        self.brokers = {b: SimBroker(b, self) for b in broker_ids}
        self.faults = True
        self.checker = Checker(self)
        self.acked: dict[tuple[int, int], bytes] = {}  # (pid, offset) -> stamped batch bytes
        self.produced = 0
        self.pending_values: dict[object, tuple[int, int, int]] = {}
        self.producers = {
            pid: IdempotentProducer(1_000 + pid) for pid in range(self.opt.partitions)
        }
        self.trace: list[str] = []
        self.stats: Counter[str] = Counter()

    # -- scheduling ----------------------------------------------------------------------

    def at(self, delay_ms: int, action: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (self.now_ms + delay_ms, self._seq, action))

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

    def _paused(self, broker: SimBroker) -> bool:
        return self.now_ms < broker.paused_until_ms

    def _on_broker(
        self, broker: SimBroker, incarnation: int | None, action: Callable[[], None]
    ) -> None:
        """Run `action` on `broker`'s process (`incarnation`, None: whichever runs). A paused
        process runs it when it wakes (SIGSTOP defers, it does not drop); a dead or replaced
        one never does."""
        if not broker.alive or (incarnation is not None and broker.incarnation != incarnation):
            return
        if self._paused(broker):
            self.at(
                broker.paused_until_ms - self.now_ms,
                lambda: self._on_broker(broker, incarnation, action),
            )
            return
        action()

    # -- the controller process -------------------------------------------------------------

    def _partition(self, pid: int) -> PartitionRecord | None:
        """The controller's current record for partition `pid` (clients' omniscient view)."""
        if self.topic_id is None:
            return None
        return self.controller.image.partition(self.topic_id, pid)

    def _leader(self, pid: int) -> int:
        record = self._partition(pid)
        return record.leader if record is not None else NO_LEADER

    def _call_controller(
        self,
        command: Callable[[ControllerCore, int], Outcome[Any]],
        on_reply: Callable[[Any], None] | None = None,
    ) -> bool:
        """A request reached the controller: run it now; `on_reply(reply)` once everything it
        could have seen is durable (group commit). False when the controller is down."""
        ctl = self.controller
        if not ctl.up:
            return False
        seen_events = len(ctl.events)
        reply: Any = ctl.execute(command, self.now_ms)
        for event in ctl.events[seen_events:]:
            self.checker.on_controller_event(event)
        if ctl.has_pending:
            if on_reply is not None:
                self._after_flush.append((ctl.generation, lambda: on_reply(reply)))
            if not self._flush_scheduled:
                self._flush_scheduled = True
                generation = ctl.generation
                self.at(self.rng.randint(1, 4), lambda: self._flush(generation))
        elif on_reply is not None:
            on_reply(reply)
        return True

    def _flush(self, generation: int) -> None:
        ctl = self.controller
        if generation != ctl.generation:
            return  # the process that scheduled this fsync died first
        self._flush_scheduled = False
        entries = ctl.flush()
        self.checker.on_controller_entries(entries)
        self._publish(entries)
        callbacks, self._after_flush = self._after_flush, []
        for gen, callback in callbacks:
            if gen == ctl.generation:
                callback()

    def _controller_tick(self) -> None:
        self.at(self.opt.controller_tick_ms, self._controller_tick)
        self._call_controller(lambda core, now: core.tick(now))

    def crash_controller(self) -> None:
        ctl = self.controller
        if not ctl.up or not self.faults:
            return  # already down, or the liveness phase has begun
        if ctl.has_pending and self.rng.random() < 0.5:
            self._flush(ctl.generation)  # the fsync finished just before the crash
        lost = ctl.pending_count
        ctl.crash()
        self._after_flush.clear()
        self._flush_scheduled = False
        self.stats["controller_crashes"] += 1
        self.note(f"controller crash, {lost} unflushed entries lost")
        for broker in self.brokers.values():
            # Every stream to the dead process breaks; watchers reconnect with backoff.
            broker.hb_stream = None
            if broker.watch is not None:
                self._break_watch(broker)
        downtime_ms = self.rng.choice((self.rng.randint(50, 300), self.rng.randint(300, 1_500)))
        self.at(downtime_ms, self.restart_controller)

    def restart_controller(self) -> None:
        if self.controller.up:
            return
        self.controller.restart(self.now_ms)
        self.controller_up_since_ms = self.now_ms
        self.note(f"controller restart at offset {self.controller.durable_offset}")

    def _create_topic(self) -> None:
        if self.topic_id is not None:
            return
        existing = self.controller.durable_image.topic(TOPIC)
        if existing is not None:
            self.topic_id = existing.topic_id
            return
        self.at(50, self._create_topic)
        configs = {
            "min.insync.replicas": str(self.opt.min_insync_replicas),
            "unclean.leader.election.enable": "false",
        }
        topic = CreatableTopic(TOPIC, self.opt.partitions, self.opt.replication_factor, configs)

        def answer(results: tuple[CreateTopicResult, ...]) -> None:
            if results[0].error == ErrorCode.NONE:
                self.topic_id = results[0].topic_id
                self.note(f"topic created {self.topic_id}")

        self._call_controller(lambda core, now: core.create_topics([topic], False, now), answer)

    # -- metadata (WatchMetadata) -----------------------------------------------------------

    def _publish(self, entries: list[LogEntry]) -> None:
        """Send durable entries down every open watch stream: delayed, maybe reordered."""
        if not entries:
            return
        batch = tuple(entries)
        for broker in self.brokers.values():
            token = broker.watch
            if token is None:
                continue
            if self.faults and self.rng.random() < self.opt.drop_rate / 5:
                self._break_watch(broker)  # the stream broke; the reconnect resends from there
                continue
            delay = self._delay() * (3 if self.faults and self.rng.random() < 0.2 else 1)
            self.at(
                delay, partial(self._on_watch_batch, broker, token, False, batch, batch[0].offset)
            )

    def _break_watch(self, broker: SimBroker) -> None:
        broker.watch = None
        incarnation = broker.incarnation
        self.at(self.rng.randint(20, 200), lambda: self._open_watch(broker, incarnation))

    def _open_watch(self, broker: SimBroker, incarnation: int) -> None:
        if (
            not broker.alive
            or broker.incarnation != incarnation
            or not broker.registered
            or broker.watch is not None
        ):
            return
        ctl = self.controller
        if not ctl.up:
            self.at(self.rng.randint(50, 200), lambda: self._open_watch(broker, incarnation))
            return
        self._next_watch += 1
        token = broker.watch = self._next_watch
        is_snapshot, items, offset = ctl.read_from(broker.image.next_offset)
        if is_snapshot or items:
            self.at(
                self._delay(),
                lambda: self._on_watch_batch(broker, token, is_snapshot, items, offset),
            )

    def _on_watch_batch(
        self,
        broker: SimBroker,
        token: int,
        is_snapshot: bool,
        items: tuple[Any, ...],
        offset: int,
    ) -> None:
        if broker.watch != token or not broker.alive:
            return  # that stream is gone; its reconnect asks again from the applied offset
        if self._paused(broker):
            self.at(
                broker.paused_until_ms - self.now_ms,
                lambda: self._on_watch_batch(broker, token, is_snapshot, items, offset),
            )
            return
        image = broker.image
        applied = False
        if is_snapshot:
            image.replace_with_snapshot(items, offset)
            broker.metadata_buffer = {
                o: e for o, e in broker.metadata_buffer.items() if o >= image.next_offset
            }
            applied = True
            self.stats["metadata_snapshots"] += 1
        else:
            for entry in items:
                if entry.offset >= image.next_offset:
                    broker.metadata_buffer[entry.offset] = entry
        # WatchMetadata applies in offset order: what arrived early waits for the gap to fill.
        while image.next_offset in broker.metadata_buffer:
            image.apply(broker.metadata_buffer.pop(image.next_offset))
            applied = True
        if applied:
            self._act_on_metadata(broker)

    def _act_on_metadata(self, broker: SimBroker) -> None:
        """ReplicaManager.apply_metadata_batch: registrations, then every hosted partition."""
        for broker_id, reg in broker.image.brokers.items():
            broker.view.update(
                broker_id,
                reg.broker_epoch,
                fenced=reg.fenced,
                in_controlled_shutdown=reg.in_controlled_shutdown,
            )
        topic = broker.image.topics_by_id.get(self.topic_id) if self.topic_id else None
        if topic is None:
            return
        for pid, record in sorted(topic.partitions.items()):
            if broker.broker_id not in record.replicas:
                continue
            rep = broker.replica(pid)
            self.apply(
                broker, pid, rep.core.apply_partition_state(partition_state(record), self.now_ms)[1]
            )

    # -- broker lifecycle: registration and heartbeats ----------------------------------------

    def start_broker(self, broker: SimBroker) -> None:
        broker.start_process()
        incarnation = broker.incarnation
        self._register(broker, incarnation)
        self.at(self.opt.heartbeat_interval_ms, lambda: self._heartbeat_tick(broker, incarnation))

    def _register(self, broker: SimBroker, incarnation: int) -> None:
        if not broker.alive or broker.incarnation != incarnation or broker.registered:
            return
        request = RegisterRequest(
            broker_id=broker.broker_id,
            cluster_id=CLUSTER_ID,
            incarnation_id=broker.incarnation_id,
            host="127.0.0.1",
            port=9_000 + broker.broker_id,
        )
        answered = [False]

        def retry() -> None:
            if not answered[0]:
                answered[0] = True
                self.at(self.rng.randint(50, 150), lambda: self._register(broker, incarnation))

        def on_reply(reply: RegisterReply) -> None:
            if answered[0]:
                return
            answered[0] = True
            if reply.error != ErrorCode.NONE:
                # DUPLICATE_BROKER_REGISTRATION: the old incarnation's session is still alive.
                self.at(self.rng.randint(50, 150), lambda: self._register(broker, incarnation))
                return
            broker.broker_epoch = reply.broker_epoch
            broker.registered = True
            broker.lossy = False  # the registration took this incarnation out of every ISR
            self.note(f"b{broker.broker_id} registered, broker epoch {reply.broker_epoch}")
            self._open_watch(broker, incarnation)

        def arrive() -> None:
            self._call_controller(
                lambda core, now: core.register_broker(request, now),
                lambda reply: self.send(
                    lambda: self._on_broker(broker, incarnation, lambda: on_reply(reply))
                ),
            )

        self.at(self.opt.request_timeout_ms, retry)
        self.send(arrive)

    def _heartbeat_tick(self, broker: SimBroker, incarnation: int) -> None:
        if not broker.alive or broker.incarnation != incarnation:
            return
        self.at(self.opt.heartbeat_interval_ms, lambda: self._heartbeat_tick(broker, incarnation))
        if broker.registered and not self._paused(broker):
            self._send_heartbeat(broker)

    def _send_heartbeat(self, broker: SimBroker, want_fence: bool = False) -> None:
        ctl = self.controller
        stream = broker.hb_stream
        if stream is None or stream[1] != ctl.generation:
            if not ctl.up:
                broker.hb_stream = None
                return
            self._next_stream_id += 1
            stream = broker.hb_stream = (self._next_stream_id, ctl.generation)
        if self.faults and self.rng.random() < self.opt.stream_break_rate and self._fence_ok():
            # The connection breaks under a live broker: the controller fences it at once and
            # the next heartbeat, on a new stream, unfences it.
            self.stats["stream_breaks"] += 1
            self._break_heartbeat_stream(broker, notice=True)
            return
        request = HeartbeatRequest(
            broker.broker_id,
            broker.broker_epoch,
            broker.image.next_offset,  # what controller_link.py reports
            want_fence=want_fence,
            want_shut_down=broker.shutting_down,
        )
        stream_id, generation = stream
        incarnation = broker.incarnation

        def arrive() -> None:
            if self.controller.generation != generation:
                return  # the stream died with that controller process
            self._call_controller(
                lambda core, now: core.heartbeat(request, stream_id, now),
                lambda reply: self.at(
                    self._delay(),
                    lambda: self._on_broker(
                        broker, incarnation, lambda: self._on_heartbeat_reply(broker, reply)
                    ),
                ),
            )

        # A stream is TCP: heartbeats are delayed, never dropped alone (a loss breaks it).
        self.at(self._delay(), arrive)

    def _on_heartbeat_reply(self, broker: SimBroker, reply: HeartbeatReply) -> None:
        if reply.error in (ErrorCode.STALE_BROKER_EPOCH, ErrorCode.BROKER_ID_NOT_REGISTERED):
            # controller_link.py: the controller no longer knows this epoch; register again.
            broker.registered = False
            broker.hb_stream = None
            self._register(broker, broker.incarnation)
        elif reply.should_shut_down and broker.shutting_down:
            self._stop_broker(broker, "controlled shutdown granted")

    def _break_heartbeat_stream(self, broker: SimBroker, notice: bool) -> None:
        stream, broker.hb_stream = broker.hb_stream, None
        if stream is None or not notice:
            return
        stream_id, generation = stream
        broker_id, broker_epoch = broker.broker_id, broker.broker_epoch

        def arrive() -> None:
            if self.controller.generation == generation:
                self._call_controller(
                    lambda core, now: core.heartbeat_stream_closed(
                        broker_id, broker_epoch, stream_id, now
                    )
                )

        self.at(self._delay(), arrive)

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
                self.apply(broker, pid, core.on_log_truncated(log.leo, log.log_start_offset)[1])
            elif isinstance(effect, TruncateFullyAndStartAt):
                log.truncate_fully_and_start_at(effect.offset)
                self.checker.on_truncated(broker, pid)
                self.apply(broker, pid, core.on_log_truncated(log.leo, log.log_start_offset)[1])
            elif isinstance(effect, AppendAsFollower):
                headers = log.append(effect.records)
                self.apply(broker, pid, core.on_follower_appended(log.leo, headers)[1])
            elif isinstance(effect, AdvanceLogStartOffset):
                log.log_start_offset = max(log.log_start_offset, effect.offset)
            elif isinstance(effect, HighWatermarkChanged):
                self.checker.on_high_watermark(broker, pid)
            elif isinstance(effect, CompleteProduce):
                self._on_produce_complete(effect)
            elif isinstance(effect, ProposeIsr):
                self._send_alter_partition(broker, pid, effect)
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

    def _send_alter_partition(self, broker: SimBroker, pid: int, proposal: ProposeIsr) -> None:
        incarnation = broker.incarnation
        answered = [False]

        def answer(result: AlterPartitionResult) -> None:
            if answered[0]:
                return
            answered[0] = True

            def on_leader() -> None:
                rep = broker.replicas.get(pid)
                if rep is not None:
                    _, effects = rep.core.on_alter_partition_result(result, self.now_ms)
                    self.apply(broker, pid, effects)

            self._on_broker(broker, incarnation, on_leader)

        def lost() -> None:
            # A lost request or answer, or a controller that died before its fsync, surfaces
            # as a transport error at the request timeout; the core retries.
            answer(AlterPartitionResult(proposal.proposal_id, ErrorCode.REQUEST_TIMED_OUT))

        def send_now() -> None:
            if not broker.alive or broker.incarnation != incarnation or self.topic_id is None:
                return
            request = AlterPartitionRequest(
                broker.broker_id,
                broker.broker_epoch,
                (
                    AlterPartitionProposal(
                        topic_id=self.topic_id,
                        partition=pid,
                        leader_epoch=proposal.leader_epoch,
                        partition_epoch=proposal.partition_epoch,
                        new_isr=tuple(IsrMember(b, e) for b, e in proposal.new_isr_with_epochs),
                        leader_recovery_state=int(proposal.leader_recovery_state),
                    ),
                ),
            )

            def arrive() -> None:
                self._call_controller(
                    lambda core, now: core.alter_partition(request, now),
                    lambda reply: self.send(
                        lambda: answer(replica_result(proposal.proposal_id, reply))
                    ),
                )
                if self.faults and self.rng.random() < 0.02:
                    # A crash right after the change, before or after its fsync (scenario 9).
                    self.crash_controller()

            self.at(self.opt.request_timeout_ms, lost)
            self.send(arrive)

        self.at(max(proposal.delay_ms, 0), lambda: self._on_broker(broker, incarnation, send_now))

    # -- fetching -------------------------------------------------------------------------

    def _fetch_tick(self, broker: SimBroker) -> None:
        for pid, rep in broker.replicas.items():
            if not rep.fetching or rep.fetch_in_flight:
                continue
            position, _ = rep.core.next_fetch(self.now_ms)
            if position is None:
                continue
            self._send_fetch(broker, rep, pid, position)

    def _send_fetch(
        self, follower: SimBroker, follower_rep: SimReplica, pid: int, position: FetchPosition
    ) -> None:
        incarnation = follower.incarnation
        self._next_fetch_id += 1
        fetch_id = follower_rep.fetch_in_flight = self._next_fetch_id
        leader = self.brokers[position.leader_id]
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
                self.at(100, done)  # connection refused / timeout
                return
            rep = leader.replicas[pid]
            answer, effects = rep.core.handle_follower_fetch(request, self.now_ms)
            self.apply(leader, pid, effects)
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
                self.at(
                    self._delay(),
                    lambda: self._on_broker(follower, incarnation, lambda: respond(response)),
                )

        def respond(response: FetchResponse) -> None:
            done()
            rep = follower.replicas.get(pid)
            if rep is None:
                return
            self.apply(
                follower, pid, rep.core.on_fetch_response(position, response, self.now_ms)[1]
            )

        def reach_leader() -> None:
            if not leader.alive:
                self.at(100, done)  # connection refused
            else:
                self._on_broker(leader, None, arrive)

        # The request timeout: a fetch to a stopped leader is given up.
        self.at(2 * self.opt.request_timeout_ms, done)
        if self._dropped():
            self.at(100, done)
        else:
            self.at(self._delay(), reach_leader)

    # -- producing and consuming ----------------------------------------------------------

    def _record_ack(self, pid: int, base_offset: int, data: bytes) -> None:
        """The producer got its acknowledgement: from now on the batch must never be lost."""
        self.acked[(pid, base_offset)] = data
        self.checker.on_acked(pid, base_offset)

    def _produce(self) -> None:
        pid = self.rng.randrange(self.opt.partitions)
        leader_id = self._leader(pid)
        if leader_id == NO_LEADER:
            return
        self.produced += 1
        value = f"s{self.seed}-m{self.produced}".encode()
        raw = encode_batch([(self.now_ms, None, value, ())])
        broker = self.brokers[leader_id]
        token = (pid, self.produced)

        def arrive() -> None:
            if pid not in broker.replicas:
                return
            rep = broker.replicas[pid]
            headers = [h for _, h in iter_batches(raw)]
            plan, _ = rep.core.plan_append(-1, headers)
            if not isinstance(plan, AppendPlan):
                return
            rep.log.leader_append(raw, plan)
            self.checker.on_leader_append(broker, pid, plan)
            self.pending_values[token] = (broker.broker_id, pid, plan.base_offset)
            _, effects = rep.core.on_leader_appended(
                plan, self.now_ms, token=token, deadline_ms=self.now_ms + 2_000
            )
            self.apply(broker, pid, effects)

        self.send(lambda: self._on_broker(broker, None, arrive))

    # An idempotent producer (docs/design.md §5, §8.5): retries the same batch (same producer id,
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
        leader_id = self._leader(pid)

        def retry_later(delay_ms: int) -> None:
            self.at(delay_ms, lambda: self._retry_if_current(pid, sequence, attempt))

        retry_later(2_500)  # the request timeout: a lost request or answer is retried
        if leader_id == NO_LEADER:
            return
        broker = self.brokers[leader_id]

        def arrive() -> None:
            if pid not in broker.replicas:
                return
            rep = broker.replicas[pid]
            headers = [h for _, h in iter_batches(raw)]
            plan, _ = rep.core.plan_append(-1, headers)
            deadline_ms = self.now_ms + 2_000
            if isinstance(plan, DuplicateAppend):
                self.pending_values[token] = (broker.broker_id, pid, plan.base_offset)
                _, effects = rep.core.park_produce(
                    token, plan.base_offset, plan.last_offset, deadline_ms
                )
                self.apply(broker, pid, effects)
                return
            if isinstance(plan, ProduceRejected):
                self.checker.on_producer_error(pid, plan.error)
                self.send(lambda: self._retry_if_current(pid, sequence, attempt))
                return
            rep.log.leader_append(raw, plan)
            self.checker.on_leader_append(broker, pid, plan)
            self.pending_values[token] = (broker.broker_id, pid, plan.base_offset)
            _, effects = rep.core.on_leader_appended(
                plan, self.now_ms, token=token, deadline_ms=deadline_ms
            )
            self.apply(broker, pid, effects)

        self.send(lambda: self._on_broker(broker, None, arrive))

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
                self.send(lambda: self._record_ack(pid, base_offset, data))  # type: ignore[arg-type]
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
        self.send(lambda: self._record_ack(pid, base_offset, data))  # type: ignore[arg-type]

    # -- faults ---------------------------------------------------------------------------

    # The fault budget (docs/design.md §8.1: an acked write survives while at most
    # replication.factor - min.insync.replicas replicas are impaired at once). Data is lost
    # only when a partition's ISR ends up holding nothing but "lossy" replicas: crashed ones
    # that may have lost an acknowledged tail and have not registered again (registering takes
    # a new incarnation out of every ISR). A lossy replica can still enter an ISR: a leader's
    # pending expansion counted its fetches towards the HW and commits after it died. So:
    # - a crash needs every other replica of its partitions healthy and min.insync.replicas
    #   healthy members besides it in each ISR it is in;
    # - faults that lose nothing (pauses past the session timeout, broken heartbeat streams,
    #   asking to be fenced, controlled shutdowns, offline periods) only shrink ISRs, which is
    #   safe while no replica is lossy, so they wait until none is (KIP-966's
    #   "last replica standing" scenario is what they would cause otherwise).

    def _healthy(self, broker_id: int) -> bool:
        """Running, registered as this process, unfenced, not shutting down or paused."""
        broker = self.brokers[broker_id]
        reg = self.controller.image.brokers.get(broker_id)
        return (
            broker.alive
            and not self._paused(broker)
            and broker.registered
            and reg is not None
            and reg.broker_epoch == broker.broker_epoch
            and not reg.fenced
            and not reg.in_controlled_shutdown
        )

    def _crash_ok(self, broker_id: int) -> bool:
        """A crash may lose the unflushed tail (see the budget above)."""
        if not self._healthy(broker_id):
            return False
        impaired_max = self.opt.replication_factor - self.opt.min_insync_replicas - 1
        for pid in range(self.opt.partitions):
            record = self._partition(pid)
            if record is None or broker_id not in record.replicas:
                continue
            others = [b for b in record.replicas if b != broker_id]
            if sum(1 for b in others if not self._healthy(b)) > impaired_max:
                return False
            if broker_id in record.isr:
                healthy = sum(1 for b in record.isr if b != broker_id and self._healthy(b))
                if healthy < self.opt.min_insync_replicas:
                    return False
        return True

    def _fence_ok(self) -> bool:
        """A fault that loses nothing (see the budget above)."""
        return not any(b.lossy for b in self.brokers.values())

    def crash(self, broker: SimBroker) -> None:
        self.note(f"crash b{broker.broker_id}")
        self.stats["broker_crashes"] += 1
        broker.alive = False
        broker.lossy = True
        for pid, log in broker.logs.items():
            log.crash(self.rng)
            log.hw_checkpoint = min(log.hw_checkpoint, log.leo)
            self.checker.on_log_shortened(broker.broker_id, pid, log.leo)
        broker.replicas.clear()
        broker.registered = False
        broker.watch = None
        # The heartbeat stream breaks. Usually the kernel resets the connection and the
        # controller fences at once (docs/design.md §3.4); after a power loss or a network
        # partition nothing arrives and only the session timeout fences the broker.
        self._break_heartbeat_stream(broker, notice=self.rng.random() < 0.7)
        self.at(self.rng.randint(100, 1_500), lambda: self.restart(broker))

    def controlled_shutdown(self, broker: SimBroker) -> None:
        """SIGTERM (broker/app.py): ask the controller to move leaderships away, stop when it
        says so (or after the shutdown timeout), flushing every log; start again later."""
        if broker.shutting_down or not self._healthy(broker.broker_id):
            return
        self.note(f"b{broker.broker_id} controlled shutdown")
        self.stats["controlled_shutdowns"] += 1
        broker.shutting_down = True
        incarnation = broker.incarnation
        self._send_heartbeat(broker)
        if self.rng.random() < 0.3:
            # The controller fails over in the middle of the change (docs/design.md §8, layer 2).
            self.at(self.rng.randint(1, 60), self.crash_controller)

        def timed_out() -> None:
            if not broker.alive or broker.incarnation != incarnation:
                return
            # Liveness (docs/protocol.md §16): a controller that has run for most of the wait, with
            # this broker running too, grants the shutdown once the broker leads nothing and
            # its peers have seen that (a paused peer is fenced within a session timeout).
            steady_ms = self.now_ms - 1_500
            invariant(
                not self.controller.up
                or self.controller_up_since_ms > steady_ms
                or broker.paused_until_ms > steady_ms,
                f"b{broker.broker_id}: controlled shutdown not granted in {SHUTDOWN_TIMEOUT_MS} "
                f"ms by a controller up since {self.controller_up_since_ms}",
            )
            self._stop_broker(broker, "controlled shutdown timed out")

        self.at(SHUTDOWN_TIMEOUT_MS, timed_out)

    def _stop_broker(self, broker: SimBroker, reason: str) -> None:
        """A clean stop: every log flushed, the heartbeat stream closed in order."""
        self.note(f"b{broker.broker_id} stops: {reason}")
        for rep in broker.replicas.values():
            rep.log.flush(rep.core.high_watermark)
        broker.alive = False
        broker.replicas.clear()
        broker.registered = False
        broker.watch = None
        self._break_heartbeat_stream(broker, notice=True)
        self.at(self.rng.randint(100, 1_000), lambda: self.restart(broker))

    def restart(self, broker: SimBroker) -> None:
        if broker.alive:
            return
        self.note(f"restart b{broker.broker_id}")
        self.start_broker(broker)

    def _move_leader(self, pid: int) -> None:
        """A leader move: the leader asks to be fenced (its next heartbeat unfences it) or an
        administrator asks for the preferred leader (ElectLeaders)."""
        if not self.faults:
            return
        record = self._partition(pid)
        if record is None:
            return
        if record.leader != NO_LEADER and self.rng.random() < 0.6:
            leader = self.brokers[record.leader]
            if self._healthy(leader.broker_id) and self._fence_ok():
                self.note(f"b{leader.broker_id} asks to be fenced")
                self.stats["self_fences"] += 1
                self._send_heartbeat(leader, want_fence=True)
            return
        self.stats["preferred_elections"] += 1
        self._call_controller(
            lambda core, now: core.elect_leaders(Election.PREFERRED, [(TOPIC, pid)], now)
        )

    def _offline_episode(self) -> None:
        """Pause every ISR member of the partition with the smallest ISR past the session
        timeout: the partition goes offline and must stay so (no unclean election) until an
        ISR member returns, even though other replicas may be up."""
        records = [r for r in (self._partition(p) for p in range(self.opt.partitions)) if r]
        if not records or not self._fence_ok():
            return
        smallest = min(len(r.isr) for r in records)
        record = self.rng.choice([r for r in records if len(r.isr) == smallest])
        until = self.now_ms + self.opt.session_timeout_ms + self.rng.randint(200, 1_000)
        self.note(f"offline episode p{record.partition}: pause {list(record.isr)} to {until}")
        self.stats["offline_episodes"] += 1
        for broker_id in record.isr:
            broker = self.brokers[broker_id]
            broker.paused_until_ms = max(broker.paused_until_ms, until)

    def _maybe_fault(self) -> None:
        if not self.faults or self.topic_id is None:
            return
        rng = self.rng
        if rng.random() < self.opt.crash_rate:
            candidates = [b for b in self.brokers.values() if b.alive]
            if candidates:
                broker = rng.choice(candidates)
                if self._crash_ok(broker.broker_id):
                    self.crash(broker)
        if rng.random() < self.opt.move_leader_rate:
            pid = rng.randrange(self.opt.partitions)
            self._move_leader(pid)
            # Successive elections inside one fetch interval (KIP-279's scenario): the
            # next leader may never have seen the last one's writes.
            for _ in range(rng.randint(0, 2)):
                self.at(rng.randint(2, 20), partial(self._move_leader, pid))
        if rng.random() < self.opt.pause_rate:
            broker = rng.choice(list(self.brokers.values()))
            if self._fence_ok():
                until = self.now_ms + rng.randint(50, 800)
                broker.paused_until_ms = max(broker.paused_until_ms, until)
        if rng.random() < self.opt.shutdown_rate:
            broker = rng.choice(list(self.brokers.values()))
            if self._fence_ok():
                self.controlled_shutdown(broker)
        if rng.random() < self.opt.controller_crash_rate:
            self.crash_controller()
        if rng.random() < self.opt.offline_rate:
            self._offline_episode()

    # -- main loop ------------------------------------------------------------------------

    def _tick(self) -> None:
        self._maybe_fault()
        for broker in self.brokers.values():
            if not broker.alive or self._paused(broker):
                continue
            self._fetch_tick(broker)
            for pid, rep in list(broker.replicas.items()):
                if self.now_ms % 150 == 0:
                    self.apply(broker, pid, rep.core.maybe_shrink_isr(self.now_ms)[1])
                if pid in broker.replicas:
                    self.apply(broker, pid, rep.core.expire_produces(self.now_ms)[1])
                if self.rng.random() < 0.02:
                    rep.log.flush(rep.core.high_watermark)
        if self.faults and self.rng.random() < self.opt.tick_ms / self.opt.produce_interval_ms:
            self._produce()
        if self.faults and self.rng.random() < 0.3:
            pid = self.rng.randrange(self.opt.partitions)
            if self.producers[pid].in_flight is None:
                self._produce_idempotent(pid)
        if self.now_ms % 20 == 0:
            self.checker.consume()
        self.at(self.opt.tick_ms, self._tick)

    def _run_until(self, end_ms: int, stop: Callable[[], bool] | None = None) -> None:
        while self._queue and self._queue[0][0] <= end_ms:
            self.now_ms, _, action = heapq.heappop(self._queue)
            action()
            self.checker.check(full=self.now_ms % 25 == 0)
            if stop is not None and self.now_ms % 100 == 0 and stop():
                return

    def run(self) -> None:
        for broker in self.brokers.values():
            self.start_broker(broker)
        self.at(0, self._controller_tick)
        self.at(0, self._create_topic)
        self.at(0, self._tick)
        # Every seed sees at least one controller restart and one offline period; the rates
        # add more.
        safety = self.opt.safety_ms
        if self.opt.scheduled_faults:
            self.at(self.rng.randint(safety // 5, safety * 4 // 5), self.crash_controller)
            self.at(
                self.rng.randint(safety // 5, safety * 3 // 5),
                lambda: self._offline_episode() if self.faults else None,
            )
        self._run_until(safety)
        # Liveness: heal everything, restart the dead, stop producing; the cluster must settle.
        self.faults = False
        self.restart_controller()
        for broker in self.brokers.values():
            broker.paused_until_ms = min(broker.paused_until_ms, self.now_ms)  # wake now
            if not broker.alive:
                self.restart(broker)
        self._run_until(self.now_ms + self.opt.liveness_ms, stop=self.checker.converged)
        self.checker.check_final()


# ------------------------------------------------------------------------------------------
# Invariant checkers (docs/design.md §8)


class Checker:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        # (pid, base offset) -> batch bytes, once any replica's HW passed it (I2, I5).
        self.committed: dict[tuple[int, int], bytes] = {}
        self.writers: dict[tuple[int, int], int] = {}  # (pid, leader epoch) -> broker (I10)
        self.replica_epochs: dict[tuple[int, int], int] = {}  # (broker, pid) -> LE seen
        self.consumer_position: dict[int, int] = {}
        self.verified: dict[tuple[int, int], int] = {}  # (broker, pid) -> offset checked up to
        # I1, incrementally: acked offsets not yet seen on a broker's log, per (broker, pid).
        # An offset leaves the set once the broker holds the acked bytes and comes back when
        # the broker's log is cut below it (truncation, crash).
        self.unverified: dict[tuple[int, int], set[int]] = {}
        self.acked_offsets: dict[int, list[int]] = {}
        self.last_record: dict[tuple[str, int], PartitionRecord] = {}  # last durable ones

    def on_acked(self, pid: int, offset: int) -> None:
        self.acked_offsets.setdefault(pid, []).append(offset)
        for broker_id in self.sim.brokers:
            self.unverified.setdefault((broker_id, pid), set()).add(offset)

    def on_log_shortened(self, broker_id: int, pid: int, leo: int) -> None:
        pending = self.unverified.setdefault((broker_id, pid), set())
        pending.update(o for o in self.acked_offsets.get(pid, ()) if o >= leo)

    def on_truncated(self, broker: SimBroker, pid: int) -> None:
        key = (broker.broker_id, pid)
        leo = broker.replicas[pid].log.leo
        self.verified[key] = min(self.verified.get(key, 0), leo)
        self.on_log_shortened(broker.broker_id, pid, leo)

    def on_controller_entries(self, entries: list[LogEntry]) -> None:
        """Every record the controller made durable (docs/design.md §8.8, docs/protocol.md §17)."""
        sim = self.sim
        for entry in entries:
            record = entry.record
            if not isinstance(record, PartitionRecord):
                continue
            pid = record.partition
            old = self.last_record.get((record.topic_id, pid))
            self.last_record[(record.topic_id, pid)] = record
            if old is None:
                continue
            where = f"p{pid} record at {entry.offset} ({record.reason}): "
            invariant(
                record.partition_epoch == old.partition_epoch + 1,
                f"{where}partition epoch {old.partition_epoch} -> {record.partition_epoch}",
            )
            invariant(
                record.leader_epoch >= old.leader_epoch,
                f"{where}leader epoch went back {old.leader_epoch} -> {record.leader_epoch}",
            )
            if record.leader == old.leader:
                continue
            invariant(record.leader_epoch > old.leader_epoch, f"{where}leader moved, same epoch")
            if record.leader == NO_LEADER:
                sim.stats["offline_records"] += 1
                if any(self._live_out_of_sync(b, record) for b in record.replicas):
                    sim.stats["offline_with_live_out_of_sync_replica"] += 1
                continue
            # Unclean election is disabled: the new leader comes from the previous ISR ...
            invariant(
                record.leader in old.isr,
                f"{where}broker {record.leader} elected from outside the ISR {list(old.isr)}",
            )
            # ... and, if it is the process the controller thinks it is, holds every
            # acknowledged batch (I1 at election time).
            leader = sim.brokers[record.leader]
            reg = sim.controller.durable_image.brokers.get(record.leader)
            if leader.alive and reg is not None and reg.broker_epoch == leader.broker_epoch:
                log = leader.logs.get(pid)
                for (apid, offset), data in sim.acked.items():
                    if apid == pid:
                        invariant(
                            log is not None and log.batch_at(offset) == data,
                            f"{where}new leader {record.leader} lacks acked batch at {offset}",
                        )

    def on_controller_event(self, event: Event) -> None:
        """A session timeout fences only a broker that stopped heartbeating: dead, paused,
        re-registering, or an older incarnation. A controller restart must not mass-fence
        live brokers (docs/protocol.md §16, KAFKA-18138)."""
        if event.name != "broker_fenced" or not event.fields["reason"].startswith("session"):
            return
        sim = self.sim
        broker = sim.brokers[event.fields["broker_id"]]
        quiet_since_ms = sim.now_ms - sim.opt.session_timeout_ms - 2 * sim.opt.heartbeat_interval_ms
        invariant(
            not broker.alive
            or not broker.registered
            or broker.broker_epoch != event.fields["broker_epoch"]
            or broker.paused_until_ms >= quiet_since_ms,
            f"b{broker.broker_id} fenced by the session timeout while heartbeating: {event}",
        )

    def _live_out_of_sync(self, broker_id: int, record: PartitionRecord) -> bool:
        broker = self.sim.brokers[broker_id]
        reg = self.sim.controller.durable_image.brokers.get(broker_id)
        return (
            broker_id not in record.isr
            and broker.alive
            and not self.sim._paused(broker)
            and reg is not None
            and not reg.fenced
        )

    def on_producer_error(self, pid: int, error: ErrorCode) -> None:
        """The idempotent producer must never be told its retry is out of order or fenced:
        that would mean the dedupe state lost a committed batch (docs/design.md §8.5)."""
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
            leader_id = sim._leader(pid)
            if leader_id == NO_LEADER:
                continue
            broker = sim.brokers[leader_id]
            rep = broker.replicas.get(pid)
            if not broker.alive or rep is None or sim._paused(broker):
                continue
            position = self.consumer_position.get(pid, 0)
            answer, _ = rep.core.check_consumer_fetch(-1, position)
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
        """After every event: each replica's local invariants (I6, I8, I11), its log agrees
        with its core, and leader epochs only grow (I7). Messages are built only on failure:
        this runs thousands of times per seed."""
        sim = self.sim
        epochs = self.replica_epochs
        for broker in sim.brokers.values():
            if not broker.alive:
                continue
            for pid, rep in broker.replicas.items():
                core, log = rep.core, rep.log
                core.check_invariants()
                key = (broker.broker_id, pid)
                if core.leo != log.leo:
                    invariant(False, f"b{key[0]} p{pid}: core LEO {core.leo} != log {log.leo}")
                entries = log.epoch_cache.entries
                for (e1, s1), (e2, s2) in itertools.pairwise(entries):
                    if e2 <= e1 or s2 <= s1:
                        check_epoch_entries(entries, f"b{key[0]} p{pid}: ")  # raises, says why
                seen = epochs.get(key, -1)
                if core.leader_epoch < seen:
                    invariant(
                        False,
                        f"b{key[0]} p{pid}: leader epoch went back {seen} -> {core.leader_epoch}",
                    )
                epochs[key] = core.leader_epoch
        if full:
            self._check_acked_on_isr()

    def _check_acked_on_isr(self) -> None:
        """I1 (continuous form): every acked batch is held by every live, unfenced member of
        the controller's ISR, and by at least one live member. A member counts only while the
        controller's registration is this process's (a restarted broker that has not
        registered yet may have lost its tail; registering takes it out of every ISR)."""
        sim = self.sim
        registrations = sim.controller.image.brokers
        for pid in range(sim.opt.partitions):
            record = sim._partition(pid)
            if record is None:
                continue
            members: list[set[int]] = []
            for broker_id in record.isr:
                broker = sim.brokers[broker_id]
                reg = registrations.get(broker_id)
                if not broker.alive or reg is None or reg.broker_epoch != broker.broker_epoch:
                    continue
                pending = self.unverified.setdefault((broker_id, pid), set())
                log = broker.logs.get(pid)
                for offset in list(pending):
                    if log is not None and log.batch_at(offset) == sim.acked[(pid, offset)]:
                        pending.discard(offset)
                    else:
                        invariant(
                            reg.fenced,
                            f"p{pid}: acked batch at {offset} missing on ISR member {broker_id}",
                        )
                members.append(pending)
            if members:
                lost = set.intersection(*members)
                invariant(not lost, f"p{pid}: acked batches {sorted(lost)} on no live ISR member")

    def converged(self) -> bool:
        sim = self.sim
        ctl = sim.controller
        if not ctl.up or sim.topic_id is None or ctl.has_pending:
            return False
        registrations = ctl.image.brokers
        for broker in sim.brokers.values():
            reg = registrations.get(broker.broker_id)
            if not broker.alive or not broker.registered or reg is None or reg.fenced:
                return False
            if reg.broker_epoch != broker.broker_epoch:
                return False
            if broker.image.next_offset != ctl.durable_offset:
                return False
        for pid in range(sim.opt.partitions):
            record = sim._partition(pid)
            if record is None or record.leader == NO_LEADER:
                return False
            if set(record.isr) != set(record.replicas):
                return False
            # I16: with every replica back in the ISR the rebalance restores preferred leaders.
            if record.leader != record.preferred_leader:
                return False
            leader = sim.brokers[record.leader].replicas.get(pid)
            if leader is None or leader.core.role is not Role.LEADER:
                return False
            for broker_id in record.replicas:
                rep = sim.brokers[broker_id].replicas.get(pid)
                if rep is None or rep.core.leader_epoch != record.leader_epoch:
                    return False
                if rep.core.high_watermark != leader.core.leo or rep.log.leo != leader.core.leo:
                    return False
        return True

    def check_final(self) -> None:
        sim = self.sim
        invariant(self.converged(), "the cluster did not converge after the faults healed")
        # Every broker follows the metadata log to the same image the controller holds.
        for broker in sim.brokers.values():
            invariant(
                broker.image == sim.controller.durable_image,
                f"b{broker.broker_id}'s metadata image differs from the controller's",
            )
        unclean = [e for e in sim.controller.events if e.name == "unclean_leader_elected"]
        invariant(
            not unclean, f"unclean election with unclean.leader.election.enable=false: {unclean}"
        )
        for pid in range(sim.opt.partitions):
            record = sim._partition(pid)
            assert record is not None
            leader_log = sim.brokers[record.leader].replicas[pid].log
            for broker_id in record.replicas:
                log = sim.brokers[broker_id].replicas[pid].log
                invariant(
                    log.batches == leader_log.batches,
                    f"p{pid}: broker {broker_id}'s log differs from the leader's",
                )
                check_batches_contiguous(log.triples(), log.log_start_offset, f"p{pid}: ")
                check_epoch_cache_matches_batches(
                    log.epoch_cache.entries, log.triples(), f"b{broker_id} p{pid}: "
                )
            # docs/design.md §8.5: every idempotent batch is stored once, acked or not.
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
