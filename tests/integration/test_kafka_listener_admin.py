"""The Kafka port's admin APIs and limits with clients no one here wrote, one module cluster
(test_kafka_clients.py has produce/consume and bad input): confluent-kafka's and kafka-python's
admin clients grow a topic (CreatePartitions), read and change its configs (DescribeConfigs,
IncrementalAlterConfigs) and run a preferred election (ElectLeaders); aiokafka produces and
consumes with every codec; kcat reads records written by our own Producer; max.connections
refuses a Kafka connection past it; a failed acks=0 produce closes its connection; a leader
without a Kafka port is answered as leader -1 (last on the module cluster: it restarts broker 3
without one); a kafka-python producer and an aiokafka idempotent producer write through a leader
SIGKILL with nothing they were acknowledged lost (each on a cluster of its own)."""

from __future__ import annotations

import asyncio
import io
import pathlib
import re
import shutil
import socket
import struct
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import kafka
import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
)
from kafka.admin import ConfigResource as KPConfigResource
from kafka.admin import ConfigResourceType as KPConfigResourceType
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_writer
from kio.static.primitive import i16, i32

from minibroker.broker.kafka import codec
from minibroker.broker.kafka.admin_handlers import ADMIN_SUPPORTED, ELECT_LEADERS
from minibroker.client import Admin, Consumer, Producer, TopicPartition
from minibroker.deploy import cluster as launcher

pytestmark = pytest.mark.integration

MAX_CONNECTIONS = 40
PRODUCE_KEY = 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("kafka-admin")
    settings = {"max.connections": str(MAX_CONNECTIONS)}
    with local_cluster(str(directory / "cluster"), brokers=3, settings=settings) as c:
        yield c


def create_topic(cluster: LocalCluster, name: str, partitions: int = 1) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(name, partitions, 3, {"min.insync.replicas": "2"})


def partition_count(cluster: LocalCluster, topic: str) -> int:
    with Admin(cluster.bootstrap) as admin:
        return len(admin.describe_topics([topic])[0].partitions)


def test_confluent_admin_partitions_configs_and_elections(cluster: LocalCluster) -> None:
    create_topic(cluster, "ck-admin")
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    # CreatePartitions: 1 -> 3; then asking for fewer is Kafka's INVALID_PARTITIONS.
    admin.create_partitions([NewPartitions("ck-admin", 3)])["ck-admin"].result(30)
    wait_until(lambda: partition_count(cluster, "ck-admin") == 3, 20, "three partitions")
    with pytest.raises(confluent_kafka.KafkaException) as refused:
        admin.create_partitions([NewPartitions("ck-admin", 2)])["ck-admin"].result(30)
    assert refused.value.args[0].code() == confluent_kafka.KafkaError.INVALID_PARTITIONS
    # IncrementalAlterConfigs, then DescribeConfigs shows it as a dynamic topic config.
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        "ck-admin",
        incremental_configs=[
            ConfigEntry("retention.ms", "123456", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([resource])[resource].result(30)
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "ck-admin")])
    configs = next(iter(described.values())).result(30)
    retention = configs["retention.ms"]
    assert retention.value == "123456"
    assert retention.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["min.insync.replicas"].value == "2"
    bad = ConfigResource(
        ConfigResource.Type.TOPIC,
        "ck-admin",
        incremental_configs=[
            ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(confluent_kafka.KafkaException) as invalid:
        admin.incremental_alter_configs([bad])[bad].result(30)
    assert invalid.value.args[0].code() == confluent_kafka.KafkaError.INVALID_CONFIG
    # A broker resource: its static configs.
    broker = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "1")])
    assert next(iter(broker.values())).result(30)
    # ElectLeaders, preferred: the leaders are the preferred ones already.
    future = admin.elect_leaders(
        confluent_kafka.ElectionType.PREFERRED,
        [confluent_kafka.TopicPartition("ck-admin", 0)],
    )
    results = future.result(30)
    (error,) = results.values()
    assert error is None or error.code() == confluent_kafka.KafkaError.ELECTION_NOT_NEEDED


