"""The simulation's nemesis: the faults it injects into brokers, and the budget they keep to.

Broker crashes that lose the unflushed tail, SIGSTOP-like pauses (nothing runs on a paused
broker; its heartbeats stop, so a long pause is a session timeout and a zombie leader),
brokers asking to be fenced and preferred elections (bursts of leader moves, KIP-279's
scenario), controlled shutdowns (SIGTERM) and restarts, controller crashes (the controller
process is replsim.py's), and offline periods (every ISR member of a partition paused past the
session timeout, so the partition must stay offline: unclean election is disabled and an
out-of-sync replica must never lead), and network partitions (links cut for a while: a zombie
leader, a follower cut from its leader, a broker cut from the controller, one broker split from
the rest; the Network, scheduler.py, holds what a cut link carries). Drops and delays are the
Network's.

The fault budget (docs/design.md §8.1: an acked write survives while at most
replication.factor - min.insync.replicas replicas are impaired at once). Data is lost only when
a partition's ISR ends up holding nothing but "lossy" replicas: crashed ones that may have lost
an acknowledged tail and have not registered again (registering takes a new incarnation out of
every ISR). A lossy replica can still enter an ISR: a leader's pending expansion counted its
fetches towards the HW and commits after it died. So:
- a crash needs every other replica of its partitions healthy and min.insync.replicas healthy
  members besides it in each ISR it is in;
- faults that lose nothing (pauses past the session timeout, broken heartbeat streams, asking
  to be fenced, controlled shutdowns, offline periods) only shrink ISRs, which is safe while no
  replica is lossy, so they wait until none is (KIP-966's "last replica standing" scenario is
  what they would cause otherwise).

Moving replicas (KIP-455, docs/protocol.md §25): the nemesis starts reassignments through the
real ControllerCore (a random target of the same replication factor: a reorder, overlapping the
current replicas, or disjoint from them), cancels running ones, and decommissions brokers (then
cancels the decommission). During a move a partition has more replicas than its replication
factor (target + removing) and its ISR may hold removing replicas, which leave it when the move
completes (ISR ∩ target) or adding ones, which leave it when it is cancelled (ISR ∩ original).
So the budget is written against the partition's replication factor, len(target_replicas), not
len(replicas): with every broker of `replicas` counted as an "other", at most
RF - min.insync.replicas of them are lossy at once, so the target keeps at least
min.insync.replicas replicas that are not, and completion (which needs the whole target in the
ISR) always leaves an ISR holding every acknowledged batch. A broker added to a partition after
it crashed hosts nothing yet and cannot join the ISR before it registers (which ends its
lossiness). A cancel drops the adding replicas from the ISR, which may be the only healthy
ones: it shrinks ISRs like the faults above and waits until no replica is lossy. A start
changes no ISR (one that completes at once keeps the target, all in the ISR) and a
decommission moves leaderships only to in-sync replicas, so they need no wait.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from scheduler import CONTROLLER

from minibroker.client.common.invariant import invariant
from minibroker.client.errors import ErrorCode
from minibroker.client.types import NO_LEADER
from minibroker.controller.core.election import Election
from minibroker.controller.core.messages import (
    DecommissionReply,
    ReassignmentResult,
    ReassignmentTarget,
)
from minibroker.metadata.records import PartitionRecord

if TYPE_CHECKING:
    from node import SimBroker
    from replsim import Simulation

SHUTDOWN_TIMEOUT_MS = 2_000  # a broker stops after this long without the controller's grant


class Nemesis:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    # -- the budget --------------------------------------------------------------------------

    def healthy(self, broker_id: int) -> bool:
        """Running, registered as this process, unfenced, not shutting down or paused, not cut
        from the controller."""
        sim = self.sim
        broker = sim.brokers[broker_id]
        reg = sim.controller.image.brokers.get(broker_id)
        return (
            broker.alive
            and not broker.paused()
            and not sim.net.is_cut(broker_id, CONTROLLER)
            and broker.registered
            and reg is not None
            and reg.broker_epoch == broker.broker_epoch
            and not reg.fenced
            and not reg.in_controlled_shutdown
        )

    def crash_ok(self, broker_id: int) -> bool:
        """A crash may lose the unflushed tail (see the budget above)."""
        if not self.healthy(broker_id):
            return False
        opt = self.sim.opt
        for pid in range(opt.partitions):
            record = self.sim.partition(pid)
            if record is None or broker_id not in record.replicas:
                continue
            # The replication factor, not the replicas of a move (target + removing).
            impaired_max = len(record.target_replicas) - opt.min_insync_replicas - 1
            others = [b for b in record.replicas if b != broker_id]
            if sum(1 for b in others if not self.healthy_in(b, record)) > impaired_max:
                return False
            if broker_id in record.isr:
                healthy = sum(
                    1 for b in record.isr if b != broker_id and self.healthy_in(b, record)
                )
                if healthy < opt.min_insync_replicas:
                    return False
        return True

    def healthy_in(self, broker_id: int, record: PartitionRecord) -> bool:
        """Healthy, and (a follower) not cut from the partition's leader."""
        leader = record.leader
        return self.healthy(broker_id) and (
            leader in (NO_LEADER, broker_id) or not self.sim.net.is_cut(broker_id, leader)
        )

    def fence_ok(self) -> bool:
        """A fault that loses nothing (see the budget above)."""
        return not any(b.lossy for b in self.sim.brokers.values())

    # -- broker processes --------------------------------------------------------------------

    def crash(self, broker: SimBroker) -> None:
        sim = self.sim
        sim.note(f"crash b{broker.broker_id}")
        sim.stats["broker_crashes"] += 1
        broker.stop_process()
        broker.lossy = True
        broker.crashed_at_ms = sim.now_ms
        for pid, log in broker.logs.items():
            log.crash(sim.rng)
            sim.checker.on_log_shortened(broker.broker_id, pid, log.leo)
        # The heartbeat stream breaks. Usually the kernel resets the connection and the
        # controller fences at once (docs/design.md §3.4); after a power loss or a network
        # partition nothing arrives and only the session timeout fences the broker.
        broker.break_heartbeat_stream(notice=sim.rng.random() < 0.7)
        sim.at(sim.rng.randint(100, 1_500), lambda: self.restart(broker))

    def controlled_shutdown(self, broker: SimBroker) -> None:
        """SIGTERM (broker/app.py): ask the controller to move leaderships away, stop when it
        says so (or after the shutdown timeout), flushing every log; start again later."""
        sim = self.sim
        if broker.shutting_down or not self.healthy(broker.broker_id):
            return
        sim.note(f"b{broker.broker_id} controlled shutdown")
        sim.stats["controlled_shutdowns"] += 1
        broker.shutting_down = True
        incarnation = broker.incarnation
        broker.send_heartbeat()
        if sim.rng.random() < 0.3:
            # The controller fails over in the middle of the change (docs/design.md §8, layer 2).
            sim.at(sim.rng.randint(1, 60), sim.crash_controller)

        def timed_out() -> None:
            if not broker.alive or broker.incarnation != incarnation:
                return
            # Liveness (docs/protocol.md §16): a controller that has run for most of the wait,
            # with this broker running too, grants the shutdown once the broker leads nothing
            # and its peers have seen that (a paused peer is fenced within a session timeout).
            steady_ms = sim.now_ms - 1_500
            invariant(
                not sim.controller.up
                or sim.controller_up_since_ms > steady_ms
                or broker.paused_until_ms > steady_ms
                or sim.net.any_cut_since(steady_ms),
                f"b{broker.broker_id}: controlled shutdown not granted in {SHUTDOWN_TIMEOUT_MS} "
                f"ms by a controller up since {sim.controller_up_since_ms}",
            )
            self.stop_broker(broker, "controlled shutdown timed out")

        sim.at(SHUTDOWN_TIMEOUT_MS, timed_out)

    def stop_broker(self, broker: SimBroker, reason: str) -> None:
        """A clean stop: every log flushed, the heartbeat stream closed in order."""
        sim = self.sim
        sim.note(f"b{broker.broker_id} stops: {reason}")
        if broker.engine is not None:
            # Parked produces are answered (NOT_LEADER_OR_FOLLOWER), then every log flushed.
            broker.handle(broker.engine.shutdown(reason))
            for tp, high_watermark in broker.engine.high_watermarks().items():
                broker.logs[tp.partition].flush(high_watermark)
        broker.stop_process()
        broker.break_heartbeat_stream(notice=True)
        sim.at(sim.rng.randint(100, 1_000), lambda: self.restart(broker))

    def restart(self, broker: SimBroker) -> None:
        if broker.alive:
            return
        self.sim.note(f"restart b{broker.broker_id}")
        broker.start()

    # -- leadership and availability ---------------------------------------------------------

    def move_leader(self, pid: int) -> None:
        """A leader move: the leader asks to be fenced (its next heartbeat unfences it) or an
        administrator asks for the preferred leader (ElectLeaders)."""
        sim = self.sim
        if not sim.net.faults:
            return
        record = sim.partition(pid)
        if record is None:
            return
        if record.leader != NO_LEADER and sim.rng.random() < 0.6:
            leader = sim.brokers[record.leader]
            if self.healthy(leader.broker_id) and self.fence_ok():
                sim.note(f"b{leader.broker_id} asks to be fenced")
                sim.stats["self_fences"] += 1
                leader.send_heartbeat(want_fence=True)
            return
        sim.stats["preferred_elections"] += 1
        sim.call_controller(
            lambda core, now: core.elect_leaders(Election.PREFERRED, [(sim.topic, pid)], now)
        )

    def offline_episode(self) -> None:
        """Pause every ISR member of the partition with the smallest ISR past the session
        timeout: the partition goes offline and must stay so (no unclean election) until an
        ISR member returns, even though other replicas may be up."""
        sim = self.sim
        records = [r for r in (sim.partition(p) for p in range(sim.opt.partitions)) if r]
        if not records or not self.fence_ok():
            return
        smallest = min(len(r.isr) for r in records)
        record = sim.rng.choice([r for r in records if len(r.isr) == smallest])
        until = sim.now_ms + sim.opt.session_timeout_ms + sim.rng.randint(200, 1_000)
        sim.note(f"offline episode p{record.partition}: pause {list(record.isr)} to {until}")
        sim.stats["offline_episodes"] += 1
        for broker_id in record.isr:
            broker = sim.brokers[broker_id]
            broker.paused_until_ms = max(broker.paused_until_ms, until)

    # -- network partitions ------------------------------------------------------------------

    def partition_episode(self) -> None:
        """Cut links for a while (scheduler.py's Network holds what they carry), one of:
        - zombie: a leader cut from the controller and every other broker; its clients still
          reach it (they keep its address as the leader: stale metadata), so it takes writes it
          must never acknowledge, and is fenced and replaced meanwhile;
        - follower: a follower cut from its leader (the leader shrinks the ISR; it rejoins);
        - controller: a broker cut from the controller only (fenced, its leaderships move,
          while it still serves fetches and its clients);
        - split: one broker cut from every other broker, the controller on its side or theirs.
        A cut, like a pause, fences without losing data, so it keeps to the same budget
        (`fence_ok`); a broker cut from the controller or its leader is impaired for a crash."""
        sim = self.sim
        if sim.net.cuts or not self.fence_ok():
            return  # one episode at a time
        rng = sim.rng
        brokers = sorted(sim.brokers)
        kind = rng.choice(("zombie", "follower", "controller", "split"))
        links: list[tuple[int, int]] = []
        if kind in ("zombie", "follower"):
            led = [
                r
                for r in (sim.partition(p) for p in range(sim.opt.partitions))
                if r is not None and r.leader != NO_LEADER
            ]
            if not led:
                return
            record = rng.choice(led)
            leader = record.leader
            if kind == "zombie":
                links = [(leader, CONTROLLER)] + [(leader, b) for b in brokers if b != leader]
                what = f"b{leader} (leader of p{record.partition}) from every node"
            else:
                follower = rng.choice([b for b in record.replicas if b != leader])
                links = [(follower, leader)]
                what = f"follower b{follower} of p{record.partition} from its leader b{leader}"
        elif kind == "controller":
            broker_id = rng.choice(brokers)
            links = [(broker_id, CONTROLLER)]
            what = f"b{broker_id} from the controller"
        else:
            broker_id = rng.choice(brokers)
            rest = [b for b in brokers if b != broker_id]
            links = [(broker_id, b) for b in rest]
            if rng.random() < 0.5:
                links += [(b, CONTROLLER) for b in rest]
                what = f"b{broker_id} + controller | {rest}"
            else:
                links.append((broker_id, CONTROLLER))
                what = f"b{broker_id} | {rest} + controller"
        duration_ms = rng.randint(200, sim.opt.partition_ms_max)
        sim.note(f"partition ({kind}) for {duration_ms} ms: cut {what}")
        sim.stats[f"partition_{kind}"] += 1
        for a, b in links:
            sim.net.cut(a, b)
        # A leader cut from the controller keeps its clients, whose metadata still names it.
        stale = sim.workload.stale_leader
        for pid in range(sim.opt.partitions):
            leader = sim.leader(pid)
            if leader != NO_LEADER and sim.net.is_cut(leader, CONTROLLER):
                stale[pid] = leader
        sim.at(duration_ms, partial(self.heal_partition, links))

    def heal_partition(self, links: list[tuple[int, int]]) -> None:
        sim = self.sim
        if not all(sim.net.is_cut(a, b) for a, b in links):
            return  # healed already (the liveness phase heals everything)
        sim.note("partition healed")
        for a, b in links:
            sim.net.heal(a, b)
        sim.workload.stale_leader.clear()

    # -- moving replicas (KIP-455) -------------------------------------------------------------

    def reassign(self) -> None:
        """Start a reassignment of a random partition (a reorder of its replicas, a target
        overlapping them, or one disjoint from them, same replication factor; an arbitrary one
        now and then, perhaps refused), or cancel a running one, through the real core."""
        sim = self.sim
        rng = sim.rng
        pid = rng.randrange(sim.opt.partitions)
        record = sim.partition(pid)
        if record is None or not sim.controller.up:
            return
        if record.is_reassigning and rng.random() < 0.4:
            if self.fence_ok():  # a cancel shrinks the ISR to ISR ∩ original (budget above)
                self._alter_reassignment(pid, None)
            return
        current = list(record.target_replicas)
        rf = len(current)
        others = [b for b in sorted(sim.brokers) if b not in current]
        rng.shuffle(others)
        kind = rng.choice(("reorder", "overlap", "overlap", "disjoint", "any"))
        if kind == "disjoint" and len(others) >= rf:
            target = others[:rf]
        elif kind in ("overlap", "disjoint") and others:
            keep = rng.sample(current, rng.randint(max(1, rf - len(others)), rf - 1))
            target = keep + others[: rf - len(keep)]
            rng.shuffle(target)
        elif kind == "any":
            target = rng.sample(sorted(sim.brokers), rf)
        else:
            target = rng.sample(current, rf)
        self._alter_reassignment(pid, tuple(target))

    def _alter_reassignment(self, pid: int, target: tuple[int, ...] | None) -> None:
        sim = self.sim
        before = sim.partition(pid)
        request = ReassignmentTarget(sim.topic, pid, target)

        def answer(results: tuple[ReassignmentResult, ...]) -> None:
            error = results[0].error
            what = "cancel" if target is None else f"to {list(target)}"
            sim.note(f"reassign p{pid} {what}: {error.name}")
            sim.stats[f"reassign_{'cancel' if target is None else 'start'}_{error.name}"] += 1

        if not sim.call_controller(
            lambda core, now: core.alter_partition_reassignments([request], now), answer
        ):
            return
        # The core ran it at once: a start that changed the partition aims at `target`.
        after = sim.partition(pid)
        if target is not None and after is not None and after != before:
            invariant(
                after.target_replicas == target,
                f"p{pid}: reassignment to {list(target)} wrote {list(after.target_replicas)}",
            )

    def decommission(self) -> None:
        """Decommission a random broker when the others can still hold the replication factor;
        cancel the decommission later (moves already started go on)."""
        sim = self.sim
        image = sim.controller.image
        if not sim.controller.up:
            return
        leaving = image.decommissioning
        candidates = [b for b in sorted(sim.brokers) if b not in leaving]
        if len(candidates) - 1 < sim.opt.replication_factor:
            return
        broker_id = sim.rng.choice(candidates)

        def answer(reply: DecommissionReply) -> None:
            sim.note(f"decommission b{broker_id}: {reply.error.name}, {reply.partitions_moving}")
            sim.stats[f"decommission_{reply.error.name}"] += 1

        sim.call_controller(
            lambda core, now: core.decommission_broker(broker_id, False, now), answer
        )
        sim.at(sim.rng.randint(300, 3_000), partial(self.cancel_decommission, broker_id))

    def cancel_decommission(self, broker_id: int) -> None:
        """Take the mark off `broker_id` (again later if the controller is down or the answer
        is lost: the mark is read back from the controller's image)."""
        sim = self.sim
        if broker_id not in sim.controller.image.decommissioning and sim.controller.up:
            return
        sim.at(sim.rng.randint(200, 600), partial(self.cancel_decommission, broker_id))

        def answer(reply: DecommissionReply) -> None:
            invariant(reply.error == ErrorCode.NONE, f"cancel decommission b{broker_id}: {reply}")
            sim.note(f"decommission of b{broker_id} cancelled")

        sim.call_controller(
            lambda core, now: core.decommission_broker(broker_id, True, now), answer
        )

    def heal(self) -> None:
        """The liveness phase: every decommission is cancelled (running moves go on and must
        complete) and every cut link heals."""
        for broker_id in sorted(self.sim.controller.image.decommissioning):
            self.cancel_decommission(broker_id)
        self.sim.net.heal_all()
        self.sim.workload.stale_leader.clear()

    def maybe_fault(self) -> None:
        """One scheduler tick's draw of faults, at the options' rates."""
        sim = self.sim
        if not sim.net.faults or sim.topic_id is None:
            return
        rng, opt = sim.rng, sim.opt
        if rng.random() < opt.crash_rate:
            candidates = [b for b in sim.brokers.values() if b.alive]
            if candidates:
                broker = rng.choice(candidates)
                if self.crash_ok(broker.broker_id):
                    self.crash(broker)
        if rng.random() < opt.move_leader_rate:
            pid = rng.randrange(opt.partitions)
            self.move_leader(pid)
            # Successive elections inside one fetch interval (KIP-279's scenario): the
            # next leader may never have seen the last one's writes.
            for _ in range(rng.randint(0, 2)):
                sim.at(rng.randint(2, 20), partial(self.move_leader, pid))
        if rng.random() < opt.pause_rate:
            broker = rng.choice(list(sim.brokers.values()))
            if self.fence_ok():
                until = sim.now_ms + rng.randint(50, 800)
                broker.paused_until_ms = max(broker.paused_until_ms, until)
        if rng.random() < opt.shutdown_rate:
            broker = rng.choice(list(sim.brokers.values()))
            if self.fence_ok():
                self.controlled_shutdown(broker)
        if rng.random() < opt.controller_crash_rate:
            sim.crash_controller()
        if rng.random() < opt.offline_rate:
            self.offline_episode()
        # Drawn only when on, so the seeds without moves keep the draws they always had.
        if opt.reassign_rate and rng.random() < opt.reassign_rate:
            self.reassign()
        if opt.decommission_rate and rng.random() < opt.decommission_rate:
            self.decommission()
        if opt.partition_rate and rng.random() < opt.partition_rate:
            self.partition_episode()
