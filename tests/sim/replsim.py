"""A deterministic, seeded simulation of the brokers' replica engine and the controller core
(docs/design.md §2, §3, §6, §8; the second test layer of §8): the wiring.

In one process: every broker's partitions hosted in the product's replica engine
(`BrokerReplicas`: the cores, the one effect interpreter, the produce / fetch / metadata
decisions) over in-memory logs (memlog.py: real v2 batch bytes, the real EpochCache, an
"unflushed tail lost on crash" model), and the real `ControllerCore` behind a simulated journal
(sim_controller.py: group commit, crash that loses unflushed entries, restart by snapshot +
replay). The rooms:

- scheduler.py: virtual time (an event queue) and the network (delay, drop, reorder);
- options.py: a run's options, drawn from its seed;
- node.py: a simulated broker (registration, heartbeats, the metadata watch, its engine) and
  replica_shell.py, the I/O around its engine (fetch sessions, AlterPartition, produce answers);
- workload.py: producers (plain and idempotent, acks=all) and consumers;
- nemesis.py: the faults and the budget they keep to, and replicas moving (reassignments,
  cancels, decommissions through the real core);
- checker.py: the invariants of docs/design.md §8, after every event and at the end;
- this module: the controller process (requests, group commit, publishing to watchers, crash
  and restart, the topic) and the run: a safety phase with faults, then a liveness phase with
  every fault healed that must converge (full ISRs, preferred leaders back, identical logs
  holding every acknowledged batch, every broker's metadata image equal to the controller's).

Everything random comes from the seed: the run's options (options.py, unless given) and one
`random.Random(seed)` for the run; virtual time is an integer `now_ms`.
Used by tests/sim/test_replication_sim.py; tests/unit/test_replication_scenarios.py uses MemLog.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Any

from checker import Checker
from nemesis import Nemesis
from node import CLUSTER_ID, SimBroker
from options import SimOptions
from scheduler import CONTROLLER, Network, Scheduler
from sim_controller import SimControllerNode
from workload import Workload

from minibroker.client.errors import ErrorCode
from minibroker.client.types import NO_LEADER
from minibroker.controller.core.controller import ControllerCore, ControllerSettings
from minibroker.controller.core.messages import CreatableTopic, CreateTopicResult, Outcome
from minibroker.metadata.records import LogEntry, PartitionRecord

__all__ = ["SimOptions", "Simulation"]

TOPIC = "sim"


class Simulation:
    """The whole cluster in one process. `run()` does the safety then the liveness phase."""

    def __init__(self, seed: int, options: SimOptions | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.opt = opt = options or SimOptions.from_seed(seed)
        self.scheduler = Scheduler()
        self.net = Network(self.scheduler, self.rng, opt.drop_rate, opt.delay_ms_max)
        settings = ControllerSettings(
            session_timeout_ms=opt.session_timeout_ms,
            auto_leader_rebalance_enable=True,
            leader_imbalance_check_interval_ms=opt.rebalance_interval_ms,
            leader_imbalance_per_broker_percentage=10,
            replica_rebuild_delay_ms=opt.replica_rebuild_delay_ms,
        )
        self.controller = SimControllerNode(
            settings, CLUSTER_ID, random.Random(self.rng.getrandbits(64)), 0
        )
        self.controller_up_since_ms = 0
        self._flush_scheduled = False
        self._after_flush: list[tuple[int, Callable[[], None]]] = []
        self.stream_ids = itertools.count(1)
        self.watch_ids = itertools.count(1)
        self.fetch_ids = itertools.count(1)
        self.topic = TOPIC
        self.topic_id: str | None = None
        self.brokers = {b: SimBroker(b, self) for b in range(1, opt.brokers + 1)}
        self.checker = Checker(self)
        self.workload = Workload(self)
        self.nemesis = Nemesis(self)
        self.trace: list[str] = []
        self.stats: Counter[str] = Counter()

    # -- time, trace, the clients' view ------------------------------------------------------

    @property
    def now_ms(self) -> int:
        return self.scheduler.now_ms

    def at(self, delay_ms: int, action: Callable[[], None]) -> None:
        self.scheduler.at(delay_ms, action)

    def note(self, text: str) -> None:
        self.trace.append(f"{self.now_ms:>6} {text}")
        if len(self.trace) > 400:
            del self.trace[:100]

    @property
    def acked(self) -> dict[tuple[int, int], bytes]:
        """(pid, offset) -> the stamped bytes of every batch a producer saw acknowledged."""
        return self.workload.acked

    def partition(self, pid: int) -> PartitionRecord | None:
        """The controller's current record for partition `pid` (clients' omniscient view)."""
        if self.topic_id is None:
            return None
        return self.controller.image.partition(self.topic_id, pid)

    def leader(self, pid: int) -> int:
        record = self.partition(pid)
        return record.leader if record is not None else NO_LEADER

    # -- the controller process --------------------------------------------------------------

    def call_controller(
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

    def _publish(self, entries: list[LogEntry]) -> None:
        """Send durable entries down every open watch stream: delayed, maybe reordered."""
        if not entries:
            return
        batch = tuple(entries)
        faults = self.net.faults
        for broker in self.brokers.values():
            token = broker.watch
            if token is None:
                continue
            if faults and self.rng.random() < self.opt.drop_rate / 5:
                broker.break_watch()  # the stream broke; the reconnect resends from there
                continue
            delay = self.net.delay() * (3 if faults and self.rng.random() < 0.2 else 1)
            self.net.transmit(
                partial(broker.on_watch_batch, token, False, batch, batch[0].offset),
                (CONTROLLER, broker.broker_id),
                delay_ms=delay,
            )

    def _controller_tick(self) -> None:
        self.at(self.opt.controller_tick_ms, self._controller_tick)
        self.call_controller(lambda core, now: core.tick(now))

    def crash_controller(self) -> None:
        ctl = self.controller
        if not ctl.up or not self.net.faults:
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
                broker.break_watch()
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

        self.call_controller(lambda core, now: core.create_topics([topic], False, now), answer)

    # -- the run -----------------------------------------------------------------------------

    def _tick(self) -> None:
        self.nemesis.maybe_fault()
        now = self.now_ms
        for broker in self.brokers.values():
            if not broker.alive or broker.paused():
                continue
            broker.fetch_tick()
            engine = broker.engine
            assert engine is not None
            for tp in engine:  # a snapshot: a replica may go while others tick
                if now % 150 == 0:
                    broker.handle(engine.maybe_shrink_isr(tp, now))
                broker.handle(engine.expire_produces(tp, now))
                if self.rng.random() < 0.02 and tp in engine:
                    broker.logs[tp.partition].flush(engine.high_watermark(tp))
            if self.opt.retention_rate and self.rng.random() < self.opt.retention_rate:
                self._retention(broker)
        self.workload.tick()
        self.at(self.opt.tick_ms, self._tick)

    def _retention(self, broker: SimBroker) -> None:
        """A retention pass on one of `broker`'s replicas (the broker's background job): the
        oldest batches below its HW go, and the engine learns the new log start."""
        engine = broker.engine
        hosted = list(engine) if engine is not None else []
        if not hosted:
            return
        tp = self.rng.choice(hosted)
        log = broker.logs[tp.partition]
        assert engine is not None
        # Each idempotent producer's newest batch stays: were its state to go with the log (the
        # core forgets a producer whose batches are all below the log start), a retry of that
        # batch after a lost answer would be stored again, as in Kafka.
        keep = [h.base_offset for h in log.headers if h.producer_id in self.workload.producer_ids]
        limit = min(engine.high_watermark(tp), max(keep, default=log.leo))
        if log.delete_retention(limit, self.rng.randint(1, 200)):
            self.stats["retention_passes"] += 1
            broker.handle(engine.on_log_start_offset_advanced(tp))

    def _after_event(self, now_ms: int) -> None:
        self.checker.check(full=now_ms % 25 == 0)

    def run(self) -> None:
        for broker in self.brokers.values():
            broker.start()
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
                lambda: self.nemesis.offline_episode() if self.net.faults else None,
            )
        self.scheduler.run_until(safety, self._after_event)
        # Liveness: heal everything, restart the dead, stop producing; the cluster must settle.
        self.net.faults = False
        self.restart_controller()
        self.nemesis.heal()  # every decommission cancelled; running moves must complete
        for broker in self.brokers.values():
            broker.paused_until_ms = min(broker.paused_until_ms, self.now_ms)  # wake now
            if not broker.alive:
                self.nemesis.restart(broker)
        converged = self.checker.converged
        self.scheduler.run_until(
            self.now_ms + self.opt.liveness_ms,
            self._after_event,
            stop=lambda now_ms: now_ms % 100 == 0 and converged(),
        )
        self.checker.check_final()
