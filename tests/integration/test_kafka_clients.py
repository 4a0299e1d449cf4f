"""Kafka clients that no one here wrote, against a real cluster's Kafka-protocol listeners
(broker/kafka/): kafka-python (pure Python) and confluent-kafka (librdkafka, C).

Covered: both clients produce with every compression codec (acks=all, idempotent for
librdkafka) and consume what they wrote; records written by a Kafka client are read by our own
Consumer over gRPC, and records written by our Producer are read by both Kafka clients; Metadata
answers give Kafka ports only; ListOffsets; a confluent-kafka idempotent producer rides through a
leader SIGKILL with nothing lost or duplicated and no fatal error; bad input on a Kafka port
(garbage, a truncated frame, an unknown API key, an unsupported version, a frame over
socket.request.max.bytes) gets an error answer or a closed connection, and the broker serves on.
"""

from __future__ import annotations

import io
import json
import pathlib
import re
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import kafka
import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.broker.kafka.handlers import SUPPORTED
from minibroker.client import Admin, Consumer, Producer, TopicPartition

pytestmark = pytest.mark.integration

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
# socket.request.max.bytes on the module's cluster: small, so the test can exceed it cheaply.
MAX_REQUEST_BYTES = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("kafka-clients")
    settings = {"socket.request.max.bytes": str(MAX_REQUEST_BYTES)}
    with local_cluster(str(directory / "cluster"), brokers=3, settings=settings) as c:
        yield c


def create_topic(cluster: LocalCluster, name: str, partitions: int = 3) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(name, partitions, 3, {"min.insync.replicas": "2"})


def consume_confluent(bootstrap: str, topic: str, partitions: int, count: int) -> list[Any]:
    """`count` messages of `topic` from the start of each partition, with confluent-kafka."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",  # assign() only: no group is joined
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
        out: list[Any] = []
        deadline = time.monotonic() + 60
        while len(out) < count:
            assert time.monotonic() < deadline, f"read {len(out)} of {count} messages"
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            out.append(message)
        return out
    finally:
        consumer.close()


def consume_kafka_python(bootstrap: str, topic: str, partitions: int, count: int) -> list[Any]:
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False
    )
    try:
        tps = [kafka.TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        deadline = time.monotonic() + 60
        while len(out) < count:
            assert time.monotonic() < deadline, f"read {len(out)} of {count} messages"
            for records in consumer.poll(timeout_ms=500).values():
                out.extend(records)
        return out
    finally:
        consumer.close()


def read_ours(bootstrap: str, topic: str, partitions: int, count: int) -> list[Any]:
    """`count` records with minibroker's own Consumer (gRPC)."""
    with Consumer(bootstrap) as consumer:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        deadline = time.monotonic() + 60
        while len(out) < count:
            assert time.monotonic() < deadline, f"read {len(out)} of {count} records"
            out.extend(consumer.poll(timeout_ms=500))
        return out


