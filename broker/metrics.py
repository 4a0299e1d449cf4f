"""Broker metrics with Kafka's JMX names (docs/design.md §7.3), in Prometheus form.

I/O shell only in that `serve` opens the /metrics port (through client.common.metrics). Kafka's
JMX name `kafka.server:type=ReplicaManager,name=UnderReplicatedPartitions` becomes
`kafka_server_ReplicaManager_UnderReplicatedPartitions`; meters ("PerSec") become counters, whose
rate Prometheus computes. Gauges are refreshed by the replica manager once a second.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from minibroker.client.common.metrics import new_registry


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = new_registry()
        rm = "kafka_server_ReplicaManager_"
        topics = "kafka_server_BrokerTopicMetrics_"

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, registry=self.registry)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, registry=self.registry)

        self.under_replicated = gauge(
            rm + "UnderReplicatedPartitions", "partitions led here with |ISR| < replication factor"
        )
        self.under_min_isr = gauge(
            rm + "UnderMinIsrPartitionCount", "partitions led here with |ISR| < min.insync.replicas"
        )
        self.at_min_isr = gauge(
            rm + "AtMinIsrPartitionCount", "partitions led here with |ISR| == min.insync.replicas"
        )
        self.partition_count = gauge(rm + "PartitionCount", "replicas hosted here")
        # The ACLs in this broker's metadata image (what its StandardAuthorizer reads); a
        # function gauge, read at each scrape (broker/app.py binds it).
        self.acls_total = gauge(
            "kafka_server_authorizer_AclsTotalCount", "ACLs in this broker's metadata image"
        )
        self.leader_count = gauge(rm + "LeaderCount", "partitions led here")
        self.isr_shrinks = counter(rm + "IsrShrinksPerSec", "committed ISR shrinks")
        self.isr_expands = counter(rm + "IsrExpandsPerSec", "committed ISR expansions")
        self.failed_isr_updates = counter(rm + "FailedIsrUpdatesPerSec", "AlterPartition failures")
        self.max_lag = gauge(
            "kafka_server_ReplicaFetcherManager_MaxLag",
            "max over followed partitions of leader HW - own LEO",
        )
        self.messages_in = counter(topics + "MessagesInPerSec", "records appended as leader")
        self.bytes_in = counter(topics + "BytesInPerSec", "bytes appended as leader")
        self.bytes_out = counter(topics + "BytesOutPerSec", "bytes sent to consumers")
        self.replication_bytes_in = counter(
            topics + "ReplicationBytesInPerSec", "bytes appended as follower"
        )
        self.replication_bytes_out = counter(
            topics + "ReplicationBytesOutPerSec", "bytes sent to followers"
        )
        self.produce_requests = counter(topics + "TotalProduceRequestsPerSec", "produce requests")
        self.failed_produce_requests = counter(
            topics + "FailedProduceRequestsPerSec", "partition produces answered with an error"
        )
        self.fetch_requests = counter(topics + "TotalFetchRequestsPerSec", "fetch requests")
        self.invalid_crc = counter(
            topics + "InvalidMessageCrcRecordsPerSec", "batches rejected for a bad CRC"
        )
        self.produce_purgatory = gauge(
            "kafka_server_DelayedOperationPurgatory_PurgatorySize_Produce",
            "acks=all produces waiting for the HW",
        )
        self.fetch_purgatory = gauge(
            "kafka_server_DelayedOperationPurgatory_PurgatorySize_Fetch",
            "long-poll fetches waiting for data",
        )
        # KIP-73 replication throttles (broker/replication/quota.py). Kafka's JMX
        # `kafka.server:type=LeaderReplication,name=byte-rate` (and FollowerReplication): the
        # quota's measured rate, bytes/s over its window, of what this broker sent to (leader)
        # or fetched for (follower) throttled, out-of-sync replicas.
        self.leader_replication_byte_rate = gauge(
            "kafka_server_leader_replication_byte_rate",
            "measured rate (bytes/s) sent to throttled replicas (leader.replication quota)",
        )
        self.follower_replication_byte_rate = gauge(
            "kafka_server_follower_replication_byte_rate",
            "measured rate (bytes/s) fetched for throttled replicas (follower.replication quota)",
        )
        self.leader_replication_rate_limit = gauge(
            "kafka_server_leader_replication_throttled_rate",
            "leader.replication.throttled.rate in force here (bytes/s; -1: unthrottled)",
        )
        self.follower_replication_rate_limit = gauge(
            "kafka_server_follower_replication_throttled_rate",
            "follower.replication.throttled.rate in force here (bytes/s; -1: unthrottled)",
        )
        self.leader_throttled_bytes = counter(
            "kafka_server_leader_replication_throttled_bytes",
            "bytes sent to throttled replicas (counted against the leader quota)",
        )
        self.follower_throttled_bytes = counter(
            "kafka_server_follower_replication_throttled_bytes",
            "bytes fetched for throttled replicas (counted against the follower quota)",
        )
        self.leader_throttled = counter(
            "kafka_server_leader_replication_throttled_partitions",
            "times a throttled partition got no records because the leader quota was exceeded",
        )
        self.follower_throttled = counter(
            "kafka_server_follower_replication_throttled_partitions",
            "times a throttled partition was left out of a fetch (follower quota exceeded)",
        )
        self.truncations = counter(
            "minibroker_broker_LogTruncationsPerSec",
            "follower truncations (diverging epoch or out of range)",
        )
