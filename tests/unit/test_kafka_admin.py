"""The Kafka port's admin APIs forwarded to the controller (broker/kafka/admin_handlers.py) and
the listener's limits and acks=0 rule (broker/kafka/server.py), without a cluster: every
advertised version of CreatePartitions, DescribeConfigs, IncrementalAlterConfigs and
ElectLeaders is read, forwarded as the controller's RPC, and answered with its codes one for
one; max.connections, connections.max.idle.ms, queued.max.request.bytes and a failed acks=0
produce over real loopback sockets."""

from __future__ import annotations

import asyncio
import io
import struct
from typing import Any

import pytest
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32

from minibroker.broker import wire
from minibroker.broker.kafka import codec
from minibroker.broker.kafka.admin_handlers import (
    ADMIN_SUPPORTED,
    CREATE_PARTITIONS,
    DESCRIBE_CONFIGS,
    ELECT_LEADERS,
    INCREMENTAL_ALTER_CONFIGS,
)
from minibroker.broker.kafka.handlers import (
    API_VERSIONS,
    CLOSE_CONNECTION,
    METADATA,
    NO_RESPONSE,
    PRODUCE,
    SUPPORTED,
    KafkaHandlers,
)
from minibroker.broker.kafka.server import KafkaListener
from minibroker.client.common.grpc_limits import RequestBudget
from minibroker.client.errors import ErrorCode
from minibroker.metadata.image import MetadataImage
from minibroker.proto import minibroker_pb2 as pb


def request_bytes(api_key: int, version: int, correlation_id: int, body: Any) -> bytes:
    cls = codec.request_class(api_key, version)
    header_cls = RequestHeaderV2 if cls.__flexible__ else RequestHeaderV1
    buffer = io.BytesIO()
    entity_writer(header_cls)(
        buffer,
        header_cls(
            request_api_key=i16(api_key),
            request_api_version=i16(version),
            correlation_id=i32(correlation_id),
            client_id="test",
        ),
    )
    entity_writer(cls)(buffer, body)
    return buffer.getvalue()


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def read_response(api_key: int, version: int, frame: bytes) -> tuple[int, Any]:
    cls = codec.response_class(api_key, version)
    flexible = cls.__flexible__ and api_key != API_VERSIONS
    header_cls = ResponseHeaderV1 if flexible else ResponseHeaderV0
    header, used = entity_reader(header_cls)(frame, 0)
    body, size = entity_reader(cls)(frame, used)
    assert used + size == len(frame), "bytes past the response's end"
    return int(header.correlation_id), body


class FakeLink:
    """A controller answering the four RPCs; `down`: it does not answer at all."""

    cluster_id = "cluster-x"

    def __init__(self, down: bool = False) -> None:
        self.down = down
        self.forwarded: list[tuple[str, Any]] = []

    async def forward(self, method: str, request: Any, timeout_s: float) -> Any:
        self.forwarded.append((method, request))
        if self.down:
            raise TimeoutError("deadline exceeded")
        if method == "CreatePartitions":
            return pb.CreatePartitionsResponse(
                results=[
                    pb.CreatePartitionsTopicResult(
                        name=t.name,
                        error_code=37 if t.count < 3 else 0,  # INVALID_PARTITIONS
                        error_message="fewer than now" if t.count < 3 else "",
                    )
                    for t in request.topics
                ]
            )
        if method == "DescribeConfigs":
            out = pb.DescribeConfigsResponse()
            for r in request.resources:
                result = out.results.add(
                    resource_type=r.resource_type, resource_name=r.resource_name
                )
                if r.resource_name == "gone":
                    result.error_code = 3  # UNKNOWN_TOPIC_OR_PARTITION
                    result.error_message = "no such topic"
                    continue
                result.configs.add(
                    name="retention.ms", value="1000", config_source=1, documentation="how long"
                )
                result.configs.add(name="cleanup.policy", value="delete", config_source=5)
            return out
        if method == "IncrementalAlterConfigs":
            return pb.IncrementalAlterConfigsResponse(
                results=[
                    pb.AlterConfigsResourceResult(
                        resource_type=r.resource_type,
                        resource_name=r.resource_name,
                        error_code=40 if r.configs[0].name == "bogus" else 0,  # INVALID_CONFIG
                        error_message="unknown config" if r.configs[0].name == "bogus" else "",
                    )
                    for r in request.resources
                ]
            )
        assert method == "ElectLeaders"
        return pb.ElectLeadersResponse(
            results=[
                pb.ElectionResult(
                    topic=t.topic,
                    partition=p,
                    error_code=84 if p == 1 else 0,  # ELECTION_NOT_NEEDED
                )
                for t in request.topic_partitions
                for p in t.partitions
            ]
        )