def test_metadata_gives_kafka_ports_only(cluster: LocalCluster) -> None:
    create_topic(cluster, "meta", partitions=2)
    client = kafka.KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        described = client.describe_cluster()
        ports = sorted(b["port"] for b in described["brokers"])
        assert ports == sorted(b.kafka_port for b in cluster.state.brokers)
        grpc_ports = {b.port for b in cluster.state.brokers}
        assert not grpc_ports & set(ports)
        (topic,) = client.describe_topics(["meta"])
        assert topic["error_code"] == 0 and len(topic["partitions"]) == 2
    finally:
        client.close()


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_idempotent_produce_every_codec(cluster: LocalCluster, codec: str) -> None:
    topic = f"ck-{codec}"
    create_topic(cluster, topic)
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": codec,
            "linger.ms": 5,
        }
    )
    errors: list[Any] = []
    for i in range(300):
        producer.produce(
            topic,
            value=f"{codec}-{i}".encode() * 10,
            key=str(i).encode(),
            on_delivery=lambda err, msg: errors.append(err) if err else None,
        )
    assert producer.flush(60) == 0
    assert errors == []
    got = consume_confluent(cluster.kafka_bootstrap, topic, 3, 300)
    assert sorted(m.value() for m in got) == sorted(
        f"{codec}-{i}".encode() * 10 for i in range(300)
    )
    # The same records through minibroker's own client, over gRPC: the same bytes.
    ours = read_ours(cluster.bootstrap, topic, 3, 300)
    assert sorted((r.key, r.value) for r in ours) == sorted(
        (str(i).encode(), f"{codec}-{i}".encode() * 10) for i in range(300)
    )


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_python_produce_and_consume_every_codec(cluster: LocalCluster, codec: str) -> None:
    topic = f"kp-{codec}"
    create_topic(cluster, topic)
    producer = kafka.KafkaProducer(
        bootstrap_servers=cluster.kafka_bootstrap,
        acks="all",
        compression_type=None if codec == "none" else codec,
        enable_idempotence=True,
    )
    futures = [producer.send(topic, f"{codec}:{i}".encode(), partition=i % 3) for i in range(200)]
    offsets = [f.get(timeout=30) for f in futures]
    producer.close()
    assert all(md.offset >= 0 for md in offsets)
    got = consume_kafka_python(cluster.kafka_bootstrap, topic, 3, 200)
    assert sorted(r.value for r in got) == sorted(f"{codec}:{i}".encode() for i in range(200))
    ours = read_ours(cluster.bootstrap, topic, 3, 200)
    assert sorted(r.value for r in ours) == sorted(r.value for r in got)


@pytest.mark.parametrize("acks", [0, 1])
def test_kafka_python_acks_zero_and_one(cluster: LocalCluster, acks: int) -> None:
    topic = f"acks-{acks}"
    create_topic(cluster, topic, partitions=1)
    producer = kafka.KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks=acks)
    for i in range(50):
        producer.send(topic, str(i).encode(), partition=0)
    producer.flush(30)
    producer.close()
    got = read_ours(cluster.bootstrap, topic, 1, 50)
    assert [r.value for r in got] == [str(i).encode() for i in range(50)]


def test_our_producer_is_read_by_both_kafka_clients(cluster: LocalCluster) -> None:
    topic = "from-ours"
    create_topic(cluster, topic)
    with Producer(cluster.bootstrap, compression_type="lz4") as producer:
        for i in range(120):
            producer.send(topic, f"ours-{i}".encode(), key=b"k", partition=i % 3)
        producer.flush()
    expected = sorted(f"ours-{i}".encode() for i in range(120))
    ck = consume_confluent(cluster.kafka_bootstrap, topic, 3, 120)
    assert sorted(m.value() for m in ck) == expected
    assert {m.key() for m in ck} == {b"k"}
    kp = consume_kafka_python(cluster.kafka_bootstrap, topic, 3, 120)
    assert sorted(r.value for r in kp) == expected
    # Offsets as our client sees them: ListOffsets through the Kafka port.
    consumer = kafka.KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        tps = [kafka.TopicPartition(topic, p) for p in range(3)]
        assert sum(consumer.end_offsets(tps).values()) == 120
        assert set(consumer.beginning_offsets(tps).values()) == {0}
    finally:
        consumer.close()


# -- bad input on the Kafka port ----------------------------------------------------------------


def kafka_address(cluster: LocalCluster, node_id: int = 1) -> tuple[str, int]:
    spec = cluster.spec(node_id)
    return spec.host, spec.kafka_port


def api_versions_v0(correlation_id: int, version: int = 0) -> bytes:
    """An ApiVersions request (v0 has an empty body) at `version`, with header v1."""
    client_id = b"raw"
    body = struct.pack(">hhih", 18, version, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


def answered(sock: socket.socket) -> bytes | None:
    """The next response frame (without its size), or None when the server closed."""
    head = recv_exactly(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    return recv_exactly(sock, size)


def recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def still_serves(cluster: LocalCluster, node_id: int = 1) -> None:
    """A fresh connection gets an ApiVersions answer, and a Kafka client gets metadata."""
    with socket.create_connection(kafka_address(cluster, node_id), timeout=10) as sock:
        sock.sendall(api_versions_v0(5))
        frame = answered(sock)
        assert frame is not None
        correlation_id, error = struct.unpack_from(">ih", frame)
        assert (correlation_id, error) == (5, 0)
    producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap})
    try:
        brokers = producer.list_topics(timeout=10).brokers
        assert sorted(b.port for b in brokers.values()) == sorted(
            b.kafka_port for b in cluster.state.brokers
        )
    finally:
        producer.flush(1)


