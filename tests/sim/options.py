"""The simulation's options: cluster shape, configs, fault rates and timers of one run."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SimOptions:
    brokers: int = 3
    partitions: int = 3
    replication_factor: int = 3
    min_insync_replicas: int = 2
    replica_lag_time_max_ms: int = 300
    replica_fetch_backoff_ms: int = 50
    alter_partition_retry_ms: int = 20
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