class FakeReplicaManager:
    def __init__(self, down: bool = False) -> None:
        self.broker_id = 1
        self.link = FakeLink(down)
        self.image = MetadataImage()
        self.produced: list[Any] = []

    async def produce(
        self, acks: int, timeout_ms: int, partitions: list[wire.ProducePartition]
    ) -> list[wire.ProduceResult]:
        self.produced.append(partitions)
        return [
            wire.ProduceResult(p.topic, p.partition, base_offset=0, log_start_offset=0)
            if p.partition == 0
            else wire.ProduceResult(p.topic, p.partition, ErrorCode.NOT_LEADER_OR_FOLLOWER)
            for p in partitions
        ]


def sample(api_key: int, version: int) -> Any:
    cls = codec.request_class(api_key, version)
    module = __import__(cls.__module__, fromlist=["_"])
    make = codec.make
    if api_key == CREATE_PARTITIONS:
        return make(
            cls,
            topics=(
                make(
                    module.CreatePartitionsTopic,
                    name="events",
                    count=6,
                    assignments=(
                        make(module.CreatePartitionsAssignment, broker_ids=(1, 2)),
                        make(module.CreatePartitionsAssignment, broker_ids=(2, 3)),
                    ),
                ),
                make(module.CreatePartitionsTopic, name="fewer", count=1, assignments=None),
            ),
            timeout=30000,
            validate_only=True,
        )
    if api_key == DESCRIBE_CONFIGS:
        resource = module.DescribeConfigsResource
        return make(
            cls,
            resources=(
                make(resource, resource_type=2, resource_name="events", configuration_keys=None),
                make(resource, resource_type=2, resource_name="gone", configuration_keys=None),
                make(resource, resource_type=4, resource_name="1", configuration_keys=("a",)),
                make(resource, resource_type=8, resource_name="1", configuration_keys=None),
            ),
            include_synonyms=True,
            include_documentation=True,
        )
    if api_key == INCREMENTAL_ALTER_CONFIGS:
        resource, config = module.AlterConfigsResource, module.AlterableConfig
        return make(
            cls,
            resources=(
                make(
                    resource,
                    resource_type=2,
                    resource_name="events",
                    configs=(
                        make(config, name="retention.ms", config_operation=0, value="5"),
                        make(config, name="segment.ms", config_operation=1, value=None),
                    ),
                ),
                make(
                    resource,
                    resource_type=4,
                    resource_name="",
                    configs=(make(config, name="bogus", config_operation=0, value="1"),),
                ),
                make(resource, resource_type=8, resource_name="1", configs=()),
            ),
            validate_only=False,
        )
    assert api_key == ELECT_LEADERS
    return make(
        cls,
        election_type=1,
        topic_partitions=(make(module.TopicPartitions, topic="events", partitions=(0, 1)),),
        timeout=15000,
    )


