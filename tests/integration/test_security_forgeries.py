"""Issue 16's forgeries against a secured cluster: every one refused, nothing changed.

ONE cluster (module fixture) as `cluster up --tls` makes it: three brokers, a controller, mutual
TLS, the authorizer on with `super.users=User:admin` (the launcher's certificate). The attacker
is `mallory`, with a client certificate signed by the cluster's CA (so authenticated, with no
rights), or a node's own certificate used for another node. Each forgery is a raw gRPC call as
the attack would be; each answer is an authorization/authentication refusal, and the state it
targets (HW, ISR, registrations, the log, leaders, topics) is checked unchanged.

Not repeated here (tests/integration/test_tls_cluster.py has them): a plaintext client and a TLS
client without a certificate get clear errors.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until
from cryptography.x509.oid import ExtendedKeyUsageOID

from minibroker.client import Admin, Consumer, Producer, TopicPartition
from minibroker.client.batch import read_header
from minibroker.client.common.tls import TlsSettings, sync_channel
from minibroker.client.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError
from minibroker.client.records.builder import BatchBuilder
from minibroker.deploy import cluster as launcher
from minibroker.deploy import tls as certs
from minibroker.metadata.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

FORGED = "forged"  # RF 2: the paused follower alone holds the HW back
VICTIM = "victim"  # RF 3: a victim producer's log
# The paused follower must stay in the ISR (registered, unfenced) for the whole scenario.
SETTINGS = {
    "replica.lag.time.max.ms": "120000",
    "broker.session.timeout.ms": "120000",
    "leader.imbalance.check.interval.seconds": "3600",
}
DENIED = (pb.CLUSTER_AUTHORIZATION_FAILED, pb.TOPIC_AUTHORIZATION_FAILED)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("forgeries") / "cluster"
    with local_cluster(str(directory), brokers=3, settings=SETTINGS, tls=True) as c:
        with _admin(c) as admin:
            admin.create_topic(FORGED, 1, 2, {"min.insync.replicas": "1"})
            admin.create_topic(VICTIM, 1, 3)
            for topic, size in ((FORGED, 2), (VICTIM, 3)):
                wait_until(
                    lambda t=topic, n=size: (
                        len(admin.describe_topics([t])[0].partitions[0].isr) == n
                    ),
                    30,
                    f"a full ISR of {topic}",
                )
        yield c


# A user certificate from the cluster's CA whose CN reads `broker-2` (make_client_cert refuses
# such a name; a careless CA might not): it is not broker 2, whose certificate also says so in
# its SAN URI (minibroker:node:broker-2).
IMPOSTOR = "impostor"


def _tls(cluster: LocalCluster, name: str) -> TlsSettings:
    """The TLS settings of a certificate holder: a node (broker-2), a user (made on use), or
    IMPOSTOR."""
    folder = launcher.tls_dir(cluster.state.dir)
    ca = certs.PemPair(folder / "ca.pem", folder / "ca.key")
    if name == IMPOSTOR:
        pem, key = folder / IMPOSTOR / "broker-2.pem", folder / IMPOSTOR / "broker-2.key"
        if not pem.exists():
            certs._issue(
                ca,
                folder / IMPOSTOR,
                "broker-2",
                f"{certs.URI_PREFIX}user:broker-2",
                None,
                [ExtendedKeyUsageOID.CLIENT_AUTH],
            )
        return TlsSettings(ca=ca.cert.read_bytes(), cert=pem.read_bytes(), key=key.read_bytes())
    pem, key = folder / f"{name}.pem", folder / f"{name}.key"
    if not pem.exists():
        certs.make_client_cert(ca, folder, name)
    return TlsSettings(
        ca=(folder / "ca.pem").read_bytes(), cert=pem.read_bytes(), key=key.read_bytes()
    )


def _call(cluster: LocalCluster, who: str, address: str, service: str, rpc: str, req: Any) -> Any:
    stubs = {
        "broker": pb_grpc.BrokerServiceStub,
        "controller": pb_grpc.ControllerServiceStub,
        "quorum": pb_grpc.QuorumServiceStub,
    }
    with sync_channel(address, _tls(cluster, who)) as channel:
        return getattr(stubs[service](channel), rpc)(req, timeout=10)


def _admin(cluster: LocalCluster) -> Admin:
    return Admin(cluster.bootstrap, **launcher.client_kwargs(cluster.state))


def _replica(cluster: LocalCluster, broker: int, topic: str) -> pb.ReplicaDescription:
    answer = _call(
        cluster,
        "admin",
        cluster.spec(broker).address,
        "broker",
        "DescribeReplicas",
        pb.DescribeReplicasRequest(topics=[topic]),
    )
    (replica,) = [r for r in answer.replicas if r.partition == 0]
    return replica


def _follower_fetch(replica_id: int, epoch: int, leader_epoch: int, offset: int) -> Any:
    request = pb.FetchRequest(
        replica_id=replica_id, replica_epoch=epoch, max_wait_ms=0, max_bytes=1 << 20
    )
    request.topics.add(topic=FORGED).partitions.add(
        partition=0,
        current_leader_epoch=leader_epoch,
        fetch_offset=offset,
        last_fetched_epoch=leader_epoch,
        log_start_offset=0,
        partition_max_bytes=1 << 20,
    )
    return request


def test_forged_follower_fetches_are_refused_and_move_nothing(cluster: LocalCluster) -> None:
    """(a) mallory fetching as a paused follower with its CURRENT broker epoch; (b) another
    broker's certificate claiming the follower's replica id. Neither advances the HW nor
    acknowledges an acks=all write only the leader has."""
    with _admin(cluster) as admin:
        (partition,) = admin.describe_topics([FORGED])[0].partitions
        epochs = {b.broker_id: b.broker_epoch for b in admin.describe_cluster().brokers}
    leader = partition.leader
    (follower,) = [r for r in partition.replicas if r != leader]
    (other,) = [b for b in (1, 2, 3) if b not in (leader, follower)]
    leader_address = cluster.spec(leader).address
    kwargs = launcher.client_kwargs(cluster.state)
    with Producer(cluster.bootstrap, acks="all", request_timeout_ms=60_000, **kwargs) as producer:
        assert producer.send(FORGED, b"copied", partition=0).result(timeout=30).offset == 0
        wait_until(lambda: _replica(cluster, leader, FORGED).high_watermark == 1, 30, "HW 1")
        cluster.pause(follower)
        try:
            pending = producer.send(FORGED, b"only-on-the-leader", partition=0)
            wait_until(
                lambda: _replica(cluster, leader, FORGED).log_end_offset == 2, 30, "leader LEO 2"
            )
            before = _replica(cluster, leader, FORGED)
            assert before.high_watermark == 1
            follower_leo = {f.replica_id: f.log_end_offset for f in before.followers}[follower]
            forged = _follower_fetch(follower, epochs[follower], before.leader_epoch, offset=2)
            controller = certs.node_name("controller", cluster.state.controller.node_id)
            for who in ("mallory", f"broker-{other}", controller):
                answer = _call(cluster, who, leader_address, "broker", "Fetch", forged)
                assert answer.error_code == pb.CLUSTER_AUTHORIZATION_FAILED, (who, answer)
                (refused,) = answer.topics[0].partitions
                assert refused.error_code == pb.CLUSTER_AUTHORIZATION_FAILED
                assert refused.records == b""
                assert f"User:{who}" in refused.error_message
            after = _replica(cluster, leader, FORGED)
            assert after.high_watermark == 1
            assert set(after.isr) == {leader, follower}
            assert {f.replica_id: f.log_end_offset for f in after.followers}[follower] == (
                follower_leo
            )
            assert not pending.done()
        finally:
            cluster.resume(follower)
        # The real follower, with its own certificate, fetches: acknowledged.
        assert pending.result(timeout=60).offset == 1


def _heartbeat(cluster: LocalCluster, who: str, request: pb.BrokerHeartbeatRequest) -> Any:
    with sync_channel(cluster.controller_address, _tls(cluster, who)) as channel:
        stream = pb_grpc.ControllerServiceStub(channel).Heartbeat(iter([request]), timeout=10)
        return list(stream)


def test_forged_node_rpcs_to_the_controller_are_refused(cluster: LocalCluster) -> None:
    """(c) a Heartbeat asking broker 2's controlled shutdown, as mallory, as broker 3's
    certificate and as a user certificate whose CN reads broker-2; (d) a fake broker's
    RegisterBroker; AlterPartition and AllocateProducerIds for another broker. Broker 2 stays
    in every ISR, nothing registers."""
    with _admin(cluster) as admin:
        epochs = {b.broker_id: b.broker_epoch for b in admin.describe_cluster().brokers}
    shut_down = pb.BrokerHeartbeatRequest(
        broker_id=2, broker_epoch=epochs[2], current_metadata_offset=1 << 40, want_shut_down=True
    )
    for who in ("mallory", "broker-3", IMPOSTOR):
        (answer,) = _heartbeat(cluster, who, shut_down)
        assert answer.error_code == pb.CLUSTER_AUTHORIZATION_FAILED, (who, answer)
        assert not answer.should_shut_down
        registered = _call(
            cluster,
            who,
            cluster.controller_address,
            "controller",
            "RegisterBroker",
            pb.BrokerRegistrationRequest(
                broker_id=99, incarnation_id="forged", host="127.0.0.1", port=1
            ),
        )
        assert registered.error_code == pb.CLUSTER_AUTHORIZATION_FAILED, (who, registered)
        for rpc, request in (
            ("AlterPartition", pb.AlterPartitionRequest(broker_id=2, broker_epoch=epochs[2])),
            (
                "AllocateProducerIds",
                pb.AllocateProducerIdsRequest(broker_id=2, broker_epoch=epochs[2]),
            ),
        ):
            answer = _call(cluster, who, cluster.controller_address, "controller", rpc, request)
            assert answer.error_code == pb.CLUSTER_AUTHORIZATION_FAILED, (who, rpc, answer)
    with _admin(cluster) as admin:
        brokers = {b.broker_id: b for b in admin.describe_cluster().brokers}
        assert set(brokers) == {1, 2, 3}
        assert not brokers[2].in_controlled_shutdown and not brokers[2].fenced
        for topic in admin.describe_topics([FORGED, VICTIM]):
            for p in topic.partitions:
                if 2 in p.replicas:
                    assert 2 in p.isr, (topic.name, p)


def test_mallory_cannot_write_delete_elect_or_read_the_metadata_log(
    cluster: LocalCluster, tmp_path: pathlib.Path
) -> None:
    """(e) a Produce carrying a victim producer's id, epoch and next sequence; (f) an unclean
    election and a topic deletion; (g) DescribeCluster shows mallory no broker epochs, and
    WatchMetadata is refused. Then the same through the Python client and the CLI: clear,
    immediate errors."""
    kwargs = launcher.client_kwargs(cluster.state)
    with Producer(cluster.bootstrap, acks="all", **kwargs) as producer:
        assert producer.send(VICTIM, b"victim-0", partition=0).result(timeout=30).offset == 0
    with _admin(cluster) as admin:
        (partition,) = admin.describe_topics([VICTIM])[0].partitions
    leader_address = cluster.spec(partition.leader).address
    fetch = pb.FetchRequest(replica_id=-1, replica_epoch=-1, max_bytes=1 << 20)
    fetch.topics.add(topic=VICTIM).partitions.add(
        partition=0, current_leader_epoch=-1, fetch_offset=0, partition_max_bytes=1 << 20
    )
    records = _call(cluster, "admin", leader_address, "broker", "Fetch", fetch)
    header = read_header(records.topics[0].partitions[0].records)
    assert header.producer_id >= 0
    before = _replica(cluster, partition.leader, VICTIM)

    # (e) the victim's next record, as mallory, who may READ the topic (an ACL) and so sees the
    # victim's producer id and sequence, but has no WRITE: reading is not writing.
    with _admin(cluster) as admin:
        admin.create_acls(
            [
                AclBinding(
                    ResourceType.TOPIC,
                    VICTIM,
                    PatternType.LITERAL,
                    "User:mallory",
                    "*",
                    AclOperation.READ,
                    AclPermissionType.ALLOW,
                )
            ]
        )
    wait_until(
        lambda: (
            _call(cluster, "mallory", leader_address, "broker", "Fetch", fetch)
            .topics[0]
            .partitions[0]
            .error_code
            == pb.NONE
        ),
        30,
        "mallory's READ ACL on the leader",
    )
    batch = BatchBuilder(
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence + header.records_count,
    )
    batch.append(0, None, b"injected")
    produce = pb.ProduceRequest(acks=-1, timeout_ms=5000)
    produce.topics.add(topic=VICTIM).partitions.add(partition=0, records=batch.build())
    answer = _call(cluster, "mallory", leader_address, "broker", "Produce", produce)
    (refused,) = answer.topics[0].partitions
    assert refused.error_code == pb.TOPIC_AUTHORIZATION_FAILED
    assert refused.error_message == f"not authorized to WRITE topic {VICTIM} as User:mallory"
    after = _replica(cluster, partition.leader, VICTIM)
    assert (after.log_end_offset, after.high_watermark) == (
        before.log_end_offset,
        before.high_watermark,
    )

    # (f) an unclean election and a deletion
    controller = cluster.controller_address
    elect = pb.ElectLeadersRequest(election_type=pb.UNCLEAN, all_partitions=True)
    answer = _call(cluster, "mallory", controller, "controller", "ElectLeaders", elect)
    assert answer.error_code == pb.CLUSTER_AUTHORIZATION_FAILED and not answer.results
    delete = pb.DeleteTopicsRequest(topic_names=[VICTIM, FORGED])
    answer = _call(cluster, "mallory", controller, "controller", "DeleteTopics", delete)
    assert {r.name: r.error_code for r in answer.results} == {
        VICTIM: pb.TOPIC_AUTHORIZATION_FAILED,
        FORGED: pb.TOPIC_AUTHORIZATION_FAILED,
    }
    # Every other controller RPC that changes or reveals something: refused with its codes.
    victim_partition = pb.TopicPartitions(topic=VICTIM, partitions=[0])
    for rpc, request in (
        ("UnregisterBroker", pb.UnregisterBrokerRequest(broker_id=2)),
        ("DecommissionBroker", pb.DecommissionBrokerRequest(broker_id=2)),
        ("CreateTopics", pb.CreateTopicsRequest(topics=[pb.CreatableTopic(name="mine")])),
        (
            "CreatePartitions",
            pb.CreatePartitionsRequest(topics=[pb.CreatePartitionsTopic(name=VICTIM, count=4)]),
        ),
        (
            "AlterPartitionReassignments",
            pb.AlterPartitionReassignmentsRequest(
                partitions=[pb.ReassignablePartition(topic=VICTIM, partition=0, replicas=[1])]
            ),
        ),
        ("ListPartitionReassignments", pb.ListPartitionReassignmentsRequest()),
        (
            "IncrementalAlterConfigs",
            pb.IncrementalAlterConfigsRequest(
                resources=[
                    pb.AlterConfigsResource(
                        resource_type=2,
                        resource_name=VICTIM,
                        configs=[pb.AlterableConfig(name="retention.ms", value="1")],
                    ),
                    pb.AlterConfigsResource(
                        resource_type=4,
                        resource_name="",
                        configs=[pb.AlterableConfig(name="log.retention.ms", value="1")],
                    ),
                ]
            ),
        ),
        (
            "DescribeConfigs",
            pb.DescribeConfigsRequest(
                resources=[pb.DescribeConfigsResource(resource_type=2, resource_name=VICTIM)]
            ),
        ),
        (
            "ElectLeaders",
            pb.ElectLeadersRequest(election_type=pb.PREFERRED, topic_partitions=[victim_partition]),
        ),
        # granting herself WRITE, dropping the ACLs, giving herself a password, listing users
        (
            "CreateAcls",
            pb.CreateAclsRequest(
                creations=[
                    pb.AclCreation(
                        resource_type=ResourceType.TOPIC,
                        resource_name=VICTIM,
                        resource_pattern_type=PatternType.LITERAL,
                        principal="User:mallory",
                        host="*",
                        operation=AclOperation.WRITE,
                        permission_type=AclPermissionType.ALLOW,
                    )
                ]
            ),
        ),
        (
            "DeleteAcls",
            pb.DeleteAclsRequest(
                filters=[
                    pb.AclFilter(
                        resource_type_filter=ResourceType.ANY,
                        pattern_type_filter=PatternType.ANY,
                        operation=AclOperation.ANY,
                        permission_type=AclPermissionType.ANY,
                    )
                ]
            ),
        ),
        ("DescribeAcls", pb.DescribeAclsRequest()),
        (
            "AlterUserScramCredentials",
            pb.AlterUserScramCredentialsRequest(
                upsertions=[
                    pb.ScramCredentialUpsertion(
                        name="mallory",
                        mechanism=1,
                        iterations=4096,
                        salt=b"s" * 16,
                        salted_password=b"p" * 32,
                    )
                ]
            ),
        ),
        ("DescribeUserScramCredentials", pb.DescribeUserScramCredentialsRequest()),
    ):
        answer = _call(cluster, "mallory", controller, "controller", rpc, request)
        codes = {getattr(answer, "error_code", 0)}
        for field in ("topics", "results", "filter_results"):
            codes |= {t.error_code for t in getattr(answer, field, [])}
        assert codes <= {0, *DENIED} and codes & set(DENIED), (rpc, answer)
    # ... and the broker's: offsets, epochs, replicas, a producer id.
    # READ on the victim's topic implies DESCRIBE there (Kafka), and nowhere else.
    for topic, code in ((VICTIM, pb.NONE), (FORGED, pb.TOPIC_AUTHORIZATION_FAILED)):
        offsets = pb.ListOffsetsRequest(replica_id=-1)
        offsets.topics.add(topic=topic).partitions.add(partition=0, timestamp=-1)
        answer = _call(cluster, "mallory", leader_address, "broker", "ListOffsets", offsets)
        assert answer.topics[0].partitions[0].error_code == code, (topic, answer)
    for replica_id, topic, code in (
        (-1, FORGED, pb.TOPIC_AUTHORIZATION_FAILED),
        (2, VICTIM, pb.CLUSTER_AUTHORIZATION_FAILED),
    ):
        epochs_asked = pb.OffsetForLeaderEpochRequest(replica_id=replica_id)
        epochs_asked.topics.add(topic=topic).partitions.add(partition=0, leader_epoch=0)
        answer = _call(
            cluster, "mallory", leader_address, "broker", "OffsetForLeaderEpoch", epochs_asked
        )
        assert answer.topics[0].partitions[0].error_code == code, answer
    replicas = _call(
        cluster,
        "mallory",
        leader_address,
        "broker",
        "DescribeReplicas",
        pb.DescribeReplicasRequest(),
    )
    assert {r.topic for r in replicas.replicas} == {VICTIM}
    pid = _call(
        cluster, "mallory", leader_address, "broker", "InitProducerId", pb.InitProducerIdRequest()
    )
    assert pid.error_code == pb.CLUSTER_AUTHORIZATION_FAILED and pid.producer_id == -1

    # (g) what a forgery would need is not given out
    described = _call(
        cluster, "mallory", controller, "controller", "DescribeCluster", pb.DescribeClusterRequest()
    )
    assert len(described.brokers) == 3
    assert {b.broker_epoch for b in described.brokers} == {-1}
    as_admin = _call(
        cluster, "admin", controller, "controller", "DescribeCluster", pb.DescribeClusterRequest()
    )
    assert all(b.broker_epoch > 0 for b in as_admin.brokers)
    with sync_channel(controller, _tls(cluster, "mallory")) as channel:
        watch = pb_grpc.ControllerServiceStub(channel).WatchMetadata(
            pb.WatchMetadataRequest(from_offset=0, broker_id=-1), timeout=10
        )
        with pytest.raises(grpc.RpcError) as denied:
            next(iter(watch))
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "User:mallory" in (denied.value.details() or "")
    metadata = _call(
        cluster,
        "mallory",
        leader_address,
        "broker",
        "Metadata",
        pb.MetadataRequest(all_topics=True),
    )
    assert [t.name for t in metadata.topics] == [VICTIM]  # her READ ACL; FORGED stays hidden

    with _admin(cluster) as admin:
        assert admin.describe_user_scram_credentials() == {}
        assert [(a.principal, a.operation) for a in admin.describe_acls()] == [
            ("User:mallory", AclOperation.READ)
        ]
        assert {VICTIM, FORGED} <= set(admin.list_topics())
        (now,) = admin.describe_topics([VICTIM])[0].partitions  # still one partition
        assert (now.leader, now.leader_epoch) == (partition.leader, partition.leader_epoch)
        assert sorted(now.replicas) == [1, 2, 3] and not admin.list_partition_reassignments()
        brokers = {b.broker_id: b for b in admin.describe_cluster().brokers}
        assert set(brokers) == {1, 2, 3} and not any(b.decommissioning for b in brokers.values())

    # The Python client and the CLI as mallory: one clear error, at once (not retried).
    folder = launcher.tls_dir(cluster.state.dir)
    mallory = {
        **kwargs,
        "ssl_certificate_location": str(folder / "mallory.pem"),
        "ssl_key_location": str(folder / "mallory.key"),
    }
    # Idempotent: no producer id without IDEMPOTENT_WRITE or WRITE somewhere (KIP-679) ...
    with (
        Producer(cluster.bootstrap, max_block_ms=20_000, **mallory) as producer,
        pytest.raises(ClusterAuthorizationFailedError, match="IDEMPOTENT_WRITE"),
    ):
        producer.send(VICTIM, b"x", partition=0).result(timeout=20)
    # ... and without idempotence the batch itself is refused: READ is not WRITE.
    with (
        Producer(
            cluster.bootstrap, max_block_ms=20_000, enable_idempotence=False, **mallory
        ) as producer,
        pytest.raises(TopicAuthorizationFailedError, match=f"WRITE topic {VICTIM}"),
    ):
        producer.send(VICTIM, b"x", partition=0).result(timeout=20)
    with Consumer(cluster.bootstrap, **mallory) as consumer:
        consumer.assign([TopicPartition(FORGED, 0)])
        with pytest.raises(TopicAuthorizationFailedError, match=f"topic {FORGED}"):
            for _ in range(50):  # raised by the first poll: metadata says no at once
                consumer.poll(timeout_ms=200)
    config = tmp_path / "mallory.properties"
    config.write_text(
        "security.protocol=SSL\n"
        f"ssl.ca.location={folder / 'ca.pem'}\n"
        f"ssl.certificate.location={folder / 'mallory.pem'}\n"
        f"ssl.key.location={folder / 'mallory.key'}\n"
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "minibroker.deploy",
            "topics",
            "delete",
            VICTIM,
            "--bootstrap-server",
            cluster.bootstrap,
            "--command-config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "MINIBROKER_BOOTSTRAP_SERVER"},
    )
    assert run.returncode != 0
    assert f"not authorized to DELETE topic {VICTIM} as User:mallory" in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_quorum_rpcs_only_from_the_controller_they_name(cluster: LocalCluster) -> None:
    """(h) Vote and QuorumFetch from a broker's certificate or mallory's: refused; DescribeQuorum
    still tells anyone who leads (clients find the controller with it), but not the voters'
    progress."""
    (voter,) = cluster.state.controllers
    header = pb.QuorumHeader(sender_id=voter.node_id)

    def epoch() -> int:
        answer = _call(
            cluster, "admin", voter.address, "quorum", "DescribeQuorum", pb.DescribeQuorumRequest()
        )
        return int(answer.leader_epoch)

    before = epoch()
    for who in ("mallory", "broker-1"):
        vote = _call(
            cluster,
            who,
            voter.address,
            "quorum",
            "Vote",
            pb.VoteRequest(header=header, candidate_epoch=1 << 20, candidate_id=voter.node_id),
        )
        assert vote.error_code == pb.CLUSTER_AUTHORIZATION_FAILED, (who, vote)
        fetched = _call(
            cluster,
            who,
            voter.address,
            "quorum",
            "QuorumFetch",
            pb.QuorumFetchRequest(header=header, replica_id=voter.node_id, fetch_offset=0),
        )
        assert fetched.error_code == pb.CLUSTER_AUTHORIZATION_FAILED, (who, fetched)
        assert not fetched.batches
    described = _call(
        cluster, "mallory", voter.address, "quorum", "DescribeQuorum", pb.DescribeQuorumRequest()
    )
    assert described.leader_id == voter.node_id and not described.voters
    assert epoch() == before  # the forged Vote's epoch was not taken up
    assert launcher.active_controller(cluster.state) is not None


def test_a_sasl_header_on_an_ssl_listener_is_unauthenticated(cluster: LocalCluster) -> None:
    """(i) A call that claims a SASL login where the listener takes none ends UNAUTHENTICATED
    with the reason, before its handler runs; the Python client raises it as
    SaslAuthenticationFailedError."""
    from minibroker.client.common.security import SASL_HEADER
    from minibroker.client.errors import SaslAuthenticationFailedError
    from minibroker.client.wire import error_from_rpc

    address = cluster.spec(1).address
    with (
        sync_channel(address, _tls(cluster, "mallory")) as channel,
        pytest.raises(grpc.RpcError) as refused,
    ):
        pb_grpc.BrokerServiceStub(channel).Metadata(
            pb.MetadataRequest(all_topics=True),
            timeout=10,
            metadata=((SASL_HEADER, "PLAIN AGFkbWluAGd1ZXNz"),),
        )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "listener is SSL; SASL needs a SASL_SSL listener" in (refused.value.details() or "")
    assert isinstance(error_from_rpc(refused.value, address), SaslAuthenticationFailedError)
