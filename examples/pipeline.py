"""Example PySpark pipeline: raw events from one topic -> per-user totals -> another topic.

    python examples/pipeline.py --bootstrap-servers 127.0.0.1:9092 \
        --input demo-events --output demo-results --checkpoint /tmp/pipeline-ckpt

Reads JSON events `{"seq": 1, "user": "alice", "amount": 42}` (the records `minibroker demo`
writes; `--generate N` writes N of them first for a standalone run) with
`spark.readStream.format("minibroker")`, keeps a running count and sum of `amount` per user
(Spark keeps that state in the checkpoint), and writes every updated total as a record keyed by
user to the output topic with `format("minibroker")` (from `foreachBatch`, because a running
aggregate needs the update output mode, which Python data sources do not offer for streaming
writes), one JSON value per user and micro-batch:
`{"user": "alice", "events": 12, "total": 530, "last_seq": 977}`. Readers of the output keep the
latest record per key (the record with the largest `events` wins), as with a compacted topic.

The same code runs on Spark's Kafka connector: swap the format for "kafka" and the option
`bootstrap.servers` for `kafka.bootstrap.servers`.

`--command-config FILE` (Kafka client properties, such as the client.properties of a
`minibroker cluster up --tls` cluster: `security.protocol=SSL`, `ssl.ca.location`, ...) connects
over TLS: its properties go to the script's own clients as keyword arguments and to the source
and the sink as `kafka.`-prefixed options, the form Spark's Kafka connector takes too.

Runs until stopped (a processing-time trigger), or with `--available-now` processes what is in
the input topic and exits. SIGTERM (`docker compose stop`) or Ctrl-C stops the query between
micro-batches and exits 0; the checkpoint then holds every finished batch, and a restart resumes
after the last one (a batch that was cut short is run again). `--generate N` tops the input topic
up to N records of sample events, so a restart finds them there and writes none.

The environment needs PYSPARK_PYTHON pointing at a Python that has minibroker[spark] installed
(this script sets it to its own interpreter when unset).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from typing import Any

DEFAULT_BOOTSTRAP = os.environ.get("MINIBROKER_BOOTSTRAP_SERVER", "127.0.0.1:9092")
EVENT_SCHEMA = "seq long, user string, amount long"
# How long a stop request waits for the running micro-batch to finish before it interrupts it
# (the compose file gives the pipeline 20 s after SIGTERM before SIGKILL).
STOP_WAIT_S = 10.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", default=DEFAULT_BOOTSTRAP)
    parser.add_argument("--input", default="demo-events", help="topic of raw JSON events")
    parser.add_argument("--output", default="demo-results", help="topic of per-user totals")
    parser.add_argument(
        "--checkpoint",
        "--checkpoint-dir",
        dest="checkpoint",
        default="/tmp/minibroker-pipeline-ckpt",
        help="Spark checkpoint directory (offsets and aggregation state)",
    )
    parser.add_argument("--trigger-seconds", type=float, default=2.0)
    parser.add_argument(
        "--available-now", action="store_true", help="process what is there now, then exit"
    )
    parser.add_argument("--max-offsets-per-trigger", type=int, default=0)
    parser.add_argument(
        "--generate",
        type=int,
        default=0,
        metavar="N",
        help="first top the input topic up to N records with sample events (only the missing "
        "ones are written, so a restart writes none)",
    )
    parser.add_argument("--master", default=os.environ.get("SPARK_MASTER", "local[*]"))
    parser.add_argument(
        "--command-config",
        metavar="FILE",
        default=None,
        help="Kafka client properties (TLS: security.protocol=SSL, ssl.ca.location, ...) for "
        "every connection",
    )
    return parser.parse_args(argv)


def client_properties(path: str | None) -> dict[str, str]:
    """The --command-config file's properties ({} without one); the PEM files it names are read
    once here, so a wrong path fails before Spark starts."""
    if not path:
        return {}
    from minibroker.client.common.config import load_file
    from minibroker.client.common.tls import client_tls_from_properties

    props = {str(k): str(v) for k, v in load_file(path).items()}
    client_tls_from_properties(props)
    return props


def client_kwargs(props: dict[str, str]) -> dict[str, str]:
    """Kafka property names -> the Python client's keyword arguments."""
    return {key.replace(".", "_"): value for key, value in props.items()}


