"""Connection and memory limits of the real broker and controller processes (issue 11 item 7).

What a hostile or careless client could do before: thousands of idle connections made a broker
and the controller unreachable for new clients, and four 200 MB produce requests held 1.5 GB of a
broker. Here, against processes on 127.0.0.1:

- with `max.connections` reached by idle sockets, a new client is refused at once (UNAVAILABLE)
  while a client that was already connected keeps working, and new clients connect again once
  the idle sockets are gone; on the broker and on the controller (whose brokers stay unfenced);
- a produce request over `socket.request.max.bytes` is refused with RECORD_LIST_TOO_LARGE on the
  client, and four concurrent 200 MB requests do not grow the broker's peak RSS by more than a
  fraction of one of them;
- produce requests held by a paused follower (acks=all) fill `queued.max.request.bytes`; the
  broker then reads no more of them, so its peak RSS stays far below what was sent, and every
  request is still answered once the ISR shrinks;
- `connections.max.idle.ms` closes idle request streams, connections and half-open sockets, and
  a producer and a consumer that were idle carry on without an error.

RSS is read from /proc (VmHWM, the peak, so nothing has to be sampled at the right moment). The
bounds are generous: each assertion fails by a wide margin with the limit removed (checked by
hand: 1.5-2 GB for the 200 MB requests, ~700 MB for the held ones).
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.client import Admin, Consumer, Producer, TopicPartition
from minibroker.client.errors import RecordListTooLargeError
from minibroker.client.records import encode_batch
from minibroker.client.stream import RequestStream
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
TOPIC = "limits"

# A new client in its own process (connections are shared between channels of one process):
# one Metadata call to a broker or one DescribeCluster to the controller, 3 s deadline.
NEW_CLIENT = """
import sys, grpc
from minibroker.proto import minibroker_pb2 as pb, minibroker_pb2_grpc as pb_grpc
kind, address = sys.argv[1], sys.argv[2]
channel = grpc.insecure_channel(address)
try:
    if kind == "broker":
        pb_grpc.BrokerServiceStub(channel).Metadata(pb.MetadataRequest(), timeout=3)
    else:
        pb_grpc.ControllerServiceStub(channel).DescribeCluster(
            pb.DescribeClusterRequest(), timeout=3
        )
    print("ok")
except grpc.RpcError as err:
    print(err.code().name, err.details())
"""


def new_client(kind: str, address: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", NEW_CLIENT, kind, address],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def status_kb(pid: int, field: str) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for pid {pid}")


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the server has closed `sock` (EOF or reset); data it sent is skipped."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def open_sockets(port: int, count: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(count)]


def established_to(port: int) -> int:
    """TCP connections of this process to 127.0.0.1:`port` that are still established."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for line in pathlib.Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].rsplit(":", 1)[1], 16)
        if remote_port == port and fields[3] == "01" and fields[9] in inodes:
            count += 1
    return count


