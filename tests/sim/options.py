"""The simulation's options: cluster shape, configs, fault rates and timers of one run.

`SimOptions()` is the fixed mix the hand-written scenarios start from. `SimOptions.from_seed`
draws a run's options from its seed, the way TigerBeetle's simulator does: the cluster's shape
and topic configs (min.insync.replicas, replica.lag.time.max.ms, partitions, brokers), how lossy
and slow the network is, and each fault's rate. Each fault kind is switched off for some seeds
("swarm testing": a run without crashes reaches states a run full of them never does) and drawn
around its default rate otherwise, so the seeds together cover about the default mix and much
more of its neighbourhood. Moving replicas (reassignments, decommissions, the controller's
replica.rebuild.delay.ms) are drawn after everything else, so a seed keeps the options it had
before they existed, and bring up to three extra brokers so targets can overlap or be disjoint;
network partitions are drawn after them, for the same reason.
The control-plane timers stay fixed: the checker's liveness bounds
(a session timeout fences only a silent broker; a controlled shutdown is granted in time) are
written against them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields, replace


@dataclass
class SimOptions:
    brokers: int = 3
    partitions: int = 3
    replication_factor: int = 3
    min_insync_replicas: int = 2
    replica_lag_time_max_ms: int = 300
    replica_fetch_backoff_ms: int = 50
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
    retention_rate: float = 0.0  # per tick and broker: delete some of the oldest batches
    # Moving replicas (KIP-455): reassignment starts/cancels and broker decommissions per tick
    # (off in the fixed mix), and the controller's replica.rebuild.delay.ms (-1: off).
    reassign_rate: float = 0.0
    decommission_rate: float = 0.0
    replica_rebuild_delay_ms: int = -1
    # Network partitions (per tick, off in the fixed mix): one episode at a time, drawn among
    # the nemesis's scenarios (a zombie leader, a follower cut from its leader, a broker cut
    # from the controller only, one broker split from the rest with the controller on either
    # side), healed after partition_ms_max at most.
    partition_rate: float = 0.0
    partition_ms_max: int = 2_500
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

    @classmethod
    def from_seed(cls, seed: int) -> SimOptions:
        """The options of seed `seed`'s run (its own generator: the run's draws stay apart)."""
        rng = random.Random(f"minibroker-sim-options-{seed}")
        base = cls()

        def rate(default: float) -> float:
            # Off for one seed in five; otherwise between half and twice the default.
            return 0.0 if rng.random() < 0.2 else default * rng.uniform(0.5, 2.0)

        options = replace(
            base,
            brokers=rng.choice((3, 3, 4)),
            partitions=rng.randint(2, 4),
            # replication.factor - min.insync.replicas is the crash budget (nemesis.py).
            min_insync_replicas=rng.choice((1, 2, 2)),
            replica_lag_time_max_ms=rng.randint(200, 600),
            replica_fetch_backoff_ms=rng.randint(20, 100),
            drop_rate=rng.choice((0.0, rng.uniform(0.01, 0.1), rng.uniform(0.01, 0.1))),
            delay_ms_max=rng.randint(5, 60),
            crash_rate=rate(base.crash_rate),
            move_leader_rate=rate(base.move_leader_rate),
            pause_rate=rate(base.pause_rate),
            controller_crash_rate=rate(base.controller_crash_rate),
            offline_rate=rate(base.offline_rate),
            shutdown_rate=rate(base.shutdown_rate),
            stream_break_rate=rate(base.stream_break_rate),
            retention_rate=rate(0.002),
            produce_interval_ms=rng.randint(5, 10),
        )
        # Drawn after the rest, so each seed keeps the options it had before moves existed.
        options.reassign_rate = rate(0.004)
        options.decommission_rate = rate(0.0008)
        if options.reassign_rate or options.decommission_rate:
            # Room to move: a disjoint target of RF 3 needs 6 brokers, a decommission 4.
            options.brokers += rng.choice((0, 1, 2, 3))
        if rng.random() < 0.25:
            options.replica_rebuild_delay_ms = rng.randint(600, 2_000)
        # Drawn after the moves, so each seed keeps the options it had before partitions existed.
        options.partition_rate = rate(0.003)
        options.partition_ms_max = rng.randint(800, 3_000)
        return options

    def describe(self) -> str:
        """The fields that differ from `SimOptions()`, for a failure message."""
        base = SimOptions()
        changed = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value != getattr(base, f.name):
                shown = f"{value:.4g}" if isinstance(value, float) else str(value)
                changed.append(f"{f.name}={shown}")
        return ", ".join(changed) or "the defaults"