BAD_INPUT = {
    "garbage": b"\x00\x00\x00\x10" + b"\xde\xad\xbe\xef" * 4,
    "unknown api key": struct.pack(">ihhih", 10, 31999, 0, 1, 0),
    "unsupported produce version": struct.pack(">ihhih", 10, 0, 1, 1, 0),
    "over socket.request.max.bytes": struct.pack(">i", MAX_REQUEST_BYTES + 1) + b"\0" * 1024,
    "negative size": struct.pack(">i", -1),
}


@pytest.mark.parametrize("what", list(BAD_INPUT))
def test_bad_input_closes_the_connection_and_the_broker_serves_on(
    cluster: LocalCluster, what: str
) -> None:
    with socket.create_connection(kafka_address(cluster), timeout=10) as sock:
        sock.sendall(BAD_INPUT[what])
        assert answered(sock) is None, f"{what}: answered instead of closed"
    still_serves(cluster)


def test_a_truncated_frame_closes_the_connection(cluster: LocalCluster) -> None:
    with socket.create_connection(kafka_address(cluster), timeout=10) as sock:
        frame = api_versions_v0(3)
        sock.sendall(frame[:-3])
        sock.shutdown(socket.SHUT_WR)
        assert answered(sock) is None
    still_serves(cluster)


def test_unsupported_api_versions_version_gets_the_supported_list(cluster: LocalCluster) -> None:
    with socket.create_connection(kafka_address(cluster), timeout=10) as sock:
        sock.sendall(api_versions_v0(11, version=99))
        frame = answered(sock)
        assert frame is not None
        correlation_id, error, count = struct.unpack_from(">ihi", frame)
        assert (correlation_id, error) == (11, 35)  # UNSUPPORTED_VERSION, at v0
        keys = {struct.unpack_from(">hhh", frame, 10 + 6 * i)[0] for i in range(count)}
        assert set(SUPPORTED) == keys  # every API served, the group APIs too
        # The connection stays open: a v0 request now is answered on it.
        sock.sendall(api_versions_v0(12))
        again = answered(sock)
        assert again is not None and struct.unpack_from(">ih", again) == (12, 0)
    still_serves(cluster)


def test_kafka_admin_clients_create_and_delete_topics(cluster: LocalCluster) -> None:
    """CreateTopics and DeleteTopics on the Kafka port, forwarded to the controller."""
    from confluent_kafka.admin import AdminClient, NewTopic

    ck_admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    # DescribeCluster: the brokers at their Kafka ports.
    described_cluster = ck_admin.describe_cluster(request_timeout=30).result(timeout=60)
    assert sorted(n.port for n in described_cluster.nodes) == sorted(
        b.kafka_port for b in cluster.state.brokers
    )
    futures = ck_admin.create_topics(
        [NewTopic("adm-ck", 3, 3, config={"retention.ms": "600000"})], operation_timeout=30
    )
    futures["adm-ck"].result(timeout=60)
    again = ck_admin.create_topics([NewTopic("adm-ck", 3, 3)], operation_timeout=30)
    with pytest.raises(confluent_kafka.KafkaException) as err:
        again["adm-ck"].result(timeout=60)
    assert err.value.args[0].code() == confluent_kafka.KafkaError.TOPIC_ALREADY_EXISTS
    kp_admin = kafka.KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        kp_admin.create_topics([kafka.admin.NewTopic("adm-kp", 2, 3)], timeout_ms=30000)
        with Admin(cluster.bootstrap) as admin:
            wait_until(lambda: {"adm-ck", "adm-kp"} <= set(admin.list_topics()), 20, "both topics")
            described = {d.name: d for d in admin.describe_topics(["adm-ck", "adm-kp"])}
            assert len(described["adm-ck"].partitions) == 3
            assert len(described["adm-kp"].partitions) == 2
            assert {len(p.replicas) for p in described["adm-kp"].partitions} == {3}
            kp_admin.delete_topics(["adm-kp"], timeout_ms=30000)
            ck_admin.delete_topics(["adm-ck"], operation_timeout=30)["adm-ck"].result(timeout=60)
            wait_until(lambda: not {"adm-ck", "adm-kp"} & set(admin.list_topics()), 20, "deletions")
    finally:
        kp_admin.close()


