"""Background work: produce expiry, ISR shrink checks, checkpoints, retention, flushes, gauges.

I/O shell (event-loop thread): the timers, and the file work the LogManager does. What expires
and which followers drop out of the ISR are the engine's decisions (`expire_produces`,
`maybe_shrink_isr`). One failing partition or step spares the others (logged); a disk failure
takes the dir offline and ends this work for good.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.common.log import get_logger
from minibroker.client.types import TopicPartition

if TYPE_CHECKING:
    from minibroker.broker.replicas.manager import ReplicaManager

log = get_logger(__name__)


class Background:
    def __init__(self, rm: ReplicaManager) -> None:
        self._rm = rm
        # (recorded bytes, throttled count) of the leader and follower quotas at the last
        # metrics refresh: the counters grow by the difference.
        self._quota_totals = [(0, 0), (0, 0)]
        self._session_evictions = 0  # the fetch session cache's count at the last refresh

    async def run(self, stop: asyncio.Event) -> None:
        """ISR shrink checks, produce expiry, checkpoints, retention, metrics gauges."""
        config = self._rm.config
        lag_ms = config["replica.lag.time.max.ms"]
        shrink_every = max(lag_ms / 2, 10) / 1000.0
        hw_every = config["replica.high.watermark.checkpoint.interval.ms"] / 1000.0
        rp_every = config["log.flush.offset.checkpoint.interval.ms"] / 1000.0
        retention_every = config["log.retention.check.interval.ms"] / 1000.0
        last = {"shrink": 0.0, "hw": 0.0, "rp": 0.0, "retention": 0.0}
        tick_s = min(shrink_every, 0.25)
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), tick_s)
            except TimeoutError:
                pass
            if self._rm.log_dir_failure is not None:
                return  # no more checkpoints, flushes or retention on a failed dir
            try:
                self.tick(last, shrink_every, hw_every, rp_every, retention_every)
            except Exception as err:
                # One failing partition or checkpoint must not stop ISR checks, produce expiry
                # and checkpoints for every other partition: log it and carry on next tick.
                if not self._rm.maybe_take_log_dir_offline(err, "background work"):
                    log.exception("background_tick_failed")

    def tick(
        self,
        last: dict[str, float],
        shrink_every: float,
        hw_every: float,
        rp_every: float,
        retention_every: float,
    ) -> None:
        rm = self._rm
        engine = rm.engine
        manager = rm.log_manager
        mono = time.monotonic()
        now = wall_clock_ms()
        self._each_partition(
            "expire_produces",
            lambda tp: rm.run(engine.expire_produces(tp, now)),
            engine.produces_waiting(),
        )
        if mono - last["shrink"] >= shrink_every:
            last["shrink"] = mono
            self._each_partition(
                "maybe_shrink_isr", lambda tp: rm.run(engine.maybe_shrink_isr(tp, now))
            )
        if mono - last["hw"] >= hw_every:
            last["hw"] = mono
            # On the loop thread: the checkpoint writes every core's HW (a few ms of fsync).
            self.guarded("checkpoint_high_watermarks", self.checkpoint_high_watermarks)
        if mono - last["rp"] >= rp_every:
            last["rp"] = mono
            self.guarded("retry_log_deletes", manager.retry_deletes)
            self.guarded("maybe_flush", lambda: manager.maybe_flush(now))
            self.guarded("checkpoint_recovery_points", manager.checkpoint_recovery_points)
            self.guarded("checkpoint_log_start_offsets", manager.checkpoint_log_start_offsets)
        if mono - last["retention"] >= retention_every:
            last["retention"] = mono
            self._each_partition("retention", lambda tp: self._run_retention(tp, now))
        self._update_gauges()

    def checkpoint_high_watermarks(self) -> None:
        self._rm.log_manager.checkpoint_high_watermarks(self._rm.engine.high_watermarks())

    def guarded(self, step: str, fn: Callable[[], Any]) -> None:
        """Run one background step; a failure is logged and the other steps still run."""
        if self._rm.log_dir_failure is not None:
            return
        try:
            fn()
        except Exception as err:
            if not self._rm.maybe_take_log_dir_offline(err, step):
                log.exception("background_step_failed", step=step)

    def _each_partition(
        self,
        step: str,
        fn: Callable[[TopicPartition], Any],
        partitions: Iterable[TopicPartition] | None = None,
    ) -> None:
        """Run one background step per partition (every hosted one unless `partitions` are
        given); one partition's failure spares the others."""
        for tp in self._rm.engine if partitions is None else partitions:
            if self._rm.log_dir_failure is not None:
                return
            try:
                fn(tp)
            except Exception as err:
                if not self._rm.maybe_take_log_dir_offline(err, f"{step} of {tp}"):
                    log.exception(
                        "background_step_failed", step=step, topic=tp.topic, partition=tp.partition
                    )

    def _run_retention(self, tp: TopicPartition, now: int) -> None:
        partition_log = self._rm.engine.log(tp)
        if partition_log is None:
            return
        deleted = partition_log.delete_retention(now, self._rm.engine.high_watermark(tp))
        if deleted:
            self._rm.run(self._rm.engine.on_log_start_offset_advanced(tp))
            self._rm.fetching.changed(tp)  # fetch sessions answer the new log start
            log.info(
                "segments_deleted",
                topic=tp.topic,
                partition=tp.partition,
                count=len(deleted),
                log_start_offset=partition_log.log_start_offset,
            )

    def update_replica_gauges(self) -> None:
        """The gauges that look at every hosted replica: computed when metrics are read
        (BrokerMetrics.refresh_on_scrape), not on a timer, so idle replicas cost nothing."""
        rm = self._rm
        gauges = rm.engine.gauges()
        m = rm.metrics
        m.under_replicated.set(gauges.under_replicated)
        m.under_min_isr.set(gauges.under_min_isr)
        m.at_min_isr.set(gauges.at_min_isr)
        m.leader_count.set(gauges.leaders)
        m.partition_count.set(gauges.partitions)
        m.max_lag.set(gauges.max_lag)
        m.produce_purgatory.set(gauges.pending_produces)

    def _update_gauges(self) -> None:
        rm = self._rm
        m = rm.metrics
        m.fetch_purgatory.set(len(rm.fetch_signals) + len(rm.hw_signals) + rm.fetching.parked)
        sessions = rm.fetching.sessions
        m.fetch_sessions.set(len(sessions))
        m.fetch_session_partitions.set(sessions.partitions_cached)
        m.fetch_session_evictions.inc(sessions.evictions - self._session_evictions)
        self._session_evictions = sessions.evictions
        self._update_quota_metrics()

    def _update_quota_metrics(self) -> None:
        """KIP-73 quotas: measured rates, limits, and the totals since the last refresh."""
        engine, m, now = self._rm.engine, self._rm.metrics, wall_clock_ms()
        sides = (
            (
                engine.leader_quota,
                m.leader_replication_byte_rate,
                m.leader_replication_rate_limit,
                m.leader_throttled_bytes,
                m.leader_throttled,
            ),
            (
                engine.follower_quota,
                m.follower_replication_byte_rate,
                m.follower_replication_rate_limit,
                m.follower_throttled_bytes,
                m.follower_throttled,
            ),
        )
        for i, (quota, rate, limit, recorded, throttled) in enumerate(sides):
            rate.set(quota.rate(now))
            limit.set(-1 if quota.unlimited else quota.limit)
            seen_bytes, seen_count = self._quota_totals[i]
            recorded.inc(quota.recorded_bytes - seen_bytes)
            throttled.inc(quota.throttled_count - seen_count)
            self._quota_totals[i] = (quota.recorded_bytes, quota.throttled_count)