def spark_options(props: dict[str, str]) -> dict[str, str]:
    """Kafka property names -> source and sink options (`kafka.` + the name)."""
    return {f"kafka.{key}": value for key, value in props.items()}


def ensure_topics(bootstrap: str, names: list[str], **client: str) -> None:
    """Create missing topics (3 partitions, replication factor up to 3)."""
    from minibroker.client import Admin

    with Admin(bootstrap, **client) as admin:
        existing = set(admin.list_topics())
        brokers = len(admin.describe_cluster().brokers)
        for name in names:
            if name not in existing:
                admin.create_topic(name, 3, min(3, brokers))


def generate(bootstrap: str, topic: str, count: int, **client: str) -> int:
    """Write sample events until `topic` holds `count` records; returns how many were written.

    The records already there are counted from the partitions' end offsets (every record ever
    written, whatever retention deleted since), and the missing events continue their `seq`.
    """
    from minibroker.client import Consumer, Producer, TopicPartition

    with Consumer(bootstrap, **client) as consumer:
        partitions = consumer.partitions_for_topic(topic)
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in partitions])
    users = ("alice", "bob", "carol", "dave", "erin")
    first = sum(ends.values())
    with Producer(bootstrap, **client) as producer:
        for i in range(first, count):
            user = users[i % len(users)]
            value = json.dumps({"seq": i, "user": user, "amount": (i * 7) % 100})
            producer.send(topic, value.encode(), key=user.encode())
        producer.flush()
    return max(0, count - first)


