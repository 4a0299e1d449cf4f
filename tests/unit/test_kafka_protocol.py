"""The Kafka-protocol listener without a cluster (broker/kafka/): the codec (kio) glue, every
advertised API version answered by the dispatch and read back by kio, and the listener's framing
and ordering over real loopback sockets: answers in request order however long each takes, acks=0
without an answer, bad frames closing only their connection."""

from __future__ import annotations

import asyncio
import io
import struct
import uuid
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
from minibroker.broker.kafka.handlers import (
    API_VERSIONS,
    CREATE_TOPICS,
    DELETE_TOPICS,
    DESCRIBE_CLUSTER,
    FETCH,
    GROUP_APIS,
    INIT_PRODUCER_ID,
    LIST_OFFSETS,
    METADATA,
    NO_RESPONSE,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
    SUPPORTED,
    KafkaHandlers,
)
from minibroker.broker.kafka.server import KafkaListener
from minibroker.broker.replicas.fetch import FetchAnswer
from minibroker.client.errors import ErrorCode
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import PartitionRecord, RegisterBrokerRecord, TopicRecord
from minibroker.proto import minibroker_pb2 as pb

TOPIC_ID = str(uuid.UUID(int=0x1234))


def request_bytes(api_key: int, version: int, correlation_id: int, body: Any) -> bytes:
    """A request frame body (no size prefix), written by kio as a Kafka client would."""
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
    """(correlation id, kio response) from a response frame without its size prefix."""
    cls = codec.response_class(api_key, version)
    flexible = cls.__flexible__ and api_key != API_VERSIONS
    header_cls = ResponseHeaderV1 if flexible else ResponseHeaderV0
    header, used = entity_reader(header_cls)(frame, 0)
    body, size = entity_reader(cls)(frame, used)
    assert used + size == len(frame), "bytes past the response's end"
    return int(header.correlation_id), body


def make_request(api_key: int, version: int, **values: Any) -> Any:
    return codec.make(codec.request_class(api_key, version), **values)


