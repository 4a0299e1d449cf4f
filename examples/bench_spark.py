"""Benchmark: rows/s of a Spark batch write and batch read through `format("minibroker")`, beside
the client's own produce and consume rates in the same run, on the same cluster.

    python examples/bench_spark.py                       # starts a local 3-broker cluster
    python examples/bench_spark.py --bootstrap-servers 127.0.0.1:9092 --rows 1000000

Measures, never asserts. Each figure is rows / wall-clock seconds of one step:
  client produce   one blocking Producer (acks=all) sending `--rows` values of `--value-bytes`
  client produce async  the same with AsyncProducer on one event loop (what a sink task runs)
  client consume   one blocking Consumer reading them back from offset 0 to the high watermark
  spark write      spark.range(rows) -> 100-byte values -> df.write.format("minibroker"), `--repeat`
                   times (the first also starts the sink's Python workers)
  spark write noop the same rows to Spark's `noop` sink: Spark's own cost of making them
  spark read 10 rows  a warm read of 10 rows: the fixed cost of one query
  spark read       spark.read.format("minibroker") -> sum(length(value)), Arrow batches
  spark read tuples  the same with useArrow=false (one Python tuple per row)
Spark runs local[N] (`--master`); a tiny read first warms the Python workers up.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from minibroker.client import Admin, AsyncProducer, Consumer, Producer, TopicPartition
from minibroker.client.common.runtime import new_event_loop


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", default="", help="default: start a local cluster")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--replication-factor", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--skip-tuples", action="store_true", help="skip the tuple-path read")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each read path")
    return parser.parse_args()


@contextlib.contextmanager
def cluster(bootstrap: str) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    from minibroker.deploy import cluster as launcher

    directory = tempfile.mkdtemp(prefix="minibroker-bench-spark-")
    state = launcher.up(directory, brokers=3, base_port=0, settings={}, timeout_s=60.0)
    try:
        yield state.bootstrap_servers
    finally:
        # Stop what this run started, by PID (the launcher's down), then SIGKILL stragglers.
        with contextlib.suppress(launcher.LauncherError):
            launcher.down(directory)
        for spec in (launcher.load_state(directory) or state).all():
            if spec.pid > 0 and launcher.process_state(spec) != "stopped":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(spec.pid, signal.SIGKILL)


def report(name: str, rows: int, seconds: float) -> None:
    print(
        f"{name:<20} {rows:>10} rows  {seconds:8.2f} s  {rows / seconds:>12,.0f} rows/s", flush=True
    )


def client_produce(bootstrap: str, topic: str, rows: int, value_bytes: int) -> None:
    value = b"x" * value_bytes
    start = time.perf_counter()
    with Producer(bootstrap, acks="all") as producer:
        for _ in range(rows):
            producer.send(topic, value)
        producer.flush()
    report("client produce", rows, time.perf_counter() - start)


def client_produce_async(bootstrap: str, topic: str, rows: int, value_bytes: int) -> None:
    """AsyncProducer on one event loop: what each task of the Spark sink runs."""
    value = b"x" * value_bytes

    async def run() -> None:
        async with AsyncProducer(bootstrap, acks="all") as producer:
            for _ in range(rows):
                await producer.send(topic, value)
            await producer.flush()

    start = time.perf_counter()
    loop = new_event_loop()
    try:
        loop.run_until_complete(run())
    finally:
        loop.close()
    report("client produce async", rows, time.perf_counter() - start)


def client_consume(bootstrap: str, topic: str, partitions: int) -> int:
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    start = time.perf_counter()
    with Consumer(bootstrap, auto_offset_reset="earliest", max_poll_records=10_000) as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        total = sum(ends.values())
        seen = 0
        while seen < total:
            seen += len(consumer.poll(timeout_ms=1000))
    report("client consume", total, time.perf_counter() - start)
    return total


def spark_session(master: str) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from minibroker.client.spark import register

    spark = (
        SparkSession.builder.master(master)
        .appName("minibroker-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def spark_read(spark: Any, bootstrap: str, topic: str, rows: int, use_arrow: bool) -> None:
    df = (
        spark.read.format("minibroker")
        .option("bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("useArrow", str(use_arrow).lower())
        .load()
    )
    start = time.perf_counter()
    (result,) = df.selectExpr("count(*) AS n", "sum(length(value)) AS bytes").collect()
    seconds = time.perf_counter() - start
    if result.n != rows:
        print(f"  (read {result.n} rows, expected {rows})")
    report("spark read arrow" if use_arrow else "spark read tuples", result.n, seconds)


def spark_write(spark: Any, bootstrap: str, topic: str, rows: int, value_bytes: int) -> None:
    df = spark.range(rows, numPartitions=2).selectExpr(
        f"cast(lpad(cast(id AS string), {value_bytes}, 'x') AS binary) AS value"
    )
    start = time.perf_counter()
    df.write.format("minibroker").option("bootstrap.servers", bootstrap).option(
        "topic", topic
    ).mode("append").save()
    report("spark write", rows, time.perf_counter() - start)


def spark_write_noop(spark: Any, rows: int, value_bytes: int) -> None:
    """The same rows written to Spark's own `noop` sink: what making them costs Spark, without
    any Python worker or broker (the floor under `spark write`)."""
    df = spark.range(rows, numPartitions=2).selectExpr(
        f"cast(lpad(cast(id AS string), {value_bytes}, 'x') AS binary) AS value"
    )
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    report("spark write noop", rows, time.perf_counter() - start)


def main() -> int:
    args = parse_args()
    with cluster(args.bootstrap_servers) as bootstrap:
        suffix = str(int(time.time()))
        client_topic, spark_topic = f"bench-client-{suffix}", f"bench-spark-{suffix}"
        async_topic = f"bench-async-{suffix}"
        with Admin(bootstrap) as admin:
            for name in (client_topic, spark_topic, async_topic):
                admin.create_topic(name, args.partitions, args.replication_factor)
        print(
            f"{args.rows} rows of {args.value_bytes} B, {args.partitions} partitions, "
            f"RF {args.replication_factor}, acks=all, Spark {args.master}",
            flush=True,
        )
        client_produce(bootstrap, client_topic, args.rows, args.value_bytes)
        client_produce_async(bootstrap, async_topic, args.rows, args.value_bytes)
        client_consume(bootstrap, client_topic, args.partitions)
        spark = spark_session(args.master)
        try:
            # Warm the Python workers up on a tiny range (their first start costs seconds), then
            # time the same tiny read: a query's cost whatever it reads.
            for warm in (True, False):
                start = time.perf_counter()
                spark.read.format("minibroker").option("bootstrap.servers", bootstrap).option(
                    "subscribe", client_topic
                ).option("endingOffsets", f'{{"{client_topic}": {{"0": 10}}}}').load().count()
                if not warm:
                    report("spark read 10 rows", 10, time.perf_counter() - start)
            # Writes repeat too: the first one also starts the sink's Python workers.
            for _ in range(args.repeat):
                spark_write(spark, bootstrap, spark_topic, args.rows, args.value_bytes)
            spark_write_noop(spark, args.rows, args.value_bytes)
            # Alternate the two read paths so that neither gets all the warm caches.
            for _ in range(args.repeat):
                spark_read(spark, bootstrap, client_topic, args.rows, use_arrow=True)
                if not args.skip_tuples:
                    spark_read(spark, bootstrap, client_topic, args.rows, use_arrow=False)
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