def check(api_key: int, version: int, body: Any, link: FakeLink) -> None:
    method, forwarded = link.forwarded[-1]
    if api_key == CREATE_PARTITIONS:
        assert method == "CreatePartitions" and forwarded.validate_only
        assert forwarded.timeout_ms == 30000
        events, fewer = forwarded.topics
        assert (events.name, events.count) == ("events", 6)
        assert [list(a.broker_ids) for a in events.assignments] == [[1, 2], [2, 3]]
        assert (fewer.name, fewer.count, list(fewer.assignments)) == ("fewer", 1, [])
        assert [(r.name, r.error_code) for r in body.results] == [
            ("events", KioErrorCode.none),
            ("fewer", KioErrorCode.invalid_partitions),
        ]
    elif api_key == DESCRIBE_CONFIGS:
        assert method == "DescribeConfigs"
        # The broker-logger resource is not forwarded: answered here.
        assert [(r.resource_type, r.resource_name) for r in forwarded.resources] == [
            (2, "events"),
            (2, "gone"),
            (4, "1"),
        ]
        assert list(forwarded.resources[2].configuration_keys) == ["a"]
        events, gone, broker, logger = body.results
        assert events.error_code == KioErrorCode.none
        retention, policy = events.configs
        assert (retention.name, retention.value, retention.config_source) == (
            "retention.ms",
            "1000",
            1,
        )
        assert policy.config_source == 5  # DEFAULT_CONFIG
        assert [(s.name, s.value, s.source) for s in retention.synonyms] == [
            ("retention.ms", "1000", 1)
        ]
        if version >= 3:
            assert retention.documentation == "how long"
        assert gone.error_code == KioErrorCode.unknown_topic_or_partition
        assert gone.error_message == "no such topic"
        assert broker.error_code == KioErrorCode.none
        assert logger.error_code == KioErrorCode.invalid_request
    elif api_key == INCREMENTAL_ALTER_CONFIGS:
        assert method == "IncrementalAlterConfigs"
        topic, broker = forwarded.resources
        assert [(c.name, c.config_operation, c.HasField("value")) for c in topic.configs] == [
            ("retention.ms", 0, True),
            ("segment.ms", 1, False),
        ]
        assert (broker.resource_type, broker.resource_name) == (4, "")
        assert [r.error_code for r in body.responses] == [
            KioErrorCode.none,
            KioErrorCode.invalid_config,
            KioErrorCode.invalid_request,
        ]
    else:
        assert method == "ElectLeaders"
        # v0 has no election type: preferred.
        assert forwarded.election_type == (pb.UNCLEAN if version >= 1 else pb.PREFERRED)
        assert not forwarded.all_partitions
        assert forwarded.timeout_ms == 15000
        (topic,) = body.replica_election_results
        assert topic.topic == "events"
        assert [(p.partition_id, p.error_code) for p in topic.partition_result] == [
            (0, KioErrorCode.none),
            (1, KioErrorCode.election_not_needed),
        ]


VERSIONS = [(k, v) for k, (low, high) in ADMIN_SUPPORTED.items() for v in range(low, high + 1)]


@pytest.mark.parametrize(("api_key", "version"), VERSIONS)
async def test_every_admin_version_is_forwarded_and_answered(api_key: int, version: int) -> None:
    assert SUPPORTED[api_key] == ADMIN_SUPPORTED[api_key]  # advertised by ApiVersions
    rm = FakeReplicaManager()
    handlers = KafkaHandlers(rm)  # type: ignore[arg-type]
    payload = request_bytes(api_key, version, 500 + version, sample(api_key, version))
    request = codec.parse_request(payload, SUPPORTED)
    answer = await handlers.handle(request)
    frame = codec.encode_response(api_key, version, request.correlation_id, answer)
    correlation_id, body = read_response(api_key, version, frame[4:])
    assert correlation_id == 500 + version
    check(api_key, version, body, rm.link)


