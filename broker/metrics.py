"""Broker metrics with Kafka's JMX names (docs/design.md §7.3), in Prometheus form.

I/O shell only in that `serve` opens the /metrics port (through client.common.metrics). Kafka's
JMX name `kafka.server:type=ReplicaManager,name=UnderReplicatedPartitions` becomes
`kafka_server_ReplicaManager_UnderReplicatedPartitions`; meters ("PerSec") become counters, whose
rate Prometheus computes. Gauges over every hosted replica (under-replicated, leaders, lag) are
computed on the event loop when /metrics is read; the others are refreshed four times a second.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge
from prometheus_client.metrics_core import Metric

from minibroker.client.common.log import get_logger
from minibroker.client.common.metrics import new_registry

log = get_logger(__name__)


class _BeforeScrape:
    """A collector registered first in the registry: it collects nothing, but runs the
    refresh hook before the gauges after it are read."""

    def __init__(self) -> None:
        self.refresh: Callable[[], None] | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> list[Metric]:
        if self.refresh is not None:
            self.refresh()
        return []


class BrokerMetrics:
    def __init__(self) -> None:
        self.registry = new_registry()
        self._before_scrape = _BeforeScrape()
        self.registry.register(self._before_scrape)  # type: ignore[arg-type]
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
        # KIP-227 fetch sessions (broker/fetch_session.py). Kafka's FetchSessionCache gauges and
        # eviction meter, and minibroker's per-kind counts of the partition entries that fetch
        # requests and answers carry and that fetches read (an idle session adds none of them).
        fsc = "kafka_server_FetchSessionCache_"
        self.fetch_sessions = gauge(fsc + "NumIncrementalFetchSessions", "fetch sessions cached")
        self.fetch_session_partitions = gauge(
            fsc + "NumIncrementalFetchPartitionsCached", "partitions in all cached fetch sessions"
        )
        self.fetch_session_evictions = counter(
            fsc + "IncrementalFetchSessionEvictionsPerSec", "fetch sessions evicted"
        )
        kinds = ["kind"]
        self.fetch_request_partitions = Counter(
            "minibroker_fetch_request_partitions",
            "partition entries in fetch requests received (forgotten ones included)",
            kinds,
            registry=self.registry,
        )
        self.fetch_response_partitions = Counter(
            "minibroker_fetch_response_partitions",
            "partition entries in fetch answers sent",
            kinds,
            registry=self.registry,
        )
        self.fetch_partitions_evaluated = Counter(
            "minibroker_fetch_partitions_evaluated",
            "partition reads done to answer fetches (each look at a partition counts)",
            kinds,
            registry=self.registry,
        )
        self.fetch_session_full_requests = Counter(
            "minibroker_fetch_session_full_requests",
            "full fetch requests that open a fetch session (epoch 0)",
            kinds,
            registry=self.registry,
        )
        self.fetch_session_errors = Counter(
            "minibroker_fetch_session_errors",
            "fetches refused for their session (70 FETCH_SESSION_ID_NOT_FOUND, 71 epoch)",
            ["code"],
            registry=self.registry,
        )
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
        self.cleaner = CleanerMetrics(self.registry)

        # -- the Kafka-protocol listener (broker/kafka/) --------------------------------------
        # Kafka's RequestsPerSec{request,version} and the connections closed for bad input.
        self.kafka_requests = Counter(
            "kafka_network_RequestMetrics_RequestsPerSec",
            "requests read on the Kafka-protocol listener, by API and version",
            ["request", "version"],
            registry=self.registry,
        )
        self.kafka_connections_closed = Counter(
            "minibroker_kafka_connections_closed_for_bad_input",
            "Kafka-protocol connections closed for a request that cannot be served",
            ["reason"],
            registry=self.registry,
        )

    def refresh_on_scrape(
        self, loop: asyncio.AbstractEventLoop, refresh: Callable[[], None]
    ) -> None:
        """Run `refresh` on `loop` (the thread that owns what it reads) before every scrape.
        A loop that does not answer within REFRESH_TIMEOUT_S (a paused process) leaves the
        gauges as they were last set."""
        owner = threading.get_ident()

        def before_scrape() -> None:
            if threading.get_ident() == owner:
                refresh()
                return
            done: concurrent.futures.Future[None] = concurrent.futures.Future()

            def run() -> None:
                try:
                    refresh()
                    done.set_result(None)
                except BaseException as err:  # handed to the scraping thread
                    done.set_exception(err)

            try:
                loop.call_soon_threadsafe(run)
                done.result(REFRESH_TIMEOUT_S)
            except Exception as err:
                # Stale gauges are better than a failed scrape (a paused or busy loop).
                log.debug("gauge_refresh_skipped", error=repr(err))

        self._before_scrape.refresh = before_scrape


REFRESH_TIMEOUT_S = 2.0


class CleanerMetrics:
    """The log cleaner's gauges with Kafka's names (LogCleaner, LogCleanerManager), and
    minibroker's counters of its rounds. Set from the cleaner threads (prometheus-client
    metrics are thread-safe); the per-thread gauges are over each thread's last round, as
    Kafka's are: the max clean time and buffer utilization over the threads, the mean recopy
    percent."""

    def __init__(self, registry: Any) -> None:
        lc = "kafka_log_LogCleaner_"
        lcm = "kafka_log_LogCleanerManager_"
        self._lock = threading.Lock()
        self._last: dict[int, tuple[float, float, float]] = {}  # thread: (secs, recopy, util)
        self.max_clean_time = Gauge(
            lc + "max_clean_time_secs",
            "longest last round of a cleaner thread (seconds)",
            registry=registry,
        )
        self.recopy_percent = Gauge(
            lc + "cleaner_recopy_percent",
            "bytes written over bytes read by the cleaners' last rounds, mean over threads (%)",
            registry=registry,
        )
        self.max_buffer_utilization = Gauge(
            lc + "max_buffer_utilization_percent",
            "fullest offset map of the cleaners' last rounds (%)",
            registry=registry,
        )
        self.dead_threads = Gauge(
            lc + "DeadThreadCount",
            "cleaner threads stopped by an unexpected error",
            registry=registry,
        )
        self.max_dirty = Gauge(
            lcm + "max_dirty_percent",
            "largest dirty ratio among the compacted logs the cleaner last looked at (%)",
            registry=registry,
        )
        self.max_compaction_delay = Gauge(
            lcm + "max_compaction_delay_secs",
            "how far past max.compaction.lag.ms the most overdue compacted log was at the last "
            "look (seconds)",
            registry=registry,
        )
        self.uncleanable_partitions = Gauge(
            lcm + "uncleanable_partitions_count",
            "logs the cleaner gave up on after an unexpected error (until deleted or restarted)",
            registry=registry,
        )
        self.time_since_last_run = Gauge(
            lcm + "time_since_last_run_ms",
            "ms since a cleaner round last ended (since the broker started, before one)",
            registry=registry,
        )
        self._last_run_monotonic = time.monotonic()
        self.time_since_last_run.set_function(
            lambda: (time.monotonic() - self._last_run_monotonic) * 1000.0
        )
        self.rounds = Counter(
            "minibroker_log_cleaner_rounds",
            "cleaner rounds ended, by outcome (cleaned, aborted, failed)",
            ["outcome"],
            registry=registry,
        )
        self.bytes_read = Counter(
            "minibroker_log_cleaner_bytes_read", "log bytes the cleaner read", registry=registry
        )
        self.bytes_written = Counter(
            "minibroker_log_cleaner_bytes_written",
            "log bytes the cleaner wrote to cleaned segments",
            registry=registry,
        )
        self.records_removed = Counter(
            "minibroker_log_cleaner_records_removed",
            "records the cleaner read and did not write back",
            registry=registry,
        )

    # -- the cleaner's observer (broker/cleaner/manager.py) ---------------------------------

    def round_finished(self, thread: int, run: Any, stats: Any) -> None:
        self.rounds.labels(run.outcome.value).inc()
        self._last_run_monotonic = time.monotonic()
        if stats is None:
            return
        self.bytes_read.inc(stats.bytes_read)
        self.bytes_written.inc(stats.bytes_written)
        self.records_removed.inc(max(0, stats.records_read - stats.records_written))
        recopy = 100.0 * stats.bytes_written / stats.bytes_read if stats.bytes_read else 0.0
        with self._lock:
            self._last[thread] = (stats.elapsed_s, recopy, 100.0 * stats.map_utilization)
            last = list(self._last.values())
        self.max_clean_time.set(max(v[0] for v in last))
        self.recopy_percent.set(sum(v[1] for v in last) / len(last))
        self.max_buffer_utilization.set(max(v[2] for v in last))

    def dirty_ratio(self, ratio: float, max_compaction_delay_ms: int = 0) -> None:
        self.max_dirty.set(100.0 * ratio)
        self.max_compaction_delay.set(max_compaction_delay_ms / 1000.0)

    def uncleanable(self, count: int) -> None:
        self.uncleanable_partitions.set(count)

    def thread_died(self) -> None:
        self.dead_threads.inc()
