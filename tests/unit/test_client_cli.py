"""The client CLI's pure parts: bootstrap lookup, parsing, and Kafka-shaped output lines."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import pathlib
import re
import subprocess
import sys
from typing import Any

import pytest

from minibroker.client.admin import (
    AsyncAdmin,
    BrokerDescription,
    PartitionDescription,
    TopicDescription,
)
from minibroker.client.cli import bench, brokers, consume, leader_election, produce, topics
from minibroker.client.cli.common import (
    FALLBACK_BOOTSTRAP,
    default_bootstrap,
    guarded,
    parse_config_pairs,
)
from minibroker.client.common.config import ConfigError
from minibroker.client.errors import (
    ElectionNotNeededError,
    PreferredLeaderNotAvailableError,
    UnknownTopicOrPartitionError,
)
from minibroker.client.types import Record, TopicPartition
from minibroker.deploy.cli import build_parser


def test_bootstrap_comes_from_env_then_cluster_file_then_fallback(tmp_path: pathlib.Path) -> None:
    assert default_bootstrap(tmp_path, {}) == FALLBACK_BOOTSTRAP
    state = tmp_path / ".minibroker"
    state.mkdir()
    (state / "cluster.json").write_text(json.dumps({"bootstrap_servers": "127.0.0.1:9192"}))
    assert default_bootstrap(tmp_path, {}) == "127.0.0.1:9192"
    env = {"MINIBROKER_BOOTSTRAP_SERVER": "h:1,h:2"}
    assert default_bootstrap(tmp_path, env) == "h:1,h:2"
    (state / "cluster.json").write_text("{not json")
    assert default_bootstrap(tmp_path, {}) == FALLBACK_BOOTSTRAP


def test_every_command_parses_with_the_bootstrap_flag_before_or_after() -> None:
    parser = build_parser()
    args = parser.parse_args(
        [
            "topics",
            "--bootstrap-server",
            "a:1",
            "create",
            "t",
            "--partitions",
            "3",
            "--replication-factor",
            "2",
            "--config",
            "min.insync.replicas=2",
        ]
    )
    assert (args.bootstrap_server, args.name, args.partitions) == ("a:1", "t", 3)
    args = parser.parse_args(["topics", "describe", "--json", "--bootstrap-server", "b:2"])
    assert args.bootstrap_server == "b:2" and args.json
    args = parser.parse_args(["produce", "t", "--key-separator", ":", "--json"])
    assert args.key_separator == ":" and not hasattr(args, "bootstrap_server")
    args = parser.parse_args(["consume", "t", "--from-beginning", "--max-messages", "5"])
    assert args.from_beginning and args.max_messages == 5
    with pytest.raises(SystemExit):
        parser.parse_args(["consume", "t", "--from-beginning", "--offset", "3"])
    args = parser.parse_args(
        ["leader-election", "--election-type", "PREFERRED", "--all-topic-partitions"]
    )
    assert args.election_type == "preferred"
    args = parser.parse_args(
        [
            "bench",
            "produce",
            "--topic",
            "t",
            "--num-records",
            "10",
            "--record-size",
            "100",
            "--throughput",
            "-1",
        ]
    )
    assert args.num_records == 10 and args.throughput == -1
    args = parser.parse_args(["bench", "consume", "--topic", "t", "--messages", "10"])
    assert args.messages == 10


def test_guarded_turns_expected_errors_into_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def boom(_args: object) -> int:
        raise UnknownTopicOrPartitionError("topic 'x' does not exist")

    assert guarded(boom)(object()) == 1  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert err == "error: UnknownTopicOrPartitionError: topic 'x' does not exist\n"


def test_config_pairs() -> None:
    assert parse_config_pairs(["a=1", " b = x=y "]) == {"a": "1", "b": "x=y"}
    with pytest.raises(ConfigError):
        parse_config_pairs(["novalue"])


def test_produce_line_splitting() -> None:
    assert produce.split_line(b"hello\n", None, 1) == (None, b"hello")
    assert produce.split_line(b"k:v:w\r\n", b":", 1) == (b"k", b"v:w")
    assert produce.split_line(b"last", None, 3) == (None, b"last")
    with pytest.raises(ValueError, match="line 4 has no key separator"):
        produce.split_line(b"nokey\n", b":", 4)


class _RefusingProducer:
    """Stands in for the blocking Producer: every second record's batch is refused (the broker
    answered INVALID_TIMESTAMP, e.g. for a producer whose clock runs an hour ahead)."""

    def __init__(self) -> None:
        self.sent = 0

    def send_batch(
        self, topic: str, values: list[bytes], *, keys: object, partition: object
    ) -> object:
        from minibroker.client.errors import InvalidTimestampError
        from minibroker.client.produce_result import ProduceRequestResult, SentRecords
        from minibroker.client.types import TopicPartition

        sent = SentRecords()
        for _ in values:
            result = ProduceRequestResult(TopicPartition(topic, 0))
            if self.sent < 2:
                result.complete(self.sent)
            else:
                result.fail(
                    InvalidTimestampError(f"a batch of 3 record(s) for {topic}-0 failed: too late")
                )
            sent._add_run(result, 0, 1)
            self.sent += 1
        return sent

    def flush(self) -> None:
        return None


def test_produce_reports_a_refused_batch_once_not_per_record(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = io.StringIO()
    failures = produce.produce_lines(
        _RefusingProducer(),
        "t",
        io.BytesIO(b"a\nb\nc\nd\ne\n"),
        separator=None,
        partition=None,
        as_json=True,
        out=out,
    )
    assert len(failures) == 3, "every record that failed is counted"
    assert [json.loads(line)["offset"] for line in out.getvalue().splitlines()] == [0, 1]
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: InvalidTimestampError: a batch of 3 record(s) for t-0 failed: too late"]


def test_consume_json_is_text_or_base64() -> None:
    text = Record("t", 1, 7, 123, b"k", b"v", (("h", b"x"),))
    assert consume.record_json(text) == {
        "topic": "t",
        "partition": 1,
        "offset": 7,
        "timestamp": 123,
        "key": "k",
        "value": "v",
        "headers": {"h": "x"},
    }
    binary = Record("t", 0, 1, 5, None, b"\xff\x00", (("h", None),))
    out = consume.record_json(binary)
    assert out["encoding"] == "base64"
    assert out["key"] is None and base64.b64decode(out["value"]) == b"\xff\x00"
    assert out["headers"] == {"h": None}
    buf = io.BytesIO()
    consume.write_record(Record("t", 0, 0, 0, None, None), buf, as_json=False)
    consume.write_record(Record("t", 0, 1, 0, None, b"v"), buf, as_json=False)
    assert buf.getvalue() == b"null\nv\n"


def _topic() -> TopicDescription:
    parts = (
        PartitionDescription(
            "foo", 0, 1, 3, 4, (1, 2, 3), (1, 2), (3,), 10, {1: 10, 2: 10, 3: None}
        ),
        PartitionDescription("foo", 1, -1, 2, 5, (2, 3, 1), (2,), (2, 3, 1), -1, {2: None}),
    )
    return TopicDescription("foo", "tid", parts, {"min.insync.replicas": "2"})


def test_topics_describe_lines_follow_kafkas_layout() -> None:
    lines = topics.format_describe([_topic()])
    assert lines[0] == (
        "Topic: foo\tTopicId: tid\tPartitionCount: 2\tReplicationFactor: 3\t"
        "Configs: min.insync.replicas=2"
    )
    assert lines[1] == (
        "\tTopic: foo\tPartition: 0\tLeader: 1\tLeaderEpoch: 3\tReplicas: 1,2,3\tIsr: 1,2\t"
        "OfflineReplicas: 3\tHighWatermark: 10\tLogEndOffsets: 1=10,2=10,3=?"
    )
    assert "\tLeader: none\t" in lines[2] and "HighWatermark: ?" in lines[2]


def _quorum(role: str, leader: int, address: str, hw: int, n: int = 3) -> Any:
    from minibroker.proto import minibroker_pb2 as pb

    return pb.DescribeQuorumResponse(
        role=role,
        leader_id=leader,
        leader_epoch=3,
        leader_address=address,
        high_watermark=hw,
        voters=[pb.QuorumVoter(voter_id=1000 + i) for i in reversed(range(n))],
    )


def test_topics_describe_quorum_header() -> None:
    header = topics.format_quorum_header(_quorum("leader", 1001, "h:2", 42))
    assert header == (
        "Controller quorum: leader 1001 (epoch 3), voters 1000,1001,1002, high watermark 42"
    )
    assert "leader none (epoch 3)" in str(
        topics.format_quorum_header(_quorum("prospective", -1, "", 7))
    )
    # A quorum of one (or no answer) adds no line: the output stays Kafka's.
    assert topics.format_quorum_header(_quorum("leader", 1000, "h:1", 5, n=1)) is None
    assert topics.format_quorum_header(None) is None


def test_topics_describe_asks_the_quorum_leader_and_skips_silently_on_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import grpc

    answers: dict[str, Any] = {
        "c1:1": _quorum("follower", 1001, "c2:2", 40),
        "c2:2": _quorum("leader", 1001, "c2:2", 42),
    }
    asked: list[str] = []

    class Stub:
        def __init__(self, address: str) -> None:
            self.address = address

        async def DescribeQuorum(self, request: Any, timeout: float) -> Any:
            asked.append(self.address)
            answer = answers.get(self.address)
            if answer is None:
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata()
                )
            return answer

    class Admin:
        def __init__(self, controller: str | None) -> None:
            self.cluster = self
            self.metadata = self
            self.controller = controller

        def controller_address(self) -> str | None:
            return self.controller

        def channel(self, address: str) -> str:
            return address

    monkeypatch.setattr(topics.pb_grpc, "QuorumServiceStub", Stub)
    got = asyncio.run(topics._describe_quorum(Admin("c1:1")))
    assert asked == ["c1:1", "c2:2"] and got.high_watermark == 42  # the leader's, not 40
    asked.clear()
    answers.pop("c2:2")  # the leader does not answer: the follower's view will do
    assert asyncio.run(topics._describe_quorum(Admin("c1:1"))).high_watermark == 40
    assert asyncio.run(topics._describe_quorum(Admin("gone:9"))) is None
    assert asyncio.run(topics._describe_quorum(Admin(None))) is None


def test_topics_describe_json_shape() -> None:
    rows = topics.describe_json([_topic()])
    assert rows[0] == {
        "topic": "foo",
        "partition": 0,
        "leader": 1,
        "leader_epoch": 3,
        "partition_epoch": 4,
        "replicas": [1, 2, 3],
        "isr": [1, 2],
        "offline_replicas": [3],
        "adding_replicas": [],
        "removing_replicas": [],
        "high_watermark": 10,
        "log_end_offsets": {"1": 10, "2": 10, "3": None},
        "cleaner_points": {},
        "dirty_ratios": {},
    }
    assert json.loads(json.dumps(rows)) == rows


def test_topics_describe_shows_a_compacted_partitions_cleaner_points() -> None:
    compacted = PartitionDescription(
        "cl", 0, 1, 3, 4, (1, 2, 3), (1, 2, 3), (), 90, {1: 90, 2: 90, 3: None},
        cleaner_points={1: 60, 2: 55, 3: None},
        dirty_ratios={1: 0.125, 2: 0.5, 3: None},
    )  # fmt: skip
    topic = TopicDescription("cl", "tid", (compacted,), {"cleanup.policy": "compact"})
    line = topics.format_describe([topic])[1]
    assert line.endswith(
        "LogEndOffsets: 1=90,2=90,3=?\tCleanerPoints: 1=60,2=55,3=?\tDirtyRatios: 1=0.12,2=0.50,3=?"
    )
    row = topics.describe_json([topic])[0]
    assert row["cleaner_points"] == {"1": 60, "2": 55, "3": None}
    assert row["dirty_ratios"] == {"1": 0.125, "2": 0.5, "3": None}
    # A topic that is not compacted shows neither column.
    assert "CleanerPoints" not in topics.format_describe([_topic()])[1]


def test_describe_replicas_answer_carries_the_cleaner_point_of_compacted_logs() -> None:
    from minibroker.client import wire as client_wire
    from minibroker.proto import minibroker_pb2 as pb

    resp = pb.DescribeReplicasResponse(
        broker_id=2,
        replicas=[
            pb.ReplicaDescription(topic="cl", partition=0, log_end_offset=9, compacted=True,
                                  cleaner_point=0, dirty_ratio=0.0),
            pb.ReplicaDescription(topic="plain", partition=0, log_end_offset=9),
        ],
    )  # fmt: skip
    cl, plain = client_wire.replica_offsets(resp)
    assert (cl.cleaner_point, cl.dirty_ratio) == (0, 0.0)
    assert (plain.cleaner_point, plain.dirty_ratio) == (None, None)


def test_leader_election_output_uses_kafkas_wording() -> None:
    results = {
        TopicPartition("foo", 1): None,
        TopicPartition("foo", 0): None,
        TopicPartition("foo", 2): ElectionNotNeededError("already"),
        TopicPartition("foo", 3): PreferredLeaderNotAvailableError("not in ISR"),
    }
    out, err = leader_election.format_results("preferred", results)
    assert out == [
        "Successfully completed leader election (PREFERRED) for partitions foo-0, foo-1",
        "Valid replica already elected for partitions foo-2",
    ]
    assert err[0].startswith("Error completing leader election (PREFERRED) for partition: foo-3: ")
    assert err[-1] == "1 replica(s) could not be elected"


def test_producer_perf_summary_line_format() -> None:
    clock = iter([0.0] + [0.1 * i for i in range(1, 200)])
    stats = bench.LatencyStats(100, io.StringIO(), clock=lambda: next(clock))
    for i in range(100):
        stats.record(float(i + 1), 1000)
    line = stats.summary(end=2.0)
    pattern = (
        r"^100 records sent, 50\.0 records/sec \(0\.05 MB/sec\), 50\.50 ms avg latency, "
        r"100\.00 ms max latency, 51 ms 50th, 96 ms 95th, 100 ms 99th, 100 ms 99\.9th\.$"
    )
    assert re.match(pattern, line), line
    assert "records sent" in stats.out.getvalue(), "a window line every 5 s"


def test_producer_props_accept_kafka_names() -> None:
    props = bench._typed_props(
        [
            "linger.ms=5",
            "max.in.flight.requests.per.connection=1",
            "enable.idempotence=false",
            "compression.type=lz4",
            "acks=all",
        ]
    )
    assert props == {
        "linger_ms": 5,
        "max_in_flight": 1,
        "enable_idempotence": False,
        "compression_type": "lz4",
        "acks": "all",
    }


def test_consumer_perf_line_format() -> None:
    line = bench.consumer_line(1000.0, 1002.0, 4 * 1024 * 1024, 400)
    fields = line.split(", ")
    assert len(fields) == len(bench.CONSUMER_HEADER.split(", ")) == 10
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:\d{3}$", fields[0])
    assert fields[2:] == ["4.0000", "2.0000", "400", "200.0000", "0", "2000", "2.0000", "200.0000"]


def test_importing_the_client_package_stays_light() -> None:
    code = (
        "import sys, minibroker.client, minibroker.client.errors;"
        "print(sorted(m for m in ('grpc', 'pyspark', 'rich') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    code = "from minibroker.client import Producer, AsyncAdmin, NotLeaderOrFollowerError; print(1)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_brokers_commands_parse() -> None:
    parser = build_parser()
    args = parser.parse_args(["brokers", "unregister", "3", "--bootstrap-server", "h:1"])
    assert (args.id, args.bootstrap_server) == (3, "h:1")
    args = parser.parse_args(["brokers", "--bootstrap-server", "h:2", "list", "--json"])
    assert args.json and args.bootstrap_server == "h:2"
    with pytest.raises(SystemExit):
        parser.parse_args(["brokers", "unregister", "three"])
    with pytest.raises(SystemExit):
        parser.parse_args(["leader-election", "--election-type", "dirty", "--all-topic-partitions"])


def test_brokers_list_lines_and_json() -> None:
    rows = (
        BrokerDescription(1, "127.0.0.1", 9092, "rack-a", False, False, 12, 85),
        BrokerDescription(2, "127.0.0.1", 9093, "", True, False, 30, -1),
        BrokerDescription(3, "127.0.0.1", 9094, "", False, True, 44, 10),
    )
    assert brokers.format_brokers(rows) == [
        "Broker: 1\tAddress: 127.0.0.1:9092\tRack: rack-a\tState: active\tReplicas: 0\t"
        "Leaders: 0\tBrokerEpoch: 12\tLastHeartbeatMsAgo: 85",
        "Broker: 2\tAddress: 127.0.0.1:9093\tRack: \tState: fenced\tReplicas: 0\t"
        "Leaders: 0\tBrokerEpoch: 30\tLastHeartbeatMsAgo: -1",
        "Broker: 3\tAddress: 127.0.0.1:9094\tRack: \tState: shutting-down\tReplicas: 0\t"
        "Leaders: 0\tBrokerEpoch: 44\tLastHeartbeatMsAgo: 10",
    ]
    assert brokers.describe_json(rows[:1]) == [
        {
            "broker_id": 1,
            "host": "127.0.0.1",
            "port": 9092,
            "rack": "rack-a",
            "state": "active",
            "replicas": 0,
            "leaders": 0,
            "broker_epoch": 12,
            "last_heartbeat_ms_ago": 85,
        }
    ]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda a: a.unregister_broker(-1), ValueError),
        (lambda a: a.unregister_broker(2**31), ValueError),
        (lambda a: a.unregister_broker("3"), TypeError),
        (lambda a: a.unregister_broker(True), TypeError),
        (lambda a: a.elect_leaders("dirty"), ValueError),
        (lambda a: a.elect_leaders(2), ValueError),
    ],
)
def test_admin_refuses_bad_arguments_before_calling_anyone(call, error) -> None:
    async def main() -> None:
        # An address nobody listens on: the error must come before any connection attempt.
        async with AsyncAdmin("127.0.0.1:1", default_api_timeout_ms=100) as admin:
            await call(admin)

    with pytest.raises(error):
        asyncio.run(main())


class _ChunkedStdin(io.RawIOBase):
    """A pipe: each read returns what one write put in, never more."""

    def __init__(self, writes: list[bytes]) -> None:
        self.writes = list(writes)

    def readable(self) -> bool:
        return True

    def read1(self, size: int = -1) -> bytes:
        return self.writes.pop(0) if self.writes else b""


def test_produce_reads_what_each_read_returns_and_keeps_split_lines_whole() -> None:
    pipe = _ChunkedStdin([b"a\nb", b"c\r\n", b"d\n", b"e"])
    assert list(produce.read_lines(pipe)) == [[b"a\n"], [b"bc\r\n"], [b"d\n"], [b"e"]]
    assert [split for lines in produce.read_lines(io.BytesIO(b"x\ny\n")) for split in lines] == [
        b"x\n",
        b"y\n",
    ]


def test_produce_sends_each_read_as_one_batch_with_keys_and_says_which_line_is_bad() -> None:
    calls: list[tuple[list[bytes], object]] = []

    class Recording:
        def send_batch(self, topic: str, values: list[bytes], *, keys: object, partition: object):  # type: ignore[no-untyped-def]
            calls.append((values, keys))
            return []

        def flush(self) -> None:
            return None

    produce.produce_lines(
        Recording(),
        "t",
        _ChunkedStdin([b"k1:v1\nk2:v2\n", b"k3:v3\n"]),  # type: ignore[arg-type]
        separator=b":",
        partition=None,
        as_json=False,
        out=io.StringIO(),
    )
    assert calls == [([b"v1", b"v2"], [b"k1", b"k2"]), ([b"v3"], [b"k3"])]
    with pytest.raises(ValueError, match="line 3 has no key separator"):
        produce.produce_lines(
            Recording(),
            "t",
            _ChunkedStdin([b"k1:v1\nk2:v2\n", b"oops\n"]),  # type: ignore[arg-type]
            separator=b":",
            partition=None,
            as_json=False,
            out=io.StringIO(),
        )
