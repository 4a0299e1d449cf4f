"""`minibroker bench kafka`: the Kafka-protocol listener against gRPC on one running cluster.

Produces 1 KiB records (by default) with confluent-kafka (librdkafka, C) through the brokers'
Kafka ports and with minibroker's own Producer through gRPC, both acks=all and idempotent with
the same linger, each to its own fresh topic; then reads one of those topics from the start with
confluent-kafka's Consumer (Kafka port) and with our Consumer (gRPC). Each row is run --runs
times (3 by default, fresh topics each run): its median is printed with every run's records/s,
then the ratio Kafka port / gRPC per phase and the load average (the machine may be shared).
Prints records/s and MB/s per row (MB = 1024 * 1024, as Kafka's perf tools), or `--json`.
It measures, never asserts.

confluent-kafka is a test dependency (`pip install -e '.[dev]'`); without it the command says so.
The cluster is the one `minibroker cluster up` started in `--dir` (it must have Kafka listeners:
a PLAINTEXT cluster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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
    parser.add_argument(
        "--confluent-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a librdkafka setting for confluent-kafka's producer and consumer (repeatable), "
        "e.g. fetch.queue.backoff.ms=10",
    )
    parser.add_argument(
        "--runs", type=int, default=3, help="runs of each row; the median is printed (default 3)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from minibroker.deploy import cluster as launcher

    try:
        import confluent_kafka
    except ImportError:
        print("minibroker bench kafka: needs confluent-kafka (pip install -e '.[dev]')")
        return 1
    if min(args.num_records, args.record_size, args.partitions, args.runs) <= 0:
        print(
            "minibroker bench kafka: --num-records, --record-size, --partitions, --runs must be > 0"
        )
        return 2
    state = launcher.load_state(args.dir)
    if state is None:
        print(f"minibroker bench kafka: no cluster in {args.dir} (minibroker cluster up)")
        return 1
    if not state.kafka_bootstrap_servers:
        print("minibroker bench kafka: the cluster's brokers have no Kafka listener")
        return 1
    grpc_bootstrap, kafka_bootstrap = state.bootstrap_servers, state.kafka_bootstrap_servers
    extra: dict[str, str] = {}
    for setting in args.confluent_set:
        key, sep, val = setting.partition("=")
        if not sep or not key:
            print(f"minibroker bench kafka: --confluent-set {setting!r}: KEY=VALUE")
            return 2
        extra[key] = val
    value = b"x" * args.record_size
    n = args.num_records
    # (phase, client, port) -> seconds of each run; every run writes its own fresh topics.
    seconds: dict[tuple[str, str, str], list[float]] = {}
    for _ in range(args.runs):
        run = uuid.uuid4().hex[:8]
        topics = {"confluent": f"bench-kafka-{run}-ck", "minibroker": f"bench-kafka-{run}-mb"}
        _create_topics(grpc_bootstrap, list(topics.values()), args.partitions)
        measured = [
            (
                ("produce", "confluent-kafka", "kafka"),
                _produce_confluent(
                    confluent_kafka,
                    kafka_bootstrap,
                    topics["confluent"],
                    value,
                    n,
                    args.linger_ms,
                    extra,
                ),
            ),
            (
                ("produce", "minibroker", "grpc"),
                _produce_ours(grpc_bootstrap, topics["minibroker"], value, n, args.linger_ms),
            ),
            (
                ("consume", "confluent-kafka", "kafka"),
                _consume_confluent(
                    confluent_kafka,
                    kafka_bootstrap,
                    topics["confluent"],
                    args.partitions,
                    n + args.partitions,  # and the producer's warm-up records
                    extra,
                ),
            ),
            (
                ("consume", "minibroker", "grpc"),
                _consume_ours(
                    grpc_bootstrap, topics["confluent"], args.partitions, n + args.partitions
                ),
            ),
        ]
        for key, took in measured:
            seconds.setdefault(key, []).append(took)
    out = []
    for (phase, client, port), runs in seconds.items():
        median = statistics.median(runs)
        out.append(
            {
                "phase": phase,
                "client": client,
                "port": port,
                "records": n,
                "record_size": args.record_size,
                "runs": len(runs),
                "seconds": round(median, 3),
                "records_per_s": round(n / median),
                "mb_per_s": round(n * args.record_size / MB / median, 1),
                "records_per_s_each_run": [round(n / s) for s in runs],
            }
        )
    ratios = {
        phase: round(_rate(out, phase, "kafka") / _rate(out, phase, "grpc"), 2)
        for phase in ("produce", "consume")
    }
    load = _load_average()
    if args.json:
        report = {
            "rows": out,
            "kafka_over_grpc": ratios,
            "load_average": load,
            "confluent_settings": extra,
        }
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{'PHASE':<8} {'CLIENT':<16} {'PORT':<6} {'RECORDS/S':>10} {'MB/S':>7} {'SECONDS':>8}"
        f"  RUNS (records/s)"
    )
    for r in out:
        print(
            f"{r['phase']:<8} {r['client']:<16} {r['port']:<6} {r['records_per_s']:>10} "
            f"{r['mb_per_s']:>7} {r['seconds']:>8}  "
            + " ".join(str(x) for x in r["records_per_s_each_run"])
        )
    print(
        f"median of {args.runs} run(s); Kafka/gRPC: produce {ratios['produce']}, "
        f"consume {ratios['consume']}; load average {' '.join(f'{x:.2f}' for x in load)}"
    )
    if extra:
        print("librdkafka settings: " + " ".join(f"{k}={v}" for k, v in extra.items()))
    return 0


def _rate(rows: list[dict[str, Any]], phase: str, port: str) -> float:
    return float(
        next(r["records_per_s"] for r in rows if r["phase"] == phase and r["port"] == port)
    )


def _load_average() -> tuple[float, float, float]:
    try:
        one, five, fifteen = os.getloadavg()
        return (round(one, 2), round(five, 2), round(fifteen, 2))
    except OSError:
        return (0.0, 0.0, 0.0)


def _create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    from minibroker.client import Admin

    with Admin(bootstrap) as admin:
        for name in names:
            admin.create_topic(name, partitions, 3, {"min.insync.replicas": "2"})


def _produce_confluent(
    ck: Any,
    bootstrap: str,
    topic: str,
    value: bytes,
    n: int,
    linger_ms: int,
    extra: dict[str, str] | None = None,
) -> float:
    producer = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": linger_ms,
            "queue.buffering.max.messages": 1_000_000,
            **(extra or {}),
        }
    )
    failed: list[Any] = []

    def done(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err)

    # Outside the measured time: metadata, a connection to every leader and the producer id
    # (one record to each partition, read back by the consumers as the first ones).
    partitions = len(producer.list_topics(topic, timeout=10).topics[topic].partitions)
    for partition in range(partitions):
        producer.produce(topic, value, partition=partition, on_delivery=done)
    if producer.flush(60) != 0 or failed:
        raise RuntimeError(f"confluent-kafka: the warm-up failed ({failed[:1]})")
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
        # The same warm-up as confluent-kafka's: one record to each partition, unmeasured.
        for partition in producer.partitions_for(topic):
            producer.send(topic, value, partition=partition)
        producer.flush()
        start = time.perf_counter()
        for _ in range(n):
            producer.send(topic, value)
        producer.flush()
        return time.perf_counter() - start


def _consume_confluent(
    ck: Any,
    bootstrap: str,
    topic: str,
    partitions: int,
    n: int,
    extra: dict[str, str] | None = None,
) -> float:
    # librdkafka's defaults, as a user gets them: among them its fetch queue's flow control (a
    # consumer queue of queued.max.messages.kbytes = 64 MiB or queued.min.messages stops
    # fetching for fetch.queue.backoff.ms = 1 s), which a reader slower than the brokers hits.
    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            **(extra or {}),
        }
    )
    try:
        consumer.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
        got = 0
        start = time.perf_counter()
        deadline = time.monotonic() + 300
        while got < n and time.monotonic() < deadline:
            # consume() waits for as many messages as asked (or the timeout): ask for no more
            # than are left, or the last call sits out its timeout.
            for message in consumer.consume(min(10_000, n - got), 1.0):
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