# kafka-python as a current client and as older ones (api_version pins the broker version it
# assumes): the older ones ask the lower versions advertised. Before 2.3 it would alter configs
# with AlterConfigs (not served: current kafka-python and librdkafka use the incremental API).
KP_VERSIONS = [None, (2, 6, 0), (2, 4, 0), (2, 3, 0), (2, 2, 0), (1, 1, 0)]
INCREMENTAL_SINCE = (2, 3, 0)
UNCLEAN_SINCE = (2, 4, 0)  # ElectLeaders v1 (election types); v0 is preferred only


@pytest.mark.parametrize("api_version", KP_VERSIONS, ids=str)
def test_kafka_python_admin_partitions_configs_and_elections(
    cluster: LocalCluster, api_version: tuple[int, ...] | None
) -> None:
    topic = f"kp-admin-{KP_VERSIONS.index(api_version)}"
    create_topic(cluster, topic)
    newer = api_version or (9, 9, 9)
    client = kafka.KafkaAdminClient(
        bootstrap_servers=cluster.kafka_bootstrap, api_version=api_version
    )
    try:
        client.create_partitions({topic: 4})
        wait_until(lambda: partition_count(cluster, topic) == 4, 20, "four partitions")
        if newer >= INCREMENTAL_SINCE:
            resource = KPConfigResource(
                KPConfigResourceType.TOPIC, topic, configs={"retention.ms": "654321"}
            )
            answer = client.alter_configs([resource])
            assert answer, answer
        described = client.describe_configs(
            [KPConfigResource(KPConfigResourceType.TOPIC, topic)], config_filter="all"
        )
        flat = repr(described)
        assert "654321" in flat if newer >= INCREMENTAL_SINCE else "retention.ms" in flat, flat
        if newer >= (2, 2, 0):
            # Unclean (preferred before v1) on a partition with a full ISR: nothing to do.
            kind = 1 if newer >= UNCLEAN_SINCE else 0
            response = client.elect_leaders(kind, {topic: [0]}, raise_errors=False)
            codes = [
                p.error_code for r in response.replica_election_results for p in r.partition_result
            ]
            assert codes and set(codes) <= {0, 84}, response  # NONE or ELECTION_NOT_NEEDED
    finally:
        client.close()


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_aiokafka_produces_and_consumes(cluster: LocalCluster, codec: str) -> None:
    import aiokafka

    topic = f"aio-{codec}"
    create_topic(cluster, topic, partitions=2)
    count = 200

    async def run() -> list[Any]:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap,
            acks="all",
            enable_idempotence=True,
            compression_type=codec,
        )
        await producer.start()
        try:
            for i in range(count):
                await producer.send(topic, f"v{i}".encode(), key=f"k{i}".encode(), partition=i % 2)
            await producer.flush()
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=cluster.kafka_bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            consumer.assign([aiokafka.TopicPartition(topic, p) for p in (0, 1)])
            out: list[Any] = []
            deadline = time.monotonic() + 60
            while len(out) < count:
                assert time.monotonic() < deadline, f"read {len(out)} of {count}"
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    out.extend(records)
            return out
        finally:
            await consumer.stop()

    got = asyncio.run(run())
    assert sorted((r.key, r.value) for r in got) == sorted(
        (f"k{i}".encode(), f"v{i}".encode()) for i in range(count)
    )
    # What aiokafka wrote, read by our own client over gRPC.
    with Consumer(cluster.bootstrap) as consumer:
        tps = [TopicPartition(topic, p) for p in (0, 1)]
        ends = consumer.end_offsets(tps)
        assert sum(ends.values()) == count


KCAT = shutil.which("kcat")