def build_session(master: str) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from minibroker.client.spark import register

    spark = (
        SparkSession.builder.master(master)
        .appName("minibroker-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        # Python workers must connect back within this time; 15 s (the default) is too short
        # on a busy 2-core machine, where starting a worker can take longer.
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark


def totals_query(spark: Any, args: argparse.Namespace) -> Any:
    """The transformation: parse, drop malformed events, aggregate per user, encode."""
    from pyspark.sql import functions as F

    source = (
        spark.readStream.format("minibroker")
        .option("bootstrap.servers", args.bootstrap_servers)
        .option("subscribe", args.input)
        .option("startingOffsets", "earliest")
        .options(**spark_options(client_properties(args.command_config)))
    )
    if args.max_offsets_per_trigger > 0:
        source = source.option("maxOffsetsPerTrigger", str(args.max_offsets_per_trigger))
    events = (
        source.load()
        .select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
        .select("e.*")
        .where(F.col("user").isNotNull() & F.col("amount").isNotNull())
    )
    totals = events.groupBy("user").agg(
        F.count(F.lit(1)).alias("events"),
        F.sum("amount").alias("total"),
        F.max("seq").alias("last_seq"),
    )
    return totals.select(
        F.col("user").alias("key"),
        F.to_json(F.struct("user", "events", "total", "last_seq")).alias("value"),
    )


class GracefulStop:
    """SIGTERM (`docker compose stop`) or SIGINT (Ctrl-C) -> stop the query between batches.

    Spark's checkpoint is consistent whenever a query stops (a batch is committed only after its
    output was written; an uncommitted one runs again, on the same offsets, after a restart).
    But `query.stop()` while the foreachBatch function is writing cancels that write, and Spark
    then logs the Python error and a StackOverflowError from the stream thread. So a running
    batch is left to finish: its foreachBatch function calls `after_batch`, which stops the query
    before the next batch can start; when no batch is running the main thread stops it at once.
    A second signal interrupts at once (KeyboardInterrupt).
    """

    def __init__(self, wait_s: float = STOP_WAIT_S) -> None:
        self.requested = threading.Event()
        self.signal_name = ""
        self.wait_s = wait_s
        self.query: Any = None
        self._lock = threading.Lock()
        self._stopper: threading.Thread | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        # Runs in the main thread between two bytecodes: only set a flag.
        if self.requested.is_set():
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        self.requested.set()

    def _stop_query(self) -> None:
        """Start `query.stop()` once, in its own thread (it waits for the stream thread)."""
        with self._lock:
            if self._stopper is None:
                self._stopper = threading.Thread(target=self.query.stop, name="stop-query")
                self._stopper.start()

    def _wait_stopped(self, deadline: float) -> None:
        while self.query.isActive and time.monotonic() < deadline:
            time.sleep(0.05)

    def after_batch(self) -> None:
        """End of the foreachBatch function: once stopping, no next batch starts."""
        if self.requested.is_set() and self.query is not None:
            self._stop_query()
            # stop() marks the query terminated before it waits for this batch to return, and
            # the stream thread starts no new batch after that.
            self._wait_stopped(time.monotonic() + self.wait_s)

    def stop(self) -> None:
        """Main thread, after a signal: stop now if idle, else let the running batch end it."""
        deadline = time.monotonic() + self.wait_s
        while self.query.isActive and time.monotonic() < deadline:
            if not self.query.status.get("isTriggerActive"):
                break
            time.sleep(0.05)
        # Idle, or the batch did not end in time (then it is interrupted and runs again later).
        self._stop_query()
        assert self._stopper is not None
        self._stopper.join()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = GracefulStop()
    stop.install()
    props = client_properties(args.command_config)
    ensure_topics(args.bootstrap_servers, [args.input, args.output], **client_kwargs(props))
    if args.generate:
        written = generate(
            args.bootstrap_servers, args.input, args.generate, **client_kwargs(props)
        )
        print(f"generate: wrote {written} sample events to {args.input}", flush=True)
    if stop.requested.is_set():
        return 0
    spark = build_session(args.master)
    try:
        bootstrap, output = args.bootstrap_servers, args.output

        def write_totals(batch: Any, batch_id: int) -> None:
            # Python data sources accept streaming writes in append mode only, and a running
            # aggregate needs update mode; foreachBatch hands each micro-batch's updated rows to
            # the (batch) minibroker sink instead. A replayed batch id writes its totals again,
            # which readers that keep the latest total per user absorb.
            batch.write.format("minibroker").option("bootstrap.servers", bootstrap).option(
                "topic", output
            ).options(**spark_options(props)).mode("append").save()
            stop.after_batch()

        writer = (
            totals_query(spark, args)
            .writeStream.outputMode("update")
            .foreachBatch(write_totals)
            .option("checkpointLocation", args.checkpoint)
        )
        if args.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{args.trigger_seconds} seconds")
        stop.query = query = writer.start()
        print(
            f"pipeline: {args.input} -> per-user totals -> {args.output} "
            f"(checkpoint {args.checkpoint})",
            flush=True,
        )
        reported = -1
        # Short waits: the signal handler only sets a flag, and this thread acts on it.
        while query.isActive and not stop.requested.is_set():
            query.awaitTermination(0.5)
            progress = query.lastProgress
            if progress and progress["batchId"] != reported and progress.get("numInputRows"):
                reported = progress["batchId"]
                print(
                    f"batch {progress['batchId']}: {progress['numInputRows']} events, "
                    f"{progress.get('processedRowsPerSecond', 0):.0f} rows/s",
                    flush=True,
                )
        if stop.requested.is_set():
            stop.stop()
            print(f"pipeline: stopped on {stop.signal_name}", flush=True)
        if query.exception() is not None:
            print(f"pipeline failed: {query.exception()}", file=sys.stderr)
            return 1
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