@pytest.fixture
def capped(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    settings = {"max.connections": "50", "leader.imbalance.check.interval.seconds": "3600"}
    with local_cluster(str(tmp_path / "cluster"), brokers=1, settings=settings) as c:
        yield c


@pytest.mark.parametrize("target", ["broker", "controller"])
def test_idle_connections_up_to_max_connections_lock_out_new_clients_only(
    capped: LocalCluster, target: str
) -> None:
    spec = capped.state.brokers[0] if target == "broker" else capped.state.controller
    with Admin(capped.bootstrap) as admin, Producer(capped.bootstrap, acks="all") as producer:
        admin.create_topic(TOPIC, 1, 1)  # the admin's connection to the controller stays open
        assert producer.send(TOPIC, b"before").result(timeout=30).offset == 0
        assert new_client(target, spec.address) == "ok"

        idle = open_sockets(spec.port, 60)
        try:
            # Past the cap grpc closes each new connection at once; the ones below it stay.
            wait_until(
                lambda: sum(closed_by_peer(s) for s in idle) >= 10, 10, "the sockets past the cap"
            )
            refused = sum(closed_by_peer(s) for s in idle)
            # 50 minus what was connected before: the producer, the admin, the broker.
            assert 10 <= refused <= 13, refused
            answer = new_client(target, spec.address)
            assert answer.startswith("UNAVAILABLE"), answer

            # Connected before: still served. The broker's heartbeats go on (never fenced).
            assert producer.send(TOPIC, b"during").result(timeout=30).offset == 1
            assert not any(b.fenced for b in admin.describe_cluster().brokers)
        finally:
            for s in idle:
                s.close()
        wait_until(lambda: new_client(target, spec.address) == "ok", 30, "a new client again")
        assert producer.send(TOPIC, b"after").result(timeout=30).offset == 2
    fenced = [
        line
        for line in pathlib.Path(capped.state.controller.log_file).read_text().splitlines()
        if '"broker_fenced"' in line
    ]
    assert fenced == []


@pytest.fixture
def one_broker(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    settings = {"leader.imbalance.check.interval.seconds": "3600"}
    with local_cluster(str(tmp_path / "cluster"), brokers=1, settings=settings) as c:
        yield c


def produce_request(size: int) -> pb.ProduceRequest:
    request = pb.ProduceRequest(acks=1, timeout_ms=30_000)
    request.topics.add(topic=TOPIC).partitions.add(partition=0, records=b"\0" * size)
    return request


def test_requests_over_the_size_limit_are_refused_before_they_are_held(
    one_broker: LocalCluster,
) -> None:
    broker = one_broker.state.brokers[0]
    with Admin(one_broker.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, 1, {"max.message.bytes": str(32 * MIB)})

    # The producer's view: a clear, non-retriable error naming the limit.
    with Producer(
        one_broker.bootstrap,
        batch_size=32 * MIB,
        max_request_size=64 * MIB,
        buffer_memory=128 * MIB,
        linger_ms=0,
    ) as producer:
        with pytest.raises(RecordListTooLargeError, match=r"socket\.request\.max\.bytes"):
            producer.send(TOPIC, b"x" * (20 * MIB)).result(timeout=60)
        assert producer.send(TOPIC, b"small").result(timeout=30).offset == 0

    # Four 200 MB requests at once, on four connections.
    before_kb = status_kb(broker.pid, "VmHWM")
    request = produce_request(200_000_000)

    async def send_all() -> list[object]:
        channels = [
            grpc.aio.insecure_channel(
                broker.address,
                options=[
                    ("grpc.use_local_subchannel_pool", 1),
                    ("grpc.max_send_message_length", 256 * MIB),
                ],
            )
            for _ in range(4)
        ]
        try:
            calls = [pb_grpc.BrokerServiceStub(c).Produce(request, timeout=120) for c in channels]
            return await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await asyncio.gather(*(c.close() for c in channels))

    outcomes = asyncio.run(send_all())
    grown_mb = (status_kb(broker.pid, "VmHWM") - before_kb) / 1024
    assert grown_mb < 200, f"the broker's peak RSS grew by {grown_mb:.0f} MB"
    for outcome in outcomes:
        assert isinstance(outcome, grpc.aio.AioRpcError), outcome
        assert outcome.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in (outcome.details() or "")


@pytest.fixture
def held(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    settings = {
        "leader.imbalance.check.interval.seconds": "3600",
        "replica.lag.time.max.ms": "4000",
        "max.message.bytes": "10485760",
        "queued.max.request.bytes": str(24 * MIB),
    }
    with local_cluster(str(tmp_path / "cluster"), brokers=2, settings=settings) as c:
        yield c


def test_produce_requests_past_the_queued_bytes_wait_unread_and_are_all_answered(
    held: LocalCluster,
) -> None:
    with Admin(held.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, 2)
        wait_until(
            lambda: len(admin.describe_topics([TOPIC])[0].partitions[0].isr) == 2, 30, "full ISR"
        )
        leader = admin.describe_topics([TOPIC])[0].partitions[0].leader
    follower = next(b for b in held.state.brokers if b.node_id != leader)
    leader_spec = held.spec(leader)
    before_kb = status_kb(leader_spec.pid, "VmHWM")
    # acks=all with the follower stopped: each request is held until the ISR shrinks.
    held.pause(follower.node_id)

    async def send_all() -> list[int]:
        channel = grpc.aio.insecure_channel(
            leader_spec.address, options=[("grpc.max_send_message_length", 64 * MIB)]
        )
        stream = RequestStream(pb_grpc.BrokerServiceStub(channel).ProduceStream, "leader")
        try:
            requests = []
            for _ in range(40):
                request = produce_request(0)
                request.acks = -1
                request.topics[0].partitions[0].records = batch_of(8 * MIB)
                requests.append(stream.request(request, 120))
            answers = await asyncio.gather(*requests)
            return [a.topics[0].partitions[0].error_code for a in answers]
        finally:
            await stream.close()
            await channel.close()

    try:
        codes = asyncio.run(send_all())
    finally:
        held.resume(follower.node_id)
    assert codes == [0] * 40  # queued, not refused
    grown_mb = (status_kb(leader_spec.pid, "VmHWM") - before_kb) / 1024
    # 320 MB were sent; without the budget the leader holds them all (~700 MB peak).
    assert grown_mb < 200, f"the leader's peak RSS grew by {grown_mb:.0f} MB"


def batch_of(size: int) -> bytes:
    """One batch of one record, `size` bytes in all (give or take its header)."""
    return encode_batch([(int(time.time() * 1000), None, b"v" * (size - 100), [])])


@pytest.fixture
def quick_idle(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    settings = {
        "leader.imbalance.check.interval.seconds": "3600",
        "connections.max.idle.ms": "1500",
    }
    with local_cluster(str(tmp_path / "cluster"), brokers=1, settings=settings) as c:
        yield c


def broker_log_events(cluster: LocalCluster, name: str) -> list[dict[str, object]]:
    events = []
    for line in pathlib.Path(cluster.state.brokers[0].log_file).read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == name:
            events.append(record)
    return events


def test_idle_streams_and_connections_are_closed_and_clients_carry_on(
    quick_idle: LocalCluster,
) -> None:
    broker = quick_idle.state.brokers[0]
    with Admin(quick_idle.bootstrap) as admin:
        admin.create_topic(TOPIC, 1, 1)
        with Producer(quick_idle.bootstrap, acks="all") as producer:
            assert producer.send(TOPIC, b"one").result(timeout=30).offset == 0
            # Quiet now: the broker ends the produce stream, then closes the connection.
            wait_until(
                lambda: [
                    e
                    for e in broker_log_events(quick_idle, "stream_idle_closed")
                    if e.get("rpc") == "produce"
                ],
                30,
                "the idle produce stream to be closed",
            )
            wait_until(lambda: established_to(broker.port) == 0, 30, "the idle connection closed")
            # Both clients carry on as if nothing happened.
            assert producer.send(TOPIC, b"two").result(timeout=30).offset == 1
            (desc,) = admin.describe_topics([TOPIC])
            assert desc.partitions[0].leader == broker.node_id

    tp = TopicPartition(TOPIC, 0)
    with Consumer(quick_idle.bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        values: list[bytes] = []
        wait_until(
            lambda: (
                values.extend(r.value for r in consumer.poll(timeout_ms=200)) or len(values) == 2
            ),
            30,
            "both records",
        )
        assert values == [b"one", b"two"]

    # A socket that never speaks HTTP/2 is dropped after the same time.
    (raw,) = open_sockets(broker.port, 1)
    try:
        wait_until(lambda: closed_by_peer(raw), 30, "the half-open socket to be closed")
    finally:
        raw.close()
