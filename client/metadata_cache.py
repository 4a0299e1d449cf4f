"""The client's view of the cluster: brokers, topics, partition leaders, epochs, ISR.

Pure: no I/O, no clock (time comes in as `now_ms`). The I/O shell (`minibroker.client.transport`)
fetches a Metadata response from any broker, converts it to these dataclasses and calls `update`.
Producers and consumers ask it where to send (`leader_for`, `read_replica_for`) and flag it stale
(`request_update`) whenever a broker answers NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH and the
like, as Kafka's client `Metadata` class does. Event-loop thread only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from minibroker.client.errors import ErrorCode
from minibroker.client.types import NO_LEADER, TopicPartition


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str = ""
    fenced: bool = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition as the controller last published it. leader == -1: offline."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    partition_epoch: int = 0
    error_code: int = ErrorCode.NONE
    # A reassignment in progress (KIP-455): replicas being added and removed; () when none.
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: str
    partitions: Mapping[int, PartitionInfo]
    configs: Mapping[str, str] = field(default_factory=dict)
    error_code: int = ErrorCode.NONE

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """One Metadata response, converted. `topics` holds only the topics that were asked for."""

    cluster_id: str
    controller_id: int
    brokers: Mapping[int, BrokerInfo]
    topics: Mapping[str, TopicInfo]
    controller_host: str = ""
    controller_port: int = 0
    all_topics: bool = False


class MetadataCache:
    """Latest known metadata plus the topics the client cares about.

    Invariant: a partition's leader epoch never goes backwards in the cache; a response from a
    broker that is behind the controller (older epoch) does not undo what a newer one told us.
    """

    def __init__(self, metadata_max_age_ms: int = 300_000) -> None:
        self.metadata_max_age_ms = metadata_max_age_ms
        self.cluster_id = ""
        self.controller_id = -1
        self.controller_host = ""
        self.controller_port = 0
        self.brokers: dict[int, BrokerInfo] = {}
        self.topics: dict[str, TopicInfo] = {}
        # Topics whose Metadata answer was an error (e.g. UNKNOWN_TOPIC_OR_PARTITION).
        self.topic_errors: dict[str, int] = {}
        self.interest: set[str] = set()
        self.last_refresh_ms = -1
        self.update_requested = True
        self.version = 0

    # -- updates -------------------------------------------------------------------------------

    def add_interest(self, topics: Iterable[str]) -> bool:
        """Track `topics`; returns True when one of them is new (a refresh is then needed)."""
        new = set(topics) - self.interest
        if new:
            self.interest |= new
            self.update_requested = True
        return bool(new)

    def remove_interest(self, topics: Iterable[str]) -> None:
        """Stop tracking `topics` (their metadata is no longer asked for)."""
        self.interest.difference_update(topics)

    def request_update(self) -> None:
        self.update_requested = True

    def needs_update(self, now_ms: int) -> bool:
        return (
            self.update_requested
            or self.last_refresh_ms < 0
            or now_ms - self.last_refresh_ms >= self.metadata_max_age_ms
        )

    def update(self, snapshot: ClusterSnapshot, now_ms: int) -> None:
        """Apply a Metadata response; keeps leader epochs monotonic per partition."""
        self.cluster_id = snapshot.cluster_id
        self.controller_id = snapshot.controller_id
        self.controller_host = snapshot.controller_host
        self.controller_port = snapshot.controller_port
        self.brokers = dict(snapshot.brokers)
        if snapshot.all_topics:
            # A full listing also tells us which topics disappeared.
            for name in list(self.topics):
                if name not in snapshot.topics:
                    del self.topics[name]
        for name, topic in snapshot.topics.items():
            if topic.error_code != ErrorCode.NONE:
                self.topic_errors[name] = topic.error_code
                self.topics.pop(name, None)
                continue
            self.topic_errors.pop(name, None)
            self.topics[name] = self._merge(self.topics.get(name), topic)
        self.last_refresh_ms = now_ms
        self.update_requested = False
        self.version += 1

    @staticmethod
    def _merge(old: TopicInfo | None, new: TopicInfo) -> TopicInfo:
        if old is None or old.topic_id != new.topic_id:
            return new
        merged: dict[int, PartitionInfo] = {}
        for p, info in new.partitions.items():
            prev = old.partitions.get(p)
            merged[p] = prev if prev is not None and prev.leader_epoch > info.leader_epoch else info
        return TopicInfo(new.name, new.topic_id, merged, new.configs, new.error_code)

    def mark_leader_unknown(self, tp: TopicPartition) -> None:
        """Forget the leader after it said it is not the leader; a refresh brings the new one."""
        topic = self.topics.get(tp.topic)
        info = topic.partitions.get(tp.partition) if topic else None
        if topic is not None and info is not None and info.leader != NO_LEADER:
            parts = dict(topic.partitions)
            parts[tp.partition] = PartitionInfo(
                info.partition,
                NO_LEADER,
                info.leader_epoch,
                info.replicas,
                info.isr,
                info.offline_replicas,
                info.partition_epoch,
                info.error_code,
                info.adding_replicas,
                info.removing_replicas,
            )
            self.topics[tp.topic] = TopicInfo(
                topic.name, topic.topic_id, parts, topic.configs, topic.error_code
            )
        self.update_requested = True

    # -- queries -------------------------------------------------------------------------------

    def partition_count(self, topic: str) -> int | None:
        info = self.topics.get(topic)
        return info.num_partitions if info is not None else None

    def partition(self, tp: TopicPartition) -> PartitionInfo | None:
        topic = self.topics.get(tp.topic)
        return topic.partitions.get(tp.partition) if topic is not None else None

    def leader_for(self, tp: TopicPartition) -> int | None:
        """The leader's node id, or None when unknown, offline, or not among known brokers."""
        info = self.partition(tp)
        if info is None or info.leader == NO_LEADER or info.leader not in self.brokers:
            return None
        return info.leader

    def leader_epoch(self, tp: TopicPartition) -> int:
        info = self.partition(tp)
        return info.leader_epoch if info is not None else -1

    def read_replica_for(self, tp: TopicPartition, client_rack: str | None) -> int | None:
        """Where a consumer should fetch (KIP-392): an in-sync, unfenced replica in the client's
        rack, preferring the leader when it is in that rack; otherwise the leader."""
        leader = self.leader_for(tp)
        if not client_rack or leader is None:
            return leader
        info = self.partition(tp)
        if info is None or self.brokers[leader].rack == client_rack:
            return leader
        for node in info.isr:
            broker = self.brokers.get(node)
            if broker is not None and broker.rack == client_rack and not broker.fenced:
                return node
        return leader

    def address(self, node_id: int) -> str | None:
        broker = self.brokers.get(node_id)
        return broker.address if broker is not None else None

    def controller_address(self) -> str | None:
        if not self.controller_host or self.controller_port <= 0:
            return None
        return f"{self.controller_host}:{self.controller_port}"

    def topic_config(self, topic: str, name: str) -> str | None:
        info = self.topics.get(topic)
        return info.configs.get(name) if info is not None else None
