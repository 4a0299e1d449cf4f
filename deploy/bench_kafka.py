"""`minibroker bench kafka`: the Kafka-protocol listener against gRPC on one running cluster.

Produces 1 KiB records (by default) with confluent-kafka (librdkafka, C) through the brokers'
Kafka ports and with minibroker's own Producer through gRPC, both acks=all and idempotent with
the same linger, each to its own fresh topic; then reads one of those topics from the start with
confluent-kafka's Consumer (Kafka port) and with our Consumer (gRPC). Prints records/s and MB/s
per row (MB = 1024 * 1024, as Kafka's perf tools), or `--json`. It measures, never asserts.

confluent-kafka is a test dependency (`pip install -e '.[dev]'`); without it the command says so.
The cluster is the one `minibroker cluster up` started in `--dir` (it must have Kafka listeners:
a PLAINTEXT cluster).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

MB = 1024 * 1024


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "kafka",
        help="confluent-kafka over the Kafka port vs our client over gRPC, same cluster",
        description="Produce and consume the same records with confluent-kafka (Kafka port) and "
        "minibroker's client (gRPC) on a running `cluster up` cluster; print the throughput.",
    )
    parser.add_argument("--dir", default=".minibroker", help="the cluster's directory")
    parser.add_argument("--num-records", type=int, default=100_000)
    parser.add_argument("--record-size", type=int, default=1024, help="value bytes")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from minibroker.deploy import cluster as launcher

    try:
        import confluent_kafka
    except ImportError:
        print("minibroker bench kafka: needs confluent-kafka (pip install -e '.[dev]')")
        return 1
    if args.num_records <= 0 or args.record_size <= 0 or args.partitions <= 0:
        print("minibroker bench kafka: --num-records, --record-size, --partitions must be > 0")
        return 2
    state = launcher.load_state(args.dir)
    if state is None:
        print(f"minibroker bench kafka: no cluster in {args.dir} (minibroker cluster up)")
        return 1
    if not state.kafka_bootstrap_servers:
        print("minibroker bench kafka: the cluster's brokers have no Kafka listener")
        return 1
    grpc_bootstrap, kafka_bootstrap = state.bootstrap_servers, state.kafka_bootstrap_servers
    run = uuid.uuid4().hex[:8]
    topics = {"confluent": f"bench-kafka-{run}-ck", "minibroker": f"bench-kafka-{run}-mb"}
    _create_topics(grpc_bootstrap, list(topics.values()), args.partitions)
    value = b"x" * args.record_size
    n = args.num_records
    rows = [
        (
            "produce",
            "confluent-kafka",
            "kafka",
            _produce_confluent(
                confluent_kafka, kafka_bootstrap, topics["confluent"], value, n, args.linger_ms
            ),
        ),
        (
            "produce",
            "minibroker",
            "grpc",
            _produce_ours(grpc_bootstrap, topics["minibroker"], value, n, args.linger_ms),
        ),
        (
            "consume",
            "confluent-kafka",
            "kafka",
            _consume_confluent(
                confluent_kafka, kafka_bootstrap, topics["confluent"], args.partitions, n
            ),
        ),
        (
            "consume",
            "minibroker",
            "grpc",
            _consume_ours(grpc_bootstrap, topics["confluent"], args.partitions, n),
        ),
    ]
    out = [
        {
            "phase": phase,
            "client": client,
            "port": port,
            "records": n,
            "record_size": args.record_size,
            "seconds": round(seconds, 3),
            "records_per_s": round(n / seconds),
            "mb_per_s": round(n * args.record_size / MB / seconds, 1),
        }
        for phase, client, port, seconds in rows
    ]
    if args.json:
        print(json.dumps({"rows": out}, indent=2))
        return 0
    print(f"{'PHASE':<8} {'CLIENT':<16} {'PORT':<6} {'RECORDS/S':>10} {'MB/S':>7} {'SECONDS':>8}")
    for r in out:
        print(
            f"{r['phase']:<8} {r['client']:<16} {r['port']:<6} {r['records_per_s']:>10} "
            f"{r['mb_per_s']:>7} {r['seconds']:>8}"
        )
    return 0


def _create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    from minibroker.client import Admin

    with Admin(bootstrap) as admin:
        for name in names:
            admin.create_topic(name, partitions, 3, {"min.insync.replicas": "2"})


def _produce_confluent(
    ck: Any, bootstrap: str, topic: str, value: bytes, n: int, linger_ms: int
) -> float:
    producer = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": linger_ms,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    failed: list[Any] = []

    def done(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    producer.list_topics(topic, timeout=10)  # metadata first, outside the measured time
    start = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                producer.produce(topic, value, on_delivery=done)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    if producer.flush(300) != 0 or failed:
        raise RuntimeError(f"confluent-kafka: {len(failed)} records failed ({failed[:1]})")
    return time.perf_counter() - start


def _produce_ours(bootstrap: str, topic: str, value: bytes, n: int, linger_ms: int) -> float:
    from minibroker.client import Producer

    with Producer(bootstrap, acks="all", enable_idempotence=True, linger_ms=linger_ms) as producer:
        producer.partitions_for(topic)
        start = time.perf_counter()
        for _ in range(n):
            producer.send(topic, value)
        producer.flush()
        return time.perf_counter() - start


def _consume_confluent(ck: Any, bootstrap: str, topic: str, partitions: int, n: int) -> float:
    consumer = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False}
    )
    try:
        consumer.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
        got = 0
        start = time.perf_counter()
        deadline = time.monotonic() + 300
        while got < n and time.monotonic() < deadline:
            for message in consumer.consume(10_000, 1.0):
                if message.error() is None:
                    got += 1
        if got < n:
            raise RuntimeError(f"confluent-kafka read {got} of {n} records")
        return time.perf_counter() - start
    finally:
        consumer.close()


def _consume_ours(bootstrap: str, topic: str, partitions: int, n: int) -> float:
    from minibroker.client import Consumer, TopicPartition

    with Consumer(bootstrap) as consumer:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        got = 0
        start = time.perf_counter()
        deadline = time.monotonic() + 300
        while got < n and time.monotonic() < deadline:
            got += len(consumer.poll(timeout_ms=1000))
        if got < n:
            raise RuntimeError(f"minibroker read {got} of {n} records")
        return time.perf_counter() - start
