"""The replica engine's read-only views of the partitions it hosts.

Pure: reads only. `ReplicaViews` is a mixin of `BrokerReplicas` (engine.py), which alone owns
and writes the hosted-partition map; these answer from it: membership and lookups (a replica's
log, topic id, role, HW), the HW checkpoint's mapping, the leaders this broker's followers fetch
from, DescribeReplicas (`describe`) and the broker's gauges (under-replicated, under and at
min.insync.replicas, leaders, follower lag, parked produces).

Concurrency contract: single-threaded, with the engine's thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, TypeVar

from minibroker.broker.replication.events import FetchPosition, Role
from minibroker.broker.replication.hosted import HostedReplica
from minibroker.broker.replication.outputs import FollowerProgress, Gauges, ReplicaDescription
from minibroker.broker.replication.partition import PartitionReplica
from minibroker.broker.replication.storage import Storage
from minibroker.client.common.invariant import invariant
from minibroker.client.types import TopicPartition

S = TypeVar("S", bound=Storage)


class ReplicaViews(Generic[S]):
    """What `BrokerReplicas` hosts, read only (a mixin: the map is the engine's)."""

    # Set and written by BrokerReplicas only.
    _hosted: dict[TopicPartition, HostedReplica[S]]
    offline: str | None

    def __contains__(self, tp: object) -> bool:
        return tp in self._hosted

    def __len__(self) -> int:
        return len(self._hosted)

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(list(self._hosted))

    def get(self, tp: TopicPartition) -> HostedReplica[S] | None:
        return self._hosted.get(tp)

    def hosted(self) -> Mapping[TopicPartition, HostedReplica[S]]:
        """Read-only view of the hosted replicas (for tests and the simulation's checks)."""
        return self._hosted

    def log(self, tp: TopicPartition) -> S | None:
        hosted = self._hosted.get(tp)
        return None if hosted is None else hosted.log

    def topic_id(self, tp: TopicPartition) -> str | None:
        hosted = self._hosted.get(tp)
        return None if hosted is None else hosted.topic_id

    def role(self, tp: TopicPartition) -> Role:
        hosted = self._hosted.get(tp)
        return Role.NONE if hosted is None else hosted.core.role

    def high_watermark(self, tp: TopicPartition) -> int:
        hosted = self._hosted.get(tp)
        invariant(hosted is not None, f"{tp} is not hosted")
        return hosted.core.high_watermark  # type: ignore[union-attr]

    def implied_fetch(self, tp: TopicPartition, replica_id: int, at_ms: int) -> None:
        """A follower's fetch session carried `tp` unchanged in a request at `at_ms`
        (`PartitionReplica.note_implied_fetch`)."""
        hosted = self._hosted.get(tp)
        if hosted is not None:
            _, effects = hosted.core.note_implied_fetch(replica_id, at_ms)
            invariant(not effects, f"an implied fetch of {tp} has effects: {effects}")

    def follower_out_of_sync(self, tp: TopicPartition, replica_id: int) -> bool:
        """`replica_id` follows `tp`, led here, from outside its ISR: its next fetch may
        expand the ISR (once it is caught up, eligible, and no ISR change is in flight)."""
        hosted = self._hosted.get(tp)
        if hosted is None:
            return False
        core = hosted.core
        return core.is_leader and replica_id not in core.isr

    def high_watermarks(self) -> dict[TopicPartition, int]:
        """Every hosted replica's HW (what the HW checkpoint writes)."""
        return {tp: h.core.high_watermark for tp, h in self._hosted.items()}

    def led_partitions(self) -> int:
        return sum(1 for h in self._hosted.values() if h.core.is_leader)

    def followed_leaders(
        self, among: Iterable[TopicPartition] | None = None
    ) -> Iterator[tuple[TopicPartition, int]]:
        """(tp, leader id) for every replica (of `among`, when given) that follows a leader and
        may fetch: none once the log dir is offline (it stopped every fetcher, and nothing may
        write there again)."""
        if self.offline is not None:
            return
        hosted_by_tp = self._hosted
        for tp in hosted_by_tp if among is None else among:
            hosted = hosted_by_tp.get(tp)
            leader_id = None if hosted is None else _fetching_leader(hosted.core)
            if leader_id is not None:
                yield tp, leader_id

    def describe(self, topics: Iterable[str] = ()) -> list[ReplicaDescription]:
        wanted = set(topics)
        out = []
        for tp, hosted in sorted(self._hosted.items()):
            if wanted and tp.topic not in wanted:
                continue
            core = hosted.core
            out.append(
                ReplicaDescription(
                    tp=tp,
                    is_leader=core.is_leader,
                    leader_id=core.leader_id,
                    leader_epoch=core.leader_epoch,
                    partition_epoch=core.partition_epoch,
                    log_start_offset=core.log_start_offset,
                    log_end_offset=core.leo,
                    high_watermark=core.high_watermark,
                    isr=tuple(sorted(core.isr)),
                    maximal_isr=tuple(sorted(core.maximal_isr)),
                    followers=_follower_progress(core) if core.is_leader else (),
                )
            )
        return out

    def gauges(self) -> Gauges:
        under_replicated = under_min = at_min = leaders = 0
        max_lag = pending = 0
        for hosted in self._hosted.values():
            core = hosted.core
            pending += core.pending_produce_count
            if core.is_leader:
                leaders += 1
                isr = len(core.isr)
                # Kafka: against the target while a reassignment runs (replicas - removing), so
                # a move does not count as under-replicated while the new copies catch up.
                under_replicated += isr < (hosted.replication_factor or len(core.replicas))
                under_min += isr < core.effective_min_isr
                at_min += isr == core.effective_min_isr
            else:
                lag = _follower_lag(core)
                if lag is not None:
                    max_lag = max(max_lag, lag)
        return Gauges(
            under_replicated, under_min, at_min, leaders, len(self._hosted), max_lag, pending
        )

    def pending_fetch(self, tp: TopicPartition) -> FetchPosition | None:
        """The follower fetch of `tp` in flight (the one `next_fetch` planned last)."""
        hosted = self._hosted.get(tp)
        return None if hosted is None else hosted.pending_fetch


def _fetching_leader(core: PartitionReplica) -> int | None:
    follower = core.follower_state
    if core.role is not Role.FOLLOWER or follower is None or follower.failed:
        return None
    return follower.leader_id


def _follower_lag(core: PartitionReplica) -> int | None:
    follower = core.follower_state
    if core.role is not Role.FOLLOWER or follower is None:
        return None
    return follower.leader_high_watermark - core.leo


def _follower_progress(core: PartitionReplica) -> tuple[FollowerProgress, ...]:
    return tuple(
        FollowerProgress(r.replica_id, r.leo, r.last_caught_up_time_ms)
        for r in core.remote_replicas
    )
