"""Partition limits in the controller core (issue 11 item 8; KIP-578's names).

Before: a CreateTopics of 1,000,000 partitions was placed, written and applied, growing the
controller to 1.6 GB and leaving brokers to run out of file handles. Rules checked here, on the
pure core:

- `max.partitions` bounds the partitions of the cluster and `max.broker.partitions` the replicas
  of each broker; a topic past either is refused with POLICY_VIOLATION and writes nothing (no
  entry, image unchanged), validate_only included, and a topic that fits exactly is created;
- a topic that cannot fit is refused before a placement is built: a million partitions cost
  the core no memory in proportion to them;
- brokers at their limit take no new replicas; a placement that would still put one over is
  refused;
- whatever sequence of creates, no broker ever hosts more than its limit and the cluster never
  holds more than its limit (property test).
"""

from __future__ import annotations

import random
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.client.errors import ErrorCode
from minibroker.controller.config import build_config
from minibroker.controller.core.controller import ControllerCore, ControllerSettings
from minibroker.controller.core.messages import (
    CreatableTopic,
    CreateTopicResult,
    HeartbeatRequest,
    RegisterRequest,
)
from minibroker.controller.core.partition_limits import (
    DEFAULT_MAX_BROKER_PARTITIONS,
    DEFAULT_MAX_PARTITIONS,
    hosted_replicas,
)

NOW = 1_000_000


class Cluster:
    def __init__(self, **settings: int) -> None:
        self.core = ControllerCore(
            ControllerSettings(auto_leader_rebalance_enable=False, **settings),
            "cluster-A",
            random.Random(7),
            NOW,
        )
        self.entries = 0

    def add_brokers(self, *ids: int) -> None:
        for b in ids:
            reply = self.core.register_broker(
                RegisterRequest(b, "", f"inc-{b}", "127.0.0.1", 9000 + b), NOW
            ).reply
            assert reply.error == ErrorCode.NONE
            req = HeartbeatRequest(b, reply.broker_epoch, self.core.image.next_offset)
            assert not self.core.heartbeat(req, b, NOW).reply.is_fenced

    def create(
        self, name: str, partitions: int, rf: int = 1, validate_only: bool = False
    ) -> CreateTopicResult:
        outcome = self.core.create_topics(
            [CreatableTopic(name, partitions, rf)], validate_only, NOW
        )
        (result,) = outcome.reply
        if result.error != ErrorCode.NONE:
            assert outcome.entries == (), "a refused topic must write nothing"
        self.entries += len(outcome.entries)
        return result

    def hosted(self) -> dict[int, int]:
        image = self.core.image
        return dict(hosted_replicas(p.replicas for _, p in image.partitions()))

    def replicas_of(self, name: str) -> list[tuple[int, ...]]:
        topic = self.core.image.topic(name)
        assert topic is not None
        return [topic.partitions[i].replicas for i in sorted(topic.partitions)]


def test_the_defaults_are_the_controllers_config_defaults() -> None:
    settings = build_config({}).settings()
    assert settings.max_partitions == DEFAULT_MAX_PARTITIONS == 10_000
    assert settings.max_broker_partitions == DEFAULT_MAX_BROKER_PARTITIONS == 1000
    assert build_config({"max.partitions": "7"}).settings().max_partitions == 7


def test_the_cluster_limit_refuses_the_topic_that_would_pass_it() -> None:
    cluster = Cluster(max_partitions=10)
    cluster.add_brokers(1, 2, 3)
    assert cluster.create("a", 6).error == ErrorCode.NONE
    before = (cluster.core.image.next_offset, cluster.core.image.partition_count())

    refused = cluster.create("b", 5)
    assert refused.error == ErrorCode.POLICY_VIOLATION
    assert "max.partitions=10" in refused.message and "11" in refused.message
    assert cluster.create("b", 5, validate_only=True).error == ErrorCode.POLICY_VIOLATION
    assert (cluster.core.image.next_offset, cluster.core.image.partition_count()) == before
    assert cluster.core.image.topic("b") is None

    assert cluster.create("b", 4).error == ErrorCode.NONE  # exactly at the limit
    assert cluster.core.image.partition_count() == 10


def test_the_broker_limit_counts_replicas_and_refuses_past_it() -> None:
    cluster = Cluster(max_broker_partitions=4)
    cluster.add_brokers(1, 2, 3)
    assert cluster.create("a", 4, rf=3).error == ErrorCode.NONE  # 4 replicas on each
    assert cluster.hosted() == {1: 4, 2: 4, 3: 4}
    refused = cluster.create("b", 1)
    assert refused.error == ErrorCode.POLICY_VIOLATION
    assert "max.broker.partitions=4" in refused.message
    assert cluster.core.image.topic("b") is None


