"""Every moving-replicas Admin call against a real cluster (issue 14): 1 controller, 4 brokers.

- a partition of an RF 2 topic, with acknowledged records, is moved to the two brokers that did
  not hold it: the reassignment shows in the brokers' metadata and in ListPartitionReassignments
  until every target replica is in the ISR, then the partition lives on the target only, and
  its records are all on the new replicas;
- a reassignment that cannot complete (its new replica's broker is paused) is listed, refuses a
  second one with REASSIGNMENT_IN_PROGRESS, and is cancelled back to the original replicas;
- a topic config and a broker throttle are changed and read back with DescribeConfigs;
- CreatePartitions grows a topic (validate_only changes nothing);
- a broker is decommissioned: it ends up holding nothing, DescribeCluster says so;
- bad input gets Kafka's errors and changes nothing, from the Admin and from raw requests
  (malformed protobufs the Admin would never build).

Conditions are awaited with deadlines, never with fixed sleeps; every process is killed by PID
when the test ends.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import grpc
import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.client import Admin, Producer
from minibroker.client.admin import (
    AlterConfigOp,
    ConfigResource,
    PartitionDescription,
)
from minibroker.client.errors import (
    BrokerIdNotRegisteredError,
    ErrorCode,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    NoReassignmentInProgressError,
    ReassignmentInProgressError,
    UnknownTopicOrPartitionError,
)
from minibroker.client.types import TopicPartition
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

TOPIC = "moves"
BROKERS = (1, 2, 3, 4)
RECORDS = 200
DEADLINE_S = 60.0


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    settings = {
        "leader.imbalance.check.interval.seconds": "3600",
        "replica.lag.time.max.ms": "3000",
    }
    with local_cluster(str(tmp_path / "cluster"), brokers=len(BROKERS), settings=settings) as c:
        yield c


def partition(admin: Admin, topic: str, index: int) -> PartitionDescription:
    (desc,) = admin.describe_topics([topic])
    return desc.partitions[index]


def test_every_moving_replicas_admin_call(cluster: LocalCluster) -> None:
    tp = TopicPartition(TOPIC, 0)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, 2, 2)
        with Producer(cluster.bootstrap, acks="all") as producer:
            for i in range(RECORDS):
                producer.send(TOPIC, f"v{i}".encode(), partition=0)
            producer.flush()
        before = partition(admin, TOPIC, 0)
        target = tuple(b for b in BROKERS if b not in before.replicas)
        assert len(target) == 2

        # -- a complete move: every replica replaced ------------------------------------------
        assert admin.alter_partition_reassignments({tp: target}) == {tp: None}

        def moved() -> bool:
            p = partition(admin, TOPIC, 0)
            return (
                admin.list_partition_reassignments() == {}
                and p.replicas == target
                and set(p.isr) == set(target)
                and p.leader in target
                and p.adding_replicas == ()
                and p.removing_replicas == ()
                and p.high_watermark == RECORDS
                and all(p.log_end_offsets.get(b) == RECORDS for b in target)
            )

        wait_until(moved, DEADLINE_S, f"{tp} moved to {target} with its {RECORDS} records")
        assert admin.list_partition_reassignments([tp]) == {}

        # -- one that cannot complete: listed, blocks another, cancelled ----------------------
        now = partition(admin, TOPIC, 0)
        stuck = next(b for b in BROKERS if b not in now.replicas)
        cluster.pause(stuck)
        try:
            wanted = (now.leader, stuck)
            assert admin.alter_partition_reassignments({tp: wanted}) == {tp: None}
            ongoing = admin.list_partition_reassignments()
            assert list(ongoing) == [tp]
            assert ongoing[tp].adding_replicas == (stuck,)
            assert ongoing[tp].target_replicas == wanted
            # The brokers' metadata (describe_topics) may lag the controller's a little.
            wait_until(
                lambda: partition(admin, TOPIC, 0).adding_replicas == (stuck,),
                DEADLINE_S,
                "the brokers' metadata to show the running reassignment",
            )
            again = admin.alter_partition_reassignments({tp: now.replicas})
            assert isinstance(again[tp], ReassignmentInProgressError)
            assert admin.alter_partition_reassignments({tp: None}) == {tp: None}
            wait_until(
                lambda: (
                    admin.list_partition_reassignments() == {}
                    and partition(admin, TOPIC, 0).replicas == now.replicas
                ),
                DEADLINE_S,
                "the cancelled reassignment reverted",
            )
        finally:
            cluster.resume(stuck)

        # -- bad reassignments: Kafka's errors, nothing changes -------------------------------
        current = partition(admin, TOPIC, 0)
        bad = admin.alter_partition_reassignments(
            {
                TopicPartition("no-such-topic", 0): [1, 2],
                TopicPartition(TOPIC, 99): [1, 2],
                TopicPartition(TOPIC, 1): [1, 1],
            }
        )
        assert isinstance(bad[TopicPartition("no-such-topic", 0)], UnknownTopicOrPartitionError)
        assert isinstance(bad[TopicPartition(TOPIC, 99)], UnknownTopicOrPartitionError)
        assert isinstance(bad[TopicPartition(TOPIC, 1)], InvalidReplicaAssignmentError)
        for replicas in ([], [1, 42]):
            (error,) = admin.alter_partition_reassignments({tp: replicas}).values()
            assert isinstance(error, InvalidReplicaAssignmentError), replicas
        (error,) = admin.alter_partition_reassignments({tp: None}).values()
        assert isinstance(error, NoReassignmentInProgressError)
        after = partition(admin, TOPIC, 0)
        assert (after.replicas, after.partition_epoch) == (
            current.replicas,
            current.partition_epoch,
        )
        assert admin.list_partition_reassignments() == {}

        # -- configs ---------------------------------------------------------------------------
        topic = ConfigResource("topic", TOPIC)
        admin.incremental_alter_configs({topic: [AlterConfigOp("retention.ms", "set", "3600000")]})
        entries = admin.describe_configs([topic], ["retention.ms"])[topic]
        assert [(e.name, e.value, e.source) for e in entries] == [
            ("retention.ms", "3600000", "DYNAMIC_TOPIC_CONFIG")
        ]
        every = {e.name: e for e in admin.describe_configs([topic])[topic]}
        assert "min.insync.replicas" in every and every["retention.ms"].value == "3600000"
        admin.incremental_alter_configs({topic: [AlterConfigOp("retention.ms", "delete")]})
        (entry,) = admin.describe_configs([topic], ["retention.ms"])[topic]
        assert entry.source != "DYNAMIC_TOPIC_CONFIG" and entry.value != "3600000"

        broker = ConfigResource("broker", "1")
        rate = "leader.replication.throttled.rate"
        admin.incremental_alter_configs({broker: [AlterConfigOp(rate, "set", "1048576")]})
        (entry,) = admin.describe_configs([broker], [rate])[broker]
        assert (entry.value, entry.source) == ("1048576", "DYNAMIC_BROKER_CONFIG")
        with pytest.raises(InvalidConfigError):
            admin.incremental_alter_configs({broker: [AlterConfigOp(rate, "set", "0")]})
        with pytest.raises(InvalidConfigError):
            admin.incremental_alter_configs({topic: [AlterConfigOp("no.such.config", "set", "1")]})
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.incremental_alter_configs(
                {ConfigResource("topic", "nope"): [AlterConfigOp("retention.ms", "set", "1")]}
            )
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.describe_configs([ConfigResource("topic", "nope")])
        (entry,) = admin.describe_configs([broker], [rate])[broker]
        assert entry.value == "1048576"  # the refused changes changed nothing
        admin.incremental_alter_configs({broker: [AlterConfigOp(rate, "delete")]})

        # -- CreatePartitions ------------------------------------------------------------------
        admin.create_partitions({TOPIC: 4}, validate_only=True)
        assert len(admin.describe_topics([TOPIC])[0].partitions) == 2
        admin.create_partitions({TOPIC: 3}, {TOPIC: [[3, 4]]})
        assert partition(admin, TOPIC, 2).replicas == (3, 4)
        admin.create_partitions({TOPIC: 4})
        (desc,) = admin.describe_topics([TOPIC])
        assert len(desc.partitions) == 4 and desc.partitions[3].leader in BROKERS
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({TOPIC: 3})
        with pytest.raises(InvalidReplicaAssignmentError):
            admin.create_partitions({TOPIC: 5}, {TOPIC: [[1, 42]]})
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.create_partitions({"nope": 5})
        assert len(admin.describe_topics([TOPIC])[0].partitions) == 4

        # -- decommissioning -------------------------------------------------------------------
        total = sum(len(p.replicas) for p in admin.describe_topics([TOPIC])[0].partitions)
        described = admin.describe_cluster()
        assert sum(b.replica_count for b in described.brokers) == total
        assert sum(b.leader_count for b in described.brokers) == 4
        assert not any(b.decommissioning for b in described.brokers)
        leaving = max(described.brokers, key=lambda b: b.replica_count).broker_id
        assert admin.decommission_broker(leaving) >= 1

        def drained() -> bool:
            b = next(b for b in admin.describe_cluster().brokers if b.broker_id == leaving)
            return (
                b.decommissioning
                and b.replica_count == 0
                and b.leader_count == 0
                and admin.list_partition_reassignments() == {}
            )

        wait_until(drained, DEADLINE_S, f"broker {leaving} drained")

        def brokers_show_it() -> bool:
            (desc,) = admin.describe_topics([TOPIC])
            return all(
                leaving not in p.replicas and len(p.replicas) == 2 and len(p.isr) == 2
                for p in desc.partitions
            )

        wait_until(brokers_show_it, DEADLINE_S, f"the brokers' metadata without {leaving}")
        with pytest.raises(BrokerIdNotRegisteredError):
            admin.decommission_broker(99)
        assert admin.decommission_broker(leaving, cancel=True) == 0
        assert not any(b.decommissioning for b in admin.describe_cluster().brokers)


def test_malformed_requests_are_refused_by_the_controller(cluster: LocalCluster) -> None:
    """What no Admin sends: the controller refuses it whole with INVALID_REQUEST (the
    well-formed part of the request does not happen either)."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, 2)
        before = partition(admin, TOPIC, 0)
    with grpc.insecure_channel(cluster.controller_address) as channel:
        stub = pb_grpc.ControllerServiceStub(channel)
        resp = stub.AlterPartitionReassignments(
            pb.AlterPartitionReassignmentsRequest(
                partitions=[
                    pb.ReassignablePartition(topic=TOPIC, partition=0, replicas=[1, 2]),
                    pb.ReassignablePartition(topic=TOPIC, partition=-1, replicas=[1, 2]),
                ]
            ),
            timeout=10,
        )
        assert resp.error_code == ErrorCode.INVALID_REQUEST
        assert {r.error_code for r in resp.results} == {ErrorCode.INVALID_REQUEST}
        alter = stub.IncrementalAlterConfigs(
            pb.IncrementalAlterConfigsRequest(
                resources=[
                    pb.AlterConfigsResource(
                        resource_type=2,
                        resource_name=TOPIC,
                        configs=[
                            pb.AlterableConfig(name="retention.ms", config_operation=0, value="9")
                        ],
                    ),
                    pb.AlterConfigsResource(resource_type=3, resource_name="x"),
                ]
            ),
            timeout=10,
        )
        assert {r.error_code for r in alter.results} == {ErrorCode.INVALID_REQUEST}
        described = stub.DescribeConfigs(
            pb.DescribeConfigsRequest(
                resources=[pb.DescribeConfigsResource(resource_type=4, resource_name="one")]
            ),
            timeout=10,
        )
        assert [r.error_code for r in described.results] == [ErrorCode.INVALID_REQUEST]
        decommission = stub.DecommissionBroker(
            pb.DecommissionBrokerRequest(broker_id=-1), timeout=10
        )
        assert decommission.error_code == ErrorCode.INVALID_REQUEST
    with Admin(cluster.bootstrap) as admin:
        after = partition(admin, TOPIC, 0)
        assert (after.replicas, after.partition_epoch) == (before.replicas, before.partition_epoch)
        assert admin.list_partition_reassignments() == {}
        topic = ConfigResource("topic", TOPIC)
        (entry,) = admin.describe_configs([topic], ["retention.ms"])[topic]
        assert entry.value != "9"