@pytest.mark.skipif(
    KCAT is None, reason="kcat is not installed (Debian: apt-get install -y kcat; .ci/run does)"
)
def test_kcat_reads_what_our_producer_wrote(cluster: LocalCluster) -> None:
    assert KCAT is not None
    create_topic(cluster, "ours-kcat")
    with Producer(cluster.bootstrap) as producer:
        for i in range(30):
            producer.send("ours-kcat", f"v{i}".encode(), key=f"k{i}".encode(), partition=0)
        producer.flush()
    kcat_read = [KCAT, "-b", cluster.kafka_bootstrap, "-C", "-t", "ours-kcat", "-o", "beginning"]
    kcat_read += ["-e", "-f", "%k=%s@%o\n"]
    consumed = subprocess.run(
        kcat_read,
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert consumed.stdout.decode().splitlines() == [f"k{i}=v{i}@{i}" for i in range(30)]


def test_max_connections_refuses_a_kafka_connection_past_it(cluster: LocalCluster) -> None:
    spec = cluster.state.brokers[2]
    address = (spec.host, spec.kafka_port)
    held = [socket.create_connection(address, timeout=5) for _ in range(MAX_CONNECTIONS + 5)]
    try:
        refused: set[int] = set()

        def five_refused() -> bool:
            for i, sock in enumerate(held):
                if i in refused:
                    continue
                sock.setblocking(False)
                try:
                    if sock.recv(1) == b"":
                        refused.add(i)
                except BlockingIOError:
                    pass  # open: the broker waits for a request
                except ConnectionResetError:
                    refused.add(i)
            return len(refused) >= 5

        wait_until(five_refused, 10, "the connections past max.connections refused")
        closed = len(refused)
        # Kafka clients of the tests before may still hold a connection or two.
        assert 5 <= closed <= 5 + 3, f"{closed} of {len(held)} connections refused"
    finally:
        for sock in held:
            sock.close()
    # The slots free again: a Kafka client is served.
    client = kafka.KafkaAdminClient(bootstrap_servers=f"{address[0]}:{address[1]}")
    try:
        assert client.describe_cluster()["brokers"]
    finally:
        client.close()


def kafka_request(api_key: int, version: int, correlation_id: int, **body: Any) -> bytes:
    """A size-prefixed request frame written by kio, as a Kafka client writes it."""
    cls = codec.request_class(api_key, version)
    header_cls = RequestHeaderV2 if cls.__flexible__ else RequestHeaderV1
    buffer = io.BytesIO()
    entity_writer(header_cls)(
        buffer,
        header_cls(
            request_api_key=i16(api_key),
            request_api_version=i16(version),
            correlation_id=i32(correlation_id),
            client_id="raw",
        ),
    )
    entity_writer(cls)(buffer, codec.make(cls, **body))
    payload = buffer.getvalue()
    return struct.pack(">i", len(payload)) + payload


def test_a_failed_acks_zero_produce_closes_the_connection(cluster: LocalCluster) -> None:
    """acks=0 to a broker that does not lead the partition: no answer, and the connection
    closed after the answers before it (Kafka's way of telling the producer)."""
    create_topic(cluster, "acks-zero")
    with Admin(cluster.bootstrap) as admin:
        leader = admin.describe_topics(["acks-zero"])[0].partitions[0].leader
    other = next(b for b in cluster.state.brokers if b.node_id != leader)
    module = __import__(codec.request_class(PRODUCE_KEY, 9).__module__, fromlist=["_"])
    produce = kafka_request(
        PRODUCE_KEY,
        9,
        2,
        transactional_id=None,
        acks=0,
        timeout=5000,
        topic_data=(
            codec.make(
                module.TopicProduceData,
                name="acks-zero",
                partition_data=(codec.make(module.PartitionProduceData, index=0, records=b"x"),),
            ),
        ),
    )
    with socket.create_connection((other.host, other.kafka_port), timeout=10) as sock:
        versions = struct.pack(">hhih", 18, 0, 1, 3) + b"raw"
        sock.sendall(struct.pack(">i", len(versions)) + versions + produce)
        head = sock.recv(4)
        (size,) = struct.unpack(">i", head)
        answer = b""
        while len(answer) < size:
            answer += sock.recv(size - len(answer))
        assert struct.unpack_from(">ih", answer) == (1, 0)  # ApiVersions answered first
        try:
            assert sock.recv(1) == b"", "answered a failed acks=0 produce"
        except ConnectionResetError:
            pass


def test_the_admin_clients_spoke_every_advertised_admin_version(cluster: LocalCluster) -> None:
    """After the tests above: each advertised version of the admin APIs was asked by a real
    client (kafka-python pinned to older brokers asks the lower ones), ElectLeaders v1 aside:
    no Kafka release had it as its newest (2.4 brought v1 and v2), so no client asks it (the
    unit tests read and answer it)."""
    seen: set[tuple[str, int]] = set()
    pattern = re.compile(
        r'^kafka_network_RequestMetrics_RequestsPerSec_total\{request="(\w+)",version="(\d+)"\} '
        r"(\S+)$",
        re.M,
    )
    for spec in cluster.state.brokers:
        url = f"http://{spec.host}:{spec.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        seen |= {(name, int(v)) for name, v, count in pattern.findall(text) if float(count) > 0}
    for key, (low, high) in ADMIN_SUPPORTED.items():
        name = codec.api_name(key)
        for version in range(low, high + 1):
            if (key, version) == (ELECT_LEADERS, 1):
                continue
            assert (name, version) in seen, f"no {name} v{version} request: {sorted(seen)}"


def test_a_leader_without_a_kafka_port_is_answered_as_leader_minus_one(
    cluster: LocalCluster,
) -> None:
    """Broker 3 restarted without kafka.listeners (last test on this cluster): a Kafka client's
    Metadata gives its partitions leader -1 with LEADER_NOT_AVAILABLE, never broker 3's id
    (which it has no address for)."""
    cluster.stop(3)
    state = launcher.load_state(cluster.directory)
    assert state is not None
    state.find("3").kafka_port = 0
    launcher.save_state(state)
    cluster.start(3)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("no-kafka-leader", 6, 1)
        wait_until(
            lambda: any(
                p.leader == 3 for p in admin.describe_topics(["no-kafka-leader"])[0].partitions
            ),
            20,
            "a partition led by broker 3",
        )
        led = {
            p.partition: p.leader for p in admin.describe_topics(["no-kafka-leader"])[0].partitions
        }
    client = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    topic = client.list_topics("no-kafka-leader", timeout=10).topics["no-kafka-leader"]
    assert 3 not in client.list_topics(timeout=10).brokers
    for index, partition in topic.partitions.items():
        if led[index] == 3:
            assert partition.leader == -1, (index, partition)
            assert partition.error.code() == confluent_kafka.KafkaError.LEADER_NOT_AVAILABLE
        else:
            assert partition.leader == led[index] and partition.error is None, (index, partition)


# -- failover -----------------------------------------------------------------------------------


@pytest.fixture
def failover_cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    settings = {
        "replica.lag.time.max.ms": "1500",
        "broker.session.timeout.ms": "2500",
        "leader.imbalance.check.interval.seconds": "3600",
    }
    with local_cluster(str(tmp_path / "cluster"), brokers=3, settings=settings) as c:
        yield c


def values_on_survivors(cluster: LocalCluster, killed: int, topic: str) -> list[bytes]:
    """Every value of `topic`'s partition 0, read from its start to its end by our Consumer
    from the brokers other than `killed`."""
    survivors = [b for b in cluster.state.brokers if b.node_id != killed]
    with Consumer(",".join(b.address for b in survivors)) as consumer:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < end:
            assert time.monotonic() < deadline, f"read {len(got)} of {end}"
            got.extend(r.value for r in consumer.poll(timeout_ms=500) if r.value is not None)
    return got


def test_kafka_python_producer_loses_nothing_acknowledged_through_a_leader_sigkill(
    failover_cluster: LocalCluster,
) -> None:
    cluster = failover_cluster
    create_topic(cluster, "kp-failover")
    with Admin(cluster.bootstrap) as admin:
        wait_until(
            lambda: len(admin.describe_topics(["kp-failover"])[0].partitions[0].isr) == 3,
            20,
            "a full ISR",
        )
        leader = admin.describe_topics(["kp-failover"])[0].partitions[0].leader
    producer = kafka.KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap,
        acks="all",
        retries=1000,
        retry_backoff_ms=100,
        request_timeout_ms=5000,
        delivery_timeout_ms=120000,
        linger_ms=2,
        max_in_flight_requests_per_connection=1,
    )
    acked: list[bytes] = []
    failed: list[Exception] = []
    futures = []
    acked_before_kill = -1
    try:
        for i in range(1500):
            value = f"m{i:06d}".encode()
            future = producer.send("kp-failover", value, partition=0)
            future.add_callback(lambda _meta, v=value: acked.append(v))
            future.add_errback(failed.append)
            futures.append(future)
            if i == 500:
                wait_until(lambda: len(acked) >= 300, 30, "300 acks before the kill")
                cluster.kill(leader)
                acked_before_kill = len(acked)
        producer.flush(120)
    finally:
        producer.close(10)
    assert failed == [], failed[:3]
    assert len(acked) == 1500 and acked_before_kill < 1500
    with Admin(",".join(b.address for b in cluster.state.brokers if b.node_id != leader)) as admin:
        assert admin.describe_topics(["kp-failover"])[0].partitions[0].leader != leader
    got = values_on_survivors(cluster, leader, "kp-failover")
    assert set(acked) <= set(got), "an acknowledged record is missing"


