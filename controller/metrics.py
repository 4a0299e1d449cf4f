"""Controller metrics with Kafka's names and meanings (docs/design.md §7.3).

Does no I/O itself (the app serves the registry with `client.common.metrics.serve`). Gauges are
refreshed from the image by the command loop after each change, on the event-loop thread, so the
scrape thread never walks the mutable image. Counters count the core's events: every election
that gives a partition a leader (LeaderElectionRate, as a Prometheus counter: take `rate()`), and
the unclean ones among them (UncleanLeaderElectionsPerSec).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from minibroker.controller.core.messages import Event
from minibroker.controller.quorum.messages import Event as QuorumEvent
from minibroker.controller.quorum.messages import QuorumState, Role, RoleChanged
from minibroker.metadata.image import MetadataImage

KAFKA_CONTROLLER = "kafka_controller_KafkaController_"
CONTROLLER_STATS = "kafka_controller_ControllerStats_"
RAFT_METRICS = "kafka_server_raft_metrics_"


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        # Kafka's JMX names in Prometheus form, as the brokers export them:
        # kafka.controller:type=KafkaController,name=X -> kafka_controller_KafkaController_X.
        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(KAFKA_CONTROLLER + name, doc, registry=registry)

        self.active_controller_count = gauge(
            "ActiveControllerCount", "1 on the active controller (the sum over a cluster is 1)"
        )
        self.active_broker_count = gauge("ActiveBrokerCount", "registered, unfenced brokers")
        self.fenced_broker_count = gauge("FencedBrokerCount", "registered, fenced brokers")
        self.global_topic_count = gauge("GlobalTopicCount", "topics")
        self.global_partition_count = gauge("GlobalPartitionCount", "partitions")
        self.offline_partitions_count = gauge(
            "OfflinePartitionsCount", "partitions without a leader"
        )
        self.preferred_replica_imbalance_count = gauge(
            "PreferredReplicaImbalanceCount", "partitions led by a replica other than replicas[0]"
        )
        self.last_committed_record_offset = gauge(
            "LastCommittedRecordOffset", "offset of the last fsynced metadata record"
        )
        self.leader_elections = Counter(
            CONTROLLER_STATS + "LeaderElectionRate",
            "elections that gave a partition a leader",
            registry=registry,
        )
        self.unclean_leader_elections = Counter(
            CONTROLLER_STATS + "UncleanLeaderElectionsPerSec",
            "elections of a replica from outside the ISR (may lose data)",
            registry=registry,
        )
        self.fenced_brokers = Counter(
            "minibroker_controller_BrokerFencings",
            "brokers fenced, by reason",
            ["reason"],
            registry=registry,
        )
        self.active_controller_count.set(0)

        # The metadata quorum, with Kafka's raft-metrics names
        # (kafka.server:type=raft-metrics,name=X -> kafka_server_raft_metrics_X).
        def raft(name: str, doc: str) -> Gauge:
            return Gauge(RAFT_METRICS + name, doc, registry=registry)

        self.current_leader = raft("current_leader", "id of the quorum leader, -1 when unknown")
        self.current_epoch = raft("current_epoch", "the quorum epoch this voter is in")
        self.current_vote = raft("current_vote", "the voter this one voted for in its epoch, -1")
        self.current_state = Gauge(
            RAFT_METRICS + "current_state",
            "1 for this voter's role (leader, follower, candidate, ...)",
            ["state"],
            registry=registry,
        )
        self.high_watermark = raft("high_watermark", "the committed offset of the metadata log")
        self.log_end_offset = raft("log_end_offset", "this voter's metadata log end offset")
        self.commit_latency_avg = raft(
            "commit_latency_avg", "ms from a leader's append to its commit (last 100)"
        )
        self.commit_latency_max = raft(
            "commit_latency_max", "ms from a leader's append to its commit (max of last 100)"
        )
        self.elections = Counter(
            RAFT_METRICS + "elections",
            "elections this voter won (it became leader)",
            registry=registry,
        )
        self.resignations = Counter(
            RAFT_METRICS + "resignations",
            "leaderships this voter gave up, by reason",
            ["reason"],
            registry=registry,
        )
        self._latencies: collections.deque[float] = collections.deque(maxlen=100)
        self.current_leader.set(-1)
        self.current_vote.set(-1)

    def quorum_role(self, change: RoleChanged) -> None:
        self.current_leader.set(change.leader_id)
        self.current_epoch.set(change.epoch)
        for role in Role:
            self.current_state.labels(state=role.value).set(1 if role == change.role else 0)
        if change.role == Role.LEADER:
            self.elections.inc()

    def quorum_offsets(self, high_watermark: int, log_end_offset: int) -> None:
        self.high_watermark.set(high_watermark)
        self.log_end_offset.set(log_end_offset)

    def quorum_state(self, state: QuorumState) -> None:
        """The persisted quorum state: epoch and vote (Kafka's current-vote is -1 without)."""
        self.current_epoch.set(state.epoch)
        self.current_vote.set(state.voted_for)

    def quorum_event(self, event: QuorumEvent) -> None:
        if event.name == "quorum_resigned":
            self.resignations.labels(reason=str(event.fields.get("reason", ""))).inc()

    def commit_latency(self, ms: float) -> None:
        self._latencies.append(ms)
        self.commit_latency_avg.set(sum(self._latencies) / len(self._latencies))
        self.commit_latency_max.set(max(self._latencies))

    def refresh(self, image: MetadataImage, committed_offset: int) -> None:
        fenced = sum(1 for b in image.brokers.values() if b.fenced)
        self.active_broker_count.set(len(image.brokers) - fenced)
        self.fenced_broker_count.set(fenced)
        self.global_topic_count.set(len(image.topics_by_id))
        self.global_partition_count.set(image.partition_count())
        self.offline_partitions_count.set(image.offline_partition_count())
        self.preferred_replica_imbalance_count.set(image.preferred_imbalance_count())
        self.last_committed_record_offset.set(committed_offset - 1)

    def count(self, events: Iterable[Event]) -> None:
        for event in events:
            if event.name == "leader_elected":
                self.leader_elections.inc()
            elif event.name == "unclean_leader_elected":
                self.leader_elections.inc()
                self.unclean_leader_elections.inc()
            elif event.name == "broker_fenced":
                reason = str(event.fields.get("reason", ""))
                kind = "session_timeout" if reason.startswith("session timed out") else reason
                self.fenced_brokers.labels(reason=kind.replace(" ", "_")).inc()


__all__ = ["ControllerMetrics"]