@pytest.mark.parametrize("api_key", sorted(ADMIN_SUPPORTED))
async def test_a_silent_controller_gives_request_timed_out(api_key: int) -> None:
    version = ADMIN_SUPPORTED[api_key][1]
    handlers = KafkaHandlers(FakeReplicaManager(down=True))  # type: ignore[arg-type]
    request = codec.parse_request(
        request_bytes(api_key, version, 1, sample(api_key, version)), SUPPORTED
    )
    body = await handlers.handle(request)
    if api_key == CREATE_PARTITIONS:
        codes = [r.error_code for r in body.results]
    elif api_key == DESCRIBE_CONFIGS:
        codes = [r.error_code for r in body.results[:3]]
    elif api_key == INCREMENTAL_ALTER_CONFIGS:
        codes = [r.error_code for r in body.responses[:2]]
    else:
        assert body.error_code == KioErrorCode.request_timed_out
        codes = [p.error_code for p in body.replica_election_results[0].partition_result]
    assert codes and set(codes) == {KioErrorCode.request_timed_out}


async def test_a_refused_election_names_each_partition_in_v0() -> None:
    rm = FakeReplicaManager()

    async def refuse(method: str, request: Any, timeout_s: float) -> Any:
        return pb.ElectLeadersResponse(error_code=31, error_message="denied")

    rm.link.forward = refuse  # type: ignore[method-assign]
    handlers = KafkaHandlers(rm)  # type: ignore[arg-type]
    request = codec.parse_request(
        request_bytes(ELECT_LEADERS, 0, 1, sample(ELECT_LEADERS, 0)), SUPPORTED
    )
    body = await handlers.handle(request)
    codes = [p.error_code for p in body.replica_election_results[0].partition_result]
    assert codes == [KioErrorCode.cluster_authorization_failed] * 2


# -- acks=0 and the listener's limits -----------------------------------------------------------


def produce(acks: int, partitions: tuple[int, ...]) -> Any:
    cls = codec.request_class(PRODUCE, 9)
    module = __import__(cls.__module__, fromlist=["_"])
    return codec.make(
        cls,
        transactional_id=None,
        acks=acks,
        timeout=5000,
        topic_data=(
            codec.make(
                module.TopicProduceData,
                name="events",
                partition_data=tuple(
                    codec.make(module.PartitionProduceData, index=p, records=b"batch")
                    for p in partitions
                ),
            ),
        ),
    )


def metadata_request() -> Any:
    return codec.make(
        codec.request_class(METADATA, 12),
        topics=(),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


async def round_trip(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, correlation_id: int
) -> int:
    writer.write(framed(request_bytes(METADATA, 12, correlation_id, metadata_request())))
    await writer.drain()
    (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 5))
    return read_response(METADATA, 12, await reader.readexactly(size))[0]


async def closed_by_server(reader: asyncio.StreamReader, timeout: float = 5) -> bool:
    try:
        return await asyncio.wait_for(reader.read(), timeout) == b""
    except ConnectionResetError:
        return True


async def test_a_failed_acks_zero_produce_closes_the_connection_after_earlier_answers() -> None:
    rm = FakeReplicaManager()
    handlers = KafkaHandlers(rm)  # type: ignore[arg-type]
    ok = codec.parse_request(request_bytes(PRODUCE, 9, 1, produce(0, (0,))), SUPPORTED)
    assert await handlers.handle(ok) is NO_RESPONSE
    bad = codec.parse_request(request_bytes(PRODUCE, 9, 2, produce(0, (0, 1))), SUPPORTED)
    assert await handlers.handle(bad) is CLOSE_CONNECTION
    listener = KafkaListener("127.0.0.1", 0, handlers.handle, max_request_bytes=1 << 20)
    await listener.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(framed(request_bytes(METADATA, 12, 7, metadata_request())))
        writer.write(framed(request_bytes(PRODUCE, 9, 8, produce(0, (1,)))))
        await writer.drain()
        (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 5))
        assert read_response(METADATA, 12, await reader.readexactly(size))[0] == 7
        assert await closed_by_server(reader)
        assert listener.closed_for == {"acks=0 produce failed": 1}
        writer.close()
    finally:
        await listener.stop()


