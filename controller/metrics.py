"""Controller metrics with Kafka's names and meanings (docs/design.md §7.3).

Does no I/O itself (the app serves the registry with `client.common.metrics.serve`). Gauges are
refreshed from the image by the command loop after each change, on the event-loop thread, so the
scrape thread never walks the mutable image. Counters count the core's events: every election
that gives a partition a leader (LeaderElectionRate, as a Prometheus counter: take `rate()`), and
the unclean ones among them (UncleanLeaderElectionsPerSec).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from minibroker.controller.core.messages import Event
from minibroker.metadata.image import MetadataImage

KAFKA_CONTROLLER = "kafka_controller_KafkaController_"
CONTROLLER_STATS = "kafka_controller_ControllerStats_"


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
        self.active_controller_count.set(1)

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