def test_aiokafka_producer_loses_nothing_acknowledged_through_a_leader_sigkill(
    failover_cluster: LocalCluster,
) -> None:
    """aiokafka's idempotent producer through a SIGKILL of the partition's leader: every
    send it acknowledged is in the log the survivors serve, and none failed."""
    import aiokafka

    cluster = failover_cluster
    topic = "aio-failover"
    create_topic(cluster, topic)
    with Admin(cluster.bootstrap) as admin:
        wait_until(
            lambda: len(admin.describe_topics([topic])[0].partitions[0].isr) == 3,
            20,
            "a full ISR",
        )
        leader = admin.describe_topics([topic])[0].partitions[0].leader
    acked: list[bytes] = []
    total = 1200

    async def run() -> list[BaseException]:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=2,
            request_timeout_ms=5000,
            retry_backoff_ms=100,
        )
        await producer.start()
        futures: list[tuple[bytes, asyncio.Future[Any]]] = []
        try:
            for i in range(total):
                value = f"a{i:06d}".encode()
                futures.append((value, await producer.send(topic, value, partition=0)))
                if i == 400:
                    deadline = time.monotonic() + 30
                    while sum(f.done() for _, f in futures) < 200:
                        assert time.monotonic() < deadline, "200 acks before the kill"
                        await asyncio.sleep(0.02)
                    cluster.kill(leader)
            results = await asyncio.gather(*(f for _, f in futures), return_exceptions=True)
        finally:
            await producer.stop()
        failures: list[BaseException] = []
        for (value, _), result in zip(futures, results, strict=True):
            if isinstance(result, BaseException):
                failures.append(result)
            else:
                acked.append(value)
        return failures

    failures = asyncio.run(run())
    assert failures == [], failures[:3]
    assert len(acked) == total
    got = values_on_survivors(cluster, leader, topic)
    assert set(acked) <= set(got), "an acknowledged record is missing"
    assert len(got) == len(set(got)), "a record was written twice (idempotence)"