async def test_max_connections_refuses_the_one_past_it() -> None:
    handlers = KafkaHandlers(FakeReplicaManager())  # type: ignore[arg-type]
    listener = KafkaListener(
        "127.0.0.1", 0, handlers.handle, max_request_bytes=1 << 20, max_connections=2
    )
    await listener.start()
    try:
        first = await asyncio.open_connection("127.0.0.1", listener.port)
        second = await asyncio.open_connection("127.0.0.1", listener.port)
        assert await round_trip(*first, 1) == 1 and await round_trip(*second, 2) == 2
        third = await asyncio.open_connection("127.0.0.1", listener.port)
        assert await closed_by_server(third[0])
        assert listener.closed_for == {"too many connections": 1}
        assert await round_trip(*first, 3) == 3  # the others serve on
        first[1].close()
        deadline = asyncio.get_running_loop().time() + 5
        while len(listener._connections) > 1:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        fourth = await asyncio.open_connection("127.0.0.1", listener.port)
        assert await round_trip(*fourth, 4) == 4  # a freed slot is taken
        for _, w in (second, third, fourth):
            w.close()
    finally:
        await listener.stop()


async def test_an_idle_connection_is_closed_but_not_one_waiting_for_an_answer() -> None:
    handlers = KafkaHandlers(FakeReplicaManager())  # type: ignore[arg-type]
    release = asyncio.Event()

    async def handler(request: codec.Request) -> Any:
        if request.correlation_id == 99:
            await release.wait()  # a long poll
        return await handlers.handle(request)

    listener = KafkaListener("127.0.0.1", 0, handler, max_request_bytes=1 << 20, idle_ms=300)
    await listener.start()
    try:
        idle = await asyncio.open_connection("127.0.0.1", listener.port)
        assert await round_trip(*idle, 1) == 1
        waiting = await asyncio.open_connection("127.0.0.1", listener.port)
        waiting[1].write(framed(request_bytes(METADATA, 12, 99, metadata_request())))
        await waiting[1].drain()
        assert await closed_by_server(idle[0], timeout=3)
        assert listener.closed_for == {"idle": 1}
        await asyncio.sleep(0.5)  # past the idle time, an answer still owed
        release.set()
        (size,) = struct.unpack(">i", await asyncio.wait_for(waiting[0].readexactly(4), 5))
        assert read_response(METADATA, 12, await waiting[0].readexactly(size))[0] == 99
        idle[1].close()
        waiting[1].close()
    finally:
        await listener.stop()


async def test_queued_max_request_bytes_stops_reading_until_answers_go_out() -> None:
    handlers = KafkaHandlers(FakeReplicaManager())  # type: ignore[arg-type]
    release = asyncio.Event()
    handled: list[int] = []

    async def handler(request: codec.Request) -> Any:
        handled.append(request.correlation_id)
        await release.wait()
        return await handlers.handle(request)

    one = len(request_bytes(METADATA, 12, 1, metadata_request()))
    budget = RequestBudget(one * 2)  # room for two requests read and not answered
    listener = KafkaListener("127.0.0.1", 0, handler, max_request_bytes=1 << 20, budget=budget)
    await listener.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        for correlation_id in range(1, 6):
            writer.write(framed(request_bytes(METADATA, 12, correlation_id, metadata_request())))
        await writer.drain()
        await asyncio.sleep(0.3)
        assert handled == [1, 2] and budget.used == 2 * one
        release.set()
        got = []
        for _ in range(5):
            (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 5))
            got.append(read_response(METADATA, 12, await reader.readexactly(size))[0])
        assert got == [1, 2, 3, 4, 5] and handled == [1, 2, 3, 4, 5]
        await asyncio.sleep(0.05)
        assert budget.used == 0
        writer.close()
    finally:
        await listener.stop()