def test_offset_for_leader_epoch_answers_the_epoch_end(cluster: LocalCluster) -> None:
    """An OffsetForLeaderEpoch v4 request written with kio, answered by the partition's leader."""
    from kio.schema.offset_for_leader_epoch.v4 import request as req
    from kio.schema.offset_for_leader_epoch.v4.response import OffsetForLeaderEpochResponse
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.schema.response_header.v1.header import ResponseHeader
    from kio.serial import entity_reader, entity_writer
    from kio.static.primitive import i16, i32

    create_topic(cluster, "epochs", partitions=1)
    with Producer(cluster.bootstrap) as producer:
        for i in range(7):
            producer.send("epochs", str(i).encode(), partition=0)
        producer.flush()
    with Admin(cluster.bootstrap) as admin:
        partition = admin.describe_topics(["epochs"])[0].partitions[0]
    buffer = io.BytesIO()
    entity_writer(RequestHeader)(
        buffer,
        RequestHeader(
            request_api_key=i16(23),
            request_api_version=i16(4),
            correlation_id=i32(77),
            client_id="test",
        ),
    )
    entity_writer(req.OffsetForLeaderEpochRequest)(
        buffer,
        req.OffsetForLeaderEpochRequest(
            replica_id=i32(-1),
            topics=(
                req.OffsetForLeaderTopic(
                    topic="epochs",
                    partitions=(
                        req.OffsetForLeaderPartition(
                            partition=i32(0),
                            current_leader_epoch=i32(partition.leader_epoch),
                            leader_epoch=i32(partition.leader_epoch),
                        ),
                    ),
                ),
            ),
        ),
    )
    payload = buffer.getvalue()
    with socket.create_connection(kafka_address(cluster, partition.leader), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        frame = answered(sock)
    assert frame is not None
    header, used = entity_reader(ResponseHeader)(frame, 0)
    body, _ = entity_reader(OffsetForLeaderEpochResponse)(frame, used)
    assert header.correlation_id == 77
    (result,) = body.topics[0].partitions
    assert (int(result.error_code), result.leader_epoch, result.end_offset) == (
        0,
        partition.leader_epoch,
        7,
    )


KCAT = shutil.which("kcat")


@pytest.mark.skipif(
    KCAT is None, reason="kcat is not installed (Debian: apt-get install -y kcat; .ci/run does)"
)
def test_kcat_produces_lists_and_consumes(cluster: LocalCluster) -> None:
    assert KCAT is not None
    create_topic(cluster, "kcat", partitions=1)
    lines = "".join(f"key{i}:value{i}\n" for i in range(20))
    subprocess.run(
        [
            KCAT,
            "-b",
            cluster.kafka_bootstrap,
            "-P",
            "-t",
            "kcat",
            "-p",
            "0",
            "-K",
            ":",
            "-z",
            "snappy",
            "-X",
            "enable.idempotence=true",
        ],
        input=lines.encode(),
        check=True,
        timeout=60,
    )
    listing = subprocess.run(
        [KCAT, "-b", cluster.kafka_bootstrap, "-L", "-t", "kcat", "-J"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    metadata = json.loads(listing.stdout)
    assert sorted(int(b["name"].rsplit(":", 1)[1]) for b in metadata["brokers"]) == sorted(
        b.kafka_port for b in cluster.state.brokers
    )
    consumed = subprocess.run(
        [
            KCAT,
            "-b",
            cluster.kafka_bootstrap,
            "-C",
            "-t",
            "kcat",
            "-o",
            "beginning",
            "-e",
            "-f",
            "%k=%s@%o\n",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert consumed.stdout.decode().splitlines() == [f"key{i}=value{i}@{i}" for i in range(20)]
    ours = read_ours(cluster.bootstrap, "kcat", 1, 20)
    assert [(r.key, r.value) for r in ours] == [
        (f"key{i}".encode(), f"value{i}".encode()) for i in range(20)
    ]


def test_bench_kafka_reports_both_paths(cluster: LocalCluster) -> None:
    """`minibroker bench kafka` on the module's cluster: four rows, every record counted."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "minibroker.deploy",
            "bench",
            "kafka",
            "--dir",
            cluster.directory,
            "--num-records",
            "300",
            "--record-size",
            "1024",
            "--json",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    rows = json.loads(result.stdout)["rows"]
    assert [(r["phase"], r["client"], r["port"]) for r in rows] == [
        ("produce", "confluent-kafka", "kafka"),
        ("produce", "minibroker", "grpc"),
        ("consume", "confluent-kafka", "kafka"),
        ("consume", "minibroker", "grpc"),
    ]
    assert all(r["records"] == 300 and r["records_per_s"] > 0 for r in rows)


def requests_seen(cluster: LocalCluster) -> dict[tuple[str, int], float]:
    """Every broker's kafka_network_RequestMetrics_RequestsPerSec, summed, by (API, version)."""
    seen: dict[tuple[str, int], float] = {}
    pattern = re.compile(
        r'^kafka_network_RequestMetrics_RequestsPerSec_total\{request="(\w+)",version="(\d+)"\} '
        r"(\S+)$",
        re.M,
    )
    for spec in cluster.state.brokers:
        url = f"http://{spec.host}:{spec.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        for name, version, value in pattern.findall(text):
            key = (name, int(version))
            seen[key] = seen.get(key, 0.0) + float(value)
    return seen


def test_the_clients_spoke_the_highest_advertised_versions(cluster: LocalCluster) -> None:
    """After the tests above (same module cluster): librdkafka and kafka-python negotiated the
    top of each advertised range, so those versions are the ones exercised end to end."""
    seen = requests_seen(cluster)
    for api, version in [
        ("api_versions", 3),
        ("metadata", 12),
        ("produce", 9),
        ("fetch", 12),
        ("init_producer_id", 4),
        ("list_offsets", 7),
    ]:
        assert seen.get((api, version), 0) > 0, f"no {api} v{version} request: {sorted(seen)}"


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


def test_confluent_idempotent_producer_survives_a_leader_sigkill(
    failover_cluster: LocalCluster,
) -> None:
    cluster = failover_cluster
    create_topic(cluster, "failover", partitions=1)
    with Admin(cluster.bootstrap) as admin:
        wait_until(
            lambda: len(admin.describe_topics(["failover"])[0].partitions[0].isr) == 3,
            20,
            "a full ISR",
        )
        leader = admin.describe_topics(["failover"])[0].partitions[0].leader
    fatal: list[Any] = []
    failed: list[Any] = []
    acked: list[bytes] = []
    lock = threading.Lock()

    def on_error(err: Any) -> None:
        if err.fatal():
            fatal.append(err)

    def on_delivery(err: Any, msg: Any) -> None:
        with lock:
            (failed if err else acked).append(err or msg.value())

    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            "message.timeout.ms": 120000,
            "error_cb": on_error,
        }
    )
    sent = 0

    def produce_until(target: int) -> None:
        nonlocal sent
        while sent < target:
            producer.produce("failover", value=f"m{sent:06d}".encode(), on_delivery=on_delivery)
            sent += 1
            producer.poll(0)

    produce_until(500)
    wait_until(lambda: producer.poll(0.1) >= 0 and len(acked) >= 300, 30, "300 acks before")
    cluster.kill(leader)
    produce_until(2000)
    assert producer.flush(120) == 0, "messages still in flight two minutes after the kill"
    assert fatal == [], f"librdkafka raised a fatal error: {fatal}"
    assert failed == []
    expected = [f"m{i:06d}".encode() for i in range(2000)]
    assert sorted(acked) == expected
    # Every acknowledged record once, in order (idempotence: no duplicate, no gap).
    survivors = [b for b in cluster.state.brokers if b.node_id != leader]
    bootstrap = ",".join(b.address for b in survivors)
    with Consumer(bootstrap) as consumer:
        tp = TopicPartition("failover", 0)
        assert consumer.end_offsets([tp])[tp] == 2000, "duplicates or losses in the log"
    got = [r.value for r in read_ours(bootstrap, "failover", 1, 2000)]
    assert got == expected