def test_a_full_broker_gets_no_new_replicas() -> None:
    cluster = Cluster(max_broker_partitions=1)
    cluster.add_brokers(1, 2, 3)
    assert cluster.create("a", 1).error == ErrorCode.NONE
    (full,) = cluster.hosted()
    assert cluster.create("b", 2).error == ErrorCode.NONE
    assert all(full not in replicas for replicas in cluster.replicas_of("b"))
    assert cluster.hosted() == {1: 1, 2: 1, 3: 1}
    refused = cluster.create("c", 1)
    assert refused.error == ErrorCode.POLICY_VIOLATION
    assert "full: [1, 2, 3]" in refused.message


def test_placement_skips_a_full_broker_it_would_otherwise_start_on() -> None:
    cluster = Cluster(max_broker_partitions=3)
    cluster.add_brokers(1)
    assert cluster.create("a", 3).error == ErrorCode.NONE  # broker 1 is full
    cluster.add_brokers(2, 3)
    # Round robin over all three would start "b" on broker 1.
    assert cluster.create("b", 2).error == ErrorCode.NONE
    assert sorted(r for (r,) in cluster.replicas_of("b")) == [2, 3]


def test_a_placement_that_would_put_one_broker_over_is_refused() -> None:
    cluster = Cluster(max_broker_partitions=3)
    cluster.add_brokers(1)
    assert cluster.create("a", 2).error == ErrorCode.NONE  # broker 1: 2 of 3
    cluster.add_brokers(2, 3)
    # Room for 1 + 3 + 3 = 7 replicas, but round robin gives each broker 2 of 6.
    refused = cluster.create("b", 6)
    assert refused.error == ErrorCode.POLICY_VIOLATION
    assert "broker 1 4 replicas" in refused.message
    assert cluster.create("b", 3).error == ErrorCode.NONE
    assert cluster.hosted() == {1: 3, 2: 1, 3: 1}


def test_a_topic_with_too_few_brokers_with_room_for_its_replication_factor_is_refused() -> None:
    cluster = Cluster(max_broker_partitions=1)
    cluster.add_brokers(1, 2)
    assert cluster.create("a", 1).error == ErrorCode.NONE
    refused = cluster.create("b", 1, rf=2)
    assert refused.error == ErrorCode.POLICY_VIOLATION
    assert "replication factor 2 needs 2 brokers with room" in refused.message


def test_a_million_partitions_are_refused_without_building_anything() -> None:
    cluster = Cluster()
    cluster.add_brokers(1, 2, 3)
    tracemalloc.start()
    try:
        result = cluster.create("huge", 1_000_000, rf=3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.error == ErrorCode.POLICY_VIOLATION
    assert "max.partitions=10000" in result.message
    # A placement alone is a million tuples (~100 MB); the refusal allocates next to nothing.
    assert peak < 1_000_000, f"refusing allocated {peak} bytes"
    # Under the cluster limit but over what three brokers may host: refused the same way.
    tracemalloc.start()
    try:
        result = cluster.create("big", 9_000, rf=3)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.error == ErrorCode.POLICY_VIOLATION
    assert "27000 replicas" in result.message and "room for 3000" in result.message
    assert peak < 1_000_000, f"refusing allocated {peak} bytes"
    assert cluster.entries == 0 and cluster.core.image.partition_count() == 0


@settings(max_examples=150, deadline=None)
@given(
    max_partitions=st.integers(1, 30),
    max_broker_partitions=st.integers(1, 12),
    brokers=st.integers(1, 4),
    requests=st.lists(st.tuples(st.integers(1, 20), st.integers(1, 4)), max_size=12),
)
def test_no_sequence_of_creates_passes_either_limit(
    max_partitions: int,
    max_broker_partitions: int,
    brokers: int,
    requests: list[tuple[int, int]],
) -> None:
    cluster = Cluster(max_partitions=max_partitions, max_broker_partitions=max_broker_partitions)
    cluster.add_brokers(*range(1, brokers + 1))
    for i, (partitions, rf) in enumerate(requests):
        before = cluster.core.image.partition_count()
        result = cluster.create(f"t{i}", partitions, rf)
        after = cluster.core.image.partition_count()
        if result.error == ErrorCode.NONE:
            assert after == before + partitions
        else:
            assert after == before
        assert after <= max_partitions
        assert all(n <= max_broker_partitions for n in cluster.hosted().values())
