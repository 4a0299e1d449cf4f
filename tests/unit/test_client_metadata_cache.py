"""The client's metadata cache (pure): leaders, epochs, staleness, rack-aware read replicas; and
the order in which a client asks brokers for metadata."""

from __future__ import annotations

from minibroker.client.errors import ErrorCode
from minibroker.client.metadata_cache import (
    BrokerInfo,
    ClusterSnapshot,
    MetadataCache,
    PartitionInfo,
    TopicInfo,
)
from minibroker.client.types import TopicPartition

TP = TopicPartition("t", 0)
BROKERS = {
    1: BrokerInfo(1, "h1", 9001, rack="r1"),
    2: BrokerInfo(2, "h2", 9002, rack="r2"),
    3: BrokerInfo(3, "h3", 9003, rack="r3"),
}


def snapshot(
    leader: int = 1,
    epoch: int = 5,
    isr: tuple[int, ...] = (1, 2, 3),
    topic_id: str = "id-1",
    brokers: dict[int, BrokerInfo] | None = None,
    all_topics: bool = False,
) -> ClusterSnapshot:
    part = PartitionInfo(0, leader, epoch, (1, 2, 3), isr)
    return ClusterSnapshot(
        cluster_id="c",
        controller_id=0,
        brokers=brokers or BROKERS,
        topics={"t": TopicInfo("t", topic_id, {0: part}, {"max.message.bytes": "100"})},
        controller_host="ctl",
        controller_port=9090,
        all_topics=all_topics,
    )


def test_update_answers_leader_epoch_address_and_config() -> None:
    cache = MetadataCache()
    cache.update(snapshot(), now_ms=10)
    assert cache.leader_for(TP) == 1
    assert cache.leader_epoch(TP) == 5
    assert cache.address(1) == "h1:9001"
    assert cache.partition_count("t") == 1
    assert cache.controller_address() == "ctl:9090"
    assert cache.topic_config("t", "max.message.bytes") == "100"
    assert cache.leader_for(TopicPartition("t", 7)) is None
    assert cache.leader_for(TopicPartition("other", 0)) is None


def test_a_stale_response_never_lowers_a_leader_epoch() -> None:
    cache = MetadataCache()
    cache.update(snapshot(leader=2, epoch=7), now_ms=0)
    cache.update(snapshot(leader=1, epoch=6), now_ms=1)  # a broker behind the controller
    assert (cache.leader_for(TP), cache.leader_epoch(TP)) == (2, 7)
    cache.update(snapshot(leader=3, epoch=8), now_ms=2)
    assert (cache.leader_for(TP), cache.leader_epoch(TP)) == (3, 8)


def test_a_recreated_topic_takes_the_new_epochs() -> None:
    cache = MetadataCache()
    cache.update(snapshot(epoch=9, topic_id="old"), now_ms=0)
    cache.update(snapshot(epoch=0, topic_id="new"), now_ms=1)
    assert cache.leader_epoch(TP) == 0


def test_mark_leader_unknown_and_request_update() -> None:
    cache = MetadataCache(metadata_max_age_ms=1000)
    cache.update(snapshot(), now_ms=0)
    assert not cache.needs_update(500)
    assert cache.needs_update(1000), "metadata.max.age.ms passed"
    cache.mark_leader_unknown(TP)
    assert cache.leader_for(TP) is None
    assert cache.leader_epoch(TP) == 5, "the epoch stays for fencing checks"
    assert cache.needs_update(1)


def test_a_leader_missing_from_the_broker_list_is_unknown() -> None:
    cache = MetadataCache()
    cache.update(snapshot(leader=3, brokers={1: BROKERS[1], 2: BROKERS[2]}), now_ms=0)
    assert cache.leader_for(TP) is None


def test_topic_errors_and_full_listings() -> None:
    cache = MetadataCache()
    cache.update(snapshot(), now_ms=0)
    missing = ClusterSnapshot(
        "c",
        0,
        BROKERS,
        {"gone": TopicInfo("gone", "", {}, {}, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)},
    )
    cache.update(missing, now_ms=1)
    assert cache.topic_errors["gone"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert "gone" not in cache.topics
    assert "t" in cache.topics, "a partial answer does not drop other topics"
    cache.update(ClusterSnapshot("c", 0, BROKERS, {}, all_topics=True), now_ms=2)
    assert "t" not in cache.topics, "a full listing without the topic means it was deleted"


def test_interest_flags_a_refresh_only_for_new_topics() -> None:
    cache = MetadataCache()
    cache.update(snapshot(), now_ms=0)
    assert cache.add_interest(["t"])
    cache.update(snapshot(), now_ms=1)
    assert not cache.add_interest(["t"])
    assert not cache.update_requested


def test_read_replica_prefers_an_in_sync_replica_in_the_client_rack() -> None:
    """KIP-392: same-rack ISR member when the leader is elsewhere; the leader otherwise."""
    cache = MetadataCache()
    cache.update(snapshot(leader=1, isr=(1, 2, 3)), now_ms=0)
    assert cache.read_replica_for(TP, None) == 1
    assert cache.read_replica_for(TP, "r1") == 1
    assert cache.read_replica_for(TP, "r2") == 2
    assert cache.read_replica_for(TP, "nowhere") == 1
    cache.update(snapshot(leader=1, epoch=6, isr=(1, 3)), now_ms=1)
    assert cache.read_replica_for(TP, "r2") == 1, "an out-of-sync follower is never chosen"
    fenced = dict(BROKERS)
    fenced[3] = BrokerInfo(3, "h3", 9003, rack="r3", fenced=True)
    cache.update(snapshot(leader=1, epoch=7, isr=(1, 3), brokers=fenced), now_ms=2)
    assert cache.read_replica_for(TP, "r3") == 1, "a fenced follower is never chosen"


def test_metadata_is_asked_of_fenced_brokers_last_and_of_live_ones_in_turn() -> None:
    """A SIGSTOPped broker is fenced by the controller but still accepts connections: a
    Metadata call to it waits out its deadline, so it is tried only after every other address;
    the others rotate so no single dead one takes the first attempt of every refresh."""
    from minibroker.client.transport import ClusterClient

    client = ClusterClient("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
    brokers = {
        1: BrokerInfo(1, "127.0.0.1", 1),
        2: BrokerInfo(2, "127.0.0.1", 2, fenced=True),
        3: BrokerInfo(3, "127.0.0.1", 3),
    }
    client.metadata.update(ClusterSnapshot("c", 0, brokers, {}), now_ms=0)
    orders = [client._metadata_addresses() for _ in range(4)]
    for order in orders:
        assert order[-1] == "127.0.0.1:2"
        assert sorted(order) == ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
    assert {order[0] for order in orders} == {"127.0.0.1:1", "127.0.0.1:3"}