def metadata_all(version: int) -> Any:
    """A Metadata request for every topic."""
    return make_request(
        METADATA,
        version,
        topics=None,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


class FakeLink:
    """The controller link's `forward`: records what was forwarded, answers as a controller."""

    cluster_id = "cluster-x"

    def __init__(self) -> None:
        self.forwarded: list[tuple[str, Any]] = []

    async def forward(self, method: str, request: Any, timeout_s: float) -> Any:
        self.forwarded.append((method, request))
        if method == "CreateTopics":
            return pb.CreateTopicsResponse(
                topics=[
                    pb.CreatableTopicResult(
                        name=t.name,
                        topic_id=TOPIC_ID,
                        error_code=36 if t.name == "events" else 0,  # TOPIC_ALREADY_EXISTS
                        error_message="exists" if t.name == "events" else "",
                        num_partitions=max(t.num_partitions, 1),
                        replication_factor=max(t.replication_factor, 1),
                    )
                    for t in request.topics
                ]
            )
        assert method == "DeleteTopics"
        return pb.DeleteTopicsResponse(
            results=[
                pb.DeletableTopicResult(name=name, topic_id=TOPIC_ID, error_code=0)
                for name in request.topic_names
            ]
        )


class FakeReplicaManager:
    """What KafkaHandlers calls, with the answers recorded and given."""

    def __init__(self) -> None:
        self.broker_id = 1
        self.link = FakeLink()
        self.image = MetadataImage()
        for broker_id, kafka_port in ((1, 19092), (2, 19093), (3, 0)):
            self.image.apply_record(
                RegisterBrokerRecord(
                    broker_id=broker_id,
                    incarnation_id=f"i{broker_id}",
                    broker_epoch=broker_id,
                    host="127.0.0.1",
                    port=9000 + broker_id,
                    fenced=False,
                    kafka_host="127.0.0.1" if kafka_port else "",
                    kafka_port=kafka_port,
                )
            )
        self.image.apply_record(TopicRecord("events", TOPIC_ID))
        for partition, leader in ((0, 1), (1, 3)):
            self.image.apply_record(
                PartitionRecord(TOPIC_ID, partition, (1, 2, 3), (1, 2, 3), leader, 4, 5)
            )
        self.produced: list[tuple[int, int, list[wire.ProducePartition]]] = []
        self.fetched: list[wire.FetchParams] = []

    async def produce(
        self, acks: int, timeout_ms: int, partitions: list[wire.ProducePartition]
    ) -> list[wire.ProduceResult]:
        self.produced.append((acks, timeout_ms, partitions))
        return [
            wire.ProduceResult(p.topic, p.partition, base_offset=42, log_start_offset=0)
            if p.partition == 0
            else wire.ProduceResult(p.topic, p.partition, ErrorCode.NOT_LEADER_OR_FOLLOWER)
            for p in partitions
        ]

    async def fetch(self, params: wire.FetchParams, **_: Any) -> FetchAnswer:
        self.fetched.append(params)
        return FetchAnswer(
            0,
            ErrorCode.NONE,
            [
                wire.FetchPartitionResult(
                    "events", 0, high_watermark=7, log_start_offset=0, records=b"\x01batch"
                ),
                wire.FetchPartitionResult(
                    "events", 1, ErrorCode.NOT_LEADER_OR_FOLLOWER, current_leader=(3, 4)
                ),
            ],
        )

    def list_offsets(self, asked: list[wire.ListOffsetsPartition]) -> list[wire.ListOffsetsResult]:
        return [
            wire.ListOffsetsResult(a.topic, a.partition, offset=7, timestamp=-1, leader_epoch=4)
            for a in asked
        ]

    async def init_producer_id(self) -> Any:
        return wire.encode_init_producer_id(ErrorCode.NONE, producer_id=1001)

    def offset_for_leader_epoch(
        self, asked: list[wire.OffsetForLeaderPartition]
    ) -> list[wire.EpochEndOffsetResult]:
        return [
            wire.EpochEndOffsetResult(
                a.topic, a.partition, leader_epoch=a.leader_epoch, end_offset=99
            )
            if a.current_leader_epoch == 4
            else wire.EpochEndOffsetResult(a.topic, a.partition, ErrorCode.FENCED_LEADER_EPOCH)
            for a in asked
        ]


# -- codec ---------------------------------------------------------------------------------------


def test_a_request_is_read_with_its_header_version() -> None:
    body = make_request(API_VERSIONS, 3, client_software_name="x", client_software_version="1")
    request = codec.parse_request(request_bytes(API_VERSIONS, 3, 77, body), SUPPORTED)
    assert (request.api_key, request.api_version, request.correlation_id) == (18, 3, 77)
    assert request.flexible and request.client_id == "test"
    assert request.body.client_software_name == "x"
    old = codec.parse_request(request_bytes(METADATA, 1, 5, metadata_all(1)), SUPPORTED)
    assert not old.flexible and old.body.topics is None


def test_unknown_keys_versions_and_malformed_bytes_are_refused() -> None:
    with pytest.raises(codec.KafkaProtocolError, match="unknown api key 9999"):
        codec.parse_request(struct.pack(">hhi", 9999, 0, 1), SUPPORTED)
    with pytest.raises(codec.UnsupportedVersion) as err:
        codec.parse_request(struct.pack(">hhi", PRODUCE, 2, 9) + b"\0\0", SUPPORTED)
    assert (err.value.api_key, err.value.version, err.value.correlation_id) == (0, 2, 9)
    # A known API that this broker does not serve (DeleteRecords) is not supported either.
    with pytest.raises(codec.UnsupportedVersion):
        codec.parse_request(struct.pack(">hhi", 21, 0, 1), SUPPORTED)
    good = request_bytes(METADATA, 12, 1, metadata_all(12))
    with pytest.raises(codec.KafkaProtocolError, match="malformed"):
        codec.parse_request(good[:-3], SUPPORTED)
    # Bytes past the end are ignored, as Kafka's parser does (librdkafka sends some).
    assert codec.parse_request(good + b"xx", SUPPORTED).correlation_id == 1
    with pytest.raises(codec.KafkaProtocolError, match="no header"):
        codec.parse_request(b"\0\3", SUPPORTED)


# -- dispatch: every advertised version ---------------------------------------------------------


def sample_request(api_key: int, version: int) -> Any:
    cls = codec.request_class(api_key, version)
    module = __import__(cls.__module__, fromlist=["_"])
    if api_key == API_VERSIONS:
        return codec.make(cls, client_software_name="t", client_software_version="1")
    if api_key == METADATA:
        topic_cls = module.MetadataRequestTopic
        return codec.make(
            cls,
            topics=(
                codec.make(topic_cls, name="events", topic_id=None),
                codec.make(topic_cls, name="missing", topic_id=None),
            ),
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
    if api_key == PRODUCE:
        part = module.PartitionProduceData
        return codec.make(
            cls,
            transactional_id=None,
            acks=-1,
            timeout=5000,
            topic_data=(
                codec.make(
                    module.TopicProduceData,
                    name="events",
                    partition_data=(
                        codec.make(part, index=0, records=b"v2batch"),
                        codec.make(part, index=1, records=b"other"),
                    ),
                ),
            ),
        )
    if api_key == FETCH:
        return codec.make(
            cls,
            cluster_id=None,
            replica_id=-1,
            max_wait=250,
            min_bytes=1,
            max_bytes=1 << 20,
            isolation_level=1,
            session_id=0,
            session_epoch=-1,
            topics=(
                codec.make(
                    module.FetchTopic,
                    topic="events",
                    partitions=tuple(
                        codec.make(
                            module.FetchPartition,
                            partition=p,
                            current_leader_epoch=4,
                            fetch_offset=3,
                            last_fetched_epoch=-1,
                            log_start_offset=-1,
                            partition_max_bytes=1000,
                        )
                        for p in (0, 1)
                    ),
                ),
            ),
            forgotten_topics_data=(),
            rack_id="",
        )
    if api_key == LIST_OFFSETS:
        return codec.make(
            cls,
            replica_id=-1,
            isolation_level=0,
            topics=(
                codec.make(
                    module.ListOffsetsTopic,
                    name="events",
                    partitions=(
                        codec.make(
                            module.ListOffsetsPartition,
                            partition_index=0,
                            current_leader_epoch=-1,
                            timestamp=-1,
                        ),
                    ),
                ),
            ),
        )
    if api_key == DESCRIBE_CLUSTER:
        return codec.make(cls, include_cluster_authorized_operations=False, endpoint_type=1)
    if api_key == OFFSET_FOR_LEADER_EPOCH:
        return codec.make(
            cls,
            replica_id=-1,
            topics=(
                codec.make(
                    module.OffsetForLeaderTopic,
                    topic="events",
                    partitions=tuple(
                        codec.make(
                            module.OffsetForLeaderPartition,
                            partition=p,
                            current_leader_epoch=epoch,
                            leader_epoch=3,
                        )
                        for p, epoch in ((0, 4), (1, 2))
                    ),
                ),
            ),
        )
    if api_key == CREATE_TOPICS:
        topic = module.CreatableTopic
        return codec.make(
            cls,
            topics=(
                codec.make(
                    topic,
                    name="fresh",
                    num_partitions=6,
                    replication_factor=3,
                    assignments=(),
                    configs=(
                        codec.make(module.CreatableTopicConfig, name="retention.ms", value="1000"),
                    ),
                ),
                codec.make(
                    topic,
                    name="events",
                    num_partitions=1,
                    replication_factor=1,
                    assignments=(),
                    configs=(),
                ),
                codec.make(
                    topic,
                    name="manual",
                    num_partitions=-1,
                    replication_factor=-1,
                    assignments=(
                        codec.make(
                            module.CreatableReplicaAssignment, partition_index=0, broker_ids=(1,)
                        ),
                    ),
                    configs=(),
                ),
            ),
            timeout=30000,
            validate_only=False,
        )
    if api_key == DELETE_TOPICS:
        if version >= 6:
            state = module.DeleteTopicState
            return codec.make(
                cls,
                topics=(
                    codec.make(state, name="events", topic_id=None),
                    codec.make(state, name=None, topic_id=uuid.UUID(TOPIC_ID)),
                    codec.make(state, name=None, topic_id=uuid.UUID(int=7)),
                ),
                timeout=30000,
            )
        return codec.make(cls, topic_names=("events", "gone"), timeout=30000)
    assert api_key == INIT_PRODUCER_ID
    return codec.make(
        cls, transactional_id=None, transaction_timeout=60000, producer_id=-1, producer_epoch=-1
    )


def check_answer(api_key: int, version: int, body: Any, rm: FakeReplicaManager) -> None:
    if api_key == API_VERSIONS:
        assert body.error_code == KioErrorCode.none
        assert {a.api_key: (a.min_version, a.max_version) for a in body.api_keys} == SUPPORTED
    elif api_key == METADATA:
        # Kafka addresses only, brokers without a Kafka listener left out.
        assert [(b.node_id, b.port) for b in body.brokers] == [(1, 19092), (2, 19093)]
        events, missing = body.topics
        assert events.error_code == KioErrorCode.none
        assert [p.error_code for p in events.partitions] == [
            KioErrorCode.none,
            KioErrorCode.listener_not_found,  # its leader, broker 3, has no Kafka listener
        ]
        assert events.partitions[0].leader_id == 1
        assert missing.error_code == KioErrorCode.unknown_topic_or_partition
        if version >= 10:
            assert events.topic_id == uuid.UUID(TOPIC_ID)
    elif api_key == PRODUCE:
        acks, timeout_ms, partitions = rm.produced[-1]
        assert (acks, timeout_ms) == (-1, 5000)
        assert [(p.partition, p.records) for p in partitions] == [(0, b"v2batch"), (1, b"other")]
        (topic,) = body.responses
        ok, refused = topic.partition_responses
        assert (ok.error_code, ok.base_offset) == (KioErrorCode.none, 42)
        assert refused.error_code == KioErrorCode.not_leader_or_follower
    elif api_key == FETCH:
        params = rm.fetched[-1]
        assert params.replica_id == -1 and params.session_id == 0
        assert [(p.partition, p.fetch_offset, p.max_bytes) for p in params.partitions] == [
            (0, 3, 1000),
            (1, 3, 1000),
        ]
        if version >= 7:  # the top-level error and the session id came with KIP-227
            assert (body.error_code, body.session_id) == (KioErrorCode.none, 0)
        (topic,) = body.responses
        ok, moved = topic.partitions
        assert (ok.high_watermark, ok.last_stable_offset, ok.records) == (7, 7, b"\x01batch")
        assert moved.error_code == KioErrorCode.not_leader_or_follower
        if version >= 12:
            assert (moved.current_leader.leader_id, moved.current_leader.leader_epoch) == (3, 4)
    elif api_key == LIST_OFFSETS:
        (topic,) = body.topics
        (p,) = topic.partitions
        assert (p.error_code, p.offset) == (KioErrorCode.none, 7)
    elif api_key == DESCRIBE_CLUSTER:
        assert (body.error_code, body.cluster_id, body.controller_id) == (
            KioErrorCode.none,
            "cluster-x",
            1,
        )
        assert [(b.broker_id, b.port) for b in body.brokers] == [(1, 19092), (2, 19093)]
    elif api_key == OFFSET_FOR_LEADER_EPOCH:
        (topic,) = body.topics
        ok, fenced = topic.partitions
        assert (ok.error_code, ok.leader_epoch, ok.end_offset) == (KioErrorCode.none, 3, 99)
        assert fenced.error_code == KioErrorCode.fenced_leader_epoch
    elif api_key == CREATE_TOPICS:
        method, forwarded = rm.link.forwarded[-1]
        assert method == "CreateTopics" and forwarded.timeout_ms == 30000
        # The manual assignment is refused here and never forwarded.
        assert [(t.name, t.num_partitions, t.replication_factor) for t in forwarded.topics] == [
            ("fresh", 6, 3),
            ("events", 1, 1),
        ]
        assert dict(forwarded.topics[0].configs) == {"retention.ms": "1000"}
        fresh, events, manual = body.topics
        assert (fresh.name, fresh.error_code) == ("fresh", KioErrorCode.none)
        if version >= 5:
            assert (fresh.num_partitions, fresh.replication_factor) == (6, 3)
        assert events.error_code == KioErrorCode.topic_already_exists
        assert manual.error_code == KioErrorCode.invalid_request
    elif api_key == DELETE_TOPICS:
        method, forwarded = rm.link.forwarded[-1]
        assert method == "DeleteTopics"
        if version >= 6:
            # By name, by a known id (named by the image), and an unknown id (not forwarded).
            assert list(forwarded.topic_names) == ["events", "events"]
            codes = [r.error_code for r in body.responses]
            assert codes == [KioErrorCode.none, KioErrorCode.none, KioErrorCode.unknown_topic_id]
        else:
            assert list(forwarded.topic_names) == ["events", "gone"]
            assert [r.name for r in body.responses] == ["events", "gone"]
            assert {r.error_code for r in body.responses} == {KioErrorCode.none}
    else:
        assert (body.error_code, body.producer_id, body.producer_epoch) == (
            KioErrorCode.none,
            1001,
            0,
        )


# The group APIs are answered by GroupHandlers with a coordinator: tests/unit/test_group_handlers.py
# and test_group_membership_handlers.py read back each of their versions.
VERSIONS = [
    (key, v)
    for key, (low, high) in SUPPORTED.items()
    if key not in GROUP_APIS
    for v in range(low, high + 1)
]


@pytest.mark.parametrize(("api_key", "version"), VERSIONS)
async def test_every_advertised_version_is_answered_and_reads_back(
    api_key: int, version: int
) -> None:
    rm = FakeReplicaManager()
    handlers = KafkaHandlers(rm)  # type: ignore[arg-type]
    payload = request_bytes(api_key, version, 1000 + version, sample_request(api_key, version))
    request = codec.parse_request(payload, SUPPORTED)
    answer = await handlers.handle(request)
    frame = codec.encode_response(api_key, version, request.correlation_id, answer)
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    correlation_id, body = read_response(api_key, version, frame[4:])
    assert correlation_id == 1000 + version
    check_answer(api_key, version, body, rm)


async def test_acks_zero_gets_no_answer_and_bad_acks_is_refused() -> None:
    rm = FakeReplicaManager()
    handlers = KafkaHandlers(rm)  # type: ignore[arg-type]
    body = sample_request(PRODUCE, 9)
    zero = codec.parse_request(
        request_bytes(PRODUCE, 9, 1, codec.make(type(body), **{**_fields(body), "acks": 0})),
        SUPPORTED,
    )
    assert await handlers.handle(zero) is NO_RESPONSE
    assert rm.produced[-1][0] == 0
    bad = codec.parse_request(
        request_bytes(PRODUCE, 9, 2, codec.make(type(body), **{**_fields(body), "acks": 2})),
        SUPPORTED,
    )
    answer = await handlers.handle(bad)
    assert len(rm.produced) == 1, "a produce with acks=2 reached the replica manager"
    codes = {p.error_code for p in answer.responses[0].partition_responses}
    assert codes == {KioErrorCode.invalid_required_acks}


def _fields(entity: Any) -> dict[str, Any]:
    return {name: getattr(entity, name) for name in entity.__dataclass_fields__}


# -- the listener: framing and order ------------------------------------------------------------


async def open_listener(handler: Any, max_request_bytes: int = 1 << 20) -> KafkaListener:
    listener = KafkaListener("127.0.0.1", 0, handler, max_request_bytes=max_request_bytes)
    await listener.start()
    return listener


async def api_versions_round_trip(port: int, correlation_id: int, version: int = 3) -> Any:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        body = make_request(
            API_VERSIONS, min(version, 3), client_software_name="t", client_software_version="1"
        )
        payload = bytearray(request_bytes(API_VERSIONS, min(version, 3), correlation_id, body))
        struct.pack_into(">h", payload, 2, version)
        writer.write(framed(bytes(payload)))
        await writer.drain()
        (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 5))
        return read_response(
            API_VERSIONS, 0 if version > 3 else version, await reader.readexactly(size)
        )
    finally:
        writer.close()


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True when the server closed the connection without answering."""
    return await asyncio.wait_for(reader.read(), 5) == b""


async def test_answers_go_out_in_request_order_even_when_handled_out_of_order() -> None:
    handlers = KafkaHandlers(FakeReplicaManager())  # type: ignore[arg-type]
    releases: dict[int, asyncio.Event] = {}
    finished: list[int] = []

    async def handler(request: codec.Request) -> Any:
        release = releases.setdefault(request.correlation_id, asyncio.Event())
        await release.wait()
        finished.append(request.correlation_id)
        return await handlers.handle(request)

    listener = await open_listener(handler)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        body = metadata_all(12)
        for correlation_id in (1, 2, 3):
            writer.write(framed(request_bytes(METADATA, 12, correlation_id, body)))
        await writer.drain()
        while len(releases) < 3:  # all three are being handled at once
            await asyncio.sleep(0.01)
        releases[3].set()
        releases[2].set()
        while len(finished) < 2:
            await asyncio.sleep(0.01)
        releases[1].set()
        order = []
        for _ in range(3):
            (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 5))
            order.append(read_response(METADATA, 12, await reader.readexactly(size))[0])
        assert finished == [3, 2, 1]
        assert order == [1, 2, 3]
        writer.close()
    finally:
        await listener.stop()


async def test_acks_zero_produce_is_not_answered_and_the_next_request_is() -> None:
    rm = FakeReplicaManager()
    listener = await open_listener(KafkaHandlers(rm).handle)  # type: ignore[arg-type]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        body = sample_request(PRODUCE, 9)
        zero = codec.make(type(body), **{**_fields(body), "acks": 0})
        writer.write(framed(request_bytes(PRODUCE, 9, 1, zero)))
        writer.write(framed(request_bytes(METADATA, 12, 2, metadata_all(12))))
        await writer.drain()
        (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 5))
        correlation_id, _ = read_response(METADATA, 12, await reader.readexactly(size))
        assert correlation_id == 2
        assert rm.produced and rm.produced[0][0] == 0
        writer.close()
    finally:
        await listener.stop()


@pytest.mark.parametrize(
    ("what", "data"),
    [
        ("garbage", framed(b"\xff" * 64)),
        ("unknown api key", framed(struct.pack(">hhi", 4242, 0, 1) + b"\0\0")),
        ("unsupported produce version", framed(struct.pack(">hhi", PRODUCE, 99, 1) + b"\0\0")),
        ("negative size", struct.pack(">i", -5) + b"x"),
        ("too large", struct.pack(">i", (1 << 20) + 1)),  # no body sent: refused on the size
    ],
)
async def test_bad_input_closes_only_its_connection(what: str, data: bytes) -> None:
    listener = await open_listener(KafkaHandlers(FakeReplicaManager()).handle)  # type: ignore[arg-type]
    try:
        bystander = await asyncio.open_connection("127.0.0.1", listener.port)
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(data)
        await writer.drain()
        assert await closed_by_server(reader), what
        assert sum(listener.closed_for.values()) == 1
        # The broker still serves: a new connection and one opened before.
        correlation_id, body = await api_versions_round_trip(listener.port, 9)
        assert (correlation_id, body.error_code) == (9, KioErrorCode.none)
        b_reader, b_writer = bystander
        b_writer.write(framed(request_bytes(METADATA, 12, 3, metadata_all(12))))
        (size,) = struct.unpack(">i", await asyncio.wait_for(b_reader.readexactly(4), 5))
        assert read_response(METADATA, 12, await b_reader.readexactly(size))[0] == 3
        b_writer.close()
        writer.close()
    finally:
        await listener.stop()


async def test_a_truncated_frame_closes_the_connection() -> None:
    listener = await open_listener(KafkaHandlers(FakeReplicaManager()).handle)  # type: ignore[arg-type]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        payload = request_bytes(METADATA, 12, 1, metadata_all(12))
        writer.write(framed(payload)[:-4])
        writer.write_eof()
        assert await closed_by_server(reader)
        assert listener.closed_for == {"truncated frame": 1}
        writer.close()
    finally:
        await listener.stop()


async def test_unsupported_api_versions_version_is_answered_with_the_supported_list() -> None:
    listener = await open_listener(KafkaHandlers(FakeReplicaManager()).handle)  # type: ignore[arg-type]
    try:
        correlation_id, body = await api_versions_round_trip(listener.port, 21, version=77)
        assert correlation_id == 21
        assert body.error_code == KioErrorCode.unsupported_version
        assert {a.api_key: (a.min_version, a.max_version) for a in body.api_keys} == SUPPORTED
        assert listener.closed_for == {}
    finally:
        await listener.stop()


async def test_stop_ends_connections_whose_answers_never_come() -> None:
    started = asyncio.Event()

    async def never(request: codec.Request) -> Any:
        started.set()
        await asyncio.Event().wait()

    listener = await open_listener(never)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    writer.write(framed(request_bytes(METADATA, 12, 1, metadata_all(12))))
    await writer.drain()
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.wait_for(listener.stop(), 5)
    assert await closed_by_server(reader)
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", listener.port)
    writer.close()


async def test_describe_cluster_for_controllers_is_refused() -> None:
    handlers = KafkaHandlers(FakeReplicaManager())  # type: ignore[arg-type]
    body = codec.make(
        codec.request_class(DESCRIBE_CLUSTER, 1),
        include_cluster_authorized_operations=False,
        endpoint_type=2,
    )
    request = codec.parse_request(request_bytes(DESCRIBE_CLUSTER, 1, 4, body), SUPPORTED)
    answer = await handlers.handle(request)
    assert answer.error_code == KioErrorCode.unsupported_endpoint_type
    assert answer.brokers == ()


async def test_a_failed_answer_frees_a_reader_blocked_on_a_full_pipeline() -> None:
    """The writer gives up (here a handler fails) while the reader waits for room in the
    in-flight queue: the queue is freed, the connection closes and its task ends. Before, the
    reader waited for room for ever and the connection, with its finished answers, stayed."""
    failing = asyncio.Event()

    async def handler(request: codec.Request) -> Any:
        if request.correlation_id == 1:
            await failing.wait()
            raise RuntimeError("handler failed")
        await asyncio.Event().wait()  # never answers

    listener = KafkaListener("127.0.0.1", 0, handler, max_request_bytes=1 << 20, max_in_flight=2)
    await listener.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        body = metadata_all(12)
        for correlation_id in range(1, 7):
            writer.write(framed(request_bytes(METADATA, 12, correlation_id, body)))
        await writer.drain()
        deadline = asyncio.get_running_loop().time() + 5
        while len(listener._connections) != 1:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        failing.set()
        try:
            assert await asyncio.wait_for(reader.read(), 5) == b""
        except ConnectionResetError:
            pass  # the abort may reach the client as a reset
        while listener._connections:
            assert asyncio.get_running_loop().time() < deadline, "the connection never ended"
            await asyncio.sleep(0.01)
        assert listener.closed_for.get("handler failed") == 1
        writer.close()
    finally:
        await listener.stop()
