"""What every controller command shares: the state (`MetadataImage`, broker liveness), the entries
and events a command collects for its `Outcome`, and the one way a partition's state changes.

Pure, like the rest of `controller/core`. `ControllerCore` (`controller.py`) is this state with
the broker commands of `cluster_control.py` and the topic and partition commands of
`replication_control.py`; a command returns `_done(reply)`, which hands its entries (already
applied to the image) and events to the caller, who makes them durable before replying.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from minibroker.client.topic_config import resolve_topic_config
from minibroker.client.types import NO_LEADER
from minibroker.controller.core.election import Election, PartitionChange, check_partition_change
from minibroker.controller.core.isr import isr_delta
from minibroker.controller.core.liveness import Liveness
from minibroker.controller.core.messages import Event, Outcome
from minibroker.controller.core.partition_limits import (
    DEFAULT_MAX_BROKER_PARTITIONS,
    DEFAULT_MAX_PARTITIONS,
    PartitionLimits,
)
from minibroker.controller.core.reassignment import complete_reassignment
from minibroker.metadata.image import MetadataImage, TopicImage
from minibroker.metadata.placement import BrokerSlot
from minibroker.metadata.records import LogEntry, MetadataRecord

R = TypeVar("R")


class RandomSource(Protocol):
    """What the core needs of `random.Random` (topic ids)."""

    def getrandbits(self, k: int, /) -> int: ...


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """The controller's rule parameters (controller/config.py maps Kafka's keys onto these)."""

    node_id: int = 1000
    session_timeout_ms: int = 3000
    num_partitions: int = 1
    default_replication_factor: int = 1
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_check_interval_ms: int = 30_000
    leader_imbalance_per_broker_percentage: int = 10
    producer_id_block_size: int = 1000
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    max_broker_partitions: int = DEFAULT_MAX_BROKER_PARTITIONS
    # Broker-level defaults for topic configs (typed), under the topic config names.
    topic_defaults: Mapping[str, Any] = field(default_factory=dict)
    # Failure decommissioning: a broker fenced for this long has its replicas rebuilt on live
    # brokers (controller config `replica.rebuild.delay.ms`); -1 (the default) never.
    replica_rebuild_delay_ms: int = -1


class ControlBase:
    """The controller's state and the plumbing its commands share (see the module docstring)."""

    def __init__(
        self,
        settings: ControllerSettings,
        cluster_id: str,
        rng: RandomSource,
        now_ms: int,
        image: MetadataImage | None = None,
    ) -> None:
        self.settings = settings
        self.cluster_id = cluster_id
        self.image = image if image is not None else MetadataImage()
        self.liveness = Liveness(settings.session_timeout_ms)
        self._rng = rng
        # A restarted controller gives every known broker a fresh session (KAFKA-18138), so a
        # broker that died while the controller was down is still fenced by the timeout.
        for reg in self.image.brokers.values():
            self.liveness.start_session(reg.broker_id, reg.broker_epoch, now_ms)
        self.next_rebalance_ms = now_ms + settings.leader_imbalance_check_interval_ms
        self.partition_limits = PartitionLimits(
            settings.max_partitions, settings.max_broker_partitions
        )
        self._entries: list[LogEntry] = []
        self._events: list[Event] = []
        # Failure decommissioning: when each fenced (or unregistered but still named) broker was
        # first seen fenced by this controller. In memory only: a failover restarts the clock.
        self.fenced_since: dict[int, int] = {
            b.broker_id: now_ms for b in self.image.brokers.values() if b.fenced
        }

    # -- plumbing -----------------------------------------------------------------------------

    def _append(self, record: MetadataRecord, now_ms: int) -> LogEntry:
        entry = LogEntry(self.image.next_offset, now_ms, record)
        self.image.apply(entry)
        self._entries.append(entry)
        return entry

    def _event(self, name: str, **fields: Any) -> None:
        self._events.append(Event(name, fields))

    def _done(self, reply: R) -> Outcome[R]:
        outcome = Outcome(reply, tuple(self._entries), tuple(self._events))
        self._entries = []
        self._events = []
        return outcome

    def take_pending(self) -> Outcome[None]:
        """The entries and events of a command that raised midway. They are already applied to
        the image, so the caller must still make them durable to keep log and image equal."""
        return self._done(None)

    def _acceptable(self, exclude: int | None = None) -> Callable[[int], bool]:
        def acceptable(broker_id: int) -> bool:
            return broker_id != exclude and self.image.is_active(broker_id)

        return acceptable

    def _unclean_enabled(self, topic: TopicImage) -> bool:
        effective = resolve_topic_config(topic.configs, self.settings.topic_defaults)
        return bool(effective["unclean.leader.election.enable"])

    def _online_election(self, topic: TopicImage) -> Election:
        return Election.UNCLEAN if self._unclean_enabled(topic) else Election.ONLINE

    def _placeable_brokers(self) -> list[BrokerSlot]:
        """Brokers that may take new replicas: active and not decommissioning."""
        return [
            BrokerSlot(b.broker_id, b.rack)
            for b in self.image.brokers.values()
            if b.is_active and b.broker_id not in self.image.decommissioning
        ]

    def _min_isr(self, topic: TopicImage) -> int:
        effective = resolve_topic_config(topic.configs, self.settings.topic_defaults)
        return int(effective["min.insync.replicas"])

    def _maybe_complete_reassignment(self, topic: TopicImage, index: int, now_ms: int) -> None:
        """Complete the partition's reassignment if every target replica is in the ISR now
        (called whenever the ISR of a reassigning partition may have grown)."""
        current = topic.partitions[index]
        completed = complete_reassignment(current, self._acceptable())
        if completed is None:
            return
        moved = completed.leader != current.leader
        self._apply_change(topic, PartitionChange(completed, moved, False), now_ms)
        self._event(
            "reassignment_completed",
            topic=topic.name,
            partition=index,
            replicas=list(completed.replicas),
            removed=list(current.removing_replicas),
            added=list(current.adding_replicas),
            leader=completed.leader,
            leader_moved=moved,
            partition_epoch=completed.partition_epoch,
        )

    def _apply_change(self, topic: TopicImage, change: PartitionChange, now_ms: int) -> None:
        old = topic.partitions[change.record.partition]
        new = change.record
        check_partition_change(old, new)
        self._append(new, now_ms)
        common = {
            "topic": topic.name,
            "partition": new.partition,
            "leader_epoch": new.leader_epoch,
            "partition_epoch": new.partition_epoch,
            "reason": new.reason,
        }
        if change.leader_changed:
            if new.leader == NO_LEADER:
                self._event("partition_offline", old_leader=old.leader, isr=list(new.isr), **common)
            else:
                self._event(
                    "unclean_leader_elected" if change.unclean else "leader_elected",
                    old_leader=old.leader,
                    new_leader=new.leader,
                    isr=list(new.isr),
                    **common,
                )
        added, removed = isr_delta(old.isr, new.isr)
        if removed:
            self._event(
                "isr_shrink",
                old_isr=list(old.isr),
                new_isr=list(new.isr),
                leader=new.leader,
                **common,
            )
        if added:
            self._event(
                "isr_expand",
                old_isr=list(old.isr),
                new_isr=list(new.isr),
                leader=new.leader,
                **common,
            )
